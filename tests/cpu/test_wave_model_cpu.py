"""The wave model of the sm_90a policy (policy.wave_seconds / wave_candidates / wave_choice) and the
configs it picks for M > 128: its CPU twin. The kernels it picks are compile-checked
(compile_check.dense_variants / fp8_variants); their speed is the `bench sweep`'s to show."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cutegemm import policy
from cutegemm.config import EpilogueSpec, GemmProblem, can_implement, config_errors
from cutegemm.policy import (
    MODEL_MARGIN,
    padded_tiles,
    policy_for,
    short_tile_cluster,
    wave_candidates,
    wave_choice,
    wave_seconds,
)

SMS = 132
POL = policy_for("sm_90a", SMS)
SCALED = EpilogueSpec(scale_a=True, scale_b=True)


def problem(m, n, k, dtype="bf16", out="bf16"):
    return GemmProblem(m, n, k, 1, dtype, dtype, out, "k", "k")


def dense(m, n, k, dtype="bf16"):
    p = problem(m, n, k, dtype)
    return POL.choose_dense(p, **({"epilogue": SCALED} if dtype == "e4m3" else {}))


@contextlib.contextmanager
def policy_flags(**flags):
    """The policy module's switches set to ``flags`` inside, restored after."""
    saved = {name: getattr(policy, name) for name in flags}
    for name, value in flags.items():
        setattr(policy, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(policy, name, value)


def dense_no_pairs(m, n, k, dtype="bf16"):
    """dense() without the 64-row pairs of 112 < M <= 128 (policy.small_m_pair): the pick they replace."""
    with policy_flags(SMALL_M_PAIRS=False):
        return dense(m, n, k, dtype)


@pytest.mark.parametrize("m,n,k", [(8192, 8192, 8192), (4096, 4096, 4096), (16384, 7168, 2048), (2048, 4096, 7168)])
def test_measured_parity_shapes_keep_their_tile(m, n, k):
    """bench/RESULTS.md's dense bf16 shapes (cuBLAS parity with 128x256 2x1) and FP8's large
    shapes (128x192 2x1) keep the measured configs."""
    cfg = dense(m, n, k)
    assert (cfg.tile_m, cfg.tile_n, cfg.cluster_m, cfg.split_k) == (128, 256, 2, 1), cfg.name
    if (m, n, k) in ((8192, 8192, 8192), (16384, 7168, 2048)):  # FP8's measured shapes
        f8 = dense(m, n, k, "e4m3")
        assert (f8.tile_m, f8.tile_n, f8.cluster_m, f8.split_k) == (128, 192, 2, 1), f8.name


def test_the_issue_cliffs_get_whole_waves():
    # Llama-3-8B qkv at M = 1024: 192 tiles of 128x256 (1.45 waves: two rounds for 60 CTAs)
    cfg = dense(1024, 6144, 4096)
    assert (cfg.tile_n, cfg.cluster_m) == (192, 2)  # 256 tiles: 1.94 waves
    # Llama-3-8B o at M = 1024: one round of 128 tiles of 128x256, not two of 128x128
    cfg = dense(1024, 4096, 4096)
    assert (cfg.tile_n, cfg.cluster_m, cfg.split_k) == (256, 2, 1)
    # DeepSeek-V3 kv_a at M = 512: 36 tiles of 128x64 for 132 SMs -> K in 3 ranges (108 units)
    cfg = dense(512, 576, 7168)
    assert (cfg.tile_n, cfg.split_k, cfg.cluster_m, cfg.split_tail) == (64, 3, 1, False)


def test_192_row_tiles_where_they_fill_one_wave():
    """DeepSeek-V3 kv_a at M = 8192: 43 x 3 = 129 tiles of 192x192, one wave (128x192: 192 tiles,
    1.45 waves); 3072 x 1536: 128 of them (128x256 2x1: 144). A quantized output takes no 192-row
    tile: the model's pick among the 128-row ones."""
    for m, n in ((8192, 576), (3072, 1536)):
        cfg = dense(m, n, 7168)
        assert (cfg.tile_m, cfg.tile_n, cfg.cluster_m, cfg.split_k) == (192, 192, 1, 1), cfg.name
        assert not config_errors(cfg)
    cfg = POL.choose_dense(problem(8192, 576, 7168, out="e4m3"), epilogue=EpilogueSpec(quant="mxfp8"))
    assert cfg.tile_m == 128 and not config_errors(cfg), cfg.name
    assert dense(1024, 28672, 4096).tile_m == 128  # 896 tiles of 128x256 against 900 of 192x192


def test_64x96_tiles_where_128_row_tiles_fill_part_of_a_wave():
    """DeepSeek-V3 kv_a / q_a at M = 1024 / 512: 96 / 128 tiles of 64x96, paired along the side
    with fewer tiles (16 x 6: 1x2; 8 x 16: 2x1)."""
    for m, n, cluster in ((1024, 576, (1, 2)), (512, 1536, (2, 1))):
        cfg = dense(m, n, 7168)
        assert (cfg.tile_m, cfg.tile_n, cfg.cluster_m, cfg.cluster_n, cfg.split_k) == (64, 96, *cluster, 1), cfg.name
        assert not config_errors(cfg)
    assert dense(8192, 576, 7168, "e4m3").tile_m == 128  # FP8 weighs 128-row tiles only


@pytest.mark.parametrize("m,n,cluster", [
    (512, 1536, (2, 1)), (1024, 576, (1, 2)), (768, 1024, (2, 1)), (1536, 288, (2, 1)), (384, 2048, (2, 1)),
    (2048, 384, (1, 2)), (192, 288, (1, 1)), (640, 576, (1, 2)),
])  # fmt: skip
def test_short_tile_cluster_pairs_along_the_side_with_fewer_tiles(m, n, cluster):
    """64x96 clusters: the pair along the side with fewer tiles where its count is even (8 x 16:
    2x1, 16 x 6: 1x2), along the other where it is odd (12 x 11 and 24 x 3: 2x1), 1x1 where both
    are odd (3 x 3)."""
    assert short_tile_cluster(problem(m, n, 4096), 64, 96) == cluster


@settings(max_examples=200, deadline=None)
@given(m=st.integers(1, 20000), n=st.integers(1, 40000), l=st.integers(1, 4),
       tile=st.sampled_from([(64, 96), (128, 96), (128, 128), (128, 256), (192, 192)]),
       cluster=st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2)]))  # fmt: skip
