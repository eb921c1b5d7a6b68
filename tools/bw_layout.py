"""Probe: does the layout of FP8 block scales' scale_a change our kernel's speed? scale_a (M, K/128)
row-major (each row's scales contiguous: a warp's 8 rows 4 * K/128 bytes apart) against M-major
(``sa.t().contiguous().t()``, torch._scaled_mm's required layout: a warp's rows contiguous), same
operands, policy configs, dense and grouped; torch's blockwise _scaled_mm beside (M-major)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import cutegemm  # noqa: E402
from cutegemm.benchmarks import Timer, _moe_counts  # noqa: E402
from cutegemm.grouped import grouped_gemm  # noqa: E402

timer = Timer()
F8 = torch.float8_e4m3fn
for m, n, k in [(8192, 8192, 8192), (16384, 7168, 2048)]:
    torch.manual_seed(0)
    a, b = torch.randn(m, k, device="cuda").to(F8), torch.randn(n, k, device="cuda").to(F8).t()
    sa = torch.rand(m, k // 128, device="cuda") + 0.5
    sb = torch.rand(k // 128, n // 128, device="cuda") + 0.5
    sa_m, sb_m = sa.t().contiguous().t(), sb.t().contiguous().t()
    fl = 2.0 * m * n * k
    t_row = timer(lambda a=a, b=b, sa=sa, sb=sb: cutegemm.gemm(a, b, scale_a=sa, scale_b=sb), 20)
    t_mm = timer(lambda a=a, b=b, sa=sa_m, sb=sb: cutegemm.gemm(a, b, scale_a=sa, scale_b=sb), 20)
    t_t = timer(lambda a=a, b=b, sa=sa_m, sb=sb_m: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16), 20)
    same = torch.equal(cutegemm.gemm(a, b, scale_a=sa, scale_b=sb), cutegemm.gemm(a, b, scale_a=sa_m, scale_b=sb))
    print(f"{m}x{n}x{k}: ours scale_a row-major {fl / t_row / 1e9:.1f} TFLOP/s, M-major {fl / t_mm / 1e9:.1f}; "
          f"torch blockwise {fl / t_t / 1e9:.1f}; bitwise equal: {same}", flush=True)
for e, tok, n, k in [(32, 512, 4096, 7168), (32, 512, 7168, 2048)]:
    counts = _moe_counts(e, tok)
    total = sum(counts)
    torch.manual_seed(0)
    a = torch.randn(total, k, device="cuda").to(F8)
    b = torch.randn(e, n, k, device="cuda").to(F8).transpose(1, 2)
    sa = torch.rand(total, k // 128, device="cuda") + 0.5
    sb = (torch.rand(e, n // 128, k // 128, device="cuda") + 0.5).transpose(1, 2)
    sa_m = sa.t().contiguous().t()
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    fl = 2.0 * total * n * k
    t_row = timer(lambda a=a, b=b, sa=sa, sb=sb, offs=offs: grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb), 20)
    t_mm = timer(lambda a=a, b=b, sa=sa_m, sb=sb, offs=offs: grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb), 20)
    print(f"grouped E{e}x{tok} N{n} K{k}: ours scale_a row-major {fl / t_row / 1e9:.1f} TFLOP/s, M-major {fl / t_mm / 1e9:.1f}",
          flush=True)  # fmt: skip
