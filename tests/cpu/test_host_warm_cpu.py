"""Warm (memoized) host paths of dequantize and the sm_90a block-scaled GEMM on the CPU (no GPU):
the kernels are no-ops that record their arguments (tests/host_overhead_cpu.py). A warm call must
hand the kernels what the cold call hands them, return the same kind of result, and raise what
the cold call raises for an input that differs from the warm signature."""

import pytest
import torch

import cutegemm
from cutegemm.blockscaled import dequant, quantize_ref
from cutegemm.blockscaled.reference import BlockScaledTensor

from ..host_overhead_cpu import cpu_dequant_path, kernel_args

BF = torch.bfloat16


def test_only_dequantize_records_warm_keys():
    """dequantize_checked records a warm key only when its caller asks (dequantize does); the GEMM
    routes that call it (the sm_90a block-scaled path, the weight-only dequantize-first route)
    leave the table alone."""
    q = quantize_ref(torch.randn(128, 64), "mxfp8")
    with cpu_dequant_path() as k:
        out = dequant.dequantize_checked(q)
        assert k.calls == 1 and out.shape == q.shape and out.dtype == BF
        assert not dequant._WARM
        dequant.dequantize_checked(q, out_dtype=torch.float32)
        assert not dequant._WARM
        dequant.dequantize(q, BF)
        assert len(dequant._WARM) == 1
        calls = k.calls
        dequant.dequantize(q, BF)  # warm: the kernel, not dequantize_checked's lookups
        assert k.calls == calls + 1


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_warm_dequantize_is_the_cold_launch(fmt):
    """The warm launch passes the cold launch's arguments (the output a fresh tensor of the same
    layout) for each output dtype, float16 as the fp32 pass and a cast."""
    q = quantize_ref(torch.randn(3, 32, 64), fmt)
    with cpu_dequant_path() as k:
        for dt in (BF, torch.float32, torch.float16):
            dequant._WARM.clear()
            cold = dequant.dequantize(q, dt)
            cold_args = kernel_args(k)
            warm = dequant.dequantize(q, dt)
            warm_args = kernel_args(k)
            assert warm_args[:3] + warm_args[4:] == cold_args[:3] + cold_args[4:]
            assert warm_args[3][:2] + warm_args[3][3:] == cold_args[3][:2] + cold_args[3][3:]
            assert warm_args[3][2] != cold_args[3][2]  # a fresh output
            assert (warm.shape, warm.stride(), warm.dtype) == (cold.shape, cold.stride(), cold.dtype) == (
                q.shape, cold.stride(), dt)  # fmt: skip


def test_warm_dequantize_keeps_every_check():
    q = quantize_ref(torch.randn(64, 64), "mxfp8")
    with cpu_dequant_path() as k:
        for _ in range(2):
            dequant.dequantize(q, BF)
            dequant.dequantize(q)
        calls = k.calls
        with pytest.raises(TypeError, match="out_dtype"):
            dequant.dequantize(q, torch.float64)
        with pytest.raises(TypeError, match="out_dtype"):
            dequant.dequantize(q, [BF])  # unhashable
        with pytest.raises(TypeError, match="BlockScaledTensor"):
            dequant.dequantize(q.data.float(), BF)
        # the same key but transposed elements (not contiguous) or another shape: the reference
        qt = BlockScaledTensor(data=q.data.t().contiguous().t(), scales=q.scales, fmt=q.fmt, shape=q.shape)
        assert torch.equal(dequant.dequantize(qt), dequant.dequantize_ref(qt))
        q2 = quantize_ref(torch.randn(64, 40), "mxfp8")  # K % 16 != 0
        for _ in range(2):
            assert torch.equal(cutegemm.dequantize(q2), dequant.dequantize_ref(q2))
        assert k.calls == calls
