"""The gathering K-grouped kernel (``grouped.k_grouped.grouped_k_gather``: GemmConfig.kgrouped
with gather_a / gather_b, sm_90a): one operand's K rows loaded through the routing index by
cp.async. Bitwise against the same tile's K-grouped kernel on the gathered copy (the same WGMMAs
in the same order); against the fp64 product; NaN / Inf in rows the index never reads and in K
positions past offs[-1] stay out; empty experts give zeros; determinism; a CUDA-graph replay
with new routing; ``moe.routed_experts``' backward with ``GATHER_WEIGHT_GRADS`` against its
copying backward."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cutegemm import moe
from cutegemm.grouped import k_grouped
from cutegemm.grouped.k_grouped import grouped_k, grouped_k_gather

pytestmark = pytest.mark.gpu
BF = torch.bfloat16


def _sm90():
    return torch.cuda.get_device_capability()[0] == 9


def _routing(tokens, k, experts, gen, spill=0):
    ids = torch.randint(0, experts, (tokens * k,), generator=gen, device="cuda")
    ids[:spill] = experts  # routed outside the experts: positions past offs[-1]
    order = torch.argsort(ids, stable=True)
    offs = torch.bincount(ids, minlength=experts + 1)[:experts].cumsum(0).to(torch.int32)
    return (order // k).to(torch.int32), offs


def _operands(tokens, k, experts, m, n, gather, gen, spill=0, extra=0):
    """(a, b, rows, offs): the gathered operand holds ``extra`` more token rows than the routing
    reads (NaN), the other operand NaN at the positions past offs[-1]."""
    rows, offs = _routing(tokens, k, experts, gen, spill)
    R = rows.numel()
    toks = torch.randn(tokens + extra, m if gather == "a" else n, device="cuda", generator=gen).to(BF)
    toks[tokens:] = float("nan")
    other = torch.randn(R, n if gather == "a" else m, device="cuda", generator=gen).to(BF)
    other[int(offs[-1]) if experts else 0 :] = float("inf")
    return (toks, other, rows, offs) if gather == "a" else (other.mT, toks, rows, offs)


def _copy_route(a, b, rows, offs, gather, out_dtype):
    """The plain K-grouped kernel on the gathered copy, with the gathering call's tile."""
    cfg = next(p[3] for p in k_grouped._KG_GATHER.values() if p)
    g = (a if gather == "a" else b).index_select(0, rows.long())
    a2, b2 = (g.mT, b) if gather == "a" else (a, g)
    return grouped_k(a2, b2, offs, None, out_dtype, 1.0, False, config=replace(cfg, gather_a=False, gather_b=False))


def _reference(a, b, rows, offs, gather):
    g = (a if gather == "a" else b).index_select(0, rows.long()).double()
    A, B = (g.mT, b.double()) if gather == "a" else (a.double(), g)
    out, start = [], 0
    for end in offs.tolist():
        end = max(end, start)
        out.append(A[:, start:end] @ B[start:end])
        start = end
    return torch.stack(out)


def _check(tokens, k, experts, m, n, gather, out_dtype=BF, spill=0, seed=0, transposed=False):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a, b, rows, offs = _operands(tokens, k, experts, m, n, gather, gen, spill, extra=5)
    k_grouped._KG_GATHER.clear()
    out = grouped_k_gather(a, b, offs, rows, gather, out_dtype)
    if transposed:  # the same tile storing M-major (config.c_major "m"): each out[e]^T, the same bits
        got = grouped_k_gather(a, b, offs, rows, gather, out_dtype, transposed=True)
        assert got.shape == (experts, n, m) and got.is_contiguous()
        cfgs = [p[3] for p in k_grouped._KG_GATHER.values() if p]
        assert (len(cfgs) == 2 and sorted(c.c_major for c in cfgs) == ["m", "n"]) or rows.numel() < 8
        assert torch.equal(got, out.mT)
    kernel = all(k_grouped._KG_GATHER.values())  # (a degenerate A of one K column takes the copy)
    assert kernel or rows.numel() < 8, "the kernel route did not run"
    assert torch.isfinite(out).all()
    clean_a, clean_b = a.nan_to_num(0.0, 0.0, 0.0), b.nan_to_num(0.0, 0.0, 0.0)
    ref = _reference(clean_a, clean_b, rows, offs, gather)
    tol = 1e-2 if out_dtype == BF else 2e-4
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol * ref.abs().max().item() + 1e-6)
    # The copy route with the same tile: the copies hold the same positions (inf past offs[-1]
    # zeroed in shared memory by both); a copy of fewer than 8 positions is not M-major
    if kernel and rows.numel() >= 8:
        assert torch.equal(out, _copy_route(a, b, rows, offs, gather, out_dtype))


@pytest.mark.parametrize("gather", ["a", "b"])
@pytest.mark.parametrize("tokens,k,experts,m,n", [(512, 8, 32, 2048, 1536), (1000, 4, 16, 1024, 256),
                                                  (64, 8, 128, 2048, 768), (3, 2, 5, 136, 40)])  # fmt: skip
def test_gathered_weight_gradient(tokens, k, experts, m, n, gather):
    if not _sm90():
        pytest.skip("the gathering K-grouped kernel is sm_90a")
    _check(tokens, k, experts, m, n, gather, spill=7)


