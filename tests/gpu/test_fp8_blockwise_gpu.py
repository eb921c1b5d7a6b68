"""DeepSeek-style FP8 block scaling on sm_90a: e4m3 A (M, K) with fp32 scale_a (M, ceil(K/128))
(1x128 blocks), e4m3 B (K, N) = w.t() with fp32 scale_b (ceil(K/128), ceil(N/128)) (128x128
blocks), torch._scaled_mm's shapes.

Reference: the dequantized product in float64 (``gemm_ref(..., compute_dtype=float64)``, itself
checked against a float64 loop over K blocks in test_fp8_blockwise_cpu.py). Our error must stay
within 2x the error of a same-precision baseline: torch's own blockwise ``torch._scaled_mm``
(cuBLAS, sm_90 with CUDA >= 12.9) when this torch runs it and its result is sane, else the
dequantized product in fp32 rounded to bf16 (what an fp32-accumulating kernel can reach; the
tensor core's FP8 accumulation within one 128-wide K block is why 2x, not 1x, is the bar, as in
test_fp8_gpu.py). Outputs go to NaN-poisoned buffers (every element written, nothing outside);
hypothesis over M, N, K (K not a multiple of 128, partial M/N tiles) and scale magnitudes
(1e-3..1e3); zero blocks.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cutegemm
from cutegemm.config import Form

from ..gemm_check import assert_outside_untouched, assert_within_torch_error, poisoned_out
from .test_quant_epilogue_gpu import check_quantized

pytestmark = pytest.mark.gpu
F8 = torch.float8_e4m3fn
BF16 = torch.bfloat16


def _sm90():
    return torch.cuda.get_device_capability()[0] == 9


def _skip_unless_sm90():
    if not _sm90():
        pytest.skip("FP8 block scaling is an sm_90a kernel")


def _operands(m, n, k, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = (torch.randn(m, k, generator=g, device="cuda") * 3).to(F8)
    w = (torch.randn(n, k, generator=g, device="cuda") * 3).to(F8)  # (N, K) weight: b = w.t()
    return a, w.t()


def _scales(m, n, k, seed=0, log10_lo=-0.3, log10_hi=0.3):
    """scale_a (M, KB), scale_b (KB, NB) log-uniform in [10^lo, 10^hi]."""
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    kb, nb = math.ceil(k / 128), math.ceil(n / 128)

    def draw(*shape):
        return 10.0 ** (torch.rand(*shape, generator=g, device="cuda") * (log10_hi - log10_lo) + log10_lo)

    return draw(m, kb), draw(kb, nb)


def _reference(a, b, sa, sb):
    return cutegemm.gemm_ref(
        a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float64, compute_dtype=torch.float64
    )


def _torch_blockwise(a, b, sa, sb):
    """torch._scaled_mm with (BlockWise1x128, BlockWise128x128) scales in the layouts torch's own
    tests use (scale_a M-major, scale_b the .t() of an (NB, KB) tensor); None when this torch /
    GPU does not run it."""
    try:
        return torch._scaled_mm(
            a, b, scale_a=sa.t().contiguous().t(), scale_b=sb.t().contiguous().t(), out_dtype=BF16
        )
    except (RuntimeError, NotImplementedError, ValueError, TypeError):
        return None


def _baseline(a, b, sa, sb, ref):
    """The same-precision baseline (see the module docstring) and its name."""
    t = _torch_blockwise(a, b, sa, sb)
    scale = ref.abs().max().item() or 1.0
    if t is not None and not torch.isnan(t).any() and (t.double() - ref).abs().max().item() <= 2e-2 * scale:
        return t, "torch blockwise _scaled_mm"
    return cutegemm.gemm_ref(a, b, scale_a=sa, scale_b=sb), "fp32 dequantized matmul -> bf16"


def _check(out, a, b, sa, sb, what):
    ref = _reference(a, b, sa, sb)
    base, name = _baseline(a, b, sa, sb, ref)
    assert_within_torch_error(out, base, ref, what=f"{what} (vs {name})")


@pytest.mark.parametrize(
    "m,n,k",
    [
        (512, 384, 256),
        (333, 200, 528),
        (1, 256, 4096),
        (4096, 1024, 1024),
        (256, 7168, 2048),
        (130, 136, 144),
    ],
)
def test_blockwise(m, n, k):
    _skip_unless_sm90()
    a, b = _operands(m, n, k, seed=m + n + k)
    sa, sb = _scales(m, n, k, seed=k)
    buf, out = poisoned_out((m, n), BF16)
    res = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out=out)
    assert res is out
    assert_outside_untouched(buf, m, n)
    _check(out, a, b, sa, sb, f"fp8 blockwise {m}x{n}x{k}")


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    m=st.integers(1, 1100),
    n8=st.integers(1, 140),
    k16=st.integers(1, 80),
    lo=st.floats(-3.0, 3.0),
    span=st.floats(0.0, 6.0),
)
def test_blockwise_hypothesis(m, n8, k16, lo, span):
    """Shapes with partial M / N tiles and K not a multiple of 128 (the last K block partial);
    scales log-uniform over up to 6 decades within 1e-3..1e3."""
    _skip_unless_sm90()
    n, k = 8 * n8, 16 * k16
    hi = min(lo + span, 3.0)
    a, b = _operands(m, n, k, seed=m * 31 + n)
    sa, sb = _scales(m, n, k, seed=k, log10_lo=lo, log10_hi=hi)
    buf, out = poisoned_out((m, n), BF16)
    cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out=out)
    assert_outside_untouched(buf, m, n)
    _check(out, a, b, sa, sb, "fp8 blockwise hyp")


def test_blockwise_zero_blocks():
    """Zero data blocks and zero scale blocks: exactly their contributions vanish (and a row /
    column of blocks that is all zero gives exact zeros)."""
    _skip_unless_sm90()
    m, n, k = 384, 512, 640
    a, b = _operands(m, n, k, seed=5)
    sa, sb = _scales(m, n, k, seed=5)
    a = a.float()
    a[:128, 128:256] = 0  # a zero 1x128 data block run (rows 0..127, K block 1)
    a = a.to(F8)  # (e4m3 -> fp32 -> e4m3 is exact)
    sb[2, 1] = 0.0  # a zero 128x128 scale block (K block 2, N block 1)
    sa[200:260, :] = 0.0  # rows with all-zero scales -> exact zero rows
    sb[:, 3] = 0.0  # N block 3: all-zero scales -> exact zero columns 384..511
    buf, out = poisoned_out((m, n), BF16)
    cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out=out)
    assert_outside_untouched(buf, m, n)
    assert (out[200:260] == 0).all()
    assert (out[:, 384:] == 0).all()
    _check(out, a, b, sa, sb, "fp8 blockwise zero blocks")


def test_blockwise_scale_layouts_and_determinism():
    """Any layout of the scales gives the same bits: scale_a row-major (copied M-major), torch's
    M-major (TMA-loaded in place), M-major inside a wider buffer (in place), a misaligned view and
    an M of rows % 4 != 0 (both copied to a padded M-major buffer); scale_b as the .t() of an
    (NB, KB) weight-scale tensor or row-major (copied K-contiguous). Repeated calls agree."""
    _skip_unless_sm90()
    for m in (640, 641, 130):
        n, k = 768, 1152
        a, b = _operands(m, n, k, seed=11)
        sa, sb = _scales(m, n, k, seed=11)
        kb = sa.shape[1]
        x = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
        _check(x, a, b, sa, sb, f"fp8 blockwise m={m}")
        wide = torch.full((kb, m + 12), float("nan"), device="cuda")
        wide[:, :m] = sa.t()
        odd = torch.empty(m * kb + 1, device="cuda")[1:].view(kb, m).t()  # data_ptr % 16 == 4
        odd.copy_(sa)
        for sa2, sb2 in ((sa.t().contiguous().t(), sb.t().contiguous().t()), (wide.t()[:m], sb), (odd, sb)):
            assert torch.equal(x, cutegemm.gemm(a, b, scale_a=sa2, scale_b=sb2)), (m, sa2.stride())
        for _ in range(3):
            assert torch.equal(x, cutegemm.gemm(a, b, scale_a=sa, scale_b=sb))
    # row-major b (copied to K-major first) gives the same result
    assert torch.equal(x, cutegemm.gemm(a, b.contiguous(), scale_a=sa, scale_b=sb))


@pytest.mark.parametrize(
    "override",
    [
        dict(tile_m=128, tile_n=64, raster="n", group=1),
        dict(tile_m=64, tile_n=128, pingpong=True),
        dict(tile_m=128, tile_n=128),
        dict(tile_m=128, tile_n=128, cluster_m=2, wg_order=True),
        dict(tile_m=128, tile_n=192, cluster_m=2, raster="n", group=8),
        dict(tile_m=128, tile_n=192, cluster_m=2, wg_order=True),
        dict(tile_m=64, tile_n=64, pingpong=True, raster="n", group=1),
        dict(tile_m=64, tile_n=64, raster="n", group=1),  # the decode policy: one warpgroup
        dict(tile_m=64, tile_n=128, raster="n", group=1),
    ],
)
def test_blockwise_forced_tiles(override):
    """The other tiles of the support matrix (tile_n 64 splits a scale block over two tiles;
    pingpong 64-row tiles)."""
    _skip_unless_sm90()
    from cutegemm.config import GemmConfig

    m, n, k = 300, 520, 700 - 700 % 16
    a, b = _operands(m, n, k, seed=13)
    sa, sb = _scales(m, n, k, seed=13, log10_lo=-2, log10_hi=2)
    cfg = GemmConfig(
        arch="sm_90a",
        a_dtype="e4m3",
        b_dtype="e4m3",
        a_major="k",
        b_major="k",
        fp8_blockwise=True,
        **override,
    )
    buf, out = poisoned_out((m, n), BF16)
    cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out=out, config=cfg)
    assert_outside_untouched(buf, m, n)
    _check(out, a, b, sa, sb, f"fp8 blockwise {cfg.name}")


@pytest.mark.parametrize("n", [64, 200, 256, 400, 520, 1000])
def test_blockwise_192_wide_tiles_straddle_scale_blocks(n):
    """A 192-wide tile covers two 128-column scale blocks of B, split 128 or 64 columns in by
    its position; at N's end the second block may not exist (clamped, columns never stored).
    Scales over 4 decades per block, so a column scaled by its neighbour block is caught."""
    _skip_unless_sm90()
    from cutegemm.config import GemmConfig

    m, k = 192, 512
    a, b = _operands(m, n, k, seed=n)
    sa, sb = _scales(m, n, k, seed=n, log10_lo=-2, log10_hi=2)
    cfg = GemmConfig(arch="sm_90a", a_dtype="e4m3", b_dtype="e4m3", a_major="k", b_major="k", fp8_blockwise=True,
                     tile_m=128, tile_n=192, cluster_m=2, wg_order=True)  # fmt: skip
    buf, out = poisoned_out((m, n), BF16)
    cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out=out, config=cfg)
    assert_outside_untouched(buf, m, n)
    _check(out, a, b, sa, sb, f"fp8 blockwise 128x192 n={n}")


def test_blockwise_epilogue_bias_silu_fp32_out():
    _skip_unless_sm90()
    m, n, k = 300, 520, 512
    a, b = _operands(m, n, k, seed=7)
    sa, sb = _scales(m, n, k, seed=7)
    bias = torch.randn(n, device="cuda").to(BF16)
    out = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, bias=bias, activation="silu", out_dtype=torch.float32)
    assert out.dtype == torch.float32
    ref = torch.nn.functional.silu(_reference(a, b, sa, sb) + bias.double())
    # Same precision: torch's blockwise product (FP8 tensor-core accumulation inside each 128-wide
    # K block, as ours), then the epilogue in fp32; an fp32 dequantized matmul would not see the
    # tensor core's reduced-precision accumulation and is no same-precision baseline.
    try:
        prod = torch._scaled_mm(a, b, scale_a=sa.t().contiguous().t(), scale_b=sb.t().contiguous().t(),
                                out_dtype=torch.float32)  # fmt: skip
    except (RuntimeError, NotImplementedError, ValueError, TypeError):
        prod = _baseline(a, b, sa, sb, _reference(a, b, sa, sb))[0].float()
    same = torch.nn.functional.silu(prod + bias.float())
    assert_within_torch_error(out, same, ref, atol=1e-4, what="fp8 blockwise bias silu")


def test_blockwise_long_k_vs_torch():
    """K = 8192 (64 promoted K tiles)."""
    _skip_unless_sm90()
    m, n, k = 1024, 1024, 8192
    a, b = _operands(m, n, k, seed=17)
    sa, sb = _scales(m, n, k, seed=17)
    _check(cutegemm.gemm(a, b, scale_a=sa, scale_b=sb), a, b, sa, sb, "fp8 blockwise long K")


def test_blockwise_bad_inputs():
    _skip_unless_sm90()
    a, b = _operands(256, 384, 256)
    sa, sb = _scales(256, 384, 256)
    with pytest.raises(ValueError, match="pass scale_b.t"):
        cutegemm.gemm(a, b, scale_a=sa, scale_b=sb.t().contiguous())
    with pytest.raises(ValueError, match="fast_accum must be False"):
        cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, fast_accum=True)
    with pytest.raises(ValueError, match="must be on"):
        cutegemm.gemm(a, b, scale_a=sa.cpu(), scale_b=sb)


@pytest.mark.parametrize("m,n,k", [(64, 128, 200), (130, 200, 333)])
def test_blockwise_k_not_a_multiple_of_16(m, n, k):
    """K % 16 != 0 (rows TMA cannot address): the aligned staging route, not an error."""
    _skip_unless_sm90()
    a, b = _operands(m, n, k, seed=k)
    sa, sb = _scales(m, n, k, seed=m)
    buf, out = poisoned_out((m, n), BF16)
    cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out=out)
    assert_outside_untouched(buf, m, n)
    _check(out, a, b, sa, sb, f"fp8 blockwise {m}x{n}x{k}")


# ---- grouped (MoE packed form): scale_a (total_M, KB) per token row, scale_b (E, KB, NB) per expert
def _grouped_operands(counts, n, k, seed=0, pad_rows=5, log10_lo=-0.3, log10_hi=0.3):
    """a (total + pad, K), b = w.transpose(1, 2) of an (E, N, K) weight, offs, scale_a, scale_b
    (E, KB, NB) given as the .transpose(1, 2) of the weight's (E, NB, KB) scales."""
    E = len(counts)
    total = sum(counts) + pad_rows  # rows past offs[-1] belong to no expert
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = (torch.randn(total, k, generator=g, device="cuda") * 3).to(F8)
    w = (torch.randn(E, n, k, generator=g, device="cuda") * 3).to(F8)
    kb, nb = math.ceil(k / 128), math.ceil(n / 128)

    def draw(*shape):
        return 10.0 ** (torch.rand(*shape, generator=g, device="cuda") * (log10_hi - log10_lo) + log10_lo)

    offs = torch.tensor(counts, dtype=torch.int32, device="cuda").cumsum(0, dtype=torch.int32)
    return a, w.transpose(1, 2), offs, draw(total, kb), draw(E, nb, kb).transpose(1, 2)


