"""`bench host`'s torch baselines compute what the paths they stand beside compute: its MXFP8 recipe in
torch ops gives quantize_ref's elements and scales byte for byte, and its inverse dequantize_ref's
values, so the host-time row compares the same work."""

from __future__ import annotations

import pytest
import torch

from cutegemm.bench.host import _torch_mx_dequantize, _torch_mx_quantize
from cutegemm.blockscaled.reference import dequantize_ref, quantize_ref


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("scale", [1.0, 1e-30, 3e4])
def test_torch_mx_recipe_is_quantize_ref(dtype, scale):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 256, generator=g) * scale).to(dtype)
    x[3, 32:64] = 0  # an all-zero block
    data, scales = _torch_mx_quantize(x)
    q = quantize_ref(x, "mxfp8", swizzle=False)
    assert torch.equal(data.view(torch.uint8), q.data.view(torch.uint8))
    assert torch.equal(scales.view(torch.uint8), q.scales.view(torch.uint8))
    for out in (torch.bfloat16, torch.float32):
        assert torch.equal(_torch_mx_dequantize(q.data, q.scales, out), dequantize_ref(q).to(out))
