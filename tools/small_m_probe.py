"""Dense bf16 at decode-sized M (the foundation's 128x7168x2048 shape and smaller): the policy's
tile beside other tiles, clusters and stage counts, against torch.matmul, rounds interleaved
(median of 30 L2-cold reps each).

    python tools/small_m_probe.py [ROUNDS] [--set tiles|epi]
    PROFILE=1 python tools/small_m_probe.py [--set ...]   # one launch each (ncu --profile-from-start off)

Set "tiles" (first run, bench/2026-11-30j/round3/): tiles, clusters, stages; "epi": the same
128x64 tile as a flat (2-D) and a 3-D launch with 2, 3 and 4 epilogue buffers (the 3-D launch with
4 buffers took 20.7 us where the policy's flat one took 15.8), and the small-M tiles as flat
launches.
"""

import os
import sys
from dataclasses import replace

from probe_common import interleaved_rounds, profile_each

from cutegemm.benchmarks import Timer, _dense_inputs
from cutegemm.gemm.api import gemm
from cutegemm.gemm.config import GemmConfig

SHAPES = ((128, 7168, 2048), (64, 7168, 2048), (16, 7168, 2048))
BASE = GemmConfig(arch="sm_90a", a_major="k", b_major="k", raster="n", group=1)
TILES = [
    None,  # the policy
    dict(tile_m=128, tile_n=64, cluster_n=2),
    dict(tile_m=128, tile_n=64, cluster_n=4),
    dict(tile_m=64, tile_n=128),
    dict(tile_m=64, tile_n=128, cluster_m=2),
    dict(tile_m=128, tile_n=128, cluster_n=2),
    dict(tile_m=128, tile_n=64, stages=4),
    dict(tile_m=128, tile_n=64, epi_stages=2),
    dict(tile_m=64, tile_n=64, pingpong=True),
]
PROFILED = ("torch", "policy")
T128 = dict(tile_m=128, tile_n=64)
EPI = [
    None,
    dict(T128, flat=True),
    dict(T128, epi_stages=4),
    dict(T128, epi_stages=3),
    dict(T128, epi_stages=2),
    dict(T128, epi_stages=2, flat=True),
    dict(T128),
    dict(tile_m=64, tile_n=128, flat=True),
    dict(tile_m=64, tile_n=64, flat=True),
    dict(tile_m=64, tile_n=64, pingpong=True, flat=True),
    dict(tile_m=64, tile_n=128, cluster_n=2, flat=True),
]
# The policy's small-M rule against its alternatives on other N / K (flat launches).
POLICY = [
    None,
    dict(tile_m=64, tile_n=128, flat=True),
    dict(tile_m=64, tile_n=64, flat=True),
    dict(T128, flat=True),
]
SET = sys.argv[sys.argv.index("--set") + 1] if "--set" in sys.argv else "tiles"
CANDS = {"tiles": TILES, "epi": EPI, "policy": POLICY}[SET]
if SET == "policy":
    SHAPES = ((16, 7168, 2048), (64, 7168, 2048), (16, 4096, 7168), (64, 4096, 7168), (16, 28672, 4096),
              (64, 28672, 4096), (1, 7168, 2048), (96, 7168, 2048))  # fmt: skip


def main(rounds: int):
    import torch

    timer = Timer()
    for m, n, k in SHAPES:
        a, b = _dense_inputs(m, n, k, torch.bfloat16, "k")
        cfgs = [None if c is None else replace(BASE, **c) for c in CANDS]
        runs = {"torch": lambda a=a, b=b: torch.matmul(a, b)}
        for c in cfgs:
            try:
                gemm(a, b, config=c)
            except ValueError as exc:  # e.g. a flat config for operands it cannot take (M = 1)
                print(f"   skipped {c.name}: {exc}", flush=True)
                continue
            runs["policy" if c is None else c.name] = lambda a=a, b=b, c=c: gemm(a, b, config=c)
        if os.environ.get("PROFILE"):
            profile_each(
                [(name, f) for name, f in runs.items() if name in PROFILED or "e2" in name or "e4" in name]
            )
            continue
        times = interleaved_rounds(timer, runs, rounds)
        print(f"== {m}x{n}x{k}: us per round (TFLOP/s of the last)", flush=True)
        for name, ts in times.items():
            print(
                f"   {' '.join(f'{t * 1e3:7.2f}' for t in ts)}  ({2.0 * m * n * k / ts[-1] / 1e9:6.1f})  {name}",
                flush=True,
            )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 3)