def _grouped_check(out, a, b, offs, sa, sb, what, pad_rows):
    """Every expert's rows within 2x the same-precision baseline (torch's blockwise _scaled_mm per
    expert, or the fp32 dequantized product), rows past offs[-1] untouched (NaN)."""
    from cutegemm import grouped_gemm_ref

    end = out.shape[0] - pad_rows
    assert torch.isnan(out[end:]).all(), f"{what}: rows past offs[-1] were written"
    ref = grouped_gemm_ref(a, b, offs=offs, scale_a=sa, scale_b=sb, out_dtype=torch.float64,
                           compute_dtype=torch.float64)  # fmt: skip
    bounds = [0, *offs.tolist()]
    base = torch.empty(end, b.shape[2], dtype=BF16, device="cuda")
    names = set()
    for e in range(b.shape[0]):
        s, t = bounds[e], bounds[e + 1]
        if t > s:
            base[s:t], name = _baseline(a[s:t], b[e], sa[s:t], sb[e], ref[s:t])
            names.add(name)
    if end:
        assert_within_torch_error(out[:end], base, ref[:end], what=f"{what} (vs {', '.join(sorted(names))})")


def _run_grouped(counts, n, k, seed=0, pad_rows=5, config=None, **scale_range):
    _skip_unless_sm90()
    from cutegemm import grouped_gemm

    a, b, offs, sa, sb = _grouped_operands(counts, n, k, seed, pad_rows, **scale_range)
    out = torch.full((a.shape[0], n), float("nan"), dtype=BF16, device="cuda")
    res = grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb, out=out, config=config)
    assert res is out
    _grouped_check(out, a, b, offs, sa, sb, f"grouped fp8 blockwise {counts} n={n} k={k}", pad_rows)
    return a, b, offs, sa, sb, out


