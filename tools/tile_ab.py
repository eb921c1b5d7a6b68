"""Interleaved A/B of grouped configs on the issue-4 MoE shapes: every round times each config
once (median of 20, L2 flushed), so drift in clock or temperature hits all configs alike.

    python tools/tile_ab.py [ROUNDS] [--set width|cluster|small|large]

With PROFILE=1: one launch of each config (and torch's) between cudaProfilerStart / Stop, for
``ncu --profile-from-start off``.
"""

import os
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from cutegemm.benchmarks import GROUPED_NAMES, GROUPED_SHAPES, Timer, _moe_counts  # noqa: E402
from cutegemm.gemm.config import GemmConfig  # noqa: E402
from cutegemm.grouped import grouped_gemm  # noqa: E402

POLICY = dict(tile_m=128, tile_n=256, cluster_n=2, scheduler="dynamic")  # the policy (> 64 rows)
SETS = {
    # tile width (2026-11-30, fifth session)
    "width": ([POLICY, dict(POLICY, tile_n=192), dict(POLICY, tile_n=128)],
              ("Qwen3-30B-A3B", "DeepSeek-V3 down", "DeepSeek-V3 up")),
    # B multicast over two m-tiles of one expert (2x1) instead of A over two n-tiles (1x2): less
    # L2 -> SM traffic per tile (32 vs 40 KB per K step), wasted CTAs when an expert's m-tile
    # count is odd
    "cluster": ([POLICY, dict(POLICY, cluster_n=1, cluster_m=2), dict(tile_m=128, tile_n=256, cluster_m=2)],
                ("Mixtral up", "DeepSeek-V3 up")),
    # many small experts (Qwen3: ~128 rows each, 1.31x padded row work at 128-row tiles, 1.16x
    # at 64): 64-row tiles, one consumer warpgroup (cooperative) or two alternating (pingpong)
    "small": ([POLICY, dict(POLICY, tile_n=192), dict(POLICY, tile_m=64), dict(POLICY, tile_m=64, cluster_n=1),
               dict(tile_m=64, tile_n=256, cluster_n=2, pingpong=True), dict(tile_m=64, tile_n=192, cluster_n=2, pingpong=True),
               dict(tile_m=64, tile_n=128, cluster_n=2, pingpong=True), dict(POLICY, cluster_n=1, cluster_m=2)],
              ("Qwen3-30B-A3B",)),
    # Tile order inside an expert (2026-11-30, eleventh session): bands of G cluster m-tiles
    # walked along N (raster "n", group G) instead of m fastest over the whole expert; Mixtral's
    # 32 m-tiles per expert re-read A ~30 times from DRAM under the default order
    "band": ([POLICY, dict(POLICY, raster="n", group=4), dict(POLICY, raster="n", group=8),
              dict(POLICY, raster="n", group=16), dict(POLICY, cluster_n=1, cluster_m=2, raster="n", group=4),
              dict(POLICY, cluster_n=1, cluster_m=2, raster="n", group=8),
              dict(POLICY, cluster_n=1, cluster_m=2, raster="n", group=4, scheduler="static"),
              dict(POLICY, raster="n", group=2)],
             ("Mixtral up", "DeepSeek-V3 up", "DeepSeek-V3 down")),
    # DRAM traffic of the large shapes (ncu, PROFILE=1): the policy against torch
    "large": ([POLICY], ("DeepSeek-V3 up", "Mixtral up")),
}
CANDS, SHAPES = SETS[sys.argv[sys.argv.index("--set") + 1] if "--set" in sys.argv else "width"]

if __name__ == "__main__":
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 3
    timer = Timer()
    base = GemmConfig(arch="sm_90a", grouped=True, b_major="k", raster="m", group=1)
    cfgs = [replace(base, **c) for c in CANDS]
    for (e, tok, n, k), label in zip(GROUPED_SHAPES, GROUPED_NAMES, strict=True):
        if label not in SHAPES:
            continue
        counts = _moe_counts(e, tok)
        a = torch.randn(sum(counts), k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
        fl = 2.0 * sum(counts) * n * k
        if os.environ.get("PROFILE"):
            runs = [lambda a=a, b=b, offs=offs: torch._grouped_mm(a, b, offs=offs)]
            runs += [lambda c=c, a=a, b=b, offs=offs: grouped_gemm(a, b, offs=offs, config=c) for c in cfgs]
            for f in runs:
                f()
                torch.cuda.synchronize()
                torch.cuda.profiler.start()
                f()
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
                print("profiled", flush=True)
            continue
        times = {c.name: [] for c in cfgs}
        times["torch"] = []
        for _ in range(rounds):
            times["torch"].append(timer(lambda a=a, b=b, offs=offs: torch._grouped_mm(a, b, offs=offs), 20))
            for c in cfgs:
                times[c.name].append(timer(lambda c=c, a=a, b=b, offs=offs: grouped_gemm(a, b, offs=offs, config=c), 20))
        print(f"== {label}: TFLOP/s per round", flush=True)
        for name, ts in times.items():
            print(f"   {' '.join(f'{fl / t / 1e9:7.1f}' for t in ts)}  {name}", flush=True)
        del a, b
