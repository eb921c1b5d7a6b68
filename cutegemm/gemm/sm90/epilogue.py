"""The sm_90a consumer warpgroups' epilogue (a part of ``cutegemm.gemm.sm90.kernel.GemmSm90``): per
tile, the accumulator's subtiles (all of the tile's rows x 32 columns) through
``epilogue.epilogue_subtile``, into a ring of shared-memory buffers, each stored by one warp's
TMA (or, for a grouped tile that crosses its expert's end, by predicated copies).

- Direct outputs go registers -> stmatrix -> smem; gated and quantized outputs store by
  coordinate (the stmatrix partition still gives the register order).
- Per-tile inputs (FP8 row-wise scales; bias with alpha when there is no beta * C) are applied to
  the whole accumulator first (``AccumulatorScaling.scale_accumulators``).
- Grouped tiles start at their expert's first row; swapped tiles (``gemm.sm90.swap``) skip the
  subtiles past the expert's last token and store transposed.

:meth:`epilogue_parts` builds the copies, buffers and barriers once per CTA; :meth:`store_tile`
runs one tile's epilogue and returns the count of subtiles stored so far (it picks the buffer).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup

from ...epilogue import epilogue_subtile, store_gated
from ...epilogue.ops import FP8_MAX, store_saturated
from ...epilogue.quant import store_quantized_subtile
from ..grouped_parts import grouped_acc_coords, grouped_out_tile
from ..store import store_subtile_predicated

BAR_EPILOGUE = 1  # + warpgroup turn (1, 2)


class EpiParts(NamedTuple):
    """A consumer thread's epilogue pieces (see :meth:`Sm90Epilogue.epilogue_parts`)."""

    tiled_copy_r2s: object
    tRS_rAcc: cute.Tensor  # (R2S, R2S_M, R2S_N) view of the whole accumulator
    tRS_sC: object  # direct: (R2S, R2S_M, R2S_N, EPI_STAGE) smem destination, else None
    tRS_rD_out: object  # direct: the subtile cast to the output type, else None
    tRS_cE: object  # gated / quantized: subtile-local (m, n) of each register, else None
    tRS_rD: cute.Tensor  # the subtile's fp32 values
    size_rD: int
    store_pipeline: object
    epi_barrier: object
    store_warp: object  # this warp issues the TMA stores
    tRS_sZ: object = None  # preact: (R2S, R2S_M, R2S_N, EPI_STAGE) smem of the values before the gate
    tRS_rZ: object = None  # preact: a subtile of them in the output type


