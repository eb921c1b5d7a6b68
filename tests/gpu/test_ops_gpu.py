"""torch.library custom ops on the GPU (our kernels):
- torch.compile(fullgraph=True) (aot_eager and inductor) of two small MoE blocks vs eager, forward
  and gradients: a router-free block (offs given, padding rows past offs[-1]) and a routed block
  (top-1 router -> tokens sorted by expert on the device -> grouped up-proj -> SwiGLU -> grouped
  down-proj -> unsort, scaled by the router probability); new offs contents never recompile;
- gradients of gemm (every activation kind, batched, bias) and of both grouped forms with bf16
  operands vs an fp64 reference: our error <= 2x torch's own bf16 autograd error + a small atol;
- CUDA-graph capture of each forward op, replayed with new data / new offs, bitwise equal to
  eager and within torch's error of the reference. (The K-grouped form and the packed backward
  read offs on the host: not capturable, see cutegemm/ops.py.)
- the quantization ops (cutegemm::quantize, cutegemm::gemm_quantized): torch.compile(fullgraph)
  of a function calling both, bitwise equal to eager and to the plain functions; CUDA-graph
  capture replayed with new data and a new NVFP4 global scale, bitwise equal to eager."""

import pytest
import torch
import torch.nn.functional as F

import cutegemm.ops  # noqa: F401  (registers torch.ops.cutegemm)
from cutegemm import grouped_gemm_ref

from ..gemm_check import assert_within_torch_error

pytestmark = pytest.mark.gpu

OP = torch.ops.cutegemm
BF16 = torch.bfloat16
F64 = torch.float64


def make_offs(counts):
    return torch.tensor(counts, dtype=torch.int32, device="cuda").cumsum(0, dtype=torch.int32)


def bounds(offs):
    ends = offs.tolist()
    return list(zip([0, *ends[:-1]], ends, strict=True))


