"""Host time of the list form (``grouped_gemm(xs, ws)``): per-call wall time and a cProfile of
20 calls, for a Qwen3-like list (128 groups) and a Mixtral-like one (8 groups)."""

import cProfile
import pstats
import sys

import torch

from cutegemm.benchmarks import host_time_us
from cutegemm.grouped import grouped_gemm

for label, g, m, n, k in [] if "--breakdown" in sys.argv else [("qwen3", 128, 128, 1536, 2048), ("mixtral", 8, 4096, 14336, 4096), ("decode", 32, 16, 4096, 7168)]:
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

# Breakdown of one list call's host time (GPU idle before each piece, median of 50): the table's
# pinned copy, the counter, the compiled launch alone (arguments built beforehand), the whole call.
from unittest import mock  # noqa: E402


def _med(fn):
    return host_time_us(fn, reps=50)


for label, g, m, n, k in [("mixtral", 8, 4096, 14336, 4096), ("qwen3", 128, 128, 1536, 2048)]:
    xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(g)]
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t() for _ in range(g)]
    grouped_gemm(xs, ws)
    captured = {}
    from cutegemm.gemm import api as dapi

    orig_get = dapi.DENSE_CACHE.get

    def spy_get(cfg, orig_get=orig_get, captured=captured):
        fn = orig_get(cfg)

        def call(*a, fn=fn, captured=captured):
            captured["fn"], captured["args"] = fn, a
            return fn(*a)

        return call

    with mock.patch.object(dapi.DENSE_CACHE, "get", spy_get):
        grouped_gemm(xs, ws)
    fn, args = captured["fn"], captured["args"]
    rows = list(range(g * 16 + 16))
    import array  # noqa: E402

    def table_copy(rows=rows, g=g):
        t = torch.empty(len(rows) + g * 48, dtype=torch.int64, device="cuda")
        t[: len(rows)].copy_(torch.frombuffer(array.array("q", rows), dtype=torch.int64).pin_memory(), non_blocking=True)

    print(f"{label}: whole call {_med(lambda xs=xs, ws=ws: grouped_gemm(xs, ws)):.0f} us; "
          f"compiled launch alone {_med(lambda fn=fn, args=args: fn(*args)):.0f} us; "
          f"table alloc + pinned copy {_med(table_copy):.0f} us; "
          f"counter torch.zeros {_med(lambda: torch.zeros(1, dtype=torch.int32, device='cuda')):.0f} us; "
          f"validation only {_med(lambda xs=xs, ws=ws: [x.shape[1] == w.shape[0] for x, w in zip(xs, ws, strict=True)]):.0f} us",
          flush=True)  # fmt: skip
    from torch.profiler import ProfilerActivity, profile  # noqa: E402

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            torch.cuda.synchronize()
            grouped_gemm(xs, ws)
    torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15), flush=True)
    import cutegemm.grouped.list_form as list_form  # noqa: E402

    print(f"{label}: _list_launch alone {_med(lambda xs=xs, ws=ws: list_form._list_launch(xs, ws, None, 1.0)):.0f} us; "
          f"torch.empty of the outputs {_med(lambda g=g, m=m, n=n: torch.empty(g * m * n, dtype=torch.bfloat16, device='cuda')):.0f} us",
          flush=True)  # fmt: skip
