"""Debug: one K-grouped case per process (an illegal instruction poisons the context).
    python tools/kg_debug.py M N c0,c1,... [tile_m tile_n]"""
import sys

import torch

import cutegemm
from cutegemm.grouped import grouped_gemm, grouped_gemm_ref
from cutegemm.grouped.k_grouped import kgrouped_config

m, n = int(sys.argv[1]), int(sys.argv[2])
counts = [int(c) for c in sys.argv[3].split(",")]
cfg = None
if len(sys.argv) > 5:
    cfg = cutegemm.GemmConfig(arch="sm_90a", kgrouped=True, a_major="k", b_major="n",
                              tile_m=int(sys.argv[4]), tile_n=int(sys.argv[5]))
import os  # noqa: E402

K = sum(counts) + int(os.environ.get("PAD", "0"))
a = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
b = torch.randn(K, n, device="cuda", dtype=torch.bfloat16)
offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
print("policy:", (cfg or kgrouped_config("sm_90a", 132, m, n, K // len(counts), len(counts), "bf16", "bf16", "k", "n", False)).name, flush=True)
try:
    out = grouped_gemm(a, b, offs=offs, config=cfg)
    torch.cuda.synchronize()
    ref = grouped_gemm_ref(a[:, : sum(counts)], b[: sum(counts)], offs=offs, compute_dtype=torch.float64)
    print("OK max err", (out.double() - ref).abs().max().item(), flush=True)
except Exception as exc:
    print("FAIL", type(exc).__name__, str(exc)[:200], flush=True)
