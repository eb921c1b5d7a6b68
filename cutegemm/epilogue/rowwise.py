"""What the MoE layer's elementwise / row kernels between the GEMMs share (``gated_grads``,
``combine``): 128-bit chunks of 8 bf16 / fp16 values, flat 1-D fake tensors for the compile cache,
the SASS markers compile-check holds them to."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_tensor

CHUNK = 8  # 16-bit values per 128-bit load / store
MAX_ELEMENTS = 2**31 - 1  # flat int32 indexing
KERNEL_DTYPES = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16}
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
SASS_REQUIRED = {"LDG.128": r"\bLDG\.E[.A-Z0-9]*\.128", "STG.128": r"\bSTG\.E[.A-Z0-9]*\.128"}
SASS_FORBIDDEN = {"LDL": r"\bLDL(\.|\s)", "STL": r"\bSTL(\.|\s)"}


def flat_tensor(dtype, divisibility: int):
    """A 1-D fake tensor of ``dtype``, 16-byte aligned, its length a multiple of ``divisibility``."""
    return make_fake_tensor(dtype, (cute.sym_int32(divisibility=divisibility),), (1,), assumed_align=16)


__all__ = ["CHUNK", "DTYPE_NAMES", "KERNEL_DTYPES", "MAX_ELEMENTS", "SASS_FORBIDDEN", "SASS_REQUIRED", "flat_tensor"]
