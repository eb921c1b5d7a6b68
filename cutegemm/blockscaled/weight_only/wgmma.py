"""The FP4-weight kernel's WGMMA consumers (``Fp4WeightConfig.wgmma``, sm_90a), a part of
:class:`~cutegemm.blockscaled.weight_only.kernel.Fp4WeightKernel`: the weights are dequantized from
shared memory into registers and multiplied by the Hopper warpgroup MMA with A from registers
(``wgmma.mma_async`` m64 x tokens x k16, bf16), the activations read by the MMA straight from
the ring's shared memory. The ``mma.sync`` consumers of :mod:`.weight_only.ring` load every token's
activations into registers once per 16-row weight tile and issue one MMA per 8 tokens, so their
work grows with the tokens per pass; here the tokens are the MMA's N (up to 128), and the
dequantization of a weight serves all of them.

The producer is :meth:`~cutegemm.blockscaled.weight_only.ring.RingPipeline.produce` (the ring's, without
the activation pairing): per stage one 128-row x 256-K TMA box of weight bytes (128-byte
swizzle), the token pass's activations as four (tokens x 64 K) boxes in the 128-byte swizzled
K-major layout the WGMMA descriptor reads, in K order, and the scales' column groups. With
128-K stages (``Fp4WeightConfig.stage_k``: FP4 ``ring_k`` 1, MXFP8 ``ring_k`` 2; the policy's
choice for 128 tokens per pass, four stages where two of 256 K fit) a stage holds half of that:
FP4 weight boxes of 64 bytes per row in the 64-byte swizzle (byte b of row r at r * 64 +
(((b >> 4) ^ (r // 2 % 4)) << 4) + b % 16), two activation boxes.

Two consumer warpgroups (warps 0-7, 64 weight rows each; the producer is warp 8, with
``producer_wg`` the first of a warpgroup of four that lowers its register count by setmaxnreg so
the consumers can raise theirs to 232: ptxas otherwise gives each of the three warpgroups 168,
and 128 tokens' 64 fp32 accumulators per thread spilled). Thread (g, t)
of warp w holds weight rows r = 16 w + g and r + 8 of its warpgroup's 64. The A fragment of a
k16 step (K values 16 j .. 16 j + 15 of the stage) wants, per row, the bf16 pairs of K
(2 t, 2 t + 1) and (2 t + 8, 2 t + 9): byte t of the step's two 32-bit weight words (8 nibbles
each), one PRMT + the multiply-and-mask placement of :mod:`.weight_only.math` + the packed scale multiply
each (``dequant_fp4_byte``). The four threads of a quad read the same 16 bytes (a broadcast); the
8 rows of a warp's read lie in different swizzled 16-byte columns, so the reads are
conflict-free. The scale factor of a step (NVFP4: one per 16 K; MXFP4: one per 32 K) multiplies
the bf16 pair (as in the ring); the global scale (and NVFP4's 2**8) scale the fp32 accumulators
at the store (:meth:`~cutegemm.blockscaled.weight_only.kernel.Fp4WeightKernel.store_fragment`).

MXFP8 weights (``ring_k`` 4: a stage still covers 256 K, as two 128-K weight boxes and the same
four activation boxes): half h of a stage is box h, its 16-byte piece p is k16 step p, and the
two K pairs of a row come from words 0-1 and 2-3 of the piece, one PRMT each
(:meth:`WgmmaPipeline.fp8_fragments`), which also collects the rows' NaN flags.

Per commit group (``Fp4WeightConfig.group_steps``: 8 k16 steps = 128 K, or 4 at 256 tokens per
pass, where two groups' A fragments must fit beside 128 fp32 accumulators per thread) the A
fragments are computed first, then one fence and the group's WGMMAs, a commit and a wait for the
group before, so the dequantization of the next group overlaps this group's MMAs; a stage is
released once the first group of the next one has waited for it. (Dequantizing each step right
before its WGMMA made ptxas fence before every WGMMA and give each its own scoreboard wait,
``gsb0`` on all 16 per stage instead of 2: the MMAs ran one at a time, 62 us for NVFP4 64 x 28672
x 4096 on the H200.) Consecutive groups' A fragments must live in different registers: ptxas
keeps an in-flight WGMMA's register operands apart from later writes within straight-line code,
not across a loop's back edge, so a loop trip holds two groups at least: stages of one group run
two per trip (``Fp4WeightConfig.trip_stages``; :meth:`WgmmaPipeline.kernel_wgmma`), and a trip
of more than two groups ends with a wait for all of them (the tensor pipe drains there: FP4 at
256 tokens per pass ran 2-5% faster with one 128-K stage of two groups per trip than with two).

256 tokens per pass (``n_tiles`` 32, ``producer_wg``, FP4 in 128-K stages, MXFP8 in 64-K ones:
``ring_k`` 1, 64-byte weight rows, each stage copying the 128-K scale group that holds its K,
five stages where two of 128 K fit): m64 x 256 x k16 WGMMAs
(138 tensor-core cycles each at full rate, against ~25 issue slots of dequantization per warp), so
the weights' decoding hides under the MMAs where 128 tokens were instruction-bound.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import memory
from cutlass.cute.nvgpu import warpgroup

from ...runtime.ptx import (
    ld_global_cg_f32,
    ld_shared_b32,
    ld_shared_v4,
    smem_desc_sw128,
    st_global_v4,
    wgmma_rs_bf16,
)
from .math import (
    PAIR_NAN_MASK,
    dequant_e4m3_pair,
    dequant_fp4_byte,
    e4m3_pair_selector,
    mx_factor_bf16x2,
    nvfp4_factors,
)

__all__ = ["WgmmaPipeline"]

# ``producer_wg``: 2 x 128 x 232 + 128 x 40 <= 65536 registers (as CUTLASS's sm_90 warp-specialized kernels)
PRODUCER_REGISTERS = 40
CONSUMER_REGISTERS = 232


class WgmmaPipeline:
    """:meth:`kernel_wgmma`; launched by ``RingPipeline.launch_ring`` when ``cfg.wgmma``."""

    def __init__(self, kernel):
        self.k = kernel  # the kernel this part belongs to (its config, layouts, tiles)

    @cute.kernel
    def kernel_wgmma(self, tma_atom: cute.CopyAtom, mW: cute.Tensor, tma_atom_x: cute.CopyAtom, mX2: cute.Tensor, mS,
                     mOut, mOffs, mGs, mXs, mWork, m_rows, n, k, batches, n_ctas, slot0, tile_stride, alpha):  # fmt: skip
        """Grid (128-row weight tiles, batches / experts); each CTA runs its batch's (expert's)
        token passes over its weight rows, the passes after the first reading the rows from L2.
        With ``split`` (dense): the ring's persistent grid, equal ranges of (row tile, pass, K
        stage) units per CTA, a pass cut between CTAs finished by ``split_finish``."""
        cfg = self.k.cfg
        S = cfg.ring
        W = cfg.warps
        NT = cfg.n_tiles
        tidx, bx, by, warp, lane = self.k.ring_pipe.thread_ids()
        (n_p, cols_p, _, n_kst, n_tiles, row_start, row_end, x_base0, n_pass, u_lo, u_hi,
         total) = self.k.ring_pipe.ring_work(mOffs, m_rows, n, k, batches, n_ctas, bx, by)  # fmt: skip

        alloc = memory.SmemAllocator()
        sW, sX, sFlag, w_smem, x_smem, side_base, bar_base, full, empty, xfull = self.k.ring_pipe.ring_smem(alloc)
        sE = None
        if cutlass.const_expr(cfg.staged_store):
            sE = alloc.allocate_tensor(cutlass.Uint8, cute.make_layout(cfg.store_rows * cfg.store_row_bytes), 16)
        if tidx == 0:
            for i in cutlass.range_constexpr(S):
                # the TMA's transaction bytes; every consumer lane releases its own reads
                cute.arch.mbarrier_init(full + i, 1)
                cute.arch.mbarrier_init(empty + i, W * 32)
                cute.arch.mbarrier_init(xfull + i, 1)
            cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        if warp >= W:
            # ---- producer (warp W; with producer_wg its warpgroup hands its registers over) ----
            if cutlass.const_expr(cfg.producer_wg):
                cute.arch.setmaxregister_decrease(PRODUCER_REGISTERS)
            if warp == W:
                self.k.ring_pipe.produce(tma_atom, mW, tma_atom_x, mX2, sW, sX, mS, u_lo, u_hi, n_kst, n_pass, n_tiles, bx, by,
                             row_start, x_base0, m_rows, n_p, cols_p, tile_stride, x_smem, side_base, bar_base, full,
                             lane)  # fmt: skip
        else:
            # ---- consumers: two warpgroups of 64 weight rows ----
            if cutlass.const_expr(cfg.producer_wg):
                cute.arch.setmaxregister_increase(CONSUMER_REGISTERS)
            g = lane // 4
            t = lane % 4
            gs = self.k.out_scale(mGs, alpha)
            r0 = (warp // 4) * 64 + (warp % 4) * 16  # the warp's first row in the CTA (= 16 warp)
            w_off = cute.make_rmem_tensor((2,), cutlass.Int32)  # rows r0 + g, r0 + g + 8 (x 128 bytes)
            s_off = cute.make_rmem_tensor((2,), cutlass.Int32)  # their scales' offset in the 128-row tile
            for hr in cutlass.range_constexpr(2):
                r = r0 + 8 * hr + g
                w_off[hr] = r * cfg.w_row_bytes
                s_off[hr] = (r % 32) * 16 + ((r // 32) % 4) * 4
            acc = cute.make_rmem_tensor((1, NT, 4), cutlass.Float32)
            sel = t + 0x4440  # PRMT selector: byte t of a word (K pair 2 t, 2 t + 1 of its 8 values)
            if cutlass.const_expr(self.k.fp8):
                sel = e4m3_pair_selector(2 * t)  # bytes 2 t, 2 t + 1 of two words (8-bit weights)
            nan = cute.make_rmem_tensor((1, 2), cutlass.Int32)  # 8-bit weights: NaN flags of rows g, g + 8 (unused for FP4)
            it = cutlass.Int32(0)
            seg = u_lo // n_kst
            lo = u_lo
            hi = u_hi
            stride = self.k.ring_pipe.seg_stride()
            if cutlass.const_expr(cfg.tail_split):
                # after the full rounds (u_lo .. u_hi, stride: the grid) the CTA's range of the tail
                t_lo, t_hi, t_base, t_units, g_t = self.k.ring_pipe.tail_range(bx, n_tiles, n_pass, n_kst, stride)
                in_tail = cutlass.Int32(0)
                lo, hi, stride, in_tail, seg = self.k.ring_pipe.tail_enter(seg * n_kst, hi, stride, in_tail, seg, 0, t_lo, t_hi,
                                                               n_kst)[:5]  # fmt: skip
            while seg * n_kst < hi:  # segments: one token pass over one weight tile (split: the part in range)
                su0 = seg * n_kst
                ks0 = cutlass.max(lo - su0, 0)
                ks_end = cutlass.min(hi - su0, n_kst)
                acc.fill(0.0)
                if cutlass.const_expr(self.k.fp8):
                    nan.fill(0)
                ks = ks0
                # Two commit groups per trip at least (stages of one group: two per trip),
                # straight-line, so consecutive groups' A fragments sit in different registers
                # (ptxas keeps an in-flight WGMMA's A registers apart from later writes in
                # straight-line code, not across the loop's back edge; a branch around the second
                # stage made it serialize every WGMMA). An odd last stage runs after the loop,
                # once the MMAs in flight are done.
                U = cfg.trip_stages
                while ks + (U - 1) < ks_end:
                    for _ in cutlass.range_constexpr(U):
                        self.wgmma_stage(acc, it, ks, ks0, full, empty, side_base, w_smem, x_smem, s_off, w_off, g, sel,
                                         k, nan)  # fmt: skip
                        it += 1
                        ks += 1
                    if cutlass.const_expr(cfg.trip_groups > 2):
                        # more than two commit groups per trip: their A registers alternate only
                        # within the trip, so none may be in flight across the back edge
                        warpgroup.wait_group(0)
                if cutlass.const_expr(U == 2):
                    if ks < ks_end:
                        warpgroup.wait_group(0)
                        self.wgmma_stage(acc, it, ks, ks0, full, empty, side_base, w_smem, x_smem, s_off, w_off, g, sel,
                                         k, nan)  # fmt: skip
                        it += 1
                        ks += 1
                warpgroup.wait_group(0)
                cute.arch.mbarrier_arrive(empty + (it - 1) % S)
                if cutlass.const_expr(self.k.fp8):
                    self.k.nan_rows(nan, acc, PAIR_NAN_MASK)
                if cutlass.const_expr(cfg.tail_split):
                    # a unit cut between CTAs: the one that completes it stores it
                    if self.tail_gather(acc, sFlag, mWork, slot0, warp, lane, seg, su0, ks0, ks_end, n_kst, bx, by,
                                        n_tiles * n_pass, t_base, t_units, g_t) == 1:  # fmt: skip
                        self.store_segment(acc, sE, sFlag, mWork, slot0, lane, warp, seg, su0, u_lo, u_hi, total,
                                           n_ctas, n_kst, n_pass, n_tiles, batches, bx, by, row_start, row_end, x_base0,
                                           m_rows, n, gs, mXs, mOut)  # fmt: skip
                else:
                    self.store_segment(acc, sE, sFlag, mWork, slot0, lane, warp, seg, su0, u_lo, u_hi, total, n_ctas,
                                       n_kst, n_pass, n_tiles, batches, bx, by, row_start, row_end, x_base0, m_rows, n,
                                       gs, mXs, mOut)  # fmt: skip
                seg += stride
                if cutlass.const_expr(cfg.tail_split):
                    lo, hi, stride, in_tail, seg = self.k.ring_pipe.tail_enter(seg * n_kst, hi, stride, in_tail, seg, 0, t_lo, t_hi,
                                                                   n_kst)[:5]  # fmt: skip

    @cute.jit
    def store_segment(self, acc, sE, sFlag, mWork, slot0, lane, warp, seg, su0, u_lo, u_hi, total, n_ctas, n_kst,
                      n_pass, n_tiles, batches, bx, by, row_start, row_end, x_base0, m_rows, n, gs, mXs, mOut):  # fmt: skip
        """Store segment ``seg``'s outputs: staged (``staged_store``) or by ``end_segment``."""
        cfg = self.k.cfg
        if cutlass.const_expr(cfg.staged_store):
            tile, _, m0, x_base = self.k.ring_pipe.ring_segment(seg, n_pass, n_tiles, bx, by, row_start, x_base0, m_rows)
            self.store_staged(acc, sE, warp, lane, m0, row_end, x_base, tile * cfg.rows_per_cta, n, gs, mXs,
                              mOut)  # fmt: skip
        else:
            self.k.ring_pipe.end_segment(acc, None, sFlag, mWork, slot0, lane, 0, warp, warp, seg, su0, u_lo, u_hi, total,
                             n_ctas, n_kst, n_pass, n_tiles, batches, bx, by, row_start, row_end, x_base0, m_rows,
                             n, gs, mXs, mOut, False)  # fmt: skip

    @cute.jit
    def tail_gather(self, acc, sFlag, mWork, slot0, warp, lane, seg, su0, ks0, ks_end, n_kst, bx, by, n_seg, t_base,
                    t_units, g_t):  # fmt: skip
        """``tail_split``, the end of the CTA's piece (K stages ks0 .. ks_end) of segment ``seg``:
        1 if the CTA stores the segment (whole, or the contributor that completes it), else 0.
        A cut segment: every contributor writes its fp32 partial sums to its slot in ``mWork``
        (slot 0: the piece holding its first tail unit, 1: its last; the units between are whole
        segments), then one thread counts it in on the segment's counter (acq_rel, GPU scope).
        The CTA that completes the count (and resets the counter for the next launch) adds all
        the slots, in CTA order into zeroed accumulators, so the sum does not depend on who
        finishes: bitwise reproducible. No CTA waits for another. Layout of ``mWork`` as in
        :meth:`~cutegemm.blockscaled.weight_only.ring.RingPipeline.split_finish` (counters per
        (batch, segment), then 2 slots per (batch, CTA) from word ``slot0``)."""
        fin = cutlass.Int32(1)
        if ks0 > 0 or ks_end < n_kst:
            n_acc = self.k.cfg.n_tiles * 4
            bar = 32 * self.k.cfg.warps
            grid = cute.arch.grid_dim()[0]
            mWf = cute.make_tensor(cute.recast_ptr(mWork.iterator, dtype=cutlass.Float32), mWork.layout)
            s0 = su0 - t_base  # the segment's first unit in the tail
            c_first, c_last = self.k.ring_pipe.share_holders(s0, n_kst, g_t, t_units)
            my_lo = self.k.ring_pipe.share_start(bx, g_t, t_units)  # the CTA's first tail unit
            base = self.k.ring_pipe.slot_word(slot0, by * grid + bx, my_lo, s0, warp, lane)
            for v in cutlass.range_constexpr(n_acc):
                mWf[base + v * 32] = acc[self.k.acc_index(v)]
            cute.arch.fence_acq_rel_gpu()
            fin = self.k.ring_pipe.count_in(mWork, by * n_seg + seg, c_last - c_first, sFlag, warp == 0 and lane == 0, bar)
            if fin == 1:
                cute.arch.fence_acq_rel_gpu()
                acc.fill(0.0)
                for c in range(c_first, c_last + 1):
                    c_lo = self.k.ring_pipe.share_start(c, g_t, t_units)  # CTA c's first tail unit
                    word = self.k.ring_pipe.slot_word(slot0, by * grid + c, c_lo, s0, warp, lane)
                    addr = mWork.iterator.toint() + cutlass.Int64(word) * 4
                    for v in cutlass.range_constexpr(n_acc):
                        acc[self.k.acc_index(v)] += ld_global_cg_f32(addr + v * 128)
        return fin

    @cute.jit
    def store_staged(self, acc, sE, warp, lane, m0, row_end, x_base, tile_row0, n, gs, mXs, mOut):
        """``staged_store``: the pass's outputs (tokens m0.., weight rows tile_row0 .. + 127) in rounds
        of ``store_rows`` tokens: every consumer thread writes its scaled values of the round's
        tokens to the buffer (row: token, column: weight row), then reads 16 contiguous bytes of a
        token's row and stores them (tokens < row_end; rows < n as whole 16-byte pieces, n being a
        multiple of their values). N not such a multiple, or an unaligned output: the direct
        stores (:meth:`~cutegemm.blockscaled.weight_only.kernel.Fp4WeightKernel.store_fragment`)."""
        cfg = self.k.cfg
        esz = cfg.out_bytes
        V = 16 // esz  # values per 16-byte piece
        CT = cfg.store_rows
        RB = cfg.store_row_bytes
        PPR = 128 * esz // 16  # pieces per token row
        bar = 32 * cfg.warps
        g = lane // 4
        t = lane % 4
        tid = warp * 32 + lane
        out_addr = mOut.iterator.toint()
        if n % V == 0 and out_addr % 16 == 0:
            sEo = cute.make_tensor(cute.recast_ptr(sE.iterator, dtype=self.k.out_dtype),
                                   cute.make_layout((CT, 128), stride=(RB // esz, 1)))  # fmt: skip
            e_base = sE.iterator.toint()
            for c in cutlass.range_constexpr(cfg.n_tiles * 8 // CT):
                if m0 + c * CT < row_end:
                    for jj in cutlass.range_constexpr(CT // 8):
                        nt = c * (CT // 8) + jj
                        for i in cutlass.range_constexpr(2):
                            ml = 8 * jj + 2 * t + i  # the token's row in the buffer
                            xs = cutlass.Float32(1.0)
                            if cutlass.const_expr(cfg.x_scale):
                                m = cutlass.min(m0 + c * CT + ml, row_end - 1)  # (rows past the end: never stored)
                                xs = mXs[x_base + cutlass.Int64(m)]
                            for hr in cutlass.range_constexpr(2):
                                y = acc[0, nt, 2 * hr + i] * gs
                                if cutlass.const_expr(cfg.x_scale):
                                    y = y * xs
                                sEo[ml, 16 * warp + 8 * hr + g] = self.k.out_dtype(y)
                    self.k.sync(bar)
                    for q in cutlass.range_constexpr(CT * PPR // bar):
                        piece = tid + q * bar
                        row = piece // PPR
                        col = tile_row0 + (piece % PPR) * V
                        m = m0 + c * CT + row
                        words = ld_shared_v4(e_base + row * RB + (piece % PPR) * 16)
                        if m < row_end and col < n:
                            st_global_v4(out_addr + ((x_base + cutlass.Int64(m)) * cutlass.Int64(n) + cutlass.Int64(col)) * esz,
                                         words)  # fmt: skip
                    self.k.sync(bar)  # the buffer is rewritten by the next round
        else:
            self.k.store_fragment(acc, lane, m0, row_end, x_base, tile_row0 + 16 * warp, n, gs, mXs, mOut, False)

    @cute.jit
    def wgmma_stage(self, acc, it, ks, ks0, full, empty, side_base, w_smem, x_smem, s_off, w_off, g, sel, k, nan):
        """Ring stage ``it`` (K stage ``ks`` of the segment, whose first is ``ks0``): wait for it,
        read the rows' scale words, then its commit groups (:meth:`wgmma_group`); after the first group's
        wait for the group before, release the stage before."""
        cfg = self.k.cfg
        S = cfg.ring
        slot = it % S
        cute.arch.mbarrier_wait(full + slot, (it // S) % 2)
        st = side_base + slot * cfg.side_bytes
        sw = cute.make_rmem_tensor((2, cfg.scale_groups), cutlass.Int32)  # the rows' scale words
        for hr in cutlass.range_constexpr(2):
            for h in cutlass.range_constexpr(cfg.scale_groups):
                sw[hr, h] = ld_shared_b32(st + h * 512 + s_off[hr])
        x_stage = x_smem + slot * (cfg.x_boxes * cfg.x_box_bytes)
        for grp in cutlass.range_constexpr(cfg.stage_steps // cfg.group_steps):
            self.wgmma_group(acc, grp, w_smem + slot * (cfg.w_boxes * cfg.w_box_bytes), x_stage, sw, w_off, g, sel, ks,
                             k, nan)  # fmt: skip
            if grp == 0 and ks > ks0:
                # the previous stage's MMAs are done (wait_group(1) above): release it
                cute.arch.mbarrier_arrive(empty + (it - 1) % S)

    @cute.jit
    def wgmma_group(self, acc, grp: cutlass.Constexpr, w_box, x_stage, sw, w_off, g, sel, ks, k, nan):
        """Commit group ``grp`` of a ring stage (``group_steps`` k16 steps: 8 = 128 K, or 4): the
        rows' 16-byte weight reads and their scale factors, the steps' A fragments (dequantized,
        natural K pairs), then one fence, the WGMMAs, a commit and a wait for the group before (its
        A registers and, at a stage's first group, the stage before are then free)."""
        cfg = self.k.cfg
        T = cfg.tokens_per_pass
        XB = cfg.x_box_bytes
        NT = cfg.n_tiles
        G = cfg.group_steps
        k0 = ks * (cfg.ring_k * cfg.chunk_k)  # the stage's first K value
        a = cute.make_rmem_tensor((G, 4), cutlass.Int32)  # A fragments of the group's steps
        if cutlass.const_expr(self.k.fp8):
            self.fp8_fragments(a, grp, w_box, sw, w_off, g, sel, k0, k, nan)
        for pp in cutlass.range_constexpr(0 if self.k.fp8 else G // 2):
            p = (G // 2) * grp + pp  # 16-byte piece of the stage's weight rows: 32 K, steps 2 p and 2 p + 1
            f = cute.make_rmem_tensor((2, 2), cutlass.Int32)  # bf16x2 factors: (row, k16 step)
            for hr in cutlass.range_constexpr(2):
                live = k0 + 32 * p < k  # past K: unit scales (the weights and activations are zeros)
                if cutlass.const_expr(self.k.mx):
                    e = cutlass.select_(live, (sw[hr, p // 4] >> (8 * (p % 4))) & 0xFF, cutlass.Int32(127))
                    f[hr, 0] = mx_factor_bf16x2(e)
                    f[hr, 1] = f[hr, 0]
                else:
                    pair = cutlass.select_(live, (sw[hr, p // 2] >> (16 * (p % 2))) & 0xFFFF, cutlass.Int32(0x3838))
                    fac = nvfp4_factors(pair)
                    f[hr, 0] = fac[0]
                    f[hr, 1] = fac[1]
            wds = [ld_shared_v4(w_box + w_off[hr] + self.w_piece(p, g)) for hr in range(2)]
            for s in cutlass.range_constexpr(2):
                # A of step 2 pp + s: rows (g, g + 8) x K pairs (2 t, 2 t + 1) of word 2 s and
                # (2 t + 8, 2 t + 9) = the same byte of word 2 s + 1
                for q in cutlass.range_constexpr(4):
                    a[2 * pp + s, q] = dequant_fp4_byte(wds[q % 2][2 * s + q // 2], sel, f[q % 2, s], self.k.mx)
        desc0 = smem_desc_sw128(x_stage)  # (both formats: 256 K per stage, four activation boxes)
        warpgroup.fence()
        for jj in cutlass.range_constexpr(G):
            j = G * grp + jj  # k16 step of the stage: activation box j // 4, bytes 32 (j % 4) of its rows
            desc = desc0 + cutlass.Int64(((j // 4) * XB + (j % 4) * 32) >> 4)
            d = wgmma_rs_bf16([acc[0, i // 4, i % 4] for i in range(T // 2)], [a[jj, q] for q in range(4)], desc, T)
            for i in cutlass.range_constexpr(NT * 4):
                acc[0, i // 4, i % 4] = d[i]
        warpgroup.commit_group()
        warpgroup.wait_group(1)

    def w_piece(self, p, g):
        """Byte offset, in weight row r (r % 8 = g: rows g and g + 8 alike), of its swizzled
        16-byte piece p (:meth:`~cutegemm.blockscaled.weight_only.ring.RingPipeline.w_smem_layout`):
        the 128-byte swizzle XORs p with r % 8, the 64-byte one (``ring_k`` 1) with r // 2 % 4."""
        if cutlass.const_expr(self.k.cfg.w_row_bytes == 64):
            return (p ^ ((g >> 1) & 3)) * 16
        return (p ^ g) * 16

    @cute.jit
    def fp8_fragments(self, a, grp: cutlass.Constexpr, w_stage, sw, w_off, g, sel, k0, k, nan):
        """8-bit weights: the A fragments of commit group ``grp`` (steps j = G grp .. G grp + G - 1
        of the stage; step j is 16-byte piece p = j % 8 of box half = j // 8 of the stage's 128-K
        weight boxes): per row (g, g + 8) one 16-byte read, the
        K pairs (2 t, 2 t + 1) from words 0-1 and (2 t + 8, 2 t + 9) from words 2-3 (one PRMT of
        the two words each, ``dequant_e4m3_pair``), times the MX factor of the piece's 32-K block
        (column 4 half + p // 2 of the stage: byte p // 2 of the row's word of group ``half``)."""
        G = self.k.cfg.group_steps
        for jj in cutlass.range_constexpr(G):
            j = G * grp + jj
            half = j // 8
            p = j % 8
            box = w_stage + half * self.k.cfg.w_box_bytes
            live = k0 + 128 * half + 16 * p < k  # past K: unit scales (the weights and activations are zeros)
            f = cute.make_rmem_tensor((2,), cutlass.Int32)
            col = p // 2  # the piece's 32-K block in the scale group (a stage sharing it: offset by its K)
            spg = self.k.cfg.stages_per_scale_group
            if cutlass.const_expr(spg > 1):
                col = ((k0 // self.k.cfg.stage_k) % spg) * (4 // spg) + p // 2
            for hr in cutlass.range_constexpr(2):
                e = cutlass.select_(live, (sw[hr, half] >> (8 * col)) & 0xFF, cutlass.Int32(127))
                f[hr] = mx_factor_bf16x2(e)
            wds = [ld_shared_v4(box + w_off[hr] + self.w_piece(p, g)) for hr in range(2)]
            for q in cutlass.range_constexpr(4):
                hr = q % 2
                w0 = 2 * (q // 2)  # words 0-1: K 2 t, 2 t + 1; words 2-3: K 2 t + 8, 2 t + 9
                dq = dequant_e4m3_pair(wds[hr][w0], wds[hr][w0 + 1], sel, f[hr], nan[0, hr])
                a[jj, q] = dq[0]
                nan[0, hr] = dq[1]
