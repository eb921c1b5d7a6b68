"""A/B of the working tree against a reference copy of the package, in one process, through the
public API (``gemm``, ``grouped_gemm``, ``quantize``): the same operands, rounds interleaved with
alternating order, L2 flushed before every rep, CUDA-event medians; torch's baseline timed in the
same rounds. Prints one row per case: reference, ours, torch (µs) and ours / reference.

    python tools/ab.py REF_PACKAGE_DIR [--families dense,grouped,fp4w,fp8,quantize] [--rounds 4]

REF_PACKAGE_DIR is a ``cutegemm`` package directory of another checkout (e.g. the previous main);
it is imported under the name ``cutegemm_ref`` (its kernel cache key is its own source hash).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path

import torch

import cutegemm
from cutegemm.runtime.timer import Timer

DENSE = [(8192, 8192, 8192), (4096, 4096, 4096), (16384, 7168, 2048), (2048, 4096, 7168), (128, 7168, 2048),
         (16, 4096, 7168)]
GROUPED = [("DeepSeek-V3 up", 32, 512, 4096, 7168), ("Qwen3-30B-A3B", 128, 128, 1536, 2048),
           ("Mixtral up", 8, 4096, 28672, 4096), ("decode", 32, 16, 4096, 7168)]
FP4W = [("nvfp4", 16), ("nvfp4", 512), ("nvfp4", 1024), ("mxfp4", 128), ("mxfp8", 16), ("mxfp8", 512)]


def load_ref(path: Path):
    spec = importlib.util.spec_from_file_location(
        "cutegemm_ref", path / "__init__.py", submodule_search_locations=[str(path)]
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["cutegemm_ref"] = mod
    spec.loader.exec_module(mod)
    return mod


def counts(experts: int, tokens: int) -> list[int]:
    gen = torch.Generator().manual_seed(0)
    lam = torch.full((experts,), float(tokens))
    return [int(round(c / 8.0)) * 8 for c in torch.poisson(lam, generator=gen).tolist()]


def cases(families, ref):
    """(family, label, {"ref": fn, "ours": fn, "torch": fn}) for every case of ``families``."""
    dev, bf = "cuda", torch.bfloat16
    torch.manual_seed(0)
    if "dense" in families:
        for m, n, k in DENSE:
            a = torch.randn(m, k, device=dev, dtype=bf)
            b = torch.randn(n, k, device=dev, dtype=bf).t()
            yield "dense", f"{m}x{n}x{k}", {"ref": lambda a=a, b=b: ref.gemm(a, b),
                                            "ours": lambda a=a, b=b: cutegemm.gemm(a, b),
                                            "torch": lambda a=a, b=b: torch.matmul(a, b)}
    if "grouped" in families:
        for name, e, tok, n, k in GROUPED:
            c = counts(e, tok)
            x = torch.randn(sum(c), k, device=dev, dtype=bf)
            w = torch.randn(e, n, k, device=dev, dtype=bf).transpose(1, 2)
            offs = torch.tensor(c, device=dev).cumsum(0).to(torch.int32)
            yield "grouped", name, {"ref": lambda x=x, w=w, o=offs: ref.grouped_gemm(x, w, offs=o),
                                    "ours": lambda x=x, w=w, o=offs: cutegemm.grouped_gemm(x, w, offs=o),
                                    "torch": lambda x=x, w=w, o=offs: torch._grouped_mm(x, w, offs=o)}
    if "fp4w" in families:
        n, k = 28672, 4096
        for fmt, m in FP4W:
            w = torch.randn(n, k, device=dev, dtype=bf)
            qw, qw_ref = cutegemm.quantize(w, fmt), ref.quantize(w, fmt)
            wd = cutegemm.dequantize(qw).to(bf)
            x = torch.randn(m, k, device=dev, dtype=bf)
            yield "fp4w", f"{fmt} {m}x{n}x{k}", {"ref": lambda x=x, q=qw_ref: ref.gemm(x, q),
                                                 "ours": lambda x=x, q=qw: cutegemm.gemm(x, q),
                                                 "torch": lambda x=x, w=wd: x @ w.T}
    if "fp8" in families:
        for m, n, k in ((8192, 8192, 8192), (128, 7168, 2048)):
            a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
            b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()
            sa, sb = torch.rand(m, 1, device=dev) + 0.5, torch.rand(1, n, device=dev) + 0.5
            yield "fp8", f"row-wise {m}x{n}x{k}", {
                "ref": lambda a=a, b=b, sa=sa, sb=sb: ref.gemm(a, b, scale_a=sa, scale_b=sb),
                "ours": lambda a=a, b=b, sa=sa, sb=sb: cutegemm.gemm(a, b, scale_a=sa, scale_b=sb),
                "torch": lambda a=a, b=b, sa=sa, sb=sb: torch._scaled_mm(a, b, sa, sb, out_dtype=bf)}
    if "quantize" in families:
        for fmt in ("mxfp8", "nvfp4"):
            x = torch.randn(16384, 7168, device=dev, dtype=bf)
            yield "quantize", f"{fmt} 16384x7168", {"ref": lambda x=x, f=fmt: ref.quantize(x, f),
                                                    "ours": lambda x=x, f=fmt: cutegemm.quantize(x, f),
                                                    "torch": lambda x=x: x.to(torch.float8_e4m3fn)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("ref", type=Path)
    p.add_argument("--families", default="dense,grouped,fp4w,fp8,quantize")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    ref = load_ref(args.ref.resolve())
    timer = Timer()
    print(f"{torch.cuda.get_device_name()}; reference {args.ref}; medians of {args.rounds} interleaved rounds "
          f"of {args.reps} L2-flushed reps (µs)")
    print("| family | case | reference | ours | torch | ours / ref (speed) | spread ref / ours |")
    print("|---|---|---|---|---|---|---|")
    ratios = []
    for fam, label, fns in cases(args.families.split(","), ref):
        for fn in fns.values():  # compile / warm every side first
            fn()
        torch.cuda.synchronize()
        t = {side: [] for side in fns}
        for r in range(args.rounds):
            order = list(fns) if r % 2 == 0 else list(reversed(fns))
            for side in order:
                t[side].append(timer(fns[side], reps=args.reps, warmup=2) * 1e3)
        med = {side: statistics.median(v) for side, v in t.items()}
        spread = {side: (max(v) - min(v)) / med[side] for side, v in t.items()}
        ratio = med["ref"] / med["ours"]  # > 1: ours is faster
        ratios.append(ratio)
        print(f"| {fam} | {label} | {med['ref']:.1f} | {med['ours']:.1f} | {med['torch']:.1f} | "
              f"{ratio:.3f} | {spread['ref']:.1%} / {spread['ours']:.1%} |", flush=True)
    geo = statistics.geometric_mean(ratios) if ratios else float("nan")
    print(f"geomean speed ours / reference: {geo:.3f} over {len(ratios)} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
