# ruff: noqa: B023  (each lambda is timed inside its own iteration)
"""Probe: what do the row-wise FP8 scales cost in the epilogue? Row-wise promoted FP8 with
per-row x per-column scales against the same call without scales (same kernel config, identity
epilogue), dense and grouped DeepSeek-V3 up; torch._scaled_mm / _scaled_grouped_mm beside."""

import torch
from probe_common import F8, moe_operands

import cutegemm
from cutegemm.benchmarks import Timer
from cutegemm.grouped import grouped_gemm

timer = Timer()
for m, n, k in [(8192, 8192, 8192), (16384, 7168, 2048)]:
    torch.manual_seed(0)
    a, b = torch.randn(m, k, device="cuda").to(F8), torch.randn(n, k, device="cuda").to(F8).t()
    ra, rb = torch.rand(m, device="cuda") + 0.5, torch.rand(n, device="cuda") + 0.5
    fl = 2.0 * m * n * k
    t_s = timer(lambda: cutegemm.gemm(a, b, scale_a=ra, scale_b=rb), 20)
    t_p = timer(lambda: cutegemm.gemm(a, b), 20)
    tt = timer(lambda: torch._scaled_mm(a, b, scale_a=ra[:, None], scale_b=rb[None], out_dtype=torch.bfloat16), 20)
    print(f"dense {m}x{n}x{k}: row-wise scales {fl / t_s / 1e9:.1f} TFLOP/s, no scales {fl / t_p / 1e9:.1f}, "
          f"torch row-wise {fl / tt / 1e9:.1f}", flush=True)  # fmt: skip
for e, tok, n, k in [(32, 512, 4096, 7168), (32, 512, 7168, 2048)]:
    a, b, offs, fl = moe_operands(e, tok, n, k, F8)
    total = a.shape[0]
    ra, rb = torch.rand(total, device="cuda") + 0.5, torch.rand(e, n, device="cuda") + 0.5
    t_s = timer(lambda: grouped_gemm(a, b, offs=offs, scale_a=ra, scale_b=rb), 20)
    t_p = timer(lambda: grouped_gemm(a, b, offs=offs), 20)
    tt = timer(lambda: torch._scaled_grouped_mm(a, b, ra, rb, offs=offs, out_dtype=torch.bfloat16), 20)
    print(f"grouped E{e}x{tok} N{n} K{k}: row-wise scales {fl / t_s / 1e9:.1f} TFLOP/s, no scales "
          f"{fl / t_p / 1e9:.1f}, torch _scaled_grouped_mm {fl / tt / 1e9:.1f}", flush=True)  # fmt: skip
