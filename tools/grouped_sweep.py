"""Time grouped configs on the MoE benchmark shapes (used to set Sm90Policy.choose_grouped)."""
from dataclasses import replace

import torch

from cutegemm.benchmarks import GROUPED_SHAPES, Timer, _moe_counts
from cutegemm.gemm.config import GemmConfig
from cutegemm.grouped import grouped_gemm

CANDS = [
    dict(tile_m=128, tile_n=256),
    dict(tile_m=128, tile_n=256, cluster_n=2),
    dict(tile_m=128, tile_n=128, pingpong=True, cluster_n=2),
    dict(tile_m=128, tile_n=128),
    dict(tile_m=64, tile_n=256),
    dict(tile_m=64, tile_n=128, cluster_n=2),
]
timer = Timer()
for e, tok, n, k in [GROUPED_SHAPES[0], GROUPED_SHAPES[2], GROUPED_SHAPES[4]]:
    counts = _moe_counts(e, tok)
    a = torch.randn(sum(counts), k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    fl = 2.0 * sum(counts) * n * k
    tt = timer(lambda: torch._grouped_mm(a, b, offs=offs), 20)
    print(f"== E{e} tok{tok} N{n} K{k}: torch {fl / tt / 1e9:.1f}", flush=True)
    for c in CANDS:
        cfg = replace(GemmConfig(arch="sm_90a", grouped=True, b_major="k", raster="m", group=1), **c)
        t = timer(lambda cfg=cfg: grouped_gemm(a, b, offs=offs, config=cfg), 20)
        print(f"   {fl / t / 1e9:7.1f} TFLOP/s {tt / t:5.2f}x {cfg.name}", flush=True)
