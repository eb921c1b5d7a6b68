"""Block-scaled formats (MXFP8, MXFP4, NVFP4): descriptors, scale layouts, reference quantizers and
the fast GPU quantizer (``quantize``) and ``dequantize``."""

from .dequant import dequantize
from .formats import FORMATS, MXFP4, MXFP8, MXFP8_E5M2, NVFP4, BlockFormat, get_format
from .layout import from_swizzled, swizzled_shape, to_swizzled
from .quantize_launch import quantize
from .reference import BlockScaledTensor, dequantize_ref, pack_fp4, quantize_ref, unpack_fp4

__all__ = [
    "BlockFormat",
    "FORMATS",
    "MXFP8",
    "MXFP8_E5M2",
    "MXFP4",
    "NVFP4",
    "get_format",
    "to_swizzled",
    "from_swizzled",
    "swizzled_shape",
    "BlockScaledTensor",
    "quantize_ref",
    "dequantize_ref",
    "pack_fp4",
    "unpack_fp4",
    "quantize",
    "dequantize",
]
