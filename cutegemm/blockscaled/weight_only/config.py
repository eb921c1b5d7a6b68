"""Fp4WeightConfig: the compile-cache key of the weight-only kernels (FP4 / MXFP8 weights x bf16 /
e4m3 activations), and the rules of its fields."""

from __future__ import annotations

from dataclasses import dataclass

from .math import CHUNK_K, FP8_CHUNK_K

OUT_DTYPE_NAMES = ("bf16", "fp16", "fp32")
FORMATS = ("nvfp4", "mxfp4", "mxfp8")  # mxfp8: e4m3 weights, the ring only (``chunk_k``)


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
    # registers, B = the ring's activations in K order; :mod:`.weight_only.wgmma`): two warpgroups of 64
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
    # the grid, ``weight_only.launch.pass_grid_ctas``): 1: a CTA per unit; 2: a persistent grid of
    # one CTA per SM, its ring streaming on from one unit into the next. Finer units: the last
    # wave's share of idle SMs shrinks (the policy takes it where the SM count makes that pay:
    # ``weight_only.launch.pass_grid_pays``).
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
        if self.out_dtype not in OUT_DTYPE_NAMES:
            raise ValueError(f"Fp4WeightConfig.out_dtype must be one of {sorted(OUT_DTYPE_NAMES)}, got {self.out_dtype!r}")
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
