"""torch.library custom ops on CPU (no GPU): schemas, opcheck, fake shapes, float64 gradcheck of
gemm and both grouped forms, the rows-past-offs[-1] gradient contract, and torch.compile
(fullgraph=True, backend="aot_eager": dynamo + fake tensors + AOTAutograd, forward and backward)
of a small MoE block against eager; the quantization ops (cutegemm::quantize,
cutegemm::gemm_quantized): opcheck, fake shapes == real shapes (hypothesis), wrappers == the torch
references byte for byte, bad inputs, torch.compile(fullgraph=True) bitwise equal to eager.
Inductor on CPU takes ~30 s to compile the block: opt in with CUTEGEMM_TEST_INDUCTOR=1."""

import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

import cutegemm  # noqa: F401  (registers the ops)
from cutegemm import ops
from cutegemm.config import ACTIVATIONS, GATED

OP = torch.ops.cutegemm
F64 = torch.float64


def make_offs(counts):
    return torch.tensor(counts, dtype=torch.int32).cumsum(0, dtype=torch.int32)


def rand(*shape, dtype=F64, grad=True):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_schemas():
    assert str(OP.gemm.default._schema) == (
        "cutegemm::gemm(Tensor a, Tensor b, Tensor? bias=None, *, float alpha=1., ScalarType? out_dtype=None, "
        "str? activation=None) -> Tensor"
    )
    assert str(OP.grouped_gemm.default._schema) == (
        "cutegemm::grouped_gemm(Tensor a, Tensor b, Tensor offs, *, float alpha=1., ScalarType? out_dtype=None, "
        "str? activation=None) -> Tensor"
    )
    assert ops.gemm._opoverload is OP.gemm.default


# ---------------------------------------------------------------------------------------------- opcheck

GEMM_CASES = {
    "plain_f32": lambda: ((rand(5, 6, dtype=torch.float32), rand(6, 4, dtype=torch.float32)), {}),
    "bias_silu_alpha": lambda: ((rand(5, 6), rand(6, 4), rand(4)), {"alpha": 0.5, "activation": "silu"}),
    "batched_shared_b": lambda: ((rand(2, 5, 6), rand(6, 4)), {"activation": "gelu_tanh"}),
    "shared_a_batched_b": lambda: ((rand(5, 6), rand(3, 6, 4)), {"alpha": 2.0}),
    "batched_relu": lambda: ((rand(2, 5, 6), rand(2, 6, 4), rand(4)), {"activation": "relu"}),
    "swiglu": lambda: ((rand(5, 6), rand(6, 8), rand(8)), {"activation": "swiglu"}),
    "bf16_out_f32": lambda: (
        (rand(5, 8, dtype=torch.bfloat16), rand(8, 4, dtype=torch.bfloat16)),
        {"out_dtype": torch.float32},
    ),
    "transposed_views": lambda: ((rand(6, 5).detach().t().requires_grad_(), rand(4, 6).detach().t()), {}),
}


@pytest.mark.parametrize("case", list(GEMM_CASES))
def test_opcheck_gemm(case):
    args, kwargs = GEMM_CASES[case]()
    torch.library.opcheck(OP.gemm.default, args, kwargs)


GROUPED_CASES = {
    # packed, an expert with no rows and rows past offs[-1]
    "packed": lambda: ((rand(11, 6), rand(3, 6, 4), make_offs([4, 0, 5])), {"alpha": 0.5}),
    "packed_f32_weight_view": lambda: (
        (
            rand(9, 8, dtype=torch.float32),
            rand(3, 4, 8, dtype=torch.float32).detach().transpose(1, 2).requires_grad_(),
            make_offs([3, 3, 3]),
        ),
        {},
    ),  # fmt: skip
    "packed_bf16_out_f32": lambda: (
        (rand(9, 8, dtype=torch.bfloat16), rand(2, 8, 8, dtype=torch.bfloat16), make_offs([2, 5])),
        {"out_dtype": torch.float32},
    ),
    "packed_no_experts": lambda: ((rand(4, 6), rand(0, 6, 4), make_offs([])), {}),
    "k_grouped": lambda: ((rand(5, 10), rand(10, 4), make_offs([3, 0, 6])), {"alpha": 1.5}),
    "packed_swiglu": lambda: ((rand(11, 6), rand(3, 6, 8), make_offs([4, 0, 5])), {"activation": "swiglu"}),
    "packed_gelu_bf16": lambda: (
        (rand(9, 8, dtype=torch.bfloat16), rand(2, 8, 8, dtype=torch.bfloat16), make_offs([2, 7])),
        {"activation": "gelu", "out_dtype": torch.float32},
    ),
}