def rel_err(x, ref):
    ref = ref.float()
    return ((x.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def copies(*tensors):
    """(torch bf16 leaves, fp64 reference leaves) detached copies of our leaves, requiring grad."""
    lp = [t.detach().clone().requires_grad_() for t in tensors]
    ref = [t.detach().to(F64).requires_grad_() for t in tensors]
    return lp, ref


def assert_grads(ours, lp, ref, names, atol=1e-5):
    for o, t, r, name in zip(ours, lp, ref, names, strict=True):
        assert_within_torch_error(o.grad, t.grad, r.grad, atol=atol, what=f"grad {name}")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ---------------------------------------------------------------------------------------------- torch.compile


def moe_block(x, w_gate_up, w_down, w_out, bias, offs):
    """Router-free MoE block: tokens sorted by expert, offs given (same as tests/test_ops_cpu.py)."""
    h = OP.grouped_gemm(x, w_gate_up, offs)  # (T, 2I)
    inter = h.shape[1] // 2
    act = (F.silu(h[:, :inter].float()) * h[:, inter:].float()).to(x.dtype)
    y = OP.grouped_gemm(act, w_down, offs)  # (T, H)
    keep = torch.arange(y.shape[0], device=y.device).unsqueeze(1) < offs[-1]  # rows past offs[-1]: garbage
    y = torch.where(keep, y, torch.zeros((), dtype=y.dtype, device=y.device))
    return OP.gemm(y, w_out, bias, alpha=0.5, activation="gelu_tanh")


def moe_params(T, H, inter, E):
    def p(*shape, scale):
        return (torch.randn(*shape, device="cuda") * scale).to(BF16)

    return [
        p(T, H, scale=1.0).requires_grad_(),
        p(E, 2 * inter, H, scale=H**-0.5).transpose(1, 2).requires_grad_(),  # (E, H, 2I) view, K-major
        p(E, inter, H, scale=inter**-0.5).requires_grad_(),  # (E, I, H) used as b (E, K=I, N=H)
        p(H, H, scale=H**-0.5).requires_grad_(),
        torch.randn(H, device="cuda").requires_grad_(),  # fp32 bias
    ]


def run_with_grads(fn, params, offs, end):
    for q in params:
        q.grad = None
    out = fn(*params, offs)
    out[:end].float().square().sum().backward()
    torch.cuda.synchronize()
    return out[:end].detach(), [q.grad.clone() for q in params]


_TOL = {"aot_eager": 1e-3, "inductor": 2e-2}  # inductor fuses the SwiGLU / casts differently


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_moe_block_matches_eager(backend):
    torch._dynamo.reset()
    counts = [64, 0, 96, 40]
    offs, end = make_offs(counts), sum(counts)
    params = moe_params(end + 24, 128, 128, len(counts))
    out_e, grads_e = run_with_grads(moe_block, params, offs, end)
    compiled = torch.compile(moe_block, backend=backend, fullgraph=True)
    out_c, grads_c = run_with_grads(compiled, params, offs, end)
    tol = _TOL[backend]
    assert not torch.isnan(out_c).any()
    assert rel_err(out_c, out_e) <= tol
    for i, (gc, ge) in enumerate(zip(grads_c, grads_e, strict=True)):
        assert not torch.isnan(gc).any(), f"grad {i}: NaN"
        assert rel_err(gc, ge) <= tol, f"grad {i}"
    # New offs contents: no recompile (the fake impls never read offs), still matches eager.
    counts = [10, 150, 0, 40]
    offs.copy_(make_offs(counts))
    out_e, grads_e = run_with_grads(moe_block, params, offs, sum(counts))
    with torch._dynamo.config.patch(error_on_recompile=True):
        out_c, grads_c = run_with_grads(compiled, params, offs, sum(counts))
    assert rel_err(out_c, out_e) <= tol
    for i, (gc, ge) in enumerate(zip(grads_c, grads_e, strict=True)):
        assert rel_err(gc, ge) <= tol, f"grad {i} (new offs)"


def routed_moe(x, w_router, w_gate_up, w_down):
    """Top-1 MoE block, everything on the device (no host sync, fixed shapes): route, sort tokens
    by expert, grouped up-proj (gate | up), SwiGLU, grouped down-proj, unsort, scale by the
    router probability."""
    num_experts = w_router.shape[1]
    logits = x.float() @ w_router  # (T, E)
    idx = logits.argmax(dim=-1)
    weight = torch.softmax(logits, dim=-1).gather(1, idx.unsqueeze(1))  # (T, 1)
    order = torch.argsort(idx, stable=True)
    counts = (idx.unsqueeze(1) == torch.arange(num_experts, device=x.device)).sum(0)
    offs = counts.cumsum(0).to(torch.int32)
    h = OP.grouped_gemm(x[order], w_gate_up, offs)  # (T, 2I)
    inter = h.shape[1] // 2
    act = (F.silu(h[:, :inter].float()) * h[:, inter:].float()).to(x.dtype)
    ys = OP.grouped_gemm(act, w_down, offs)  # (T, H), sorted by expert
    y = ys[torch.argsort(order)]
    return (y.float() * weight).to(x.dtype)


def routed_moe_ref(x, w_router, w_gate_up, w_down):
    """fp64 twin: per token, its expert's MLP (no sorting)."""
    x64 = x.double()
    logits = x.float() @ w_router  # the same routing decision as the block
    idx = logits.argmax(dim=-1)
    weight = torch.softmax(logits.double(), dim=-1).gather(1, idx.unsqueeze(1))
    out = torch.zeros(x.shape[0], w_down.shape[2], dtype=F64, device=x.device)
    inter = w_gate_up.shape[2] // 2
    for e in range(w_router.shape[1]):
        rows = idx == e
        h = x64[rows] @ w_gate_up[e].double()
        out[rows] = (F.silu(h[:, :inter]) * h[:, inter:]) @ w_down[e].double()
    return out * weight


def routed_params(T, H, inter, E):
    def p(*shape, scale):
        return (torch.randn(*shape, device="cuda") * scale).to(BF16)

    return [
        p(T, H, scale=1.0).requires_grad_(),
        (torch.randn(H, E, device="cuda") * H**-0.5).requires_grad_(),  # fp32 router
        p(E, 2 * inter, H, scale=H**-0.5).transpose(1, 2).requires_grad_(),
        p(E, H, inter, scale=inter**-0.5).transpose(1, 2).requires_grad_(),  # (E, I, H) view of (E, H, I)
    ]


def run_routed(fn, params):
    for q in params:
        q.grad = None
    out = fn(*params)
    out.float().square().sum().backward()
    torch.cuda.synchronize()
    return out.detach(), [q.grad.clone() for q in params]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_routed_moe_block_matches_eager(backend):
    torch._dynamo.reset()
    T, H, inter, E = 384, 128, 192, 6
    params = routed_params(T, H, inter, E)
    out_e, grads_e = run_routed(routed_moe, params)
    with torch.no_grad():
        assert rel_err(out_e, routed_moe_ref(*params)) < 2e-2, "eager block vs fp64 reference"
    compiled = torch.compile(routed_moe, backend=backend, fullgraph=True)
    out_c, grads_c = run_routed(compiled, params)
    tol = _TOL[backend]
    assert not torch.isnan(out_c).any()
    assert rel_err(out_c, out_e) <= tol
    for i, (gc, ge) in enumerate(zip(grads_c, grads_e, strict=True)):
        assert not torch.isnan(gc).any(), f"grad {i}: NaN"
        assert rel_err(gc, ge) <= tol, f"grad {i}"
    # New tokens (new routing, new offs): no recompile, still matches eager and the reference.
    with torch.no_grad():
        params[0].copy_(torch.randn_like(params[0]))
    with torch._dynamo.config.patch(error_on_recompile=True):
        out_c = compiled(*params).detach()
    with torch.no_grad():
        assert rel_err(out_c, routed_moe(*params)) <= tol
        assert rel_err(out_c, routed_moe_ref(*params)) < 2e-2


# ---------------------------------------------------------------------------------------------- gradients


def test_grouped_packed_grads_vs_fp64_reference():
    counts, pad, H, N = [64, 0, 96, 32], 16, 128, 256
    offs, end = make_offs(counts), sum(counts)
    x = torch.randn(end + pad, H, device="cuda", dtype=BF16, requires_grad=True)
    w = (torch.randn(len(counts), N, H, device="cuda") * H**-0.5).to(BF16).requires_grad_()
    y = OP.grouped_gemm(x, w.transpose(1, 2), offs, alpha=0.5)
    g = torch.randn(end + pad, N, device="cuda", dtype=BF16)
    g[end:] = float("nan")  # rows past offs[-1]: their gradient is never read
    y.backward(g)
    (xt, wt), (xr, wr) = copies(x, w)
    outs = []
    for xx, ww in ((xt, wt), (xr, wr)):
        yy = torch.cat([xx[s:e] @ ww[i].t() for i, (s, e) in enumerate(bounds(offs))]) * 0.5
        yy.backward(g[:end].to(yy.dtype))
        outs.append(yy)
    assert_within_torch_error(y[:end], outs[0], outs[1].detach(), what="y")
    assert_within_torch_error(x.grad[:end], xt.grad[:end], xr.grad[:end], what="grad x")
    assert_within_torch_error(w.grad, wt.grad, wr.grad, what="grad w")
    assert (x.grad[end:] == 0).all(), "rows past offs[-1] must get a zero gradient"
    assert (w.grad[1] == 0).all(), "the expert with no rows must get a zero gradient"


def test_grouped_k_grads_vs_fp64_reference():
    counts, M, N = [64, 0, 128], 128, 64
    offs, total = make_offs(counts), sum(counts) + 64  # 64 columns of a past offs[-1]
    a = torch.randn(M, total, device="cuda", dtype=BF16, requires_grad=True)
    b = torch.randn(total, N, device="cuda", dtype=BF16, requires_grad=True)
    y = OP.grouped_gemm(a, b, offs)
    g = torch.randn_like(y)
    y.backward(g)
    lp, ref = copies(a, b)
    outs = []
    for aa, bb in (lp, ref):
        yy = torch.stack([aa[:, s:e] @ bb[s:e] for s, e in bounds(offs)])
        yy.backward(g.to(yy.dtype))
        outs.append(yy)
    assert_within_torch_error(y, outs[0], outs[1].detach(), what="y")
    assert_grads([a, b], lp, ref, ["a", "b"])
    assert (a.grad[:, sum(counts) :] == 0).all() and (b.grad[sum(counts) :] == 0).all()


def _act_ref(activation, z):
    if activation is None:
        return z
    if activation == "swiglu":
        return F.silu(z[..., 0::2]) * z[..., 1::2]  # the kernels' interleaved gate/up columns
    return {"relu": torch.relu, "silu": F.silu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[
        activation
    ](z)


@pytest.mark.parametrize("activation", [None, "relu", "silu", "gelu_tanh", "swiglu"])
@pytest.mark.parametrize("batched", [False, True])
def test_gemm_grads_vs_fp64_reference(activation, batched):
    M, K, N = 192, 128, 256
    lead = (3,) if batched else ()
    a = torch.randn(*lead, M, K, device="cuda", dtype=BF16, requires_grad=True)
    b = (torch.randn(K, N, device="cuda") * K**-0.5).to(BF16).requires_grad_()  # shared over the batch
    bias = torch.randn(N, device="cuda", requires_grad=True)
    y = OP.gemm(a, b, bias, alpha=0.7, out_dtype=torch.float32, activation=activation)
    g = torch.randn_like(y)
    y.backward(g)
    lp, ref = copies(a, b, bias)
    outs = []
    for aa, bb, cc in (lp, ref):
        yy = _act_ref(activation, 0.7 * (aa @ bb) + cc)  # torch: bf16 matmul, epilogue in fp32
        yy.backward(g.to(yy.dtype))
        outs.append(yy)
    assert_within_torch_error(y, outs[0], outs[1].detach(), what="y")
    assert_grads([a, b, bias], lp, ref, ["a", "b", "bias"])


# ---------------------------------------------------------------------------------------------- CUDA graphs


def _warm(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # compiles / loads the kernels, fills the plan caches
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()


def test_cuda_graph_grouped_op_replayed_with_new_offs():
    E, K, N, T = 4, 128, 256, 512
    a = torch.randn(T, K, device="cuda", dtype=BF16)
    b = torch.randn(E, N, K, device="cuda", dtype=BF16).transpose(1, 2)
    offs = make_offs([100, 0, 200, 150])
    _warm(lambda: OP.grouped_gemm(a, b, offs, alpha=0.5))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = OP.grouped_gemm(a, b, offs, alpha=0.5)
    checked = 0
    for counts in ([100, 0, 200, 150], [0, 512, 0, 0], [7, 300, 1, 50], [0, 0, 0, 0], [128, 128, 128, 128]):
        offs.copy_(make_offs(counts))
        a.copy_(torch.randn_like(a))
        graph.replay()
        torch.cuda.synchronize()
        end = sum(counts)
        if not end:
            continue
        eager = OP.grouped_gemm(a, b, offs, alpha=0.5)
        assert torch.equal(out[:end], eager[:end]), f"replay differs from eager for {counts}"
        ref = grouped_gemm_ref(a, b, offs=offs, alpha=0.5, compute_dtype=F64)
        same = torch.cat([a[s:e] @ b[i] for i, (s, e) in enumerate(bounds(offs))]) * 0.5
        assert_within_torch_error(out[:end], same, ref[:end], what=f"replay {counts}")
        checked += 1
    assert checked == 4


def test_cuda_graph_gemm_op_replayed_with_new_data():
    a = torch.randn(256, 128, device="cuda", dtype=BF16)
    b = torch.randn(128, 192, device="cuda", dtype=BF16)
    bias = torch.randn(192, device="cuda")

    def fn():
        return OP.gemm(a, b, bias, alpha=0.25, activation="silu")

    _warm(fn)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    for _ in range(3):
        a.copy_(torch.randn_like(a))
        bias.copy_(torch.randn_like(bias))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, fn()), "replay differs from eager"
        ref = F.silu(0.25 * (a.double() @ b.double()) + bias.double())
        same = F.silu(0.25 * (a @ b).float() + bias).to(BF16)
        assert_within_torch_error(out, same, ref, what="gemm replay")


def test_cuda_graph_moe_block_forward_replayed_with_new_offs():
    """Both ops and the torch glue of the block in one captured graph (inference)."""
    counts = [64, 0, 96, 40]
    offs, T = make_offs(counts), 224
    params = [q.detach() for q in moe_params(T, 128, 128, len(counts))]
    with torch.no_grad():
        _warm(lambda: moe_block(*params, offs))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = moe_block(*params, offs)
        for counts in ([10, 150, 0, 40], [224, 0, 0, 0], [0, 0, 0, 1], [50, 50, 50, 50]):
            offs.copy_(make_offs(counts))
            params[0].copy_(torch.randn_like(params[0]))
            graph.replay()
            torch.cuda.synchronize()
            end = sum(counts)
            assert torch.equal(out[:end], moe_block(*params, offs)[:end]), counts


# ---------------------------------------------------------------------------------------------- quantization ops


def _bytes(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t


def assert_same_quantized(q, ref, what=""):
    """Bitwise equality of two BlockScaledTensors (elements, swizzled scales, global scale)."""
    assert q.fmt == ref.fmt and tuple(q.shape) == tuple(ref.shape), what
    assert q.data.dtype == ref.data.dtype and q.scales.dtype == ref.scales.dtype, what
    assert q.data.shape == ref.data.shape and q.scales.shape == ref.scales.shape, what
    assert torch.equal(_bytes(q.data), _bytes(ref.data)), f"{what}: data differs"
    assert torch.equal(_bytes(q.scales), _bytes(ref.scales)), f"{what}: scales differ"
    assert (q.global_scale is None) == (ref.global_scale is None), what
    if q.global_scale is not None:
        assert torch.equal(q.global_scale.reshape(()), ref.global_scale.reshape(())), f"{what}: global scale"


def quant_block(x, w, bias, gs):
    """Both quantization ops in one function: quantize the activations three ways, and two GEMMs
    with quantized outputs (MXFP8 with bias + activation; NVFP4 with a given global scale)."""
    return (
        cutegemm.ops.quantize(x, "mxfp8"),
        cutegemm.ops.quantize(x, "nvfp4"),  # default global scale, computed on the device
        cutegemm.ops.quantize(x.float() * 3, "mxfp4", scale_rule="ceil"),
        cutegemm.ops.gemm_quantized(x, w, bias, out_dtype="mxfp8", alpha=0.5, activation="gelu_tanh"),
        cutegemm.ops.gemm_quantized(x, w, out_dtype="nvfp4", out_global_scale=gs),
    )


def quant_block_direct(x, w, bias, gs):
    """The same through the plain functions (no custom ops)."""
    return (
        cutegemm.quantize(x, "mxfp8"),
        cutegemm.quantize(x, "nvfp4"),
        cutegemm.quantize(x.float() * 3, "mxfp4", scale_rule="ceil"),
        cutegemm.gemm(x, w, bias=bias, out_dtype="mxfp8", alpha=0.5, activation="gelu_tanh"),
        cutegemm.gemm(x, w, out_dtype="nvfp4", out_global_scale=gs),
    )


def quant_inputs(M=200, K=128, N=192):
    x = torch.randn(M, K, device="cuda").to(BF16)
    w = (torch.randn(K, N, device="cuda") * K**-0.5).to(BF16)
    bias = torch.randn(N, device="cuda")
    gs = torch.tensor([0.004], device="cuda")
    return x, w, bias, gs


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_quant_ops_fullgraph_matches_eager(backend):
    torch._dynamo.reset()
    args = quant_inputs()
    eager = quant_block(*args)
    direct = quant_block_direct(*args)
    compiled = torch.compile(quant_block, backend=backend, fullgraph=True)
    got = compiled(*args)
    torch.cuda.synchronize()
    names = ["quantize mxfp8", "quantize nvfp4", "quantize mxfp4 ceil", "gemm mxfp8", "gemm nvfp4"]
    for g, e, d, name in zip(got, eager, direct, names, strict=True):
        assert_same_quantized(e, d, f"op vs plain function: {name}")
        assert_same_quantized(g, e, f"compiled ({backend}) vs eager: {name}")
    # the quantize op is byte-identical to quantize_ref on the same device
    from cutegemm.blockscaled import quantize_ref

    assert_same_quantized(eager[0], quantize_ref(args[0], "mxfp8"), "quantize vs quantize_ref")
    assert_same_quantized(eager[1], quantize_ref(args[0], "nvfp4"), "quantize nvfp4 vs quantize_ref")


def test_cuda_graph_quant_ops_replayed_with_new_data():
    x, w, bias, gs = quant_inputs(M=160)
    _warm(lambda: quant_block(x, w, bias, gs))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = quant_block(x, w, bias, gs)
    for i in range(3):
        x.copy_(torch.randn_like(x, dtype=torch.float32).to(BF16) * (1 + i))
        gs.fill_(0.002 * (i + 1))
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(outs, quant_block(x, w, bias, gs), strict=True):
            assert_same_quantized(got, want, f"replay {i} vs eager")
