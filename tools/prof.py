"""Steady-state timing (back-to-back, no flush) and an ncu-profiled launch of ours vs torch."""
import sys
import torch
import cutegemm
from dataclasses import replace
from cutegemm.gemm.config import GemmConfig

def steady(fn, n=50):
    for _ in range(5): fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(); s.record()
    for _ in range(n): fn()
    e.record(); e.synchronize()
    return s.elapsed_time(e) / n

shapes = [(4096, 4096, 4096, dict(tile_m=128, tile_n=256, cluster_m=2, raster="n")),
          (128, 7168, 2048, dict(tile_m=64, tile_n=128, raster="n", group=1))]
prof = "--ncu" in sys.argv
for m, n, k, tile in shapes:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
    cfg = replace(GemmConfig(arch="sm_90a", a_major="k", b_major="k"), **tile)
    f_ours = lambda: cutegemm.gemm(a, b, config=cfg)
    f_torch = lambda: torch.matmul(a, b)
    t_o, t_t = steady(f_ours), steady(f_torch)
    fl = 2 * m * n * k
    print(f"{m}x{n}x{k}: steady ours {t_o*1e3:.1f} us ({fl/t_o/1e9:.0f} TF/s)  torch {t_t*1e3:.1f} us ({fl/t_t/1e9:.0f} TF/s)", flush=True)
    # host time per call (GPU not the bottleneck for tiny work is not the point here)
    import time
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(200): f_ours()
    t1 = time.perf_counter(); torch.cuda.synchronize()
    print(f"   host enqueue ours {(t1-t0)/200*1e6:.1f} us/call", flush=True)
    if prof:
        torch.cuda.synchronize(); torch.cuda.profiler.start()
        f_ours(); f_torch()
        torch.cuda.synchronize(); torch.cuda.profiler.stop()
