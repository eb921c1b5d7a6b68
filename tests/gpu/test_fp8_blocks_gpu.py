"""torch._scaled_mm's 1x128 x 1x128 and 128x128 x 1x128 FP8 block recipes on sm_90a
(``cutegemm.blockscaled.fp8_blocks``: the block-scaled kernel with per-column B scales,
``GemmConfig.sfb_cols``), in torch's scale layouts (scale_a M-major or the padded (L4, M/128) view, scale_b
(N, K/128) N-major).

Reference: the block-dequantized product in float64. Our error must stay within 2x a
same-precision baseline's: torch's own ``torch._scaled_mm`` with these scales where this torch /
GPU runs it and its result is sane, else the fp32 dequantized product rounded to the output dtype
(bf16 / fp16). fp32 outputs without a torch fp32-output block GEMM: within one bf16 ulp of our
bf16 result once rounded, and within 2x torch's bf16-output error (``_check``).
Outputs go to NaN-poisoned buffers (every element written, nothing outside); hypothesis over M,
N, K (partial tiles, K not a multiple of 128) and scale magnitudes; bitwise determinism; any
operand layout (copied K-major); out views the kernel cannot write in place.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cutegemm
from cutegemm.blockscaled.fp8_blocks import RECIPES, vector_block_recipe

from ..gemm_check import assert_outside_untouched, assert_within_torch_error, poisoned_out

pytestmark = pytest.mark.gpu
F8 = torch.float8_e4m3fn
BF16 = torch.bfloat16


@pytest.fixture(autouse=True)
def _sm90():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("these FP8 block recipes are built for sm_90a")


def _case(m, n, k, lhs_block, seed=0, lo=-0.5, hi=0.5):
    """(a (M, K), b (K, N) = w.t(), scale_a, scale_b) in torch's layouts, scales log-uniform in
    [10^lo, 10^hi]."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = (torch.randn(m, k, generator=g, device="cuda") * 3).to(F8)
    w = (torch.randn(n, k, generator=g, device="cuda") * 3).to(F8)
    kb, mb = -(-k // 128), -(-m // 128)

    def draw(*shape):
        return 10.0 ** (torch.rand(*shape, generator=g, device="cuda") * (hi - lo) + lo)

    sb = draw(n, kb).t().contiguous().t()
    if lhs_block == 1:
        sa = draw(m, kb).t().contiguous().t()
    else:
        l4 = -(-kb // 4) * 4
        sa = torch.nn.functional.pad(draw(mb, kb), (0, l4 - kb), value=float("nan")).t()  # padding never read
    assert vector_block_recipe(a, w.t(), sa, sb) == RECIPES[0 if lhs_block == 1 else 1]
    return a, w.t(), sa, sb


def _torch_same_precision(a, b, sa, sb, out_dtype, ref):
    """torch._scaled_mm with these scales in ``out_dtype`` where this torch / GPU runs it and its
    result is sane, else None."""
    try:
        t = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype)
    except (RuntimeError, NotImplementedError, ValueError, TypeError):
        return None
    scale = ref.abs().max().item() or 1.0
    return t if not torch.isnan(t).any() and (t.double() - ref).abs().max().item() <= 2e-2 * scale else None


def _check(out, a, b, sa, sb, what):
    """bf16 / fp16 out: within 2x the same-precision baseline (the module docstring). fp32 out,
    where torch has no fp32-output FP8 block GEMM: the FP8 tensor core's accumulation, not the
    output rounding, sets the error there (the fp32 dequantized matmul is no same-precision
    baseline), so the fp32 result must round to our bf16 result (checked against torch above) to
    within one bf16 ulp, element by element, and stay within 2x torch's bf16-output error."""
    ref = cutegemm.gemm_ref(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float64, compute_dtype=torch.float64)
    base = _torch_same_precision(a, b, sa, sb, out.dtype, ref)
    if base is not None:
        assert_within_torch_error(out, base, ref, what=f"{what} (vs torch._scaled_mm)")
        return
    if out.dtype != torch.float32:
        base = cutegemm.gemm_ref(a, b, scale_a=sa, scale_b=sb, out_dtype=out.dtype)
        assert_within_torch_error(out, base, ref, what=f"{what} (vs fp32 dequantized matmul)")
        return
    ours16 = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out_dtype=BF16)
    _check(ours16, a, b, sa, sb, f"{what} bf16")
    rounded = out.to(BF16)
    ulp = torch.finfo(BF16).eps * torch.maximum(rounded.float().abs(), ours16.float().abs())
    bad = (rounded.float() - ours16.float()).abs() > ulp
    assert not bad.any(), f"{what}: fp32 out rounds {int(bad.sum())} elements beyond 1 bf16 ulp of our bf16 out"
    base16 = _torch_same_precision(a, b, sa, sb, BF16, ref)
    if base16 is None:
        base16 = cutegemm.gemm_ref(a, b, scale_a=sa, scale_b=sb, out_dtype=BF16)
    assert_within_torch_error(out, base16, ref, what=f"{what} fp32 out (vs torch's bf16-output error)")


@pytest.mark.parametrize("lhs_block", [1, 128])
@pytest.mark.parametrize("m,n,k", [(256, 768, 512), (384, 128, 1280), (1, 256, 4096), (4096, 1024, 1024),
                                   (130, 136, 144), (64, 7168, 2048)])  # fmt: skip
