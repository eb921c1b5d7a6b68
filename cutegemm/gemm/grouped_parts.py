"""Device-side pieces of the packed grouped (MoE) GEMM shared by the sm_90a and sm_100a kernels.

Both kernels run the same grouped protocol around their arch-specific MMA:

1. shared memory holds a ``tile_start`` table of E + 1 Int32 (:func:`tile_table_len`,
   :func:`tile_table`); before ``pipeline_init_wait`` warp 0 fills it from ``offs``
   (``if warp_idx == 0: fill_tile_starts(...)``, written in the kernel body: the same ``if``
   inside a nested ``cute.jit`` helper changed the sm_90a SASS);
2. after ``pipeline_init_wait`` every thread syncs and builds the scheduler from the table
   (:func:`make_grouped_scheduler`); its tiles are (m_tile, n_tile, expert, row_start, row_end);
3. A is read from the expert's first row (:func:`from_row`, the load role's ``a_tiles(tile)``);
4. the output tile of a grouped tile is C offset by row_start (:func:`grouped_out_tile`); it is
   TMA-stored when every row belongs to the expert, otherwise stored by predicated copies
   (``gemm.store.store_subtile_predicated``).

The list form (``GemmConfig.listed``: groups of arbitrary M, N, K, each with its own tensors) runs
a protocol of the same shape:

1. the host's group table (``schedulers.grouped.LIST_FIELDS`` int64 per group, a row with the
   tile count, then room for 3 x 128-byte descriptors per group) is the ``offs`` argument;
   :func:`launch_list_descriptors` runs the prep kernel (:func:`list_descriptors_kernel`) on the
   GEMM's stream first: each group's A, B, C descriptors, the launch's template descriptors with
   the group's address, extents and leading dimension;
2. warp 0 copies the groups' first tiles into the same shared-memory table
   (``fill_list_tile_starts``), then :func:`make_list_scheduler`; its tiles are (m_tile, n_tile,
   0, group), so the launch's TMA coordinate tensors (group 0's shapes) index them;
3. the load role and the storing warp pass :func:`list_descriptor` of the tile's group to every
   TMA copy (after an acquire fence); the descriptors' extents clip the boxes, so a partial tile
   needs no predicated path; :func:`list_k_tiles` gives each group's own K-tile count.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync
from cutlass.tensor_utils import TensorMapManager, TensorMapUpdateMode

from ..schedulers.grouped import (
    LIST_FIELDS,
    LIST_K,
    LIST_LD_A,
    LIST_LD_B,
    LIST_LD_C,
    LIST_M,
    LIST_N,
    LIST_PTR_A,
    LIST_PTR_B,
    LIST_PTR_C,
    LIST_TILE,
    GroupedScheduler,
    ListScheduler,
    fill_list_tile_starts,
    fill_tile_starts,
    group_range,
)

__all__ = [
    "GROUPED_MAX_GROUPS",
    "fill_list_tile_starts",
    "fill_tile_starts",
    "from_row",
    "grouped_acc_coords",
    "grouped_acc_space",
    "grouped_k_tiles",
    "offset_k_tiles",
    "grouped_out_tile",
    "list_descriptor",
    "launch_kgrouped_table",
    "launch_list_descriptors",
    "list_descriptors_kernel",
    "list_groups",
    "list_k_tiles",
    "list_roles",
    "list_tile_table",
    "make_list_scheduler",
    "make_grouped_scheduler",
    "tile_table",
    "tile_table_bytes",
    "tile_table_len",
]

GROUPED_MAX_GROUPS = 1024  # capacity of the shared-memory tile-start table (grouped kernels)


def tile_table_len(grouped: bool) -> int:
    """Int32 entries of the SharedStorage ``tile_start`` member (1 for dense: unused).
    ``grouped``: the packed or the list form."""
    return GROUPED_MAX_GROUPS + 1 if grouped else 1


def tile_table_bytes(grouped: bool) -> int:
    """Shared-memory bytes the table takes from the stage budget (0 for dense)."""
    return 4 * (GROUPED_MAX_GROUPS + 1) if grouped else 0


def tile_table(table_storage, n_out, tile_n: int, cluster_n: int):
    """(tile_start, n_cluster_tiles): the table in shared memory (E + 1 Int32) and the number of
    cluster tiles along N. One warp then fills the table from offs before ``pipeline_init_wait``:
    ``fill_tile_starts(tile_start, mOffs, total_m, tile_m, n_cluster_tiles, lane)``; it is visible
    to every thread once :func:`make_grouped_scheduler` has synced the CTA."""
    tile_start = table_storage.get_tensor(cute.make_layout(GROUPED_MAX_GROUPS + 1))
    return tile_start, cute.ceil_div(n_out, tile_n * cluster_n)


def make_grouped_scheduler(tile_start, mOffs, total_m, n_cluster_tiles, cfg) -> GroupedScheduler:
    """Every thread of the CTA: wait until the table is written, then the scheduler over it for
    the GemmConfig ``cfg`` (tile, cluster, raster / group). (The table must have been filled with
    ``tile_m * cluster_m`` rows per cluster tile and ``n_cluster_tiles`` along N.)"""
    cute.arch.sync_threads()  # the table is visible to every role
    if cutlass.const_expr(cfg.swap_ab):
        # Tokens (grouped) along the tile's N, one CTA each; the cluster's CTAs along the weights.
        return GroupedScheduler.create(
            tile_start, mOffs, total_m, cfg.tile_n, cfg.cluster_m, 1, n_cluster_tiles, cfg.raster == "m", cfg.group, True
        )
    return GroupedScheduler.create(
        tile_start, mOffs, total_m, cfg.tile_m, cfg.cluster_n, cfg.cluster_m, n_cluster_tiles, cfg.raster == "m", cfg.group
    )


def from_row(t: cute.Tensor, row_start) -> cute.Tensor:
    """(M, ...) tensor viewed from row ``row_start`` on (an expert's rows start anywhere)."""
    return cute.domain_offset((row_start, 0, 0), t)


def offset_k_tiles(tma_atom, cta_coord, cta_layout, smem: cute.Tensor, tensor: cute.Tensor, tiler, mn_tile, origin):
    """(TMA, RestK) TMA k-tiles of ``tensor`` (rows, K, 1) viewed from ``origin`` (row, K column,
    0) on, row tile ``mn_tile`` of ``tiler`` (rows, K) tiles; ``smem`` (rows, K, STAGE) as the
    load stages hold them. Grouped: rows from the expert's first row; K-grouped: K from the
    expert's slice (an origin need not be a multiple of the tile)."""
    g = cute.local_tile(cute.domain_offset(origin, tensor), tiler, (None, None, None))
    _, t = cpasync.tma_partition(tma_atom, cta_coord, cta_layout, cute.group_modes(smem, 0, 2), cute.group_modes(g, 0, 2))
    return t[(None, mn_tile, None, 0)]


def grouped_k_tiles(tma_atom, cta_coord, cta_layout, smem: cute.Tensor, tensor: cute.Tensor, tiler, tile):
    """:func:`offset_k_tiles` of grouped tile ``tile``: rows from its expert's first row
    (tile[3]), m-tile tile[0]. (The sm_90a A operand and its MXFP8 scales.)"""
    return offset_k_tiles(tma_atom, cta_coord, cta_layout, smem, tensor, tiler, tile[0], (tile[3], 0, 0))


def grouped_acc_space(mC: cute.Tensor, mB: cute.Tensor):
    """Identity tensor over (total_M, GEMM columns, E) (mB is (N, K, E)): the epilogue coordinate
    (m, n, l) of a grouped accumulator element is its packed row, its GEMM column and its expert,
    so per-row vectors index the packed rows and per-(expert, column) vectors use l."""
    return cute.make_identity_tensor((mC.shape[0], mB.shape[0], mB.shape[2]))


def grouped_acc_coords(cAcc_tiles: cute.Tensor, tile) -> cute.Tensor:
    """(bM, bN) global coordinates of grouped tile ``tile``'s accumulator elements.

    cAcc_tiles: (bM, bN, RestM, RestN, RestE) tiles of :func:`grouped_acc_space`; the tile's rows
    start at its expert's first row, so the m coordinate is row_start + m_tile * bM + i."""
    m_tile, n_tile, expert, row_start, _ = tile
    return cute.domain_offset((row_start, 0), cAcc_tiles[(None, None, m_tile, n_tile, expert)])


def grouped_out_tile(mC: cute.Tensor, mC_gmem: cute.Tensor, tile, tile_mn):
    """Output tile of grouped tile ``tile`` = (m_tile, n_tile, expert, row_start, row_end).

    tile_mn: the OUTPUT tile (gated / FP4 outputs: fewer stored columns than GEMM columns).
    Returns (gC, gC_real, rows_left, cols_left, full_tile): the tile_mn tile of the TMA
    coordinate tensor ``mC`` and of C itself (``mC_gmem``), both counted from the expert's first
    row; how many of the tile's rows belong to the expert and how many columns lie inside N
    (either may exceed the tile); and whether every row belongs to the expert (TMA-storable).
    """
    m_tile, n_tile, _, row_start, row_end = tile
    gC = cute.local_tile(from_row(mC, row_start), tile_mn, (m_tile, n_tile, 0))
    gC_real = cute.local_tile(from_row(mC_gmem, row_start), tile_mn, (m_tile, n_tile, 0))
    rows_left = row_end - row_start - m_tile * tile_mn[0]
    cols_left = mC_gmem.shape[1] - n_tile * tile_mn[1]
    full_tile = rows_left >= tile_mn[0]
    return gC, gC_real, rows_left, cols_left, full_tile


# --- list form (sm_90a): one TMA descriptor per (group, operand), written by a prep kernel -----
DESC_BYTES = 128  # one TMA descriptor (CUtensorMap)
_DESC_MANAGER = TensorMapManager(TensorMapUpdateMode.GMEM, DESC_BYTES)


def list_groups(mTable: cute.Tensor):
    """G of a list-form table tensor: (G + 1) rows of LIST_FIELDS int64, then the descriptor
    workspace, 3 x 128 bytes per group (128-byte aligned: a row is 128 bytes)."""
    return (mTable.shape[0] - LIST_FIELDS) // (LIST_FIELDS + 3 * DESC_BYTES // 8)


def list_descriptor(mTable: cute.Tensor, num_groups, g, which: int, space=cute.AddressSpace.generic):
    """Pointer to the TMA descriptor of group g's operand ``which`` (0 A, 1 B, 2 C), in the
    workspace behind the table's rows: generic for the copies, gmem for the prep kernel's
    writes."""
    ptr = mTable.iterator + (num_groups + 1) * LIST_FIELDS + (g * 3 + which) * (DESC_BYTES // 8)
    return _DESC_MANAGER.get_tensormap_ptr(ptr, space)


def list_roles(mTable: cute.Tensor, num_groups, tile_k: int):
    """The list form's per-tile functions for the kernel roles: (K tiles of the tile's group,
    its A and B descriptors for the load role, its C descriptor for the storing warp). A list
    tile is (m, n, 0, group): it indexes the launch's TMA coordinate tensors (group 0's shapes;
    coordinates past them are fine) and its group's descriptors' extents clip the boxes."""

    def k_tiles(tile):
        return list_k_tiles(mTable, tile[3], tile_k)

    def load_descs(tile):
        return list_descriptor(mTable, num_groups, tile[3], 0), list_descriptor(mTable, num_groups, tile[3], 1)

    def out_desc(tile):
        return list_descriptor(mTable, num_groups, tile[3], 2)

    return k_tiles, load_descs, out_desc


def list_tile_table(table_storage, mTable: cute.Tensor, warp_idx):
    """List form, before ``pipeline_init_wait``: (tile_start, G). Warp 0 copies the groups' first
    tiles from the group table into the shared-memory table (``fill_list_tile_starts``); it is
    visible to every thread once :func:`make_list_scheduler` has synced the CTA."""
    num_groups = list_groups(mTable)
    tile_start = table_storage.get_tensor(cute.make_layout(GROUPED_MAX_GROUPS + 1))
    _fill_list_table_warp0(tile_start, mTable, num_groups, warp_idx)
    return tile_start, num_groups


@cute.jit
def _fill_list_table_warp0(tile_start: cute.Tensor, mTable: cute.Tensor, num_groups, warp_idx):
    if warp_idx == 0:
        fill_list_tile_starts(tile_start, mTable, num_groups, cute.arch.lane_idx())


def make_list_scheduler(tile_start, mTable, num_groups, tile_m: int) -> ListScheduler:
    """Every thread of the CTA, after warp 0 has filled ``tile_start`` from the table
    (``fill_list_tile_starts``): sync, then the scheduler over it."""
    cute.arch.sync_threads()
    return ListScheduler.create(tile_start, mTable, num_groups, tile_m)


@cute.jit
def list_k_tiles(mTable: cute.Tensor, g, tile_k: cutlass.Constexpr):
    """K tiles of group g (0 when its K is 0: the tile stores alpha * 0)."""
    k = cutlass.Int32(mTable[g * LIST_FIELDS + LIST_K])
    return (k + (tile_k - 1)) // tile_k


@cute.jit
def _list_operand(mTable: cute.Tensor, g, which: cutlass.Constexpr, dtype: cutlass.Constexpr,
                  rows_field: cutlass.Constexpr, cols_field: cutlass.Constexpr, unit_mode: cutlass.Constexpr):  # fmt: skip
    """Group g's operand ``which`` as a (rows, cols, 1) global tensor with its leading dimension
    on the mode that is not ``unit_mode`` (extents clamped to >= 1: an empty operand's
    descriptor is never used, but stays a valid one)."""
    row = g * LIST_FIELDS
    ptr = cute.make_ptr(dtype, mTable[row + LIST_PTR_A + which], cute.AddressSpace.gmem, assumed_align=16)
    rows = cutlass.max(cutlass.Int32(mTable[row + rows_field]), 1)
    cols = cutlass.max(cutlass.Int32(mTable[row + cols_field]), 1)
    ld = mTable[row + LIST_LD_A + which]  # LIST_LD_A / _B / _C
    stride = (ld, 1, 0) if unit_mode == 1 else (1, ld, 0)
    return cute.make_tensor(ptr, cute.make_layout((rows, cols, 1), stride=stride))


def launch_list_descriptors(tma_atoms, mTable: cute.Tensor, dtypes, unit_modes, stream):
    """From a kernel's host ``__call__``: the prep kernel (:func:`list_descriptors_kernel`), one
    CTA per group, on the GEMM's stream before the GEMM. ``unit_modes``: the unit-stride mode of
    A (M, K), B (N, K), C (M, N)."""
    list_descriptors_kernel(*tma_atoms, mTable, dtypes, unit_modes).launch(
        grid=(list_groups(mTable), 1, 1), block=[96, 1, 1], stream=stream
    )


@cute.kernel
def list_descriptors_kernel(
    tma_atom_a: cute.CopyAtom, tma_atom_b: cute.CopyAtom, tma_atom_c: cute.CopyAtom,
    mTable: cute.Tensor, dtypes: cutlass.Constexpr, unit_modes: cutlass.Constexpr,
):  # fmt: skip
    """Grid (G, 1, 1), 3 warps: warp w writes group blockIdx.x's descriptor of operand w (A (M, K),
    B (N, K), C (M, N)): the template's descriptor (the launch's atom: dtype, box, swizzle) with
    the group's address, extents and leading dimension (``tensormap.replace``), then a release
    fence for the tensormap proxy. Launched on the GEMM's stream right before it."""
    g, _, _ = cute.arch.block_idx()
    w = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    num_groups = list_groups(mTable)
    atoms = (tma_atom_a, tma_atom_b, tma_atom_c)
    fields = ((LIST_M, LIST_K), (LIST_N, LIST_K), (LIST_M, LIST_N))
    for which in cutlass.range_constexpr(3):
        if w == which:
            ptr = list_descriptor(mTable, num_groups, g, which, cute.AddressSpace.gmem)
            with cute.arch.elect_one():
                cpasync.copy_tensormap(atoms[which], ptr)
            cute.arch.sync_warp()
            cute.arch.fence_acq_rel_cta()
            t = _list_operand(mTable, g, which, dtypes[which], fields[which][0], fields[which][1], unit_modes[which])
            cpasync.update_tma_descriptor(atoms[which], t, ptr)
            cute.arch.sync_warp()
            cpasync.fence_tma_desc_release()


def launch_kgrouped_table(mOffs: cute.Tensor, mTable: cute.Tensor, mA: cute.Tensor, mB: cute.Tensor,
                          mC: cute.Tensor, tile_mn, stream):  # fmt: skip
    """The K-grouped form on the list-form kernel (sm_100a), in the host ``__call__`` before the
    descriptor prep kernel: :func:`kgrouped_table_kernel`, one CTA per expert, writes the list
    form's group table from offs on the device (no host sync: graph-capturable)."""
    kgrouped_table_kernel(mOffs, mTable, mA, mB, mC, tile_mn).launch(
        grid=(mOffs.shape[0], 1, 1), block=[128, 1, 1], stream=stream
    )


@cute.kernel
def kgrouped_table_kernel(mOffs: cute.Tensor, mTable: cute.Tensor, mA: cute.Tensor, mB: cute.Tensor,
                          mC: cute.Tensor, tile_mn: cutlass.Constexpr):  # fmt: skip
    """Grid (E, 1, 1): CTA e writes expert e's row of the group table (``schedulers.grouped``'s
    LIST_* fields) for the K-grouped form out[e] = A[:, k_e] @ B[k_e, :]. A is (M, K, 1) M-major
    and B (N, K, 1) N-major, so an expert's operands start at its first K row (k_start times the
    leading dimension: 16-byte aligned when the leading dimensions are). C is (M, N, E). The
    expert's K slice is clamped as the grouped forms clamp offs (``group_range``); an empty one
    owns no tiles and its CTA writes zeros into out[e]. Tile starts count the tiles of the
    non-empty experts before it; the last CTA writes the total row."""
    e, _, _ = cute.arch.block_idx()
    tidx, _, _ = cute.arch.thread_idx()
    num_e = mOffs.shape[0]
    total_k, m, n = mA.shape[1], mC.shape[0], mC.shape[1]
    k_start, k_end = group_range(mOffs, e, total_k)
    tiles = ((m + tile_mn[0] - 1) // tile_mn[0]) * ((n + tile_mn[1] - 1) // tile_mn[1])
    if tidx == 0:
        before = cutlass.Int32(0)
        for j in range(e):
            s, t = group_range(mOffs, j, total_k)
            before += cutlass.select_(t > s, 1, 0)
        lda, ldb = cutlass.Int64(mA.layout.stride[1]), cutlass.Int64(mB.layout.stride[1])
        row = e * LIST_FIELDS
        mTable[row + LIST_PTR_A] = mA.iterator.toint() + cutlass.Int64(k_start) * lda * (mA.element_type.width // 8)
        mTable[row + LIST_PTR_B] = mB.iterator.toint() + cutlass.Int64(k_start) * ldb * (mB.element_type.width // 8)
        mTable[row + LIST_PTR_C] = mC.iterator.toint() + cutlass.Int64(e) * cutlass.Int64(mC.layout.stride[2]) * (
            mC.element_type.width // 8
        )
        mTable[row + LIST_M] = cutlass.Int64(m)
        mTable[row + LIST_N] = cutlass.Int64(n)
        mTable[row + LIST_K] = cutlass.Int64(k_end - k_start)
        mTable[row + LIST_LD_A] = lda
        mTable[row + LIST_LD_B] = ldb
        mTable[row + LIST_LD_C] = cutlass.Int64(mC.layout.stride[0])
        mTable[row + LIST_TILE] = cutlass.Int64(before * tiles)
        if e == num_e - 1:  # the total row: the tile count after the last group
            mTable[num_e * LIST_FIELDS + LIST_TILE] = cutlass.Int64((before + cutlass.select_(k_end > k_start, 1, 0)) * tiles)
    if k_end <= k_start:
        for i in range(tidx, m * n, 128):
            mC[(i // n, i % n, e)] = mC.element_type(0)
