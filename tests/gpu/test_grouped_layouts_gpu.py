"""The grouped forms with layouts torch accepts and TMA cannot always address (they used to be
rejected), on the GPU: hypothesis over operand / out views with NaN-poisoned outputs
(tests/layout_cases.py; the CPU twin is tests/cpu/test_grouped_layouts_cpu.py)."""

import pytest
from hypothesis import given, settings

from ..layout_cases import LAYOUT_STRATEGY, check_packed_layout

pytestmark = pytest.mark.gpu


@settings(max_examples=30, deadline=None)
@given(**LAYOUT_STRATEGY)
def test_packed_any_layout_against_the_twin(counts, tail, k, n, a_how, b_t, b_step, out_how):
    check_packed_layout("cuda", counts, tail, k, n, a_how, b_t, b_step, out_how)