@pytest.mark.parametrize("out_dtype", [BF16, torch.float32])
def test_recipes(lhs_block, m, n, k, out_dtype):
    a, b, sa, sb = _case(m, n, k, lhs_block, seed=m + n + k)
    buf, out = poisoned_out((m, n), out_dtype)
    res = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out=out)
    assert res is out
    assert_outside_untouched(buf, m, n)
    _check(out, a, b, sa, sb, f"{RECIPES[lhs_block != 1]} {m}x{n}x{k}")
    again = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype)
    assert torch.equal(again, out), "not bitwise deterministic"


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(m=st.integers(1, 700), n8=st.integers(2, 120), k16=st.integers(9, 70), lhs=st.sampled_from([1, 128]),
       lo=st.floats(-3.0, 2.0), span=st.floats(0.0, 4.0), alpha=st.sampled_from([1.0, 0.25]))  # fmt: skip
def test_recipes_hypothesis(m, n8, k16, lhs, lo, span, alpha):
    n, k = 8 * n8, 16 * k16
    a, b, sa, sb = _case(m, n, k, lhs, seed=m * 31 + n, lo=lo, hi=min(lo + span, 3.0))
    buf, out = poisoned_out((m, n), BF16)
    cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out=out, alpha=alpha)
    assert_outside_untouched(buf, m, n)
    _check(out / alpha, a, b, sa, sb, "hypothesis")


def test_layouts_and_out_views():
    """A column-major a, a row-major b, misaligned out views: copied / staged, the same bits."""
    m, n, k = 200, 264, 640
    a, b, sa, sb = _case(m, n, k, 1, seed=3)
    want = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
    a_cm = a.t().contiguous().t()
    b_rm = b.contiguous()
    assert torch.equal(cutegemm.gemm(a_cm, b_rm, scale_a=sa.contiguous(), scale_b=sb.contiguous()), want)
    big = torch.full((m, n + 3), float("nan"), dtype=BF16, device="cuda")
    view = big[:, 1:n + 1]  # a 2-byte offset: not 16-byte aligned
    cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out=view)
    assert torch.equal(view, want)
    assert torch.isnan(big[:, 0]).all() and torch.isnan(big[:, n + 1:]).all()


def test_bad_inputs():
    a, b, sa, sb = _case(128, 256, 384, 1)
    with pytest.raises(ValueError, match="supports only"):
        cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, bias=torch.ones(256, device="cuda"))
    with pytest.raises(TypeError, match="float32"):
        cutegemm.gemm(a, b, scale_a=sa.half(), scale_b=sb)
    with pytest.raises(ValueError, match="block scaling"):
        cutegemm.gemm(a, b, scale_a=sa[:, :2], scale_b=sb)


@pytest.mark.parametrize("warm", [False, True])
def test_cuda_graph_replays_new_scales(warm):
    """Captured cold (the scale builders: no host copy inside the capture) or warm (the cached
    gather index), the graph replays with new scale values written into the same tensors and
    matches eager calls bit for bit."""
    m, n, k = 192 + warm, 264, 640
    a, b, sa, sb = _case(m, n, k, 1, seed=11 + warm)
    # eager first: the kernel loaded; warm: this key's gather index too, cold: another layout's
    cutegemm.gemm(a, b, scale_a=sa if warm else sa.contiguous(), scale_b=sb)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            out = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
    for seed in (5, 6):
        _, _, sa2, sb2 = _case(m, n, k, 1, seed=seed)
        sa.copy_(sa2)
        sb.copy_(sb2)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, cutegemm.gemm(a, b, scale_a=sa, scale_b=sb))


@pytest.mark.parametrize("lhs_block", [1, 128])
@pytest.mark.parametrize("m,n,k", [(256, 768, 512), (130, 136, 144), (1, 256, 4096), (77, 200, 1296)])
def test_warm_bare_calls_equal_the_cold_path(lhs_block, m, n, k):
    """gemm(a, b, scale_a=, scale_b=) with no other option: the first call records a warm plan,
    later ones launch from it (new scale values, same tensors' layouts) and match the cold path
    (an explicit out_dtype) bit for bit."""
    a, b, sa, sb = _case(m, n, k, lhs_block, seed=m + k)
    first = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
    for seed in (1, 2):
        _, _, sa2, sb2 = _case(m, n, k, lhs_block, seed=seed)
        sa.copy_(sa2)
        sb.copy_(sb2)
        warm = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
        cold = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out_dtype=BF16)
        assert warm.shape == (m, n) and warm.is_contiguous() and torch.equal(warm, cold)
    assert not torch.equal(first, warm)


def test_default_is_the_column_kernel_and_a_forced_emulation_agrees(monkeypatch):
    """A call without a config runs the block-scaled kernel with per-column B scales
    (config.sfb_cols); a forced MXFP8-emulation config (fp8_mx) still runs; both within 2x the
    same-precision baseline, into NaN-poisoned outputs."""
    from cutegemm.blockscaled import fp8_blocks
    from cutegemm.blockscaled.mx_sm90 import emulation_config

    seen = []
    get = fp8_blocks.DENSE_CACHE.get
    monkeypatch.setattr(fp8_blocks.DENSE_CACHE, "get", lambda cfg: seen.append(cfg) or get(cfg))
    m, n, k = 300, 264, 1040
    for lhs in (1, 128):
        a, b, sa, sb = _case(m, n, k, lhs, seed=5)
        for config in (None, emulation_config(m, n, k, BF16, 1.0, None)):
            buf, out = poisoned_out((m, n), BF16)
            assert cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out=out, config=config) is out
            assert_outside_untouched(buf, m, n)
            _check(out, a, b, sa, sb, f"{'default' if config is None else 'emulation'} lhs {lhs}")
            assert seen[-1].sfb_cols == (config is None) and seen[-1].fp8_mx == (config is not None)
