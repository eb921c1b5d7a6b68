"""Quantized-output epilogues (MXFP8 / MXFP4 / NVFP4) and user-defined epilogues on a GPU.

Quantized: the kernel's BlockScaledTensor against ``quantize_ref(gemm_ref(..., fp32))``: >= 99.9%
of data bytes equal in blocks of equal scale, block scales equal but for rare blocks one step off
(the accumulation order differs, so a value on a rounding boundary may land one step away), every
dequantized element within one quantization step of the reference's, and the swizzle padding
exactly zero. Random data, ragged M.

User epilogues: two functions (column / row vectors; coordinate arithmetic) against gemm_ref in
float64, within 2x torch's own error; unsupported functions raise ValueError / TypeError.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cutegemm
from cutegemm.blockscaled import dequantize_ref
from cutegemm.blockscaled.layout import swizzled_shape
from cutegemm.epilogue import fn, interleave_gate_up

from ..gemm_check import assert_outside_untouched, assert_within_torch_error, poisoned_out

pytestmark = pytest.mark.gpu
BF16 = torch.bfloat16
FMTS = ("mxfp8", "mxfp4", "nvfp4")


def _elem_step(deq: torch.Tensor, scale: torch.Tensor, fmt: str) -> torch.Tensor:
    """One quantization step at each dequantized value (element grid spacing x block scale)."""
    q = (deq / scale).abs()
    if fmt == "mxfp8":
        e = torch.floor(torch.log2(q.clamp(min=2.0**-6)))
        return torch.exp2(e - 3) * scale
    step = torch.where(q < 2, 0.5, torch.where(q < 4, 1.0, 2.0))
    return step * scale


def _block_scale(t: cutegemm.blockscaled.BlockScaledTensor) -> torch.Tensor:
    """Per-element fp32 scale (block scale x global scale)."""
    plain = t.plain_scales()
    if t.fmt.is_mx:
        s = torch.exp2(plain.view(torch.uint8).float() - 127)
    else:
        s = plain.float() * t.global_scale
    return s.repeat_interleave(t.fmt.block_size, dim=-1)[..., : t.shape[-1]]


def check_quantized(ours, ref, fmt, min_equal=0.999):
    """Data and scale bytes equal but for values on a rounding boundary: a block whose amax sits
    at a power of two (MX) or a scale step (NVFP4) may take the neighbouring scale in either
    accumulation order, which moves all its elements; such blocks must differ by one scale step
    and be rare, and every other block's bytes must match (>= min_equal)."""
    assert ours.fmt.name == fmt and ours.shape == ref.shape
    d_ours, d_ref = ours.data.view(torch.uint8), ref.data.view(torch.uint8)
    assert d_ours.shape == d_ref.shape
    s_ours, s_ref = ours.scales.view(torch.uint8), ref.scales.view(torch.uint8)
    assert s_ours.shape == s_ref.shape
    s_step = (s_ours.int() - s_ref.int()).abs()
    moved_blocks = int((s_step != 0).sum())
    assert int(s_step.max()) <= 1, f"{fmt}: a block scale is more than one step off"
    assert moved_blocks <= max(2, 0.002 * s_ours.numel()), f"{fmt}: {moved_blocks} of {s_ours.numel()} block scales differ"
    moved = _block_scale(ours) != _block_scale(ref)  # per element
    if d_ours.shape[-1] != moved.shape[-1]:  # FP4: two elements per byte
        moved = moved.reshape(*moved.shape[:-1], -1, 2).any(-1)
    same = (d_ours == d_ref)[~moved].float().mean().item() if (~moved).any() else 1.0
    assert same >= min_equal, f"{fmt}: only {same:.5f} of data bytes equal (blocks of equal scale)"
    # swizzle padding: rows >= M and scale columns past N / block are zero in both
    m, n = ours.shape[-2], ours.shape[-1]
    rows_p, cols_p = swizzled_shape(m, -(-n // ours.fmt.block_size))
    assert s_ours.shape[-2:] == (rows_p, cols_p)
    dq_o, dq_r = dequantize_ref(ours), dequantize_ref(ref)
    assert not torch.isnan(dq_o).any()
    step = torch.maximum(_elem_step(dq_o, _block_scale(ours), fmt), _elem_step(dq_r, _block_scale(ref), fmt))
    err = (dq_o - dq_r).abs()
    bad = err > step * 1.0001 + 1e-30
    if bad.any():
        idx = bad.nonzero()[:5].tolist()
        detail = [(i, dq_o[tuple(i)].item(), dq_r[tuple(i)].item(), _block_scale(ours)[tuple(i)].item(),
                   _block_scale(ref)[tuple(i)].item()) for i in idx]  # fmt: skip
        raise AssertionError(f"{fmt}: {bad.sum().item()} elements more than one step off: (index, ours, ref, "
                             f"our scale, ref scale) {detail}")  # fmt: skip


def _inputs(m, n, k, seed=0, batch=None):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape_a = (m, k) if batch is None else (batch, m, k)
    a = torch.randn(shape_a, generator=g, device="cuda").to(BF16)
    b = (torch.randn(k, n, generator=g, device="cuda") / k**0.5).to(BF16)
    return a, b


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("epi", ["none", "bias_gelu", "swiglu"])
def test_quantized_output(fmt, epi):
    m, n, k = 333, 512, 256
    a, b = _inputs(m, n, k, seed=hash((fmt, epi)) % 1000)
    kw = {}
    if epi == "bias_gelu":
        kw = dict(bias=torch.randn(n, device="cuda").to(BF16), activation="gelu")
    elif epi == "swiglu":
        kw = dict(activation="swiglu")
    gs = 0.01 if fmt == "nvfp4" else None
    q = cutegemm.gemm(a, b, out_dtype=fmt, out_global_scale=gs, **kw)
    ref = cutegemm.gemm_ref(a, b, out_dtype=fmt, out_global_scale=gs, **kw)
    check_quantized(q, ref, fmt)


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    fmt=st.sampled_from(FMTS),
    m=st.integers(1, 700),
    n32=st.integers(1, 24),
    k=st.sampled_from([64, 136, 520]),
    batch=st.sampled_from([None, 2]),
    scale=st.sampled_from([1e-6, 1.0, 300.0]),
)
def test_quantized_output_hypothesis(fmt, m, n32, k, batch, scale):
    n = 32 * n32
    a, b = _inputs(m, n, k, seed=m * 7 + n, batch=batch)
    a = (a.float() * scale).to(BF16)
    gs = (scale * 0.01) if fmt == "nvfp4" else None
    q = cutegemm.gemm(a, b, out_dtype=fmt, out_global_scale=gs)
    ref = cutegemm.gemm_ref(a, b, out_dtype=fmt, out_global_scale=gs)
    check_quantized(q, ref, fmt)


def test_quantized_blocks_of_zeros_and_nan():
    m, n, k = 256, 256, 128
    a, b = _inputs(m, n, k, seed=5)
    a[:64] = 0  # whole rows of zeros -> all-zero blocks (scale byte 0, elements 0)
    a[100, 3] = float("nan")  # NaN rows -> NaN scale, zero elements, only that row
    for fmt in FMTS:
        gs = 0.01 if fmt == "nvfp4" else None
        q = cutegemm.gemm(a, b, out_dtype=fmt, out_global_scale=gs)
        ref = cutegemm.gemm_ref(a, b, out_dtype=fmt, out_global_scale=gs)
        assert torch.equal(q.scales.view(torch.uint8)[..., :64, :], ref.scales.view(torch.uint8)[..., :64, :])
        dq = dequantize_ref(q)
        assert torch.isnan(dq[100]).all() and not torch.isnan(dq[:100]).any() and not torch.isnan(dq[101:]).any()
        assert (dq[:64] == 0).all()


def test_swiglu_mxfp8_halves_layout_and_next_gemm_operand():
    m, n2, k = 256, 1024, 512
    a, b = _inputs(m, n2, k, seed=11)
    q = cutegemm.gemm(a, b, activation="swiglu", gate_layout="halves", out_dtype="mxfp8")
    ref = cutegemm.gemm_ref(a, b, activation="swiglu", gate_layout="halves", out_dtype="mxfp8")
    check_quantized(q, ref, "mxfp8")
    assert q.data.dtype == torch.float8_e4m3fn and q.scales.dtype == torch.float8_e8m0fnu
    assert q.data.shape == (m, n2 // 2) and q.data.is_contiguous()
    # same result as the interleaved weight
    q2 = cutegemm.gemm(a, interleave_gate_up(b), activation="swiglu", out_dtype="mxfp8")
    assert torch.equal(q.data.view(torch.uint8), q2.data.view(torch.uint8))


def test_quantized_bad_inputs():
    a, b = _inputs(64, 48, 64)
    with pytest.raises(ValueError, match="multiple of 32"):
        cutegemm.gemm(a, b, out_dtype="mxfp8")
    a, b = _inputs(64, 64, 64)
    with pytest.raises(ValueError, match="out_global_scale"):
        cutegemm.gemm(a, b, out_dtype="nvfp4")
    with pytest.raises(ValueError, match="NVFP4 outputs only"):
        cutegemm.gemm(a, b, out_dtype="mxfp8", out_global_scale=1.0)
    with pytest.raises(ValueError, match="quantized out_dtype"):
        cutegemm.gemm(a, b, out_dtype="int4")
    with pytest.raises(ValueError, match="out="):
        cutegemm.gemm(a, b, out_dtype="mxfp8", out=torch.empty(64, 64, device="cuda", dtype=BF16))
    with pytest.raises(ValueError, match="positive"):
        cutegemm.gemm(a, b, out_dtype="nvfp4", out_global_scale=-1.0)


# --- user-defined epilogues ----------------------------------------------------------------------
def epi_bias_rowscale(acc, row, col, bias, scale):
    return fn.silu(acc + bias[col]) * scale[row]


def epi_coords(acc, row, col):
    return fn.where(col < 40, acc * 2.0, fn.relu(acc) - 0.5)


def epi_two_vectors_gelu(acc, row, col, shift, gain):
    return fn.gelu(acc * gain[col] + shift[row]) + 1.0


def _check_user(func, args, m, n, k, seed=0, **kw):
    a, b = _inputs(m, n, k, seed=seed)
    buf, out = poisoned_out((m, n), BF16)
    cutegemm.gemm(a, b, out=out, epilogue=func, epilogue_args=args, **kw)
    assert_outside_untouched(buf, m, n)
    ref = cutegemm.gemm_ref(a, b, epilogue=func, epilogue_args=args, compute_dtype=torch.float64, **kw)
    torch_same = func_ref_same_precision(func, a, b, args, kw.get("alpha", 1.0))
    assert_within_torch_error(out, torch_same, ref, what=func.__name__)


def func_ref_same_precision(func, a, b, args, alpha):
    from cutegemm.epilogue.user import apply_user_ref

    acc = torch.matmul(a, b).float()
    return apply_user_ref(func, acc * alpha, args).to(BF16)


@pytest.mark.parametrize("m,n,k", [(200, 136, 96), (1, 64, 64), (517, 1000, 264)])
def test_user_epilogue_vectors(m, n, k):
    bias = torch.randn(n, device="cuda").to(BF16)
    scale = torch.rand(m, device="cuda") + 0.5
    _check_user(epi_bias_rowscale, (bias, scale), m, n, k)


def test_user_epilogue_coordinates_and_alpha():
    _check_user(epi_coords, (), 300, 200, 128, alpha=0.5)


def test_user_epilogue_misaligned_vector_is_copied():
    m, n = 130, 72
    shift = torch.randn(m + 1, device="cuda")[1:]  # 4-byte offset: copied by the API
    gain = torch.randn(n, device="cuda").to(torch.float16)
    _check_user(epi_two_vectors_gelu, (shift, gain), m, n, 64)


def test_user_epilogue_untraceable_and_bad_args():
    a, b = _inputs(64, 64, 64)
    v = torch.ones(64, device="cuda")

    def indexes_by_expression(acc, row, col, v):
        return acc + v[col + 1]

    with pytest.raises((ValueError, TypeError), match="row or col"):
        cutegemm.gemm(a, b, epilogue=indexes_by_expression, epilogue_args=(v,))
    t = torch.ones(3)

    def captures_tensor(acc, row, col):
        return acc * t.sum()

    with pytest.raises(TypeError, match="epilogue_args"):
        cutegemm.gemm(a, b, epilogue=captures_tensor)
    with pytest.raises(ValueError, match="without an epilogue"):
        cutegemm.gemm(a, b, epilogue_args=(v,))
    with pytest.raises(ValueError, match="1-D"):
        cutegemm.gemm(a, b, epilogue=epi_bias_rowscale, epilogue_args=(v.view(8, 8), v))
    with pytest.raises(ValueError, match="replaces"):
        cutegemm.gemm(a, b, epilogue=epi_coords, activation="relu")


def test_user_epilogue_with_quantized_output():
    m, n, k = 256, 256, 128
    a, b = _inputs(m, n, k, seed=3)
    bias = torch.randn(n, device="cuda").to(BF16)
    scale = torch.rand(m, device="cuda") + 0.5
    q = cutegemm.gemm(a, b, epilogue=epi_bias_rowscale, epilogue_args=(bias, scale), out_dtype="mxfp8")
    ref = cutegemm.gemm_ref(a, b, epilogue=epi_bias_rowscale, epilogue_args=(bias, scale), out_dtype="mxfp8")
    check_quantized(q, ref, "mxfp8")
