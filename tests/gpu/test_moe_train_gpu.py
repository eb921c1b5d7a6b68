"""Training through the gated MoE experts on the GPU (cutegemm.moe.grouped_experts, nn.GroupedExperts;
the CPU twin of these checks is tests/cpu/test_moe_train_cpu.py):

- output and gradients of x, w_gate_up, w_down (bf16) against an fp64 reference: our error within
  2x the error of the same layer built on torch's ``grouped_mm`` (torch autograd, SwiGLU in fp32)
  + a small atol, over ragged expert sizes with empty experts, rows past offs[-1] and both gate
  layouts / weight storages (hypothesis);
- the no-grad route (SwiGLU fused into the epilogue) against the training route's forward;
- determinism: two backward passes bitwise equal;
- a training step (forward, loss, backward into .grad) captured in a CUDA graph and replayed with
  new tokens and new offs: bitwise equal to eager;
- torch.compile(fullgraph=True) of a training step (aot_eager, inductor) against eager.
"""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cutegemm.moe import grouped_experts
from cutegemm.nn import GroupedExperts

from ..gemm_check import assert_within_torch_error

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16
F64 = torch.float64


def make_offs(counts):
    return torch.tensor(counts, dtype=torch.int32, device="cuda").cumsum(0, dtype=torch.int32)


def torch_grouped_mm(a, b, offs):
    fn = getattr(F, "grouped_mm", None) or torch._grouped_mm
    return fn(a, b, offs=offs)


def split(z, layout):
    n = z.shape[-1] // 2
    return (z[..., :n], z[..., n:]) if layout == "halves" else (z[..., 0::2], z[..., 1::2])


def torch_experts(x, w1, w2, offs, layout):
    """The same layer on torch's grouped_mm (what transformers' grouped_mm backend runs): bf16
    GEMMs, SwiGLU in fp32."""
    gate, up = split(torch_grouped_mm(x, w1, offs).float(), layout)
    h = (F.silu(gate) * up).to(x.dtype)
    return torch_grouped_mm(h, w2, offs)


def ref_experts(x, w1, w2, counts, layout):
    """fp64, one expert at a time (the leaves are fp64)."""
    outs, prev = [], 0
    for e, c in enumerate(counts):
        gate, up = split(x[prev : prev + c] @ w1[e], layout)
        outs.append((F.silu(gate) * up) @ w2[e])
        prev += c
    return torch.cat(outs)


def params(E, H, inter, storage):
    """(leaves, b views): "linear" stores (E, out, in) and passes transposed views."""
    g1 = (torch.randn(E, 2 * inter, H, device="cuda") * H**-0.5).to(BF16)
    g2 = (torch.randn(E, H, inter, device="cuda") * inter**-0.5).to(BF16)
    if storage == "linear":
        leaves = [g1.requires_grad_(), g2.requires_grad_()]
        return leaves, lambda p: (p[0].transpose(1, 2), p[1].transpose(1, 2))
    leaves = [
        g1.transpose(1, 2).contiguous().requires_grad_(),
        g2.transpose(1, 2).contiguous().requires_grad_(),
    ]
    return leaves, lambda p: (p[0], p[1])


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    counts=st.lists(st.one_of(st.just(0), st.integers(1, 300)), min_size=1, max_size=8),
    pad=st.sampled_from([0, 7]),
    dims=st.sampled_from([(256, 128), (128, 384), (512, 256)]),
    layout=st.sampled_from(["interleaved", "halves"]),
    storage=st.sampled_from(["linear", "kn"]),
)
def test_grads_within_2x_torch_grouped_mm(counts, pad, dims, layout, storage):
    H, inter = dims
    offs, end = make_offs(counts), sum(counts)
    x = torch.randn(end + pad, H, device="cuda", dtype=BF16, requires_grad=True)
    (p1, p2), view = params(len(counts), H, inter, storage)
    gy = torch.randn(end + pad, H, device="cuda", dtype=BF16)
    gy[end:] = float("nan")  # rows past offs[-1]: never read
    y = grouped_experts(x, *view((p1, p2)), offs, gate_layout=layout)
    y.backward(gy)
    torch.cuda.synchronize()
    assert (x.grad[end:] == 0).all(), "rows past offs[-1] get a zero gradient"
    for e, c in enumerate(counts):
        if c == 0:
            assert (p1.grad[e] == 0).all() and (p2.grad[e] == 0).all(), (
                "an expert with no rows: zero gradient"
            )
    if end == 0:
        return
    ours = [y[:end], x.grad[:end], p1.grad, p2.grad]

    tl = [t.detach().clone().requires_grad_() for t in (x, p1, p2)]
    tw = [w.mT.contiguous().mT for w in view(tl[1:])]  # torch's grouped_mm reads b K-major
    yt = torch_experts(tl[0][:end].contiguous(), *tw, offs, layout)
    yt.backward(gy[:end])
    rl = [t.detach().to(F64).requires_grad_() for t in (x, p1, p2)]
    yr = ref_experts(rl[0][:end], *view(rl[1:]), counts, layout)
    yr.backward(gy[:end].to(F64))
    torch.cuda.synchronize()

    def grad(t):
        return t.grad if t.grad is not None else torch.zeros_like(t)

    theirs = [yt, grad(tl[0])[:end], grad(tl[1]), grad(tl[2])]
    refs = [yr.detach(), grad(rl[0])[:end], grad(rl[1]), grad(rl[2])]
    for name, o, t, r in zip(
        ["y", "grad x", "grad w_gate_up", "grad w_down"], ours, theirs, refs, strict=True
    ):
        assert_within_torch_error(o, t.detach(), r, atol=1e-4, what=f"{name} counts={counts}")