def test_padded_tiles_count_the_schedulers_cluster_tiles(m, n, l, tile, cluster):
    """The model's tile count is the static scheduler's: its persistent grid (no cap) walks
    cluster tiles, each of cluster_m x cluster_n CTA tiles."""
    from cutegemm.schedulers.static import persistent_grid

    cm, cn, clusters = persistent_grid((m, n, l), tile, cluster, 2**40)
    assert padded_tiles(m, tile[0], cm) * padded_tiles(n, tile[1], cn) * l == clusters * cm * cn


def test_wave_seconds_counts_whole_clusters():
    """A cluster past an odd tile count runs a CTA on nothing: 3 M tiles of 128 in 2x1 clusters
    take the time of 4, so at N = 10240 (40 tiles of 256) 128x256 2x1 is 160 tiles (1.2 waves)
    and 192x192 1x1 (2 x 54 = 108 tiles, one wave) is picked."""
    p = problem(384, 10240, 8192)
    assert wave_seconds(p, 128, 256, 2, 1, SMS, 1.0) == wave_seconds(problem(512, 10240, 8192), 128, 256, 2, 1, SMS, 1.0)
    assert wave_seconds(p, 128, 256, 1, 1, SMS, 1.0) < wave_seconds(p, 128, 256, 2, 1, SMS, 1.0)
    assert padded_tiles(384, 128, 2) == 4 and padded_tiles(1024, 96, 2) == 12 and padded_tiles(576, 96, 2) == 6


def test_split_tail_where_few_tile_columns_leave_a_short_wave():
    """7168 x 576 x 7168: 56 x 3 = 168 tiles of 128x192 = one whole wave, then 36 tiles in 3
    ranges (108 units). Wide N (2048 x 7168 x 16384, 38 columns) keeps its 2x1 tile: the tail's
    1x1 clusters lost there. A tail that would take two rounds of split units is no gain (16384 x
    576: 2 whole waves + 120 tiles x 2 ranges). 6144 rows (48 x 4 tiles of 128x160, a whole wave
    and 60 more, which took a split tail) fit one wave of 192x160 tiles (32 x 4 = 128)."""
    cfg = dense(7168, 576, 7168)
    assert (cfg.tile_n, cfg.split_k, cfg.split_tail, cfg.cluster_m) == (192, 3, True, 1), cfg.name
    assert not config_errors(cfg)
    tall = dense(6144, 576, 7168)
    assert (tall.tile_m, tall.tile_n, tall.split_k, tall.cluster_m) == (192, 160, 1, 1), tall.name
    assert not dense(2048, 7168, 16384).split_tail
    assert not dense(16384, 576, 7168).split_tail
    assert not dense(4096, 576, 7168).split_tail  # 96 tiles: less than a wave, no tail to split
    t = wave_seconds(problem(8192, 576, 7168), 128, 192, 1, 2, SMS, 0.96, tail=True)
    whole = wave_seconds(problem(8192, 576, 7168), 128, 192, 1, 1, SMS, 0.96)
    assert whole / 2 < t < whole  # one whole wave plus one of half-K units


