"""Dense bf16 at M = 1..64 with the same 64x64 tile (one M tile): does the time follow the rows
that A's TMA box fills with zeros (rows past M)? L2-cold medians, torch.matmul beside.
``--big``: M = 64..128 with the 128x64 tile instead.

    python tools/oob_m_probe.py [--big]
"""

import sys

import torch

from cutegemm.benchmarks import Timer, _dense_inputs
from cutegemm.gemm.api import gemm
from cutegemm.gemm.config import GemmConfig

timer = Timer()
BIG = "--big" in sys.argv
cfg = GemmConfig(arch="sm_90a", a_major="k", b_major="k", raster="n", group=1, tile_m=128 if BIG else 64, tile_n=64)
for n, k in ((4096, 7168), (7168, 2048)):
    for m in (64, 80, 96, 112, 128) if BIG else (1, 8, 16, 32, 48, 64):
        a, b = _dense_inputs(m, n, k, torch.bfloat16, "k")
        t_ours = timer(lambda a=a, b=b: gemm(a, b, config=cfg), 30)
        t_torch = timer(lambda a=a, b=b: torch.matmul(a, b), 30)
        print(f"{m}x{n}x{k}: ours ({cfg.tile_m}x64, 3-D launch) {t_ours * 1e3:6.2f} us, torch {t_torch * 1e3:6.2f} us", flush=True)
