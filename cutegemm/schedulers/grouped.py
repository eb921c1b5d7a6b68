"""Grouped (MoE) tile scheduler: the tile -> (expert, m-tile, n-tile) map is computed on the device
from the ``offs`` tensor, so no host sync is needed and a captured CUDA graph stays correct when
the contents of ``offs`` change between replays.

Problem: A packed (total_M, K); expert e owns rows [start_e, end_e) with end_e = offs[e] and
start_e = offs[e - 1] (0 for e = 0), both clamped into [0, total_M] and end_e >= start_e (bad
offsets stay memory-safe: an expert gets a clamped, possibly empty, row range). Expert e has
ceil((end_e - start_e) / tile_m) m-tiles; every m-tile is paired with every N cluster tile.

Order: expert-major. Inside an expert the (m, n) cluster tiles follow the config's raster and
group, as a dense problem of the expert's size would (``static.swizzled_tile_coord``). The default
(raster "m", group 1) walks m fastest over the whole expert, so CTAs working at the same time share
the expert's B columns (the weights, the big operand) in L2. Raster "n" with group G walks bands
of G m-tiles, m fastest inside a band and the band along N: for experts of thousands of rows the
CTAs in flight then share a band's A rows as well as B columns.

At kernel start one warp turns offs into ``tile_start[e]`` (the first linear tile of expert e,
``tile_start[E]`` = total) in shared memory; a tile index is then mapped by a binary search.
:func:`grouped_tile_map` is the plain-Python twin used by the CPU tests.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from .static import PersistentWalk, swizzled_tile_coord


def expert_rows(offs, total_m):
    """[(start_e, end_e)] with the clamping rules of the kernel (plain Python)."""
    rows, prev = [], 0
    for o in offs:
        end = min(max(int(o), 0), total_m)
        start = min(max(prev, 0), total_m)
        rows.append((start, max(end, start)))
        prev = int(o)
    return rows


def k_window_ref(start: int, end: int, tile_k: int, align: int) -> tuple[int, int, int, int]:
    """Plain-Python twin of the K-grouped kernel's K window (``GemmSm90.kernel``'s ``k_range``)
    for an expert whose K slice is [start, end): (k0, K tiles, head, rem). The TMA boxes start
    at k0 = start rounded down to ``align`` elements (16 bytes) and cover K tiles of tile_k
    columns (0 for an empty slice); the first tile's columns before ``head`` and, when rem > 0,
    the last tile's columns from ``rem`` on are zeroed in shared memory."""
    k0 = start - start % align
    n_k = -(-(end - k0) // tile_k) if end > start else 0
    return k0, n_k, start - k0, (end - k0) % tile_k


def grouped_tile_map(offs, total_m: int, tile_m: int, n_tiles: int, cluster_m: int = 1, raster_m: bool = True, group: int = 1):
    """Linear cluster tile index -> (expert, row_start, row_end, m_tile, n_tile), in the kernel's
    order; with ``cluster_m`` > 1, m_tile is the cluster's first m-tile (CTA r of the cluster
    takes m_tile + r; a CTA past the expert's rows has an empty tile). ``raster_m`` / ``group``:
    the order inside an expert (see the module docstring)."""
    out = []
    for e, (start, end) in enumerate(expert_rows(offs, total_m)):
        mt = -(-(end - start) // (tile_m * cluster_m))
        for t in range(mt * n_tiles):
            m, n = expert_tile(t, mt, n_tiles, raster_m, group)
            out.append((e, start, end, m * cluster_m, n))
    return out


def expert_tile(local, mt, nt, raster_m: bool, group: int, min_fn=min):
    """Tile ``local`` of an expert with mt x nt cluster tiles -> (m, n) cluster tile (Python ints
    or DSL Int32; ``raster_m`` / ``group`` compile-time)."""
    if raster_m and group == 1:  # m fastest over the whole expert (the default)
        return local % mt, local // mt
    m, n, _ = swizzled_tile_coord(local, mt, nt, group, raster_m, min_fn)
    return m, n


@cute.jit
def group_range(mOffs: cute.Tensor, e: cutlass.Int32, total_m: cutlass.Int32):
    """(start, end) of group e (its rows, or its K slice in the K-grouped form), clamped into
    [0, total_m] with end >= start."""
    end = cutlass.min(cutlass.max(cutlass.Int32(mOffs[e]), 0), total_m)
    prev = cutlass.Int32(0)
    if e > 0:
        prev = cutlass.Int32(mOffs[e - 1])
    start = cutlass.min(cutlass.max(prev, 0), total_m)
    return start, cutlass.max(end, start)


@cute.jit
def _group_tiles(mOffs: cute.Tensor, e: cutlass.Int32, total_m: cutlass.Int32, tile_m: cutlass.Constexpr):
    start, end = group_range(mOffs, e, total_m)
    return (end - start + (tile_m - 1)) // tile_m


@cute.jit
def fill_tile_starts(
    tile_start: cute.Tensor, mOffs: cute.Tensor, total_m: cutlass.Int32, tile_m: cutlass.Constexpr,
    n_cluster_tiles: cutlass.Int32, lane: cutlass.Int32,
):  # fmt: skip
    """One warp: tile_start[e] = sum_{j<e} m_tiles(j) * n_cluster_tiles (exclusive scan)."""
    num_groups = cute.size(mOffs)
    per_lane = (num_groups + 31) // 32
    first = lane * per_lane
    # Pass 1: this lane's sum over its experts.
    local = cutlass.Int32(0)
    for i in range(per_lane):
        e = first + i
        if e < num_groups:
            local += _group_tiles(mOffs, e, total_m, tile_m) * n_cluster_tiles
    # Exclusive prefix over lanes (Hillis-Steele inclusive scan, then subtract own).
    incl = local
    for shift in cutlass.range_constexpr(5):
        other = cute.arch.shuffle_sync_up(incl, 1 << shift)
        if lane >= (1 << shift):
            incl += other
    run = incl - local
    # Pass 2: write the exclusive prefix for this lane's experts.
    for i in range(per_lane):
        e = first + i
        if e < num_groups:
            tile_start[e] = run
            run += _group_tiles(mOffs, e, total_m, tile_m) * n_cluster_tiles
    if lane == 31:
        tile_start[num_groups] = incl


@cute.jit
def owner_group(tile_start: cute.Tensor, num_groups: cutlass.Int32, work: cutlass.Int32):
    """Binary search: the last group g with tile_start[g] <= work (empty groups share a start;
    the search lands on the last of them, the one that owns the tile)."""
    lo = cutlass.Int32(0)
    hi = num_groups - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tile_start[mid] <= work:
            lo = mid
        else:
            hi = mid - 1
    return lo


def even_split(count, parts, j):
    """[lo, hi) of part j when ``count`` items are split into ``parts`` parts of floor or ceil of
    count / parts items, in order (Python ints or DSL integers; no part is empty when parts <=
    count). The product j * (count % parts) stays below parts**2 (the kernel uses Int64)."""
    q, r = count // parts, count % parts
    lo = j * q + (j * r) // parts
    hi = (j + 1) * q + ((j + 1) * r) // parts
    return lo, hi


def swap_tile_map(offs, total_m: int, tile_n: int, m_tiles: int, cluster_m: int = 1):
    """Plain-Python twin of the swapped grouped scheduler (``GemmConfig.swap_ab``): linear cluster
    tile -> (expert, token_start, token_end, weight_tile) of CTA 0 (CTA r takes weight_tile + r);
    each expert's tokens split evenly over ceil(tokens / tile_n) tiles, token tiles fastest."""
    out = []
    for e, (start, end) in enumerate(expert_rows(offs, total_m)):
        mt = -(-(end - start) // tile_n)
        for t in range(mt * m_tiles):
            lo, hi = even_split(end - start, mt, t % mt)
            out.append((e, start + lo, start + hi, (t // mt) * cluster_m))
    return out


class GroupedScheduler(PersistentWalk):
    """Device side. ``tile_start`` is a shared-memory Int32 tensor of E + 1 entries filled by
    :meth:`fill_tile_starts`. Holds only Int32 runtime values plus compile-time settings."""

    _dyn = ("total", "start", "stride", "num_groups", "cta_n", "total_m", "cta_m", "tiles_n")

    def __init__(self, tile_start, tile_m: int, cluster_n: int, values=None, cluster_m: int = 1, raster_m: bool = True,
                 group: int = 1, swap: bool = False):  # fmt: skip
        self.tile_start = tile_start
        self.tile_m = tile_m
        self.cluster_n = cluster_n
        self.cluster_m = cluster_m
        self.raster_m = raster_m
        self.group = group
        self.swap = swap
        self._set_values(values)

    @staticmethod
    def create(
        tile_start, mOffs, total_m, tile_m: int, cluster_n: int, cluster_m: int = 1, n_cluster_tiles=1,
        raster_m: bool = True, group: int = 1, swap: bool = False,
    ) -> GroupedScheduler:  # fmt: skip
        """``swap`` (``GemmConfig.swap_ab``): the grouped rows (tile_m of them per tile) are the
        GEMM's N and the other dimension (clusters of cluster_n CTAs) its M, so the CTA's place
        along it is blockIdx.x and :meth:`cta_tile` returns the two tile indices swapped."""
        bx, by, cluster_id = cute.arch.block_idx()
        _, _, num_clusters = cute.arch.grid_dim()
        num_groups = cutlass.Int32(cute.size(mOffs))
        values = (
            cutlass.Int32(tile_start[num_groups]),
            cutlass.Int32(cluster_id),
            cutlass.Int32(num_clusters),
            num_groups,
            cutlass.Int32(bx if swap else by) % cluster_n,
            cutlass.Int32(total_m),
            cutlass.Int32(bx) % cluster_m,
            cutlass.Int32(n_cluster_tiles),
        )
        sched = GroupedScheduler(tile_start, tile_m, cluster_n, values, cluster_m, raster_m, group, swap)
        sched.mOffs = mOffs
        return sched

    @cute.jit
    def cta_tile(self, work):
        """(m_tile, n_tile, expert, row_start, row_end): m_tile counts tiles from row_start. With
        cluster_m > 1 the cluster covers cluster_m consecutive m-tiles of one expert (CTA r takes
        the r-th); one past the expert's rows is an empty tile (row_end - row_start <= m_tile *
        tile_m): it loads and multiplies nothing useful and stores nothing. ``swap``: (n_tile,
        m_tile, ...), the grouped rows' tile second."""
        e = owner_group(self.tile_start, self.num_groups, work)
        local = work - self.tile_start[e]
        start, end = group_range(self.mOffs, e, self.total_m)
        rows_per_cluster = self.tile_m * self.cluster_m
        mt = (end - start + (rows_per_cluster - 1)) // rows_per_cluster
        m_c, n_c = expert_tile(local, mt, self.tiles_n, self.raster_m, self.group, cutlass.min)
        if cutlass.const_expr(self.swap):
            # The expert's tokens split evenly over its mt tiles (each gets floor or ceil of
            # tokens / mt, at most tile_m): tiles that share a weight tile then run at one speed
            # and read it from L2 together. The tile is returned as its own token range.
            t0, t1 = even_split(cutlass.Int64(end - start), cutlass.Int64(mt), cutlass.Int64(m_c))  # 64-bit: no overflow
            return n_c * self.cluster_n + self.cta_n, 0, e, start + cutlass.Int32(t0), start + cutlass.Int32(t1)
        return m_c * self.cluster_m + self.cta_m, n_c * self.cluster_n + self.cta_n, e, start, end


# --- list form -------------------------------------------------------------------------------
# The list-form kernel's group table: LIST_FIELDS int64 per group (row g), and one more row whose
# LIST_TILE field holds the total tile count. Built on the host from the tensors' metadata
# (``grouped.packed``), read on the device by the scheduler, the producer and the descriptor prep.
LIST_FIELDS = 16
LIST_PTR_A, LIST_PTR_B, LIST_PTR_C, LIST_M, LIST_N, LIST_K, LIST_LD_A, LIST_LD_B, LIST_LD_C, LIST_TILE = range(10)


def list_tile_map(shapes, tile_m: int, tile_n: int):
    """Plain-Python twin of :class:`ListScheduler`: linear tile index -> (group, m_tile, n_tile)
    for groups of (M, N) shapes, group-major, m fastest inside a group (its tiles share B)."""
    out = []
    for g, (m, n) in enumerate(shapes):
        mt, nt = -(-m // tile_m), -(-n // tile_n)
        out += [(g, t % mt, t // mt) for t in range(mt * nt)]
    return out


def list_tile_starts(shapes, tile_m: int, tile_n: int) -> list[int]:
    """Exclusive prefix of the groups' tile counts, then the total (G + 1 values)."""
    starts = [0]
    for m, n in shapes:
        starts.append(starts[-1] + -(-m // tile_m) * -(-n // tile_n))
    return starts


@cute.jit
def fill_list_tile_starts(tile_start: cute.Tensor, mTable: cute.Tensor, num_groups: cutlass.Int32, lane: cutlass.Int32):
    """One warp: the table's LIST_TILE column (G + 1 values) into shared memory."""
    for g in range(lane, num_groups + 1, 32):
        tile_start[g] = cutlass.Int32(mTable[g * LIST_FIELDS + LIST_TILE])


class ListScheduler(PersistentWalk):
    """Device side of the list form: a strided walk over every group's tiles; ``cta_tile`` is
    (m_tile, n_tile, 0, group) (L = 0: each group's descriptors address its own tensors)."""

    _dyn = ("total", "start", "stride", "num_groups")

    def __init__(self, tile_start, mTable, tile_m: int, values=None):
        self.tile_start = tile_start
        self.mTable = mTable
        self.tile_m = tile_m
        self._set_values(values)

    @staticmethod
    def create(tile_start, mTable, num_groups, tile_m: int) -> ListScheduler:
        _, _, cluster_id = cute.arch.block_idx()
        _, _, num_clusters = cute.arch.grid_dim()
        num_groups = cutlass.Int32(num_groups)
        values = (cutlass.Int32(tile_start[num_groups]), cutlass.Int32(cluster_id), cutlass.Int32(num_clusters), num_groups)
        return ListScheduler(tile_start, mTable, tile_m, values)

    @cute.jit
    def cta_tile(self, work):
        g = owner_group(self.tile_start, self.num_groups, work)
        local = work - self.tile_start[g]
        m = cutlass.Int32(self.mTable[g * LIST_FIELDS + LIST_M])
        mt = (m + (self.tile_m - 1)) // self.tile_m
        return local % mt, local // mt, cutlass.Int32(0), g
