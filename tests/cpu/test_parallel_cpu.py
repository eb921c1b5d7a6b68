"""CPU (gloo): the expert-parallel MoE layer on 2 and 4 spawned processes equals the single-process
reference (all experts in one process, same weights from a common seed), forward and gradients
(x, topk_weight and each rank's expert weights, against both single-process layers).

Routing covers experts with no tokens, a rank whose experts are never chosen (it receives no
tokens), ranks with no tokens of their own, duplicate experts within a token's top-k and an
all-empty step. Every process runs under a deadline and is killed if it outlives it, so a broken
exchange fails the test instead of hanging CI. ``run_ranks`` is shared with test_parallel_gpu.py.
"""

from __future__ import annotations

import os
import queue
import socket
import time
import traceback
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# cutegemm is imported inside the workers and tests only: spawned children import this module to
# find their target, and the harness test's children need nothing but torch.

HIDDEN, INTER = 32, 48
TOL = dict(atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------
# spawn harness


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn, rank, world, backend, port, q, env, pg_timeout_s):
    os.environ.update(env)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=pg_timeout_s))
        try:
            q.put((rank, True, fn(rank, world)))
        finally:
            dist.destroy_process_group()
    except BaseException:  # report everything, including assertion failures, to the parent
        q.put((rank, False, traceback.format_exc()))


