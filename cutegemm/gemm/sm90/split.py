"""Split K for the dense sm_90a kernel (``GemmConfig.split_k``), a part of
:class:`~cutegemm.gemm.sm90.kernel.GemmSm90`.

Decode-sized calls (a few to 128 rows) have few output tiles: 16 x 4096 x 7168 in 64x64 tiles is
64 tiles for 132 SMs, so half the SMs would stream no weights at all. With split K each tile is
``split_k`` work units (the static scheduler's :meth:`cta_tile` gives the unit's K range and
linear tile index; :func:`~cutegemm.schedulers.static.split_k_range` cuts the K tiles). A unit's
consumers run the usual mainloop over their range, then :meth:`SplitK.split_k_fixup`:

1. every thread stores its fp32 (promoted) accumulators to the unit's workspace slot, 16 bytes at
   a time, the tile's threads side by side (a warp's stores cover 512 contiguous bytes);
2. after a barrier of the tile's threads, one thread fences (release, GPU scope) and adds 1 to
   the tile's counter (acquire, GPU scope). The unit that reads ``split_k - 1`` completes the
   tile and sets the counter back to 0 (no other unit of this launch touches it again; the next
   launch on the stream starts after this one ends), so any ``split_k`` works, 3 and 5 included;
3. the completing unit adds the slots of all ranges in range order (its own too, read back):
   the same sum whatever order the units arrived in, so results are bitwise reproducible. It
   then runs the epilogue (bias, activation, scales, quantized output: all of them, once, on the
   full sum); the other units store nothing to the output.

No unit waits for another, so the units need not be resident together. Workspace (int32 words,
zeroed once when the plan is made; each launch leaves its counters at 0): ``split_counter_words``
counters, then ``split_k`` slots of ``tile_m * tile_n`` fp32 per split tile
(:func:`split_workspace_words`). Like the dynamic scheduler's counter it belongs to one plan: one
plan must not run on two streams at once.

``GemmConfig.split_tail``: only the tiles past the whole waves are split (the scheduler's
``tail_unit``: a unit's tile tuple carries its tile's range count, 1 for a whole tile, which then
skips the fix-up); the counters and slots are those of the split tiles, indexed from the first.

``GemmConfig.split_cluster``: the split_k units of a tile are instead the CTAs of one cluster (1 x 1
x split_k, grid = one CTA per unit), so they run at once and can reach each other's shared memory.
Range 0 (cluster rank 0) keeps ``(split_k - 1) * tile_m * tile_n`` fp32 of receive slots and an
mbarrier expecting their bytes (initialized before the cluster's start-up barrier); every thread of
range r > 0 stores its accumulators into slot r - 1 with ``st.async`` (16 bytes at a time, the
slot layout of the workspace path), each store completing its bytes on that mbarrier, and is done.
Range 0's threads wait for the mbarrier's phase and add the slots to their own partial sums in
range order (:meth:`SplitK.split_k_fixup_cluster`: the bits of the workspace path).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from ...runtime.ptx import ld_global_cg_v4_f32, ld_shared_v4_f32, st_async_cluster_v4_f32, st_global_cg_v4_f32
from ...schedulers.static import split_k_range

__all__ = ["SplitK", "split_counter_words", "split_workspace_words"]


def split_counter_words(tiles):
    """Counter words ahead of the slots: one per output tile, rounded up to 16 bytes (Python or
    DSL ints)."""
    return (tiles + 3) // 4 * 4


def split_workspace_words(tiles: int, split_k: int, tile_m: int, tile_n: int) -> int:
    """Int32 words of a split-K workspace for ``tiles`` output tiles."""
    return split_counter_words(tiles) + tiles * split_k * tile_m * tile_n


class SplitK:
    """Split K (config.split_k): each K range of an output tile runs as its own unit; the partial
    sums meet in a workspace (counted in, summed in range order) or, with split_cluster, in range 0's
    shared memory."""

    def __init__(self, kernel):
        self.k = kernel  # the kernel this part belongs to (its config, layouts, tiles)

    def split_k_roles(self, k_tile_cnt):
        """(k_range, load_k_tiles, k_first) of split K: a unit's K tile count and first K tile
        from its K range (tile[3]); the consumers' ``k_range`` has no head or tail to zero."""

        def k_first(tile):  # tile[5]: the ranges of the unit's tile (split_tail: 1 for a whole tile)
            return split_k_range(tile[3], k_tile_cnt, tile[5])[0]

        def load_k_tiles(tile):
            return split_k_range(tile[3], k_tile_cnt, tile[5])[1]

        def k_range(tile):
            return load_k_tiles(tile), 0, 0

        return k_range, load_k_tiles, k_first

    @cute.jit
    def split_k_fixup(self, acc: cute.Tensor, tile, split_tiles, mWorkspace: cute.Tensor,
                      sFlag: cute.Tensor, tid: cutlass.Int32, epi_barrier) -> cutlass.Int32:  # fmt: skip
        """Store this unit's partial sums, count in on the tile's counter; in the unit that
        completes the count, replace ``acc`` by the sum of every range's partials (range order).
        Returns 1 there (run the epilogue), else 0; 1 for a whole tile (split_tail's first waves).
        ``tid``: the thread among the tile's ``threads_per_tile``; ``split_tiles``: (first split
        tile, split tiles) of the launch (the scheduler's ``split_tiles``)."""
        last = cutlass.Int32(1)
        if tile[5] > 1:
            last = self._fixup(acc, tile[4] - split_tiles[0], tile[3], split_tiles[1], mWorkspace, sFlag, tid,
                               epi_barrier)  # fmt: skip
        return last

    @cute.jit
    def _fixup(self, acc: cute.Tensor, t: cutlass.Int32, s: cutlass.Int32, n_tiles: cutlass.Int32,
               mWorkspace: cute.Tensor, sFlag: cute.Tensor, tid: cutlass.Int32, epi_barrier) -> cutlass.Int32:  # fmt: skip
        """:meth:`split_k_fixup` of range ``s`` of split tile ``t`` (of ``n_tiles``: the slots and
        counters are the split tiles')."""
        split_k = self.k.config.split_k
        nthr = self.k.threads_per_tile
        n_vec = cute.size(acc) // 4
        # byte address of (tile t, range 0, vector 0, thread tid): the slots follow the counters;
        # range r's slot is r * slot_bytes further
        slot_bytes = self.k.config.tile_m * self.k.config.tile_n * 4
        word = cutlass.Int64(split_counter_words(n_tiles)) + cutlass.Int64(t) * split_k * (slot_bytes // 4) + tid * 4
        slot0 = mWorkspace.iterator.toint() + word * 4
        mine = slot0 + cutlass.Int64(s) * slot_bytes
        for v in cutlass.range_constexpr(n_vec):
            st_global_cg_v4_f32(mine + v * nthr * 16, [acc[4 * v + i] for i in range(4)])
        # One thread publishes the tile's partials: the barrier orders every thread's stores
        # before its release fence (cumulativity), and its acquiring count orders the other
        # ranges' partials before the reads that follow the second barrier (the pattern of
        # CUTLASS's generic barrier). One fence on the path, not one per thread plus the
        # atomic's and the reader's own (0.4-0.6 us less per call on the H200).
        epi_barrier.arrive_and_wait()
        if tid == 0:
            cute.arch.fence_acq_rel_gpu()
            old = cute.arch.atomic_add(mWorkspace.iterator + t, cutlass.Int32(1), sem="acquire", scope="gpu")
            done = cutlass.Int32(old) == split_k - 1
            sFlag[0] = cutlass.select_(done, 1, 0)
            if done:
                mWorkspace[t] = cutlass.Int32(0)  # the counter back to 0 for the next launch
        epi_barrier.arrive_and_wait()
        last = sFlag[0]
        if last == 1:
            # Every range's slot from memory, this unit's own included (the same bits as its
            # registers): no branch between the loads, so each vector's split_k loads are in
            # flight together, not one L2 round trip per range.
            for v in cutlass.range_constexpr(n_vec):
                parts = [ld_global_cg_v4_f32(slot0 + r * slot_bytes + v * nthr * 16) for r in range(split_k)]
                for i in cutlass.range_constexpr(4):
                    tot = cutlass.Float32(0.0)
                    for r in cutlass.range_constexpr(split_k):
                        tot = tot + parts[r][i]
                    acc[4 * v + i] = tot
        return last

    def split_recv_floats(self) -> int:
        """split_cluster: fp32 receive slots in range 0's shared memory (one per other range)."""
        return (self.k.config.split_k - 1) * self.k.config.tile_m * self.k.config.tile_n

    @cute.jit
    def split_cluster_arm(self, mbar, tidx: cutlass.Int32, after_sync: cutlass.Constexpr):
        """split_cluster: range 0's receive mbarrier, one arrival and the other ranges' bytes.
        Before the cluster's start-up barrier (``after_sync`` False) thread 0 initializes it; after
        it, thread 0 arrives with the expected bytes (a peer's bytes that complete first leave
        the count negative, and the phase still waits for this arrival). Init and arrive sit on
        both sides of the barrier: back to back, compute-sanitizer's racecheck reported the
        warp-wide init against thread 0's arrive (a warning, no error)."""
        if cute.arch.block_idx_in_cluster() == 0:
            if tidx == 0:
                if cutlass.const_expr(after_sync):
                    cute.arch.mbarrier_arrive_and_expect_tx(mbar, self.split_recv_floats() * 4)
                else:
                    cute.arch.mbarrier_init(mbar, 1)

    @cute.jit
    def split_k_fixup_cluster(self, acc: cute.Tensor, tile, sRecv: cute.Tensor, mbar,
                              tid: cutlass.Int32) -> cutlass.Int32:  # fmt: skip
        """split_cluster: ranges r > 0 store their partial sums into range 0's slot r - 1 (in its
        shared memory, completing bytes on its mbarrier) and return 0; range 0 waits for all of
        them, replaces ``acc`` by the sum of every range's partials (range order) and returns 1.
        ``tid``: the thread among the tile's ``threads_per_tile``."""
        split_k = self.k.config.split_k
        nthr = self.k.threads_per_tile
        n_vec = cute.size(acc) // 4
        s = tile[3]  # the K range: this CTA's rank in its cluster
        slot_bytes = self.k.config.tile_m * self.k.config.tile_n * 4
        base = sRecv.iterator.toint() + tid * 16
        mbar_addr = mbar.toint()
        last = cutlass.Int32(1)
        if s > 0:
            mine = base + (s - 1) * slot_bytes
            for v in cutlass.range_constexpr(n_vec):
                st_async_cluster_v4_f32(mine + v * nthr * 16, mbar_addr, 0, [acc[4 * v + i] for i in range(4)])
            last = cutlass.Int32(0)
        else:
            cute.arch.mbarrier_wait(mbar, 0)
            for v in cutlass.range_constexpr(n_vec):
                parts = [ld_shared_v4_f32(base + r * slot_bytes + v * nthr * 16) for r in range(split_k - 1)]
                for i in cutlass.range_constexpr(4):
                    # (0 + range 0) + range 1 + ...: the workspace path's order and bits
                    tot = cutlass.Float32(0.0) + acc[4 * v + i]
                    for r in cutlass.range_constexpr(split_k - 1):
                        tot = tot + parts[r][i]
                    acc[4 * v + i] = tot
        return last
