"""Autotuning and the policy sweep on the current GPU: ``python -m cutegemm tune`` and
``python -m cutegemm bench tiles`` (the records and the timing loop: ``cutegemm.tuning``)."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

import torch

from ..api.face import gemm
from ..config import EpilogueSpec, GemmProblem, can_implement
from ..gemm.dense import dense_runner
from ..gemm.launch import TORCH_TO_NAME
from ..grouped.packed import grouped_runner
from ..policy import policy_for, short_a_box
from ..runtime.device import device_info
from ..runtime.timer import Timer
from ..tuning import TuneResult, tune
from .core import DENSE_SHAPES, dense_inputs


def _current_arch() -> tuple[str, int]:
    return device_info(torch.cuda.current_device())


def tune_dense(
    m: int,
    n: int,
    k: int,
    dtype=torch.bfloat16,
    *,
    l: int = 1,
    out_dtype=None,
    a_major: str = "k",
    b_major: str = "k",
    epilogue: EpilogueSpec = EpilogueSpec(),
    reps: int = 20,
    persist: bool = True,
) -> TuneResult:
    """Tune ``gemm`` for an (L,) M x K @ K x N problem on the current GPU. b_major="k": b is a
    transposed (N, K) weight (nn.Linear); "n": row-major (K, N)."""
    arch, sms = _current_arch()
    name, out = TORCH_TO_NAME[dtype], TORCH_TO_NAME[out_dtype or dtype]
    p = GemmProblem(m, n, k, l, name, name, out, a_major, b_major)
    return tune(arch, "dense", p, epilogue, runner=dense_runner, num_sms=sms, reps=reps, persist=persist)


def tune_grouped(
    total_m: int,
    n: int,
    k: int,
    num_groups: int,
    dtype=torch.bfloat16,
    *,
    out_dtype=None,
    b_major: str = "k",
    alpha: bool = False,
    reps: int = 20,
    persist: bool = True,
) -> TuneResult:
    """Tune the packed ``grouped_gemm`` (a (total_m, K), b (E, K, N), offs) on the current GPU.
    b_major="k": b is ``w.transpose(1, 2)`` of an (E, N, K) weight."""
    arch, sms = _current_arch()
    name, out = TORCH_TO_NAME[dtype], TORCH_TO_NAME[out_dtype or dtype]
    p = GemmProblem(total_m, n, k, 1, name, name, out, "k", b_major)
    epi = EpilogueSpec(alpha=alpha)
    return tune(arch, "grouped", p, epi, runner=grouped_runner, num_groups=num_groups, num_sms=sms, reps=reps,
                persist=persist)


# ---------------------------------------------------------------------------------------------- policy sweep

SM90_CANDIDATES = [
    dict(tile_m=128, tile_n=128, cluster_m=2, cluster_n=1, raster="m", group=8, pingpong=True),
    dict(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2, raster="m", group=8, pingpong=True),
    dict(tile_m=128, tile_n=128, cluster_m=2, cluster_n=1, raster="n", group=8, pingpong=True),
    dict(tile_m=64, tile_n=256, cluster_m=2, cluster_n=1, raster="m", group=8, pingpong=True),
    # 128x192 pingpong (16-bit, light epilogues): 2048 x 7168 x 16384 0.626 ms against 128x256 2x1's
    # 0.655 (H100), 30% slower where there are few tiles; not yet a wave-model candidate
    dict(tile_m=128, tile_n=192, cluster_m=2, cluster_n=1, raster="n", group=8, pingpong=True),
    # 64-row pingpong tiles: three times as many tiles as 128x192 where N is a multiple of 192
    # (N = 576: 8192 x 576 is 384 tiles of 64x192, 2.9 waves on 132 SMs, against 1.45 of 128x192;
    # H200: 0.84-0.86x cuBLAS there against 128x160 2x1's 0.87, and slower on the other worst shapes)
    dict(tile_m=64, tile_n=192, cluster_m=2, cluster_n=1, raster="m", group=8, pingpong=True),
    dict(tile_m=64, tile_n=192, cluster_m=1, cluster_n=1, raster="n", group=1, pingpong=True),
    dict(tile_m=64, tile_n=160, cluster_m=2, cluster_n=1, raster="m", group=8, pingpong=True),
    dict(tile_m=128, tile_n=64, cluster_m=1, cluster_n=1, raster="n", group=1, pingpong=True),
    dict(tile_m=128, tile_n=64, cluster_m=1, cluster_n=2, raster="n", group=1, pingpong=True),
    dict(tile_m=128, tile_n=64, cluster_m=1, cluster_n=2, raster="n", group=1),
    dict(tile_m=128, tile_n=64, cluster_m=1, cluster_n=4, raster="n", group=1),
    dict(tile_m=128, tile_n=256, cluster_m=2, cluster_n=1, raster="m", group=8),
    dict(tile_m=128, tile_n=256, cluster_m=1, cluster_n=2, raster="m", group=8),
    dict(tile_m=128, tile_n=256, cluster_m=2, cluster_n=1, raster="n", group=8),
    dict(tile_m=128, tile_n=256, cluster_m=1, cluster_n=1, raster="m", group=8),
    dict(tile_m=128, tile_n=192, cluster_m=2, cluster_n=1, raster="m", group=8),
    dict(tile_m=128, tile_n=128, cluster_m=2, cluster_n=1, raster="m", group=8),
    dict(tile_m=128, tile_n=128, cluster_m=1, cluster_n=1, raster="m", group=8),
    dict(tile_m=64, tile_n=128, cluster_m=1, cluster_n=1, raster="n", group=1),
    dict(tile_m=64, tile_n=256, cluster_m=1, cluster_n=1, raster="n", group=1),
    dict(tile_m=128, tile_n=64, cluster_m=1, cluster_n=1, raster="n", group=1),
    dict(tile_m=64, tile_n=128, cluster_m=1, cluster_n=2, raster="n", group=1),
    # K cut into 2 / 4 ranges (split_k: cooperative, 1x1 cluster, static): the layers whose output
    # tiles fill less than a wave or leave a short last one (bench sweep's waves column)
    # (128x256 with 4 ranges spills registers: not a candidate)
    *(dict(tile_m=128, tile_n=tn, cluster_m=1, cluster_n=1, raster="n", group=1, split_k=sk)
      for tn, sk in ((64, 2), (64, 4), (128, 2), (128, 4), (160, 2), (160, 4), (192, 2), (192, 4), (256, 2),
                     # ranges that are not a power of two: units that fill a wave where 2 and 4 do not
                     (64, 3), (128, 3), (128, 6), (160, 3), (192, 3), (192, 5), (192, 6))),
    # decode-sized M (64-row tiles, memory-bound): more K ranges than split_few_tiles takes (2),
    # through the workspace or, up to 8 ranges of 64x64, shared memory (split_cluster): the
    # layers with very few output tiles (N = 576: 9 tiles of 64x64 on 132 SMs)
    *(dict(tile_m=64, tile_n=tn, cluster_m=1, cluster_n=1, raster="n", group=1, split_k=sk, split_cluster=sc)
      for tn, sk, sc in ((64, 2, True), (64, 4, False), (64, 4, True), (64, 8, False), (64, 8, True),
                         (128, 2, False), (128, 4, False), (128, 8, False))),
    # split K of the last wave only (split_tail): whole waves unsplit, the part-filled last one in
    # 2 or 3 ranges (the wave model's fields: 1x1, M-major raster)
    *(dict(tile_m=128, tile_n=tn, cluster_m=1, cluster_n=1, raster="m", group=8, split_k=sk, split_tail=True)
      for tn, sk in ((128, 2), (160, 2), (192, 2), (160, 3), (192, 3))),
    # 128x160: whole waves where N is a multiple of 5 x 1024 (the wave model's tile for M > 128)
    dict(tile_m=128, tile_n=160, cluster_m=2, cluster_n=1, raster="n", group=8),
    dict(tile_m=128, tile_n=160, cluster_m=1, cluster_n=1, raster="n", group=1),
    # 128x96 / 64x96: one wave where N = 1536 at M = 1024 / 512 (cuBLAS's tiles there, ncu:
    # 128x96 in 1x2 clusters, their 2x1 in the transposed view; 64x96 1x2, and 2x4 at 1024 x 576)
    dict(tile_m=128, tile_n=96, cluster_m=1, cluster_n=1, raster="n", group=1),
    dict(tile_m=128, tile_n=96, cluster_m=2, cluster_n=1, raster="n", group=8),
    dict(tile_m=128, tile_n=96, cluster_m=1, cluster_n=2, raster="m", group=8),
    dict(tile_m=64, tile_n=96, cluster_m=1, cluster_n=1, raster="n", group=1),
    dict(tile_m=64, tile_n=96, cluster_m=1, cluster_n=2, raster="n", group=1),
    dict(tile_m=64, tile_n=96, cluster_m=2, cluster_n=1, raster="n", group=1),
    dict(tile_m=64, tile_n=96, cluster_m=2, cluster_n=2, raster="n", group=1),
    # 128x224 (whole waves where 128x256 part-fills its last) and the 1x2 clusters the wave model
    # takes over an odd count of 3 to 9 M tiles (policy.odd_m_pairs_n)
    dict(tile_m=128, tile_n=224, cluster_m=2, cluster_n=1, raster="n", group=8),
    dict(tile_m=128, tile_n=224, cluster_m=1, cluster_n=2, raster="m", group=8),
    dict(tile_m=128, tile_n=192, cluster_m=1, cluster_n=2, raster="m", group=8),
    dict(tile_m=128, tile_n=160, cluster_m=1, cluster_n=2, raster="m", group=8),
    # clusters of 4 (the kernel's limit): cuBLAS runs 4x1 / 4x2 / 2x4 clusters where K is long and M
    # small (ncu, bench/RESULTS.md "The worst cases under ncu"); the policy weighs pairs only
    *(dict(tile_m=tm, tile_n=tn, cluster_m=cm, cluster_n=cn, raster="m" if cn > 1 else "n", group=8 if tm > 64 else 1)
      for tm, tn in ((64, 128), (128, 128), (128, 192)) for cm, cn in ((2, 2), (1, 4), (4, 1))),
    # 192-row tiles (three consumer warpgroups): one wave where 128-row tiles leave a short one
    # (cuBLAS's 192x192 at 8192 x 576)
    *(dict(tile_m=192, tile_n=tn, cluster_m=cm, cluster_n=cn, raster="m", group=8)
      for tn, cm, cn in ((96, 1, 1), (128, 1, 1), (128, 2, 1), (128, 1, 2), (160, 1, 1), (192, 1, 1), (192, 2, 1),
                         (192, 1, 2))),
]


def tile_candidates(pol, p: GemmProblem) -> list:
    """The policy's pick for ``p``, then every SM90_CANDIDATES variant of its base config that
    can run ``p``, distinct; decode-sized M (<= 128): each with A's short box where it takes one
    (policy.short_a_box), as the policy's own configs."""
    base, out = pol.choose(p), []
    for cfg in [pol.choose_dense(p), *(replace(base, **{"split_k": 1, "split_cluster": False, "split_tail": False, **c})
                                       for c in SM90_CANDIDATES)]:
        if p.m <= 128:
            cfg = short_a_box(cfg, p)
        if cfg not in out and can_implement(cfg, p)[0]:
            out.append(cfg)
    return out


