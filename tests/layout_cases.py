"""Layout cases shared by the CPU (emulated kernel) and GPU tests of the grouped forms: operands
and outputs in the views torch accepts and TMA cannot always address, checked against the
reference twin with NaN-poisoned outputs."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

import cutegemm
from cutegemm.gemm.launch import packed_m_major

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


# hypothesis arguments of check_m_major_out
M_MAJOR_STRATEGY = dict(
    counts=st.lists(st.integers(0, 300), min_size=1, max_size=6),
    tail=st.sampled_from([0, 3, 8, 13]),
    k=st.sampled_from([8, 40, 64, 264]),
    m=st.integers(1, 72),
    dtype=st.sampled_from([BF, torch.float16, torch.float32]),
)


def check_m_major_out(device, counts, tail, k, m, dtype, used_configs):
    """The packed form into an M-major out (the transposed view of an (N, total) buffer) and the
    3d x 2d form, whose result is the packed form's transpose: equal to the twin, NaN poison kept
    past offs[-1] (rows of the packed out, columns of the 3d x 2d out), and stored M-major in place
    (config.c_major "m") exactly where the kernel can, with ``gemm.launch.PACKED_M_MAJOR`` on: a
    16-bit out whose M-major rows are 16-byte multiples, more than one column; with it off, through
    the row-major scratch. ``used_configs()``: the configs of the kernels run since the
    last call of it."""
    torch.manual_seed(0)
    e, end = len(counts), sum(counts)
    total = end + tail
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(device=device, dtype=torch.int32)
    in_dtype = BF if dtype == torch.float32 else dtype
    in_place = packed_m_major() and dtype != torch.float32 and total > 0 and total % 8 == 0 and m > 1
    # packed 2d x 3d: a (total, k) x b (e, k, m) into out = buf.t(), buf (m, total)
    a = torch.randn(total, k, device=device).to(in_dtype)
    b = (torch.randn(e, k, m, device=device) * k**-0.5).to(in_dtype)
    buf = torch.full((m, total), float("nan"), dtype=dtype, device=device)
    used_configs()
    got = cutegemm.grouped_gemm(a, b, offs=offs, out=buf.t(), out_dtype=dtype)
    assert got.data_ptr() == buf.data_ptr() and got.stride() == buf.t().stride()
    cfgs = used_configs()
    assert (any(c.c_major == "m" for c in cfgs) if in_place else all(c.c_major == "n" for c in cfgs)), cfgs
    ref = cutegemm.grouped_gemm_ref(a, b, offs=offs, out_dtype=torch.float32)
    assert torch.isnan(buf[:, end:]).all(), "a row past offs[-1] was written"
    assert not torch.isnan(buf[:, :end]).any(), "an expert row was not written"
    torch.testing.assert_close(got[:end].float(), ref[:end], atol=2e-2, rtol=2e-2)
    # 3d x 2d: a3 (e, m, k) x b2 (k, total) with offs splitting total -> (m, total)
    a3 = torch.randn(e, m, k, device=device).to(in_dtype)
    b2 = (torch.randn(k, total, device=device) * k**-0.5).to(in_dtype)
    ref = cutegemm.grouped_gemm_ref(a3, b2, offs=offs, out_dtype=torch.float32)
    used_configs()
    res = cutegemm.grouped_gemm(a3, b2, offs=offs, out_dtype=dtype)
    assert res.shape == (m, total) and res.is_contiguous() and res.dtype == dtype
    torch.testing.assert_close(res[:, :end].float(), ref[:, :end], atol=2e-2, rtol=2e-2)
    out = torch.full((m, total), float("nan"), dtype=dtype, device=device)
    assert cutegemm.grouped_gemm(a3, b2, offs=offs, out=out) is out
    cfgs = used_configs()  # (the out= call may reuse the plan of the call before it)
    assert (any(c.c_major == "m" for c in cfgs) if in_place else all(c.c_major == "n" for c in cfgs)), cfgs
    assert torch.isnan(out[:, end:]).all(), "a column past offs[-1] was written"
    torch.testing.assert_close(out[:, :end].float(), ref[:, :end], atol=2e-2, rtol=2e-2)
