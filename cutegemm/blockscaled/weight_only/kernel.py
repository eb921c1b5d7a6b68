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

Two ways to feed the math (``Fp4WeightConfig.ring``), each a mixin of :class:`Fp4WeightKernel`:

* the streaming ring (``ring`` > 0, the host policy's choice): :mod:`.fp4_ring`;
* per-thread loads (``ring`` = 0, the fourth session's kernel): :mod:`.fp4_direct`.

MXFP8 weights (``fmt="mxfp8"``: e4m3 elements, e8m0 scales per 32; ring only) take the same
ring with a byte per K value: a 64-byte chunk of a weight row holds 64 K values (``chunk_k``),
a thread's 16 bytes dequantize in K order (``fp4_math.dequant_e4m3x4``: PRMT with sign
replication, a shift and a mask put the byte's bits into bf16 as the value x 2**-120, then two
packed multiplies, by 2**120 and by the scale), so the activations need no pairing: word j of a
row is one m16n8k16 MMA's K (2 t, 2 t + 1), (2 t + 8, 2 t + 9) against the activations' same 8
bytes (:meth:`Fp4WeightKernel.mma_chunk_fp8`). The placement makes the e4m3 NaN code finite, so
the consumers keep per-row NaN flags and write NaN into the rows that had one (``nan_rows``).

On sm_90a the ring also feeds warpgroup-MMA consumers (``Fp4WeightConfig.wgmma``,
:mod:`.fp4_wgmma`): the tokens are the MMA's N (up to 128) and the activations are read by the
MMA from shared memory, so a dequantized weight serves every token of the pass; the host policy
takes them from 17 rows (33 per expert). Everything below describes the ``mma.sync`` consumers.

A CTA has warps_n x warps_k consumer warps: warps_n groups of weight rows (16 * row_tiles each),
and the K chunks of a row dealt round-robin to warps_k warps whose partial sums meet in shared
memory (:meth:`Fp4WeightKernel.finish_pass`). The token rows of the CTA's batch / expert are
processed in passes of 8 * n_tiles. Grouped: a CTA reads its expert's row range from ``offs`` on
the device (clamped like the bf16 grouped path; no host sync, CUDA-graph safe) and an expert
with no rows costs nothing. The register math (dequantization, scale decodes, the MMA wrapper,
the activation pairing / reorder) and its torch twins live in :mod:`.fp4_math`. This module: the
config, the kernel class (host entry, shared fragment math, pass finishing), compile glue.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

from ...runtime.ptx import ld_global_v4, ld_shared_v4
from .direct import DirectPipeline
from .math import (
    CHUNK_K,
    FP8_CHUNK_K,
    WORD_NAN_MASK,
    dequant_e4m3x4,
    dequant_fp4x8,
    mma_bf16_16816,
    mx_factor_bf16x2,
    nvfp4_factors,
    pair_natural_x,
)
from .ring import RingPipeline
from .wgmma import WgmmaPipeline

__all__ = ["Fp4WeightConfig", "all_configs", "check_variant", "build_fp4_weight", "SASS_REQUIRED"]

FORMATS = ("nvfp4", "mxfp4", "mxfp8")  # mxfp8: e4m3 weights, the ring only (``chunk_k``)
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


@dataclass(frozen=True)
class Fp4WeightConfig:
    """What changes the compiled kernel.

    fmt: ``nvfp4`` | ``mxfp4`` | ``mxfp8`` (e4m3 weights: the ring only); n_tiles: 8-token MMA tiles per pass (tokens per pass = 8 * n_tiles);
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
    # sm_90a: the consumers multiply with the warpgroup MMA (A = the dequantized weights from
    # registers, B = the ring's activations in K order; :mod:`.fp4_wgmma`): two warpgroups of 64
    # weight rows (warps_n 8, row_tiles 1, warps_k 1), producer_pairs=False, 256 K per stage
    # (ring_k 2; MXFP8 4), 128 (ring_k 1; MXFP8 2) or 64 (MXFP8 ring_k 1); up to 128 tokens per
    # pass, 256 (n_tiles 32) with producer_wg, not split, in 128-K stages (MXFP8: 64-K ones).
    wgmma: bool = False
    # WGMMA consumers: the producer is a whole warpgroup (one warp works) that gives its registers
    # to the consumers (setmaxnreg: 40 producer / 232 consumer registers instead of ptxas's even
    # 168 for three warpgroups), so 128-token passes keep their accumulators without spills.
    producer_wg: bool = False
    # WGMMA consumers: k16 steps per commit group (dequantize the group's A fragments, fence, its
    # WGMMAs, commit, wait for the group before): 8 or 4; 0 picks 8, or 4 at 256 tokens per pass
    # (two groups' fragments stay live beside 128 fp32 accumulators per thread).
    wg_steps: int = 0
    # WGMMA consumers: ring stages per consumer loop trip (straight-line code, so consecutive commit
    # groups' A fragments sit in different registers; a trip must hold two groups): 1 or 2; 0
    # picks 2 for stages of one commit group, else 1. A trip of more than two commit groups ends
    # with a wait for all of them (the tensor pipe drains: FP4 at 256 tokens per pass, two 128-K
    # stages of two groups per trip, was 2-5% slower than one stage per trip on the H200).
    wg_trip: int = 0
    # WGMMA consumers, not split: each token pass's outputs go through a small shared-memory
    # buffer (``store_rows`` tokens x 128 rows at a time), so every thread writes 16 contiguous
    # bytes of an output row instead of 2-byte pieces of four rows per warp store (N a multiple of
    # 16 bytes' values and a 16-byte aligned output; else the direct stores).
    staged_store: bool = False
    # WGMMA consumers, dense, not split: the work is dealt in (weight tile, token pass) units
    # instead of a CTA per weight tile running all its passes, the passes of a tile consecutive
    # (their weight reads meet in L2), to the grid's CTAs round-robin (one kernel; the host picks
    # the grid, ``fp4_weight_api.pass_grid_ctas``): 1: a CTA per unit; 2: a persistent grid of
    # one CTA per SM, its ring streaming on from one unit into the next. Finer units: the last
    # wave's share of idle SMs shrinks (the policy takes it where the SM count makes that pay:
    # ``fp4_weight_api.pass_grid_pays``).
    pass_ctas: int = 0
    # With ``pass_ctas`` 2: the units left after the grid's last full round (fewer than its CTAs:
    # the waves' tail) are not dealt whole but cut into equal ranges of K stages over the CTAs
    # (at least ``TAIL_MIN_STAGES`` each), so every SM ends at about the same time; a unit cut
    # between CTAs meets through a workspace (:meth:`WgmmaPipeline.tail_gather`).
    tail_split: bool = False

    def __post_init__(self):
        if self.fmt not in FORMATS:
            raise ValueError(f"Fp4WeightConfig.fmt must be one of {FORMATS}, got {self.fmt!r}")
        if self.n_tiles not in ((1, 2, 4, 8, 16, 32) if self.wgmma else (1, 2, 4, 8)):
            raise ValueError(f"Fp4WeightConfig.n_tiles must be 1, 2, 4 or 8 (16 or 32 with wgmma), got {self.n_tiles}")
        if self.wgmma and (
            self.arch != "sm_90a" or not self.ring or self.ring_k not in ((1, 2, 4) if self.fmt == "mxfp8" else (1, 2))
            or (self.warps_n, self.warps_k, self.row_tiles) != (8, 1, 1) or self.producer_pairs
        ):  # fmt: skip
            raise ValueError(
                "Fp4WeightConfig.wgmma needs sm_90a, the ring with 128 or 256 K per stage (ring_k 1 or 2; mxfp8: 64, 128 "
                "or 256: 1, 2 or 4), warps_n 8, "
                "warps_k 1, row_tiles 1 and producer_pairs=False"
            )
        if self.producer_wg and not self.wgmma:
            raise ValueError("Fp4WeightConfig.producer_wg is for the WGMMA consumers")
        if self.wg_steps not in ((0, 4, 8) if self.wgmma else (0,)):
            raise ValueError(f"Fp4WeightConfig.wg_steps must be 0, 4 or 8 (WGMMA consumers only), got {self.wg_steps}")
        if self.wg_trip not in ((0, 1, 2) if self.wgmma else (0,)):
            raise ValueError(f"Fp4WeightConfig.wg_trip must be 0, 1 or 2 (WGMMA consumers only), got {self.wg_trip}")
        if self.staged_store and (not self.wgmma or self.split):
            raise ValueError("Fp4WeightConfig.staged_store is for the WGMMA consumers without the split grid")
        if self.pass_ctas not in (0, 1, 2):
            raise ValueError(f"Fp4WeightConfig.pass_ctas must be 0, 1 or 2, got {self.pass_ctas}")
        if self.pass_ctas and (not self.wgmma or self.split or self.grouped):
            raise ValueError("Fp4WeightConfig.pass_ctas is for the dense WGMMA consumers without the split grid")
        if self.tail_split and self.pass_ctas != 2:
            raise ValueError("Fp4WeightConfig.tail_split needs the persistent pass grid (pass_ctas 2)")
        if self.wgmma and self.trip_groups < 2:
            # one commit group per trip: the next trip's A fragments could take the in-flight group's registers
            raise ValueError("Fp4WeightConfig: a WGMMA consumer loop trip (wg_trip stages) must hold two commit groups")
        if self.n_tiles == 32 and (not self.producer_wg or self.stage_k != (64 if self.fp8 else 128) or self.split):
            # (MXFP8 weights in 128-K stages: two 81 KB stages fit, 154.5 vs 143.1 us with 128 tokens
            # per pass at M=256)
            raise ValueError(
                "Fp4WeightConfig: 256 tokens per pass (n_tiles 32) need producer_wg and 128-K stages of FP4 weights "
                "(ring_k 1) or 64-K stages of MXFP8 ones (ring_k 1), without the split grid (it spills)"
            )
        if self.fmt == "mxfp8" and (not self.ring or self.producer_pairs):
            raise ValueError("Fp4WeightConfig with mxfp8 weights needs the ring with producer_pairs=False")
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
            if not 2 <= self.ring <= 8 or self.ring_k not in ((1, 2, 4) if self.wgmma else (2, 4)):
                raise ValueError(
                    f"Fp4WeightConfig.ring must be 0 or 2..8 and ring_k 2 or 4 (1: WGMMA), got {self.ring}, {self.ring_k}"
                )
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

    @property
    def fp8(self) -> bool:
        """8-bit (MXFP8 e4m3) weights: a byte per K value instead of a nibble."""
        return self.fmt == "mxfp8"

    @property
    def chunk_k(self) -> int:
        """K values of one 64-byte chunk of a weight row (a thread reads 16 bytes of it): 128 for
        FP4, 64 for 8-bit weights."""
        return FP8_CHUNK_K if self.fp8 else CHUNK_K

    @property
    def stage_k(self) -> int:
        """K values per ring stage."""
        return self.ring_k * self.chunk_k

    @property
    def x_boxes_per_chunk(self) -> int:
        """Activation TMA boxes (64 K values each) per K chunk."""
        return self.chunk_k // 64

    # Ring stage layout (bytes): w_boxes TMA boxes of the CTA's weight rows x w_row_bytes (the
    # stage's K of each row), x_boxes TMA boxes of the pass's tokens x 64 activations (128 bytes),
    # with the 128-byte swizzle (64-byte FP4 weight rows: the 64-byte one), and the scales'
    # 512-byte column groups.
    @property
    def w_stage_row_bytes(self) -> int:
        """Bytes of one weight row's K values in a ring stage."""
        return self.stage_k // (1 if self.fp8 else 2)

    @property
    def w_row_bytes(self) -> int:
        """Bytes of a weight row in one TMA box: 128 (128-byte swizzle), or a whole stage's 64 for
        the WGMMA consumers' ``ring_k`` 1 (128-K stages of FP4 weights, 64-K ones of MXFP8;
        64-byte swizzle)."""
        return min(128, self.w_stage_row_bytes)

    @property
    def w_boxes(self) -> int:
        """Weight TMA boxes per ring stage (8-bit weights with ``ring_k`` 4: two of 128 K)."""
        return self.w_stage_row_bytes // self.w_row_bytes

    @property
    def x_boxes(self) -> int:
        """Activation TMA boxes (64 K values each) per ring stage."""
        return self.x_boxes_per_chunk * self.ring_k

    @property
    def stage_steps(self) -> int:
        """k16 steps of a ring stage."""
        return self.stage_k // 16

    @property
    def group_steps(self) -> int:
        """The WGMMA consumers' k16 steps per commit group (``wg_steps``; 0: 8, 4 at 256 tokens; at
        most a stage's)."""
        return min(self.wg_steps or (4 if self.n_tiles == 32 else 8), self.stage_steps)

    @property
    def trip_stages(self) -> int:
        """The WGMMA consumers' ring stages per loop trip (``wg_trip``; 0: 2 for stages of one
        commit group, else 1)."""
        return self.wg_trip or (2 if self.stage_steps <= self.group_steps else 1)

    @property
    def trip_groups(self) -> int:
        """The WGMMA consumers' commit groups per loop trip (at least 2; more end the trip with a
        wait for all of them)."""
        return self.trip_stages * self.stage_steps // self.group_steps

    @property
    def w_box_bytes(self) -> int:
        return self.rows_per_cta * self.w_row_bytes

    @property
    def x_box_bytes(self) -> int:
        return self.tokens_per_pass * 128

    @property
    def scale_group_k(self) -> int:
        """K values of one 512-byte scale column group (4 columns of the 128x4 layout): 64 for
        NVFP4 (a scale per 16), 128 for MX (a scale per 32)."""
        return 64 if self.fmt == "nvfp4" else 128

    @property
    def scale_groups(self) -> int:
        """Scale column groups copied per ring stage (at least the one holding a shorter stage's K)."""
        return max(1, self.stage_k // self.scale_group_k)

    @property
    def stages_per_scale_group(self) -> int:
        """Ring stages that share one scale column group (2 for MXFP8's 64-K stages, else 1)."""
        return max(1, self.scale_group_k // self.stage_k)

    @property
    def out_bytes(self) -> int:
        """Bytes of one output value."""
        return 4 if self.out_dtype == "fp32" else 2

    @property
    def store_rows(self) -> int:
        """Tokens per round of ``staged_store`` (256 threads x 16 bytes: 16 tokens of 2-byte outputs, 8 of fp32)."""
        return 16 if self.out_bytes == 2 else 8

    @property
    def store_row_bytes(self) -> int:
        """A token's row in the ``staged_store`` buffer: 128 outputs and 16 bytes of padding (the
        consumers' 2- / 4-byte writes, two tokens apart, then fall in different banks)."""
        return 128 * self.out_bytes + 16

    @property
    def side_bytes(self) -> int:
        """Scales of one stage."""
        return self.scale_groups * 512

    @property
    def smem_bytes(self) -> int:
        red = 4 * self.row_tiles * self.n_tiles * 4 * 32 * self.warps_n * (self.warps_k - 1)
        boxes = self.w_boxes * self.w_box_bytes + self.x_boxes * self.x_box_bytes
        staged = self.store_rows * self.store_row_bytes if self.staged_store else 0
        return self.ring * (boxes + self.side_bytes + 16) + red + staged + 1024 + 256

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
            + ("_cpair" if self.ring and not self.producer_pairs and not self.wgmma and not self.fp8 else "")
            + ("_wg" if self.wgmma else "")
            + ("_pwg" if self.producer_wg else "")
            + (f"_g{self.wg_steps}" if self.wg_steps else "")
            + (f"_u{self.wg_trip}" if self.wg_trip else "")
            + ("_ss" if self.staged_store else "")
            + {0: "", 1: "_pc", 2: "_pp"}[int(self.pass_ctas)]
            + ("_ts" if self.tail_split else "")
        )


# --- the kernel ---------------------------------------------------------------------------------
class Fp4WeightKernel(RingPipeline, WgmmaPipeline, DirectPipeline):
    """The FP4-weight kernel: the host entry (``__call__``), the pipelines (:mod:`.fp4_ring`,
    :mod:`.fp4_direct`) and the fragment math and pass finishing they share."""

    def __init__(self, cfg: Fp4WeightConfig):
        self.cfg = cfg
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
            self.launch_ring(mX, mW, mS, mOut, mOffs, mGs, mXs, mWork, m_rows, n, k, batches, n_ctas, slot0,
                             tile_stride, alpha, stream)  # fmt: skip
        else:
            self.launch_direct(mX, mW, mS, mOut, mOffs, mGs, mXs, m_rows, n, k, batches, m_slices, tile_stride,
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
    from ...runtime.cache import KernelCache

    return KernelCache(build_fp4_weight)


def all_configs(arch: str) -> list[Fp4WeightConfig]:
    """The compile-checked variants for ``arch``: every kernel the host policy picks
    (``fp4_weight_api.pick_config``) plus fp32 output and the other pipelines."""
    from .launch import pick_config

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
    from ...runtime.sass import check_sass, wgmma_register_a_hazards

    required = WGMMA_SASS_REQUIRED if cfg.wgmma else RING_SASS_REQUIRED if cfg.ring else SASS_REQUIRED
    extra = wgmma_register_a_hazards if cfg.wgmma else None
    return check_sass(build_fp4_weight(cfg), cfg.arch, required, SASS_FORBIDDEN, extra)


