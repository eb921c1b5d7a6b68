"""The plain-torch twin of :func:`cutegemm.gemm.dense.gemm`: the reference the tests, the
autotuner's runner and the CPU paths of the custom ops compare with or run."""

from __future__ import annotations

import torch

from ..blockscaled.reference import quantize_ref
from ..config import QUANT_FORMATS
from ..epilogue import GATED, epilogue_ref
from ..epilogue.user import apply_user_ref
from .fp8_scales import (
    check_fp8_out,
    check_scale_result,
    fp8_block_scales,
    fp8_blockwise_ref,
    fp8_saturated,
    fp8_scales,
    not_fp8,
)
from .launch import OUT_TO_NAME, TORCH_FP8, check_activation, global_scale, quant_outputs, quant_result


def gemm_ref(
    a,
    b,
    *,
    out_dtype=None,
    alpha: float = 1.0,
    beta: float = 0.0,
    c=None,
    bias=None,
    activation: str | None = None,
    gate_layout: str = "interleaved",
    compute_dtype=torch.float32,
    epilogue=None,
    epilogue_args=(),
    out_global_scale=None,
    scale_a=None,
    scale_b=None,
    scale_result=None,
):
    """Plain-torch twin of :func:`gemm`: the matmul and the epilogue in ``compute_dtype``
    (``cutegemm.epilogue.epilogue_ref``, or the user ``epilogue`` evaluated on torch tensors),
    then the cast, or for a quantized ``out_dtype`` ("mxfp8" / "mxfp4" / "nvfp4")
    ``quantize_ref`` of the fp32 result. Same arguments, same rules."""
    check_activation(activation, gate_layout)
    if beta != 0.0 and c is None:
        raise ValueError(f"beta={beta} needs the residual tensor c")
    if beta != 0.0 and activation in GATED:
        raise ValueError(f"beta * c cannot be combined with the gated activation {activation!r}")
    fp8 = a.dtype in TORCH_FP8
    out_dtype = out_dtype or (torch.bfloat16 if fp8 else a.dtype)
    check_fp8_out(a.dtype, out_dtype)
    if fp8 and not isinstance(out_dtype, str) and out_dtype not in OUT_TO_NAME and out_dtype != torch.float64:
        raise TypeError(f"out_dtype of FP8 operands: torch.bfloat16, torch.float16, torch.float32 or an FP8 dtype (the "
                        f"twin: float64 too), got {out_dtype}")  # fmt: skip
    if fp8 and fp8_block_scales(a, b, scale_a, scale_b, kernel_layout=False) is not None:
        if out_dtype in TORCH_FP8:
            raise ValueError("an FP8 output takes per-tensor or row-wise scales, not block scales")
        acc = fp8_blockwise_ref(a, b, scale_a, scale_b, compute_dtype)  # DeepSeek block scales
        scale_a = scale_b = None
    else:
        acc = torch.matmul(a.to(compute_dtype), b.to(compute_dtype))
        if fp8:  # validated and flattened as gemm's (one per row / column, or per tensor)
            scale_a, scale_b = fp8_scales(a, b, scale_a, scale_b)
        elif scale_a is not None or scale_b is not None:
            raise not_fp8(a)
    if out_dtype in TORCH_FP8 and activation in GATED:
        raise ValueError(f"an FP8 output cannot be combined with the gated activation {activation!r}")
    if a.shape[-1] == 0:  # K = 0: a zero product, whatever the scales (torch._scaled_mm: zeros)
        scale_a = scale_b = None
    if scale_a is not None:  # FP8 scales: per row of a / per column of b, or per tensor
        sa = scale_a.to(compute_dtype).reshape(-1)
        acc = acc * (sa if sa.numel() == 1 else sa.unsqueeze(-1))
    if scale_b is not None:
        acc = acc * scale_b.to(compute_dtype).reshape(-1)
    if epilogue is not None:
        if beta != 0.0 or bias is not None or activation is not None:
            raise ValueError("a user epilogue replaces beta * c, bias and activation: apply them inside it")
        res = apply_user_ref(epilogue, acc * alpha if alpha != 1.0 else acc, tuple(epilogue_args))
    else:
        res = epilogue_ref(
            acc, alpha=alpha, beta=beta, c=c, bias=bias, activation=activation, gate_layout=gate_layout
        )
    if isinstance(out_dtype, str):
        if out_dtype not in QUANT_FORMATS:
            raise ValueError(f"a quantized out_dtype must be one of {QUANT_FORMATS}, got {out_dtype!r}")
        gs = global_scale(out_dtype, out_global_scale, res.device)
        if res.numel() == 0:  # an empty result, as the kernel path returns it (quantize_ref takes no empty x)
            return quant_result(out_dtype, tuple(res.shape), *quant_outputs(out_dtype, res.shape, res.device), gs)
        return quantize_ref(res.float(), out_dtype, global_scale=gs)
    if scale_result is not None:
        check_scale_result(scale_result, out_dtype, activation, beta, epilogue)
        res = res * scale_result.to(res.dtype).reshape(())
    return fp8_saturated(res, out_dtype) if out_dtype in TORCH_FP8 else res.to(out_dtype)



__all__ = ["gemm_ref"]
