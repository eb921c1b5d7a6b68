"""Time the dequantize kernel (cutegemm.blockscaled.dequant) against the bytes it moves: per
format and shape, the kernel's time, its effective bandwidth (elements read + bf16 written), and a
torch copy of the bf16 output (clone) for scale. L2 flushed before each rep, median of 20."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from cutegemm import quantize  # noqa: E402
from cutegemm.benchmarks import Timer  # noqa: E402
from cutegemm.blockscaled import dequant  # noqa: E402
from cutegemm.blockscaled.dequant import dequantize_bf16  # noqa: E402

timer = Timer()
for fmt in ("mxfp8", "nvfp4"):
    for shape in ((8192, 8192), (32, 4096, 7168)):
        q = quantize(torch.randn(*shape, device="cuda", dtype=torch.bfloat16), fmt)
        out = torch.empty(shape, device="cuda", dtype=torch.bfloat16)
        n = out.numel()
        moved = n * (1 if fmt == "mxfp8" else 0.5) + n * 2
        for unroll in (2, 4):
            orig = dequant.DequantConfig
            dequant.DequantConfig = lambda fmt, arch, u=unroll, orig=orig: orig(fmt=fmt, arch=arch, unroll=u)  # noqa: E731
            try:
                t = timer(lambda q=q, out=out: dequantize_bf16(q, out=out), 20)
                ok = torch.equal(out.view(torch.int16), dequant.dequantize_bf16_ref(q).view(torch.int16))
            finally:
                dequant.DequantConfig = orig
            print(f"{fmt} {shape} unroll {unroll}: dequantize {t * 1e3:.1f} us = {moved / t / 1e6:.0f} GB/s, equal to the twin: {ok}", flush=True)
        t_copy = timer(lambda out=out: out.clone(), 20)
        print(f"   bf16 clone (2x{2 * n / 1e6:.0f} MB) {t_copy * 1e3:.1f} us = {4 * n / t_copy / 1e6:.0f} GB/s", flush=True)
