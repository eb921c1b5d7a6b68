"""One profiled launch each (for ncu --profile-from-start off) of dense FP8 8192^3: cuBLAS's
blockwise (1x128 / 128x128) and row-wise ``torch._scaled_mm``, our block-scaled kernel (policy
and 128x128) and our row-wise promoted kernel (policy): why block scaling costs us more than it
costs cuBLAS. Run: ncu --clock-control none --profile-from-start off ... python tools/prof_fp8.py"""
from dataclasses import replace

import torch
from probe_common import profile_each

import cutegemm
from cutegemm.gemm.api import _PLANS

torch.manual_seed(0)
m = n = k = 8192
a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
sa = torch.rand(m, k // 128, device="cuda") + 0.5
sb = torch.rand(k // 128, n // 128, device="cuda") + 0.5
sa_t, sb_t = sa.t().contiguous().t(), sb.t().contiguous().t()  # torch's layouts
ra, rb = torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5
cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
bw = next(p.config for p in _PLANS.values() if p.config.fp8_blockwise)
jobs = [
    ("torch blockwise", lambda: torch._scaled_mm(a, b, scale_a=sa_t, scale_b=sb_t, out_dtype=torch.bfloat16)),
    ("torch rowwise", lambda: torch._scaled_mm(a, b, scale_a=ra, scale_b=rb, out_dtype=torch.bfloat16)),
    ("ours blockwise " + bw.name, lambda: cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)),
    ("ours blockwise 128x128", lambda: cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, config=replace(bw, tile_n=128))),
    ("ours rowwise", lambda: cutegemm.gemm(a, b, scale_a=ra.reshape(-1), scale_b=rb.reshape(-1))),
]
profile_each(jobs)  # compile and warm up outside the profiled range, then one launch each
