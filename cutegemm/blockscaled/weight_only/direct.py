"""The per-thread pipelines of the FP4-weight kernel (``Fp4WeightConfig.ring`` = 0, the first
pipeline of this family), a part of :class:`~cutegemm.blockscaled.weight_only.kernel.Fp4WeightKernel`.

Every thread loads its own weight pieces (16 bytes of a weight row per 128-wide K chunk, L1
bypassed: they are read once) and scale bytes, prefetched one chunk ahead in registers
(``stages=0``) or through a per-warp cp.async ring (``stages`` deep). Activations are re-read by
every warp through L1 in a fragment order prepared on the host (``fragment_order_x``: one small
copy of x per call, ~5 us on the H200), so a warp's activation load is 512 contiguous bytes.
Grid: (N / rows per CTA, 1 or E, m-slices).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import memory

from ...runtime.ptx import (
    cp_async,
    cp_async_commit,
    cp_async_wait,
    ld_global_u8,
    ld_global_u16,
    ld_global_v4_stream,
    ld_shared_b32,
    ld_shared_v4,
)
from .math import CHUNK_K

__all__ = ["DirectPipeline"]


class DirectPipeline:
    """:meth:`kernel` (per-thread loads) and its load helpers."""

    def __init__(self, kernel):
        self.k = kernel  # the kernel this part belongs to (its config, layouts, tiles)

    def launch_direct(self, mX, mW, mS, mOut, mOffs, mGs, mXs, m_rows, n, k, batches, m_slices, tile_stride, alpha,
                      stream):  # fmt: skip
        """Host side of :meth:`kernel` (traced inside ``Fp4WeightKernel.__call__``)."""
        grid_x = (n + self.k.cfg.rows_per_cta - 1) // self.k.cfg.rows_per_cta
        self.kernel(mX, mW, mS, mOut, mOffs, mGs, mXs, m_rows, n, k, m_slices, tile_stride, alpha).launch(
            grid=[grid_x, batches, m_slices], block=[32 * self.k.cfg.warps, 1, 1], stream=stream,
            min_blocks_per_mp=self.k.min_blocks, preferred_smem_carveout=100 if self.k.min_blocks > 1 else None,
        )

    @cute.kernel
    def kernel(self, mX, mW, mS, mOut, mOffs, mGs, mXs, m_rows, n, k, m_slices, tile_stride, alpha):
        cfg = self.k.cfg
        RT, NT, RW, KW = cfg.row_tiles, cfg.n_tiles, cfg.warps_n, cfg.warps_k
        tidx, _, _ = cute.arch.thread_idx()
        bx, batch, slice_ = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        rw = warp % RW  # row group
        kg = warp // RW  # K group: chunks kg, kg + KW, ...
        g = lane // 4
        t = lane % 4
        n_p, cols_p = self.k.scale_dims(n, k)
        # rows of tokens this CTA reads: a batch of the dense form, an expert's segment of offs
        row_start, row_end, x_base = self.k.token_range(mOffs, m_rows, batch)
        gs = self.k.out_scale(mGs, alpha)

        # Byte addresses. Weight row r, chunk c, thread t: 16 bytes at r * K/2 + 64 c + 16 t.
        # Its scales (128x4 swizzled): tile row r // 128, in-tile (r % 32) * 16 + (r // 32 % 4) * 4,
        # column kk // vec of K value kk = 128 c + 32 t: NVFP4 (2c + t // 2) * 512 + 2 (t % 2)
        # (two scales, 16 K each), MXFP4 c * 512 + t.
        row0 = bx * cfg.rows_per_cta + rw * (16 * RT)
        # per-row byte offsets (32-bit: one weight matrix is < 2 GiB) from 64-bit batch bases
        w_addr = cute.make_rmem_tensor((RT, 2), cutlass.Int32)
        s_addr = cute.make_rmem_tensor((RT, 2), cutlass.Int32)
        w_base = mW.iterator.toint() + cutlass.Int64(batch) * cutlass.Int64(n) * cutlass.Int64(k // 2)
        s_base = self.k.scales_base(mS, batch, n_p, cols_p)
        for rt in cutlass.range_constexpr(RT):
            for hr in cutlass.range_constexpr(2):
                r = cutlass.min(row0 + 16 * rt + 8 * hr + g, n - 1)  # rows past N: never stored
                w_addr[rt, hr] = r * (k // 2) + 16 * t
                in_tile = self.k.scale_in_tile(r, t)
                s_addr[rt, hr] = (r // 128) * tile_stride + in_tile
        # activations in the fragment order of ``fragment_order_x`` (host): 16 bytes of token m,
        # thread t, step j of chunk c at ((4 c + j) * rows + m) * 64 + 16 t
        x_addr = cute.make_rmem_tensor((NT,), cutlass.Int32)
        x_ptr = mX.iterator.toint()
        x_plane = m_rows * 64
        acc = cute.make_rmem_tensor((RT, NT, 4), cutlass.Float32)
        rW = cute.make_rmem_tensor((RT, 2, 4), cutlass.Int32)  # raw e2m1 words of the current chunk
        rS = cute.make_rmem_tensor((RT, 2), cutlass.Int32)  # its raw scale bytes
        nW = cute.make_rmem_tensor((RT, 2, 4), cutlass.Int32)  # the next chunk's (prefetch)
        nS = cute.make_rmem_tensor((RT, 2), cutlass.Int32)
        n_acc = RT * NT * 4
        sRed = None
        if cutlass.const_expr(KW > 1):
            # partial sums of K groups 1.. for group 0: (value, lane, row group, K group - 1)
            sRed = memory.SmemAllocator().allocate_tensor(
                cutlass.Float32, cute.make_layout((n_acc, 32, RW, KW - 1), stride=(32, 1, 32 * n_acc, 32 * n_acc * RW)), 16
            )
        D = cfg.stages
        ring_w = cutlass.Int32(0)
        ring_s = cutlass.Int32(0)
        if cutlass.const_expr(D > 0):
            # per warp: D stages x (2 RT) pieces x 32 lanes x 16 bytes (weights), x 4 bytes (scales)
            sRing = memory.SmemAllocator().allocate_tensor(
                cutlass.Int32, cute.make_layout(cfg.warps * D * 2 * RT * 32 * 5), 16
            )
            ring_w = sRing.iterator.toint() + warp * (D * 2 * RT * 512) + lane * 16
            ring_s = sRing.iterator.toint() + cfg.warps * (D * 2 * RT * 512) + warp * (D * 2 * RT * 128) + lane * 4
        full_chunks = k // CHUNK_K
        my_chunks = cutlass.max(full_chunks - kg + KW - 1, 0) // KW  # kg, kg + KW, ... < full_chunks
        tail_group = full_chunks % KW

        m_chunk = slice_ * (8 * NT)
        while row_start + m_chunk < row_end:
            m0 = row_start + m_chunk
            for nt in cutlass.range_constexpr(NT):
                m = cutlass.min(m0 + nt * 8 + g, row_end - 1)  # tokens past the end: never stored
                x_addr[nt] = m * 64 + 16 * t
            acc.fill(0.0)
            if cutlass.const_expr(D > 0):
                # cp.async ring: chunk i of this warp in stage i % D, D chunks in flight. Each
                # thread reads back only the bytes it copied itself, so waiting for its own
                # groups is enough (no barrier).
                for st in cutlass.range_constexpr(D):
                    if st < my_chunks:
                        self.issue_chunk(kg + st * KW, st, w_base, s_base, w_addr, s_addr, ring_w, ring_s)
                    cp_async_commit()
                for i in cutlass.range(my_chunks, unroll=1):
                    st = i % D
                    cp_async_wait(D - 1)
                    for rt in cutlass.range_constexpr(RT):
                        for hr in cutlass.range_constexpr(2):
                            p = rt * 2 + hr
                            words = ld_shared_v4(ring_w + (st * (2 * RT) + p) * 512)
                            for q in cutlass.range_constexpr(4):
                                rW[rt, hr, q] = words[q]
                            sw = ld_shared_b32(ring_s + (st * (2 * RT) + p) * 128)
                            if cutlass.const_expr(self.k.mx):
                                rS[rt, hr] = (sw >> (8 * t)) & 0xFF
                            else:
                                rS[rt, hr] = (sw >> (16 * (t % 2))) & 0xFFFF
                    self.k.mma_chunk(kg + i * KW, rW, rS, x_ptr, x_addr, x_plane, acc)
                    if i + D < my_chunks:  # refill this stage (its bytes are in registers now)
                        self.issue_chunk(kg + (i + D) * KW, st, w_base, s_base, w_addr, s_addr, ring_w, ring_s)
                    cp_async_commit()
                cp_async_wait(0)
            else:
                if my_chunks > 0:
                    self.load_chunk(kg, w_base, s_base, w_addr, s_addr, nW, nS, True, False)
                for i in cutlass.range(my_chunks, unroll=1):
                    c = kg + i * KW
                    for rt in cutlass.range_constexpr(RT):
                        for hr in cutlass.range_constexpr(2):
                            rS[rt, hr] = nS[rt, hr]
                            for q in cutlass.range_constexpr(4):
                                rW[rt, hr, q] = nW[rt, hr, q]
                    if i + 1 < my_chunks:  # prefetch the next chunk under this one's math
                        self.load_chunk(c + KW, w_base, s_base, w_addr, s_addr, nW, nS, True, False)
                    self.k.mma_chunk(c, rW, rS, x_ptr, x_addr, x_plane, acc)
            if full_chunks * CHUNK_K < k:  # K % 128: threads past K contribute zeros
                if kg == tail_group:
                    live = full_chunks * CHUNK_K + 32 * t < k
                    self.load_chunk(full_chunks, w_base, s_base, w_addr, s_addr, rW, rS, live, True)
                    self.k.mma_chunk(full_chunks, rW, rS, x_ptr, x_addr, x_plane, acc)
            self.k.finish_pass(acc, sRed, lane, kg, rw, m0, row_end, x_base, row0, n, gs, mXs, mOut, 0)
            m_chunk += m_slices * (8 * NT)

    @cute.jit
    def issue_chunk(self, c, st, w_base, s_base, w_addr, s_addr, ring_w, ring_s):
        """cp.async this thread's pieces of K chunk ``c`` into ring stage ``st``: 16 bytes per
        weight row, and the aligned 4-byte group holding its scale(s)."""
        RT = self.k.cfg.row_tiles
        t = cute.arch.lane_idx() % 4
        s_off = (c * 512 - t) if self.k.mx else (c * 1024 - 2 * (t % 2))
        for rt in cutlass.range_constexpr(RT):
            for hr in cutlass.range_constexpr(2):
                p = rt * 2 + hr
                cp_async(ring_w + (st * (2 * RT) + p) * 512, w_base + cutlass.Int64(w_addr[rt, hr] + c * 64), 16, self.k.cfg.l2_prefetch)
                cp_async(ring_s + (st * (2 * RT) + p) * 128, s_base + cutlass.Int64(s_addr[rt, hr] + s_off), 4)

    @cute.jit
    def load_chunk(self, c, w_base, s_base, w_addr, s_addr, rW, rS, live, masked: cutlass.Constexpr):
        """Issue the loads of K chunk ``c``: this thread's 16 bytes of each of its weight rows and
        their raw scale bytes (NVFP4: two e4m3, MXFP4: one e8m0). ``masked``: the K tail, where
        a thread without K values (``live`` false) reads its row's first piece (in bounds) and
        keeps zeros / scale 1."""
        RT = self.k.cfg.row_tiles
        t = cute.arch.lane_idx() % 4
        w_off = c * 64
        s_off = c * 512 if self.k.mx else c * 1024
        if cutlass.const_expr(masked):
            w_off = cutlass.select_(live, w_off, -16 * t)
            s_off = cutlass.select_(live, s_off, -t if self.k.mx else -(t // 2) * 512 - 2 * (t % 2))
        for rt in cutlass.range_constexpr(RT):
            for hr in cutlass.range_constexpr(2):
                words = ld_global_v4_stream(w_base + cutlass.Int64(w_addr[rt, hr] + w_off), self.k.cfg.l2_prefetch)
                for q in cutlass.range_constexpr(4):
                    rW[rt, hr, q] = words[q]
                    if cutlass.const_expr(masked):
                        rW[rt, hr, q] = cutlass.select_(live, words[q], cutlass.Int32(0))
        for rt in cutlass.range_constexpr(RT):
            for hr in cutlass.range_constexpr(2):
                if cutlass.const_expr(self.k.mx):
                    rS[rt, hr] = ld_global_u8(s_base + cutlass.Int64(s_addr[rt, hr] + s_off))
                    if cutlass.const_expr(masked):
                        rS[rt, hr] = cutlass.select_(live, rS[rt, hr], cutlass.Int32(self.k.unit_scale))
                else:
                    rS[rt, hr] = ld_global_u16(s_base + cutlass.Int64(s_addr[rt, hr] + s_off))
                    if cutlass.const_expr(masked):
                        rS[rt, hr] = cutlass.select_(live, rS[rt, hr], cutlass.Int32(self.k.unit_scale))
