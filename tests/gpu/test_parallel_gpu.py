"""2+ GPUs (NCCL): the expert-parallel MoE layer equals the same layer on one GPU (all experts local,
cutegemm grouped GEMM, no communication) and the fp32 single-process reference.

Skipped unless 2 or more CUDA GPUs are present (the ``multigpu`` marker, handled in conftest.py).
NCCL_NVLS_ENABLE=0 in every rank (never enable NVLink multicast on the lent machines).
Status: written without a multi-GPU machine; not yet run.
"""

from __future__ import annotations

import pytest
import torch

from ..cpu.test_parallel_cpu import full_weights, make_routing, run_ranks

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]

HIDDEN, INTER = 256, 512  # N * 2 bytes ends on 16 bytes for both grouped GEMMs
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0"}


def _nccl_worker(rank, world):
    from cutegemm.nn import GroupedExperts
    from cutegemm.parallel import ExpertParallelMoE, moe_reference, moe_single_device

    dev = torch.device("cuda", rank)
    L, dtype = 4, torch.bfloat16
    E = L * world
    no_last_rank = [e for e in range(E - L) if e != 1]  # expert 1 and the last rank's experts unused
    cases = [
        ("last rank receives nothing", 2, 1000 + 37 * rank, no_last_rank),
        ("rank 0 has no tokens", 2, 0 if rank == 0 else 777, list(range(E))),
        ("uniform", 2, 4096, list(range(E))),
        ("top-1 to one expert", 1, 300, [E - 1]),
    ]
    stats = {}
    for i, (name, k, tokens, allowed) in enumerate(cases):
        weights = full_weights(E, HIDDEN, INTER, seed=2000 + i, dtype=dtype, device=dev)
        model = ExpertParallelMoE(E, HIDDEN, INTER, dtype=dtype, device=dev)
        model.load_full_weights(*weights)
        single = GroupedExperts(E, HIDDEN, INTER, dtype=dtype, device=dev)
        with torch.no_grad():
            single.w_gate_up.copy_(weights[0])
            single.w_down.copy_(weights[1])
        x, idx, w = make_routing(tokens, k, allowed, seed=10 * i + rank, hidden=HIDDEN, dtype=dtype, device=dev)
        out = model(x, idx, w, check_routing=True)
        one_gpu = moe_single_device(x, idx, w, single)
        ref = moe_reference(x, idx, w, *weights)
        torch.cuda.synchronize()
        assert out.shape == (tokens, HIDDEN) and out.dtype == dtype
        # Same kernels, same bf16 roundings; only the grouped GEMM config may differ with the
        # problem size (accumulation order), hence a few bf16 ulps rather than bit equality.
        torch.testing.assert_close(out, one_gpu, atol=2e-2, rtol=2e-2, msg=lambda m, n=name: f"{n} vs 1 GPU: {m}")
        torch.testing.assert_close(out, ref, atol=5e-2, rtol=5e-2, msg=lambda m, n=name: f"{n} vs fp32 ref: {m}")
        torch.testing.assert_close(model.reference_forward(x, idx, w), ref, atol=0, rtol=0)  # NCCL all_gather
        stats[name] = float((out.float() - one_gpu.float()).abs().max()) if tokens else 0.0
    return stats


def test_expert_parallel_nccl_matches_single_gpu():
    world = 2  # the lent multi-GPU machines have 2 (x2) or more; 2 covers the exchange
    results = run_ranks(_nccl_worker, world, "nccl", timeout_s=300, env=NCCL_ENV)
    assert sorted(results) == list(range(world))
