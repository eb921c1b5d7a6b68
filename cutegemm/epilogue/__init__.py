"""Composable epilogue ops applied to the fp32 accumulator, shared by every kernel family and arch."""

from .ops import EpilogueSpec, apply_epilogue

__all__ = ["EpilogueSpec", "apply_epilogue"]
