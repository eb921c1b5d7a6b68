# ruff: noqa: B023  (each lambda is timed inside its own iteration)
"""Probe: what does a per-column bias (and bias + swiglu) cost in the bf16 epilogue? The same
call with and without the bias, dense (long and short K) and grouped DeepSeek-V3 up / down."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import cutegemm  # noqa: E402
from cutegemm.benchmarks import Timer, _moe_counts  # noqa: E402
from cutegemm.grouped import grouped_gemm  # noqa: E402

timer = Timer()
BF = torch.bfloat16
for m, n, k in [(8192, 8192, 8192), (16384, 7168, 2048)]:
    torch.manual_seed(0)
    a, b = torch.randn(m, k, device="cuda", dtype=BF), torch.randn(n, k, device="cuda", dtype=BF).t()
    bias = torch.randn(n, device="cuda", dtype=BF)
    fl = 2.0 * m * n * k
    t0 = timer(lambda: cutegemm.gemm(a, b), 20)
    t1 = timer(lambda: cutegemm.gemm(a, b, bias=bias), 20)
    t2 = timer(lambda: torch.addmm(bias, a, b), 20)
    print(f"dense {m}x{n}x{k}: plain {fl / t0 / 1e9:.1f} TFLOP/s, +bias {fl / t1 / 1e9:.1f}, torch addmm {fl / t2 / 1e9:.1f}",
          flush=True)  # fmt: skip
for e, tok, n, k in [(32, 512, 4096, 7168), (32, 512, 7168, 2048)]:
    counts = _moe_counts(e, tok)
    total = sum(counts)
    torch.manual_seed(0)
    a = torch.randn(total, k, device="cuda", dtype=BF)
    b = torch.randn(e, n, k, device="cuda", dtype=BF).transpose(1, 2)
    bias = torch.randn(e, n, device="cuda", dtype=BF)
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    fl = 2.0 * total * n * k
    t0 = timer(lambda: grouped_gemm(a, b, offs=offs), 20)
    t1 = timer(lambda: grouped_gemm(a, b, offs=offs, bias=bias), 20)
    t2 = timer(lambda: grouped_gemm(a, b, offs=offs, bias=bias, activation="swiglu"), 20)
    print(f"grouped E{e}x{tok} N{n} K{k}: plain {fl / t0 / 1e9:.1f} TFLOP/s, +bias {fl / t1 / 1e9:.1f}, "
          f"+bias+swiglu {fl / t2 / 1e9:.1f}", flush=True)  # fmt: skip
