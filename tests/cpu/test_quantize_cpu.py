"""CPU: the quantize kernel's math and its compilation, without a GPU.

- The per-block math of cutegemm.blockscaled.quantizer (written once over an ops namespace, run
  here with torch tensors: TorchOps / block_math_ref) is byte-identical to quantize_ref, checked
  with hypothesis over values with zeros, NaN, Inf, huge, subnormal and exact rounding ties.
- The integer e4m3 rounding and the e2m1 code against torch's own conversions, exhaustively
  over every bf16 bit pattern plus the rounding midpoints.
- Every kernel variant compiles for sm_90a and sm_100a (SASS: vector loads, no spills).
"""

import importlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cutegemm.blockscaled import FORMATS, get_format, pack_fp4, quantize_ref, to_swizzled
from cutegemm.blockscaled.quantizer import QuantizeConfig, TorchOps, block_math_ref

# the module (cutegemm.blockscaled.quantizer is also the name of the function it exports)
qmod = importlib.import_module("cutegemm.blockscaled.quantizer")
lmod = importlib.import_module("cutegemm.blockscaled.quantize_launch")

FMTS = ("mxfp8", "mxfp8_e5m2", "mxfp4", "nvfp4")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SPECIAL = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-45, -3e-39, 2.0**-126, 3e38, -3.4e38,
           448.0, 464.0, 57344.0, 6.0, 5.0, 0.25, 0.75, 2.5, 1.75 * 2**-20]  # fmt: skip


def _all_bf16_values() -> torch.Tensor:
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()


def _ref_bytes(x, fmt, rule, gs):
    q = quantize_ref(x, fmt, scale_rule=rule, global_scale=gs, swizzle=False)
    return q.scales.view(torch.uint8), q.data.view(torch.uint8)


def _twin_bytes(x, fmt, rule, gs):
    f = get_format(fmt)
    gs_t = None
    if f.has_global_scale:
        gs_t = quantize_ref(x, fmt, global_scale=gs).global_scale  # the reference's (default) gs
    sbytes, codes = block_math_ref(x, f, rule, gs_t, cuda_div6=False)  # CPU torch divides exactly
    if f.elems_per_byte == 2:
        data = codes[..., 0::2] | (codes[..., 1::2] << 4)
    else:
        data = codes.clamp(-f.elem_max, f.elem_max).to(f.elem_dtype).view(torch.uint8)
    return sbytes, data


def _make_x(rows, nblocks, fmt, dtype, seed, special_frac, exp_range):
    g = torch.Generator().manual_seed(seed)
    k = nblocks * get_format(fmt).block_size
    mant = torch.randn(rows, k, generator=g)
    expo = torch.randint(-exp_range, exp_range + 1, (rows, k), generator=g).float()
    x = mant * torch.exp2(expo)
    # per-block magnitudes spread widely so blocks hit every binade
    x = x * torch.exp2(torch.randint(-40, 40, (rows, nblocks, 1), generator=g).float()).repeat_interleave(
        get_format(fmt).block_size, -1
    ).reshape(rows, k)
    if special_frac:
        pick = torch.rand(rows, k, generator=g) < special_frac
        vals = torch.tensor(SPECIAL)[torch.randint(0, len(SPECIAL), (rows, k), generator=g)]
        x = torch.where(pick, vals, x)
    zero_blocks = torch.rand(rows, nblocks, 1, generator=g) < 0.1
    x = torch.where(zero_blocks.repeat_interleave(get_format(fmt).block_size, -1).reshape(rows, k), 0.0, x)
    return x.to(dtype)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fmt=st.sampled_from(FMTS),
    dtype=st.sampled_from(DTYPES),
    rule=st.sampled_from(["ocp", "ceil"]),
    rows=st.integers(1, 9),
    nblocks=st.integers(1, 6),
    seed=st.integers(0, 2**31 - 1),
    special_frac=st.sampled_from([0.0, 0.01, 0.2]),
    exp_range=st.sampled_from([0, 3, 30]),
    gs=st.sampled_from([None, 1.0, 3.7e-3, 2.0**-120, 1e30]),
)
def test_twin_matches_reference(fmt, dtype, rule, rows, nblocks, seed, special_frac, exp_range, gs):
    f = get_format(fmt)
    if f.has_global_scale:
        rule = "ocp"
    else:
        gs = None
    x = _make_x(rows, nblocks, fmt, dtype, seed, special_frac, exp_range)
    ref_s, ref_d = _ref_bytes(x, fmt, rule, gs)
    tw_s, tw_d = _twin_bytes(x, fmt, rule, gs)
    assert torch.equal(tw_s, ref_s), f"scales differ at {torch.nonzero(tw_s != ref_s)[:5].tolist()}"
    assert torch.equal(tw_d, ref_d), f"data differ at {torch.nonzero(tw_d != ref_d)[:5].tolist()}"


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("rule", ["ocp", "ceil"])
def test_twin_every_bf16_value(fmt, rule):
    """Every bf16 bit pattern (incl. subnormals, Inf, NaN), each alone in a block with neighbours
    that set the block amax to every binade."""
    f = get_format(fmt)
    if f.has_global_scale and rule == "ceil":
        pytest.skip("NVFP4 has one rule")
    v = _all_bf16_values()
    bs = f.block_size
    x = torch.zeros(v.numel(), bs)
    x[:, 0] = v
    x[:, 1] = torch.exp2(
        torch.randint(-130, 128, (v.numel(),), generator=torch.Generator().manual_seed(1)).float()
    )
    x = x.reshape(-1, 64 * bs)
    gs = 0.5 if f.has_global_scale else None
    ref = _ref_bytes(x, fmt, rule, gs)
    tw = _twin_bytes(x, fmt, rule, gs)
    assert torch.equal(tw[0], ref[0]) and torch.equal(tw[1], ref[1])


