"""The grouped forms with layouts torch accepts and TMA cannot always address (they used to be
rejected), on the GPU: hypothesis over operand / out views with NaN-poisoned outputs
(tests/layout_cases.py; the CPU twin is tests/cpu/test_grouped_layouts_cpu.py)."""

import pytest
import torch
from hypothesis import given, settings

from cutegemm.grouped import packed

from ..layout_cases import LAYOUT_STRATEGY, M_MAJOR_STRATEGY, check_m_major_out, check_packed_layout

pytestmark = pytest.mark.gpu


@settings(max_examples=30, deadline=None)
@given(**LAYOUT_STRATEGY)
def test_packed_any_layout_against_the_twin(counts, tail, k, n, a_how, b_t, b_step, out_how):
    check_packed_layout("cuda", counts, tail, k, n, a_how, b_t, b_step, out_how)


class _Recording:
    """The packed form's kernel cache, recording the configs it is asked for."""

    def __init__(self, inner):
        self.inner, self.cfgs = inner, []

    def get(self, cfg):
        self.cfgs.append(cfg)
        return self.inner.get(cfg)


@settings(max_examples=25, deadline=None)
@given(**M_MAJOR_STRATEGY)
def test_m_major_out_in_place(counts, tail, k, m, dtype):
    """The packed form into an M-major out and the 3d x 2d form with ``PACKED_M_MAJOR`` off
    (through the row-major scratch); NaN poison kept past offs[-1] (tests/layout_cases.py)."""
    from cutegemm.gemm import launch

    saved, launch.PACKED_M_MAJOR = launch.PACKED_M_MAJOR, False
    try:
        _m_major_gpu(counts, tail, k, m, dtype)
    finally:
        launch.PACKED_M_MAJOR = saved


@settings(max_examples=25, deadline=None)
@given(**M_MAJOR_STRATEGY)
def test_m_major_route_with_unaligned_experts(counts, tail, k, m, dtype):
    """``PACKED_M_MAJOR`` on (as shipped): the kernel stores C M-major in place (config.c_major
    "m"), experts starting at a row that is not a multiple of 8 by predicated copies (an H100
    faulted with an illegal instruction on counts [146, 146, 247], tail 13, k 64, m 7 before that
    guard)."""
    from cutegemm.gemm import launch

    saved, launch.PACKED_M_MAJOR = launch.PACKED_M_MAJOR, True
    try:
        _m_major_gpu([146, 146, 247], 13, 64, 7, torch.bfloat16)
        _m_major_gpu(counts, tail, k, m, dtype)
    finally:
        launch.PACKED_M_MAJOR = saved


def _m_major_gpu(counts, tail, k, m, dtype):
    saved = packed.GROUPED_CACHE
    packed.GROUPED_CACHE = rec = _Recording(saved)
    packed.PLANS.clear()  # every call below cold once: its config is recorded
    try:
        seen = [0]

        def used_configs():
            new = rec.cfgs[seen[0]:]
            seen[0] = len(rec.cfgs)
            return new

        check_m_major_out("cuda", counts, tail, k, m, dtype, used_configs)
    finally:
        packed.GROUPED_CACHE = saved
