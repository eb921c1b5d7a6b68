"""CPU (no GPU): the block-scaled GEMM's public entry points. ``cutegemm.gemm_ref(qa, qb)`` with
BlockScaledTensor operands (MXFP8 / NVFP4 / MXFP4 from quantize_ref) is dequantize -> matmul,
checked against an independent decode and against the unquantized product; the custom op
``cutegemm::gemm_blockscaled`` is registered, its CPU kernel is the reference, its fake impl gives
the real shapes / dtypes (FakeTensorMode, opcheck) and rejects bad inputs, it traces under
torch.compile(fullgraph=True); ``cutegemm.gemm(qa, qb)`` with CPU tensors raises ValueError,
unsupported options raise ValueError, and the kernel raises NotImplementedError off sm_100."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cutegemm
from cutegemm import quant_ops
from cutegemm.blockscaled import gemm as bs
from cutegemm.blockscaled import quantize_ref, unpack_fp4

OP = torch.ops.cutegemm
FORMATS = ["mxfp8", "nvfp4", "mxfp4"]
# (a shape, b shape): b is (N, K) / (L, N, K); M, N, K all different so a transposed operand fails
SHAPES = [((70, 96), (50, 96)), ((2, 33, 64), (2, 130, 64)), ((1, 160), (7, 160))]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def quantized(fmt, a_shape, b_shape, swizzle=True):
    a, b = torch.randn(a_shape), torch.randn(b_shape)
    return a, b, quantize_ref(a, fmt, swizzle=swizzle), quantize_ref(b, fmt, swizzle=swizzle)


def decode(q):
    """Independent of dequantize_ref: elements times scales from the plain scale bytes."""
    fmt = q.fmt
    elems = unpack_fp4(q.data) if fmt.elems_per_byte == 2 else q.data.to(torch.float64)
    plain = q.plain_scales()
    if fmt.is_mx:
        scales = torch.pow(2.0, plain.view(torch.uint8).to(torch.float64) - 127)
    else:
        scales = plain.to(torch.float64) * q.global_scale.double()
    return elems.double() * scales.repeat_interleave(fmt.block_size, dim=-1)[..., : q.shape[-1]]


def op_args(qa, qb):
    return (qa.data, qa.scales, qb.data, qb.scales, qa.global_scale, qb.global_scale)


def test_op_registered_with_schema():
    assert str(OP.gemm_blockscaled.default._schema) == (
        "cutegemm::gemm_blockscaled(Tensor a, Tensor a_scales, Tensor b, Tensor b_scales, "
        "Tensor? a_global_scale=None, Tensor? b_global_scale=None, *, str fmt, ScalarType? out_dtype=None, "
        "float alpha=1.) -> Tensor"
    )
    assert quant_ops.gemm_blockscaled_op._opoverload is OP.gemm_blockscaled.default


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_gemm_ref_is_dequantize_then_matmul(fmt, shapes):
    a, b, qa, qb = quantized(fmt, *shapes)
    out = cutegemm.gemm_ref(qa, qb, out_dtype=torch.float32)
    want = decode(qa) @ decode(qb).mT
    assert out.shape == (*shapes[0][:-1], shapes[1][-2]) and out.dtype == torch.float32
    # fp32 matmul of exactly decoded operands vs fp64: accumulation rounding only
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    # ... and close to the unquantized product (the quantization error of 1 - 3 significant bits)
    exact = a.double() @ b.double().mT
    err = (out.double() - exact).abs().max() / exact.abs().max()
    assert err < {"mxfp8": 0.08, "nvfp4": 0.3, "mxfp4": 0.35}[fmt]
    # default: bf16 output of the same values; alpha scales; compute_dtype float64 is honoured
    assert torch.equal(cutegemm.gemm_ref(qa, qb), out.to(torch.bfloat16))
    torch.testing.assert_close(cutegemm.gemm_ref(qa, qb, out_dtype=torch.float32, alpha=-0.5), -0.5 * out)
    f64 = cutegemm.gemm_ref(qa, qb, out_dtype=torch.float64, compute_dtype=torch.float64)
    tol = 1e-6 if fmt == "nvfp4" else 1e-12  # NVFP4: dequantize_ref's (e2m1 * s) * gs rounds to fp32
    torch.testing.assert_close(f64, want, rtol=tol, atol=tol * want.abs().max().item())


@pytest.mark.parametrize("fmt", FORMATS)
def test_op_cpu_kernel_and_wrapper_match_gemm_ref(fmt):
    _, _, qa, qb = quantized(fmt, (2, 40, 64), (2, 24, 64))
    ref = cutegemm.gemm_ref(qa, qb, out_dtype=torch.float16, alpha=1.5)
    assert torch.equal(
        OP.gemm_blockscaled(*op_args(qa, qb), fmt=fmt, out_dtype=torch.float16, alpha=1.5), ref
    )
    assert torch.equal(quant_ops.gemm_blockscaled(qa, qb, out_dtype=torch.float16, alpha=1.5), ref)
    # plain (unswizzled) scales are swizzled by the wrapper: same result
    torch.manual_seed(0)
    _, _, pa, pb = quantized(fmt, (2, 40, 64), (2, 24, 64), swizzle=False)
    assert not pa.scales_swizzled
    assert torch.equal(quant_ops.gemm_blockscaled(pa, pb, out_dtype=torch.float16, alpha=1.5), ref)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@pytest.mark.parametrize("out_dtype", [None, torch.float16, torch.float32])
def test_fake_impl_gives_the_real_shape_and_dtype(fmt, shapes, out_dtype):
    _, _, qa, qb = quantized(fmt, *shapes)
    real = OP.gemm_blockscaled(*op_args(qa, qb), fmt=fmt, out_dtype=out_dtype)
    mode = FakeTensorMode()
    fake_args = [None if t is None else mode.from_tensor(t) for t in op_args(qa, qb)]
    with mode:
        fake = OP.gemm_blockscaled(*fake_args, fmt=fmt, out_dtype=out_dtype)
    want_shape = (*shapes[0][:-1], shapes[1][-2])
    want_dtype = out_dtype or torch.bfloat16
    assert (tuple(real.shape), real.dtype) == (want_shape, want_dtype)
    assert (tuple(fake.shape), fake.dtype) == (want_shape, want_dtype)


@pytest.mark.parametrize("fmt", FORMATS)
def test_opcheck(fmt):
    """opcheck without its test_schema: torch's SchemaCheckMode copies and compares the inputs,
    which has no CPU kernel for float8 / float4_e2m1fn_x2 tensors."""
    _, _, qa, qb = quantized(fmt, (3, 33, 64), (3, 20, 64))
    for test in ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic"):
        torch.library.opcheck(
            OP.gemm_blockscaled.default, op_args(qa, qb), {"fmt": fmt, "alpha": 0.5}, test_utils=test
        )


def _bad_op_calls(qa, qb, q4):
    args = op_args(qa, qb)  # MXFP8
    with pytest.raises(ValueError, match="fmt must be one of"):
        OP.gemm_blockscaled(*args, fmt="mxfp8_e5m2")
    with pytest.raises(TypeError, match="elements are"):
        OP.gemm_blockscaled(*args, fmt="nvfp4")
    with pytest.raises(ValueError, match="out_dtype"):
        OP.gemm_blockscaled(*args, fmt="mxfp8", out_dtype=torch.int8)
    with pytest.raises(ValueError, match="K mismatch"):
        OP.gemm_blockscaled(args[0], args[1], args[2][:, :32], args[3], fmt="mxfp8")
    with pytest.raises(ValueError, match="batch mismatch"):
        OP.gemm_blockscaled(args[0][None], args[1][None], *args[2:4], fmt="mxfp8")
    with pytest.raises(ValueError, match="a_scales"):
        OP.gemm_blockscaled(args[0], args[1][:, :1], *args[2:], fmt="mxfp8")
    with pytest.raises(ValueError, match="no global scale"):
        OP.gemm_blockscaled(*args[:4], args[3].new_ones((), dtype=torch.float32), fmt="mxfp8")
    with pytest.raises(ValueError, match="one-element"):
        OP.gemm_blockscaled(*op_args(q4, q4)[:5], q4.data.new_ones(2, dtype=torch.float32), fmt="nvfp4")


def test_op_bad_inputs_raise():
    _, _, qa, qb = quantized("mxfp8", (40, 64), (24, 64))
    q4 = quantize_ref(torch.randn(24, 64), "nvfp4")
    _bad_op_calls(qa, qb, q4)  # the CPU kernel
    mode = FakeTensorMode()

    def fake(q):
        return type(q)(**{**q.__dict__, **{k: mode.from_tensor(getattr(q, k)) for k in ("data", "scales")}})

    fq4 = fake(q4)
    fq4.global_scale = mode.from_tensor(q4.global_scale)
    fqa, fqb = fake(qa), fake(qb)
    with mode:
        _bad_op_calls(fqa, fqb, fq4)  # the fake implementation


def _compiled_block(x, w):
    qx = quant_ops.quantize(x, "nvfp4")
    qw = quant_ops.quantize(w, "nvfp4")
    return quant_ops.gemm_blockscaled(qx, qw, out_dtype=torch.float32, alpha=0.5).relu()


def test_compile_fullgraph_matches_eager():
    torch._dynamo.reset()
    x, w = torch.randn(40, 64), torch.randn(24, 64)
    compiled = torch.compile(_compiled_block, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x, w), _compiled_block(x, w))


@pytest.mark.parametrize("fmt", FORMATS)
def test_gemm_with_cpu_operands_raises_value_error(fmt):
    _, _, qa, qb = quantized(fmt, (40, 64), (24, 64))
    with pytest.raises(ValueError, match="must be on a CUDA device"):
        cutegemm.gemm(qa, qb)
    with pytest.raises(ValueError, match="must be on a CUDA device"):
        cutegemm.gemm(qa, qb, out_dtype=torch.float32, alpha=2.0)


def test_gemm_rejects_unsupported_options_and_mixed_operands():
    _, _, qa, qb = quantized("mxfp8", (40, 64), (24, 64))
    with pytest.raises(
        ValueError, match="supports only out_dtype, alpha, config, out so far; got bias, activation"
    ):
        cutegemm.gemm(qa, qb, bias=torch.zeros(24), activation="relu")
    with pytest.raises(ValueError, match="got beta"):
        cutegemm.gemm_ref(qa, qb, beta=1.0, c=None)
    with pytest.raises(ValueError, match="out_dtype must be one of"):
        cutegemm.gemm_ref(qa, qb, out_dtype="mxfp8")
    with pytest.raises(ValueError, match="out_dtype must be one of"):
        cutegemm.gemm_ref(qa, qb, out_dtype=torch.int32)
    with pytest.raises(TypeError, match="qb must be a BlockScaledTensor"):
        cutegemm.gemm(qa, torch.randn(64, 24))
    with pytest.raises(TypeError, match="qa must be a BlockScaledTensor"):
        cutegemm.gemm_ref(torch.randn(40, 64), quantize_ref(torch.randn(24, 64), "mxfp8_e5m2"))
    # a tensor times an MXFP8 (e4m3) weight is the low-precision-weight GEMM: bf16 / e4m3 activations
    with pytest.raises(TypeError, match="bf16 or float8_e4m3fn activations"):
        cutegemm.gemm_ref(torch.randn(40, 64), qb)
    q4 = quantize_ref(torch.randn(24, 64), "nvfp4")
    with pytest.raises(ValueError, match="share a format"):
        cutegemm.gemm_ref(qa, q4)
    with pytest.raises(ValueError, match="no block-scaled GEMM"):
        cutegemm.gemm_ref(quantize_ref(torch.randn(8, 64), "mxfp8_e5m2"), qb)
    with pytest.raises(ValueError, match="K mismatch"):
        cutegemm.gemm_ref(qa, quantize_ref(torch.randn(24, 96), "mxfp8"))
    # plain tensors still take the dense path
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    torch.testing.assert_close(cutegemm.gemm_ref(a, b), a @ b)


@pytest.mark.parametrize(
    "capability, message",
    [((12, 0), r"needs sm_100a \(Blackwell\); this GPU is sm_120")],  # sm_90: dequantize-first (GPU tests)
)  # fmt: skip
def test_kernel_raises_not_implemented_off_sm100(monkeypatch, capability, message):
    """The device check passes (patched: no GPU here); the capability decides."""
    _, _, qa, qb = quantized("nvfp4", (40, 64), (24, 64))
    monkeypatch.setattr(bs, "_check", lambda *args: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    with pytest.raises(NotImplementedError, match=message):
        cutegemm.gemm(qa, qb)
    with pytest.raises(NotImplementedError, match=message):
        bs.gemm_blockscaled(qa, qb, out_dtype=torch.float32)


def test_mixed_mx_pair_rules_and_reference():
    """MXFP8 x MXFP4 is a valid pair (either order): the reference dequantizes each operand in its
    own format; NVFP4 pairs with nothing else; the sm_100a config has both element types and its
    problem rule (K a multiple of 128)."""
    from cutegemm.blockscaled import dequantize_ref
    from cutegemm.blockscaled.gemm import blockscaled_config, check_operands
    from cutegemm.config import GemmProblem, can_implement, config_errors

    a, b = torch.randn(40, 256), torch.randn(24, 256)
    q8, q4 = quantize_ref(a, "mxfp8"), quantize_ref(b, "mxfp4")
    check_operands(q8, q4)
    check_operands(q4, quantize_ref(a, "mxfp8"))
    out = cutegemm.gemm_ref(q8, q4, out_dtype=torch.float64)
    want = dequantize_ref(q8).double() @ dequantize_ref(q4).double().T
    torch.testing.assert_close(out, want)
    with pytest.raises(ValueError, match="share a format"):
        check_operands(q8, quantize_ref(b, "nvfp4"))
    cfg = blockscaled_config("mxfp8", 1024, 1024, b_fmt_name="mxfp4")
    assert (cfg.a_dtype, cfg.b_dtype, cfg.sf_dtype, cfg.sf_vec) == ("e4m3", "e2m1", "e8m0", 32)
    assert config_errors(cfg) == []
    assert can_implement(cfg, GemmProblem(1024, 1024, 1024, 1, "e4m3", "e2m1", "bf16", "k", "k"))[0]
    ok, why = can_implement(cfg, GemmProblem(1024, 1024, 1056, 1, "e4m3", "e2m1", "bf16", "k", "k"))
    assert not ok and "multiple of 128" in why
    bad = blockscaled_config("nvfp4", 1024, 1024)
    from dataclasses import replace

    assert config_errors(replace(bad, b_dtype="e4m3"))  # NVFP4 scales (e4m3, 16) do not mix
