"""Blackwell rules checked without a GPU: which kernel arch and compile target serve each compute
capability, the transaction-byte rule of the stage barriers (compile-check's ``stage_tx_errors``)
on the configurations whose arithmetic a mixed MXFP8 x MXFP4 kernel got wrong, and the TMEM plan
of the block-scaled kernels (two accumulator buffers, overlapping at tile_n = 256: no accumulator
column is overwritten before the epilogue has read it; compile-check's ``tmem_errors``)."""

import dataclasses
from types import SimpleNamespace

import pytest

from cutegemm.compile_check import stage_data_bytes, stage_k, stage_tx_errors, tmem_errors
from cutegemm.config import GemmConfig
from cutegemm.gemm.sm100.blockscaled import tmem_plan
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


# -- TMEM: accumulator buffers and scale factors ------------------------------------------------
def _sf_cols(tile_m: int, tile_n: int, two_cta: bool) -> int:
    """SFA (32-row groups of the CTA's rows) + SFB (the tile's columns rounded up to 128) x 4 K blocks."""
    return ((tile_m // (2 if two_cta else 1)) // 32 + -(-tile_n // 128) * 4) * 4


def _read_order(plan, buf: int, num_epi: int) -> list[int]:
    """Subtiles in the epilogue's read order (the kernel's ``sub``): buffer 0 of an overlapping
    plan backwards."""
    if plan.overlap_cols and buf == 0:
        return list(range(num_epi))[::-1]
    return list(range(num_epi))


def _simulate(plan, acc_cols: int, epi_cols: int, epi_m_tiles: int, tiles: int = 6) -> list[str]:
    """Run the acc pipeline's protocol tile by tile and report every TMEM column an MMA overwrites
    before the epilogue of the tile that owns it has read it. Tile t uses buffer t % 2 (one stage:
    the pipeline phase; two stages: the stage index). The MMA of tile t may start once the
    epilogue of tile t - acc_stage released its stage; the epilogue runs tiles in order."""
    n_tiles_cols = acc_cols // epi_cols
    num_epi = n_tiles_cols * epi_m_tiles
    release = plan.release_after(epi_cols, epi_m_tiles, num_epi)
    start = [0, plan.stage_cols]
    problems = []
    unread = {}  # column -> tile whose accumulator holds it and has not been read yet
    for t in range(tiles):
        buf = t % 2
        cols = range(start[buf], start[buf] + acc_cols)
        for c in cols:  # tile t's MMAs write its buffer
            if c in unread and unread[c] != t:
                problems.append(f"tile {t} overwrites column {c} of tile {unread[c]} before it is read")
        for c in cols:
            unread[c] = t
        # One stage: tile t + 1's MMA starts right at tile t's release (the worst case), so the
        # epilogue's reads after the release race it. Two stages: disjoint buffers, each guarded
        # by its own pipeline stage (released after its last read).
        if plan.acc_stage == 1:
            order = _read_order(plan, buf, num_epi)
            for i in range(release + 1):
                n = order[i] // epi_m_tiles
                for c in range(start[buf] + n * epi_cols, start[buf] + (n + 1) * epi_cols):
                    unread.pop(c, None)
            rest = order[release + 1 :]
            nxt = (t + 1) % 2
            nxt_cols = set(range(start[nxt], start[nxt] + acc_cols))
            for i in rest:
                n = i // epi_m_tiles
                for c in range(start[buf] + n * epi_cols, start[buf] + (n + 1) * epi_cols):
                    if c in nxt_cols:
                        problems.append(f"tile {t} reads column {c} after tile {t + 1}'s MMA started")
                    unread.pop(c, None)
        else:
            for c in cols:  # two disjoint stages: read fully before the stage is reused
                unread.pop(c, None)
    return problems


@pytest.mark.parametrize("tile_m, tile_n, two_cta", [(128, 64, False), (128, 128, False), (128, 192, False),
                                                      (128, 256, False), (256, 256, True), (256, 192, True)])  # fmt: skip
@pytest.mark.parametrize("epi_cols, epi_m_tiles", [(16, 1), (32, 1), (64, 1), (32, 2)])
def test_tmem_plan_never_overwrites_an_unread_accumulator(tile_m, tile_n, two_cta, epi_cols, epi_m_tiles):
    plan = tmem_plan(tile_n, _sf_cols(tile_m, tile_n, two_cta))
    assert plan.buffers == 2 and plan.alloc_cols <= 512
    assert plan.stage_cols + tile_n + _sf_cols(tile_m, tile_n, two_cta) <= plan.alloc_cols
    assert (plan.acc_stage == 1) == (tile_n == 256)  # the only tile whose two accumulators overlap
    assert _simulate(plan, tile_n, epi_cols, epi_m_tiles) == []


def test_tmem_simulation_catches_a_late_release_point():
    """The check is not vacuous: releasing before the shared columns are read is flagged."""
    plan = tmem_plan(256, _sf_cols(128, 256, False))
    assert plan.overlap_cols == 48 and plan.stage_cols == 208 and plan.acc_span == 464
    early = dataclasses.replace(plan, overlap_cols=16)  # releases after one 32-column subtile
    assert _simulate(early, 256, 32, 1)
    assert _simulate(plan, 256, 32, 1) == []
    forward = SimpleNamespace(**{**dataclasses.asdict(plan), "overlap_cols": 0})  # no reversal of buffer 0
    forward.release_after = lambda e, m, n: plan.release_after(e, m, n)
    assert _simulate(forward, 256, 32, 1)


def test_tmem_rule_of_compile_check():
    cfg = _bs("e4m3", "e4m3", 128, 256)
    plan = tmem_plan(256, 48)
    ok = SimpleNamespace(tmem=plan, num_acc_tmem_cols=plan.acc_span)
    assert tmem_errors(cfg, ok) == []
    one_buffer = dataclasses.replace(plan, buffers=1, stage_cols=0, overlap_cols=0, acc_span=256)
    assert any("one accumulator buffer" in e for e in tmem_errors(cfg, SimpleNamespace(tmem=one_buffer, num_acc_tmem_cols=256)))
    assert any("scale factors start" in e for e in tmem_errors(cfg, SimpleNamespace(tmem=plan, num_acc_tmem_cols=512)))
    with pytest.raises(ValueError, match="exceed"):
        tmem_plan(480, 48)
