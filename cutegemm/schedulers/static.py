"""Static persistent tile scheduler (arch-neutral).

Work unit: one *cluster tile* (cluster_m x cluster_n CTA tiles). The grid is
``(cluster_m, cluster_n, num_persistent_clusters)``; cluster ``c = blockIdx.z`` walks the linear
cluster-tile indices ``c, c + gridDim.z, c + 2 * gridDim.z, ...``. A linear index becomes
``(m, n, l)`` cluster coordinates through :func:`swizzled_tile_coord`, the one mapping used by the
kernels (traced with DSL integers) and by the CPU property tests (plain ints).

Raster and swizzle (L2 reuse): with ``raster="m"`` the walk goes along M inside bands of
``group`` N-columns, N fastest inside the band; so the ~132 tiles in flight cover ``group``
N-columns x (132 / group) M-rows and both operands are re-read from L2, not HBM.
``raster="n"`` swaps the roles of M and N.
"""

from __future__ import annotations

import copy
from typing import Protocol

import cutlass
import cutlass.cute as cute
from cutlass.cutlass_dsl import extract_mlir_values, new_from_mlir_values


def swizzled_tile_coord(idx, tiles_m, tiles_n, group, raster_m, min_fn=min):
    """Linear tile index -> (m, n, l) tile coordinates.

    Works on Python ints (tests) and on DSL Int32 values (kernels, pass ``min_fn=cutlass.min``).
    ``raster_m`` and ``group`` must be Python values (compile-time).
    """
    per_batch = tiles_m * tiles_n
    l_idx = idx // per_batch
    r = idx - l_idx * per_batch
    if raster_m:
        major_count, minor_count = tiles_m, tiles_n
    else:
        major_count, minor_count = tiles_n, tiles_m
    band_size = group * major_count
    band = r // band_size
    r = r - band * band_size
    first_minor = band * group
    width = min_fn(group, minor_count - first_minor)
    major = r // width
    minor = first_minor + (r - major * width)
    if raster_m:
        return major, minor, l_idx
    return minor, major, l_idx


def split_k_range(split, k_tiles, split_k):
    """(first K tile, K tile count) of K range ``split`` of ``split_k`` (split K: a tile's K tiles
    cut into equal ranges, sizes differing by at most one). Python ints (tests) or DSL Int32."""
    first = split * k_tiles // split_k
    return first, (split + 1) * k_tiles // split_k - first


def tail_units(tiles, ctas, split_k):
    """Split K on the last wave only (``GemmConfig.split_tail``): (D, units) for ``tiles`` output
    tiles on ``ctas`` persistent CTAs: the first D = (tiles // ctas) * ctas tiles are one work unit
    each (whole K), the other tiles - D are ``split_k`` units each. Python ints (host, tests) or
    DSL Int32 (kernel)."""
    whole = tiles // ctas * ctas
    return whole, whole + (tiles - whole) * split_k


