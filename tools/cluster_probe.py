"""Persistent grids of 4-CTA clusters: how many such clusters the GPU runs at once
(``gemm.api.resident_clusters``), and grouped / dense GEMMs with 2x2 clusters launched with that
grid against the old one (SMs // 4 clusters), one process, interleaved rounds.

    python tools/cluster_probe.py [ROUNDS]
"""

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import importlib  # noqa: E402

import torch  # noqa: E402
from probe_common import moe_operands  # noqa: E402

gapi = importlib.import_module("cutegemm.gemm.api")  # cutegemm.gemm is also a function's name
grapi = importlib.import_module("cutegemm.grouped.api")
from cutegemm.benchmarks import GROUPED_NAMES, GROUPED_SHAPES, Timer  # noqa: E402
from cutegemm.gemm.config import GemmConfig  # noqa: E402
from cutegemm.grouped import grouped_gemm  # noqa: E402

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
sms = torch.cuda.get_device_properties(0).multi_processor_count
for size in (1, 2, 4, 8):
    print(f"cluster size {size}: {gapi.resident_clusters(0, size)} resident clusters (SMs // size = {sms // size})", flush=True)
new_grid = gapi.max_clusters_for


def old_grid(cfg, device, num_sms=None):
    return max(1, sms // (cfg.cluster_m * cfg.cluster_n))


def use(grid):
    gapi.max_clusters_for = grapi.max_clusters_for = grid
    gapi._PLANS.clear()
    grapi._PLANS.clear()


timer = Timer()
base = GemmConfig(arch="sm_90a", grouped=True, b_major="k", tile_m=128, tile_n=256, raster="m", group=1)
cands = [("1x2 dynamic (policy)", dict(cluster_n=2, scheduler="dynamic")), ("2x2 dynamic", dict(cluster_m=2, cluster_n=2, scheduler="dynamic")),
         ("2x2 static", dict(cluster_m=2, cluster_n=2, scheduler="static"))]  # fmt: skip
for (e, tok, n, k), label in zip(GROUPED_SHAPES, GROUPED_NAMES, strict=True):
    if label not in ("Mixtral up", "DeepSeek-V3 up"):
        continue
    a, b, offs, fl = moe_operands(e, tok, n, k)
    ref = grouped_gemm(a, b, offs=offs, config=replace(base, **cands[0][1]))
    times = {}
    for _ in range(rounds):
        times.setdefault("torch", []).append(timer(lambda a=a, b=b, offs=offs: torch._grouped_mm(a, b, offs=offs), 20))
        for gname, grid in (("resident grid", new_grid), ("SMs // 4 grid", old_grid)):
            use(grid)
            for cname, over in cands:
                if gname != "resident grid" and "2x2" not in cname:
                    continue
                cfg = replace(base, **over)
                out = grouped_gemm(a, b, offs=offs, config=cfg)
                assert torch.equal(out, ref) or (out - ref).abs().max().item() < 1e-2, cname
                times.setdefault(f"{cname}, {gname}", []).append(
                    timer(lambda cfg=cfg, a=a, b=b, offs=offs: grouped_gemm(a, b, offs=offs, config=cfg), 20))
    use(new_grid)
    print(f"== {label}: TFLOP/s per round", flush=True)
    for name, ts in times.items():
        print(f"   {' '.join(f'{fl / t / 1e9:7.1f}' for t in ts)}  {name}", flush=True)
    del a, b
