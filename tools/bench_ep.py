"""Tokens/s of one expert-parallel MoE layer forward on N GPUs vs the same layer on one GPU.

STATUS: run once on 2 H200s (2026-11-29, small layer; numbers in bench/RESULTS.md).

    python tools/bench_ep.py --gpus 2 [--tokens 8192 --experts 64 --hidden 4096 --inter 1536 --topk 8]

- 1 GPU: ``moe_single_device`` (all experts local, cutegemm grouped GEMM, no communication) on
  ``tokens`` tokens.
- N GPUs: ``ExpertParallelMoE`` with every rank holding ``tokens`` tokens of its own (weak scaling:
  N * tokens tokens per step); tokens/s = N * tokens / (slowest rank's time per step).
  The step includes the counts exchange, the one host read of the split sizes, both token
  exchanges and the combine.
Routing is uniform random top-k (distinct experts per token). NCCL_NVLS_ENABLE=0 is set for every
rank. Timing: CUDA events around ``iters`` forwards after ``warmup`` forwards, per rank; the
reported time is the max over ranks (all_reduce MAX).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def _routing(tokens, experts, topk, hidden, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(device, dtype)
    idx = torch.rand(tokens, experts, generator=g).argsort(1)[:, :topk].to(device)
    w = torch.randn(tokens, topk, generator=g).softmax(-1).to(device)
    return x, idx, w


def _time(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters  # seconds per forward


def _rank_main(rank, world, port, cfg, q):
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NCCL_NVLS_ENABLE": "0"})
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    try:
        from cutegemm.parallel import ExpertParallelMoE

        dev = torch.device("cuda", rank)
        model = ExpertParallelMoE(cfg["experts"], cfg["hidden"], cfg["inter"], dtype=torch.bfloat16, device=dev)
        x, idx, w = _routing(cfg["tokens"], cfg["experts"], cfg["topk"], cfg["hidden"], torch.bfloat16, dev, 1 + rank)
        with torch.no_grad():
            t = _time(lambda: model(x, idx, w), cfg["warmup"], cfg["iters"])
        tt = torch.tensor([t], device=dev)
        dist.all_reduce(tt, op=dist.ReduceOp.MAX)
        if rank == 0:
            q.put(float(tt))
    finally:
        dist.destroy_process_group()


def bench_expert_parallel(num_gpus=2, tokens=8192, experts=64, hidden=4096, inter=1536, topk=8, warmup=5, iters=20):
    """Returns {"1gpu_tokens_per_s", "ngpu_tokens_per_s", "speedup", ...}. NOT YET RUN (see the
    module docstring)."""
    from cutegemm.nn import GroupedExperts
    from cutegemm.parallel import moe_single_device

    if torch.cuda.device_count() < num_gpus:
        raise RuntimeError(f"needs {num_gpus} GPUs, found {torch.cuda.device_count()}")
    cfg = dict(tokens=tokens, experts=experts, hidden=hidden, inter=inter, topk=topk, warmup=warmup, iters=iters)

    single = GroupedExperts(experts, hidden, inter, dtype=torch.bfloat16, device="cuda:0")
    x, idx, w = _routing(tokens, experts, topk, hidden, torch.bfloat16, "cuda:0", 1)
    with torch.no_grad():
        t1 = _time(lambda: moe_single_device(x, idx, w, single), warmup, iters)
    single = x = idx = w = None  # free the baseline's memory before the ranks start
    torch.cuda.empty_cache()

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_rank_main, args=(r, num_gpus, port, cfg, q)) for r in range(num_gpus)]
    for p in procs:
        p.start()
    try:
        tn = q.get(timeout=600)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    res = dict(cfg, num_gpus=num_gpus, t_1gpu_s=t1, t_ngpu_s=tn,
               **{"1gpu_tokens_per_s": tokens / t1, "ngpu_tokens_per_s": num_gpus * tokens / tn})  # fmt: skip
    res["speedup"] = res["ngpu_tokens_per_s"] / res["1gpu_tokens_per_s"]
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=8192, help="tokens per rank (and on the 1-GPU baseline)")
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--inter", type=int, default=1536)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args(argv)
    res = bench_expert_parallel(args.gpus, args.tokens, args.experts, args.hidden, args.inter, args.topk,
                                iters=args.iters)  # fmt: skip
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
