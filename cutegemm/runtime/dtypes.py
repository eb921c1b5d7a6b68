"""The DSL element types of the config's dtype names."""

import cutlass

CUTLASS_DTYPES = {
    "bf16": cutlass.BFloat16,
    "fp16": cutlass.Float16,
    "fp32": cutlass.Float32,
    "e4m3": cutlass.Float8E4M3FN,  # FP8 and block-scaled operands
    "e5m2": cutlass.Float8E5M2,  # FP8 dense operands
    "e2m1": cutlass.Float4E2M1FN,
    "u8": cutlass.Uint8,  # packed FP4 pairs of a quantized output
}
# Block scale factors (sm_100a block-scaled MMA)
SF_DTYPES = {"e8m0": cutlass.Float8E8M0FNU, "e4m3": cutlass.Float8E4M3FN}
