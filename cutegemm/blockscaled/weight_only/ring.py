"""The streaming ring of the FP4-weight kernel (``Fp4WeightConfig.ring`` > 0, the host policy's
pipeline), a part of :class:`~cutegemm.blockscaled.weight_only.kernel.Fp4WeightKernel`.

One producer warp fills ``ring`` shared-memory stages: ``ring_k`` K chunks of the CTA's weight
rows (a 2-D TMA box, 128-byte swizzle), their scales (one bulk copy of whole 512-byte groups of the
128x4 layout) and the token pass's activations (2-D TMA boxes of x as the caller stored it, no
host copy). The consumer warps read everything from shared memory, so the activations are
fetched once per CTA instead of once per warp. Per-row bulk copies were tried first: issue-bound
at ~780 GB/s. ``split`` (dense): a persistent grid whose CTAs take equal ranges of (segment, K
stage) units, segments cut between CTAs meeting through a workspace (:meth:`split_finish`;
:func:`split_plan_ref` is the torch-free twin of its schedule). Measured on the H200: see
``bench/RESULTS.md``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import memory
from cutlass.cute.nvgpu import cpasync, warpgroup

from ...runtime.ptx import bulk_g2s, ld_global_cg_f32, ld_shared_u8, ld_shared_u16, ld_shared_v4, st_shared_v4
from .math import e4m3_nan_flags, pair_natural_x

__all__ = ["RingPipeline", "split_plan_ref", "tail_plan_ref", "TAIL_MIN_STAGES"]

# ``Fp4WeightConfig.tail_split``: the fewest K stages of a CTA's range in the waves' tail (a unit
# cut finer would cost its finisher more partial sums to add than the balance gains)
TAIL_MIN_STAGES = 8


class RingPipeline:
    """:meth:`kernel_ring` and its parts; the shared fragment math (``mma_chunk``, ``finish_pass``,
    the scale-layout helpers) comes from :class:`~cutegemm.blockscaled.weight_only.kernel.Fp4WeightKernel`."""

    def __init__(self, kernel):
        self.k = kernel  # the kernel this part belongs to (its config, layouts, tiles)

    def launch_ring(self, mX, mW, mS, mOut, mOffs, mGs, mXs, mWork, m_rows, n, k, batches, n_ctas, slot0,
                    tile_stride, alpha, stream):  # fmt: skip
        """Host side of :meth:`kernel_ring` (traced inside ``Fp4WeightKernel.__call__``): the TMA
        descriptors of the weights and the activations, the grid, the launch."""
        grid_x = (n + self.k.cfg.rows_per_cta - 1) // self.k.cfg.rows_per_cta
        # The weights as an (N, K/2, L) byte tensor (8-bit weights: (N, K, L)), read by a TMA box
        # of rows_per_cta x 128 bytes (rows past N and bytes past the row arrive as zeros).
        row_bytes = cute.assume(k if cutlass.const_expr(self.k.fp8) else k // 2, divby=16)
        w3 = cute.make_tensor(
            cute.recast_ptr(mW.iterator, dtype=cutlass.Uint8),
            cute.make_layout((n, row_bytes, batches), stride=(row_bytes, 1, cutlass.Int64(n) * cutlass.Int64(row_bytes))),
        )
        sw_layout = self.w_smem_layout()
        tma_atom, tma_w = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), w3, cute.slice_(sw_layout, (None, None, 0)),
            (self.k.cfg.rows_per_cta, self.k.cfg.w_row_bytes),
        )
        # The activations as they are ((rows, K) bf16, row-major), read by TMA boxes of
        # tokens_per_pass x 64 (rows past the end and K values past K arrive as zeros).
        x_rows = m_rows
        if cutlass.const_expr(not self.k.cfg.grouped):
            x_rows = m_rows * batches
        k16 = cute.assume(k, divby=16 if cutlass.const_expr(self.k.fp8) else 32)
        x2 = cute.make_tensor(
            cute.recast_ptr(mX.iterator, dtype=cutlass.BFloat16), cute.make_layout((x_rows, k16), stride=(k16, 1))
        )
        sx_layout = self.x_smem_layout()
        tma_atom_x, tma_x = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), x2, cute.slice_(sx_layout, (None, None, 0)), (self.k.cfg.tokens_per_pass, 64)
        )
        grid = [grid_x, batches, 1]
        if cutlass.const_expr(self.k.cfg.pass_ctas):
            grid = [n_ctas, batches, 1]
        if cutlass.const_expr(self.k.cfg.split):
            grid = [n_ctas, 1, 1]
        kernel = self.k.wgmma_pipe.kernel_wgmma if cutlass.const_expr(self.k.cfg.wgmma) else self.kernel_ring
        kernel(tma_atom, tma_w, tma_atom_x, tma_x, mS, mOut, mOffs, mGs, mXs, mWork, m_rows, n, k,
               batches, n_ctas, slot0, tile_stride, alpha).launch(
            grid=grid, block=[32 * (self.k.cfg.warps + (4 if self.k.cfg.producer_wg else 1)), 1, 1], stream=stream,
        )

    def w_smem_layout(self):
        """(rows_per_cta, w_row_bytes, ring * w_boxes) weight boxes. 128-byte rows, 128-byte
        swizzle: byte b of row r of a box sits at r * 128 + (((b >> 4) ^ (r % 8)) << 4) + b % 16;
        64-byte rows (``ring_k`` 1), 64-byte swizzle: at r * 64 + (((b >> 4) ^ (r // 2 % 4)) << 4) + b % 16."""
        cfg = self.k.cfg
        kind = warpgroup.SmemLayoutAtomKind.K_SW64 if cfg.w_row_bytes == 64 else warpgroup.SmemLayoutAtomKind.K_SW128
        atom = warpgroup.make_smem_layout_atom(kind, cutlass.Uint8)
        return cute.tile_to_shape(atom, (cfg.rows_per_cta, cfg.w_row_bytes, cfg.ring * cfg.w_boxes), order=(0, 1, 2))

    def x_smem_layout(self):
        """(tokens_per_pass, 64 bf16, ring * x_boxes) activation boxes, 128-byte swizzle (the
        byte map of :meth:`w_smem_layout`; a box row is one token's 64 K values)."""
        cfg = self.k.cfg
        atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, cutlass.BFloat16)
        boxes = cfg.ring * cfg.x_boxes
        return cute.tile_to_shape(atom, (cfg.tokens_per_pass, 64, boxes), order=(0, 1, 2))

    @cute.kernel
    def kernel_ring(self, tma_atom: cute.CopyAtom, mW: cute.Tensor, tma_atom_x: cute.CopyAtom, mX2: cute.Tensor, mS,
                    mOut, mOffs, mGs, mXs, mWork, m_rows, n, k, batches, n_ctas, slot0, tile_stride, alpha):  # fmt: skip
        """The streaming ring (``cfg.ring`` > 0). Warp 0 fills stage after stage of shared memory,
        all counted on the stage's full mbarrier: ``ring_k / 2`` TMA boxes of the CTA's weight
        rows x 128 bytes (rows past N and bytes past K/2 arrive as zeros), ``2 ring_k`` TMA boxes
        of the token pass's activations as the caller stored them (tokens x 64 K values; rows past
        the tensor and K values past K arrive as zeros) and one ``cp.async.bulk`` of the scales'
        512-byte column groups (the CTA's rows lie in one 128-row scale tile). Warps 1..
        (warps_n x warps_k, as in :meth:`kernel`) read weights, scales and activations from the
        stage, then release it. Four PRMTs per 16-byte activation piece give the weights' (k, k+4)
        pairing: done once per stage by the producer after the boxes land (``producer_pairs``,
        :meth:`pair_stage`; the stage's full barrier then counts the TMA's arrival and one per
        producer lane, its empty barrier one per consumer lane), or by every consumer on each
        read. Tokens past the pass's end (another expert's, or zeros) are never stored.

        Bank conflicts: a warp's 16-byte weight reads cover two rows per 8 lanes; MMA row g of a
        16-row tile reads weight row g // 2 + 4 (g % 2) (rows 0 and 4, 1 and 5, ...), whose
        swizzled pieces lie in opposite halves of the banks. The stores use the same map. The
        activation reads (token g, piece 4 (t % 2) + j of box t // 2) are two-way conflicted.

        Work: units of (segment, K stage), a segment being one token pass over one CTA-row tile of
        one batch. Without ``split`` a CTA takes its tile's segments (grid: row tiles x batches;
        grouped: the expert's passes from offs). With ``split`` (dense) a persistent grid of
        ``n_ctas`` CTAs takes equal ranges of all units, so every SM streams the same number of
        weight bytes; a segment cut between CTAs is finished by :meth:`split_finish`."""
        cfg = self.k.cfg
        RT, NT, RW, KW = cfg.row_tiles, cfg.n_tiles, cfg.warps_n, cfg.warps_k
        S, SK, R = cfg.ring, cfg.ring_k, cfg.rows_per_cta
        W = cfg.warps
        NB = cfg.w_boxes  # weight boxes per stage
        XC = cfg.x_boxes_per_chunk
        NX = cfg.x_boxes  # activation boxes per stage
        XB = cfg.x_box_bytes
        side = cfg.side_bytes
        CK = cfg.chunk_k
        VT = CK // 4  # K values per thread per chunk
        tidx, bx, by, warp, lane = self.thread_ids()
        (n_p, cols_p, n_chunks, n_kst, n_tiles, row_start, row_end, x_base0, n_pass, u_lo, u_hi,
         total) = self.ring_work(mOffs, m_rows, n, k, batches, n_ctas, bx, by)  # fmt: skip

        alloc = memory.SmemAllocator()
        sW, sX, sFlag, w_smem, x_smem, side_base, bar_base, full, empty, xfull = self.ring_smem(alloc)
        sRed = None
        if cutlass.const_expr(KW > 1):
            n_acc = RT * NT * 4
            sRed = alloc.allocate_tensor(
                cutlass.Float32, cute.make_layout((n_acc, 32, RW, KW - 1), stride=(32, 1, 32 * n_acc, 32 * n_acc * RW)), 16
            )
        PP = cfg.producer_pairs
        # every consumer lane releases its own reads of a stage (producer_pairs, and 8-bit weights:
        # compute-sanitizer's racecheck cannot follow one lane's arrive after a warp sync, and
        # flagged the next stage's scale copy against the K-split warps' scale reads)
        PL = PP or self.k.fp8
        if tidx == 0:
            for i in cutlass.range_constexpr(S):
                # weights + scales (+ activations) (tx), and with producer_pairs the paired activations.
                # With producer_pairs every lane that wrote or read the paired activations arrives
                # itself (an arrive releases the arriving thread's own accesses only: one elected
                # lane after a warp sync is not an ordering racecheck can follow).
                cute.arch.mbarrier_init(full + i, 1 + 32 if PP else 1)
                cute.arch.mbarrier_init(empty + i, W * 32 if PL else W)
                cute.arch.mbarrier_init(xfull + i, 1)
            cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        if warp == 0:
            # ---- producer ----
            self.produce(tma_atom, mW, tma_atom_x, mX2, sW, sX, mS, u_lo, u_hi, n_kst, n_pass, n_tiles, bx, by,
                         row_start, x_base0, m_rows, n_p, cols_p, tile_stride, x_smem, side_base, bar_base, full, lane)
        else:
            # ---- consumers ----
            cw = warp - 1
            rw = cw % RW
            kg = cw // RW
            g = lane // 4
            t = lane % 4
            gp = g // 2 + 4 * (g % 2)  # the weight row of MMA row g (class docstring)
            gs = self.k.out_scale(mGs, alpha)
            # token 8 nt + g's 16-byte piece 4 (t % 2) + j of activation box t // 2 (swizzled):
            # x_smem + box * XB + x_addr[nt] + (x_sw ^ 16 j)
            # (8-bit weights: pieces 2 t + j2 of the chunk's one box, x_sw ^ 16 j2)
            x_addr = cute.make_rmem_tensor((NT,), cutlass.Int32)
            for nt in cutlass.range_constexpr(NT):
                x_addr[nt] = (0 if cutlass.const_expr(self.k.fp8) else (t // 2) * XB) + (nt * 8 + g) * 128
            x_sw = ((2 * t if cutlass.const_expr(self.k.fp8) else 4 * (t % 2)) ^ g) * 16
            w_row = cute.make_rmem_tensor((RT, 2), cutlass.Int32)  # row * 128 in a box
            s_off = cute.make_rmem_tensor((RT, 2), cutlass.Int32)
            for rt in cutlass.range_constexpr(RT):
                for hr in cutlass.range_constexpr(2):
                    w_row[rt, hr] = (rw * (16 * RT) + 16 * rt + 8 * hr + gp) * 128
                    if cutlass.const_expr(R == 128):
                        s_off[rt, hr] = self.k.scale_in_tile(w_row[rt, hr] // 128, t)
            acc = cute.make_rmem_tensor((RT, NT, 4), cutlass.Float32)
            rW = cute.make_rmem_tensor((RT, 2, 4), cutlass.Int32)
            rS = cute.make_rmem_tensor((RT, 2), cutlass.Int32)
            nan = cute.make_rmem_tensor((RT, 2), cutlass.Int32)  # 8-bit weights: e4m3 NaN flags
            it = cutlass.Int32(0)
            u = u_lo
            seg = u_lo // n_kst
            ks = u_lo - seg * n_kst
            while u < u_hi:
                if ks == 0 or u == u_lo:  # a segment starts here
                    acc.fill(0.0)
                    if cutlass.const_expr(self.k.fp8):
                        nan.fill(0)
                if cutlass.const_expr(R < 128):
                    tile = self.ring_segment(seg, n_pass, n_tiles, bx, by, row_start, x_base0, m_rows)[0]
                    for rt in cutlass.range_constexpr(RT):
                        for hr in cutlass.range_constexpr(2):
                            # the CTA's rows lie in one 128-row scale tile
                            s_off[rt, hr] = self.k.scale_in_tile((tile * R) % 128 + w_row[rt, hr] // 128, t)
                slot = it % S
                cute.arch.mbarrier_wait(full + slot, (it // S) % 2)
                st = side_base + slot * side
                for q in cutlass.range_constexpr(SK):
                    mine = True
                    if cutlass.const_expr(KW > 1):
                        mine = kg == q % KW
                    c = ks * SK + q
                    if mine and c < n_chunks:
                        # K values past K (a partial last chunk): zero weights and activations
                        # (the TMA fills them), unit scales (the scale bytes there are stale)
                        live = c * CK + VT * t < k
                        box = w_smem + (slot * NB + q // 2) * cfg.w_box_bytes
                        piece = (q % 2) * 4 + t  # 16-byte piece of the 128-byte box row
                        for rt in cutlass.range_constexpr(RT):
                            for hr in cutlass.range_constexpr(2):
                                words = ld_shared_v4(box + w_row[rt, hr] + (piece ^ gp) * 16)
                                for w in cutlass.range_constexpr(4):
                                    rW[rt, hr, w] = words[w]
                                    if cutlass.const_expr(self.k.fp8):
                                        nan[rt, hr] = e4m3_nan_flags(words[w], nan[rt, hr])
                                if cutlass.const_expr(self.k.mx):
                                    sb = ld_shared_u8(st + s_off[rt, hr] + self.k.scale_chunk_offset(q))
                                    rS[rt, hr] = cutlass.select_(live, sb, cutlass.Int32(self.k.unit_scale))
                                else:
                                    sb = ld_shared_u16(st + s_off[rt, hr] + self.k.scale_chunk_offset(q))
                                    rS[rt, hr] = cutlass.select_(live, sb, cutlass.Int32(self.k.unit_scale))
                        xq = x_smem + (slot * NX + XC * q) * XB
                        if cutlass.const_expr(self.k.fp8):
                            self.k.mma_chunk_fp8(rW, rS, xq, x_addr, x_sw, acc)
                        else:
                            self.k.mma_chunk(q, rW, rS, xq, x_addr, x_sw, acc, "paired" if PP else "swizzled")
                if cutlass.const_expr(PL):
                    cute.arch.mbarrier_arrive(empty + slot)  # every lane: its own reads
                else:
                    cute.arch.sync_warp()
                    if lane == 0:
                        cute.arch.mbarrier_arrive(empty + slot)
                it += 1
                if ks == n_kst - 1 or u == u_hi - 1:  # the segment ends here
                    if cutlass.const_expr(self.k.fp8):
                        self.k.nan_rows(nan, acc)
                    self.end_segment(acc, sRed, sFlag, mWork, slot0, lane, kg, rw, cw, seg, u - ks, u_lo, u_hi, total, n_ctas,
                                     n_kst, n_pass, n_tiles, batches, bx, by, row_start, row_end, x_base0, m_rows, n,
                                     gs, mXs, mOut)  # fmt: skip
                u += 1
                ks += 1
                if ks == n_kst:
                    ks = 0
                    seg += 1

    @cute.jit
    def produce(self, tma_atom, mW, tma_atom_x, mX2, sW, sX, mS, u_lo, u_hi, n_kst, n_pass, n_tiles, bx, by, row_start,
                x_base0, m_rows, n_p, cols_p, tile_stride, x_smem, side_base, bar_base, full, lane):  # fmt: skip
        """The producer warp of :meth:`kernel_ring` (and of the WGMMA kernel, :mod:`.weight_only.wgmma`):
        units ``u_lo .. u_hi`` of (segment, K stage), each into the next ring slot (waiting for
        its empty barrier), counted on its full barrier (``producer_pairs``: the activation boxes
        on xfull, then paired by :meth:`pair_stage` one stage behind)."""
        cfg = self.k.cfg
        S, R, T = cfg.ring, cfg.rows_per_cta, cfg.tokens_per_pass
        SG = cfg.scale_groups
        NB = cfg.w_boxes
        NX = cfg.x_boxes
        XB = cfg.x_box_bytes
        side = cfg.side_bytes
        PP = cfg.producer_pairs
        empty = full + S
        xfull = full + 2 * S
        cpasync.prefetch_descriptor(tma_atom)  # the TMA ops elect their thread: call them warp-wide
        cpasync.prefetch_descriptor(tma_atom_x)
        # (TMA, boxes), (TMA, RestN, RestK, L)
        tWs, tWg = cpasync.tma_partition(
            tma_atom, 0, cute.make_layout(1), cute.group_modes(sW, 0, 2),
            cute.group_modes(cute.local_tile(mW, (R, cfg.w_row_bytes), (None, None, None)), 0, 2),
        )  # fmt: skip
        sXb = cute.group_modes(sX, 0, 2)
        it = cutlass.Int32(0)
        u = u_lo
        seg = u_lo // n_kst
        ks = u_lo - seg * n_kst
        hi = u_hi
        stride = self.seg_stride()
        if cutlass.const_expr(cfg.tail_split):
            # after the full rounds (u_lo .. u_hi, stride: the grid) the CTA's range of the tail
            t_lo, t_hi = self.tail_range(bx, n_tiles, n_pass, n_kst, stride)[:2]
            in_tail = cutlass.Int32(0)
            u, hi, stride, in_tail, seg, ks = self.tail_enter(u, hi, stride, in_tail, seg, ks, t_lo, t_hi, n_kst)
        while u < hi:
            tile, batch, m0, x_base = self.ring_segment(seg, n_pass, n_tiles, bx, by, row_start, x_base0, m_rows)
            # (T, 64, K / 64) boxes of this pass's tokens (dense: x_base = the batch's first row)
            gX = cute.local_tile(cute.domain_offset((cutlass.Int32(x_base) + m0, 0), mX2), (T, 64), (0, None))
            tXs, tXg = cpasync.tma_partition(tma_atom_x, 0, cute.make_layout(1), sXb, cute.group_modes(gX, 0, 2))
            s_base = self.k.scales_base(mS, batch, n_p, cols_p) + cutlass.Int64(tile * R // 128) * cutlass.Int64(tile_stride)
            slot = it % S
            if it >= S:
                cute.arch.mbarrier_wait(empty + slot, (it // S + 1) % 2)
            g0 = ks * SG  # the stage's first scale column group
            if cutlass.const_expr(cfg.stages_per_scale_group > 1):
                g0 = ks // cfg.stages_per_scale_group  # stages sharing a group: each copies it
            n_groups = cutlass.min(SG, cols_p // 4 - g0)
            if lane == 0:
                if cutlass.const_expr(PP):
                    cute.arch.mbarrier_arrive_and_expect_tx(full + slot, NB * cfg.w_box_bytes + n_groups * 512)
                    cute.arch.mbarrier_arrive_and_expect_tx(xfull + slot, NX * XB)
                else:
                    cute.arch.mbarrier_arrive_and_expect_tx(full + slot, NB * cfg.w_box_bytes + n_groups * 512 + NX * XB)
                bulk_g2s(side_base + slot * side, s_base + cutlass.Int64(g0 * 512), n_groups * 512, bar_base + slot * 8)
            cute.arch.sync_warp()
            for j in cutlass.range_constexpr(NB):
                cute.copy(tma_atom, tWg[(None, tile, ks * NB + j, batch)], tWs[(None, slot * NB + j)], tma_bar_ptr=full + slot)
            for j in cutlass.range_constexpr(NX):
                cute.copy(tma_atom_x, tXg[(None, ks * NX + j)], tXs[(None, slot * NX + j)],
                          tma_bar_ptr=(xfull if PP else full) + slot)  # fmt: skip
            if cutlass.const_expr(PP):
                if it > 0:
                    self.pair_stage(it - 1, x_smem, xfull, full, lane)
            it += 1
            u += 1
            ks += 1
            if ks == n_kst:
                ks = 0
                seg += stride
                u = seg * n_kst
            if cutlass.const_expr(cfg.tail_split):
                u, hi, stride, in_tail, seg, ks = self.tail_enter(u, hi, stride, in_tail, seg, ks, t_lo, t_hi, n_kst)
        if cutlass.const_expr(PP):
            if it > 0:
                self.pair_stage(it - 1, x_smem, xfull, full, lane)

    @cute.jit
    def pair_stage(self, it, x_smem, xfull, full, lane):
        """Producer: once stage ``it``'s activation boxes have landed, turn every 16-byte piece
        (8 K values in order) into the weights' (k, k+4) pairing in place (four PRMTs), then
        count every lane's arrival on the stage's full barrier. The TMA will overwrite these bytes
        S stages later: the proxy fence orders the generic writes before it."""
        cfg = self.k.cfg
        S = cfg.ring
        slot = it % S
        cute.arch.mbarrier_wait(xfull + slot, (it // S) % 2)
        per_stage = cfg.x_boxes * cfg.x_box_bytes
        base = x_smem + slot * per_stage + lane * 16
        for i in cutlass.range_constexpr(per_stage // (16 * 32)):
            a = base + i * 512
            st_shared_v4(a, pair_natural_x(ld_shared_v4(a)))
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.mbarrier_arrive(full + slot)  # every lane releases its own writes

    @cute.jit
    def end_segment(self, acc, sRed, sFlag, mWork, slot0, lane, kg, rw, cw, seg, su0, u_lo, u_hi, total, n_ctas, n_kst,
                    n_pass, n_tiles, batches, bx, by, row_start, row_end, x_base0, m_rows, n, gs, mXs, mOut,
                    permuted: cutlass.Constexpr = True):  # fmt: skip
        """The consumers at the end of segment ``seg`` (first unit ``su0``): store it, or (split,
        the segment cut between CTAs) :meth:`split_finish`. ``permuted``: the mma.sync consumers'
        row order (:meth:`kernel_ring`); the WGMMA consumers' is the natural one."""
        cfg = self.k.cfg
        tile, batch, m0, x_base = self.ring_segment(seg, n_pass, n_tiles, bx, by, row_start, x_base0, m_rows)
        row0 = tile * cfg.rows_per_cta + rw * (16 * cfg.row_tiles)
        bar = 32 * cfg.warps
        if cutlass.const_expr(cfg.split):
            if su0 >= u_lo and su0 + n_kst <= u_hi:
                self.k.finish_pass(acc, sRed, lane, kg, rw, m0, m_rows, x_base, row0, n, gs, mXs, mOut, bar, permuted)
            else:
                self.split_finish(acc, sRed, sFlag, mWork, slot0, lane, kg, rw, cw, seg, su0, u_lo, total, n_ctas, n_kst,
                                  m0, m_rows, x_base, row0, n, gs, mXs, mOut, bar, permuted)  # fmt: skip
        else:
            self.k.finish_pass(acc, sRed, lane, kg, rw, m0, row_end, x_base, row0, n, gs, mXs, mOut, bar, permuted)

    @cute.jit
    def ring_work(self, mOffs, m_rows, n, k, batches, n_ctas, bx, by):
        """The ring kernels' work geometry: (N_p, cols_p) of the scales, K chunks, K stages, row
        tiles, the batch's (expert's) token rows and first x row, its token passes, and the CTA's
        (first, end) unit and the unit count (:meth:`unit_range`)."""
        cfg = self.k.cfg
        n_p, cols_p = self.k.scale_dims(n, k)
        n_chunks = (k + cfg.chunk_k - 1) // cfg.chunk_k
        n_kst = (n_chunks + cfg.ring_k - 1) // cfg.ring_k
        n_tiles = (n + cfg.rows_per_cta - 1) // cfg.rows_per_cta
        row_start, row_end, x_base0 = self.k.token_range(mOffs, m_rows, by)
        n_pass = (row_end - row_start + cfg.tokens_per_pass - 1) // cfg.tokens_per_pass
        u_lo, u_hi, total = self.unit_range(bx, batches, n_tiles, n_pass, n_kst, n_ctas)
        return n_p, cols_p, n_chunks, n_kst, n_tiles, row_start, row_end, x_base0, n_pass, u_lo, u_hi, total

    def ring_smem(self, alloc):
        """The ring's shared memory: weight boxes, activation boxes (128-byte swizzle), the
        scales' stage slots, the stages' full / empty / activations-landed mbarriers, a flag;
        returned as (sW, sX, flag, the first four's shared addresses, the three barrier arrays)."""
        S, side = self.k.cfg.ring, self.k.cfg.side_bytes
        sw_layout = self.w_smem_layout()
        sW = alloc.allocate_tensor(cutlass.Uint8, sw_layout.outer, 1024, swizzle=sw_layout.inner)
        sx_layout = self.x_smem_layout()
        sX = alloc.allocate_tensor(cutlass.BFloat16, sx_layout.outer, 1024, swizzle=sx_layout.inner)
        sides = alloc.allocate_tensor(cutlass.Int32, cute.make_layout(S * side // 4), 128)
        bars = alloc.allocate_tensor(cutlass.Int64, cute.make_layout(3 * S), 8)
        sFlag = alloc.allocate_tensor(cutlass.Int32, cute.make_layout(4), 16)
        full = bars.iterator
        empty = bars.iterator + S
        xfull = bars.iterator + 2 * S  # the stage's activation boxes have landed (producer_pairs)
        return (sW, sX, sFlag, sW.iterator.toint(), sX.iterator.toint(), sides.iterator.toint(), bars.iterator.toint(),
                full, empty, xfull)  # fmt: skip

    def thread_ids(self):
        """(thread, CTA x, CTA y, warp (uniform), lane)."""
        tidx, _, _ = cute.arch.thread_idx()
        bx, by, _ = cute.arch.block_idx()
        return tidx, bx, by, cute.arch.make_warp_uniform(tidx // 32), tidx % 32

    @cute.jit
    def unit_range(self, bx, batches, n_tiles, n_pass, n_kst, n_ctas):
        """(first unit, end unit, unit count) of CTA ``bx``: its tile's passes x K stages (with
        ``pass_ctas``: its (tile, pass) segments bx, bx + the grid's CTAs, ... (:meth:`seg_stride`)
        up to the batch's end), or with ``split`` an equal share of every (batch, row tile, pass,
        K stage) unit."""
        u_lo = cutlass.Int32(0)
        u_hi = n_pass * n_kst
        total = u_hi
        if cutlass.const_expr(self.k.cfg.pass_ctas):
            u_lo = bx * n_kst
            u_hi = n_tiles * n_pass * n_kst
            if cutlass.const_expr(self.k.cfg.tail_split):  # the full rounds; the rest: tail_range
                u_hi = (n_tiles * n_pass // n_ctas) * n_ctas * n_kst
        if cutlass.const_expr(self.k.cfg.split):
            total = batches * n_tiles * n_pass * n_kst
            u_lo = self.share_start(bx, n_ctas, total)
            u_hi = self.share_start(bx + 1, n_ctas, total)
        return u_lo, u_hi, total

    @cute.jit
    def share_start(self, c, parts, total):
        """First unit of part ``c`` when ``total`` units are cut into ``parts`` equal ranges (the
        split grid, ``tail_split``'s tail): c * total // parts, in 64 bits."""
        return cutlass.Int32(cutlass.Int64(c) * cutlass.Int64(total) // cutlass.Int64(parts))

    @cute.jit
    def share_holders(self, su0, n_kst, parts, total):
        """(first, last) part holding a unit of the segment whose first unit is ``su0`` (of
        :meth:`share_start`'s equal ranges): the contributors of a segment cut between CTAs."""
        G64 = cutlass.Int64(parts)
        T64 = cutlass.Int64(total)
        c_first = cutlass.Int32((cutlass.Int64(su0 + 1) * G64 - 1) // T64)
        c_last = cutlass.Int32((cutlass.Int64(su0 + n_kst) * G64 - 1) // T64)
        return c_first, c_last

    @cute.jit
    def tail_range(self, bx, n_tiles, n_pass, n_kst, n_ctas):
        """``tail_split``: (first unit, end unit, the tail's first unit, its unit count, the CTAs
        sharing it) of CTA ``bx`` in the tail, the units after the pass grid's last full round
        (:meth:`unit_range`): equal ranges of them over the first G_t CTAs, G_t = the grid's
        CTAs, fewer where a range would hold less than ``TAIL_MIN_STAGES`` K stages (the CTA
        that finishes a cut unit adds every contributor's partial sums); the other CTAs' ranges
        are empty."""
        n_seg = n_tiles * n_pass
        base = (n_seg // n_ctas) * n_ctas * n_kst
        t_units = n_seg * n_kst - base
        g_t = cutlass.max(cutlass.min(n_ctas, t_units // TAIL_MIN_STAGES), 1)
        t_lo = self.share_start(cutlass.min(bx, g_t), g_t, t_units)
        t_hi = self.share_start(cutlass.min(bx + 1, g_t), g_t, t_units)
        return base + t_lo, base + t_hi, base, t_units, g_t

    @cute.jit
    def tail_enter(self, u, hi, stride, in_tail, seg, ks, t_lo, t_hi, n_kst):
        """``tail_split``: once the walk (unit ``u``, segment ``seg``, its stage ``ks``) is past
        the full rounds' end ``hi`` (and not yet in the tail), move it to the CTA's tail range
        ``t_lo .. t_hi`` with stride 1; returns (u, hi, stride, in_tail, seg, ks)."""
        if u >= hi and in_tail == 0:
            in_tail = cutlass.Int32(1)
            u = t_lo
            hi = t_hi
            stride = cutlass.Int32(1)
            seg = u // n_kst
            ks = u - seg * n_kst
        return u, hi, stride, in_tail, seg, ks

    def seg_stride(self):
        """From one segment (unit) of a CTA to its next: the grid's CTA count on the pass grid
        (``pass_ctas``; with a CTA per unit the first step ends the CTA's work), else 1."""
        if cutlass.const_expr(self.k.cfg.pass_ctas):
            return cute.arch.grid_dim()[0]
        return 1

    @cute.jit
    def ring_segment(self, seg, n_pass, n_tiles, bx, by, row_start, x_base0, m_rows):
        """Segment ``seg`` of the ring's work (units: segment x K stages) -> (row tile, batch, first
        token row of the pass, the batch's first x row). Split: segments run (batch, row tile,
        pass), a tile's passes back to back (their weight reads hit L2); else the CTA's own tile
        (bx, by) and its passes."""
        tile = bx
        batch = by
        m0 = row_start + seg * self.k.cfg.tokens_per_pass
        x_base = x_base0
        if cutlass.const_expr(self.k.cfg.split):
            rest = seg // n_pass
            tile = rest % n_tiles
            batch = rest // n_tiles
            m0 = (seg - rest * n_pass) * self.k.cfg.tokens_per_pass
            x_base = cutlass.Int64(batch) * cutlass.Int64(m_rows)
        if cutlass.const_expr(self.k.cfg.pass_ctas):  # segment = (tile, pass) unit of the batch
            tile = seg // n_pass
            m0 = row_start + (seg - tile * n_pass) * self.k.cfg.tokens_per_pass
        return tile, batch, m0, x_base

    def slot_word(self, slot0, cta, cta_lo, su0, rw, lane):
        """Word of lane ``lane`` of row group ``rw`` in CTA ``cta``'s slot for the segment starting
        at unit ``su0``: slot 0 if the segment holds the CTA's first unit ``cta_lo``, else 1 (its
        last). Value v of the lane sits ``32 v`` words further (:meth:`split_finish`)."""
        n_acc = self.k.cfg.row_tiles * self.k.cfg.n_tiles * 4
        slot_words = self.k.cfg.warps_n * n_acc * 32
        return slot0 + (cta * 2 + cutlass.select_(cta_lo >= su0, 0, 1)) * slot_words + rw * n_acc * 32 + lane

    @cute.jit
    def split_finish(self, acc, sRed, sFlag, mWork, slot0, lane, kg, rw, cw, seg, su0, u_lo, total, n_ctas, n_kst,
                     m0, row_end, x_base, row0, n, gs, mXs, mOut, bar_threads: cutlass.Constexpr,
                     permuted: cutlass.Constexpr = True):  # fmt: skip
        """A segment cut between CTAs (``split``): its K groups meet (``sRed``), K group 0 writes
        its fp32 partial sums to the CTA's slot in ``mWork`` and one thread counts the CTA in on
        the segment's counter (acq_rel, GPU scope). The CTA that completes the count adds the
        partials of every contributor in CTA order (its own from registers: the sum is the same
        whatever the arrival order, so results are deterministic), stores the fragment and resets
        the counter for the next launch. Nobody waits for another CTA.

        mWork (Int32 words): one counter per segment, then from word ``slot0`` (the host keeps it
        past every counter, so a later call's slots never land on a counter) 2 slots per CTA of
        warps_n x n_acc x 32 fp32: slot 0 for the segment holding the CTA's first unit, 1 for
        the one holding its last (the units between are whole segments, stored directly)."""
        cfg = self.k.cfg
        RT, NT = cfg.row_tiles, cfg.n_tiles
        n_acc = RT * NT * 4
        me = cute.arch.block_idx()[0]
        mWf = cute.make_tensor(cute.recast_ptr(mWork.iterator, dtype=cutlass.Float32), mWork.layout)
        c_first, c_last = self.share_holders(su0, n_kst, n_ctas, total)
        self.k.reduce_k_groups(acc, sRed, lane, kg, rw, bar_threads)
        if kg == 0:
            base = self.slot_word(slot0, me, u_lo, su0, rw, lane)
            for v in cutlass.range_constexpr(n_acc):
                mWf[base + v * 32] = acc[self.k.acc_index(v)]
            cute.arch.fence_acq_rel_gpu()
        if self.count_in(mWork, seg, c_last - c_first, sFlag, cw == 0 and lane == 0, bar_threads) == 1:
            cute.arch.fence_acq_rel_gpu()
            if kg == 0:
                tot = cute.make_rmem_tensor((RT, NT, 4), cutlass.Float32)
                tot.fill(0.0)
                for c in range(c_first, c_last + 1):
                    if c == me:
                        for v in cutlass.range_constexpr(n_acc):
                            tot[self.k.acc_index(v)] += acc[self.k.acc_index(v)]
                    else:
                        c_lo = self.share_start(c, n_ctas, total)  # CTA c's first unit
                        base = self.slot_word(slot0, c, c_lo, su0, rw, lane)
                        addr = mWork.iterator.toint() + cutlass.Int64(base) * 4
                        for v in cutlass.range_constexpr(n_acc):
                            tot[self.k.acc_index(v)] += ld_global_cg_f32(addr + v * 128)
                self.k.store_fragment(tot, lane, m0, row_end, x_base, row0, n, gs, mXs, mOut, permuted)
        self.k.sync(bar_threads)  # sFlag and sRed are rewritten by the next segment

    @cute.jit
    def count_in(self, mWork, ctr, others, sFlag, leader, bar_threads: cutlass.Constexpr):
        """A contributor to a unit cut between CTAs (:meth:`split_finish`, the consumers'
        ``tail_gather``), its partial sums written and fenced: after the consumers' barrier the
        ``leader`` thread adds 1 to counter ``ctr`` of ``mWork`` (acq_rel, GPU scope); the CTA
        whose add finds ``others`` earlier arrivals completes the unit and resets the counter for
        the next launch. Returns 1 there (the same in every consumer thread), else 0."""
        self.k.sync(bar_threads)
        if leader:
            old = cute.arch.atomic_add(mWork.iterator + ctr, cutlass.Int32(1), sem="acq_rel", scope="gpu")
            last = cutlass.Int32(old) == others
            sFlag[0] = cutlass.select_(last, 1, 0)
            if last:
                mWork[ctr] = 0  # every contributor has counted in: ready for the next launch
        self.k.sync(bar_threads)
        return sFlag[0]


def split_plan_ref(total: int, n_ctas: int, n_kst: int) -> list[list[tuple]]:
    """Torch-free twin of the split grid's schedule (:meth:`RingPipeline.kernel_ring` /
    :meth:`RingPipeline.split_finish`, the same integer formulas): for every CTA the pieces of
    segments it processes, as (segment, first unit, last unit + 1, whole, slot, contributors
    c_first, c_last). The CPU tests check that the pieces partition the units, that a cut
    segment's contributors are exactly the CTAs holding its units, and that a CTA's slots differ."""
    plan = []
    for c in range(n_ctas):
        u_lo, u_hi = c * total // n_ctas, (c + 1) * total // n_ctas
        pieces, u = [], u_lo
        seg, ks = u_lo // n_kst, u_lo % n_kst
        start = u_lo
        while u < u_hi:
            if ks == n_kst - 1 or u == u_hi - 1:  # the segment ends here (the kernel's test)
                su0 = u - ks
                whole = su0 >= u_lo and su0 + n_kst <= u_hi
                c_first = ((su0 + 1) * n_ctas - 1) // total
                c_last = ((su0 + n_kst) * n_ctas - 1) // total
                slot = 0 if u_lo >= su0 else 1
                pieces.append((seg, start, u + 1, whole, slot, c_first, c_last))
                start = u + 1
            u += 1
            ks += 1
            if ks == n_kst:
                ks, seg = 0, seg + 1
        plan.append(pieces)
    return plan


def tail_plan_ref(n_seg: int, n_kst: int, grid: int) -> list[list[tuple]]:
    """Torch-free twin of the pass grid's schedule with ``tail_split`` (:meth:`RingPipeline.
    unit_range` / :meth:`RingPipeline.tail_range` and the consumers' ``tail_gather``): for every
    CTA its pieces as in :func:`split_plan_ref` (a whole segment's slot None): whole segments bx,
    bx + grid, ... over the full rounds, then its range of the tail, which is the split grid's
    schedule of the tail's units over its first G_t CTAs, shifted past the full rounds. The CPU
    tests check that the pieces partition the units, that a cut segment's contributors are
    exactly the CTAs holding its units, and a CTA's slots differ."""
    full = n_seg // grid * grid
    t_units = (n_seg - full) * n_kst
    g_t = max(min(grid, t_units // TAIL_MIN_STAGES), 1)
    tail = split_plan_ref(t_units, g_t, n_kst) if t_units else []
    plan = []
    for c in range(grid):
        pieces = [(s, s * n_kst, (s + 1) * n_kst, True, None, c, c) for s in range(c, full, grid)]
        for seg, a, b, whole, slot, c_first, c_last in tail[c] if c < len(tail) else []:
            shift = full * n_kst
            pieces.append((full + seg, shift + a, shift + b, whole, None if whole else slot, c_first, c_last))
        plan.append(pieces)
    return plan
