"""FP8 (e4m3) scale arguments of ``gemm`` / ``grouped_gemm``: the row-wise / per-tensor recipe
(fp32 vectors read in the epilogue) and DeepSeek-style block scaling (1x128 scales of A, 128x128
of B, applied in the mainloop), validated once here; plus the block-scaling reference."""

from __future__ import annotations

import torch

from ..config import TMA_ALIGN_BYTES


def not_e4m3(a) -> ValueError:
    """The error of FP8 scales passed to a form that takes float8_e4m3fn operands only (grouped)
    with operands of another dtype."""
    return ValueError(f"scale_a / scale_b are for torch.float8_e4m3fn inputs, got a.dtype {getattr(a, 'dtype', None)} "
                      "(FP8 operands of the grouped forms must be e4m3; the dense form also takes e5m2)")


def not_fp8(a) -> ValueError:
    """The error of FP8 scales passed to the dense form with operands that are not FP8."""
    return ValueError(f"scale_a / scale_b are for FP8 inputs (torch.float8_e4m3fn / float8_e5m2), got a.dtype "
                      f"{getattr(a, 'dtype', None)}")


def warm_scale_view(t: torch.Tensor) -> torch.Tensor:
    """A row-wise FP8 scale's 1-D view on a warm path: :func:`scale_vector`'s when it does not copy."""
    return t if t.dim() == 1 else t.view(-1)


def check_fp32_scale(name: str, t, device, rule: str = "") -> None:
    """An fp32 scale tensor on ``device`` (TypeError / ValueError naming it otherwise)."""
    pre = f"{rule}: " if rule else ""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{pre}{name} must be a torch.Tensor (fp32), got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise TypeError(f"{pre}{name} must be torch.float32, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{pre}{name} must be on {device}, got {t.device}")


def scale_vector(name: str, t, n: int, device, what: str) -> torch.Tensor:
    """A per-row / per-column fp32 scale (n elements, any one non-unit dim) or one per-tensor
    value, as a contiguous 16-byte aligned 1-D tensor."""
    check_fp32_scale(name, t, device)
    if t.numel() not in (1, n) or (t.numel() == n and n > 1 and sum(s > 1 for s in t.shape) != 1):
        raise ValueError(f"{name} must have 1 or {n} elements (per tensor / per {what}), got shape {tuple(t.shape)}")
    t = t.reshape(-1)
    if t.stride(0) != 1 or t.data_ptr() % TMA_ALIGN_BYTES:
        t = t.clone(memory_format=torch.contiguous_format)
    return t


def fp8_scales(a, b, scale_a, scale_b):
    """(scale_a, scale_b) as contiguous fp32 1-D tensors (None when not given): one per row of a
    / per column of b, or a single per-tensor value."""
    scale_b = one_block_scale_b(a, b, scale_a, scale_b)
    return (
        None if scale_a is None else scale_vector("scale_a", scale_a, a.shape[-2], a.device, "row"),
        None if scale_b is None else scale_vector("scale_b", scale_b, b.shape[-1], a.device, "column"),
    )


def one_block_scale_b(a, b, scale_a, scale_b):
    """Block scales of one K block and one N block in torch's padded layout (scale_a (M, 1),
    scale_b (4, 1): its K blocks padded to 4 rows, as torch's tests build it) are a per-row x
    per-tensor pair: scale_b's first row then. Any other scale_b as it is."""
    if (isinstance(scale_b, torch.Tensor) and scale_b.shape == (4, 1) and isinstance(scale_a, torch.Tensor)
            and scale_a.dim() == 2 and a.dim() == 2 and b.dim() == 2 and tuple(scale_a.shape) == (a.shape[0], 1)
            and fp8_block_shapes(a, b)[1] == (1, 1)):  # fmt: skip
        return scale_b[:1]
    return scale_b


TORCH_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)  # torch's FP8 dtypes (operands; the dense form's outputs too)


def check_fp8_out(a_dtype, out_dtype) -> None:
    """An FP8 ``out_dtype`` (torch._scaled_mm's) needs FP8 operands: TypeError otherwise."""
    if out_dtype in TORCH_FP8 and a_dtype not in TORCH_FP8:
        raise TypeError(f"an FP8 out_dtype ({out_dtype}) needs FP8 operands (torch._scaled_mm's), got {a_dtype}")


