"""FP8 row-wise grouped DeepSeek-V3 up / down: tile orders inside an expert (bands of G m-tiles
walked along N) beside the policy (m fastest over the expert) and torch, one process.

    python tools/fp8_band_probe.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cutegemm.benchmarks_scaled import bench_grouped_fp8  # noqa: E402

bench_grouped_fp8(shapes=((32, 512, 4096, 7168), (32, 512, 7168, 2048)),
                  configs=[dict(raster="n", group=2), dict(raster="n", group=4), dict(raster="n", group=8), {}])  # fmt: skip
