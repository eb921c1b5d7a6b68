"""MXFP8 emulation on sm_90a, host side (no GPU): the scale layouts the kernel reads (mSFA rows of
four K blocks, mSFB permuted into the consumers' register order), a torch model of the kernel's
per-32 promotion from those layouts against the dequantized reference, and the config rules."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cutegemm.blockscaled import quantize_ref
from cutegemm.blockscaled.gemm import gemm_blockscaled_ref
from cutegemm.blockscaled.mx_sm90 import (
    check_mx_operands,
    kernel_sfa,
    kernel_sfb,
    mx_config,
    mx_emulation_ref,
    mx_scales_a,
    mx_scales_b,
    sfb_permutation,
)
from cutegemm.config import Form, GemmConfig, can_implement


def _q(rows, k, seed, spread=6):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g)
    e = torch.randint(-spread, spread + 1, (rows, -(-k // 32)), generator=g).float()
    return quantize_ref(x * torch.exp2(e).repeat_interleave(32, dim=-1)[:, :k], "mxfp8")


@pytest.mark.parametrize("tile_n", [64, 128])
def test_sfb_permutation_is_the_register_order(tile_n):
    """Thread q reads register v's scale at (v // 4) * 16 + 4 q + v % 4; register v = 2 j + e of a
    WGMMA fragment is column 8 j + 2 q + e."""
    perm = sfb_permutation(tile_n)
    assert sorted(perm.tolist()) == list(range(tile_n))
    for q in range(4):
        for v in range(tile_n // 4):
            j, e = v // 2, v % 2
            assert perm[(v // 4) * 16 + 4 * q + v % 4] == 8 * j + 2 * q + e


def test_scale_layouts():
    qa, qb = _q(70, 208, 0), _q(150, 208, 1)  # Kb = 7 -> padded to 8; N = 150 -> 2 tiles of 128
    sfa = mx_scales_a(qa)
    assert sfa.shape == (70, 8, 1) and sfa.stride() == (8, 1, 70 * 8)
    plain = qa.plain_scales().view(torch.uint8).int()
    assert torch.equal(sfa[:, :7, 0], torch.exp2(plain.float() - 127))
    assert (sfa[:, 7:] == 0).all()
    sfb = mx_scales_b(qb, 128)
    assert sfb.shape == (256, 8, 1) and sfb.stride() == (1, 256, 256 * 8)
    plain_b = torch.exp2(qb.plain_scales().view(torch.uint8).float() - 127)
    perm = sfb_permutation(128)
    for p in range(256):
        col = (p // 128) * 128 + perm[p % 128].item()
        expect = plain_b[col] if col < 150 else torch.zeros(7)
        assert torch.equal(sfb[p, :7, 0], expect), p
    assert (sfb[:, 7:] == 0).all()


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 150), n=st.integers(1, 200), k16=st.integers(1, 20), tile_n=st.sampled_from([64, 128]))
def test_kernel_model_matches_reference(m, n, k16, tile_n):
    """The kernel's arithmetic, fed from the kernel's own scale layouts, equals the dequantized
    product (fp32 summation order aside)."""
    k = 16 * k16
    qa, qb = _q(m, k, m + k), _q(n, k, n + 7 * k)
    ref = gemm_blockscaled_ref(qa, qb, out_dtype=torch.float64, compute_dtype=torch.float64)
    got = mx_emulation_ref(qa, qb, tile_n).double()
    scale = ref.abs().max().clamp(min=1e-30)
    assert ((got - ref).abs().max() / scale) < 1e-5


def test_config_rules():
    cfg = mx_config(1024, 1024)
    assert cfg.fp8_mx and can_implement(cfg)[0] and "_mx32" in cfg.name
    assert mx_config(16, 1024).tile_m == 64
    bad = {
        "sm_90a kernel": replace(cfg, arch="sm_100a"),
        "tile_m and tile_n must be 64 or 128": replace(cfg, tile_n=256),
        "cooperative schedule only": replace(cfg, pingpong=True),
        "cannot be combined with fast_accum": replace(cfg, fast_accum=True),
        "needs e4m3 A and B": GemmConfig(arch="sm_90a", fp8_mx=True, tile_n=128),
        "not flat": replace(cfg, form=Form.FLAT),
    }
    assert can_implement(replace(cfg, form=Form.GROUPED))[0]  # the grouped (MoE packed) form
    for msg, c in bad.items():
        ok, why = can_implement(c)
        assert not ok and msg in why, (msg, why)


def test_operand_rules():
    qa, qb = _q(16, 64, 0), _q(16, 64, 1)
    check_mx_operands(qa, qb)
    fp4 = quantize_ref(torch.randn(16, 64), "nvfp4")
    check_mx_operands(fp4, fp4)  # FP4 x FP4: dequantize-first on sm_90a
    wrong = replace(fp4, data=fp4.data.view(torch.uint8))
    with pytest.raises(ValueError, match="float4_e2m1fn_x2"):
        check_mx_operands(wrong, wrong)
    q40a, q40b = quantize_ref(torch.randn(16, 40), "mxfp8"), quantize_ref(torch.randn(8, 40), "mxfp8")
    with pytest.raises(ValueError, match="multiple of 16"):
        check_mx_operands(q40a, q40b)


@settings(max_examples=40, deadline=None)
@given(L=st.integers(1, 3), rows=st.integers(1, 300), k=st.integers(1, 1100), tile_n=st.sampled_from([64, 128, 192]),
       repeat=st.sampled_from([1, 4]), fp16=st.booleans())  # fmt: skip
def test_scale_builders_by_position(L, rows, k, tile_n, repeat, fp16):
    """kernel_sfa / kernel_sfb element by element: the scale of 32-wide K block j is s[..., j //
    repeat] up to ceil(K / 32) blocks, zero past them and past the last column; unit stride along
    Kb (sfa) / Np (sfb); the input (any float dtype) is left as it was."""
    kb, kbp = -(-k // 32), -(-k // 128) * 4
    s = torch.randn(L, rows, -(-kb // repeat), dtype=torch.float16 if fp16 else torch.float32)
    before = s.clone()
    sfa, sfb = kernel_sfa(s, k, repeat), kernel_sfb(s, k, tile_n, repeat)
    assert torch.equal(s, before)
    blocks = s.float().repeat_interleave(repeat, dim=2)[:, :, :kb]  # (L, rows, kb)
    assert sfa.shape == (rows, kbp, L) and sfa.stride()[1] == 1 and sfa.data_ptr() % 16 == 0
    assert torch.equal(sfa[:, :kb].permute(2, 0, 1), blocks) and not sfa[:, kb:].any()
    n_pos = -(-rows // tile_n) * tile_n
    assert sfb.shape == (n_pos, kbp, L) and sfb.stride()[0] == 1
    cols = (torch.arange(n_pos) // tile_n) * tile_n + sfb_permutation(tile_n).repeat(n_pos // tile_n)
    real = cols < rows
    assert torch.equal(sfb[real, :kb].permute(2, 0, 1), blocks[:, cols[real]])
    assert not sfb[~real].any() and not sfb[:, kb:].any()
