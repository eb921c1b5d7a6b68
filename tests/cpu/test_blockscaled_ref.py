"""CPU tests of the block-scaled formats, the 128x4 scale layout and the reference quantizers."""

import ast
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cutegemm.blockscaled import (
    MXFP4,
    MXFP8,
    MXFP8_E5M2,
    NVFP4,
    BlockFormat,
    dequantize_ref,
    from_swizzled,
    get_format,
    pack_fp4,
    quantize_ref,
    to_swizzled,
    unpack_fp4,
)

SETTINGS = settings(max_examples=50, deadline=None)
MX_FORMATS = [MXFP8, MXFP8_E5M2, MXFP4]
E2M1_GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


# ----------------------------------------------------------------------------- helpers


@st.composite
def inputs(draw, even_k=False, max_rows=260, max_k=150):
    """Random (rows, K) or (L, rows, K) tensors with magnitudes anywhere in the dtype's range.

    Values are ``±m * 2**e`` with ``m`` in [1, 2) and ``e`` = a random centre (from subnormal
    to near the dtype max) plus a per-element spread, with a fraction of exact zeros.
    """
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.bfloat16, torch.float16]))
    rows = draw(st.integers(1, max_rows))
    k = draw(st.integers(1, max_k))
    if even_k:
        k += k % 2
    shape = (rows, k) if draw(st.booleans()) else (draw(st.integers(1, 3)), rows, k)
    lo, hi = (-24, 14) if dtype == torch.float16 else (-149, 126)
    center = draw(st.integers(lo, hi))
    spread = draw(st.sampled_from([0, 2, 10, 40]))
    zero_frac = draw(st.sampled_from([0.0, 0.1, 0.6]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    m = 1.0 + torch.rand(shape, generator=g)
    e = (center + torch.randint(-spread, spread + 1, shape, generator=g)).clamp(lo, hi)
    sign = torch.randint(0, 2, shape, generator=g) * 2.0 - 1.0
    x = sign * torch.ldexp(m, e.float())
    x = torch.where(torch.rand(shape, generator=g) < zero_frac, 0.0, x)
    return x.to(dtype)


def half_ulp(v, fmt):
    """Half the spacing of ``fmt``'s element grid in the binade of ``|v|`` (float64)."""
    _, ex = torch.frexp(v.abs())
    e = torch.clamp(ex - 1, min=fmt.elem_emin) - fmt.elem_mantissa_bits - 1
    return torch.ldexp(torch.ones_like(v), e)


def expand(scales, fmt, k):
    """Repeat per-block values along K (last dim) and cut to ``k`` columns."""
    return scales.repeat_interleave(fmt.block_size, dim=-1)[..., :k]


def elements(q):
    """Decoded element values (float64), shape ``q.shape``."""
    if q.fmt.elems_per_byte == 2:
        return unpack_fp4(q.data).double()
    return q.data.double()


def block_amax(x, bs):
    """Per-block max |x| (float64), blocks along the last dim, zero padded."""
    xd = torch.nn.functional.pad(x.double(), (0, -x.shape[-1] % bs))
    return xd.abs().unflatten(-1, (-1, bs)).amax(-1)


def block_mask(shape, bs, index):
    """Boolean mask of the elements in block ``index`` = (*leading, block)."""
    mask = torch.zeros(shape, dtype=torch.bool)
    *lead, b = index
    mask[(*lead, slice(b * bs, (b + 1) * bs))] = True
    return mask


# ----------------------------------------------------------------------------- formats


def test_format_descriptors():
    assert (MXFP8.elem_dtype, MXFP8.scale_dtype, MXFP8.block_size) == (
        torch.float8_e4m3fn,
        torch.float8_e8m0fnu,
        32,
    )
    assert (MXFP4.elem_dtype, MXFP4.scale_dtype, MXFP4.block_size) == (
        torch.float4_e2m1fn_x2,
        torch.float8_e8m0fnu,
        32,
    )
    assert (NVFP4.elem_dtype, NVFP4.scale_dtype, NVFP4.block_size) == (
        torch.float4_e2m1fn_x2,
        torch.float8_e4m3fn,
        16,
    )
    assert NVFP4.has_global_scale and not MXFP8.has_global_scale and not MXFP4.has_global_scale
    for fmt in (MXFP8, MXFP8_E5M2):
        assert fmt.elem_max == torch.finfo(fmt.elem_dtype).max
        assert fmt.elem_emax == math.floor(math.log2(fmt.elem_max))
        assert 2.0**fmt.elem_emin == torch.finfo(fmt.elem_dtype).smallest_normal
    assert (MXFP4.elem_max, MXFP4.elem_emax, MXFP4.elems_per_byte) == (6.0, 2, 2)
    assert MXFP8.is_mx and MXFP4.is_mx and not NVFP4.is_mx


def test_get_format():
    assert get_format("mxfp8") is MXFP8
    assert get_format("MXFP4") is MXFP4
    assert get_format("nvfp4") is NVFP4
    assert get_format(NVFP4) is NVFP4
    with pytest.raises(ValueError, match="fp6"):
        get_format("fp6")
    with pytest.raises(TypeError):
        get_format(4)
    with pytest.raises(AttributeError):
        MXFP8.block_size = 16
    assert isinstance(MXFP8, BlockFormat)


# ----------------------------------------------------------------------------- layout


def test_swizzle_index_formula_elementwise():
    rows, cols = 130, 6
    plain = (torch.arange(rows * cols) % 255 + 1).to(torch.uint8).reshape(rows, cols)
    sw = to_swizzled(plain)
    assert sw.shape == (256, 8) and sw.dtype == torch.uint8
    flat = sw.flatten().tolist()
    expected = [0] * (256 * 8)
    for r in range(rows):
        for c in range(cols):
            tile = (r // 128) * (8 // 4) + c // 4
            rr, cc = r % 128, c % 4
            expected[tile * 512 + (rr % 32) * 16 + (rr // 32) * 4 + cc] = int(plain[r, c])
    assert flat == expected  # also checks that every padding byte is zero


def torch_blocked_helpers():
    """torch's own ``to_blocked``/``from_blocked`` test helpers.

    ``torch.testing._internal.common_quantized`` imports test-only packages (expecttest), so
    the three pure-torch functions are loaded from its source instead of importing it.
    """
    path = Path(torch.__file__).parent / "testing" / "_internal" / "common_quantized.py"
    if not path.exists():
        pytest.skip("torch has no common_quantized.py")
    wanted = {"ceil_div", "to_blocked", "from_blocked"}
    nodes = [n for n in ast.parse(path.read_text()).body if getattr(n, "name", None) in wanted]
    if len(nodes) != len(wanted):
        pytest.skip("torch's to_blocked/from_blocked helpers not found")
    namespace = {"torch": torch}
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(path), "exec"), namespace)
    return SimpleNamespace(**{name: namespace[name] for name in wanted})


def test_swizzle_matches_torch_to_blocked():
    cq = torch_blocked_helpers()
    g = torch.Generator().manual_seed(0)
    for rows, cols in [(128, 4), (1, 1), (200, 9), (300, 17)]:
        plain = torch.randint(0, 256, (rows, cols), generator=g, dtype=torch.uint8)
        assert torch.equal(to_swizzled(plain).flatten(), cq.to_blocked(plain))
        assert torch.equal(from_swizzled(cq.to_blocked(plain), rows, cols), plain)
    # torch's loop-based inverse, on a small case (scales as uint8, any block size)
    plain = torch.randint(0, 256, (131, 5), generator=g, dtype=torch.uint8)
    ref = cq.from_blocked(torch.empty(131, 5 * 32), cq.to_blocked(plain), 32)
    assert torch.equal(ref, plain)


@SETTINGS
@given(
    st.integers(1, 3),
    st.integers(1, 300),
    st.integers(1, 13),
    st.booleans(),
    st.sampled_from([torch.uint8, torch.float8_e8m0fnu, torch.float8_e4m3fn]),
)
def test_swizzle_roundtrip(nb, rows, cols, batched, dtype):
    g = torch.Generator().manual_seed(rows * 31 + cols)
    shape = (nb, rows, cols) if batched else (rows, cols)
    plain = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8).view(dtype)
    sw = to_swizzled(plain)
    rp, cp = -(-rows // 128) * 128, -(-cols // 4) * 4
    assert sw.shape == ((nb, rp, cp) if batched else (rp, cp)) and sw.dtype == dtype
    back = from_swizzled(sw, rows, cols)
    assert back.dtype == dtype and torch.equal(back.view(torch.uint8), plain.view(torch.uint8))
    assert int(sw.view(torch.uint8).long().sum()) == int(plain.view(torch.uint8).long().sum())
    if batched:
        for i in range(nb):
            assert torch.equal(sw[i].view(torch.uint8), to_swizzled(plain[i]).view(torch.uint8))


def test_layout_errors():
    with pytest.raises(TypeError, match="scales_plain"):
        to_swizzled(torch.zeros(4, 4))
    with pytest.raises(ValueError, match="scales_plain"):
        to_swizzled(torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="swizzled"):
        from_swizzled(torch.zeros(128, 4, dtype=torch.uint8), 129, 4)
    with pytest.raises(ValueError, match="cols"):
        from_swizzled(torch.zeros(128, 4, dtype=torch.uint8), 128, 0)


# ----------------------------------------------------------------------------- e2m1 packing


def test_pack_fp4_rne_exhaustive():
    vals = torch.arange(-8 * 64, 8 * 64 + 1, dtype=torch.float32) / 64  # incl. every midpoint
    vals = torch.cat([vals, torch.tensor([1e30, -1e30, float("inf"), -float("inf"), 7.0, 0.0, -0.0])])
    grid = torch.tensor(E2M1_GRID, dtype=torch.float64)
    a = vals.double().abs().clamp(max=6.0)
    dist = (a[:, None] - grid[None, :]).abs()
    best = dist.min(dim=1, keepdim=True).values
    cand = dist == best
    code = torch.where(cand.sum(1) > 1, cand.int().argmax(1) + (cand.int().argmax(1) % 2), dist.argmin(1))
    expected = grid[code] * torch.where(torch.signbit(vals), -1.0, 1.0).double()
    got = unpack_fp4(pack_fp4(vals.reshape(-1, 2))).reshape(-1).double()
    assert torch.equal(got, expected)
    assert torch.equal(torch.signbit(got), torch.signbit(vals))


def test_pack_fp4_nibble_order():
    packed = pack_fp4(torch.tensor([[0.5, 1.0, -6.0, 3.0, 0.0, -0.0]]))
    assert packed.dtype == torch.float4_e2m1fn_x2 and packed.shape == (1, 3)
    assert packed.view(torch.uint8).tolist() == [[0x21, 0x5F, 0x80]]
    assert pack_fp4(torch.tensor([float("nan"), 1.0])).view(torch.uint8).tolist() == [0x20]
    with pytest.raises(ValueError, match="values"):
        pack_fp4(torch.zeros(3))


# ----------------------------------------------------------------------------- MX round trip


@SETTINGS
@given(inputs(even_k=True), st.sampled_from(MX_FORMATS), st.sampled_from(["ocp", "ceil"]), st.booleans())
def test_mx_roundtrip_and_scales(x, fmt, rule, swizzle):
    q = quantize_ref(x, fmt, scale_rule=rule, swizzle=swizzle)
    k = x.shape[-1]
    assert q.data.dtype == fmt.elem_dtype and q.scales.dtype == torch.float8_e8m0fnu
    assert q.data.shape == (*x.shape[:-1], k // fmt.elems_per_byte) and q.shape == x.shape
    assert q.global_scale is None and q.scales_swizzled == swizzle
    plain = q.plain_scales()
    assert plain.shape == (*x.shape[:-1], -(-k // fmt.block_size))

    # scales: exact powers of two (decoded with torch's own e8m0 cast), exponent per the rule
    scale = plain.double()
    mant, ex = torch.frexp(scale)
    assert bool((mant == 0.5).all())
    e = ex - 1
    amax = block_amax(x, fmt.block_size)
    nz = amax > 0
    assert bool((e[~nz] == -127).all())
    if rule == "ocp":
        _, aex = torch.frexp(amax)
        want = (aex - 1 - fmt.elem_emax).clamp(-127, 127)
        assert torch.equal(e[nz], want[nz])
    else:
        assert bool((amax <= fmt.elem_max * scale).all())
        assert bool(((amax > fmt.elem_max * scale / 2) | (e == -127)).all())

    # elements: RNE within half an ulp of the element grid, or saturated
    dq = dequantize_ref(q)
    assert dq.dtype == torch.float32 and dq.shape == x.shape and bool(torch.isfinite(dq).all())
    sc = expand(scale, fmt, k)
    v = x.double() / sc  # exact: power-of-two scale
    qv = elements(q)
    assert torch.equal(dq.double(), qv * sc)  # MX dequantization is exact in fp32
    sat = v.abs() > fmt.elem_max
    assert bool((qv[sat] == torch.sign(v[sat]) * fmt.elem_max).all())
    assert bool(((v - qv).abs()[~sat] <= half_ulp(v, fmt)[~sat]).all())
    if rule == "ceil":
        assert not bool(sat.any())
    else:
        assert bool((v.abs() < 2.0 ** (fmt.elem_emax + 1)).all())  # bounded saturation


# ----------------------------------------------------------------------------- NVFP4 round trip


@SETTINGS
@given(inputs(even_k=True), st.sampled_from([None, 1.0, 2.0**-20, 37.5]), st.booleans())
def test_nvfp4_roundtrip_and_scales(x, global_scale, swizzle):
    q = quantize_ref(x, NVFP4, global_scale=global_scale, swizzle=swizzle)
    k = x.shape[-1]
    assert q.data.dtype == torch.float4_e2m1fn_x2 and q.scales.dtype == torch.float8_e4m3fn
    gs32 = q.global_scale
    assert gs32.dtype == torch.float32 and gs32.shape == ()
    xf = x.float()
    if global_scale is None:
        amax32 = xf.abs().amax()
        want = (amax32 / 2688).clamp(min=2.0**-126) if amax32 > 0 else torch.tensor(1.0)
        assert gs32.item() == want.item()
    else:
        assert gs32.item() == global_scale
    gs = gs32.double()

    # block scale: e4m3 rounding of min(amax / 6 / gs, 448), within half an e4m3 ulp
    s = q.plain_scales().double()
    assert bool((s >= 0).all() & (s <= 448).all())
    s_exact = (block_amax(x, 16) / 6 / gs).clamp(max=448)
    e4m3 = get_format("mxfp8")
    assert bool(((s - s_exact).abs() <= half_ulp(s_exact, e4m3) * (1 + 2.0**-20)).all())

    # elements: RNE on the e2m1 grid relative to the fp32 denominator the quantizer used
    denom = expand((s.float() * gs32).double(), NVFP4, k)
    qv = elements(q)
    dq = dequantize_ref(q)
    assert bool(torch.isfinite(dq).all())
    assert torch.equal(dq, (qv.float() * expand(s.float(), NVFP4, k)) * gs32)
    zero = denom == 0
    assert bool((qv[zero] == 0).all())
    assert bool((x.double().abs()[zero] <= 6 * 2.0**-10 * gs * (1 + 2.0**-20)).all())
    v = torch.where(zero, 0.0, x.double() / torch.where(zero, 1.0, denom))
    tol = 2.0**-22 * v.abs()
    sat = v.abs() > 6 + tol
    assert bool((qv[sat] == 6 * torch.sign(v[sat])).all())
    ok = (v - qv).abs() <= half_ulp(v, NVFP4) + tol
    assert bool((ok | sat | (v.abs() >= 6)).all())
    # the same bound in the x domain (|x - dq| <= half-ulp * scale, up to fp32 rounding)
    err = (x.double() - dq.double()).abs()
    bound = (half_ulp(v, NVFP4) + tol) * denom + 2.0**-23 * dq.double().abs() + 2.0**-149
    assert bool((err <= bound)[~sat & ~zero].all())


# ----------------------------------------------------------------------------- hand examples


def test_mxfp8_known_block():
    x = torch.arange(1, 33, dtype=torch.float32).reshape(1, 32)
    q = quantize_ref(x, "mxfp8")
    assert q.plain_scales().view(torch.uint8).item() == 127 - 3  # floor(log2 32) - 8 = -3
    # x * 8 = 8..256; in [128, 256) the e4m3 spacing is 16, odd k are ties -> even mantissa
    want = list(range(1, 17)) + [16, 18, 20, 20, 20, 22, 24, 24, 24, 26, 28, 28, 28, 30, 32, 32]
    assert dequantize_ref(q).flatten().tolist() == want
    assert quantize_ref(x, "mxfp8", scale_rule="ceil").plain_scales().view(torch.uint8).item() == 124


def test_mxfp4_known_block():
    x = torch.arange(1, 33, dtype=torch.float32).reshape(1, 32)
    q = quantize_ref(x, "mxfp4")
    assert q.plain_scales().view(torch.uint8).item() == 127 + 3  # floor(log2 32) - 2 = 3
    # x / 8 rounded on the e2m1 grid (ties 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4)
    grid = [0, 0, 0.5, 0.5, 0.5, 1, 1, 1, 1, 1, 1.5, 1.5, 1.5, 2, 2, 2]
    grid += [2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4]
    assert dequantize_ref(q).flatten().tolist() == [8 * g for g in grid]
    assert q.data.shape == (1, 16) and q.data.view(torch.uint8)[0, 0].item() == 0x00
    assert q.data.view(torch.uint8)[0, 1].item() == 0x11  # 3/8 -> 0.5, 4/8 -> 0.5


def test_nvfp4_known_block():
    x = torch.arange(1, 17, dtype=torch.float32).reshape(1, 16)
    q = quantize_ref(x, "nvfp4", global_scale=1 / 64)
    # s = 16 / 6 * 64 = 170.67 -> e4m3 176 (spacing 16 in [128, 256)), byte 0 1110 011
    assert q.plain_scales().view(torch.uint8).item() == 0x73
    # elements k / (176 / 64) = k / 2.75 on the e2m1 grid
    grid = [0.5, 0.5, 1, 1.5, 2, 2, 3, 3, 3, 4, 4, 4, 4, 6, 6, 6]
    assert dequantize_ref(q).flatten().tolist() == [2.75 * g for g in grid]
    # exactly representable block with unit scales is lossless
    y = torch.tensor([[6.0, -3.0, 1.5, 0.5, 0, 4, -2, 1] * 2])
    qy = quantize_ref(y, NVFP4, global_scale=1.0)
    assert qy.plain_scales().float().item() == 1.0
    assert torch.equal(dequantize_ref(qy), y)


def test_default_nvfp4_global_scale():
    x = torch.tensor([[0.0] * 15 + [2688.0]] * 3)
    q = quantize_ref(x, NVFP4)
    assert q.global_scale.item() == 1.0
    assert q.plain_scales().float().flatten().tolist() == [448.0] * 3
    assert torch.equal(dequantize_ref(q), x)
    assert quantize_ref(torch.zeros(2, 16), NVFP4).global_scale.item() == 1.0


# ----------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("fmt", [MXFP8, MXFP8_E5M2, MXFP4, NVFP4])
def test_all_zero_blocks(fmt):
    x = torch.zeros(3, 70)
    x[1, 5] = 3.0
    q = quantize_ref(x, fmt)
    dq = dequantize_ref(q)
    assert not bool(torch.isnan(dq).any())
    assert bool((dq[0] == 0).all() & (dq[2] == 0).all())
    scales = q.plain_scales()
    if fmt.is_mx:
        assert bool((scales[0].view(torch.uint8) == 0).all())  # E = -127
    else:
        assert bool((scales[0].float() == 0).all())


@pytest.mark.parametrize("fmt", [MXFP8, MXFP4, NVFP4])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_propagates_to_its_block_only(fmt, bad):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, 70, generator=g)
    x[1, 3, 40] = bad
    q = quantize_ref(x, fmt)
    dq = dequantize_ref(q)
    mask = block_mask(x.shape, fmt.block_size, (1, 3, 40 // fmt.block_size))
    assert bool(torch.isnan(dq[mask]).all()) and not bool(torch.isnan(dq[~mask]).any())
    scales = q.plain_scales()
    nan_scales = torch.isnan(scales.float())
    assert int(nan_scales.sum()) == 1 and bool(nan_scales[1, 3, 40 // fmt.block_size])
    if fmt.is_mx:
        assert scales[1, 3, 40 // fmt.block_size].view(torch.uint8).item() == 0xFF
    else:
        clean = x.clone()
        clean[1, 3, 40] = 0.0
        assert q.global_scale.item() == quantize_ref(clean, fmt).global_scale.item()
    assert torch.equal(
        dq[~mask],
        dequantize_ref(quantize_ref(torch.where(mask, 0.0, x), fmt, global_scale=q.global_scale))[~mask],
    )


def test_saturation():
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1] = 500.0, 1.0
    # ocp: E = floor(log2 500) - 8 = 0, 500 saturates to 448; ceil: E = 1, 250 -> 256
    assert dequantize_ref(quantize_ref(x, MXFP8))[0, :2].tolist() == [448.0, 1.0]
    assert dequantize_ref(quantize_ref(x, MXFP8, scale_rule="ceil"))[0, :2].tolist() == [512.0, 1.0]
    x[0, 0] = 7.0  # e2m1: ocp E = 0 -> saturates to 6; ceil E = 1 -> 3.5 -> 4 (x2 = 8)
    assert dequantize_ref(quantize_ref(x, MXFP4))[0, :2].tolist() == [6.0, 1.0]
    assert dequantize_ref(quantize_ref(x, MXFP4, scale_rule="ceil"))[0, :2].tolist() == [8.0, 1.0]
    big = torch.full((2, 32), torch.finfo(torch.float32).max)
    for fmt in MX_FORMATS + [NVFP4]:
        dq = dequantize_ref(quantize_ref(big, fmt))
        assert bool(torch.isfinite(dq).all()) and bool((dq > 1e38).all())
    # NVFP4 with a global scale too small for the block: e4m3 scale saturates at 448,
    # elements at 6
    q = quantize_ref(torch.full((1, 16), 1e6), NVFP4, global_scale=1.0)
    assert q.plain_scales().float().item() == 448.0
    assert bool((dequantize_ref(q) == 6 * 448).all())


def test_subnormal_inputs():
    x = torch.full((4, 64), 1e-40)  # fp32 subnormals
    x[:, ::3] = -3e-42
    for fmt in MX_FORMATS:
        q = quantize_ref(x, fmt)
        assert bool((q.plain_scales().view(torch.uint8) == 0).all())  # E clamps to -127
        dq = dequantize_ref(q)
        assert bool(torch.isfinite(dq).all())
        # at the smallest scale 2**-127 the error is still within half an element ulp
        v = x.double() * 2.0**127
        assert bool(((dq.double() - x.double()).abs() * 2.0**127 <= half_ulp(v, fmt)).all())
    dq = dequantize_ref(quantize_ref(x, NVFP4))
    assert bool(torch.isfinite(dq).all())
    assert bool(((dq - x).abs() <= 0.25 * x.abs().max()).all())


@pytest.mark.parametrize("fmt", [MXFP8, MXFP4, NVFP4])
def test_tail_blocks_and_batch(fmt):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 130, 50, generator=g) * torch.logspace(-3, 3, 50)
    q = quantize_ref(x, fmt, swizzle=False)
    assert q.plain_scales().shape == (2, 130, -(-50 // fmt.block_size))
    assert q.data.shape == (2, 130, 50 // fmt.elems_per_byte)
    qs = quantize_ref(x, fmt)
    assert qs.scales.shape == (2, 256, 4)
    assert torch.equal(qs.plain_scales().view(torch.uint8), q.scales.view(torch.uint8))
    for i in range(2):  # batched == per-slice (same global scale)
        qi = quantize_ref(x[i], fmt, global_scale=q.global_scale, swizzle=False)
        assert torch.equal(qi.data.view(torch.uint8), q.data[i].view(torch.uint8))
        assert torch.equal(qi.scales.view(torch.uint8), q.scales[i].view(torch.uint8))
    # the tail block's amax only sees the real elements
    y = torch.ones(1, 33)
    y[0, 32] = 0.25
    assert quantize_ref(y, MXFP8).plain_scales()[0].view(torch.uint8).tolist() == [127 - 8, 127 - 10]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs(dtype):
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(3)).to(dtype)
    for fmt in (MXFP8, NVFP4):
        ref = quantize_ref(x.float(), fmt)
        q = quantize_ref(x, fmt)
        assert torch.equal(q.data.view(torch.uint8), ref.data.view(torch.uint8))
        assert torch.equal(q.scales.view(torch.uint8), ref.scales.view(torch.uint8))


def test_argument_errors():
    x = torch.randn(4, 32)
    with pytest.raises(TypeError, match="x"):
        quantize_ref(x.int(), MXFP8)
    with pytest.raises(TypeError, match="x"):
        quantize_ref(x.tolist(), MXFP8)
    with pytest.raises(ValueError, match="x"):
        quantize_ref(x[0], MXFP8)
    with pytest.raises(ValueError, match="K must be even"):
        quantize_ref(torch.randn(4, 33), MXFP4)
    with pytest.raises(ValueError, match="unknown"):
        quantize_ref(x, "mxfp6")
    with pytest.raises(TypeError, match="fmt"):
        quantize_ref(x, 8)
    with pytest.raises(ValueError, match="scale_rule"):
        quantize_ref(x, MXFP8, scale_rule="floor")
    with pytest.raises(ValueError, match="scale_rule"):
        quantize_ref(x, NVFP4, scale_rule="ceil")
    with pytest.raises(ValueError, match="global_scale"):
        quantize_ref(x, MXFP8, global_scale=1.0)
    with pytest.raises(ValueError, match="global_scale"):
        quantize_ref(x, NVFP4, global_scale=-1.0)
    with pytest.raises(TypeError, match="global_scale"):
        quantize_ref(x, NVFP4, global_scale="1")
    with pytest.raises(TypeError, match="q"):
        dequantize_ref(x)
