"""Dense calls at M <= 128: an earlier policy (forced as a config) against the policy now and
torch (cuBLAS; FP8: torch._scaled_mm row-wise), rounds interleaved; each entry the best round's
L2-cold median of 30 (``--clean``: the flush's dirty lines written back first, see
``benchmarks.Timer``).

--before tile (default): the policy's tile with A's box of tile_m rows and no split K.
--before pow2: the 2026-12-01 third session's policy: 128x64 for 64 < M <= 128, A's box of a
power of two (8 / 16 / 32) only for M <= 32 in 64-row tiles, then split K as now (FP8: none).
--fp8: the FP8 row-wise shapes only.

    python tools/decode_policy_probe.py [ROUNDS] [--before tile|pow2] [--clean] [--fp8]
"""

import sys
from dataclasses import replace

import torch
from probe_common import interleaved_rounds

from cutegemm.benchmarks import Timer, _dense_inputs
from cutegemm.gemm.api import _device_info, gemm
from cutegemm.gemm.config import GemmProblem
from cutegemm.gemm.policy import policy_for, split_few_tiles

SHAPES = ((1, 4096, 7168), (16, 4096, 7168), (32, 4096, 7168), (40, 4096, 7168), (64, 4096, 7168),
          (72, 4096, 7168), (96, 4096, 7168), (128, 4096, 7168), (16, 7168, 2048), (96, 7168, 2048),
          (128, 7168, 2048), (16, 28672, 4096), (96, 28672, 4096), (128, 28672, 4096), (16, 2048, 7168),
          (72, 1536, 7168), (96, 1536, 7168), (1, 7168, 2048))  # fmt: skip
FP8_SHAPES = ((16, 4096, 7168), (1, 7168, 2048), (16, 28672, 4096), (32, 7168, 2048), (96, 7168, 2048),
              (128, 28672, 4096), (16, 2048, 7168), (96, 1536, 7168), (128, 4096, 7168))  # fmt: skip
BEFORE = sys.argv[sys.argv.index("--before") + 1] if "--before" in sys.argv else "tile"


def before_config(pol, p):
    """The earlier policy's config (see the module doc)."""
    cfg = pol.choose(p)
    if BEFORE == "tile":
        return cfg
    if 64 < p.m <= 128:
        cfg = replace(cfg, tile_n=64)
    box = next((r for r in (8, 16, 32) if r >= p.m), 0)
    if box and box < cfg.tile_m and cfg.a_dtype in ("bf16", "fp16", "e4m3"):
        cfg = replace(cfg, a_rows=box)
    return cfg if cfg.a_dtype == "e4m3" else split_few_tiles(cfg, p, pol.num_sms)  # FP8: no split then


def main(rounds: int):
    timer = Timer(clean="--clean" in sys.argv)
    arch, sms = _device_info(torch.cuda.current_device())
    pol = policy_for(arch, sms)
    for fp8 in (True,) if "--fp8" in sys.argv else (False, True):
        for m, n, k in FP8_SHAPES if fp8 else SHAPES:
            a, b = _dense_inputs(m, n, k, torch.bfloat16, "k")
            kw = {}
            name = "bf16"
            if fp8:
                a, b, name = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn), "e4m3"
                sa, sb = torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5
                kw = dict(scale_a=sa.view(-1), scale_b=sb.view(-1))
                runs = {"torch": lambda a=a, b=b, sa=sa, sb=sb: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)}
            else:
                runs = {"torch": lambda a=a, b=b: torch.matmul(a, b)}
            p = GemmProblem(m, n, k, 1, name, name, "bf16", "k", "k")
            old, new = before_config(pol, p), pol.choose_dense(p)
            runs["before"] = lambda a=a, b=b, old=old, kw=kw: gemm(a, b, config=old, **kw)
            runs["policy"] = lambda a=a, b=b, kw=kw: gemm(a, b, **kw)
            o1, o2 = runs["before"](), runs["policy"]()
            diff = (o1.float() - o2.float()).abs().max().item()
            times = interleaved_rounds(timer, runs, rounds)
            best = {r: min(ts) * 1e3 for r, ts in times.items()}
            print(f"{name} {m}x{n}x{k}: torch {best['torch']:6.2f} us | before {best['before']:6.2f} "
                  f"({best['torch'] / best['before']:.2f}x) | policy {best['policy']:6.2f} "
                  f"({best['torch'] / best['policy']:.2f}x) {new.name} | max |before - policy| {diff:.3g}",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 2)
