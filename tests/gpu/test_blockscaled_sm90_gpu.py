"""MXFP8 x MXFP8 on sm_90a (Hopper), emulated: e4m3 WGMMAs of K 32 whose partial sums are promoted
with the e8m0 scales (``cutegemm.blockscaled.mx_sm90``). Skipped unless an sm_90 GPU is present.

Reference: the dequantized operands (exact in fp32 for MX formats) multiplied in float64. A bf16
output's error must be within 2x the same-precision torch baseline (the dequantized operands,
exact in bf16, through torch's bf16 matmul); an fp32 output's within 2e-4 of max |ref| (the FP8
tensor core's accumulation inside each 32-product partial sum; no torch fp32 path has it).
Outputs go to NaN-poisoned buffers (every element written, nothing outside); hypothesis over M,
N, K (partial tiles, K not a multiple of 128) and per-row / per-block scale exponents.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cutegemm
import cutegemm.ops  # noqa: F401  (registers torch.ops.cutegemm)
from cutegemm.blockscaled import dequantize_ref, quantize_ref
from cutegemm.blockscaled.mx_sm90 import mx_config

from ..gemm_check import assert_outside_untouched, assert_within_torch_error, poisoned_out

pytestmark = pytest.mark.gpu


def _skip_unless_sm90():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("MXFP8 emulation is the sm_90a path")


def _operands(m, n, k, seed=0, spread=8, batch=None):
    """Random values times 2**e, e drawn per (row, 32-K block) in [-spread, spread]: the scales of
    neighbouring blocks differ, so a scale applied to the wrong block or column shows."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    lead = () if batch is None else (batch,)

    def draw(rows):
        x = torch.randn(*lead, rows, k, generator=g, device="cuda")
        kb = -(-k // 32)
        e = torch.randint(-spread, spread + 1, (*lead, rows, kb), generator=g, device="cuda").float()
        return x * torch.exp2(e).repeat_interleave(32, dim=-1)[..., :k]

    return quantize_ref(draw(m), "mxfp8"), quantize_ref(draw(n), "mxfp8")


def _reference(qa, qb):
    return dequantize_ref(qa).double() @ dequantize_ref(qb).double().mT


def _torch_same_precision(qa, qb, out_dtype):
    a, b = dequantize_ref(qa), dequantize_ref(qb)
    if out_dtype == torch.float32:
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            return a @ b.mT
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev
    return (a.to(out_dtype) @ b.to(out_dtype).mT).to(out_dtype)


def _run_checked(qa, qb, out_dtype=torch.bfloat16, what="", **kw):
    """gemm(qa, qb, out=<poisoned view>, **kw) (the out dtype follows ``out``), checked."""
    shape = (*qa.shape[:-1], qb.shape[-2])
    m, n = shape[-2], shape[-1]
    buf, out = poisoned_out(shape, out_dtype, pad_cols=8 + (-n) % 8)  # rows 16-byte aligned
    res = cutegemm.gemm(qa, qb, out=out, **kw)
    assert res is out
    assert_outside_untouched(buf, m, n)
    alpha = kw.get("alpha", 1.0)
    ref = _reference(qa, qb) * alpha
    if out_dtype == torch.float32:
        # An fp32 output shows the FP8 tensor core's own accumulation precision inside each 32-product
        # partial sum (measured ~7e-5 of max |ref|), not reachable by any fp32 torch baseline.
        assert not torch.isnan(out).any(), what
        err = (out.double() - ref).abs().max().item()
        assert err <= 2e-4 * (ref.abs().max().item() or 1.0), f"{what}: max err {err:.4g}"
        return out
    base = _torch_same_precision(qa, qb, out_dtype).double() * alpha
    assert_within_torch_error(out, base.to(out_dtype), ref, what=what)
    return out


@pytest.mark.parametrize(
    "m,n,k",
    [(256, 256, 512), (1000, 520, 768), (1, 128, 256), (300, 4096, 2048), (130, 136, 144), (77, 65, 48)],
)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_mxfp8_matches_reference(m, n, k, out_dtype):
    _skip_unless_sm90()
    qa, qb = _operands(m, n, k, seed=m + n + k)
    out = _run_checked(qa, qb, out_dtype, what=f"mxfp8 {m}x{n}x{k}")
    own = cutegemm.gemm(qa, qb, out_dtype=out_dtype)  # allocated here (odd N: padded rows, copied)
    assert own.is_contiguous() and own.shape == (m, n) and torch.equal(own, out)


@pytest.mark.parametrize(
    "tile",
    [
        dict(tile_m=128, tile_n=128),
        dict(tile_m=128, tile_n=64),
        dict(tile_m=64, tile_n=128),
        dict(tile_m=64, tile_n=64),
        dict(tile_m=128, tile_n=128, cluster_m=2),
        dict(tile_m=128, tile_n=64, cluster_n=2, raster="n", group=4),
        dict(tile_m=128, tile_n=128, cluster_m=2, cluster_n=2),
        dict(tile_m=128, tile_n=128, scheduler="dynamic"),
    ],
)
def test_mxfp8_tiles_and_clusters(tile):
    _skip_unless_sm90()
    m, n, k = 700, 900, 1536
    qa, qb = _operands(m, n, k, seed=3)
    cfg = replace(mx_config(m, n), **tile)
    _run_checked(qa, qb, what=str(tile), config=cfg)


def test_mxfp8_alpha_and_batched():
    _skip_unless_sm90()
    qa, qb = _operands(200, 192, 640, seed=5, batch=3)
    out = _run_checked(qa, qb, what="batched alpha", alpha=0.375)
    assert out.shape == (3, 200, 192)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    m=st.integers(1, 700),
    n8=st.integers(1, 80),
    k16=st.integers(1, 48),
    spread=st.integers(0, 20),
    out32=st.booleans(),
)
def test_mxfp8_hypothesis(m, n8, k16, spread, out32):
    """Partial M / N tiles, K a multiple of 16 (a partial last 32-block when K % 32 == 16, a
    partial last K tile when K % 128 != 0), scale exponents over up to +-20 per block."""
    _skip_unless_sm90()
    n, k = 8 * n8, 16 * k16
    qa, qb = _operands(m, n, k, seed=m * 31 + n + k, spread=spread)
    out_dtype = torch.float32 if out32 else torch.bfloat16
    _run_checked(qa, qb, out_dtype, what=f"hyp {m}x{n}x{k} spread {spread}")


