"""The streaming floor of the FP4-weight decode target (issue 5: NVFP4 weight x bf16, dense M=16,
N=28672 K=4096, >= 3x cuBLAS bf16): in one process, under both L2 flushes of
``benchmarks.Timer``, cuBLAS bf16 on the dequantized weight, our call, and the time torch takes
to read the same byte counts once (an fp32 ``sum`` of a buffer as large as the NVFP4 weight +
its scales, and of the bf16 weight's bytes; an int64-accumulated int32 sum streamed at only
~0.6 TB/s, ``bench/2026-12-02c/decode_bound/int64_sum.log``). Best of ROUNDS interleaved L2-cold medians of 30, µs.

    python tools/decode_bound_probe.py [ROUNDS]
"""

import sys

import torch
from probe_common import interleaved_rounds

import cutegemm
from cutegemm.benchmarks import Timer
from cutegemm.blockscaled.dequant import dequantize_checked

N, K = 28672, 4096
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
torch.manual_seed(0)
qw = cutegemm.quantize(torch.randn(N, K, device="cuda", dtype=torch.bfloat16), "nvfp4")
w16 = dequantize_checked(qw)
fp4_bytes = qw.data.numel() * qw.data.element_size() + qw.scales.numel() * qw.scales.element_size()
buf4 = torch.rand(fp4_bytes // 4, device="cuda")  # fp32: torch's sum streams it fastest
w16_f32 = w16.view(torch.float32).reshape(-1)  # the bf16 weight's bytes read as fp32 (values unused)
print(f"NVFP4 weight + scales: {fp4_bytes / 1e6:.1f} MB; bf16 weight: {w16.numel() * 2 / 1e6:.1f} MB", flush=True)
for m in (1, 16):
    x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
    runs = {
        "cublas_bf16": lambda x=x: x @ w16.t(),
        "ours_nvfp4": lambda x=x: cutegemm.gemm(x, qw),
        "read_fp4_bytes": lambda: buf4.sum(),
        "read_bf16_bytes": lambda: w16_f32.sum(),
    }
    for mode in ("write", "clean"):
        best = {k: min(v) * 1e3 for k, v in interleaved_rounds(Timer(clean=mode == "clean"), runs, rounds).items()}
        c = best["cublas_bf16"]
        print(f"M={m} {mode} flush: " + " | ".join(f"{k} {t:.1f}" for k, t in best.items())
              + f" | cuBLAS / ours {c / best['ours_nvfp4']:.2f}x, cuBLAS / read of the FP4 bytes"
              f" {c / best['read_fp4_bytes']:.2f}x", flush=True)