@pytest.mark.parametrize(
    "counts",
    [[0, 0, 0], [700], [0, 700, 0], [3, 1, 2], [129, 127, 128, 1, 0, 255], [16] * 32, [300, 0, 45]],
    ids=["all-empty", "one", "one-of-three", "tiny", "ragged", "decode", "mixed"],
)
def test_grouped_blockwise_edge_cases(counts):
    _run_grouped(counts, 384, 640, seed=len(counts))


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    counts=st.lists(st.one_of(st.just(0), st.integers(1, 300)), min_size=1, max_size=10),
    n16=st.integers(1, 40),
    k16=st.integers(1, 50),
    lo=st.floats(-3.0, 3.0),
    span=st.floats(0.0, 6.0),
)
def test_grouped_blockwise_hypothesis(counts, n16, k16, lo, span):
    """Ragged experts (incl. empty ones), N with partial 128-column scale blocks, K not a multiple
    of 128; scales over up to 6 decades."""
    _run_grouped(counts, 16 * n16, 16 * k16, seed=sum(counts) + n16, log10_lo=lo, log10_hi=min(lo + span, 3.0))


@pytest.mark.parametrize(
    "override",
    [
        dict(tile_m=128, tile_n=128, cluster_n=2),
        dict(tile_m=64, tile_n=128, cluster_n=2),
        dict(tile_m=128, tile_n=64),
        dict(tile_m=128, tile_n=128, scheduler="dynamic"),
        dict(tile_m=128, tile_n=128, cluster_m=2),
        dict(tile_m=128, tile_n=128, cluster_n=2, wg_order=True),
        dict(tile_m=128, tile_n=192, cluster_n=2),
        dict(tile_m=128, tile_n=192, cluster_n=2, wg_order=True, scheduler="dynamic"),
    ],
)
def test_grouped_blockwise_forced_tiles(override):
    from cutegemm.config import GemmConfig

    cfg = GemmConfig(arch="sm_90a", a_dtype="e4m3", b_dtype="e4m3", b_major="k", form=Form.GROUPED,
                     fp8_blockwise=True, **override)  # fmt: skip
    _run_grouped([200, 0, 77, 130, 1], 520, 700 - 700 % 16, seed=3, config=cfg, log10_lo=-2, log10_hi=2)


