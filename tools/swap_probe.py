"""Swapped grouped GEMM (``GemmConfig.swap_ab``: tokens along the WGMMA's N, the last tile of an
expert cut to its real tokens) against the policy's kernel and torch._grouped_mm on the issue-4
MoE shapes, one process, interleaved rounds. Checks each output against the policy's first.

    python tools/swap_probe.py [ROUNDS] [SHAPE_INDEX ...]
"""

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from probe_common import moe_operands  # noqa: E402

from cutegemm.benchmarks import GROUPED_NAMES, GROUPED_SHAPES, Timer  # noqa: E402
from cutegemm.gemm.config import GemmConfig  # noqa: E402
from cutegemm.grouped import grouped_gemm  # noqa: E402

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
only = [int(x) for x in sys.argv[2:]] or list(range(len(GROUPED_SHAPES)))
timer = Timer()
base = GemmConfig(arch="sm_90a", grouped=True, swap_ab=True, b_major="k", tile_m=128, tile_n=256, raster="m", group=1,
                  scheduler="dynamic")  # fmt: skip
cands = [
    ("swap 128x256 c2x1 dynamic", dict(cluster_m=2)),
    ("swap 128x192 c2x1 dynamic", dict(cluster_m=2, tile_n=192)),
    ("swap 128x128 c2x1 dynamic", dict(cluster_m=2, tile_n=128)),
    ("swap 128x160 c1x1 dynamic", dict(tile_n=160)),
    ("swap 128x256 c1x1 dynamic", dict()),
]
for i, ((e, tok, n, k), label) in enumerate(zip(GROUPED_SHAPES, GROUPED_NAMES, strict=True)):
    if i not in only:
        continue
    a, b, offs, fl = moe_operands(e, tok, n, k)
    ref = grouped_gemm(a, b, offs=offs)
    scale = ref.float().abs().max().item()
    for cname, over in cands:
        out = grouped_gemm(a, b, offs=offs, config=replace(base, **over))
        err = (out.float() - ref.float()).abs().max().item()
        print(f"{label} {cname}: max |swap - policy| = {err:.3g} (|policy| max {scale:.3g}), bitwise {torch.equal(out, ref)}",
              flush=True)  # fmt: skip
        assert err <= 1e-2 * scale, (label, cname, err)
    times = {}
    for _ in range(rounds):
        times.setdefault("torch._grouped_mm", []).append(timer(lambda a=a, b=b, offs=offs: torch._grouped_mm(a, b, offs=offs), 20))
        times.setdefault("policy", []).append(timer(lambda a=a, b=b, offs=offs: grouped_gemm(a, b, offs=offs), 20))
        for cname, over in cands:
            cfg = replace(base, **over)
            times.setdefault(cname, []).append(timer(lambda cfg=cfg, a=a, b=b, offs=offs: grouped_gemm(a, b, offs=offs, config=cfg), 20))
    print(f"== {label} (E{e} x ~{tok}, N{n} K{k}): ms and TFLOP/s per round", flush=True)
    for name, ts in times.items():
        print(f"   {' '.join(f'{t:8.4f} ms {fl / t / 1e9:7.1f}' for t in ts)}  {name}", flush=True)
    del a, b
