"""Decode-sized M options of the dense policy (sm_90a, M <= 128): A's short TMA box, K split
over few output tiles, and clusters of four 64x128 tiles along N (:func:`quad_clusters`).
:mod:`cutegemm.policy` applies them (``ArchPolicy.choose_dense``) and re-exports them."""

from __future__ import annotations

from dataclasses import replace

from .config import (
    FP8_DTYPES,
    Form,
    GemmConfig,
    GemmProblem,
    a_rows_errors,
    a_rows_for,
    config_errors,
    split_k_errors,
)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def short_a_box(cfg: GemmConfig, p: GemmProblem) -> GemmConfig:
    """The dense call's config with ``a_rows`` (A's TMA box: M rounded up to 8 or a multiple of
    16) when M fits in fewer rows than the tile has and the config allows it (sm_90a dense,
    K-major A, no A multicast); else cfg. The zeros the TMA unit fills in past M take time with
    the rows. H200 (bench/RESULTS.md, us, torch.matmul in
    the same run): 16 x 4096 x 7168 in 64x64 tiles, M = 1 / 16 / 32 / 64: 37.7 / 32.6 / 28.5 /
    25.7 (torch 25.6-26.1); with the box, 128x64 tiles: 72 x 4096 x 7168 33.7 -> 27.4 (27.2),
    96 x 7168 x 2048 17.3 -> 15.8 (15.1), 96 x 28672 x 4096 93.5 -> 75.4 (71.9); FP8 96 x 7168 x
    2048 12.5 -> 11.8 (torch._scaled_mm 12.6); 64x64 tiles: 40 x 4096 x 7168 26.2 -> 25.0 (25.9).
    DeepSeek block scales take it too (their scale_a rows keep a box of tile_m rows)."""
    box = a_rows_for(p.m)
    if cfg.a_rows or box >= cfg.tile_m or a_rows_errors(replace(cfg, a_rows=box)):
        return cfg
    return replace(cfg, a_rows=box)


# 16-bit 64-row tiles take 4 K ranges (not 2) while 8 units per tile would fill at most this share of
# the SMs: the H100 rows of split_few_tiles (18 tiles: 4 ranges 1.07x cuBLAS, 2 ranges 0.93) and
# the H200 ones (32 tiles: 2 ranges).
FEW_TILES_SPLIT4 = 1.25
FP8_CLUSTER4_SHARE = 0.75  # split_few_tiles: FP8 64x64 tiles' 4 ranges meet in a cluster up to this share of the SMs


def few_tiles(tiles: int, num_sms: int) -> bool:
    """Whether 16-bit 64-row tiles this few take 4 K ranges (FEW_TILES_SPLIT4)."""
    return 8 * tiles <= num_sms * FEW_TILES_SPLIT4


