"""torch._grouped_mm's own test cases (pytorch/pytorch test/test_matmul_cuda.py), rewritten for
``cutegemm.grouped_gemm`` (forward values; the sources' backward checks are not rewritten: our
custom op's gradients are tests/cpu/test_ops_cpu.py's). Inputs are built as the source builds
them (row- / column-major, strided views, zero-size groups); the result of every group is compared
with ``torch.mm`` of the group's slices, as the source's ``grouped_mm_helper`` does, with its
tolerance (``assertEqual``: torch.testing's defaults for bf16). The compiled-test shapes (odd
M / N / K, unaligned leading dimensions) are compared with ``torch._grouped_mm`` itself. See
tests/conformance/helpers.py for the cuda / cpu variants."""

from __future__ import annotations

import pytest
import torch

import cutegemm

from .helpers import DEVICES, run

pytestmark = pytest.mark.source("pytorch/pytorch test/test_matmul_cuda.py")

BF = torch.bfloat16
LAYOUTS = [(s, a, b) for s in (False, True) for a in (False, True) for b in (False, True)]
LAYOUT_IDS = [f"strided{int(s)}-a_row_major{int(a)}-b_row_major{int(b)}" for s, a, b in LAYOUTS]


def _bounds(offs):
    start = 0
    for end in offs.tolist():
        yield start, end
        start = end


def _check_groups(device, a, b, offs, pieces):
    """ours and the reference twin: every (out slice, a slice, (N, K) b slice) against torch.mm."""
    ours = run(device, cutegemm.grouped_gemm, a, b, offs=offs, out_dtype=BF)
    twin = cutegemm.grouped_gemm_ref(a, b, offs=offs, out_dtype=BF)
    for result in (ours, twin):
        for sel, a_g, b_g in pieces:
            torch.testing.assert_close(sel(result), torch.mm(a_g, b_g.t()))


# pytorch/pytorch test/test_matmul_cuda.py::test_grouped_gemm_2d_2d
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("strided,a_row_major,b_row_major", LAYOUTS, ids=LAYOUT_IDS)
def test_grouped_gemm_2d_2d(device, strided, a_row_major, b_row_major):
    torch.manual_seed(0)
    m, n, k, groups = 16, 32, 64, 4
    total = k * groups + k * int(strided)
    if a_row_major:
        a = torch.randn(m, total, device=device, dtype=BF)[:, : k * groups]
    else:
        a = torch.randn(total, m, device=device, dtype=BF).t()[:, : k * groups]
    if b_row_major:
        b = torch.randn(n, total, device=device, dtype=BF)[:, : k * groups]
    else:
        b = torch.randn(total, n, device=device, dtype=BF).t()[:, : k * groups]
    offs = torch.arange(k, groups * k + 1, k, device=device, dtype=torch.int32)
    pieces = [((lambda r, g=g: r[g]), a[:, s:e], b[:, s:e]) for g, (s, e) in enumerate(_bounds(offs))]
    _check_groups(device, a, b.t(), offs, pieces)


def _a_2d(device, m, k, groups, strided, row_major):
    s = int(strided)
    if row_major:
        return torch.randn(m * groups, k * (1 + s), device=device, dtype=BF)[:, :k]
    return torch.randn(k, (m + 2 * s) * groups, device=device, dtype=BF).t()[: m * groups, :]


def _w_3d(device, groups, rows, k, strided, row_major):
    """(groups, rows, k) weights: row-major, or the transpose of (groups, k, rows); every other
    group and the first k columns of twice as many when strided."""
    s = int(strided)
    if row_major:
        return torch.randn(groups * (1 + s), rows, k * (1 + s), device=device, dtype=BF)[:: 1 + s, :, :k]
    w = torch.randn(groups * (1 + s), k * (1 + s), rows, device=device, dtype=BF)
    return w.transpose(-2, -1)[:: 1 + s, :, :k]


# pytorch/pytorch test/test_matmul_cuda.py::test_grouped_gemm_2d_3d (with its zero-size group pass)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("zero_size", [False, True])
@pytest.mark.parametrize("strided,a_row_major,b_row_major", LAYOUTS, ids=LAYOUT_IDS)
def test_grouped_gemm_2d_3d(device, strided, a_row_major, b_row_major, zero_size):
    torch.manual_seed(0)
    m, n, k, groups = 16, 32, 64, 4
    a = _a_2d(device, m, k, groups, strided, a_row_major)
    b = _w_3d(device, groups, n, k, strided, b_row_major)
    assert (a if a_row_major else a.t()).is_contiguous() is not strided
    assert (b if b_row_major else b.transpose(-2, -1)).is_contiguous() is not strided
    offs = torch.arange(m, groups * m + 1, m, device=device, dtype=torch.int32)
    if zero_size:
        offs[0] = offs[1]
    pieces = [((lambda r, s=s, e=e: r[s:e]), a[s:e], b[g]) for g, (s, e) in enumerate(_bounds(offs))]
    _check_groups(device, a, b.transpose(-2, -1), offs, pieces)


# pytorch/pytorch test/test_matmul_cuda.py::test_grouped_gemm_3d_3d
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("strided,a_row_major,b_row_major", LAYOUTS, ids=LAYOUT_IDS)
def test_grouped_gemm_3d_3d(device, strided, a_row_major, b_row_major):
    torch.manual_seed(0)
    m, n, k, groups = 16, 32, 64, 4
    a = _w_3d(device, groups, m, k, strided, a_row_major)
    b = _w_3d(device, groups, n, k, strided, b_row_major)
    pieces = [((lambda r, g=g: r[g]), a[g], b[g]) for g in range(groups)]
    _check_groups(device, a, b.transpose(-2, -1), None, pieces)


