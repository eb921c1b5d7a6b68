"""CPU: the decode-sized-M options of the dense sm_90a kernel: the short A box
(``GemmConfig.a_rows``) and split K (``GemmConfig.split_k``): their rules, the policy's choice
and split K's K ranges and workspace."""

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cutegemm.config import (
    EpilogueSpec,
    Form,
    GemmConfig,
    GemmProblem,
    a_rows_errors,
    can_implement,
    config_errors,
)
from cutegemm.gemm.sm90.split import split_workspace_words
from cutegemm.policy import policy_for, short_a_box, small_m_options
from cutegemm.schedulers.static import split_k_range, tail_unit, tail_units

DECODE = GemmConfig(arch="sm_90a", a_major="k", b_major="k", tile_m=64, tile_n=64, raster="n", group=1)


@given(k_tiles=st.integers(0, 600), split=st.sampled_from([2, 3, 4, 5, 6, 8]))
def test_split_k_ranges_partition_the_k_tiles(k_tiles, split):
    """The ranges of one tile cover its K tiles once, in order, sizes within one of each other."""
    ranges = [split_k_range(s, k_tiles, split) for s in range(split)]
    at = 0
    for first, count in ranges:
        assert first == at and count >= 0
        at += count
    assert at == k_tiles
    sizes = [c for _, c in ranges]
    assert max(sizes) - min(sizes) <= 1


def _select(c, a, b):
    return a if c else b


@given(tiles=st.integers(1, 700), ctas=st.integers(1, 140), split=st.sampled_from([2, 3, 4, 5, 6, 8]))
def test_split_tail_units_cover_each_tile_once(tiles, ctas, split):
    """split_tail: the first (tiles // ctas) * ctas tiles are one whole unit each, every later
    tile split_k consecutive units (its ranges in order); the kernel's select form agrees with the
    plain one; the grid the host launches (min(units, ctas) CTAs) gives the kernel the same D."""
    whole, total = tail_units(tiles, ctas, split)
    assert whole == tiles // ctas * ctas and total == whole + (tiles - whole) * split
    seen = {}
    for work in range(total):
        t, r, ranges = tail_unit(work, whole, split)
        assert (t, r, ranges) == tail_unit(work, whole, split, _select)
        assert 0 <= t < tiles and 0 <= r < ranges
        assert ranges == (1 if t < whole else split)
        assert (t, r) not in seen
        seen[(t, r)] = work
    assert len(seen) == whole + (tiles - whole) * split
    for t in range(whole, tiles):  # a tail tile's ranges: consecutive units, in range order
        assert [seen[(t, r)] for r in range(split)] == list(range(seen[(t, 0)], seen[(t, 0)] + split))
    grid = min(total, ctas)
    assert tail_units(tiles, grid, split)[0] == whole


def test_split_tail_rules_and_workspace():
    from cutegemm.gemm.launch import new_workspace

    ok = replace(DECODE, split_k=2, split_tail=True)
    assert not config_errors(ok) and "_sk2t" in ok.name
    for kw in (dict(split_k=1), dict(split_cluster=True)):
        assert any("split_tail" in e for e in config_errors(replace(ok, **kw))), kw
    # 20 x 10 tiles of 64x64 on 132 CTAs: 132 whole, 68 split in 2
    p = GemmProblem(20 * 64, 10 * 64, 4096, 1, "bf16", "bf16", "bf16", "k", "k")
    ws = new_workspace(ok, "cpu", p, 132)
    assert ws.numel() == split_workspace_words(68, 2, 64, 64) and not ws.any()
    assert new_workspace(replace(ok, split_tail=False), "cpu", p, 132).numel() == split_workspace_words(200, 2, 64, 64)


def test_split_workspace_words():
    # 5 tiles: 8 counter words (16-byte aligned slots), then 2 slots of 64 x 128 fp32 per tile
    assert split_workspace_words(5, 2, 64, 128) == 8 + 5 * 2 * 64 * 128
    assert split_workspace_words(4, 4, 128, 64) == 4 + 4 * 4 * 128 * 64


def test_split_k_rules():
    ok = replace(DECODE, split_k=4)
    assert not config_errors(ok) and "_sk4" in ok.name
    bad = {
        "split_k must be": dict(split_k=7),
        "cluster's size": dict(split_k=3, split_cluster=True),
        "sm_90a only": dict(arch="sm_100a", tile_m=128),
        "dense only": dict(form=Form.GROUPED),
        "1x1 cluster": dict(cluster_n=2),
        "static scheduler": dict(scheduler="dynamic"),
        "per-K-block scales": dict(a_dtype="e4m3", b_dtype="e4m3", tile_m=128, tile_n=128, fp8_blockwise=True),
    }
    for match, kw in bad.items():
        errs = config_errors(replace(ok, **kw))
        assert any(match in e for e in errs), (match, errs)


