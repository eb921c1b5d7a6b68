"""Dense FP8 with e5m2 operands (e5m2 x e4m3 as FP8 training's input gradient takes it, e4m3 x
e5m2, e5m2 x e5m2), per-tensor and row-wise fp32 scales, sm_90a (QGMMA with both types; sm_100a:
the arch-generic cases, tcgen05 kind::f8f6f4).

Against a float64 reference of the dequantized product: our error within 2x that of the same
product at fp32 with a bf16 output, and within 2x torch._scaled_mm's where torch computes the pair
(it refuses e5m2 x e5m2); NaN-poisoned outputs; the same bits on a second call; hypothesis over
shapes (ragged M, N, K; the policy's split-K and decode tiles among them)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cutegemm

from ..gemm_check import assert_outside_untouched, assert_within_torch_error, poisoned_out
from .test_fp8_gpu import _operands, _scales  # a (M, K), b = w.t(); per-row / per-tensor scales

pytestmark = pytest.mark.gpu
E4, E5, BF16 = torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16
PAIRS = [(E5, E4), (E4, E5), (E5, E5)]


@pytest.fixture(autouse=True)
def _fp8_gpu():
    if torch.cuda.get_device_capability()[0] not in (9, 10):
        pytest.skip("dense FP8 runs on sm_90a / sm_100a")


def _check(a, b, sa, sb, what, fast_accum=False):
    m, n = a.shape[0], b.shape[1]
    buf, out = poisoned_out((m, n), BF16)
    cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out=out, fast_accum=fast_accum)
    assert_outside_untouched(buf, m, n)
    ref = (a.double() @ b.double()) * sa.double().reshape(-1, 1) * sb.double().reshape(1, -1)
    same = ((a.float() @ b.float()) * sa.reshape(-1, 1) * sb.reshape(1, -1)).to(BF16)
    assert_within_torch_error(out, same, ref, what=f"{what} vs fp32")
    if a.dtype != E5 or b.dtype != E5:  # torch._scaled_mm computes the mixed pairs
        try:
            theirs = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=BF16, use_fast_accum=fast_accum)
        except RuntimeError:  # (row-wise scales with e5m2: not every torch build)
            theirs = None
        if theirs is not None:
            assert_within_torch_error(out, theirs, ref, what=f"{what} vs torch._scaled_mm")
    again = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, fast_accum=fast_accum)
    assert torch.equal(again, out), f"{what}: another call, other bits"


@pytest.mark.parametrize("a_dtype,b_dtype", PAIRS)
@pytest.mark.parametrize("kind", ["tensor", "row"])
@pytest.mark.parametrize("m,n,k", [(128, 256, 512), (100, 272, 4096), (1024, 1536, 7168), (16, 2048, 7168),
                                   (1, 576, 7168), (2048, 4096, 1024)])  # fmt: skip
def test_e5m2_pairs(a_dtype, b_dtype, kind, m, n, k):
    a, b = _operands(m, n, k, seed=m + n, a_dtype=a_dtype, b_dtype=b_dtype)
    sa, sb = _scales(kind, m, n, seed=k)
    _check(a, b, sa, sb, f"{a_dtype}x{b_dtype} {kind} {m}x{n}x{k}")


@pytest.mark.parametrize("a_dtype,b_dtype", PAIRS)
def test_e5m2_fast_accum(a_dtype, b_dtype):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("fast accumulation is an sm_90a option")
    a, b = _operands(512, 1024, 2048, seed=7, a_dtype=a_dtype, b_dtype=b_dtype)
    sa, sb = _scales("tensor", 512, 1024)
    _check(a, b, sa, sb, f"{a_dtype}x{b_dtype} fast_accum", fast_accum=True)


def test_e5m2_gradient_matmul():
    """FP8 training's input gradient: dX = dY (e5m2, row-wise scaled) @ W (e4m3 (N, K) weight, read
    as its (K, N) column-major view, no copy), the bf16 result against the fp64 product."""
    t, n, k = 384, 4096, 1024
    g = torch.Generator(device="cuda").manual_seed(3)
    dy = torch.randn(t, n, generator=g, device="cuda")
    w = torch.randn(n, k, generator=g, device="cuda")
    s_dy = dy.abs().amax(dim=1, keepdim=True) / torch.finfo(E5).max
    s_w = w.abs().amax() / torch.finfo(E4).max
    dy8, w8t = (dy / s_dy).to(E5), (w / s_w).to(E4).t().contiguous().t()  # b (N, K) read K-major
    _check(dy8, w8t, s_dy, s_w.reshape(1, 1).expand(1, k).contiguous(), "dY e5m2 @ W e4m3")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=st.integers(1, 700), n=st.integers(1, 80).map(lambda v: v * 16), k=st.integers(1, 60).map(lambda v: v * 16),
       pair=st.sampled_from(PAIRS), kind=st.sampled_from(["tensor", "row"]))  # fmt: skip
def test_e5m2_hypothesis(m, n, k, pair, kind):
    a, b = _operands(m, n, k, m * 7 + n, *pair)
    sa, sb = _scales(kind, m, n, seed=k)
    _check(a, b, sa, sb, f"{pair} {kind} {m}x{n}x{k}")
