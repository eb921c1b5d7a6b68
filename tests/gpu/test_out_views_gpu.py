"""``out=`` views whose rows are not a multiple of 16 bytes (N odd for bf16, N % 4 for fp32), inside
a larger NaN-poisoned buffer: the TMA store writes whole 16-byte row pieces, so the library must
never let it reach the caller's memory past column N (regression: it wrote columns N .. N + 7)."""

from __future__ import annotations

import pytest
import torch

import cutegemm

from ..gemm_check import assert_outside_untouched

pytestmark = pytest.mark.gpu


def _buf(m, n, dtype):
    buf = torch.full((m + 3, n + 15), float("nan"), dtype=dtype, device="cuda")
    return buf, buf[:m, :n]


@pytest.mark.parametrize("m,n,k", [(77, 65, 48), (64, 130, 64), (300, 257, 128)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_dense_out_view_with_unaligned_rows(m, n, k, out_dtype):
    if torch.cuda.get_device_capability()[0] not in (9, 10):
        pytest.skip("sm_90 / sm_100 only")
    torch.manual_seed(n)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    for kw in ({}, {"bias": bias}):
        buf, out = _buf(m, n, out_dtype)
        assert cutegemm.gemm(a, w.t(), out=out, **kw) is out
        assert_outside_untouched(buf, m, n)
        ref = a.double() @ w.double().t() + (bias.double() if kw else 0)
        torch.testing.assert_close(out.double(), ref, atol=0.1, rtol=0.02)
    if torch.cuda.get_device_capability()[0] == 9:  # FP8 row-wise (sm_90a)
        a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        sa, sb = torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5
        buf, out = _buf(m, n, out_dtype)
        cutegemm.gemm(a8, w8.t(), scale_a=sa, scale_b=sb, out=out)
        assert_outside_untouched(buf, m, n)
        ref = (a8.double() @ w8.double().t()) * sa.double() * sb.double()
        torch.testing.assert_close(out.double(), ref, atol=0.1, rtol=0.02)
