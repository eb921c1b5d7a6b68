"""Gathered A rows on Blackwell (``config.gather_a``, sm_100a): the packed grouped form reading A's
rows through an index with the TMA unit's ``.tile::gather4`` mode, so that a MoE layer's up
projection reads the tokens as they are instead of a copy permuted by expert.

``mAIdx`` (rows,) int32 maps every packed row (the experts' rows, in ``offs`` order) to its row of
A (``x``, (tokens, K) row-major). One ``cp.async.bulk.tensor.2d.tile::gather4`` loads four rows of
one K box: the load warp's elected thread issues ``tile_m / 4`` of them per stage, on the stage's
full barrier, with the bytes a tile load would bring (the barrier's transaction count is
unchanged). The TMA unit reads the four row indices from the index's copy in global memory; an
index outside [0, tokens) is out of the tensor map's bounds and fills its row with zeros.

The tile's last rows past the expert's end read the next rows of the index (other experts' rows,
whose results are never stored); past the index's end they read the host's padding
(:data:`INDEX_PAD` zeros after the index, ``cutegemm.grouped.gather``), so no read leaves the
index's buffer. A is not multicast (cluster_n 1) and the MMA is 1-CTA (the grouped form's rule).

Compiled and SASS-checked only: no sm_100a GPU has run it.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass._mlir.dialects import cute_nvgpu as _cute_nvgpu_ir
from cutlass.cute.nvgpu import cpasync

INDEX_PAD = 128  # index entries after the last packed row that the host fills (>= tile_m)


def gather_tma_atom(kernel, mA: cute.Tensor, mAIdx: cute.Tensor):
    """(atom, TMA tensor (rows, K), index tensor (rows, K)) of the gather4 load of A: ``mA`` is A
    itself as (tokens, K, 1), ``mAIdx`` the (rows,) index. The A box follows the MMA's operand
    partition as ``make_tiled_tma_atom_A`` builds it (1-CTA: the tile's rows and K tile)."""
    a2 = cute.make_tensor(mA.iterator, cute.make_ordered_layout((mA.shape[0], mA.shape[1]), order=(1, 0)))
    # mode 0 (rows) carries the gather indices, mode 1 (K, contiguous) is broadcast
    idx = cute.make_tensor(mAIdx.iterator, cute.make_layout((mAIdx.shape[0], mA.shape[1]), stride=(1, 0)))
    g_tile = cute.composition(cute.make_identity_layout(a2.shape), (kernel.mma_tiler[0], kernel.mma_tiler[2]))
    cta_v_map = kernel.tiled_mma._thrfrg_A(g_tile)
    cta_v_map = cute.dice(cute.get(cta_v_map, mode=[1]), (1, (1,) * cute.rank(g_tile)))
    smem = cute.slice_(kernel.a_smem_layout_staged, (None, None, None, 0))
    op = cpasync.CopyBulkTensor2DGather4G2SOp(kernel.cta_group)
    res = _cute_nvgpu_ir.atom_make_non_exec_2d_gather4_tma_load(
        a2.value, idx.layout, smem.value if hasattr(smem, "value") else smem, cta_v_map, op._to_ir(), num_multicast=1
    )
    return cute.CopyAtom(op, cpasync.CopyBulkTensor2DGather4G2SNonExecTrait(res[0])), res[1], idx


def _partition(kernel, tma_atom, thr_mma, sA: cute.Tensor, mA_rows: cute.Tensor, mIdx: cute.Tensor, first):
    """tma_partition of the (bM, bK, RestK) tiles of rows [first, first + tile_m): (TMA, STAGE)
    shared memory, (TMA, RestK) coordinates, (TMA, RestK) indices."""
    tiler = (kernel.mma_tiler[0], kernel.mma_tiler[2])
    g_rows = cute.local_tile(cute.domain_offset((first, 0), mA_rows), tiler, (0, None))
    g_idx = cute.local_tile(cute.domain_offset((first, 0), mIdx), tiler, (0, None))
    return cpasync.tma_partition(
        tma_atom, 0, cute.make_layout(1), cute.group_modes(sA, 0, 3),
        [cute.group_modes(thr_mma.partition_A(g_rows), 0, 3), cute.group_modes(thr_mma.partition_A(g_idx), 0, 3)],
    )  # fmt: skip


def gathered_smem(kernel, tma_atom, thr_mma, sA: cute.Tensor, mA_rows: cute.Tensor, mIdx: cute.Tensor) -> cute.Tensor:
    """(TMA, STAGE): the stages' partition of the gather4 load."""
    return _partition(kernel, tma_atom, thr_mma, sA, mA_rows, mIdx, 0)[0]


def gathered_a_tiles(kernel, tma_atom, thr_mma, sA: cute.Tensor, mA_rows: cute.Tensor, mIdx: cute.Tensor):
    """tile -> ((TMA, RestK) coordinates, (TMA, RestK) indices) of a grouped tile's A k-tiles:
    packed rows from the tile's first row (the expert's first row + its m-tiles), for
    ``GemmBase.load_ab``."""

    def a_tiles(tile):
        m_tile, _, _, row_start, _ = tile
        _, tAgA, tAgI = _partition(kernel, tma_atom, thr_mma, sA, mA_rows, mIdx, row_start + m_tile * kernel.mma_tiler[0])
        return tAgA, tAgI

    return a_tiles
