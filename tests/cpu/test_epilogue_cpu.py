"""CPU: the epilogue ops without a GPU.

- the kernels' own activation formulas (cutegemm.epilogue.ops, written once over a math
  namespace) evaluated in fp32 torch against float64 references;
- the torch twins (epilogue_ref / gemm_ref) against the written-out math;
- EpilogueSpec validation, argument validation that happens before any GPU work, fake args.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cutegemm
from cutegemm.config import ACTIVATIONS, GATED, GemmConfig
from cutegemm.epilogue import EpilogueSpec, epilogue_ref, interleave_gate_up, ops, split_gate_up
from cutegemm.gemm.args import dense_fake_args
from cutegemm.gemm.dense import _check_epilogue_args
from cutegemm.gemm.launch import interleave_b


class TorchMath:
    """The CuteMath primitives on fp32 torch tensors (exact exp / reciprocal instead of the
    kernels' ex2.approx / rcp.approx, ~1e-7 relative apart)."""

    @staticmethod
    def exp(x):
        # correctly rounded fp32 exp (evaluated in float64): torch's own fp32 CPU exp depends on
        # the SIMD path it takes (tensor alignment, ISA), up to ~20 ulps apart (seen in CI)
        return torch.exp(x.double()).to(x.dtype)

    rcp = staticmethod(torch.reciprocal)
    abs = staticmethod(torch.abs)

    @staticmethod
    def where(cond, x, y):
        return torch.where(cond, x, y)


TM = TorchMath()


def _x_grid():
    x = torch.linspace(-12.0, 12.0, 200001, dtype=torch.float64)
    return torch.cat([x, torch.tensor([0.0, -0.0, 1e-30, -1e-30, 30.0, -30.0, 80.0, -80.0], dtype=torch.float64)])


REFERENCES = {
    "relu": lambda x: torch.relu(x),
    "silu": lambda x: x * torch.sigmoid(x),
    "gelu": lambda x: 0.5 * x * (1.0 + torch.special.erf(x / math.sqrt(2.0))),
    # 0.5 * x * (1 + tanh(u)) == x * sigmoid(2u), the form without float64 cancellation in the tail
    "gelu_tanh": lambda x: x * torch.sigmoid(2.0 * math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)),
    "relu_sq": lambda x: torch.relu(x) ** 2,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
}


def test_gelu_tanh_reference_is_torchs():
    x = _x_grid()
    torch.testing.assert_close(
        REFERENCES["gelu_tanh"](x), torch.nn.functional.gelu(x, approximate="tanh"), atol=1e-14, rtol=1e-12
    )


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_kernel_activation_formulas_in_fp32(name):
    """The exact formulas the kernels trace, run in fp32: max error vs float64 within ~8 fp32
    ulps of the value's scale (absolute max(|x|, |f(x)|) * 1e-6; torch's CPU exp differs by SIMD
    path), and 2e-4
    relative in the tails (the fp32 rounding of large exp arguments; for gelu
    down to x = -6.3, where Phi flushes to 0: absolute error < 7e-10 past it)."""
    x = _x_grid()
    ours = ops.ACTIVATION_FNS[name](x.float(), TM).double()
    ref = REFERENCES[name](x)
    err = (ours - ref).abs()
    scale = torch.maximum(x.abs(), ref.abs()).clamp(min=1.0)  # relu_sq grows as x^2
    assert (err <= 1e-6 * scale + 1e-30).all(), f"{name}: max err {err.max().item():.3g}"
    tail = ref.abs() > 1e-30
    if name == "gelu":
        assert err[x < -6.3].max().item() < 7e-10
        tail &= x > -6.3
    rel = err[tail] / ref[tail].abs()
    assert rel.max().item() < 2e-4, f"{name}: max rel err {rel.max().item():.3g}"


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_kernel_activation_nan_and_inf(name):
    x = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=torch.float32)
    y = ops.ACTIVATION_FNS[name](x, TM)
    assert torch.isnan(y[0]), f"{name}(nan) must be nan"
    want = REFERENCES[name](x[1:].double())  # the formulas' values at +-inf (inf, 1, 0, -1, or NaN for x * 0)
    torch.testing.assert_close(y[1:].double(), want, atol=0, rtol=0, equal_nan=True, msg=f"{name}(+-inf)")


def test_normal_cdf_accuracy():
    x = _x_grid()
    phi = ops._normal_cdf(x.float(), TM).double()
    ref = 0.5 * (1.0 + torch.special.erf(x / math.sqrt(2.0)))
    assert (phi - ref).abs().max().item() < 1.5e-7


