"""CPU properties of the dynamic schedulers (schedulers/dynamic.py): the atomic hand-out covers
every tile (dense and grouped, random offs with empty experts) exactly once whatever the finishing
order; the CLC grid bound holds for any offs and the CLC rules (padding skipped, spurious invalid
responses, no bulk drain) still run every real tile exactly once; config rules and kernel
signature."""

import random
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutegemm.config import Form, GemmConfig, can_implement
from cutegemm.gemm.args import KernelArgs, dense_fake_args, grouped_fake_args
from cutegemm.schedulers.dynamic import clc_grid_clusters, simulate_clc, simulate_dynamic
from cutegemm.schedulers.grouped import expert_rows, grouped_tile_map

# Expert row counts, empty experts likely.
counts_st = st.lists(st.one_of(st.just(0), st.integers(0, 700)), min_size=1, max_size=40)


def offs_of(counts):
    out, run = [], 0
    for c in counts:
        run += c
        out.append(run)
    return out


def expected_grouped_tiles(offs, total_m, tile_m, n_tiles):
    """Every (expert, m_tile, n_tile) the grouped map must produce, from the rows alone."""
    want = set()
    for e, (start, end) in enumerate(expert_rows(offs, total_m)):
        for mt in range(-(-(end - start) // tile_m)):
            want |= {(e, mt, nt) for nt in range(n_tiles)}
    return want


@settings(max_examples=200, deadline=None)
@given(total=st.integers(0, 3000), clusters=st.integers(1, 200), seed=st.integers(0, 2**31))
def test_dynamic_hands_out_every_tile_once(total, clusters, seed):
    counter = [0]
    done = simulate_dynamic(total, clusters, random.Random(seed), counter=counter)
    tiles = [t for ts in done.values() for t in ts]
    assert sorted(tiles) == list(range(total))
    # The launch leaves its counter at 0 (the fetcher of ticket total - 1 resets it): the next
    # launch needs no host reset, and hands out the same tiles.
    assert counter == [0]
    again = simulate_dynamic(total, clusters, random.Random(seed + 1), counter=counter)
    assert sorted(t for ts in again.values() for t in ts) == list(range(total)) and counter == [0]
    # Cluster c starts with tile c when it exists (the first tile needs no atomic).
    for c, ts in done.items():
        if c < total:
            assert ts[0] == c
        else:
            assert ts == []


# (raster_m, group) orders inside an expert: the default, and bands of G m-tiles / n-tiles.
orders_st = st.sampled_from([(True, 1), (False, 1), (False, 2), (False, 3), (False, 8), (True, 2), (True, 4)])


@settings(max_examples=200, deadline=None)
@given(counts=counts_st, tile_m=st.sampled_from([64, 128]), n_tiles=st.integers(1, 9),
       clusters=st.integers(1, 140), pad=st.integers(0, 300), seed=st.integers(0, 2**31), order=orders_st)  # fmt: skip
def test_dynamic_grouped_covers_every_expert_tile_once(counts, tile_m, n_tiles, clusters, pad, seed, order):
    offs = offs_of(counts)
    total_m = offs[-1] + pad
    table = grouped_tile_map(offs, total_m, tile_m, n_tiles, raster_m=order[0], group=order[1])
    done = simulate_dynamic(len(table), clusters, random.Random(seed))
    got = Counter((table[t][0], table[t][3], table[t][4]) for ts in done.values() for t in ts)
    assert all(v == 1 for v in got.values())
    assert set(got) == expected_grouped_tiles(offs, total_m, tile_m, n_tiles)
    # No tile of an empty expert, and every tile's rows lie inside its expert.
    for t in range(len(table)):
        e, start, end, mt, _ = table[t]
        assert counts[e] > 0 and start + mt * tile_m < end


@settings(max_examples=100, deadline=None)
@given(mt=st.integers(1, 40), nt=st.integers(1, 40), group=st.integers(1, 12))
def test_grouped_band_order(mt, nt, group):
    """Raster "n", group G inside one expert: m fastest inside bands of G m-tiles (the last band
    may be shorter), the bands in m order, each walked along N; the default (raster "m", group
    1) is m fastest over the whole expert, the order of the kernels before bands existed."""
    offs = [mt * 128]
    band = [(m, n) for *_, m, n in grouped_tile_map(offs, offs[-1], 128, nt, raster_m=False, group=group)]
    want = []
    for b0 in range(0, mt, group):
        rows = range(b0, min(b0 + group, mt))
        want += [(m, n) for n in range(nt) for m in rows]
    assert band == want
    default = [(m, n) for *_, m, n in grouped_tile_map(offs, offs[-1], 128, nt)]
    assert default == [(m, n) for n in range(nt) for m in range(mt)]
    if group >= mt:  # one band: the default order
        assert band == default


@settings(max_examples=300, deadline=None)
@given(counts=counts_st, over=st.integers(-300, 300), tile_m=st.sampled_from([64, 128, 256]),
       n_tiles=st.integers(1, 30))  # fmt: skip
def test_clc_grid_bounds_the_real_tile_count(counts, over, tile_m, n_tiles):
    """Valid offs (non-decreasing from 0; offs[-1] may exceed total_m: clamped): the host-side grid,
    computed without reading offs, has a cluster for every real tile; the padding is below one
    m-tile per expert plus the rows no expert owns. (Invalid offs can give overlapping clamped
    experts whose tiles exceed the bound; the kernel stays memory-safe, their output is undefined.)"""
    offs = offs_of(counts)
    total_m = max(0, offs[-1] + over)
    real = len(grouped_tile_map(offs, total_m, tile_m, n_tiles))
    grid = clc_grid_clusters(total_m, len(offs), tile_m, n_tiles)
    owned = sum(end - start for start, end in expert_rows(offs, total_m))
    assert real <= grid
    assert grid - real <= ((total_m - owned) / tile_m + len(offs)) * n_tiles
    if total_m % tile_m == 0 and len(offs) == 1 and offs[0] >= total_m:
        assert grid == real  # one expert owning every row: no padding


@settings(max_examples=300, deadline=None)
@given(real=st.integers(0, 400), extra=st.integers(0, 400), resident=st.integers(1, 64),
       p_invalid=st.sampled_from([0.0, 0.025, 0.3]), seed=st.integers(0, 2**31))  # fmt: skip
def test_clc_runs_every_real_tile_once(real, extra, resident, p_invalid, seed):
    """Padding is skipped, spurious invalid responses only end the cluster that got them (the
    clusters still pending launch later and run their own tile): nothing is lost or doubled."""
    grid = real + extra
    processed, padding, queries = simulate_clc(real, grid, resident, random.Random(seed), p_invalid)
    assert sorted(processed) == list(range(real))
    assert padding == extra  # each padding tile is decoded (and skipped) exactly once
    # One query per tile held, one final (invalid) query per cluster that ran.
    assert queries == grid


def test_clc_padding_drained_one_query_at_a_time():
    """Many more padding clusters than real ones (the pad-64 case): the padding is skipped by the
    running clusters; every query observes one cluster, so the drain is serial and exact."""
    processed, padding, queries = simulate_clc(10, 640, 4, random.Random(0))
    assert sorted(processed) == list(range(10)) and padding == 630 and queries == 640


@pytest.mark.parametrize(
    "change, needle",
    [
        (dict(scheduler="clc"), "sm_100a"),
        (dict(scheduler="dynamic", pingpong=True, tile_n=128), "cooperative"),
        (dict(scheduler="atomic"), "scheduler must be one of"),
    ],
)
def test_scheduler_config_rules(change, needle):
    ok, why = can_implement(replace(GemmConfig(arch="sm_90a"), **change))
    assert not ok and needle in why


@pytest.mark.parametrize(
    "cfg",
    [
        GemmConfig(arch="sm_90a", scheduler="dynamic"),
        GemmConfig(arch="sm_90a", form=Form.GROUPED, cluster_n=2, scheduler="dynamic"),
        GemmConfig(arch="sm_100a", scheduler="clc"),
        GemmConfig(arch="sm_100a", form=Form.GROUPED, tile_n=128, scheduler="clc"),
        GemmConfig(arch="sm_100a", scheduler="dynamic"),
    ],
    ids=lambda c: c.name,
)
def test_scheduler_configs_accepted(cfg):
    assert can_implement(cfg) == (True, "")


def test_workspace_kernel_argument():
    """Only the "dynamic" scheduler takes the (1,) int32 counter; the others compile it as None.
    It is the argument before the gather index and the preact output (KernelArgs' last three
    fields; the compile arguments carry the stream, one more, in front of offs)."""
    assert KernelArgs._fields[-3:] == ("workspace", "a_index", "preact")
    for cfg in (GemmConfig(arch="sm_90a"), GemmConfig(arch="sm_100a", scheduler="clc")):
        assert dense_fake_args(cfg)[-3] is None and dense_fake_args(cfg)[-2] is None
    dyn = GemmConfig(arch="sm_90a", scheduler="dynamic")
    ws = dense_fake_args(dyn)[-3]
    assert ws is not None and "int32" in str(ws.element_type).lower()
    assert grouped_fake_args(replace(dyn, form=Form.GROUPED))[-3] is not None
    assert len(dense_fake_args(dyn)) == len(dense_fake_args(GemmConfig(arch="sm_90a")))
    gathered = grouped_fake_args(GemmConfig(arch="sm_90a", form=Form.GROUPED, gather_a=True))
    assert gathered[-3] is None and "int32" in str(gathered[-2].element_type).lower() and gathered[-1] is None


@pytest.mark.parametrize(
    "cfg, stas",
    [
        (GemmConfig(arch="sm_90a", scheduler="dynamic"), "forbidden"),
        (GemmConfig(arch="sm_100a", form=Form.GROUPED, scheduler="dynamic"), "forbidden"),
        (GemmConfig(arch="sm_90a", cluster_m=2, scheduler="dynamic"), "required"),
        (GemmConfig(arch="sm_90a", form=Form.GROUPED, cluster_n=2, scheduler="dynamic"), "required"),
        (GemmConfig(arch="sm_100a", tile_m=256, two_cta=True, cluster_m=2, scheduler="dynamic"), "required"),
        (GemmConfig(arch="sm_100a", scheduler="clc"), "neither"),
    ],
    ids=lambda x: x.name if isinstance(x, GemmConfig) else x,
)
def test_stas_marker_follows_the_cluster_size(cfg, stas):
    """The "dynamic" ring is filled by st.async only in multi-CTA clusters (st.async to
    shared::cluster needs >= 2 CTAs: compute-sanitizer flags it in a 1-CTA cluster); a 1-CTA
    cluster uses a plain st.shared, and compile-check forbids STAS there."""
    from cutegemm.compile_check import forbidden_markers, required_markers

    want = {"required": (True, False), "forbidden": (False, True), "neither": (False, False)}[stas]
    assert ("STAS" in required_markers(cfg), "STAS" in forbidden_markers(cfg)) == want
    assert ("ATOMG.ADD" in required_markers(cfg)) == (cfg.scheduler == "dynamic")
