"""Block-scaled -> bf16 dequantize kernel (``cutegemm.blockscaled.dequant``), CPU side: the kernel's
arithmetic twin against ``dequantize_ref``, the SASS of every variant, and the sm_90a MXFP8 GEMM's
routing rule (``sm90_mx.dequantize_first``)."""

from __future__ import annotations

import pytest
import torch

from cutegemm.blockscaled import dequant
from cutegemm.blockscaled.mx_sm90 import DEQUANT_MIN_COLS, DEQUANT_MIN_ROWS, dequantize_first
from cutegemm.blockscaled.reference import dequantize_ref, quantize_ref


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp8_e5m2", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("lead", [(), (3,)])
@pytest.mark.parametrize("k", [96, 48, 16])
def test_twin_equals_reference_bitwise(fmt, lead, k):
    """fp32 element (FP4 decoded by bit arithmetic) x fp32 scale (MX: 2**(byte - 127); NVFP4: the
    e4m3 value, then x the global scale), rounded to bf16, equals dequantize_ref rounded to bf16:
    scales over a wide range per column, zero and NaN blocks, a K tail block (48, 16)."""
    g = torch.Generator().manual_seed(k + len(lead))
    x = torch.randn(*lead, 200, k, generator=g) * torch.logspace(-36, 30, k)
    x[..., 5, :16] = 0.0
    x[..., 7, 16:] = float("nan")
    q = quantize_ref(x, fmt)
    twin = dequant.dequantize_bf16_ref(q)
    ref = dequantize_ref(q).to(torch.bfloat16)
    assert twin.shape == q.shape
    assert torch.equal(twin.view(torch.int16), ref.view(torch.int16))


def test_scale_and_element_decodes():
    """Every e8m0 edge, every e4m3 byte and every e2m1 code against torch's own decode."""
    from cutegemm.blockscaled.quantizer import TorchOps as T
    from cutegemm.blockscaled.reference import unpack_fp4

    s = torch.tensor([0, 1, 126, 127, 128, 254, 255], dtype=torch.int32)
    vals = T.as_float(dequant.scale_factor_bits(s, T).contiguous())
    assert vals[0].item() == 2.0**-127 and vals[1].item() == 2.0**-126 and vals[3].item() == 1.0
    assert vals[5].item() == 2.0**127 and torch.isnan(vals[6])
    b = torch.arange(256, dtype=torch.int32)
    e4m3 = T.as_float(dequant.e4m3_scale_bits(b, T).to(torch.int32).contiguous())
    want = b.to(torch.uint8).view(torch.float8_e4m3fn).float()
    assert torch.equal(e4m3.isnan(), want.isnan())
    assert torch.equal(e4m3[~want.isnan()].view(torch.int32), want[~want.isnan()].view(torch.int32))
    codes = torch.arange(16, dtype=torch.int32)
    e2m1 = T.as_float(dequant.e2m1_bits(codes, T).to(torch.int32).contiguous())
    packed = (codes[0::2] | (codes[1::2] << 4)).to(torch.uint8)
    assert torch.equal(e2m1.view(torch.int32), unpack_fp4(packed).view(torch.int32))


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
    with pytest.raises(ValueError, match="CUDA"):
        dequant.check_dequant_operand(quantize_ref(torch.randn(4, 64), "nvfp4"))
    with pytest.raises(ValueError, match="fmt"):
        dequant.DequantConfig(fmt="fp4")


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4"])
def test_warm_dequantize_passes_what_the_cold_call_passes(fmt):
    """dequantize's warm path (tests/host_overhead_cpu.py ``cpu_dequant_path``: CPU elements, a
    no-op kernel): the same kernel arguments and result as the cold call, for each output dtype;
    it re-checks the elements' alignment, and a key the kernel does not take never turns warm."""
    from ..host_overhead_cpu import cpu_dequant_path, kernel_args

    q = quantize_ref(torch.randn(2, 128, 64), fmt)
    with cpu_dequant_path() as k:
        for dt in (torch.bfloat16, torch.float32, torch.float16):
            cold = dequant.dequantize(q, dt)
            cold_args = kernel_args(k)
            assert len(dequant._WARM) >= 1
            warm = dequant.dequantize(q, dt)
            warm_args = kernel_args(k)
            # the same arguments but the fresh output (its shape, strides and dtype the same)
            assert warm_args[:3] + warm_args[4:] == cold_args[:3] + cold_args[4:]
            assert warm_args[3][:2] + warm_args[3][3:] == cold_args[3][:2] + cold_args[3][3:]
            assert (warm.shape, warm.dtype, warm.stride()) == (cold.shape, cold.dtype, cold.stride()) == (
                q.shape, dt, cold.stride())
        calls = k.calls
        # misaligned elements (same key): the cold checks, which send them to the reference
        buf = torch.empty(q.data.numel() + 1, dtype=torch.uint8)
        data = buf[1:].view(q.data.dtype).view(q.data.shape)
        data.copy_(q.data)
        q_off = dequant.BlockScaledTensor(data=data, scales=q.scales, fmt=q.fmt, shape=q.shape,
                                          global_scale=q.global_scale)  # fmt: skip
        out = dequant.dequantize(q_off, torch.bfloat16)
        assert k.calls == calls and torch.equal(out, dequantize_ref(q).to(torch.bfloat16))
        # K not a multiple of 16: never the kernel, cold or warm
        q_odd = quantize_ref(torch.randn(4, 40), "mxfp8")
        for _ in range(2):
            assert torch.equal(dequant.dequantize(q_odd), dequantize_ref(q_odd))
        assert k.calls == calls