def _swiglu_oai(g, u):
    """gpt-oss's gate, written out as its model code has it (alpha 1.702, limit 7)."""
    g = g.clamp(min=None, max=7.0)
    u = u.clamp(min=-7.0, max=7.0)
    return (u + 1) * (g * torch.sigmoid(g * 1.702))


GATED_REFERENCES = {**{k: (lambda act: lambda g, u: REFERENCES[act](g) * u)(a) for k, a in ops.GATE_ACTIVATION.items()},
                    "swiglu_oai": _swiglu_oai}  # fmt: skip


@pytest.mark.parametrize("gated", GATED)
def test_kernel_gate_formula(gated):
    g = torch.randn(4096, dtype=torch.float64) * 4  # past swiglu_oai's clamps at +-7 too
    u = torch.randn(4096, dtype=torch.float64) * 4
    spec = EpilogueSpec(gated=gated)
    ours = ops.gated_out(spec.gated, g.float(), u.float(), TM).double()
    torch.testing.assert_close(ours, GATED_REFERENCES[gated](g, u), atol=1e-5, rtol=1e-5)


def test_kernel_swiglu_oai_nan_and_inf():
    """NaN in either column stays NaN (torch.clamp propagates it); +inf and up's -inf are clamped;
    gate = -inf gives NaN, as torch's formula does (-inf * sigmoid(-inf))."""
    nan, inf = float("nan"), float("inf")
    g = torch.tensor([nan, 1.0, inf, -inf, 1.0, 1.0, 7.5])
    u = torch.tensor([1.0, nan, 1.0, 1.0, inf, -inf, -7.5])
    ours = ops.gated_out("swiglu_oai", g, u, TM)
    torch.testing.assert_close(ours, _swiglu_oai(g, u), equal_nan=True, atol=1e-6, rtol=1e-6)
    assert ours[[0, 1, 3]].isnan().all() and ours[[2, 4, 5, 6]].isfinite().all()


# --- torch twins -------------------------------------------------------------------------------
def _mm(m=37, k=24, n=40, batch=None):
    shape_a = (m, k) if batch is None else (batch, m, k)
    a = torch.randn(shape_a, dtype=torch.bfloat16)
    b = torch.randn(k, n, dtype=torch.bfloat16)
    return a, b, a.double() @ b.double()


@pytest.mark.parametrize("activation", [None, *ACTIVATIONS])
def test_gemm_ref_each_activation_with_alpha_beta_bias(activation):
    a, b, exact = _mm()
    c = torch.randn(exact.shape, dtype=torch.float16)
    bias = torch.randn(exact.shape[-1], dtype=torch.bfloat16)
    got = cutegemm.gemm_ref(
        a, b, out_dtype=torch.float64, alpha=0.75, beta=-1.5, c=c, bias=bias, activation=activation,
        compute_dtype=torch.float64,
    )  # fmt: skip
    y = 0.75 * exact - 1.5 * c.double() + bias.double()
    want = y if activation is None else REFERENCES[activation](y)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("activation", GATED)
def test_gemm_ref_gated_layouts(activation):
    a, b, exact = _mm(n=48)
    bias = torch.randn(48, dtype=torch.float32) * 4  # pre-activations past swiglu_oai's clamps too
    y = exact + bias.double()
    act = GATED_REFERENCES[activation]
    got_il = cutegemm.gemm_ref(a, b, out_dtype=torch.float64, bias=bias, activation=activation, compute_dtype=torch.float64)
    torch.testing.assert_close(got_il, act(y[:, 0::2], y[:, 1::2]), atol=1e-12, rtol=1e-12)
    got_h = cutegemm.gemm_ref(
        a, b, out_dtype=torch.float64, bias=bias, activation=activation, gate_layout="halves",
        compute_dtype=torch.float64,
    )  # fmt: skip
    torch.testing.assert_close(got_h, act(y[:, :24], y[:, 24:]), atol=1e-12, rtol=1e-12)
    # "halves" is "interleaved" on interleaved columns (what the API hands the kernel)
    got_conv = cutegemm.gemm_ref(
        a, interleave_gate_up(b), out_dtype=torch.float64, bias=interleave_gate_up(bias), activation=activation,
        compute_dtype=torch.float64,
    )  # fmt: skip
    torch.testing.assert_close(got_conv, got_h, atol=1e-12, rtol=1e-12)


