"""The gated epilogue's second output (``EpilogueSpec.preact``, sm_90a): the gather kernel writing
Z = x[idx] W[e] (every GEMM column) beside H = act(gate) * up in one launch
(``grouped.gather.gathered_grouped_gemm(..., preact_out=z)``), which ``moe.routed_experts``' forward
runs. Z and H bitwise equal to the same tile's packed kernel on the gathered copy with no
activation / with the gate alone (same WGMMAs, same order); H within 2x torch's error against fp64;
NaN-poisoned rows past offs[-1] untouched; the routed layer's output and gradients against the
two-pass route (the GEMM, then the SwiGLU pass)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import cutegemm
from cutegemm import moe
from cutegemm.config import EpilogueSpec, GemmProblem
from cutegemm.epilogue import epilogue_ref
from cutegemm.grouped import gather
from cutegemm.policy import policy_for

from ..gemm_check import assert_within_torch_error

pytestmark = pytest.mark.gpu
BF = torch.bfloat16


def _sm90():
    return torch.cuda.get_device_capability()[0] == 9


def _routing(tokens, k, experts, gen):
    ids = torch.randint(0, experts, (tokens * k,), generator=gen, device="cuda")
    order = torch.argsort(ids, stable=True)
    offs = torch.bincount(ids, minlength=experts).cumsum(0).to(torch.int32)
    return (order // k).to(torch.int32), offs


def _tile_cfg(rows, w, act):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    E, K, N = w.shape
    problem = GemmProblem(rows, N, K, 1, "bf16", "bf16", "bf16", "k", "k" if w.stride(1) == 1 else "n")
    return policy_for("sm_90a", sms).choose_gathered(problem, E, epilogue=EpilogueSpec(gated=act, preact=True))


@pytest.mark.parametrize(
    "tokens,k,experts,hidden,n,act,transposed",
    [(512, 2, 8, 256, 256, "swiglu", True), (1000, 8, 16, 128, 96, "geglu", False), (7, 4, 8, 64, 512, "swiglu", True),
     (4096, 8, 64, 512, 384, "swiglu", True)],
)  # fmt: skip
def test_z_and_h_in_one_launch(tokens, k, experts, hidden, n, act, transposed):
    if not _sm90():
        pytest.skip("preact: sm_90a")
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, hidden, device="cuda", generator=gen).to(BF)
    if transposed:  # (E, K, N) view of (E, N, K): the nn.Linear storage
        w = (torch.randn(experts, n, hidden, device="cuda", generator=gen) / hidden**0.5).to(BF).transpose(1, 2)
    else:
        w = (torch.randn(experts, hidden, n, device="cuda", generator=gen) / hidden**0.5).to(BF)
    idx, offs = _routing(tokens, k, experts, gen)
    rows, tail = idx.shape[0], 5
    idx = torch.cat([idx, torch.zeros(tail, dtype=torch.int32, device="cuda")])
    assert gather.preact_route(x, w, offs, act)
    z = torch.full((rows + tail, n), float("nan"), dtype=BF, device="cuda")
    h = torch.full((rows + tail, n // 2), float("nan"), dtype=BF, device="cuda")
    gather.gathered_grouped_gemm(x, w, gather_index=idx, run=None, offs=offs, activation=act, out=h, preact_out=z)
    assert z[rows:].isnan().all() and h[rows:].isnan().all()
    xg = x[idx[:rows].long()]
    cfg = _tile_cfg(rows, w, act)
    z_same = cutegemm.grouped_gemm(xg, w, offs=offs, config=replace(cfg, gather_a=False, epilogue=EpilogueSpec()))
    h_same = cutegemm.grouped_gemm(xg, w, offs=offs, activation=act,
                                   config=replace(cfg, gather_a=False, epilogue=EpilogueSpec(gated=act)))  # fmt: skip
    assert torch.equal(z[:rows], z_same), "Z differs from the same tile's packed kernel"
    assert torch.equal(h[:rows], h_same), "H differs from the same tile's gated packed kernel"
    # H against fp64 (per expert), within 2x torch's bf16 error (torch: the two-step bf16 path)
    ref = torch.empty(rows, n // 2, dtype=torch.float64, device="cuda")
    torch_bf16 = torch.empty(rows, n // 2, dtype=BF, device="cuda")
    start = 0
    for e, end in enumerate(offs.tolist()):
        acc = xg[start:end].double() @ w[e].double()
        ref[start:end] = epilogue_ref(acc, activation=act)
        zt = xg[start:end] @ w[e]  # torch bf16
        torch_bf16[start:end] = epilogue_ref(zt.float(), activation=act).to(BF)
        start = end
    assert_within_torch_error(h[:rows].double(), torch_bf16.double(), ref, what="H")
    # run twice: the warm plan, bitwise the same
    z2, h2 = torch.empty_like(z), torch.empty_like(h)
    gather.gathered_grouped_gemm(x, w, gather_index=idx, run=None, offs=offs, activation=act, out=h2, preact_out=z2)
    assert torch.equal(z2[:rows], z[:rows]) and torch.equal(h2[:rows], h[:rows])


def test_routed_layer_on_the_one_launch_route(monkeypatch):
    if not _sm90():
        pytest.skip("preact: sm_90a")
    gen = torch.Generator(device="cuda").manual_seed(1)
    T, H, I, E, K = 2048, 512, 256, 32, 4
    x = torch.randn(T, H, device="cuda", generator=gen).to(BF)
    ids = torch.randint(0, E, (T, K), device="cuda", generator=gen)
    wts = torch.rand(T, K, device="cuda", generator=gen).to(BF)
    w1 = (torch.randn(E, 2 * I, H, device="cuda", generator=gen) / H**0.5).to(BF).mT
    w2 = (torch.randn(E, H, I, device="cuda", generator=gen) / I**0.5).to(BF).mT
    dout = torch.randn(T, H, device="cuda", generator=gen).to(BF)
    calls = []
    real = gather.gathered_grouped_gemm

    def counting(*a, **kw):
        calls.append(kw.get("preact_out") is not None)
        return real(*a, **kw)

    monkeypatch.setattr(moe, "gathered_grouped_gemm", counting)
    monkeypatch.setattr(moe, "gather_pays", lambda *a: True)

    def run():
        leaves = [t.detach().clone().requires_grad_() for t in (x, wts, w1, w2)]
        out = moe.routed_experts(leaves[0], ids, *leaves[1:])
        out.backward(dout)
        return [out] + [t.grad for t in leaves]

    got = run()
    assert calls == [True]
    assert all(torch.equal(a, b) for a, b in zip(got, run(), strict=True)), "not deterministic"
    monkeypatch.setattr(moe, "preact_route", lambda *a: False)
    ref = run()
    assert calls == [True, True]
    for g, r in zip(got, ref, strict=True):  # H from fp32 accumulators vs from Z rounded to bf16
        torch.testing.assert_close(g.float(), r.float(), rtol=2e-2, atol=2e-2)
