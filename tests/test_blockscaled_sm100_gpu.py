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
