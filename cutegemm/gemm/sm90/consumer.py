"""The consumer warpgroups of the sm_90a kernel: per tile, the WGMMA mainloop over the stage ring
(warpgroups taking turns per K tile with ``config.wg_order``; FP8 promotion every K tile, or
every ``config.promote_k`` K through the MX mainloop's K-tile step; the
block-scaled and MX mainloop variants hook in through their parts), then the epilogue."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.cute.nvgpu import warpgroup

from .mx import MX_KB, MX_PARTS, SF_BYTES

# Named barriers: 1, 2 are the epilogue's (epilogue.BAR_EPILOGUE + warpgroup turn)
BAR_ORDER = 3  # + warpgroup turn (3, 4): pingpong tensor-core hand-off
BAR_K_ORDER = 5  # + consumer warpgroup (5, 6): config.wg_order, turns per K tile


class Sm90Consumers:
    """The consumer role (``mma_and_epilogue``) and its K-tile steps."""

    def __init__(self, kernel):
        self.k = kernel  # the kernel this part belongs to (its config, layouts, tiles)

    # ---------------------------------------------------------------------------------------
    @cute.jit
    def mma_and_epilogue(
        self,
        sched,
        ab_pipeline: pipeline.PipelineAsync,
        k_tile_cnt: cutlass.Int32,
        tiled_mma: cute.TiledMma,
        sA: cute.Tensor,
        sB: cute.Tensor,
        sC: cute.Tensor,
        gC_mnl: cute.Tensor,
        tma_atom_c: cute.CopyAtom,
        alpha: cutlass.Float32,
        mma_tidx: cutlass.Int32,
        wg: cutlass.Int32,
        warp_idx: cutlass.Int32,
        cAcc_mnl: cute.Tensor | None,  # (bM, bN, RestM, RestN, RestL) coordinates, or None
        mCin: cute.Tensor | None,
        mBias: cute.Tensor | None,
        beta: cutlass.Float32,
        mC_mnl: cute.Tensor,  # TMA coordinate tensor of C
        mC_gmem: cute.Tensor | None,  # grouped: C in global memory (partial-tile stores)
        quant_args: tuple,
        vectors: tuple,
        group_cols,  # grouped: the GEMM's N (per-expert vectors hold E rows of N); dense: None
        block_scales: tuple = (None, None),  # fp8_blockwise: (sSFA, mSFB); fp8_mx: (sSFA, sSFB)
        k_range=None,  # K-grouped: tile -> (K tiles, head columns to zero, K values of a partial last K tile or 0)
        out_desc=None,  # listed: tile -> its group's C descriptor
        split=None,  # split K: (workspace, shared-memory flag)
        preact=None,  # epilogue.preact: (TMA atom, smem ring, TMA tensor, tensor) of the values before the gate
    ):
        """Consumer warpgroups: WGMMA mainloop into register accumulators, then the epilogue.

        ``wg``: this warpgroup's turn in pingpong (0/1; always 0 in cooperative). ``mma_tidx``:
        thread index among the threads that share a tile.
        """
        direct = self.k.direct_store  # registers -> stmatrix -> smem
        thr_mma = tiled_mma.get_slice(mma_tidx)
        # (MMA, MMA_M, MMA_K, STAGE), (MMA, MMA_N, MMA_K, STAGE)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        # (MMA, MMA_M, MMA_N)
        acc_shape = thr_mma.partition_C(gC_mnl if direct else cAcc_mnl).shape[:3]
        acc = cute.make_rmem_tensor(acc_shape, self.k.acc_dtype)
        # FP8 with promotion: every K tile's WGMMAs start a fresh partial sum (acc), added into an
        # fp32 accumulator in registers once they retire, so the tensor core's reduced-precision
        # FP8 accumulation spans 128 K only (as cuBLAS without fast accumulation / DeepGEMM), or
        # config.promote_k (32 / 64, gemm.sm90.mx's K-tile step without its scales).
        promote = self.k.config.fp8 and not self.k.config.fast_accum
        acc_sum = cute.make_rmem_tensor(acc_shape, self.k.acc_dtype) if promote else acc
        num_k_blocks = cute.size(tCrA, mode=[2])
        swap = self.k.config.swap_ab
        if cutlass.const_expr(swap):  # one WGMMA width per 16 tokens (see gemm.sm90.swap)
            variants = self.k.swap.swap_variants(tiled_mma, mma_tidx, sA, sB, acc, acc_sum, promote)
        # FP8 block scaling (DeepSeek 1x128 / 128x128, config.fp8_blockwise): see
        # gemm.sm90.blockwise (this thread's rows, scale registers).
        blockwise = self.k.config.fp8_blockwise
        if cutlass.const_expr(blockwise):
            assert promote
            bw = self.k.blockwise.blockwise_setup(thr_mma, acc_shape, block_scales)
        # MXFP8 emulation (config.fp8_mx): scales per 32-K block of every row / column, in shared
        # memory stages next to A and B (see blockscaled.gemm.sm90.mx): this thread's row
        # addresses and its first column-scale group.
        mx = self.k.config.fp8_mx
        sfa_rows, sfb_base = None, None
        if cutlass.const_expr(mx or self.k.config.promote_k > 0):
            assert promote and acc_shape == ((2, 2, self.k.config.tile_n // (8 * MX_PARTS)), 1, MX_PARTS), acc_shape
        if cutlass.const_expr(mx):
            sSFA, sSFB = block_scales
            tCcTile = thr_mma.partition_C(cute.make_identity_tensor((self.k.config.tile_m, self.k.config.tile_n)))
            sfa_rows = [sSFA.iterator.toint() + tCcTile[((0, h, 0), 0, 0)][0] * (MX_KB * SF_BYTES) for h in range(2)]
            sfb_base = sSFB.iterator.toint() + tCcTile[((0, 0, 0), 0, 0)][1] * (2 * SF_BYTES)  # 4 q floats

        ep = self.k.epi.epilogue_parts(tiled_mma, mma_tidx, sC, acc_sum, wg, warp_idx,
                                       preact[1] if cutlass.const_expr(preact is not None) else None)  # fmt: skip
        # (ep is only passed on inside the tile loop: a method called on it there would make the
        # DSL carry the whole tuple through the loop)
        epi_barrier = ep.epi_barrier
        if cutlass.const_expr(self.k.config.a_rows):
            # A's box fills the first a_rows rows of each stage: the rest are zeros, written once
            self.k.zero.zero_a_rows_past_box(sA, mma_tidx)
            cute.arch.fence_proxy("async.shared", space="cta")  # before the WGMMAs read them
            epi_barrier.arrive_and_wait()
        read_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.k.ab_stage)
        release_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.k.ab_stage)
        epi_count = cutlass.Int32(0)  # subtiles stored so far: picks the epilogue smem buffer
        # config.wg_order: the two consumer warpgroups take turns issuing each K tile's WGMMAs
        # (warpgroup 0 first: warpgroup 1 opens its turn once).
        k_order = self.k.config.wg_order
        my_wg = mma_tidx // self.k.threads_per_warpgroup
        if cutlass.const_expr(k_order):
            if my_wg == 1:
                cute.arch.barrier_arrive(barrier_id=BAR_K_ORDER, number_of_threads=2 * self.k.threads_per_warpgroup)

        work = sched.first()
        if cutlass.const_expr(self.k.pingpong):
            if wg == 1:
                # Tile 0 of this CTA belongs to warpgroup 0: skip its stages.
                skip_cnt = self._k_tiles_of(sched, work, k_tile_cnt, k_range)
                work = sched.next(work)
                read_state, release_state = self._skip(read_state, release_state, skip_cnt)
        while sched.is_valid(work):
            tile = sched.cta_tile(work)
            kt_cnt = k_tile_cnt
            k_head, k_rem = 0, 0
            if cutlass.const_expr(k_range is not None):
                kt_cnt, k_head, k_rem = k_range(tile)

            # ---- mainloop: keep one WGMMA batch in flight, release the stage behind it ----
            acc_sum.fill(0.0)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            if cutlass.const_expr(blockwise):
                bw_at, nb_split = self.k.blockwise.blockwise_tile_start(bw, tile)
            if cutlass.const_expr(self.k.pingpong):
                if work >= sched.first() + sched.stride:  # not this CTA's first tile: wait our turn
                    cute.arch.barrier(barrier_id=BAR_ORDER + wg, number_of_threads=2 * self.k.threads_per_warpgroup)
            warpgroup.fence()
            if cutlass.const_expr(mx or self.k.config.promote_k > 0):  # per-32 / promote_k partial sums
                for _k_tile in range(kt_cnt):
                    ab_pipeline.consumer_wait(read_state)
                    tiled_mma = self.k.mx.mx_k_tile(tiled_mma, acc, acc_sum, tCrA, tCrB, read_state.index, sfa_rows, sfb_base)
                    ab_pipeline.consumer_release(read_state)
                    release_state.advance()
                    read_state.advance()
            elif cutlass.const_expr(swap):
                read_state, release_state = self.k.swap.swap_k_loop(
                    ab_pipeline, read_state, release_state, variants, self.k.swap.swap_width_index(tile), kt_cnt, num_k_blocks,
                    my_wg, promote,
                )  # fmt: skip
            elif cutlass.const_expr(blockwise):
                tiled_mma, read_state, release_state = self.k.blockwise.blockwise_k_loop(
                    ab_pipeline, read_state, release_state, tiled_mma, acc, acc_sum, tCrA, tCrB, num_k_blocks, kt_cnt,
                    bw, bw_at, nb_split, my_wg,
                )  # fmt: skip
            else:
                for k_tile in range(kt_cnt):
                    ab_pipeline.consumer_wait(read_state)
                    if cutlass.const_expr(self.k.config.gathers):
                        # A's (B's) stage was written by cp.async (generic proxy): order before the WGMMAs
                        cute.arch.fence_proxy("async.shared", space="cta")
                    if cutlass.const_expr(self.k.config.kgrouped):
                        # K-grouped: columns of the first K tile before the expert's range and of
                        # the last past it hold other experts' values: zero them in this stage
                        # before any WGMMA reads it.
                        lo = cutlass.select_(k_tile == 0, k_head, 0)
                        hi = cutlass.select_(k_tile == kt_cnt - 1, cutlass.select_(k_rem > 0, k_rem, self.k.tile_shape_mnk[2]),
                                             self.k.tile_shape_mnk[2])  # fmt: skip
                        if (lo > 0) | (hi < self.k.tile_shape_mnk[2]):
                            self.k.zero.zero_k_outside(sA, sB, read_state.index, lo, hi, mma_tidx)
                            cute.arch.fence_proxy("async.shared", space="cta")
                            epi_barrier.arrive_and_wait()
                    tiled_mma = self.issue_k_tile(tiled_mma, acc, tCrA, tCrB, read_state.index, num_k_blocks, promote, my_wg)
                    release_state = self.retire_k_tile(ab_pipeline, read_state, release_state, k_tile, promote, acc, acc_sum)
                    read_state.advance()
            if cutlass.const_expr(self.k.pingpong):
                # All WGMMAs of this tile are issued: hand the tensor cores to the other warpgroup.
                cute.arch.barrier_arrive(barrier_id=BAR_ORDER + 1 - wg, number_of_threads=2 * self.k.threads_per_warpgroup)
            warpgroup.wait_group(0)
            if cutlass.const_expr(not promote):
                if kt_cnt > 0:
                    ab_pipeline.consumer_release(release_state)
                    release_state.advance()

            # ---- epilogue (gemm.sm90.epilogue) ----
            store_args = (ep, tile, acc_sum, thr_mma, epi_count, gC_mnl, mC_mnl, mC_gmem, cAcc_mnl, tma_atom_c, sC, alpha,
                          beta, mCin, mBias, quant_args, vectors, group_cols, out_desc, mma_tidx, wg, preact)  # fmt: skip
            if cutlass.const_expr(self.k.config.split_cluster):
                # split K in a cluster: range 0 sums the partials and stores the tile
                if self.k.split.split_k_fixup_cluster(acc_sum, tile, *split, mma_tidx) == 1:
                    epi_count = self.k.epi.store_tile(*store_args)
            elif cutlass.const_expr(self.k.config.split_k > 1):
                # split K: the unit that completes the tile sums the partials and stores it
                if self.k.split.split_k_fixup(acc_sum, tile, sched.split_tiles(), *split, mma_tidx, epi_barrier) == 1:
                    epi_count = self.k.epi.store_tile(*store_args)
            else:
                epi_count = self.k.epi.store_tile(*store_args)
            work = sched.next(work)
            if cutlass.const_expr(self.k.pingpong):
                # The next tile of this CTA belongs to the other warpgroup: skip its stages.
                skip_cnt = self._k_tiles_of(sched, work, k_tile_cnt, k_range)
                work = sched.next(work)
                read_state, release_state = self._skip(read_state, release_state, skip_cnt)

        if cutlass.const_expr(k_order):
            if my_wg == 0:  # take warpgroup 1's last hand-over: no arrival is left pending at exit
                cute.arch.barrier(barrier_id=BAR_K_ORDER, number_of_threads=2 * self.k.threads_per_warpgroup)
        ep.store_pipeline.producer_tail()

    @cute.jit
    def retire_k_tile(self, ab_pipeline, read_state, release_state, k_tile: cutlass.Int32, promote: cutlass.Constexpr,
                      acc: cute.Tensor, acc_sum: cute.Tensor, rezero: cutlass.Constexpr = False):  # fmt: skip
        """After a K tile's WGMMAs are issued: keep one batch in flight and release the stage
        behind it, or (``promote``, FP8) wait for this batch, release its stage and add the
        partial sum into the promoted one (``rezero``: then zero the partial sum for the next
        K tile, ``gemm.sm90.swap``). Returns release_state."""
        if cutlass.const_expr(promote):
            warpgroup.wait_group(0)
            ab_pipeline.consumer_release(read_state)
            release_state.advance()
            acc_sum.store(acc_sum.load() + acc.load())
            if cutlass.const_expr(rezero):
                acc.fill(0.0)
                warpgroup.fence()  # the zeros before the next K tile's WGMMAs read them
        else:
            warpgroup.wait_group(1)
            if k_tile > 0:
                ab_pipeline.consumer_release(release_state)
                release_state.advance()
        return release_state

    @cute.jit
    def issue_k_tile(self, tiled_mma: cute.TiledMma, acc: cute.Tensor, tCrA: cute.Tensor, tCrB: cute.Tensor,
                     stage: cutlass.Int32, num_k_blocks: cutlass.Constexpr, fresh: cutlass.Constexpr,
                     my_wg: cutlass.Int32):  # fmt: skip
        """One K tile's WGMMAs from smem stage ``stage``, committed as one group (``fresh``: into a
        new partial sum, FP8 promotion); with wg_order inside this warpgroup's turn. Returns
        tiled_mma."""
        if cutlass.const_expr(fresh):
            warpgroup.fence()  # the adds after it read acc: order them before the overwrite
            tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
        if cutlass.const_expr(self.k.config.wg_order):  # our turn
            cute.arch.barrier(barrier_id=BAR_K_ORDER + my_wg, number_of_threads=2 * self.k.threads_per_warpgroup)
        for kb in cutlass.range_constexpr(num_k_blocks):
            coord = (None, None, kb, stage)
            cute.gemm(tiled_mma, acc, tCrA[coord], tCrB[coord], acc)
            if cutlass.const_expr(fresh):
                tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.commit_group()
        if cutlass.const_expr(self.k.config.wg_order):  # the other warpgroup's turn
            cute.arch.barrier_arrive(barrier_id=BAR_K_ORDER + 1 - my_wg, number_of_threads=2 * self.k.threads_per_warpgroup)
        return tiled_mma

    @cute.jit
    def _k_tiles_of(self, sched, work, k_tile_cnt: cutlass.Int32, k_range):
        """K tiles of tile ``work`` (the one pingpong's other warpgroup takes): k_tile_cnt, or
        for K-grouped / list tiles their expert's or group's own count (0 past the last tile)."""
        cnt = k_tile_cnt
        if cutlass.const_expr(k_range is not None):
            cnt = cutlass.Int32(0)
            if sched.is_valid(work):
                cnt = k_range(sched.cta_tile(work))[0]
        return cnt

    @cute.jit
    def _skip(self, read_state, release_state, k_tile_cnt: cutlass.Int32):
        """Advance both consumer states past one tile's k-tiles (consumed by the other warpgroup)."""
        for _ in range(k_tile_cnt):
            read_state.advance()
            release_state.advance()
        return read_state, release_state
