"""The packed grouped form with A's rows gathered (``grouped_gemm(x, w, offs=offs,
gather_index=idx)``, cutegemm/grouped/gather.py) on the CPU: the host path with the compiled kernel
replaced by tests/emulated_kernel.py (it reads A's rows through the index it is handed, as the
gather kernel does), against the reference twin and against the packed form of x[idx], with
NaN-poisoned outputs; the route each call takes; the config rules and the policy's configs.
The kernel's own loads are the GPU tests' (tests/gpu/test_grouped_gather_gpu.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cutegemm
from cutegemm.config import EpilogueSpec, Form, GemmConfig, GemmProblem, config_errors
from cutegemm.grouped import gather
from cutegemm.moe import grouped_experts
from cutegemm.policy import gather_pays, policy_for

from ..emulated_kernel import emulated_kernels

BF = torch.bfloat16


def _offs(counts):
    return torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)


def _routing(tokens: int, k: int, experts: int, gen):
    """(index, offs): the token of every (token, slot) pair sorted by expert, as a MoE layer's
    dispatch builds them."""
    ids = torch.randint(0, experts, (tokens * k,), generator=gen)
    order = torch.argsort(ids, stable=True)
    counts = torch.bincount(ids, minlength=experts)
    return (order // k).to(torch.int32), _offs(counts.tolist())


@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(1, 70), k=st.integers(1, 4), experts=st.integers(1, 6), n=st.sampled_from([16, 40, 64]),
       kdim=st.sampled_from([64, 128]), act=st.sampled_from([None, "silu", "swiglu"]),
       alpha=st.sampled_from([1.0, 0.5]), tail=st.integers(0, 3), seed=st.integers(0, 2**16))  # fmt: skip
def test_gather_kernel_route_against_the_twin(tokens, k, experts, n, kdim, act, alpha, tail, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, kdim, generator=gen).to(BF)
    w = torch.randn(experts, kdim, n, generator=gen).to(BF)
    idx, offs = _routing(tokens, k, experts, gen)
    rows = idx.shape[0]
    idx = torch.cat([idx, torch.zeros(tail, dtype=torch.int32)])  # rows past offs[-1]: never written
    n_out = n // 2 if act == "swiglu" else n
    out = torch.full((rows + tail, n_out), float("nan"), dtype=BF)
    with emulated_kernels() as cache:
        cutegemm.grouped_gemm(x, w, offs=offs, gather_index=idx, activation=act, alpha=alpha, out=out)
        # an out whose rows are not a multiple of 16 bytes is not TMA-storable: the copying route
        assert [kern.cfg.gather_a for kern in cache.kernels] == [n_out * 2 % 16 == 0]
    ref = cutegemm.grouped_gemm_ref(x, w, offs=offs, gather_index=idx, activation=act, alpha=alpha)
    plain = cutegemm.grouped_gemm_ref(x[idx.long()], w, offs=offs, activation=act, alpha=alpha)
    torch.testing.assert_close(ref, plain)
    torch.testing.assert_close(out[:rows].float(), ref[:rows].float(), atol=2e-2, rtol=2e-2)
    assert out[rows:].isnan().all()


def test_weights_as_transposed_views_and_int64_index():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(9, 64, generator=gen).to(BF)
    w = torch.randn(3, 32, 64, generator=gen).to(BF).transpose(1, 2)  # (E, K, N) view of (E, N, K)
    idx, offs = _routing(9, 2, 3, gen)
    with emulated_kernels() as cache:
        y = cutegemm.grouped_gemm(x, w, offs=offs, gather_index=idx.long())
        assert cache.kernels[-1].cfg.gather_a and cache.kernels[-1].cfg.b_major == "k"
        strided = torch.stack([idx, idx], dim=1)[:, 0]  # a strided view: passed contiguous
        assert not strided.is_contiguous()
        torch.testing.assert_close(cutegemm.grouped_gemm(x, w, offs=offs, gather_index=strided), y)
    torch.testing.assert_close(y.float(), cutegemm.grouped_gemm_ref(x[idx.long()], w, offs=offs).float(),
                               atol=2e-2, rtol=2e-2)  # fmt: skip


@pytest.mark.parametrize(
    "what,kwargs",
    [("K not a multiple of 64", dict(kdim=48)), ("a bias", dict(bias=True)), ("halves", dict(halves=True)),
     ("x column-major", dict(col=True)), ("fp32 x", dict(dtype=torch.float32))],
)  # fmt: skip
def test_other_calls_take_the_copying_route(what, kwargs):
    """Every call the kernel does not take runs the packed form on x[idx] (its own checks and
    routes), with the same result as the twin."""
    gen = torch.Generator().manual_seed(2)
    kdim, dtype = kwargs.get("kdim", 64), kwargs.get("dtype", BF)
    x = torch.randn(12, kdim, generator=gen).to(dtype)
    if kwargs.get("col"):
        x = x.t().contiguous().t()
    w = torch.randn(2, kdim, 32, generator=gen).to(dtype)
    idx, offs = _routing(12, 1, 2, gen)
    opts = {}
    if kwargs.get("bias"):
        opts["bias"] = torch.randn(2, 32, generator=gen)
    if kwargs.get("halves"):
        opts.update(activation="swiglu", gate_layout="halves")
    if dtype == torch.float32:
        with pytest.raises(TypeError, match="bf16, fp16 or float8"):
            with emulated_kernels():
                cutegemm.grouped_gemm(x, w, offs=offs, gather_index=idx)
        return
    with emulated_kernels() as cache:
        y = cutegemm.grouped_gemm(x, w, offs=offs, gather_index=idx, **opts)
        assert not any(kern.cfg.gather_a for kern in cache.kernels), what
    ref = cutegemm.grouped_gemm_ref(x, w, offs=offs, gather_index=idx, **opts)
    torch.testing.assert_close(y.float(), ref.float(), atol=3e-2, rtol=3e-2)


def test_bad_indices_and_offs():
    x, w = torch.randn(8, 64).to(BF), torch.randn(2, 64, 16).to(BF)
    offs = _offs([3, 3])
    with emulated_kernels():
        with pytest.raises(TypeError, match="1-D integer"):
            cutegemm.grouped_gemm(x, w, offs=offs, gather_index=torch.zeros(2, 3, dtype=torch.int32))
        with pytest.raises(TypeError, match="int32 or int64"):
            cutegemm.grouped_gemm(x, w, offs=offs, gather_index=torch.zeros(6))
        with pytest.raises(ValueError, match=r"lie in \[0, 8\)"):
            cutegemm.grouped_gemm(x, w, offs=offs, gather_index=torch.tensor([0, 1, 2, 3, 4, 8], dtype=torch.int32),
                                  check_offs=True)  # fmt: skip
        with pytest.raises(ValueError, match="exceeds"):
            cutegemm.grouped_gemm(x, w, offs=_offs([3, 4]), gather_index=torch.zeros(6, dtype=torch.int32),
                                  check_offs=True)  # fmt: skip
        with pytest.raises(ValueError, match="experts"):
            cutegemm.grouped_gemm(x, w, offs=_offs([6]), gather_index=torch.zeros(6, dtype=torch.int32))
        # without check_offs an index outside x is clamped into it (no load leaves x)
        y = cutegemm.grouped_gemm(x, w, offs=offs, gather_index=torch.tensor([0, 1, 2, 3, 4, 99], dtype=torch.int32))
        torch.testing.assert_close(y[5].float(), (x[7].float() @ w[1].float()), atol=5e-2, rtol=2e-2)


def test_gather_a_rules_and_policy():
    base = GemmConfig(arch="sm_90a", form=Form.GROUPED, tile_m=128, tile_n=256, cluster_m=2, gather_a=True)
    assert not config_errors(base)
    base100 = GemmConfig(arch="sm_100a", form=Form.GROUPED, tile_m=128, tile_n=128, gather_a=True)
    assert not config_errors(base100)
    for cfg in (base, base100):
        for bad in (dict(cluster_m=1, cluster_n=2), dict(scheduler="dynamic"), dict(form=Form.DENSE), dict(a_major="m"),
                    dict(a_dtype="e4m3", b_dtype="e4m3", b_major="k"), dict(swap_ab=True)):  # fmt: skip
            assert any("gather_a" in e for e in config_errors(replace(cfg, **bad))), (cfg.arch, bad)
    assert config_errors(replace(base100, cluster_m=2))  # sm_100a grouped tiles: 1x1, 1-CTA
    assert config_errors(replace(base100, tile_m=256, two_cta=True, cluster_m=2))
    for arch in ("sm_90a", "sm_100a"):
        pol = policy_for(arch, 132)
        for rows, experts in ((64, 8), (8192, 8), (131072, 128), (512, 32)):
            for epi in (EpilogueSpec(), EpilogueSpec(gated="swiglu")):
                cfg = pol.choose_gathered(GemmProblem(rows, 1536, 2048, 1, "bf16", "bf16", "bf16", "k", "n"), experts,
                                          epilogue=epi)  # fmt: skip
                assert cfg.gather_a and cfg.cluster_n == 1 and cfg.scheduler == "static" and not cfg.swap_ab
                assert not config_errors(cfg), (cfg.name, config_errors(cfg))


@settings(max_examples=25, deadline=None)
@given(tokens=st.integers(1, 70), k=st.integers(1, 4), experts=st.integers(1, 6), act=st.sampled_from([None, "swiglu"]),
       tail=st.integers(0, 3), bad=st.integers(0, 2), seed=st.integers(0, 2**16))  # fmt: skip
def test_sm100_route_pads_the_index(tokens, k, experts, act, tail, bad, seed):
    """The sm_100a route (TMA gather4, emulated): the kernel reads the index through a copy
    followed by INDEX_PAD zeros (the emulated kernel checks them), cold and warm calls alike;
    an index outside x gives that row zeros (no load leaves x)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, 64, generator=gen).to(BF)
    w = torch.randn(experts, 64, 32, generator=gen).to(BF)
    idx, offs = _routing(tokens, k, experts, gen)
    rows = idx.shape[0]
    idx[torch.randperm(rows, generator=gen)[:bad]] = tokens + 5  # outside x
    idx = torch.cat([idx, torch.zeros(tail, dtype=torch.int32)])
    xz = torch.cat([x, torch.zeros(1, 64, dtype=BF)])  # x with a zero row for the indices outside it
    ref = cutegemm.grouped_gemm_ref(xz[idx.long().clamp(max=tokens)], w, offs=offs, activation=act)
    with emulated_kernels() as cache:
        saved = gather.device_info
        gather.device_info = lambda index: ("sm_100a", 148)
        try:
            for _ in range(2):  # the cold call, then the warm plan
                out = torch.full((rows + tail, 16 if act else 32), float("nan"), dtype=BF)
                cutegemm.grouped_gemm(x, w, offs=offs, gather_index=idx, activation=act, out=out)
                torch.testing.assert_close(out[:rows].float(), ref[:rows].float(), atol=2e-2, rtol=2e-2)
                assert out[rows:].isnan().all()
        finally:
            gather.device_info = saved
        cfg = cache.kernels[-1].cfg
        assert cfg.arch == "sm_100a" and cfg.gather_a and (cfg.cluster_m, cfg.cluster_n) == (1, 1)
        assert cache.kernels[-1].calls == 2


