"""MXFP8 (e4m3, e8m0 scales per 32) weights on the low-precision-weight ring kernel
(``Fp4WeightConfig(fmt="mxfp8")``) on a GPU (sm_90 / sm_100): ``gemm(x, qw)`` /
``grouped_gemm(x, qw, offs=offs)`` with bf16 (or e4m3 + scale_a) activations, and the MXFP8 x
MXFP8 calls with few rows that the sm_90a policy runs through it. Every element against a
float64 reference of the dequantized operands, within 2x torch's own bf16 error; poisoned
outputs; K tails (K a multiple of 16), rows past N, empty experts, rows past offs[-1] untouched;
NaN weights; the split grid's cut points."""

from __future__ import annotations

from dataclasses import replace
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cutegemm
from cutegemm.blockscaled.reference import BlockScaledTensor, dequantize_ref
from cutegemm.blockscaled.weight_only import launch as api

from .test_fp4_weight_gpu import POISON, _bounds, _check, _offs, _weights

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] not in (9, 10),
    reason="needs an sm_90 / sm_100 GPU",
)

SHAPES = [
    {},  # the policy's
    dict(ring=3, ring_k=2, warps_n=8, warps_k=1, row_tiles=1, wgmma=False, producer_wg=False),
    dict(ring=4, ring_k=2, warps_n=4, warps_k=1, row_tiles=1, wgmma=False, producer_wg=False),
    dict(ring=2, ring_k=4, warps_n=2, warps_k=2, row_tiles=1, wgmma=False, producer_wg=False),
    dict(ring=3, ring_k=2, warps_n=2, warps_k=4, row_tiles=4, wgmma=False, producer_wg=False),
]
WGMMA = []
if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9:  # the WGMMA consumers (sm_90a)
    WGMMA = [dict(ring=ring, ring_k=4, warps_n=8, warps_k=1, row_tiles=1, wgmma=True) for ring in (2, 3)]
    # 128 K per stage (two stages per loop trip, an odd last one after it), the producer warpgroup
    WGMMA += [dict(ring=ring, ring_k=2, warps_n=8, warps_k=1, row_tiles=1, wgmma=True, producer_wg=True) for ring in (3, 4)]
    # commit groups of 4 k16 steps (128-K stages: one per loop trip; 256-K: a wait for all four
    # groups at the end of a trip); 64-K stages
    WGMMA += [dict(ring=3, ring_k=rk, warps_n=8, warps_k=1, row_tiles=1, wgmma=True, producer_wg=True, wg_steps=4)
              for rk in (2, 4)]  # fmt: skip
    WGMMA += [dict(ring=6, ring_k=1, warps_n=8, warps_k=1, row_tiles=1, wgmma=True, producer_wg=True)]


def _config(rows, out_dtype, grouped, experts, **shape):
    cfg = api.pick_config(rows, "mxfp8", out_dtype, api.weight_arch(0), grouped, experts)
    return replace(cfg, **{"staged_store": False, **shape})


