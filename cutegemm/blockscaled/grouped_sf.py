"""Scale factors of A for the grouped (MoE packed) block-scaled GEMM: every expert's rows start a
new 128-row block of the 128x4 swizzled layout.

A grouped tile covers rows ``row_start + 128 m`` .. of its expert, which rarely lie on a 128-row
boundary of the packed rows, while the scale-factor layout (and its TMA box) moves in whole
128-row blocks. So the kernel reads A's scales from a per-expert padded layout (as
``torch._scaled_grouped_mm``'s block-scaled recipes expect them): expert e's scale rows start at
``sf_start[e] = 128 * sum_{j<e} ceil(rows_j / 128)``, its m-tile m at block
``sf_start[e] / 128 + m``. With the kernel's tile table (``schedulers.grouped``), that block is
``tile_start[e] // n_cluster_tiles + m`` (tile_m 128, cluster_m 1).

:func:`grouped_scales_a` builds those bytes from a BlockScaledTensor of the packed rows on the
device (no host sync: the row map comes from ``offs`` with torch ops), padded to
``P = 128 * (ceil(total_M / 128) + E)`` rows, an upper bound that does not depend on offs'
contents. Rows past ``offs[-1]`` get no scales. :func:`padded_sf_rows_ref` is the plain-Python
twin of the row map (CPU tests). Arch-neutral: plain torch.
"""

from __future__ import annotations

import torch

from ..schedulers.grouped import expert_rows
from .layout import TILE_ROWS, to_swizzled
from .reference import BlockScaledTensor

__all__ = ["grouped_sf_rows", "grouped_scales_a", "padded_sf_rows_ref", "sf_rows_bound"]


def sf_rows_bound(total_m: int, num_experts: int) -> int:
    """Rows of the padded layout: >= sum_e 128 * ceil(rows_e / 128) for any valid offs."""
    return TILE_ROWS * (-(-total_m // TILE_ROWS) + num_experts)


def padded_sf_rows_ref(offs: list[int], total_m: int) -> list[int | None]:
    """Plain-Python twin: the padded scale row of every packed row (None: past offs[-1]), with
    the kernel's clamping of offs (``schedulers.grouped.expert_rows``)."""
    dest: list[int | None] = [None] * total_m
    block = 0
    for start, end in expert_rows(offs, total_m):
        for r in range(start, end):
            if dest[r] is None:
                dest[r] = block * TILE_ROWS + r - start
        block += -(-(end - start) // TILE_ROWS)
    return dest


def grouped_sf_rows(offs: torch.Tensor, total_m: int) -> torch.Tensor:
    """(total_M,) int64 on offs' device: the padded scale row of every packed row, or
    ``sf_rows_bound`` (a dump row) for rows of no expert. Valid (non-decreasing) offs give
    :func:`padded_sf_rows_ref`; other offs give some row inside the buffer (memory-safe)."""
    E = offs.numel()
    bound = sf_rows_bound(total_m, E)
    o = offs.to(torch.int64).clamp(0, total_m)
    prev = torch.cat([o.new_zeros(1), o[:-1]])
    end = torch.maximum(o, prev)
    rows = end - prev
    blocks = (rows + TILE_ROWS - 1) // TILE_ROWS
    sf_start = (torch.cumsum(blocks, 0) - blocks) * TILE_ROWS
    r = torch.arange(total_m, device=offs.device, dtype=torch.int64)
    e = torch.searchsorted(end, r, right=True)  # the first expert whose rows end after r
    inside = e < E
    ec = e.clamp(max=E - 1)
    dest = sf_start[ec] + r - prev[ec]
    ok = inside & (r >= prev[ec]) & (dest >= 0) & (dest < bound)
    return torch.where(ok, dest, torch.full_like(dest, bound))


def grouped_scales_a(qa: BlockScaledTensor, offs: torch.Tensor) -> torch.Tensor:
    """The kernel's A scales: (P, ceil(K / block) rounded to 4) bytes of the 128x4 swizzled layout
    over the per-expert padded rows (P = :func:`sf_rows_bound`), flat."""
    total_m = qa.shape[-2]
    E = offs.numel()
    plain = qa.plain_scales()
    bound = sf_rows_bound(total_m, E)
    buf = plain.view(torch.uint8).new_zeros((bound + 1, plain.shape[-1]))
    if total_m:
        buf.index_copy_(0, grouped_sf_rows(offs, total_m), plain.view(torch.uint8))
    return to_swizzled(buf[:bound].view(plain.dtype)).reshape(-1)
