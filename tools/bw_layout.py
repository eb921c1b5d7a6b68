"""Probe: does the layout of FP8 block scales' scale_a change our kernel's speed? scale_a (M, K/128)
row-major (each row's scales contiguous: a warp's 8 rows 4 * K/128 bytes apart) against M-major
(``sa.t().contiguous().t()``, torch._scaled_mm's required layout: a warp's rows contiguous), same
operands, policy configs, dense and grouped; torch's blockwise _scaled_mm beside (M-major).
Written for the kernels that loaded scale_a per thread from global memory (row-major was
faster, bench/2026-11-30h/round8); since 2026-11-30 (bench/2026-11-30i) the kernels TMA-load
an M-major scale_a and copy a row-major one.)"""

import torch
from probe_common import F8, dense_block_scaled, moe_operands

import cutegemm
from cutegemm.benchmarks import Timer
from cutegemm.grouped import grouped_gemm

timer = Timer()
for m, n, k in [(8192, 8192, 8192), (16384, 7168, 2048)]:
    a, b, sa, sb = dense_block_scaled(m, n, k)
    sa_m, sb_m = sa.t().contiguous().t(), sb.t().contiguous().t()
    fl = 2.0 * m * n * k
    t_row = timer(lambda a=a, b=b, sa=sa, sb=sb: cutegemm.gemm(a, b, scale_a=sa, scale_b=sb), 20)
    t_mm = timer(lambda a=a, b=b, sa=sa_m, sb=sb: cutegemm.gemm(a, b, scale_a=sa, scale_b=sb), 20)
    t_t = timer(lambda a=a, b=b, sa=sa_m, sb=sb_m: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16), 20)
    same = torch.equal(cutegemm.gemm(a, b, scale_a=sa, scale_b=sb), cutegemm.gemm(a, b, scale_a=sa_m, scale_b=sb))
    print(f"{m}x{n}x{k}: ours scale_a row-major {fl / t_row / 1e9:.1f} TFLOP/s, M-major {fl / t_mm / 1e9:.1f}; "
          f"torch blockwise {fl / t_t / 1e9:.1f}; bitwise equal: {same}", flush=True)
for e, tok, n, k in [(32, 512, 4096, 7168), (32, 512, 7168, 2048)]:
    a, b, offs, fl = moe_operands(e, tok, n, k, F8)
    total = a.shape[0]
    sa = torch.rand(total, k // 128, device="cuda") + 0.5
    sb = (torch.rand(e, n // 128, k // 128, device="cuda") + 0.5).transpose(1, 2)
    sa_m = sa.t().contiguous().t()
    t_row = timer(lambda a=a, b=b, sa=sa, sb=sb, offs=offs: grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb), 20)
    t_mm = timer(lambda a=a, b=b, sa=sa_m, sb=sb, offs=offs: grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb), 20)
    print(f"grouped E{e}x{tok} N{n} K{k}: ours scale_a row-major {fl / t_row / 1e9:.1f} TFLOP/s, M-major {fl / t_mm / 1e9:.1f}",
          flush=True)  # fmt: skip
