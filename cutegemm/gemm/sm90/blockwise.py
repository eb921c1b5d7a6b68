"""FP8 with DeepSeek block scales on Hopper: the pieces of ``cutegemm.gemm.sm90.kernel.GemmSm90`` used
only when ``config.fp8_blockwise`` (mixed in; every call site is behind
``const_expr(config.fp8_blockwise)``, so other kernels compile exactly as without it).

Scales: fp32 scale_a (M, K/128) per 1x128 block of A's rows, M-major (``fp8_args.tma_scale_a``),
scale_b per 128x128 block of B (the kernel's (NB, KB) view; grouped: (NB, KB, E)). K tile kt's WGMMA partial sum (a fresh fp32
``acc`` per 128-wide K tile) is promoted as

    acc_sum[r, c] += acc[r, c] * scale_a[r, kt] * scale_b[c // 128, kt]

A thread's rows and columns: ``gemm.sm90.accumulators`` (frag_dims, frag_idx). A tile of at most 128
columns sees one N block of B; a 192-wide tile (``two_nb``) spans two: its 8-column groups before
the block boundary (64 or 128 columns in, by the tile's position: tiles start at multiples of
64) take the first B scale, the rest the second.

scale_a rides the A/B stage ring (as in DeepGEMM): the producer TMA-loads the tile's rows of K
block kt (one box of sfa_rows(): tile_m, + 4 when grouped) into stage kt beside A and B, on the same full
barrier, so a consumer reads its rows' scales from shared memory once the stage is full, with
no global-load latency in the K loop. (Loaded by the consumers from global memory, the scales'
latency sat in front of the first WGMMA of a K tile: ptxas hoists the scale product there.)
Grouped tiles start at any row; the box starts at the row rounded down to 4 (16 bytes: TMA's
alignment of the contiguous mode) and the consumers read that many rows further in. The B scales
(one or two per K tile per tile) are loaded by the consumers from global memory one K tile
ahead; the K loop is unrolled by two K tiles whose B-scale registers swap roles.

``config.sfb_cols`` (dense): scale_b per column and K block instead, (N, K/128) N-major (torch's
1x128 blocks of B): it rides the stage ring too (one TMA box of tile_n columns of K block kt per
stage, beside scale_a), and the promotion is ``acc_sum[r, c] += acc[r, c] * scale_a[r, kt] *
scale_b[c, kt]``, a thread reading its tile_n / 4 columns' scales from the stage before it
releases it.
"""

from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.cute.nvgpu import cpasync, warpgroup

from ..fp8_scales import SCALE_A_ROW_ALIGN as SFA_ALIGN  # fp32 rows per 16 bytes
from .accumulators import frag_dims, frag_idx


class BlockwiseRegs(NamedTuple):
    """A consumer thread's block-scale state (:meth:`BlockwiseMainloop.blockwise_setup`, once)."""

    sSFA: object  # scale_a's stages (shared memory)
    sfb: object  # scale_b: the (NB, KB[, E]) fp32 tensor, or with config.sfb_cols its stages (shared memory)
    n_sa: int  # accumulator rows of this thread
    two_nb: bool  # a tile spans two 128-column N blocks of B's scales
    sa_rows: object  # (n_sa,) Int32: the tile-local rows of the thread's accumulator registers
    sa_vals: object  # (n_sa,) Float32: their scale_a in the current K tile
    sb_cur: object  # (1 or 2,) Float32: B's scale(s) of the current K tile (None with config.sfb_cols)
    sb_next: object  # ... of the K tile loaded a tile ahead (None with config.sfb_cols)
    col0: object  # config.sfb_cols: (1,) Int32, the thread's first tile-local column (else None)
    acc_shape: object


