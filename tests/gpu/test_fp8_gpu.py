"""Dense FP8 (e4m3) GEMM with fp32 per-row / per-column / per-tensor scales (sm_90a WGMMA; the
arch-generic tests run on sm_100a too: tcgen05 into the fp32 TMEM accumulator, no promotion).

Against a float64 reference of the dequantized product: our error must stay within 2x torch's
own error at the same precision (torch._scaled_mm, fp32 accumulation, bf16 output); outputs in
NaN-poisoned buffers; random data; hypothesis over shapes and scale kinds.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cutegemm
from cutegemm.config import GemmConfig, GemmProblem
from cutegemm.epilogue import EpilogueSpec
from cutegemm.policy import policy_for

from ..gemm_check import assert_outside_untouched, assert_within_torch_error, poisoned_out

pytestmark = pytest.mark.gpu
F8 = torch.float8_e4m3fn
BF16 = torch.bfloat16


def _sm90():
    return torch.cuda.get_device_capability()[0] == 9


def _fp8_gpu():
    """FP8 row-wise runs here: sm_90a (WGMMA, promoted) or sm_100a (tcgen05, TMEM accumulator)."""
    return torch.cuda.get_device_capability()[0] in (9, 10)


def _operands(m, n, k, seed=0, a_dtype=F8, b_dtype=F8):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = (torch.randn(m, k, generator=g, device="cuda") * 3).to(a_dtype)
    w = (torch.randn(n, k, generator=g, device="cuda") * 3).to(b_dtype)  # (N, K) weight: b = w.t()
    return a, w.t()


def _scales(kind, m, n, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    if kind == "row":
        return torch.rand(m, 1, generator=g, device="cuda") + 0.1, torch.rand(1, n, generator=g, device="cuda") + 0.1
    if kind == "tensor":
        return torch.tensor(0.37, device="cuda"), torch.tensor(1.9, device="cuda")
    return None, None


def _reference(a, b, sa, sb):
    acc = a.double() @ b.double()
    if sa is not None:
        acc = acc * sa.double().reshape(-1, 1) if sa.numel() > 1 else acc * sa.double()
    if sb is not None:
        acc = acc * sb.double().reshape(1, -1) if sb.numel() > 1 else acc * sb.double()
    return acc


def _torch_same_precision(a, b, sa, sb):
    """torch._scaled_mm (needs K and N multiples of 16), else fp32 matmul of the same values,
    scaled in fp32 and rounded to bf16 (what an fp32-accumulating FP8 kernel can reach)."""
    if a.shape[1] % 16 or b.shape[1] % 16:
        acc = a.float() @ b.float()
        if sa is not None:
            acc = acc * (sa.reshape(-1, 1) if sa.numel() > 1 else sa)
        if sb is not None:
            acc = acc * (sb.reshape(1, -1) if sb.numel() > 1 else sb)
        return acc.to(BF16)
    one = torch.tensor(1.0, device="cuda")
    if sa is not None and sa.numel() > 1:
        return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=BF16)
    return torch._scaled_mm(a, b, scale_a=one if sa is None else sa, scale_b=one if sb is None else sb, out_dtype=BF16)


@pytest.mark.parametrize("kind", ["row", "tensor", "none"])
@pytest.mark.parametrize("m,n,k", [(512, 384, 256), (333, 200, 528), (1, 256, 4096), (4096, 1024, 1024)])
def test_fp8_scaled(kind, m, n, k):
    if not _fp8_gpu():
        pytest.skip("FP8 row-wise runs on sm_90a / sm_100a")
    a, b = _operands(m, n, k, seed=m + n + k)
    sa, sb = _scales(kind, m, n)
    buf, out = poisoned_out((m, n), BF16)
    cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out=out)
    assert_outside_untouched(buf, m, n)
    assert_within_torch_error(out, _torch_same_precision(a, b, sa, sb), _reference(a, b, sa, sb), what=f"fp8 {kind}")


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    m=st.integers(1, 1100),
    n8=st.integers(1, 140),
    k16=st.integers(1, 80),
    kind=st.sampled_from(["row", "tensor"]),
)
def test_fp8_hypothesis(m, n8, k16, kind):
    if not _fp8_gpu():
        pytest.skip("FP8 row-wise runs on sm_90a / sm_100a")
    n, k = 8 * n8, 16 * k16
    a, b = _operands(m, n, k, seed=m * 31 + n)
    sa, sb = _scales(kind, m, n, seed=k)
    out = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
    assert out.dtype == BF16 and out.shape == (m, n)
    assert_within_torch_error(out, _torch_same_precision(a, b, sa, sb), _reference(a, b, sa, sb), what="fp8 hyp")


def test_fp8_epilogue_bias_silu_and_fp32_out():
    if not _fp8_gpu():
        pytest.skip("FP8 row-wise runs on sm_90a / sm_100a")
    m, n, k = 300, 520, 512
    a, b = _operands(m, n, k, seed=7)
    sa, sb = _scales("row", m, n)
    bias = torch.randn(n, device="cuda").to(BF16)
    out = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, bias=bias, activation="silu", out_dtype=torch.float32)
    ref = torch.nn.functional.silu(_reference(a, b, sa, sb) + bias.double())
    tsame = torch.nn.functional.silu(_torch_same_precision(a, b, sa, sb).float() + bias.float())
    assert_within_torch_error(out, tsame, ref, what="fp8 bias silu")


def test_fp8_row_major_b_is_copied_and_swiglu_mxfp8():
    if not _fp8_gpu():
        pytest.skip("FP8 row-wise runs on sm_90a / sm_100a")
    m, n, k = 256, 512, 256
    a, b = _operands(m, n, k, seed=9)
    sa, sb = _scales("row", m, n)
    out_rm = cutegemm.gemm(a, b.contiguous(), scale_a=sa, scale_b=sb)
    out_km = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
    assert torch.equal(out_rm, out_km)
    q = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, activation="swiglu", out_dtype="mxfp8")
    from cutegemm.blockscaled import quantize_ref

    from .test_quant_epilogue_gpu import check_quantized

    # The FP8 GEMM's own error (checked against fp64 by the tests above) exceeds an e4m3 step for
    # small outputs of a block, so the quantized epilogue is checked against quantize_ref of the
    # same accumulation's fp32 output: 128-K partial sums, as the quantized output has them (an
    # fp32 output otherwise gets promote_k 32, policy.fp32_promotion).
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    arch = "sm_90a" if _sm90() else "sm_100a"
    cfg = policy_for(arch, sms).choose_dense(GemmProblem(m, n, k, 1, "e4m3", "e4m3", "fp32", "k", "k"), promote_k=0)
    y32 = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, activation="swiglu", out_dtype=torch.float32, config=cfg)
    check_quantized(q, quantize_ref(y32, "mxfp8"), "mxfp8")


def test_fp8_bad_inputs_and_determinism():
    if not _fp8_gpu():
        pytest.skip("FP8 row-wise runs on sm_90a / sm_100a")
    a, b = _operands(128, 128, 128)
    with pytest.raises(TypeError, match="float32"):
        cutegemm.gemm(a, b, scale_a=torch.ones(128, 1, device="cuda", dtype=BF16))
    with pytest.raises(ValueError, match="1 or 128"):
        cutegemm.gemm(a, b, scale_a=torch.ones(64, device="cuda"))
    with pytest.raises(ValueError, match="float8"):
        cutegemm.gemm(a.to(BF16), b.to(BF16), scale_a=torch.ones(1, device="cuda"))
    with pytest.raises(TypeError):
        cutegemm.gemm(a, b.to(BF16))
    sa, sb = _scales("row", 128, 128)
    x = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
    for _ in range(3):
        assert torch.equal(x, cutegemm.gemm(a, b, scale_a=sa, scale_b=sb))


@pytest.mark.parametrize("m,n,k", [(1024, 1024, 8192), (300, 256, 2048)])
def test_fp8_fast_accum_matches_torch_fast_accum_error(m, n, k):
    """fast_accum=True (no promotion) against torch._scaled_mm(use_fast_accum=True); the default
    (promoted) stays within 2x torch's default even at K = 8192."""
    if not _sm90():
        pytest.skip("an sm_90a FP8 option (promotion, fast accumulation, warpgroup order)")
    a, b = _operands(m, n, k, seed=k)
    sa, sb = _scales("row", m, n)
    ref = _reference(a, b, sa, sb)
    fast = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, fast_accum=True)
    tfast = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=BF16, use_fast_accum=True)
    assert_within_torch_error(fast, tfast, ref, what="fp8 fast accum")
    promoted = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
    assert_within_torch_error(promoted, _torch_same_precision(a, b, sa, sb), ref, what="fp8 promoted")