def split_few_tiles(cfg: GemmConfig, p: GemmProblem, num_sms: int) -> GemmConfig:
    """The dense call's config with ``split_k`` when M <= 128 gives too few output tiles to keep
    the SMs busy (16-bit inputs and FP8 row-wise; not DeepSeek block scales, see split_k_errors).
    128-row tiles (their WGMMA time per K tile is twice a 64-row tile's): 4 or 2 K ranges while
    the units fit in one wave; 64-row tiles (memory-bound): 2 ranges from a quarter of the SMs
    down. Each range keeps at least 24 K tiles of 64 (the measured calls had 28-56; a range's
    partial sums cost a store, a counter and a read, ~2 us in all at 16 x 4096 x 7168); FP8: see
    below.
    H200 (bench/RESULTS.md, us, torch.matmul in the same run):
    96 x 1536 x 7168 (24 tiles of 128x64) 25.0 ->
    17.2 with 4 ranges (15.1); 128 x 4096 x 7168 (64 tiles) 32.4 -> 28.3 with 2 (26.0); 16 x 2048 x
    7168 (32 tiles of 64x64) 19.3 -> 17.6 with 2 (16.5); not taken at 16 x 4096 x 7168 (64 tiles
    of 64x64: 25.1 -> 26.2 with 2, torch 25.8).
    FP8 row-wise (bench/RESULTS.md, us, torch._scaled_mm 22.2-24.5):
    64-row tiles take 4 ranges or none: 16 x 2048 x 7168 (32 tiles of 64x64) 15.6 -> 12.9 with 4
    (13.5 with 2), 16 x 4096 x 7168 (64 tiles) 16.6 -> 18.0 with 2; 128-row tiles as above: 96 x
    1536 x 7168 17.5 -> 13.1 with 4, 128 x 4096 x 7168 19.9 -> 19.4 with 2; 16 K tiles (K = 2048)
    do not split (128 x 7168 x 2048: 12.0 -> 17.8 with 2)."""
    fp8 = cfg.a_dtype in FP8_DTYPES
    if p.m > 128 or cfg.split_k != 1 or cfg.a_dtype not in ("bf16", "fp16", *FP8_DTYPES):
        return cfg
    tiles = ceil_div(p.m, cfg.tile_m) * ceil_div(p.n, cfg.tile_n) * p.l
    if cfg.tile_m == 128:
        split = 4 if 4 * tiles <= num_sms else 2 if 2 * tiles <= num_sms else 1
    else:
        split = (4 if fp8 or few_tiles(tiles, num_sms) else 2) if 4 * tiles <= num_sms else 1
    # K tiles of 64 (16-bit) / 128 (FP8) elements per range: at least 24 / 12 (3 / 1.5 KB a row)
    k_tiles, min_tiles = (ceil_div(p.k, 128), 12) if fp8 else (ceil_div(p.k, 64), 24)
    while split > 1 and k_tiles < min_tiles * split:
        split //= 2
    if split == 1 or split_k_errors(replace(cfg, split_k=split)):
        return cfg
    # Two ranges of tiles up to 128x64 meet in shared memory (split_cluster), the rest through the
    # workspace: one run on the H200 (bench/RESULTS.md, us, cluster vs
    # workspace): 2 ranges bf16 128 x 4096 x 7168 27.1 vs 28.0, 16 x 2048 x 7168 16.3 vs 17.1,
    # FP8 128 x 4096 x 7168 18.1 vs 19.0; slower with 4 ranges (range 0 receives 3 slots at once:
    # 96 x 1536 x 7168 19.2 vs 16.6, FP8 16 x 2048 x 7168 16.2 vs 12.8) and with 128x128 tiles
    # (64 KiB slots: 128 x 4096 x 7168 37.8 vs 31.7).
    # 16-bit 64x64 tiles with 4 ranges meet in shared memory too (H100, `bench tiles`, x cuBLAS,
    # cluster vs workspace, 9 tiles of N = 576, K = 7168: M = 1 0.95 vs 0.87, 16 0.96 vs 0.91, 64
    # 1.02 vs 0.92, 2 ranges in a cluster 0.79 / 0.80 / 0.85; 128 rows in 64x64 tiles, 18 tiles:
    # 1.07 vs 1.02, 2 ranges 0.93). FP8 64x64 tiles too where the 4 ranges' units fill at most
    # FP8_CLUSTER4_SHARE of the SMs (H100, x torch._scaled_mm per-tensor, cluster vs workspace, M = 1
    # / 16 / 64: N = 576, K = 7168 (36 units) 0.99 / 1.01 / 1.04 vs 0.93 / 0.95 / 0.99; N = 1536 (96
    # units) 1.00 / 1.01 / 0.95 vs 0.96 / 0.98 / 0.93; the H200's 128 units above ran slower).
    four = split == 4 and (not fp8 or 4 * tiles <= FP8_CLUSTER4_SHARE * num_sms)
    small = cfg.tile_m * cfg.tile_n <= (128 * 64 if split == 2 else 64 * 64 if four else 0)
    cluster = small and not split_k_errors(replace(cfg, split_k=split, split_cluster=True))
    return replace(cfg, split_k=split, split_cluster=cluster)


def small_m_options(cfg: GemmConfig, p: GemmProblem, num_sms: int) -> GemmConfig:
    """The policy's decode-sized-M options of a dense sm_90a config: :func:`short_a_box`, then
    :func:`split_few_tiles`."""
    return split_few_tiles(short_a_box(cfg, p), p, num_sms)


# 16-bit 48 < M <= 64 in 64x128 tiles (A's whole 64-row box) with K >= QUAD_MIN_K: clusters of
# four along N (1x4, A multicast: each CTA of the four reads a quarter of A's K steps from L2,
# where A's 64 rows are a third of what a CTA streams per K step beside B's 128 columns). H100,
# `bench tiles` (one process, 3 interleaved rounds of 8 L2-flushed reps, x cuBLAS), the sweep's
# layers at M = 64 where the decode rule takes 64x128 (1x1 -> 1x4): Llama-3-70B qkv (N 10240, K
# 8192) 0.923 -> 0.980, down (8192, 28672) 0.949 -> 1.035, Qwen3-32B qkv (10240, 5120) 0.934 ->
# 0.989, gate_up (51200, 5120) 0.978 -> 1.010; at K = 4096 it lost or tied (Llama-3-8B qkv N
# 6144: 0.986 -> 0.966; gate_up 28672: 0.989 -> 0.998), so shorter K keeps 1x1. M <= 48 takes a
# short A box (short_a_box), which excludes multicast.
# e4m3 (QUAD_FP8) at any M <= 64, the short box given up for A's whole one, where the 64x128 tiles
# fill at most QUAD_FP8_SHARE of the SMs. H100, one process, 3 interleaved rounds of 8 L2-flushed
# reps, x torch._scaled_mm per-tensor (cuBLASLt), M = 1 / 16 / 64: Llama-3-70B qkv (N 10240, K
# 8192; 80 tiles) 0.91 / 0.91 / 0.92 -> 0.96 / 0.95 / 0.98, Qwen3-32B qkv (10240, 5120) 0.93 / 0.90
# / 0.93 -> 0.96 / 0.94 / 0.98; more than a round of them lost (N 32768, K 4096 at M = 1: 0.99 ->
# 0.87), and so did a nearly full one: 128 64x64 tiles in 1x4 clusters (N 8192, K 28672, M = 64)
# ran 0.73 against 0.99 in 1x1 (clusters of four pack into the GPCs, whose SMs may not hold 32).
QUAD_CLUSTERS = True
QUAD_FP8 = True
QUAD_FP8_SHARE = 0.75
QUAD_MIN_K = 5120