def test_no_grad_route_matches_training_route():
    counts = [40, 0, 130, 7, 64, 1, 200, 22]
    offs, end = make_offs(counts), sum(counts)
    layer = GroupedExperts(8, 256, 384, device="cuda")
    x = torch.randn(end + 5, 256, device="cuda", dtype=BF16)
    y_train = layer(x, offs)  # grad enabled: pre-activations written, SwiGLU in torch
    with torch.no_grad():
        y_fused = layer(x, offs)  # SwiGLU in the epilogue
        ref = layer.forward_ref(x, offs)
    assert y_train.grad_fn is not None and y_fused.grad_fn is None
    scale = ref[:end].float().abs().max().item()
    for y in (y_train, y_fused):
        assert (y[:end].float() - ref[:end].float()).abs().max().item() <= 0.03 * scale


def _step(layer, x, offs, gy):
    layer.zero_grad(set_to_none=False)
    if x.grad is not None:
        x.grad.zero_()
    y = layer(x, offs)
    y.backward(gy)
    return y


def test_backward_is_deterministic():
    counts = [300, 0, 17, 129, 64]
    offs, end = make_offs(counts), sum(counts)
    layer = GroupedExperts(5, 512, 256, device="cuda")
    x = torch.randn(end, 512, device="cuda", dtype=BF16, requires_grad=True)
    gy = torch.randn(end, 512, device="cuda", dtype=BF16)
    runs = []
    for _ in range(2):
        y = _step(layer, x, offs, gy)
        torch.cuda.synchronize()
        runs.append([t.detach().clone() for t in (y, x.grad, layer.w_gate_up.grad, layer.w_down.grad)])
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b), "two backward runs differ"


def test_cuda_graph_training_step_replayed_with_new_offs():
    """Forward + backward (gradients into .grad) captured once; replayed with new tokens and new
    routing (offs) it equals eager bit for bit: no host sync, offs read on the device."""
    E, H, inter, T = 4, 256, 128, 512
    layer = GroupedExperts(E, H, inter, device="cuda")
    x = torch.randn(T, H, device="cuda", dtype=BF16, requires_grad=True)
    gy = torch.randn(T, H, device="cuda", dtype=BF16)
    offs = make_offs([100, 0, 200, 150])
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # compile / load the kernels, build the plans, allocate .grad
            _step(layer, x, offs, gy)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = _step(layer, x, offs, gy)
    grads = (x.grad, layer.w_gate_up.grad, layer.w_down.grad)
    for counts in ([100, 0, 200, 150], [0, 512, 0, 0], [7, 300, 1, 50], [128, 128, 128, 128]):
        end = sum(counts)
        with torch.no_grad():
            offs.copy_(make_offs(counts))
            x.copy_(torch.randn_like(x))
            gy.copy_(torch.randn_like(gy))
        graph.replay()
        torch.cuda.synchronize()
        captured = [y[:end].clone(), *(g.clone() for g in grads)]
        eager = _step(layer, x, offs, gy)
        torch.cuda.synchronize()
        for name, c, e in zip(
            ["y", "x", "w_gate_up", "w_down"],
            captured,
            [eager[:end], x.grad, layer.w_gate_up.grad, layer.w_down.grad],
            strict=True,
        ):
            assert torch.equal(c, e), f"replay differs from eager ({name}) for {counts}"