def test_gemm_ref_beta_zero_ignores_c_and_batched_c():
    a, b, exact = _mm(batch=3)
    nan_c = torch.full(exact.shape, float("nan"))
    got = cutegemm.gemm_ref(a, b, out_dtype=torch.float64, beta=0.0, c=nan_c, compute_dtype=torch.float64)
    torch.testing.assert_close(got, exact)
    c = torch.randn(exact.shape)
    got = cutegemm.gemm_ref(a, b, out_dtype=torch.float64, beta=2.0, c=c, compute_dtype=torch.float64)
    torch.testing.assert_close(got, exact + 2.0 * c.double())


def test_gemm_ref_rejects_like_gemm():
    a, b, _ = _mm()
    with pytest.raises(ValueError, match="needs the residual tensor c"):
        cutegemm.gemm_ref(a, b, beta=1.0)
    with pytest.raises(ValueError, match="cannot be combined with the gated"):
        cutegemm.gemm_ref(a, b, beta=1.0, c=torch.zeros(37, 20), activation="swiglu")
    with pytest.raises(ValueError, match="activation must be"):
        cutegemm.gemm_ref(a, b, activation="softplus")
    with pytest.raises(ValueError, match="gate_layout must be"):
        cutegemm.gemm_ref(a, b, activation="swiglu", gate_layout="pairs")


@settings(max_examples=30, deadline=None)
@given(n2=st.integers(1, 40), k=st.integers(1, 9), lead=st.integers(0, 2))
def test_interleave_gate_up(n2, k, lead):
    t = torch.randn(*([2] * lead), k, 2 * n2)
    il = interleave_gate_up(t)
    gate, up = split_gate_up(il, "interleaved")
    assert torch.equal(gate, t[..., :n2]) and torch.equal(up, t[..., n2:])
    # the API's version keeps a K-major (column-major) b K-major
    w = torch.randn(2 * n2, k)  # nn.Linear weight: rows [gate | up]
    b = w.t()
    b_il = interleave_b(b)
    assert torch.equal(b_il, interleave_gate_up(b))
    if k > 1 and n2 > 0:
        assert b_il.stride(-2) == 1, "K-major b must stay K-major"


# --- EpilogueSpec and argument validation --------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(activation="softplus"), "activation must be"),
        (dict(gated="swiglu_step"), "gated must be"),
        (dict(gated="swiglu", activation="relu"), "activation must be None"),
        (dict(gated="geglu", beta=True), "cannot be combined with a gated"),
        (dict(c_dtype="bf16"), "without beta=True"),
        (dict(bias_dtype="fp16"), "without bias=True"),
        (dict(bias=True, bias_dtype="fp8"), "bias_dtype must be one of"),
        (dict(beta=True, c_dtype="int8"), "c_dtype must be one of"),
        (dict(alpha=1), "alpha must be a bool"),
    ],
)
def test_epilogue_spec_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EpilogueSpec(**kwargs)


def test_epilogue_spec_names_and_properties():
    specs = [
        EpilogueSpec(),
        EpilogueSpec(alpha=True),
        EpilogueSpec(bias=True),
        EpilogueSpec(bias=True, bias_dtype="bf16"),
        EpilogueSpec(beta=True, c_dtype="bf16"),
        EpilogueSpec(activation="gelu"),
        EpilogueSpec(activation="gelu_tanh"),
        EpilogueSpec(gated="swiglu"),
        EpilogueSpec(gated="geglu", bias=True, alpha=True),
    ]
    names = [s.name for s in specs]
    assert len(set(names)) == len(names), names
    assert EpilogueSpec().name == "identity" and not EpilogueSpec(alpha=True).needs_coords
    assert EpilogueSpec(gated="swiglu").cols_per_output == 2 and EpilogueSpec(gated="swiglu").needs_coords
    cfgs = {GemmConfig(arch="sm_90a", epilogue=s) for s in specs}
    assert len(cfgs) == len(specs), "the epilogue is part of the config (cache key)"


def test_gemm_rejects_bad_epilogue_names_before_gpu_work():
    a = torch.randn(8, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="activation must be None or one of"):
        cutegemm.gemm(a, a, activation="softplus")
    with pytest.raises(ValueError, match="gate_layout must be one of"):
        cutegemm.gemm(a, a, activation="swiglu", gate_layout="pairs")