def _scaled_weights(shape, seed):
    """MXFP8 weights whose rows span 2**-40 .. 2**40 (scales far from 1) plus the special rows
    of ``_weights`` (a zero block, large and tiny values)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(*shape, device="cuda", generator=g)
    w = w * torch.exp2(torch.randint(-40, 41, (*shape[:-1], 1), device="cuda", generator=g).float())
    if shape[-1] >= 64:
        w[..., :1, :32] = 0.0
    return cutegemm.quantize(w.to(torch.bfloat16), "mxfp8")


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    counts=st.lists(st.integers(0, 90), min_size=1, max_size=4),
    n=st.integers(1, 300),
    kb=st.integers(1, 60),
    grouped=st.booleans(),
    shape=st.sampled_from(SHAPES + WGMMA),
    n_tiles=st.sampled_from([None, 1, 2, 4, 8]),
    out_dtype=st.sampled_from([torch.bfloat16, torch.float32]),
    scaled=st.booleans(),
)
def test_ring_matches_reference(counts, n, kb, grouped, shape, n_tiles, out_dtype, scaled):
    """Ring shapes x tokens per pass, dense (several passes) and grouped (empty experts, tokens past
    a pass's end), K = 16 kb (tail chunks, partial stages), rows past N, wide scale ranges."""

    def config(m, e):
        nt = n_tiles
        if nt is None and shape:  # another shape: at most 64 tokens per pass (mma.sync; WGMMA in 3 stages)
            nt = min(_config(m, out_dtype, grouped, e).n_tiles, 8)
        return _config(m, out_dtype, grouped, e, **shape, **({} if nt is None else {"n_tiles": nt}))

    _ring_case(counts, n, kb, grouped, scaled, out_dtype, config)


def _ring_case(counts, n, kb, grouped, scaled, out_dtype, config):
    """MXFP8 weights (n, 16 kb) (``scaled``: rows spanning 2**-40 .. 2**40), ``counts`` rows per
    expert (dense: their sum), ``config(max(m, 1), experts)``'s kernel into a poisoned output:
    checked against the reference, 3 rows past offs[-1] (grouped) untouched."""
    k = 16 * kb
    if not grouped:
        counts = [max(sum(counts), 1)]
    e = len(counts)
    wshape = (e, n, k) if grouped else (n, k)
    qw = _scaled_weights(wshape, n + kb) if scaled else _weights(wshape, "mxfp8", seed=n * 31 + kb)
    m = sum(counts)
    x = torch.randn(m + 3, k, device="cuda").to(torch.bfloat16)  # 3 rows past offs[-1] (grouped)
    if not grouped:
        x = x[:m]
    cfg = config(max(m, 1), e)
    offs = _offs(counts) if grouped else None
    out = torch.full((x.shape[0], n), POISON, device="cuda", dtype=out_dtype)
    api.gemm_fp4_weight(x, qw, offs=offs, out=out, config=cfg)
    assert torch.isnan(out[m:]).all(), "a row past offs[-1] was written"
    _check(out[:m], x[:m], qw, _bounds(offs) if grouped else None)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 70),
    n=st.integers(1, 700),
    kb=st.integers(1, 80),
    shape=st.sampled_from(SHAPES[:3] + WGMMA),
    n_tiles=st.sampled_from([1, 2, 4, 8]),
    sms=st.sampled_from([1, 2, 3, 5, 132]),
)
def test_split_ring(m, n, kb, shape, n_tiles, sms):
    """The split grid with 8-bit weights: segments cut between CTAs (the SM count faked), every
    output written once, deterministic."""
    k = 16 * kb
    qw = _weights((n, k), "mxfp8", seed=n * 13 + kb)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    cfg = _config(m, torch.float32, False, 1, **shape, split=True, n_tiles=n_tiles)
    out = torch.full((m, n), POISON, device="cuda", dtype=torch.float32)
    with mock.patch.object(api, "_sm_count", lambda index: sms):
        api.gemm_fp4_weight(x, qw, out=out, config=cfg)
        _check(out, x, qw)
        again = api.gemm_fp4_weight(x, qw, out_dtype=torch.float32, config=cfg)
    assert torch.equal(again, out), "split results differ between two runs"


@pytest.mark.skipif(not WGMMA, reason="the WGMMA consumers (sm_90a)")
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    counts=st.lists(st.integers(0, 300), min_size=1, max_size=3),
    n=st.integers(1, 300),
    kb=st.integers(1, 50),
    grouped=st.booleans(),
    shape=st.sampled_from([dict(n_tiles=32, ring=5, split=False), dict(n_tiles=32, ring=5, split=False, staged_store=True),
                           dict(n_tiles=16, ring=8, split=True), dict(n_tiles=16, ring=8, split=False)]),
    scaled=st.booleans(),
)  # fmt: skip
def test_wgmma_64k_stages(counts, n, kb, grouped, shape, scaled):
    """MXFP8 weights in 64-K ring stages (two per 128-K scale group; two stages per loop trip, an
    odd last one after it) with 128 or 256 tokens per pass: several passes, K tails, empty
    experts, rows past offs[-1] untouched."""

    def config(m, e):
        return _config(m, torch.bfloat16, grouped, e, ring_k=1, producer_wg=True, wgmma=True, warps_n=8, warps_k=1,
                       row_tiles=1, **{**shape, "split": shape["split"] and not grouped})  # fmt: skip

    _ring_case(counts, n, kb, grouped, scaled, torch.bfloat16, config)


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("rows", ["decode", "more"])
def test_nan_weights_and_scales(grouped, rows):
    """An e4m3 NaN element (0x7F / 0xFF) or a NaN scale (0xFF) makes every output of its weight row
    NaN, as in the reference; the other outputs stay finite and correct."""
    n, k = 200, 16 * 21
    e = 3 if grouped else 1
    qw = _weights((e, n, k) if grouped else (n, k), "mxfp8", seed=3, special=False)
    data = qw.data.view(torch.uint8).view(e, n, k)
    data[0, 7, 300] = 0x7F
    data[-1, 130, 5] = 0xFF
    plain = qw.plain_scales()
    sc = plain.view(torch.uint8).clone()
    sc.view(e, n, -1)[0, 66, 2] = 0xFF
    qw = BlockScaledTensor(qw.data, sc.view(plain.dtype), qw.fmt, qw.shape, None, scales_swizzled=False)
    counts = ([9, 0, 20] if grouped else [29]) if rows == "decode" else ([40, 0, 50] if grouped else [45])
    m = sum(counts)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    offs = _offs(counts) if grouped else None
    got = api.gemm_fp4_weight(x, qw, offs=offs, out_dtype=torch.float32)
    want = api.gemm_fp4_weight_ref(x, qw, offs=offs, out_dtype=torch.float32)
    first = list(range(counts[0]))  # expert 0's rows (expert 2 has the other NaN)
    assert torch.equal(torch.isnan(got), torch.isnan(want)), "NaN pattern differs from the reference"
    assert torch.isnan(got[first, 7]).all() and torch.isnan(got[first, 66]).all()
    fin = ~torch.isnan(want)
    torch.testing.assert_close(got[fin], want[fin], rtol=1e-4, atol=1e-4 * want[fin].abs().max().item())


