"""Probe: does a grouped 128-row tile whose second warpgroup has no rows cost less? Every expert
gets the same row count c; with 128-row tiles, c = 448 ends every expert in a tile whose second
warpgroup has no rows, c = 449 gives it one (c = 64 / 65: the same with one tile per expert,
where the weight read bounds the time). Times the policy-shaped config (and a static one) on
DeepSeek-V3 up's N and K. With PROFILE=1: one launch of c = 448 and 449 each between
cudaProfilerStart / Stop (for ncu --profile-from-start off).

    PYTHONPATH=<repo root> python tools/skip_probe.py   (the cutegemm on PYTHONPATH: A/B-able)
"""

import os

import torch

from cutegemm.benchmarks import Timer
from cutegemm.gemm.config import GemmConfig
from cutegemm.grouped import grouped_gemm

timer = Timer()
E, N, K = 32, 4096, 7168
b = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
for sched in () if os.environ.get("PROFILE") else ("dynamic", "static"):
    cfg = GemmConfig(arch="sm_90a", grouped=True, b_major="k", tile_m=128, tile_n=256, cluster_n=2, scheduler=sched,
                     raster="m", group=1)
    for c in (64, 65, 448, 449, 512):
        a = torch.randn(E * c, K, device="cuda", dtype=torch.bfloat16)
        offs = torch.full((E,), c, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
        t = timer(lambda a=a, offs=offs, cfg=cfg: grouped_gemm(a, b, offs=offs, config=cfg), 20)
        tt = timer(lambda a=a, offs=offs: torch._grouped_mm(a, b, offs=offs), 20)
        fl = 2.0 * E * c * N * K
        print(f"{sched:8s} rows/expert {c:4d}: ours {t * 1e3:8.1f} us ({fl / t / 1e9:6.1f} TFLOP/s), "
              f"torch {tt * 1e3:8.1f} us", flush=True)

if os.environ.get("PROFILE"):
    cfg = GemmConfig(arch="sm_90a", grouped=True, b_major="k", tile_m=128, tile_n=256, cluster_n=2,
                     scheduler="dynamic", raster="m", group=1)  # fmt: skip
    for c in (448, 449):
        a = torch.randn(E * c, K, device="cuda", dtype=torch.bfloat16)
        offs = torch.full((E,), c, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
        grouped_gemm(a, b, offs=offs, config=cfg)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        grouped_gemm(a, b, offs=offs, config=cfg)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