@pytest.mark.parametrize("case", list(GROUPED_CASES))
def test_opcheck_grouped(case):
    args, kwargs = GROUPED_CASES[case]()
    torch.library.opcheck(OP.grouped_gemm.default, args, kwargs)


# ---------------------------------------------------------------------------------------------- fake shapes


def test_fake_shapes_and_dtypes():
    with FakeTensorMode():
        bf = torch.bfloat16
        a, b = torch.empty(7, 16, dtype=bf), torch.empty(16, 10, dtype=bf)
        assert OP.gemm(a, b).shape == (7, 10) and OP.gemm(a, b).dtype == bf
        y = OP.gemm(a, b, torch.empty(10), activation="geglu", out_dtype=torch.float32)
        assert y.shape == (7, 5) and y.dtype == torch.float32
        assert OP.gemm(torch.empty(3, 7, 16, dtype=bf), b).shape == (3, 7, 10)
        assert OP.gemm(a, torch.empty(4, 16, 10, dtype=bf)).shape == (4, 7, 10)
        offs = torch.empty(5, dtype=torch.int32)
        y = OP.grouped_gemm(torch.empty(33, 16, dtype=bf), torch.empty(5, 16, 24, dtype=bf), offs)
        assert y.shape == (33, 24) and y.dtype == bf
        y = OP.grouped_gemm(
            torch.empty(16, 33, dtype=bf), torch.empty(33, 24, dtype=bf), offs, out_dtype=torch.float32
        )
        assert y.shape == (5, 16, 24) and y.dtype == torch.float32


def test_bad_inputs_raise():
    a, b = torch.randn(5, 6), torch.randn(6, 4)
    with pytest.raises(ValueError, match="do not match"):
        OP.gemm(a, torch.randn(5, 4))
    with pytest.raises(TypeError):
        OP.gemm(a, b.double())
    with pytest.raises(ValueError, match="activation"):
        OP.gemm(a, b, activation="softplus")
    with pytest.raises(ValueError, match="bias"):
        OP.gemm(a, b, torch.randn(5))
    with pytest.raises(TypeError, match="int32"):
        OP.grouped_gemm(torch.randn(8, 6), torch.randn(2, 6, 4), torch.tensor([3, 8]))
    with pytest.raises(ValueError, match="experts"):
        OP.grouped_gemm(torch.randn(8, 6), torch.randn(2, 6, 4), make_offs([8]))
    with FakeTensorMode(), pytest.raises(ValueError, match="disagree on K"):
        OP.grouped_gemm(torch.empty(8, 6), torch.empty(2, 5, 4), torch.empty(2, dtype=torch.int32))


# ---------------------------------------------------------------------------------------------- gradcheck


@pytest.mark.parametrize("activation", [None, *ACTIVATIONS, *GATED])
def test_gradcheck_gemm_activations(activation):
    a, b, bias = rand(5, 6), rand(6, 8), rand(8)
    assert torch.autograd.gradcheck(
        lambda a, b, bias: OP.gemm(a, b, bias, alpha=0.7, activation=activation), (a, b, bias)
    )


@pytest.mark.parametrize("shapes", [((2, 5, 6), (6, 4)), ((5, 6), (3, 6, 4)), ((2, 5, 6), (2, 6, 4))])
def test_gradcheck_gemm_batched(shapes):
    a, b = rand(*shapes[0]), rand(*shapes[1])
    assert torch.autograd.gradcheck(lambda a, b: OP.gemm(a, b, alpha=1.5, activation="silu"), (a, b))


def test_gradcheck_gemm_bias_only_and_out_dtype():
    a, b, bias = rand(5, 6, grad=False), rand(6, 4, grad=False), rand(4)
    assert torch.autograd.gradcheck(lambda bias: OP.gemm(a, b, bias), (bias,))
    a = rand(5, 6)
    assert torch.autograd.gradcheck(lambda a: OP.gemm(a, b, out_dtype=torch.float64), (a,))


