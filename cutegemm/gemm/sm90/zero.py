"""Zeroing parts of the shared-memory stages of A and B in the dense sm_90a kernel, a part of
:class:`~cutegemm.gemm.sm90.kernel.GemmSm90`: A's rows past its short TMA box (``GemmConfig.a_rows``,
once when the kernel starts) and, for the K-grouped form, the K columns of a stage outside the
expert's range (per stage, before its WGMMAs)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from ...runtime.ptx import st_shared_v4

__all__ = ["StageZero"]


class StageZero:
    """Zeroes the parts of a shared-memory stage that a partial TMA box leaves stale (rows past a
    short A box, K columns outside a K window)."""

    def __init__(self, kernel):
        self.k = kernel  # the kernel this part belongs to (its config, layouts, tiles)

    @cute.jit
    def zero_a_rows_past_box(self, sA: cute.Tensor, tid: cutlass.Int32):
        """Zero rows a_rows..tile_m of every stage of A (config.a_rows), 16 bytes per store, by
        the tile's threads: a K-major stage is tile_m rows of 128 bytes (whole 8-row swizzle
        atoms, row-block major), so those rows are its last (tile_m - a_rows) * 128 bytes."""
        row_bytes = self.k.tile_shape_mnk[2] * self.k.a_dtype.width // 8
        assert row_bytes == 128 and self.k.config.a_major == "k", (row_bytes, self.k.config.a_major)
        chunks = (self.k.config.tile_m - self.k.a_box_rows) * row_bytes // 16  # per stage
        base = sA.iterator.toint() + self.k.a_box_rows * row_bytes
        for j in range(tid, self.k.ab_stage * chunks, self.k.threads_per_tile):
            stage = j // chunks
            st_shared_v4(base + stage * (self.k.config.tile_m * row_bytes) + (j - stage * chunks) * 16, (0, 0, 0, 0))

    @cute.jit
    def zero_k_outside(self, sA: cute.Tensor, sB: cute.Tensor, stage: cutlass.Int32, lo: cutlass.Int32,
                       hi: cutlass.Int32, tid: cutlass.Int32):  # fmt: skip
        """Zero the K columns outside [lo, hi) of stage ``stage`` of A (tile_m, tile_k) and B
        (tile_n, tile_k), by the tile's threads (``tid``)."""
        self._zero_cols(sA, self.k.config.a_major == "m", self.k.config.tile_m, stage, lo, hi, tid)
        self._zero_cols(sB, self.k.config.b_major == "n", self.k.config.tile_n, stage, lo, hi, tid)

    @cute.jit
    def _zero_cols(self, s: cute.Tensor, mn_major: cutlass.Constexpr, rows: cutlass.Constexpr, stage: cutlass.Int32,
                   lo: cutlass.Int32, hi: cutlass.Int32, tid: cutlass.Int32):  # fmt: skip
        """Zero columns [0, lo) and [hi, tile_k) of one operand's stage (rows x tile_k).
        MN-major (a column's rows contiguous, swizzled in 16-byte pieces): the threads take
        (column, 8-row piece) pairs in turn and store 16 bytes each. K-major: thread t owns
        column t % tile_k of every (threads / tile_k)-th row and zeroes them when its column is
        outside the range. (An unrolled sweep over the whole stage spilled registers in
        pingpong tiles; one with a division per element cost 30% of DeepSeek-V3 dW up.)"""
        tk, nthr = self.k.tile_shape_mnk[2], self.k.threads_per_tile
        zero = s.element_type(0.0)
        if cutlass.const_expr(mn_major):
            pieces = rows // 8
            zeros = cute.make_rmem_tensor((8,), s.element_type)
            zeros.fill(zero)
            for j in range(tid, (lo + tk - hi) * pieces, nthr):
                c = j // pieces
                col = cutlass.select_(c < lo, c, hi + c - lo)
                cute.autovec_copy(zeros, cute.local_tile(s[(None, col, stage)], (8,), (j % pieces,)))
        else:
            assert nthr % tk == 0, (nthr, tk)
            col = tid % tk
            if (col < lo) | (col >= hi):
                for r in range(tid // tk, rows, nthr // tk):
                    s[(r, col, stage)] = zero
