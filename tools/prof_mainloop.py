"""One profiled launch each (for ncu --profile-from-start off): our dense bf16 8192^3 and
cuBLAS; our grouped bf16 on a Mixtral-like (E=2 x 4096, N 28672, K 4096) and a DeepSeek-V3-up
shape and torch._grouped_mm; our grouped FP8 row-wise (DeepSeek-V3 up) promoted, with and
without wg_order. Run: ncu --clock-control none --profile-from-start off ... python tools/prof_mainloop.py"""
from dataclasses import replace

import torch
from probe_common import profile_each

import cutegemm
from cutegemm.benchmarks import _moe_counts
from cutegemm.grouped import grouped_gemm
from cutegemm.grouped.api import _PLANS

torch.manual_seed(0)
jobs = []
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16).t()
jobs += [("dense ours", lambda: cutegemm.gemm(a, b)), ("dense cublas", lambda: torch.matmul(a, b))]
for name, e, tok, n, k in [("mixtral2", 2, 4096, 28672, 4096), ("dsv3up", 32, 512, 4096, 7168)]:
    counts = [tok] * e if name == "mixtral2" else _moe_counts(e, tok)
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    x = torch.randn(sum(counts), k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    jobs += [(f"{name} ours", lambda x=x, w=w, offs=offs: grouped_gemm(x, w, offs=offs)),
             (f"{name} torch", lambda x=x, w=w, offs=offs: torch._grouped_mm(x, w, offs=offs))]
counts = _moe_counts(32, 512)
offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
x8 = torch.randn(sum(counts), 7168, device="cuda").to(torch.float8_e4m3fn)
w8 = torch.randn(32, 4096, 7168, device="cuda").to(torch.float8_e4m3fn).transpose(1, 2)
sa, sb = torch.rand(sum(counts), device="cuda") + 0.5, torch.rand(32, 4096, device="cuda") + 0.5
grouped_gemm(x8, w8, offs=offs, scale_a=sa, scale_b=sb)
base = next(p.config for key, p in _PLANS.items() if key[0] == x8.shape and key[4] == x8.dtype)
wgo = replace(base, wg_order=True)
jobs += [("fp8 grouped ours", lambda: grouped_gemm(x8, w8, offs=offs, scale_a=sa, scale_b=sb)),
         ("fp8 grouped wgo", lambda: grouped_gemm(x8, w8, offs=offs, scale_a=sa, scale_b=sb, config=wgo))]
profile_each(jobs)  # compile and warm up outside the profiled range, then one launch each
