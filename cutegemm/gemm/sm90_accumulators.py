"""A consumer thread's WGMMA accumulator fragment on Hopper: its register order (shared by the
FP8 promotion of ``gemm.sm90_blockwise``), and the epilogue inputs applied to it once per tile
(``PreEpilogueSm90Mixin``, mixed into ``cutegemm.gemm.sm90.GemmSm90``).

A thread's fragment of a 64xN WGMMA atom is ((2, 2, N/8), MMA_M, 1) = (column pair, row + 8,
8-column group), MMA_M atoms 64 rows apart: 2 * MMA_M distinct rows and N / 4 distinct columns.
"""

from __future__ import annotations

import dataclasses

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup


def frag_dims(acc_shape, tile_n: int) -> tuple[int, int]:
    """(distinct rows, distinct columns) of a thread's ((2, 2, tile_n/(8 P)), MMA_M, P) fragment
    (P column parts: one WGMMA atom per part, ``config.split_promote`` / ``fp8_mx``)."""
    assert acc_shape[0] == (2, 2, tile_n // (8 * acc_shape[2])), acc_shape
    return 2 * acc_shape[1], tile_n // 4


def frag_idx(i: int, v: int, part_v: int = 0):
    """Register of the fragment's row i and column v (both in their frag_dims order);
    ``part_v``: the columns of one part when the fragment has column parts (v = part_v * part +
    v in the part), 0 when it has one."""
    part = 0
    if part_v:
        part, v = divmod(v, part_v)
    return ((v % 2, i % 2, v // 2), i // 2, part)


def unit_mode(t: cute.Tensor) -> cute.Tensor:
    """``t`` with a trailing mode of size 1 (the rank cute.gemm expects of a single MMA_N slice)."""
    return cute.make_tensor(t.iterator, cute.append(t.layout, cute.make_layout(1)))


class PreEpilogueSm90Mixin:
    """Per-row / per-column epilogue inputs applied to the accumulators once per tile
    (:meth:`scale_accumulators`), the epilogue's subtiles then running without them
    (:meth:`epilogue_after_pre`): FP8 row-wise scales, and a bias (with alpha before it) when
    there is no beta * C. Not for the MXFP8 emulation's accumulator layout, list / K-grouped
    tiles or user epilogues."""

    @property
    def pre_epilogue(self) -> tuple[bool, bool, bool]:
        """(scale_a, scale_b, alpha + bias) applied by :meth:`scale_accumulators`."""
        cfg = self.config
        epi = cfg.epilogue
        ok = not cfg.listed and not cfg.kgrouped and not cfg.fp8_mx and epi.user is None
        return (ok and epi.scale_a, ok and epi.scale_b, ok and epi.bias and not epi.beta)

    def epilogue_after_pre(self):
        """The epilogue spec left for the subtiles once ``pre_epilogue`` ran."""
        epi = self.config.epilogue
        scale_a, scale_b, bias = self.pre_epilogue
        if scale_a or scale_b or bias:
            epi = dataclasses.replace(epi, scale_a=False, scale_b=False)
        if bias:
            epi = dataclasses.replace(epi, alpha=False, bias=False, bias_dtype="fp32")
        return epi

    def scale_accumulators(self, acc_sum: cute.Tensor, tCcAcc: cute.Tensor, vectors, group_cols, alpha, mBias):
        """The ``pre_epilogue`` ops, once per tile before the epilogue: acc_sum[r, c] =
        acc_sum[r, c] * scale_a[r] * scale_b[c] (FP8 row-wise recipe; vectors = (scale_a,
        scale_b), a 1-element vector being a per-tensor scale), then, with a bias and no beta * C,
        * alpha + bias[c]. A thread loads its 2 rows' and tile_n / 4 columns' values together, so
        their latency is paid once per tile; the epilogue used to gather them per element and per
        32-column subtile (FP8 scales: 16% of the time of grouped DeepSeek-V3 down, bias 8%:
        bench/2026-11-30i/round7/fp8_epi.log, round11/bias_epi.log). ``tCcAcc``: the global
        (m, n, l) coordinate of every accumulator register (rows / columns past the problem read
        clamped values, never stored)."""
        from ..epilogue.ops import _col_index

        epi = self.config.epilogue
        scale_a, scale_b, bias = self.pre_epilogue
        n_rows, n_cols = frag_dims(acc_sum.shape, self.config.tile_n)
        part_v = n_cols // acc_sum.shape[2] if acc_sum.shape[2] > 1 else 0
        ra = cute.make_rmem_tensor((n_rows,), cutlass.Float32)
        rb = cute.make_rmem_tensor((n_cols,), cutlass.Float32)
        rbias = cute.make_rmem_tensor((n_cols,), cutlass.Float32)
        if scale_a:
            sa = vectors[0]
            for i in range(n_rows):
                ra[i] = sa[cutlass.min(tCcAcc[frag_idx(i, 0, part_v)][0], sa.shape[0] - 1)]
        for v in range(n_cols):
            mnl = tCcAcc[frag_idx(0, v, part_v)]
            if scale_b:
                rb[v] = vectors[1][_col_index(mnl, vectors[1], group_cols)]
            if bias:
                rbias[v] = mBias[_col_index(mnl, mBias, group_cols)].to(cutlass.Float32)
        for i in range(n_rows):
            for v in range(n_cols):
                x = acc_sum[frag_idx(i, v, part_v)]
                if scale_a:
                    x = x * ra[i]
                if scale_b:
                    x = x * rb[v]
                if bias:
                    if epi.alpha:
                        x = x * alpha
                    x = x + rbias[v]
                acc_sum[frag_idx(i, v, part_v)] = x


class SplitPromoteSm90Mixin:
    """``config.split_promote``: the FP8 promotion K loop with two column halves in flight."""

    @cute.jit
    def split_promote_k_loop(self, ab_pipeline, read_state, release_state, tiled_mma: cute.TiledMma,
                             acc: cute.Tensor, acc_sum: cute.Tensor, tCrA: cute.Tensor, tCrB: cute.Tensor,
                             num_k_blocks: cutlass.Constexpr, kt_cnt: cutlass.Int32):  # fmt: skip
        """A tile's K loop for FP8 with promotion, the tiled MMA's atom being half the tile's
        columns (``acc`` / ``acc_sum``: ((2, 2, tile_n / 16), MMA_M, 2)): runs of
        ``config.split_promote`` K tiles (:meth:`split_promote_run`), then the rest one by one. Returns (tiled_mma,
        read_state, release_state)."""
        run = self.config.split_promote
        for _r in range(kt_cnt // run):
            tiled_mma, read_state, release_state = self.split_promote_run(
                ab_pipeline, read_state, release_state, tiled_mma, acc, acc_sum, tCrA, tCrB, num_k_blocks, run
            )
        for _r in range(kt_cnt % run):
            tiled_mma, read_state, release_state = self.split_promote_run(
                ab_pipeline, read_state, release_state, tiled_mma, acc, acc_sum, tCrA, tCrB, num_k_blocks, 1
            )
        return tiled_mma, read_state, release_state

    @cute.jit
    def split_promote_run(self, ab_pipeline, read_state, release_state, tiled_mma: cute.TiledMma,
                          acc: cute.Tensor, acc_sum: cute.Tensor, tCrA: cute.Tensor, tCrB: cute.Tensor,
                          num_k_blocks: cutlass.Constexpr, n: cutlass.Constexpr):  # fmt: skip
        """``n`` K tiles, straight-line code, nothing in flight at the start or the end (ptxas
        serializes every WGMMA of the kernel (C7514) when accumulators of a WGMMA batch that is
        still in flight around a loop's back edge are read). Each K tile is two commit groups,
        one per column half, each into a fresh partial sum. In order: K tile t's half 0 retires
        and is added into ``acc_sum`` while its half 1 runs; K tile t + 1's half 0 is issued; K
        tile t's half 1 retires, its stage is released, it is added while K tile t + 1's half 0
        runs; K tile t + 1's half 1 is issued. So within a run one half's WGMMAs are in flight
        while the other's adds run; each partial sum spans one K tile, as in the plain loop (the
        same values, bitwise)."""
        ab_pipeline.consumer_wait(read_state)
        tiled_mma = self.issue_half(tiled_mma, acc, tCrA, tCrB, read_state.index, num_k_blocks, 0)
        tiled_mma = self.issue_half(tiled_mma, acc, tCrA, tCrB, read_state.index, num_k_blocks, 1)
        read_state.advance()
        for _t in cutlass.range_constexpr(n - 1):
            warpgroup.wait_group(1)  # half 0 of K tile t retired
            self.add_half(acc_sum, acc, 0)
            ab_pipeline.consumer_wait(read_state)
            tiled_mma = self.issue_half(tiled_mma, acc, tCrA, tCrB, read_state.index, num_k_blocks, 0)
            warpgroup.wait_group(1)  # half 1 of K tile t retired: its stage is free
            ab_pipeline.consumer_release(release_state)
            release_state.advance()
            self.add_half(acc_sum, acc, 1)
            tiled_mma = self.issue_half(tiled_mma, acc, tCrA, tCrB, read_state.index, num_k_blocks, 1)
            read_state.advance()
        warpgroup.wait_group(1)
        self.add_half(acc_sum, acc, 0)
        warpgroup.wait_group(0)
        ab_pipeline.consumer_release(release_state)
        release_state.advance()
        self.add_half(acc_sum, acc, 1)
        return tiled_mma, read_state, release_state

    @cute.jit
    def issue_half(self, tiled_mma: cute.TiledMma, acc: cute.Tensor, tCrA: cute.Tensor, tCrB: cute.Tensor,
                   stage: cutlass.Int32, num_k_blocks: cutlass.Constexpr, half: cutlass.Constexpr):  # fmt: skip
        """Column half ``half`` of one K tile's WGMMAs (stage ``stage``) into a fresh partial sum
        in its part of ``acc``, committed as one group. Returns tiled_mma."""
        warpgroup.fence()  # the adds of this half's previous partial sum read it: order them first
        tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
        part = unit_mode(acc[(None, None, half)])  # (MMA, MMA_M, 1)
        for kb in cutlass.range_constexpr(num_k_blocks):
            cute.gemm(tiled_mma, part, tCrA[(None, None, kb, stage)], unit_mode(tCrB[(None, half, kb, stage)]), part)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.commit_group()
        return tiled_mma

    @cute.jit
    def add_half(self, acc_sum: cute.Tensor, acc: cute.Tensor, half: cutlass.Constexpr):
        """acc_sum += acc over column half ``half`` (part ``half`` of both fragments)."""
        for i in cutlass.range_constexpr(cute.size(acc.shape[0]) * acc.shape[1]):
            idx = (i % cute.size(acc.shape[0]), i // cute.size(acc.shape[0]), half)
            acc_sum[idx] = acc_sum[idx] + acc[idx]
