"""Tile/cluster sweep on a GPU: times candidate configs per shape (used to set the policy)."""

from __future__ import annotations

from dataclasses import replace

import torch

from .benchmarks import DENSE_SHAPES, Timer, _dense_inputs
from .gemm.api import TORCH_TO_NAME, _device_info, gemm
from .gemm.config import GemmProblem, can_implement
from .gemm.policy import policy_for

SM90_CANDIDATES = [
    dict(tile_m=128, tile_n=128, cluster_m=2, cluster_n=1, raster="m", group=8, pingpong=True),
    dict(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2, raster="m", group=8, pingpong=True),
    dict(tile_m=128, tile_n=128, cluster_m=2, cluster_n=1, raster="n", group=8, pingpong=True),
    dict(tile_m=64, tile_n=256, cluster_m=2, cluster_n=1, raster="m", group=8, pingpong=True),
    dict(tile_m=128, tile_n=64, cluster_m=1, cluster_n=1, raster="n", group=1, pingpong=True),
    dict(tile_m=128, tile_n=64, cluster_m=1, cluster_n=2, raster="n", group=1, pingpong=True),
    dict(tile_m=128, tile_n=64, cluster_m=1, cluster_n=2, raster="n", group=1),
    dict(tile_m=128, tile_n=64, cluster_m=1, cluster_n=4, raster="n", group=1),
    dict(tile_m=128, tile_n=256, cluster_m=2, cluster_n=1, raster="m", group=8),
    dict(tile_m=128, tile_n=256, cluster_m=1, cluster_n=2, raster="m", group=8),
    dict(tile_m=128, tile_n=256, cluster_m=2, cluster_n=1, raster="n", group=8),
    dict(tile_m=128, tile_n=256, cluster_m=1, cluster_n=1, raster="m", group=8),
    dict(tile_m=128, tile_n=192, cluster_m=2, cluster_n=1, raster="m", group=8),
    dict(tile_m=128, tile_n=128, cluster_m=2, cluster_n=1, raster="m", group=8),
    dict(tile_m=128, tile_n=128, cluster_m=1, cluster_n=1, raster="m", group=8),
    dict(tile_m=64, tile_n=128, cluster_m=1, cluster_n=1, raster="n", group=1),
    dict(tile_m=64, tile_n=256, cluster_m=1, cluster_n=1, raster="n", group=1),
    dict(tile_m=128, tile_n=64, cluster_m=1, cluster_n=1, raster="n", group=1),
    dict(tile_m=64, tile_n=128, cluster_m=1, cluster_n=2, raster="n", group=1),
]


def sweep_dense(shapes=DENSE_SHAPES, dtype=torch.bfloat16, reps=20):
    timer = Timer()
    arch, sms = _device_info(torch.cuda.current_device())
    pol = policy_for(arch, sms)
    name = TORCH_TO_NAME[dtype]
    for m, n, k in shapes:
        a, b = _dense_inputs(m, n, k, dtype)
        base = pol.choose(GemmProblem(m, n, k, 1, name, name, name, "k", "k"))
        t_torch = timer(lambda a=a, b=b: torch.matmul(a, b), reps)
        flops = 2.0 * m * n * k
        print(f"== {m}x{n}x{k}: torch {flops / t_torch / 1e9:.1f} TFLOP/s; policy picks {base.name}", flush=True)
        best = None
        for cand in SM90_CANDIDATES:
            cfg = replace(base, **cand)
            if not can_implement(cfg)[0]:
                continue
            try:
                t = timer(lambda a=a, b=b, cfg=cfg: gemm(a, b, config=cfg), reps)
            except Exception as exc:
                print(f"   {cfg.name}: FAILED {type(exc).__name__}: {str(exc)[:200]}")
                continue
            tf = flops / t / 1e9
            print(f"   {tf:7.1f} TFLOP/s {t_torch / t:5.2f}x  {cfg.name}", flush=True)
            if best is None or t < best[0]:
                best = (t, cfg)
        if best:
            print(f"   best: {flops / best[0] / 1e9:.1f} TFLOP/s ({t_torch / best[0]:.2f}x) {best[1].name}")