# pytorch/pytorch test/test_matmul_cuda.py::test_grouped_gemm_3d_2d (with its zero-size group pass)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("zero_size", [False, True])
@pytest.mark.parametrize("strided,a_row_major,b_row_major", LAYOUTS, ids=LAYOUT_IDS)
def test_grouped_gemm_3d_2d(device, strided, a_row_major, b_row_major, zero_size):
    torch.manual_seed(0)
    m, n, k, groups = 16, 32, 64, 4
    s = int(strided)
    a = _w_3d(device, groups, m, k, strided, a_row_major)
    if b_row_major:
        b = torch.randn(n * groups, k * (1 + s), device=device, dtype=BF)[:, :k]
    else:
        b = torch.randn(k, n * (groups + s), device=device, dtype=BF).t()[: n * groups, :]
    offs = torch.arange(n, groups * n + 1, n, device=device, dtype=torch.int32)
    if zero_size:
        offs[0] = offs[1]
    pieces = [((lambda r, s=s, e=e: r[:, s:e]), a[g], b[s:e]) for g, (s, e) in enumerate(_bounds(offs))]
    _check_groups(device, a, b.t(), offs, pieces)


def _compiled_case(op, a_row_major, b_row_major, device):
    """The operands of the source's compiled test (odd sizes, leading dimensions padded to 16
    bytes and sliced, so the views are unaligned at the end)."""
    align = 8
    up = lambda x: (x + align - 1) // align * align  # noqa: E731
    r = lambda *s: torch.randn(*s, device=device, dtype=BF)  # noqa: E731
    i32 = dict(device=device, dtype=torch.int32)
    if op == "2d/2d":
        m, n = 3, 7
        offs = torch.tensor([0, 1, 6, 6, 7] if not (a_row_major or b_row_major) else [0, 8, 16, 16, 27], **i32)
        k = int(offs[-1])
        a = r(m, up(k))[:, :k] if a_row_major else r(k, up(m)).t()[:m, :]
        b = r(n, up(k))[:, :k] if b_row_major else r(k, up(n)).t()[:n, :]
        return a, b.transpose(-2, -1), offs
    if op == "2d/3d":
        n, k = 7, 13
        offs = torch.tensor([0, 1, 3, 3, 5] if a_row_major else [0, 8, 16, 16, 19], **i32)
        g, m = offs.numel(), int(offs[-1])
        a = r(m, up(k))[:, :k] if a_row_major else r(k, up(m)).t()[:m, :]
        b = r(g, n, up(k))[:, :, :k] if b_row_major else r(g, k, up(n)).transpose(-2, -1)[:, :n, :]
        return a, b.transpose(-2, -1), offs
    if op == "3d/2d":
        m, k = 3, 13
        offs = torch.tensor([0, 8, 16, 16, 19], **i32)
        g, n = offs.numel(), int(offs[-1])
        a = r(g, m, up(k))[:, :, :k] if a_row_major else r(g, k, up(m)).transpose(-2, -1)[:, :m, :]
        b = r(n, up(k))[:, :k] if b_row_major else r(k, up(n)).t()[:n, :]
        return a, b.transpose(-2, -1), offs
    g, m, n, k = 5, 3, 7, 13
    a = r(g, m, up(k))[:, :, :k] if a_row_major else r(g, k, up(m)).transpose(-2, -1)[:, :m, :]
    b = r(g, n, up(k))[:, :, :k] if b_row_major else r(g, k, up(n)).transpose(-2, -1)[:, :n, :]
    return a, b.transpose(-2, -1), None


# pytorch/pytorch test/test_matmul_cuda.py::test_grouped_gemm_compiled (its operands: odd sizes and
# unaligned views; torch.compile / max_autotune is torch's own code path, not rewritten: the
# result is compared with torch._grouped_mm on the same device, as the source does)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("b_row_major", [False, True])
@pytest.mark.parametrize("a_row_major", [False, True])
@pytest.mark.parametrize("op", ["2d/2d", "2d/3d", "3d/2d", "3d/3d"])
def test_grouped_gemm_compiled(device, op, a_row_major, b_row_major):
    torch.manual_seed(0)
    a, b, offs = _compiled_case(op, a_row_major, b_row_major, device)
    expected = torch._grouped_mm(a, b, offs=offs)
    ours = run(device, cutegemm.grouped_gemm, a, b, offs=offs)
    twin = cutegemm.grouped_gemm_ref(a, b, offs=offs)
    torch.testing.assert_close(ours, expected)
    torch.testing.assert_close(twin, expected)


# pytorch/pytorch test/test_matmul_cuda.py (grouped_mm): bias is rejected by torch._grouped_mm;
# cutegemm's grouped forms take a per-expert bias in the 2-D x 3-D form, but not in the 3-D x 2-D
# form (its bias would run along the grouped dimension)
@pytest.mark.unsupported
def test_grouped_gemm_3d_2d_bias_not_supported():
    a = torch.randn(2, 8, 16, dtype=BF)
    b = torch.randn(16, 32, dtype=BF)
    offs = torch.tensor([16, 32], dtype=torch.int32)
    with pytest.raises(ValueError, match="3d x 2d form does not take bias"):
        cutegemm.grouped_gemm(a, b, offs=offs, bias=torch.zeros(32))
