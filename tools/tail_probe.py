"""tail_split (an expert's last m-tile with <= 64 rows split along K between the consumer
warpgroups) on the grouped FP8 row-wise DeepSeek-V3 shapes, beside the policy and torch in one
process, then the bf16 issue-4 shapes interleaved (tools/tile_ab.py --set tail).

    python tools/tail_probe.py [ROUNDS]
"""

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cutegemm.benchmarks_scaled import bench_grouped_fp8  # noqa: E402

rounds = sys.argv[1] if len(sys.argv) > 1 else "2"
bench_grouped_fp8(shapes=((32, 512, 4096, 7168), (32, 512, 7168, 2048)), configs=[dict(tail_split=True)])
subprocess.run([sys.executable, str(Path(__file__).parent / "tile_ab.py"), rounds, "--set", "tail"], check=True)
