"""The tail-zeroing kernel (cutegemm.epilogue.zero_tail) on the GPU: rows at or past offs[-1] of a
NaN-poisoned output become zero, every other row and every byte past the output keep their bits,
for any dtype, offs[-1] anywhere in [0, R] (and past it), many grid sizes; ``ops.packed_zero_tail``
with it against the packed grouped GEMM's reference, as the MoE backward calls it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cutegemm import ops
from cutegemm.epilogue.zero_tail import kernel_takes, zero_tail_cuda

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn]


def _poisoned(rows, cols, dtype, slack):
    """(buffer, out): out (rows, cols) at the start of a NaN-filled buffer ``slack`` rows longer."""
    buf = torch.full(((rows + slack) * cols,), float("nan"), dtype=torch.float32, device="cuda").to(dtype)
    return buf, buf[: rows * cols].view(rows, cols)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 3000), cols16=st.integers(1, 80), dtype=st.sampled_from(DTYPES),
       end=st.integers(-2, 3100), experts=st.integers(1, 9))  # fmt: skip
def test_zero_tail_writes_only_the_tail(rows, cols16, dtype, end, experts):
    cols = cols16 * 16 // torch.empty((), dtype=dtype).element_size()  # rows a multiple of 16 bytes
    buf, out = _poisoned(rows, cols, dtype, 3)
    before = buf.view(torch.uint8).clone()
    offs = torch.linspace(0, end, experts + 1, device="cuda").round().to(torch.int32)[1:].contiguous()
    assert kernel_takes(out, offs)
    zero_tail_cuda(out, offs)
    first = min(max(int(offs[-1]), 0), rows)
    b = buf.view(torch.uint8).view(-1)
    row_bytes = cols * out.element_size()
    assert torch.equal(b[: first * row_bytes], before[: first * row_bytes]), "a row before offs[-1] changed"
    assert torch.all(b[first * row_bytes: rows * row_bytes] == 0), "a tail row is not zero"
    assert torch.equal(b[rows * row_bytes:], before[rows * row_bytes:]), "wrote past the output"


def test_zero_tail_large_tail_takes_the_strided_grid():
    out = torch.full((70000, 2048), float("nan"), dtype=torch.bfloat16, device="cuda")  # > 4 CTAs per SM
    offs = torch.tensor([5, 17], dtype=torch.int32, device="cuda")
    zero_tail_cuda(out, offs)
    assert torch.isnan(out[:17]).all() and (out[17:] == 0).all()


def test_kernel_takes_rules():
    offs = torch.tensor([4], dtype=torch.int32, device="cuda")
    assert kernel_takes(torch.empty(8, 8, dtype=torch.bfloat16, device="cuda"), offs)
    assert not kernel_takes(torch.empty(8, 4, dtype=torch.bfloat16, device="cuda"), offs)  # 8-byte rows
    assert not kernel_takes(torch.empty(8, 16, dtype=torch.bfloat16, device="cuda")[:, :8], offs)  # strided
    assert not kernel_takes(torch.empty(8, 8, dtype=torch.bfloat16, device="cuda"), offs.long())
    assert not kernel_takes(torch.empty(8, 8, dtype=torch.bfloat16, device="cuda"), offs[:0])


@pytest.mark.parametrize("kernel", [True, False])
@pytest.mark.parametrize("sizes", [[100, 0, 37, 64], [0, 0, 0], [128, 256]])
def test_packed_zero_tail_matches_the_reference(monkeypatch, kernel, sizes):
    monkeypatch.setattr(ops, "ZERO_TAIL_KERNEL", kernel)
    g = torch.Generator(device="cuda").manual_seed(len(sizes))
    rows = sum(sizes) + 45  # 45 rows past the last expert
    a = torch.randn(rows, 256, device="cuda", generator=g).bfloat16()
    b = torch.randn(len(sizes), 256, 192, device="cuda", generator=g).bfloat16()
    offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    with torch.no_grad():
        out = ops.packed_zero_tail(a, b, offs)
    ref = ops._grouped_ref(a, b, offs=offs, out_dtype=torch.bfloat16)
    end = int(offs[-1])
    assert (out[end:] == 0).all()
    torch.testing.assert_close(out[:end].float(), ref[:end].float(), atol=0.05, rtol=0.02)
