"""A/B of FP4 / MXFP8-weight WGMMA-consumer variants at prefill sizes, H200. Per case, one
process, same operands, write flush, best of ROUNDS interleaved L2-cold medians of 30, µs:
``base`` cuBLAS bf16 / ``torch._grouped_mm`` on the dequantized weight, ``policy`` the library's
routing, ``dq`` the dequantize-first path forced, then ``pick_config``'s WGMMA config with each VARIANT's fields replaced.

    python tools/wg_ab.py ROUNDS FMTS MS GROUPED_ROWS 'name=field=v,field=v' ...
    e.g. python tools/wg_ab.py 2 nvfp4,mxfp8 64,128,256 64,256 't128pwg=n_tiles=16,ring=2,producer_wg=True'
    (``k128=1`` / ``k256=1``: 128 / 256 K per ring stage, ring_k 1 / 2 for FP4, 2 / 4 for MXFP8)
    WG_AB_SKIP=policy,dq leaves those runs out (e.g. to spare the dequantize path's compiles).
"""

import os
import sys
from dataclasses import replace

import torch
from probe_common import quantized_moe, report_vs_base

import cutegemm
from cutegemm.benchmarks import Timer
from cutegemm.blockscaled import fp4_weight_api as api
from cutegemm.blockscaled.dequant import dequantize_checked
from cutegemm.grouped.api import grouped_gemm

N, K = 28672, 4096
SKIP = set(os.environ.get("WG_AB_SKIP", "").split(",")) - {"base"}


def variants(cfg, specs):
    out = {}
    for spec in specs:
        name, _, fields = spec.partition("=")
        kw = {f.split("=")[0]: eval(f.split("=")[1]) for f in fields.split(",") if f}  # noqa: S307
        if kw.pop("k128", False):  # 128 K per ring stage in either format
            kw["ring_k"] = 2 if cfg.fmt == "mxfp8" else 1
        if kw.pop("k256", False):  # 256 K per ring stage
            kw["ring_k"] = 4 if cfg.fmt == "mxfp8" else 2
        if cfg.grouped:
            kw.pop("split", None)
        try:
            out[name] = replace(cfg, **kw)
        except ValueError as exc:  # e.g. more shared memory than an SM has
            print(f"  skip {name}: {exc}")
    return out


def dense_case(fmt, qw, w16, m, specs, timer, rounds):
    x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
    cfg = api.pick_config(m, fmt, torch.bfloat16, "sm_90a", False)
    runs = {"base": lambda: x @ w16.t(), "policy": lambda: cutegemm.gemm(x, qw),
            "pick": lambda: api.gemm_fp4_weight(x, qw, config=cfg),
            "dq": lambda: api._dequantized(x, qw, None, None, None, 1.0, None)}  # fmt: skip
    for name, c in variants(cfg, specs).items():
        runs[name] = lambda c=c: api.gemm_fp4_weight(x, qw, config=c)
    runs = {name: fn for name, fn in runs.items() if name not in SKIP}
    report_vs_base(f"{fmt} dense M={m} ({cfg.name})", runs, timer, rounds, 2.0 * m * N * K)


def grouped_case(fmt, tok, specs, timer, rounds):
    counts, offs, gq, g16, x = quantized_moe(32, tok, 4096, 7168, fmt)
    cfg = api.pick_config(x.shape[0], fmt, torch.bfloat16, "sm_90a", True, 32)
    b = g16.transpose(1, 2)
    runs = {"base": lambda: torch._grouped_mm(x, b, offs=offs), "policy": lambda: grouped_gemm(x, gq, offs=offs),
            "pick": lambda: api.gemm_fp4_weight(x, gq, offs=offs, config=cfg),
            "dq": lambda: api._dequantized(x, gq, offs, None, None, 1.0, None)}  # fmt: skip
    for name, c in variants(cfg, specs).items():
        runs[name] = lambda c=c: api.gemm_fp4_weight(x, gq, offs=offs, config=c)
    runs = {name: fn for name, fn in runs.items() if name not in SKIP}
    report_vs_base(f"{fmt} grouped E=32 ~{tok} ({cfg.name})", runs, timer, rounds, 2.0 * x.shape[0] * 4096 * 7168)


def main():
    rounds, fmts, ms, gr = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3], sys.argv[4]
    specs = sys.argv[5:]
    timer = Timer()
    for fmt in fmts:
        torch.manual_seed(0)
        qw = cutegemm.quantize(torch.randn(N, K, device="cuda", dtype=torch.bfloat16), fmt)
        w16 = dequantize_checked(qw)
        for m in [int(v) for v in ms.split(",") if v]:
            dense_case(fmt, qw, w16, m, specs, timer, rounds)
        for tok in [int(v) for v in gr.split(",") if v]:
            grouped_case(fmt, tok, specs, timer, rounds)


if __name__ == "__main__":
    main()
