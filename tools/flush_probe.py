"""Dense calls at decode-sized M under both L2 flushes of ``benchmarks.Timer``: "write" (512 MB
written: the timed call finds ~60 MB of dirty lines to write back) and "clean" (the same
write, then a read of it: clean lines only). Per shape: torch (cuBLAS; FP8 torch._scaled_mm
row-wise), the policy's config, a few other tiles / split-K counts, and the time torch takes
to read the weight once (``b.sum()``); each entry the best of ROUNDS interleaved L2-cold
medians of 30.

    python tools/flush_probe.py [ROUNDS] [--set box|split|split8|cluster|cluster8] [--clean] [--list]
    (--list: the configs, for precompile)

--set box: M between the powers of two, A's TMA box of M rounded up to 16 rows (any tile).
--set split: few output tiles, split K 1 / 2 / 4 / 8 (split8: the same in FP8 row-wise).
--set cluster: the same shapes, split K 2 / 4 / 8 through the workspace ("ws") and through
distributed shared memory ("cl", ``split_cluster``), and the policy's split with the cluster
exchange (cluster8: FP8 row-wise). These sets time the "write" flush only (--clean: both).
"""

import sys
from dataclasses import replace

import torch
from probe_common import interleaved_rounds

from cutegemm.benchmarks import Timer, _dense_inputs
from cutegemm.gemm.api import gemm
from cutegemm.gemm.config import GemmProblem, a_rows_errors, a_rows_for, split_k_errors
from cutegemm.gemm.policy import policy_for

BF16 = ((1, 4096, 7168), (16, 4096, 7168), (64, 4096, 7168), (128, 4096, 7168), (16, 7168, 2048),
        (128, 7168, 2048), (16, 28672, 4096), (128, 28672, 4096), (96, 1536, 7168), (16, 2048, 7168))  # fmt: skip
FP8 = ((16, 4096, 7168), (128, 7168, 2048))
# --set box: M between the power-of-two boxes, A's box of M rounded up to 16 rows
BOX = ((40, 4096, 7168), (56, 4096, 7168), (72, 4096, 7168), (96, 4096, 7168), (112, 4096, 7168), (96, 1536, 7168),
       (72, 1536, 7168), (96, 7168, 2048), (48, 2048, 7168), (96, 28672, 4096))  # fmt: skip
BOX_FP8 = ((128, 28672, 4096), (96, 7168, 2048))
# --set split: calls with few output tiles, split K 1 / 2 / 4 / 8 in 64- / 128-wide tiles (boxed)
SPLIT = ((1, 7168, 2048), (16, 7168, 2048), (16, 2048, 7168), (16, 4096, 7168), (64, 4096, 7168), (128, 4096, 7168),
         (72, 1536, 7168), (96, 1536, 7168), (128, 7168, 2048))  # fmt: skip
SET = sys.argv[sys.argv.index("--set") + 1] if "--set" in sys.argv else "flush"
MODES = ("write", "clean") if SET == "flush" or "--clean" in sys.argv else ("write",)


def _ok(cfg):
    return not (a_rows_errors(cfg) if cfg.a_rows else []) and not (split_k_errors(cfg) if cfg.split_k > 1 else [])


