"""FP4 weights x bf16 activations (W4A16; FP8 activations are converted to bf16 exactly on the
host, their per-token scale applied in the kernel) for decode: ``x @ dequantize(qw).T`` without ever
writing a dequantized weight to memory. Dense ``(M, K) x (N, K)`` and grouped (MoE, the packed
``offs`` form: ``x`` (total_M, K), ``qw`` (E, N, K)). NVFP4 (e4m3 scales per 16, fp32 global
scale) and MXFP4 (e8m0 scales per 32). CuTe DSL, arch-neutral: warp-level ``mma.sync`` bf16
tensor-core MMAs and plain vector loads, so the same code runs on sm_90a and sm_100a.

Decode is bound by reading the weights (4.5 bits per element instead of 16), so the kernel is
built around streaming them once at full bandwidth:

* The MMA computes ``out^T = W . x^T`` with W as the 16-row A operand (``m16n8k16``) and the
  tokens as the 8-column B operand (1..8 n8 tiles per pass; the host policy uses up to 4, i.e.
  32 tokens per pass over a CTA's weight rows, more tokens take more passes, mostly from L2).
* Each thread turns 16 bytes (32 e2m1 values) of a weight row per 128-wide K chunk into A
  fragments itself (read from the ring's shared memory, or loaded straight into registers). The
  order of K inside an MMA is free as long as both operands agree: the 8 nibbles of a 32-bit word
  are paired as (k, k+4), which makes the e2m1 -> bf16 conversion two shifts and masks per pair;
  the activations get the same pairing from four PRMTs per 16-byte piece (the ring) or from a
  host-side reorder (the per-thread pipelines).
* e2m1 -> bf16 is exact: the nibble's magnitude bits land in the bf16 exponent/mantissa so that
  the bf16 value is ``e2m1 * 2**-126`` (the 0.5 code is a bf16 subnormal, which bf16 arithmetic
  keeps), and one packed bf16 multiply by ``scale * 2**118`` (NVFP4; exact: an e4m3 scale times
  an e2m1 value has <= 6 significant bits) gives ``w * scale * 2**-8``; the 2**8 and the global
  scale are applied to the fp32 accumulators at the end. MXFP4 (scales 2**-127 .. 2**127) takes
  two multiplies, by 2**126 then by the scale, so no intermediate over/underflows.

Two ways to feed the math (``Fp4WeightConfig.ring``), each a part of :class:`Fp4WeightKernel`:

* the streaming ring (``ring`` > 0, the host policy's choice): :mod:`.ring`;
* per-thread loads (``ring`` = 0, the first pipeline): :mod:`.direct`.

MXFP8 weights (``fmt="mxfp8"``: e4m3 elements, e8m0 scales per 32; ring only) take the same
ring with a byte per K value: a 64-byte chunk of a weight row holds 64 K values (``chunk_k``),
a thread's 16 bytes dequantize in K order (``weight_only.math.dequant_e4m3x4``: PRMT with sign
replication, a shift and a mask put the byte's bits into bf16 as the value x 2**-120, then two
packed multiplies, by 2**120 and by the scale), so the activations need no pairing: word j of a
row is one m16n8k16 MMA's K (2 t, 2 t + 1), (2 t + 8, 2 t + 9) against the activations' same 8
bytes (:meth:`Fp4WeightKernel.mma_chunk_fp8`). The placement makes the e4m3 NaN code finite, so
the consumers keep per-row NaN flags and write NaN into the rows that had one (``nan_rows``).

On sm_90a the ring also feeds warpgroup-MMA consumers (``Fp4WeightConfig.wgmma``,
:mod:`.weight_only.wgmma`): the tokens are the MMA's N (up to 128) and the activations are read by the
MMA from shared memory, so a dequantized weight serves every token of the pass; the host policy
takes them from 17 rows (33 per expert). Everything below describes the ``mma.sync`` consumers.

A CTA has warps_n x warps_k consumer warps: warps_n groups of weight rows (16 * row_tiles each),
and the K chunks of a row dealt round-robin to warps_k warps whose partial sums meet in shared
memory (:meth:`Fp4WeightKernel.finish_pass`). The token rows of the CTA's batch / expert are
processed in passes of 8 * n_tiles. Grouped: a CTA reads its expert's row range from ``offs`` on
the device (clamped like the bf16 grouped path; no host sync, CUDA-graph safe) and an expert
with no rows costs nothing. The register math (dequantization, scale decodes, the MMA wrapper,
the activation pairing / reorder) and its torch twins live in :mod:`.weight_only.math`. This module: the
config, the kernel class (host entry, shared fragment math, pass finishing), compile glue.
"""