def _train_step(layer, x, offs, end):
    return layer(x, offs)[:end].float().square().sum()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_training_step_fullgraph(backend):
    torch._dynamo.reset()
    counts = [64, 0, 96, 40]
    offs, end = make_offs(counts), sum(counts)
    layer = GroupedExperts(4, 256, 128, device="cuda")
    x = torch.randn(end + 16, 256, device="cuda", dtype=BF16, requires_grad=True)
    compiled = torch.compile(_train_step, backend=backend, fullgraph=True)
    results = []
    for fn in (_train_step, compiled):
        x.grad = None
        layer.zero_grad()
        loss = fn(layer, x, offs, end)
        loss.backward()
        torch.cuda.synchronize()
        results.append(
            [loss.detach(), x.grad.clone(), layer.w_gate_up.grad.clone(), layer.w_down.grad.clone()]
        )
    for e, c in zip(*results, strict=True):
        assert torch.isfinite(c).all()
        rel = ((c.float() - e.float()).norm() / e.float().norm().clamp_min(1e-30)).item()
        assert rel <= (1e-3 if backend == "aot_eager" else 2e-2), rel
    # new routing: no recompile (the fake implementations never read offs)
    offs.copy_(make_offs([10, 150, 0, 40]))
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled(layer, x, offs, 200).backward()


