"""Operands gathered through an index on Hopper (``config.gather_a`` / ``gather_b``): the packed
grouped form reading A's rows through an index, so that a MoE layer's up projection reads the
tokens as they are instead of a copy permuted by expert; and the K-grouped form reading one
operand's K rows through it (the weight gradients, below).

``mAIdx`` (rows,) int32 maps every packed row (the experts' rows, in ``offs`` order) to its row of
A. Hopper's TMA cannot gather rows, so the producer warpgroup's four warps load A with cp.async
(16 bytes per copy, 8 per thread per 128 x 64 stage) into the same 128-byte-swizzled stages the
TMA would fill, while one elected thread of warp 0 loads B by TMA as usual. A stage's full barrier
therefore expects 1 + 128 arrivals: the TMA thread's arrive-and-expect-tx (B's bytes only) and one
``cp.async.mbarrier.arrive.noinc`` per producer thread, which arrives once that thread's copies
of the stage have landed. The consumers order those generic-proxy writes before their WGMMAs'
reads with a proxy fence after the wait (``Sm90Consumers``).

K-grouped form (``form=KGROUPED``; the MoE weight gradients, dW_e = x_e^T dy_e): the index maps
each packed K position (a routed pair) to its token, and the gathered operand is MN-major (x or
dout as they are, (tokens, M or N) row-major). ``gather_a`` gathers A's K columns, ``gather_b``
B's K rows; a K row of a stage is one token's tile_m (tile_n) contiguous values, 16 bytes per
cp.async, the chunks of one K row on consecutive threads (:meth:`load_k`). Positions outside the
expert's K range (the first and last K tiles) read clamped positions and are zeroed by the
consumers, as for the TMA-loaded operand. Chunks past the gathered operand's M (N) read its last
chunk instead: they feed only output rows (columns) that are not stored.

Packed form: each thread reads the index of its 8 rows once per tile. Rows past the expert's end (the tile's
last rows) read the expert's last row instead, and index values are clamped into A: such rows'
results are never stored, and no load leaves A. K must be a multiple of the 64-wide K tile (the
host takes the copying route otherwise), so every 16-byte chunk is inside its row.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.cute.nvgpu import cpasync

GATHER_THREADS = 128  # the producer warpgroup
COPY_BITS = 128  # one cp.async moves 16 bytes


class GatherA:
    """The producer warpgroup's loads of a ``config.gather_a`` / ``gather_b`` kernel (a part of
    GemmSm90): :meth:`load` for the packed form, :meth:`load_k` for the K-grouped form."""

    def __init__(self, kernel):
        self.k = kernel  # the kernel this part belongs to (its config, layouts, tiles)

    @staticmethod
    def producer_arrivals() -> int:
        """Arrivals a stage's full barrier expects: the TMA thread's and every producer thread's."""
        return 1 + GATHER_THREADS

    def gathered_stage_bytes(self) -> int:
        """The gathered operand's bytes per stage (A's, or B's with gather_b): delivered by
        cp.async, not counted as TMA transaction bytes."""
        rows = self.k.tile_shape_mnk[1 if self.k.config.gather_b else 0]
        return rows * self.k.tile_shape_mnk[2] * self.k.a_dtype.width // 8

    def tiled_copy(self) -> cute.TiledCopy:
        """cp.async of a (tile_m, tile_k) K-major tile by 128 threads: 16-byte chunks, the chunks
        of one row of the K tile on consecutive threads."""
        dtype = self.k.a_dtype
        elems = COPY_BITS // dtype.width
        cols = self.k.tile_shape_mnk[2] // elems  # chunks per row of a K tile
        atom = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dtype, num_bits_per_copy=COPY_BITS
        )
        threads = cute.make_layout((GATHER_THREADS // cols, cols), stride=(cols, 1))
        return cute.make_tiled_copy_tv(atom, threads, cute.make_layout((1, elems)))

    @cute.jit
    def load(
        self,
        sched,
        ab_pipeline: pipeline.PipelineTmaAsync,
        k_tile_cnt: cutlass.Int32,
        mA_mkl: cute.Tensor,  # (rows of A, K, 1)
        mAIdx: cute.Tensor,  # (packed rows,) int32
        sA: cute.Tensor,  # (tile_m, tile_k, STAGE)
        tma_atom_b: cute.CopyAtom,
        tBgB: cute.Tensor,  # (TMA, RestN, RestK, RestL)
        tBsB: cute.Tensor,  # (TMA, STAGE)
        b_mcast_mask,
        ptidx: cutlass.Int32,  # thread index in the producer warpgroup
        warp_idx: cutlass.Int32,
    ):
        """Every producer thread: A's rows of every scheduled tile by cp.async, B by TMA from
        warp 0, into the stage ring (see the module docstring)."""
        tile_m, tile_k = self.k.tile_shape_mnk[0], self.k.tile_shape_mnk[2]
        elems = COPY_BITS // self.k.a_dtype.width
        tiled = self.tiled_copy()
        thr = tiled.get_slice(ptidx)
        tAsA = thr.partition_D(sA)  # (CPY, CPY_M, CPY_K, STAGE)
        tAcA = thr.partition_S(cute.make_identity_tensor((tile_m, tile_k)))  # (CPY, CPY_M, CPY_K)
        n_rows = cute.size(tAcA, mode=[1])
        chunk = tAcA[(0, 0, 0)][1] // elems  # this thread's 16-byte chunk of a K tile's row
        chunks = tile_k // elems
        a_rows = mA_mkl.shape[0]
        rows = cute.make_rmem_tensor((n_rows,), cutlass.Int32)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.k.ab_stage)
        work = sched.first()
        while sched.is_valid(work):
            tile = sched.cta_tile(work)  # (m_tile, n_tile, expert, row_start, row_end)
            first = tile[3] + tile[0] * tile_m
            last = cutlass.max(tile[4] - 1, 0)
            for m in cutlass.range_constexpr(n_rows):
                r = cutlass.min(first + tAcA[(0, m, 0)][0], last)
                rows[m] = cutlass.max(cutlass.min(mAIdx[r], a_rows - 1), 0)
            tBgB_k = tBgB[(None, tile[1], None, tile[2])]
            for k_tile in range(k_tile_cnt):
                full_bar = ab_pipeline.producer_get_barrier(state)
                ab_pipeline.sync_object_empty.wait(state.index, state.phase)
                if warp_idx == 0:  # B's bytes on the barrier (one elected arrival), then its TMA
                    ab_pipeline.sync_object_full.arrive(state.index, ab_pipeline.producer_mask)
                    cute.copy(tma_atom_b, tBgB_k[(None, k_tile)], tBsB[(None, state.index)], tma_bar_ptr=full_bar,
                              mcast_mask=b_mcast_mask)  # fmt: skip
                for m in cutlass.range_constexpr(n_rows):
                    row = cute.local_tile(mA_mkl[(rows[m], None, 0)], (elems,), (k_tile * chunks + chunk,))
                    cute.copy(tiled, row, tAsA[(None, m, 0, state.index)])
                cute.arch.cp_async_mbarrier_arrive_noinc(full_bar)
                state.advance()
            work = sched.next(work)
        sched.finish(work)
        if warp_idx == 0:  # do not exit while a peer in the cluster may still release our stages
            ab_pipeline.producer_tail(state)

    def tiled_copy_mn(self, tile_mn: int) -> cute.TiledCopy:
        """cp.async of a (tile_mn, tile_k) MN-major tile by 128 threads: 16-byte chunks along MN,
        the chunks of one K row on consecutive threads."""
        dtype = self.k.a_dtype
        elems = COPY_BITS // dtype.width
        per_k = tile_mn // elems  # chunks per K row
        atom = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dtype, num_bits_per_copy=COPY_BITS
        )
        threads = cute.make_layout((per_k, GATHER_THREADS // per_k), stride=(1, per_k))
        return cute.make_tiled_copy_tv(atom, threads, cute.make_layout((elems, 1)))

    @cute.jit
    def load_k(
        self,
        sched,
        ab_pipeline: pipeline.PipelineTmaAsync,
        k_range,  # tile -> (K tiles, head, rest): the expert's K tiles
        k_window,  # tile -> (k0, k_start, k_end): the first box's K position and the expert's range
        mX: cute.Tensor,  # (M or N, tokens, 1): the gathered operand as it is (MN-major)
        mIdx: cute.Tensor,  # (packed K,) int32 token of every K position
        sX: cute.Tensor,  # (tile_m or tile_n, tile_k, STAGE)
        tma_atom: cute.CopyAtom,  # the other operand's
        tiles,  # tile -> (TMA, RestK): the other operand's K tiles of the tile
        tOsO: cute.Tensor,  # (TMA, STAGE)
        mcast_mask,  # the other operand's multicast to the cluster (its CTAs share the expert's K range)
        ptidx: cutlass.Int32,  # thread index in the producer warpgroup
        warp_idx: cutlass.Int32,
    ):
        """K-grouped: every producer thread loads its chunks of the gathered operand's K rows by
        cp.async, warp 0 the other operand by TMA (see the module docstring)."""
        gather_b = self.k.config.gather_b
        tile_mn, tile_k = self.k.tile_shape_mnk[1 if gather_b else 0], self.k.tile_shape_mnk[2]
        elems = COPY_BITS // self.k.a_dtype.width
        tiled = self.tiled_copy_mn(tile_mn)
        thr = tiled.get_slice(ptidx)
        tXsX = thr.partition_D(sX)  # (CPY, 1, CPY_K, STAGE)
        tXcX = thr.partition_S(cute.make_identity_tensor((tile_mn, tile_k)))  # (CPY, 1, CPY_K)
        n_rows = cute.size(tXcX, mode=[2])
        mn_size, tokens, positions = mX.shape[0], mX.shape[1], mIdx.shape[0]
        toks = cute.make_rmem_tensor((n_rows,), cutlass.Int32)  # the tokens of this thread's K rows
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.k.ab_stage)
        work = sched.first()
        while sched.is_valid(work):
            tile = sched.cta_tile(work)  # (m_tile, n_tile, expert)
            kt_cnt = k_range(tile)[0]
            k0 = k_window(tile)[0]
            o_k = tiles(tile)
            # this thread's chunk along MN (one past the operand's end reads its last chunk)
            col = cutlass.min((tile[1] if gather_b else tile[0]) * tile_mn + tXcX[(0, 0, 0)][0], mn_size - elems)
            for j in cutlass.range_constexpr(n_rows):  # the first K tile's tokens
                toks[j] = mIdx[cutlass.max(cutlass.min(k0 + tXcX[(0, 0, j)][1], positions - 1), 0)]
            for k_tile in range(kt_cnt):
                full_bar = ab_pipeline.producer_get_barrier(state)
                ab_pipeline.sync_object_empty.wait(state.index, state.phase)
                if warp_idx == 0:  # the other operand's bytes on the barrier (one elected arrival), then its TMA
                    ab_pipeline.sync_object_full.arrive(state.index, ab_pipeline.producer_mask)
                    cute.copy(tma_atom, o_k[(None, k_tile)], tOsO[(None, state.index)], tma_bar_ptr=full_bar,
                              mcast_mask=mcast_mask)  # fmt: skip
                for j in cutlass.range_constexpr(n_rows):
                    t = cutlass.max(cutlass.min(toks[j], tokens - 1), 0)
                    src = cute.local_tile(mX[(None, t, 0)], (elems,), (col // elems,))
                    cute.copy(tiled, src, tXsX[(None, 0, j, state.index)])
                cute.arch.cp_async_mbarrier_arrive_noinc(full_bar)
                # the next K tile's tokens, in flight while this thread waits for the next stage
                for j in cutlass.range_constexpr(n_rows):
                    p = cutlass.min(k0 + (k_tile + 1) * tile_k + tXcX[(0, 0, j)][1], positions - 1)
                    toks[j] = mIdx[cutlass.max(p, 0)]
                state.advance()
            work = sched.next(work)
        sched.finish(work)
        if warp_idx == 0:
            ab_pipeline.producer_tail(state)