def test_split_cluster_rules():
    ok = GemmConfig(arch="sm_90a", tile_m=64, tile_n=64, a_major="k", b_major="k", split_k=8, split_cluster=True)
    assert not config_errors(ok) and "_sk8c" in ok.name
    for kw, what in ((dict(split_k=1), "needs split_k in"), (dict(tile_n=128), "receives"),
                     (dict(tile_m=128, tile_n=128, split_k=4), "receives"), (dict(cluster_n=2), "1x1 cluster")):  # fmt: skip
        errs = config_errors(replace(ok, **kw))
        assert any(what in e for e in errs), (kw, errs)
    for kw in (dict(tile_n=128, split_k=4), dict(tile_m=128, split_k=4), dict(tile_m=128, tile_n=128, split_k=2)):
        assert not config_errors(replace(ok, **kw)), kw
    # one CTA per unit along the grid's z: at most 65535 units
    p = GemmProblem(4096, 8192, 4096, 1, "bf16", "bf16", "bf16", "k", "k")
    assert "65535" in can_implement(ok, p)[1]
    assert can_implement(ok, replace(p, m=64))[0]


def test_a_rows_rules():
    ok = replace(DECODE, a_rows=16)
    assert not config_errors(ok) and "_ar16" in ok.name
    for kw in (dict(a_rows=8), dict(a_rows=48), dict(a_rows=112, tile_m=128, tile_n=64)):
        assert not config_errors(replace(ok, **kw)), kw  # 8 or a multiple of 16 below tile_m
    for kw in (dict(a_rows=20), dict(a_rows=24), dict(a_rows=4), dict(a_rows=64),
               dict(a_rows=120, tile_m=128, tile_n=64), dict(a_rows=128, tile_m=128, tile_n=64)):
        assert any("a_rows" in e for e in config_errors(replace(ok, **kw))), kw
    assert any("K-major A" in e for e in config_errors(replace(ok, a_major="m")))
    assert any("K-major A" in e for e in config_errors(replace(ok, cluster_n=2)))
    assert any("cooperative" in e for e in config_errors(replace(ok, pingpong=True)))
    assert any("dense sm_90a" in e for e in config_errors(replace(ok, form=Form.GROUPED)))
    # the problem must fit in the box: rows past it would be read as zeros
    p = GemmProblem(17, 256, 512, 1, "bf16", "bf16", "bf16", "k", "k")
    ok_, why = can_implement(ok, p)
    assert not ok_ and "a_rows=16" in why
    assert can_implement(ok, replace(p, m=16))[0]


def test_policy_short_a_box():
    pol = policy_for("sm_90a", 132)
    for dtype in ("bf16", "e4m3"):
        for m, rows in ((1, 8), (8, 8), (9, 16), (16, 16), (17, 32), (32, 32), (33, 48), (48, 48), (49, 0), (64, 0),
                        (65, 80), (96, 96), (97, 112), (112, 112), (113, 0), (128, 0)):  # fmt: skip
            p = GemmProblem(m, 4096, 7168, 1, dtype, dtype, "bf16", "k", "k")
            cfg = short_a_box(pol.choose(p), p)
            assert cfg.a_rows == rows, (dtype, m, cfg.name)
            assert can_implement(cfg, p)[0], cfg.name
    # not for a column-major (M-major) A
    p = GemmProblem(16, 4096, 7168, 1, "bf16", "bf16", "bf16", "m", "k")
    assert short_a_box(pol.choose(p), p).a_rows == 0
    # DeepSeek block scales too (their scale_a rows have their own box); not the MXFP8 emulation
    p = GemmProblem(16, 4096, 7168, 1, "e4m3", "e4m3", "bf16", "k", "k")
    assert short_a_box(pol.choose(p, fp8_blockwise=True), p).a_rows == 16
    assert any("fp8_mx" in e for e in a_rows_errors(replace(DECODE, a_dtype="e4m3", b_dtype="e4m3", fp8_mx=True,
                                                            a_rows=16)))  # fmt: skip


