"""Interleaved A/B of grouped configs on the issue-4 MoE shapes: every round times each config
once (median of 20, L2 flushed), so drift in clock or temperature hits all configs alike.

    python tools/tile_ab.py [ROUNDS]
"""

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from cutegemm.benchmarks import GROUPED_NAMES, GROUPED_SHAPES, Timer, _moe_counts  # noqa: E402
from cutegemm.gemm.config import GemmConfig  # noqa: E402
from cutegemm.grouped import grouped_gemm  # noqa: E402

CANDS = [
    dict(tile_m=128, tile_n=256, cluster_n=2, scheduler="dynamic"),  # the policy (> 64 rows)
    dict(tile_m=128, tile_n=192, cluster_n=2, scheduler="dynamic"),
    dict(tile_m=128, tile_n=128, cluster_n=2, scheduler="dynamic"),
]
SHAPES = ("Qwen3-30B-A3B", "DeepSeek-V3 down", "DeepSeek-V3 up")

if __name__ == "__main__":
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    timer = Timer()
    base = GemmConfig(arch="sm_90a", grouped=True, b_major="k", raster="m", group=1)
    cfgs = [replace(base, **c) for c in CANDS]
    for (e, tok, n, k), label in zip(GROUPED_SHAPES, GROUPED_NAMES, strict=True):
        if label not in SHAPES:
            continue
        counts = _moe_counts(e, tok)
        a = torch.randn(sum(counts), k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
        fl = 2.0 * sum(counts) * n * k
        times = {c.name: [] for c in cfgs}
        times["torch"] = []
        for _ in range(rounds):
            times["torch"].append(timer(lambda a=a, b=b, offs=offs: torch._grouped_mm(a, b, offs=offs), 20))
            for c in cfgs:
                times[c.name].append(timer(lambda c=c, a=a, b=b, offs=offs: grouped_gemm(a, b, offs=offs, config=c), 20))
        print(f"== {label}: TFLOP/s per round", flush=True)
        for name, ts in times.items():
            print(f"   {' '.join(f'{fl / t / 1e9:7.1f}' for t in ts)}  {name}", flush=True)
        del a, b
