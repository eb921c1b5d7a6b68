"""Layout cases shared by the CPU (emulated kernel) and GPU tests of the grouped forms: operands
and outputs in the views torch accepts and TMA cannot always address, checked against the
reference twin with NaN-poisoned outputs."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

import cutegemm

BF = torch.bfloat16

# hypothesis arguments of check_packed_layout
LAYOUT_STRATEGY = dict(
    counts=st.lists(st.integers(0, 40), min_size=1, max_size=5),
    tail=st.integers(0, 9),
    k=st.integers(1, 40),
    n=st.integers(1, 40),
    a_how=st.sampled_from(["rm", "cm", "off", "pad"]),
    b_t=st.booleans(),
    b_step=st.sampled_from([1, 2]),
    out_how=st.sampled_from([None, "rm", "cm", "off", "pad"]),
)


def view(rows, cols, how, device, dtype=BF, fill=None):
    """(a (rows, cols) view, the buffer it is a view of or None): "rm" row-major compact, "cm"
    column-major, "off" one element past the start with an odd row stride, "pad" row-major with
    3 spare columns."""
    def make(*shape):
        if fill is not None:
            return torch.full(shape, fill, dtype=dtype, device=device)
        return torch.randn(*shape, device=device).to(dtype)

    if how == "rm":
        return make(rows, cols), None
    if how == "cm":
        buf = make(cols, rows)
        return buf.t(), buf
    if how == "off":
        buf = make(rows + 1, cols + 1)
        return buf[1:, 1:], buf
    buf = make(rows, cols + 3)
    return buf[:, :cols], buf


def check_packed_layout(device, counts, tail, k, n, a_how, b_t, b_step, out_how):
    """Packed 2d x 3d: A of any layout, B transposed / strided over the experts, any N, out of any
    view (or none): equal to the twin on the experts' rows; with out=, nothing outside out is
    written and rows past offs[-1] (``tail`` of them) keep their NaN poison."""
    torch.manual_seed(0)
    e, total = len(counts), sum(counts) + tail
    a, _ = view(total, k, a_how, device)
    if b_t:
        b = torch.randn(e * b_step, n, k, device=device).to(BF).transpose(1, 2)[::b_step]
    else:
        b = torch.randn(e * b_step, k, n, device=device).to(BF)[::b_step]
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(device=device, dtype=torch.int32)
    ref = cutegemm.grouped_gemm_ref(a, b, offs=offs)
    end = sum(counts)
    if out_how is None:
        got = cutegemm.grouped_gemm(a, b, offs=offs)
        assert got.shape == (total, n) and got.is_contiguous()
    else:
        out, buf = view(total, n, out_how, device, fill=float("nan"))
        got = cutegemm.grouped_gemm(a, b, offs=offs, out=out)
        assert got is out
        if buf is not None:  # nothing outside the view written
            mask = torch.ones_like(buf, dtype=torch.bool)
            mask.as_strided(out.shape, out.stride(), out.storage_offset() - buf.storage_offset()).fill_(False)
            assert torch.isnan(buf[mask]).all(), "written outside out"
        assert torch.isnan(out[end:]).all(), "a row past offs[-1] was written"
    assert not torch.isnan(got[:end]).any(), "an expert row was not written"
    torch.testing.assert_close(got[:end].float(), ref[:end].float(), atol=1e-2, rtol=1e-2)
