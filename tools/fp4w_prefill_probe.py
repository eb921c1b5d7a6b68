"""FP4-weight calls (bf16 activations x NVFP4 / MXFP4 weights) from decode to prefill sizes, H200:
where the decode kernel (``fp4_weight``, token passes over each CTA's weight rows) stops paying
and the dequantize-first path (one bf16 copy of the weight by ``dequant.dequantize_bf16``, then
the bf16 GEMM) takes over. Per case, one process, same operands, write flush, best of ROUNDS
interleaved L2-cold medians of 30, µs:

- ``base``: cuBLAS ``x @ w16.T`` / ``torch._grouped_mm`` on the weight dequantized beforehand;
- ``policy``: ``cutegemm.gemm(x, qw)`` / ``grouped_gemm`` as the library routes the call;
- ``kernel``: the decode kernel with the decode policy's config (``fp4_weight_api.pick_config``);
- ``dq``: dequantize the weight (our kernel) + our bf16 GEMM;
- ``wg t.. r..``: the WGMMA consumers (``Fp4WeightConfig.wgmma``), tokens per pass and ring stages;
- ``read``: torch reading the FP4 weight bytes once (a bound for the decode kernel).

    python tools/fp4w_prefill_probe.py [ROUNDS] [--quick] [--list]
"""

import sys

import torch
from probe_common import quantized_moe, report_vs_base

import cutegemm
from cutegemm.benchmarks import Timer, _moe_counts
from cutegemm.blockscaled import fp4_weight_api as api
from cutegemm.blockscaled.dequant import dequantize_checked
from cutegemm.blockscaled.fp4_weight import Fp4WeightConfig
from cutegemm.gemm.api import gemm
from cutegemm.grouped.api import grouped_gemm

N, K = 28672, 4096
DENSE_M = (16, 32, 48, 64, 96, 128, 192, 256, 512)
MX_M = (64, 256, 1024)
GROUPED = ((32, 64), (32, 256))  # (E, mean tokens per expert); N 4096, K 7168
QUICK = "--quick" in sys.argv


def wg_configs(fmt, rows, grouped):
    """WGMMA-consumer configs (``Fp4WeightConfig.wgmma``) for ``rows`` tokens (per expert)."""
    shapes = [(4, 4, False)] if rows <= 32 else [(8, 3, False), (16, 2, False)]
    if not grouped:
        shapes += [(4, 4, True)] if rows <= 32 else [(8, 3, True)]
    return {
        f"wg t{8 * nt} r{ring}{' split' if split else ''}": Fp4WeightConfig(
            fmt=fmt, n_tiles=nt, ring=ring, ring_k=2, warps_n=8, warps_k=1, row_tiles=1, stages=0, grouped=grouped,
            wgmma=True, producer_pairs=False, split=split)
        for nt, ring, split in shapes
    }  # fmt: skip


def dense_cases():
    for m in DENSE_M[:4] if QUICK else DENSE_M:
        yield "nvfp4", m
    for m in () if QUICK else MX_M:
        yield "mxfp4", m


def main(rounds: int):
    timer = Timer()
    torch.manual_seed(0)
    for fmt, m in dense_cases():
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        qw = cutegemm.quantize(w, fmt)
        w16 = dequantize_checked(qw)
        x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
        data = qw.data.view(torch.float32)
        runs = {
            "base": lambda x=x, w16=w16: x @ w16.T,
            "policy": lambda x=x, qw=qw: cutegemm.gemm(x, qw),
            "kernel": lambda x=x, qw=qw, c=api.pick_config(m, fmt, torch.bfloat16, "sm_90a", False): api.gemm_fp4_weight(x, qw, config=c),
            "dq": lambda x=x, qw=qw: gemm(x, dequantize_checked(qw).mT),
            "read": lambda data=data: data.sum(),
        }
        for name, cfg in wg_configs(fmt, m, False).items():
            runs[name] = lambda x=x, qw=qw, cfg=cfg: api.gemm_fp4_weight(x, qw, config=cfg)
        report(f"{fmt} dense {m}x{N}x{K}", runs, timer, rounds, 2.0 * m * N * K)
    for e, tok in GROUPED[:1] if QUICK else GROUPED:
        n, k = 4096, 7168
        counts, offs, qw, w16, x = quantized_moe(e, tok, n, k, "nvfp4")
        data = qw.data.view(torch.float32)
        runs = {
            "base": lambda x=x, w16=w16, offs=offs: torch._grouped_mm(x, w16.transpose(1, 2), offs=offs),
            "policy": lambda x=x, qw=qw, offs=offs: cutegemm.grouped_gemm(x, qw, offs=offs),
            "kernel": lambda x=x, qw=qw, offs=offs, c=api.pick_config(sum(counts), "nvfp4", torch.bfloat16, "sm_90a", True, e):
                api.gemm_fp4_weight(x, qw, offs=offs, config=c),  # fmt: skip
            "dq": lambda x=x, qw=qw, offs=offs: grouped_gemm(x, dequantize_checked(qw).transpose(1, 2), offs=offs),
            "read": lambda data=data: data.sum(),
        }
        for name, cfg in wg_configs("nvfp4", tok, True).items():
            runs[name] = lambda x=x, qw=qw, offs=offs, cfg=cfg: api.gemm_fp4_weight(x, qw, offs=offs, config=cfg)
        report(f"nvfp4 grouped E{e} x ~{tok} N{n} K{k}", runs, timer, rounds, 2.0 * sum(counts) * n * k)
        del w16


report = report_vs_base


if __name__ == "__main__":
    if "--list" in sys.argv:
        for fmt, m in dense_cases():
            print(repr(api.pick_config(m, fmt, torch.bfloat16, "sm_90a", False)))
            for cfg in wg_configs(fmt, m, False).values():
                print(repr(cfg))
        # the dequantize-first path's bf16 GEMMs
        from cutegemm.epilogue import EpilogueSpec
        from cutegemm.gemm.config import GemmProblem
        from cutegemm.gemm.policy import policy_for

        pol = policy_for("sm_90a", 132)
        for m in DENSE_M:
            print(repr(pol.choose_dense(GemmProblem(m, N, K, 1, "bf16", "bf16", "bf16", "k", "k"))))
        for e, tok in GROUPED:
            for cfg in wg_configs("nvfp4", tok, True).values():
                print(repr(cfg))
            p = GemmProblem(sum(_moe_counts(e, tok)), 4096, 7168, 1, "bf16", "bf16", "bf16", "k", "k")
            print(repr(pol.choose_grouped(p, e, epilogue=EpilogueSpec())))
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 2)
