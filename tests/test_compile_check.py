"""CPU: every kernel variant of the support matrix compiles for its arch (no GPU) and its SASS has
the intended instructions and no local-memory spills."""

import pytest

from cutegemm.compile_check import all_variants, check_config

VARIANTS = all_variants(["sm_90a", "sm_100a"])


@pytest.mark.parametrize("cfg", VARIANTS, ids=[c.name for c in VARIANTS])
def test_variant_compiles_with_expected_sass(cfg):
    res = check_config(cfg)
    assert res.ok, res.line()