def _e4m3_candidates() -> torch.Tensor:
    """Every non-negative fp32 <= 448 that is a bf16 value, every e4m3 value and the midpoints
    between neighbouring e4m3 values (and their fp32 neighbours): the RNE decision points."""
    v = _all_bf16_values()
    e4 = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (e4[1:] + e4[:-1]) / 2
    mids_bits = mids.view(torch.int32)
    near = torch.cat([(mids_bits + d).view(torch.float32) for d in (-1, 0, 1)])
    rnd = torch.rand(200000, generator=torch.Generator().manual_seed(2)) * 448
    tiny = torch.rand(20000, generator=torch.Generator().manual_seed(3)) * 2.0**-6
    c = torch.cat([v, e4, near, rnd, tiny, torch.tensor([448.0, 2.0**-10, 2.0**-10 * 1.0000001, 1e-45])])
    return c[~torch.signbit(c) & (c <= 448) & torch.isfinite(c)]  # the block scale is never -0


def test_e4m3_round_is_torchs():
    s = _e4m3_candidates()
    code, val = qmod.e4m3_round(s, TorchOps)
    want = s.to(torch.float8_e4m3fn)
    assert torch.equal(code.to(torch.uint8), want.view(torch.uint8))
    assert torch.equal(val, want.float())


def test_fp4_code_is_pack_fp4():
    v = torch.cat(
        [
            _all_bf16_values(),
            torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]) * (1 + 2.0**-23),
            torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]) * (1 - 2.0**-24),
            torch.rand(99998) * 8,
        ]
    )
    v = v[~torch.isnan(v)]
    v = v[: v.numel() // 2 * 2]
    code = qmod.fp4_code(v, TorchOps).to(torch.uint8)
    assert torch.equal(code[0::2] | (code[1::2] << 4), pack_fp4(v).view(torch.uint8))


def test_mx_exponent_covers_every_fp32_exponent():
    """amax = every power of two and its neighbours in fp32 (incl. subnormals): E as frexp gives."""
    e = torch.arange(-149, 128, dtype=torch.float64)
    p = torch.exp2(e).float()
    bits = p.view(torch.int32)
    amax = torch.cat([p, (bits + 1).view(torch.float32), (bits - 1).view(torch.float32).clamp(min=0)])
    for f in (FORMATS["mxfp8"], FORMATS["mxfp8_e5m2"], FORMATS["mxfp4"]):
        for ceil in (False, True):
            got = qmod.mx_exponent(amax.view(torch.int32), f, ceil, TorchOps)
            mant, ex = torch.frexp(amax)
            want = ex - 1 - f.elem_emax
            if ceil:
                want = want + (mant * 2.0 ** (f.elem_emax + 1) > f.elem_max).int()
            want = torch.where(amax == 0, -127, want).clamp(-127, 127)
            assert torch.equal(got, want.int())


@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 5, 3), (2, 130, 9), (3, 257, 8), (1, 128, 4)])
def test_swizzle_offset_is_the_layout(shape):
    """The kernel's scale address formula places every scale where to_swizzled puts it."""
    nb, rows, cols = shape
    vals = torch.arange(1, nb * rows * cols + 1, dtype=torch.int64).reshape(nb, rows, cols)
    want = to_swizzled((vals % 251 + 1).to(torch.uint8)).reshape(-1)
    b, r, c = torch.meshgrid(torch.arange(nb), torch.arange(rows), torch.arange(cols), indexing="ij")
    got = torch.zeros_like(want)
    got[qmod.swizzle_offset(b, r, c, *qmod.scale_strides(rows, cols)).reshape(-1)] = (
        (vals % 251 + 1).to(torch.uint8).reshape(-1)
    )
    assert torch.equal(got, want)


