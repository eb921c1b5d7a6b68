"""Clusters of 4 CTAs beside the policy's pick (bf16, sm_90a): the sweep's layers with K >= KMIN at
the given token counts, each timed as the pick, the pick's tile in 1x4 and in 2x2 clusters, and
torch.matmul, in one process: 3 interleaved rounds of 8 L2-flushed reps, CUDA-event medians; prints
torch time / ours per config and checks every variant's output bitwise against the pick's. The
data a cluster-of-4 rule of the wave model would be fitted on (bench/RESULTS.md, "Clusters of 4").
Writes $OUT/cluster4.json (or ./cluster4.json).

    python tools/cluster4_ab.py 384,640,896,1152 [KMIN=7168]
"""

import json
import os
import statistics
import sys
from dataclasses import replace

import torch

import cutegemm
from cutegemm.bench import layers as L
from cutegemm.config import GemmProblem, can_implement, config_errors
from cutegemm.policy import policy_for
from cutegemm.runtime.timer import Timer


def variants(pick, p):
    """{"pick": pick, "1x4": ..., "2x2": ...}: the pick's tile in clusters of 4 where they run."""
    out = {"pick": pick}
    if pick.split_k != 1 or pick.pingpong:
        return out
    for label, (cm, cn) in (("1x4", (1, 4)), ("2x2", (2, 2))):
        alt = replace(pick, cluster_m=cm, cluster_n=cn, raster="m" if cn >= cm else "n",
                      group=1 if pick.tile_m == 64 else pick.group)  # fmt: skip
        if alt != pick and not config_errors(alt) and can_implement(alt, p)[0]:
            out[label] = alt
    return out


def time_shape(timer, m, n, k, cfgs):
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
    fns = {"torch": lambda: torch.matmul(a, b)}
    first = cutegemm.gemm(a, b, config=cfgs["pick"])
    for label, cfg in cfgs.items():
        if not torch.equal(cutegemm.gemm(a, b, config=cfg), first):
            print(f"   {label} {cfg.name}: NOT bitwise equal to the pick")
        fns[label] = lambda cfg=cfg: cutegemm.gemm(a, b, config=cfg)
    times = {label: [] for label in fns}
    for r in range(3):
        for label in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            times[label].append(timer(fns[label], 8))
    return {label: statistics.median(v) for label, v in times.items()}


def main(ms, kmin):
    pol, timer, rows = policy_for("sm_90a", 132), Timer(), []
    for family, name, n, k in L.LAYERS:
        if k < kmin:
            continue
        for m in ms:
            p = GemmProblem(m, n, k, 1, "bf16", "bf16", "bf16", "k", "k")
            cfgs = variants(pol.choose(p), p)
            if len(cfgs) == 1:
                continue
            med = time_shape(timer, m, n, k, cfgs)
            print(f"{family} {name} {m}x{n}x{k}: " + "  ".join(
                f"{lb} {c.tile_m}x{c.tile_n} {c.cluster_m}x{c.cluster_n} {med['torch'] / med[lb]:.3f}"
                for lb, c in cfgs.items()), flush=True)  # fmt: skip
            rows.append(dict(m=m, n=n, k=k, torch_ms=med["torch"], **{lb: (c.name, med[lb]) for lb, c in cfgs.items()}))
    with open(os.path.join(os.environ.get("OUT", "."), "cluster4.json"), "w") as f:
        json.dump(rows, f)


if __name__ == "__main__":
    main([int(v) for v in sys.argv[1].split(",")], int(sys.argv[2]) if len(sys.argv) > 2 else 7168)
