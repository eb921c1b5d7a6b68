"""Where the time of one dense FP4-weight decode call goes (N=28672, K=4096; M = 16, 1, 64): the
whole call with the policy's config, the host reorder of the activations alone (what the
per-thread pipelines pay per call; the ring reads x as stored), and cuBLAS bf16 on the same
(dequantized) weights; L2-cold CUDA-event medians, one process. Overrides of the policy's config
on the command line (keyword text, e.g. 'split=True') are timed beside it."""
import sys
from dataclasses import replace

import torch

import cutegemm
from cutegemm.benchmarks import Timer
from cutegemm.blockscaled import fp4_math
from cutegemm.blockscaled.fp4_weight_api import _arch, gemm_fp4_weight, pick_config

torch.manual_seed(0)
timer = Timer()
for fmt in ("nvfp4", "mxfp4"):
    for m, n, k in [(16, 28672, 4096), (1, 28672, 4096), (64, 28672, 4096)]:
        qw = cutegemm.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), fmt)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        wd = cutegemm.dequantize(qw).to(torch.bfloat16)
        t_cublas = timer(lambda x=x, wd=wd: x @ wd.T)
        t_full = timer(lambda x=x, qw=qw: gemm_fp4_weight(x, qw))
        t_reorder = timer(lambda x=x: fp4_math.fragment_order_x(x))
        print(f"{fmt} M={m}: full call {t_full * 1e3:.1f} us | host reorder alone {t_reorder * 1e3:.1f} us | "
              f"cuBLAS bf16 {t_cublas * 1e3:.1f} us ({t_cublas / t_full:.2f}x)", flush=True)
        for s in sys.argv[1:]:
            cfg = replace(pick_config(m, fmt, torch.bfloat16, _arch(0), False), **eval(f"dict({s})"))  # noqa: S307
            t = timer(lambda x=x, qw=qw, cfg=cfg: gemm_fp4_weight(x, qw, config=cfg))
            print(f"   [{s}] {t * 1e3:.1f} us ({t_cublas / t:.2f}x)", flush=True)
