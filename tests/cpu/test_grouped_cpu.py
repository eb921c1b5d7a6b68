"""CPU: the grouped (MoE) tile map — every (expert, m-tile, n-tile) exactly once, empty experts,
clamping of bad offsets; the device's binary-search lookup mirrored in plain Python."""

import bisect
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from cutegemm.config import Form
from cutegemm.schedulers.grouped import expert_rows, grouped_tile_map


def device_lookup(offs, total_m, tile_m, n_tiles, work):
    """Plain-Python mirror of GroupedScheduler (tile_start prefix + 'last start <= work')."""
    rows = expert_rows(offs, total_m)
    counts = [-(-(e - s) // tile_m) * n_tiles for s, e in rows]
    tile_start = [0, *itertools.accumulate(counts)]
    e = bisect.bisect_right(tile_start[:-1], work) - 1
    local = work - tile_start[e]
    start, end = rows[e]
    mt = -(-(end - start) // tile_m)
    return e, start, end, local % mt, local // mt


counts_st = st.lists(st.one_of(st.just(0), st.integers(0, 300)), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(counts=counts_st, tile_m=st.sampled_from([64, 128]), n_tiles=st.integers(1, 9), workers=st.integers(1, 140))
def test_every_expert_tile_exactly_once(counts, tile_m, n_tiles, workers):
    offs = list(itertools.accumulate(counts))
    total_m = offs[-1]
    tiles = grouped_tile_map(offs, total_m, tile_m, n_tiles)
    expected = {(e, mt, nt) for e, c in enumerate(counts) for mt in range(-(-c // tile_m)) for nt in range(n_tiles)}
    got = []
    for w in range(workers):
        for idx in range(w, len(tiles), workers):
            e, start, end, mt, nt = device_lookup(offs, total_m, tile_m, n_tiles, idx)
            assert (e, start, end, mt, nt) == tiles[idx]
            # The tile lies inside its expert's rows: the rows it may store are [row0, min(end, row0 + tile_m)).
            row0 = start + mt * tile_m
            assert start <= row0 < end
            got.append((e, mt, nt))
    assert len(got) == len(expected) and set(got) == expected


@settings(max_examples=200, deadline=None)
@given(offs=st.lists(st.integers(-50, 400), min_size=1, max_size=20), total_m=st.integers(0, 300))
def test_bad_offsets_are_clamped_into_valid_rows(offs, total_m):
    for start, end in expert_rows(offs, total_m):
        assert 0 <= start <= end <= total_m
    for _, start, end, mt, _ in grouped_tile_map(offs, total_m, 64, 2):
        assert start + mt * 64 < end <= total_m


def test_rows_of_experts_partition_total_for_valid_offs():
    offs = [0, 5, 5, 130, 131, 400]
    rows = expert_rows(offs, 400)
    assert rows == [(0, 0), (0, 5), (5, 5), (5, 130), (130, 131), (131, 400)]


@settings(max_examples=200, deadline=None)
@given(counts=counts_st, tile_m=st.sampled_from([64, 128]), n_tiles=st.integers(1, 5))
def test_two_cta_clusters_cover_every_m_tile_once(counts, tile_m, n_tiles):
    """cluster_m = 2: cluster tile t gives CTA r the m-tile m0 + r of one expert; every real
    (expert, m-tile, n-tile) is covered exactly once and the extra CTA of an odd expert gets an
    empty row range (it stores nothing)."""
    offs = list(itertools.accumulate(counts))
    tiles = grouped_tile_map(offs, offs[-1], tile_m, n_tiles, cluster_m=2)
    rows = expert_rows(offs, offs[-1])
    got, empty = [], 0
    for e, start, end, m0, nt in tiles:
        assert m0 % 2 == 0
        for r in range(2):
            mt = m0 + r
            if (end - start) - mt * tile_m > 0:
                got.append((e, mt, nt))
            else:
                empty += 1
    expected = [(e, mt, nt) for e, (s, t) in enumerate(rows) for nt in range(n_tiles) for mt in range(-(-(t - s) // tile_m))]
    assert sorted(got) == sorted(expected)
    assert empty == sum((-(-(t - s) // tile_m)) % 2 for s, t in rows) * n_tiles


def test_kgrouped_config_rules_and_policy():
    """The K-grouped kernel's config: bf16 / fp16, alpha only (sm_100a: M-major a, N-major b,
    1x1, static); the policy's choice (kgrouped_config) satisfies the rules on sm_90a whatever the
    operand majors, on sm_100a for the weight gradient's majors (others take the host route)."""
    from dataclasses import replace

    from cutegemm.config import GemmConfig, config_errors
    from cutegemm.epilogue import EpilogueSpec
    from cutegemm.grouped.k_grouped import kgrouped_config

    ok = GemmConfig(arch="sm_90a", form=Form.KGROUPED, a_major="m")
    assert config_errors(ok) == [] and ok.name.startswith("kgrouped_")
    assert config_errors(replace(ok, pingpong=True, tile_m=64)) == []  # skips by each tile's own K count
    ok100 = replace(ok, arch="sm_100a", b_major="n", raster="m", group=1)  # the list-form kernel on a device table
    assert config_errors(ok100) == []
    bad = {
        "sm_100a K-major b": replace(ok100, b_major="k"),
        "sm_100a K-major a": replace(ok100, a_major="k"),
        "sm_100a cluster": replace(ok100, cluster_n=2),
        "sm_100a dynamic": replace(ok100, scheduler="dynamic"),
        "fp8": replace(ok, a_dtype="e4m3", b_dtype="e4m3", a_major="k", b_major="k"),
        "bias": replace(ok, epilogue=EpilogueSpec(bias=True)),
        "clc": replace(ok, scheduler="clc"),
    }
    for what, cfg in bad.items():
        assert any("kgrouped" in e for e in config_errors(cfg)), what
    for m, n, k, e in [(7168, 4096, 512, 32), (2048, 1536, 128, 128), (64, 64, 1, 3), (100, 8, 0, 1)]:
        for am, bm in itertools.product("km", "nk"):
            cfg = kgrouped_config("sm_90a", 132, m, n, k, e, "bf16", "fp32", am, bm, True)
            assert cfg.kgrouped and cfg.epilogue.alpha
            assert cfg.pingpong == (k <= 1024 and cfg.tile_m == 128 and cfg.tile_n == 128), cfg.name
            assert config_errors(cfg) == [], (m, n, k, e, am, bm, config_errors(cfg))
            cfg = kgrouped_config("sm_100a", 148, m, n, k, e, "bf16", "fp32", am, bm, True)
            assert cfg.kgrouped and cfg.epilogue.alpha and cfg.arch == "sm_100a"
            assert (config_errors(cfg) == []) == (am + bm == "mn"), (cfg.name, config_errors(cfg))


@settings(max_examples=300, deadline=None)
@given(
    offs=st.lists(st.integers(-20, 700), min_size=1, max_size=8),
    tile_k=st.sampled_from([32, 64, 128]),
    align=st.sampled_from([4, 8, 16]),
)
def test_k_grouped_window_covers_each_slice_exactly(offs, tile_k, align):
    """The K-grouped kernel's K window (twin): the columns its K tiles keep (not zeroed) are
    exactly the expert's clamped slice, and every box starts on a 16-byte boundary."""
    from cutegemm.schedulers.grouped import k_window_ref

    total = max(max(offs), 0) + 5
    for start, end in expert_rows(offs, total):
        k0, n_k, head, rem = k_window_ref(start, end, tile_k, align)
        assert k0 % align == 0 and 0 <= head < align
        kept = []
        for t in range(n_k):
            lo = head if t == 0 else 0
            hi = rem if (t == n_k - 1 and rem > 0) else tile_k
            kept += [k0 + t * tile_k + c for c in range(lo, hi)]
        assert kept == list(range(start, end)), (start, end, k0, n_k, head, rem)


def test_kgrouped_launch_plan_and_views(monkeypatch):
    """The K-grouped launcher's host side (kernel replaced by a recorder): the weight gradient's
    x.t() / dy / (E, M, N) out reach the kernel as (M, K, 1) M-major, (N, K, 1) N-major and
    (M, N, E) views of the caller's own storage; the plan is built once per signature (alpha != 1
    is another); an M-major out (the transposed view of an (E, N, M) buffer) is stored M-major
    (config.c_major "m", a plan of its own); an out with neither mode contiguous, or an M-major
    fp32 one, is left to the caller's other routes."""
    import torch

    import cutegemm.grouped.k_grouped as k_grouped
    from cutegemm.gemm.launch import DENSE_CACHE

    built, calls = [], []
    monkeypatch.setattr(k_grouped, "device_info", lambda index: ("sm_90a", 132))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(DENSE_CACHE, "get", lambda cfg: built.append(cfg) or (lambda *args: calls.append(args)))
    monkeypatch.setattr(k_grouped, "_KG_PLANS", {})
    bf = torch.bfloat16
    M, N, counts = 200, 264, [40, 0, 3, 85]
    K, E = sum(counts), len(counts)
    a = torch.randn(K, M, dtype=bf).t()
    b = torch.randn(K, N, dtype=bf)
    offs = torch.tensor(counts).cumsum(0).to(torch.int32)
    out = torch.empty(E, M, N, dtype=bf)
    assert k_grouped._kgrouped_launch(a, b, offs, out, 1.0, None)
    assert k_grouped._kgrouped_launch(a, b, offs, out, 1.0, None)
    assert len(built) == 1 and len(calls) == 2
    cfg = built[0]
    assert cfg.kgrouped and (cfg.a_major, cfg.b_major) == ("m", "n") and not cfg.epilogue.alpha
    A, B, C = calls[0][:3]
    assert A.shape == (M, K, 1) and A.stride()[:2] == (1, M) and A.data_ptr() == a.data_ptr()
    assert B.shape == (N, K, 1) and B.stride()[:2] == (1, N) and B.data_ptr() == b.data_ptr()
    assert C.shape == (M, N, E) and C.stride() == (N, 1, M * N) and C.data_ptr() == out.data_ptr()
    assert calls[0][8] is offs
    assert k_grouped._kgrouped_launch(a, b, offs, out, 0.5, None)
    assert len(built) == 2 and built[1].epilogue.alpha and calls[-1][5] == 0.5
    out_t = torch.empty(E, N, M, dtype=bf).transpose(1, 2)
    assert k_grouped._kgrouped_launch(a, b, offs, out_t, 1.0, None)
    assert len(built) == 3 and built[2].c_major == "m" and built[0].c_major == "n"
    C = calls[-1][2]
    assert C.shape == (M, N, E) and C.stride() == (1, M, M * N) and C.data_ptr() == out_t.data_ptr()
    assert not k_grouped._kgrouped_launch(a, b, offs, torch.empty(E, N, M).transpose(1, 2), 1.0, None)
    assert not k_grouped._kgrouped_launch(a, b, offs, torch.empty(E, M, 2 * N, dtype=bf)[:, :, ::2], 1.0, None)