def test_epilogue_argument_checks():
    a, b, _ = _mm(n=48)
    shape = torch.Size([37, 48])
    with pytest.raises(ValueError, match="needs the residual tensor c"):
        _check_epilogue_args(a, b, shape, 0.5, None, None, None)
    with pytest.raises(ValueError, match="cannot be combined with the gated"):
        _check_epilogue_args(a, b, torch.Size([37, 24]), 0.5, None, None, "swiglu")
    with pytest.raises(ValueError, match=r"bias must have shape \(48,\)"):
        _check_epilogue_args(a, b, shape, 0.0, None, torch.zeros(47), None)
    with pytest.raises(ValueError, match="one value per GEMM column, gate and up"):
        _check_epilogue_args(a, b, torch.Size([37, 24]), 0.0, None, torch.zeros(24), "swiglu")
    with pytest.raises(TypeError, match="bias.dtype"):
        _check_epilogue_args(a, b, shape, 0.0, None, torch.zeros(48, dtype=torch.int32), None)
    with pytest.raises(TypeError, match="bias must be a torch.Tensor"):
        _check_epilogue_args(a, b, shape, 0.0, None, [0.0] * 48, None)
    _check_epilogue_args(a, b, torch.Size([37, 24]), 0.0, None, torch.zeros(48), "geglu")  # ok


def test_fake_args_follow_the_spec():
    base = dense_fake_args(GemmConfig(arch="sm_90a"))
    # a, b, c, cin, bias, alpha, beta, max_clusters, stream, offs, sfa, sfb, quant sf, quant gs,
    # v0..v3, workspace, a_index, preact: unused inputs are None
    assert len(base) == 21 and base[3] is None and base[4] is None
    assert all(x is None for x in base[9:])
    preact = dense_fake_args(GemmConfig(arch="sm_90a", epilogue=EpilogueSpec(gated="swiglu", preact=True)))
    assert preact[-1] is not None and "bfloat16" in str(preact[-1].element_type).lower() and base[-1] is None
    quant = dense_fake_args(GemmConfig(arch="sm_90a", out_dtype="u8", epilogue=EpilogueSpec(quant="nvfp4")))
    assert quant[12] is not None and quant[13] is not None and quant[14] is None
    full = dense_fake_args(
        GemmConfig(arch="sm_100a", epilogue=EpilogueSpec(beta=True, c_dtype="bf16", bias=True, bias_dtype="fp16"))
    )
    assert full[3] is not None and full[4] is not None
    assert "bf16" in str(full[3].element_type).lower() or "bfloat16" in str(full[3].element_type).lower()


def test_reference_matches_torch_functional():
    x = torch.randn(1000, dtype=torch.float64) * 5
    y = epilogue_ref(x.view(10, 100), activation="gelu_tanh").flatten()
    torch.testing.assert_close(y, torch.nn.functional.gelu(x, approximate="tanh"))


@pytest.mark.parametrize(
    "kw,pre,left",
    [
        # FP8 row-wise scales: applied to the accumulators once per tile, not in the subtiles
        (dict(a_dtype="e4m3", b_dtype="e4m3", b_major="k", epilogue=EpilogueSpec(scale_a=True, scale_b=True)),
         (True, True, False), EpilogueSpec()),
        # a bias without beta * C joins that pass, with alpha before it; the activation stays
        (dict(epilogue=EpilogueSpec(alpha=True, bias=True, bias_dtype="bf16", activation="silu")),
         (False, False, True), EpilogueSpec(activation="silu")),
        (dict(epilogue=EpilogueSpec(bias=True, gated="swiglu")), (False, False, True), EpilogueSpec(gated="swiglu")),
        # beta * C with a bias keeps the bias in the subtiles (alpha * acc + beta * C + bias)
        (dict(epilogue=EpilogueSpec(alpha=True, beta=True, bias=True)), (False, False, False),
         EpilogueSpec(alpha=True, beta=True, bias=True)),
        # the MXFP8 emulation's accumulator layout: the old path
        (dict(a_dtype="e4m3", b_dtype="e4m3", b_major="k", tile_n=128, fp8_mx=True, epilogue=EpilogueSpec(bias=True)),
         (False, False, False), EpilogueSpec(bias=True)),
    ],
)
def test_sm90_pre_epilogue_rules(kw, pre, left):
    """Which per-row / per-column epilogue inputs the sm_90a kernel applies to the accumulators
    once per tile (``AccumulatorScaling.pre_epilogue``: scale_a, scale_b, alpha + bias), and the epilogue
    spec its subtiles then run."""
    from cutegemm.gemm.sm90.kernel import GemmSm90

    k = GemmSm90(GemmConfig(arch="sm_90a", tile_m=128, **{"tile_n": 192, **kw}))
    assert k.accum.pre_epilogue == pre
    assert k.accum.epilogue_after_pre() == left
