"""The public face: check -> plan -> launch, one route per call (``face``), plus the quantize /
dequantize entry points. ``cutegemm`` re-exports these names."""

from ..blockscaled.dequant import dequantize
from ..blockscaled.quantize_launch import quantize
from .face import gemm, gemm_ref, grouped_gemm, grouped_gemm_ref

__all__ = ["gemm", "gemm_ref", "grouped_gemm", "grouped_gemm_ref", "quantize", "dequantize"]