def _torch_routed(x, ids, wts, w1, w2, layout):
    """transformers' grouped_mm route: sort, gathered copy, torch's grouped GEMMs, SwiGLU in fp32,
    weighted unpermute and sum (torch autograd)."""
    E = w1.shape[0]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=E)
    offs = counts.cumsum(0).to(torch.int32)
    y = torch_experts(x.index_select(0, order // ids.shape[1]), w1, w2, offs, layout)
    inv = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    return (y[inv].view(*ids.shape, -1) * wts.unsqueeze(-1).to(y.dtype)).sum(1)


def _ref_routed(x, ids, wts, w1, w2, layout):
    """fp64, one expert at a time: out[t] += wts[t, j] * expert_e(x[t]) where ids[t, j] = e."""
    out = x * 0
    for e in range(w1.shape[0]):
        t, j = (ids == e).nonzero(as_tuple=True)
        if t.numel():
            gate, up = split(x[t] @ w1[e], layout)
            out = out.index_add(0, t, ((F.silu(gate) * up) @ w2[e]) * wts[t, j].unsqueeze(-1))
    return out


@pytest.mark.parametrize("tokens,hidden,inter,experts,k,layout", [
    (512, 256, 128, 8, 2, "interleaved"), (96, 512, 256, 16, 4, "halves"), (2048, 1024, 256, 64, 8, "interleaved"),
])  # fmt: skip
def test_routed_experts_against_fp64_and_torch(tokens, hidden, inter, experts, k, layout):
    """moe.routed_experts (dispatch, experts and combine in one node; the rows gathered again in
    the backward, dw from dH' and H): output and the gradients of x, the routing weights and both
    weights within 2x the error of torch's grouped_mm route; the same bits on a second backward."""
    from cutegemm.moe import routed_experts

    g = torch.Generator(device="cuda").manual_seed(tokens + experts)
    ids = torch.stack([torch.randperm(experts, generator=g, device="cuda")[:k] for _ in range(tokens)])
    leaves64 = [torch.randn(tokens, hidden, generator=g, device="cuda", dtype=F64),
                torch.softmax(torch.randn(tokens, k, generator=g, device="cuda", dtype=F64), -1),
                torch.randn(experts, hidden, 2 * inter, generator=g, device="cuda", dtype=F64) / hidden**0.5,
                torch.randn(experts, inter, hidden, generator=g, device="cuda", dtype=F64) / inter**0.5]  # fmt: skip
    dout = torch.randn(tokens, hidden, generator=g, device="cuda", dtype=F64)

    def run(fn, dtype):
        leaves = [t.to(dtype if i != 1 else torch.float32 if dtype != F64 else F64).requires_grad_()
                  for i, t in enumerate(leaves64)]  # fmt: skip
        out = fn(*leaves)
        return (out, *torch.autograd.grad(out, leaves, dout.to(out.dtype)))

    def ours(x, w, w1, w2):
        return routed_experts(x, ids, w, w1, w2, gate_layout=layout)

    def theirs(x, w, w1, w2):
        return _torch_routed(x, ids, w, w1, w2, layout)

    ref = run(lambda x, w, w1, w2: _ref_routed(x, ids, w, w1, w2, layout), F64)
    got, base = run(ours, BF16), run(theirs, BF16)
    for name, o, t, r in zip(("out", "dx", "dweights", "dw_gate_up", "dw_down"), got, base, ref, strict=True):
        assert_within_torch_error(o.double(), t.double(), r, atol=1e-3, what=name)
    again = run(ours, BF16)
    assert all(torch.equal(a, b) for a, b in zip(got, again, strict=True)), "not deterministic"


@pytest.mark.parametrize("tokens,hidden,inter,experts,k,layout", [
    (2048, 2048, 256, 64, 8, "interleaved"), (64, 2048, 768, 128, 8, "interleaved"), (96, 512, 256, 16, 4, "halves"),
])  # fmt: skip
def test_routed_experts_without_a_gradient(tokens, hidden, inter, experts, k, layout):
    """moe.routed_experts under no_grad (H from the up projection's fused gated epilogue, through
    the gather kernel where policy.gather_pays; no Z): the output within 2x the error of torch's
    grouped_mm route against fp64, the same bits on a second call."""
    from cutegemm.moe import routed_experts

    g = torch.Generator(device="cuda").manual_seed(tokens + experts)
    ids = torch.stack([torch.randperm(experts, generator=g, device="cuda")[:k] for _ in range(tokens)])
    x = torch.randn(tokens, hidden, generator=g, device="cuda", dtype=F64)
    w = torch.softmax(torch.randn(tokens, k, generator=g, device="cuda", dtype=F64), -1)
    w1 = torch.randn(experts, hidden, 2 * inter, generator=g, device="cuda", dtype=F64) / hidden**0.5
    w2 = torch.randn(experts, inter, hidden, generator=g, device="cuda", dtype=F64) / inter**0.5
    ref = _ref_routed(x, ids, w, w1, w2, layout)
    xb, wf, w1b, w2b = x.to(BF16), w.float(), w1.to(BF16), w2.to(BF16)
    with torch.no_grad():
        got = routed_experts(xb, ids, wf, w1b, w2b, gate_layout=layout)
        base = _torch_routed(xb, ids, wf, w1b, w2b, layout)
        assert torch.equal(got, routed_experts(xb, ids, wf, w1b, w2b, gate_layout=layout)), "not deterministic"
    assert_within_torch_error(got.double(), base.double(), ref, atol=1e-3, what="out")


def test_routed_experts_slots_outside_the_experts():
    """Slots routed outside [0, E) (expert-parallel sentinels, dropped slots) contribute nothing,
    though the kernels leave their rows unspecified: output and gradients finite and at bf16
    distance from the fp64 formula that skips them."""
    from cutegemm.moe import routed_experts

    g = torch.Generator(device="cuda").manual_seed(11)
    T, H, I, E, k = 256, 256, 128, 8, 2
    ids = torch.randint(-1, E + 1, (T, k), generator=g, device="cuda")
    leaves64 = [torch.randn(T, H, generator=g, device="cuda", dtype=F64),
                torch.rand(T, k, generator=g, device="cuda", dtype=F64),
                torch.randn(E, H, 2 * I, generator=g, device="cuda", dtype=F64) / H**0.5,
                torch.randn(E, I, H, generator=g, device="cuda", dtype=F64) / I**0.5]  # fmt: skip
    dout = torch.randn(T, H, generator=g, device="cuda", dtype=F64)
    leaves = [t.to(BF16 if i != 1 else torch.float32).requires_grad_() for i, t in enumerate(leaves64)]
    out = routed_experts(leaves[0], ids, *leaves[1:])
    got = (out, *torch.autograd.grad(out, leaves, dout.to(BF16)))
    for t in leaves64:
        t.requires_grad_()
    ref = _ref_routed(leaves64[0], ids, *leaves64[1:], "interleaved")
    want = (ref, *torch.autograd.grad(ref, leaves64, dout))
    for name, o, r in zip(("out", "dx", "dweights", "dw_gate_up", "dw_down"), got, want, strict=True):
        assert torch.isfinite(o).all(), name
        err = (o.double() - r).norm() / r.norm().clamp(min=1e-30)
        assert err < 2e-2, f"{name}: relative error {err:.3g}"
