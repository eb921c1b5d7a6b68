"""Promoted FP8 row-wise grouped: the swapped kernel's variants beside the policy's (unswapped)
config and torch._scaled_grouped_mm, same run (benchmarks_scaled.bench_grouped_fp8).
Usage: python tools/fp8_swap_probe.py [fast]"""
import sys

from cutegemm.benchmarks_scaled import bench_grouped_fp8

S = dict(swap_ab=True, cluster_m=2, cluster_n=1, tile_m=128, scheduler="dynamic")
fast = dict(fast_accum=True) if "fast" in sys.argv[1:] else {}
configs = [
    dict(S, tile_n=192, **fast),
    dict(S, tile_n=192, wg_order=True, **fast),
    dict(S, tile_n=128, wg_order=True, **fast),
    dict(S, tile_n=128, **fast),
    dict(S, tile_n=192, wg_order=True, cluster_m=1, **fast),
]
bench_grouped_fp8(shapes=((32, 512, 4096, 7168), (32, 512, 7168, 2048), (128, 128, 1536, 2048)), configs=configs)
