"""Host time of the list form (``grouped_gemm(xs, ws)``): per-call wall time and a cProfile of
20 calls, for a Qwen3-like list (128 groups) and a Mixtral-like one (8 groups)."""

import cProfile
import pstats

import torch

from cutegemm.benchmarks import host_time_us
from cutegemm.grouped import grouped_gemm

for label, g, m, n, k in [("qwen3", 128, 128, 1536, 2048), ("mixtral", 8, 4096, 14336, 4096), ("decode", 32, 16, 4096, 7168)]:
    xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(g)]
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t() for _ in range(g)]
    for _ in range(3):
        grouped_gemm(xs, ws)
    torch.cuda.synchronize()
    print(f"{label}: host {host_time_us(lambda xs=xs, ws=ws: grouped_gemm(xs, ws)):.0f} us/call", flush=True)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(20):
        grouped_gemm(xs, ws)
    pr.disable()
    torch.cuda.synchronize()
    pstats.Stats(pr).sort_stats("tottime").print_stats(12)