def plain_sm90_dense(cfg: GemmConfig) -> bool:
    """Whether ``cfg`` is the sm_90a dense kernel with per-tile (or no) scales and a plain output:
    the configs the measured decode-sized rules below rewrite (no block / MX scales, no fast
    accumulation, no quantized or user epilogue)."""
    return (cfg.arch == "sm_90a" and cfg.form in (Form.DENSE, Form.FLAT) and not cfg.fp8_blockwise
            and not cfg.fp8_mx and not cfg.fast_accum and not cfg.epilogue.quant and not cfg.epilogue.user)  # fmt: skip


def _e4m3(p: GemmProblem) -> bool:
    return p.a_dtype == "e4m3" and p.b_dtype == "e4m3"


def quad_clusters(cfg: GemmConfig, p: GemmProblem, num_sms: int) -> GemmConfig | None:
    """The 1x4 cluster of an sm_90a dense 64x128 config, 16-bit for 48 < M <= 64 (see
    QUAD_CLUSTERS), e4m3 for M <= 64 on at most QUAD_FP8_SHARE of the SMs (QUAD_FP8, A's whole box), or None where
    it does not apply (another tile, cluster, split, form or epilogue, a short A box on 16-bit,
    fewer than 4 N tiles, K < QUAD_MIN_K)."""
    if _e4m3(p):
        applies = QUAD_FP8 and p.m <= 64 and ceil_div(p.n, 128) <= QUAD_FP8_SHARE * num_sms
    else:
        applies = QUAD_CLUSTERS and p.a_dtype in ("bf16", "fp16") and 48 < p.m <= 64 and not cfg.a_rows
    if (not applies or not plain_sm90_dense(cfg) or p.k < QUAD_MIN_K or (cfg.tile_m, cfg.tile_n) != (64, 128)
            or cfg.cluster_m * cfg.cluster_n != 1 or cfg.split_k != 1 or cfg.pingpong or ceil_div(p.n, 128) < 4):  # fmt: skip
        return None
    alt = replace(cfg, cluster_n=4, raster="m", group=1, a_rows=0)
    return None if config_errors(alt) else alt


# e4m3 112 < M <= 128 where the pick cuts K over 128x64 tiles (few N tiles, split_few_tiles /
# the wave model): 64x64 tiles instead, two M tiles on each N tile, in the most K ranges (4, 2 or
# 1, in a cluster: split_cluster; at most the pick's) whose units fit in one round, and 2x1 pairs (B multicast) where
# one range already fills it. H100, one process, 3 interleaved rounds of 8 L2-flushed reps, x
# torch._scaled_mm per-tensor, M = 128 (the pick -> this): N 576 K 7168 (128x64 in 4 ranges) 0.90 ->
# 1.06 (4 ranges), N 1536 K 7168 0.88 -> 0.95 (2), N 2048 K 4096 (2 ranges) 0.86 -> 0.93 (2), N
# 4096 K 4096 / 14336 0.91 / 0.95 -> 0.96 / 0.97 (2x1 pairs). Unsplit picks keep their tiles (64x64
# pairs trailed them by up to 26% on wide N).
FP8_ROW_SPLIT = True


def fp8_row_split(cfg: GemmConfig, p: GemmProblem, num_sms: int) -> GemmConfig | None:
    """The 64x64 config of an e4m3 sm_90a dense call with 112 < M <= 128 whose config cuts K over
    128x64 tiles (see FP8_ROW_SPLIT), else None."""
    if (not FP8_ROW_SPLIT or not plain_sm90_dense(cfg) or not _e4m3(p) or not 112 < p.m <= 128
            or (cfg.tile_m, cfg.tile_n) != (128, 64) or cfg.split_k < 2 or cfg.split_tail):  # fmt: skip
        return None
    units = 2 * ceil_div(p.n, 64) * p.l  # two 64-row tiles on each N tile
    # at most the pick's ranges (its split met split_few_tiles' least K per range)
    split = next(s for s in (4, 2, 1) if s == 1 or (s <= cfg.split_k and units * s <= num_sms))
    alt = replace(cfg, tile_m=64, tile_n=64, cluster_m=1 if split > 1 else 2, cluster_n=1, split_k=split,
                  split_cluster=split > 1, raster="n", group=1, a_rows=0)  # fmt: skip
    return None if config_errors(alt) or (split > 1 and split_k_errors(alt)) else alt
