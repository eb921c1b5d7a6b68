"""FP8 outputs (``out_dtype=torch.float8_e4m3fn / float8_e5m2``, torch._scaled_mm's FP8
``out_dtype``), sm_90a, and sm_100a where capability 10 runs the same cases: the epilogue
saturates the fp32 values to the type's finite range (NaN kept) and rounds them once to
nearest-even (cvt.rn.satfinite).

Every element within one FP8 step (ulp) of the float64 product of the dequantized operands,
saturated; the error against float64 within 2x torch._scaled_mm's on the same operands where
torch computes the call (tensor-wise scales); NaN-poisoned outputs, nothing written outside the
output view; the same bits on a second call; overflow and infinite scales give +-max, a NaN input
NaN; ``scale_result`` with a bias; hypothesis over shapes (ragged M, N, K; the policy's split-K and decode tiles among them)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cutegemm

from ..gemm_check import assert_outside_untouched, error_stats, poisoned_out
from .test_fp8_gpu import _operands, _scales  # a (M, K), b = w.t(); per-row / per-tensor scales

pytestmark = pytest.mark.gpu
E4, E5, BF16 = torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16
MANTISSA = {E4: 3, E5: 2}
MIN_EXP = {E4: -6, E5: -14}  # the smallest normal binade


@pytest.fixture(autouse=True)
def _fp8_gpu():
    if torch.cuda.get_device_capability()[0] not in (9, 10):
        pytest.skip("FP8 outputs: the dense FP8 kernels of sm_90a / sm_100a")


def _saturated_reference(a, b, sa, sb, out_dtype, bias=None, activation=None):
    acc = (a.double() @ b.double()) * sa.double().reshape(-1, 1) * sb.double().reshape(1, -1)
    if bias is not None:
        acc = acc + bias.double()
    if activation == "relu":
        acc = acc.relu()
    top = torch.finfo(out_dtype).max
    return acc.clamp(-top, top)


def _assert_within_one_step(out, ref, what, magnitude):
    """|out - ref| <= one FP8 step at ref's binade (or the subnormal step) plus the accumulation's
    error bound, element by element. The FP8 tensor cores add the products in a narrower accumulator
    than fp32 (about 13 bits kept between promotions), so a sum of K products can be off by up to
    ``2**-12 * sum |a_i b_i|`` (``magnitude``, scaled as the output) before the one rounding to FP8;
    that bound only matters where the terms cancel."""
    o, r = out.double(), ref
    assert not torch.isnan(o).any(), f"{what}: NaN in output"
    exp = torch.floor(torch.log2(r.abs().clamp_min(1e-300))).clamp_min(MIN_EXP[out.dtype])
    step = torch.pow(2.0, exp - MANTISSA[out.dtype])
    bad = (o - r).abs() > step + 2.0**-12 * magnitude
    assert not bad.any(), f"{what}: {int(bad.sum())} elements more than one FP8 step off, e.g. {o[bad][:4]} vs {r[bad][:4]}"


def _magnitude(a, b, sa, sb):
    """sum_k |a_ik b_kj| * |sa_i sb_j| in float64: the scale of the accumulation error."""
    return (a.double().abs() @ b.double().abs()) * sa.double().abs().reshape(-1, 1) * sb.double().abs().reshape(1, -1)


def _check(a, b, sa, sb, out_dtype, what, **kw):
    m, n = a.shape[0], b.shape[1]
    buf, out = poisoned_out((m, n), out_dtype, pad_cols=16)
    res = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out=out, **kw)
    assert res is out and out.dtype == out_dtype
    assert_outside_untouched(buf.float(), m, n)
    ref = _saturated_reference(a, b, sa, sb, out_dtype, kw.get("bias"), kw.get("activation"))
    _assert_within_one_step(out, ref, what, _magnitude(a, b, sa, sb))
    fresh = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype, **kw)  # allocated (odd N: padded rows)
    assert fresh.dtype == out_dtype and fresh.is_contiguous()
    assert torch.equal(fresh.view(torch.uint8), out.view(torch.uint8)), f"{what}: another call, other bits"
    # torch._scaled_mm computes FP8 outputs tensor-wise, e4m3 only (cuBLASLt has no e5m2 output for e4m3
    # operands: CUBLAS_STATUS_NOT_SUPPORTED) and with K and N multiples of 16
    if sa.numel() == 1 and sb.numel() == 1 and not kw and out_dtype == E4 and a.shape[1] % 16 == 0 and n % 16 == 0:
        theirs = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype)
        inside = ref.abs() < torch.finfo(out_dtype).max  # (saturation: test_fp8_out_saturates)
        (o_max, o_mean), (t_max, t_mean) = error_stats(out.float()[inside], ref[inside]), error_stats(theirs.float()[inside], ref[inside])
        assert o_max <= 2 * t_max + 1e-12 and o_mean <= 2 * t_mean + 1e-12, f"{what}: {o_max, o_mean} vs torch {t_max, t_mean}"
    return out


@pytest.mark.parametrize("out_dtype", [E4, E5])
@pytest.mark.parametrize("kind", ["tensor", "row"])
@pytest.mark.parametrize("m,n,k", [(128, 256, 512), (100, 272, 4096), (1024, 1536, 7168), (16, 2048, 7168),
                                   (1, 576, 7168), (2048, 4096, 1024), (77, 40, 96)])  # fmt: skip
def test_fp8_out(out_dtype, kind, m, n, k):
    a, b = _operands(m, n, k, seed=m + n)
    sa, sb = _scales(kind, m, n, seed=k)
    sa = sa / 16  # products of randn * 3 operands: mostly inside e4m3's range, some saturated
    _check(a, b, sa, sb, out_dtype, f"{out_dtype} {kind} {m}x{n}x{k}")


@pytest.mark.parametrize("out_dtype", [E4, E5])
def test_fp8_out_epilogue_and_operand_types(out_dtype):
    """bias + relu, e5m2 x e4m3 operands, fast accumulation."""
    m, n, k = 384, 1024, 2048
    a, b = _operands(m, n, k, seed=5, a_dtype=E5)
    sa, sb = _scales("row", m, n, seed=6)
    bias = torch.randn(n, device="cuda", dtype=BF16) * 8
    _check(a, b, sa / 16, sb, out_dtype, f"{out_dtype} bias relu", bias=bias, activation="relu")
    _check(a, b, sa / 16, sb, out_dtype, f"{out_dtype} fast_accum", fast_accum=True)


@pytest.mark.parametrize("out_dtype", [E4, E5])
def test_fp8_out_saturates(out_dtype):
    top = torch.finfo(out_dtype).max
    a, b = _operands(256, 512, 256, seed=11)
    one = torch.tensor(1.0, device="cuda")
    exact = a.double() @ b.double()
    slack = 2.0**-12 * (a.double().abs() @ b.double().abs())  # the FP8 accumulator's error bound (see above)
    low, high = exact - slack, exact + slack  # where the kernel's fp32 sum lies
    for s in (1e6, float("inf")):
        out = cutegemm.gemm(a, b, scale_a=torch.tensor(s, device="cuda"), scale_b=one, out_dtype=out_dtype).float()
        # the sums beyond the type's range whatever the accumulator's rounding (inf: every sum whose sign is sure)
        over, under = (low > 0) & (low * s > top), (high < 0) & (high * s < -top)
        assert over.sum() > 1000 and under.sum() > 1000
        assert torch.equal(out[over], torch.full_like(out[over], top))
        assert torch.equal(out[under], torch.full_like(out[under], -top))
    a_nan = a.clone()
    a_nan[3, 7] = float("nan")
    out = cutegemm.gemm(a_nan, b, scale_a=one, scale_b=one, out_dtype=out_dtype).float()
    assert out[3].isnan().all() and not out[torch.arange(256, device="cuda") != 3].isnan().any()


def test_fp8_out_scale_result():
    """torch's D scale (``scale_result``) with a bias: ``sr * (acc * sa * sb + bias)``, against float64
    and torch._scaled_mm's same call."""
    m, n, k = 512, 1024, 2048
    a, b = _operands(m, n, k, seed=9)
    sa, sb, sr = (torch.tensor(v, device="cuda") for v in (0.02, 0.5, 0.25))
    bias = torch.randn(n, device="cuda", dtype=BF16) * 8
    ours = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, bias=bias, out_dtype=E4, scale_result=sr)
    ref = ((a.double() @ b.double()) * 0.01 + bias.double()) * 0.25
    _assert_within_one_step(ours, ref.clamp(-448, 448), "scale_result", _magnitude(a, b, sa, sb * sr))
    theirs = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, bias=bias, out_dtype=E4, scale_result=sr)
    (o_max, o_mean), (t_max, t_mean) = error_stats(ours.float(), ref), error_stats(theirs.float(), ref)
    assert o_max <= 2 * t_max + 1e-12 and o_mean <= 2 * t_mean + 1e-12, f"{o_max, o_mean} vs torch {t_max, t_mean}"


def _ragged_n(x):  # N not always a multiple of 16 (the padded scratch and its copy)
    return 16 * x + ((x * 5) % 16 if x % 3 == 0 else 0)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(m=st.integers(1, 700), n=st.integers(1, 96).map(_ragged_n), k=st.integers(1, 64).map(lambda x: 16 * x),
       out_fp8=st.sampled_from([E4, E5]), kind=st.sampled_from(["tensor", "row"]))  # fmt: skip
def test_fp8_out_shapes(m, n, k, out_fp8, kind):
    a, b = _operands(m, n, k, seed=m * 7 + n)
    sa, sb = _scales(kind, m, n, seed=k)
    _check(a, b, sa / 16, sb, out_fp8, f"{out_fp8} {kind} {m}x{n}x{k}")

