"""MXFP8 (e4m3) weights on the low-precision-weight ring kernel, on the CPU: the e4m3 -> bf16
register math (torch twin) is exact for every byte, every position and the e8m0 range; the NaN
flags find exactly the NaN bytes; the fragment mapping reproduces the matmul; the scale bytes the
kernel reads are the 128x4 layout's; config rules, the policy, argument rules; compile-checks."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from cutegemm.blockscaled.layout import to_swizzled
from cutegemm.blockscaled.reference import dequantize_ref, quantize_ref
from cutegemm.blockscaled.weight_only import kernel as fw
from cutegemm.blockscaled.weight_only import math as fm
from cutegemm.blockscaled.weight_only.launch import check_args, gemm_fp4_weight_ref, pick_config

BYTES = torch.arange(256, dtype=torch.int64)
E4M3 = BYTES.to(torch.uint8).view(torch.float8_e4m3fn).double()


@pytest.mark.parametrize("e", [0, 1, 2, 7, 60, 120, 126, 127, 128, 134, 135, 200, 253, 254, 255])
def test_e4m3_twin_exact_for_every_byte_position_and_scale(e):
    factor = fm.mx_scale_bf16_ref(torch.full((256,), e))
    for pos in range(4):
        got = fm.dequant_e4m3_words_ref(BYTES << (8 * pos), factor).reshape(256, 4)[:, pos].double()
        if e == 255:
            assert torch.isnan(got).all()
            continue
        exact = (E4M3 * 2.0 ** (e - 127)).float()  # the reference dequantizes in fp32 (exact here)
        finite = ~torch.isnan(E4M3)
        # one rounding to bf16: only products below 2**-126 (bf16 subnormals) change
        assert torch.equal(got[finite], exact.to(torch.bfloat16).double()[finite]), (e, pos)
        if e >= 10:
            assert torch.equal(got[finite], exact.double()[finite]), (e, pos)
        # the other three positions of the word hold zeros (byte 0)
        rest = fm.dequant_e4m3_words_ref(BYTES << (8 * pos), factor).reshape(256, 4)
        assert (rest[:, [p for p in range(4) if p != pos]] == 0).all()


def test_e4m3_twin_pairs_bytes_in_k_order():
    word = torch.tensor([0x38 | (0x40 << 8) | (0x44 << 16) | (0xC8 << 24)])  # 1, 2, 3, -4
    got = fm.dequant_e4m3_words_ref(word, fm.mx_scale_bf16_ref(torch.tensor(127)))
    assert got.flatten().tolist() == [1.0, 2.0, 3.0, -4.0]


def test_nan_flags_find_exactly_the_nan_bytes():
    for pos in range(4):
        flags = fm.e4m3_nan_flags_ref(BYTES << (8 * pos))
        hit = (flags >> (8 * pos + 7)) & 1
        assert torch.equal(hit.bool(), torch.isnan(E4M3)), pos
        assert torch.equal(flags & ~(0x80 << (8 * pos)), torch.zeros_like(flags))  # no carry into other bytes
    # all four bytes NaN, none carries
    assert fm.e4m3_nan_flags_ref(torch.tensor([0xFF7F7FFF])).item() == 0x80808080


@pytest.mark.parametrize("e", [0, 100, 127, 140, 254])
def test_wgmma_pair_twin_selects_and_dequantizes_each_pair(e):
    """``dequant_e4m3_pair`` (the WGMMA consumers): the PRMT selector of bytes 2 t, 2 t + 1 of the
    8-byte pool picks them with their signs replicated; the pair's values are the bytes' e4m3
    values times the scale (one bf16 rounding); the NaN flag is set exactly for pairs with a NaN."""
    g = torch.Generator().manual_seed(e)
    lo = torch.randint(0, 2**32, (4096,), generator=g, dtype=torch.int64)
    hi = torch.randint(0, 2**32, (4096,), generator=g, dtype=torch.int64)
    pool = lo | (hi << 32)
    factor = fm.mx_scale_bf16_ref(torch.full((4096,), e))
    for t in range(4):
        i = 2 * t
        nan = torch.zeros(4096, dtype=torch.bool)
        got = fm.dequant_e4m3_pair_ref(lo, hi, i, factor, nan_out=nan).double()
        b = torch.stack([(pool >> (8 * i)) & 0xFF, (pool >> (8 * (i + 1))) & 0xFF], dim=-1)
        vals = E4M3[b]
        want = (vals * 2.0 ** (e - 127)).float().to(torch.bfloat16).double()
        fin = ~torch.isnan(vals).any(-1)
        assert torch.equal(got[fin], want[fin]), t
        assert torch.equal(nan, ~fin), t
    assert fm.prmt_ref(torch.tensor([0x80017F02]), torch.tensor([0]), fm.e4m3_pair_selector(0)).item() == 0x007F0002
    assert fm.prmt_ref(torch.tensor([0x80017F02]), torch.tensor([0]), fm.e4m3_pair_selector(2)).item() == 0xFF800001


def test_fragment_mapping_reproduces_the_matmul():
    """One 16-row x 8-token x 64-K chunk as ``mma_chunk_fp8`` builds it: lane (g, t), word j holds
    K 16 t + 4 j .. + 3 of rows g, g + 8; the m16n8k16 MMA's A / B fragment positions (2 t, 2 t + 1),
    (2 t + 8, 2 t + 9) get the word's two pairs; the sum of the 4 MMAs equals W @ X^T."""
    g_ = torch.Generator().manual_seed(0)
    w = torch.randn(16, 64, generator=g_, dtype=torch.float64)
    x = torch.randn(8, 64, generator=g_, dtype=torch.float64)
    acc = torch.zeros(16, 8, dtype=torch.float64)
    for j in range(4):
        a = torch.full((16, 16), float("nan"), dtype=torch.float64)
        b = torch.full((16, 8), float("nan"), dtype=torch.float64)
        for lane in range(32):
            g, t = lane // 4, lane % 4
            kk = 16 * t + 4 * j
            for r in (g, g + 8):
                a[r, 2 * t : 2 * t + 2] = w[r, kk : kk + 2]
                a[r, 2 * t + 8 : 2 * t + 10] = w[r, kk + 2 : kk + 4]
            b[2 * t : 2 * t + 2, g] = x[g, kk : kk + 2]
            b[2 * t + 8 : 2 * t + 10, g] = x[g, kk + 2 : kk + 4]
        assert not torch.isnan(a).any() and not torch.isnan(b).any()
        acc += a @ b
    torch.testing.assert_close(acc, w @ x.T)