@pytest.mark.parametrize("counts,pad", [([3, 0, 4, 2], 3), ([0, 5], 0), ([0, 0], 2)])
def test_gradcheck_grouped_packed(counts, pad):
    """Experts with no rows; rows past offs[-1] (their output is unspecified; their da is 0)."""
    offs = make_offs(counts)
    a, b = rand(sum(counts) + pad, 6), rand(len(counts), 6, 5)

    def f(a, b):
        return OP.grouped_gemm(a, b, offs, alpha=0.5)[: sum(counts)]  # only the specified rows

    assert torch.autograd.gradcheck(f, (a, b))


@pytest.mark.parametrize("activation", ["relu", "silu", "gelu_tanh", "relu_sq", "tanh", "swiglu", "geglu", "glu", "swiglu_oai"])
def test_gradcheck_grouped_packed_activation(activation):
    """The packed op with an activation: dZ = dY * act'(Z), Z recomputed by the op."""
    counts = [3, 0, 4]
    offs = make_offs(counts)
    a, b = rand(sum(counts) + 2, 6), rand(3, 6, 8)

    def f(a, b):
        return OP.grouped_gemm(a, b, offs, alpha=0.5, activation=activation)[: sum(counts)]

    assert torch.autograd.gradcheck(f, (a, b))


def test_grouped_activation_shapes_and_rules():
    offs = make_offs([2, 3])
    with FakeTensorMode():
        y = OP.grouped_gemm(torch.empty(5, 16), torch.empty(2, 16, 24), torch.empty(2, dtype=torch.int32),
                            activation="swiglu")  # fmt: skip
        assert y.shape == (5, 12)
    with pytest.raises(ValueError, match="K-grouped"):
        OP.grouped_gemm(torch.randn(4, 5), torch.randn(5, 6), offs, activation="relu")
    with pytest.raises(ValueError, match="even"):
        OP.grouped_gemm(torch.randn(5, 4), torch.randn(2, 4, 7), offs, activation="geglu")
    with pytest.raises(ValueError, match="activation"):
        OP.grouped_gemm(torch.randn(5, 4), torch.randn(2, 4, 8), offs, activation="softplus")


def test_gradcheck_grouped_k():
    offs = make_offs([3, 0, 4])
    a, b = rand(5, 9), rand(9, 4)  # T = 9, offs[-1] = 7: two columns of a / rows of b unused
    assert torch.autograd.gradcheck(lambda a, b: OP.grouped_gemm(a, b, offs, alpha=0.5), (a, b))


def test_packed_grad_ignores_rows_past_end():
    """dY in rows past offs[-1] is never read (NaN there must not leak); da there is exactly 0."""
    counts = [2, 0, 3]
    offs, end = make_offs(counts), sum(counts)
    a, b = rand(end + 4, 6), rand(3, 6, 5)
    y = OP.grouped_gemm(a, b, offs)
    g = torch.randn_like(y)
    g[end:] = float("nan")
    y.backward(g)
    assert torch.isfinite(a.grad).all() and torch.isfinite(b.grad).all()
    assert (a.grad[end:] == 0).all()
    ref_a, ref_b = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    ref = torch.cat(
        [ref_a[s:e] @ ref_b[i] for i, (s, e) in enumerate(zip([0, 2, 2], [2, 2, 5], strict=True))]
    )
    ref.backward(g[:end])
    torch.testing.assert_close(a.grad[:end], ref_a.grad[:end])
    torch.testing.assert_close(b.grad, ref_b.grad)  # expert 1 (no rows): zero


# ---------------------------------------------------------------------------------------------- torch.compile


def moe_block(x, w_gate_up, w_down, w_out, bias, offs):
    """Router-free MoE block: tokens sorted by expert, offs given."""
    h = OP.grouped_gemm(x, w_gate_up, offs)  # (T, 2I)
    inter = h.shape[1] // 2
    act = F.silu(h[:, :inter]) * h[:, inter:]
    y = OP.grouped_gemm(act, w_down, offs)  # (T, H)
    # Rows past offs[-1] are unspecified (garbage on CUDA): zero them before anything that mixes
    # rows (the dense layer's weight gradient sums over all rows). Graph-safe, no host sync.
    keep = torch.arange(y.shape[0], device=y.device).unsqueeze(1) < offs[-1]
    y = torch.where(keep, y, torch.zeros((), dtype=y.dtype, device=y.device))
    return OP.gemm(y, w_out, bias, alpha=0.5, activation="gelu_tanh")  # dense (T, H)


