"""The K-grouped form reading one operand through the routing index
(``grouped.k_grouped.grouped_k_gather``: the routed MoE layer's weight gradients from x and dout as
they are) on the CPU: the config rules, the compiled variants' cp.async loads, the host route with
the compiled kernel replaced by tests/emulated_kernel.py (it reads the gathered operand's K rows
through the index it is handed, clamped, as the kernel's producer does) against the gathered copy's
product, NaN-free with empty experts; the copying route where the kernel does not take the call;
and ``moe.routed_experts``' backward with ``GATHER_WEIGHT_GRADS`` against its copying backward.
The kernel's own loads are the GPU tests' (tests/gpu/test_kgrouped_gather_gpu.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cutegemm import moe
from cutegemm.config import Form, GemmConfig, config_errors
from cutegemm.grouped import k_grouped
from cutegemm.grouped.k_grouped import grouped_k_gather

from ..emulated_kernel import emulated_kernels

BF = torch.bfloat16


def _routing(tokens: int, k: int, experts: int, gen, spill: int = 0):
    """(rows, offs): the token of every (token, slot) pair sorted by expert; ``spill`` pairs past
    offs[-1] (routed outside the experts)."""
    ids = torch.randint(0, experts, (tokens * k,), generator=gen)
    ids[: min(spill, ids.numel())] = experts
    order = torch.argsort(ids, stable=True)
    counts = torch.bincount(ids, minlength=experts + 1)[:experts]
    return (order // k).to(torch.int32), counts.cumsum(0).to(torch.int32)


def _expected(a, b, offs, rows, gather):
    rows_of = a if gather == "a" else b
    g = rows_of.index_select(0, rows.long()).float()
    A, B = (g.mT, b.float()) if gather == "a" else (a.float(), g)
    out, start = [], 0
    for end in offs.tolist():
        end = min(max(end, start), A.shape[1])
        out.append(A[:, start:end] @ B[start:end])
        start = end
    return torch.stack(out)


KG = dict(arch="sm_90a", form=Form.KGROUPED, a_major="m", b_major="n", tile_m=128, tile_n=128)


def test_rules():
    assert config_errors(GemmConfig(**KG, gather_a=True)) == []
    assert config_errors(GemmConfig(**KG, gather_b=True, pingpong=True)) == []
    assert config_errors(GemmConfig(**KG, gather_a=True, cluster_m=2)) == []  # B multicast beside a gathered A
    assert config_errors(GemmConfig(**KG, gather_b=True, cluster_n=2)) == []
    for bad in (dict(gather_a=True, gather_b=True), dict(gather_a=True, cluster_n=2), dict(gather_b=True, cluster_m=2),
                dict(gather_a=True, scheduler="dynamic"), dict(gather_a=True, a_major="k"), dict(gather_b=True, b_major="k"),
                dict(gather_a=True, tile_m=192), dict(gather_b=True, tile_n=96), dict(gather_a=True, arch="sm_100a")):  # fmt: skip
        assert config_errors(GemmConfig(**{**KG, **bad})), bad
    assert config_errors(GemmConfig(arch="sm_90a", form=Form.GROUPED, gather_b=True))
    assert GemmConfig(**KG, gather_b=True).name != GemmConfig(**KG, gather_a=True).name


def test_variants_load_by_cp_async():
    from cutegemm.compile_check import check_config, stage_data_bytes
    from cutegemm.variants import kgrouped_variants

    cfgs = [c for c in kgrouped_variants("sm_90a") if c.gathers]
    assert {c.gather_a for c in cfgs} == {True, False}
    assert stage_data_bytes(replace(cfgs[0], gather_a=False, gather_b=False)) > stage_data_bytes(cfgs[0])
    res = check_config(cfgs[1])  # gather_b, pingpong
    assert res.ok, res.error
    assert res.markers["LDGSTS"] > 0 and res.markers["ARRIVES.LDGSTSBAR"] > 0 and res.markers["LDL"] == 0


@settings(max_examples=25, deadline=None)
@given(tokens=st.integers(1, 40), k=st.integers(1, 3), experts=st.integers(1, 6), m=st.sampled_from([8, 16, 40]),
       n=st.sampled_from([8, 24, 136]), gather=st.sampled_from("ab"), spill=st.integers(0, 3), seed=st.integers(0, 99))  # fmt: skip
@example(tokens=1, k=1, experts=1, m=8, n=8, gather="b", spill=0, seed=0)  # one K column: the copy route
@example(tokens=1, k=1, experts=1, m=8, n=8, gather="a", spill=0, seed=0)
def test_kernel_route_against_the_copy(tokens, k, experts, m, n, gather, spill, seed):
    gen = torch.Generator().manual_seed(seed)
    rows, offs = _routing(tokens, k, experts, gen, spill)
    R = rows.numel()
    if gather == "a":  # a: the tokens' rows (tokens, M), b (R, N)
        a, b = torch.randn(tokens, m, generator=gen).to(BF), torch.randn(R, n, generator=gen).to(BF)
    else:  # a (M, R) as the weight gradient's transposed view, b: the tokens' rows (tokens, N)
        a, b = torch.randn(R, m, generator=gen).to(BF).mT, torch.randn(tokens, n, generator=gen).to(BF)
    with emulated_kernels() as cache:
        out = grouped_k_gather(a, b, offs, rows, gather, torch.float32)
    used = [kk.cfg for kk in cache.kernels]
    assert len(used) == 1
    if R >= 8 or used[0].gathers:  # (an A of fewer than 8 K columns beside a gathered B is not TMA-readable: the copy)
        assert used[0].gather_a == (gather == "a") and used[0].gather_b == (gather == "b")
        assert (used[0].cluster_n if gather == "a" else used[0].cluster_m) == 1 and used[0].scheduler == "static"
    assert out.shape == (experts, m, n) and not out.isnan().any()
    torch.testing.assert_close(out, _expected(a, b, offs, rows, gather), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("what", ["int64 index", "odd rows", "fp32", "k-major a"])
def test_other_calls_take_the_copying_route(monkeypatch, what):
    gen = torch.Generator().manual_seed(0)
    rows, offs = _routing(12, 2, 3, gen)
    x, dz = torch.randn(12, 16, generator=gen).to(BF), torch.randn(24, 32, generator=gen).to(BF)
    gather = "a"
    if what == "int64 index":
        rows = rows.long()
    elif what == "odd rows":
        x = x[:, :12]
    elif what == "fp32":
        x, dz = x.float(), dz.float()
    else:  # gather b with a K-major a: the kernel takes MN-major A only with... a (M, R) row-major is K-major
        gather, x, dz = "b", torch.randn(16, 24, generator=gen).to(BF), torch.randn(12, 32, generator=gen).to(BF)
    copies = []
    monkeypatch.setattr(k_grouped, "grouped_k", lambda a, b, offs, *rest: copies.append(1) or _expected_plain(a, b, offs))
    with emulated_kernels() as cache:
        out = grouped_k_gather(x, dz, offs, rows, gather, torch.float32)
    if what == "k-major a":  # the gathered operand is fine: the kernel takes a K-major A beside a gathered B
        assert not copies and len(cache.kernels) == 1
    else:
        assert copies == [1] and not cache.kernels
    torch.testing.assert_close(out, _expected(x, dz, offs, rows, gather), rtol=1e-5, atol=1e-4)


def _expected_plain(a, b, offs):
    out, start = [], 0
    for end in offs.tolist():
        out.append(a[:, start:end].float() @ b[start:end].float())
        start = end
    return torch.stack(out)


def test_bad_arguments():
    rows, offs = torch.zeros(6, dtype=torch.int32), torch.tensor([6], dtype=torch.int32)
    with pytest.raises(ValueError, match="gather"):
        grouped_k_gather(torch.randn(4, 8), torch.randn(6, 8), offs, rows, "c")
    with pytest.raises(ValueError, match="index of 6"):
        grouped_k_gather(torch.randn(4, 8), torch.randn(6, 8), offs, rows[:5], "a")


@settings(max_examples=25, deadline=None)
@given(tokens=st.integers(1, 40), k=st.integers(1, 3), experts=st.integers(1, 6), m=st.sampled_from([8, 16, 40]),
       n=st.sampled_from([8, 24, 136]), spill=st.integers(0, 3), seed=st.integers(0, 99))  # fmt: skip
def test_transposed_result(tokens, k, experts, m, n, spill, seed):
    """``transposed``: a contiguous (E, N, M) result holding out[e]^T, stored by the kernel M-major
    (config.c_major "m"), in place: no transposing copy; the copy route where the kernel does not run."""
    gen = torch.Generator().manual_seed(seed)
    rows, offs = _routing(tokens, k, experts, gen, spill)
    a, b = torch.randn(tokens, m, generator=gen).to(BF), torch.randn(rows.numel(), n, generator=gen).to(BF)
    with emulated_kernels() as cache:
        out = grouped_k_gather(a, b, offs, rows, "a", BF, transposed=True)
    assert out.shape == (experts, n, m) and out.is_contiguous()
    used = [kk.cfg for kk in cache.kernels]
    assert len(used) == 1 and used[0].c_major == "m"
    assert used[0].gather_a or rows.numel() < 8  # (fewer than 8 K positions: the copy, then the TMA kernel)
    torch.testing.assert_close(out.float(), _expected(a, b, offs, rows, "a").mT, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("storage", ["plain", "transposed"])
@pytest.mark.parametrize("wide_a", [None, (128, 256)])
def test_routed_backward_reads_x_and_dout_through_the_index(monkeypatch, storage, wide_a):
    """GATHER_WEIGHT_GRADS: the same gradients as the copying backward (the emulated kernels, fp32
    math both ways), with both weight gradients from the gathering kernel's gather "a" where it has
    its tile (k_grouped.GATHER_WIDE_TILE["a"]), one of them stored M-major into its weight's
    layout (dW_down for plain storage, dW_gate_up for transposed), else the copies."""
    tiles = {"a": wide_a, "b": (128, 256)}
    gen = torch.Generator().manual_seed(3)
    T, H, I, E, K = 20, 16, 8, 4, 2
    x = torch.randn(T, H, generator=gen).to(BF)
    ids = torch.randint(0, E, (T, K), generator=gen)
    wts = torch.rand(T, K, generator=gen).to(BF)
    if storage == "plain":
        w1, w2 = torch.randn(E, H, 2 * I, generator=gen).to(BF) / 4, torch.randn(E, I, H, generator=gen).to(BF) / 4
    else:
        w1 = (torch.randn(E, 2 * I, H, generator=gen).to(BF) / 4).mT
        w2 = (torch.randn(E, H, I, generator=gen).to(BF) / 4).mT
    dout = torch.randn(T, H, generator=gen).to(BF)

    def grads(flag):
        monkeypatch.setattr(moe, "GATHER_WEIGHT_GRADS", flag)
        monkeypatch.setattr(moe, "GATHER_WIDE_TILE", tiles)
        leaves = [t.detach().clone().requires_grad_() for t in (x, wts, w1, w2)]
        with emulated_kernels() as cache:
            monkeypatch.setattr(moe, "eager_cuda", lambda t: True)
            monkeypatch.setattr(moe, "gather_pays", lambda *a: True)
            moe.routed_experts(leaves[0], ids, *leaves[1:]).backward(dout)
            monkeypatch.undo()
            monkeypatch.setattr(moe, "GATHER_WEIGHT_GRADS", flag)
        return [t.grad for t in leaves], [kk.cfg for kk in cache.kernels]

    ref, ref_cfgs = grads(False)
    got, cfgs = grads(True)
    gathering = [c for c in cfgs if c.gathers and c.kgrouped]
    assert len(gathering) == (2 if wide_a else 0) and all(c.gather_a for c in gathering)
    assert sum(c.c_major == "m" for c in gathering) == (1 if wide_a else 0)
    assert not any(c.gathers and c.kgrouped for c in ref_cfgs)
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(g.float(), r.float(), rtol=2e-2, atol=2e-2)
