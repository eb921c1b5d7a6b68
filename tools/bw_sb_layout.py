# ruff: noqa: B023  (each lambda is timed inside its own iteration)
"""Probe: does the layout of FP8 block scales' scale_b change our kernel's speed? The kernel reads
scale_b as an (N/128, K/128) view, one value per K tile per tile. torch's (K/128, N/128) scale_b
row-major makes that view K-strided (a new cache line every K tile); its column-major form
(``sb.t().contiguous().t()``) makes it K-contiguous. Same operands, policy configs and 128x128,
dense and grouped; row-wise promoted (no block scales) beside."""

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import cutegemm  # noqa: E402
from cutegemm.benchmarks import Timer, _moe_counts  # noqa: E402
from cutegemm.gemm.api import _PLANS  # noqa: E402
from cutegemm.grouped import grouped_gemm  # noqa: E402

timer = Timer()
F8 = torch.float8_e4m3fn
for m, n, k in [(8192, 8192, 8192), (16384, 7168, 2048)]:
    torch.manual_seed(0)
    a, b = torch.randn(m, k, device="cuda").to(F8), torch.randn(n, k, device="cuda").to(F8).t()
    sa = torch.rand(m, k // 128, device="cuda") + 0.5
    sb = torch.rand(k // 128, n // 128, device="cuda") + 0.5
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
    counts = _moe_counts(e, tok)
    total = sum(counts)
    torch.manual_seed(0)
    a = torch.randn(total, k, device="cuda").to(F8)
    b = torch.randn(e, n, k, device="cuda").to(F8).transpose(1, 2)
    sa = torch.rand(total, k // 128, device="cuda") + 0.5
    sb_k = (torch.rand(e, n // 128, k // 128, device="cuda") + 0.5).transpose(1, 2)  # view K-contiguous
    sb_n = sb_k.contiguous()  # (E, KB, NB) row-major: view K-strided
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    fl = 2.0 * total * n * k
    t_k = timer(lambda: grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb_k), 20)
    t_n = timer(lambda: grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb_n), 20)
    ra, rb = torch.rand(total, device="cuda") + 0.5, torch.rand(e, n, device="cuda") + 0.5
    t_r = timer(lambda: grouped_gemm(a, b, offs=offs, scale_a=ra, scale_b=rb), 20)
    print(f"grouped E{e}x{tok} N{n} K{k}: scale_b view K-strided {fl / t_n / 1e9:.1f} TFLOP/s, K-contiguous "
          f"{fl / t_k / 1e9:.1f}; row-wise promoted {fl / t_r / 1e9:.1f}", flush=True)  # fmt: skip