class BlockwiseMainloop:
    """DeepSeek block scaling (config.fp8_blockwise): 1x128 activation scales riding the stage ring
    beside A, 128x128 weight scales loaded a K tile ahead, applied as each K tile is promoted."""

    def __init__(self, kernel):
        self.k = kernel  # the kernel this part belongs to (its config, layouts, tiles)

    def sfa_rows(self) -> int:
        """Rows of one stage's scale_a box: tile_m, plus SFA_ALIGN for grouped tiles (their first
        row need not be a multiple of 4)."""
        return self.k.config.tile_m + (SFA_ALIGN if self.k.config.grouped else 0)

    def sfa_stage_floats(self) -> int:
        """Shared-memory floats per scale_a stage: sfa_rows() rounded up to 128 bytes (a TMA
        destination's alignment; a 132-row stride faulted with a misaligned address)."""
        return -(-self.sfa_rows() // 32) * 32

    def sfa_layout(self):
        """(rows, 1, stage) fp32 scale_a stages, rows contiguous, each stage 128-byte aligned."""
        r, st = self.sfa_rows(), self.sfa_stage_floats()
        return cute.make_layout((r, 1, self.k.ab_stage), stride=(1, st, st))

    def sfb_stage_floats(self) -> int:
        """config.sfb_cols: shared-memory floats per scale_b stage (tile_n, 128-byte aligned)."""
        return -(-self.k.config.tile_n // 32) * 32

    def sfb_layout(self):
        """config.sfb_cols: (tile_n, 1, stage) fp32 scale_b stages, columns contiguous."""
        n, st = self.k.config.tile_n, self.sfb_stage_floats()
        return cute.make_layout((n, 1, self.k.ab_stage), stride=(1, st, st))

    def stage_bytes(self) -> int:
        """Scale bytes one stage receives: scale_a's box, and scale_b's with config.sfb_cols."""
        return (self.sfa_rows() + (self.k.config.tile_n if self.k.config.sfb_cols else 0)) * 4

    @staticmethod
    def scale_tma(m: cute.Tensor, stages, rows: int):
        """TMA atom and coordinate tensor of a (rows-major) scale tensor (R, KB) as (R, KB, 1): one box
        of ``rows`` x 1 per stage of ``stages`` (its layout), every CTA for itself (no multicast)."""
        m3 = cute.make_tensor(m.iterator, cute.append(m.layout, cute.make_layout(1)))
        return cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), m3, cute.slice_(stages, (None, None, 0)), (rows, 1)
        )

    def sfb_tma(self, mSFB: cute.Tensor):
        """config.sfb_cols: scale_b (N, KB) (N-major): one box of tile_n x 1 per stage."""
        return self.scale_tma(mSFB, self.sfb_layout(), self.k.config.tile_n)

    def sfb_load_operand(self, tma_atom, mSFB, sSFB):
        """config.sfb_cols: the scale_b operand for ``GemmBase.load_ab``: n-tile tile[1]'s columns."""
        one = cute.make_layout(1)
        tBsSFB, tBgSFB = cpasync.tma_partition(
            tma_atom, 0, one, cute.group_modes(sSFB, 0, 2),
            cute.group_modes(cute.local_tile(mSFB, (self.k.config.tile_n, 1), (None, None, None)), 0, 2),
        )  # fmt: skip

        def sfb_tiles(tile):
            return tBgSFB[(None, tile[1], None, tile[2])]

        return (tma_atom, sfb_tiles, tBsSFB, None)

    def sfa_box_row(self, tile):
        """(first row of grouped tile ``tile``'s scale_a box, the tile's first row's offset in it):
        the tile's first row rounded down to SFA_ALIGN (TMA's 16-byte rule for the contiguous
        mode's coordinate)."""
        row0 = tile[3] + tile[0] * self.k.config.tile_m
        off = row0 % SFA_ALIGN
        return row0 - off, off

    def sfa_tma(self, mSFA: cute.Tensor):
        """scale_a (M, KB) (M-major): one box of sfa_rows() x 1 per stage (:meth:`scale_tma`)."""
        return self.scale_tma(mSFA, self.sfa_layout(), self.sfa_rows())

    def sfa_load_operand(self, tma_atom, mSFA, sSFA):
        """The scale_a operand for ``GemmBase.load_ab`` (``mSFA``: the TMA coordinate tensor of
        :meth:`sfa_tma`; ``sSFA``: ``storage.sSFA`` in :meth:`sfa_layout`). Dense: m-tile
        tile[0]'s rows. Grouped: from row tile[3] + tile[0] * tile_m rounded down to a multiple of
        4. Built inside the producer's branch: the tile function closes over its values."""
        rows = self.sfa_rows()
        one = cute.make_layout(1)
        ssfa = cute.group_modes(sSFA, 0, 2)
        tAsSFA, tAgSFA = cpasync.tma_partition(
            tma_atom, 0, one, ssfa, cute.group_modes(cute.local_tile(mSFA, (rows, 1), (None, None, None)), 0, 2)
        )

        def sfa_tiles(tile):
            if cutlass.const_expr(self.k.config.grouped):
                g = cute.local_tile(cute.domain_offset((self.sfa_box_row(tile)[0], 0, 0), mSFA), (rows, 1),
                                    (None, None, None))  # fmt: skip
                _, t = cpasync.tma_partition(tma_atom, 0, one, ssfa, cute.group_modes(g, 0, 2))
                return t[(None, 0, None, 0)]
            return tAgSFA[(None, tile[0], None, tile[2])]

        return (tma_atom, sfa_tiles, tAsSFA, None)

    def blockwise_setup(self, thr_mma, acc_shape, block_scales):
        """Per consumer thread, once: its :class:`BlockwiseRegs`."""
        cfg = self.k.config
        sSFA, mSFB = block_scales
        n_sa = frag_dims(acc_shape, cfg.tile_n)[0]
        two_nb = cfg.tile_n > 128
        n_sb = 2 if two_nb else 1
        tCcTile = thr_mma.partition_C(cute.make_identity_tensor((cfg.tile_m, cfg.tile_n)))
        sa_rows = cute.make_rmem_tensor((n_sa,), cutlass.Int32)
        for i in range(n_sa):
            sa_rows[i] = tCcTile[frag_idx(i, 0)][0]
        sa_vals = cute.make_rmem_tensor((n_sa,), cutlass.Float32)
        if cutlass.const_expr(cfg.sfb_cols):  # the column scales are read from the stages as used
            col0 = cute.make_rmem_tensor((1,), cutlass.Int32)
            col0[0] = tCcTile[frag_idx(0, 0)][1]
            return BlockwiseRegs(sSFA, mSFB, n_sa, False, sa_rows, sa_vals, None, None, col0, acc_shape)
        sb_cur = cute.make_rmem_tensor((n_sb,), cutlass.Float32)
        sb_next = cute.make_rmem_tensor((n_sb,), cutlass.Float32)
        return BlockwiseRegs(sSFA, mSFB, n_sa, two_nb, sa_rows, sa_vals, sb_cur, sb_next, None, acc_shape)

    def blockwise_tile_start(self, bw, tile):
        """A tile's N block(s) and K tile 0's B scales into the first buffer. Returns (the
        loads' arguments, the 8-column group where the second N block starts).

        Grouped: B's scales are the expert's (NB, KB) slice, and the stage's scale_a box starts
        ``sa_off`` rows before the tile's first row (rounded down to 4). A tile past N (the second
        CTA of a 1x2 cluster at an odd n-tile count) and a 192-wide tile's second block past N's
        last read the last N block's scales (clamped: memcheck found the read past B's scales),
        never stored."""
        cfg = self.k.config
        sfb = bw.sfb
        sa_off = 0
        if cfg.grouped:  # (plain Python, traced inline: a compile-time branch)
            sfb = bw.sfb[(None, None, tile[2])]
            sa_off = self.sfa_box_row(tile)[1]
        col0 = tile[1] * cfg.tile_n
        n_blk = cutlass.min(col0 // 128, sfb.shape[0] - 1)
        n_blk1 = cutlass.min(col0 // 128 + 1, sfb.shape[0] - 1)
        nb_split = (128 - col0 % 128) // 8
        bw_at = (sfb, n_blk, n_blk1, sa_off)
        if cutlass.const_expr(not cfg.sfb_cols):  # (per-column scales ride the stages)
            self.load_b_scales(bw.sb_cur, bw_at, 0, bw.two_nb)
        return bw_at, nb_split

    @cute.jit
    def blockwise_k_loop(
        self,
        ab_pipeline: pipeline.PipelineAsync,
        read_state,
        release_state,
        tiled_mma: cute.TiledMma,
        acc: cute.Tensor,
        acc_sum: cute.Tensor,
        tCrA: cute.Tensor,
        tCrB: cute.Tensor,
        num_k_blocks: cutlass.Constexpr,
        kt_cnt: cutlass.Int32,
        bw,
        bw_at,
        nb_split: cutlass.Int32,
        my_wg: cutlass.Int32,
    ):
        """A tile's K loop, unrolled by two K tiles whose B-scale buffers swap roles: the B
        scales loaded for K tile k + 1 are first read by its promotion, a whole K tile later.
        Returns (tiled_mma, read_state, release_state)."""
        sb_cur, sb_next = bw.sb_cur, bw.sb_next
        bw_k = (bw, bw_at, nb_split, my_wg)
        if cutlass.const_expr(self.k.config.sfb_cols):  # the scales of both operands ride the stages
            for _kt in range(kt_cnt):
                tiled_mma, read_state, release_state = self.blockwise_k_tile(
                    ab_pipeline, read_state, release_state, tiled_mma, acc, acc_sum, tCrA, tCrB, num_k_blocks,
                    None, None, 0, bw_k,
                )  # fmt: skip
            return tiled_mma, read_state, release_state
        for kp in range(kt_cnt // 2):
            tiled_mma, read_state, release_state = self.blockwise_k_tile(
                ab_pipeline, read_state, release_state, tiled_mma, acc, acc_sum, tCrA, tCrB, num_k_blocks,
                sb_cur, sb_next, 2 * kp + 1, bw_k,
            )  # fmt: skip
            tiled_mma, read_state, release_state = self.blockwise_k_tile(
                ab_pipeline, read_state, release_state, tiled_mma, acc, acc_sum, tCrA, tCrB, num_k_blocks,
                sb_next, sb_cur, cutlass.min(2 * kp + 2, kt_cnt - 1), bw_k,
            )  # fmt: skip
        if kt_cnt % 2 == 1:  # the last K tile (its "next" load reloads its own scales)
            tiled_mma, read_state, release_state = self.blockwise_k_tile(
                ab_pipeline, read_state, release_state, tiled_mma, acc, acc_sum, tCrA, tCrB, num_k_blocks,
                sb_cur, sb_next, kt_cnt - 1, bw_k,
            )  # fmt: skip
        return tiled_mma, read_state, release_state

    @cute.jit
    def blockwise_k_tile(
        self,
        ab_pipeline: pipeline.PipelineAsync,
        read_state,
        release_state,
        tiled_mma: cute.TiledMma,
        acc: cute.Tensor,
        acc_sum: cute.Tensor,
        tCrA: cute.Tensor,
        tCrB: cute.Tensor,
        num_k_blocks: cutlass.Constexpr,
        sb_use: cute.Tensor,
        sb_load: cute.Tensor,
        k_load: cutlass.Int32,
        bw_k,  # (bw, bw_at, nb_split, my_wg)
    ):
        """One K tile with DeepSeek block scales: its WGMMAs into a fresh partial sum, this
        thread's row scales from the stage, the B scales of K tile ``k_load`` into ``sb_load``
        while the WGMMAs run, then acc_sum += partial * scale_a[row] * scale_b (``sb_use``).
        Returns (tiled_mma, read_state, release_state)."""
        bw, bw_at, nb_split, my_wg = bw_k
        sSFA, n_sa, two_nb, sa_rows, sa_vals, acc_shape = bw.sSFA, bw.n_sa, bw.two_nb, bw.sa_rows, bw.sa_vals, bw.acc_shape
        sa_off = bw_at[3]
        ab_pipeline.consumer_wait(read_state)
        tiled_mma = self.k.consumers.issue_k_tile(tiled_mma, acc, tCrA, tCrB, read_state.index, num_k_blocks, True, my_wg)
        for i in cutlass.range_constexpr(n_sa):  # before the stage is released
            sa_vals[i] = sSFA[(sa_off + sa_rows[i], 0, read_state.index)]
        if cutlass.const_expr(self.k.config.sfb_cols):
            # the columns' scales are read from the stage as they are used (no register copy of
            # tile_n / 4 of them), so the stage is released after the promotion
            warpgroup.wait_group(0)
            self.promote_columns(acc_sum, acc, sa_vals, bw.sfb, bw.col0[0], read_state.index, n_sa, acc_shape)
            ab_pipeline.consumer_release(read_state)
            release_state.advance()
            read_state.advance()
            return tiled_mma, read_state, release_state
        self.load_b_scales(sb_load, bw_at, k_load, two_nb)
        warpgroup.wait_group(0)
        ab_pipeline.consumer_release(read_state)
        release_state.advance()
        if cutlass.const_expr(two_nb):
            # the boundary is 64 or 128 columns in (tiles start at multiples of 64): one
            # constant split per branch, no select per register
            if nb_split == 8:
                self.promote_blockwise(acc_sum, acc, sa_vals, sb_use, n_sa, acc_shape, 8)
            else:
                self.promote_blockwise(acc_sum, acc, sa_vals, sb_use, n_sa, acc_shape, 16)
        else:
            self.promote_blockwise(acc_sum, acc, sa_vals, sb_use, n_sa, acc_shape, None)
        read_state.advance()
        return tiled_mma, read_state, release_state

    @cute.jit
    def load_b_scales(self, dst: cute.Tensor, bw_at, k: cutlass.Int32, two_nb: cutlass.Constexpr):
        """B's block scale(s) of K tile ``k`` into ``dst`` (two_nb: the tile's two N blocks)."""
        sfb, n_blk, n_blk1, _ = bw_at
        dst[0] = sfb[(n_blk, k)]
        if cutlass.const_expr(two_nb):
            dst[1] = sfb[(n_blk1, k)]

    @cute.jit
    def promote_blockwise(self, acc_sum: cute.Tensor, acc: cute.Tensor, sa: cute.Tensor, sb: cute.Tensor,
                          n_sa: cutlass.Constexpr, acc_shape: cutlass.Constexpr, split: cutlass.Constexpr):  # fmt: skip
        """acc_sum += acc * scale_a[row] * scale_b[block] for one K tile (DeepSeek block scales).
        ``sa``: the n_sa row scales of this thread; ``sb``: B's scale (``split`` None) or B's two
        scales, the first for the 8-column groups before group ``split``."""
        for i in cutlass.range_constexpr(n_sa):
            scale = sa[i] * sb[0]
            scale1 = scale
            if cutlass.const_expr(split is not None):
                scale1 = sa[i] * sb[1]
            for v in cutlass.range_constexpr(cute.size(acc_shape[0]) // 2):
                s = scale
                if cutlass.const_expr(split is not None and v // 2 >= split):
                    s = scale1
                acc_sum[frag_idx(i, v)] = acc_sum[frag_idx(i, v)] + acc[frag_idx(i, v)] * s

    @cute.jit
    def promote_columns(self, acc_sum: cute.Tensor, acc: cute.Tensor, sa: cute.Tensor, sSFB: cute.Tensor,
                        col0: cutlass.Int32, stage: cutlass.Int32, n_sa: cutlass.Constexpr,
                        acc_shape: cutlass.Constexpr):  # fmt: skip
        """config.sfb_cols: acc_sum += acc * scale_a[row] * scale_b[column] for one K tile, the
        column scales read from stage ``stage`` of ``sSFB``. A thread's fragment column v is
        col0 + 8 (v // 2) + v % 2 (col0: its first, (lane % 4) * 2: ``accumulators``)."""
        for v in cutlass.range_constexpr(cute.size(acc_shape[0]) // 2):
            sb = sSFB[(col0 + (v // 2) * 8 + v % 2, 0, stage)]
            for i in cutlass.range_constexpr(n_sa):
                acc_sum[frag_idx(i, v)] = acc_sum[frag_idx(i, v)] + acc[frag_idx(i, v)] * (sa[i] * sb)