from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

from ...runtime.cache import KernelCache
from ...runtime.ptx import ld_global_v4, ld_shared_v4
from ...runtime.sass import check_sass, wgmma_register_a_hazards
from .config import FORMATS, Fp4WeightConfig
from .direct import DirectPipeline
from .math import (
    WORD_NAN_MASK,
    dequant_e4m3x4,
    dequant_fp4x8,
    mma_bf16_16816,
    mx_factor_bf16x2,
    nvfp4_factors,
    pair_natural_x,
)
from .policy import pick_config
from .ring import RingPipeline
from .wgmma import WgmmaPipeline

__all__ = ["Fp4WeightConfig", "all_configs", "check_variant", "build_fp4_weight", "SASS_REQUIRED"]

OUT_DTYPES = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16, "fp32": cutlass.Float32}
SASS_REQUIRED = {
    "HMMA.16816.F32.BF16": r"\bHMMA\.16816\.F32\.BF16\b",
    "LDG.128": r"\bLDG\.E[.A-Z0-9_:]*\.128",
}
RING_SASS_REQUIRED = {
    "HMMA.16816.F32.BF16": SASS_REQUIRED["HMMA.16816.F32.BF16"],
    "UTMALDG": r"\bUTMALDG\b",  # TMA boxes of weight rows and activations
    "UBLKCP.S.G": r"\bUBLKCP\.S\.G\b",  # cp.async.bulk global -> shared (the scales)
    "LDS.128": r"\bLDS\.128\b",
}
WGMMA_SASS_REQUIRED = {
    "HGMMA.64xNx16.F32.BF16": r"\bHGMMA\.64x\d+x16\.F32\.BF16\b",  # the warpgroup MMA, A from registers
    **{key: RING_SASS_REQUIRED[key] for key in ("UTMALDG", "UBLKCP.S.G", "LDS.128")},
}
SASS_FORBIDDEN = {"LDL": r"\bLDL(\.|\s)", "STL": r"\bSTL(\.|\s)"}