def moe_params(T, H, inter, E, dtype=torch.float32):
    return [
        rand(T, H, dtype=dtype),
        rand(E, 2 * inter, H, dtype=dtype)
        .detach()
        .transpose(1, 2)
        .requires_grad_(),  # nn.Linear-style storage
        rand(E, inter, H, dtype=dtype),
        rand(H, H, dtype=dtype),
        rand(H, dtype=dtype),
    ]


def run_with_grads(fn, params, offs, end):
    for p in params:
        p.grad = None
    out = fn(*params, offs)
    out[:end].square().sum().backward()  # rows past offs[-1] are unspecified: not consumed
    return out[:end].detach(), [p.grad.clone() for p in params]


_BACKENDS = ["aot_eager", pytest.param("inductor", marks=pytest.mark.skipif(
    not os.environ.get("CUTEGEMM_TEST_INDUCTOR"), reason="slow on CPU (~30 s): set CUTEGEMM_TEST_INDUCTOR=1"))]  # fmt: skip


@pytest.mark.parametrize("backend", _BACKENDS)
def test_compile_moe_block_matches_eager(backend):
    torch._dynamo.reset()
    counts = [4, 0, 6, 3]
    offs, end = make_offs(counts), sum(counts)
    params = moe_params(end + 3, 8, 6, len(counts))
    compiled = torch.compile(moe_block, backend=backend, fullgraph=True)
    out_c, grads_c = run_with_grads(compiled, params, offs, end)
    out_e, grads_e = run_with_grads(moe_block, params, offs, end)
    torch.testing.assert_close(out_c, out_e)
    for gc, ge in zip(grads_c, grads_e, strict=True):
        torch.testing.assert_close(gc, ge)


