"""FP8 row-wise promoted: the policy's tiles with and without ``split_promote`` (and 128-column
tiles with longer runs), dense and grouped, in one process beside torch (``--set`` picks the
shapes). Usage: python tools/sp_probe.py [--set dense|grouped|all]"""

from __future__ import annotations

import argparse

from cutegemm.benchmarks_scaled import bench_fp8, bench_grouped_fp8

p = argparse.ArgumentParser()
p.add_argument("--set", default="all")
args = p.parse_args()
if args.set in ("dense", "all"):
    bench_fp8(
        shapes=[(8192, 8192, 8192), (16384, 7168, 2048), (4096, 4096, 4096)],
        configs=[dict(split_promote=1), dict(tile_n=128), dict(tile_n=128, split_promote=4),
                 dict(tile_n=128, split_promote=2)],
    )  # fmt: skip
if args.set in ("grouped", "all"):
    bench_grouped_fp8(
        shapes=((32, 512, 4096, 7168), (32, 512, 7168, 2048)),
        configs=[dict(split_promote=1), dict(tile_n=128, split_promote=4), dict(tile_n=128),
                 dict(split_promote=1, scheduler="static")],
    )  # fmt: skip