def configs(p: GemmProblem):
    pol = policy_for("sm_90a", 132)
    base = pol.choose(p)
    out = {"policy": pol.choose_dense(p)}
    box = next((r for r in (8, 16, 32, 64) if r >= p.m), 0)
    if SET in ("cluster", "cluster8"):
        box8 = a_rows_for(p.m)
        pol = out["policy"]
        if pol.split_k > 1:
            out["policy cl"] = replace(pol, split_cluster=True)
        tm = 64 if p.m <= 64 else 128
        for tn in (64, 128):
            for sk in (2, 4, 8):
                cfg = replace(base, tile_m=tm, tile_n=tn, split_k=sk, a_rows=box8 if box8 < tm else 0, raster="n", group=1)
                out[f"{tm}x{tn} s{sk} ws"] = cfg
                out[f"{tm}x{tn} s{sk} cl"] = replace(cfg, split_cluster=True)
    elif SET in ("box", "split", "split8"):
        box8 = a_rows_for(p.m)
        pol_box = replace(out["policy"], a_rows=box8 if box8 < out["policy"].tile_m else 0)
        out["policy+box"] = pol_box
        tm = 64 if p.m <= 64 else 128
        for tn in (64, 128):
            for s in (1, 2, 4, 8) if SET.startswith("split") else (1, 2, 4):
                out[f"{tm}x{tn} s{s} box"] = replace(base, tile_m=tm, tile_n=tn, split_k=s, a_rows=box8 if box8 < tm else 0,
                                                   raster="n", group=1)  # fmt: skip
    elif p.m <= 64:
        for tn in (64, 128):
            for s in (1, 2, 4):
                cfg = replace(base, tile_m=64, tile_n=tn, split_k=s, a_rows=box if box < 64 else 0, raster="n", group=1)
                out[f"64x{tn} s{s}"] = cfg
    else:
        for tn in (64, 128):
            for s in (1, 2, 4):
                out[f"128x{tn} s{s}"] = replace(base, tile_m=128, tile_n=tn, split_k=s, raster="n", group=1)
        out["64x64 s2"] = replace(base, tile_m=64, tile_n=64, split_k=2, raster="n", group=1)
    seen, keep = set(), {}
    for name, cfg in out.items():
        if name == "policy" or (cfg not in seen and _ok(cfg)):
            keep[name] = cfg
            seen.add(cfg)
    return keep


def problems():
    shapes = {"flush": (BF16, FP8), "box": (BOX, BOX_FP8), "split": (SPLIT, ()), "split8": ((), SPLIT),
              "cluster": (SPLIT, ()), "cluster8": ((), SPLIT)}[SET]
    for fp8 in (False, True):
        name = "e4m3" if fp8 else "bf16"
        for m, n, k in shapes[fp8]:
            yield fp8, m, n, k, GemmProblem(m, n, k, 1, name, name, "bf16", "k", "k")


def main(rounds: int):
    timers = {mode: Timer(clean=mode == "clean") for mode in MODES}
    for fp8, m, n, k, p in problems():
        a, b = _dense_inputs(m, n, k, torch.bfloat16, "k")
        kw = {}
        if fp8:
            a, b = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
            sa, sb = torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5
            kw = dict(scale_a=sa.view(-1), scale_b=sb.view(-1))
            runs = {"torch": lambda a=a, b=b, sa=sa, sb=sb: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)}
            ref = runs["torch"]().float()
        else:
            runs = {"torch": lambda a=a, b=b: torch.matmul(a, b)}
            ref = (a.double() @ b.double()).float()
        runs["read b"] = lambda b=b, fp8=fp8: b.float().sum() if fp8 else b.sum()
        cfgs = configs(p)
        for name, cfg in cfgs.items():
            runs[name] = lambda a=a, b=b, cfg=cfg, kw=kw: gemm(a, b, config=cfg, **kw)
            err = (runs[name]().float() - ref).abs().max().item()
            if err > 1.0:
                print(f"  {name} {cfg.name}: max err {err:.3g} (check)", flush=True)
        wbytes = b.numel() * b.element_size()
        for mode, timer in timers.items():
            times = interleaved_rounds(timer, runs, rounds)
            best = {r: min(ts) * 1e3 for r, ts in times.items()}
            t0 = best["torch"]
            parts = " | ".join(f"{r} {t:6.2f}" + ("" if r in ("torch", "read b") else f" ({t0 / t:.2f}x)")
                               for r, t in best.items())  # fmt: skip
            print(f"{'e4m3' if fp8 else 'bf16'} {m}x{n}x{k} [{mode}] weight {wbytes / 1e6:.1f} MB = "
                  f"{wbytes / best['read b'] / 1e3:.0f} GB/s read | {parts}", flush=True)  # fmt: skip
        print(f"   policy: {cfgs['policy'].name}", flush=True)


if __name__ == "__main__":
    if "--list" in sys.argv:
        from cutegemm.epilogue import EpilogueSpec

        for fp8, _, _, _, p in problems():
            for cfg in configs(p).values():
                print(repr(replace(cfg, epilogue=EpilogueSpec(scale_a=True, scale_b=True)) if fp8 else cfg))
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 2)