class Sm90Epilogue:
    """:meth:`epilogue_parts` and :meth:`store_tile` (see the module docstring)."""

    def __init__(self, kernel):
        self.k = kernel  # the kernel this part belongs to (its config, layouts, tiles)

    # --- preact: a gated epilogue's second output, the values before the gate (all GEMM columns),
    # stored like a direct output (stmatrix -> its own smem ring -> TMA) beside the gated one.
    def preact_smem_layout(self, c_layout):
        """(EPI_M, EPI_N, stages) smem ring of the values before the gate (row-major, swizzled)."""
        atom = sm90_utils.get_smem_layout_atom(c_layout, self.k.c_dtype, self.k.epi_tile[1])
        return cute.tile_to_shape(
            warpgroup.make_smem_layout_atom(atom, self.k.c_dtype),
            (*self.k.epi_tile, self.k.epi_stage * self.k.epi_groups),
            order=(0, 1, 2),
        )

    def preact_tma(self, mZ: cute.Tensor):
        """(TMA store atom, TMA coordinate tensor) of the (M, N, L) output of the values before the gate."""
        return cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), mZ, cute.slice_(self.k.epi_smem_layout_z, (None, None, 0)),
            self.k.epi_tile,
        )  # fmt: skip

    def epilogue_parts(self, tiled_mma, mma_tidx, sC: cute.Tensor, acc_sum: cute.Tensor, wg, warp_idx,
                       sZ=None) -> EpiParts:  # fmt: skip
        """The epilogue's copies, register buffers, TMA-store pipeline and barrier, once per CTA."""
        epi = self.k.config.epilogue
        direct = self.k.direct_store  # registers -> stmatrix -> smem
        tRS_sC = tRS_rD_out = tRS_cE = tRS_sZ = tRS_rZ = None
        # Epilogue copies: registers -> smem with stmatrix, then one warp TMA-stores the subtile.
        # (Gated, quantized and FP8 outputs store by coordinate; the stmatrix partition still
        # gives the register order: built for bf16 then, or for the output's type with preact.)
        r2s_dtype = self.k.c_dtype if direct or epi.preact else cutlass.BFloat16
        copy_atom_r2s = sm90_utils.sm90_get_smem_store_op(
            self.k.c_layout, elem_ty_d=r2s_dtype, elem_ty_acc=self.k.acc_dtype
        )
        copy_atom_c = cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(self.k.c_layout.is_m_major_c(), 4), r2s_dtype
        )
        tiled_copy_r2s = cute.make_tiled_copy_S(copy_atom_r2s, cute.make_tiled_copy_C_atom(copy_atom_c, tiled_mma))
        thr_copy_r2s = tiled_copy_r2s.get_slice(mma_tidx)
        # (R2S, R2S_M, R2S_N) view of the whole accumulator
        tRS_rAcc = tiled_copy_r2s.retile(acc_sum)
        if cutlass.const_expr(direct):
            # (R2S, R2S_M, R2S_N, EPI_STAGE)
            tRS_sC = thr_copy_r2s.partition_D(sC)
            rD_shape = cute.shape(thr_copy_r2s.partition_S(sC))[:3]
            tRS_rD_out = cute.make_rmem_tensor(rD_shape, self.k.c_dtype)
        else:
            # (R2S, R2S_M, R2S_N): subtile-local (m, n) of each accumulator register of a subtile
            tRS_cE = thr_copy_r2s.partition_S(cute.make_identity_tensor(self.k.epi_tile))
            rD_shape = cute.shape(tRS_cE)
        if cutlass.const_expr(epi.preact):
            tRS_sZ = thr_copy_r2s.partition_D(sZ)
            tRS_rZ = cute.make_rmem_tensor(cute.shape(thr_copy_r2s.partition_S(sZ))[:3], self.k.c_dtype)
        tRS_rD = cute.make_rmem_tensor(rD_shape, self.k.acc_dtype)
        size_rD = cute.size(tRS_rD)

        store_pipeline = pipeline.PipelineTmaStore.create(
            num_stages=self.k.epi_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.k.threads_per_tile),
        )
        # Barriers: the epilogue's (threads sharing a tile) and, in pingpong, one "your turn for
        # the tensor cores" barrier per warpgroup (its 128 threads sync, the other's 128 arrive).
        epi_barrier = pipeline.NamedBarrier(barrier_id=BAR_EPILOGUE + wg, num_threads=self.k.threads_per_tile)
        store_warp = warp_idx % 4 == 0  # one warp of the group issues the TMA stores
        if self.k.wg_per_tile > 1:
            store_warp = warp_idx == 4
        return EpiParts(tiled_copy_r2s, tRS_rAcc, tRS_sC, tRS_rD_out, tRS_cE, tRS_rD, size_rD, store_pipeline,
                        epi_barrier, store_warp, tRS_sZ, tRS_rZ)  # fmt: skip

    @cute.jit
    def store_tile(self, ep: EpiParts, tile, acc_sum: cute.Tensor, thr_mma, epi_count: cutlass.Int32,
                   gC_mnl: cute.Tensor, mC_mnl: cute.Tensor, mC_gmem, cAcc_mnl, tma_atom_c: cute.CopyAtom,
                   sC: cute.Tensor, alpha: cutlass.Float32, beta: cutlass.Float32, mCin, mBias, quant_args: tuple,
                   vectors: tuple, group_cols, out_desc, mma_tidx: cutlass.Int32, wg: cutlass.Int32,
                   preact=None) -> cutlass.Int32:  # fmt: skip
        """One tile's epilogue (``tile``: the scheduler's coordinates); returns ``epi_count`` plus
        the subtiles stored. ``preact``: (TMA atom, smem ring, TMA tensor, global tensor) of the
        values before the gate (config.epilogue.preact), else None."""
        epi = self.k.config.epilogue
        epi_sub = self.k.accum.epilogue_after_pre()
        gated = epi.gated is not None
        quant = epi.quant is not None
        direct = self.k.direct_store
        fp8_out = not direct and not gated and not quant  # an FP8 output (epilogue.ops.store_saturated)
        swap = self.k.config.swap_ab
        # swap_ab + gated: the subtile's values before gating (its gate / up pairs lie in two
        # threads; ``swap_gated_store`` pairs them)
        epi_values = dataclasses.replace(epi_sub, gated=None) if swap and gated else epi_sub
        tiled_copy_r2s, tRS_rAcc, tRS_sC, tRS_rD_out, tRS_cE, tRS_rD, size_rD, store_pipeline, epi_barrier, store_warp = ep[:10]
        tRS_sZ, tRS_rZ = ep[10:]  # (unpacked here: an attribute read inside the loop's `if` would carry ep)
        full_tile = True
        tile_quant_args = quant_args
        if cutlass.const_expr(swap):
            # Tokens of this expert start at row_start (C's columns here): subtiles past its
            # last token are skipped, one that crosses it is stored by predicated copies.
            gC, gC_real, tokens_left, cols_left = self.k.swap.swap_out_tile(mC_mnl, mC_gmem, tile, gC_mnl.shape[:2])
        elif cutlass.const_expr(self.k.config.grouped):
            # Rows of this expert start at row_start: offset C, and store with TMA only when
            # every row of the tile belongs to the expert (else predicated, row < row_end).
            gC, gC_real, rows_left, cols_left, full_tile = grouped_out_tile(
                mC_mnl, mC_gmem, tile, gC_mnl.shape[:2]
            )
            if cutlass.const_expr(self.k.config.c_major == "m"):
                # C M-major: the TMA store's box starts at the tile's first row along the unit-stride
                # mode, which must be 16-byte aligned (8 elements): an expert starting elsewhere
                # stores every tile by predicated copies
                full_tile = full_tile and tile[3] % 8 == 0
            tile_quant_args = (*quant_args, tile[4])  # no scales for the next expert's rows
        else:
            gC = gC_mnl[(None, None, tile[0], tile[1], tile[2])]
        desc_c = None
        if cutlass.const_expr(out_desc is not None):
            desc_c = out_desc(tile)
            if store_warp:
                cpasync.fence_tma_desc_acquire(desc_c)
        # ((EPI_M, EPI_N), (RestM, RestN))
        gC_epi = cute.zipped_divide(gC, self.k.epi_tile_out)
        bSG_sC, bSG_gC = cpasync.tma_partition(
            tma_atom_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), gC_epi
        )
        if cutlass.const_expr(epi.preact):  # the values before the gate: whole accumulator subtiles
            tma_atom_z, sZ, mZ_mnl, mZ_gmem = preact
            z_tile = (self.k.config.tile_m, self.k.config.tile_n)
            if cutlass.const_expr(self.k.config.grouped):
                gZ, gZ_real, _, z_cols_left, _ = grouped_out_tile(mZ_mnl, mZ_gmem, tile, z_tile)
            else:
                gZ = cute.local_tile(mZ_mnl, z_tile, (tile[0], tile[1], tile[2]))
            bSG_sZ, bSG_gZ = cpasync.tma_partition(
                tma_atom_z, 0, cute.make_layout(1), cute.group_modes(sZ, 0, 2), cute.zipped_divide(gZ, self.k.epi_tile)
            )
        epi_rest = gC_epi.shape[1]
        epi_layout = cute.make_layout(epi_rest, stride=(epi_rest[1], 1))
        num_epi = cute.size(epi_rest)
        tRS_cAcc = None
        if cutlass.const_expr(epi.needs_coords):
            # (R2S_V, EPI): global coordinates of tRS_rAcc's registers; column epi_idx holds
            # those that the loop below copies into tRS_rD for subtile epi_idx.
            if cutlass.const_expr(swap):
                tCcAcc = thr_mma.partition_C(self.k.swap.swap_acc_coords(cAcc_mnl, tile))
            elif cutlass.const_expr(self.k.config.grouped):
                tCcAcc = thr_mma.partition_C(grouped_acc_coords(cAcc_mnl, tile))
            else:
                tCcAcc = thr_mma.partition_C(cAcc_mnl[(None, None, tile[0], tile[1], tile[2])])
            if cutlass.const_expr(any(self.k.accum.pre_epilogue)):
                self.k.accum.scale_accumulators(acc_sum, tCcAcc, vectors, group_cols, alpha, mBias)
            tRS_cAcc = cute.composition(tiled_copy_r2s.retile(tCcAcc), cute.make_layout((size_rD, num_epi)))
        for epi_idx in cutlass.range_constexpr(num_epi):
            epi_coord = epi_layout.get_hier_coord(epi_idx)
            live = True
            if cutlass.const_expr(swap):  # swap_ab: subtiles past the expert's last token are skipped
                live = tokens_left > epi_coord[1] * self.k.epi_tile_out[1]
            if live:
                for v in cutlass.range_constexpr(size_rD):
                    tRS_rD[v] = tRS_rAcc[epi_idx * size_rD + v]
                coords = tRS_cAcc[(None, epi_idx)] if cutlass.const_expr(epi_sub.needs_coords) else None
                if cutlass.const_expr(epi.preact):
                    z, out = epilogue_subtile(epi_values, tRS_rD.load(), coords, alpha, beta, mCin, mBias, vectors,
                                              group_cols, preact=True)  # fmt: skip
                    tRS_rZ.store(z.to(self.k.c_dtype))
                    z_buf = wg * self.k.epi_stage + epi_count % self.k.epi_stage  # (= buf below)
                    cute.copy(tiled_copy_r2s, tRS_rZ, tRS_sZ[(None, None, None, z_buf)])
                else:
                    out = epilogue_subtile(epi_values, tRS_rD.load(), coords, alpha, beta, mCin, mBias, vectors, group_cols)
                if cutlass.const_expr(direct):
                    tRS_rD_out.store(out.to(self.k.c_dtype))
                buf = wg * self.k.epi_stage + epi_count % self.k.epi_stage
                if cutlass.const_expr(direct):
                    cute.copy(tiled_copy_r2s, tRS_rD_out, tRS_sC[(None, None, None, buf)])
                elif cutlass.const_expr(fp8_out):
                    store_saturated(out, tRS_cE, sC[(None, None, buf)], FP8_MAX[self.k.config.out_dtype])
                elif cutlass.const_expr(quant):
                    store_quantized_subtile(
                        epi_sub, out, coords, tRS_cE, sC[(None, None, buf)], tile_quant_args, 4, 1 if gated else 2
                    )
                elif cutlass.const_expr(swap):
                    self.k.swap.swap_gated_store(epi_sub, out, coords, tRS_cE, sC[(None, None, buf)], self.k.c_dtype)
                else:
                    store_gated(out, coords, tRS_cE, sC[(None, None, buf)], self.k.c_dtype)
                # Make the smem writes visible to the TMA (async proxy), then one warp stores.
                cute.arch.fence_proxy("async.shared", space="cta")
                epi_barrier.arrive_and_wait()
                sub_full = full_tile
                if cutlass.const_expr(swap):  # every token column of the subtile is the expert's
                    sub_full = tokens_left >= (epi_coord[1] + 1) * self.k.epi_tile_out[1]
                if sub_full:
                    if store_warp:
                        cute.copy(tma_atom_c, bSG_sC[(None, buf)], bSG_gC[(None, epi_coord)], tma_desc_ptr=desc_c)
                        if cutlass.const_expr(epi.preact):  # in the same bulk group
                            cute.copy(tma_atom_z, bSG_sZ[(None, buf)], bSG_gZ[(None, epi_coord)])
                        store_pipeline.producer_commit()
                        # Before the buffer after next is rewritten, its store must have read it.
                        store_pipeline.producer_acquire()
                else:
                    # A grouped tile that crosses the expert's last row: every thread copies
                    # 16-byte row pieces of the subtile, rows < row_end and columns < N only.
                    # (swap_ab: token columns < the expert's end, weight rows < N.)
                    if cutlass.const_expr(swap):
                        self.k.swap.swap_store_partial(
                            sC[(None, None, buf)],
                            cute.local_tile(gC_real, self.k.epi_tile_out, epi_coord),
                            tokens_left - epi_coord[1] * self.k.epi_tile_out[1],
                            cols_left - epi_coord[0] * self.k.epi_tile_out[0],
                            mma_tidx,
                        )
                    elif cutlass.const_expr(self.k.config.grouped):
                        store_subtile_predicated(
                            sC[(None, None, buf)],
                            cute.local_tile(gC_real, self.k.epi_tile_out, epi_coord),  # (EPI_M, EPI_N)
                            rows_left - epi_coord[0] * self.k.epi_tile_out[0],
                            cols_left - epi_coord[1] * self.k.epi_tile_out[1],
                            mma_tidx,
                            self.k.threads_per_tile,
                            self.k.config.c_major == "m",
                        )
                        if cutlass.const_expr(epi.preact):
                            store_subtile_predicated(
                                sZ[(None, None, buf)],
                                cute.local_tile(gZ_real, self.k.epi_tile, epi_coord),
                                rows_left - epi_coord[0] * self.k.epi_tile[0],
                                z_cols_left - epi_coord[1] * self.k.epi_tile[1],
                                mma_tidx,
                                self.k.threads_per_tile,
                            )
                    if cutlass.const_expr(self.k.config.grouped):
                        if store_warp:
                            # This path commits no TMA store, so nothing retires the earlier ones:
                            # wait until they have read their buffers before the next subtile
                            # rewrites one of them.
                            cute.arch.cp_async_bulk_wait_group(0, read=True)
                epi_barrier.arrive_and_wait()
                epi_count += 1
        return epi_count
