"""Torch-side views of block-scaled operands and outputs shared by the block-scaled GEMM routes
(sm_100a kernel, sm_90a emulation): the kernel's view of a BlockScaledTensor's data, the L = 1
batch view, and the output buffer rules."""

from __future__ import annotations

import torch

from ..gemm.launch import copy_unaligned_out, kernel_view, padded_rows
from .reference import BlockScaledTensor

OUT_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def operand_view(q: BlockScaledTensor) -> torch.Tensor:
    """(rows, K, L) view of the K-major elements (FP4: in packed byte units of torch's x2 dtype)."""
    d = q.data if q.data.dim() == 3 else q.data.unsqueeze(0)
    d = d.contiguous()
    L, rows, kk = d.shape
    return d.as_strided((rows, kk, L), (kk, 1, rows * kk))


def l1_view(t: torch.Tensor) -> torch.Tensor:
    """A row-major (rows, cols) tensor as the kernel's (rows, cols, 1), the unit L mode at a
    16-byte stride (TMA checks every stride, used or not)."""
    return t.as_strided(*kernel_view(t.unsqueeze(0), 2, (1, 2, 0), "out"))


def output_view(out, L: int, m: int, n: int, out_dtype, device, batched: bool):
    """(written, its (M, N, L) kernel view): the caller's ``out`` (checked), or a view into a buffer
    whose rows are padded to 16 bytes (TMA stores whole 16-byte row pieces) when there is no out or
    its N columns are not a multiple of 16 bytes. After the launch, ``finish_output``."""
    shape = (L, m, n) if batched else (m, n)
    if out is not None:
        check_out(out, shape, out_dtype, device)
    written = out if out is not None and (n * out.element_size()) % 16 == 0 else padded_rows(shape, out_dtype, device)
    if not batched:  # one as_strided where unsqueeze(0).permute(1, 2, 0) took two views (same strides)
        ld = written.stride(0)
        return written, written.as_strided((m, n, 1), (ld, written.stride(1), m * ld))
    return written, written.permute(1, 2, 0)


def check_out(out, shape, out_dtype, device) -> None:
    """The rules of a caller's ``out`` (ValueError): the result's shape and dtype, the operands'
    device, unit column stride, 16-byte aligned rows / batches / start (TMA stores)."""
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(shape) or out.dtype != out_dtype:
        got = f"{tuple(out.shape)} {out.dtype}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"out must be a {tuple(shape)} {out_dtype} tensor, got {got}")
    if out.device != device:
        raise ValueError(f"out is on {out.device}, the operands on {device}")
    align = 16 // out.element_size()
    batched = out.dim() == 3
    if out.stride(-1) != 1 or out.stride(-2) % align or (batched and out.stride(0) % align) or out.data_ptr() % 16:
        raise ValueError(
            f"out needs unit column stride and 16-byte aligned rows / batches / start, got strides {out.stride()}"
        )


def finish_output(out, written):
    """The result once the kernel has written ``written`` (see ``output_view``): out (the N
    columns copied in when the kernel wrote scratch), or the new result, contiguous."""
    if out is None:
        return written.contiguous()  # a no-op unless the rows were padded
    return copy_unaligned_out(out, written)