@pytest.mark.parametrize("tokens,k,experts,m,n", [(512, 8, 32, 1536, 2048), (1000, 4, 16, 256, 1024), (70, 3, 9, 200, 264)])
def test_gathered_b_in_wide_tiles(monkeypatch, tokens, k, experts, m, n):
    """gather "b" in the 128x256 tile (k_grouped.GATHER_WIDE_TILE["b"], off by default): the
    gathered operand's 256-value rows."""
    if not _sm90():
        pytest.skip("the gathering K-grouped kernel is sm_90a")
    monkeypatch.setitem(k_grouped.GATHER_WIDE_TILE, "b", (128, 256))
    _check(tokens, k, experts, m, n, "b", spill=5)
    assert next(p[3] for p in k_grouped._KG_GATHER.values() if p).tile_n == 256


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tokens=st.integers(1, 300), k=st.integers(1, 8), experts=st.integers(1, 40), m=st.sampled_from([8, 64, 200, 512]),
       n=st.sampled_from([8, 128, 264]), gather=st.sampled_from("ab"), fp32=st.booleans(), spill=st.integers(0, 9),
       seed=st.integers(0, 10**6))  # fmt: skip
def test_gathered_hypothesis(tokens, k, experts, m, n, gather, fp32, spill, seed):
    if not _sm90():
        pytest.skip("the gathering K-grouped kernel is sm_90a")
    _check(tokens, k, experts, m, n, gather, torch.float32 if fp32 else BF, spill, seed, transposed=not fp32)


@pytest.mark.parametrize("tokens,k,experts,m,n", [(2048, 8, 128, 2048, 1536), (1000, 4, 16, 1024, 256), (3, 2, 5, 136, 40)])
def test_gathered_a_stored_m_major(tokens, k, experts, m, n):
    """gather "a" with ``transposed`` (dW_gate_up = x[rows]^T dZ into an (E, 2I, H) weight): the
    (E, N, M) result is the plain call's transposed, bit for bit (the same tile's WGMMAs)."""
    if not _sm90():
        pytest.skip("the gathering K-grouped kernel is sm_90a")
    _check(tokens, k, experts, m, n, "a", spill=3, transposed=True)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counts=st.lists(st.integers(0, 300), min_size=1, max_size=9), m=st.sampled_from([8, 64, 200, 512]),
       n=st.sampled_from([7, 128, 264]), a_t=st.booleans(), seed=st.integers(0, 10**6))  # fmt: skip
def test_k_grouped_into_an_m_major_out(counts, m, n, a_t, seed):
    """The TMA K-grouped kernel with ``out`` the transposed view of a NaN-poisoned (E, N, M) buffer:
    stored M-major in place, the N-major result's bits (one launch; the same tile)."""
    if not _sm90():
        pytest.skip("the K-grouped kernel is sm_90a")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    K = int(offs[-1])
    x = torch.randn(m, K, device="cuda", generator=gen).to(BF) if not a_t else torch.randn(K, m, device="cuda", generator=gen).to(BF).t()
    dy = torch.randn(K, n, device="cuda", generator=gen).to(BF)
    ref = grouped_k(x, dy, offs, None, BF, 1.0, False)
    buf = torch.full((len(counts), n, m), float("nan"), dtype=BF, device="cuda")
    k_grouped._KG_PLANS.clear()
    got = grouped_k(x, dy, offs, buf.mT, BF, 1.0, False)
    plans = [p for p in k_grouped._KG_PLANS.values() if p]
    assert got.data_ptr() == buf.data_ptr() and not buf.isnan().any()
    assert K == 0 or (len(plans) == 1 and plans[0][1][2][1][0] == 1)  # C's kernel view: M-major (unit stride along M)
    assert torch.equal(buf.mT, ref)


def test_graph_replay_and_determinism():
    if not _sm90():
        pytest.skip("the gathering K-grouped kernel is sm_90a")
    gen = torch.Generator(device="cuda").manual_seed(1)
    a, b, rows, offs = _operands(1024, 8, 64, 2048, 768, "b", gen)
    b = b.nan_to_num(0.0)
    first = grouped_k_gather(a, b, offs, rows, "b")
    for _ in range(3):
        assert torch.equal(first, grouped_k_gather(a, b, offs, rows, "b"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = grouped_k_gather(a, b, offs, rows, "b")
    new_rows, new_offs = _routing(1024, 8, 64, gen)
    rows.copy_(new_rows)
    offs.copy_(new_offs)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, grouped_k_gather(a, b, offs, rows, "b"))


@pytest.mark.parametrize("storage", ["plain", "transposed"])
def test_routed_backward_through_the_index(monkeypatch, storage):
    if not _sm90():
        pytest.skip("the gathering K-grouped kernel is sm_90a")
    gen = torch.Generator(device="cuda").manual_seed(2)
    T, H, I, E, K = 1024, 1024, 384, 32, 8
    x = torch.randn(T, H, device="cuda", generator=gen).to(BF)
    ids = torch.randint(0, E, (T, K), device="cuda", generator=gen)
    wts = torch.rand(T, K, device="cuda", generator=gen).to(BF)
    w1 = torch.randn(E, H, 2 * I, device="cuda", generator=gen).to(BF) / 32
    w2 = torch.randn(E, I, H, device="cuda", generator=gen).to(BF) / 16
    if storage == "transposed":
        w1, w2 = w1.mT.contiguous().mT, w2.mT.contiguous().mT
    dout = torch.randn(T, H, device="cuda", generator=gen).to(BF)

    def grads(flag):
        monkeypatch.setattr(moe, "GATHER_WEIGHT_GRADS", flag)
        leaves = [t.detach().clone().requires_grad_() for t in (x, wts, w1, w2)]
        moe.routed_experts(leaves[0], ids, *leaves[1:]).backward(dout)
        return [t.grad for t in leaves]

    ref, got = grads(False), grads(True)
    for g, r in zip(got, ref, strict=True):
        assert g.stride() == r.stride()
        err = (g.float() - r.float()).abs().max().item()
        assert err <= 2e-2 * r.float().abs().max().item(), err
    assert all(torch.equal(g, h) for g, h in zip(got, grads(True), strict=True))  # deterministic
