"""CPU tests: config rules, the scheduler's tile map, the policy."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutegemm.config import Form, GemmConfig, GemmProblem, can_implement
from cutegemm.epilogue import EpilogueSpec
from cutegemm.policy import policy_for
from cutegemm.schedulers.static import swizzled_tile_coord


def ceil_div(a, b):
    return -(-a // b)


@settings(max_examples=300, deadline=None)
@given(
    tiles_m=st.integers(1, 40),
    tiles_n=st.integers(1, 40),
    batches=st.integers(1, 4),
    group=st.integers(1, 9),
    raster_m=st.booleans(),
    workers=st.integers(1, 140),
)
def test_every_tile_exactly_once(tiles_m, tiles_n, batches, group, raster_m, workers):
    """The persistent walk (worker w takes w, w + W, ...) visits each (m, n, l) tile exactly once."""
    total = tiles_m * tiles_n * batches
    seen = []
    for w in range(min(workers, total)):
        for idx in range(w, total, workers):
            m, n, l_idx = swizzled_tile_coord(idx, tiles_m, tiles_n, group, raster_m)
            assert 0 <= m < tiles_m and 0 <= n < tiles_n and 0 <= l_idx < batches
            seen.append((m, n, l_idx))
    assert len(seen) == total and len(set(seen)) == total


def test_raster_group_keeps_tiles_in_flight_local():
    """With raster m and group 8, the first 8*M tiles cover 8 N-columns (L2 reuse of B)."""
    coords = [swizzled_tile_coord(i, 16, 32, 8, True) for i in range(16 * 8)]
    assert {n for _, n, _ in coords} == set(range(8))
    assert {m for m, _, _ in coords} == set(range(16))


def test_cluster_tile_counts_cover_problem():
    """Cluster tiles x cluster shape x tile cover the problem (partial clusters included)."""
    for m, n, tm, tn, cm, cn in [(1000, 1032, 128, 256, 2, 1), (1, 8, 64, 128, 1, 2), (4096, 4096, 128, 64, 1, 4)]:
        assert ceil_div(m, tm * cm) * tm * cm >= m and ceil_div(n, tn * cn) * tn * cn >= n


@pytest.mark.parametrize(
    "change,needle",
    [
        (dict(arch="sm_80"), "arch"),
        (dict(a_dtype="fp32", b_dtype="fp32"), "a/b dtype"),
        (dict(out_dtype="int8"), "out dtype"),
        (dict(tile_m=96), "tile_m"),
        (dict(tile_n=112), "tile_n"),
        (dict(cluster_m=3), "cluster_m"),
        (dict(cluster_m=4, cluster_n=2), "cluster size"),
        (dict(two_cta=True), "two_cta"),
        (dict(pingpong=True, tile_m=128, tile_n=256), "pingpong"),
        (dict(a_major="n"), "a_major"),
        (dict(stages=1), "stages"),
        (dict(scheduler="clc"), "scheduler"),
    ],
)
def test_config_rules_name_the_problem(change, needle):
    cfg = replace(GemmConfig(arch="sm_90a"), **change)
    ok, why = can_implement(cfg)
    assert not ok and needle in why


def test_problem_alignment_rule():
    cfg = GemmConfig(arch="sm_90a")
    ok, _ = can_implement(cfg, GemmProblem(100, 64, 64, a_strides=(64,)))
    assert ok
    ok, why = can_implement(cfg, GemmProblem(100, 64, 60, a_strides=(60,)))
    assert not ok and "16 bytes" in why
    ok, why = can_implement(cfg, GemmProblem(100, 64, 64, out_dtype="fp32"))
    assert not ok and "out_dtype" in why


def test_sm100_rules():
    ok, _ = can_implement(GemmConfig(arch="sm_100a", tile_m=256, tile_n=256, two_cta=True, cluster_m=2))
    assert ok
    ok, why = can_implement(GemmConfig(arch="sm_100a", tile_m=256, tile_n=256, two_cta=True, cluster_m=1))
    assert not ok and "cluster_m" in why
    ok, why = can_implement(GemmConfig(arch="sm_100a", pingpong=True))
    assert not ok and "pingpong" in why


@settings(max_examples=200, deadline=None)
@given(
    m=st.integers(1, 20000),
    n=st.integers(1, 20000).map(lambda x: 8 * ceil_div(x, 8)),
    k=st.integers(8, 20000),
    l_count=st.integers(1, 8),
    arch=st.sampled_from(["sm_90a", "sm_100a"]),
    a_major=st.sampled_from("km"),
    b_major=st.sampled_from("kn"),
)
def test_policy_always_picks_an_implementable_config(m, n, k, l_count, arch, a_major, b_major):
    p = GemmProblem(m, n, k, l_count, a_major=a_major, b_major=b_major)
    cfg = policy_for(arch).choose(p)
    ok, why = can_implement(cfg, p)
    assert ok, why


@settings(max_examples=100, deadline=None)
@given(
    total=st.integers(1, 100_000),
    experts=st.integers(1, 512),
    n=st.integers(1, 4000).map(lambda x: 8 * x),
    b_major=st.sampled_from("kn"),
    k=st.sampled_from([256, 768, 1536, 1544, 4096]),
    epi=st.sampled_from([EpilogueSpec(), EpilogueSpec(gated="swiglu"), EpilogueSpec(bias=True, activation="silu"),
                         EpilogueSpec(alpha=True)]),
)
def test_grouped_policy_is_implementable(total, experts, n, b_major, k, epi):
    """Every packed grouped pick is implementable, the short-K pingpong 128x192 tile
    (policy.PINGPONG_MAX_K) included: taken for 16-bit K <= 1536 with >= 512 rows per expert and
    an epilogue it takes (EpilogueSpec.light), never otherwise."""
    from cutegemm import policy

    n = 2 * n if epi.gated else n
    p = GemmProblem(total, n, k, b_major=b_major)
    cfg = policy_for("sm_90a").choose_grouped(p, experts, epilogue=epi)
    ok, why = can_implement(cfg, p)
    assert ok and cfg.grouped, why
    short = k <= policy.PINGPONG_MAX_K and total / experts >= policy.PINGPONG_MIN_ROWS and epi.light
    assert (cfg.pingpong and (cfg.tile_m, cfg.tile_n, cfg.cluster_m) == (128, 192, 2)) == short, cfg.name
    gathered = policy_for("sm_90a").choose_gathered(p, experts, epilogue=epi)
    assert not gathered.pingpong or gathered.tile_n <= 128  # packed=False: never the short-K tile


def test_pingpong_128x192_rule():
    """sm_90a pingpong holds at most 128x128 accumulators per warpgroup, 128x192 for 16-bit inputs
    and a light epilogue (the tiles that compile without spills)."""
    from cutegemm.config import config_errors

    base = GemmConfig(arch="sm_90a", form=Form.GROUPED, tile_m=128, tile_n=192, cluster_m=2, pingpong=True,
                      raster="m", group=1)  # fmt: skip
    assert not config_errors(base)
    assert not config_errors(replace(base, epilogue=EpilogueSpec(gated="swiglu", alpha=True)))
    for bad in (replace(base, epilogue=EpilogueSpec(bias=True)), replace(base, epilogue=EpilogueSpec(beta=True)),
                replace(base, epilogue=EpilogueSpec(gated="swiglu", preact=True)), replace(base, tile_n=256),
                replace(base, a_dtype="e4m3", b_dtype="e4m3", fast_accum=True, b_major="k")):  # fmt: skip
        assert any("128x192" in e for e in config_errors(bad)), bad.name


@settings(max_examples=100, deadline=None)
@given(
    total=st.integers(1, 100_000),
    experts=st.integers(1, 512),
    n=st.integers(1, 4000).map(lambda x: 8 * x),
    b_major=st.sampled_from("kn"),
    out_dtype=st.sampled_from(["bf16", "fp32"]),
)
def test_grouped_policy_is_implementable_sm100(total, experts, n, b_major, out_dtype):
    p = GemmProblem(total, n, 4096, b_major=b_major, out_dtype=out_dtype)
    cfg = policy_for("sm_100a").choose_grouped(p, experts)
    ok, why = can_implement(cfg, p)
    assert ok and cfg.grouped and cfg.arch == "sm_100a" and not cfg.two_cta, why


def test_sm100_grouped_rules():
    for tile_m, cluster_n in ((128, 1), (64, 2), (128, 4)):
        ok, why = can_implement(GemmConfig(arch="sm_100a", form=Form.GROUPED, tile_m=tile_m, tile_n=128, cluster_n=cluster_n))
        assert ok, why
    ok, why = can_implement(GemmConfig(arch="sm_100a", form=Form.GROUPED, tile_m=256, tile_n=256, two_cta=True, cluster_m=2))
    assert not ok and "two_cta" in why and "1-CTA" in why
    ok, why = can_implement(GemmConfig(arch="sm_100a", form=Form.GROUPED, cluster_m=2))
    assert not ok and "cluster_m" in why


BS_MXFP8 = dict(a_dtype="e4m3", b_dtype="e4m3", sf_dtype="e8m0", sf_vec=32, a_major="k", b_major="k")
BS_NVFP4 = dict(a_dtype="e2m1", b_dtype="e2m1", sf_dtype="e4m3", sf_vec=16, a_major="k", b_major="k")


@pytest.mark.parametrize(
    "change",
    [
        dict(BS_MXFP8, tile_n=256),
        dict(BS_NVFP4, tile_n=128),
        dict(BS_MXFP8, tile_m=256, tile_n=256, two_cta=True, cluster_m=2),
        dict(BS_NVFP4, tile_m=256, tile_n=128, two_cta=True, cluster_m=2, cluster_n=2),
        dict(BS_MXFP8, a_dtype="e2m1", b_dtype="e2m1"),  # MXFP4
        dict(BS_MXFP8, tile_n=192),
        dict(BS_NVFP4, tile_m=256, tile_n=64, two_cta=True, cluster_m=2),
        dict(BS_MXFP8, form=Form.GROUPED),  # the grouped (MoE packed) form: 1-CTA 128-row tiles
    ],
)
def test_blockscaled_rules_accept(change):
    ok, why = can_implement(replace(GemmConfig(arch="sm_100a"), **change))
    assert ok, why


@pytest.mark.parametrize(
    "arch,change,needle",
    [
        ("sm_90a", dict(BS_MXFP8), "sm_100a only"),
        ("sm_100a", dict(BS_MXFP8, tile_n=96), "tile_n"),
        ("sm_100a", dict(BS_MXFP8, tile_n=224), "tile_n"),
        ("sm_100a", dict(BS_MXFP8, tile_m=64), "MMA M"),
        ("sm_100a", dict(BS_MXFP8, tile_m=128, two_cta=True, cluster_m=2), "MMA M"),
        ("sm_100a", dict(BS_MXFP8, b_major="n"), "K-major"),
        ("sm_100a", dict(BS_MXFP8, sf_vec=16), "sf_vec"),
        ("sm_100a", dict(BS_NVFP4, sf_dtype="e5m2"), "sf dtype"),
        ("sm_100a", dict(BS_NVFP4, b_dtype="e4m3"), "equal dtypes"),  # NVFP4 scales do not mix
        ("sm_100a", dict(BS_MXFP8, form=Form.GROUPED, cluster_m=2), "grouped"),
        ("sm_100a", dict(BS_MXFP8, form=Form.GROUPED, tile_m=256, two_cta=True, cluster_m=2), "grouped"),
        ("sm_100a", dict(BS_MXFP8, cluster_m=4, cluster_n=2), "cluster size"),
        ("sm_100a", dict(sf_dtype="e8m0"), "sf_vec"),
    ],
)
def test_blockscaled_rules_name_the_problem(arch, change, needle):
    ok, why = can_implement(replace(GemmConfig(arch=arch), **change))
    assert not ok and needle in why, why


def test_blockscaled_alignment_rule():
    cfg = replace(GemmConfig(arch="sm_100a"), **BS_NVFP4)
    p = dict(a_dtype="e2m1", b_dtype="e2m1", a_major="k", b_major="k")
    ok, why = can_implement(cfg, GemmProblem(128, 128, 64, a_strides=(64,), b_strides=(64,), **p))
    assert ok, why
    ok, why = can_implement(cfg, GemmProblem(128, 128, 48, a_strides=(48,), **p))
    assert not ok and "16 bytes" in why
    assert "bs-e4m3v16" in cfg.name and "bs" not in GemmConfig(arch="sm_100a").name


# --- sm_90a epilogue ring vs A/B stages (GemmConfig.epi_stages) ---------------------------------
def _stages(cfg):
    """(A/B stages, epilogue buffers) the sm_90a kernel picks for ``cfg`` (host-side setup, traced
    for sm_90a without a GPU)."""
    import cutlass.cute as cute
    from cutlass.tensor_utils import LayoutEnum

    from cutegemm.gemm.sm90.kernel import GemmSm90
    from cutegemm.runtime.sass import compile_options

    g = GemmSm90(cfg)
    row = LayoutEnum.ROW_MAJOR

    @cute.jit
    def probe():
        g._setup(row, row, row)

    cute.compile(probe, options=compile_options("sm_90a"))
    return g.ab_stage, g.epi_stage


@pytest.mark.parametrize(
    "kw, want",
    [
        (dict(), (4, 4)),  # dense 128x256: 4 stages beside 4 buffers
        (dict(form=Form.GROUPED), (4, 3)),  # its 4 KiB tile table: 3 buffers keep the 4th stage
        (dict(form=Form.GROUPED, epi_stages=4), (3, 4)),  # the old ring, explicitly
        (dict(tile_n=128, pingpong=True), (6, 2)),
        (dict(a_dtype="e4m3", b_dtype="e4m3", tile_n=192), (5, 3)),  # FP8: a 5th stage for 1 buffer
        (dict(out_dtype="fp32"), (4, 2)),  # fp32 subtiles are twice the size
        # 64x64 with an MXFP4 output: 14 stages + 2 buffers filled the budget exactly and the scale
        # words after them overflowed shared memory by 1 KiB at launch (H200, 2026-11-30)
        (dict(tile_m=64, tile_n=64, b_major="n", out_dtype="u8", epilogue=EpilogueSpec(quant="mxfp4")), (13, 4)),
    ],
    ids=str,
)
def test_epilogue_ring_gives_way_to_ab_stages(kw, want):
    cfg = replace(GemmConfig(arch="sm_90a", b_major="k"), **kw)
    assert _stages(cfg) == want


def test_epi_stages_rules():
    assert can_implement(GemmConfig(arch="sm_90a", epi_stages=3))[0]
    for bad in (GemmConfig(arch="sm_90a", epi_stages=1), GemmConfig(arch="sm_90a", epi_stages=9),
                GemmConfig(arch="sm_100a", tile_n=128, epi_stages=2)):  # fmt: skip
        ok, why = can_implement(bad)
        assert not ok and "epi_stages" in why, why
    assert "_e3_" in GemmConfig(arch="sm_90a", epi_stages=3).name
    assert "_e" not in GemmConfig(arch="sm_90a").name.split("_c")[0].split("_t")[-1]


@pytest.mark.parametrize(
    "m,n,k,dtype,want",
    [
        (16, 7168, 2048, "bf16", (64, 128)),  # 56 tiles of 128 columns: >= a third of the SMs
        (64, 4096, 7168, "bf16", (64, 64)),  # 32: twice the CTAs with 64 columns
        (16, 28672, 4096, "bf16", (64, 128)),
        (65, 7168, 2048, "bf16", (128, 64)),  # up to 128 rows: 128x64
        (16, 7168, 2048, "e4m3", (64, 64)),  # FP8: 64x128 only from as many tiles as SMs
        (64, 28672, 4096, "e4m3", (64, 128)),
        (128, 7168, 2048, "e4m3", (128, 64)),
    ],
)
def test_policy_decode_sized_m(m, n, k, dtype, want):
    """Dense calls of <= 64 rows take 64-row tiles (one consumer warpgroup), sized by how many
    SMs get a tile (bench/RESULTS.md, 2026-11-30 tenth session)."""
    p = GemmProblem(m, n, k, 1, dtype, dtype, "bf16", "k", "k")
    cfg = policy_for("sm_90a", 132).choose(p)
    assert (cfg.tile_m, cfg.tile_n) == want and not cfg.pingpong
    assert can_implement(cfg, p)[0]
