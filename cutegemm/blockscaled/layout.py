"""The 128x4 ("32x4x4") swizzled scale-factor layout used by cuBLAS, CUTLASS and torch.

Plain scales have shape ``(rows, cols)`` with ``cols = ceil(K / block_size)``, optionally with a
leading batch dimension ``(L, rows, cols)``. The swizzled form pads ``rows`` to a multiple of
128 and ``cols`` to a multiple of 4 (padding bytes are zero) and cuts the result into 128x4
tiles of 512 bytes each. Tiles are stored row-of-tiles major (tile ``(i, j)`` at tile index
``i * (cols_padded // 4) + j``), and inside a tile the scale of row ``r`` and column ``c`` sits
at byte offset ``(r % 32) * 16 + (r // 32) * 4 + c``.

The swizzled tensor is returned with shape ``(rows_padded, cols_padded)`` (or
``(L, rows_padded, cols_padded)``); only its flat byte order is meaningful, and it equals
``torch.testing._internal.common_quantized.to_blocked`` (which returns the same bytes flattened),
i.e. what ``torch._scaled_mm`` expects for ``SWIZZLE_32_4_4``.

Both directions work on the raw ``uint8`` view and return the dtype they were given, so they
apply equally to ``float8_e8m0fnu`` (MX) and ``float8_e4m3fn`` (NVFP4) scales.
"""

from __future__ import annotations

import torch

__all__ = ["TILE_ROWS", "TILE_COLS", "swizzled_shape", "to_swizzled", "from_swizzled"]

TILE_ROWS = 128
TILE_COLS = 4


def _ceil_to(n: int, m: int) -> int:
    return -(-n // m) * m


def swizzled_shape(rows: int, cols: int) -> tuple[int, int]:
    """Padded ``(rows, cols)`` of the swizzled layout for a ``(rows, cols)`` plain scale tensor."""
    return _ceil_to(rows, TILE_ROWS), _ceil_to(cols, TILE_COLS)


def _check_byte_tensor(t: object, arg: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{arg}: expected a torch.Tensor, got {type(t).__name__}")
    if t.element_size() != 1:
        raise TypeError(f"{arg}: expected a 1-byte dtype (e8m0/e4m3/uint8), got {t.dtype}")
    return t


def to_swizzled(scales_plain: torch.Tensor) -> torch.Tensor:
    """Convert plain scales ``(rows, cols)`` or ``(L, rows, cols)`` to the 128x4 swizzled layout.

    Returns a new contiguous tensor of the same dtype with shape ``(rows_p, cols_p)`` (or
    ``(L, rows_p, cols_p)``), ``rows_p``/``cols_p`` rounded up to multiples of 128/4, whose
    flat bytes follow the tile layout described in the module docstring; padding is zero bytes.

    Raises:
        TypeError: ``scales_plain`` is not a tensor of a 1-byte dtype.
        ValueError: ``scales_plain`` is not 2-D or 3-D.
    """
    _check_byte_tensor(scales_plain, "scales_plain")
    if scales_plain.dim() not in (2, 3):
        raise ValueError(
            f"scales_plain: expected shape (rows, cols) or (L, rows, cols), got {tuple(scales_plain.shape)}"
        )
    batched = scales_plain.dim() == 3
    src = scales_plain.view(torch.uint8)
    if not batched:
        src = src.unsqueeze(0)
    nb, rows, cols = src.shape
    rows_p, cols_p = swizzled_shape(rows, cols)
    padded = src.new_zeros((nb, rows_p, cols_p))
    padded[:, :rows, :cols] = src
    # row = i*128 + a*32 + b, col = j*4 + c  ->  tile (i, j), in-tile offset b*16 + a*4 + c
    tiles = padded.view(nb, rows_p // 128, 4, 32, cols_p // 4, 4).permute(0, 1, 4, 3, 2, 5)
    out = tiles.reshape(nb, rows_p, cols_p)
    if not batched:
        out = out.squeeze(0)
    return out.view(scales_plain.dtype)


def from_swizzled(swizzled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Invert :func:`to_swizzled`: recover the plain ``(rows, cols)`` scales.

    ``swizzled`` may have any shape holding exactly ``rows_p * cols_p`` elements (e.g. the
    ``(rows_p, cols_p)`` output of :func:`to_swizzled` or torch's flat ``to_blocked`` output),
    giving a ``(rows, cols)`` result; a 3-D ``(L, ...)`` tensor holding ``L * rows_p * cols_p``
    elements gives ``(L, rows, cols)``. Returns a new contiguous tensor of the same dtype.

    Raises:
        TypeError: ``swizzled`` is not a tensor of a 1-byte dtype.
        ValueError: ``rows``/``cols`` are not positive or the element count does not match.
    """
    _check_byte_tensor(swizzled, "swizzled")
    for arg, val in (("rows", rows), ("cols", cols)):
        if not isinstance(val, int) or val <= 0:
            raise ValueError(f"{arg}: expected a positive int, got {val!r}")
    rows_p, cols_p = swizzled_shape(rows, cols)
    batched = swizzled.dim() == 3
    nb = swizzled.shape[0] if batched else 1
    if swizzled.numel() != nb * rows_p * cols_p:
        raise ValueError(
            f"swizzled: expected {nb} x {rows_p} x {cols_p} elements for rows={rows}, "
            f"cols={cols}, got shape {tuple(swizzled.shape)}"
        )
    src = swizzled.contiguous().view(torch.uint8)
    tiles = src.reshape(nb, rows_p // 128, cols_p // 4, 32, 4, 4).permute(0, 1, 4, 3, 2, 5)
    out = tiles.reshape(nb, rows_p, cols_p)[:, :rows, :cols].contiguous()
    if not batched:
        out = out.squeeze(0)
    return out.view(swizzled.dtype)
