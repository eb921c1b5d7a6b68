"""One launch each, for ncu --profile-from-start off: the grouped policy kernel and swapped
(``swap_ab``) configs on DeepSeek-V3 up and Qwen3-30B-A3B (``tools/swap_probe.py``'s shapes).

    ncu --clock-control none --profile-from-start off --metrics ... python tools/swap_profile.py
"""

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from probe_common import moe_operands, profile_each  # noqa: E402

from cutegemm.benchmarks import GROUPED_NAMES, GROUPED_SHAPES  # noqa: E402
from cutegemm.gemm.config import GemmConfig  # noqa: E402
from cutegemm.grouped import grouped_gemm  # noqa: E402

base = GemmConfig(arch="sm_90a", grouped=True, b_major="k", tile_m=128, tile_n=256, raster="m", group=1, scheduler="dynamic")
policy = replace(base, cluster_n=2, swap_ab=False)
swap = [replace(base, swap_ab=True, tile_n=192, cluster_m=2), replace(base, swap_ab=True, tile_n=256, cluster_m=2)]
jobs = []
for (e, tok, n, k), label in zip(GROUPED_SHAPES, GROUPED_NAMES, strict=True):
    if label not in ("DeepSeek-V3 up", "Qwen3-30B-A3B"):
        continue
    a, b, offs, _ = moe_operands(e, tok, n, k)
    for cfg in (policy, *swap):
        jobs.append((f"{label} {cfg.name}", lambda a=a, b=b, offs=offs, cfg=cfg: grouped_gemm(a, b, offs=offs, config=cfg)))
profile_each(jobs)
