"""The swapped grouped kernel's arch-neutral parts on the CPU: its config rules and the tile map
(each expert's tokens split evenly over ceil(tokens / tile_n) tiles)."""

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from cutegemm.config import Form, GemmConfig, config_errors
from cutegemm.epilogue import EpilogueSpec
from cutegemm.schedulers.grouped import even_split, swap_tile_map

SWAP = GemmConfig(arch="sm_90a", form=Form.GROUPED, swap_ab=True, b_major="k", tile_m=128, tile_n=192, cluster_m=2, scheduler="dynamic")


def test_swap_config_rules():
    assert config_errors(SWAP) == []
    assert config_errors(replace(SWAP, tile_n=160, cluster_m=1)) == []
    bad = {
        "not grouped": replace(SWAP, form=Form.DENSE),
        "sm_100a": replace(SWAP, arch="sm_100a"),
        "fp8 promoted 256 tokens": replace(SWAP, a_dtype="e4m3", b_dtype="e4m3", tile_n=256),
        "e5m2": replace(SWAP, a_dtype="e5m2", b_dtype="e5m2", tile_n=128),
        "pingpong": replace(SWAP, pingpong=True, scheduler="static"),
        "64 rows": replace(SWAP, tile_m=64),
        "tile_n 200": replace(SWAP, tile_n=200),
        "odd chunks in a pair": replace(SWAP, tile_n=160),
        "cluster_n": replace(SWAP, cluster_n=2, cluster_m=1),
    }
    for name, cfg in bad.items():
        errs = config_errors(cfg)
        assert errs and (name.startswith("fp8 promoted") or any("swap_ab" in e for e in errs)), (name, errs)
    fp8 = replace(SWAP, a_dtype="e4m3", b_dtype="e4m3", tile_n=192, epilogue=EpilogueSpec(scale_a=True, scale_b=True))
    assert config_errors(fp8) == [] and config_errors(replace(fp8, tile_n=256, fast_accum=True)) == []
    for epi in (EpilogueSpec(gated="swiglu", quant="mxfp8"), EpilogueSpec(quant="mxfp8"), EpilogueSpec(beta=True)):
        assert any("swap_ab" in e for e in config_errors(replace(SWAP, epilogue=epi))), epi
    for epi in (EpilogueSpec(alpha=True, activation="gelu"), EpilogueSpec(alpha=True, bias=True, bias_dtype="bf16"),
                EpilogueSpec(alpha=True, bias=True, gated="swiglu"), EpilogueSpec(gated="geglu")):
        assert config_errors(replace(SWAP, epilogue=epi)) == [], epi


@settings(max_examples=300, deadline=None)
@given(count=st.integers(1, 5000), tile_n=st.sampled_from([32, 64, 128, 160, 192, 256]))
def test_even_split(count, tile_n):
    parts = -(-count // tile_n)
    ranges = [even_split(count, parts, j) for j in range(parts)]
    assert ranges[0][0] == 0 and ranges[-1][1] == count
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    widths = [hi - lo for lo, hi in ranges]
    assert min(widths) >= 1 and max(widths) <= tile_n and max(widths) - min(widths) <= 1


@settings(max_examples=200, deadline=None)
@given(counts=st.lists(st.one_of(st.just(0), st.integers(1, 700)), min_size=1, max_size=20),
       tile_n=st.sampled_from([64, 128, 192, 256]), m_tiles=st.integers(1, 5), cluster_m=st.sampled_from([1, 2]),
       pad=st.integers(0, 9))  # fmt: skip
def test_swap_tile_map_covers_every_token_once(counts, tile_n, m_tiles, cluster_m, pad):
    offs, run = [], 0
    for c in counts:
        run += c
        offs.append(run)
    tiles = swap_tile_map(offs, run + pad, tile_n, m_tiles, cluster_m)
    seen = {}
    for e, lo, hi, w in tiles:
        assert 0 < hi - lo <= tile_n
        assert w % cluster_m == 0 and w < m_tiles * cluster_m
        for t in range(lo, hi):
            seen[(t, w)] = seen.get((t, w), 0) + 1
            assert (offs[e - 1] if e else 0) <= t < offs[e]
    assert sorted(seen) == sorted((t, w * cluster_m) for t in range(run) for w in range(m_tiles))
    assert set(seen.values()) == {1} or not seen
