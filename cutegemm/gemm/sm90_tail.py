"""Grouped tail tiles split along K (``config.tail_split``, sm_90a cooperative 128-row tiles), a
mixin of :class:`~cutegemm.gemm.sm90.GemmSm90`.

In a grouped GEMM an expert's last m-tile is padding past its rows. When at most 64 of its 128
rows are real, the warpgroup that owns rows 64..127 would multiply nothing but padding. Instead
both warpgroups compute rows 0..63 (the first warpgroup's A rows) over half of every K tile's
K blocks each (warpgroup w takes K blocks [w * n / 2, (w + 1) * n / 2)), so the tile's tensor
work halves and neither warpgroup idles. After the K loop the second warpgroup's partial sums go
through the shared memory of the tile's last A/B stage (held until then) into the first's
registers; the epilogue then runs as for any tile: the first warpgroup holds rows 0..63, the
second's rows (64..127) lie past the expert's end and are never stored.

Register order: a thread of either warpgroup holds the same (row - 64 w, column) positions, so
the exchange is thread t's register v -> word v * 128 + t, no coordinate map. The loads are
those of a full tile (A's box is 128 rows).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup

HALF_ROWS = 64  # rows of one consumer warpgroup's share of a 128-row tile


class TailSplitSm90Mixin:
    """:meth:`tail_k_loop` and its parts (used only when ``config.tail_split``)."""

    def is_half_tail(self, tile):
        """Whether grouped tile ``tile`` = (m_tile, n_tile, expert, row_start, row_end) has at
        most 64 rows of its expert (warp-uniform Boolean; a tile with none counts too)."""
        m_tile, _, _, row_start, row_end = tile
        rows_left = row_end - row_start - m_tile * self.config.tile_m
        return cute.arch.make_warp_uniform(cutlass.select_(rows_left <= HALF_ROWS, 1, 0)) == 1

    @cute.jit
    def tail_k_loop(self, ab_pipeline, read_state, release_state, tiled_mma: cute.TiledMma, acc: cute.Tensor,
                    acc_sum: cute.Tensor, tCrA0: cute.Tensor, tCrB: cute.Tensor, sB: cute.Tensor,
                    num_k_blocks: cutlass.Constexpr, kt_cnt: cutlass.Int32, promote: cutlass.Constexpr,
                    my_wg: cutlass.Int32, tid: cutlass.Int32, epi_barrier):  # fmt: skip
        """The K loop of a half tail tile (module docstring). ``tCrA0``: the first warpgroup's
        A fragment (rows 0..63); ``tid``: the thread's index in its warpgroup. Ends as the plain
        loop does before its last release: every WGMMA retired and, without promotion, the last
        stage still held (released by the caller); with promotion this loop releases it after
        the exchange. Returns (tiled_mma, read_state, release_state)."""
        kb0 = my_wg * (num_k_blocks // 2)
        for k_tile in range(kt_cnt):
            ab_pipeline.consumer_wait(read_state)
            if cutlass.const_expr(promote):
                warpgroup.fence()  # the adds below read acc: order them before the overwrite
                tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
            for j in cutlass.range_constexpr(num_k_blocks // 2):
                kb = kb0 + j
                cute.gemm(tiled_mma, acc, tCrA0[(None, None, kb, read_state.index)], tCrB[(None, None, kb, read_state.index)], acc)
                if cutlass.const_expr(promote):
                    tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            warpgroup.commit_group()
            if cutlass.const_expr(promote):
                warpgroup.wait_group(0)
                if k_tile < kt_cnt - 1:  # the last stage is held for the exchange
                    ab_pipeline.consumer_release(read_state)
                    release_state.advance()
                acc_sum.store(acc_sum.load() + acc.load())
            else:
                warpgroup.wait_group(1)
                if k_tile > 0:
                    ab_pipeline.consumer_release(release_state)
                    release_state.advance()
            read_state.advance()
        warpgroup.wait_group(0)
        if kt_cnt > 0:
            self.add_second_half(acc_sum, sB, release_state.index, my_wg, tid, epi_barrier)
            if cutlass.const_expr(promote):
                ab_pipeline.consumer_release(release_state)
                release_state.advance()
        return tiled_mma, read_state, release_state

    @cute.jit
    def add_second_half(self, acc_sum: cute.Tensor, sB: cute.Tensor, stage: cutlass.Int32, my_wg: cutlass.Int32,
                        tid: cutlass.Int32, epi_barrier):  # fmt: skip
        """acc_sum of warpgroup 0 += acc_sum of warpgroup 1, through B's shared-memory stage
        ``stage`` (held: no TMA writes it until it is released), in chunks of its size."""
        n_acc = cute.size(acc_sum)
        stage_words = cute.cosize(sB.layout) // cute.size(sB, mode=[2]) * sB.element_type.width // 32
        chunk = min(n_acc, stage_words // 128)
        base = cute.recast_ptr(sB[(None, None, stage)].iterator, dtype=cutlass.Float32)
        buf = cute.make_tensor(base, cute.make_layout((chunk, 128), stride=(128, 1)))
        epi_barrier.arrive_and_wait()  # both warpgroups' WGMMAs have read the stage
        for c0 in cutlass.range_constexpr(0, n_acc, chunk):
            n = min(chunk, n_acc - c0)
            if my_wg == 1:
                for v in cutlass.range_constexpr(n):
                    buf[v, tid] = acc_sum[c0 + v]
            epi_barrier.arrive_and_wait()
            if my_wg == 0:
                for v in cutlass.range_constexpr(n):
                    acc_sum[c0 + v] = acc_sum[c0 + v] + buf[v, tid]
            epi_barrier.arrive_and_wait()
        # the stage's next writer is the TMA (async proxy): order these generic accesses first
        cute.arch.fence_proxy("async.shared", space="cta")