def test_policy_split_few_tiles():
    pol = policy_for("sm_90a", 132)
    cases = {
        (96, 1536, 7168, "bf16"): (128, 4),
        (128, 4096, 7168, "bf16"): (128, 2),
        (16, 2048, 7168, "fp16"): (64, 2),
        (16, 4096, 7168, "bf16"): (64, 1),
        (128, 7168, 2048, "bf16"): (128, 1),
        (16, 2048, 512, "bf16"): (64, 1),  # 8 K tiles: ranges would hold fewer than 24
        (16, 2048, 3072, "bf16"): (64, 2),
        (16, 2048, 3008, "bf16"): (64, 1),  # 47 K tiles
        (96, 1536, 4096, "bf16"): (128, 2),  # 64 K tiles: 2 ranges, not 4
        (96, 1536, 7168, "e4m3"): (128, 4),  # FP8 row-wise: K tiles of 128, >= 12 per range
        (16, 2048, 7168, "e4m3"): (64, 4),  # FP8 64-row tiles: 4 ranges or none
        (16, 4096, 7168, "e4m3"): (64, 1),
        (128, 7168, 2048, "e4m3"): (128, 1),  # 16 K tiles
        (96, 1536, 4096, "e4m3"): (128, 2),  # 32 K tiles: 2 ranges, not 4
        (1024, 1536, 7168, "bf16"): (128, 1),
    }
    for (m, n, k, dt), (tile_m, split) in cases.items():
        p = GemmProblem(m, n, k, 1, dt, dt, "bf16" if dt == "e4m3" else dt, "k", "k")
        cfg = small_m_options(pol.choose(p), p, 132)
        assert (cfg.tile_m, cfg.split_k) == (tile_m, split), ((m, n, k, dt), cfg.name)
        # two ranges of tiles up to 128x64 meet in shared memory
        assert cfg.split_cluster == (split == 2 and cfg.tile_m * cfg.tile_n <= 8192), cfg.name
        assert can_implement(cfg, p)[0], cfg.name


@given(tiles=st.integers(1, 60), ctas=st.integers(1, 20), split=st.sampled_from([2, 3, 4, 5, 6, 8]),
       tail=st.booleans(), seed=st.integers(0, 2**16), launches=st.integers(1, 3))
