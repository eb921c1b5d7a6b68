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
  fragments itself (read from the ring's shared memory, or loaded straight into registers). The order of K inside
  an MMA is free as long as both operands agree: the 8 nibbles of a 32-bit word are paired as
  (k, k+4), which makes the e2m1 -> bf16 conversion two shifts and masks per pair; the
  activations get the same pairing from four PRMTs per 16-byte read (the ring) or from a
  host-side reorder (the older pipelines, below).
* e2m1 -> bf16 is exact: the nibble's magnitude bits land in the bf16 exponent/mantissa so that
  the bf16 value is ``e2m1 * 2**-126`` (the 0.5 code is a bf16 subnormal, which bf16 arithmetic
  keeps), and one packed bf16 multiply by ``scale * 2**118`` (NVFP4; exact: an e4m3 scale times
  an e2m1 value has <= 6 significant bits) gives ``w * scale * 2**-8``; the 2**8 and the global
  scale are applied to the fp32 accumulators at the end. MXFP4 (scales 2**-127 .. 2**127) takes
  two multiplies, by 2**126 then by the scale, so no intermediate over/underflows.
* Older pipelines: weight loads bypass L1 (they are read once); activations are small and re-read
  by every warp through L1, in a fragment order prepared on the host (``fragment_order_x``: one
  small copy of x per call, ~5 us on the H200) so a warp's activation load is 512 contiguous
  bytes. The ring reads x as the caller stored it (TMA boxes), no copy.

Two ways to feed the math (``Fp4WeightConfig.ring``):

* the streaming ring (``ring`` > 0, the host policy's choice since 2026-11-30): one producer
  warp fills ``ring`` shared-memory stages, each ``ring_k`` K chunks of the CTA's 128 weight
  rows (a 2-D TMA box, 128-byte swizzle), their scales (one bulk copy of whole 512-byte groups of
  the 128x4 layout) and the token pass's activations (2-D TMA boxes of x as stored); the
  consumer warps read everything from shared memory, so the activations are fetched once per
  CTA instead of once per warp (:meth:`Fp4WeightKernel.kernel_ring`). Per-row bulk copies were
  tried first: issue-bound at ~780 GB/s. ``split`` (dense): a persistent grid whose CTAs take
  equal ranges of (segment, K stage) units, partial segments meeting through a workspace;
* per-thread loads (``ring`` = 0, the fourth session's kernel), described below.

Grid: (N / rows per CTA, 1 or E, m-slices). A CTA has warps_n x warps_k warps: warps_n groups
of weight rows (16 * row_tiles each), and the K chunks of a row dealt round-robin to warps_k warps
whose partial sums meet in shared memory. Weight chunks are prefetched one ahead in registers
(``stages=0``) or through a per-warp cp.async ring (``stages`` deep). The token rows of the CTA's
expert are processed in chunks of 8 * n_tiles. Grouped: a CTA reads its expert's row range from
``offs`` on the device (clamped like the bf16 grouped path; no host sync, CUDA-graph safe) and an
expert with no rows costs nothing. Measured on the H200: ``bench/RESULTS.md`` (fourth session;
the ring: 2026-11-30). The register math (dequantization, scale decodes, the MMA wrapper, the
activation reorder) and its torch twins live in :mod:`cutegemm.blockscaled.fp4_math`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

from ..runtime.ptx import (
    bulk_g2s,
    cp_async,
    cp_async_commit,
    cp_async_wait,
    ld_global_cg_f32,
    ld_global_u8,
    ld_global_u16,
    ld_global_v4,
    ld_global_v4_stream,
    ld_shared_b32,
    ld_shared_u8,
    ld_shared_u16,
    ld_shared_v4,
    st_shared_v4,
)
from .fp4_math import (
    CHUNK_K,
    dequant_fp4x8,
    mma_bf16_16816,
    mx_scale_bf16_bits,
    nvfp4_factors,
    pair_natural_x,
)

__all__ = ["Fp4WeightConfig", "all_configs", "check_variant", "build_fp4_weight", "SASS_REQUIRED"]

FORMATS = ("nvfp4", "mxfp4")
OUT_DTYPES = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16, "fp32": cutlass.Float32}
SASS_REQUIRED = {
    "HMMA.16816.F32.BF16": r"\bHMMA\.16816\.F32\.BF16\b",
    "LDG.128": r"\bLDG\.E[.A-Z0-9_:]*\.128",
}
RING_SASS_REQUIRED = {
    "HMMA.16816.F32.BF16": SASS_REQUIRED["HMMA.16816.F32.BF16"],
    "UTMALDG": r"\bUTMALDG\b",  # TMA box of weight rows
    "UBLKCP.S.G": r"\bUBLKCP\.S\.G\b",  # cp.async.bulk global -> shared (scales, activations)
    "LDS.128": r"\bLDS\.128\b",
}
SASS_FORBIDDEN = {"LDL": r"\bLDL(\.|\s)", "STL": r"\bSTL(\.|\s)"}


@dataclass(frozen=True)
class Fp4WeightConfig:
    """What changes the compiled kernel.

    fmt: ``nvfp4`` | ``mxfp4``; n_tiles: 8-token MMA tiles per pass (tokens per pass = 8 * n_tiles);
    row_tiles: 16-row weight tiles per warp; warps_n x warps_k: the CTA's warps, warps_n groups
    over weight rows, warps_k over K (the K chunks of a row are dealt round-robin to warps_k
    warps, whose partial sums meet in shared memory); grouped: MoE packed form; out_dtype:
    bf16 | fp16 | fp32; arch: sm_90a | sm_100a. ring > 0 selects the streaming ring (then
    warps_n * 16 * row_tiles must divide 128 and stages / min_blocks are 0; the CTA gets one more
    warp, the producer).
    """

    fmt: str = "nvfp4"
    n_tiles: int = 2
    row_tiles: int = 1
    warps_n: int = 2
    warps_k: int = 4
    grouped: bool = False
    out_dtype: str = "bf16"
    arch: str = "sm_90a"
    min_blocks: int = 0  # CTAs per SM the registers are capped for; 0: none
    x_scale: bool = False  # multiply token m's outputs by a per-token fp32 scale (FP8 activations)
    stages: int = 4  # cp.async ring depth (K chunks in flight per warp); 0: register prefetch
    l2_prefetch: int = 0  # L2 prefetch-size hint of the weight loads: 0, 128 or 256 bytes
    # Streaming ring (0: off): a producer warp streams the CTA's weight rows (2-D TMA boxes), their
    # scales and the tokens' activations (cp.async.bulk) for ring_k K chunks per stage into
    # ``ring`` shared-memory stages (mbarrier transaction counts); the consumer warps read
    # everything from shared memory (the activations are loaded once per CTA, not once per warp).
    ring: int = 0
    ring_k: int = 2
    # Split (dense ring only): a persistent grid of CTAs takes equal ranges of all (segment, K
    # stage) units, so the SMs stream equal weight bytes whatever N / rows_per_cta is; segments
    # cut between CTAs meet through a workspace (``Fp4WeightKernel.split_finish``).
    split: bool = False
    # Ring: the producer warp pairs each stage's activations in place once (True), or every
    # consumer warp pairs what it reads (False; four PRMTs per 16-byte read).
    producer_pairs: bool = True

    def __post_init__(self):
        if self.fmt not in FORMATS:
            raise ValueError(f"Fp4WeightConfig.fmt must be one of {FORMATS}, got {self.fmt!r}")
        if self.n_tiles not in (1, 2, 4, 8):
            raise ValueError(f"Fp4WeightConfig.n_tiles must be 1, 2, 4 or 8, got {self.n_tiles}")
        if self.row_tiles not in (1, 2, 4):
            raise ValueError(f"Fp4WeightConfig.row_tiles must be 1, 2 or 4, got {self.row_tiles}")
        if self.warps_n not in (1, 2, 4, 8) or self.warps_k not in (1, 2, 4, 8) or self.warps > 16:
            raise ValueError(f"Fp4WeightConfig.warps_n / warps_k must be 1..8 (<= 16 warps), got {self.warps_n}, {self.warps_k}")
        if self.out_dtype not in OUT_DTYPES:
            raise ValueError(f"Fp4WeightConfig.out_dtype must be one of {sorted(OUT_DTYPES)}, got {self.out_dtype!r}")
        if self.arch not in ("sm_90a", "sm_100a"):
            raise ValueError(f"Fp4WeightConfig.arch must be sm_90a or sm_100a, got {self.arch!r}")
        if self.split and not self.ring:
            raise ValueError("Fp4WeightConfig.split needs the ring")
        if self.ring:
            if not 2 <= self.ring <= 8 or self.ring_k not in (2, 4):
                raise ValueError(f"Fp4WeightConfig.ring must be 0 or 2..8 and ring_k 2 or 4, got {self.ring}, {self.ring_k}")
            if 128 % self.rows_per_cta or self.stages or self.min_blocks:
                raise ValueError(
                    "Fp4WeightConfig with ring: rows per CTA must divide 128 (the scales' 128-row tiles); "
                    "stages and min_blocks must be 0"
                )
            if self.split and self.grouped:
                raise ValueError("Fp4WeightConfig.split is for the dense form")
            if self.smem_bytes > 227 * 1024:
                raise ValueError(f"Fp4WeightConfig: {self.ring} ring stages need {self.smem_bytes} B of shared memory")

    @property
    def warps(self) -> int:
        return self.warps_n * self.warps_k

    @property
    def rows_per_cta(self) -> int:
        return self.warps_n * 16 * self.row_tiles

    @property
    def tokens_per_pass(self) -> int:
        return 8 * self.n_tiles

    # Ring stage layout (bytes): ring_k / 2 TMA boxes of the CTA's weight rows x 128 bytes (two K
    # chunks), 2 * ring_k TMA boxes of the pass's tokens x 64 activations (128 bytes), both with
    # the 128-byte swizzle, and the scales' 512-byte column groups.
    @property
    def w_box_bytes(self) -> int:
        return self.rows_per_cta * 128

    @property
    def x_box_bytes(self) -> int:
        return self.tokens_per_pass * 128

    @property
    def scale_groups(self) -> int:
        return self.ring_k * (1 if self.fmt == "mxfp4" else 2)

    @property
    def side_bytes(self) -> int:
        """Scales of one stage."""
        return self.scale_groups * 512

    @property
    def smem_bytes(self) -> int:
        red = 4 * self.row_tiles * self.n_tiles * 4 * 32 * self.warps_n * (self.warps_k - 1)
        boxes = self.ring_k // 2 * self.w_box_bytes + 2 * self.ring_k * self.x_box_bytes
        return self.ring * (boxes + self.side_bytes + 16) + red + 1024 + 256

    @property
    def name(self) -> str:
        g = "grouped_" if self.grouped else ""
        return (
            f"fp4w_{g}{self.fmt}_t{self.tokens_per_pass}_r{self.rows_per_cta}_w{self.warps_n}x{self.warps_k}_"
            f"{self.out_dtype}_{self.arch}" + (f"_mb{self.min_blocks}" if self.min_blocks else "")
            + f"_s{self.stages}" + (f"_l2p{self.l2_prefetch}" if self.l2_prefetch else "")
            + ("_xs" if self.x_scale else "")
            + (f"_ring{self.ring}x{self.ring_k}" if self.ring else "")
            + ("_split" if self.split else "")
            + ("_cpair" if self.ring and not self.producer_pairs else "")
        )


# --- the kernel ---------------------------------------------------------------------------------
class Fp4WeightKernel:
    def __init__(self, cfg: Fp4WeightConfig):
        self.cfg = cfg
        self.mx = cfg.fmt == "mxfp4"
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
        grid_x = (n + self.cfg.rows_per_cta - 1) // self.cfg.rows_per_cta
        if cutlass.const_expr(self.cfg.ring > 0):
            # The weights as an (N, K/2, L) byte tensor, read by a TMA box of rows_per_cta x 128
            # bytes (rows past N and bytes past K/2 arrive as zeros).
            half_k = cute.assume(k // 2, divby=16)
            w3 = cute.make_tensor(
                cute.recast_ptr(mW.iterator, dtype=cutlass.Uint8),
                cute.make_layout((n, half_k, batches), stride=(half_k, 1, cutlass.Int64(n) * cutlass.Int64(half_k))),
            )
            sw_layout = self.w_smem_layout()
            tma_atom, tma_w = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileG2SOp(), w3, cute.slice_(sw_layout, (None, None, 0)), (self.cfg.rows_per_cta, 128)
            )
            # The activations as they are ((rows, K) bf16, row-major), read by TMA boxes of
            # tokens_per_pass x 64 (rows past the end and K values past K arrive as zeros).
            x_rows = m_rows
            if cutlass.const_expr(not self.cfg.grouped):
                x_rows = m_rows * batches
            k32 = cute.assume(k, divby=32)
            x2 = cute.make_tensor(
                cute.recast_ptr(mX.iterator, dtype=cutlass.BFloat16), cute.make_layout((x_rows, k32), stride=(k32, 1))
            )
            sx_layout = self.x_smem_layout()
            tma_atom_x, tma_x = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileG2SOp(), x2, cute.slice_(sx_layout, (None, None, 0)), (self.cfg.tokens_per_pass, 64)
            )
            grid = [grid_x, batches, 1]
            if cutlass.const_expr(self.cfg.split):
                grid = [n_ctas, 1, 1]
            self.kernel_ring(tma_atom, tma_w, tma_atom_x, tma_x, mS, mOut, mOffs, mGs, mXs, mWork, m_rows, n, k,
                             batches, n_ctas, slot0, tile_stride, alpha).launch(
                grid=grid, block=[32 * (1 + self.cfg.warps), 1, 1], stream=stream,
            )
            return
        self.kernel(mX, mW, mS, mOut, mOffs, mGs, mXs, m_rows, n, k, m_slices, tile_stride, alpha).launch(
            grid=[grid_x, batches, m_slices], block=[32 * self.cfg.warps, 1, 1], stream=stream,
            min_blocks_per_mp=self.min_blocks, preferred_smem_carveout=100 if self.min_blocks > 1 else None,
        )

    @cute.kernel
    def kernel(self, mX, mW, mS, mOut, mOffs, mGs, mXs, m_rows, n, k, m_slices, tile_stride, alpha):
        from cutlass import memory

        cfg = self.cfg
        RT, NT, RW, KW = cfg.row_tiles, cfg.n_tiles, cfg.warps_n, cfg.warps_k
        tidx, _, _ = cute.arch.thread_idx()
        bx, batch, slice_ = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        rw = warp % RW  # row group
        kg = warp // RW  # K group: chunks kg, kg + KW, ...
        g = lane // 4
        t = lane % 4
        n_p, cols_p = self.scale_dims(n, k)
        # rows of tokens this CTA reads: a batch of the dense form, an expert's segment of offs
        row_start, row_end, x_base = self.token_range(mOffs, m_rows, batch)
        gs = self.out_scale(mGs, alpha)

        # Byte addresses. Weight row r, chunk c, thread t: 16 bytes at r * K/2 + 64 c + 16 t.
        # Its scales (128x4 swizzled): tile row r // 128, in-tile (r % 32) * 16 + (r // 32 % 4) * 4,
        # column kk // vec of K value kk = 128 c + 32 t: NVFP4 (2c + t // 2) * 512 + 2 (t % 2)
        # (two scales, 16 K each), MXFP4 c * 512 + t.
        row0 = bx * cfg.rows_per_cta + rw * (16 * RT)
        # per-row byte offsets (32-bit: one weight matrix is < 2 GiB) from 64-bit batch bases
        w_addr = cute.make_rmem_tensor((RT, 2), cutlass.Int32)
        s_addr = cute.make_rmem_tensor((RT, 2), cutlass.Int32)
        w_base = mW.iterator.toint() + cutlass.Int64(batch) * cutlass.Int64(n) * cutlass.Int64(k // 2)
        s_base = self.scales_base(mS, batch, n_p, cols_p)
        for rt in cutlass.range_constexpr(RT):
            for hr in cutlass.range_constexpr(2):
                r = cutlass.min(row0 + 16 * rt + 8 * hr + g, n - 1)  # rows past N: never stored
                w_addr[rt, hr] = r * (k // 2) + 16 * t
                in_tile = self.scale_in_tile(r, t)
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
                            if cutlass.const_expr(self.mx):
                                rS[rt, hr] = (sw >> (8 * t)) & 0xFF
                            else:
                                rS[rt, hr] = (sw >> (16 * (t % 2))) & 0xFFFF
                    self.mma_chunk(kg + i * KW, rW, rS, x_ptr, x_addr, x_plane, acc)
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
                    self.mma_chunk(c, rW, rS, x_ptr, x_addr, x_plane, acc)
            if full_chunks * CHUNK_K < k:  # K % 128: threads past K contribute zeros
                if kg == tail_group:
                    live = full_chunks * CHUNK_K + 32 * t < k
                    self.load_chunk(full_chunks, w_base, s_base, w_addr, s_addr, rW, rS, live, True)
                    self.mma_chunk(full_chunks, rW, rS, x_ptr, x_addr, x_plane, acc)
            self.finish_pass(acc, sRed, lane, kg, rw, m0, row_end, x_base, row0, n, gs, mXs, mOut, 0)
            m_chunk += m_slices * (8 * NT)

    def w_smem_layout(self):
        """(rows_per_cta, 128 bytes, ring * ring_k / 2) weight boxes, 128-byte swizzle: byte b of
        row r of a box sits at r * 128 + (((b >> 4) ^ (r % 8)) << 4) + b % 16."""
        cfg = self.cfg
        atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, cutlass.Uint8)
        return cute.tile_to_shape(atom, (cfg.rows_per_cta, 128, cfg.ring * cfg.ring_k // 2), order=(0, 1, 2))

    def x_smem_layout(self):
        """(tokens_per_pass, 64 bf16, ring * 2 * ring_k) activation boxes, 128-byte swizzle (the
        byte map of :meth:`w_smem_layout`; a box row is one token's 64 K values)."""
        cfg = self.cfg
        atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, cutlass.BFloat16)
        return cute.tile_to_shape(atom, (cfg.tokens_per_pass, 64, cfg.ring * 2 * cfg.ring_k), order=(0, 1, 2))

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
        :meth:`pair_stage`; the stage's full barrier then counts two arrivals), or by every
        consumer on each read. Tokens past the pass's end (another expert's, or zeros) are never
        stored.

        Bank conflicts: a warp's 16-byte weight reads cover two rows per 8 lanes; MMA row g of a
        16-row tile reads weight row g // 2 + 4 (g % 2) (rows 0 and 4, 1 and 5, ...), whose
        swizzled pieces lie in opposite halves of the banks. The stores use the same map. The
        activation reads (token g, piece 4 (t % 2) + j of box t // 2) are two-way conflicted.

        Work: units of (segment, K stage), a segment being one token pass over one CTA-row tile of
        one batch. Without ``split`` a CTA takes its tile's segments (grid: row tiles x batches;
        grouped: the expert's passes from offs). With ``split`` (dense) a persistent grid of
        ``n_ctas`` CTAs takes equal ranges of all units, so every SM streams the same number of
        weight bytes; a segment cut between CTAs is finished by :meth:`split_finish`."""
        from cutlass import memory

        cfg = self.cfg
        RT, NT, RW, KW = cfg.row_tiles, cfg.n_tiles, cfg.warps_n, cfg.warps_k
        S, SK, R, T = cfg.ring, cfg.ring_k, cfg.rows_per_cta, cfg.tokens_per_pass
        SG, W = cfg.scale_groups, cfg.warps
        NB = SK // 2  # weight boxes per stage
        NX = 2 * SK  # activation boxes per stage
        XB = cfg.x_box_bytes
        side = cfg.side_bytes
        tidx, _, _ = cute.arch.thread_idx()
        bx, by, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(tidx // 32)
        lane = tidx % 32
        n_p, cols_p = self.scale_dims(n, k)
        n_chunks = (k + CHUNK_K - 1) // CHUNK_K
        n_kst = (n_chunks + SK - 1) // SK
        n_tiles = (n + R - 1) // R
        row_start, row_end, x_base0 = self.token_range(mOffs, m_rows, by)
        n_pass = (row_end - row_start + T - 1) // T
        u_lo = cutlass.Int32(0)
        u_hi = n_pass * n_kst
        total = u_hi
        if cutlass.const_expr(cfg.split):
            total = batches * n_tiles * n_pass * n_kst
            u_lo = cutlass.Int32(cutlass.Int64(bx) * cutlass.Int64(total) // cutlass.Int64(n_ctas))
            u_hi = cutlass.Int32(cutlass.Int64(bx + 1) * cutlass.Int64(total) // cutlass.Int64(n_ctas))

        alloc = memory.SmemAllocator()
        sw_layout = self.w_smem_layout()
        sW = alloc.allocate_tensor(cutlass.Uint8, sw_layout.outer, 1024, swizzle=sw_layout.inner)
        sx_layout = self.x_smem_layout()
        sX = alloc.allocate_tensor(cutlass.BFloat16, sx_layout.outer, 1024, swizzle=sx_layout.inner)
        sides = alloc.allocate_tensor(cutlass.Int32, cute.make_layout(S * side // 4), 128)
        bars = alloc.allocate_tensor(cutlass.Int64, cute.make_layout(3 * S), 8)
        sFlag = alloc.allocate_tensor(cutlass.Int32, cute.make_layout(4), 16)
        sRed = None
        if cutlass.const_expr(KW > 1):
            n_acc = RT * NT * 4
            sRed = alloc.allocate_tensor(
                cutlass.Float32, cute.make_layout((n_acc, 32, RW, KW - 1), stride=(32, 1, 32 * n_acc, 32 * n_acc * RW)), 16
            )
        w_smem = sW.iterator.toint()
        x_smem = sX.iterator.toint()
        side_base = sides.iterator.toint()
        bar_base = bars.iterator.toint()
        full = bars.iterator
        empty = bars.iterator + S
        xfull = bars.iterator + 2 * S  # the stage's activation boxes have landed (the producer pairs them)
        PP = cfg.producer_pairs
        if tidx == 0:
            for i in cutlass.range_constexpr(S):
                # weights + scales (+ activations) (tx), and with producer_pairs the paired activations
                cute.arch.mbarrier_init(full + i, 2 if PP else 1)
                cute.arch.mbarrier_init(empty + i, W)
                cute.arch.mbarrier_init(xfull + i, 1)
            cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        if warp == 0:
            # ---- producer ----
            cpasync.prefetch_descriptor(tma_atom)  # the TMA ops elect their thread: call them warp-wide
            cpasync.prefetch_descriptor(tma_atom_x)
            # (TMA, boxes), (TMA, RestN, RestK, L)
            tWs, tWg = cpasync.tma_partition(
                tma_atom, 0, cute.make_layout(1), cute.group_modes(sW, 0, 2),
                cute.group_modes(cute.local_tile(mW, (R, 128), (None, None, None)), 0, 2),
            )  # fmt: skip
            sXb = cute.group_modes(sX, 0, 2)
            it = cutlass.Int32(0)
            u = u_lo
            seg = u_lo // n_kst
            ks = u_lo - seg * n_kst
            while u < u_hi:
                tile, batch, m0, x_base = self.ring_segment(seg, n_pass, n_tiles, bx, by, row_start, x_base0, m_rows)
                # (T, 64, K / 64) boxes of this pass's tokens (dense: x_base = the batch's first row)
                gX = cute.local_tile(cute.domain_offset((cutlass.Int32(x_base) + m0, 0), mX2), (T, 64), (0, None))
                tXs, tXg = cpasync.tma_partition(tma_atom_x, 0, cute.make_layout(1), sXb, cute.group_modes(gX, 0, 2))
                s_base = self.scales_base(mS, batch, n_p, cols_p) + cutlass.Int64(tile * R // 128) * cutlass.Int64(tile_stride)
                slot = it % S
                if it >= S:
                    cute.arch.mbarrier_wait(empty + slot, (it // S + 1) % 2)
                c0 = ks * SK
                g0 = c0 * (SG // SK)
                n_groups = cutlass.min(SG, cols_p // 4 - g0)
                if lane == 0:
                    if cutlass.const_expr(PP):
                        cute.arch.mbarrier_arrive_and_expect_tx(full + slot, NB * R * 128 + n_groups * 512)
                        cute.arch.mbarrier_arrive_and_expect_tx(xfull + slot, NX * XB)
                    else:
                        cute.arch.mbarrier_arrive_and_expect_tx(full + slot, NB * R * 128 + n_groups * 512 + NX * XB)
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
                    seg += 1
            if cutlass.const_expr(PP):
                if it > 0:
                    self.pair_stage(it - 1, x_smem, xfull, full, lane)
        else:
            # ---- consumers ----
            cw = warp - 1
            rw = cw % RW
            kg = cw // RW
            g = lane // 4
            t = lane % 4
            gp = g // 2 + 4 * (g % 2)  # the weight row of MMA row g (class docstring)
            gs = self.out_scale(mGs, alpha)
            # token 8 nt + g's 16-byte piece 4 (t % 2) + j of activation box t // 2 (swizzled):
            # x_smem + box * XB + x_addr[nt] + (x_sw ^ 16 j)
            x_addr = cute.make_rmem_tensor((NT,), cutlass.Int32)
            for nt in cutlass.range_constexpr(NT):
                x_addr[nt] = (t // 2) * XB + (nt * 8 + g) * 128
            x_sw = ((4 * (t % 2)) ^ g) * 16
            w_row = cute.make_rmem_tensor((RT, 2), cutlass.Int32)  # row * 128 in a box
            s_off = cute.make_rmem_tensor((RT, 2), cutlass.Int32)
            for rt in cutlass.range_constexpr(RT):
                for hr in cutlass.range_constexpr(2):
                    w_row[rt, hr] = (rw * (16 * RT) + 16 * rt + 8 * hr + gp) * 128
                    if cutlass.const_expr(R == 128):
                        s_off[rt, hr] = self.scale_in_tile(w_row[rt, hr] // 128, t)
            acc = cute.make_rmem_tensor((RT, NT, 4), cutlass.Float32)
            rW = cute.make_rmem_tensor((RT, 2, 4), cutlass.Int32)
            rS = cute.make_rmem_tensor((RT, 2), cutlass.Int32)
            it = cutlass.Int32(0)
            u = u_lo
            seg = u_lo // n_kst
            ks = u_lo - seg * n_kst
            while u < u_hi:
                if ks == 0 or u == u_lo:  # a segment starts here
                    acc.fill(0.0)
                if cutlass.const_expr(R < 128):
                    tile = self.ring_segment(seg, n_pass, n_tiles, bx, by, row_start, x_base0, m_rows)[0]
                    for rt in cutlass.range_constexpr(RT):
                        for hr in cutlass.range_constexpr(2):
                            # the CTA's rows lie in one 128-row scale tile
                            s_off[rt, hr] = self.scale_in_tile((tile * R) % 128 + w_row[rt, hr] // 128, t)
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
                        live = c * CHUNK_K + 32 * t < k
                        box = w_smem + (slot * NB + q // 2) * (R * 128)
                        piece = (q % 2) * 4 + t  # 16-byte piece of the 128-byte box row
                        for rt in cutlass.range_constexpr(RT):
                            for hr in cutlass.range_constexpr(2):
                                words = ld_shared_v4(box + w_row[rt, hr] + (piece ^ gp) * 16)
                                for w in cutlass.range_constexpr(4):
                                    rW[rt, hr, w] = words[w]
                                if cutlass.const_expr(self.mx):
                                    sb = ld_shared_u8(st + s_off[rt, hr] + q * 512)
                                    rS[rt, hr] = cutlass.select_(live, sb, cutlass.Int32(self.unit_scale))
                                else:
                                    sb = ld_shared_u16(st + s_off[rt, hr] + q * 1024)
                                    rS[rt, hr] = cutlass.select_(live, sb, cutlass.Int32(self.unit_scale))
                        xq = x_smem + (slot * NX + 2 * q) * XB
                        self.mma_chunk(q, rW, rS, xq, x_addr, x_sw, acc, "paired" if PP else "swizzled")
                cute.arch.sync_warp()
                if lane == 0:
                    cute.arch.mbarrier_arrive(empty + slot)
                it += 1
                if ks == n_kst - 1 or u == u_hi - 1:  # the segment ends here
                    self.end_segment(acc, sRed, sFlag, mWork, slot0, lane, kg, rw, cw, seg, u - ks, u_lo, u_hi, total, n_ctas,
                                     n_kst, n_pass, n_tiles, batches, bx, by, row_start, row_end, x_base0, m_rows, n,
                                     gs, mXs, mOut)  # fmt: skip
                u += 1
                ks += 1
                if ks == n_kst:
                    ks = 0
                    seg += 1

    @cute.jit
    def pair_stage(self, it, x_smem, xfull, full, lane):
        """Producer: once stage ``it``'s activation boxes have landed, turn every 16-byte piece
        (8 K values in order) into the weights' (k, k+4) pairing in place (four PRMTs), then
        count the stage's second arrival on its full barrier. The TMA will overwrite these bytes
        S stages later: the proxy fence orders the generic writes before it."""
        cfg = self.cfg
        S = cfg.ring
        slot = it % S
        cute.arch.mbarrier_wait(xfull + slot, (it // S) % 2)
        per_stage = 2 * cfg.ring_k * cfg.x_box_bytes
        base = x_smem + slot * per_stage + lane * 16
        for i in cutlass.range_constexpr(per_stage // (16 * 32)):
            a = base + i * 512
            st_shared_v4(a, pair_natural_x(ld_shared_v4(a)))
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.sync_warp()
        if lane == 0:
            cute.arch.mbarrier_arrive(full + slot)

    @cute.jit
    def end_segment(self, acc, sRed, sFlag, mWork, slot0, lane, kg, rw, cw, seg, su0, u_lo, u_hi, total, n_ctas, n_kst,
                    n_pass, n_tiles, batches, bx, by, row_start, row_end, x_base0, m_rows, n, gs, mXs, mOut):  # fmt: skip
        """The consumers at the end of segment ``seg`` (first unit ``su0``): store it, or (split,
        the segment cut between CTAs) :meth:`split_finish`."""
        cfg = self.cfg
        tile, batch, m0, x_base = self.ring_segment(seg, n_pass, n_tiles, bx, by, row_start, x_base0, m_rows)
        row0 = tile * cfg.rows_per_cta + rw * (16 * cfg.row_tiles)
        bar = 32 * cfg.warps
        if cutlass.const_expr(cfg.split):
            if su0 >= u_lo and su0 + n_kst <= u_hi:
                self.finish_pass(acc, sRed, lane, kg, rw, m0, m_rows, x_base, row0, n, gs, mXs, mOut, bar, True)
            else:
                self.split_finish(acc, sRed, sFlag, mWork, slot0, lane, kg, rw, cw, seg, su0, u_lo, total, n_ctas, n_kst,
                                  m0, m_rows, x_base, row0, n, gs, mXs, mOut, bar)  # fmt: skip
        else:
            self.finish_pass(acc, sRed, lane, kg, rw, m0, row_end, x_base, row0, n, gs, mXs, mOut, bar, True)

    @cute.jit
    def ring_segment(self, seg, n_pass, n_tiles, bx, by, row_start, x_base0, m_rows):
        """Segment ``seg`` of the ring's work (units: segment x K stages) -> (row tile, batch, first
        token row of the pass, the batch's first x row). Split: segments run (batch, row tile,
        pass), a tile's passes back to back (their weight reads hit L2); else the CTA's own tile
        (bx, by) and its passes."""
        tile = bx
        batch = by
        m0 = row_start + seg * self.cfg.tokens_per_pass
        x_base = x_base0
        if cutlass.const_expr(self.cfg.split):
            rest = seg // n_pass
            tile = rest % n_tiles
            batch = rest // n_tiles
            m0 = (seg - rest * n_pass) * self.cfg.tokens_per_pass
            x_base = cutlass.Int64(batch) * cutlass.Int64(m_rows)
        return tile, batch, m0, x_base

    @cute.jit
    def split_finish(self, acc, sRed, sFlag, mWork, slot0, lane, kg, rw, cw, seg, su0, u_lo, total, n_ctas, n_kst,
                     m0, row_end, x_base, row0, n, gs, mXs, mOut, bar_threads: cutlass.Constexpr):  # fmt: skip
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
        cfg = self.cfg
        RT, NT, RW = cfg.row_tiles, cfg.n_tiles, cfg.warps_n
        n_acc = RT * NT * 4
        slot_words = RW * n_acc * 32
        slots0 = slot0
        me = cute.arch.block_idx()[0]
        mWf = cute.make_tensor(cute.recast_ptr(mWork.iterator, dtype=cutlass.Float32), mWork.layout)
        G64 = cutlass.Int64(n_ctas)
        T64 = cutlass.Int64(total)
        c_first = cutlass.Int32((cutlass.Int64(su0 + 1) * G64 - 1) // T64)
        c_last = cutlass.Int32((cutlass.Int64(su0 + n_kst) * G64 - 1) // T64)
        self.reduce_k_groups(acc, sRed, lane, kg, rw, bar_threads)
        if kg == 0:
            base = slots0 + (me * 2 + cutlass.select_(u_lo >= su0, 0, 1)) * slot_words + rw * n_acc * 32 + lane
            for v in cutlass.range_constexpr(n_acc):
                mWf[base + v * 32] = acc[v // (NT * 4), (v // 4) % NT, v % 4]
            cute.arch.fence_acq_rel_gpu()
        self.sync(bar_threads)
        if cw == 0 and lane == 0:
            old = cute.arch.atomic_add(mWork.iterator + seg, cutlass.Int32(1), sem="acq_rel", scope="gpu")
            last = cutlass.Int32(old) == c_last - c_first
            sFlag[0] = cutlass.select_(last, 1, 0)
            if last:
                mWork[seg] = 0  # every contributor has counted in: ready for the next launch
        self.sync(bar_threads)
        if sFlag[0] == 1:
            cute.arch.fence_acq_rel_gpu()
            if kg == 0:
                tot = cute.make_rmem_tensor((RT, NT, 4), cutlass.Float32)
                tot.fill(0.0)
                for c in range(c_first, c_last + 1):
                    if c == me:
                        for v in cutlass.range_constexpr(n_acc):
                            tot[v // (NT * 4), (v // 4) % NT, v % 4] += acc[v // (NT * 4), (v // 4) % NT, v % 4]
                    else:
                        c_lo = cutlass.Int32(cutlass.Int64(c) * T64 // G64)  # CTA c's first unit
                        base = slots0 + (c * 2 + cutlass.select_(c_lo >= su0, 0, 1)) * slot_words + rw * n_acc * 32 + lane
                        addr = mWork.iterator.toint() + cutlass.Int64(base) * 4
                        for v in cutlass.range_constexpr(n_acc):
                            tot[v // (NT * 4), (v // 4) % NT, v % 4] += ld_global_cg_f32(addr + v * 128)
                self.store_fragment(tot, lane, m0, row_end, x_base, row0, n, gs, mXs, mOut, True)
        self.sync(bar_threads)  # sFlag and sRed are rewritten by the next segment

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

    @cute.jit
    def reduce_k_groups(self, acc, sRed, lane, kg, rw, bar_threads: cutlass.Constexpr):
        """K groups 1.. add their partial sums into K group 0's ``acc`` through ``sRed``."""
        cfg = self.cfg
        RT, NT, KW = cfg.row_tiles, cfg.n_tiles, cfg.warps_k
        n_acc = RT * NT * 4
        if cutlass.const_expr(KW > 1):
            if kg > 0:
                for v in cutlass.range_constexpr(n_acc):
                    sRed[v, lane, rw, kg - 1] = acc[v // (NT * 4), (v // 4) % NT, v % 4]
            self.sync(bar_threads)
            if kg == 0:
                for kk in cutlass.range_constexpr(KW - 1):
                    for v in cutlass.range_constexpr(n_acc):
                        acc[v // (NT * 4), (v // 4) % NT, v % 4] += sRed[v, lane, rw, kk]

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
        column group: (r % 32) * 16 + (r // 32 % 4) * 4, plus the column of K value 32 t (MXFP4
        t; NVFP4 (t // 2) * 512 + 2 (t % 2), two scales of 16 K). Chunk c adds c * 512 (MXFP4) /
        c * 1024 (NVFP4)."""
        in_tile = (r % 32) * 16 + ((r // 32) % 4) * 4
        if cutlass.const_expr(self.mx):
            in_tile += t
        else:
            in_tile += (t // 2) * 512 + 2 * (t % 2)
        return in_tile

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
    def issue_chunk(self, c, st, w_base, s_base, w_addr, s_addr, ring_w, ring_s):
        """cp.async this thread's pieces of K chunk ``c`` into ring stage ``st``: 16 bytes per
        weight row, and the aligned 4-byte group holding its scale(s)."""
        RT = self.cfg.row_tiles
        t = cute.arch.lane_idx() % 4
        s_off = (c * 512 - t) if self.mx else (c * 1024 - 2 * (t % 2))
        for rt in cutlass.range_constexpr(RT):
            for hr in cutlass.range_constexpr(2):
                p = rt * 2 + hr
                cp_async(ring_w + (st * (2 * RT) + p) * 512, w_base + cutlass.Int64(w_addr[rt, hr] + c * 64), 16, self.cfg.l2_prefetch)
                cp_async(ring_s + (st * (2 * RT) + p) * 128, s_base + cutlass.Int64(s_addr[rt, hr] + s_off), 4)

    @cute.jit
    def load_chunk(self, c, w_base, s_base, w_addr, s_addr, rW, rS, live, masked: cutlass.Constexpr):
        """Issue the loads of K chunk ``c``: this thread's 16 bytes of each of its weight rows and
        their raw scale bytes (NVFP4: two e4m3, MXFP4: one e8m0). ``masked``: the K tail, where
        a thread without K values (``live`` false) reads its row's first piece (in bounds) and
        keeps zeros / scale 1."""
        RT = self.cfg.row_tiles
        t = cute.arch.lane_idx() % 4
        w_off = c * 64
        s_off = c * 512 if self.mx else c * 1024
        if cutlass.const_expr(masked):
            w_off = cutlass.select_(live, w_off, -16 * t)
            s_off = cutlass.select_(live, s_off, -t if self.mx else -(t // 2) * 512 - 2 * (t % 2))
        for rt in cutlass.range_constexpr(RT):
            for hr in cutlass.range_constexpr(2):
                words = ld_global_v4_stream(w_base + cutlass.Int64(w_addr[rt, hr] + w_off), self.cfg.l2_prefetch)
                for q in cutlass.range_constexpr(4):
                    rW[rt, hr, q] = words[q]
                    if cutlass.const_expr(masked):
                        rW[rt, hr, q] = cutlass.select_(live, words[q], cutlass.Int32(0))
        for rt in cutlass.range_constexpr(RT):
            for hr in cutlass.range_constexpr(2):
                if cutlass.const_expr(self.mx):
                    rS[rt, hr] = ld_global_u8(s_base + cutlass.Int64(s_addr[rt, hr] + s_off))
                    if cutlass.const_expr(masked):
                        rS[rt, hr] = cutlass.select_(live, rS[rt, hr], cutlass.Int32(self.unit_scale))
                else:
                    rS[rt, hr] = ld_global_u16(s_base + cutlass.Int64(s_addr[rt, hr] + s_off))
                    if cutlass.const_expr(masked):
                        rS[rt, hr] = cutlass.select_(live, rS[rt, hr], cutlass.Int32(self.unit_scale))

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
                    f = mx_scale_bf16_bits(rS[rt, hr])
                    rF[rt, hr, 0] = f | (f << 16)
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
                if cutlass.const_expr(x_mode == "paired"):
                    xw = ld_shared_v4(x_ptr + x_addr[nt] + (x_plane ^ (16 * j)))  # paired by the producer
                elif cutlass.const_expr(x_mode == "swizzled"):
                    xw = pair_natural_x(ld_shared_v4(x_ptr + x_addr[nt] + (x_plane ^ (16 * j))))
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


# --- compile ------------------------------------------------------------------------------------
def split_plan_ref(total: int, n_ctas: int, n_kst: int) -> list[list[tuple]]:
    """Torch-free twin of the split grid's schedule (:meth:`Fp4WeightKernel.kernel_ring` /
    :meth:`Fp4WeightKernel.split_finish`, the same integer formulas): for every CTA the pieces of
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
    from ..runtime.cache import KernelCache

    return KernelCache(build_fp4_weight)


def all_configs(arch: str) -> list[Fp4WeightConfig]:
    """The compile-checked variants for ``arch``: every kernel the host policy picks
    (``fp4_weight_api.pick_config``) plus fp32 output and the other pipelines."""
    from .fp4_weight_api import pick_config

    out = []
    for fmt in FORMATS:
        for grouped in (False, True):
            for rows in (1, 16, 32, 64):
                out.append(pick_config(rows * (8 if grouped else 1), fmt, torch.bfloat16, arch, grouped, 8))
    out.append(Fp4WeightConfig(fmt="nvfp4", out_dtype="fp32", arch=arch))
    out.append(pick_config(16, "nvfp4", torch.bfloat16, arch, False, 1, x_scale=True))  # FP8 activations
    out.append(pick_config(128, "mxfp4", torch.bfloat16, arch, True, 8, x_scale=True))
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
    """Compile ``cfg`` to SASS (no GPU needed) and check it: (ok, marker counts, error)."""
    from ..runtime.sass import check_sass

    required = RING_SASS_REQUIRED if cfg.ring else SASS_REQUIRED
    return check_sass(build_fp4_weight(cfg), cfg.arch, required, SASS_FORBIDDEN)


