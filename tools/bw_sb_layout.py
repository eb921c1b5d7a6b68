# ruff: noqa: B023  (each lambda is timed inside its own iteration)
"""Probe: does the layout of FP8 block scales' scale_b change our kernel's speed? The kernel reads
scale_b as an (N/128, K/128) view, one value per K tile per tile. torch's (K/128, N/128) scale_b
row-major makes that view K-strided (a new cache line every K tile); its column-major form
(``sb.t().contiguous().t()``) makes it K-contiguous. Same operands, policy configs and 128x128,
dense and grouped; row-wise promoted (no block scales) beside."""

from dataclasses import replace

import torch
from probe_common import F8, dense_block_scaled, moe_operands

import cutegemm
from cutegemm.benchmarks import Timer
from cutegemm.gemm.api import _PLANS
from cutegemm.grouped import grouped_gemm

timer = Timer()
for m, n, k in [(8192, 8192, 8192), (16384, 7168, 2048)]:
    a, b, sa, sb = dense_block_scaled(m, n, k)
    sb_k = sb.t().contiguous().t()
    fl = 2.0 * m * n * k
    _PLANS.clear()
    cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
    pol = next(p.config for p in _PLANS.values() if p.config.fp8_blockwise)
    for cfg in (None, replace(pol, tile_n=128)):
        t_n = timer(lambda cfg=cfg, sb=sb: cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, config=cfg), 20)
        t_k = timer(lambda cfg=cfg, sb=sb_k: cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, config=cfg), 20)
        same = torch.equal(cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, config=cfg),
                           cutegemm.gemm(a, b, scale_a=sa, scale_b=sb_k, config=cfg))  # fmt: skip
        print(f"{m}x{n}x{k} {'policy' if cfg is None else '128x128'}: scale_b view K-strided {fl / t_n / 1e9:.1f} "
              f"TFLOP/s, K-contiguous {fl / t_k / 1e9:.1f}; bitwise equal: {same}", flush=True)  # fmt: skip
    ra, rb = torch.rand(m, device="cuda") + 0.5, torch.rand(n, device="cuda") + 0.5
    t_r = timer(lambda: cutegemm.gemm(a, b, scale_a=ra, scale_b=rb), 20)
    print(f"{m}x{n}x{k}: row-wise promoted (policy) {fl / t_r / 1e9:.1f} TFLOP/s", flush=True)
for e, tok, n, k in [(32, 512, 4096, 7168)]:
    a, b, offs, fl = moe_operands(e, tok, n, k, F8)
    total = a.shape[0]
    sa = torch.rand(total, k // 128, device="cuda") + 0.5
    sb_k = (torch.rand(e, n // 128, k // 128, device="cuda") + 0.5).transpose(1, 2)  # view K-contiguous
    sb_n = sb_k.contiguous()  # (E, KB, NB) row-major: view K-strided
    t_k = timer(lambda: grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb_k), 20)
    t_n = timer(lambda: grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb_n), 20)
    ra, rb = torch.rand(total, device="cuda") + 0.5, torch.rand(e, n, device="cuda") + 0.5
    t_r = timer(lambda: grouped_gemm(a, b, offs=offs, scale_a=ra, scale_b=rb), 20)
    print(f"grouped E{e}x{tok} N{n} K{k}: scale_b view K-strided {fl / t_n / 1e9:.1f} TFLOP/s, K-contiguous "
          f"{fl / t_k / 1e9:.1f}; row-wise promoted {fl / t_r / 1e9:.1f}", flush=True)  # fmt: skip
