"""Grouped forms with the layouts torch accepts, on the CPU: the host path of every form runs
with the compiled kernel replaced by tests/emulated_kernel.py (it computes from the views it is
handed), so these check the staging route (aligned copies of operands TMA cannot address, an
aligned scratch for an out it cannot store), the 3d forms' rewriting and what is cached, against
the reference twin, with NaN-poisoned outputs: every element of out written, nothing around it,
rows past offs[-1] untouched."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cutegemm
from cutegemm.grouped import packed

from ..emulated_kernel import emulated_kernels
from ..layout_cases import LAYOUT_STRATEGY, M_MAJOR_STRATEGY, check_m_major_out, check_packed_layout

BF = torch.bfloat16


@settings(max_examples=40, deadline=None)
@given(**LAYOUT_STRATEGY)
def test_packed_any_layout_against_the_twin(counts, tail, k, n, a_how, b_t, b_step, out_how):
    """Packed 2d x 3d with A of any layout, B transposed / strided over the experts, any N, out of
    any view (or none); rows past offs[-1] (``tail``) keep their NaN poison."""
    with emulated_kernels():
        check_packed_layout("cpu", counts, tail, k, n, a_how, b_t, b_step, out_how)


def _offs(counts):
    return torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)


def test_staged_calls_are_not_cached_aligned_ones_are():
    """The warm fast path is for aligned calls only: a staged call builds no plan."""
    offs = _offs([5, 9, 2])
    b = torch.randn(3, 32, 48).to(BF)
    with emulated_kernels() as cache:
        cutegemm.grouped_gemm(torch.randn(32, 16).to(BF).t(), b, offs=offs)  # column-major a: staged
        cutegemm.grouped_gemm(torch.randn(16, 32).to(BF), torch.randn(3, 32, 7).to(BF), offs=offs)  # N = 7
        assert len(packed.PLANS) == 0
        a = torch.randn(16, 32).to(BF)
        for _ in range(3):
            cutegemm.grouped_gemm(a, b, offs=offs)
        assert len(packed.PLANS) == 1 and len(cache.kernels) == 3


def test_k_grouped_small_odd_sizes_one_launch():
    """K-grouped with m = 3, n = 7, offs [0, 8, 16, 16, 27] (torch's compiled-test shapes): no out
    given, so nothing to reject: one K-grouped launch into a padded scratch, a compact result."""
    offs = torch.tensor([0, 8, 16, 16, 27], dtype=torch.int32)
    x, dy = torch.randn(27, 3).to(BF), torch.randn(27, 7).to(BF)
    with emulated_kernels() as cache:
        got = cutegemm.grouped_gemm(x.t(), dy, offs=offs)
        assert [kern.cfg.kgrouped for kern in cache.kernels] == [True] and cache.kernels[0].calls == 1
    assert got.shape == (5, 3, 7) and got.is_contiguous()
    torch.testing.assert_close(got, cutegemm.grouped_gemm_ref(x.t(), dy, offs=offs), atol=1e-2, rtol=1e-2)
    assert torch.equal(got[0], torch.zeros(3, 7, dtype=BF)) and torch.equal(got[3], torch.zeros(3, 7, dtype=BF))


@settings(max_examples=20, deadline=None)
@given(m=st.sampled_from([8, 24, 40]), n=st.sampled_from([1, 3, 16, 33]), counts=st.lists(st.integers(0, 20), min_size=1,
       max_size=5), dtype=st.sampled_from([BF, torch.float32]))  # fmt: skip
def test_k_grouped_into_an_m_major_out(m, n, counts, dtype):
    """K-grouped with ``out`` the transposed view of an (E, N, M) buffer (a weight gradient in an
    (E, N, K) weight's layout): a 16-bit out with 16-byte columns is stored M-major in place
    (config.c_major "m", one launch, no scratch), others (fp32, one column) through the scratch;
    every element written."""
    offs = _offs(counts)
    x, dy = torch.randn(int(offs[-1]), m).to(BF), torch.randn(int(offs[-1]), n).to(BF)
    buf = torch.full((len(counts), n, m), float("nan"), dtype=dtype)
    with emulated_kernels() as cache:
        got = cutegemm.grouped_gemm(x.t(), dy, offs=offs, out=buf.mT, out_dtype=dtype)
        cfgs = [kern.cfg for kern in cache.kernels]
    assert got.data_ptr() == buf.data_ptr() and len(cfgs) == (1 if sum(counts) else 0)  # (K = 0: zeros, no launch)
    assert all(c.kgrouped and c.c_major == ("m" if dtype == BF and n > 1 else "n") for c in cfgs)  # (N = 1: scratch)
    torch.testing.assert_close(buf.mT, cutegemm.grouped_gemm_ref(x.t(), dy, offs=offs, out_dtype=dtype), atol=1e-2, rtol=1e-2)


def test_3d_forms_route_and_match_torch():
    """3d x 3d: the dense batched GEMM, or the packed form (offs (1..G) * M, one kernel) with a
    per-group bias; 3d x 2d: the packed form transposed. The operands' odd strides are ones
    torch._grouped_mm refuses (not 16-byte multiples): the reference is torch's fp32 product."""
    torch.manual_seed(0)
    g, m, n, k = 3, 5, 7, 13
    a = torch.randn(g, k, m).to(BF).transpose(1, 2)
    b = torch.randn(g, k, n).to(BF)
    with emulated_kernels() as cache:
        out = cutegemm.grouped_gemm(a, b)
        assert cache.kernels[-1].cfg.form.value.startswith("dense")
        torch.testing.assert_close(out, (a.float() @ b.float()).to(BF))
        bias = torch.randn(g, n)
        out = cutegemm.grouped_gemm(a, b, bias=bias)
        assert cache.kernels[-1].cfg.grouped
        torch.testing.assert_close(out.float(), (a.float() @ b.float() + bias[:, None]), atol=2e-2, rtol=2e-2)
        b2 = torch.randn(k, 11).to(BF)
        offs = torch.tensor([4, 4, 11], dtype=torch.int32)
        expected = torch.cat([a[0].float() @ b2[:, :4].float(), a[2].float() @ b2[:, 4:].float()], 1).to(BF)
        out = cutegemm.grouped_gemm(a, b2, offs=offs)
        assert out.shape == (m, 11) and out.is_contiguous()
        torch.testing.assert_close(out, expected)
        col_major = torch.full((11, m), float("nan"), dtype=BF).t()  # the kernel's (total_N, M) layout
        assert cutegemm.grouped_gemm(a, b2, offs=offs, out=col_major) is col_major
        torch.testing.assert_close(col_major, expected)


@settings(max_examples=40, deadline=None)
@given(**M_MAJOR_STRATEGY, route=st.booleans())
def test_m_major_out_in_place(counts, tail, k, m, dtype, route):
    """The packed form into an M-major out and the 3d x 2d form: with ``PACKED_M_MAJOR`` on
    (``route``) the kernel stores C M-major in place where it can (config.c_major "m"), else (and
    with it off) through the row-major scratch (tests/layout_cases.py)."""
    from cutegemm.gemm import launch

    saved, launch.PACKED_M_MAJOR = launch.PACKED_M_MAJOR, route
    try:
        _m_major_case(counts, tail, k, m, dtype)
    finally:
        launch.PACKED_M_MAJOR = saved


def _m_major_case(counts, tail, k, m, dtype):
    with emulated_kernels() as cache:
        seen = [0]

        def used_configs():
            new = [kern.cfg for kern in cache.kernels[seen[0]:]]
            seen[0] = len(cache.kernels)
            return new

        check_m_major_out("cpu", counts, tail, k, m, dtype, used_configs)