@pytest.mark.parametrize("m,n,k", [(512, 10240, 8192), (1024, 5120, 25600), (2048, 5120, 25600), (512, 5120, 25600)])
def test_n_multiple_of_5120_gets_128x160(m, n, k):
    """The sweep's worst bf16 cliffs (0.64-0.78x cuBLAS in 128x128 / 128x256 tiles, K split or
    not): N / 160 tiles fill whole waves (e.g. 1024 x 5120: 8 x 32 = 256 tiles, 1.94 waves) where
    128x256 leaves 160 tiles (1.21 waves) and 128x128 pays its lower rate over 2.4 waves."""
    cfg = dense(m, n, k)
    assert (cfg.tile_m, cfg.tile_n, cfg.cluster_m, cfg.split_k) == (128, 160, 2, 1), cfg.name
    tiles = -(-m // 128) * -(-n // 160)
    assert tiles < SMS or tiles / (-(-tiles // SMS) * SMS) > 0.95  # the last wave nearly full


def test_wave_seconds_counts_rounds():
    p = problem(1024, 6144, 4096)
    one = wave_seconds(problem(1024, 4096, 4096), 128, 256, 2, 1, SMS, 1.0)  # 128 tiles: one round
    two = wave_seconds(p, 128, 256, 2, 1, SMS, 1.0)  # 192 tiles: two rounds
    assert two == pytest.approx(2 * one)
    # K cut in two: half the WGMMA time per unit, twice the units, plus the partial sums
    split = wave_seconds(problem(256, 1024, 8192), 128, 128, 1, 2, SMS, 1.0)
    whole = wave_seconds(problem(256, 1024, 8192), 128, 128, 1, 1, SMS, 1.0)
    assert split < whole < 2 * split
    # e4m3 runs its WGMMAs at twice the rate
    assert wave_seconds(problem(4096, 4096, 4096, "e4m3"), 128, 128, 2, 1, SMS, 1.0) < wave_seconds(
        problem(4096, 4096, 4096), 128, 128, 2, 1, SMS, 1.0)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(m=st.integers(129, 16384), n=st.integers(1, 32768), k=st.integers(16, 32768).map(lambda k: k // 16 * 16),
       dtype=st.sampled_from(["bf16", "fp16", "e4m3"]))  # fmt: skip
@example(m=769, n=4033, k=16, dtype="bf16")  # the default 128x256 2x1 over 7 M tiles: its 1x2 twin
def test_pick_is_valid_and_never_predicted_slower(m, n, k, dtype):
    p = problem(m, n, k, dtype)
    for splits in ((1,), (1, 2, 4)):
        cands = wave_candidates(p, SMS, splits)
        pick = wave_choice(p, SMS, splits)

        def chosen(c, default=cands[0]):  # the default, or a candidate the model puts MODEL_MARGIN ahead of it
            return c.seconds <= default.seconds and (c == default or c.seconds * MODEL_MARGIN < default.seconds)

        # or the 1x2 twin of such a 2x1 pick over an odd count of M tiles (policy.odd_m_pairs_n)
        twin_of = [c for c in cands if (c.tile_m, c.tile_n, c.cluster_m, c.split_k) == (pick.tile_m, pick.tile_n, 2, 1)]
        assert chosen(pick) or (
            pick.cluster_n == 2 and policy.odd_m_pairs_n(p, pick.tile_m, pick.tile_n) and twin_of and chosen(twin_of[0])
        ), (pick, cands[0])
        assert all(c.cluster_m == 1 and c.tile_n <= 192 for c in cands if c.split_k > 1)
    cfg = dense(m, n, k, dtype)
    assert not config_errors(cfg), (cfg.name, config_errors(cfg))
    ok, why = can_implement(cfg, replace(p, out_dtype="bf16"))
    assert ok, why
    if cfg.split_k > 1:  # at least 24 K tiles of 64 (12 of 128 for e4m3) per range
        tile_k, least = (128, 12) if dtype == "e4m3" else (64, 24)
        assert -(-k // tile_k) >= least * cfg.split_k


@settings(max_examples=300, deadline=None)
@given(m=st.integers(1, 16384), n=st.integers(1, 60000), k=st.integers(16, 40000).map(lambda k: k // 16 * 16),
       out=st.sampled_from(["bf16", "fp16", "fp32", "e4m3"]), scaled=st.booleans())  # fmt: skip
@example(m=128, n=576, k=7168, out="fp32", scaled=True)  # FP8_ROW_SPLIT: 64x64 in 4 cluster ranges, promoted
@example(m=16, n=10240, k=8192, out="e4m3", scaled=True)  # QUAD_FP8 into an FP8 output
@example(m=1024, n=7168, k=16384, out="fp32", scaled=True)  # 128x160's shape: fp32 keeps promote_k tiles
def test_e4m3_picks_are_valid_for_every_output(m, n, k, out, scaled):
    """Every e4m3 pick of the policy (the wave model, 128x160, the 1x4 decode clusters, the 64x64
    tiles at M = 128, the cluster K ranges), for each output dtype, with or without the scale
    epilogue: a valid config that implements the problem, fp32 outputs promoted per WGMMA
    (policy.fp32_promotion) and each K range at least 12 K tiles of 128."""
    p = problem(m, n, k, "e4m3", out)
    cfg = POL.choose_dense(p, **({"epilogue": SCALED} if scaled else {}))
    assert not config_errors(cfg), (cfg.name, config_errors(cfg))
    ok, why = can_implement(cfg, p)
    assert ok, (cfg.name, why)
    assert bool(cfg.promote_k) == (out == "fp32"), cfg.name
    if cfg.split_k > 1:
        assert -(-k // 128) >= 12 * cfg.split_k, cfg.name
    if cfg.cluster_n == 4:  # the decode rule's 1x4 clusters: 64x128, A's whole box, at most 3/4 of the SMs
        assert (cfg.tile_m, cfg.tile_n, cfg.a_rows) == (64, 128, 0) and m <= 64 and -(-n // 128) <= 0.75 * SMS, cfg.name


@pytest.mark.parametrize("m", [1, 16, 64, 100, 128])
def test_decode_sizes_untouched(m):
    """M <= 64 keeps the measured decode rules (decode_tile, split_few_tiles); 64 < M <= 128 the
    128-row rule's config or the wave model's pick over it (SMALL_M_WAVES), 1x1 clusters, or
    past 112 rows the 64-row pair over that (small_m_pair)."""
    from cutegemm import policy

    for n, k in ((4096, 7168), (28672, 4096), (1536, 7168)):
        cfg, rule = dense(m, n, k), decode_rule(problem(m, n, k))
        assert rule.tile_m == (64 if m <= 64 else 128) and rule.cluster_m == 1
        assert rule.tile_n in (64, 128)
        alt = policy.small_m_alternative(rule, problem(m, n, k), SMS) or rule
        assert cfg == (policy.small_m_pair(alt, problem(m, n, k), SMS) or alt)


def test_explicit_tiles_and_other_forms_are_left_alone():
    p = problem(512, 576, 7168)
    assert POL.choose_dense(p, tile_m=128, tile_n=256).split_k == 1
    grouped = POL.choose_grouped(problem(4096, 4096, 4096), 8)
    assert grouped.split_k == 1


def decode_rule(p, **kw):
    """choose_dense's config with no dtype family in SMALL_M_WAVES and no 64-row pairs (the decode
    rule's for M <= 128)."""
    with policy_flags(SMALL_M_WAVES=frozenset(), SMALL_M_PAIRS=False):
        return POL.choose_dense(p, **kw)


def test_small_m_wave_picks_are_taken_and_valid(monkeypatch):
    """policy.small_m_alternative (64 < M <= 128): choose_dense takes its picks for the dtype
    families in SMALL_M_WAVES (16-bit and e4m3; e4m3 without split K), keeps the decode rule's
    config for the others and for explicit tiles; the picks are valid configs (the 64-row pairs
    that follow them at M = 128 off: tested below)."""
    from cutegemm import policy

    monkeypatch.setattr(policy, "SMALL_M_PAIRS", False)
    assert policy.SMALL_M_WAVES == frozenset({"16-bit", "e4m3"})
    p = problem(128, 10240, 8192)  # Llama-3-70B qkv at M = 128: 160 tiles of 128x64, 1.21 waves (0.74x cuBLAS)
    cfg = decode_rule(p)
    assert (cfg.tile_n, cfg.split_k) == (64, 1)
    alt = policy.small_m_alternative(cfg, p, SMS)
    # 107 tiles of 128x96: one round (the H100 sweep: 0.96x cuBLAS, 128x160 in 2 ranges 0.93)
    assert (alt.tile_m, alt.tile_n, alt.split_k, alt.cluster_m) == (128, 96, 1, 1)
    assert not config_errors(alt)
    assert POL.choose_dense(p) == alt
    assert POL.choose_dense(p, tile_n=64) == replace(cfg, tile_n=64)  # explicit tiles are left alone
    assert policy.small_m_alternative(POL.choose_dense(problem(256, 10240, 8192)), problem(256, 10240, 8192), SMS) is None
    p8 = problem(128, 10240, 8192, "e4m3")
    cfg8 = decode_rule(p8, epilogue=SCALED)
    alt8 = policy.small_m_alternative(cfg8, p8, SMS)
    assert (alt8.tile_n, alt8.split_k) == (128, 1) and not config_errors(alt8) and alt8.epilogue == SCALED, alt8
    assert POL.choose_dense(p8, epilogue=SCALED) == alt8
    # Qwen3-32B down at M = 128: the split pick the e4m3 sweep measured slower is not weighed
    p8 = problem(128, 5120, 25600, "e4m3")
    assert POL.choose_dense(p8, epilogue=SCALED).split_k == 1
    monkeypatch.setattr(policy, "SMALL_M_WAVES", frozenset({"16-bit"}))
    assert POL.choose_dense(problem(128, 10240, 8192, "e4m3"), epilogue=SCALED) == cfg8
    monkeypatch.setattr(policy, "SMALL_M_WAVES", frozenset())
    assert POL.choose_dense(p) == cfg


@settings(max_examples=200, deadline=None)
@given(m=st.integers(65, 128), n=st.integers(1, 60000), k=st.integers(16, 40000), dtype=st.sampled_from(["bf16", "e4m3"]))
def test_small_m_wave_picks_predicted_faster(m, n, k, dtype):
    from cutegemm import policy

    p = problem(m, n, k, dtype)
    cfg = decode_rule(p, **({"epilogue": SCALED} if dtype == "e4m3" else {}))
    alt = policy.small_m_alternative(cfg, p, SMS)
    if alt is None:
        return
    assert not config_errors(alt), (alt.name, config_errors(alt))
    fam = policy.dtype_family(dtype)
    rates = {**policy.TILE_RATES[fam], **policy.SMALL_M_RATES, **policy.SMALL_M_ONLY_RATES[fam]}

    def t(c):
        return wave_seconds(p, 128, c.tile_n, 1, max(1, c.split_k), SMS, rates[(128, c.tile_n)])

    assert t(alt) * MODEL_MARGIN < t(cfg)
    assert dtype == "bf16" or alt.split_k == 1
    assert POL.choose_dense(p, **({"epilogue": SCALED} if dtype == "e4m3" else {})) == (policy.small_m_pair(alt, p, SMS) or alt)


def test_16bit_128x128_multicasts_b_over_two_m_tiles():
    """16-bit 128x128 tiles with two or more M tiles run a 2x1 cluster, M-major as measured (H100
    bench tiles: 512 x 4096 x 14336 0.78 -> 0.96x cuBLAS); one M tile stays 1x1."""
    for m, n, k in ((512, 4096, 14336), (512, 4096, 4096), (1024, 2048, 4096)):
        cfg = dense(m, n, k)
        assert (cfg.tile_m, cfg.tile_n, cfg.cluster_m, cfg.raster, cfg.split_k) == (128, 128, 2, "m", 1), cfg.name
        assert not config_errors(cfg)
    cands = wave_candidates(problem(128 + 1, 4096, 4096), SMS)
    assert all(c.cluster_m == 2 for c in cands if c.tile_n >= 128 and c.tile_m == 128)
    one_tile = wave_candidates(problem(128, 4096, 4096), SMS)
    assert all(c.cluster_m == 1 for c in one_tile if c.tile_m == 128)


def test_128x64_is_a_candidate_above_128_rows():
    """The wave model weighs 128x64 (1x1) for M > 128; 512 x 2048 x 4096 takes it (H100: 16-bit
    0.98x cuBLAS against 128x128 split in two's 0.85; e4m3 since the H100's FP8 timing, at its own
    rate, see test_e4m3_128x64_where_it_fills_one_wave)."""
    cfg = dense(512, 2048, 4096)
    assert (cfg.tile_m, cfg.tile_n, cfg.cluster_m, cfg.split_k) == (128, 64, 1, 1), cfg.name
    assert not config_errors(cfg)


@pytest.mark.parametrize("m", [1, 16, 64, 128])
def test_few_tiles_take_four_ranges_in_a_cluster(m):
    """N = 576, K = 7168 (9 tiles of 64x64 per 64 rows): 4 K ranges meeting in shared memory
    (H100: 0.95-1.07x cuBLAS against 2 ranges' 0.79-0.85); M = 128 in 64x64 tiles. FP8 too (its 36
    units within small_m.FP8_CLUSTER4_SHARE of the SMs; at M = 128 by small_m.FP8_ROW_SPLIT, where
    its 128x64 pick took 4 ranges); FP8 units past that share go through the workspace."""
    cfg = dense(m, 576, 7168)
    assert (cfg.tile_m, cfg.tile_n, cfg.split_k, cfg.split_cluster) == (64, 64, 4, True), cfg.name
    assert not config_errors(cfg)
    f8 = dense(m, 576, 7168, "e4m3")
    assert (f8.tile_m, f8.split_k, f8.split_cluster) == (64, 4, True), f8.name
    if m <= 64:  # 32 tiles of 64x64: 128 units, past FP8_CLUSTER4_SHARE of 132 SMs
        wide = dense(m, 2048, 7168, "e4m3")
        assert (wide.tile_m, wide.tile_n, wide.split_k, wide.split_cluster) == (64, 64, 4, False), wide.name


def test_more_tiles_keep_two_ranges():
    """32 tiles of 64x64 (16 x 2048 x 7168: the H200's measured 2-range cluster) keep 2 ranges."""
    cfg = dense(16, 2048, 7168)
    assert (cfg.tile_m, cfg.tile_n, cfg.split_k, cfg.split_cluster) == (64, 64, 2, True), cfg.name


def test_64_row_tiles_only_where_four_ranges_follow():
    """64 < M <= 128 takes 64x64 tiles only where they still take 4 K ranges (at most 20 tiles on
    132 SMs): N = 1024 (32 such tiles) keeps 128x64 with its K ranges."""
    cfg = dense(128, 1024, 7168)
    assert (cfg.tile_m, cfg.tile_n) == (128, 64), cfg.name


def test_h100_split_costs_and_128x160_rate():
    """The H100 recalibration (16-bit split K at 10 µs a range, 128x160 at 0.95 of 128x256):
    DeepSeek-V3 q_a at M = 512 runs 128x64 unsplit (0.93x cuBLAS in `bench tiles` against 4 ranges
    of 128x192's 0.83), Qwen3-32B qkv at M = 128 128x128 unsplit (0.97 against 0.91), Qwen3-32B
    gate_up at M = 512 128x160 2x1 (1.00 against 128x256's 0.93; without 128x224, which runs it 1.03
    since); e4m3 too since its H100 timing (test_e4m3_128x160_and_split_cost)."""
    q_a = wave_choice(problem(512, 1536, 7168), SMS, (1, 2, 3, 4), True, other_m=False)  # (64x96 now, above)
    assert (q_a.tile_m, q_a.tile_n, q_a.split_k) == (128, 64, 1), q_a
    qkv = dense_no_pairs(128, 10240, 5120)
    assert (qkv.tile_n, qkv.split_k) == (96, 1), qkv.name  # 128x96 since (0.95 -> 0.96 in the H100 sweep)
    gate_up = dense(512, 51200, 5120)
    assert (gate_up.tile_n, gate_up.cluster_m, gate_up.split_k) == (224, 2, 1), gate_up.name
    assert wave_choice(problem(512, 51200, 5120), SMS, other_m=False).tile_n == 160  # 224 is 16-bit dense only
    for cfg in (qkv, gate_up):
        assert not config_errors(cfg)


def test_e4m3_128x160_and_split_cost():
    """e4m3 for M > 128 weighs 128x160 (2x1) beside 128x192 and splits K at 16-bit's 10 µs a range
    (H100, x torch._scaled_mm per-tensor, policy.E4M3_160_RATE): DeepSeek-V3 o at M = 1024 (360
    tiles, 2.7 waves, against 304 of 128x192 in 2.3) 0.87 -> 0.98, Qwen3-32B gate_up at M = 256
    0.88 -> 0.99, Llama-3-70B qkv at M = 512 0.98 -> 1.09; DeepSeek-V3 q_a at M = 512 128x64
    unsplit (0.92, against 128x192 in 4 ranges' 0.72). N = 6144 (32 tiles of 192) keeps 128x192, and
    the M <= 128 rule keeps its own 128x160 rate (policy.SMALL_M_ONLY_RATES)."""
    for m, n, k in ((1024, 7168, 16384), (256, 51200, 5120), (512, 10240, 8192), (2048, 5120, 25600)):
        cfg = dense(m, n, k, "e4m3")
        assert (cfg.tile_m, cfg.tile_n, cfg.cluster_m, cfg.cluster_n, cfg.split_k) == (128, 160, 2, 1, 1), cfg.name
        assert not config_errors(cfg)
    q_a = dense(512, 1536, 7168, "e4m3")
    assert (q_a.tile_m, q_a.tile_n, q_a.split_k) == (128, 64, 1), q_a.name
    for m in (512, 1024, 8192):
        assert dense(m, 6144, 4096, "e4m3").tile_n == 192
    assert policy.SMALL_M_ONLY_RATES["e4m3"][(128, 160)] < policy.E4M3_160_RATE
    assert dense(128, 51200, 5120, "e4m3").tile_n == 160  # the M <= 128 pick it had (2.4 waves)


def test_128x96_one_m_tile_1x1_else_1x2():
    """128x96 tiles (sm_90a tile_n: any whole number of 32-column subtiles from 64 to 256, or 80): for
    64 < M <= 128 in 1x1 clusters (Llama-3-70B qkv at M = 128: 107 tiles, one round; a split-K
    candidate names 1x1 too); above, in 1x2 clusters with an M-major raster (A multicast: DeepSeek-V3
    q_a at M = 1024 and kv_a at M = 2048, one wave; H100: 0.93x cuBLAS against 2x1's 0.85, 1x1
    0.74); 16-bit only."""
    from cutegemm.config import GemmConfig, config_errors

    ok = GemmConfig(arch="sm_90a", a_major="k", b_major="k", tile_m=128, tile_n=96)
    assert not config_errors(ok) and not config_errors(replace(ok, tile_n=224))
    assert any("tile_n" in e for e in config_errors(replace(ok, tile_n=112)))
    assert dense_no_pairs(128, 10240, 8192).tile_n == 96
    for m, n in ((1024, 1536), (2048, 576)):
        cfg = dense(m, n, 7168)
        assert (cfg.tile_m, cfg.tile_n, cfg.cluster_m, cfg.cluster_n, cfg.raster, cfg.split_k) == (
            128, 96, 1, 2, "m", 1), cfg.name  # fmt: skip
        assert not config_errors(cfg)
    assert all((c.cluster_m, c.cluster_n) == (1, 2)
               for c in wave_candidates(problem(1024, 1536, 7168), SMS) if (c.tile_m, c.tile_n) == (128, 96))  # fmt: skip
    small = wave_candidates(problem(128, 10240, 8192), SMS, (1, 2), {(128, 96): 0.85}, other_m=False)
    assert {(c.cluster_m, c.cluster_n) for c in small if c.tile_n == 96 and c.split_k > 1} == {(1, 1)}
    for m, n, k in [(1024, 1536, 7168), (2048, 576, 7168), (8192, 8192, 8192)]:
        assert dense(m, n, k, "e4m3").tile_n != 96, (m, n, k)
    assert dense(8192, 8192, 8192).tile_n == 256


@settings(max_examples=200, deadline=None)
@given(m=st.integers(129, 20000), n=st.integers(1, 40000), k=st.integers(64, 30000), e=st.integers(1, 64))
@example(8192, 576, 7168, 1).via("192x192 for one expert")
@example(1024, 1536, 7168, 4).via("128x96 2x1")
@example(1024, 576, 7168, 8).via("64x96 1x2")
def test_new_tiles_never_reach_forms_that_do_not_take_them(m, n, k, e):
    """The 192-row, 64x96 and 128x96 wave picks are 16-bit dense tiles: the K-grouped config
    (the policy's tile for one expert's problem), a quantized output and the grouped forms get
    a config without errors, and the plain dense call still takes them where they win."""
    from cutegemm.grouped.k_grouped import kgrouped_config

    kg = kgrouped_config("sm_90a", SMS, m, n, k, e, "bf16", "bf16", "k", "n", False)
    assert not config_errors(kg), kg.name
    q = POL.choose_dense(problem(m, n - n % 32 or 32, k, out="e4m3"), epilogue=EpilogueSpec(quant="mxfp8"))
    assert not config_errors(q), q.name
    g = POL.choose_grouped(problem(m * e, n, k), e)
    assert not config_errors(g), g.name
    assert not config_errors(dense(m, n, k))


def test_e4m3_128x64_where_it_fills_one_wave():
    """FP8 row-wise, M > 128: Qwen3-30B-A3B o at M = 512 takes 128 tiles of 128x64 (one wave; 1.12x
    torch._scaled_mm against 0.93 for 128x128 2x1 in the same rounds, H100); DeepSeek-V3 kv_a at
    M = 512 128x64 in 3 ranges; large shapes keep 128x192 2x1."""
    o = dense(512, 2048, 4096, "e4m3")
    assert (o.tile_m, o.tile_n, o.cluster_m, o.split_k) == (128, 64, 1, 1), o.name
    kv = dense(512, 576, 7168, "e4m3")
    assert (kv.tile_n, kv.split_k) == (64, 3), kv.name
    big = dense(8192, 8192, 8192, "e4m3")
    assert (big.tile_n, big.cluster_m) == (192, 2), big.name


@pytest.mark.parametrize("m", [1, 16, 64])
def test_fp8_decode_tile_streams_the_weight_sooner(m):
    """FP8 M <= 64 (policy.decode_read_time): the 64x128 tile where its tiles fill one round
    (N 10240: 80 tiles, against 64x64's 160 in 1.2 rounds) or ties, 64x64 where 64x128 leaves a few
    CTAs in a last round (N 51200: 4 of 400; N 24576: 60 of 192); 16-bit keeps its rule."""
    from cutegemm import policy

    picks = {n: dense(m, n, k, "e4m3").tile_n for n, k in ((10240, 8192), (51200, 5120), (24576, 1536), (32768, 4096))}
    assert picks == {10240: 128, 51200: 64, 24576: 64, 32768: 128}, picks
    assert policy.decode_read_time(80, 128, SMS) < policy.decode_read_time(160, 64, SMS)
    assert policy.decode_read_time(0, 64, SMS) == 0
    # a part-filled round of c CTAs costs max(c, DECODE_SAT_CTAS) columns
    assert policy.decode_read_time(SMS + 1, 64, SMS) == (SMS + policy.DECODE_SAT_CTAS) * 64
    assert dense(m, 10240, 8192).tile_n == 128 and dense(m, 51200, 5120).tile_n == 128  # bf16: N / 128 >= SMs / 3


def test_128x224_where_128x256_leaves_a_part_filled_wave():
    """128x224 2x1 (policy.WIDE_RATE): DeepSeek-V3 o at M = 2048 is 512 tiles (3.9 waves) where
    128x256 makes 448 (3.4: a fourth round for a third of the SMs); H100 0.89 -> 0.99x cuBLAS.
    Shapes 128x256 fills (8192^3, 4096^3) keep it; 224 is 16-bit dense only (no e4m3, no quantized
    output: the other_m=False fallback never weighs it)."""
    o = dense(2048, 7168, 16384)
    assert (o.tile_m, o.tile_n, o.cluster_m, o.cluster_n, o.raster) == (128, 224, 2, 1, "n"), o.name
    assert not config_errors(o)
    for m, n, k in ((8192, 8192, 8192), (4096, 4096, 4096), (1024, 4096, 4096)):
        assert dense(m, n, k).tile_n == 256
    assert dense(2048, 7168, 16384, "e4m3").tile_n != 224
    assert all(c.tile_n != 224 for c in wave_candidates(problem(2048, 7168, 16384), SMS, other_m=False))


@pytest.mark.parametrize(
    "m,n,k,dtype,tile_n",
    [(640, 28672, 4096, "bf16", 224), (640, 24576, 4096, "bf16", 192), (384, 28672, 4096, "bf16", 224),
     (1152, 1536, 7168, "bf16", 128), (896, 10240, 8192, "bf16", 192), (640, 7168, 16384, "bf16", 160),
     (896, 10240, 8192, "e4m3", 192), (384, 28672, 4096, "e4m3", 192)],
)  # fmt: skip
def test_odd_m_tile_counts_pair_along_n(m, n, k, dtype, tile_n):
    """An odd count of M tiles (3 to 9): the cluster pairs along N (1x2, M-major raster), both
    dtypes, also where the rounds tie (1152 x 1536 x 7168: 9 x 12 tiles of 128x128, one wave
    either way; H100 `bench tiles` 0.65x cuBLAS in 2x1) and where N's tile count is odd and
    padded (640 x 7168 x 16384: 45 tiles of 128x160)."""
    cfg = dense(m, n, k, dtype)
    assert (cfg.tile_n, cfg.cluster_m, cfg.cluster_n, cfg.raster, cfg.split_k) == (tile_n, 1, 2, "m", 1), cfg.name
    assert not config_errors(cfg)


def test_192_row_tiles_lead_16bit_pairs_at_nine_m_tiles():
    """PAIR_N_RATE: at M = 1152 (9 M tiles) 16-bit 192x192 (6 M tiles, no pad) is the pick where
    the 1x2 pairs ran slower in the same rounds (H100: Llama-3-70B down 0.97 against 0.84x
    cuBLAS). Llama-3-70B qkv M = 1152 (N 10240) kept 128x256 1x2 (1.00) until 192x160 tiles were
    weighed (TALL_160_RATE: 1.04 in the same `bench tiles` rounds); Qwen3-32B down (N 5120, K
    25600) takes 192x128 in 1x2 pairs (0.98 against 128x192 1x2's 0.86)."""
    down = dense(1152, 8192, 28672)
    assert (down.tile_m, down.tile_n, down.cluster_m, down.cluster_n) == (192, 192, 1, 1), down.name
    qkv = dense(1152, 10240, 8192)
    assert (qkv.tile_m, qkv.tile_n, qkv.cluster_m, qkv.cluster_n) == (192, 160, 1, 1), qkv.name
    qdown = dense(1152, 5120, 25600)
    assert (qdown.tile_m, qdown.tile_n, qdown.cluster_m, qdown.cluster_n) == (192, 128, 1, 2), qdown.name


def test_odd_m_pairs_where_the_pair_along_n_pads_fewer():
    """odd_m_pairs_n: 128-row tiles, an odd count of M tiles up to ODD_M_MAX_TILES, and fewer tiles
    padded along N than along M; else (even M tiles, many M tiles, one N tile) 2x1 as before."""
    assert policy.odd_m_pairs_n(problem(640, 28672, 4096), 128, 224)  # 5 x 128
    assert policy.odd_m_pairs_n(problem(384, 7168, 4096), 128, 256)  # 3 x 28
    assert policy.odd_m_pairs_n(problem(1152, 5120, 4096), 128, 224)  # 9 x 23: 9 x 24 < 10 x 23
    assert policy.odd_m_pairs_n(problem(640, 7424, 4096), 128, 256)  # 5 x 29: 5 x 30 < 6 x 29
    assert policy.odd_m_pairs_n(problem(640, 7168, 4096, "e4m3"), 128, 192)
    assert not policy.odd_m_pairs_n(problem(512, 28672, 4096), 128, 224)  # 4 M tiles
    assert not policy.odd_m_pairs_n(problem(1408, 28672, 4096), 128, 224)  # 11 M tiles: past the cap
    assert not policy.odd_m_pairs_n(problem(8000, 576, 7168), 128, 192)  # 63 x 3
    assert not policy.odd_m_pairs_n(problem(384, 200, 4096), 128, 256)  # 3 x 1: 3 x 2 > 4 x 1
    assert not policy.odd_m_pairs_n(problem(640, 7168, 4096), 64, 96)
    saved = policy.PAIR_ODD_M
    policy.PAIR_ODD_M = False
    try:
        assert not policy.odd_m_pairs_n(problem(640, 28672, 4096), 128, 224)
        assert dense(1152, 1536, 7168).cluster_m == 2
    finally:
        policy.PAIR_ODD_M = saved


@pytest.mark.parametrize(
    "n,k,tile_n",
    [(6144, 4096, 96), (4096, 4096, 64), (28672, 4096, 160), (10240, 8192, 160), (8192, 28672, 128),
     (51200, 5120, 160), (5120, 25600, 80), (5120, 2048, 80), (2048, 4096, 64), (24576, 1536, 192),
     (7168, 16384, 128), (32768, 4096, 128), (4096, 14336, 64)],
)  # fmt: skip
def test_m128_takes_64_row_pairs(n, k, tile_n):
    """policy.small_m_pair at M = 128 (16-bit): 2x1 pairs of 64-row tiles, the tile_n whose rounds of
    pairs stream the fewest columns per SM (the H200's fastest pair on those layers but two), unsplit,
    N-major; valid configs."""
    cfg = dense(128, n, k)
    assert (cfg.tile_m, cfg.tile_n, cfg.cluster_m, cfg.cluster_n, cfg.split_k, cfg.a_rows) == (64, tile_n, 2, 1, 1, 0), cfg.name
    assert not config_errors(cfg)
    assert dense(128, n, k, "fp16").tile_n == tile_n


@pytest.mark.parametrize("m,n,k", [(128, 1536, 7168), (128, 576, 7168), (112, 10240, 8192), (80, 10240, 8192),
                                   (129, 10240, 8192), (64, 10240, 8192), (128, 10240, 8192, )])  # fmt: skip
def test_64_row_pairs_only_past_112_rows_and_where_they_engage_as_many_sms(m, n, k):
    """No pair where the pick's K-split units outnumber the pair's CTAs (DeepSeek-V3 q_a / kv_a), at
    or below 112 rows (the short A box), past 128, for e4m3, for an explicit tile, or for a
    quantized or preact output."""
    from cutegemm import policy

    cfg = dense(m, n, k)
    taken = 112 < m <= 128 and n > 1536
    assert (cfg.tile_m == 64 and cfg.cluster_m == 2) == taken, cfg.name
    if taken:
        rule = decode_rule(problem(m, n, k))
        alt = policy.small_m_alternative(rule, problem(m, n, k), SMS) or rule
        units = -(-m // alt.tile_m) * -(-n // alt.tile_n) * max(1, alt.split_k)
        assert min(2 * -(-n // cfg.tile_n), SMS) >= min(units, SMS)
    fp8 = POL.choose_dense(problem(m, n, k, "e4m3"), epilogue=SCALED)
    assert not (fp8.tile_m == 64 and fp8.cluster_m == 2)
    if m <= 128:
        assert POL.choose_dense(problem(m, n, k), tile_n=128).cluster_m == 1
    for epi in (EpilogueSpec(quant="mxfp8"), EpilogueSpec(gated="swiglu", preact=True)):  # not run on a GPU: no pair
        cfg = POL.choose_dense(problem(m, n, k), epilogue=epi)
        assert not (cfg.tile_m == 64 and cfg.cluster_m == 2), cfg.name


@settings(max_examples=200, deadline=None)
@given(m=st.integers(113, 128), n=st.integers(1, 60000), k=st.integers(16, 40000), l=st.integers(1, 3),
       act=st.sampled_from([None, "silu", "swiglu"]))  # fmt: skip
def test_64_row_pairs_are_valid_and_stream_least(m, n, k, l, act):
    """Every pair small_m_pair returns is a valid config for its epilogue, unsplit, with the tile_n
    of the fewest streamed columns (ties: the narrower) among the valid ones that engage at least as
    many SMs as the config before it; where it returns none, no tile_n qualifies."""
    from cutegemm import policy

    epi = EpilogueSpec(gated="swiglu") if act == "swiglu" else EpilogueSpec(activation=act)
    p = GemmProblem(m, n, k, l, "bf16", "bf16", "bf16", "k", "k")
    with policy_flags(SMALL_M_PAIRS=False):
        before = POL.choose_dense(p, epilogue=epi)
    cfg = POL.choose_dense(p, epilogue=epi)
    units = -(-m // before.tile_m) * -(-n // before.tile_n) * l * max(1, before.split_k)

    def streamed(tn):
        return -(-(-(-n // tn) * l) // (SMS // 2)) * (64 + tn)

    pair = replace(before, tile_m=64, cluster_m=2, cluster_n=1, split_k=1, split_tail=False, split_cluster=False, raster="n",
                   group=1, a_rows=0)  # fmt: skip
    ok = [tn for tn in policy.PAIR_TILE_N
          if min(2 * -(-n // tn) * l, SMS) >= min(units, SMS) and not config_errors(replace(pair, tile_n=tn))]
    if before.cluster_n > 1 or not ok:
        assert cfg == before
        return
    assert cfg == replace(pair, tile_n=min(ok, key=lambda tn: (streamed(tn), tn))), cfg.name
    assert cfg.epilogue == epi


def test_short_k_takes_the_pingpong_tile_where_it_fills_waves():
    """policy.short_k_pingpong: 16-bit, K <= PINGPONG_MAX_K, M >= PINGPONG_MIN_ROWS, a light
    epilogue and at least SHORT_K_MIN_WAVES waves of 128x192 tiles."""
    q_b = dense(1024, 24576, 1536)  # DeepSeek-V3 q_b
    assert (q_b.tile_m, q_b.tile_n, q_b.pingpong, q_b.cluster_m, q_b.split_k) == (128, 192, True, 2, 1)
    assert not config_errors(q_b)
    with policy_flags(SHORT_K_PINGPONG=False):
        assert not dense(1024, 24576, 1536).pingpong

    def short_k_tile(c):
        return c.pingpong and c.tile_n == 192

    assert short_k_tile(dense(512, 24576, 1536)) and short_k_tile(dense(8192, 6144, 1024))
    for m, n, k, dtype in [(1024, 24576, 2048, "bf16"), (256, 24576, 1536, "bf16"), (512, 1536, 1536, "bf16"),
                           (1024, 24576, 1536, "e4m3")]:  # fmt: skip
        assert not short_k_tile(dense(m, n, k, dtype)), (m, n, k, dtype)
    biased = POL.choose_dense(problem(1024, 24576, 1536), epilogue=EpilogueSpec(bias=True))
    assert not short_k_tile(biased) and not config_errors(biased)


def test_128x96_pairs_along_m_where_n_has_many_more_tiles():
    """policy.wide_n_pairs_m: 128x96 in 2x1 clusters (N-major raster) where the N tiles are at least
    three times the (even) M tiles; 1x2 where the counts are near or the M count is odd."""
    for m, n, k in [(256, 6144, 4096), (768, 2048, 4096), (250, 6100, 2048)]:
        cfg = dense(m, n, k)
        assert (cfg.tile_m, cfg.tile_n, cfg.cluster_m, cfg.cluster_n, cfg.raster) == (128, 96, 2, 1, "n"), cfg.name
    cfg = dense(1024, 1536, 7168)  # 8 x 16 tiles
    assert (cfg.tile_n, cfg.cluster_m, cfg.cluster_n) == (96, 1, 2), cfg.name
    assert not policy.wide_n_pairs_m(problem(384, 6144, 4096))  # 3 M tiles: a pair along M pads one
    assert policy.wide_n_pairs_m(problem(256, 576, 4096)) and not policy.wide_n_pairs_m(problem(256, 480, 4096))


def test_short_k_pingpong_skips_odd_m_tile_counts():
    """short_k_pingpong's 2x1 clusters pad a tile over an odd M count (5 / 7 / 9 at M = 640 / 896 /
    1152): the wave model's pick runs there; even counts and 11+ M tiles keep the pingpong tile."""
    for m in (640, 896, 1152):
        assert not dense(m, 24576, 1536).pingpong
    for m in (512, 768, 1024, 1408):
        cfg = dense(m, 24576, 1536)
        assert cfg.pingpong and (cfg.tile_m, cfg.tile_n, cfg.cluster_m) == (128, 192, 2), (m, cfg.name)