@pytest.mark.parametrize("m,n,k", [(1000, 520, 2048), (256, 384, 128), (129, 200, 4096)])
def test_fp8_wg_order_is_bitwise_equal(m, n, k):
    """config.wg_order (the consumer warpgroups take turns per K tile) changes the issue order
    only: bitwise equal to the same tile without it, and within torch's error."""
    if not _sm90():
        pytest.skip("an sm_90a FP8 option (promotion, fast accumulation, warpgroup order)")
    a, b = _operands(m, n, k, seed=m + k)
    sa, sb = _scales("row", m, n, seed=n)
    cfg = GemmConfig(arch="sm_90a", a_dtype="e4m3", b_dtype="e4m3", a_major="k", b_major="k", tile_m=128,
                     tile_n=192, cluster_m=2, epilogue=EpilogueSpec(scale_a=True, scale_b=True))  # fmt: skip
    buf, out = poisoned_out((m, n), BF16)
    cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out=out, config=replace(cfg, wg_order=True))
    assert_outside_untouched(buf, m, n)
    plain = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, config=cfg)
    assert torch.equal(out, plain)
    assert_within_torch_error(out, _torch_same_precision(a, b, sa, sb), _reference(a, b, sa, sb), what="fp8 wg_order")


@pytest.mark.parametrize("m,n,k", [(128, 256, 512), (1000, 520, 2048), (129, 200, 4096), (16, 2048, 7168)])
def test_fp8_fp32_out_promote_k(m, n, k):
    """FP8 row-wise into an fp32 output: the policy promotes every 32 K (config.promote_k, the MX
    mainloop's per-column-half WGMMAs), bitwise equal to the explicit promote_k=32 config; 32 and
    64 K partial sums put no more elements beyond torch's element tolerance (2e-3 abs and rel, its
    test_scaled_mm_vs_emulated_row_wise) than 128 K ones and have a smaller mean error; all within
    2x torch._scaled_mm's fp32-output error; nothing written outside the output."""
    if not _sm90():
        pytest.skip("an sm_90a FP8 option (promotion, fast accumulation, warpgroup order)")
    g = torch.Generator(device="cuda").manual_seed(m + n)
    x, y = torch.randn(m, k, generator=g, device="cuda"), torch.randn(n, k, generator=g, device="cuda")
    xs = 448.0 / x.abs().amax(dim=1, keepdim=True)
    ys = 448.0 / y.abs().amax(dim=1, keepdim=True).t()
    a, b = (x * xs).to(F8), (y.t() * ys).to(F8)
    sa, sb = xs.reciprocal(), ys.reciprocal()
    ref = _reference(a, b, sa, sb)
    problem = GemmProblem(m, n, k, 1, "e4m3", "e4m3", "fp32", "k", "k")
    chosen = policy_for("sm_90a", torch.cuda.get_device_properties(0).multi_processor_count).choose_dense(
        problem, epilogue=cutegemm.EpilogueSpec(scale_a=True, scale_b=True))  # fmt: skip
    assert chosen.promote_k == 32, chosen
    buf, out = poisoned_out((m, n), torch.float32)
    cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out=out)
    assert_outside_untouched(buf, m, n)
    outs = {pk: cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float32,
                              config=replace(chosen, promote_k=pk)) for pk in (32, 64, 0)}  # fmt: skip
    assert torch.equal(out, outs[32])

    def beyond(o):
        d = (o.double() - ref).abs()
        return int((d > 2e-3 + 2e-3 * ref.abs()).sum()), float(d.mean())

    (far32, err32), (far64, err64), (far128, err128) = beyond(outs[32]), beyond(outs[64]), beyond(outs[0])
    assert far32 <= far128 and far64 <= far128, (far32, far64, far128)
    assert err32 < err128 and err64 < err128, (err32, err64, err128)
    pad = -n % 16  # torch._scaled_mm takes N % 16 == 0 only: its baseline on zero-padded columns
    bp = torch.nn.functional.pad(b.t().view(torch.uint8), (0, 0, 0, pad)).view(F8).t()
    sbp = torch.nn.functional.pad(sb, (0, pad), value=1.0)
    tfp32 = torch._scaled_mm(a, bp, scale_a=sa, scale_b=sbp, out_dtype=torch.float32)[:, :n]
    assert_within_torch_error(out, tfp32, ref, what="fp8 fp32 out promote_k 32")


