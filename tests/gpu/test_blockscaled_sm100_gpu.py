"""Block-scaled GEMM on an sm_100 GPU (native tcgen05 block-scaled MMA): against the reference
twin dequantize_ref -> fp32 matmul. Skipped unless an sm_100 GPU is present (conftest)."""

from dataclasses import replace

import pytest
import torch

from cutegemm.blockscaled import dequantize_ref, quantize_ref
from cutegemm.blockscaled.gemm import blockscaled_config, gemm_blockscaled

pytestmark = [pytest.mark.gpu, pytest.mark.sm100]

FORMATS = ["mxfp8", "nvfp4", "mxfp4"]
SHAPES = [(128, 256, 512), (256, 256, 1024), (1000, 520, 768), (1, 128, 256), (300, 4096, 2048)]


def reference(qa, qb):
    return dequantize_ref(qa) @ dequantize_ref(qb).mT


def check(out, ref, out_dtype):
    # fp32 accumulation of exactly representable products: the error is the output rounding plus
    # accumulation order.
    tol = {torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 2e-3}[out_dtype]
    scale = ref.abs().max().clamp(min=1e-6)
    err = (out.float() - ref).abs().max() / scale
    assert err <= tol, f"max relative error {err:.3g} > {tol}"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_blockscaled_matches_dequantized_matmul(fmt, m, n, k, out_dtype):
    torch.manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda")
    b = torch.randn(n, k, device="cuda")
    qa, qb = quantize_ref(a, fmt), quantize_ref(b, fmt)
    out = gemm_blockscaled(qa, qb, out_dtype=out_dtype)
    assert out.shape == (m, n) and out.dtype == out_dtype
    check(out, reference(qa, qb), out_dtype)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "tile",
    [
        dict(tile_m=128, tile_n=128),
        dict(tile_m=128, tile_n=256),
        dict(tile_m=256, tile_n=256, two_cta=True, cluster_m=2),
        dict(tile_m=256, tile_n=128, two_cta=True, cluster_m=2, cluster_n=2),
        dict(tile_m=128, tile_n=128, cluster_m=2, cluster_n=2),
        dict(tile_m=128, tile_n=192),  # odd N tiles start half an SFB granule in
        dict(tile_m=128, tile_n=64, cluster_n=2),
        dict(tile_m=256, tile_n=192, two_cta=True, cluster_m=2),
        dict(tile_m=256, tile_n=64, two_cta=True, cluster_m=2),
    ],
)
def test_blockscaled_tiles_and_clusters(fmt, tile):
    torch.manual_seed(0)
    m, n, k = 700, 900, 1536
    qa = quantize_ref(torch.randn(m, k, device="cuda"), fmt)
    qb = quantize_ref(torch.randn(n, k, device="cuda"), fmt)
    cfg = replace(blockscaled_config(fmt, m, n), **tile)
    check(gemm_blockscaled(qa, qb, config=cfg), reference(qa, qb), torch.bfloat16)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "tile",
    [dict(tile_m=128, tile_n=256), dict(tile_m=256, tile_n=256, two_cta=True, cluster_m=2),
     dict(tile_m=128, tile_n=256, scheduler="dynamic"), dict(tile_m=128, tile_n=256, scheduler="clc")],
)  # fmt: skip
def test_blockscaled_overlapping_accumulators(fmt, tile):
    """tile_n = 256: two accumulator buffers share TMEM columns (``TmemPlan``). Enough tiles that
    every CTA runs several, alternating buffers, and a ragged edge in M and N."""
    torch.manual_seed(3)
    m, n, k = 4000, 4000, 512
    qa = quantize_ref(torch.randn(m, k, device="cuda"), fmt)
    qb = quantize_ref(torch.randn(n, k, device="cuda"), fmt)
    cfg = replace(blockscaled_config(fmt, m, n), **tile)
    tiles = -(-m // cfg.tile_m) * -(-n // cfg.tile_n)
    assert tiles >= 3 * torch.cuda.get_device_properties(0).multi_processor_count // (2 if cfg.two_cta else 1)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm_blockscaled(qa, qb, config=cfg, out=out)
    check(out, reference(qa, qb), torch.bfloat16)


@pytest.mark.parametrize("fmt", FORMATS)
def test_blockscaled_zero_blocks_and_saturation(fmt):
    torch.manual_seed(1)
    m, n, k = 256, 256, 1024
    a = torch.randn(m, k, device="cuda")
    a[:, :64] = 0  # whole zero blocks
    a[::7, 128:160] = 1e4  # saturating / large-scale blocks
    b = torch.randn(n, k, device="cuda")
    b[:50] = 0
    qa, qb = quantize_ref(a, fmt), quantize_ref(b, fmt)
    check(gemm_blockscaled(qa, qb), reference(qa, qb), torch.bfloat16)


@pytest.mark.parametrize("fmt", FORMATS)
def test_blockscaled_batched(fmt):
    torch.manual_seed(2)
    qa = quantize_ref(torch.randn(3, 200, 512, device="cuda"), fmt)
    qb = quantize_ref(torch.randn(3, 300, 512, device="cuda"), fmt)
    out = gemm_blockscaled(qa, qb)
    assert out.shape == (3, 200, 300)
    check(out, reference(qa, qb), torch.bfloat16)


@pytest.mark.parametrize("formats", [("mxfp8", "mxfp4"), ("mxfp4", "mxfp8")], ids=["mxfp8xmxfp4", "mxfp4xmxfp8"])
@pytest.mark.parametrize("m,n,k", [(128, 256, 512), (1000, 520, 768), (1, 128, 256), (300, 4096, 2048)])
@pytest.mark.parametrize(
    "tile",
    [None, dict(tile_m=128, tile_n=128, cluster_n=2), dict(tile_m=256, tile_n=256, two_cta=True, cluster_m=2)],
    ids=["policy", "128x128-1x2", "2cta"],
)
def test_mixed_mx_matches_dequantized_matmul(formats, m, n, k, tile):
    """MXFP8 x MXFP4 (kind::mxf8f6f4, the FP4 operand unpacked to a byte per element in shared
    memory by its TMA) against the dequantized fp32 matmul."""
    torch.manual_seed(m + n + k)
    qa = quantize_ref(torch.randn(m, k, device="cuda"), formats[0])
    qb = quantize_ref(torch.randn(n, k, device="cuda"), formats[1])
    config = None
    if tile is not None:
        config = replace(blockscaled_config(formats[0], m, n, b_fmt_name=formats[1]), **tile)
    out = gemm_blockscaled(qa, qb, config=config)
    check(out, reference(qa, qb), torch.bfloat16)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scheduler", ["dynamic", "clc"])
def test_blockscaled_dynamic_schedulers_get_their_workspace(fmt, scheduler):
    """A block-scaled config with the atomic-counter ("dynamic") scheduler compiles with a
    workspace argument: the call must pass one (a fresh counter per launch); CLC needs none."""
    torch.manual_seed(3)
    m, n, k = 700, 900, 1024
    qa = quantize_ref(torch.randn(m, k, device="cuda"), fmt)
    qb = quantize_ref(torch.randn(n, k, device="cuda"), fmt)
    cfg = replace(blockscaled_config(fmt, m, n), scheduler=scheduler)
    for _ in range(2):  # the counter must start from zero on every launch
        check(gemm_blockscaled(qa, qb, config=cfg), reference(qa, qb), torch.bfloat16)


@pytest.mark.parametrize("formats", [("mxfp8", "mxfp4"), ("mxfp4", "mxfp8")], ids=["mxfp8xmxfp4", "mxfp4xmxfp8"])
def test_mixed_mx_grouped_matches_dequantized(formats):
    """The grouped mixed form (its stage barrier counts the FP4 operand at 4 bits: it hung when it
    counted the unpacked bytes) against the dequantized matmul per expert."""
    from cutegemm import grouped_gemm

    torch.manual_seed(4)
    e, n, k, counts = 4, 256, 512, [100, 0, 257, 31]
    x = torch.randn(sum(counts), k, device="cuda")
    w = torch.randn(e, n, k, device="cuda")
    qa, qw = quantize_ref(x, formats[0]), quantize_ref(w, formats[1])
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    out = grouped_gemm(qa, qw, offs=offs)
    xd, wd = dequantize_ref(qa), dequantize_ref(qw)
    bounds = [0, *offs.tolist()]
    ref = torch.cat([xd[bounds[i]:bounds[i + 1]] @ wd[i].T for i in range(e)])
    check(out, ref, torch.bfloat16)