def test_compile_no_recompile_on_offs_or_token_count():
    """No guard on offs contents (the fake impls never read them); dynamic T traces once more at most."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    cnt = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(moe_block, backend=cnt, fullgraph=True)
    params = moe_params(12, 8, 6, 3)
    for counts in ([4, 4, 4], [0, 12, 0], [1, 2, 3]):
        offs, end = make_offs(counts), sum(counts)
        with torch.no_grad():
            torch.testing.assert_close(compiled(*params, offs)[:end], moe_block(*params, offs)[:end])
    assert cnt.frame_count == 1
    # A new token count: one dynamic-shape recompile, then the same graph serves other counts.
    for T in (20, 28):
        x = rand(T, 8, dtype=torch.float32)
        offs, end = make_offs([T // 2, 0, T // 4]), T // 2 + T // 4
        with torch.no_grad():
            torch.testing.assert_close(
                compiled(x, *params[1:], offs)[:end], moe_block(x, *params[1:], offs)[:end]
            )
    assert cnt.frame_count == 2


# ---------------------------------------------------------------------------------------------- quantization ops

QUANTIZE_FORMATS = ["mxfp8", "mxfp8_e5m2", "mxfp4", "nvfp4"]


def _bytes(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t


def assert_same_quantized(q, ref):
    """Bitwise equality of two BlockScaledTensors (elements, swizzled scales, global scale)."""
    assert (
        q.fmt == ref.fmt and tuple(q.shape) == tuple(ref.shape) and q.scales_swizzled and ref.scales_swizzled
    )
    assert q.data.dtype == ref.data.dtype and q.scales.dtype == ref.scales.dtype
    assert torch.equal(_bytes(q.data), _bytes(ref.data))
    assert torch.equal(_bytes(q.scales), _bytes(ref.scales))
    assert (q.global_scale is None) == (ref.global_scale is None)
    if q.global_scale is not None:
        assert q.global_scale.shape == () and torch.equal(q.global_scale, ref.global_scale.reshape(()))


def test_quant_schemas():
    assert str(OP.quantize.default._schema) == (
        'cutegemm::quantize(Tensor x, str fmt, Tensor? global_scale=None, *, str scale_rule="ocp") '
        "-> (Tensor, Tensor, Tensor)"
    )
    assert str(OP.gemm_quantized.default._schema) == (
        "cutegemm::gemm_quantized(Tensor a, Tensor b, Tensor? bias=None, Tensor? out_global_scale=None, *, "
        "str out_dtype, float alpha=1., str? activation=None) -> (Tensor, Tensor)"
    )
    assert (
        ops.quantize is cutegemm.quant_ops.quantize
        and ops.gemm_quantized is cutegemm.quant_ops.gemm_quantized
    )


QUANT_OPCHECK = {
    "quantize_mxfp8_bf16": lambda: (OP.quantize, (torch.randn(130, 96, dtype=torch.bfloat16), "mxfp8"), {}),
    "quantize_mxfp8_ceil_batched": lambda: (
        OP.quantize,
        (torch.randn(2, 7, 64), "mxfp8"),
        {"scale_rule": "ceil"},
    ),
    "quantize_mxfp4_tail": lambda: (OP.quantize, (torch.randn(5, 50, dtype=torch.float16), "mxfp4"), {}),
    "quantize_nvfp4_default_gs": lambda: (OP.quantize, (torch.randn(33, 48), "nvfp4"), {}),
    "quantize_nvfp4_given_gs": lambda: (OP.quantize, (torch.randn(33, 48), "nvfp4", torch.tensor(0.02)), {}),
    "gemm_mxfp8_bias_gelu": lambda: (
        OP.gemm_quantized,
        (
            torch.randn(40, 24, dtype=torch.bfloat16),
            torch.randn(24, 64, dtype=torch.bfloat16),
            torch.randn(64),
        ),
        {"out_dtype": "mxfp8", "alpha": 0.5, "activation": "gelu"},
    ),
    "gemm_mxfp4_swiglu_batched": lambda: (
        OP.gemm_quantized,
        (torch.randn(3, 9, 16, dtype=torch.bfloat16), torch.randn(16, 128, dtype=torch.bfloat16)),
        {"out_dtype": "mxfp4", "activation": "swiglu"},
    ),
    "gemm_nvfp4_batched_b": lambda: (
        OP.gemm_quantized,
        (torch.randn(9, 16, dtype=F64), torch.randn(2, 16, 32, dtype=F64), None, torch.tensor([0.05])),
        {"out_dtype": "nvfp4"},
    ),
}


@pytest.mark.parametrize("case", list(QUANT_OPCHECK))
def test_opcheck_quant_ops(case):
    op, args, kwargs = QUANT_OPCHECK[case]()
    torch.library.opcheck(op.default, args, kwargs)


@settings(max_examples=40, deadline=None)
@given(
    fmt=st.sampled_from(QUANTIZE_FORMATS),
    lead=st.sampled_from([(), (1,), (3,)]),
    rows=st.integers(1, 300),
    k2=st.integers(1, 100),
    scale=st.sampled_from([1e-30, 1e-3, 1.0, 1e4]),
)
def test_quantize_op_fake_matches_real(fmt, lead, rows, k2, scale):
    shape = (*lead, rows, 2 * k2)
    x = torch.randn(*shape) * scale
    data, scales, gs = OP.quantize(x, fmt)
    with FakeTensorMode():
        fd, fs, fg = OP.quantize(torch.empty(shape), fmt)
    for real, fake in ((data, fd), (scales, fs), (gs, fg)):
        assert (real.shape, real.dtype) == (fake.shape, fake.dtype)
    # the wrapper is quantize_ref, byte for byte (CPU)
    from cutegemm.blockscaled import quantize_ref

    assert_same_quantized(ops.quantize(x, fmt), quantize_ref(x, fmt))


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("shapes,activation", [(((7, 16), (16, 64)), None), (((2, 130, 8), (8, 96)), "relu"),
                                                (((5, 24), (3, 24, 64)), "geglu")])  # fmt: skip
def test_gemm_quantized_op_fake_matches_real_and_ref(fmt, shapes, activation):
    a, b = torch.randn(*shapes[0], dtype=torch.bfloat16), torch.randn(*shapes[1], dtype=torch.bfloat16)
    gs = torch.tensor([0.03]) if fmt == "nvfp4" else None
    data, scales = OP.gemm_quantized(a, b, None, gs, out_dtype=fmt, alpha=0.5, activation=activation)
    with FakeTensorMode():
        fd, fs = OP.gemm_quantized(
            torch.empty(shapes[0], dtype=torch.bfloat16), torch.empty(shapes[1], dtype=torch.bfloat16), None,
            None if gs is None else torch.empty(1), out_dtype=fmt, alpha=0.5, activation=activation,
        )  # fmt: skip
    assert (data.shape, data.dtype, scales.shape, scales.dtype) == (fd.shape, fd.dtype, fs.shape, fs.dtype)
    q = ops.gemm_quantized(a, b, out_dtype=fmt, out_global_scale=gs, alpha=0.5, activation=activation)
    ref = cutegemm.gemm_ref(a, b, out_dtype=fmt, out_global_scale=gs, alpha=0.5, activation=activation)
    assert_same_quantized(q, ref)


def _quant_bad_calls():
    a, b = torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(16, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="fmt"):
        OP.quantize(torch.randn(4, 32), "int8")
    with pytest.raises(ValueError, match="no global scale"):
        OP.quantize(torch.randn(4, 32), "mxfp8", torch.ones(()))
    with pytest.raises(ValueError, match="K must be even"):
        OP.quantize(torch.randn(4, 33), "mxfp4")
    with pytest.raises(ValueError, match="scale_rule"):
        OP.quantize(torch.randn(4, 32), "nvfp4", scale_rule="ceil")
    with pytest.raises(ValueError, match="needs out_global_scale"):
        OP.gemm_quantized(a, b, out_dtype="nvfp4")
    with pytest.raises(ValueError, match="NVFP4 outputs only"):
        OP.gemm_quantized(a, b, None, torch.ones(1), out_dtype="mxfp8")
    with pytest.raises(ValueError, match="multiple of 32"):
        OP.gemm_quantized(a, b[:, :48], out_dtype="mxfp8")
    with pytest.raises(ValueError, match="out_dtype"):
        OP.gemm_quantized(a, b, out_dtype="fp8")


def test_quant_ops_bad_inputs_raise():
    _quant_bad_calls()  # the CPU kernels
    with FakeTensorMode():
        _quant_bad_calls()  # the fake implementations


def quantized_block(x, w, gs):
    """Both quantization ops in one graph: quantize the input, a GEMM with a quantized output."""
    qx = ops.quantize(x, "mxfp8")
    qy = ops.gemm_quantized(x, w, out_dtype="nvfp4", out_global_scale=gs, activation="silu")
    qz = ops.quantize(x.float() * 2, "nvfp4")
    return qx, qy, qz


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])  # inductor: ~6 s here
def test_compile_quant_ops_fullgraph_matches_eager(backend):
    torch._dynamo.reset()
    x, w = torch.randn(40, 32, dtype=torch.bfloat16), torch.randn(32, 96, dtype=torch.bfloat16)
    gs = torch.tensor([0.01])
    compiled = torch.compile(quantized_block, backend=backend, fullgraph=True)
    for got, want in zip(compiled(x, w, gs), quantized_block(x, w, gs), strict=True):
        assert_same_quantized(got, want)


def test_quant_ops_are_not_differentiable():
    x = torch.randn(4, 32, requires_grad=True)
    _, _, gs = OP.quantize(x, "nvfp4")
    with pytest.raises(RuntimeError, match="no autograd formula"):
        gs.sum().backward()


@pytest.mark.parametrize("name", ["gemm", "grouped_gemm", "quantize", "gemm_quantized", "gemm_blockscaled",
                                  "gemm_fp4_weight"])  # fmt: skip
def test_no_grad_fast_path_is_registered(name):
    """Each op's AutogradCPU / AutogradCUDA kernels are ours (ops._register_no_grad_path: a call
    that needs no gradient runs the device's function directly), where torch has the private names
    it needs; the quantized ops' results are the same either way."""
    if ops.make_autograd_impl is None:
        pytest.skip("this torch has no make_autograd_impl: custom_op's own path only")
    dump = torch._C._dispatch_dump(f"cutegemm::{name}")
    for key in ("AutogradCPU", "AutogradCUDA"):
        line = next(ln for ln in dump.splitlines() if ln.startswith(f"{key}:"))
        assert "cutegemm/ops.py" in line.replace("\\", "/"), line
    if name == "quantize":
        x = torch.randn(4, 64)
        fast = torch.ops.cutegemm.quantize(x, "mxfp8", None)
        slow = torch.ops.cutegemm.quantize(x.clone().requires_grad_(), "mxfp8", None)  # custom_op's path
        assert all(torch.equal(f.view(torch.uint8), s.view(torch.uint8)) for f, s in zip(fast[:2], slow[:2], strict=True))


