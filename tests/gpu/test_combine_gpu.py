"""The one-pass row combines (cutegemm.epilogue.combine) on the GPU: the kernel against an fp64
reference within 2x the error of torch's unpermute / product / sum in the same dtype, bitwise
equal on a second call, the dot beside it; ``moe.combine`` and ``gather_tokens`` forward and
backward against torch's formulas; the MoE layer trained through them (bench/moe.py's cutegemm
route) against the fp64 reference within 2x the torch path's error."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cutegemm import ops
from cutegemm.epilogue.combine import combine_rows_cuda, kernel_takes
from cutegemm.moe import combine, gather_tokens, inverse_permutation

pytestmark = pytest.mark.gpu


def _routing(tokens, k, experts, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    ids = torch.randint(0, experts, (tokens, k), device="cuda", generator=g)
    return torch.argsort(ids.reshape(-1), stable=True), g


def _err(x, ref):
    return ((x.double() - ref).abs().max() / ref.abs().max().clamp(min=1e-30)).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens,k,hidden", [(1, 1, 8), (37, 3, 24), (4099, 8, 2048), (513, 2, 4096), (300, 8, 7168)])
def test_combine_forward_and_backward(dtype, tokens, k, hidden):
    order, g = _routing(tokens, k, 16, tokens + k + hidden)
    y = torch.randn(tokens * k, hidden, device="cuda", generator=g).to(dtype).requires_grad_()
    w = torch.rand(tokens, k, device="cuda", generator=g).requires_grad_()
    dout = torch.randn(tokens, hidden, device="cuda", generator=g).to(dtype)
    inv = inverse_permutation(order)
    assert kernel_takes(y.detach(), inv.to(torch.int32), w.detach().reshape(-1))

    out = combine(y, order, k, w)
    dy, dw = torch.autograd.grad(out, (y, w), dout)
    # torch's way (transformers): unpermute, product in the operands' dtype, sum
    yt, wt = y.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    same = (yt[inv].view(tokens, k, hidden) * wt.unsqueeze(-1)).sum(1).to(dtype)
    dyt, dwt = torch.autograd.grad(same, (yt, wt), dout)
    yd, wd = y.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = (yd[inv].view(tokens, k, hidden) * wd.unsqueeze(-1)).sum(1)
    dyr, dwr = torch.autograd.grad(ref, (yd, wd), dout.double())
    for what, ours, theirs, exact in (("out", out, same, ref), ("dy", dy, dyt, dyr), ("dw", dw, dwt, dwr)):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, what
        assert _err(ours, exact) <= 2 * max(_err(theirs, exact), torch.finfo(dtype).eps), (what, _err(ours, exact))
    again = combine(y, order, k, w)
    assert torch.equal(out, again), "not bitwise reproducible"
    assert torch.equal(dy, torch.autograd.grad(again, (y, w), dout)[0])


@pytest.mark.parametrize("tokens,k,hidden", [(37, 3, 24), (4099, 8, 2048)])
def test_gather_tokens_backward_sums_in_one_pass(tokens, k, hidden):
    order, g = _routing(tokens, k, 16, 7)
    x = torch.randn(tokens, hidden, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    rows = gather_tokens(x, order, k)
    grad = torch.randn_like(rows)
    (dx,) = torch.autograd.grad(rows, x, grad)
    ref = grad.double()[inverse_permutation(order)].view(tokens, k, hidden).sum(1)
    same = grad[inverse_permutation(order)].view(tokens, k, hidden).sum(1)
    assert _err(dx, ref) <= 2 * max(_err(same, ref), 2**-8)
    assert torch.equal(dx, torch.autograd.grad(gather_tokens(x, order, k), x, grad)[0])


def test_kernel_dot_and_fallbacks():
    g = torch.Generator(device="cuda").manual_seed(1)
    src = torch.randn(50, 64, device="cuda", generator=g).to(torch.bfloat16)
    idx = torch.randint(0, 50, (33,), device="cuda", generator=g, dtype=torch.int32)
    w = torch.rand(33, device="cuda", generator=g)
    other = torch.randn(33, 64, device="cuda", generator=g).to(torch.bfloat16)
    out, dots = combine_rows_cuda(src, idx, w, 1, other)
    ref_out, ref_dots = ops._combine_rows_torch(src, idx, w, 1, other)
    exact = (src.double()[idx.long()] * other.double()).sum(1)
    assert torch.allclose(out.float(), ref_out.float(), rtol=2**-8, atol=0)
    assert (dots.double() - exact).abs().max() <= 2 * max((ref_dots.double() - exact).abs().max().item(), 1e-5)
    # H not a multiple of 8, or an unaligned view: the torch formulas, same semantics
    odd = torch.randn(50, 60, device="cuda", generator=g).to(torch.bfloat16)
    assert not kernel_takes(odd, idx, w)
    out_odd, _ = ops.combine_rows(odd, idx, w, 3)
    assert torch.equal(out_odd, ops._combine_rows_torch(odd, idx, w, 3)[0])
    view = torch.randn(50, 72, device="cuda", generator=g).to(torch.bfloat16)[:, 1:65]
    assert not kernel_takes(view, idx, w)
    assert torch.equal(ops.combine_rows(view, idx, w, 3)[0], ops._combine_rows_torch(view, idx, w, 3)[0])


def test_moe_layer_trains_through_the_combine():
    """bench/moe.py's cutegemm route (gather_tokens, grouped_experts, combine) on a small layer:
    output and every gradient within 2x the torch route's error against fp64."""
    from cutegemm.bench import moe

    shape = moe.Shape("small", 512, 256, 128, 8, 4)
    layer = moe.make_layer(shape)
    ours = moe.check(moe.build_runner("cutegemm", layer), layer)
    theirs = moe.check(moe.build_runner("torch", layer), layer)
    for key, err in ours.items():
        assert err <= 2 * max(theirs[key], 2**-8), (key, err, theirs[key])


