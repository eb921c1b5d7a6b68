"""A consumer thread's WGMMA accumulator fragment on Hopper: its register order (shared by the
FP8 promotion of ``gemm.sm90.blockwise``), and the epilogue inputs applied to it once per tile
(``AccumulatorScaling``, a part of ``cutegemm.gemm.sm90.kernel.GemmSm90``).

A thread's fragment of a 64xN WGMMA atom is ((2, 2, N/8), MMA_M, 1) = (column pair, row + 8,
8-column group), MMA_M atoms 64 rows apart: 2 * MMA_M distinct rows and N / 4 distinct columns.
"""

from __future__ import annotations

import dataclasses

import cutlass
import cutlass.cute as cute

from ...epilogue.ops import col_index


def frag_dims(acc_shape, tile_n: int) -> tuple[int, int]:
    """(distinct rows, distinct columns) of a thread's ((2, 2, tile_n/(8 P)), MMA_M, P) fragment
    (P column parts: 1, or the MX mainloop's MX_PARTS WGMMAs of tile_n / P columns)."""
    assert acc_shape[0] == (2, 2, tile_n // (8 * acc_shape[2])), acc_shape
    return 2 * acc_shape[1], tile_n // 4


def frag_idx(i: int, v: int, parts: int = 1, tile_n: int = 0):
    """Register of the fragment's row i and column v (both in their frag_dims order; with P
    column parts, v runs over part 0's registers, then part 1's: the same column order)."""
    if parts == 1:
        return ((v % 2, i % 2, v // 2), i // 2, 0)
    part_v = tile_n // (4 * parts)
    return ((v % 2, i % 2, (v % part_v) // 2), i // 2, v // part_v)


class AccumulatorScaling:
    """Per-row / per-column epilogue inputs applied to the accumulators once per tile
    (:meth:`scale_accumulators`), the epilogue's subtiles then running without them
    (:meth:`epilogue_after_pre`): FP8 row-wise scales, and a bias (with alpha before it) when
    there is no beta * C. Not for the MXFP8 emulation's accumulator layout, list / K-grouped
    tiles or user epilogues."""

    def __init__(self, kernel):
        self.k = kernel  # the kernel this part belongs to (its config, layouts, tiles)

    @property
    def pre_epilogue(self) -> tuple[bool, bool, bool]:
        """(scale_a, scale_b, alpha + bias) applied by :meth:`scale_accumulators`."""
        cfg = self.k.config
        epi = cfg.epilogue
        ok = not cfg.listed and not cfg.kgrouped and not cfg.fp8_mx and epi.user is None
        return (ok and epi.scale_a, ok and epi.scale_b, ok and epi.bias and not epi.beta)

    def epilogue_after_pre(self):
        """The epilogue spec left for the subtiles once ``pre_epilogue`` ran."""
        epi = self.k.config.epilogue
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
        32-column subtile (FP8 scales: 16% of the time of grouped DeepSeek-V3 down, bias 8%).
        ``tCcAcc``: the global
        (m, n, l) coordinate of every accumulator register (rows / columns past the problem read
        clamped values, never stored)."""
        epi = self.k.config.epilogue
        scale_a, scale_b, bias = self.pre_epilogue
        tile_n = self.k.config.tile_n
        n_rows, n_cols = frag_dims(acc_sum.shape, tile_n)
        parts = acc_sum.shape[2]  # config.promote_k: the MX mainloop's column parts

        def idx(i, v):
            return frag_idx(i, v, parts, tile_n)
        # swap_ab: the fragment's rows are GEMM columns and its columns tokens (the coordinates
        # say (token, column, expert) all the same), so the row and column vectors trade places.
        swap = self.k.config.swap_ab
        n_a, n_b = (n_cols, n_rows) if swap else (n_rows, n_cols)

        def at(j, along_rows):  # coordinates of the fragment's row j (column 0) or column j (row 0)
            return tCcAcc[idx(j, 0) if along_rows else idx(0, j)]

        ra = cute.make_rmem_tensor((n_a,), cutlass.Float32)
        rb = cute.make_rmem_tensor((n_b,), cutlass.Float32)
        rbias = cute.make_rmem_tensor((n_b,), cutlass.Float32)
        if scale_a:
            sa = vectors[0]
            for i in range(n_a):
                ra[i] = sa[cutlass.min(at(i, not swap)[0], sa.shape[0] - 1)]
        for v in range(n_b):
            mnl = at(v, swap)
            if scale_b:
                rb[v] = vectors[1][col_index(mnl, vectors[1], group_cols)]
            if bias:
                rbias[v] = mBias[col_index(mnl, mBias, group_cols)].to(cutlass.Float32)
        for i in range(n_rows):
            for v in range(n_cols):
                ia, ib = (v, i) if swap else (i, v)
                x = acc_sum[idx(i, v)]
                if scale_a:
                    x = x * ra[ia]
                if scale_b:
                    x = x * rb[ib]
                if bias:
                    if epi.alpha:
                        x = x * alpha
                    x = x + rbias[ib]
                acc_sum[idx(i, v)] = x