@pytest.mark.parametrize("grouped", [False, True])
def test_policy_calls_and_fp8_activations(grouped):
    """``cutegemm.gemm(x, qw)`` / ``grouped_gemm`` with MXFP8 weights as the library routes them
    (decode rows and more), bf16 and e4m3 + per-token scale_a activations."""
    e, n, k = 3, 150, 16 * 23
    qw = _weights((e, n, k) if grouped else (n, k), "mxfp8", seed=9)
    for counts in ([7, 0, 19], [70, 0, 60]) if grouped else ([13], [45], [300]):
        total = sum(counts)
        offs = _offs(counts) if grouped else None
        x = torch.randn(total, k, device="cuda").to(torch.bfloat16)
        out = torch.full((total, n), POISON, device="cuda", dtype=torch.bfloat16)
        if grouped:
            cutegemm.grouped_gemm(x, qw, offs=offs, out=out)
        else:
            cutegemm.gemm(x, qw, out=out)
        _check(out, x, qw, _bounds(offs) if grouped else None)
        x8 = (torch.randn(total, k, device="cuda") * 4).to(torch.float8_e4m3fn)
        sa = torch.rand(total, device="cuda") + 0.25
        got = cutegemm.grouped_gemm(x8, qw, offs=offs, scale_a=sa) if grouped else cutegemm.gemm(x8, qw, scale_a=sa)
        want = (cutegemm.grouped_gemm_ref(x8, qw, offs=offs, scale_a=sa, out_dtype=torch.float64) if grouped
                else cutegemm.gemm_ref(x8, qw, scale_a=sa, out_dtype=torch.float64))  # fmt: skip
        torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())


def _spy_ring():
    from cutegemm.blockscaled import mx_sm90

    return mock.patch.object(mx_sm90, "gemm_fp4_weight", wraps=mx_sm90.gemm_fp4_weight)


@pytest.mark.parametrize("grouped", [False, True])
def test_mxfp8_x_mxfp8_takes_the_weight_path(grouped):
    """MXFP8 x MXFP8 (sm_90a): A dequantized to bf16 (exact), then the MXFP8-weight GEMM with
    the MXFP8 weight (a spy proves the path); results equal the reference of the dequantized
    operands within 2x torch's bf16 error; rows past offs[-1] untouched."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the sm_90a policy")
    from cutegemm.blockscaled import mx_sm90 as sm90_mx

    e, n, k = 4, 264, 16 * 33
    counts = [3, 0, 17, 9] if grouped else [11]
    total = sum(counts)
    qw = _weights((e, n, k) if grouped else (n, k), "mxfp8", seed=21)
    x = torch.randn(total + (2 if grouped else 0), k, device="cuda").to(torch.bfloat16)
    qa = cutegemm.quantize(x, "mxfp8")
    xd = dequantize_ref(qa).to(torch.bfloat16)  # exact
    out = torch.full((x.shape[0], n), POISON, device="cuda", dtype=torch.bfloat16)
    offs = _offs(counts) if grouped else None
    assert sm90_mx.ring_first(qa, qw)
    with _spy_ring() as spy:
        if grouped:
            cutegemm.grouped_gemm(qa, qw, offs=offs, out=out)
        else:
            cutegemm.gemm(qa, qw, out=out)
    assert spy.call_count == 1
    assert torch.isnan(out[total:]).all()
    _check(out[:total], xd[:total], qw, _bounds(offs) if grouped else None)
