"""Which weight-only kernel variant a call gets: tokens per pass, consumers (mma.sync or WGMMA),
the pass grid and its cut tail, from the rows, the format and the SMs."""

from __future__ import annotations

import functools

import torch

from .config import Fp4WeightConfig

OUT_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


@functools.lru_cache(maxsize=1024)
def pick_config(m: int, fmt: str, out_dtype: torch.dtype, arch: str, grouped: bool, experts: int = 1,
                x_scale: bool = False, few_tiles: bool = False, tiles_sms: tuple[int, int] | None = None):  # fmt: skip
    """The kernel variant: tokens per pass from the (mean) rows per batch / expert. ``few_tiles``
    (dense): the weight's 128-row tiles are fewer than the SMs (:func:`policy_config`);
    ``tiles_sms`` (dense): (128-row weight tiles x batches, the device's SMs), for
    :func:`pass_grid_pays`."""
    rows = -(-m // max(experts, 1)) if grouped else m
    fp8 = fmt == "mxfp8"
    # Dense, fewer 128-row weight tiles than SMs: one CTA per tile would leave SMs idle; the split
    # grid spreads the K stages over all of them. H200, N=K=8192 (64 tiles), us (bench/RESULTS.md):
    # MXFP8 M=1 35.9 (WGMMA, 32 tokens, split) / 37.9 (mma.sync,
    # split) / 44.9 (mma.sync, a CTA per tile); M=16 36.2 / 38.6 / 47.7 (cuBLAS bf16 43.4).
    # NVFP4 M=1 29.3 / 26.6 / 28.9, M=16 29.6 / 26.9 / 33.6; MXFP4 M=16 30.7 / 27.4 / 35.8.
    # N=28672 (224 tiles), MXFP8 M=1: 53.8 / 50.6 / 46.1.
    spread = few_tiles and not grouped
    if arch == "sm_90a" and (rows > 32 or (not grouped and rows > (32 if fp8 else 16)) or (spread and fp8)):
        # sm_90a, more tokens: the WGMMA consumers (weight_only.wgmma), 64 tokens per pass in 3 ring
        # stages (32 in 4 for dense M <= 32), dense M > 32 on the split grid. H200
        # (bench/RESULTS.md), NVFP4 N=28672 K=4096, us: M=32 44.0 vs
        # 50.0 (mma.sync consumers, 32-token pass, same run); M=64 51.1 vs 64.7 (cuBLAS bf16
        # 69.9); M=128 93.9 vs 117.5 (74.1); M=192 135.5 vs 167.8; MXFP4 M=64 53.3 vs 66.8.
        # Grouped E=32 N=4096 K=7168: ~64 rows per expert 403.6 vs 650.0 (torch._grouped_mm
        # 604.0); ~256 rows 1288.1 vs 2247.6. 128 tokens per pass in 2 stages: within 2% at
        # M = 96..256, slower below. M=16: 41.9 vs 31.5, not taken. The split grid (another run):
        # M=64 50.9 vs 51.7, M=128 90.5 vs 95.2, M=256 167.3 vs 180.6; M=32 44.2 vs 43.7.
        # MXFP8 weights: the same with 256 K per stage (ring_k 4: two 128-K weight boxes), from 33
        # dense rows (up to 32 the mma.sync consumers below: 48.5 vs 54.2 us at M=32, N=28672
        # K=4096); previously 128 tokens per pass in two 256-K stages from 97 rows.
        # From 65 rows: 128 tokens per pass in four 128-K stages
        # (ring_k 1 / 2: the producer refills a stage while three are in flight), the producer
        # warpgroup's registers handed to the consumers (``producer_wg``: no spills). H200, same run,
        # us, vs 64 tokens in three 256-K stages and cuBLAS bf16: NVFP4 M=80 70.8 / 88.4 / 71.3;
        # M=128 70.3 / 90.8 / 76.2; M=256 128.3 / 167.6 / 99.3; M=512 234.8 / 316.4 / 158.5; MXFP8
        # M=96 76.4 / 104.0 / 70.8; M=128 77.7 / 93.0 (the 128-token config of before) / 75.6;
        # grouped E=32 N=4096 K=7168 ~256 rows per expert NVFP4 974.8 / 1296.4 (torch._grouped_mm
        # 869.0), MXFP8 1130.2 / 1393.5 (840.7); ~64 rows: within 1-3% either way. M=64: 80.9 vs 50.9.
        # 256 tokens per pass (FP4, a CTA per (weight tile, pass), three
        # 128-K stages, commit groups of 4 k16 steps): taken where its passes cost less than
        # twice as many 128-token ones (a 256-token pass ~1.6x a 128-token one). H200, same run,
        # us, 256 vs 128 tokens per pass (cuBLAS bf16): NVFP4 N=28672 K=4096 M=256 102.8 / 127.8
        # (97.7); M=384 230.8 / 181.2 (124.8, not taken); M=512 193.0 / 234.4 (155.6); M=768
        # 282.4 / 340.0 (243.4); M=1024 371.1 / 447.4 (302.8; dequantize-first 383.7); MXFP4 M=256
        # 104.0 / 129.2 (94.8). Grouped E=32 N=4096 K=7168 ~256 rows per expert 864.8 / 957.8
        # (torch._grouped_mm 848.7), ~512 1585.2 / 1822.9 (1451.4). On the split grid it spills
        # and ran slower (115.5 at M=256); with few weight tiles the split t128 stays. Grouped: from
        # 129 mean rows per expert (experts' rows spread around the mean, and a 256-token pass
        # spans what takes 128-token passes 2-3). MXFP8 weights: in five 64-K stages (two 128-K
        # ones fit: 154.5 us at M=256); same run, us, 256 / 128 tokens per pass (cuBLAS bf16):
        # M=256 111.7 / 142.8 (96.2), M=512 212.8 / 264.0 (152.2), M=1024 411.2 / 508.2 (299.2;
        # dequantize-first 405.5); grouped ~256 978.4 / 1113.5 (833.3), ~512 1788.2 / 2120.6 (1394.6).
        # The outputs of 256-token passes staged through shared memory (16-byte row
        # pieces: ``staged_store``), same run, us, staged / direct stores (cuBLAS bf16): NVFP4 M=256
        # 93.1 / 99.1 (99.5), M=512 175.5 / 188.3 (158.2), M=1024 337.8 / 363.1 (305.2); grouped
        # ~256 832.1 / 859.8 (862.2), ~512 1515.9 / 1571.7 (1464.4); MXFP4 M=256 92.4 / 99.3
        # (96.5); MXFP8 M=256 105.1 / 111.4 (97.8), M=1024 387.1 / 405.8 (300.1). Grouped 128
        # tokens per pass too: ~128 rows per expert NVFP4 560.6 / 568.0 (721.3), MXFP8 647.6 / 657.9
        # (736.2); 64 tokens not (~64 rows: NVFP4 408.1 / 406.9, MXFP8 500.0 / 494.1).
        # Dense 256-token passes dealt as (weight tile, pass) units where that fills the SMs'
        # waves better (``pass_grid_pays``). H200, same run, us, a
        # persistent grid taking units round-robin / a CTA per unit / a CTA per tile (cuBLAS
        # bf16): NVFP4 M=1024 309.1 / 312.6 / 339.1 (305.8), M=2048 621.3 / 628.2 / 664.2 (607.0);
        # MXFP4 M=1024 303.9 / 308.1 / 337.9 (296.0), M=2048 607.7 / 617.6 / 665.2 (582.7); MXFP8
        # M=1024 363.3 / 350.3 / 387.1 (300.3), M=2048 726.3 / 702.0 / 769.3 (593.1): FP4 takes the
        # persistent grid, MXFP8 a CTA per unit.
        # The persistent grid's last round less than half full: its units cut into equal K ranges
        # over all the CTAs instead (``tail_split_pays``). H200, same run,
        # us, cut tail / persistent grid, whole units / a CTA per tile (cuBLAS bf16): NVFP4 M=512
        # (448 units on 132 SMs, the last round 52) 169.8 / 177.6 / 175.0 (154.7); M=768 (12 in the
        # last round) 246.1 / 263.2 / 254.9 (242.0); MXFP4 M=512 167.3 / - / 175.1 (149.4); MXFP8
        # M=512 194.7 / 209.2 / 198.4 (151.1), M=768 280.4 / 309.0 / 291.3 (234.6). With a fuller
        # last round the cut costs more than the balance gains (under the 700 W cap the SMs of a
        # part-empty last round clock up): M=256 (92 of 132) 96.2 / 92.9 / 92.4, M=1024 (104)
        # 317.2 / 308.0 / 336.2.
        wide = rows > 64
        t256 = wide and not spread and (rows > 128 if grouped else -(-rows // 256) * 8 <= -(-rows // 128) * 5)
        n_tiles = 4 if rows <= 32 else 32 if t256 else 16 if wide else 8
        dense256 = t256 and not grouped and tiles_sms is not None
        tail = dense256 and experts == 1 and tail_split_pays(-(-rows // 256), *tiles_sms)
        pass_grid = dense256 and not tail and pass_grid_pays(-(-rows // 256), *tiles_sms)
        return Fp4WeightConfig(
            fmt=fmt, n_tiles=n_tiles, grouped=grouped, out_dtype=OUT_NAMES[out_dtype], arch=arch, x_scale=x_scale,
            ring=(5 if fp8 else 3) if t256 else 4 if wide else {4: 4, 8: 3}[n_tiles],
            ring_k=1 if t256 else (2 if fp8 else 1) if wide else (4 if fp8 else 2),
            row_tiles=1, warps_n=8, warps_k=1, stages=0, producer_pairs=False, wgmma=True, producer_wg=wide,
            split=not grouped and not t256 and (n_tiles >= 8 or spread),
            staged_store=n_tiles >= 16 and (t256 or grouped),
            pass_ctas=2 if tail else (1 if fp8 else 2) if pass_grid else 0, tail_split=tail,
        )  # fmt: skip
    n_tiles = 1 if rows <= 8 else 2 if rows <= 16 else 4  # more rows: passes in the CTA (L2 hits)
    # Measured on the H200 (bench/RESULTS.md): the TMA / bulk-copy ring with 128
    # weight rows per CTA (4 row groups of 32 x 2 K groups, 4 stages of 256 K) was best or within
    # 2% of best on every decode shape, dense and grouped, both formats (the earlier register-prefetch /
    # cp.async pipelines: 3-35% slower; 6-8 stages or 64-row CTAs: slower).
    shape = dict(ring=4, ring_k=2, row_tiles=2, warps_n=4, warps_k=2, stages=0)
    if (grouped and fmt == "mxfp4") or (fp8 and not grouped):
        # the same ring with 8 x 16-row warps. Grouped MXFP4: the 4 x 2 split spills two registers
        # (2.89x vs 2.95x torch._grouped_mm with the spill, same run). Dense MXFP8 weights (H200,
        # N=28672 K=4096, us, same run): M=32 48.8 vs 63.7 (4 x 2), M=1 / 16 within 1%; grouped
        # MXFP8, E=32 ~16 rows per expert: 269.4 vs 263.2, 4 x 2 kept.
        shape = dict(ring=4, ring_k=2, row_tiles=1, warps_n=8, warps_k=1, stages=0)
    # The producer pairs the activations for up to 16 tokens per pass (+3-6% grouped, +3% M=16);
    # at 32 the consumers pair what they read (the producer's 16 KB per stage: 7% slower at M=64)
    shape["producer_pairs"] = n_tiles <= 2 and not fp8  # 8-bit weights: K in order, no pairing
    if not grouped and (rows > 8 * n_tiles or spread):
        # several token passes (dense): the split grid (equal unit ranges per CTA) measured 84 vs
        # 92 us at M=64 (H200); with one pass it was slower (43 vs 34 us at M=16).
        # (64 tokens per pass, tried: 65.0 vs 81.3 us at M=64 on sm_90a, but its
        # registers spill on sm_100a; sm_90a takes the WGMMA consumers above.) Few weight tiles:
        # split with one pass too (``spread`` above).
        shape["split"] = True
    return Fp4WeightConfig(
        fmt=fmt, n_tiles=n_tiles, grouped=grouped, out_dtype=OUT_NAMES[out_dtype], arch=arch, x_scale=x_scale, **shape
    )


def pass_grid_pays(passes: int, tiles: int, sms: int) -> bool:
    """Dense WGMMA consumers (one CTA per SM at 256 tokens per pass): whether a CTA per (weight
    tile, token pass) (``Fp4WeightConfig.pass_ctas``) fills the SMs' waves better than a CTA per
    tile running all ``passes``, by more than 4 points (the CTAs' pipeline fills it adds)."""

    def fill(ctas: int) -> float:  # busy share of the SMs over the launch's waves
        return ctas / (-(-ctas // sms) * sms)

    return passes > 1 and fill(tiles * passes) > fill(tiles) + 0.04


def tail_split_pays(passes: int, tiles: int, sms: int) -> bool:
    """Dense WGMMA consumers at 256 tokens per pass: whether the persistent pass grid with its
    last round's units cut into equal K ranges over all the CTAs (``Fp4WeightConfig.tail_split``)
    is taken: more units than SMs and the last round less than half full (H200: 3-6% faster at
    512 / 768 rows of N=28672, slower where the last round is 70-80% full; ``pick_config``)."""
    units = passes * tiles
    return units > sms and 0 < units % sms < sms / 2
