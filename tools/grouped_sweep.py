"""Time grouped configs on the MoE benchmark shapes (used to set Sm90Policy.choose_grouped).

    python tools/grouped_sweep.py [--list] [--set NAME]
        --list: print the candidate configs' reprs (for tools/precompile.py) and exit
        --set: which candidate list (default: the first one)
"""

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cutegemm.gemm.config import GemmConfig  # noqa: E402

CANDS_ROUND1 = [
    dict(tile_m=128, tile_n=256, cluster_n=2, scheduler="dynamic"),
    dict(tile_m=128, tile_n=256, cluster_n=2, scheduler="dynamic", epi_stages=4),
    dict(tile_m=128, tile_n=256, cluster_n=2),
    dict(tile_m=128, tile_n=192, cluster_n=2),
    dict(tile_m=128, tile_n=128, cluster_n=2),
    dict(tile_m=128, tile_n=128, pingpong=True, cluster_n=2),
    dict(tile_m=64, tile_n=256, pingpong=True, cluster_n=2),
    dict(tile_m=64, tile_n=256, pingpong=True),
    dict(tile_m=64, tile_n=256, pingpong=True, cluster_m=2),
    dict(tile_m=64, tile_n=192, pingpong=True, cluster_n=2),
    dict(tile_m=64, tile_n=128, pingpong=True, cluster_n=2),
    dict(tile_m=64, tile_n=128, cluster_n=2, scheduler="dynamic"),
]

# Round 2 (2026-11-30): 2x1 clusters (B multicast over two m-tiles of one expert) with the stage
# counts of the automatic epilogue ring.
CANDS_CLUSTER_M = [
    dict(tile_m=128, tile_n=256, cluster_n=2, scheduler="dynamic"),
    dict(tile_m=128, tile_n=256, cluster_m=2, scheduler="dynamic"),
    dict(tile_m=128, tile_n=256, cluster_m=2),
    dict(tile_m=128, tile_n=256, cluster_m=2, cluster_n=2, scheduler="dynamic"),
    dict(tile_m=128, tile_n=192, cluster_m=2, scheduler="dynamic"),
    dict(tile_m=128, tile_n=128, cluster_m=2, scheduler="dynamic"),
    dict(tile_m=128, tile_n=128, pingpong=True, cluster_m=2),
    dict(tile_m=64, tile_n=256, pingpong=True, cluster_m=2),
    dict(tile_m=64, tile_n=128, pingpong=True, cluster_m=2),
    dict(tile_m=64, tile_n=128, cluster_m=2, scheduler="dynamic"),
]
# Round 3 (2026-11-30, fifth session; the row skip it was for was reverted, bench/RESULTS.md): with
# a warpgroup whose rows all lie past the expert's end issuing no WGMMAs, would a 2x1 cluster's
# mostly empty second m-tile cost less? (No.)
CANDS_SKIP = CANDS_CLUSTER_M[:5] + [dict(tile_m=128, tile_n=192, cluster_n=2, scheduler="dynamic")]
SETS = {"round1": CANDS_ROUND1, "cluster_m": CANDS_CLUSTER_M, "skip": CANDS_SKIP}
CANDS = SETS[sys.argv[sys.argv.index("--set") + 1]] if "--set" in sys.argv else CANDS_ROUND1


def configs():
    base = GemmConfig(arch="sm_90a", grouped=True, b_major="k", raster="m", group=1)
    return [replace(base, **c) for c in CANDS]


if __name__ == "__main__":
    if "--list" in sys.argv:
        for c in configs():
            print(repr(c))
        sys.exit(0)
    import torch

    from cutegemm import gemm
    from cutegemm.benchmarks import GROUPED_NAMES, GROUPED_SHAPES, Timer, _moe_counts
    from cutegemm.grouped import grouped_gemm

    timer = Timer()
    for (e, tok, n, k), label in zip(GROUPED_SHAPES, GROUPED_NAMES, strict=True):
        counts = _moe_counts(e, tok)
        a = torch.randn(sum(counts), k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
        fl = 2.0 * sum(counts) * n * k
        tt = timer(lambda a=a, b=b, offs=offs: torch._grouped_mm(a, b, offs=offs), 20)
        print(f"== {label} E{e} tok{tok} N{n} K{k}: torch {fl / tt / 1e9:.1f} TFLOP/s ({tt:.4f} ms)", flush=True)
        # The same work as E equal dense GEMMs (batched, our policy): what grouping costs.
        a3 = torch.randn(e, tok, k, device="cuda", dtype=torch.bfloat16)
        td = timer(lambda a3=a3, b=b: gemm(a3, b), 20)
        print(f"   dense batched L={e} M={tok}: {2.0 * e * tok * n * k / td / 1e9:.1f} TFLOP/s ({td:.4f} ms)", flush=True)
        del a3
        best = None
        for cfg in configs():
            try:
                t = timer(lambda cfg=cfg, a=a, b=b, offs=offs: grouped_gemm(a, b, offs=offs, config=cfg), 20)
            except Exception as exc:
                print(f"   FAILED {cfg.name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            best = min(best or (t, cfg.name), (t, cfg.name))
            print(f"   {fl / t / 1e9:7.1f} TFLOP/s {tt / t:5.2f}x {cfg.name}", flush=True)
        print(f"   best: {tt / best[0]:.2f}x {best[1]}", flush=True)
        del a, b
