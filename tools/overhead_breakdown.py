"""Where the host time of a warm ``cutegemm.gemm`` call goes (H200 host, 128^3 bf16): the whole call
beside torch.matmul, and its pieces timed alone (key, lookup, output allocation, views, the
compiled function's call with prebuilt arguments)."""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import cutegemm  # noqa: E402
from cutegemm.gemm import api  # noqa: E402


def bench(fn, calls=4000, rounds=5):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        best = min(best, (t1 - t0) / calls * 1e6)
    return best


a = torch.randn(128, 128, device="cuda", dtype=torch.bfloat16)
w = torch.randn(128, 128, device="cuda", dtype=torch.bfloat16)
b = w.t()
cutegemm.gemm(a, b)
plan = next(iter(api._PLANS.values()))
out = torch.empty(128, 128, device="cuda", dtype=torch.bfloat16)
(sa, ta), (sb, tb), (sc, tc) = plan.views
av, bv, ov = (a, b, out) if plan.flat else (a.as_strided(sa, ta), b.as_strided(sb, tb), out.as_strided(sc, tc))
args = (av, bv, ov, None, None, 1.0, 0.0, plan.max_clusters, None, None, None, None, None, None, None, None, None, None)
fn = plan.fn


def key():
    return (a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.device, torch.bfloat16, None, False,
            None, None, False, False, None, None, None, b.device)  # fmt: skip


rows = {
    "cutegemm.gemm(a, b)": lambda: cutegemm.gemm(a, b),
    "cutegemm.gemm(a, b, out=out)": lambda: cutegemm.gemm(a, b, out=out),
    "torch.matmul(a, b)": lambda: torch.matmul(a, b),
    "torch.matmul(a, b, out=out)": lambda: torch.matmul(a, b, out=out),
    "key tuple": key,
    "key + dict lookup": lambda: api._PLANS.get(key()),
    "_current_device()": api._current_device,
    "torch.empty(128, 128)": lambda: torch.empty(128, 128, dtype=torch.bfloat16, device=plan.device),
    "one as_strided": lambda: a.as_strided(sa, ta),
    "memo_view(b)": lambda: api.memo_view(plan, b, sb, tb),
    "plan.launch (views + call)": lambda: plan.launch((a, b, out, None, None), 1.0, 0.0),
    "compiled fn, prebuilt args": lambda: fn(*args),
}
print(f"host µs per warm call on {torch.cuda.get_device_name()} (best of 5 x 4000):")
for name, f in rows.items():
    try:
        print(f"  {name:36s} {bench(f):6.2f}", flush=True)
    except Exception as exc:
        print(f"  {name:36s} FAILED {type(exc).__name__}: {exc}", flush=True)
