"""FP8 row-wise, fp32 output, 128 x 512 x 256 (torch's test_scaled_mm_vs_emulated_row_wise): how
many elements each accumulation variant puts beyond torch's 2e-3 of the emulation, beside
torch._scaled_mm itself, and their max errors against the exact product of the FP8 operands.
Needs a GPU; run from the repository root: ``python tools/fp8_accuracy.py``
(bench/RESULTS.md, FP8: element-wise accuracy)."""
from dataclasses import replace

import torch

import cutegemm
from cutegemm.bench.layers import _clear_plans, record_configs
from tests.conformance.helpers import amax_scale, dequant_mm, to_e4m3

torch.manual_seed(42)
m, k, n = 128, 512, 256
F32 = torch.float32
x = torch.randn(m, k, device="cuda", dtype=F32)
y = torch.randn(n, k, device="cuda", dtype=F32).t()
xs, ys = amax_scale(x, dim=1), amax_scale(y, dim=0)
x8, y8 = to_e4m3(x * xs), to_e4m3(y * ys)
sa, sb = xs.reciprocal(), ys.reciprocal()
emu = dequant_mm(x8, xs, y8, ys, F32, None)
exact = (x8.double() @ y8.double()) * sa.double() * sb.double()


def report(name, out):
    bad = ((out - emu).abs() > 2e-3 + 2e-3 * emu.abs()).sum().item()
    print(f"{name:40s} beyond 2e-3 of emulation: {bad:4d}   max |out - exact| {(out.double() - exact).abs().max().item():.3e}"
          f"   max |emu - exact| {(emu.double() - exact).abs().max().item():.3e}", flush=True)


report("torch._scaled_mm", torch._scaled_mm(x8, y8, sa, sb, out_dtype=F32))
report("torch._scaled_mm fast_accum", torch._scaled_mm(x8, y8, sa, sb, out_dtype=F32, use_fast_accum=True))
_clear_plans()
base = record_configs(lambda: cutegemm.gemm(x8, y8, scale_a=sa, scale_b=sb, out_dtype=F32))[-1]
_clear_plans()
report(f"ours (policy {base.name})", cutegemm.gemm(x8, y8, scale_a=sa, scale_b=sb, out_dtype=F32))
for kw in (dict(promote_k=0), dict(promote_k=32), dict(promote_k=64), dict(promote_k=0, fast_accum=True),
           dict(promote_k=32, tile_n=64), dict(promote_k=32, tile_m=64, tile_n=64)):
    cfg = replace(base, **kw)
    try:
        report(f"ours {kw}", cutegemm.gemm(x8, y8, scale_a=sa, scale_b=sb, out_dtype=F32, config=cfg))
    except Exception as exc:
        print(f"ours {kw}: {type(exc).__name__}: {str(exc)[:150]}")


def scaled(acc, row, col, sa, sb):
    return acc * sa[row] * sb[col]


# the operands upcast to bf16 (exact for e4m3), the bf16 WGMMA's fp32 accumulation, scales in a user epilogue
a16, b16 = x8.to(torch.bfloat16), y8.to(torch.bfloat16)
report("ours bf16 upcast + scale epilogue", cutegemm.gemm(a16, b16, out_dtype=F32, epilogue=scaled,
                                                          epilogue_args=(sa.reshape(-1), sb.reshape(-1))))
report("torch bf16 upcast matmul * scales", (a16.float() @ b16.float()) * sa * sb)
