"""CPU: the grouped (MoE packed form) block-scaled GEMM of sm_100a: the per-expert padded layout
of A's scales (device row map vs its Python twin; bytes vs an independent per-expert swizzle),
config rules, compile-check variants, the reference twin and argument validation."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cutegemm
from cutegemm.blockscaled import dequantize_ref, quantize_ref
from cutegemm.blockscaled.grouped_sf import (
    grouped_scales_a,
    grouped_sf_rows,
    padded_sf_rows_ref,
    sf_rows_bound,
)
from cutegemm.blockscaled.layout import to_swizzled
from cutegemm.config import Form, GemmConfig, can_implement

MX = dict(a_dtype="e4m3", b_dtype="e4m3", sf_dtype="e8m0", sf_vec=32)


def _offs(counts):
    return torch.tensor(counts, dtype=torch.int32).cumsum(0, dtype=torch.int32)


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.one_of(st.just(0), st.integers(1, 300)), min_size=1, max_size=12),
    pad=st.integers(0, 40),
)
def test_row_map_matches_twin(counts, pad):
    """Every packed row's padded scale row: expert e from 128 * sum_{j<e} ceil(rows_j / 128);
    rows past offs[-1] go to the dump row (the bound); no two rows share a padded row."""
    total = sum(counts) + pad
    offs = _offs(counts)
    got = grouped_sf_rows(offs, total).tolist()
    want = padded_sf_rows_ref(offs.tolist(), total)
    bound = sf_rows_bound(total, len(counts))
    assert got == [bound if w is None else w for w in want]
    real = [g for g in got if g != bound]
    assert len(set(real)) == len(real) and all(0 <= g < bound for g in real)
    # each expert starts a 128-row block
    start, block = 0, 0
    for c in counts:
        if c:
            assert got[start] == 128 * block
        block += -(-c // 128)
        start += c


@settings(max_examples=40, deadline=None)
@given(offs=st.lists(st.integers(-50, 400), min_size=1, max_size=8), total=st.integers(0, 300))
def test_row_map_is_memory_safe_for_bad_offs(offs, total):
    """Decreasing / negative / too-large offs: every row still lands inside the buffer."""
    got = grouped_sf_rows(torch.tensor(offs, dtype=torch.int32), total)
    assert got.numel() == total
    if total:
        assert int(got.min()) >= 0 and int(got.max()) <= sf_rows_bound(total, len(offs))


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4", "mxfp4"])
@pytest.mark.parametrize("counts", [[5, 0, 130], [0, 0], [128, 1, 256], [300]])
def test_padded_scale_bytes(fmt, counts):
    """The kernel's A-scale bytes equal an independent construction: each expert's plain scale rows
    swizzled on their own (padded to 128 rows), the experts' blocks one after another, then zero
    blocks up to the bound."""
    k = 96 if fmt == "mxfp8" else 128
    total = sum(counts) + 3  # 3 rows past offs[-1]
    qa = quantize_ref(torch.randn(total, k), fmt)
    plain = qa.plain_scales().view(torch.uint8)
    got = grouped_scales_a(qa, _offs(counts)).view(torch.uint8)
    pieces, start = [], 0
    for c in counts:
        if c:
            pieces.append(to_swizzled(plain[start : start + c]).reshape(-1))
        start += c
    want = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.uint8)
    cols_p = -(-plain.shape[1] // 4) * 4
    assert got.numel() == sf_rows_bound(total, len(counts)) * cols_p
    assert torch.equal(got[: want.numel()], want)
    assert not got[want.numel() :].any()


@pytest.mark.parametrize(
    "kw,ok",
    [
        (dict(tile_m=128, tile_n=128), True),
        (dict(tile_m=128, tile_n=256, cluster_n=2, scheduler="clc"), True),
        (dict(tile_m=256, tile_n=256, two_cta=True, cluster_m=2), False),
        (dict(tile_m=128, tile_n=128, cluster_m=2), False),
    ],
)
def test_grouped_blockscaled_config_rules(kw, ok):
    cfg = GemmConfig(arch="sm_100a", a_major="k", b_major="k", form=Form.GROUPED, **MX, **kw)
    good, why = can_implement(cfg)
    assert good == ok, why
    if not ok:
        assert "grouped" in why


def test_compile_check_lists_grouped_blockscaled():
    from cutegemm.compile_check import _mma_markers, all_variants

    vs = [c for c in all_variants(["sm_100a"]) if c.grouped and c.blockscaled]
    assert {c.a_dtype + c.sf_dtype for c in vs} == {"e4m3e8m0", "e2m1e8m0", "e2m1e4m3"}
    assert {c.scheduler for c in vs} >= {"static", "clc", "dynamic"}
    for c in vs:
        assert can_implement(c)[0], c.name
        assert "UTCCP" in _mma_markers(c)


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_reference_twin_is_per_expert_dequantized_matmul(fmt):
    counts, n, k = [7, 0, 20], 48, 64
    total = sum(counts) + 2
    qa = quantize_ref(torch.randn(total, k), fmt, **({"global_scale": 0.5} if fmt == "nvfp4" else {}))
    qb = quantize_ref(torch.randn(3, n, k), fmt, **({"global_scale": 2.0} if fmt == "nvfp4" else {}))
    offs = _offs(counts)
    got = cutegemm.grouped_gemm_ref(qa, qb, offs=offs, out_dtype=torch.float64, alpha=0.5, compute_dtype=torch.float64)
    a, b = dequantize_ref(qa).double(), dequantize_ref(qb).double()
    want = torch.zeros(total, n, dtype=torch.float64)
    start = 0
    for e, c in enumerate(counts):
        want[start : start + c] = 0.5 * a[start : start + c] @ b[e].T
        start += c
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_argument_errors():
    qa = quantize_ref(torch.randn(10, 64), "mxfp8")
    qb = quantize_ref(torch.randn(2, 32, 64), "mxfp8")
    offs = _offs([4, 6])
    with pytest.raises(ValueError, match="offs is required"):
        cutegemm.grouped_gemm(qa, qb)
    with pytest.raises(ValueError, match="offs has 3 entries"):
        cutegemm.grouped_gemm(qa, qb, offs=_offs([4, 6, 0]))
    with pytest.raises(TypeError, match="int32"):
        cutegemm.grouped_gemm(qa, qb, offs=offs.long())
    with pytest.raises(ValueError, match="share a format"):
        cutegemm.grouped_gemm(qa, quantize_ref(torch.randn(2, 32, 64), "nvfp4"), offs=offs)
    with pytest.raises(ValueError, match=r"qb \(E, N, K\)"):
        cutegemm.grouped_gemm(qa, quantize_ref(torch.randn(32, 64), "mxfp8"), offs=offs)
    with pytest.raises(ValueError, match="supports only"):
        cutegemm.grouped_gemm(qa, qb, offs=offs, bias=torch.zeros(32))
    with pytest.raises(ValueError, match="CUDA device"):
        cutegemm.grouped_gemm(qa, qb, offs=offs)


def test_nvfp4_global_scales_stay_on_the_device(monkeypatch):
    """NVFP4's global scales reach the kernel as a 1-element device vector (their product), with
    no host read (float / item on a scale would sync the call and break CUDA-graph capture); the
    configs multiply by it (EpilogueSpec.scale_a) and only when the operands have scales."""
    from dataclasses import replace

    from cutegemm.blockscaled.gemm import blockscaled_config, global_scale_vector, with_global_scale

    torch.manual_seed(0)
    qa = quantize_ref(torch.randn(64, 128), "nvfp4", global_scale=torch.tensor(0.25))
    qb = quantize_ref(torch.randn(2, 32, 128), "nvfp4", global_scale=torch.tensor(3.0))
    mx = quantize_ref(torch.randn(64, 128), "mxfp8")

    def no_host_read(*_a, **_k):
        raise AssertionError("host read of a global scale")

    monkeypatch.setattr(torch.Tensor, "__float__", no_host_read)
    monkeypatch.setattr(torch.Tensor, "item", no_host_read)
    v = global_scale_vector(qa, qb)
    monkeypatch.undo()
    assert v.shape == (1,) and v.dtype == torch.float32 and v.device == qa.data.device
    assert torch.equal(v, torch.tensor([0.75]))
    assert global_scale_vector(mx, mx) is None
    nv = blockscaled_config("nvfp4", 256, 256)
    assert nv.epilogue.scale_a and not nv.epilogue.alpha
    assert not blockscaled_config("mxfp8", 256, 256).epilogue.scale_a
    bare = replace(nv, epilogue=replace(nv.epilogue, scale_a=False))
    forced = with_global_scale(bare, v, 2.0)  # a given config gains the ops the call needs
    assert forced.epilogue.scale_a and forced.epilogue.alpha
    assert with_global_scale(nv, v, 1.0) == nv
    with pytest.raises(ValueError, match="global scale"):
        with_global_scale(nv, None, 1.0)