def test_split_counter_protocol_in_any_arrival_order(tiles, ctas, split, tail, seed, launches):
    """The fix-up protocol of gemm/sm90/split.py, played in Python with units arriving in a random
    order each launch: every unit stores its slot, then adds 1 to its tile's counter; the unit
    that reads split_k - 1 completes the tile (sums the slots in range order) and sets the counter
    back to 0. Every split tile is completed exactly once per launch, with the same sum whatever
    the order, and every counter is 0 after each launch; whole tiles (split_tail) never count."""
    import random

    rng = random.Random(seed)
    whole, total = tail_units(tiles, ctas, split) if tail else (0, tiles * split)
    n_split = (total - whole) // split
    counters = [0] * n_split
    partial = {(t, r): rng.uniform(-1, 1) for t in range(tiles) for r in range(split)}
    want = {t: sum((0.0, *(partial[(t, r)] for r in range(split)))) for t in range(whole, tiles)}
    for _ in range(launches):
        slots, done = {}, {}
        order = list(range(total))
        rng.shuffle(order)
        for work in order:
            t, r, ranges = tail_unit(work, whole, split) if tail else (work // split, work % split, split)
            if ranges == 1:
                assert t < whole
                continue
            i = t - whole
            slots[(i, r)] = partial[(t, r)]
            old, counters[i] = counters[i], counters[i] + 1
            if old == split - 1:
                assert t not in done
                tot = 0.0
                for rr in range(split):  # range order, as the kernel adds them
                    tot = tot + slots[(i, rr)]
                done[t] = tot
                counters[i] = 0
        assert counters == [0] * n_split
        assert done == want  # bit-equal floats: the same additions in the same order


@pytest.mark.parametrize("m,n,k,want16,want8", [
    (64, 10240, 8192, True, True), (64, 10240, 5120, True, True),  # measured gains, both
    (64, 8192, 28672, True, False), (64, 51200, 5120, True, False),  # e4m3 takes 64x64 tiles there
    (64, 6144, 4096, False, False), (64, 28672, 4096, False, False),  # K = 4096: lost or tied
    (49, 10240, 8192, True, True), (56, 10240, 8192, True, True),  # A's whole 64-row box (a_rows 0)
    (48, 10240, 8192, False, True), (16, 10240, 8192, False, True),  # 16-bit: a short A box, no multicast
    (1, 10240, 5120, False, True),  # e4m3 gives up the short box: measured at M = 1 and 16
    (64, 4096, 14336, False, False),  # 64x64 tiles (few N tiles): not this rule
    (65, 10240, 8192, False, False), (128, 10240, 8192, False, False),
])  # fmt: skip
def test_policy_quad_clusters(m, n, k, want16, want8):
    """64x128 decode tiles with K >= QUAD_MIN_K take 1x4 clusters (A multicast), as measured:
    16-bit for 48 < M <= 64, e4m3 for M <= 64 (A's whole box) where the tiles fit in one round;
    everything else keeps its config."""
    from cutegemm.small_m import QUAD_MIN_K, quad_clusters

    pol = policy_for("sm_90a", 132)
    for dt in ("bf16", "fp16", "e4m3"):
        p = GemmProblem(m, n, k, 1, dt, dt, "bf16", "k", "k")
        for epi in ({}, {"epilogue": EpilogueSpec(scale_a=True, scale_b=True)}) if dt == "e4m3" else ({},):
            cfg = pol.choose_dense(p, **epi)
            quad = (cfg.cluster_m, cfg.cluster_n, cfg.raster, cfg.group) == (1, 4, "m", 1)
            assert quad == (want8 if dt == "e4m3" else want16), (dt, cfg.name)
            if quad:
                assert (cfg.tile_m, cfg.tile_n, cfg.split_k, cfg.a_rows) == (64, 128, 1, 0) and k >= QUAD_MIN_K
                assert not config_errors(cfg)
                base = pol.choose(p, **epi)
                assert quad_clusters(replace(base, cluster_n=2), p, 132) is None  # a multicast pick stays
            # an explicit tile stands
            assert pol.choose_dense(p, tile_m=64, tile_n=128, **epi).cluster_n == 1
    # e4m3 tiles past 3/4 of the SMs keep 1x1 (N 32768 at M = 1 lost 0.99 -> 0.87 in 1x4; 128 tiles
    # of 64x64 in 1x4 ran 0.73 against 0.99): 80 tiles on 132 SMs take it, on 100 SMs they do not
    p = GemmProblem(16, 10240, 8192, 1, "e4m3", "e4m3", "bf16", "k", "k")
    assert quad_clusters(pol.choose(p), p, 132) is not None and quad_clusters(pol.choose(p), p, 100) is None
    p = GemmProblem(16, 16000, 8192, 1, "e4m3", "e4m3", "bf16", "k", "k")  # 125 tiles: not measured, not taken
    assert pol.choose_dense(p).cluster_n == 1


@pytest.mark.parametrize("m,n,k,want", [
    (128, 576, 7168, (1, 4, True)), (128, 1536, 7168, (1, 2, True)), (128, 2048, 4096, (1, 2, True)),  # ranges
    (128, 576, 3072, (1, 2, True)),  # at most the pick's 2 ranges (a shorter K: fewer K tiles per range)
    (128, 4096, 4096, (2, 1, False)), (120, 4096, 14336, (2, 1, False)),  # 2x1 pairs: one range fills the SMs
    (128, 10240, 8192, None), (128, 6144, 4096, None),  # unsplit picks keep their tiles
    (112, 576, 7168, None), (100, 2048, 4096, None),  # M <= 112: a short second 64-row tile
])  # fmt: skip
def test_fp8_row_split(m, n, k, want, monkeypatch):
    """e4m3 picks that cut K over 128x64 tiles at 112 < M <= 128 run 64x64 tiles (small_m.FP8_ROW_SPLIT):
    the most K ranges (in a cluster) whose units fit one round, else 2x1 pairs; 16-bit keeps its rules."""
    pol = policy_for("sm_90a", 132)
    epi = EpilogueSpec(scale_a=True, scale_b=True)
    for od in ("bf16", "e4m3", "fp32"):
        cfg = pol.choose_dense(GemmProblem(m, n, k, 1, "e4m3", "e4m3", od, "k", "k"), epilogue=epi)
        assert not config_errors(cfg)
        if want is None:
            assert cfg.tile_m != 64 or m <= 64, cfg.name
            continue
        assert (cfg.tile_m, cfg.tile_n, cfg.a_rows) == (64, 64, 0), cfg.name
        assert (cfg.cluster_m, cfg.split_k, cfg.split_cluster) == want, cfg.name
        assert 2 * -(-n // 64) * cfg.split_k <= 132 or cfg.split_k == 1
        assert bool(cfg.promote_k) == (od == "fp32")  # fp32 outputs keep their promotion
    from cutegemm import small_m

    bf = pol.choose_dense(GemmProblem(m, n, k, 1, "bf16", "bf16", "bf16", "k", "k"))
    monkeypatch.setattr(small_m, "FP8_ROW_SPLIT", False)
    assert bf == pol.choose_dense(GemmProblem(m, n, k, 1, "bf16", "bf16", "bf16", "k", "k"))  # 16-bit: not this rule
    if want is not None:  # the rule off: the 128x64 pick that cut K
        off = pol.choose_dense(GemmProblem(m, n, k, 1, "e4m3", "e4m3", "bf16", "k", "k"), epilogue=epi)
        assert (off.tile_m, off.tile_n) == (128, 64) and off.split_k > 1, off.name
    assert pol.choose_dense(GemmProblem(m, n, k, 1, "e4m3", "e4m3", "bf16", "k", "k"), epilogue=epi,
                            tile_m=128, tile_n=64, split_k=2).tile_m == 128  # an explicit tile stands
