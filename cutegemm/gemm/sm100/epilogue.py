"""The epilogue role of the sm_100a GEMM (``sm100.GemmSm100``): the epilogue warps own the TMEM
allocation and move each accumulator stage TMEM -> registers -> ``epilogue_subtile`` (the
arch-neutral epilogue math) -> shared memory -> TMA store; grouped tiles that cross their
expert's last row are stored by predicated copies. Mixed into GemmSm100 (it uses the kernel's
setup: ``epi_barrier``, ``tmem_ptr_barrier``, the acc / epilogue layouts)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory as memory
import cutlass.pipeline as pipeline
import cutlass.utils.blackwell_helpers as sm100_utils
from cutlass.cute.nvgpu import cpasync, tcgen05

from ...epilogue import epilogue_subtile, store_gated
from ...epilogue.ops import FP8_MAX, store_saturated
from ...epilogue.quant import store_quantized_subtile
from ..grouped_parts import grouped_acc_coords, grouped_acc_space, grouped_out_tile
from ..store import store_subtile_predicated


class Sm100Epilogue:
    """``epilogue``: the role of warps 0..3 of GemmSm100."""

    def __init__(self, kernel):
        self.k = kernel  # the kernel this part belongs to (its config, layouts, tiles)

    @cute.jit
    def epilogue(
        self,
        sched,
        acc_pipeline: pipeline.PipelineAsync,
        tmem: memory.TmemAllocator,
        acc_layout: cute.Layout,  # (MMA, MMA_M, MMA_N, ACC_STAGE)
        gC: cute.Tensor,  # (CTA_M, CTA_N, RestM, RestN, RestL) output tiles (gated: see kernel)
        sC: cute.Tensor,  # (EPI_M, EPI_N, EPI_STAGE)
        epi_tile: cute.Tile,
        tma_atom_c: cute.CopyAtom,
        alpha: cutlass.Float32,
        epi_tidx: cutlass.Int32,
        warp_idx: cutlass.Int32,
        tCcAcc: cute.Tensor | None,  # (MMA, MMA_M, MMA_N, RestM, RestN, RestL) coordinates, or None
        mCin: cute.Tensor | None,
        mBias: cute.Tensor | None,
        beta: cutlass.Float32,
        mma_coord_v: cutlass.Int32,
        c_tiles=None,  # grouped: tile -> its output views (see the kernel); None for dense
        quant_args=None,  # quantized output: (scale bytes, global scale, rows, output columns)
        vectors=(),  # user epilogue vectors / FP8 scales
        group_cols=None,  # grouped: the GEMM's N (per-expert vectors hold E rows of N)
        out_desc=None,  # listed: tile -> its group's C descriptor
    ):
        """Epilogue warps: own the TMEM allocation; TMEM -> registers -> epilogue_subtile -> smem -> TMA.

        Grouped: a tile's rows start at its expert's first row; a tile that crosses the expert's
        last row is stored by predicated copies (rows < row_end, columns < N), not by TMA.
        """
        grouped = self.k.config.grouped
        epi = self.k.config.epilogue
        gated = epi.gated is not None
        quant = epi.quant is not None
        direct = self.k.direct_store  # registers -> smem by the r2s copy
        fp8_out = not direct and not gated and not quant  # an FP8 output (saturated, by coordinate)
        tmem.allocate(self.k.num_tmem_cols)  # by warp epi_warp_ids[0]; the others wait for the address
        tmem.wait_for_alloc()
        tmem_ptr = tmem.retrieve_ptr(self.k.acc_dtype)
        # The tiled MMA has one atom per tile, so MMA_M = MMA_N = 1: drop them.
        # (CTA_M, CTA_N, ACC_STAGE)
        tAcc = cute.make_tensor(tmem_ptr, acc_layout)[((None, None), 0, 0, None)]

        # TMEM -> registers: the widest tcgen05.ld for this epilogue subtile.
        copy_atom_t2r = sm100_utils.get_tmem_load_op(
            self.k.cta_tile_shape_mnk, self.k.c_layout, self.k.r2s_dtype, self.k.acc_dtype, epi_tile, self.k.use_2cta
        )
        # (EPI_TILE_M, EPI_TILE_N, EPI_M, EPI_N, ACC_STAGE)
        tAcc_epi = cute.flat_divide(tAcc, epi_tile)
        tiled_copy_t2r = tcgen05.make_tmem_copy(copy_atom_t2r, tAcc_epi[(None, None, 0, 0, 0)])
        thr_copy_t2r = tiled_copy_t2r.get_slice(epi_tidx)
        # (T2R, T2R_M, T2R_N, EPI_M, EPI_N, ACC_STAGE)
        tTR_tAcc_all = thr_copy_t2r.partition_S(tAcc_epi)
        # (T2R, T2R_M, T2R_N)
        if cutlass.const_expr(direct):
            # (EPI_TILE_M, EPI_TILE_N, EPI_M, EPI_N, RestM, RestN, RestL)
            gC_epi = cute.flat_divide(gC, epi_tile)
            tTR_rAcc = cute.make_rmem_tensor(
                thr_copy_t2r.partition_D(gC_epi)[(None, None, None, 0, 0, 0, 0, 0)].shape, self.k.acc_dtype
            )
        else:
            # (EPI_TILE_M, EPI_TILE_N / 2, EPI_M, EPI_N, RestM * CTA_PER_MMA, RestN, RestL)
            gC_epi = cute.flat_divide(gC, self.k.epi_tile_out)
            # (EPI_TILE_M, EPI_TILE_N, EPI_M, EPI_N): CTA-local coordinates in accumulator subtiles
            cTile_epi = cute.flat_divide(cute.make_identity_tensor(cute.product_each(tAcc.shape[:2])), epi_tile)
            tTR_rAcc = cute.make_rmem_tensor(
                thr_copy_t2r.partition_D(cTile_epi)[(None, None, None, 0, 0)].shape, self.k.acc_dtype
            )
        tTR_rC = cute.make_rmem_tensor(tTR_rAcc.shape, self.k.r2s_dtype)

        # Registers -> smem, in the thread layout of the TMEM load.
        copy_atom_r2s = sm100_utils.get_smem_store_op(
            self.k.c_layout, self.k.r2s_dtype, self.k.acc_dtype, tiled_copy_t2r
        )
        tiled_copy_r2s = cute.make_tiled_copy_D(copy_atom_r2s, tiled_copy_t2r)
        thr_copy_r2s = tiled_copy_r2s.get_slice(epi_tidx)
        tRS_sC = None
        if cutlass.const_expr(direct):
            # (R2S, R2S_M, R2S_N, EPI_STAGE)
            tRS_sC = thr_copy_r2s.partition_D(sC)
        # (R2S, R2S_M, R2S_N)
        tRS_rC = tiled_copy_r2s.retile(tTR_rC)
        if cutlass.const_expr(not direct):
            # (R2S, R2S_M, R2S_N): subtile-local (m, n) of each register, in the r2s order
            tRS_cE = tiled_copy_r2s.retile(thr_copy_t2r.partition_D(cTile_epi)[(None, None, None, 0, 0)])
        if cutlass.const_expr(epi.needs_coords and not grouped):
            # (T2R, T2R_M, T2R_N, EPI_M, EPI_N, RestM, RestN, RestL): global coordinates, as gC_epi
            tTR_cAcc_all = thr_copy_t2r.partition_D(
                cute.flat_divide(tCcAcc[((None, None), 0, 0, None, None, None)], epi_tile)
            )

        # smem -> global by TMA, one subtile per store; TMA clips rows/columns past M/N.
        # (TMA, EPI_STAGE), (TMA, EPI_M, EPI_N, RestM, RestN, RestL)
        bSG_sC, bSG_gC_all = cpasync.tma_partition(
            tma_atom_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), cute.group_modes(gC_epi, 0, 2)
        )
        store_pipeline = pipeline.PipelineTmaStore.create(
            num_stages=self.k.epi_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.k.num_epi_threads),
        )
        acc_consumer_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.k.acc_stage)
        epi_count = cutlass.Int32(0)  # subtiles stored so far: picks the smem buffer of the store ring

        work = sched.first()
        while sched.is_valid(work):
            tile = sched.cta_tile(work)
            full_tile = True
            tile_quant_args = quant_args
            if cutlass.const_expr(grouped):
                # (m_tile, n_tile, expert, row_start, row_end): C from the expert's first row.
                bSG_gC, gC_real_epi, cC_epi, rows_left, cols_left, full_tile, cT_epi = c_tiles(tile)
                tile_quant_args = (*quant_args, tile[4])  # no scales for the next expert's rows
                if cutlass.const_expr(epi.needs_coords):
                    # (T2R, T2R_M, T2R_N, EPI_M * EPI_N)
                    tTR_cAcc = cute.group_modes(thr_copy_t2r.partition_D(cT_epi), 3, 5)
            else:
                tile_m, tile_n, tile_l = tile[0], tile[1], tile[2]  # (listed: tile[3] is the group)
                out_m = tile_m
                if cutlass.const_expr(self.k.out_div > 1):
                    out_m = tile_m * self.k.cta_per_mma + mma_coord_v  # gC holds single-CTA tiles
                # (TMA, EPI_M * EPI_N)
                bSG_gC = cute.group_modes(bSG_gC_all[(None, None, None, out_m, tile_n, tile_l)], 1, 3)
                if cutlass.const_expr(epi.needs_coords):
                    # (T2R, T2R_M, T2R_N, EPI_M * EPI_N)
                    tTR_cAcc = cute.group_modes(
                        tTR_cAcc_all[(None, None, None, None, None, tile_m, tile_n, tile_l)], 3, 5
                    )
            desc_c = None
            if cutlass.const_expr(out_desc is not None):
                desc_c = out_desc(tile)
                if warp_idx == self.k.epi_warp_ids[0]:
                    cpasync.fence_tma_desc_acquire(desc_c)
            acc_buf = acc_consumer_state.index
            if cutlass.const_expr(self.k.acc_overlap):
                acc_buf = acc_consumer_state.phase  # overlapping buffers: tiles alternate
            # (T2R, T2R_M, T2R_N, EPI_M * EPI_N)
            tTR_tAcc = cute.group_modes(tTR_tAcc_all[(None, None, None, None, None, acc_buf)], 3, 5)
            num_epi = cute.size(tTR_tAcc, mode=[3])
            release_idx = num_epi - 1
            if cutlass.const_expr(self.k.acc_overlap):
                epi_m, epi_n = cute.product_each(cute.shape(epi_tile))
                release_idx = self.k.tmem.release_after(epi_n, self.k.cta_tile_mn[0] // epi_m, num_epi)

            acc_pipeline.consumer_wait(acc_consumer_state)
            for epi_idx in cutlass.range_constexpr(num_epi):
                sub = epi_idx  # the subtile read in this step
                if cutlass.const_expr(self.k.acc_overlap):
                    # Shared columns first: buffer 0's are its last, so it is read backwards.
                    sub = epi_idx + (num_epi - 1 - 2 * epi_idx) * (1 - acc_buf)
                cute.copy(tiled_copy_t2r, tTR_tAcc[(None, None, None, sub)], tTR_rAcc)
                if cutlass.const_expr(epi_idx == release_idx):
                    # Every TMEM read of this stage (overlapping buffers: of the columns the next
                    # tile's buffer shares) has completed (tcgen05.wait::ld): give the stage back
                    # so the MMA warp can start its next tile while we store.
                    cute.arch.fence_view_async_tmem_load()
                    with cute.arch.elect_one():
                        acc_pipeline.consumer_release(acc_consumer_state)
                coords = None
                if cutlass.const_expr(epi.needs_coords):
                    # (R2S, R2S_M, R2S_N): global coordinates of the registers below
                    coords = tiled_copy_r2s.retile(tTR_cAcc[(None, None, None, sub)])
                out = epilogue_subtile(
                    epi, tiled_copy_r2s.retile(tTR_rAcc).load(), coords, alpha, beta, mCin, mBias, vectors,
                    group_cols,
                )
                if cutlass.const_expr(direct):
                    tRS_rC.store(out.to(self.k.c_dtype))
                # The store that last used this buffer was waited for (producer_acquire below,
                # epi_stage - 1 stores ago) before the barrier that ended the previous subtile.
                buf = epi_count % self.k.epi_stage
                if cutlass.const_expr(direct):
                    cute.copy(tiled_copy_r2s, tRS_rC, tRS_sC[(None, None, None, buf)])
                elif cutlass.const_expr(fp8_out):
                    store_saturated(out, tRS_cE, sC[(None, None, buf)], FP8_MAX[self.k.config.out_dtype])
                elif cutlass.const_expr(quant):
                    # tcgen05.ld 32dp32b: a thread holds whole rows of the subtile (quad = 1)
                    store_quantized_subtile(epi, out, coords, tRS_cE, sC[(None, None, buf)], tile_quant_args, 1, 0)
                else:
                    store_gated(out, coords, tRS_cE, sC[(None, None, buf)], self.k.c_dtype)
                # Make the smem writes visible to the TMA (async proxy), then one warp stores.
                cute.arch.fence_proxy("async.shared", space="cta")
                self.k.epi_barrier.arrive_and_wait()
                if full_tile:
                    if warp_idx == self.k.epi_warp_ids[0]:
                        cute.copy(tma_atom_c, bSG_sC[(None, buf)], bSG_gC[(None, sub)], tma_desc_ptr=desc_c)
                        store_pipeline.producer_commit()
                        store_pipeline.producer_acquire()
                else:
                    if cutlass.const_expr(grouped):
                        # A grouped tile that crosses the expert's last row: every epilogue thread
                        # copies 16-byte row pieces of the subtile, rows < row_end, columns < N.
                        row0, col0 = cC_epi[(0, 0, sub)]
                        store_subtile_predicated(
                            sC[(None, None, buf)],
                            gC_real_epi[(None, None, sub)],  # (EPI_TILE_M, EPI_TILE_N)
                            rows_left - row0,
                            cols_left - col0,
                            epi_tidx,
                            self.k.num_epi_threads,
                        )
                        if warp_idx == self.k.epi_warp_ids[0]:
                            # Keep the store ring's rule (at most epi_stage - 1 TMA stores still
                            # reading smem after each subtile): the TMA stores of a previous full
                            # tile may still read the buffers the next subtiles overwrite.
                            store_pipeline.producer_acquire()
                self.k.epi_barrier.arrive_and_wait()
                epi_count += 1
            acc_consumer_state.advance()
            work = sched.next(work)

        # Stores must have read smem before the CTA exits; all TMEM reads finished before the
        # last epilogue barrier, and every MMA before the last acc-full wait.
        store_pipeline.producer_tail()
        tmem.relinquish_alloc_permit()
        # 2-CTA: waits (mbarrier) until the peer CTA's epilogue is done with its TMEM too.
        tmem.free(tmem_ptr, self.k.num_tmem_cols)

    def grouped_c_tiles(self, mC_mnl, mC_gmem, mB_nkl, thr_mma, sC, epi_tile, tma_atom_c):
        """The grouped form's ``c_tiles``: tile -> where its output goes (see the inner function)."""
        k = self.k
        epi = k.config.epilogue
        # Output tile of a CTA (gated / FP4: fewer stored columns than GEMM columns; grouped
        # tiles are 1-CTA MMAs, so the CTA tile is the MMA tile).
        out_tile = (k.cta_tile_mn[0], k.cta_tile_mn[1] // k.out_div)
        # Tile-local (m, n) of every element of this CTA's output, in epilogue subtiles:
        # (EPI_TILE_M, EPI_TILE_N, EPI_M * EPI_N), as bSG_gC / gC_real_epi below.
        if cutlass.const_expr(k.out_div == 1):
            cC_epi = cute.group_modes(
                cute.flat_divide(
                    thr_mma.partition_C(cute.make_identity_tensor(k.mma_tiler[:2]))[((None, None), 0, 0)],
                    epi_tile,
                ),
                2,
                4,
            )
        else:
            cC_epi = cute.group_modes(cute.flat_divide(cute.make_identity_tensor(out_tile), k.epi_tile_out), 2, 4)
        # (bM, bN, RestM, RestN, RestE): (packed row, GEMM column, expert) of every accumulator
        cAcc_tiles = None
        if cutlass.const_expr(epi.needs_coords):
            cAcc_tiles = cute.local_tile(
                grouped_acc_space(mC_mnl, mB_nkl), cute.slice_(k.mma_tiler, (None, None, 0)), (None, None, None)
            )

        def c_tiles(tile):
            """Output of a grouped tile: (bSG_gC (TMA, EPI_M * EPI_N) TMA destinations,
            gC_real_epi (EPI_TILE_M, EPI_TILE_N, EPI_M * EPI_N) the same subtiles of C itself,
            cC_epi their tile-local coordinates, rows_left, cols_left, full_tile, and the
            accumulator's global coordinates (EPI_TILE_M, EPI_TILE_N, EPI_M, EPI_N) or None)."""
            gC_t, gC_real_t, rows_left, cols_left, full_tile = grouped_out_tile(mC_mnl, mC_gmem, tile, out_tile)
            if cutlass.const_expr(k.out_div == 1):
                # (CTA_M, CTA_N): this CTA's part of the MMA tile -> (EPI_TILE_M, EPI_TILE_N, EPI_M, EPI_N)
                gC_epi_t = cute.flat_divide(thr_mma.partition_C(gC_t)[((None, None), 0, 0)], epi_tile)
                gC_real_epi = cute.group_modes(
                    cute.flat_divide(thr_mma.partition_C(gC_real_t)[((None, None), 0, 0)], epi_tile), 2, 4
                )
            else:
                gC_epi_t = cute.flat_divide(gC_t, k.epi_tile_out)
                gC_real_epi = cute.group_modes(cute.flat_divide(gC_real_t, k.epi_tile_out), 2, 4)
            _, bSG_gC_t = cpasync.tma_partition(
                tma_atom_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), cute.group_modes(gC_epi_t, 0, 2)
            )
            coords = None
            if cutlass.const_expr(epi.needs_coords):
                coords = cute.flat_divide(
                    thr_mma.partition_C(grouped_acc_coords(cAcc_tiles, tile))[((None, None), 0, 0)], epi_tile
                )
            return cute.group_modes(bSG_gC_t, 1, 3), gC_real_epi, cC_epi, rows_left, cols_left, full_tile, coords
        return c_tiles
