"""Command line: ``python -m cutegemm {bench,compile-check,plot}``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def cmd_compile_check(args) -> int:
    from .compile_check import main

    return main([a.strip() for a in args.arch.split(",") if a.strip()])


def cmd_bench(args) -> int:
    if not _has_gpu():
        print("No CUDA GPU here: running compile-check for sm_90a and sm_100a instead of the benchmark.")
        args.arch = "sm_90a,sm_100a"
        return cmd_compile_check(args)
    import torch

    from . import benchmarks

    outdir = Path(args.out)
    families = ["dense", "grouped"] if args.family == "all" else [args.family]
    for fam in families:
        if fam == "dense":
            rows = benchmarks.bench_dense(reps=args.reps)
            path = benchmarks.write_results(rows, f"dense_{torch.cuda.get_device_name().replace(' ', '_')}", outdir)
            print(benchmarks.markdown_table(rows, f"dense bf16 on {torch.cuda.get_device_name()}"))
            print(f"results: {path}")
        elif fam == "grouped":
            rows = benchmarks.bench_grouped(reps=args.reps)
            path = benchmarks.write_results(rows, f"grouped_{torch.cuda.get_device_name().replace(' ', '_')}", outdir)
            print(benchmarks.markdown_table(rows, f"grouped bf16 on {torch.cuda.get_device_name()} (vs torch._grouped_mm)"))
            print(f"results: {path}")
        elif fam == "sweep":
            from .tuning import sweep_dense

            sweep_dense(reps=args.reps)
    return 0


def cmd_plot(args) -> int:
    from .benchmarks import plot

    out = plot(Path(args.json))
    print(out or "no plot written")
    return 0 if out else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m cutegemm")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench", help="benchmark vs torch on a GPU (compile-check without one)")
    b.add_argument("family", nargs="?", default="dense", choices=["dense", "grouped", "sweep", "all"])
    b.add_argument("--reps", type=int, default=30)
    b.add_argument("--out", default="results")
    b.set_defaults(fn=cmd_bench)
    c = sub.add_parser("compile-check", help="compile every variant for each arch and check its SASS")
    c.add_argument("--arch", default="sm_90a,sm_100a")
    c.set_defaults(fn=cmd_compile_check)
    pl = sub.add_parser("plot", help="PNG from a results JSON")
    pl.add_argument("json")
    pl.set_defaults(fn=cmd_plot)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