@pytest.mark.parametrize("shape,pays", [
    ((2048, 16384 * 8, 128), True),  # Qwen3-30B-A3B: gather 3.38 ms, copy 3.53 ms on the H200
    ((2048, 16384 * 8, 64), True),  # OLMoE-1B-7B: 3.78 / 3.93
    ((2048, 64 * 8, 128), False),  # decode, 4 rows per expert: 0.388 / 0.375
    ((4096, 8192 * 2, 8), False),  # Mixtral-8x7B: 8.63 / 8.22
    ((7168, 8192 * 8, 256), False),  # DeepSeek-V3: 14.45 / 12.14
])  # fmt: skip
def test_the_layer_gathers_where_it_measured_faster(shape, pays):
    assert gather_pays(*shape) == pays


def test_warm_calls_reuse_the_plan_with_new_routing():
    """A second call of the same signature launches the first call's plan with its own tensors,
    offs and index (new routing each step, as in a MoE layer)."""
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(20, 64, generator=gen).to(BF), torch.randn(4, 64, 32, generator=gen).to(BF)
    with emulated_kernels() as cache:
        gather.PLANS.clear()
        for _ in range(3):
            idx, offs = _routing(20, 2, 4, gen)
            y = cutegemm.grouped_gemm(x, w, offs=offs, gather_index=idx, activation="swiglu")
            ref = cutegemm.grouped_gemm_ref(x[idx.long()], w, offs=offs, activation="swiglu")
            torch.testing.assert_close(y.float(), ref.float(), atol=2e-2, rtol=2e-2)
        assert len(cache.kernels) == 1 and cache.kernels[0].calls == 3 and len(gather.PLANS) == 1
        gather.PLANS.clear()


