"""Four-CTA clusters, now that persistent grids hold only the clusters that fit (30 of 4 on the
H200): FP8 row-wise grouped / dense and bf16 dense beside the policies and torch, one process.

    python tools/cluster4_probe.py
"""

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from cutegemm.benchmarks import bench_dense  # noqa: E402
from cutegemm.benchmarks_scaled import bench_fp8, bench_grouped_fp8  # noqa: E402
from cutegemm.gemm.config import GemmConfig  # noqa: E402

bench_grouped_fp8(
    shapes=((32, 512, 4096, 7168), (32, 512, 7168, 2048)),
    configs=[dict(cluster_m=2, cluster_n=2, scheduler="static"), dict(cluster_m=2, cluster_n=2),
             dict(cluster_n=4, tile_n=128, scheduler="static"), dict(cluster_n=4, tile_n=128)],
)  # fmt: skip
bench_fp8(shapes=[(8192, 8192, 8192), (16384, 7168, 2048)],
          configs=[dict(cluster_m=2, cluster_n=2), dict(cluster_m=4, cluster_n=1), dict(cluster_m=1, cluster_n=4)])  # fmt: skip
base = GemmConfig(arch="sm_90a", b_major="k", tile_m=128, tile_n=256, raster="n", group=8)
for over in (dict(cluster_m=2, cluster_n=1), dict(cluster_m=2, cluster_n=2), dict(cluster_m=4, cluster_n=1)):
    cfg = replace(base, **over)
    print(f"-- bf16 dense {cfg.name}", flush=True)
    bench_dense(shapes=[(8192, 8192, 8192), (16384, 7168, 2048)], config_for=lambda m, n, k, cfg=cfg: cfg)
torch.cuda.synchronize()
