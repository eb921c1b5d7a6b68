"""Command line: ``python -m cutegemm {bench,compile-check,plot,tune}`` (``bench host``: host time per
warm call of every public path beside torch's)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from . import compile_check, tuning
from .bench import core as benchmarks
from .bench import host as host_bench
from .bench import layers as layer_sweep
from .bench import moe as moe_bench
from .bench import scaled
from .bench import tune as tuner
from .bench.core import plot
from .bench.quantize import bench_quantize, quant_markdown_table, write_quant_results
from .bench.tune import sweep_dense


def _has_gpu() -> bool:
    return torch.cuda.is_available()


def cmd_compile_check(args) -> int:
    return compile_check.main([a.strip() for a in args.arch.split(",") if a.strip()])


def cmd_bench(args) -> int:
    if args.family == "host":  # host time per warm call: needs a GPU, says so without one
        return host_bench.main(calls=args.calls)
    if not _has_gpu():
        print("No CUDA GPU here: running compile-check for sm_90a and sm_100a instead of the benchmark.")
        args.arch = "sm_90a,sm_100a"
        return cmd_compile_check(args)

    outdir = Path(args.out)
    gpu = torch.cuda.get_device_name()
    # family -> (bench function, result-file prefix, table title) for the Row-table families
    tables = {
        "dense": (benchmarks.bench_dense, "dense", f"dense bf16 on {gpu}"),
        "grouped": (benchmarks.bench_grouped, "grouped", f"grouped bf16 on {gpu} (vs torch._grouped_mm)"),
        "fp4w": (scaled.bench_fp4_weight, "fp4w", f"FP4 / MXFP8 weight x bf16 on {gpu}"),
        "fp8blocks": (scaled.bench_fp8_blocks, "fp8blocks", f"FP8 1x128 x 1x128 / 128x128 x 1x128 on {gpu}"),
    }
    families = ["dense", "grouped"] if args.family == "all" else [args.family]
    for fam in families:
        if fam in tables:
            bench, prefix, title = tables[fam]
            rows = bench(reps=args.reps)
            path = benchmarks.write_results(rows, f"{prefix}_{gpu.replace(' ', '_')}", outdir)
            print(benchmarks.markdown_table(rows, title))
            print(f"results: {path}")
        elif fam == "quantize":
            rows = bench_quantize(reps=args.reps)
            print(quant_markdown_table(rows, f"quantize (bf16 input) on {gpu}"))
            print(f"results: {write_quant_results(rows, outdir)}")
        elif fam == "sweep":  # real-model layers x M, bf16 and FP8 row-wise / per-tensor, vs torch
            m_values = tuple(int(v) for v in args.m_values.split(",")) if args.m_values else layer_sweep.M_VALUES
            kinds = tuple(args.kinds.split(",")) if args.kinds else layer_sweep.KINDS
            if not set(kinds) <= set(layer_sweep.ALL_KINDS):
                raise SystemExit(f"--kinds: choose from {','.join(layer_sweep.ALL_KINDS)}, got {args.kinds}")
            results = layer_sweep.sweep(kinds=kinds, m_values=m_values, out=outdir / "sweep")
            print(layer_sweep.markdown(results))
            print(f"results: {outdir / 'sweep'}")
        elif fam == "moe":  # the MoE expert layer, fwd and fwd+bwd: torch, cutegemm, transformers backend, SonicMoE
            shapes, impls = moe_bench.select_shapes(args.shapes), moe_bench.select_impls(args.impls)
            results = moe_bench.bench_moe(shapes, impls, rounds=args.rounds, reps=args.reps, out=outdir / "moe")
            print(moe_bench.markdown(results))
            print(f"results: {outdir / 'moe'}")
        elif fam == "tiles":  # every sm_90a tile candidate on the dense benchmark shapes (or --shapes)
            m_values = [int(v) for v in args.m_values.split(",")] if args.m_values else None
            shapes = (_parse_shapes(args.shapes, 3) if args.shapes else layer_sweep.layer_shapes(m_values) if m_values
                      else benchmarks.DENSE_SHAPES)  # fmt: skip
            sweep_dense(shapes, reps=args.reps, rounds=args.rounds if args.m_values or args.shapes else 1, out=outdir / "tiles")
    return 0


def _parse_shapes(text: str, fields: int) -> list[tuple[int, ...]]:
    shapes = []
    for item in text.split(","):
        dims = tuple(int(x) for x in item.lower().strip().split("x"))
        if len(dims) != fields:
            raise SystemExit(f"bad shape {item!r}: expected {fields} numbers joined by 'x'")
        shapes.append(dims)
    return shapes


def cmd_tune(args) -> int:
    """Tune a list of shapes now (regardless of CUTEGEMM_AUTOTUNE) and persist the winners."""
    if not _has_gpu():
        print("Tuning needs a CUDA GPU (it times kernels); none here: nothing tuned.")
        return 0

    if args.family == "dense":
        shapes = _parse_shapes(args.shapes, 3) if args.shapes else benchmarks.DENSE_SHAPES
        jobs = [
            (f"{m}x{n}x{k}", lambda m=m, n=n, k=k: tuner.tune_dense(m, n, k, reps=args.reps))
            for m, n, k in shapes
        ]
    else:  # grouped: ExMxNxK, M = total rows over all E experts
        shapes = _parse_shapes(args.shapes, 4) if args.shapes else [
            (e, e * tok, n, k) for e, tok, n, k in benchmarks.GROUPED_SHAPES
        ]  # fmt: skip
        jobs = [
            (f"E{e} {m}x{n}x{k}", lambda e=e, m=m, n=n, k=k: tuner.tune_grouped(m, n, k, e, reps=args.reps))
            for e, m, n, k in shapes
        ]
    for label, job in tuning.progress(jobs, f"tune {args.family}"):
        res = job()
        speed = f"{res.speedup:.2f}x the default" if res.speedup else "the default failed"
        print(f"{label:>24}: {res.winner_ms:.4f} ms, {speed} | {res.winner.name}", flush=True)
    print(f"records: {tuning.tuning_file()}")
    return 0


def cmd_plot(args) -> int:
    out = plot(Path(args.json))
    print(out or "no plot written")
    return 0 if out else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m cutegemm")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench", help="benchmark vs torch on a GPU (compile-check without one)")
    b.add_argument("family", nargs="?", default="dense",
                   choices=["dense", "grouped", "quantize", "fp4w", "fp8blocks", "sweep", "moe", "tiles", "host", "all"])
    b.add_argument("--reps", type=int, default=30)
    b.add_argument("--calls", type=int, default=1000, help="host: back-to-back calls per timing")
    b.add_argument("--out", default="results")
    b.add_argument("--shapes", default="",
                   help="moe: shape names (substrings, comma separated); tiles: MxNxK,...; default all")
    b.add_argument("--impls", default="", help="moe: torch,cutegemm,cutegemm-hf,sonicmoe (torch always runs)")
    b.add_argument("--rounds", type=int, default=4, help="moe, tiles (with --shapes or --m-values): interleaved rounds")
    b.add_argument("--m-values", default="",
                   help="sweep: token counts M, comma separated (default 1,16,64,128,512,1024,2048,8192); "
                        "tiles: the sweep's layers at these M")
    b.add_argument("--kinds", default="",
                   help="sweep: bf16,fp8,fp8t (fp8t: per-tensor FP8 vs torch's cuBLASLt path; default bf16,fp8)")
    b.set_defaults(fn=cmd_bench)
    c = sub.add_parser("compile-check", help="compile every variant for each arch and check its SASS")
    c.add_argument("--arch", default="sm_90a,sm_100a")
    c.set_defaults(fn=cmd_compile_check)
    pl = sub.add_parser("plot", help="PNG from a results JSON")
    pl.add_argument("json")
    pl.set_defaults(fn=cmd_plot)
    t = sub.add_parser("tune", help="autotune configs for shapes on a GPU and persist the winners")
    t.add_argument("family", nargs="?", default="dense", choices=["dense", "grouped"])
    t.add_argument("--shapes", default="", help="dense: MxNxK,... ; grouped: ExMxNxK,... (M = total rows)")
    t.add_argument("--reps", type=int, default=20)
    t.set_defaults(fn=cmd_tune)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
