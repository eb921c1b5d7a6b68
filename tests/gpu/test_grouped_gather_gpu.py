"""The gather kernel (``grouped_gemm(x, w, offs=offs, gather_index=idx)``, GemmConfig.gather_a):
A's rows loaded through the index, by cp.async on sm_90a and by TMA gather4 on sm_100a (these
tests run there where the GPU is one). Against the same tile's TMA kernel on the copy x[idx]
(bitwise: same MMAs in the same order), the fp64 reference, torch's same-precision
error; NaN-poisoned outputs; rows past offs[-1] untouched; MoE routings from decode to prefill
sizes; a CUDA-graph replay with new routing; determinism."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cutegemm
from cutegemm.config import ACTIVATIONS, GATED, EpilogueSpec, GemmProblem
from cutegemm.moe import grouped_experts
from cutegemm.policy import gather_pays, policy_for

from ..gemm_check import assert_within_torch_error

pytestmark = pytest.mark.gpu
BF = torch.bfloat16


def _sm90():
    return torch.cuda.get_device_capability()[0] == 9


def _arch():
    """The gather kernel's arch on this GPU (sm_90a: cp.async rows, sm_100a: TMA gather4), or None."""
    return {9: "sm_90a", 10: "sm_100a"}.get(torch.cuda.get_device_capability()[0])


