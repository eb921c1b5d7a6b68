"""Where the swapped grouped kernel stops paying: E=16 experts of ~256 / 1024 / 2048 Poisson
tokens (N4096 K7168, and N7168 K2048), the swapped 128x256 c2x1 tile against the plain 128x256
c1x2 tile (both dynamic) and torch._grouped_mm, one process, interleaved rounds.

    python tools/swap_thresh.py [ROUNDS]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from probe_common import moe_operands  # noqa: E402

from cutegemm.benchmarks import Timer  # noqa: E402
from cutegemm.gemm.config import GemmConfig  # noqa: E402
from cutegemm.grouped import grouped_gemm  # noqa: E402

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
timer = Timer()
plain = GemmConfig(arch="sm_90a", grouped=True, b_major="k", tile_m=128, tile_n=256, cluster_n=2, raster="m", group=1, scheduler="dynamic")
swap = GemmConfig(arch="sm_90a", grouped=True, b_major="k", tile_m=128, tile_n=256, cluster_m=2, raster="m", group=1, scheduler="dynamic",
                  swap_ab=True)  # fmt: skip
for tok in (256, 1024, 2048):
    for n, k in ((4096, 7168), (7168, 2048)):
        a, b, offs, fl = moe_operands(16, tok, n, k)
        ref = grouped_gemm(a, b, offs=offs, config=plain)
        assert torch.equal(grouped_gemm(a, b, offs=offs, config=swap), ref)
        times = {}
        for _ in range(rounds):
            times.setdefault("torch._grouped_mm", []).append(timer(lambda a=a, b=b, offs=offs: torch._grouped_mm(a, b, offs=offs), 20))
            for name, cfg in (("plain 128x256 c1x2", plain), ("swap 128x256 c2x1", swap)):
                times.setdefault(name, []).append(timer(lambda a=a, b=b, offs=offs, cfg=cfg: grouped_gemm(a, b, offs=offs, config=cfg), 20))
        print(f"== E16 x ~{tok} N{n} K{k}: TFLOP/s per round", flush=True)
        for name, ts in times.items():
            print(f"   {' '.join(f'{fl / t / 1e9:7.1f}' for t in ts)}  {name}", flush=True)
        del a, b
