"""Grouped MXFP8 x MXFP8 on sm_90a (the policy: dequantize-first at these shapes; the emulation
forced beside it) vs what a Hopper user has, same run, same operands:
torch._grouped_mm bf16 on the dequantized operands (exact in bf16) and dequantize-then-
_grouped_mm (the dequantize timed too). DeepSeek-V3 up / down shapes, Poisson tokens, seed 0."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dataclasses import replace  # noqa: E402

import torch  # noqa: E402

import cutegemm  # noqa: E402
from cutegemm.benchmarks import Timer, _moe_counts  # noqa: E402
from cutegemm.blockscaled import dequantize_ref, quantize  # noqa: E402
from cutegemm.blockscaled.sm90_mx import mx_config  # noqa: E402

timer = Timer()
for e, tok, n, k in [(32, 512, 4096, 7168), (32, 512, 7168, 2048)]:
    counts = _moe_counts(e, tok)
    total = sum(counts)
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    qa = quantize(torch.randn(total, k, device="cuda", dtype=torch.bfloat16), "mxfp8")
    qw = quantize(torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16), "mxfp8")
    a16 = dequantize_ref(qa).to(torch.bfloat16)
    w16 = dequantize_ref(qw).to(torch.bfloat16).transpose(1, 2)
    fl = 2.0 * total * n * k
    ours = timer(lambda qa=qa, qw=qw, offs=offs: cutegemm.grouped_gemm(qa, qw, offs=offs), 20)
    emu_cfg = replace(mx_config(total // e, n), grouped=True)
    emu = timer(lambda qa=qa, qw=qw, offs=offs, c=emu_cfg: cutegemm.grouped_gemm(qa, qw, offs=offs, config=c), 20)
    bf16 = timer(lambda a16=a16, w16=w16, offs=offs: torch._grouped_mm(a16, w16, offs=offs), 20)

    def deq_then_mm(qa=qa, qw=qw, offs=offs):
        a = dequantize_ref(qa).to(torch.bfloat16)
        w = dequantize_ref(qw).to(torch.bfloat16).transpose(1, 2)
        return torch._grouped_mm(a, w, offs=offs)

    deq = timer(deq_then_mm, 5)
    got = cutegemm.grouped_gemm(qa, qw, offs=offs).double()
    ref = torch._grouped_mm(a16, w16, offs=offs).double()
    err = (got - ref).abs().max().item() / ref.abs().max().item()
    print(f"grouped MXFP8 E{e}x{tok} N{n} K{k}: ours {fl / ours / 1e9:.1f} TFLOP/s ({ours:.4f} ms) | "
          f"emulation forced {fl / emu / 1e9:.1f} ({emu / ours:.2f}x slower) | "
          f"torch._grouped_mm bf16 on the dequantized operands {fl / bf16 / 1e9:.1f} ({bf16 / ours:.2f}x) | "
          f"dequantize (torch ops) + _grouped_mm {deq:.3f} ms ({deq / ours:.2f}x) | max rel diff vs bf16 {err:.2e}",
          flush=True)  # fmt: skip