def tail_unit(work, whole, split_k, select=None):
    """Unit ``work`` of a split-tail walk (``whole`` = D of :func:`tail_units`) -> (linear tile,
    K range, ranges of that tile): below D tile ``work`` whole (range 0 of 1), then the ranges of
    each tail tile in turn. ``select``: ``cutlass.select_`` in kernels (plain ints otherwise)."""
    u = work - whole
    if select is None:
        return (work, 0, 1) if u < 0 else (whole + u // split_k, u % split_k, split_k)
    tail = u >= 0
    uu = select(tail, u, 0)
    t_tail = whole + uu // split_k
    return select(tail, t_tail, work), select(tail, uu - (uu // split_k) * split_k, 0), select(tail, split_k, 1)


class TileScheduler(Protocol):
    """What every scheduler gives the kernel roles (producer, MMA, epilogue).

    Roles keep a loop-carried ``work`` handle: ``first()``, then ``next(work)`` until
    ``is_valid(work)`` is false; ``cta_tile(work)`` gives this CTA's (m, n, l) tile coordinates;
    ``finish(work)`` after the loop (the dynamic schedulers' fetcher waits for its ring there).
    """

    def first(self): ...

    def next(self, work): ...

    def is_valid(self, work): ...

    def cta_tile(self, work): ...

    def finish(self, work): ...


class PersistentWalk:
    """Shared by every scheduler: a strided walk over linear tile indices (``start``, ``start +
    stride``, ... while ``< total``), and the DSL protocol that carries the Int32 runtime values
    named in ``_dyn`` through the roles' dynamic loops (everything else is compile-time state,
    kept by a shallow copy)."""

    _dyn: tuple[str, ...] = ()

    def _set_values(self, values):
        for name, v in zip(self._dyn, values or (), strict=False):
            setattr(self, name, v)

    def __extract_mlir_values__(self):
        return extract_mlir_values([getattr(self, k) for k in self._dyn])

    def __new_from_mlir_values__(self, values):
        new = copy.copy(self)
        new._set_values(new_from_mlir_values([getattr(self, k) for k in self._dyn], values))
        return new

    def first(self):
        return self.start

    def next(self, work):
        return work + self.stride

    def is_valid(self, work):
        return work < self.total

    def finish(self, work):
        """After a role's loop (the dynamic schedulers' fetcher waits there); nothing here."""


class StaticPersistentScheduler(PersistentWalk):
    """Strided walk over cluster tiles; built inside the kernel from the problem shape.

    Holds only Int32 runtime values (the ``_dyn`` list) plus compile-time settings, so the DSL can
    carry it through the roles' dynamic loops.
    """

    _dyn = ("tiles_m", "tiles_n", "total", "start", "stride", "cta_m", "cta_n", "whole")

    def __init__(self, cluster_mn, group: int, raster_m: bool, values=None, split_k: int = 1,
                 split_tail: bool = False):  # fmt: skip
        self.cluster_mn = cluster_mn
        self.group = group
        self.raster_m = raster_m
        self.split_k = split_k
        self.split_tail = split_tail
        self._set_values(values)

    @staticmethod
    def create(
        problem_mnl, tile_mn, cluster_mn, group: int, raster_m: bool, ctas_per_tile_m: int = 1, split_k: int = 1,
        split_tail: bool = False,
    ) -> StaticPersistentScheduler:
        """``tile_mn`` is the tile of one CTA. ``ctas_per_tile_m`` CTAs adjacent along the cluster's
        M mode may share one tile of ``ctas_per_tile_m * tile_mn[0]`` rows (the sm_100 2-CTA MMA:
        2); ``cta_tile`` then returns the M coordinate of that shared tile, so every CTA of the
        pair gets the same coordinates. The walk and the grid do not change. ``split_k`` > 1 (1x1
        clusters): every tile is split_k work units, one per K range (see :meth:`cta_tile`);
        with ``split_tail`` only the tiles past the whole waves (:func:`tail_units`)."""
        m, n, l_count = problem_mnl
        tiles_m = cutlass.Int32(cute.ceil_div(m, tile_mn[0] * cluster_mn[0]))
        tiles_n = cutlass.Int32(cute.ceil_div(n, tile_mn[1] * cluster_mn[1]))
        bx, by, cluster_id = cute.arch.block_idx()
        _, _, num_clusters = cute.arch.grid_dim()
        cta_m = cutlass.Int32(bx) % cluster_mn[0]
        if ctas_per_tile_m > 1:
            cta_m = cta_m // ctas_per_tile_m
        tiles = tiles_m * tiles_n * cutlass.Int32(l_count)
        whole, total = cutlass.Int32(0), tiles * split_k
        if split_tail:
            whole, total = tail_units(tiles, cutlass.Int32(num_clusters), split_k)
        values = (
            tiles_m,
            tiles_n,
            total,
            cutlass.Int32(cluster_id),
            cutlass.Int32(num_clusters),
            cta_m,
            cutlass.Int32(by) % cluster_mn[1],
            whole,
        )
        # A cluster covers cluster_m / ctas_per_tile_m shared tiles along M.
        tiles_per_cluster = (cluster_mn[0] // ctas_per_tile_m, cluster_mn[1])
        return StaticPersistentScheduler(tiles_per_cluster, group, raster_m, values, split_k, split_tail)

    def cta_tile(self, work):
        """(m, n, l) tile coordinates; with split K (m, n, l, K range, linear tile index, ranges
        of the tile): unit ``work`` is K range ``work % split_k`` of linear tile ``work //
        split_k``, so the ranges of one tile are consecutive units (taken by consecutive CTAs of
        the walk); with split_tail the mapping of :func:`tail_unit` (a whole tile: range 0 of 1)."""
        t = work
        if self.split_k > 1:
            if self.split_tail:
                t, r, ranges = tail_unit(work, self.whole, self.split_k, cutlass.select_)
            else:
                t = work // self.split_k
                r, ranges = work - t * self.split_k, cutlass.Int32(self.split_k)
        cm, cn, l_idx = swizzled_tile_coord(t, self.tiles_m, self.tiles_n, self.group, self.raster_m, min_fn=cutlass.min)
        coord = (cm * self.cluster_mn[0] + self.cta_m, cn * self.cluster_mn[1] + self.cta_n, l_idx)
        if self.split_k > 1:
            return (*coord, r, t, ranges)
        return coord

    def split_tiles(self):
        """Split K: (first split tile, split tiles), the tiles whose ranges meet in the workspace
        (plain split K: all, from 0; split_tail: the tiles past the whole waves)."""
        return self.whole, (self.total - self.whole) // self.split_k


def persistent_grid(problem_mnl, tile_mn, cluster_mn, max_clusters: int, split_k: int = 1, split_tail: bool = False):
    """Host side: grid (cluster_m, cluster_n, clusters) with clusters = min(work units (cluster
    tiles x split_k, or :func:`tail_units` with ``split_tail``), max_clusters). With split_tail
    the kernel's D from this grid is the host's: tiles >= max_clusters gives a grid of
    max_clusters, fewer tiles a grid above the tile count (D = 0 both ways)."""
    m, n, l_count = problem_mnl
    tiles = cute.ceil_div(m, tile_mn[0] * cluster_mn[0]) * cute.ceil_div(n, tile_mn[1] * cluster_mn[1]) * l_count
    total = tail_units(tiles, max_clusters, split_k)[1] if split_tail else tiles * split_k
    return (cluster_mn[0], cluster_mn[1], cutlass.min(total, max_clusters))
