"""torch._scaled_mm's 1x128 x 1x128 and 128x128 x 1x128 FP8 block recipes (cutegemm.blockscaled
.fp8_blocks), host side (no GPU): which scale shapes ask for them (and which stay with the
row-wise / DeepSeek paths), the reference twin against the block-dequantized product, the torch
model of the emulation kernel fed the expanded scales against the twin, the API's routing and
its errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cutegemm
from cutegemm.blockscaled.fp8_blocks import (
    RECIPES,
    expanded_scales,
    gathered_scales,
    gemm_fp8_vector_blocks,
    recipe_scales,
    vector_block_recipe,
)
from cutegemm.blockscaled.mx_sm90 import emulation_ref, kernel_sfa, kernel_sfb

E4M3 = torch.float8_e4m3fn


def _operands(m, n, k, lhs_block, seed, pad=True):
    """(x8 (M, K), y8 (N, K), scale_a, scale_b, x dequant scale per element, y's): torch's test
    layouts (scale_a M-major for 1x128, the (L4, M/128) K-major view for 128x128; scale_b (N, K/128)
    N-major), dequantization scales with a wide exponent spread."""
    g = torch.Generator().manual_seed(seed)
    kb, mb = -(-k // 128), -(-m // 128)
    x8 = torch.randn(m, k, generator=g).mul(64).clamp(-448, 448).to(E4M3)
    y8 = torch.randn(n, k, generator=g).mul(64).clamp(-448, 448).to(E4M3)
    sb = torch.exp2(torch.randint(-8, 8, (n, kb), generator=g).float()) * torch.rand(n, kb, generator=g).add(0.5)
    sb = sb.t().contiguous().t()
    if lhs_block == 1:
        sa = (torch.exp2(torch.randint(-8, 8, (m, kb), generator=g).float()) * torch.rand(m, kb, generator=g).add(0.5))
        sa = sa.t().contiguous().t()
        sa_el = sa.repeat_interleave(128, 1)[:, :k]
    else:
        blocks = torch.exp2(torch.randint(-8, 8, (mb, kb), generator=g).float())
        sa_el = blocks.repeat_interleave(128, 0)[:m].repeat_interleave(128, 1)[:, :k]
        l4 = -(-kb // 4) * 4 if pad else kb
        sa = torch.nn.functional.pad(blocks, (0, l4 - kb), value=float("inf")).t()  # padding never read
    sb_el = sb.repeat_interleave(128, 1)[:, :k]
    return x8, y8, sa, sb, sa_el, sb_el


def _in_layout(layout, *scales):
    """The scales as given ("torch"), row-major ("row") or column-major ("col")."""
    if layout == "row":
        return tuple(s.contiguous() for s in scales)
    if layout == "col":
        return tuple(s.t().contiguous().t() for s in scales)
    return scales


def _exact(x8, y8, sa_el, sb_el):
    return (x8.double() * sa_el.double()) @ (y8.double() * sb_el.double()).t()


@pytest.mark.parametrize("lhs_block", [1, 128])
@pytest.mark.parametrize("m,n,k", [(256, 768, 512), (384, 128, 1280), (100, 72, 208), (1, 16, 384)])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_twin_is_the_block_dequantized_product(lhs_block, m, n, k, out_dtype):
    x8, y8, sa, sb, sa_el, sb_el = _operands(m, n, k, lhs_block, seed=m + n + k)
    if lhs_block == 1 and k <= 128:
        pytest.skip("one K block: row-wise")
    assert vector_block_recipe(x8, y8.t(), sa, sb) == RECIPES[0 if lhs_block == 1 else 1]
    cd = dict(compute_dtype=torch.float64) if out_dtype == torch.float64 else {}  # the GPU tests' reference
    got = cutegemm.gemm_ref(x8, y8.t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype, alpha=0.5, **cd)
    want = _exact(x8, y8, sa_el, sb_el) * 0.5
    assert got.dtype == out_dtype and got.shape == (m, n)
    tol = dict(rtol=1.6e-2, atol=1e-3 * want.abs().max().item()) if out_dtype == torch.bfloat16 else dict(
        rtol=1e-12 if cd else 1e-5, atol=(1e-12 if cd else 1e-5) * want.abs().max().item())  # fmt: skip
    torch.testing.assert_close(got.double(), want, **tol)


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 300), n=st.integers(1, 300), kb16=st.integers(9, 40), lhs=st.sampled_from([1, 128]),
       pad=st.booleans(), tile_n=st.sampled_from([64, 128]), seed=st.integers(0, 2**16))  # fmt: skip
def test_kernel_model_with_expanded_scales_equals_twin(m, n, kb16, lhs, pad, tile_n, seed):
    """What the emulation kernel computes from the expanded scales (its own layouts and read
    positions: ``emulation_ref``) equals the twin up to fp32 summation order, for any M, N
    (partial tiles), K a multiple of 16 past one K block (a partial last block)."""
    k = 16 * kb16
    x8, y8, sa, sb, _, _ = _operands(m, n, k, lhs, seed, pad)
    recipe = vector_block_recipe(x8, y8.t(), sa, sb)
    assert recipe == RECIPES[0 if lhs == 1 else 1]
    got = emulation_ref(x8, y8, *recipe_scales(recipe, m, k, sa, sb), tile_n=tile_n, repeat=4)
    want = cutegemm.gemm_ref(x8, y8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float32)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    # the kernel's scale tensors from the 128-wide scales (repeat 4) are those built from the
    # scales expanded to 32-wide blocks, up to ceil(K / 32) blocks, and zero past them
    full = expanded_scales(recipe, m, n, k, sa, sb)
    kb = -(-k // 32)
    for build, direct, expanded in ((kernel_sfa, (k, 4), (k,)), (kernel_sfb, (k, tile_n, 4), (k, tile_n))):
        got_s = build(recipe_scales(recipe, m, k, sa, sb)[build is kernel_sfb], *direct)
        want_s = build(full[build is kernel_sfb], *expanded)
        assert got_s.shape == want_s.shape and got_s.stride() == want_s.stride()
        assert torch.equal(got_s[:, :kb], want_s[:, :kb]) and not got_s[:, kb:].any()


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 300), n=st.integers(1, 300), kb16=st.integers(9, 40), lhs=st.sampled_from([1, 128]),
       pad=st.booleans(), tile_n=st.sampled_from([64, 128, 192]), layout=st.sampled_from(["torch", "row", "col"]),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_gathered_scales_equal_the_builders(m, n, kb16, lhs, pad, tile_n, layout, seed):
    """The one-gather scale buffers (the warm path's two launches) hold what kernel_sfa /
    kernel_sfb build from recipe_scales, value for value, with the same shapes and strides, 16-byte
    aligned, for scales in torch's layouts, row-major ones and column-major ones; infinities in
    the never-read padding stay unread."""
    k = 16 * kb16
    x8, y8, sa, sb, _, _ = _operands(m, n, k, lhs, seed, pad)
    sa, sb = _in_layout(layout, sa, sb)
    recipe = vector_block_recipe(x8, y8.t(), sa, sb)
    rsa, rsb = recipe_scales(recipe, m, k, sa, sb)
    want = (kernel_sfa(rsa, k, 4), kernel_sfb(rsb, k, tile_n, 4))
    for _ in range(2):  # the cold call builds the index, the warm one reuses it
        got = gathered_scales(recipe, m, n, k, tile_n, sa, sb)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.stride() == w.stride() and g.data_ptr() % 16 == 0
            assert torch.equal(g, w)


def test_other_scale_shapes_keep_their_paths():
    m, n, k = 256, 384, 512
    a = torch.zeros(m, k).to(E4M3)
    b = torch.zeros(n, k).to(E4M3).t()
    # row-wise, per-tensor, DeepSeek 1x128 x 128x128 (torch's padded layout too): not these recipes
    for sa, sb in [(torch.ones(m, 1), torch.ones(1, n)), (torch.ones(()), torch.ones(())),
                   (torch.ones(m, 4), torch.ones(4, 3)), (torch.ones(m, 4), torch.ones(4, 3).t().contiguous().t())]:  # fmt: skip
        assert vector_block_recipe(a, b, sa, sb) is None
    # one K block: 1x128 x 1x128 is row-wise x column-wise; 128x128 of a single block is per tensor
    a1, b1 = torch.zeros(m, 128).to(E4M3), torch.zeros(n, 128).to(E4M3).t()
    assert vector_block_recipe(a1, b1, torch.ones(m, 1), torch.ones(n, 1)) is None
    assert vector_block_recipe(a1[:64], b1, torch.ones(1, 1), torch.ones(n, 1)) is None
    assert vector_block_recipe(a1, b1, torch.ones(4, 2), torch.ones(n, 1)) == RECIPES[1]
    # wrong shapes: none of them (the dense path names the error)
    assert vector_block_recipe(a, b, torch.ones(m, 3), torch.ones(n, 4)) is None
    assert vector_block_recipe(a, b, torch.ones(m, 4), torch.ones(n - 1, 4)) is None
    with pytest.raises(ValueError, match="block scaling"):
        cutegemm.gemm_ref(a, b, scale_a=torch.ones(m, 3), scale_b=torch.ones(n, 4))


def test_api_routing_and_errors():
    m, n, k = 128, 256, 384
    x8, y8, sa, sb, _, _ = _operands(m, n, k, 1, seed=1)
    with pytest.raises(ValueError, match="supports only"):
        cutegemm.gemm_ref(x8, y8.t(), scale_a=sa, scale_b=sb, bias=torch.ones(n))
    with pytest.raises(ValueError, match="supports only"):
        cutegemm.gemm(x8, y8.t(), scale_a=sa, scale_b=sb, activation="relu")
    with pytest.raises(ValueError, match="CUDA"):
        cutegemm.gemm(x8, y8.t(), scale_a=sa, scale_b=sb)
    with pytest.raises(TypeError, match="float32"):
        cutegemm.gemm_ref(x8, y8.t(), scale_a=sa.double(), scale_b=sb)
    with pytest.raises(ValueError, match="e4m3"):
        cutegemm.gemm_ref(x8, y8.t().to(torch.float8_e5m2), scale_a=sa, scale_b=sb)
    with pytest.raises(ValueError, match="out must be"):
        gemm_fp8_vector_blocks(x8, y8.t(), scale_a=sa, scale_b=sb, out=torch.empty(m, n + 1))
    z = cutegemm.gemm_ref(x8[:0], y8.t(), scale_a=sa[:0], scale_b=sb)
    assert z.shape == (0, n)


def test_gather_declines_scales_sliced_from_wide_buffers():
    """A scale tensor cut from a much wider buffer (its span far larger than its elements) is
    left to the builders, which copy only its elements; torch's layouts take the gather."""
    m, n, k = 256, 512, 1024
    x8, y8, sa, sb, _, _ = _operands(m, n, k, 1, seed=7)
    recipe = vector_block_recipe(x8, y8.t(), sa, sb)
    assert gathered_scales(recipe, m, n, k, 128, sa, sb) is not None
    wide = torch.zeros(n, 4096)
    wide[:, : sb.shape[1]] = sb
    sliced = wide[:, : sb.shape[1]]
    assert vector_block_recipe(x8, y8.t(), sa, sliced) == recipe
    assert gathered_scales(recipe, m, n, k, 128, sa, sliced) is None


def _column_kernel_model(x8, y8, sfa, sfb, k):
    """What the block-scaled kernel with per-column B scales (config.sfb_cols) computes from its
    inputs: per 128-wide K tile, the raw e4m3 product times mSFA[row, kt] * mSFB[col, kt] (fp64)."""
    acc = torch.zeros(x8.shape[0], y8.shape[0], dtype=torch.float64)
    for kt in range(-(-k // 128)):
        sl = slice(kt * 128, min(k, (kt + 1) * 128))
        acc += (x8[:, sl].double() @ y8[:, sl].double().t()) * sfa[:, kt : kt + 1].double() * sfb[:, kt].double()
    return acc


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 300), n=st.integers(1, 300), kb16=st.integers(1, 40), lhs=st.sampled_from([1, 128]),
       pad=st.booleans(), layout=st.sampled_from(["torch", "row", "col"]), seed=st.integers(0, 2**16))  # fmt: skip
def test_column_scales_feed_the_kernel_the_recipe(m, n, kb16, lhs, pad, layout, seed):
    """column_scales gives the per-column kernel (config.sfb_cols) mSFA (M, KB) M-major and mSFB
    (N, KB) N-major, TMA-addressable (K-block strides of 4-element multiples, 16-byte aligned),
    in place for torch's layouts; the kernel's arithmetic on them (``_column_kernel_model``) is the
    block-dequantized product, for scales in torch's, row-major and column-major layouts."""
    from cutegemm.blockscaled.fp8_blocks import column_scales

    k = 16 * kb16
    x8, y8, sa, sb, sa_el, sb_el = _operands(m, n, k, lhs, seed, pad)
    sa, sb = _in_layout(layout, sa, sb)
    recipe = vector_block_recipe(x8, y8.t(), sa, sb)
    if recipe is None:  # one K block: the row-wise recipe's shapes (torch's order)
        return
    sfa, sfb = column_scales(recipe, m, k, sa, sb)
    kb = -(-k // 128)
    assert sfa.shape == (m, kb) and sfb.shape == (n, kb)
    for t in (sfa, sfb):
        assert (t.stride(0) == 1 or t.shape[0] == 1) and t.stride(1) % 4 == 0 and t.data_ptr() % 16 == 0
    if layout == "torch" and sb.stride(0) == 1 and sb.stride(1) % 4 == 0:
        assert sfb.data_ptr() == sb.data_ptr()  # torch's N-major scale_b read in place
    want = _exact(x8, y8, sa_el, sb_el)
    got = _column_kernel_model(x8, y8, sfa, sfb, k)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9 * want.abs().max().item())


def test_warm_plan_launches_what_the_cold_call_launches(monkeypatch):
    """A bare call's warm plan (fp8_blocks.warm_call) hands the per-column kernel the cold call's
    operand views, column_scales' mSFA / mSFB, an (M, N, 1) output view and the grid; a call with
    other strides finds no plan."""
    from cutegemm.blockscaled import fp8_blocks
    from cutegemm.gemm.args import KernelArgs

    m, n, k = 200, 264, 640
    for lhs in (1, 128):
        x8, y8, sa, sb, _, _ = _operands(m, n, k, lhs, seed=3)
        b = y8.t()
        recipe = vector_block_recipe(x8, b, sa, sb)
        cfg = fp8_blocks.column_config(m, n, k, k, k, torch.bfloat16, False, None, 132)
        assert cfg.fp8_blockwise and cfg.sfb_cols and cfg.split_k == 1
        calls = []
        monkeypatch.setattr(fp8_blocks.DENSE_CACHE, "get", lambda c, calls=calls: lambda *a, calls=calls: calls.append(a))
        monkeypatch.setattr(fp8_blocks, "max_clusters_for", lambda c, d: 7)
        monkeypatch.setattr(fp8_blocks, "current_device", lambda: None)
        monkeypatch.setattr(fp8_blocks, "eager_cuda", lambda t: True)  # CPU tensors stand in for CUDA ones
        views = [t.as_strided((t.shape[0], k, 1), (t.stride(0), 1, t.shape[0] * t.stride(0))) for t in (x8, y8)]
        fp8_blocks._remember_warm(recipe, x8, b, sa, sb, cfg, views)
        out = fp8_blocks.warm_call(x8, b, sa, sb)
        assert out.shape == (m, n) and out.dtype == torch.bfloat16 and len(calls) == 1
        kargs = KernelArgs(*calls[0])
        for got, want in ((kargs.a, views[0]), (kargs.b, views[1])):
            assert got.shape == want.shape and got.stride() == want.stride() and got.data_ptr() == want.data_ptr()
        for got, want in zip((kargs.sfa, kargs.sfb), fp8_blocks.column_scales(recipe, m, k, sa, sb), strict=True):
            assert got.shape == want.shape and got.stride() == want.stride() and torch.equal(got, want)
        assert kargs.out.shape == (m, n, 1) and kargs.max_clusters == 7 and kargs.alpha == 1.0
        assert fp8_blocks.warm_call(x8, b, sa.contiguous(), sb) is None
        monkeypatch.setattr(fp8_blocks, "eager_cuda", lambda t: False)  # traced: the plan is not used
        assert fp8_blocks.warm_call(x8, b, sa, sb) is None and len(calls) == 1
        fp8_blocks._WARM.clear()



@pytest.mark.parametrize("n", [256, 200, 7])
def test_warm_run_output_view(n):
    """A warm 1x128 x 1x128 call hands the kernel the output view output_view would make (shape,
    strides; 16-byte rows written in place, others padded) and returns an (M, N) bf16 result."""
    from cutegemm.blockscaled import fp8_blocks as fb
    from cutegemm.blockscaled.operands import output_view

    m, k = 128, 256
    a8 = torch.randn(m, k).to(torch.float8_e4m3fn)
    b8 = torch.randn(n, k).to(torch.float8_e4m3fn).t()
    sa, sb = torch.rand(2, m).t(), torch.rand(2, n).t()
    got = []
    w = fb._Warm()
    w.fn, w.m, w.n, w.k, w.recipe, w.device, w.device_index = (lambda *args: got.append(args)), m, n, k, fb.RECIPES[0], a8.device, None
    w.a_view, w.b_view, w.max_clusters, w.workspace = (a8.shape, a8.stride()), (b8.shape, b8.stride()), 132, None
    res = w.run(a8, b8, sa, sb)
    _, want = output_view(None, 1, m, n, torch.bfloat16, a8.device, False)
    c = got[-1][2]
    assert (c.shape, c.stride(), c.dtype) == (want.shape, want.stride(), want.dtype)
    assert res.shape == (m, n) and res.dtype == torch.bfloat16 and res.is_contiguous()