def test_16bit_row_scale_and_the_layers_routing_weights():
    """bf16 grouped_gemm(scale_a=...) (an fp32 per-row output scale: the MoE down projection's
    routing weights) through the emulated kernel against the twin; scale_b stays FP8's; the
    layer's out_scale equals weighting the rows after it, and is differentiable."""
    gen = torch.Generator().manual_seed(6)
    h, w = torch.randn(20, 64, generator=gen).to(BF), torch.randn(3, 64, 32, generator=gen).to(BF)
    offs, s = _offs([5, 7, 8]), torch.rand(20, generator=gen)
    with emulated_kernels() as cache:
        y = cutegemm.grouped_gemm(h, w, offs=offs, scale_a=s)
        assert cache.kernels[-1].cfg.epilogue.scale_a
        with pytest.raises(ValueError, match="16-bit operands take scale_a only"):
            cutegemm.grouped_gemm(h, w, offs=offs, scale_b=torch.rand(3, 32))
    ref = cutegemm.grouped_gemm_ref(h, w, offs=offs, scale_a=s)
    torch.testing.assert_close(y.float(), ref.float(), atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(ref.float(), cutegemm.grouped_gemm_ref(h, w, offs=offs).float() * s[:, None],
                               atol=3e-2, rtol=2e-2)  # fmt: skip
    x = torch.randn(10, 64, dtype=torch.float64, generator=gen)
    w1, w2 = torch.randn(3, 64, 32, dtype=torch.float64, generator=gen), torch.randn(3, 16, 64, dtype=torch.float64, generator=gen)
    idx, offs2 = torch.randint(0, 10, (15,), generator=gen), _offs([5, 4, 6])
    rw = torch.rand(15, dtype=torch.float64, generator=gen, requires_grad=True)
    y2 = grouped_experts(x, w1, w2, offs2, gather_index=idx, out_scale=rw)
    torch.testing.assert_close(y2, grouped_experts(x[idx], w1, w2, offs2) * rw[:, None])
    assert torch.autograd.gradcheck(lambda r: grouped_experts(x, w1, w2, offs2, gather_index=idx, out_scale=r), (rw,))
