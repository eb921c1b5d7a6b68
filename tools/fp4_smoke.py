"""One small call of each FP4-weight ring variant against the reference (a quick hang / wrong-
result check before the full GPU tests): python tools/fp4_smoke.py"""

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import cutegemm  # noqa: E402
from cutegemm.blockscaled.fp4_weight_api import _arch, gemm_fp4_weight, gemm_fp4_weight_ref, pick_config  # noqa: E402

for fmt in ("nvfp4", "mxfp4"):
    for m, n, k in ((16, 256, 512), (5, 200, 32 * 37)):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        qw = cutegemm.quantize(w, fmt)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        cfg = replace(pick_config(m, fmt, torch.bfloat16, _arch(0), False, 1), stages=0, l2_prefetch=0,
                      ring=4, ring_k=2, warps_n=8, warps_k=1, row_tiles=1)  # fmt: skip
        out = gemm_fp4_weight(x, qw, config=cfg)
        torch.cuda.synchronize()
        ref = gemm_fp4_weight_ref(x, qw, out_dtype=torch.float32)
        err = (out.float() - ref).abs().max().item()
        print(f"smoke {fmt} {m}x{n}x{k}: max err {err:.4g} (ref max {ref.abs().max().item():.4g})", flush=True)
