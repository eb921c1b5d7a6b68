"""MXFP8 -> bf16 dequantize kernel (``cutegemm.blockscaled.dequant``), CPU side: the kernel's
arithmetic twin against ``dequantize_ref``, the SASS of every variant, and the sm_90a MXFP8 GEMM's
routing rule (``sm90_mx.dequantize_first``)."""

from __future__ import annotations

import pytest
import torch

from cutegemm.blockscaled import dequant
from cutegemm.blockscaled.reference import dequantize_ref, quantize_ref
from cutegemm.blockscaled.sm90_mx import DEQUANT_MIN_COLS, DEQUANT_MIN_ROWS, dequantize_first


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp8_e5m2"])
@pytest.mark.parametrize("lead", [(), (3,)])
@pytest.mark.parametrize("k", [96, 48, 16])
def test_twin_equals_reference_bitwise(fmt, lead, k):
    """fp32 element x 2**(scale - 127), rounded to bf16, equals dequantize_ref rounded to bf16:
    scales over 2**-120 .. 2**100 (per column), zero and NaN blocks, a K tail block (48, 16)."""
    g = torch.Generator().manual_seed(k + len(lead))
    x = torch.randn(*lead, 200, k, generator=g) * torch.logspace(-36, 30, k)
    x[..., 5, :16] = 0.0
    x[..., 7, 16:] = float("nan")
    q = quantize_ref(x, fmt)
    twin = dequant.dequantize_bf16_ref(q)
    ref = dequantize_ref(q).to(torch.bfloat16)
    assert twin.shape == q.shape
    assert torch.equal(twin.view(torch.int16), ref.view(torch.int16))


def test_scale_factor_bits_edges():
    from cutegemm.blockscaled.quantize import TorchOps

    s = torch.tensor([0, 1, 126, 127, 128, 254, 255], dtype=torch.int32)
    vals = TorchOps.as_float(dequant.scale_factor_bits(s, TorchOps).contiguous())
    assert vals[0].item() == 2.0**-127 and vals[1].item() == 2.0**-126 and vals[3].item() == 1.0
    assert vals[5].item() == 2.0**127 and torch.isnan(vals[6])


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_every_variant_compiles_with_vector_loads(arch):
    for cfg in dequant.all_configs(arch):
        ok, found, err = dequant.check_variant(cfg)
        assert ok, (cfg.name, found, err)


def test_routing_rule_and_operand_checks():
    """Small M or N keep the emulation; CPU operands (the kernel's rules fail) too; the kernel's
    own entry point rejects what it cannot take."""
    q = quantize_ref(torch.randn(512, 64), "mxfp8")
    assert not dequantize_first(DEQUANT_MIN_ROWS - 1, 4096, q, q)
    assert not dequantize_first(4096, DEQUANT_MIN_COLS - 1, q, q)
    assert not dequantize_first(4096, 4096, q, q)  # CPU tensors: the kernel does not apply
    with pytest.raises(ValueError, match="CUDA"):
        dequant.dequantize_bf16(q)
    with pytest.raises(ValueError, match="MXFP8"):
        dequant.check_dequant_operand(quantize_ref(torch.randn(4, 64), "nvfp4"))
    with pytest.raises(ValueError, match="fmt"):
        dequant.DequantConfig(fmt="nvfp4")
