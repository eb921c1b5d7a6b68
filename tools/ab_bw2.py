# ruff: noqa: B023  (each lambda is timed inside its own iteration)
"""A/B probe of the FP8 block-scale kernels: times the package on PYTHONPATH (old or new) on
dense and grouped DeepSeek-style shapes, each given its preferred scale_a layout (M-major when
the package TMA-loads it, row-major before) and a K-contiguous scale_b view (no copies in
either), torch's blockwise _scaled_mm (dense) beside. Run by ``tools/round.sh ab_bw2``."""

import sys
from pathlib import Path

import torch
from probe_common import F8, dense_block_scaled, moe_operands

import cutegemm
from cutegemm.benchmarks import Timer
from cutegemm.gemm import fp8_args
from cutegemm.grouped import grouped_gemm

TMA = hasattr(fp8_args, "tma_scale_a")
print("package", Path(cutegemm.__file__).parent, "scale_a", "M-major (TMA)" if TMA else "row-major", flush=True)
timer = Timer()


def lay(sa):
    return sa.t().contiguous().t() if TMA else sa


for m, n, k in [(8192, 8192, 8192), (16384, 7168, 2048), (2048, 7168, 2048), (512, 7168, 2048), (128, 7168, 2048),
                (16, 7168, 2048)]:  # fmt: skip
    a, b, sa, sb = dense_block_scaled(m, n, k)
    sb = sb.t().contiguous().t()  # K-contiguous view
    fl = 2.0 * m * n * k
    sa_k = lay(sa)
    t = timer(lambda a=a, b=b, sa=sa_k, sb=sb: cutegemm.gemm(a, b, scale_a=sa, scale_b=sb), 20)
    sa_t = sa.t().contiguous().t()
    tt = timer(lambda a=a, b=b, sa=sa_t, sb=sb: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16), 20)
    print(f"dense {m}x{n}x{k}: ours {fl / t / 1e9:.1f} TFLOP/s ({t * 1e3:.1f} us) | torch {fl / tt / 1e9:.1f} | "
          f"{tt / t:.3f}x", flush=True)  # fmt: skip
for e, tok, n, k in [(32, 512, 4096, 7168), (32, 512, 7168, 2048)]:
    a, b, offs, fl = moe_operands(e, tok, n, k, F8)
    sa = lay(torch.rand(a.shape[0], k // 128, device="cuda") + 0.5)
    sb = (torch.rand(e, n // 128, k // 128, device="cuda") + 0.5).transpose(1, 2)  # view K-contiguous
    t = timer(lambda: grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb), 20)
    print(f"grouped E{e}x{tok} N{n} K{k}: ours {fl / t / 1e9:.1f} TFLOP/s", flush=True)
sys.stdout.flush()
