"""Predicated store of one staged epilogue subtile (shared memory -> global memory), for tiles that
TMA cannot store whole: grouped tiles that cross an expert's last row. Arch-neutral: both
kernels stage subtiles in shared memory before storing them."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute


@cute.jit
def store_subtile_predicated(
    sC: cute.Tensor,  # (EPI_M, EPI_N) staged subtile in shared memory
    gC: cute.Tensor,  # (EPI_M, EPI_N) its place in global memory
    rows_valid: cutlass.Int32,  # rows [0, rows_valid) of the subtile may be written
    cols_valid: cutlass.Int32,  # columns [0, cols_valid)
    tidx: cutlass.Int32,
    num_threads: cutlass.Constexpr,
    m_major: cutlass.Constexpr = False,
):
    """Every thread copies 16-byte row pieces; a piece is written only when its row is valid and
    its first column is (N is a multiple of 16 bytes, so a piece never straddles the N edge).
    ``m_major`` (C stored M-major, config.c_major "m"): element copies with the threads along M
    (consecutive threads write consecutive addresses), each element checked (rows_valid may end
    inside a 16-byte piece)."""
    if cutlass.const_expr(m_major):
        _store_m_major(sC, gC, rows_valid, cols_valid, tidx, num_threads)
    else:
        _store_n_major(sC, gC, rows_valid, cols_valid, tidx, num_threads)


@cute.jit
def _store_n_major(sC, gC, rows_valid, cols_valid, tidx, num_threads: cutlass.Constexpr):
    """:func:`store_subtile_predicated` of a row-major subtile: 16-byte row pieces."""
    dtype = sC.element_type
    vec = 128 // dtype.width
    epi_m, epi_n = cute.size(sC, mode=[0]), cute.size(sC, mode=[1])
    thr_n = epi_n // vec
    # Narrow subtiles (e.g. 16-byte FP4 rows) need fewer threads than there are: the rest idle.
    thr_m = min(num_threads // thr_n, epi_m)
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=128)
    tiled = cute.make_tiled_copy_tv(
        atom, cute.make_layout((thr_m, thr_n), stride=(thr_n, 1)), cute.make_layout((1, vec))
    )
    used = thr_m * thr_n
    thr = tiled.get_slice(cutlass.min(tidx, used - 1) if cutlass.const_expr(used < num_threads) else tidx)
    _copy_valid(atom, thr, sC, gC, rows_valid, cols_valid, tidx < used)


@cute.jit
def _store_m_major(sC, gC, rows_valid, cols_valid, tidx, num_threads: cutlass.Constexpr):
    """:func:`store_subtile_predicated` of an M-major subtile: one element per copy."""
    dtype = sC.element_type
    thr_m = min(num_threads, cute.size(sC, mode=[0]))
    thr_n = num_threads // thr_m
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=dtype.width)
    tiled = cute.make_tiled_copy_tv(
        atom, cute.make_layout((thr_m, thr_n), stride=(1, thr_m)), cute.make_layout((1, 1))
    )
    _copy_valid(atom, tiled.get_slice(tidx), sC, gC, rows_valid, cols_valid, True)


@cute.jit
def _copy_valid(atom, thr, sC, gC, rows_valid, cols_valid, live):
    """This thread's pieces of the subtile (``thr``: its slice of the tiled copy), each copied when
    its first element's row and column are valid and the thread is ``live``."""
    epi_m, epi_n = cute.size(sC, mode=[0]), cute.size(sC, mode=[1])
    # (CPY, CPY_M, CPY_N)
    tS = thr.partition_S(sC)
    tD = thr.partition_D(gC)
    tI = thr.partition_S(cute.make_identity_tensor((epi_m, epi_n)))
    for i in cutlass.range_constexpr(cute.size(tS, mode=[1])):
        for j in cutlass.range_constexpr(cute.size(tS, mode=[2])):
            row, col = tI[(0, i, j)]
            if row < rows_valid and col < cols_valid and live:
                cute.copy(atom, tS[(None, i, j)], tD[(None, i, j)])
