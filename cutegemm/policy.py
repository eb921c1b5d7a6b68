"""Per-arch policy: machine facts plus the heuristic that picks a GemmConfig for a problem.

Tile/cluster choices were measured on the H200 (bench/RESULTS.md, `python -m cutegemm bench
tiles`); the sm_100a choices are untested defaults (no Blackwell GPU here).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .config import (
    FP8_DTYPES,
    PROMOTE_TILE_N,
    EpilogueSpec,
    Form,
    GemmConfig,
    GemmProblem,
    config_errors,
    split_k_errors,
    swap_ab_epilogue,
)
from .small_m import (  # noqa: F401 (re-exported: tuning, bench.tune, tests)
    FEW_TILES_SPLIT4,
    ceil_div,
    few_tiles,
    fp8_row_split,
    plain_sm90_dense,
    quad_clusters,
    short_a_box,
    small_m_options,
    split_few_tiles,
)

# Packed grouped bf16 / fp16 with at most this many mean rows per expert (and more than 64) runs
# the swapped kernel (GemmConfig.swap_ab).
SWAP_MAX_ROWS = 1024


# Packed grouped 16-bit calls with a short K (<= PINGPONG_MAX_K) and >= PINGPONG_MIN_ROWS rows per
# expert: pingpong 128x192 tiles in 2x1 clusters, so one warpgroup's epilogue runs under the other's
# mainloop (a 12-24 K-tile mainloop leaves the cooperative tile's epilogue exposed; 128x192 is the
# largest pingpong tile without spills). H100: Qwen3-30B-A3B's down projection 0.624 ms against
# 0.706 (torch._grouped_mm 0.718); bench/RESULTS.md, "Short-K expert GEMMs".
PINGPONG_MAX_K = 1536
PINGPONG_MIN_ROWS = 512


# ---- The wave model (sm_90a dense-family tiles for M > 128) ----
# A call's time is its busiest CTA's: the persistent kernel gives each CTA ceil(units / CTAs) work
# units (output tiles x K ranges), and a unit costs its WGMMAs at the tile shape's rate, its
# epilogue's stores, and with split K the fp32 partial sums it writes or reads. The candidate
# predicted fastest wins if it beats the default tile (the widest) by MODEL_MARGIN; the default
# otherwise, so shapes with many waves keep the tile measured at cuBLAS parity.
# Mainloop rate of each cooperative tile shape, relative to the 16-bit (or e4m3) tensor peak at the
# power-capped clock, and the costs per work unit, calibrated on the H200's layer sweep (`bench
# sweep`, bench/RESULTS.md: 176 timings of M > 128 calls over 13 tile / cluster / split configs,
# the constants that minimise the squared log error of the predicted times). 128x160 (2x1) is an
# estimate between its neighbours, raised to 0.95 by the H100's `bench tiles` (512 x 51200 x 5120:
# 128x160 2x1 1.00x cuBLAS in 10 rounds against 128x256's 0.93 in 7, about 0.95 of its rate): it
# fills whole waves where N is a multiple of 5 x 1024 (5120, 10240), the shapes where 128x128,
# 128x192 and 128x256 all leave a wave part-empty. For 64 < M <= 128, 128x96 weighs 0.85
# (SMALL_M_ONLY_RATES: one M tile, 1x1).
# 192x192 (three consumer warpgroups, 1x1 clusters): one wave where 128-row tiles leave a short
# last one (8192 x 576 x 7168: 43 x 3 = 129 tiles; H100 `bench tiles` 0.98x cuBLAS, against 0.89
# for 128x192 with a split tail; cuBLAS runs 192x192 there, ncu). Its rate there and on 2-4 wave
# shapes was 0.97-1.0 of 128x256 2x1's; in 2x1 or 1x2 clusters it lost on wide N.
TALL_RATE = 0.95
# 64x96 (in the clusters of short_tile_cluster): one wave of 64-row tiles where N is a multiple of 96
# and the 128-row tiles fill part of one (1024 x 576 x 7168: 96 tiles, 0.99x cuBLAS against 0.86 for 128x160
# in 4 ranges; cuBLAS runs 64x96 2x4 there). Its rate on one-wave shapes was 0.48-0.59.
SHORT_RATE = 0.55
# e4m3 128x64 (0.43, its rate at 512 x 2048 x 4096): one wave of 128 tiles where 128x128 2x1 fills
# half of one (H100, FP8 row-wise, same process: 1.19x torch._scaled_mm against 0.95).
# 128x96 (0.75) in 1x2 clusters (A multicast: cuBLAS's own tile and cluster there, ncu): 1024 x 1536
# x 7168 is 128 such tiles, one wave. H100, one process, 4 interleaved rounds of 10 L2-flushed reps
# (x cuBLAS): 1x2 0.93, 2x1 (B multicast, the pick before) 0.85-0.87, 128x128 1x2 / 2x1 0.86 / 0.84;
# 1x2 also led 2x1 at 2048 x 1536 x 7168 (0.79 / 0.74) and 2048 x 7168 x 16384 (0.72 / 0.68), tied
# or led at 1024 x 576 x 7168 (0.79 / 0.74-0.79), and trailed it by 3-5% at 512 x 4096 x 4096 and
# 512 x 28672 x 4096.
# Under ncu the 2x1 kernel ran at 79% of the L2's throughput against cuBLAS's 61%. Its rate on 1-19
# wave shapes was 0.72-0.86 (2x1); in 1x1 clusters it ran 0.74-0.75 there.
# 128x224 (2x1, N-major raster, 16-bit dense only: config_errors): nearly whole waves where 128x256
# fills part of its last one (2048 x 7168 x 16384: 512 tiles, 3.9 waves, against 448 of 128x256, 3.4).
# H100, one process, 4 interleaved rounds of 10 L2-flushed reps, x cuBLAS, 128x256 (or the pick) ->
# 128x224: DeepSeek-V3 o (N 7168, K 16384) at M = 512 / 1024 / 1536 / 2048 0.98 / 1.00 / 0.92 /
# 0.89 -> 1.05 / 1.10 / 1.02 / 0.99; 512 x 14336 x 4096 0.99 -> 1.09; 512 x 51200 x 5120 (128x160)
# 0.98 -> 1.03; 1152 x 5120 x 25600 (128x192 in 2 ranges) 0.58 -> 0.85; 512 x 28672 x 4096 0.98 /
# 0.97; 8192^3 1.02 / 1.02 (not a pick). It lost at 384 x 7168 x 16384 (0.75 -> 0.70: one round
# either way, where B's 235 MB read twice bounds the call, which the model does not count).
# Outputs bit-equal to 128x256's. The rate fits those runs.
WIDE_RATE = 0.97
# e4m3 128x160 (2x1) beside 128x192 for M > 128: whole waves where N is a multiple of 5 x 1024 and
# on N = 7168 / 28672. H100, one process, 3 interleaved rounds of 8 L2-flushed reps, 96 shapes (the
# sweep's 16 layers x M = 256 to 8192; x torch._scaled_mm per-tensor, cuBLASLt): with it and
# e4m3's 10 µs split cost (SPLIT_UNIT_SECONDS) the picks ran 0.943 -> 0.958 geomean, e.g. 1024 x
# 7168 x 16384 0.87 -> 0.98, 512 x 10240 x 8192 0.98 -> 1.09, 256 x 51200 x 5120 0.88 -> 0.99; no
# pick it changed lost more than 0.5%. Its rate there was 0.92-0.96 of the model's (the picks
# equal across that range).
E4M3_160_RATE = 0.94
# 192x128 (1x2: A multicast) and 192x160 (1x1): M = 384 / 576 / 1152 in 2 / 3 / 6 M tiles where 128-row
# tiles leave 3 / 5 / 9. Their rates in H100 `bench tiles` (109 shapes, M = 256 to 1536): 0.95 / 0.94 of
# 128x256 2x1's, weighed a little below. `bench sweep`, same rounds, the 16 cases they take: 0.913 ->
# 0.979x cuBLAS (Qwen3-32B down M = 1152 0.84 -> 0.98; one loss, DeepSeek-V3 o M = 384 0.92 -> 0.92).
TALL_128_RATE = 0.93
TALL_160_RATE = 0.91
TILE_RATES = {
    "16-bit": {(128, 256): 1.00, (128, 224): WIDE_RATE, (128, 192): 0.96, (128, 160): 0.95, (128, 128): 0.88,
               (128, 96): 0.75, (192, 192): TALL_RATE, (192, 160): TALL_160_RATE, (192, 128): TALL_128_RATE,
               (64, 96): SHORT_RATE},
    "e4m3": {(128, 192): 0.96, (128, 160): E4M3_160_RATE, (128, 128): 0.85, (128, 64): 0.43},
}
SM_FLOPS = 6.0e12  # 16-bit WGMMA flop/s of one SM at the power-capped clock (802 TFLOP/s / 132); e4m3 twice
SM_STORE_BYTES = 30e9  # HBM bytes/s of one SM's share (4 TB/s / 132): the epilogue's stores
UNIT_SECONDS = 0.5e-6  # a work unit's fixed cost (pipeline fill and drain, the epilogue's latency)
# Split K: the fp32 partial sums (an L2-resident workspace) and each range's wait for the ranges
# before it (the sums are added in range order, for bitwise-reproducible results). 16-bit: 10 µs a
# range, from the H100's bf16 layer sweep, where the split picks ran 1.1-1.3x the model's time at
# 4 µs while unsplit ones ran 0.93x (DeepSeek-V3 q_a 512 x 1536 x 7168: 128x192 in 4 ranges 0.83x
# cuBLAS, 128x64 unsplit 0.93 in `bench tiles`; Qwen3-32B qkv M = 128: 128x160 in 2 ranges 0.91,
# 128x128 unsplit 0.97). e4m3 too since the H100's FP8 timing of 96 shapes (E4M3_160_RATE's):
# at the H200's 4 µs, 512 x 1536 x 7168 took 128x192 in 4 ranges (0.72x torch._scaled_mm against
# 0.92 for 128x64 unsplit) and 256 x 2048 x 4096 128x64 in 2 (0.81 against 0.82).
SM_PARTIAL_BYTES = 30e9
SPLIT_UNIT_SECONDS = {"16-bit": 10e-6, "e4m3": 10e-6}
MODEL_MARGIN = 1.05
# K ranges the wave model weighs (3: 512 x 576 x 7168 in 128x64 tiles, 36 tiles x 3 = 108 units:
# 0.91x cuBLAS on the H200's `bench tiles`, against 0.89 in 2 ranges and the 4-range pick's 0.85)
SPLITS = (1, 2, 3, 4)
# Split K of the last wave only (GemmConfig.split_tail) among the M > 128 candidates: whole waves of
# unsplit tiles, then the part-filled last wave's tiles in ranges. Its units run 1x1 clusters
# (split_k_errors), which lose the 2x1 multicast of B: on wide N that costs more than the tail
# saves (H100 `bench tiles`, 2048 x 7168 x 16384: 128x192 split_tail 776 us, 128x192 2x1 unsplit
# 636), so only problems of at most TAIL_MAX_N_TILES tile columns take it (8192 x 576 x 7168:
# 128x192 with a split tail 101.9 us against the 2x1 pick's 117.4, 0.77 -> 0.89x cuBLAS). A tail
# tile's ranges run side by side and finish together: TAIL_SPLIT_SECONDS per unit for the count
# and the last unit's reads, not SPLIT_UNIT_SECONDS (that tail run: 40 us a unit, 9.4 over half
# the K's mainloop, of which the partial sums' bytes are 6.6).
SPLIT_TAIL = True
TAIL_MAX_N_TILES = 4
TAIL_SPLIT_SECONDS = 3e-6
EXPLICIT_TILE = frozenset({"tile_m", "tile_n", "cluster_m", "split_k", "split_tail", "fast_accum", "fp8_blockwise",
                           "fp8_mx"})  # fmt: skip


@dataclass(frozen=True)
class WaveCandidate:
    tile_m: int
    tile_n: int
    cluster_m: int
    split_k: int
    seconds: float  # the model's time of the call
    fp8: bool = False
    tail: bool = False  # split K on the last wave only (GemmConfig.split_tail)
    cluster_n: int = 1

    def fields(self) -> dict:
        """The GemmConfig fields: 2x1 clusters with an N-major raster (the measured large-shape
        tiles and 128x96's; 16-bit 128x128: M-major, as measured), 1x1 and 1x2 with an M-major one;
        64-row tiles (short_tile_cluster) N-major, as measured."""
        raster = "n" if (self.cluster_m == 2 and (self.tile_n != 128 or self.fp8)) or self.tile_m == 64 else "m"
        return dict(tile_m=self.tile_m, tile_n=self.tile_n, cluster_m=self.cluster_m, cluster_n=self.cluster_n,
                    split_k=self.split_k, split_tail=self.tail, raster=raster, group=1 if self.tile_m == 64 else 8)  # fmt: skip


def wave_seconds(p: GemmProblem, tile_m: int, tile_n: int, cluster_m: int, split: int, num_sms: int,
                 rate: float, tail: bool = False, cluster_n: int = 1) -> float:  # fmt: skip
    """The model's time of ``p`` in (tile_m x tile_n) tiles, (cluster_m x cluster_n) clusters, K
    cut in ``split`` ranges, on ``num_sms`` SMs (see TILE_RATES); ``tail``: only the tiles past the
    whole waves cut (GemmConfig.split_tail: whole waves of unsplit units, then the split ones).
    The tiles are counted in whole clusters: a cluster past an odd tile count runs a CTA on a tile
    of nothing."""
    tiles = padded_tiles(p.m, tile_m, cluster_m) * padded_tiles(p.n, tile_n, cluster_n) * p.l
    flops = SM_FLOPS * (2 if p.a_dtype in FP8_DTYPES else 1) * rate
    out_bytes = 4 if p.out_dtype == "fp32" else 1 if p.out_dtype in FP8_DTYPES else 2

    def unit(ranges: int, split_cost: float) -> float:
        sec = (2 * tile_m * tile_n * ceil_div(p.k, ranges) / flops + tile_m * tile_n * out_bytes / SM_STORE_BYTES
               + UNIT_SECONDS)  # fmt: skip
        if ranges > 1:  # an fp32 partial sum written, or read and added, after the ranges before it
            sec += tile_m * tile_n * 8 / SM_PARTIAL_BYTES + split_cost
        return sec

    ctas = num_sms - num_sms % (cluster_m * cluster_n)
    if tail and split > 1 and tiles >= ctas:
        whole = tiles // ctas
        return whole * unit(1, 0.0) + ceil_div((tiles - whole * ctas) * split, ctas) * unit(split, TAIL_SPLIT_SECONDS)
    units = tiles * split
    return ceil_div(units, min(units, ctas)) * unit(split, SPLIT_UNIT_SECONDS[dtype_family(p.a_dtype)])


def padded_tiles(extent: int, tile: int, cluster: int) -> int:
    """Tiles of ``tile`` over ``extent``, rounded up to whole clusters of ``cluster`` tiles."""
    return ceil_div(ceil_div(extent, tile), cluster) * cluster


def short_tile_cluster(p: GemmProblem, tile_m: int, tile_n: int) -> tuple[int, int]:
    """(cluster_m, cluster_n) of 64x96 tiles: the pair along the side with fewer tiles where that
    count is even, else along the other side where its count is, else 1x1. H100, one process, 4
    interleaved rounds of 10 L2-flushed reps, x cuBLAS, 1x2 / 2x1 (M tiles x N tiles): 2x1 led
    where M has fewer tiles, 512 x 1536 x 4096 (8 x 16) 0.89 / 0.95, 384 x 2048 x 4096 (6 x 22)
    0.72 / 0.89, 256 x 3072 x 4096 0.92 / 0.99, 640 x 1152 x 7168 0.86 / 0.89, 512 x 1536 x 7168
    0.90 / 0.95; 1x2 led where N has fewer, 1024 x 576 x 4096 (16 x 6) 0.99 / 0.84, 1024 x 768 x
    4096 0.84 / 0.78, 2048 x 384 x 4096 0.92 / 0.82, 1280 x 576 x 7168 0.98 / 0.88; an odd count
    pads a cluster (768 x 1024 x 7168, 12 x 11: 0.59 / 0.95; 1536 x 288 x 7168, 24 x 3: 0.83 /
    0.98). 128x96: wide_n_pairs_m."""
    mt, nt = ceil_div(p.m, tile_m), ceil_div(p.n, tile_n)
    fewer_m = mt <= nt
    for along_m in (fewer_m, not fewer_m):  # the side with fewer tiles first
        if (mt if along_m else nt) % 2 == 0:
            return (2, 1) if along_m else (1, 2)
    return 1, 1


PAIR_ODD_M = True  # odd_m_pairs_n (False: 2x1 only, the policy before it)
ODD_M_MAX_TILES = 9  # up to 9 M tiles (a padded tile idles a tenth of the CTAs or more), as measured
# The rate of a 1x2 pair relative to its tile's 2x1 one (16-bit: A multicast, B read by each CTA of
# the pair). H100 same-round A/Bs at M = 1152 (9 M tiles): 192x192 (TALL_RATE, 6 M tiles, no pad)
# ran 0.97 / 0.97 / 0.97x cuBLAS where the 1x2 pairs at the full rate ran 0.84 (Llama-3-70B down,
# 128x192), 0.93 (DeepSeek-V3 q_b, 128x256), 0.95 (Llama-3-8B gate_up, 128x256); at 0.96 the model
# takes 192x192 there and no other off-grid pick of the sweep moves. e4m3 has no 192-row tile: 1.
PAIR_N_RATE = {"16-bit": 0.96, "e4m3": 1.0}


def odd_m_pairs_n(p: GemmProblem, tile_m: int, tile_n: int) -> bool:
    """Whether a 128-row tile's cluster pairs along N (1x2, A multicast, M-major raster) instead of
    along M (2x1): where the M tiles are odd (pads_odd_m) and the pair along N pads fewer tiles. A
    cluster past the last tile still runs a CTA (its peer's multicast needs it) on a tile of
    nothing, which the model counts; even where the rounds come out equal, the 2x1 ran slower.
    H100, one process, 4 interleaved rounds of 10 L2-flushed reps, 2x1 -> 1x2 on the sweep's layers
    at M = 384 / 640 / 896 / 1152: 42 cases where the pick changed, geomean 0.888 -> 1.041x torch
    (bf16 Llama-3-70B qkv M=896 0.75 -> 0.99, FP8 Qwen3-32B qkv M=896 0.87 -> 1.18); three losses,
    where 1x2 128x256 replaced 192x192 at 9 M tiles (PAIR_N_RATE keeps 192x192 for two). Up to
    ODD_M_MAX_TILES: with many M tiles the pad is a small share, and 1x2 clusters of large problems
    ran slower (8192^3 in 128x192: 2.06 ms against 1.38 in 2x1). Every case: bench/RESULTS.md, "Odd
    M-tile counts pair their clusters along N"."""
    if not PAIR_ODD_M or tile_m != 128 or not pads_odd_m(p, tile_m):
        return False
    mt, nt = ceil_div(p.m, tile_m), ceil_div(p.n, tile_n)
    return mt * padded_tiles(p.n, tile_n, 2) < padded_tiles(p.m, tile_m, 2) * nt


def pads_odd_m(p: GemmProblem, tile_m: int = 128) -> bool:
    """Whether ``p`` has an odd count of up to ODD_M_MAX_TILES M tiles: where a 2x1 cluster pads
    one (odd_m_pairs_n, short_k_pingpong)."""
    mt = ceil_div(p.m, tile_m)
    return mt % 2 == 1 and mt <= ODD_M_MAX_TILES


WIDE_N_TILES_PER_M = 3  # wide_n_pairs_m: 128x96 pairs along M from this many N tiles per M tile


def wide_n_pairs_m(p: GemmProblem) -> bool:
    """Whether a 128x96 tile's cluster is 2x1 (B multicast, N-major raster) instead of 1x2 (TILE_RATES'
    note): where the N tiles are at least WIDE_N_TILES_PER_M times an even count of M tiles. H100
    `bench tiles`, 1x2 -> 2x1 (x cuBLAS): 256 x 6144 x 4096 (2 x 64 tiles) 0.94 -> 0.99, 768 x 2048
    x 4096 (6 x 22) 0.92 -> 0.96; 1x2 led where the counts are near (1024 x 1536 x 7168, 8 x 16:
    0.93 against 0.85-0.87). `bench sweep`, same rounds: Qwen3-30B-A3B qkv M = 256 0.90 -> 0.94."""
    mt, nt = ceil_div(p.m, 128), ceil_div(p.n, 96)
    return mt % 2 == 0 and nt >= WIDE_N_TILES_PER_M * mt


def candidate_cluster(p: GemmProblem, tile_m: int, tile_n: int) -> tuple[int, int]:
    """(cluster_m, cluster_n) of an unsplit wave-model tile: 128-row tiles wider than 96 in 2x1
    pairs where there are two M tiles (B multicast; odd_m_pairs_n weighs the 1x2 twin beside them);
    128x96 in 1x2 (A multicast), or 2x1 where wide_n_pairs_m; 192x128 in 1x2 (TALL_128_RATE);
    64x96 in short_tile_cluster's; else 1x1."""
    if tile_m == 64:
        return short_tile_cluster(p, tile_m, tile_n)
    two_n = ceil_div(p.n, tile_n) >= 2
    if tile_m == 128 and tile_n == 96:
        return (2, 1) if wide_n_pairs_m(p) else (1, 2 if two_n else 1)
    if tile_m == 128 and tile_n > 96:
        return (2 if ceil_div(p.m, tile_m) >= 2 else 1), 1
    return (1, 2) if tile_m == 192 and tile_n == 128 and two_n else (1, 1)


def dtype_family(a_dtype: str) -> str:
    """TILE_RATES' key of an operand dtype."""
    return "e4m3" if a_dtype in FP8_DTYPES else "16-bit"


def wave_candidates(p: GemmProblem, num_sms: int, splits=(1,), extra_rates=None, tail: bool = False,
                    other_m: bool = True) -> list[WaveCandidate]:  # fmt: skip
    """Every (tile, cluster, split) the model weighs for ``p``, the default (widest tile) first.
    Unsplit tiles in candidate_cluster's clusters (2x1 over two M tiles, 16-bit 128x128 too, H100
    `bench tiles`: 512 x 4096 x 14336 0.78 -> 0.96x cuBLAS), and 1x2 beside a 2x1 where
    odd_m_pairs_n says so (wave_choice takes that twin of a 2x1 pick); split K on 1x1 clusters only
    (split_k_errors) and tiles up to 128x192 (128x256's partial-sum fix-up spills registers), with
    at least 24 K tiles of 64 (16-bit) / 12 of 128 (FP8) per range, as split_few_tiles.
    ``extra_rates``: more (tile_m, tile_n): rate entries to weigh;
    ``tail``: the splits of the last wave only too, where the tiles fill a wave and span at most
    TAIL_MAX_N_TILES columns; ``other_m``: TILE_RATES' 192-row (unsplit), 64-row (paired,
    unsplit) and 128x96 tiles too (16-bit dense forms only: ArchPolicy.choose falls back without)."""
    fp8 = p.a_dtype in FP8_DTYPES
    base = TILE_RATES[dtype_family(p.a_dtype)]
    rates = {**{t: r for t, r in base.items() if other_m or (t[0] == 128 and t[1] not in (96, 224))}, **(extra_rates or {})}
    if fp8 and p.out_dtype == "fp32":  # promoted per WGMMA (fp32_promotion): its tile widths only
        rates = {t: r for t, r in rates.items() if t[1] in PROMOTE_TILE_N}
    k_tiles, min_tiles = (ceil_div(p.k, 128), 12) if fp8 else (ceil_div(p.k, 64), 24)
    out = []
    for (tm, tn), rate in rates.items():
        pair, cn = candidate_cluster(p, tm, tn)
        tail_ok = tail and ceil_div(p.m, tm) * ceil_div(p.n, tn) * p.l >= num_sms and ceil_div(p.n, tn) <= TAIL_MAX_N_TILES
        for split in splits:
            cl, cln = (pair, cn) if split == 1 else (1, 1)  # split K runs 1x1 clusters (split_k_errors)
            # (split K of 192- / 64-row tiles, and of 128x96 beyond one M tile, never ran on a GPU)
            if split > 1 and (k_tiles < min_tiles * split or tn > 192 or tm != 128 or (tn == 96 and p.m > 128)):
                continue
            sec = wave_seconds(p, tm, tn, cl, split, num_sms, rate, cluster_n=cln)
            out.append(WaveCandidate(tm, tn, cl, split, sec, fp8, cluster_n=cln))
            if split == 1 and cl == 2 and odd_m_pairs_n(p, tm, tn):  # 1x2 beside it (wave_choice)
                pair_rate = rate * PAIR_N_RATE[dtype_family(p.a_dtype)]
                out.append(WaveCandidate(tm, tn, 1, 1, wave_seconds(p, tm, tn, 1, 1, num_sms, pair_rate, cluster_n=2),
                                         fp8, cluster_n=2))  # fmt: skip
            if split > 1 and tail_ok:
                out.append(WaveCandidate(tm, tn, cl, split, wave_seconds(p, tm, tn, cl, split, num_sms, rate, True),
                                         fp8, tail=True))  # fmt: skip
    return out


def wave_choice(p: GemmProblem, num_sms: int, splits=(1,), tail: bool = False, other_m: bool = True) -> WaveCandidate:
    """The model's pick: the fastest candidate if MODEL_MARGIN ahead of the default, else the
    default; a 2x1 pick over an odd count of M tiles gives way to its 1x2 twin where
    odd_m_pairs_n says so. 16-bit weighs 128x64 tiles too (1x1, the small-M rate: H100 `bench
    tiles`, 512 x 2048 x 4096: 128x64 0.98x cuBLAS, 128x128 with 2 K ranges 0.85)."""
    cands = wave_candidates(p, num_sms, splits, SMALL_M_RATES if p.a_dtype not in FP8_DTYPES else None, tail, other_m)
    best = min(cands, key=lambda c: c.seconds)
    pick = best if best.seconds * MODEL_MARGIN < cands[0].seconds else cands[0]
    if pick.cluster_m == 2 and pick.split_k == 1 and odd_m_pairs_n(p, pick.tile_m, pick.tile_n):
        # its 1x2 twin (fewer tiles padded, and faster where the rounds tie: odd_m_pairs_n)
        twin = (pick.tile_m, pick.tile_n, 1, 2, 1)
        return next((c for c in cands if (c.tile_m, c.tile_n, c.cluster_m, c.cluster_n, c.split_k) == twin), pick)
    return pick


# 64 < M <= 128 (one 128-row tile; the decode rule's 128x64 / 128x128, split only where few tiles):
# the wave model over 1x1 tiles, and for 16-bit K splits, for the dtype families in SMALL_M_WAVES
# (`bench sweep` times the picks of the families not in it beside the decode rule's, in the same
# rounds). On the H100's sweep, on the cases where they differ: 16-bit picks 0.979x cuBLAS against
# the decode rule's 0.953 (9 cases; Llama-3-70B qkv M = 128 0.83 -> 0.94); e4m3 picks of wider
# tiles 0.86 / 0.87 / 0.94 -> 0.99 / 0.98 / 1.00x torch._scaled_mm, while its three split-K picks
# lost (1.04 / 1.16 / 1.01 -> 0.99 / 1.04 / 0.95: FP8's short mainloop leaves the partial sums'
# cost exposed), so e4m3 weighs tiles only. The sweep's M = 128 rows in 128x64 tiles ran at
# 0.58-0.62 of the 128x256 rate. 16-bit keeps 2 and 4 ranges here: the 3-range picks lost on the
# H100's sweep in the same rounds (Llama-3-70B down and DeepSeek-V3 o at M = 128, 128x192 in 3
# ranges: 0.97 / 0.95 against 1.01 / 1.01).
SMALL_M_WAVES = frozenset({"16-bit", "e4m3"})
SMALL_M_SPLITS = {"16-bit": (1, 2, 4), "e4m3": (1,)}
SMALL_M_RATES = {(128, 64): 0.60}
# 16-bit 64 < M <= 128 only: 128x96 (the H100 sweep, same rounds: Llama-3-70B qkv M = 128 0.93 ->
# 0.96, Qwen3-32B qkv 0.95 -> 0.96; one M tile, so 1x1 as every pick here)
# e4m3: 128x160 (H100: Qwen3-32B gate_up at M = 128, 2.4 waves of it, 0.98x torch._scaled_mm
# against 128x128's 0.93 in 3.03 waves; the only sweep layer where the model picks it)
SMALL_M_ONLY_RATES = {"16-bit": {(128, 96): 0.85}, "e4m3": {(128, 160): 0.85}}

# FP8 M <= 64 (ArchPolicy.decode_tile): the call streams the weight once, so its time is the bytes
# each round of CTAs reads: a whole round at the HBM peak, a part-filled last one of c CTAs at
# c / DECODE_SAT_CTAS of it. Fitted on every M <= 64 tile timed on the sweep's 16 layers (H100): of
# the 10 cases where a tile led the rule before by 4% or more, it changes 8 to the faster of 64x64
# and 64x128 (e.g. Llama-3-70B qkv, N 10240: 80 tiles of 64x128 in one round against 160 of 64x64
# in 1.2; M = 64 0.96 -> 1.01x torch._scaled_mm); 128-row tiles with a short A box led the other
# two (not weighed). SAT 64-96 pick the same tiles. bench/RESULTS.md, "FP8 row-wise".
DECODE_READ_MODEL = True
DECODE_SAT_CTAS = 80


def decode_read_time(tiles: int, tile_n: int, num_sms: int) -> float:
    """The model's time of a decode call (M <= 64) in ``tiles`` output tiles of ``tile_n``
    columns, in units of one weight column's read at the HBM peak (see DECODE_SAT_CTAS)."""
    whole, last = divmod(tiles, num_sms)
    wave = max(num_sms, DECODE_SAT_CTAS)  # a round of c CTAs takes as long as max(c, DECODE_SAT_CTAS) columns
    return (whole * wave + (max(last, DECODE_SAT_CTAS) if last else 0)) * tile_n


def small_m_alternative(cfg: GemmConfig, p: GemmProblem, num_sms: int) -> GemmConfig | None:
    """The wave model's config for a bf16 / fp16 / e4m3 sm_90a dense call with 64 < M <= 128
    where it is predicted MODEL_MARGIN faster than ``cfg`` (the decode rule's, 128-row tiles),
    else None."""
    if (cfg.arch != "sm_90a" or p.a_dtype not in ("bf16", "fp16", *FP8_DTYPES) or not 64 < p.m <= 128
            or cfg.tile_m != 128 or cfg.form not in (Form.DENSE, Form.FLAT) or cfg.split_cluster
            or cfg.pingpong or cfg.fp8_blockwise or cfg.fp8_mx):  # fmt: skip
        return None
    extra = {**SMALL_M_RATES, **SMALL_M_ONLY_RATES[dtype_family(p.a_dtype)]}
    rates = {**TILE_RATES[dtype_family(p.a_dtype)], **extra}
    if (cfg.tile_m, cfg.tile_n) not in rates:
        return None
    now = wave_seconds(p, 128, cfg.tile_n, 1, max(1, cfg.split_k), num_sms, rates[(128, cfg.tile_n)])
    # one 128-row tile: 1x1 clusters (the config below), whatever cluster a candidate names
    splits = SMALL_M_SPLITS[dtype_family(p.a_dtype)]
    best = min(wave_candidates(p, num_sms, splits, extra, other_m=False), key=lambda c: c.seconds)
    if best.seconds * MODEL_MARGIN >= now:
        return None
    alt = replace(cfg, tile_n=best.tile_n, split_k=best.split_k, cluster_m=1, cluster_n=1, raster="n", group=1)
    return None if config_errors(alt) or (alt.split_k > 1 and split_k_errors(alt)) else alt


# 16-bit, 112 < M <= 128 (two 64-row tiles, the second nearly full; below, the 128-row tile's short
# A box pays more): the call streams the weight, and the SMs streaming it set the pace. A 2x1 pair
# of 64-row tiles (B multicast) puts two SMs on each weight tile with no K split, where the picks
# above put one SM on each 128-row tile or split its K. small_m_pair takes the pair where it engages
# at least as many SMs as the pick's work units; its tile_n is the one whose rounds of pairs stream
# the fewest bytes per SM, each CTA streaming its 64 A rows and tile_n B columns: rounds x (64 +
# tile_n), ties to the narrower. Fitted on the H200 (one process, 4 interleaved rounds of 10
# L2-flushed reps, x cuBLAS, the sweep's 16 layers at M = 128, the pick -> the pair): taken on 14,
# geomean +3.3% (Llama-3-70B qkv 0.96 -> 1.01 in 64x160, Qwen3-30B-A3B qkv 0.92 -> 0.96 in 64x80,
# DeepSeek-V3 o 0.99 -> 1.06 in 64x128 where the pick split K in 2; Llama-3-8B o 0.994 -> 0.989 the
# one loss); its tile_n was the fastest pair's on 12 of the 14. Not taken on DeepSeek-V3 q_a / kv_a
# (N 1536 / 576: 48 / 18 CTAs against the pick's 96 / 72 K-split units; the pairs ran 0.83 / 0.60
# against 0.96 / 1.01). At M = 80 (a second tile of 16 rows) the pairs lost to the short-box picks
# on 13 of 16 layers. Checked on an H100 (`bench sweep`, the previous picks in the same rounds): the
# 14 cases 0.980 -> 1.022 at M = 128 and 0.978 -> 1.021 at M = 120, every one faster. FP8 pairs at
# M = 128 led the pick on 7 layers and trailed on 9 (up to 14%): 16-bit only.
SMALL_M_PAIRS = True
PAIR_TILE_N = (64, 80, 96, 128, 160, 192)


def small_m_pair(cfg: GemmConfig, p: GemmProblem, num_sms: int) -> GemmConfig | None:
    """The 2x1 pair of 64-row tiles for a 16-bit sm_90a dense call with 112 < M <= 128 where it
    engages at least as many SMs as ``cfg``'s work units (see SMALL_M_PAIRS), else None. Plain,
    alpha, beta * C, bias, activation and gated outputs (the forms its GPU tests run)."""
    epi = cfg.epilogue  # (quantized, preact and user outputs on the pairs have not run on a GPU)
    if (not SMALL_M_PAIRS or not plain_sm90_dense(cfg) or p.a_dtype not in ("bf16", "fp16") or not 112 < p.m <= 128
            or cfg.pingpong or cfg.cluster_n > 1 or epi.preact):  # fmt: skip
        return None
    units = ceil_div(p.m, cfg.tile_m) * ceil_div(p.n, cfg.tile_n) * p.l * max(1, cfg.split_k)
    pairs = num_sms // 2

    def streamed(tn: int) -> int:  # rounds of pairs x the columns each CTA streams per K step
        return ceil_div(ceil_div(p.n, tn) * p.l, pairs) * (64 + tn)

    for tn in sorted(PAIR_TILE_N, key=lambda t: (streamed(t), t)):
        if min(2 * ceil_div(p.n, tn) * p.l, 2 * pairs) < min(units, num_sms):
            continue
        alt = replace(cfg, tile_m=64, tile_n=tn, cluster_m=2, cluster_n=1, split_k=1, split_tail=False,
                      split_cluster=False, raster="n", group=1, a_rows=0)  # fmt: skip
        if not config_errors(alt):
            return alt
    return None


# Dense 16-bit calls with a short K (<= PINGPONG_MAX_K) and >= PINGPONG_MIN_ROWS rows take the
# packed grouped form's short-K tile (pingpong 128x192 in 2x1 clusters: one warpgroup's epilogue
# under the other's mainloop), where its tiles fill SHORT_K_MIN_WAVES waves (with few tiles
# 128x192 pingpong ran 30% slower, bench.tune). H100 `bench tiles`, x cuBLAS, two runs: DeepSeek-V3
# q_b (24576 x 1536) at M = 1024 1.054 / 1.049 against the pick's (128x256 2x1) 1.005 / 0.998; at
# M = 512 1.012 against 0.990. Not where its 2x1 cluster pads an M tile (pads_odd_m): `bench sweep`, same
# rounds, q_b at M = 576 / 640 / 1152 0.71 / 0.81 / 0.88x cuBLAS in it, 0.96 / 1.02 / 0.97 without.
SHORT_K_PINGPONG = True
SHORT_K_MIN_WAVES = 2
PINGPONG_ODD_M = False  # True: the rule takes odd M-tile counts too (the rule before)


def short_k_pingpong(cfg: GemmConfig, p: GemmProblem, num_sms: int) -> GemmConfig | None:
    """The pingpong 128x192 2x1 tile for a short-K 16-bit sm_90a dense call (see SHORT_K_PINGPONG),
    else None."""
    if (not SHORT_K_PINGPONG or cfg.arch != "sm_90a" or p.a_dtype not in ("bf16", "fp16") or p.k > PINGPONG_MAX_K
            or p.m < PINGPONG_MIN_ROWS or cfg.form not in (Form.DENSE, Form.FLAT) or not cfg.epilogue.light
            or ceil_div(p.m, 128) * ceil_div(p.n, 192) * p.l < SHORT_K_MIN_WAVES * num_sms
            or not PINGPONG_ODD_M and pads_odd_m(p)):  # fmt: skip
        return None
    alt = replace(cfg, tile_m=128, tile_n=192, pingpong=True, cluster_m=2, cluster_n=1, raster="n", group=8, split_k=1,
                  split_tail=False, split_cluster=False)  # fmt: skip
    return None if config_errors(alt) else alt


@dataclass(frozen=True)
class ArchPolicy:
    arch: str
    num_sms: int
    smem_bytes: int

    def choose_dense(self, p: GemmProblem, **overrides) -> GemmConfig:
        """A dense call's config: :meth:`choose`, then the decode-sized-M options
        (:func:`small_m_options`, :func:`quad_clusters`, :func:`small_m_alternative`, :func:`small_m_pair`,
        :func:`fp8_row_split`; no-ops where
        the arch or the config does not take them); for
        M > 128 on sm_90a the wave model may cut K too (:func:`wave_choice` with SPLITS), and a short K
        takes the pingpong tile (:func:`short_k_pingpong`)."""
        cfg = self.choose(p, **overrides)
        explicit = bool(set(overrides) & EXPLICIT_TILE)  # the caller's tile, split or recipe stands
        if p.m > 128 and self.arch == "sm_90a" and cfg.form in (Form.DENSE, Form.FLAT) and not explicit:
            pick = wave_choice(p, self.num_sms, SPLITS, SPLIT_TAIL)
            alt = replace(cfg, **pick.fields()) if pick.split_k > 1 else None
            if alt is not None and not split_k_errors(alt) and not config_errors(alt):
                cfg = alt
        if not explicit:
            cfg = short_k_pingpong(cfg, p, self.num_sms) or cfg
        cfg = small_m_options(cfg, p, self.num_sms)
        if not explicit:
            cfg = quad_clusters(cfg, p, self.num_sms) or cfg
        if dtype_family(p.a_dtype) in SMALL_M_WAVES and not explicit:
            cfg = small_m_alternative(cfg, p, self.num_sms) or cfg
        if not explicit:
            cfg = small_m_pair(cfg, p, self.num_sms) or fp8_row_split(cfg, p, self.num_sms) or cfg
        return cfg

    def choose(self, p: GemmProblem, **overrides) -> GemmConfig:
        if "fast_accum" in overrides and self.arch != "sm_90a":  # sm_100a's FP8 MMA has no promotion step
            overrides = {k: v for k, v in overrides.items() if k != "fast_accum"}
        if overrides.get("fast_accum") and self.arch == "sm_90a" and p.a_dtype in FP8_DTYPES and p.m > 128:
            # FP8 fast accumulation (bench_fp8 on the H200): pingpong 128x128 + 2x1
            # cluster was best or tied on every shape > 128 rows (+15% at 16384x7168x2048).
            overrides = dict(tile_m=128, tile_n=128, pingpong=True, cluster_m=2, raster="n", group=8, **overrides)
        if overrides.get("fp8_blockwise") and self.arch == "sm_90a" and p.m > 128:
            # DeepSeek FP8 block scaling: tile_n 64 / 128 (one 128-column scale block of B) or
            # 192 (two); cooperative 128x128 + 2x1 cluster (64x128 per warpgroup, two fp32
            # accumulators). H200, 8192³: 1034 TFLOP/s, ahead of
            # the 1x2 cluster (1000, with pipelined promotion); few tiles measured. M <= 128 keeps
            # the 128x64 tile below.
            # wg_order (the warpgroups take turns per K tile): 1134 vs 1029 TFLOP/s at 8192³ in one
            # run.
            # 128x192 (a tile over two B scale blocks): 8192³ 1253 vs 1145,
            # 16384x7168x2048 1161 vs 1103, 4096³ (5 waves of 128x192 tiles) 1039 vs 1065 and
            # 1030 vs 1006 in two runs.
            # From 4 waves of such tiles on (small-M sweep:
            # 2048x7168x2048 981 vs 913; 512x7168x2048, 1.2 waves: 544 vs 664).
            wide = ceil_div(p.m, 128) * ceil_div(p.n, 192) * p.l >= 4 * self.num_sms
            tile = dict(tile_m=128, tile_n=192 if wide else 128, cluster_m=2, raster="n", group=8, wg_order=True)
            overrides = {**tile, **overrides}
        elif overrides.get("fp8_blockwise") and self.arch == "sm_90a" and p.m <= 64:
            # Decode-sized M: the row-wise rule (decode_tile), one warpgroup per tile. H200, µs, in
            # one run (torch's blockwise _scaled_mm): N7168
            # K2048 M=16 11.0 (pingpong 64x64, the old policy, 11.3; torch 12.0), M=64 10.7
            # (10.9; 12.2); N28672 K4096 M=16 42.8 (49.7; 44.1); N4096 K7168 M=16 21.1 (21.5; 19.3).
            tile = dict(self.decode_tile(p), pingpong=False, cluster_m=1, cluster_n=1)
            overrides = {**tile, **overrides}
        base = dict(
            arch=self.arch,
            a_dtype=p.a_dtype,
            b_dtype=p.b_dtype,
            out_dtype=p.out_dtype,
            a_major=p.a_major,
            b_major=p.b_major,
        )
        cfg = GemmConfig(**base, **self._tile(p))
        cfg = replace(cfg, **overrides) if overrides else cfg
        if config_errors(cfg):  # an epilogue or form the 192- / 64-row or 96-column picks do not take
            cfg = replace(GemmConfig(**base, **self._tile(p, other_m=False)), **overrides)
        return fp32_promotion(cfg, overrides)

    def _tile(self, p: GemmProblem, other_m: bool = True) -> dict:
        raise NotImplementedError

    def decode_tile(self, p: GemmProblem) -> dict:
        """Decode-sized M (<= 64): 64-row tiles (one consumer warpgroup), not 128 rows mostly
        padding; 64x128 when that gives enough SMs a tile (FP8: as many tiles as SMs, its K steps
        carry half the bytes so more CTAs pay off sooner; 16-bit: a third of them), else 64x64
        (twice the CTAs). H200 (µs, old policy 128x64 -> new, torch
        in the same run): bf16 N7168 K2048: M=64 20.4 -> 15.3 (15.2), M=16 22.1 -> 15.8 (14.9);
        N28672 K4096 M=16 123 -> 71 (69); N4096 K7168 M=64 43.5 -> 25.6 (24.7). FP8 row-wise:
        N7168 K2048 M=16 14.2 -> 11.3 (torch 13.1); N28672 K4096 M=16 71.7 -> 43.6 (50.9).
        FP8 since: the tile of the two that :func:`decode_read_time` predicts sooner (the rule
        before it: 64x128 from as many tiles as SMs)."""
        rows = ceil_div(p.m, 64) * p.l
        if p.a_dtype in FP8_DTYPES and DECODE_READ_MODEL:  # FP8: the tile that streams the weight sooner
            sms = self.num_sms
            wide = decode_read_time(rows * ceil_div(p.n, 128), 128, sms) <= decode_read_time(rows * ceil_div(p.n, 64), 64, sms)
        else:
            wide = rows * ceil_div(p.n, 128) >= (self.num_sms if p.a_dtype in FP8_DTYPES else self.num_sms // 3)
        return dict(tile_m=64, tile_n=128 if wide else 64, raster="n", group=1)

    def choose_grouped(self, p: GemmProblem, num_groups: int, packed: bool = True, **overrides) -> GemmConfig:
        """Grouped: p.m is the total row count; the tile follows the mean rows per expert.
        sm_90a choices from a sweep of grouped configs on the H200 (bench/RESULTS.md).
        ``packed=False``: neither the swapped kernel nor the short-K pingpong tile (the list form
        and the gather kernel: the first has no swapped kernel, neither was timed with pingpong);
        an M-major C (``c_major="m"``) is not stored by the swapped kernel either."""
        rows = p.m / max(num_groups, 1)
        epi = overrides.get("epilogue", EpilogueSpec())
        if rows <= 64:  # decode: memory-bound on the weights; small tiles, A shared over 2 CTAs
            tile = dict(tile_m=64, tile_n=128, cluster_n=2)
        elif (packed and self.arch == "sm_90a" and p.a_dtype in ("bf16", "fp16") and p.k <= PINGPONG_MAX_K
              and rows >= PINGPONG_MIN_ROWS and epi.light):  # fmt: skip
            tile = dict(tile_m=128, tile_n=192, cluster_m=2, pingpong=True)  # see PINGPONG_MAX_K
        elif (packed and self.arch == "sm_90a" and rows <= SWAP_MAX_ROWS
              and (p.a_dtype in ("bf16", "fp16") or (p.a_dtype in FP8_DTYPES and overrides.get("fast_accum", False)))
              and swap_ab_epilogue(epi) and overrides.get("c_major", "n") == "n"):  # fmt: skip
            # Tokens along the WGMMA's N (swap_ab): an expert's last tile costs its real tokens'
            # tensor work and loads, not a whole 128-row tile's. H200 (same
            # runs as torch._grouped_mm): DeepSeek-V3 up 714 vs 678 TFLOP/s (the 128x256 c1x2
            # tile below), down 679 vs 651, Qwen3-30B-A3B (128x192: its ~128-token experts fill
            # one tile, and more stages keep more weight bytes in flight) 420 vs 401; Mixtral
            # (4096 rows per expert, no ragged waste to save) 2-5% slower, so not above
            # SWAP_MAX_ROWS. FP8 row-wise with fast accumulation (vs the
            # 128x256 c1x2 tile below): DeepSeek-V3 up 1354 vs 1251, Qwen3 702 vs 677, down 1125
            # vs 1131; with promotion the swapped kernel was 7-21% slower (not taken).
            tile = dict(tile_m=128, tile_n=192 if rows <= 192 else 256, cluster_m=2, scheduler="dynamic", swap_ab=True)
        else:  # 128x256 with the dynamic (atomic-counter) scheduler: best or within 1% of best on
            # every MoE shape > 64 rows per expert once the epilogue ring left it 4 A/B stages
            # (H200, a sweep of grouped configs: DeepSeek-V3 up / down, Qwen3 (ahead of
            # pingpong 128x128 by 6%), Mixtral; 2x1 clusters and pingpong 64x256 were slower)
            tile = dict(tile_m=128, tile_n=256, cluster_n=2, scheduler="dynamic")
        if p.a_dtype in FP8_DTYPES and not tile.get("swap_ab"):
            tile.pop("scheduler", None)  # FP8 grouped was measured with the static scheduler only
            if not overrides.get("fast_accum", False):
                # FP8 with promotion: two fp32 accumulators, at most 64x192 per warpgroup. Row-wise
                # scales: the dynamic scheduler, +1.9% / +1.4% on DeepSeek-V3 up / down in one run;
                # block scales stay static (-3.5%)
                tile = (dict(tile_m=64, tile_n=128, cluster_n=2) if rows <= 64
                        else dict(tile_m=128, tile_n=192, cluster_n=2, scheduler="dynamic"))  # fmt: skip
            if overrides.get("fp8_blockwise"):
                # 128-row tiles with wg_order: +1.3% / +2% on DeepSeek-V3 up / down;
                # 128x192 (two B scale blocks per tile): +3.7% / +5% over 128x128
                tile = dict(tile_m=64, tile_n=128, cluster_n=2) if rows <= 64 else dict(tile_m=128, tile_n=192, cluster_n=2, wg_order=True)
        if self.arch == "sm_100a":
            tile = dict(tile_m=64 if rows <= 64 else 128, tile_n=128)
        cfg = replace(self.choose(p), form=Form.GROUPED, cluster_m=1, cluster_n=1, raster="m", group=1, two_cta=False,
                      promote_k=0)  # fmt: skip
        cfg = replace(cfg, **tile)
        return fp32_promotion(replace(cfg, **overrides) if overrides else cfg, overrides)

    def choose_gathered(self, p: GemmProblem, num_groups: int, **overrides) -> GemmConfig:
        """The packed form with A's rows gathered through an index (cutegemm.grouped.gather):
        :meth:`choose_grouped`'s tile, made :func:`gathered`. Not measured yet."""
        cfg = self.choose_grouped(p, num_groups, packed=False, **overrides)
        return gathered(cfg, p.m / max(num_groups, 1))


# The MoE layer's up projection reads its rows through the dispatch index (the gather kernel)
# where that measured faster than the gathered copy plus the TMA kernel, H200, bench moe forward,
# ms, gather / copy: hidden 2048 with 1024-2048 rows per expert 3.38 / 3.53 (Qwen3-30B-A3B), 3.78 /
# 3.93 (OLMoE); slower with 4 rows per expert (decode, 0.388 / 0.375) and at hidden 4096 (Mixtral,
# 8.63 / 8.22) and 7168 (DeepSeek-V3, 14.45 / 12.14): the cp.async row loads fall behind TMA as
# the rows get longer.
GATHER_MAX_HIDDEN = 2048
GATHER_MIN_ROWS_PER_EXPERT = 64


def gather_pays(hidden: int, rows: int, experts: int) -> bool:
    """Whether a MoE layer's up projection takes the gather kernel (else the gathered copy)."""
    return hidden <= GATHER_MAX_HIDDEN and rows >= GATHER_MIN_ROWS_PER_EXPERT * max(experts, 1)


def gathered(cfg: GemmConfig, rows_per_group: float) -> GemmConfig:
    """A packed grouped config made the gathered-A kernel's (GemmConfig.gather_a): A is not
    multicast (cluster_n 1; on sm_90a B is, over a 2x1 cluster of one expert's m-tiles, where the
    experts have more rows than a tile), the static scheduler, not the swapped kernel."""
    cluster_m = 2 if rows_per_group > cfg.tile_m and cfg.arch == "sm_90a" else 1
    return replace(cfg, gather_a=True, cluster_m=cluster_m, cluster_n=1, scheduler="static", swap_ab=False)


def fp32_promotion(cfg: GemmConfig, overrides: dict) -> GemmConfig:
    """FP8 row-wise / tensor-wise with promotion into an fp32 output (sm_90a): a partial sum per
    WGMMA (promote_k 32), not per 128-K tile, unless the caller chose promote_k. The tensor core's
    FP8 accumulation keeps about 14 bits of each partial sum (DeepSeek-V3 report; a CPU model of
    it, tests/cpu/test_fp8_accumulation_cpu.py, matches the 276 of 32768 elements the H200 put
    beyond torch's 2e-3 at 128 x 512 x 256 with 128-K partial sums); an fp32 output shows those
    bits, a bf16 one rounds them away. The K tile's WGMMAs then run per column half, one half's
    adds under the other half's WGMMA (the MXFP8 emulation's mainloop); its speed is not measured
    yet, so only fp32 outputs take it. Configs the promote_k rule refuses (fast_accum, block
    scales, pingpong, swap AB, K-grouped, tile_n 256) pass through."""
    if cfg.arch != "sm_90a" or cfg.a_dtype not in FP8_DTYPES or cfg.out_dtype != "fp32" or cfg.promote_k or "promote_k" in overrides:
        return cfg
    promoted = replace(cfg, promote_k=32, wg_order=False)
    return cfg if config_errors(promoted) else promoted


class Sm90Policy(ArchPolicy):
    # Chosen from `python -m cutegemm bench tiles` on the H200 (bench/RESULTS.md):
    # 128x256 cooperative + 2x1 cluster, N-major raster, was best or within 2% of best on every
    # large shape; pingpong 128x128 was within 1-4% but never clearly ahead; for 64 < M <= 128 a
    # 128x64 tile (112 CTAs at N=7168) beat 64x128, 64x256 and every multicast variant.
    def _tile(self, p: GemmProblem, other_m: bool = True) -> dict:
        if p.m <= 64:
            return self.decode_tile(p)
        if p.m <= 128:
            # 128x128 once its tiles fill the SMs (half the re-reads of A; H200, bench/RESULTS.md,
            # us: 96 x 28672 x 4096 75.4 with 128x64 tiles (A's box of
            # 96 rows) -> 71.2 (torch 71.9); FP8 128 x 28672 x 4096 47.4 -> 43.6 (43.3))
            wide = ceil_div(p.n, 128) * p.l >= self.num_sms
            if p.a_dtype not in FP8_DTYPES and few_tiles(ceil_div(p.m, 64) * ceil_div(p.n, 64) * p.l, self.num_sms):
                # So few tiles that 64x64 ones still take 4 K ranges (split_few_tiles): twice the
                # CTAs of 128x64 (H100, 128 x 576 x 7168: 64x64 with 4 ranges 1.07x cuBLAS, 128x64 0.89)
                return dict(tile_m=64, tile_n=64, raster="n", group=1)
            return dict(tile_m=128, tile_n=128 if wide else 64, raster="n", group=1)
        # M > 128: the wave model over the cooperative tiles (FP8 with promotion: at most 64x192
        # per warpgroup), its default the measured large-shape tile (16-bit 128x256 2x1, at cuBLAS
        # parity; FP8 128x192 2x1). Split K is the dense call's (choose_dense).
        pick = wave_choice(p, self.num_sms, other_m=other_m)
        return {k: v for k, v in pick.fields().items() if k not in ("split_k", "split_tail")}


class Sm100Policy(ArchPolicy):
    def _tile(self, p: GemmProblem, other_m: bool = True) -> dict:
        if p.m >= 256 and ceil_div(p.m, 256) * ceil_div(p.n, 256) * p.l >= self.num_sms // 2:
            return dict(tile_m=256, tile_n=256, two_cta=True, cluster_m=2)
        return dict(tile_m=128, tile_n=128)


POLICIES = {
    "sm_90a": Sm90Policy("sm_90a", num_sms=132, smem_bytes=232448),
    "sm_100a": Sm100Policy("sm_100a", num_sms=148, smem_bytes=232448),
}


def policy_for(arch: str, num_sms: int | None = None) -> ArchPolicy:
    pol = POLICIES[arch]
    return replace(pol, num_sms=num_sms) if num_sms else pol
