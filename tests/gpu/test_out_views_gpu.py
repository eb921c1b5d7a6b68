"""``out=`` views whose rows are not a multiple of 16 bytes (N odd for bf16, N % 4 for fp32), inside
a larger NaN-poisoned buffer: the TMA store writes whole 16-byte row pieces, so the library must
never let it reach the caller's memory past column N (regression: it wrote columns N .. N + 7)."""

from __future__ import annotations

import pytest
import torch

import cutegemm

from ..gemm_check import assert_outside_untouched, assert_within_torch_error

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


_LAYOUTS = {
    "column-offset": lambda buf, m, n: buf[:m, 1 : n + 1],  # 2 bytes past a 16-byte boundary
    "row-offset-odd-stride": lambda buf, m, n: buf[1 : m + 1, :n],
    "column-major": lambda buf, m, n: buf[:n, :m].t(),
}


@pytest.mark.parametrize("layout", list(_LAYOUTS))
@pytest.mark.parametrize("m,n,k", [(100, 72, 64), (33, 130, 96)])
def test_dense_out_of_any_layout(layout, m, n, k):
    """out= views the TMA store cannot write in place (torch.matmul(out=) takes them): computed
    into an aligned scratch and copied in; nothing around them in the NaN-poisoned buffer written."""
    torch.manual_seed(m * n)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    side = max(m, n) + 3
    buf = torch.full((side, side + 1), float("nan"), device="cuda", dtype=torch.bfloat16)  # an odd row length
    out = _LAYOUTS[layout](buf, m, n)
    assert cutegemm.gemm(a, b, bias=bias, out=out) is out
    assert not torch.isnan(out).any()
    assert int(torch.isnan(buf).sum()) == buf.numel() - m * n, "written outside out"
    ref = a.double() @ b.double() + bias.double()
    assert_within_torch_error(out, (a @ b + bias).to(torch.bfloat16), ref, what=layout)


@pytest.mark.parametrize(
    "make",
    [lambda: (torch.randn(64, 100).t(), torch.randn(64, 40)),  # x.t() of 100 tokens (M-major, 200-byte stride)
     lambda: (torch.randn(30, 32), torch.randn(32, 7)),  # N = 7, no out
     lambda: (torch.randn(33, 40)[:, 1:33], torch.randn(48, 32).t()),  # A at an odd offset and stride
     lambda: (torch.randn(3, 7, 24).transpose(1, 2), torch.randn(3, 7, 40))],  # batched, 14-byte strides
    ids=["m-major-100-tokens", "n7", "a-offset", "batched-odd"],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_operands_torch_accepts_are_computed(make, dtype):
    """Operand layouts TMA cannot address take the staging route (an aligned copy), never an error."""
    torch.manual_seed(0)
    a, b = (t.to(dtype).cuda() for t in make())
    ours = cutegemm.gemm(a, b)
    theirs = torch.matmul(a, b)
    assert ours.shape == theirs.shape and ours.is_contiguous()
    assert_within_torch_error(ours, theirs, a.double() @ b.double(), what="staged operands")
