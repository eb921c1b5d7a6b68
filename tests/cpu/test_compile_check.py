"""CPU: every kernel variant of the support matrix compiles for its arch (no GPU) and its SASS has
the intended instructions and no local-memory spills."""

import pytest

from cutegemm.compile_check import all_variants, check_config
from cutegemm.config import Form

VARIANTS = all_variants(["sm_90a", "sm_100a"])


@pytest.mark.parametrize("cfg", VARIANTS, ids=[c.name for c in VARIANTS])
def test_variant_compiles_with_expected_sass(cfg):
    res = check_config(cfg)
    assert res.ok, res.line()


def test_serialized_wgmma_is_caught():
    """The C7520 check: a kernel whose every WGMMA waits for itself fails, a batched one passes,
    and the MXFP8 emulation (one WGMMA per commit group by design) is not judged."""
    from cutegemm.compile_check import wgmma_serialized
    from cutegemm.config import GemmConfig

    batched = "\n".join(["HGMMA.64x256x16.F32.BF16 R24, gdesc[UR16], R24 ;"] * 3
                        + ["HGMMA.64x256x16.F32.BF16 R24, gdesc[UR16], R24, gsb0 ;", "WARPGROUP.DEPBAR.LE gsb0, 0x1 ;"])  # fmt: skip
    serial = "\n".join(["HGMMA.64x256x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;", "WARPGROUP.DEPBAR.LE gsb0, 0x0 ;"] * 4)
    cfg = GemmConfig(arch="sm_90a", form=Form.GROUPED, tile_m=128, tile_n=256)
    assert not wgmma_serialized(cfg, batched)
    assert wgmma_serialized(cfg, serial)
    mx = GemmConfig(arch="sm_90a", a_dtype="e4m3", b_dtype="e4m3", a_major="k", b_major="k", fp8_mx=True)
    assert not wgmma_serialized(mx, serial.replace("HGMMA", "QGMMA"))