def run_ranks(fn, world: int, backend: str = "gloo", *, timeout_s: float = 120.0, env=None):
    """Run ``fn(rank, world)`` in ``world`` spawned processes joined by one process group.
    Returns {rank: fn's return value}; raises AssertionError with the failing rank's traceback,
    or TimeoutError. All processes are gone when it returns."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    pg_timeout = max(10, int(timeout_s / 2))
    procs = [
        ctx.Process(target=_entry, args=(fn, r, world, backend, port, q, dict(env or {}), pg_timeout), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results, failures = {}, {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) + len(failures) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                if failures:  # the first failure's grace period is over
                    break
                raise TimeoutError(f"ranks {sorted(set(range(world)) - set(results))} did not finish in {timeout_s} s")
            try:
                rank, ok, payload = q.get(timeout=min(left, 1.0))
            except queue.Empty:
                for r, p in enumerate(procs):
                    if r not in results and r not in failures and p.exitcode not in (None, 0):
                        time.sleep(0.5)  # its report may still be in flight
                        failures.setdefault(r, f"process died with exit code {p.exitcode}")
                        deadline = min(deadline, time.monotonic() + 2.0)
                continue
            (results if ok else failures)[rank] = payload
            if not ok:
                # Give the other ranks a moment to report their own errors (the first failure is
                # often the cause of the others), then kill whatever is still blocked.
                deadline = min(deadline, time.monotonic() + 2.0)
    finally:
        for p in procs:
            p.join(timeout=10 if not failures else 0.1)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
        q.close()
    if failures:
        raise AssertionError("\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(failures.items())))
    return results


# --------------------------------------------------------------------------------------------
# routing and weights shared by every rank


def full_weights(num_experts, hidden, inter, seed, dtype=torch.float32, device="cpu"):
    """Every rank builds the full weight set from a common seed and keeps its slice."""
    g = torch.Generator().manual_seed(seed)
    w_gate_up = torch.randn(num_experts, 2 * inter, hidden, generator=g) * hidden**-0.5
    w_down = torch.randn(num_experts, hidden, inter, generator=g) * inter**-0.5
    return w_gate_up.to(device, dtype), w_down.to(device, dtype)


def make_routing(tokens, k, allowed, seed, *, distinct=True, hidden=HIDDEN, dtype=torch.float32, device="cpu"):
    """tokens x hidden inputs; top-k ids drawn from ``allowed`` (distinct per token unless not
    ``distinct``), softmax weights."""
    g = torch.Generator().manual_seed(seed)
    allowed = torch.as_tensor(allowed, dtype=torch.int64)
    x = torch.randn(tokens, hidden, generator=g)
    if distinct:
        pick = torch.rand(tokens, len(allowed), generator=g).argsort(1)[:, :k]
    else:
        pick = torch.randint(len(allowed), (tokens, k), generator=g)
    idx = allowed[pick]
    w = torch.randn(tokens, k, generator=g).softmax(-1)
    return x.to(device, dtype), idx.to(device), w.to(device)


def scenarios(rank, world):
    """(name, local experts per rank, k, tokens on this rank, allowed expert ids, distinct)."""
    E3 = 3 * world
    no_last_rank = [e for e in range(E3 - 3) if e != 1]  # expert 1 and all of the last rank unused
    return [
        ("last rank receives nothing", 3, 2, 7 + 5 * rank, no_last_rank, True),
        ("rank 0 has no tokens", 2, 3, 0 if rank == 0 else 11 + rank, list(range(2 * world)), True),
        ("one expert gets everything", 1, 1, 9 + rank, [world - 1], True),
        ("duplicates in top-k", 2, 4, 13, [0, 2 * world - 1, 3], False),
        ("no tokens anywhere", 2, 2, 0, list(range(2 * world)), True),
        ("larger uniform", 4, 2, 64, list(range(4 * world)), True),
    ]


def _check_scenario(name, model, weights, x, idx, w, group=None):
    from cutegemm.nn import GroupedExperts
    from cutegemm.parallel import moe_reference, moe_single_device

    E = model.num_experts_total
    out = model(x, idx, w, check_routing=True)
    ref = moe_reference(x, idx, w, *weights)
    assert out.shape == x.shape and out.dtype == x.dtype, name
    torch.testing.assert_close(out, ref, **TOL, msg=lambda m: f"{name}: {m}")
    # the gather-based reference path sees the same weights
    gathered = model.gather_full_weights()
    for a, b in zip(gathered, weights, strict=True):
        assert torch.equal(a, b), f"{name}: gathered weights differ"
    torch.testing.assert_close(model.reference_forward(x, idx, w), ref, atol=0, rtol=0)
    # the communication-free single-device layer (the 1-GPU baseline) agrees too
    single = GroupedExperts(E, HIDDEN, INTER, dtype=torch.float32)
    with torch.no_grad():
        single.w_gate_up.copy_(weights[0])
        single.w_down.copy_(weights[1])
    torch.testing.assert_close(moe_single_device(x, idx, w, single), ref, **TOL)
    return float((out - ref).abs().max()) if out.numel() else 0.0


def _cpu_worker(rank, world):
    from cutegemm.parallel import ExpertParallelMoE

    stats = {}
    try:
        ExpertParallelMoE(world + 1, HIDDEN, INTER, dtype=torch.float32)
    except ValueError as e:
        assert "multiple" in str(e)
    else:
        raise AssertionError("indivisible expert count was accepted")
    for i, (name, L, k, tokens, allowed, distinct) in enumerate(scenarios(rank, world)):
        E = L * world
        weights = full_weights(E, HIDDEN, INTER, seed=1000 + i)
        model = ExpertParallelMoE(E, HIDDEN, INTER, dtype=torch.float32, device="cpu")
        model.load_full_weights(*weights)
        x, idx, w = make_routing(tokens, k, allowed, seed=10 * i + rank, distinct=distinct)
        stats[name] = (tokens, _check_scenario(name, model, weights, x, idx, w))
    if world == 4:
        # Expert parallelism over a sub-group (ep_group): ranks {0, 1} and {2, 3} run two
        # independent 2-way layers at once; in each pair the second rank's experts go unused.
        groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        group, sub = groups[rank // 2], rank % 2
        weights = full_weights(4, HIDDEN, INTER, seed=77 + rank // 2)
        model = ExpertParallelMoE(4, HIDDEN, INTER, ep_group=group, dtype=torch.float32)
        assert (model.world_size, model.rank, model.expert_start) == (2, sub, 2 * sub)
        model.load_full_weights(*weights)
        x, idx, w = make_routing(5 + 4 * rank, 2, [0, 1], seed=500 + rank)
        stats["sub-group"] = (len(x), _check_scenario("sub-group", model, weights, x, idx, w))
    return stats


@pytest.mark.parametrize("world", [2, 4])
def test_expert_parallel_gloo_matches_reference(world):
    results = run_ranks(_cpu_worker, world, "gloo", timeout_s=120)
    assert sorted(results) == list(range(world))
    names = [s[0] for s in scenarios(0, world)] + (["sub-group"] if world == 4 else [])
    for r in range(world):
        assert list(results[r]) == names


GRAD_TOL = dict(atol=2e-5, rtol=1e-4)


def _all_ranks_inputs(i, world, k, allowed, distinct):
    """Every rank's (x, topk_idx, topk_weight, upstream gradient) of scenario i, rebuilt from the
    seeds (so the single-process reference sees all tokens without a collective)."""
    parts = []
    for r in range(world):
        tokens = scenarios(r, world)[i][3]
        x, idx, w = make_routing(tokens, k, allowed, seed=10 * i + r, distinct=distinct)
        gy = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(7000 + 10 * i + r))
        parts.append((x, idx, w, gy))
    return parts


def _grad(t):
    """t.grad, or zeros where autograd never reached t (a reference with no tokens at all)."""
    return t.grad if t.grad is not None else torch.zeros_like(t)


def _grad_worker(rank, world):
    """Forward and gradients (x, topk_weight, this rank's expert weights) of the expert-parallel
    layer vs the single-process layer over every rank's tokens: ``moe_single_device`` (the same
    autograd path, all experts local) and ``moe_reference`` (plain torch autograd, fp32)."""
    from cutegemm.nn import GroupedExperts
    from cutegemm.parallel import ExpertParallelMoE, moe_reference, moe_single_device

    stats = {}
    for i, (name, L, k, _tokens, allowed, distinct) in enumerate(scenarios(rank, world)):
        E = L * world
        weights = full_weights(E, HIDDEN, INTER, seed=1000 + i)
        model = ExpertParallelMoE(E, HIDDEN, INTER, dtype=torch.float32)
        model.load_full_weights(*weights)
        parts = _all_ranks_inputs(i, world, k, allowed, distinct)
        x, idx, w, gy = (t.clone() for t in parts[rank])
        x.requires_grad_()
        w.requires_grad_()
        out = model(x, idx, w)
        (out * gy).sum().backward()  # every rank, also with no tokens (the exchanges are collectives)

        X, IDX, W, GY = (torch.cat(ts) for ts in zip(*parts, strict=True))
        start = sum(p[0].shape[0] for p in parts[:rank])
        mine = slice(start, start + x.shape[0])
        experts = slice(rank * L, (rank + 1) * L)

        single = GroupedExperts(E, HIDDEN, INTER, dtype=torch.float32)
        with torch.no_grad():
            single.w_gate_up.copy_(weights[0])
            single.w_down.copy_(weights[1])
        xs, ws = X.clone().requires_grad_(), W.clone().requires_grad_()
        ref_single = moe_single_device(xs, IDX, ws, single)
        (ref_single * GY).sum().backward()

        xr, wr = X.clone().requires_grad_(), W.clone().requires_grad_()
        w1, w2 = (t.clone().requires_grad_() for t in weights)
        ref = moe_reference(xr, IDX, wr, w1, w2)
        (ref * GY).sum().backward()

        ours = {"out": out, "x": x.grad, "topk_weight": w.grad, "w_gate_up": model.experts.w_gate_up.grad,
                "w_down": model.experts.w_down.grad}  # fmt: skip
        for ref_name, (out_ref, leaves) in (
            ("single", (ref_single, (xs, ws, single.w_gate_up, single.w_down))),
            ("reference", (ref, (xr, wr, w1, w2))),
        ):
            gx, gw, g1, g2 = (_grad(t) for t in leaves)
            refs = {"out": out_ref[mine], "x": gx[mine], "topk_weight": gw[mine], "w_gate_up": g1[experts],
                    "w_down": g2[experts]}  # fmt: skip
            for key, val in ours.items():
                assert val is not None, f"{name}: no gradient for {key}"
                torch.testing.assert_close(
                    val, refs[key], **GRAD_TOL, msg=lambda m, n=name, k=key, r=ref_name: f"{n}, {k} vs {r}: {m}"
                )
        stats[name] = float(model.experts.w_down.grad.abs().max())
    return stats


@pytest.mark.parametrize("world", [2, 4])
def test_expert_parallel_gloo_gradients_match_single_process(world):
    results = run_ranks(_grad_worker, world, "gloo", timeout_s=180)
    assert sorted(results) == list(range(world))
    # The scenario where every rank has tokens for its own experts trains every weight.
    assert all(results[r]["larger uniform"] > 0 for r in range(world))


def _failing_worker(rank, world):
    if rank == 1:
        raise RuntimeError("boom on rank 1")
    time.sleep(600)  # rank 0 hangs: the harness must kill it soon after rank 1's failure
    return "unreachable"


def test_harness_reports_failure_and_kills_stuck_ranks():
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match="boom on rank 1"):
        run_ranks(_failing_worker, 2, "gloo", timeout_s=60)
    assert time.monotonic() - t0 < 30  # well inside the 60 s deadline: killed after a 2 s grace


def test_needs_initialized_process_group():
    from cutegemm.parallel import ExpertParallelMoE

    with pytest.raises(RuntimeError, match="process group"):
        ExpertParallelMoE(4, HIDDEN, INTER, dtype=torch.float32)
