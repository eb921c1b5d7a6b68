"""Dense split K at decode-sized M (``GemmConfig.split_k``): tiles x split counts beside the
policy's config and torch.matmul (cuBLAS), rounds interleaved (median of 30 L2-cold reps each),
plus a correctness line per config: max |ours - fp64 reference| against torch's own error, and
whether two calls give the same bits.

    python tools/split_k_probe.py [ROUNDS] [--fp8]
"""

import sys
from dataclasses import replace

import torch
from probe_common import interleaved_rounds

from cutegemm.benchmarks import Timer, _dense_inputs
from cutegemm.gemm.api import gemm
from cutegemm.gemm.config import GemmConfig, GemmProblem
from cutegemm.gemm.policy import short_a_box

SHAPES = ((1, 4096, 7168), (16, 4096, 7168), (32, 4096, 7168), (64, 4096, 7168), (128, 4096, 7168),
          (16, 7168, 2048), (64, 7168, 2048), (128, 7168, 2048), (16, 28672, 4096), (128, 28672, 4096),
          (16, 2048, 7168), (96, 1536, 7168))  # fmt: skip
BASE = GemmConfig(arch="sm_90a", a_major="k", b_major="k", raster="n", group=1)
CANDS = [  # split candidates take the policy's short A box where M allows one
    None,
    dict(tile_m=64, tile_n=64, split_k=2),
    dict(tile_m=64, tile_n=128, split_k=2),
    dict(tile_m=64, tile_n=128, split_k=4),
    dict(tile_m=128, tile_n=64, split_k=2),
    dict(tile_m=128, tile_n=64, split_k=4),
]


def main(rounds: int, fp8: bool):
    timer = Timer()
    for m, n, k in SHAPES:
        a, b = _dense_inputs(m, n, k, torch.bfloat16, "k")
        kw = {}
        if fp8:
            a, b = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
            sa = torch.rand(m, 1, device="cuda") + 0.5
            sb = torch.rand(1, n, device="cuda") + 0.5
            kw = dict(scale_a=sa.view(-1), scale_b=sb.view(-1))
            ref = (a.double() @ b.double()) * sa.double() * sb.double()
            runs = {"torch": lambda a=a, b=b, sa=sa, sb=sb: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)}
        else:
            ref = a.double() @ b.double()
            runs = {"torch": lambda a=a, b=b: torch.matmul(a, b)}
        t_err = (runs["torch"]().double() - ref).abs().max().item()
        base = replace(BASE, a_dtype="e4m3", b_dtype="e4m3") if fp8 else BASE
        for c in CANDS:
            cfg = None if c is None else replace(base, **c)
            if cfg is not None:
                cfg = short_a_box(cfg, GemmProblem(m, n, k, 1, cfg.a_dtype, cfg.b_dtype, "bf16", "k", "k"))
            name = "policy" if c is None else cfg.name
            try:
                o1 = gemm(a, b, config=cfg, **kw)
                o2 = gemm(a, b, config=cfg, **kw)
            except ValueError as exc:
                print(f"   skipped {name}: {exc}", flush=True)
                continue
            err = (o1.double() - ref).abs().max().item()
            print(f"   {m}x{n}x{k} {name}: max err {err:.4g} (torch {t_err:.4g}), repeat bitwise "
                  f"{torch.equal(o1, o2)}", flush=True)  # fmt: skip
            runs[name] = lambda a=a, b=b, cfg=cfg, kw=kw: gemm(a, b, config=cfg, **kw)
        times = interleaved_rounds(timer, runs, rounds)
        print(f"== {m}x{n}x{k}{' fp8' if fp8 else ''}: us per round", flush=True)
        for name, ts in times.items():
            print(f"   {' '.join(f'{t * 1e3:7.2f}' for t in ts)}  x torch {min(times['torch']) / min(ts):5.2f}  {name}",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 2, "--fp8" in sys.argv)
