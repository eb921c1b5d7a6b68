"""The gated epilogue's second output, the values before the gate (``EpilogueSpec.preact``): the
config rules, the gathered packed route that writes Z and H in one launch
(``grouped.gather.gathered_grouped_gemm(..., preact_out=z)``) and ``moe.routed_experts``' forward
on it, on the CPU with the compiled kernels replaced by tests/emulated_kernel.py. The kernel's own
stores are the GPU tests' (tests/gpu/test_preact_gpu.py)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cutegemm import moe
from cutegemm.config import EpilogueSpec, Form, GemmConfig, config_errors
from cutegemm.epilogue import epilogue_ref
from cutegemm.grouped import gather

from ..emulated_kernel import emulated_kernels

BF = torch.bfloat16


def _routing(tokens: int, k: int, experts: int, gen):
    ids = torch.randint(0, experts, (tokens * k,), generator=gen)
    order = torch.argsort(ids, stable=True)
    offs = torch.bincount(ids, minlength=experts).cumsum(0).to(torch.int32)
    return (order // k).to(torch.int32), offs


def test_rules():
    with pytest.raises(ValueError, match="preact"):
        EpilogueSpec(preact=True)  # no gate
    with pytest.raises(ValueError, match="preact"):
        EpilogueSpec(gated="swiglu", preact=True, quant="mxfp8")
    epi = EpilogueSpec(gated="swiglu", preact=True)
    assert epi.name == "swigluz" and EpilogueSpec(gated="swiglu").name == "swiglu"
    ok = GemmConfig(arch="sm_90a", form=Form.GROUPED, gather_a=True, tile_m=128, tile_n=256, cluster_m=2, epilogue=epi)
    assert config_errors(ok) == []
    bad = [
        GemmConfig(arch="sm_100a", form=Form.GROUPED, tile_m=128, tile_n=256, epilogue=epi),
        GemmConfig(arch="sm_90a", form=Form.GROUPED, swap_ab=True, tile_m=128, tile_n=256, epilogue=epi),
        GemmConfig(arch="sm_90a", form=Form.GROUPED, tile_m=128, tile_n=256, out_dtype="fp32", epilogue=epi),
        GemmConfig(arch="sm_90a", form=Form.DENSE, tile_m=128, tile_n=128, split_k=2, epilogue=epi),
    ]
    for cfg in bad:
        assert any("preact" in e for e in config_errors(cfg)), cfg.name


@settings(max_examples=30, deadline=None)
@given(tokens=st.integers(1, 60), k=st.integers(1, 4), experts=st.integers(1, 5), n=st.sampled_from([16, 48, 64]),
       act=st.sampled_from(["swiglu", "geglu"]), tail=st.integers(0, 3), seed=st.integers(0, 2**16))  # fmt: skip
def test_one_launch_writes_z_and_h(tokens, k, experts, n, act, tail, seed):
    """Z = x[idx] W[e] (every GEMM column) and H = act(gate) * up from the same accumulators, in
    the rows of the experts only (NaN-poisoned rows past offs[-1] stay NaN); a second call takes
    the warm plan with new tensors."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, 64, generator=gen).to(BF)
    w = torch.randn(experts, 64, n, generator=gen).to(BF)
    idx, offs = _routing(tokens, k, experts, gen)
    rows = idx.shape[0]
    idx = torch.cat([idx, torch.zeros(tail, dtype=torch.int32)])
    with emulated_kernels() as cache:
        for _ in range(2):
            z = torch.full((rows + tail, n), float("nan"), dtype=BF)
            h = torch.full((rows + tail, n // 2), float("nan"), dtype=BF)
            assert gather.preact_route(x, w, offs, act)
            gather.gathered_grouped_gemm(x, w, gather_index=idx, run=None, offs=offs, activation=act, out=h, preact_out=z)
            acc = torch.cat([x[idx[:rows].long()].float()[offs[e - 1] if e else 0:offs[e]] @ w[e].float()
                             for e in range(experts)])  # fmt: skip
            torch.testing.assert_close(z[:rows], acc.to(BF))
            torch.testing.assert_close(h[:rows], epilogue_ref(acc, activation=act).to(BF))
            assert z[rows:].isnan().all() and h[rows:].isnan().all()
            x = x + 1
        assert [kern.cfg.epilogue.preact for kern in cache.kernels] == [True]  # the second call: the warm plan
        assert cache.kernels[0].calls == 2


def test_preact_route_refusals(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 64, generator=gen).to(BF), torch.randn(2, 64, 32, generator=gen).to(BF)
    idx, offs = _routing(8, 2, 2, gen)
    z = torch.empty(idx.shape[0], 32, dtype=BF)
    with emulated_kernels():
        assert not gather.preact_route(x, w, offs, "silu")  # no gate
        assert not gather.preact_route(x[:, :48], w[:, :48], offs, "swiglu")  # K not a multiple of 64
        with pytest.raises(ValueError, match="preact_out"):  # a strided preact_out
            gather.gathered_grouped_gemm(x, w, gather_index=idx, run=None, offs=offs, activation="swiglu",
                                         preact_out=torch.empty(32, idx.shape[0], dtype=BF).t())  # fmt: skip
        monkeypatch.setattr(gather, "device_info", lambda i: ("sm_100a", 148))
        assert not gather.preact_route(x, w, offs, "swiglu")
        with pytest.raises(ValueError, match="preact_out"):
            gather.gathered_grouped_gemm(x, w, gather_index=idx, run=None, offs=offs, activation="swiglu", preact_out=z)


@pytest.mark.parametrize("layout", ["interleaved", "halves"])
def test_routed_forward_writes_z_and_h_in_one_launch(monkeypatch, layout):
    """routed_experts' up projection: one preact launch (interleaved gate / up) instead of the GEMM
    and the SwiGLU pass; the output and every gradient as on the two-pass route."""
    gen = torch.Generator().manual_seed(5)
    T, H, I, E, K = 24, 64, 32, 4, 2
    x = torch.randn(T, H, generator=gen).to(BF)
    ids = torch.randint(0, E, (T, K), generator=gen)
    wts = torch.rand(T, K, generator=gen).to(BF)
    w1, w2 = torch.randn(E, H, 2 * I, generator=gen).to(BF) / 8, torch.randn(E, I, H, generator=gen).to(BF) / 8
    dout = torch.randn(T, H, generator=gen).to(BF)

    def run(one_launch):
        leaves = [t.detach().clone().requires_grad_() for t in (x, wts, w1, w2)]
        with emulated_kernels() as cache:
            monkeypatch.setattr(moe, "eager_cuda", lambda t: True)
            monkeypatch.setattr(moe, "gather_pays", lambda *a: True)
            if not one_launch:
                monkeypatch.setattr(moe, "preact_route", lambda *a: False)
            out = moe.routed_experts(leaves[0], ids, *leaves[1:], gate_layout=layout)
            out.backward(dout)
            monkeypatch.undo()
        return out, [t.grad for t in leaves], [kk.cfg for kk in cache.kernels]

    out, grads, cfgs = run(True)
    ref, ref_grads, ref_cfgs = run(False)
    assert sum(c.epilogue.preact for c in cfgs) == (layout == "interleaved")
    assert not any(c.epilogue.preact for c in ref_cfgs)
    # H from the fp32 accumulators (one launch) or from Z rounded to bf16 (two passes)
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g.float(), r.float(), rtol=2e-2, atol=2e-2)
