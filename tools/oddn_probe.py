"""Probe: which elements outside an odd-N output view does each GEMM path write? (poisoned buffer)"""
import torch

import cutegemm
from cutegemm.blockscaled import quantize_ref


def outside(buf, m, n):
    w = ~torch.isnan(buf)
    w[:m, :n] = False
    idx = w.nonzero()
    return int(w.sum()), sorted(set(idx[:, 1].tolist()))[:12]


torch.manual_seed(0)
for m, n, k in [(77, 65, 48), (64, 130, 64)]:
    for dt in (torch.bfloat16, torch.float32):
        pad = 8 + (-n) % 8
        qa = quantize_ref(torch.randn(m, k, device="cuda"), "mxfp8")
        qb = quantize_ref(torch.randn(n, k, device="cuda"), "mxfp8")
        buf = torch.full((m + 3, n + pad), float("nan"), dtype=dt, device="cuda")
        cutegemm.gemm(qa, qb, out=buf[:m, :n])
        print(m, n, dt, "mx", outside(buf, m, n))
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
        buf = torch.full((m + 3, n + pad), float("nan"), dtype=dt, device="cuda")
        cutegemm.gemm(a, b, scale_a=torch.ones(m, 1, device="cuda"), scale_b=torch.ones(1, n, device="cuda"),
                      out=buf[:m, :n])
        print(m, n, dt, "fp8 row-wise", outside(buf, m, n))
        buf = torch.full((m + 3, n + pad), float("nan"), dtype=dt, device="cuda")
        cutegemm.gemm(a, b, out=buf[:m, :n])
        print(m, n, dt, "fp8 plain", outside(buf, m, n))
        a16 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w16 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        buf = torch.full((m + 3, n + pad), float("nan"), dtype=dt, device="cuda")
        cutegemm.gemm(a16, w16.t(), out=buf[:m, :n])
        print(m, n, dt, "bf16 b=w.t()", outside(buf, m, n))
        buf = torch.full((m + 3, n + pad), float("nan"), dtype=dt, device="cuda")
        cutegemm.gemm(a16, w16.t(), out=buf[:m, :n], bias=torch.randn(n, device="cuda", dtype=torch.bfloat16))
        print(m, n, dt, "bf16 b=w.t() + bias", outside(buf, m, n))
    # grouped (packed MoE form), odd N, user out view
    for dt in (torch.bfloat16,):
        e, n, k = 3, 65, 64
        a = torch.randn(96, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16)
        offs = torch.tensor([20, 50, 96], dtype=torch.int32, device="cuda")
        buf = torch.full((96 + 3, n + 15), float("nan"), dtype=dt, device="cuda")
        try:
            cutegemm.grouped_gemm(a, w.transpose(1, 2), offs=offs, out=buf[:96, :n])
            print("grouped", outside(buf, 96, n))
        except Exception as exc:
            print("grouped", type(exc).__name__, str(exc)[:150])
