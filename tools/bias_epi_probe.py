# ruff: noqa: B023  (each lambda is timed inside its own iteration)
"""Probe: what does a per-column bias (and bias + swiglu) cost in the bf16 epilogue? The same
call with and without the bias, dense (long and short K) and grouped DeepSeek-V3 up / down."""

import torch
from probe_common import moe_operands

import cutegemm
from cutegemm.benchmarks import Timer
from cutegemm.grouped import grouped_gemm

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
    a, b, offs, fl = moe_operands(e, tok, n, k)
    bias = torch.randn(e, n, device="cuda", dtype=BF)
    t0 = timer(lambda: grouped_gemm(a, b, offs=offs), 20)
    t1 = timer(lambda: grouped_gemm(a, b, offs=offs, bias=bias), 20)
    t2 = timer(lambda: grouped_gemm(a, b, offs=offs, bias=bias, activation="swiglu"), 20)
    print(f"grouped E{e}x{tok} N{n} K{k}: plain {fl / t0 / 1e9:.1f} TFLOP/s, +bias {fl / t1 / 1e9:.1f}, "
          f"+bias+swiglu {fl / t2 / 1e9:.1f}", flush=True)  # fmt: skip