@pytest.mark.parametrize("tokens,rows,hidden", [(1, 3, 8), (100, 257, 24), (5000, 40000, 2048)])
def test_gather_rows_backward_by_the_ragged_kernel(tokens, rows, hidden, monkeypatch):
    """moe.gather_rows' backward (the ragged row-combine kernel, ops.RAGGED_KERNEL on): any index,
    some tokens absent, within 2x torch's index_add error of fp64, bitwise equal on a second call."""
    from cutegemm.moe import gather_rows

    monkeypatch.setattr(ops, "RAGGED_KERNEL", True)
    g = torch.Generator(device="cuda").manual_seed(tokens + rows)
    index = torch.randint(0, max(1, tokens // 2 + 1), (rows,), device="cuda", generator=g)
    x = torch.randn(tokens, hidden, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    grad = torch.randn(rows, hidden, device="cuda", generator=g).to(torch.bfloat16)
    (dx,) = torch.autograd.grad(gather_rows(x, index), x, grad)
    ref = torch.zeros(tokens, hidden, dtype=torch.float64, device="cuda").index_add_(0, index, grad.double())
    same = torch.zeros_like(x).index_add_(0, index, grad)
    assert _err(dx, ref) <= 2 * max(_err(same, ref), 2**-8)
    assert torch.equal(dx, torch.autograd.grad(gather_rows(x, index), x, grad)[0])


@pytest.mark.parametrize("ragged", [False, True])
def test_moe_layer_trains_through_the_gather_index(ragged, monkeypatch):
    """bench/moe.py's cutegemm-gather route (grouped_experts with gather_index: the copy by
    gather_rows while a gradient is needed, its backward by the ragged kernel or index_select's):
    errors within 2x the torch route's."""
    from cutegemm.bench import moe

    monkeypatch.setattr(ops, "RAGGED_KERNEL", ragged)
    layer = moe.make_layer(moe.Shape("small", 512, 256, 128, 8, 4))
    ours = moe.check(moe.build_runner("cutegemm-gather", layer), layer)
    theirs = moe.check(moe.build_runner("torch", layer), layer)
    for key, err in ours.items():
        assert err <= 2 * max(theirs[key], 2**-8), (key, err, theirs[key])


@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(1, 300), k=st.integers(1, 8), chunks=st.integers(1, 40), experts=st.integers(1, 64),
       dtype=st.sampled_from([torch.bfloat16, torch.float16]), seed=st.integers(0, 2**16))  # fmt: skip
def test_combine_hypothesis(tokens, k, chunks, experts, dtype, seed):
    """moe.combine on random routings and widths (H = 8 .. 320), forward and backward: within 2x
    the error of torch's unpermute / product / sum against fp64, bitwise equal on a second call."""
    hidden = 8 * chunks
    order, g = _routing(tokens, k, experts, seed)
    y = torch.randn(tokens * k, hidden, device="cuda", generator=g).to(dtype).requires_grad_()
    w = torch.rand(tokens, k, device="cuda", generator=g).requires_grad_()
    dout = torch.randn(tokens, hidden, device="cuda", generator=g).to(dtype)
    inv = inverse_permutation(order)
    out = combine(y, order, k, w)
    grads = torch.autograd.grad(out, (y, w), dout)
    same = (y[inv].view(tokens, k, hidden) * w.unsqueeze(-1)).sum(1).to(dtype)
    same_grads = torch.autograd.grad(same, (y, w), dout)
    yd, wd = y.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = (yd[inv].view(tokens, k, hidden) * wd.unsqueeze(-1)).sum(1)
    ref_grads = torch.autograd.grad(ref, (yd, wd), dout.double())
    for ours, theirs, exact in zip((out, *grads), (same, *same_grads), (ref, *ref_grads), strict=True):
        assert _err(ours, exact) <= 2 * max(_err(theirs, exact), torch.finfo(dtype).eps)
    assert torch.equal(out, combine(y, order, k, w))