class Fp4WeightKernel:
    """The FP4-weight kernel: the host entry (``__call__``), the pipelines (:mod:`.weight_only.ring`,
    :mod:`.weight_only.direct`) and the fragment math and pass finishing they share."""

    def __init__(self, cfg: Fp4WeightConfig):
        self.cfg = cfg
        # The consumer pipelines, parts of this kernel (``self.k``); cfg.ring / cfg.wgmma pick one.
        self.ring_pipe = RingPipeline(self)  # weight stages by cp.async.bulk / TMA into a ring
        self.wgmma_pipe = WgmmaPipeline(self)  # sm_90a: the ring's stages consumed by WGMMA
        self.direct_pipe = DirectPipeline(self)  # mma.sync fed by cp.async per chunk
        self.mx = cfg.fmt in ("mxfp4", "mxfp8")  # e8m0 scales, one per 32 K
        self.fp8 = cfg.fp8
        self.out_dtype = OUT_DTYPES[cfg.out_dtype]
        self.min_blocks = cfg.min_blocks

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,  # (total_M * K / 2,) int32: bf16 activations, row-major, pairs
        mW: cute.Tensor,  # (L * N * K / 8,) int32: packed e2m1, row-major (L, N, K)
        mS: cute.Tensor,  # (scale bytes,) uint8: swizzled 128x4 scales, (L, N_p, cols_p)
        mOut: cute.Tensor,  # (total_M * N,) output, row-major
        mOffs: cute.Tensor,  # (E,) int32 cumulative end rows (grouped; dense: unused)
        mGs: cute.Tensor,  # (1,) fp32 global scale (NVFP4) or 1
        mXs: cute.Tensor,  # (rows,) fp32 per-token scales of FP8 activations (x_scale) or unused
        mWork: cute.Tensor,  # split: (Int32) per-segment counters (zero), partial-sum slots from word slot0
        m_rows: cutlass.Int32,  # dense: M per batch; grouped: total_M
        n: cutlass.Int32,
        k: cutlass.Int32,
        batches: cutlass.Int32,  # L (dense) or E (grouped)
        m_slices: cutlass.Int32,
        n_ctas: cutlass.Int32,  # split: the persistent grid's CTA count
        slot0: cutlass.Int32,  # split: first word of the slots in mWork (>= the segment count)
        tile_stride: cutlass.Int32,  # scale bytes per 128-row tile row
        alpha: cutlass.Float32,
        stream,
    ):
        if cutlass.const_expr(self.cfg.ring > 0):
            self.ring_pipe.launch_ring(mX, mW, mS, mOut, mOffs, mGs, mXs, mWork, m_rows, n, k, batches, n_ctas, slot0,
                             tile_stride, alpha, stream)  # fmt: skip
        else:
            self.direct_pipe.launch_direct(mX, mW, mS, mOut, mOffs, mGs, mXs, m_rows, n, k, batches, m_slices, tile_stride,
                               alpha, stream)  # fmt: skip

    @cute.jit
    def sync(self, bar_threads: cutlass.Constexpr):
        """All threads of the CTA (0) or the ``bar_threads`` consumer threads (named barrier 1)."""
        if cutlass.const_expr(bar_threads == 0):
            cute.arch.sync_threads()
        else:
            cute.arch.barrier(barrier_id=1, number_of_threads=bar_threads)

    @cute.jit
    def finish_pass(self, acc, sRed, lane, kg, rw, m0, row_end, x_base, row0, n, gs, mXs, mOut,
                    bar_threads: cutlass.Constexpr, permuted: cutlass.Constexpr = False):  # fmt: skip
        """End of one token pass: the K groups' partial sums meet in shared memory (``sRed``),
        K group 0 scales and stores its fragment (tokens < row_end, weight rows < n). ``lane``
        comes from the caller (recomputing it here cost a register spill in :meth:`kernel`).
        ``permuted``: MMA row g holds weight row g // 2 + 4 (g % 2) (:meth:`kernel_ring`)."""
        self.reduce_k_groups(acc, sRed, lane, kg, rw, bar_threads)
        if kg == 0:
            self.store_fragment(acc, lane, m0, row_end, x_base, row0, n, gs, mXs, mOut, permuted)
        if cutlass.const_expr(self.cfg.warps_k > 1):
            self.sync(bar_threads)  # sRed is rewritten by the next pass

    def acc_index(self, v: int) -> tuple:
        """The (rt, nt, q) register of flat accumulator index v (the order of ``sRed`` and of the
        split grid's partial-sum slots)."""
        NT = self.cfg.n_tiles
        return v // (NT * 4), (v // 4) % NT, v % 4

    @cute.jit
    def reduce_k_groups(self, acc, sRed, lane, kg, rw, bar_threads: cutlass.Constexpr):
        """K groups 1.. add their partial sums into K group 0's ``acc`` through ``sRed``."""
        cfg = self.cfg
        RT, NT, KW = cfg.row_tiles, cfg.n_tiles, cfg.warps_k
        n_acc = RT * NT * 4
        if cutlass.const_expr(KW > 1):
            if kg > 0:
                for v in cutlass.range_constexpr(n_acc):
                    sRed[v, lane, rw, kg - 1] = acc[self.acc_index(v)]
            self.sync(bar_threads)
            if kg == 0:
                for kk in cutlass.range_constexpr(KW - 1):
                    for v in cutlass.range_constexpr(n_acc):
                        acc[self.acc_index(v)] += sRed[v, lane, rw, kk]

    @cute.jit
    def store_fragment(self, acc, lane, m0, row_end, x_base, row0, n, gs, mXs, mOut, permuted: cutlass.Constexpr):
        """out[m, n] = acc x gs (x the token's scale): acc (rt, nt, 2 hr + i) is weight row
        row0 + 16 rt + 8 hr + g, token m0 + 8 nt + 2 t + i; tokens < row_end, rows < n."""
        cfg = self.cfg
        RT, NT = cfg.row_tiles, cfg.n_tiles
        g = lane // 4
        t = lane % 4
        if cutlass.const_expr(permuted):
            g = g // 2 + 4 * (g % 2)
        for rt in cutlass.range_constexpr(RT):
            for hr in cutlass.range_constexpr(2):
                col_n = row0 + 16 * rt + 8 * hr + g
                for nt in cutlass.range_constexpr(NT):
                    for i in cutlass.range_constexpr(2):
                        m = m0 + nt * 8 + 2 * t + i
                        if m < row_end:
                            if col_n < n:
                                y = acc[rt, nt, 2 * hr + i] * gs
                                if cutlass.const_expr(cfg.x_scale):
                                    y = y * mXs[x_base + cutlass.Int64(m)]
                                v = self.out_dtype(y)
                                mOut[(x_base + cutlass.Int64(m)) * cutlass.Int64(n) + cutlass.Int64(col_n)] = v

    @property
    def unit_scale(self) -> int:
        """The raw scale byte(s) of 1.0 (K values past K get it with zero weights): e8m0 127,
        NVFP4 two e4m3 0x38."""
        return 127 if self.mx else 0x3838

    @cute.jit
    def out_scale(self, mGs, alpha):
        """What the fp32 accumulators are multiplied by: global scale x alpha (x 2**8 for NVFP4,
        whose factors carry 2**-8, module docstring)."""
        gs = mGs[0] * alpha
        if cutlass.const_expr(not self.mx):
            gs = gs * cutlass.Float32(256.0)
        return gs

    def scale_dims(self, n, k):
        """(N_p, cols_p) of one batch's 128x4-swizzled scales: rows padded to 128, scale columns
        (one per 32 K for MXFP4, 16 for NVFP4) padded to 4."""
        vec = 32 if self.mx else 16
        return (n + 127) // 128 * 128, ((k + vec - 1) // vec + 3) // 4 * 4

    def scales_base(self, mS, batch, n_p, cols_p):
        """64-bit address of batch ``batch``'s scales (``scale_dims`` gives N_p, cols_p)."""
        return mS.iterator.toint() + cutlass.Int64(batch) * cutlass.Int64(n_p) * cutlass.Int64(cols_p)

    def scale_in_tile(self, r, t):
        """Offset, in row r's 128-row scale tile, of thread t's scale byte(s) of a K chunk's first
        column group: (r % 32) * 16 + (r // 32 % 4) * 4, plus the column of thread t's first K
        value (MXFP4 t; NVFP4 (t // 2) * 512 + 2 (t % 2), two scales of 16 K; MXFP8 t // 2).
        Chunk c adds :meth:`scale_chunk_offset`."""
        in_tile = (r % 32) * 16 + ((r // 32) % 4) * 4
        if cutlass.const_expr(self.fp8):
            in_tile += t // 2  # thread t's 16 K values of a 64-wide chunk: column t // 2
        elif cutlass.const_expr(self.mx):
            in_tile += t
        else:
            in_tile += (t // 2) * 512 + 2 * (t % 2)
        return in_tile

    def scale_chunk_offset(self, c: int) -> int:
        """Offset of chunk ``c``'s scale bytes from chunk 0's (:meth:`scale_in_tile`; a 512-byte
        group holds 4 columns): MXFP4 c * 512, NVFP4 c * 1024, MXFP8 (two columns per 64-wide
        chunk) (c // 2) * 512 + 2 (c % 2)."""
        if self.fp8:
            return (c // 2) * 512 + 2 * (c % 2)
        return c * (512 if self.mx else 1024)

    @cute.jit
    def token_range(self, mOffs, m_rows, batch):
        """(row_start, row_end, x_base): the token rows this CTA multiplies (a batch of the dense
        form, an expert's segment of offs) and the batch's first token row (dense)."""
        row_start = cutlass.Int32(0)
        row_end = m_rows
        x_base = cutlass.Int64(0)
        if cutlass.const_expr(self.cfg.grouped):
            # expert e: rows [clamp(offs[e-1]), max(clamp(offs[e]), start)), clamp into
            # [0, total_M] (schedulers.grouped.expert_rows): bad offs stay memory-safe
            if batch > 0:
                row_start = cutlass.min(cutlass.max(mOffs[batch - 1], 0), m_rows)
            row_end = cutlass.max(cutlass.min(cutlass.max(mOffs[batch], 0), m_rows), row_start)
        else:
            x_base = cutlass.Int64(batch) * cutlass.Int64(m_rows)
        return row_start, row_end, x_base

    @cute.jit
    def mma_chunk(self, c, rW, rS, x_ptr, x_addr, x_plane, acc, x_mode: cutlass.Constexpr = "global"):
        """Dequantize chunk ``c`` (loaded by :meth:`load_chunk`) and multiply it with the tokens'
        K values into ``acc`` (the activations are zero-padded to whole chunks). ``x_mode``
        "global": fragment-ordered activations (``fragment_order_x``) in global memory, plane
        ``4 c + j`` at ``x_ptr + x_addr[nt] + (4 c + j) * x_plane``; "swizzled": the chunk's two
        activation boxes of a ring stage (:meth:`kernel_ring`), K in order, piece j of token
        8 nt + g at ``x_ptr + x_addr[nt] + (x_plane ^ 16 j)``, paired here; "paired": the same,
        already paired by the producer."""
        RT, NT = self.cfg.row_tiles, self.cfg.n_tiles
        rF = cute.make_rmem_tensor((RT, 2, 2), cutlass.Int32)  # bf16x2 scale factors (per 16 K)
        rA = cute.make_rmem_tensor((RT, 2, 4), cutlass.Int32)  # dequantized words of one j
        for rt in cutlass.range_constexpr(RT):
            for hr in cutlass.range_constexpr(2):
                if cutlass.const_expr(self.mx):
                    rF[rt, hr, 0] = mx_factor_bf16x2(rS[rt, hr])
                    rF[rt, hr, 1] = rF[rt, hr, 0]
                else:
                    fac = nvfp4_factors(rS[rt, hr])
                    rF[rt, hr, 0] = fac[0]
                    rF[rt, hr, 1] = fac[1]
        for j in cutlass.range_constexpr(4):
            for rt in cutlass.range_constexpr(RT):
                for hr in cutlass.range_constexpr(2):
                    dq = dequant_fp4x8(rW[rt, hr, j], rF[rt, hr, j // 2], self.mx)
                    for q in cutlass.range_constexpr(4):
                        rA[rt, hr, q] = dq[q]
            for nt in cutlass.range_constexpr(NT):
                # (x_0, x_4), (x_1, x_5), (x_2, x_6), (x_3, x_7) of this thread's 8 K values
                if cutlass.const_expr(x_mode != "global"):
                    xw = ld_shared_v4(x_ptr + x_addr[nt] + (x_plane ^ (16 * j)))
                    if cutlass.const_expr(x_mode == "swizzled"):  # else paired by the producer
                        xw = pair_natural_x(xw)
                else:
                    xw = ld_global_v4(x_ptr + cutlass.Int64(x_addr[nt] + (4 * c + j) * x_plane))
                for h in cutlass.range_constexpr(2):
                    # B fragment of step (j, h): tokens' K values (2h, 2h+4) and (2h+1, 2h+5)
                    b = (xw[2 * h], xw[2 * h + 1])
                    for rt in cutlass.range_constexpr(RT):
                        a = (rA[rt, 0, 2 * h], rA[rt, 1, 2 * h], rA[rt, 0, 2 * h + 1], rA[rt, 1, 2 * h + 1])
                        d = mma_bf16_16816(a, b, [acc[rt, nt, q] for q in range(4)])
                        for q in cutlass.range_constexpr(4):
                            acc[rt, nt, q] = d[q]

    @cute.jit
    def mma_chunk_fp8(self, rW, rS, x_ptr, x_addr, x_sw, acc):
        """8-bit weights: one K chunk (64 K values; thread t holds 16 of them, K 16 t .. 16 t + 15,
        as 4 words of 4 e4m3 bytes per row) times the tokens' activations of the chunk's box (K in
        order, token 8 nt + g's 16-byte pieces 2 t, 2 t + 1 at ``x_ptr + x_addr[nt] + (x_sw ^ 16
        j2)``). Word j of a row dequantizes to the bf16 pairs of K (16 t + 4 j, + 1) and (+ 2, + 3),
        which one m16n8k16 MMA takes as its K (2 t, 2 t + 1) and (2 t + 8, 2 t + 9); the
        activations' 8 bytes at K 16 t + 4 j are the same pairs, so no reordering on either side.
        The scale factor (one per 32 K: the thread's 16 values share it) multiplies the pairs."""
        RT, NT = self.cfg.row_tiles, self.cfg.n_tiles
        rF = cute.make_rmem_tensor((RT, 2), cutlass.Int32)
        rA = cute.make_rmem_tensor((RT, 2, 2), cutlass.Int32)
        rX = cute.make_rmem_tensor((NT, 4), cutlass.Int32)
        for rt in cutlass.range_constexpr(RT):
            for hr in cutlass.range_constexpr(2):
                rF[rt, hr] = mx_factor_bf16x2(rS[rt, hr])
        for j2 in cutlass.range_constexpr(2):
            for nt in cutlass.range_constexpr(NT):
                xw = ld_shared_v4(x_ptr + x_addr[nt] + (x_sw ^ (16 * j2)))
                for w in cutlass.range_constexpr(4):
                    rX[nt, w] = xw[w]
            for jj in cutlass.range_constexpr(2):
                for rt in cutlass.range_constexpr(RT):
                    for hr in cutlass.range_constexpr(2):
                        dq = dequant_e4m3x4(rW[rt, hr, 2 * j2 + jj], rF[rt, hr])
                        rA[rt, hr, 0] = dq[0]
                        rA[rt, hr, 1] = dq[1]
                for nt in cutlass.range_constexpr(NT):
                    b = (rX[nt, 2 * jj], rX[nt, 2 * jj + 1])
                    for rt in cutlass.range_constexpr(RT):
                        a = (rA[rt, 0, 0], rA[rt, 1, 0], rA[rt, 0, 1], rA[rt, 1, 1])
                        d = mma_bf16_16816(a, b, [acc[rt, nt, q] for q in range(4)])
                        for q in cutlass.range_constexpr(4):
                            acc[rt, nt, q] = d[q]

    @cute.jit
    def nan_rows(self, flags, acc, mask: cutlass.Constexpr = WORD_NAN_MASK):
        """8-bit weights: NaN into the accumulators of every weight row in which a lane of the quad
        saw an e4m3 NaN byte (``flags & mask``: ``e4m3_nan_flags`` / WORD_NAN_MASK, or the WGMMA
        consumers' ``dequant_e4m3_pair`` / PAIR_NAN_MASK; the placement makes the NaN code
        finite). Any NaN weight makes its row's outputs NaN, as in the reference."""
        RT, NT = self.cfg.row_tiles, self.cfg.n_tiles
        for rt in cutlass.range_constexpr(RT):
            for hr in cutlass.range_constexpr(2):
                f = flags[rt, hr] & cutlass.Int32(mask - (1 << 32) if mask >= 1 << 31 else mask)  # as int32
                f = f | cute.arch.shuffle_sync_bfly(f, offset=1)
                f = f | cute.arch.shuffle_sync_bfly(f, offset=2)
                if f != 0:
                    for nt in cutlass.range_constexpr(NT):
                        for i in cutlass.range_constexpr(2):
                            acc[rt, nt, 2 * hr + i] = cutlass.Float32(float("nan"))


# --- compile ------------------------------------------------------------------------------------
def _flat(dtype, div, align):
    return make_fake_tensor(dtype, (cute.sym_int64(divisibility=div),), (1,), assumed_align=align)


def fake_args(cfg: Fp4WeightConfig):
    i32 = cutlass.Int32(1)
    return (
        _flat(cutlass.Int32, 4, 16),
        _flat(cutlass.Int32, 4, 16),
        _flat(cutlass.Uint8, 1, 16),
        _flat(OUT_DTYPES[cfg.out_dtype], 1, 4),
        _flat(cutlass.Int32, 1, 4),
        _flat(cutlass.Float32, 1, 4),
        _flat(cutlass.Float32, 1, 4),
        _flat(cutlass.Int32, 1, 16),
        i32, i32, i32, i32, i32, i32, i32, i32,
        cutlass.Float32(1.0),
        make_fake_stream(use_tvm_ffi_env_stream=True),
    )  # fmt: skip


def build_fp4_weight(cfg: Fp4WeightConfig):
    """(kernel object, fake args) for :class:`~cutegemm.runtime.cache.KernelCache`."""
    return Fp4WeightKernel(cfg), fake_args(cfg)


@functools.cache
def kernel_cache():
    return KernelCache(build_fp4_weight)


def all_configs(arch: str) -> list[Fp4WeightConfig]:
    """The compile-checked variants for ``arch``: every kernel the host policy picks
    (``weight_only.launch.pick_config``) plus fp32 output and the other pipelines."""
    out = []
    for fmt in FORMATS:
        for grouped in (False, True):
            for rows in (1, 16, 32, 64):
                out.append(pick_config(rows * (8 if grouped else 1), fmt, torch.bfloat16, arch, grouped, 8))
        for rows in (1, 16, 32):  # dense weights with fewer 128-row tiles than SMs: the split grid
            out.append(pick_config(rows, fmt, torch.bfloat16, arch, False, 1, few_tiles=True))
    for fmt in FORMATS:  # sm_90a: 128 tokens per pass from 65 rows, 256 from 129
        for grouped in (False, True):
            for rows in (128, 256):
                out.append(pick_config(rows * (8 if grouped else 1), fmt, torch.bfloat16, arch, grouped, 8))
    out.append(pick_config(256, "mxfp4", torch.bfloat16, arch, False, 1, x_scale=True))
    for fmt in ("nvfp4", "mxfp8"):  # sm_90a: the pass grids (224 tiles on 132 SMs, 4 passes: persistent / a CTA per unit)
        out.append(pick_config(1024, fmt, torch.bfloat16, arch, False, 1, tiles_sms=(224, 132)))
        out.append(pick_config(512, fmt, torch.bfloat16, arch, False, 1, tiles_sms=(224, 132)))  # 2 passes: the cut tail
    out.append(Fp4WeightConfig(fmt="nvfp4", out_dtype="fp32", arch=arch))
    out.append(pick_config(16, "nvfp4", torch.bfloat16, arch, False, 1, x_scale=True))  # FP8 activations
    out.append(pick_config(128, "mxfp4", torch.bfloat16, arch, True, 8, x_scale=True))
    out.append(pick_config(128 * 8, "nvfp4", torch.bfloat16, arch, True, 8, x_scale=True))  # sm_90a: 128 tokens
    out.append(Fp4WeightConfig(fmt="mxfp4", out_dtype="fp16", n_tiles=4, warps_n=4, warps_k=2, stages=0, arch=arch))
    # the register-prefetch pipeline and other ring shapes
    out.append(Fp4WeightConfig(fmt="nvfp4", n_tiles=2, warps_n=1, warps_k=2, stages=0, l2_prefetch=256, arch=arch))
    out.append(Fp4WeightConfig(fmt="mxfp4", n_tiles=1, warps_n=8, warps_k=1, stages=0, ring=2, ring_k=4, arch=arch))
    # the split ring (persistent grid), 128- and 64-row CTAs
    out.append(Fp4WeightConfig(fmt="nvfp4", row_tiles=2, warps_n=4, warps_k=2, stages=0, ring=4, split=True, arch=arch))
    out.append(Fp4WeightConfig(fmt="mxfp4", out_dtype="fp32", n_tiles=4, warps_n=4, warps_k=1, stages=0, ring=3,
                               split=True, arch=arch))  # fmt: skip
    return list(dict.fromkeys(out))


def check_variant(cfg: Fp4WeightConfig) -> tuple[bool, dict, str]:
    """Compile ``cfg`` to SASS (no GPU needed) and check it: (ok, marker counts, error). No
    local-memory spills; the WGMMA consumers: no A register of a commit group in flight across
    the loop's back edge rewritten (``wgmma_register_a_hazards``)."""
    required = WGMMA_SASS_REQUIRED if cfg.wgmma else RING_SASS_REQUIRED if cfg.ring else SASS_REQUIRED
    extra = wgmma_register_a_hazards if cfg.wgmma else None
    return check_sass(build_fp4_weight(cfg), cfg.arch, required, SASS_FORBIDDEN, extra)


