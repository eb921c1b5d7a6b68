"""Split-K configs at decode-sized M beside torch.matmul, rounds interleaved (best round's L2-cold
median of 30 per entry).

    python tools/split_exp_probe.py [ROUNDS]

The 2026-12-01 fourth session ran it on one-off copies of the package (ab_exp/, first on
PYTHONPATH) whose ``split_k_fixup`` read an environment variable at trace time: SPLIT_EXP=store
returned after the partial stores and their fence (range 0 ran the epilogue), SPLIT_EXP=none
returned before the stores; wrong results, timing only (bench/RESULTS.md)."""

import os
import sys
from dataclasses import replace

import torch
from probe_common import interleaved_rounds

import cutegemm
from cutegemm.benchmarks import Timer, _dense_inputs
from cutegemm.gemm.config import GemmConfig

B = GemmConfig(arch="sm_90a", a_major="k", b_major="k", raster="n", group=1)
CASES = [((1, 7168, 2048), replace(B, tile_m=64, tile_n=128, a_rows=8)),
         ((1, 7168, 2048), replace(B, tile_m=64, tile_n=128, a_rows=8, split_k=2)),
         ((16, 2048, 7168), replace(B, tile_m=64, tile_n=64, a_rows=16)),
         ((16, 2048, 7168), replace(B, tile_m=64, tile_n=64, a_rows=16, split_k=2)),
         ((96, 1536, 7168), replace(B, tile_m=128, tile_n=64, a_rows=96, split_k=2)),
         ((96, 1536, 7168), replace(B, tile_m=128, tile_n=64, a_rows=96, split_k=4)),
         ((128, 4096, 7168), replace(B, tile_m=128, tile_n=64, split_k=2))]  # fmt: skip
timer = Timer()
print("mode", repr(os.environ.get("SPLIT_EXP", "")), os.path.dirname(cutegemm.__file__), flush=True)
runs = {}
for (m, n, k), cfg in CASES:
    a, b = _dense_inputs(m, n, k, torch.bfloat16, "k")
    runs[f"{m}x{n}x{k} {cfg.name}"] = lambda a=a, b=b, cfg=cfg: cutegemm.gemm(a, b, config=cfg)
    runs[f"{m}x{n}x{k} torch"] = lambda a=a, b=b: torch.matmul(a, b)
times = interleaved_rounds(timer, runs, int(sys.argv[1]) if len(sys.argv) > 1 else 2)
for name, ts in times.items():
    print(f"{min(ts) * 1e3:7.2f} us  {name}", flush=True)