@pytest.mark.parametrize("ring_k", [2, 4])
def test_scale_reads_match_the_swizzled_layout(ring_k):
    """The byte ``kernel_ring`` reads for (weight row r, chunk c, thread t) from the stage's scale
    groups is the 128x4 layout's scale of row r, K block (64 c + 16 t) // 32."""
    n, k = 256, 64 * 12
    cfg = fw.Fp4WeightConfig(fmt="mxfp8", stages=0, ring=3, ring_k=ring_k, warps_n=8, warps_k=1, row_tiles=1,
                             producer_pairs=False)  # fmt: skip
    kern = fw.Fp4WeightKernel(cfg)
    plain = torch.randint(0, 255, (n, k // 32), dtype=torch.uint8)
    sw = to_swizzled(plain).reshape(-1)
    n_p, cols_p = kern.scale_dims(n, k)
    tile_stride = 128 * cols_p
    for c in range(k // 64):
        ks, q = divmod(c, ring_k)
        g0 = ks * cfg.scale_groups  # the producer's first group of the stage
        for r in (0, 5, 37, 127, 128, 200, 255):
            for t in range(4):
                base = (r // 128) * tile_stride + g0 * 512  # the stage's copy of the tile's groups
                got = sw[base + kern.scale_in_tile(r % 128, t) + kern.scale_chunk_offset(q)]
                assert got == plain[r, (64 * c + 16 * t) // 32], (c, r, t)


def test_config_rules_and_geometry():
    base = dict(fmt="mxfp8", stages=0, ring=4, ring_k=2, warps_n=4, warps_k=2, row_tiles=2, producer_pairs=False)
    cfg = fw.Fp4WeightConfig(**base)
    assert (cfg.chunk_k, cfg.x_boxes_per_chunk, cfg.scale_groups) == (64, 1, 1)
    assert fw.Fp4WeightConfig(**{**base, "ring_k": 4, "ring": 2}).scale_groups == 2
    nv = fw.Fp4WeightConfig(**{**base, "fmt": "nvfp4"})
    assert cfg.smem_bytes < nv.smem_bytes  # one activation box per chunk instead of two
    assert "_cpair" not in cfg.name and "mxfp8" in cfg.name
    wg = dict(wgmma=True, warps_n=8, warps_k=1, row_tiles=1)
    assert fw.Fp4WeightConfig(**{**base, **wg}).stage_k == 128  # WGMMA: 128 K per stage (ring_k 2) or 256 (4)
    # WGMMA, 64 K per stage (ring_k 1): 64-byte weight rows (64-byte swizzle), one activation box, a
    # copy of the 128-K scale group holding the stage's K, one commit group of 4 steps; 256 tokens fit
    k64 = fw.Fp4WeightConfig(**{**base, **wg, "ring_k": 1, "ring": 5, "n_tiles": 32, "producer_wg": True})
    assert (k64.stage_k, k64.w_row_bytes, k64.w_boxes, k64.x_boxes, k64.scale_groups, k64.group_steps) == (
        64, 64, 1, 1, 1, 4)
    assert k64.smem_bytes == 5 * (128 * 64 + 256 * 128 + 512 + 16) + 1024 + 256 <= 227 * 1024
    for bad in (dict(producer_pairs=True), dict(ring=0, stages=4), {**wg, "arch": "sm_100a"}, dict(ring_k=1),
                {**wg, "ring_k": 2, "ring": 2, "n_tiles": 32, "producer_wg": True}):  # fmt: skip
        with pytest.raises(ValueError):
            fw.Fp4WeightConfig(**{**base, **bad})


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_policy(arch):
    """Decode rows (up to 32 dense / per expert): the mma.sync ring; more on sm_90a: the WGMMA
    consumers, 256 K per stage up to 64 rows, then 128 tokens per pass in 128-K stages with the
    producer warpgroup's registers, 256 in five 64-K stages from 129 rows (dense: where fewer
    256-token passes cost less; not split); never a producer that pairs activations."""
    for grouped in (False, True):
        for m in (1, 16, 17, 32, 33, 64, 128, 200, 384):
            cfg = pick_config(m * (8 if grouped else 1), "mxfp8", torch.bfloat16, arch, grouped, 8 if grouped else 1)
            assert cfg.fmt == "mxfp8" and cfg.ring and not cfg.producer_pairs, cfg
            assert cfg.wgmma == (arch == "sm_90a" and m > 32), cfg
            if cfg.wgmma:
                kind = "t256" if m == 200 or (grouped and m > 128) else "t128" if m > 64 else "t64"
                assert (cfg.ring_k, cfg.ring, cfg.n_tiles, cfg.producer_wg) == {
                    "t64": (4, 3, 8, False), "t128": (2, 4, 16, True), "t256": (1, 5, 32, True)}[kind]  # fmt: skip
            assert cfg.split == (not grouped and cfg.n_tiles < 32 and (cfg.wgmma or m > cfg.tokens_per_pass)), cfg
            assert cfg.smem_bytes <= 227 * 1024


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_policy_with_few_weight_tiles(arch):
    """Dense weights whose 128-row tiles are fewer than the SMs: the split grid with one token
    pass (MXFP8 on sm_90a: the WGMMA consumers; FP4 up to 16 rows: the mma.sync ones); grouped
    calls unchanged."""
    for m in (1, 16, 32):
        cfg = pick_config(m, "mxfp8", torch.bfloat16, arch, False, 1, few_tiles=True)
        assert cfg.split and cfg.wgmma == (arch == "sm_90a"), cfg
        assert not pick_config(m, "mxfp8", torch.bfloat16, arch, False, 1).split
        for fmt in ("nvfp4", "mxfp4"):
            c4 = pick_config(m, fmt, torch.bfloat16, arch, False, 1, few_tiles=True)
            assert c4.split and c4.wgmma == (arch == "sm_90a" and m > 16), c4
        g = pick_config(8 * m, "mxfp8", torch.bfloat16, arch, True, 8, few_tiles=True)
        assert not g.split and not g.wgmma


def test_argument_rules():
    x = torch.randn(4, 64).to(torch.bfloat16)
    check_args(x, quantize_ref(torch.randn(16, 64), "mxfp8"))  # accepted
    with pytest.raises(ValueError, match="mxfp8_e5m2"):
        check_args(x, quantize_ref(torch.randn(16, 64), "mxfp8_e5m2"))


def test_reference_is_the_dequantized_matmul():
    qw = quantize_ref(torch.randn(3, 40, 96), "mxfp8")
    x = torch.randn(20, 96).to(torch.bfloat16)
    offs = torch.tensor([5, 5, 17], dtype=torch.int32)
    got = gemm_fp4_weight_ref(x, qw, offs=offs, out_dtype=torch.float64, compute_dtype=torch.float64)
    w = dequantize_ref(qw).double()
    want = torch.cat([x[:5].double() @ w[0].T, x[5:5].double() @ w[1].T, x[5:17].double() @ w[2].T])
    torch.testing.assert_close(got[:17], want)
    assert (got[17:] == 0).all()


def test_mxfp8_x_mxfp8_ring_routing_rule():
    from unittest import mock

    from cutegemm.blockscaled import mx_sm90 as sm90_mx

    qa = quantize_ref(torch.randn(16, 64), "mxfp8")
    assert not sm90_mx.ring_first(qa, qa)  # CPU operands: the dequantize kernel refuses them
    with mock.patch.object(sm90_mx, "dequantizable", lambda q: True):
        qb = quantize_ref(torch.randn(32, 64), "mxfp8")
        assert sm90_mx.ring_first(qa, qb)
        assert not sm90_mx.ring_first(quantize_ref(torch.randn(2, 16, 64), "mxfp8"), qb)  # batched A
        e5 = quantize_ref(torch.randn(32, 64), "mxfp8_e5m2")
        assert not sm90_mx.ring_first(qa, e5)
        assert not sm90_mx.ring_first(quantize_ref(torch.randn(16, 40), "mxfp8"), quantize_ref(torch.randn(8, 40), "mxfp8"))


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("grouped", [False, True])
def test_compile_check(arch, grouped):
    cfg = pick_config(40 * (4 if grouped else 1), "mxfp8", torch.float32, arch, grouped, 4 if grouped else 1)
    ok, markers, err = fw.check_variant(replace(cfg, n_tiles=4 if grouped else 2))
    assert ok, (err, markers)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_compile_check_128_tokens_no_spills(fmt):
    """The dense policy from 65 rows (sm_90a: WGMMA, 128 tokens per pass in 128-K stages, the
    producer warpgroup's registers handed to the consumers, split grid) compiles without a spill;
    the same without ``producer_wg`` (ptxas's even 168 registers) spills, which is why it is on."""
    t128 = pick_config(128, fmt, torch.bfloat16, "sm_90a", False, 1)
    assert (t128.n_tiles, t128.split, t128.wgmma, t128.producer_wg, t128.stage_k) == (16, True, True, True, 128)
    ok, markers, err = fw.check_variant(t128)
    assert ok and markers["LDL"] == markers["STL"] == 0, (err, markers)
    ok, markers, err = fw.check_variant(replace(t128, producer_wg=False))
    assert not ok and markers["LDL"] > 0, (err, markers)
