"""One profiled launch each (for ``ncu --profile-from-start off``) of the FP4 / MXFP8-weight WGMMA
consumers at prefill sizes beside cuBLAS bf16 on the dequantized weight: where the consumers'
time goes at 100-400 rows. Dense N=28672 K=4096; grouped E=32 ~256 rows, N=4096 K=7168.
Run: ncu --clock-control none --profile-from-start off ... python tools/prof_fp4w.py [--ms 128,256] [CONFIG ...]
(CONFIG: extra ``Fp4WeightConfig`` keyword text run on the NVFP4 call of the first M)."""
import sys
from dataclasses import replace

import torch
from probe_common import profile_each, quantized_moe

import cutegemm
from cutegemm.blockscaled import fp4_weight_api as api
from cutegemm.blockscaled.dequant import dequantize_checked
from cutegemm.blockscaled.fp4_weight import Fp4WeightConfig  # noqa: F401  (eval namespace)

torch.manual_seed(0)
n, k = 28672, 4096
args = sys.argv[1:]
ms = (128, 256)
if args[:1] == ["--ms"]:
    ms, args = tuple(int(v) for v in args[1].split(",")), args[2:]
jobs = []
for fmt in ("nvfp4", "mxfp8"):
    qw = cutegemm.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), fmt)
    w16 = dequantize_checked(qw)
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        cfg = api.pick_config(m, fmt, torch.bfloat16, "sm_90a", False)
        if fmt == "nvfp4":
            jobs.append((f"cublas bf16 M={m}", lambda x=x, w16=w16: x @ w16.t()))
        if m == ms[0] and fmt == "nvfp4":
            for s in args:
                c = replace(cfg, **eval(f"dict({s})"))
                jobs.append((f"{fmt} M={m} {c.name}", lambda x=x, qw=qw, c=c: api.gemm_fp4_weight(x, qw, config=c)))
        jobs.append((f"{fmt} M={m} {cfg.name}", lambda x=x, qw=qw, c=cfg: api.gemm_fp4_weight(x, qw, config=c)))
counts, offs, qw, w16, x = quantized_moe(32, 256, 4096, 7168, "nvfp4")
cfg = api.pick_config(x.shape[0], "nvfp4", torch.bfloat16, "sm_90a", True, 32)
jobs.append(("grouped_mm bf16 ~256", lambda: torch._grouped_mm(x, w16.transpose(1, 2), offs=offs)))
jobs.append((f"nvfp4 grouped ~256 {cfg.name}", lambda: api.gemm_fp4_weight(x, qw, offs=offs, config=cfg)))
profile_each(jobs)