def _frames_offered_to_dynamo(call):
    """(result, [(function, file)] of every frame Dynamo's eval-frame hook was offered) of
    ``call()`` run with a recording callback installed (each frame then runs as it is)."""
    from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_eval_frame
    from torch._dynamo.types import ConvertFrameReturn

    seen = []

    def callback(frame, cache_entry, frame_state):
        seen.append((frame.f_code.co_name, frame.f_code.co_filename.replace("\\", "/")))
        run_as_is = _FrameExecStrategy(_FrameAction.DEFAULT, _FrameAction.DEFAULT)
        return ConvertFrameReturn(frame_exec_strategy=run_as_is, apply_to_code=False)

    prior = set_eval_frame(callback)
    try:
        res = call()
    finally:
        set_eval_frame(prior)
    return res, seen


def _counting_disable(monkeypatch) -> list:
    """Counts the set_eval_frame calls of torch._dynamo's disable wrapper (two or more per call
    that goes through it)."""
    import torch._dynamo.eval_frame as ef

    calls = []
    real = ef.set_eval_frame
    monkeypatch.setattr(ef, "set_eval_frame", lambda cb: calls.append(cb) or real(cb))
    return calls


@pytest.mark.parametrize("name", ["gemm", "grouped_gemm", "quantize"])
def test_no_grad_path_is_never_traced_by_dynamo(name, monkeypatch):
    """ops._register_no_grad_path: with Dynamo's eval-frame callback set (a frame Dynamo skips
    calling the op), Dynamo is offered no frame of ours (the kernel's frame is skipped, the rest
    runs under torch._dynamo's disable, as custom_op's kernels do); with no callback (eager, a
    compiled graph's own run) the disable wrapper is not run; under torch.export's flag it is.
    The result is the same each way."""
    if ops.make_autograd_impl is None:
        pytest.skip("this torch has no make_autograd_impl: custom_op's own path only")
    a, b = torch.randn(6, 8), torch.randn(8, 5)
    calls = {
        "gemm": lambda: OP.gemm(a, b, alpha=0.5),
        "grouped_gemm": lambda: OP.grouped_gemm(a, torch.randn(2, 8, 5), make_offs([2, 4])),
        "quantize": lambda: OP.quantize(torch.randn(4, 64), "mxfp8", None)[0].view(torch.uint8),
    }
    torch.manual_seed(1)
    want = calls[name]()
    for _ in range(2):  # the first run builds the disable wrapper (torch's frames)
        torch.manual_seed(1)
        got, seen = _frames_offered_to_dynamo(calls[name])
        assert torch.equal(got, want)
        ours = [f for f in seen if "/cutegemm/" in f[1]]
        assert not ours, ours
        assert ("_fn", ) in {(f[0],) for f in seen if f[1].endswith("torch/_dynamo/eval_frame.py")}
    wrapper = _counting_disable(monkeypatch)
    for exporting in (False, True):
        monkeypatch.setattr(torch.compiler, "_is_exporting_flag", exporting)
        torch.manual_seed(1)  # (itself runs under the disable wrapper)
        wrapper.clear()
        got = calls[name]()
        assert torch.equal(got, want) and bool(wrapper) == exporting  # export: through the wrapper


def test_no_grad_path_reads_the_key_set_below_autograd():
    """ops._below_autograd (memoized by the key set's bits) is the rule it replaced: the CPU key
    alone, the CUDA key alone, or anything else (a mode's Python key, another device)."""
    K = torch._C.DispatchKey
    autograd = torch._C.DispatchKeySet(K.AutogradCPU) | torch._C.DispatchKeySet(K.ADInplaceOrView)
    cases = {
        0: torch._C._dispatch_keys(torch.randn(2)) | autograd,
        1: torch._C.DispatchKeySet(K.CUDA) | torch._C.DispatchKeySet(K.AutogradCUDA),
        2: torch._C._dispatch_keys(torch.randn(2)) | torch._C.DispatchKeySet(K.Python) | autograd,
    }
    cases[3] = torch._C.DispatchKeySet(K.Meta) | autograd
    for want, ks in cases.items():
        below = ks & ops._BELOW_AUTOGRAD
        old = 0 if below == ops._CPU_KEYS else 1 if below == ops._CUDA_KEYS else 2
        assert ops._below_autograd(ks) == old == min(want, 2)
        assert ops._BELOW[ks.raw_repr()] == old
