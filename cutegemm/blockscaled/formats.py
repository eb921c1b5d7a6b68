"""Descriptors of the block-scaled number formats (MXFP8, MXFP4, NVFP4).

A block-scaled tensor stores low-precision *elements* plus one *scale* per block of
``block_size`` consecutive elements along the reduction (K, last) dimension; the value of
element ``i`` is ``element[i] * scale[i // block_size]`` (times a per-tensor fp32
``global_scale`` for NVFP4).

Storage dtypes are torch's own, so quantized tensors are byte-compatible with
``torch._scaled_mm`` on Blackwell:

* ``torch.float8_e4m3fn`` / ``torch.float8_e5m2``: one element per byte.
* ``torch.float4_e2m1fn_x2``: two e2m1 elements per byte, the even element (2i) in the low
  nibble and the odd element (2i+1) in the high nibble; nibble bits are sign(1) exp(2) man(1).
* ``torch.float8_e8m0fnu``: an unsigned power of two ``2**(byte - 127)``, byte 0xFF is NaN.
* ``torch.float8_e4m3fn`` as NVFP4 block scale (always non-negative).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["BlockFormat", "MXFP8", "MXFP8_E5M2", "MXFP4", "NVFP4", "FORMATS", "get_format"]


@dataclass(frozen=True)
class BlockFormat:
    """Static description of one block-scaled format.

    Attributes:
        name: canonical lower-case name (``"mxfp8"``, ``"mxfp4"``, ...).
        elem_dtype: torch storage dtype of the elements.
        scale_dtype: torch storage dtype of the per-block scales.
        block_size: number of consecutive K elements sharing one scale.
        elem_max: largest finite element magnitude (448 for e4m3, 6 for e2m1).
        elem_emax: unbiased exponent of the largest element binade (8 for e4m3, 2 for e2m1);
            the ``emax_elem`` of the OCP MX specification.
        elem_emin: unbiased exponent of the smallest normal element (-6 for e4m3, 0 for e2m1).
        elem_mantissa_bits: explicit mantissa bits of the element type.
        has_global_scale: whether the format carries one fp32 scale per tensor (NVFP4).
    """

    name: str
    elem_dtype: torch.dtype
    scale_dtype: torch.dtype
    block_size: int
    elem_max: float
    elem_emax: int
    elem_emin: int
    elem_mantissa_bits: int
    has_global_scale: bool = False

    @property
    def elems_per_byte(self) -> int:
        """2 for packed FP4 elements, 1 otherwise."""
        return 2 if self.elem_dtype == torch.float4_e2m1fn_x2 else 1

    @property
    def is_mx(self) -> bool:
        """True for the OCP MX formats (power-of-two e8m0 scales)."""
        return self.scale_dtype == torch.float8_e8m0fnu


MXFP8 = BlockFormat(
    name="mxfp8",
    elem_dtype=torch.float8_e4m3fn,
    scale_dtype=torch.float8_e8m0fnu,
    block_size=32,
    elem_max=448.0,
    elem_emax=8,
    elem_emin=-6,
    elem_mantissa_bits=3,
)
MXFP8_E5M2 = BlockFormat(
    name="mxfp8_e5m2",
    elem_dtype=torch.float8_e5m2,
    scale_dtype=torch.float8_e8m0fnu,
    block_size=32,
    elem_max=57344.0,
    elem_emax=15,
    elem_emin=-14,
    elem_mantissa_bits=2,
)
MXFP4 = BlockFormat(
    name="mxfp4",
    elem_dtype=torch.float4_e2m1fn_x2,
    scale_dtype=torch.float8_e8m0fnu,
    block_size=32,
    elem_max=6.0,
    elem_emax=2,
    elem_emin=0,
    elem_mantissa_bits=1,
)
NVFP4 = BlockFormat(
    name="nvfp4",
    elem_dtype=torch.float4_e2m1fn_x2,
    scale_dtype=torch.float8_e4m3fn,
    block_size=16,
    elem_max=6.0,
    elem_emax=2,
    elem_emin=0,
    elem_mantissa_bits=1,
    has_global_scale=True,
)

FORMATS: dict[str, BlockFormat] = {f.name: f for f in (MXFP8, MXFP8_E5M2, MXFP4, NVFP4)}


def get_format(name: str | BlockFormat) -> BlockFormat:
    """Return the :class:`BlockFormat` called ``name`` (case-insensitive).

    Known names: ``"mxfp8"``, ``"mxfp8_e5m2"``, ``"mxfp4"``, ``"nvfp4"``. A
    :class:`BlockFormat` is returned unchanged.

    Raises:
        TypeError: ``name`` is neither a str nor a BlockFormat.
        ValueError: ``name`` is not a known format.
    """
    if isinstance(name, BlockFormat):
        return name
    if not isinstance(name, str):
        raise TypeError(f"format name: expected a str or BlockFormat, got {type(name).__name__}")
    fmt = FORMATS.get(name.lower())
    if fmt is None:
        raise ValueError(f"unknown block-scaled format {name!r}; expected one of {sorted(FORMATS)}")
    return fmt
