"""Blackwell rules checked without a GPU: which kernel arch and compile target serve each compute
capability, and the transaction-byte rule of the stage barriers (compile-check's
``stage_tx_errors``) on the configurations whose arithmetic a mixed MXFP8 x MXFP4 kernel got wrong."""

from types import SimpleNamespace

import pytest

from cutegemm.compile_check import stage_data_bytes, stage_k, stage_tx_errors
from cutegemm.config import GemmConfig
from cutegemm.runtime.cache import COMPILE_TARGETS, compile_options
from cutegemm.runtime.device import arch_for_capability


@pytest.mark.parametrize(
    "cap, arch, target",
    [((9, 0), "sm_90a", "sm_90a"),  # H100 / H200
     ((10, 0), "sm_100a", "sm_100f"),  # B200 / GB200
     ((10, 3), "sm_100a", "sm_100f"),  # B300 / GB300: an sm_100a cubin would not load
     ((10, 1), "sm_100a", "sm_100f")],  # another member of the family
)  # fmt: skip
def test_capability_to_arch_and_compile_target(cap, arch, target):
    assert arch_for_capability(*cap) == arch
    assert COMPILE_TARGETS[arch] == target and f"--gpu-arch {target} " in compile_options(arch)


@pytest.mark.parametrize("cap", [(8, 0), (8, 9), (11, 0), (12, 0), (12, 1)])
def test_other_gpus_are_refused_by_name(cap):
    with pytest.raises(ValueError, match=f"sm_{cap[0]}{cap[1]}"):
        arch_for_capability(*cap)


def _bs(a, b, tile_m, tile_n, two_cta=False, cluster=(1, 1)):
    sf = ("e4m3", 16) if a == b == "e2m1" else ("e8m0", 32)
    return GemmConfig(arch="sm_100a", a_dtype=a, b_dtype=b, a_major="k", b_major="k", tile_m=tile_m, tile_n=tile_n,
                      two_cta=two_cta, cluster_m=cluster[0], cluster_n=cluster[1], sf_dtype=sf[0], sf_vec=sf[1])


@pytest.mark.parametrize(
    "cfg, k, data",
    [(_bs("e4m3", "e2m1", 128, 128, cluster=(1, 2)), 128, 128 * 128 + 128 * 128 // 2),  # 24576
     (_bs("e4m3", "e2m1", 256, 256, two_cta=True, cluster=(2, 1)), 128, 256 * 128 + 256 * 128 // 2),  # 49152
     (_bs("e2m1", "e4m3", 128, 256), 128, 128 * 128 // 2 + 256 * 128),
     (_bs("e2m1", "e2m1", 128, 256), 256, (128 + 256) * 256 // 2),  # kind::mxf4nvf4: 64-deep MMAs
     (_bs("e4m3", "e4m3", 128, 256), 128, (128 + 256) * 128),
     (GemmConfig(arch="sm_100a", tile_m=128, tile_n=256), 64, (128 + 256) * 64 * 2),
     (GemmConfig(arch="sm_90a", tile_m=128, tile_n=256), 64, (128 + 256) * 64 * 2),
     (GemmConfig(arch="sm_90a", tile_m=64, tile_n=64, a_rows=16, a_major="k", b_major="k"), 64, (16 + 64) * 64 * 2)],
)  # fmt: skip
def test_stage_bytes_use_the_element_widths(cfg, k, data):
    assert stage_k(cfg) == k and stage_data_bytes(cfg) == data


def test_the_rule_flags_a_barrier_armed_with_the_storage_width():
    """The mixed pair's 4-bit operand sits a byte per element in shared memory: arming the barrier
    with shared-memory bytes (33792 for 128x128) expects 8192 B the TMA never delivers."""
    cfg = _bs("e4m3", "e2m1", 128, 128, cluster=(1, 2))
    sf = 512 + 512  # SFA + SFB bytes per CTA and stage: 128 rows x 4 K blocks each
    right = SimpleNamespace(tma_bytes=24576 + sf, tx_sf_bytes=sf)
    wrong = SimpleNamespace(tma_bytes=2 * 128 * 128 + sf, tx_sf_bytes=sf)
    assert stage_tx_errors(cfg, right) == []
    (problem,) = stage_tx_errors(cfg, wrong)
    assert "armed with 33792 B" in problem and "deliver 25600 B" in problem
    pair = _bs("e4m3", "e2m1", 256, 256, two_cta=True, cluster=(2, 1))
    assert stage_tx_errors(pair, SimpleNamespace(tma_bytes=49152 + 2 * 1536, tx_sf_bytes=1536)) == []
    assert stage_tx_errors(pair, SimpleNamespace(tma_bytes=68608, tx_sf_bytes=1536))