@pytest.mark.parametrize("tile_n,bias", [(192, False), (128, True)])
def test_fp8_pairs_along_n_over_odd_m_tiles(tile_n, bias):
    """The wave model's 1x2 clusters over an odd count of M tiles (policy.odd_m_pairs_n): 300 rows
    (3 M tiles, the last partial) and 1000 columns (an odd count of 192-column tiles: the pair
    pads one), with bias and silu in the epilogue on 128x128; bitwise equal to the 2x1 cluster,
    nothing written outside the output, within torch's error."""
    if not _sm90():
        pytest.skip("the wave model's clusters are sm_90a picks")
    m, n, k = 300, 1000, 1024
    a, b = _operands(m, n, k, seed=11)
    sa, sb = _scales("row", m, n, seed=3)
    bias_t = torch.randn(n, device="cuda").to(BF16) if bias else None
    epi = EpilogueSpec(scale_a=True, scale_b=True)
    if bias:
        epi = EpilogueSpec(scale_a=True, scale_b=True, bias=True, bias_dtype="bf16", activation="silu")
    cfg = GemmConfig(arch="sm_90a", a_dtype="e4m3", b_dtype="e4m3", a_major="k", b_major="k", tile_m=128,
                     tile_n=tile_n, cluster_n=2, raster="m", epilogue=epi)  # fmt: skip
    kw = dict(scale_a=sa, scale_b=sb, bias=bias_t, activation="silu" if bias else None)
    buf, out = poisoned_out((m, n), BF16)
    cutegemm.gemm(a, b, out=out, config=cfg, **kw)
    assert_outside_untouched(buf, m, n)
    assert torch.equal(out, cutegemm.gemm(a, b, config=replace(cfg, cluster_n=1, cluster_m=2, raster="n"), **kw))
    ref, tsame = _reference(a, b, sa, sb), _torch_same_precision(a, b, sa, sb).float()
    if bias:
        ref, tsame = torch.nn.functional.silu(ref + bias_t.double()), torch.nn.functional.silu(tsame + bias_t.float())
    assert_within_torch_error(out, tsame.to(BF16), ref, what=f"fp8 1x2 {tile_n}")