def fp8_saturated(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``y`` in the FP8 ``dtype`` as the kernels store it: clamped to the finite range (NaN kept, the
    PTX cvt.satfinite), then rounded to nearest-even (torch's own cast does not saturate)."""
    top = torch.finfo(dtype).max
    return y.clamp(-top, top).to(dtype)


def check_scale_result(scale_result, out_dtype, activation, beta, epilogue, device=None) -> None:
    """torch._scaled_mm's ``scale_result`` (the D scale of an FP8 output): one fp32 element, an FP8
    ``out_dtype``, and an epilogue it commutes with (alpha, bias; no activation, beta * C or user
    epilogue)."""
    if out_dtype not in TORCH_FP8:
        raise ValueError(f"scale_result scales an FP8 output (out_dtype float8_e4m3fn / float8_e5m2), got {out_dtype}")
    check_fp32_scale("scale_result", scale_result, getattr(scale_result, "device", None) if device is None else device)
    if scale_result.numel() != 1:
        raise ValueError(f"scale_result must have one element, got shape {tuple(scale_result.shape)}")
    if activation is not None or beta != 0.0 or epilogue is not None:
        raise ValueError("scale_result with an activation, beta * c or a user epilogue is not supported (it is folded "
                         "into scale_b and bias): apply the scale inside the epilogue or pass alpha")  # fmt: skip


def fold_scale_result(scale_result, a, out, out_dtype, scale_b, bias, activation, beta, epilogue):
    """(scale_b, bias) with ``scale_result`` folded in: ``sr * (acc * sa * sb + bias)`` is
    ``acc * sa * (sb * sr) + bias * sr`` (a small kernel each, no host sync)."""
    if out_dtype is None and isinstance(out, torch.Tensor):
        out_dtype = out.dtype
    check_scale_result(scale_result, out_dtype, activation, beta, epilogue, getattr(a, "device", None))
    sr = scale_result.reshape(())
    scale_b = sr.reshape(1) if scale_b is None else (scale_b * sr if isinstance(scale_b, torch.Tensor) else scale_b)
    bias = bias.float() * sr if isinstance(bias, torch.Tensor) else bias  # an fp32 bias (bf16 would round)
    return scale_b, bias


FP8_BLOCK = 128  # DeepSeek-style FP8 block scaling: 1x128 blocks of A, 128x128 blocks of B


def fp8_block_shapes(a, b) -> tuple[tuple[int, int], tuple[int, int]]:
    """(scale_a shape, scale_b shape) of FP8 block scaling for a (M, K) @ b (K, N), as
    torch._scaled_mm's (BlockWise1x128, BlockWise128x128): (M, ceil(K/128)), (ceil(K/128), ceil(N/128))."""
    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-1]
    kb, nb = -(-k // FP8_BLOCK), -(-n // FP8_BLOCK)
    return (m, kb), (kb, nb)


def is_fp8_blockwise(a, b, scale_a, scale_b) -> bool:
    """Whether 2-D scales ask for FP8 block scaling: scale_a (M, ceil(K/128)) and scale_b
    (ceil(K/128), ceil(N/128)) (torch._scaled_mm's 1x128 x 128x128 shapes). With one K block
    and one N block the shapes are also per-row x per-tensor scales, the same product: then the
    row-wise path (scales in the epilogue) serves them."""
    if not (isinstance(scale_a, torch.Tensor) and isinstance(scale_b, torch.Tensor)):
        return False
    if scale_a.dim() != 2 or scale_b.dim() != 2 or a.dim() < 2 or b.dim() < 2:
        return False
    sa_shape, sb_shape = fp8_block_shapes(a, b)
    return tuple(scale_a.shape) == sa_shape and _scale_b_rows_ok(scale_b, sb_shape) and sb_shape != (1, 1)


def _scale_b_rows_ok(scale_b, sb_shape) -> bool:
    """scale_b is (ceil(K/128), ceil(N/128)), or its K blocks padded to a multiple of 4 rows (the
    layout torch's own block-scaling tests build; the padding rows are never read)."""
    kb, nb = sb_shape
    return scale_b.shape[-1] == nb and scale_b.shape[-2] in (kb, -(-kb // 4) * 4)


SCALE_COPY_MIN_ROWS = 256


SCALE_A_ROW_ALIGN = TMA_ALIGN_BYTES // 4  # fp32 rows per 16 bytes: TMA's rule for scale_a's K-block stride and box start


def tma_scale_a(scale_a):
    """scale_a (rows, K/128) as the kernels' TMA loads it: M-major (unit stride along the rows,
    torch._scaled_mm's layout), the K-block stride a multiple of 4 rows (16 bytes) and a 16-byte
    aligned start. Each K tile's stage then carries the tile's row scales (one TMA box of
    tile_m rows), as DeepGEMM does. Such a tensor is used in place; any other layout (row-major,
    an M-major one of rows % 4 != 0, a misaligned view) is copied, on the launch stream, into an
    M-major buffer whose K-block stride is the row count rounded up to 4."""
    rows, kb = scale_a.shape
    if (
        scale_a.stride(0) == 1
        and scale_a.stride(1) % SCALE_A_ROW_ALIGN == 0
        and scale_a.data_ptr() % TMA_ALIGN_BYTES == 0
    ):
        return scale_a
    ld = -(-rows // SCALE_A_ROW_ALIGN) * SCALE_A_ROW_ALIGN
    buf = torch.empty((kb, ld), dtype=scale_a.dtype, device=scale_a.device)
    buf[:, :rows].copy_(scale_a.t())
    return buf.t()[:rows]


def k_contiguous_scale_b(sb_view, rows: int):
    """The kernel's view of scale_b ((N/128, K/128) dense, (N/128, K/128, E) grouped) with unit
    stride along K, copied when it has not and the call has ``rows`` >= 256 rows of A. Every
    consumer thread loads its tile's B scale each K tile: K-strided, that is a new cache line
    (an L2 round trip) every K tile, K-contiguous one per 32 K tiles. H200: torch's (K/128,
    N/128) row-major scale_b read in place ran 4.5% slower at 8192^3 and on grouped DeepSeek-V3
    up. torch._scaled_mm's own layout (column-major) needs
    no copy. The copy is at most a few hundred KB, on the launch stream."""
    if sb_view.shape[1] > 1 and sb_view.stride(1) != 1 and rows >= SCALE_COPY_MIN_ROWS:
        return sb_view.movedim(1, -1).contiguous().movedim(-1, 1)
    return sb_view


def fp8_block_scales(a, b, scale_a, scale_b, kernel_layout: bool = True):
    """FP8 block scaling: validates and returns (scale_a (M, KB), scale_b as the kernel's
    (NB, KB) view) (scale_a M-major, ``tma_scale_a``; scale_b any strides, read in place but copied
    K-contiguous from 256 rows on, ``k_contiguous_scale_b``; ``kernel_layout=False``: as given,
    for a caller that only validates); None when the scales are not block scales (row-wise /
    per-tensor / none: ``_fp8_scales``). Raises for a 2-D scale_a with more than one column that
    is not a valid block-scaling pair."""
    if not isinstance(b, torch.Tensor):
        return None  # _check_args names the bad operand
    blockwise = is_fp8_blockwise(a, b, scale_a, scale_b)
    looks_blockwise = isinstance(scale_a, torch.Tensor) and scale_a.dim() == 2 and scale_a.shape[-1] > 1
    if not blockwise and not looks_blockwise:
        return None
    rule = "FP8 block scaling (1x128 scales of a, 128x128 scales of b, as torch._scaled_mm)"
    if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        raise ValueError(f"{rule} takes float8_e4m3fn a and b, got {a.dtype} and {b.dtype}")
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"{rule} needs 2-D a and b, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    sa_shape, sb_shape = fp8_block_shapes(a, b)
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        check_fp32_scale(name, t, a.device, rule)
    if tuple(scale_a.shape) != sa_shape:
        raise ValueError(
            f"{rule}: scale_a must have shape (M, ceil(K/128)) = {sa_shape}, got {tuple(scale_a.shape)}"
        )
    if _scale_b_rows_ok(scale_b, sb_shape):
        scale_b = scale_b[: sb_shape[0]]  # torch's padded K blocks: the first ceil(K/128) rows
    if tuple(scale_b.shape) != sb_shape:
        hint = ""
        if tuple(scale_b.shape) == sb_shape[::-1]:
            hint = " (it has the (N/128, K/128) shape of the (N, K) weight's scales: pass scale_b.t(), as b = w.t())"
        raise ValueError(
            f"{rule}: scale_b must have shape (ceil(K/128), ceil(N/128)) = {sb_shape} (its K blocks may be "
            f"padded to a multiple of 4 rows), got "
            f"{tuple(scale_b.shape)}{hint}"
        )
    if not kernel_layout:  # validation only (the reference): no copies
        return scale_a, scale_b.t()
    return tma_scale_a(scale_a), k_contiguous_scale_b(scale_b.t(), a.shape[0])


def fp8_blockwise_ref(a, b, scale_a, scale_b, compute_dtype=torch.float32):
    """Dequantize-then-matmul reference of FP8 block scaling: every element of a times its
    (row, K block) scale, every element of b times its (K block, N block) scale, then one matmul
    in ``compute_dtype`` (equal to the sum over K blocks of the scaled block products)."""
    k, n = b.shape
    sa = scale_a.to(compute_dtype).repeat_interleave(FP8_BLOCK, dim=1)[:, :k]
    sb = scale_b.to(compute_dtype).repeat_interleave(FP8_BLOCK, dim=0)[:k]
    sb = sb.repeat_interleave(FP8_BLOCK, dim=1)[:, :n]
    return torch.matmul(a.to(compute_dtype) * sa, b.to(compute_dtype) * sb)


def fp8_grouped_block_scales(a, b, scale_a, scale_b):
    """FP8 block scaling of the packed grouped form: a (total_M, K), b (E, K, N), scale_a
    (total_M, ceil(K/128)) per 1x128 block of a token row, scale_b (E, ceil(K/128), ceil(N/128))
    per 128x128 block of each expert's weight (a 3-D scale_b is what asks for it; its K blocks
    may be padded to a multiple of 4 rows, torch's layout, the padding never read). Returns
    (scale_a, scale_b as the kernel's (NB, KB, E) view), scale_a M-major (``tma_scale_a``), scale_b
    read in place with any strides (but ``k_contiguous_scale_b``); None
    when scale_b is not 3-D (row-wise / per-tensor / none)."""
    if not (isinstance(scale_b, torch.Tensor) and scale_b.dim() == 3):
        if isinstance(scale_a, torch.Tensor) and scale_a.dim() == 2 and scale_a.shape[1] > 1:
            raise ValueError(
                "grouped FP8 block scaling needs scale_b of shape (E, ceil(K/128), ceil(N/128)) "
                f"(128x128 blocks per expert) beside a 2-D scale_a, got scale_b "
                f"{None if scale_b is None else tuple(getattr(scale_b, 'shape', ()))}"
            )
        return None
    rule = "grouped FP8 block scaling (1x128 scales of a, 128x128 scales of b per expert)"
    E, k, n = b.shape
    kb, nb = -(-k // FP8_BLOCK), -(-n // FP8_BLOCK)
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        check_fp32_scale(name, t, a.device, rule)
    if tuple(scale_a.shape) != (a.shape[0], kb):
        raise ValueError(
            f"{rule}: scale_a must have shape (total_M, ceil(K/128)) = {(a.shape[0], kb)}, got {tuple(scale_a.shape)}"
        )
    if scale_b.shape[0] == E and _scale_b_rows_ok(scale_b, (kb, nb)):
        scale_b = scale_b[:, :kb]  # torch's padded K blocks (a multiple of 4 rows): the first ceil(K/128)
    if tuple(scale_b.shape) != (E, kb, nb):
        hint = ""
        if tuple(scale_b.shape) == (E, nb, kb):
            hint = " (it has the (E, N/128, K/128) shape of an (E, N, K) weight's scales: pass scale_b.transpose(1, 2))"
        raise ValueError(
            f"{rule}: scale_b must have shape (E, ceil(K/128), ceil(N/128)) = {(E, kb, nb)} (its K blocks "
            f"may be padded to a multiple of 4 rows), got {tuple(scale_b.shape)}{hint}"
        )
    return tma_scale_a(scale_a), k_contiguous_scale_b(scale_b.permute(2, 1, 0), a.shape[0])
