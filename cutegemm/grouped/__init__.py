"""Grouped / MoE GEMM: packed (offs) form on the device-side tile map, list and K-grouped forms."""

from .packed import grouped_gemm, grouped_gemm_ref

__all__ = ["grouped_gemm", "grouped_gemm_ref"]
