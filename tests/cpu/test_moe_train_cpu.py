"""CPU: training through the gated MoE experts (cutegemm.moe.grouped_experts, nn.GroupedExperts).

On CPU tensors every grouped GEMM runs the reference twin, so the whole autograd path (forward
saving the pre-activations, the backward's packed and K-grouped GEMMs, the SwiGLU / GeGLU
derivative on interleaved or [gate | up] columns, weights stored either way round) is checked
here against plain-torch autograd: fp64 gradcheck, hypothesis over sizes with empty experts, zero
tokens and rows past offs[-1] (fp32 and bf16), the no-grad fused path, NaN in the unused rows of
dY, bad inputs, and torch.compile(fullgraph=True, backend="aot_eager") of a training step.
The same checks through the kernels are in tests/gpu/test_moe_train_gpu.py."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from cutegemm.epilogue import gated_ref, split_gate_up
from cutegemm.moe import (
    gather_tokens,
    grouped_experts,
    inverse_permutation,
    permute_rows,
    unpermute_rows,
)
from cutegemm.nn import GroupedExperts
from cutegemm.ops import activation_grad, gated_grads

from ..gemm_check import assert_within_torch_error

F64 = torch.float64
BF16 = torch.bfloat16
# the gated forms written out (swiglu_oai as gpt-oss's model code has it: alpha 1.702, limit 7)
ACT = {
    "swiglu": lambda gate, up: F.silu(gate) * up,
    "geglu": lambda gate, up: F.gelu(gate) * up,
    "swiglu_oai": lambda gate, up: (up.clamp(-7.0, 7.0) + 1) * (gate.clamp(max=7.0) * torch.sigmoid(gate.clamp(max=7.0) * 1.702)),
}


def gated_activation(z, activation, gate_layout, dtype):
    """The two-step formula: ``act(gate) * up`` of Z's gate/up columns in fp32 (fp64 for fp64),
    cast to ``dtype``."""
    cd = torch.float64 if z.dtype == torch.float64 else torch.float32
    gate, up = split_gate_up(z.to(cd), gate_layout)
    return gated_ref(activation, gate, up).to(dtype)


def make_offs(counts):
    return torch.tensor(counts, dtype=torch.int32).cumsum(0, dtype=torch.int32)


def split(z, layout):
    n = z.shape[-1] // 2
    return (z[..., :n], z[..., n:]) if layout == "halves" else (z[..., 0::2], z[..., 1::2])


def experts_torch(x, w1, w2, counts, activation="swiglu", layout="interleaved"):
    """Plain torch, one expert at a time: w1 (E, H, 2I) and w2 (E, I, H) are the b operands.
    In the inputs' dtype (torch's own bf16 matmuls for bf16 inputs). Rows past sum(counts): none."""
    outs, prev = [], 0
    for e, c in enumerate(counts):
        gate, up = split(x[prev : prev + c] @ w1[e], layout)
        outs.append(ACT[activation](gate, up) @ w2[e])
        prev += c
    return torch.cat(outs) if outs else x.new_zeros(0, w2.shape[2])


def weights(E, H, inter, dtype, storage):
    """(w1 (E, H, 2I), w2 (E, I, H)) b operands, leaves requiring grad. storage "linear": stored
    (E, out, in) like nn.Linear and passed as transposed views; "kn": stored as the b operand."""
    g1 = torch.randn(E, 2 * inter, H, dtype=F64) * H**-0.5
    g2 = torch.randn(E, H, inter, dtype=F64) * inter**-0.5
    if storage == "linear":
        p1, p2 = g1.to(dtype).requires_grad_(), g2.to(dtype).requires_grad_()
        return (p1, p2), (p1.transpose(1, 2), p2.transpose(1, 2))
    p1, p2 = (
        g1.transpose(1, 2).contiguous().to(dtype).requires_grad_(),
        g2.transpose(1, 2).contiguous().to(dtype).requires_grad_(),
    )
    return (p1, p2), (p1, p2)


def clones(params, dtype):
    return [p.detach().to(dtype).requires_grad_() for p in params]


def views(params, storage):
    return tuple(p.transpose(1, 2) for p in params) if storage == "linear" else tuple(params)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ---------------------------------------------------------------------------------------------- gradcheck


@pytest.mark.parametrize("activation", ["swiglu", "geglu", "swiglu_oai"])
@pytest.mark.parametrize("layout", ["interleaved", "halves"])
@pytest.mark.parametrize("storage", ["linear", "kn"])
def test_gradcheck_fp64(activation, layout, storage):
    counts, pad = [3, 0, 4, 2], 2
    offs, end = make_offs(counts), sum(counts)
    x = torch.randn(end + pad, 6, dtype=F64, requires_grad=True)
    (p1, p2), _ = weights(len(counts), 6, 4, F64, storage)

    def f(x, p1, p2):
        w1, w2 = views((p1, p2), storage)
        return grouped_experts(x, w1, w2, offs, activation=activation, gate_layout=layout)[:end]

    assert torch.autograd.gradcheck(f, (x, p1, p2))


# -------------------------------------------------------------------------------------------- vs plain torch


@settings(max_examples=25, deadline=None)
@given(
    counts=st.lists(st.integers(0, 7), min_size=1, max_size=5),
    pad=st.integers(0, 3),
    hidden=st.sampled_from([8, 16]),
    inter=st.sampled_from([4, 8]),
    dtype=st.sampled_from([torch.float32, BF16]),
    layout=st.sampled_from(["interleaved", "halves"]),
    storage=st.sampled_from(["linear", "kn"]),
    seed=st.integers(0, 2**16),
)
def test_grads_match_plain_torch(counts, pad, hidden, inter, dtype, layout, storage, seed):
    """Output and gradients of x, w_gate_up, w_down against torch autograd in fp64 (the
    reference) and in the same precision (bf16 bound: 2x torch's own bf16 error + 1% of the
    reference's largest value; fp32: close to the fp64 reference). Empty experts, zero tokens
    and rows past offs[-1] (zero gradient there) included."""
    torch.manual_seed(seed)
    offs, end = make_offs(counts), sum(counts)
    x = torch.randn(end + pad, hidden, dtype=F64).to(dtype).requires_grad_()
    (p1, p2), (w1, w2) = weights(len(counts), hidden, inter, dtype, storage)
    gy = torch.randn(end + pad, hidden, dtype=F64).to(dtype)
    gy[end:] = float("nan")  # rows past offs[-1]: never read
    y = grouped_experts(x, w1, w2, offs, gate_layout=layout)
    y.backward(gy)
    ours = [y[:end], x.grad, p1.grad, p2.grad]
    assert all(torch.isfinite(t).all() for t in ours)
    assert (x.grad[end:] == 0).all(), "rows past offs[-1] get a zero gradient"
    for e, c in enumerate(counts):
        if c == 0:  # an expert with no rows: zero weight gradients
            assert (p1.grad[e] == 0).all() and (p2.grad[e] == 0).all()

    results = {}
    for ref_dtype in (F64, dtype):
        leaves = clones([x, p1, p2], ref_dtype)
        yy = experts_torch(leaves[0], *views(leaves[1:], storage), counts, layout=layout)
        yy.backward(gy[:end].to(ref_dtype))
        grads = [leaf.grad if leaf.grad is not None else torch.zeros_like(leaf) for leaf in leaves]
        results[ref_dtype] = [yy.detach(), *grads]
    names = ["y", "grad x", "grad w_gate_up", "grad w_down"]
    for i, name in enumerate(names):
        ref = results[F64][i][:end] if i < 2 else results[F64][i]
        mine = ours[i][:end] if i == 1 else ours[i]
        if ref.numel() == 0:  # no tokens at all: shapes checked, nothing to compare
            assert mine.shape == ref.shape
            continue
        if dtype == BF16:
            same = results[dtype][i][:end] if i < 2 else results[dtype][i]
            assert_within_torch_error(mine, same, ref, atol=1e-2, what=name)
        else:
            torch.testing.assert_close(
                mine.double(), ref, atol=1e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}"
            )


def test_zero_tokens_and_no_experts():
    x = torch.randn(0, 8, requires_grad=True)
    (p1, p2), (w1, w2) = weights(3, 8, 4, torch.float32, "linear")
    y = grouped_experts(x, w1, w2, make_offs([0, 0, 0]))
    assert y.shape == (0, 8)
    y.sum().backward()
    assert x.grad.shape == (0, 8) and (p1.grad == 0).all() and (p2.grad == 0).all()
    x = torch.randn(5, 8, requires_grad=True)  # no experts at all: every row is past offs[-1]
    (p1, p2), (w1, w2) = weights(0, 8, 4, torch.float32, "linear")
    y = grouped_experts(x, w1, w2, make_offs([]))
    y.sum().backward()
    assert y.shape == (5, 8) and (x.grad == 0).all()


# ---------------------------------------------------------------------------------------------- the module


def test_module_trains_and_no_grad_path_agrees():
    counts = [5, 0, 9, 3]
    offs, end = make_offs(counts), sum(counts)
    layer = GroupedExperts(4, 16, 8, dtype=torch.float32)
    x = torch.randn(end + 2, 16, requires_grad=True)
    y = layer(x, offs)
    assert y.requires_grad and y.grad_fn is not None
    with torch.no_grad():
        y_fused = layer(x, offs)  # the fused-epilogue route (interleaved weights)
        y_ref = layer.forward_ref(x, offs)
    assert y_fused.grad_fn is None
    torch.testing.assert_close(y[:end], y_fused[:end])
    torch.testing.assert_close(y[:end], y_ref[:end], atol=1e-5, rtol=1e-5)
    y[:end].square().sum().backward()
    ref = clones([x, layer.w_gate_up, layer.w_down], F64)
    yy = experts_torch(ref[0], ref[1].transpose(1, 2), ref[2].transpose(1, 2), counts)
    yy.square().sum().backward()
    for got, want in zip([x.grad, layer.w_gate_up.grad, layer.w_down.grad], ref, strict=True):
        torch.testing.assert_close(got.double(), want.grad, atol=1e-5, rtol=1e-4)
    # weight gradients land in the parameters' own (E, out, in) layout, contiguous
    assert layer.w_gate_up.grad.is_contiguous() and layer.w_down.grad.is_contiguous()
    # an SGD step lowers the loss
    loss0 = y[:end].square().sum().item()
    with torch.no_grad():
        for p in (layer.w_gate_up, layer.w_down):
            p -= 1e-3 * p.grad
    assert layer(x, offs)[:end].square().sum().item() < loss0


def test_only_some_inputs_need_grad():
    counts = [4, 3]
    offs = make_offs(counts)
    layer = GroupedExperts(2, 8, 4, dtype=torch.float32)
    layer.w_gate_up.requires_grad_(False)
    x = torch.randn(7, 8)  # no grad for x either: only w_down trains
    layer(x, offs).sum().backward()
    assert layer.w_gate_up.grad is None and layer.w_down.grad is not None
    layer.w_down.requires_grad_(False)
    x.requires_grad_()
    layer(x, offs).sum().backward()
    assert x.grad is not None


def test_backward_is_deterministic():
    counts = [6, 0, 11]
    offs = make_offs(counts)
    layer = GroupedExperts(3, 16, 8, dtype=BF16)
    x = torch.randn(17, 16, dtype=BF16, requires_grad=True)
    gy = torch.randn(17, 16, dtype=BF16)
    runs = []
    for _ in range(2):
        x.grad = None
        layer.zero_grad()
        layer(x, offs).backward(gy)
        runs.append([x.grad.clone(), layer.w_gate_up.grad.clone(), layer.w_down.grad.clone()])
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


def test_bad_inputs():
    layer = GroupedExperts(2, 16, 8, dtype=torch.float32)
    x, offs = torch.randn(8, 16), make_offs([4, 4])
    with pytest.raises(TypeError, match="int32"):
        layer(x, offs.long())
    with pytest.raises(ValueError, match="entries"):
        layer(x, make_offs([8]))
    with pytest.raises(ValueError, match="disagree on K"):
        layer(torch.randn(8, 12), offs)
    with pytest.raises(TypeError, match="dtype"):
        layer(x.double(), offs)
    with pytest.raises(ValueError, match="activation"):
        grouped_experts(x, layer.w_gate_up.mT, layer.w_down.mT, offs, activation="silu")
    with pytest.raises(ValueError, match="gate_layout"):
        grouped_experts(x, layer.w_gate_up.mT, layer.w_down.mT, offs, gate_layout="split")
    with pytest.raises(ValueError, match="w_down"):
        grouped_experts(x, layer.w_gate_up.mT, layer.w_down[:, :, :4].mT, offs)
    meta = torch.empty(8, 16, device="meta")  # another device than the weights
    with pytest.raises(ValueError, match="one device"):
        layer(meta, offs)


# ---------------------------------------------------------------------------------------------- torch.compile


def _train_step(layer, x, offs, end):
    y = layer(x, offs)
    return y[:end].float().square().sum()


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_compile_training_step_fullgraph(dtype):
    """dynamo + AOTAutograd (aot_eager) trace the autograd function and the custom ops with no
    graph break; loss and gradients equal eager's; the no-grad route compiles too."""
    torch._dynamo.reset()
    counts = [4, 0, 6, 3]
    offs, end = make_offs(counts), sum(counts)
    layer = GroupedExperts(4, 16, 8, dtype=dtype)
    x = torch.randn(end + 3, 16, dtype=dtype, requires_grad=True)
    compiled = torch.compile(_train_step, backend="aot_eager", fullgraph=True)
    results = []
    for fn in (compiled, _train_step):
        x.grad = None
        layer.zero_grad()
        loss = fn(layer, x, offs, end)
        loss.backward()
        results.append(
            [loss.detach(), x.grad.clone(), layer.w_gate_up.grad.clone(), layer.w_down.grad.clone()]
        )
    for c, e in zip(*results, strict=True):
        torch.testing.assert_close(c, e)
    with torch.no_grad():
        fused = torch.compile(layer, backend="aot_eager", fullgraph=True)(x, offs)
        torch.testing.assert_close(fused[:end], layer(x, offs)[:end])


def test_gather_tokens_backward_sums_each_tokens_rows():
    """The dispatch copy's backward (cutegemm.moe.gather_tokens): each token's k row gradients
    summed in slot order, = torch's index_select backward (fp64 gradcheck too)."""
    gen = torch.Generator().manual_seed(4)
    T, k, H = 7, 3, 5
    ids = torch.randint(0, 4, (T * k,), generator=gen)
    order = torch.argsort(ids, stable=True)
    x = torch.randn(T, H, dtype=torch.float64, generator=gen, requires_grad=True)
    g = torch.randn(T * k, H, dtype=torch.float64, generator=gen)
    (ours,) = torch.autograd.grad(gather_tokens(x, order, k), x, g)
    (theirs,) = torch.autograd.grad(x.index_select(0, order // k), x, g)
    torch.testing.assert_close(ours, theirs)
    assert torch.autograd.gradcheck(lambda t: gather_tokens(t, order, k), (x,))
    with torch.no_grad():
        assert torch.equal(gather_tokens(x, order, k), x[order // k])


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(0, 40),
    inter=st.integers(1, 24),
    activation=st.sampled_from(["swiglu", "geglu", "swiglu_oai"]),
    layout=st.sampled_from(["interleaved", "halves"]),
    dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32, torch.float64]),
    want_h=st.booleans(),
    with_dh=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_gated_grads_equal_the_two_step_formulas_bitwise(rows, inter, activation, layout, dtype, want_h, with_dh, seed):
    """ops.gated_grads (the backward's one pass over Z) gives the bits of gated_activation and of
    activation_grad rounded to Z's dtype, on random values with large and tiny magnitudes."""
    g = torch.Generator().manual_seed(seed)
    z = (torch.randn(rows, 2 * inter, generator=g, dtype=torch.float64) * 10 ** torch.empty(rows, 2 * inter, dtype=torch.float64).uniform_(-3, 2, generator=g)).to(dtype)  # fmt: skip
    dh = torch.randn(rows, inter, generator=g, dtype=torch.float64).to(dtype) if with_dh else None
    h, dz = gated_grads(activation, dh, z, layout, want_h=want_h)
    cd = torch.float64 if dtype == torch.float64 else torch.float32
    if want_h:
        assert torch.equal(h.view(torch.uint8), gated_activation(z, activation, layout, dtype).view(torch.uint8))
    else:
        assert h is None
    if with_dh:
        ref = activation_grad(activation, dh.to(cd), z.to(cd), layout).to(dtype)
        assert dz.dtype == dtype and dz.shape == z.shape
        assert torch.equal(dz.view(torch.uint8), ref.view(torch.uint8))  # bits (NaN-safe)
    else:
        assert dz is None


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(0, 50), width=st.integers(1, 9), seed=st.integers(0, 2**16),
       dtype=st.sampled_from([torch.bfloat16, torch.float32]))  # fmt: skip
def test_permute_rows_and_unpermute_rows_against_index_select(rows, width, seed, dtype):
    """permute_rows / unpermute_rows: the values of index_select by the permutation (or its
    inverse) and the same gradients as index_select's scatter-add backward, bitwise (each row's
    gradient lands once)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(rows, width, generator=g).to(dtype)
    order = torch.randperm(rows, generator=g)
    dout = torch.randn(rows, width, generator=g).to(dtype)
    inv = inverse_permutation(order)
    assert torch.equal(order[inv], torch.arange(rows)) and torch.equal(inv[order], torch.arange(rows))
    for ours, theirs in ((lambda t: permute_rows(t, order), lambda t: t.index_select(0, order)),
                         (lambda t: unpermute_rows(t, order), lambda t: t.index_select(0, inv))):  # fmt: skip
        a, b = y.clone().requires_grad_(), y.clone().requires_grad_()
        out_a, out_b = ours(a), theirs(b)
        assert torch.equal(out_a, out_b)
        out_a.backward(dout)
        out_b.backward(dout)
        assert torch.equal(a.grad, b.grad)
        with torch.no_grad():
            assert torch.equal(ours(y), out_b)
    with pytest.raises(ValueError, match="one entry per row"):
        permute_rows(y, order[:-1] if rows else torch.zeros(1, dtype=torch.int64))


def test_unpermute_rows_compiles_fullgraph():
    """The combine's unpermute traces with no graph break (dynamo + AOTAutograd), same values and
    gradients as eager."""
    torch._dynamo.reset()
    y = torch.randn(12, 5, requires_grad=True)
    order = torch.randperm(12)

    def step(y, order):
        return (unpermute_rows(y, order).view(6, 2, 5).sum(1) ** 2).sum()

    out = []
    for fn in (torch.compile(step, backend="aot_eager", fullgraph=True), step):
        y.grad = None
        loss = fn(y, order)
        loss.backward()
        out.append((loss.detach(), y.grad.clone()))
    torch.testing.assert_close(out[0][0], out[1][0])
    torch.testing.assert_close(out[0][1], out[1][1])


def test_fused_gated_switch_leaves_cpu_calls_to_torch(monkeypatch):
    """ops.FUSED_GATED routes only the calls the kernel takes (CUDA bf16 / fp16 swiglu): CPU
    tensors keep the torch formulas, bit for bit."""
    from cutegemm import ops
    from cutegemm.epilogue.gated_grads import kernel_takes

    z, dh = torch.randn(6, 16).to(torch.bfloat16), torch.randn(6, 8).to(torch.bfloat16)
    assert not kernel_takes("swiglu", dh, z)
    before = gated_grads("swiglu", dh, z)
    monkeypatch.setattr(ops, "FUSED_GATED", True)
    after = gated_grads("swiglu", dh, z)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.parametrize("layout", ["interleaved", "halves"])
def test_swiglu_custom_ops(layout):
    """torch.ops.cutegemm.swiglu / swiglu_grads (what ops.gated_grads calls for CUDA bf16 / fp16
    under FUSED_GATED, opaque to torch.compile): schema, fake kernels and eager results pass
    torch.library.opcheck; off the kernel's devices they are the torch formulas, bit for bit."""
    from cutegemm import ops

    z, dh = (torch.randn(6, 16) * 3).to(torch.bfloat16), torch.randn(6, 8).to(torch.bfloat16)
    torch.library.opcheck(torch.ops.cutegemm.swiglu, (z, layout))
    torch.library.opcheck(torch.ops.cutegemm.swiglu_grads, (dh, z, layout))
    h, dz = torch.ops.cutegemm.swiglu_grads(dh, z, layout)
    h_ref, dz_ref = ops._gated_grads_torch("swiglu", dh, z, layout)
    assert torch.equal(h, h_ref) and torch.equal(dz, dz_ref)
    assert torch.equal(torch.ops.cutegemm.swiglu(z, layout), h_ref)


def _pairs(tokens, k, experts, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, experts, (tokens, k), generator=g)
    return torch.argsort(ids.reshape(-1), stable=True)


@pytest.mark.parametrize("tokens,k,hidden", [(7, 3, 16), (1, 1, 8), (5, 8, 24), (0, 2, 8)])
def test_combine_matches_the_unpermute_product_and_sum(tokens, k, hidden):
    """moe.combine (one pass; its CPU route is ops' torch formulas) against torch's unpermute,
    product and sum, forward and both gradients (gradcheck in fp64), weighted and not."""
    from cutegemm.moe import combine, inverse_permutation

    order = _pairs(tokens, k, 4)
    y = torch.randn(tokens * k, hidden, dtype=torch.float64, requires_grad=True)
    w = torch.rand(tokens, k, dtype=torch.float64, requires_grad=True)
    inv = inverse_permutation(order)
    ref = (y[inv].view(tokens, k, hidden) * w.unsqueeze(-1)).sum(1)
    torch.testing.assert_close(combine(y, order, k, w), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(combine(y, order, k), y[inv].view(tokens, k, hidden).sum(1), rtol=1e-12, atol=1e-12)
    yb, wf = y.detach().to(torch.bfloat16), w.detach().float()
    wide = combine(yb, order, k, wf, out_dtype=torch.float32)  # a wider output: the sums unrounded
    assert wide.dtype == torch.float32
    torch.testing.assert_close(wide, (yb[inv].float().view(tokens, k, hidden) * wf.unsqueeze(-1)).sum(1))
    if tokens:
        assert torch.autograd.gradcheck(lambda y, w: combine(y, order, k, w), (y, w))
        assert torch.autograd.gradcheck(lambda y: combine(y, order, k), (y,))
        x = torch.randn(tokens, hidden, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda x: gather_tokens(x, order, k), (x,))


def test_combine_keeps_y_only_for_the_weights_gradient():
    """The combine's backward needs y only for dW: with weights that need no gradient (or none),
    y (R rows) is not held until the backward; the gradients are the same either way."""
    from cutegemm.moe import combine

    order = _pairs(6, 4, 5)
    y = torch.randn(24, 8, dtype=torch.float64, requires_grad=True)
    w = torch.rand(6, 4, dtype=torch.float64)
    kept = combine(y, order, 4, w.clone().requires_grad_())
    assert kept.grad_fn.saved_tensors[0] is not None
    for weights in (w, None):
        out = combine(y, order, 4, weights)
        assert out.grad_fn.saved_tensors[0] is None
    g = torch.randn(6, 8, dtype=torch.float64)
    (dy_kept,) = torch.autograd.grad(kept, y, g)
    (dy,) = torch.autograd.grad(combine(y, order, 4, w), y, g)
    torch.testing.assert_close(dy, dy_kept, rtol=0, atol=0)


def test_combine_with_the_callers_inverse():
    """combine(..., inverse=) (the dispatch's inverse permutation, int32) gives what combine
    computes from order alone: output and gradients, and on the wider-output route."""
    from cutegemm.moe import combine, inverse_permutation

    order = _pairs(7, 3, 4)
    inv = inverse_permutation(order).to(torch.int32)
    y = torch.randn(21, 8, dtype=torch.float64, requires_grad=True)
    w = torch.rand(7, 3, dtype=torch.float64, requires_grad=True)
    g = torch.randn(7, 8, dtype=torch.float64)
    a, b = combine(y, order, 3, w), combine(y, order, 3, w, inverse=inv)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    for ga, gb in zip(torch.autograd.grad(a, (y, w), g), torch.autograd.grad(b, (y, w), g), strict=True):
        torch.testing.assert_close(ga, gb, rtol=0, atol=0)
    yb = y.detach().bfloat16()
    torch.testing.assert_close(combine(yb, order, 3, w.detach().float(), out_dtype=torch.float32, inverse=inv),
                               combine(yb, order, 3, w.detach().float(), out_dtype=torch.float32), rtol=0, atol=0)  # fmt: skip


def test_gather_tokens_with_the_callers_rows_and_inverse():
    """gather_tokens(..., rows=, inverse=) (the dispatch's, int32) gives what it computes from
    order alone, forward and backward."""
    from cutegemm.moe import dispatch, gather_tokens

    top = torch.randint(0, 5, (7, 3), generator=torch.Generator().manual_seed(9))
    d = dispatch(top, 5)
    x = torch.randn(7, 8, dtype=torch.float64, requires_grad=True)
    g = torch.randn(21, 8, dtype=torch.float64)
    a, b = gather_tokens(x, d.order, 3), gather_tokens(x, d.order, 3, d.rows, d.inverse)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(torch.autograd.grad(a, x, g)[0], torch.autograd.grad(b, x, g)[0], rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(gather_tokens(x, d.order, 3, d.rows), a, rtol=0, atol=0)


def test_combine_rejects_mismatched_arguments():
    from cutegemm.moe import combine

    order = _pairs(4, 2, 3)
    with pytest.raises(ValueError, match="one entry per row"):
        combine(torch.randn(9, 8), order, 2)
    with pytest.raises(ValueError, match="weights must be"):
        combine(torch.randn(8, 8), order, 2, torch.rand(4, 3))


def test_combine_custom_ops():
    """torch.ops.cutegemm.combine_rows / combine_rows_dot (ops.combine_rows' route for CUDA bf16 /
    fp16, opaque to torch.compile): schema and fake kernels (opcheck); off the kernel's devices
    the torch formulas."""

    src = torch.randn(10, 16).to(torch.bfloat16)
    idx = torch.tensor([3, 1, 0, 9, 9, 2], dtype=torch.int32)
    w = torch.rand(6)
    torch.library.opcheck(torch.ops.cutegemm.combine_rows, (src, idx, w, 3))
    torch.library.opcheck(torch.ops.cutegemm.combine_rows, (src, idx, None, 2))
    other = torch.randn(6, 16).to(torch.bfloat16)
    torch.library.opcheck(torch.ops.cutegemm.combine_rows_dot, (src, idx, w, other))
    out = torch.ops.cutegemm.combine_rows(src, idx, w, 3)
    ref = (src[idx.long()].float() * w.unsqueeze(1)).view(2, 3, 16).sum(1).to(torch.bfloat16)
    assert torch.equal(out, ref)


def test_gather_rows_backward_sums_every_tokens_rows():
    """moe.gather_rows (grouped_experts' copy for gather_index with a gradient): any index, tokens
    repeated any number of times or not at all; gradcheck in fp64, and the custom op
    torch.ops.cutegemm.sum_rows (its backward's route on CUDA) passes opcheck, empty segments zero."""
    from cutegemm import ops
    from cutegemm.moe import gather_rows

    x = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    for idx in (torch.tensor([3, 0, 3, 5, 3, 0, 1]), torch.tensor([2, 2], dtype=torch.int32), torch.tensor([], dtype=torch.long)):
        assert torch.autograd.gradcheck(lambda x, idx=idx: gather_rows(x, idx), (x,))
    src = torch.randn(10, 16).to(torch.bfloat16)
    idx, ptr = torch.tensor([1, 2, 3, 9], dtype=torch.int32), torch.tensor([0, 2, 2, 4], dtype=torch.int32)
    torch.library.opcheck(torch.ops.cutegemm.sum_rows, (src, idx, ptr))
    out = ops.sum_rows(src, idx, ptr)
    assert torch.equal(out[1], torch.zeros(16, dtype=torch.bfloat16))
    assert torch.equal(out[2], (src[3].float() + src[9].float()).to(torch.bfloat16))


@settings(max_examples=60, deadline=None)
@given(tokens=st.integers(0, 40), k=st.integers(1, 8), hidden=st.sampled_from([8, 16, 24, 40]),
       experts=st.integers(1, 9), weighted=st.booleans(), seed=st.integers(0, 2**16))  # fmt: skip
def test_combine_and_gather_rows_hypothesis(tokens, k, hidden, experts, weighted, seed):
    """moe.combine and moe.gather_rows over random routings (empty experts, k = 1, no tokens),
    forward and backward, against the unpermute / product / sum and index_select formulas in fp64."""
    from cutegemm.moe import combine, gather_rows, inverse_permutation

    g = torch.Generator().manual_seed(seed)
    order = torch.argsort(torch.randint(0, experts, (tokens * k,), generator=g), stable=True)
    y = torch.randn(tokens * k, hidden, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.rand(tokens, k, generator=g, dtype=torch.float64, requires_grad=True) if weighted else None
    dout = torch.randn(tokens, hidden, generator=g, dtype=torch.float64)
    inv = inverse_permutation(order)
    rows = y[inv].view(tokens, k, hidden)
    ref = (rows * w.unsqueeze(-1)).sum(1) if weighted else rows.sum(1)
    out = combine(y, order, k, w)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    leaves = (y, w) if weighted else (y,)
    for ours, theirs in zip(torch.autograd.grad(out, leaves, dout), torch.autograd.grad(ref, leaves, dout), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    x = torch.randn(max(tokens, 1), hidden, generator=g, dtype=torch.float64, requires_grad=True)
    index = torch.randint(0, x.shape[0], (tokens * k,), generator=g)
    grad = torch.randn(tokens * k, hidden, generator=g, dtype=torch.float64)
    (dx,) = torch.autograd.grad(gather_rows(x, index), x, grad)
    torch.testing.assert_close(dx, torch.zeros_like(x).index_add_(0, index, grad), rtol=1e-12, atol=1e-12)


def test_backward_frees_its_temporaries_before_the_large_gradients(monkeypatch):
    """The backward's peak memory: dH (T, I) is gone (no reference left) when dX is allocated, and
    dZ (T, 2I) when dW_down is: dZ's consumers (dX, dW_gate_up) run first, so dW_down, the last,
    is allocated beside H only."""
    import gc
    import weakref

    from cutegemm import moe as moe_mod

    refs, alive = {}, {}
    real_gated, real_tail, real_wgrad = moe_mod.gated_grads, moe_mod.packed_zero_tail, moe_mod._weight_grad

    def gated(activation, dh, z, layout, want_h=True):
        h, dz = real_gated(activation, dh, z, layout, want_h=want_h)
        if dh is not None:  # the backward's call (the forward's has no dH)
            refs["dh"], refs["dz"] = weakref.ref(dh), weakref.ref(dz)
        return h, dz

    def seen(what):
        gc.collect()
        alive[what] = [name for name in ("dh", "dz") if refs[name]() is not None]

    def tail(a, b, offs, alpha=1.0):
        seen("dx")
        return real_tail(a, b, offs, alpha)

    def wgrad(inp, grad, offs, w):
        seen("dw2" if w.shape == w2.shape else "dw1")  # (E, I, H) against w1's (E, H, 2I)
        return real_wgrad(inp, grad, offs, w)

    monkeypatch.setattr(moe_mod, "gated_grads", gated)
    monkeypatch.setattr(moe_mod, "packed_zero_tail", tail)
    monkeypatch.setattr(moe_mod, "_weight_grad", wgrad)
    T, H, I, E = 12, 16, 8, 3  # T (I + H) = 288 < E I H = 384: dW_down last (moe._down_grad_last)
    x = torch.randn(T, H, requires_grad=True)
    w1 = torch.randn(E, H, 2 * I, requires_grad=True)
    w2 = torch.randn(E, I, H, requires_grad=True)
    grouped_experts(x, w1, w2, make_offs([4, 5, 3])).sum().backward()
    assert alive == {"dx": ["dz"], "dw1": ["dz"], "dw2": []}, alive
    # more rows than that: dW_down first (its operands dropped before dZ's consumers), dZ still alive then
    alive.clear()
    x = torch.randn(48, H, requires_grad=True)
    grouped_experts(x, w1, w2, make_offs([16, 20, 12])).sum().backward()
    assert alive == {"dw2": ["dz"], "dx": ["dz"], "dw1": ["dz"]}, alive
    assert moe_mod._down_grad_last(288, w2) and not moe_mod._down_grad_last(48 * (I + H), w2)


def _routed_reference(x, ids, wts, w1, w2, activation, layout):
    """out[t] = sum over the slots j with 0 <= ids[t, j] < E of wts[t, j] * expert(x[t]), in autograd."""
    E = w1.shape[0]
    out = x * 0  # in the graph even when no slot has an expert
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if 0 <= e < E:
                gate, up = split(x[t : t + 1] @ w1[e], layout)
                out = out.index_add(0, torch.tensor([t]), wts[t, j] * (ACT[activation](gate, up) @ w2[e]))
    return out


@settings(max_examples=25, deadline=None)
@given(tokens=st.integers(1, 9), k=st.integers(1, 3), experts=st.integers(1, 4), spill=st.booleans(),
       activation=st.sampled_from(["swiglu", "geglu", "swiglu_oai"]), layout=st.sampled_from(["interleaved", "halves"]),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_routed_experts_equals_the_per_token_formula(tokens, k, experts, spill, activation, layout, seed):
    """moe.routed_experts (one node: dispatch, experts, combine; saves neither the gathered rows
    nor the expert outputs) against the per-token formula in fp64 autograd: the output and the
    gradients of x, the routing weights and both weights; slots outside [0, E) contribute nothing."""
    from cutegemm.moe import routed_experts

    g = torch.Generator().manual_seed(seed)
    H, I = 8, 4
    lo, hi = (-1, experts + 1) if spill else (0, experts)
    ids = torch.randint(lo, hi, (tokens, k), generator=g)
    leaves = [torch.randn(tokens, H, generator=g, dtype=F64), torch.rand(tokens, k, generator=g, dtype=F64),
              torch.randn(experts, H, 2 * I, generator=g, dtype=F64) / 3,
              torch.randn(experts, I, H, generator=g, dtype=F64) / 2]  # fmt: skip
    for t in leaves:
        t.requires_grad_()
    x, wts, w1, w2 = leaves
    out = routed_experts(x, ids, wts, w1, w2, activation=activation, gate_layout=layout)
    ref = _routed_reference(x, ids, wts, w1, w2, activation, layout)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    with torch.no_grad():  # the inference route (H from the fused gated epilogue, no Z)
        torch.testing.assert_close(routed_experts(x, ids, wts, w1, w2, activation=activation, gate_layout=layout),
                                   ref.detach(), rtol=1e-10, atol=1e-10)  # fmt: skip
    dout = torch.randn(tokens, H, generator=g, dtype=F64)
    wants = torch.autograd.grad(ref, leaves, dout, allow_unused=True)  # no expert used: no path to it
    for got, want, leaf in zip(torch.autograd.grad(out, leaves, dout), wants, leaves, strict=True):
        torch.testing.assert_close(got, torch.zeros_like(leaf) if want is None else want, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("layout", ["interleaved", "halves"])
def test_routed_experts_without_a_gradient_writes_no_z(monkeypatch, layout):
    """No gradient wanted (no_grad, or no input requiring one): no autograd node, and with
    interleaved gate / up the up projection's fused gated epilogue gives H (no Z, no SwiGLU pass);
    [gate | up] halves: Z, then the pass."""
    from cutegemm import moe as moe_mod

    passes = []
    real = moe_mod.gated_grads
    monkeypatch.setattr(moe_mod, "gated_grads", lambda *a, **kw: passes.append(1) or real(*a, **kw))
    g = torch.Generator().manual_seed(1)
    T, H, I, E, k = 7, 8, 4, 3, 2
    ids = torch.randint(0, E, (T, k), generator=g)
    x, wts = torch.randn(T, H, generator=g, dtype=F64), torch.rand(T, k, generator=g, dtype=F64)
    w1, w2 = torch.randn(E, H, 2 * I, generator=g, dtype=F64), torch.randn(E, I, H, generator=g, dtype=F64)
    out = moe_mod.routed_experts(x, ids, wts, w1, w2, gate_layout=layout)
    assert out.grad_fn is None and len(passes) == int(layout == "halves")
    torch.testing.assert_close(out, _routed_reference(x, ids, wts, w1, w2, "swiglu", layout), rtol=1e-10, atol=1e-10)


def test_routed_experts_gradcheck_and_what_it_saves():
    from cutegemm.moe import routed_experts

    g = torch.Generator().manual_seed(0)
    T, H, I, E, k = 5, 6, 4, 3, 2
    ids = torch.tensor([[0, 2], [1, 1], [2, 0], [3, 0], [1, -1]])  # two slots outside [0, E)
    x = torch.randn(T, H, generator=g, dtype=F64, requires_grad=True)
    wts = torch.rand(T, k, generator=g, dtype=F64, requires_grad=True)
    w1 = torch.randn(E, H, 2 * I, generator=g, dtype=F64, requires_grad=True)
    w2 = torch.randn(E, I, H, generator=g, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: routed_experts(a[0], ids, *a[1:]), (x, wts, w1, w2))
    out = routed_experts(x, ids, wts, w1, w2)
    saved = out.grad_fn.saved_tensors
    R = T * k
    # x, the weights and Z (R, 2I) and int32 routing vectors: no (R, H) tensor (rows or expert outputs)
    assert not any(t.dim() == 2 and t.shape == (R, H) for t in saved)
    assert any(t.shape == (R, 2 * I) for t in saved)
    with pytest.raises(ValueError, match="must agree"):
        routed_experts(x, ids, wts[:, :1], w1, w2)
    with pytest.raises(ValueError, match="floating point"):
        routed_experts(x, ids, ids, w1, w2)


def test_routed_backward_frees_dz_before_dw_down(monkeypatch):
    """The routed node's backward runs dZ's consumers (dX, dW_gate_up) first and drops dZ before
    dW_down, the last gradient, so dW_down is allocated beside wH only."""
    import gc
    import weakref

    from cutegemm import moe as moe_mod

    refs, alive = {}, {}
    real_rows, real_wgrad = moe_mod.routed_gated_grads, moe_mod._weight_grad

    def rows_pass(*args):
        wh, dz, dots = real_rows(*args)
        refs["dz"] = weakref.ref(dz)
        return wh, dz, dots

    def wgrad(inp, grad, offs, w):
        gc.collect()
        alive["dw2" if w.shape == w2.shape else "dw1"] = refs["dz"]() is not None
        return real_wgrad(inp, grad, offs, w)

    monkeypatch.setattr(moe_mod, "routed_gated_grads", rows_pass)
    monkeypatch.setattr(moe_mod, "_weight_grad", wgrad)
    T, H, I, E, k = 7, 16, 8, 3, 2
    x = torch.randn(T, H, requires_grad=True)
    ids = torch.randint(0, E, (T, k))
    wts = torch.rand(T, k, requires_grad=True)
    w1 = torch.randn(E, H, 2 * I, requires_grad=True)
    w2 = torch.randn(E, I, H, requires_grad=True)
    moe_mod.routed_experts(x, ids, wts, w1, w2).sum().backward()
    assert alive == {"dw1": True, "dw2": False}, alive
    assert x.grad is not None and wts.grad is not None and w1.grad is not None and w2.grad is not None


def test_routed_experts_reads_no_unspecified_row(monkeypatch):
    """On CUDA the grouped GEMMs leave the rows past offs[-1] unspecified: with every such row
    NaN here, the output and all gradients stay the per-token formula's (no row past offs[-1]
    is read: the slots routed outside [0, E) read a zero row)."""
    from cutegemm import moe as moe_mod

    real = moe_mod.grouped_mm

    def poisoned(a, b, offs, **kw):
        y = real(a, b, offs, **kw)
        if b.dim() == 3:  # the packed form: rows past offs[-1]
            y = y.clone()
            y[int(offs[-1]) :] = float("nan")
        return y

    monkeypatch.setattr(moe_mod, "grouped_mm", poisoned)
    g = torch.Generator().manual_seed(7)
    T, H, I, E, k = 9, 8, 4, 3, 2
    ids = torch.randint(-1, E + 1, (T, k), generator=g)
    ids[0] = torch.tensor([E, -1])  # surely some slots outside [0, E)
    leaves = [torch.randn(T, H, generator=g, dtype=F64), torch.rand(T, k, generator=g, dtype=F64),
              torch.randn(E, H, 2 * I, generator=g, dtype=F64) / 3, torch.randn(E, I, H, generator=g, dtype=F64) / 2]  # fmt: skip
    for t in leaves:
        t.requires_grad_()
    out = moe_mod.routed_experts(leaves[0], ids, *leaves[1:])
    ref = _routed_reference(leaves[0], ids, leaves[1], leaves[2], leaves[3], "swiglu", "interleaved")
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    dout = torch.randn(T, H, generator=g, dtype=F64)
    for got, want in zip(torch.autograd.grad(out, leaves, dout), torch.autograd.grad(ref, leaves, dout), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)