def sweep_dense(shapes=DENSE_SHAPES, dtype=torch.bfloat16, reps=20, rounds: int = 1, out=None):
    """Print the time of the policy's pick and of every other :func:`tile_candidates` config per
    shape, beside torch.matmul's (sets the policy by hand): the median over ``rounds`` interleaved
    rounds (each in the other order than the last) of ``reps`` L2-flushed reps; ``out``: a
    directory to which every shape's times go as one JSON line (tiles.jsonl)."""
    timer = Timer()
    arch, sms = device_info(torch.cuda.current_device())
    pol = policy_for(arch, sms)
    name = TORCH_TO_NAME[dtype]
    log = None
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        log = open(Path(out) / "tiles.jsonl", "a")  # noqa: SIM115 (closed below)
    for m, n, k in shapes:
        a, b = dense_inputs(m, n, k, dtype)
        cfgs = tile_candidates(pol, GemmProblem(m, n, k, 1, name, name, name, "k", "k"))
        calls = [("torch", lambda a=a, b=b: torch.matmul(a, b))]
        for cfg in cfgs:
            try:
                gemm(a, b, config=cfg)
            except Exception as exc:
                print(f"   {cfg.name}: FAILED {type(exc).__name__}: {str(exc)[:200]}")
                continue
            calls.append((cfg.name, lambda a=a, b=b, cfg=cfg: gemm(a, b, config=cfg)))
        times = {label: [] for label, _ in calls}
        for r in range(rounds):
            for label, fn in calls if r % 2 == 0 else calls[::-1]:
                times[label].append(timer(fn, reps))
        med = {label: statistics.median(v) for label, v in times.items()}
        t_torch, flops = med.pop("torch"), 2.0 * m * n * k
        print(f"== {m}x{n}x{k}: torch {flops / t_torch / 1e9:.1f} TFLOP/s ({t_torch * 1e3:.1f} us); "
              f"policy picks {cfgs[0].name}", flush=True)  # fmt: skip
        for label, t in med.items():
            print(f"   {flops / t / 1e9:7.1f} TFLOP/s {t * 1e3:8.1f} us {t_torch / t:5.2f}x  {label}", flush=True)
        if med:
            best = min(med, key=med.get)
            print(f"   best: {flops / med[best] / 1e9:.1f} TFLOP/s ({t_torch / med[best]:.2f}x) {best}")
        if log is not None:
            log.write(json.dumps(dict(m=m, n=n, k=k, pick=cfgs[0].name, torch_ms=t_torch, ms=med,
                                      spread={lb: (min(v), max(v)) for lb, v in times.items()})) + "\n")  # fmt: skip
            log.flush()
    if log is not None:
        log.close()