def test_mxfp8_zero_blocks_saturation_and_nan():
    """Zero blocks (scale byte 0), saturating blocks (|x| = 448 * 2**k), and a NaN block: exactly
    the reference's NaN rows / columns, finite everywhere else."""
    _skip_unless_sm90()
    torch.manual_seed(1)
    m, n, k = 256, 320, 1024
    a = torch.randn(m, k, device="cuda")
    a[:, :64] = 0
    a[::7, 128:160] = 3e4
    b = torch.randn(n, k, device="cuda")
    b[:50] = 0
    qa, qb = quantize_ref(a, "mxfp8"), quantize_ref(b, "mxfp8")
    _run_checked(qa, qb, what="zero / saturating blocks")
    a[5, 300] = float("nan")
    qa = quantize_ref(a, "mxfp8")
    out = cutegemm.gemm(qa, qb)
    ref = _reference(qa, qb)
    assert torch.equal(torch.isnan(out), torch.isnan(ref)), "NaN pattern differs from the reference"
    assert torch.isnan(out[5]).all() and not torch.isnan(out[torch.arange(m, device="cuda") != 5]).any()


def test_mxfp8_op_and_config_errors():
    _skip_unless_sm90()
    qa, qb = _operands(64, 128, 256, seed=9)
    ref = _reference(qa, qb)
    got = torch.ops.cutegemm.gemm_blockscaled(
        qa.data, qa.swizzled_scales(), qb.data, qb.swizzled_scales(), fmt="mxfp8"
    )
    assert (got.double() - ref).abs().max() <= 1e-2 * ref.abs().max()
    with pytest.raises(ValueError, match="not an MXFP8-emulation kernel"):
        cutegemm.gemm(qa, qb, config=replace(mx_config(64, 128), fp8_mx=False))
    with pytest.raises(ValueError, match="tile_m and tile_n must be 64 or 128"):
        cutegemm.gemm(qa, qb, config=replace(mx_config(64, 128), tile_n=256))
    with pytest.raises(ValueError, match="out must be"):
        cutegemm.gemm(qa, qb, out=torch.empty(64, 127, device="cuda", dtype=torch.bfloat16))


def _check_dequantize_first(formats, batch, m, n, k, seed, kw):
    """gemm(qa, qb, alpha=0.5) on sm_90a for formats that dequantize first: bitwise equal to our
    bf16 GEMM of the reference-dequantized operands, within 2x the error of torch's bf16 matmul
    of them, poisoned output with nothing written outside; an explicit config is refused."""
    _skip_unless_sm90()
    lead = () if batch is None else (batch,)
    g = torch.Generator(device="cuda").manual_seed(seed + len(lead))
    qa = cutegemm.quantize(torch.randn(*lead, m, k, generator=g, device="cuda"), formats[0], **kw)
    qb = cutegemm.quantize(torch.randn(*lead, n, k, generator=g, device="cuda"), formats[1], **kw)
    buf, out = poisoned_out((*lead, m, n), torch.bfloat16)
    assert cutegemm.gemm(qa, qb, out=out, alpha=0.5) is out
    assert_outside_untouched(buf, m, n)
    a16, b16 = dequantize_ref(qa).to(torch.bfloat16), dequantize_ref(qb).to(torch.bfloat16)
    assert torch.equal(out, cutegemm.gemm(a16, b16.mT, alpha=0.5))
    ref = (dequantize_ref(qa).double() @ dequantize_ref(qb).double().mT) * 0.5
    assert_within_torch_error(out, ((a16 @ b16.mT).double() * 0.5).to(torch.bfloat16), ref, what=f"{formats} on sm_90a")
    with pytest.raises(ValueError, match="no kernel config"):
        cutegemm.gemm(qa, qb, config=mx_config(m, n))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("batch", [None, 2])
def test_fp4_x_fp4_on_hopper_dequantizes_first(fmt, batch):
    """FP4 x FP4 on sm_90a: both operands dequantized to bf16 (one kernel pass each, equal to
    dequantize_ref rounded to bf16), then our bf16 GEMM (NVFP4's global scale makes the bf16
    operands a rounding; MXFP4's are exact)."""
    _check_dequantize_first((fmt, fmt), batch, 300, 264, 512, 0, {"global_scale": 0.37} if fmt == "nvfp4" else {})


@pytest.mark.parametrize("formats", [("mxfp8", "mxfp4"), ("mxfp4", "mxfp8")], ids=["mxfp8xmxfp4", "mxfp4xmxfp8"])
@pytest.mark.parametrize("batch", [None, 2])
def test_mixed_mx_on_hopper_dequantizes_first(formats, batch):
    """MXFP8 x MXFP4 (either order) on sm_90a: each operand dequantized in its own format (exact
    in bf16), then our bf16 GEMM; K not a multiple of 128 is fine here (the sm_100a kernel needs
    it)."""
    _check_dequantize_first(formats, batch, 300, 264, 544, 7, {})