def test_cuda_div6_is_torch_cuda_semantics():
    """The kernel's `amax * fp32(1/6)` is what torch computes for `t / 6.0` on CUDA (a multiply
    by the fp32 reciprocal); on the CPU torch divides. Both are exercised by the twin tests."""
    assert torch.tensor(qmod._RCP6, dtype=torch.float32).item() == qmod._RCP6
    assert qmod._RCP6 == torch.tensor(1.0, dtype=torch.float32).div(6.0).item()


def test_config_validation():
    with pytest.raises(ValueError, match="fmt"):
        QuantizeConfig(fmt="int8")
    with pytest.raises(ValueError, match="scale_rule"):
        QuantizeConfig(fmt="nvfp4", scale_rule="ceil")
    with pytest.raises(ValueError, match="in_dtype"):
        QuantizeConfig(fmt="mxfp8", in_dtype="fp64")
    assert len(qmod.all_configs("sm_90a")) == 21 + 3  # quantize variants + finite-amax kernels


def test_quantize_rejects_cpu_tensors_and_bad_args():
    x = torch.randn(4, 32)
    with pytest.raises(ValueError, match="CUDA"):
        lmod.quantize(x, "mxfp8")
    with pytest.raises(TypeError, match="dtype"):
        lmod.quantize(x.double(), "mxfp8")
    with pytest.raises(TypeError, match="torch.Tensor"):
        lmod.quantize([1.0], "mxfp8")


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4"])
def test_dequantize_out_dtypes(fmt):
    """``cutegemm.dequantize``: fp32 is the reference; bf16 / fp16 its cast (on the CPU, and on
    a GPU wherever the kernel does not take q); other dtypes and non-BlockScaledTensors raise."""
    import cutegemm

    x = torch.randn(3, 64) * torch.exp2(torch.randint(-20, 20, (3, 1)).float())
    q = quantize_ref(x, fmt)
    ref = cutegemm.blockscaled.dequantize_ref(q)
    assert torch.equal(cutegemm.dequantize(q), ref)
    for dt in (torch.bfloat16, torch.float16):
        out = cutegemm.dequantize(q, dt)
        assert out.dtype == dt and torch.equal(out, ref.to(dt))
    with pytest.raises(TypeError, match="out_dtype"):
        cutegemm.dequantize(q, torch.float64)
    with pytest.raises(TypeError, match="BlockScaledTensor"):
        cutegemm.dequantize(x)


def test_dequantize_routes_to_the_kernel(monkeypatch):
    """bf16 and fp32 go through the dequantize kernel (fp16: its fp32 pass, then a cast) exactly
    when it takes q on an sm_90a / sm_100a GPU (here CPU tensors stand in: the device test and the
    launch are replaced by the reference)."""
    from cutegemm.blockscaled import dequant

    q = quantize_ref(torch.randn(4, 64), "mxfp8")
    ref = dequant.dequantize_ref(q)
    launched = []

    def fake_launch(q, out=None, out_dtype=torch.bfloat16, record=False):
        assert record, "dequantize must ask dequantize_checked to make its key warm"
        launched.append(out_dtype)  # records nothing: every call must come back here
        return ref.to(out_dtype)

    monkeypatch.setattr(dequant, "dequantize_checked", fake_launch)
    monkeypatch.setattr(type(q.data), "is_cuda", property(lambda t: True))
    monkeypatch.setattr(dequant, "dequantizable", lambda q: True)
    for arch, routed in (("sm_90a", True), ("sm_100a", True), ("sm_89", False)):
        monkeypatch.setattr(dequant, "arch_of", lambda index, arch=arch: arch)
        for dt, kernel_dtype in ((torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32),
                                 (torch.float16, torch.float32)):  # fmt: skip
            launched.clear()
            out = dequant.dequantize(q, dt)
            assert out.dtype == dt and torch.equal(out, ref.to(dt))
            assert launched == ([kernel_dtype] if routed else [])
    monkeypatch.setattr(dequant, "dequantizable", lambda q: False)
    launched.clear()
    assert dequant.dequantize(q, torch.bfloat16).dtype == torch.bfloat16 and not launched


# --- compile every variant for both archs ------------------------------------------------------
SASS_CHECKED = (
    "quantize_mxfp8_bf16_ocp",
    "quantize_nvfp4_fp32_ocp",
    "quantize_mxfp4_fp16_ceil",
    "finite_amax_bf16",
)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_every_variant_compiles(arch):
    """Every variant compiles to a cubin; a few are also checked in SASS (128-bit loads, no spills)."""
    for cfg in qmod.all_configs(arch):
        if cfg.name.startswith(SASS_CHECKED):
            ok, found, err = qmod.check_variant(cfg)
            assert ok, (cfg.name, found, err)
        else:
            assert qmod.kernel_cache().compile(cfg) is not None
