"""FP8 with DeepSeek block scales on Hopper: the pieces of ``cutegemm.gemm.sm90.GemmSm90`` used
only when ``config.fp8_blockwise`` (mixed in; every call site is behind
``const_expr(config.fp8_blockwise)``, so other kernels compile exactly as without it).

Scales: fp32 scale_a (M, K/128) per 1x128 block of A's rows, scale_b per 128x128 block of B
(the kernel's (NB, KB) view; grouped: (NB, KB, E)). K tile kt's WGMMA partial sum (a fresh fp32
``acc`` per 128-wide K tile) is promoted as

    acc_sum[r, c] += acc[r, c] * scale_a[r, kt] * scale_b[c // 128, kt]

A thread's fragment of a 64xN WGMMA atom is ((2, 2, N/8), MMA_M, MMA_N) = (column pair, row + 8,
8-column group), MMA_M atoms 64 rows apart: 2 * MMA_M distinct rows. A tile of at most 128
columns sees one N block of B; a 192-wide tile (``two_nb``) spans two: its 8-column groups before
the block boundary (64 or 128 columns in, by the tile's position: tiles start at multiples of
64) take the first B scale, the rest the second. The consumers load their scales from global
memory (L2) one K tile ahead, under the current K tile's WGMMAs; the K loop is unrolled by two K
tiles whose scale registers swap roles, so no register copy waits for the loads.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.cute.nvgpu import warpgroup


class BlockwiseSm90Mixin:
    def blockwise_setup(self, thr_mma, acc_shape, block_scales):
        """Per consumer thread, once: (mSFA, mSFB, n_sa, two_nb, tile-local coordinates of the
        accumulator registers, row indices, two scale buffers (n_sa A scales, then B's), acc_shape)."""
        cfg = self.config
        mSFA, mSFB = block_scales
        assert acc_shape[0] == (2, 2, cfg.tile_n // 8) and acc_shape[2] == 1, acc_shape
        n_sa = 2 * acc_shape[1]
        two_nb = cfg.tile_n > 128
        n_sf = n_sa + (2 if two_nb else 1)
        tCcTile = thr_mma.partition_C(cute.make_identity_tensor((cfg.tile_m, cfg.tile_n)))
        sa_rows = cute.make_rmem_tensor((n_sa,), cutlass.Int32)
        sf_cur = cute.make_rmem_tensor((n_sf,), cutlass.Float32)
        sf_next = cute.make_rmem_tensor((n_sf,), cutlass.Float32)
        return mSFA, mSFB, n_sa, two_nb, tCcTile, sa_rows, sf_cur, sf_next, acc_shape

    def blockwise_tile_start(self, bw, tile):
        """A tile's rows and N block(s), and K tile 0's scales into the first buffer. Returns
        (the loads' arguments, the 8-column group where the second N block starts).

        Rows past M read row M - 1's scales (clamped, never stored). Grouped: rows count from
        the expert's first row (tile[3]) and B's scales are the expert's (NB, KB) slice; rows past
        the expert's end read other rows' scales (clamped into A), never stored. A tile past N
        (the second CTA of a 1x2 cluster at an odd n-tile count) and a 192-wide tile's second
        block past N's last read the last N block's scales (clamped: memcheck found the read
        past B's scales), never stored."""
        cfg = self.config
        mSFA, mSFB, n_sa, two_nb, tCcTile, sa_rows, sf_cur, _, _ = bw
        row0 = tile[0] * cfg.tile_m
        sfb = mSFB
        if cfg.grouped:  # (plain Python, traced inline: a compile-time branch and unrolled loop)
            row0 = row0 + tile[3]
            sfb = mSFB[(None, None, tile[2])]
        col0 = tile[1] * cfg.tile_n
        n_blk = cutlass.min(col0 // 128, sfb.shape[0] - 1)
        n_blk1 = cutlass.min(col0 // 128 + 1, sfb.shape[0] - 1)
        nb_split = (128 - col0 % 128) // 8
        for i in range(n_sa):
            row = row0 + tCcTile[((0, i % 2, 0), i // 2, 0)][0]
            sa_rows[i] = cutlass.min(row, mSFA.shape[0] - 1)
        bw_at = (mSFA, sfb, sa_rows, n_blk, n_blk1)
        self.load_block_scales(sf_cur, bw_at, 0, n_sa, two_nb)
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
        """A tile's K loop, unrolled by two K tiles whose scale buffers swap roles: the scales
        loaded for K tile k + 1 are first read by its promotion, a whole K tile later. Returns
        (tiled_mma, read_state, release_state)."""
        _, _, n_sa, two_nb, _, _, sf_cur, sf_next, acc_shape = bw
        bw_k = (bw_at, n_sa, two_nb, nb_split, acc_shape, my_wg)
        for kp in range(kt_cnt // 2):
            tiled_mma, read_state, release_state = self.blockwise_k_tile(
                ab_pipeline, read_state, release_state, tiled_mma, acc, acc_sum, tCrA, tCrB, num_k_blocks,
                sf_cur, sf_next, 2 * kp + 1, bw_k,
            )  # fmt: skip
            tiled_mma, read_state, release_state = self.blockwise_k_tile(
                ab_pipeline, read_state, release_state, tiled_mma, acc, acc_sum, tCrA, tCrB, num_k_blocks,
                sf_next, sf_cur, cutlass.min(2 * kp + 2, kt_cnt - 1), bw_k,
            )  # fmt: skip
        if kt_cnt % 2 == 1:  # the last K tile (its "next" load reloads its own scales)
            tiled_mma, read_state, release_state = self.blockwise_k_tile(
                ab_pipeline, read_state, release_state, tiled_mma, acc, acc_sum, tCrA, tCrB, num_k_blocks,
                sf_cur, sf_next, kt_cnt - 1, bw_k,
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
        sf_use: cute.Tensor,
        sf_load: cute.Tensor,
        k_load: cutlass.Int32,
        bw_k,  # (bw_at, n_sa, two_nb, nb_split, acc_shape, my_wg)
    ):
        """One K tile with DeepSeek block scales: its WGMMAs into a fresh partial sum, the scales
        of K tile ``k_load`` into ``sf_load`` while they run, then acc_sum += partial * scales
        (``sf_use``). Returns (tiled_mma, read_state, release_state)."""
        bw_at, n_sa, two_nb, nb_split, acc_shape, my_wg = bw_k
        ab_pipeline.consumer_wait(read_state)
        tiled_mma = self.issue_k_tile(tiled_mma, acc, tCrA, tCrB, read_state.index, num_k_blocks, True, my_wg)
        self.load_block_scales(sf_load, bw_at, k_load, n_sa, two_nb)
        warpgroup.wait_group(0)
        ab_pipeline.consumer_release(read_state)
        release_state.advance()
        if cutlass.const_expr(two_nb):
            # the boundary is 64 or 128 columns in (tiles start at multiples of 64): one
            # constant split per branch, no select per register
            if nb_split == 8:
                self.promote_blockwise(acc_sum, acc, sf_use, n_sa, acc_shape, 8)
            else:
                self.promote_blockwise(acc_sum, acc, sf_use, n_sa, acc_shape, 16)
        else:
            self.promote_blockwise(acc_sum, acc, sf_use, n_sa, acc_shape, None)
        read_state.advance()
        return tiled_mma, read_state, release_state

    @cute.jit
    def load_block_scales(self, dst: cute.Tensor, bw_at, k: cutlass.Int32, n_sa: cutlass.Constexpr,
                          two_nb: cutlass.Constexpr):  # fmt: skip
        """DeepSeek block scales of K tile ``k`` into ``dst``: this thread's n_sa row scales of A,
        then B's scale (two_nb: the scales of the tile's two N blocks)."""
        mSFA, sfb, sa_rows, n_blk, n_blk1 = bw_at
        for i in cutlass.range_constexpr(n_sa):
            dst[i] = mSFA[(sa_rows[i], k)]
        dst[n_sa] = sfb[(n_blk, k)]
        if cutlass.const_expr(two_nb):
            dst[n_sa + 1] = sfb[(n_blk1, k)]

    @cute.jit
    def promote_blockwise(self, acc_sum: cute.Tensor, acc: cute.Tensor, sf: cute.Tensor, n_sa: cutlass.Constexpr,
                          acc_shape: cutlass.Constexpr, split: cutlass.Constexpr):  # fmt: skip
        """acc_sum += acc * scale_a[row] * scale_b[block] for one K tile (DeepSeek block scales).
        ``sf``: the n_sa row scales of this thread, then B's scale (``split`` None) or B's two
        scales, the first for the 8-column groups before group ``split``."""
        for i in cutlass.range_constexpr(n_sa):
            scale = sf[i] * sf[n_sa]
            scale1 = scale
            if cutlass.const_expr(split is not None):
                scale1 = sf[i] * sf[n_sa + 1]
            for v in cutlass.range_constexpr(cute.size(acc_shape[0]) // 2):
                idx = ((v % 2, i % 2, v // 2), i // 2, 0)
                s = scale
                if cutlass.const_expr(split is not None and v // 2 >= split):
                    s = scale1
                acc_sum[idx] = acc_sum[idx] + acc[idx] * s
