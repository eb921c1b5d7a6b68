"""torch.library custom ops on the GPU (our kernels): torch.compile(fullgraph=True) of a small MoE
block vs eager (aot_eager and inductor), gradients with bf16 operands vs an fp32 torch reference,
and CUDA-graph capture of the forward ops replayed with new offs / new data."""

import pytest
import torch
import torch.nn.functional as F

import cutegemm  # noqa: F401  (registers the ops)
from cutegemm.grouped import grouped_gemm_ref

pytestmark = pytest.mark.gpu

OP = torch.ops.cutegemm
BF16 = torch.bfloat16


def make_offs(counts):
    return torch.tensor(counts, dtype=torch.int32, device="cuda").cumsum(0, dtype=torch.int32)


def rel_err(x, ref):
    ref = ref.float()
    return ((x.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


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


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_moe_block_matches_eager(backend):
    torch._dynamo.reset()
    counts = [64, 0, 96, 40]
    offs, end = make_offs(counts), sum(counts)
    params = moe_params(end + 24, 128, 128, len(counts))
    out_e, grads_e = run_with_grads(moe_block, params, offs, end)
    compiled = torch.compile(moe_block, backend=backend, fullgraph=True)
    out_c, grads_c = run_with_grads(compiled, params, offs, end)
    tol = 1e-3 if backend == "aot_eager" else 2e-2  # inductor fuses the SwiGLU differently
    assert rel_err(out_c, out_e) <= tol
    for i, (gc, ge) in enumerate(zip(grads_c, grads_e, strict=True)):
        assert rel_err(gc, ge) <= tol, f"grad {i}"
    # New offs contents: no recompile needed, still matches eager.
    counts = [10, 150, 0, 40]
    offs.copy_(make_offs(counts))
    out_e, _ = run_with_grads(moe_block, params, offs, sum(counts))
    out_c, _ = run_with_grads(compiled, params, offs, sum(counts))
    assert rel_err(out_c, out_e) <= tol


# ---------------------------------------------------------------------------------------------- gradients


def test_grouped_packed_grads_vs_fp32_reference():
    counts, pad, H, N = [64, 0, 96, 32], 16, 128, 256
    offs, end = make_offs(counts), sum(counts)
    x = torch.randn(end + pad, H, device="cuda", dtype=BF16, requires_grad=True)
    w = (torch.randn(len(counts), N, H, device="cuda") * H**-0.5).to(BF16).requires_grad_()
    y = OP.grouped_gemm(x, w.transpose(1, 2), offs, alpha=0.5)
    g = torch.randn(end + pad, N, device="cuda", dtype=BF16)
    g[end:] = float("nan")  # never read
    y.backward(g)
    xf, wf = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    starts = [0, *offs.tolist()[:-1]]
    yr = (
        torch.cat([xf[s:e] @ wf[i].t() for i, (s, e) in enumerate(zip(starts, offs.tolist(), strict=True))])
        * 0.5
    )
    yr.backward(g[:end].float())
    assert rel_err(y[:end], yr) < 1e-2
    assert rel_err(x.grad[:end], xf.grad[:end]) < 2e-2
    assert (x.grad[end:] == 0).all()
    assert rel_err(w.grad, wf.grad) < 2e-2
    assert (w.grad[1] == 0).all()  # the expert with no rows


def test_grouped_k_grads_vs_fp32_reference():
    counts, M, N = [64, 0, 128], 128, 64
    offs, total = make_offs(counts), sum(counts) + 64  # 64 columns of a past offs[-1]
    a = torch.randn(M, total, device="cuda", dtype=BF16, requires_grad=True)
    b = torch.randn(total, N, device="cuda", dtype=BF16, requires_grad=True)
    y = OP.grouped_gemm(a, b, offs)
    g = torch.randn_like(y)
    y.backward(g)
    af, bf = a.detach().float().requires_grad_(), b.detach().float().requires_grad_()
    ref = grouped_gemm_ref(af, bf, offs=offs, compute_dtype=torch.float32)
    ref.backward(g.float())
    assert rel_err(a.grad, af.grad) < 2e-2
    assert rel_err(b.grad, bf.grad) < 2e-2


@pytest.mark.parametrize("activation", [None, "relu", "silu", "gelu_tanh", "swiglu"])
@pytest.mark.parametrize("batched", [False, True])
def test_gemm_grads_vs_fp32_reference(activation, batched):
    M, K, N = 192, 128, 256
    lead = (3,) if batched else ()
    a = torch.randn(*lead, M, K, device="cuda", dtype=BF16, requires_grad=True)
    b = (torch.randn(K, N, device="cuda") * K**-0.5).to(BF16).requires_grad_()  # shared over the batch
    bias = torch.randn(N, device="cuda", requires_grad=True)
    y = OP.gemm(a, b, bias, alpha=0.7, out_dtype=torch.float32, activation=activation)
    g = torch.randn_like(y)
    y.backward(g)
    af, bf, biasf = (t.detach().float().requires_grad_() for t in (a, b, bias))
    z = 0.7 * (af @ bf) + biasf
    if activation == "swiglu":
        yr = F.silu(z[..., 0::2]) * z[..., 1::2]
    elif activation is None:
        yr = z
    else:
        yr = {"relu": torch.relu, "silu": F.silu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[
            activation
        ](z)
    yr.backward(g)
    assert rel_err(y, yr) < 1e-2
    for got, ref, name in ((a.grad, af.grad, "a"), (b.grad, bf.grad, "b"), (bias.grad, biasf.grad, "bias")):
        assert rel_err(got, ref) < 2e-2, name


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
    for counts in ([100, 0, 200, 150], [0, 512, 0, 0], [7, 300, 1, 50], [0, 0, 0, 0]):
        offs.copy_(make_offs(counts))
        a.copy_(torch.randn_like(a))
        graph.replay()
        torch.cuda.synchronize()
        end = sum(counts)
        ref = grouped_gemm_ref(a, b, offs=offs, alpha=0.5, compute_dtype=torch.float32)
        if end:
            assert rel_err(out[:end], ref[:end]) < 1e-2, counts


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
        ref = F.silu(0.25 * (a.float() @ b.float()) + bias)
        assert rel_err(out, ref) < 1e-2
