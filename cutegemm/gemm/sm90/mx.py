"""MXFP8 emulation on Hopper: the pieces of ``cutegemm.gemm.sm90.kernel.GemmSm90`` used only when
``config.fp8_mx`` (every call site is behind ``const_expr``, so other kernels compile exactly as
without it). The K-tile step without the scales is also the mainloop of ``config.promote_k``
(FP8 row-wise / tensor-wise promoted every 32 or 64 K, for fp32 outputs).

sm_90a has no block-scaled MMA. A K tile of 128 is four 32-wide e4m3 WGMMAs; each starts a fresh
fp32 partial sum ``acc`` that is promoted, once it retires, as

    acc_sum[r, c] += acc[r, c] * (scale_a[r, kb] * scale_b[c, kb])

(one multiply and one FMA per accumulator element per 32-K block). The scales come decoded to
fp32 by the host (``blockscaled.sm90_mx``) and ride the A/B stage ring: the producer warp
TMA-loads a (tile_m, 4) block of mSFA and a (tile_n, 4) block of mSFB into every stage next to
the A and B tiles, on the same full barrier.

Register order: the tiled MMA's atom is 64 x tile_n / MX_PARTS here (one WGMMA per column part,
so parts are promoted while the next parts' WGMMAs run); a thread's fragment is
((2, 2, tile_n / (8 MX_PARTS)), MMA_M, MX_PARTS) = (column pair e, row + 8 h, 8-column group j,
part): with v = tile_n / (4 MX_PARTS) * part + 2 j + e, column
``8 (v // 2) + 2 q + v % 2`` (q = lane % 4). The host
stores each tile's B scales permuted so that the tile_n / 4 scales of one thread are contiguous
in groups of four, at (v // 4) * 16 + 4 q + v % 4 for register v: a K block's column scales
are tile_n / 16 conflict-free 16-byte shared loads per thread (lanes of one q broadcast).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync, warpgroup

from ...runtime.ptx import ld_shared_v4_f32
from ..grouped_parts import grouped_k_tiles

MX_KB = 4  # 32-wide K blocks per 128-wide K tile
MX_PARTS = 2  # WGMMAs (column parts of the tile) per K block; MX_PARTS - 1 stay in flight
SF_BYTES = 4  # fp32 scales


def _unit_mode(t: cute.Tensor) -> cute.Tensor:
    """``t`` with a trailing mode of size 1 (the rank cute.gemm expects of a single MMA_N slice)."""
    return cute.make_tensor(t.iterator, cute.append(t.layout, cute.make_layout(1)))


class MxMainloop:
    """Methods of GemmSm90 used only by MXFP8-emulation configs (config.fp8_mx)."""

    def __init__(self, kernel):
        self.k = kernel  # the kernel this part belongs to (its config, layouts, tiles)

    def mx_layouts(self):
        """Staged shared-memory layouts of the fp32 scales: (tile_m, 4) row-major for A (a row's
        four K blocks are one 16-byte load), (tile_n, 4) column-major for B (a K block's columns
        are contiguous, in the permuted order). Built where used (host or kernel: a layout value
        of the host function cannot be used inside the kernel)."""
        tm, tn, st = self.k.config.tile_m, self.k.config.tile_n, self.k.ab_stage
        return (
            cute.make_layout((tm, MX_KB, st), stride=(MX_KB, 1, tm * MX_KB)),
            cute.make_layout((tn, MX_KB, st), stride=(1, tn, tn * MX_KB)),
        )

    def mx_cosizes(self) -> tuple[int, int]:
        return (self.k.config.tile_m * MX_KB * self.k.ab_stage, self.k.config.tile_n * MX_KB * self.k.ab_stage)

    def mx_stage_bytes(self) -> int:
        return (self.k.config.tile_m + self.k.config.tile_n) * MX_KB * SF_BYTES

    def mx_tma(self, mSFA: cute.Tensor, mSFB: cute.Tensor):
        """TMA atoms and coordinate tensors of mSFA (M, Kb, L) / mSFB (Np, Kb, L): one (tile, 4)
        box per stage, loaded by every CTA for itself (no multicast)."""
        op = cpasync.CopyBulkTensorTileG2SOp()
        sfa_layout, sfb_layout = self.mx_layouts()
        atom_a, tensor_a = cpasync.make_tiled_tma_atom(
            op, mSFA, cute.slice_(sfa_layout, (None, None, 0)), (self.k.config.tile_m, MX_KB)
        )
        atom_b, tensor_b = cpasync.make_tiled_tma_atom(
            op, mSFB, cute.slice_(sfb_layout, (None, None, 0)), (self.k.config.tile_n, MX_KB)
        )
        return atom_a, tensor_a, atom_b, tensor_b

    def mx_partition(self, storage, tma_atom_sfa, mSFA, tma_atom_sfb, mSFB):
        """(sSFA, sSFB, parts): the scale stages and their TMA partitions."""
        sfa_layout, sfb_layout = self.mx_layouts()
        sSFA = storage.sSFA.get_tensor(sfa_layout)
        sSFB = storage.sSFB.get_tensor(sfb_layout)
        one = cute.make_layout(1)
        # (TMA, STAGE), (TMA, RestM, RestK, RestL)
        tAsSFA, tAgSFA = cpasync.tma_partition(
            tma_atom_sfa, 0, one, cute.group_modes(sSFA, 0, 2),
            cute.group_modes(cute.local_tile(mSFA, (self.k.config.tile_m, MX_KB), (None, None, None)), 0, 2),
        )  # fmt: skip
        tBsSFB, tBgSFB = cpasync.tma_partition(
            tma_atom_sfb, 0, one, cute.group_modes(sSFB, 0, 2),
            cute.group_modes(cute.local_tile(mSFB, (self.k.config.tile_n, MX_KB), (None, None, None)), 0, 2),
        )  # fmt: skip
        return sSFA, sSFB, (tAsSFA, tAgSFA, tBsSFB, tBgSFB)

    def mx_load_operands(self, tma_atom_sfa, tma_atom_sfb, parts, mSFA=None, sSFA=None):
        """The scales as ``GemmBase.load_ab`` extra operands (SFA follows A's m-tile, SFB B's
        n-tile). Built inside the producer's branch: the tile functions close over its values.
        Grouped (needs ``mSFA`` / ``sSFA``): A's scale rows start at the expert's first row, as A's
        (``gemm.grouped_parts.grouped_k_tiles``); B's scales are per expert (L = tile[2])."""
        tAsSFA, tAgSFA, tBsSFB, tBgSFB = parts

        def sfa_tiles(tile):
            if cutlass.const_expr(self.k.config.grouped):
                return grouped_k_tiles(tma_atom_sfa, 0, cute.make_layout(1), sSFA, mSFA, (self.k.config.tile_m, MX_KB), tile)
            return tAgSFA[(None, tile[0], None, tile[2])]

        def sfb_tiles(tile):
            return tBgSFB[(None, tile[1], None, tile[2])]

        return ((tma_atom_sfa, sfa_tiles, tAsSFA, None), (tma_atom_sfb, sfb_tiles, tBsSFB, None))

    def mx_k_tile(
        self,
        tiled_mma: cute.TiledMma,
        acc: cute.Tensor,
        acc_sum: cute.Tensor,
        tCrA: cute.Tensor,
        tCrB: cute.Tensor,
        stage: cutlass.Int32,
        sfa_rows=None,  # fp8_mx: list of 2 shared addresses: row i's four K-block scales in stage 0
        sfb_base=None,  # fp8_mx: shared address of this thread's first B-scale group in stage 0, K block 0
    ):
        """One 128-wide K tile: per partial sum (fp8_mx: a 32-wide K block; config.promote_k:
        promote_k wide, one or two K blocks), one WGMMA batch per column part of the tile
        (MX_PARTS parts; the tiled MMA's atom is 64 x tile_n / MX_PARTS x 32 here), each into its
        own part of ``acc``. Step s issues batch s, waits for s - (MX_PARTS - 1) and promotes it
        (that part is rewritten only by the next step, after a fence), so MX_PARTS - 1 batches
        stay in flight while one part is promoted: with fp8_mx scaled by its row and column
        scales, with promote_k added as it is.
        Called while tracing (Python loops unroll); returns tiled_mma."""
        tm, tn = self.k.config.tile_m, self.k.config.tile_n
        scaled = self.k.config.fp8_mx
        per = 1 if scaled else self.k.config.promote_k // (self.k.tile_shape_mnk[2] // MX_KB)  # K blocks per sum
        parts = MX_PARTS
        part_v = tn // (4 * parts)  # registers of one part per row: column pairs x 8-column groups
        if cutlass.const_expr(scaled):
            sa = [ld_shared_v4_f32(row + stage * (tm * MX_KB * SF_BYTES)) for row in sfa_rows]
            sb_stage = sfb_base + stage * (tn * MX_KB * SF_BYTES)
        steps = [(kb, nh) for kb in range(0, MX_KB, per) for nh in range(parts)]
        sb = [None] * len(steps)

        def issue(s):
            kb, nh = steps[s]
            warpgroup.fence()  # the promotion of this part's last use read it: order before
            tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
            part = _unit_mode(acc[(None, None, nh)])  # (MMA, MMA_M, 1)
            for j in range(per):
                b_part = _unit_mode(tCrB[(None, nh, kb + j, stage)])  # (MMA, 1)
                cute.gemm(tiled_mma, part, tCrA[(None, None, kb + j, stage)], b_part, part)
                tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            warpgroup.commit_group()
            if cutlass.const_expr(scaled):
                vals = []  # this part's column scales (register v = part_v * nh + local v)
                for g in range(part_v // 4):
                    vals += ld_shared_v4_f32(sb_stage + (kb * tn + (part_v // 4 * nh + g) * 16) * SF_BYTES)
                sb[s] = vals

        def promote(s):
            kb, nh = steps[s]
            for i in range(2):  # rows r and r + 8 of the thread's 64-row slice
                for v in range(part_v):
                    idx = ((v % 2, i % 2, v // 2), i // 2, nh)
                    if cutlass.const_expr(scaled):
                        acc_sum[idx] = acc_sum[idx] + acc[idx] * (sa[i][kb] * sb[s][v])
                    else:
                        acc_sum[idx] = acc_sum[idx] + acc[idx]

        lag = parts - 1
        for s in range(len(steps)):
            issue(s)
            if s >= lag:
                warpgroup.wait_group(lag)
                promote(s - lag)
        warpgroup.wait_group(0)
        for s in range(len(steps) - lag, len(steps)):
            promote(s)
        return tiled_mma  # its ACCUMULATE field changed: the caller's loop carries it