def _routing(tokens, k, experts, gen):
    ids = torch.randint(0, experts, (tokens * k,), generator=gen, device="cuda")
    order = torch.argsort(ids, stable=True)
    offs = torch.bincount(ids, minlength=experts).cumsum(0).to(torch.int32)
    return (order // k).to(torch.int32), offs


def _same_tile(xg, w, offs, act=None):
    """The packed form on the gathered copy with the gather call's tile (gather_a off): the same
    WGMMAs in the same order, TMA loads."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    epi = EpilogueSpec(activation=act if act in ACTIVATIONS else None, gated=act if act in GATED else None)
    E, K, N = w.shape
    problem = GemmProblem(xg.shape[0], N, K, 1, "bf16", "bf16", "bf16", "k", "k" if w.stride(1) == 1 else "n")
    cfg = policy_for(_arch(), sms).choose_gathered(problem, E, epilogue=epi)
    return cutegemm.grouped_gemm(xg, w, offs=offs, activation=act, config=replace(cfg, gather_a=False))


def _check(tokens, k, experts, hidden, n, act=None, tail=3, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, hidden, device="cuda", generator=gen).to(BF)
    w = torch.randn(experts, n, hidden, device="cuda", generator=gen).to(BF).transpose(1, 2)
    idx, offs = _routing(tokens, k, experts, gen)
    rows = idx.shape[0]
    idx = torch.cat([idx, torch.zeros(tail, dtype=torch.int32, device="cuda")])
    n_out = n // 2 if act in GATED else n
    out = torch.full((rows + tail, n_out), float("nan"), device="cuda", dtype=BF)
    cutegemm.grouped_gemm(x, w, offs=offs, gather_index=idx, activation=act, out=out)
    torch.cuda.synchronize()
    assert out[rows:].isnan().all(), "rows past offs[-1] were written"
    xg = x[idx.long()]
    same_tile = _same_tile(xg, w, offs, act)
    assert torch.equal(out[:rows], same_tile[:rows]), "gathered loads differ from the TMA loads of x[idx]"
    ref = cutegemm.grouped_gemm_ref(xg, w, offs=offs, activation=act, compute_dtype=torch.float64)
    bounds = [0, *offs.tolist()]
    torch_same = torch.cat([xg[s:e] @ w[i] for i, (s, e) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))])
    if act is None and rows:
        assert_within_torch_error(out[:rows], torch_same, ref[:rows], what=f"gather T={tokens} k={k} E={experts}")
    return x, w, idx, offs, out


@pytest.mark.parametrize(
    "tokens,k,experts,hidden,n,act",
    [(64, 8, 128, 2048, 1536, "swiglu"),  # Qwen3-30B-A3B decode
     (4096, 8, 128, 2048, 1536, "swiglu"),  # Qwen3-30B-A3B prefill
     (2048, 2, 8, 4096, 2048, None),  # Mixtral-like, few big experts
     (1000, 8, 64, 2048, 2048, "swiglu"),  # OLMoE, ragged
     (7, 2, 4, 64, 48, None), (300, 4, 16, 128, 256, "silu"),
     (300, 4, 32, 2880, 5760, "swiglu_oai")],  # gpt-oss-20b's dims, its gate clamped past +-7
)  # fmt: skip
def test_gather_matches_the_tma_kernel_on_the_copy(tokens, k, experts, hidden, n, act):
    if _arch() is None:
        pytest.skip("the gather kernel is sm_90a / sm_100a")
    _check(tokens, k, experts, hidden, n, act)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(tokens=st.integers(1, 600), k=st.integers(1, 8), experts=st.integers(1, 40), hidden=st.sampled_from([64, 192, 512]),
       n=st.sampled_from([16, 136, 512]), tail=st.integers(0, 9), seed=st.integers(0, 2**16))  # fmt: skip
def test_gather_hypothesis(tokens, k, experts, hidden, n, tail, seed):
    if _arch() is None:
        pytest.skip("the gather kernel is sm_90a / sm_100a")
    _check(tokens, k, experts, hidden, n, None, tail, seed)


def test_gather_graph_replay_and_determinism():
    if _arch() is None:
        pytest.skip("the gather kernel is sm_90a / sm_100a")
    gen = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(512, 1024, device="cuda", generator=gen).to(BF)
    w = torch.randn(16, 1024, 512, device="cuda", generator=gen).to(BF)
    idx, offs = _routing(512, 4, 16, gen)
    first = cutegemm.grouped_gemm(x, w, offs=offs, gather_index=idx)
    for _ in range(3):
        assert torch.equal(first, cutegemm.grouped_gemm(x, w, offs=offs, gather_index=idx))
    out = torch.empty_like(first)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cutegemm.grouped_gemm(x, w, offs=offs, gather_index=idx, out=out)
    new_idx, new_offs = _routing(512, 4, 16, gen)
    idx.copy_(new_idx)
    offs.copy_(new_offs)
    graph.replay()
    torch.cuda.synchronize()
    rows = int(offs[-1])
    assert torch.equal(out[:rows], _same_tile(x[idx.long()], w, offs)[:rows])


@pytest.mark.parametrize("tokens,k,experts,hidden,inter", [(512, 8, 32, 2048, 768), (2048, 8, 64, 2048, 1024)])
def test_grouped_experts_inference_through_the_index(tokens, k, experts, hidden, inter):
    """cutegemm.moe.grouped_experts(gather_index=...) without a gradient (the route the
    transformers backend takes with FUSED_DISPATCH), on shapes where the layer gathers
    (policy.gather_pays): the up projection reads the tokens through the index; the result
    matches the layer on the permuted copy within bf16 rounding."""
    if _arch() is None:
        pytest.skip("the gather kernel is sm_90a / sm_100a")
    assert gather_pays(hidden, tokens * k, experts)
    gen = torch.Generator(device="cuda").manual_seed(11)
    x = torch.randn(tokens, hidden, device="cuda", generator=gen).to(BF)
    w1 = (torch.randn(experts, 2 * inter, hidden, device="cuda", generator=gen) * hidden**-0.5).to(BF).transpose(1, 2)
    w2 = (torch.randn(experts, hidden, inter, device="cuda", generator=gen) * inter**-0.5).to(BF).transpose(1, 2)
    idx, offs = _routing(tokens, k, experts, gen)
    with torch.no_grad():
        fused = grouped_experts(x, w1, w2, offs, gather_index=idx)
        copied = grouped_experts(x[idx.long()], w1, w2, offs)
    torch.testing.assert_close(fused.float(), copied.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("rows_per_expert", [8, 700])
def test_16bit_row_scale_in_the_epilogue(rows_per_expert):
    """bf16 grouped_gemm(scale_a=...) (the swapped kernel for few rows per expert, the row tile
    for many): the fp32 per-row scale applied to the accumulator, within 2x torch's error of the
    scaled product; the layer's out_scale (FUSED_DISPATCH's routing weights) likewise."""
    if not _sm90():
        pytest.skip("sm_90a")
    gen = torch.Generator(device="cuda").manual_seed(rows_per_expert)
    E, K, N = 16, 768, 2048
    h = torch.randn(E * rows_per_expert, K, device="cuda", generator=gen).to(BF)
    w = (torch.randn(E, N, K, device="cuda", generator=gen) * K**-0.5).to(BF).transpose(1, 2)
    offs = torch.arange(1, E + 1, device="cuda", dtype=torch.int32) * rows_per_expert
    s = torch.rand(h.shape[0], device="cuda", generator=gen)
    y = cutegemm.grouped_gemm(h, w, offs=offs, scale_a=s)
    ref = cutegemm.grouped_gemm_ref(h, w, offs=offs, compute_dtype=torch.float64) * s.double()[:, None]
    bounds = [0, *offs.tolist()]
    same = torch.cat([(h[a:b] @ w[i]) for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))])
    assert_within_torch_error(y, (same.float() * s[:, None]).to(BF), ref, what="bf16 scale_a")
    x = torch.randn(E * rows_per_expert // 4, K, device="cuda", generator=gen).to(BF)
    idx = torch.randint(0, x.shape[0], (h.shape[0],), device="cuda", generator=gen, dtype=torch.int32)
    w1 = (torch.randn(E, 2 * 512, K, device="cuda", generator=gen) * K**-0.5).to(BF).transpose(1, 2)
    w2 = (torch.randn(E, K, 512, device="cuda", generator=gen) * 512**-0.5).to(BF).transpose(1, 2)
    with torch.no_grad():
        fused = grouped_experts(x, w1, w2, offs, gather_index=idx, out_scale=s)
        plain = grouped_experts(x[idx.long()], w1, w2, offs).float() * s[:, None]
    torch.testing.assert_close(fused.float(), plain, atol=2e-2, rtol=2e-2)
