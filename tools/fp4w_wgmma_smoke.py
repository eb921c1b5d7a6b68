"""A few calls of the FP4-weight WGMMA consumers (``Fp4WeightConfig.wgmma``) against the float64
reference (the GPU tests' bound); exit 1 on the first failure. Run before longer H200 jobs:

    timeout 120 python tools/fp4w_wgmma_smoke.py
"""

import sys

import torch
from probe_common import F8  # noqa: F401  (puts the repository on sys.path)

import cutegemm
from cutegemm.blockscaled import fp4_weight_api as api
from cutegemm.blockscaled.fp4_weight import Fp4WeightConfig
from cutegemm.blockscaled.reference import dequantize_ref


def one(fmt, m, n, k, nt, ring, counts=None, split=False):
    torch.manual_seed(m + n + k)
    grouped = counts is not None
    e = len(counts) if grouped else 1
    w = torch.randn(*((e, n, k) if grouped else (n, k)), device="cuda").to(torch.bfloat16)
    qw = cutegemm.quantize(w, fmt)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    cfg = Fp4WeightConfig(fmt=fmt, n_tiles=nt, ring=ring, ring_k=2, warps_n=8, warps_k=1, row_tiles=1, stages=0,
                          grouped=grouped, wgmma=True, producer_pairs=False, split=split)  # fmt: skip
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32) if grouped else None
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    api.gemm_fp4_weight(x, qw, offs=offs, out=out, config=cfg)
    torch.cuda.synchronize()
    wd = dequantize_ref(qw).double()
    if grouped:
        bounds = list(zip([0, *offs.tolist()[:-1]], offs.tolist(), strict=True))
        ref = torch.cat([x[s:t].double() @ wd[i].T for i, (s, t) in enumerate(bounds)])
        tref = torch.cat([(x[s:t] @ wd[i].to(torch.bfloat16).T).double() for i, (s, t) in enumerate(bounds)])
    else:
        ref = x.double() @ wd.T
        tref = (x @ wd.to(torch.bfloat16).T).double()
    err = (out.double() - ref).abs().max().item()
    terr = (tref - ref).abs().max().item()
    ok = err <= 2 * terr + 1e-6 * ref.abs().max().item()
    print(f"{'ok  ' if ok else 'FAIL'} {cfg.name} m={m} n={n} k={k} counts={counts}: err {err:.4g} torch {terr:.4g}",
          flush=True)  # fmt: skip
    if not ok:
        bad = (out.double() - ref).abs() > 2 * terr + 1e-6 * ref.abs().max().item()
        idx = bad.nonzero()[:8].tolist()
        print("   bad at", idx, [(out[i, j].item(), ref[i, j].item()) for i, j in idx[:4]])
    return ok


if __name__ == "__main__":
    cases = [
        ("nvfp4", 64, 256, 512, 8, 2, None),
        ("mxfp4", 64, 256, 512, 8, 2, None),
        ("nvfp4", 100, 300, 32 * 13, 8, 3, None),
        ("nvfp4", 16, 128, 256, 2, 4, None),
        ("mxfp4", 200, 130, 1024, 16, 2, None),
        ("nvfp4", 90, 200, 32 * 9, 4, 4, [40, 0, 50]),
        ("nvfp4", 100, 1000, 32 * 40, 8, 3, None, True),  # split: passes cut between CTAs
        ("mxfp4", 64, 28672, 4096, 8, 3, None, True),
    ]
    for c in cases:
        if not one(*c):
            sys.exit(1)
    print("smoke: all ok")
