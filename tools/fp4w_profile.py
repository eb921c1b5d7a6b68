"""One dense FP4-weight call (M=16, N=28672, K=4096, NVFP4) per config given on the command line
(Fp4WeightConfig keyword text, e.g. 'n_tiles=2, warps_k=2'), for ncu."""
import sys

import torch

import cutegemm
from cutegemm.blockscaled.fp4_weight import Fp4WeightConfig  # noqa: F401  (eval namespace)
from cutegemm.blockscaled.fp4_weight_api import gemm_fp4_weight

torch.manual_seed(0)
m, n, k = 16, 28672, 4096
qw = cutegemm.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), "nvfp4")
x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
cfgs = [eval(f"Fp4WeightConfig({s})") for s in sys.argv[1:]] or [None]
for cfg in cfgs:
    gemm_fp4_weight(x, qw, config=cfg)
torch.cuda.synchronize()