def test_grouped_blockwise_cuda_graph_replay():
    """Captured once, replayed with 20 different offs contents: each replay equals an eager call
    with the same offs, bit for bit."""
    _skip_unless_sm90()
    from cutegemm import grouped_gemm

    E, n, k, total = 8, 384, 512, 600
    a, b, offs, sa, sb = _grouped_operands([total // E] * E, n, k, seed=21, pad_rows=0)
    out = torch.empty(total, n, dtype=BF16, device="cuda")
    grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb, out=out)  # compile and warm up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb, out=out)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        cuts = torch.sort(torch.randint(0, total + 1, (E - 1,), generator=g)).values
        new = torch.cat([cuts, torch.tensor([total])]).to(torch.int32)
        offs.copy_(new)
        out.fill_(float("nan"))
        graph.replay()
        eager = grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb)
        torch.cuda.synchronize()
        assert torch.equal(out, eager), f"replay with offs {new.tolist()} differs from an eager call"


def test_grouped_blockwise_swiglu_bias_and_mxfp8_out():
    """Epilogues compose with the block scales: per-expert bias + swiglu (bf16), and swiglu with an
    MXFP8 output (= quantize_ref of the reference's bf16 result, up to ties)."""
    _skip_unless_sm90()
    from cutegemm import grouped_gemm, grouped_gemm_ref
    from cutegemm.blockscaled import quantize_ref

    counts, n, k = [150, 0, 64, 300], 512, 384
    a, b, offs, sa, sb = _grouped_operands(counts, n, k, seed=9, pad_rows=0)
    bias = torch.randn(len(counts), n, device="cuda")
    out = grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb, bias=bias, activation="swiglu")
    ref = grouped_gemm_ref(a, b, offs=offs, scale_a=sa, scale_b=sb, bias=bias, activation="swiglu",
                           out_dtype=torch.float64, compute_dtype=torch.float64)  # fmt: skip
    same = grouped_gemm_ref(a, b, offs=offs, scale_a=sa, scale_b=sb, bias=bias, activation="swiglu")
    assert_within_torch_error(out, same, ref, atol=1e-3, what="grouped blockwise bias swiglu")
    q = grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb, activation="swiglu", out_dtype="mxfp8")
    # the kernel's own fp32 result, quantized by the reference (the same accumulators)
    want = quantize_ref(grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb, activation="swiglu",
                                     out_dtype=torch.float32), "mxfp8")  # fmt: skip
    check_quantized(q, want, "mxfp8")


def test_grouped_blockwise_bad_inputs():
    _skip_unless_sm90()
    from cutegemm import grouped_gemm

    a, b, offs, sa, sb = _grouped_operands([64, 64], 384, 256, pad_rows=0)  # KB = 2, NB = 3
    with pytest.raises(ValueError, match=r"scale_b must have shape \(E, ceil\(K/128\), ceil\(N/128\)\)"):
        grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb.transpose(1, 2))
    with pytest.raises(ValueError, match=r"scale_a must have shape \(total_M, ceil\(K/128\)\)"):
        grouped_gemm(a, b, offs=offs, scale_a=sa[:-1], scale_b=sb)
    with pytest.raises(ValueError, match="needs scale_b of shape"):
        grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=torch.ones(2, 384, device="cuda"))
    with pytest.raises(ValueError, match="fast_accum must be False"):
        grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb, fast_accum=True)
    with pytest.raises(TypeError, match="float32"):
        grouped_gemm(a, b, offs=offs, scale_a=sa.double(), scale_b=sb)
    with pytest.raises(ValueError, match="gate_layout='halves'"):
        grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb, activation="swiglu", gate_layout="halves")
