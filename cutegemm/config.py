"""GemmConfig (the compile-cache key), GemmProblem and ``can_implement``: what the kernels support."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

ARCHS = ("sm_90a", "sm_100a")
INPUT_DTYPES = ("bf16", "fp16")
FP8_DTYPES = ("e4m3", "e5m2")  # dense FP8: K-major A and B, fp32 scales in the epilogue; e5m2 dense only, either side
OUTPUT_DTYPES = ("bf16", "fp16", "fp32")
QUANT_OUT_DTYPES = {"mxfp8": "e4m3", "mxfp4": "u8", "nvfp4": "u8"}  # storage of quantized outputs
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
TMA_ALIGN_BYTES = 16
# Block-scaled (sm_100a): element dtypes, scale dtypes, and the (element, scale, vec) recipes.
BLOCKSCALED_DTYPES = ("e4m3", "e2m1")
SF_DTYPES = ("e8m0", "e4m3")
BLOCKSCALED_RECIPES = {
    ("e4m3", "e8m0", 32): "mxfp8",
    ("e2m1", "e8m0", 32): "mxfp4",
    ("e2m1", "e4m3", 16): "nvfp4",
}
# MXFP8 x MXFP4 (either order): kind::mxf8f6f4, e8m0 scales per 32 K; FP4 unpacked to bytes in smem (K % 128 == 0)
BLOCKSCALED_MIXED = {("e4m3", "e2m1"), ("e2m1", "e4m3")}
ELEMENT_BITS = {"bf16": 16, "fp16": 16, "fp32": 32, "e4m3": 8, "e5m2": 8, "e2m1": 4, "u8": 8}
GATHER_K_TILES = (64, 128, 256)  # K-grouped gathering: the gathered operand's tile (128 cp.async threads)
PROMOTE_TILE_N = (64, 128, 192)  # the tile widths FP8 with promote_k runs
QUANT_FORMATS = ("mxfp8", "mxfp4", "nvfp4")  # quantized outputs (epilogue.quant)
MAX_EPILOGUE_ARGS = 4  # vectors a user epilogue may take (epilogue.user)
EPI_DTYPES = ("bf16", "fp16", "fp32")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "relu_sq", "tanh", "sigmoid")
GATED = ("swiglu", "geglu", "geglu_tanh", "reglu", "glu", "swiglu_oai")  # epilogue.ops.gated_out


@dataclass(frozen=True)
class EpilogueSpec:
    """What the epilogue does to the fp32 accumulator before the cast (formulas and order:
    :mod:`cutegemm.epilogue.ops`). Disabled ops emit no code.

    alpha: multiply by a runtime fp32 scalar (``alpha == 1`` costs nothing when False).
    beta: add ``beta * C`` (runtime fp32 scalar; C an input tensor of the output's shape, row
        major, dtype ``c_dtype``).
    bias: add a per-GEMM-column vector of dtype ``bias_dtype``.
    activation: None | one of ACTIVATIONS (relu_sq: relu(y)^2; gelu: erf), applied last.
    gated: None | one of GATED: act(gate) * up (ops.gated_out); the output has
        half the GEMM's columns; B's columns alternate gate, up. Excludes activation and beta.
    preact: gated: also store the values before the gate (all GEMM columns) to a second output.
    c_dtype / bias_dtype: dtypes of C and bias; "fp32" when the op is off (one kernel, one key).
    quant: None | "mxfp8" | "mxfp4" | "nvfp4": the output is block-quantized along its columns
        (see :mod:`cutegemm.epilogue.quant`): data (e4m3, or e2m1 pairs as bytes) plus 128x4
        swizzled scale factors, written by the kernel.
    user: key of a registered user-defined epilogue (:mod:`cutegemm.epilogue.user`), applied to
        ``alpha * acc`` instead of beta / bias / activation; user_args: dtypes of its vectors.
    """

    alpha: bool = False
    beta: bool = False
    bias: bool = False
    activation: str | None = None
    gated: str | None = None
    preact: bool = False
    c_dtype: str = "fp32"
    bias_dtype: str = "fp32"
    quant: str | None = None
    user: str | None = None
    user_args: tuple = ()
    scale_a: bool = False  # FP8: multiply by an fp32 per-row (or per-tensor) scale of A
    scale_b: bool = False  # FP8: multiply by an fp32 per-column (or per-tensor) scale of B

    def __post_init__(self):
        err = []
        if self.quant is not None and self.quant not in QUANT_FORMATS:
            err.append(f"quant must be None or one of {QUANT_FORMATS}, got {self.quant!r}")
        if self.user is not None:
            if self.beta or self.bias or self.activation or self.gated:
                err.append("a user epilogue replaces beta / bias / activation / gated: leave them off")
            if len(self.user_args) > MAX_EPILOGUE_ARGS:
                err.append(f"a user epilogue takes at most {MAX_EPILOGUE_ARGS} vectors, got {len(self.user_args)}")
            for d in self.user_args:
                if d not in EPI_DTYPES:
                    err.append(f"user_args dtypes must be in {EPI_DTYPES}, got {d!r}")
        elif self.user_args:
            err.append("user_args without a user epilogue")
        if (self.scale_a or self.scale_b) and self.user is not None:
            err.append("scale_a / scale_b (FP8 scales) cannot be combined with a user epilogue yet")
        for f in ("alpha", "beta", "bias"):
            if not isinstance(getattr(self, f), bool):
                err.append(f"{f} must be a bool, got {getattr(self, f)!r}")
        if self.activation is not None and self.activation not in ACTIVATIONS:
            err.append(f"activation must be None or one of {ACTIVATIONS}, got {self.activation!r}")
        if self.gated is not None and self.gated not in GATED:
            err.append(f"gated must be None or one of {GATED}, got {self.gated!r}")
        if self.gated is not None and self.activation is not None:
            err.append(f"gated={self.gated!r} already applies its activation; activation must be None")
        if self.gated is not None and self.beta:
            err.append("beta * C cannot be combined with a gated activation")
        if self.preact and (self.gated is None or self.quant is not None):
            err.append("preact stores the pre-activation values of a gated epilogue (no quantized output)")
        for f, on in (("c_dtype", self.beta), ("bias_dtype", self.bias)):
            v = getattr(self, f)
            if v not in EPI_DTYPES:
                err.append(f"{f} must be one of {EPI_DTYPES}, got {v!r}")
            elif not on and v != "fp32":
                err.append(f"{f}={v!r} without {'beta' if f == 'c_dtype' else 'bias'}=True: leave it at 'fp32'")
        if err:
            raise ValueError("invalid EpilogueSpec: " + "; ".join(err))

    @property
    def name(self) -> str:
        parts = [f"scale{'a' * self.scale_a}{'b' * self.scale_b}"] if self.scale_a or self.scale_b else []
        if self.alpha:
            parts.append("alpha")
        if self.beta:
            parts.append(f"beta{self.c_dtype}")
        if self.bias:
            parts.append(f"bias{self.bias_dtype}")
        if self.activation:
            parts.append(self.activation)
        if self.gated:
            parts.append(self.gated + "z" * self.preact)
        if self.user:
            parts.append(f"user{self.user}" + "".join(f"-{d}" for d in self.user_args))
        if self.quant:
            parts.append(f"q{self.quant}")
        return "+".join(parts) if parts else "identity"

    @property
    def needs_coords(self) -> bool:
        """Whether the kernel must give each accumulator element its global coordinate."""
        return bool(self.beta or self.bias or self.gated or self.quant or self.user or self.scale_a or self.scale_b)

    @property
    def light(self) -> bool:
        """No C, bias, quantized output, user epilogue or Z output (what sm_90a pingpong 128x192 takes)."""
        return not (self.beta or self.bias or self.quant or self.user or self.preact)

    @property
    def cols_per_output(self) -> int:
        """GEMM columns per output column (2 for gated)."""
        return 2 if self.gated else 1


class Form(str, Enum):
    """Which operands a launch takes and how its tiles map onto them (one per config).

    DENSE: (L,) M x K times K x N through the kernel's (M, K, L) / (N, K, L) / (M, N, L) views.
    FLAT: L = 1, A (M, K), B (K, N), C (M, N) passed as torch holds them (no per-call views).
    GROUPED: MoE packed form: A (total_M, K) split into experts by a device ``offs``, B (E, N, K).
    KGROUPED: weight gradient (sm_90a): ``offs`` splits K of A (M, total_K) and B (total_K, N) into
        experts, output (E, M, N); each tile reads its K range from offs and zeroes the K values
        outside it in its first and last stages.
    LISTED: G groups of any (M_g, N_g, K_g) with their own tensors: a device table (pointers,
        shapes, leading dims, first tiles) in the offs slot, one TMA descriptor per group and operand
        written by a prep kernel; the launch's A, B, C are group 0's.
    The value is the form's name in ``GemmConfig.name``."""

    DENSE = "dense"
    FLAT = "dense-2d"
    GROUPED = "grouped"
    KGROUPED = "kgrouped"
    LISTED = "listed"

    def __repr__(self) -> str:  # GemmConfig's repr stays valid Python (compile logs are replayed)
        return f"Form.{self.name}"


@dataclass(frozen=True)
class GemmConfig:
    """Everything that changes the compiled kernel. Frozen and hashable: it is the cache key.

    tile_m/tile_n: the CTA tile (sm_100a with two_cta: the MMA tile of the CTA pair, so the CTA
    tile is tile_m/2 x tile_n). stages=0 picks as many A/B stages as shared memory holds.
    raster/group: tile order of the persistent scheduler (see schedulers/static.py); grouped: the
    order inside each expert (schedulers/grouped.py; raster "m" with group 1 is m fastest over the
    whole expert, the policy's choice for most shapes).
    scheduler: "static" (strided walk), "dynamic" (global atomic tile counter, both archs; every
    launch leaves it at 0 for the next) or "clc" (sm_100a cluster launch control);
    the dynamic ones need the cooperative schedule (see schedulers/dynamic.py).
    pingpong (sm_90a): the two consumer warpgroups take alternate tiles, so one runs its epilogue
    while the other runs its mainloop; tile_m x tile_n is then one warpgroup's tile (<= 128x128
    or 64x256: 128 fp32 accumulators a thread; 128x192 for 16-bit inputs and light epilogues).
    Otherwise "cooperative": the warpgroups split every tile along M (tile_m // 64 of them).
    """

    arch: str
    a_dtype: str = "bf16"
    b_dtype: str = "bf16"
    out_dtype: str = "bf16"
    a_major: str = "k"  # "k" (row-major A) | "m" (column-major A)
    b_major: str = "n"  # "n" (row-major B) | "k" (column-major B, e.g. weight.t())
    tile_m: int = 128
    tile_n: int = 256
    cluster_m: int = 1
    cluster_n: int = 1
    stages: int = 0
    # sm_90a epilogue buffers (TMA-store ring). 0 = auto: 4 (cooperative) / 2 per warpgroup
    # (pingpong), fewer (down to 2) when that frees shared memory for one more A/B stage.
    epi_stages: int = 0
    two_cta: bool = False
    pingpong: bool = False  # sm_90a: each consumer warpgroup owns whole tiles, alternating
    form: Form = Form.DENSE  # dense, flat 2-D, grouped (MoE packed), K-grouped or list form (Form)
    raster: str = "m"
    group: int = 8
    scheduler: str = "static"
    epilogue: EpilogueSpec = field(default_factory=EpilogueSpec)
    # Block-scaled MMA (sm_100a): a_dtype/b_dtype in BLOCKSCALED_DTYPES, one scale of sf_dtype per
    # sf_vec elements along K (128x4 swizzled layout). sf_vec=0: not block-scaled.
    sf_dtype: str = ""
    sf_vec: int = 0
    # FP8 (sm_90a): False promotes the WGMMA partial sums into fp32 every K tile (accurate, as
    # torch._scaled_mm's default); True accumulates in the tensor core only (use_fast_accum=True).
    fast_accum: bool = False
    # FP8 with promotion (sm_90a, plain mainloop): K per promoted partial sum, 32 or 64 (a new
    # partial sum every one or two WGMMAs, waited for in the K tile); 0: the K tile (128).
    promote_k: int = 0
    # FP8 (sm_90a) DeepSeek-V3 block scaling: fp32 scales per 1x128 block of A and 128x128 block of B, applied
    # to every K tile's (128) promoted WGMMA partial sum in the mainloop; the kernel's mSFA / mSFB.
    fp8_blockwise: bool = False
    # fp8_blockwise, dense: B's scales per column and K block (1x128 blocks of B, (N, K/128) N-major: torch's
    # BlockWise1x128), riding the stage ring beside A's; each column's own scale in the promotion.
    sfb_cols: bool = False
    # FP8 with promotion, cooperative sm_90a: the consumer warpgroups issue each K tile's WGMMAs in
    # turn (named barriers), so one's promotion adds run while the tensor cores do the other's.
    wg_order: bool = False
    # MXFP8 emulation (sm_90a has no block-scaled MMA): e4m3 A and B, an e8m0 scale per 32 K of a row of A /
    # column of B, decoded to fp32 on the host (``blockscaled.mx_sm90``); each 32-wide WGMMA's partial sum is
    # promoted as acc += partial * scale_a[row] * scale_b[col], the scales riding the TMA stage ring.
    fp8_mx: bool = False
    # Grouped packed form, sm_90a, "swap AB": C^T = B^T A^T, a tile's M over one expert's weight columns, its
    # N over the expert's tokens (split evenly); each tile's WGMMAs cut to its real tokens rounded up to 16, and
    # only the 32-row TMA chunks holding them loaded: a ragged last tile costs neither (gemm/sm90/swap.py).
    swap_ab: bool = False
    # Dense sm_90a, split K: each tile's K tiles cut into split_k equal ranges (adjacent work units) writing fp32
    # partial sums to the workspace; the unit completing the tile's count adds them in range order (the same
    # bits whatever the arrival order) and runs the epilogue (gemm/sm90/split.py).
    split_k: int = 1
    split_cluster: bool = False  # split K in one cluster's CTAs: ranges 1.. st.async partial sums to range 0
    split_tail: bool = False  # split K of the tiles past the whole waves only (schedulers/static.py)
    # Dense sm_90a, one M tile (decode): A's TMA box is a_rows rows (M rounded up to 8 or 16s), not tile_m (the
    # TMA unit's zero fill costs time); the consumers zero rows a_rows..tile_m once instead. 0: whole tile.
    a_rows: int = 0
    # Packed form: A's rows through an index (a_index: packed row -> row of A; sm_90a cp.async, sm_100a TMA
    # gather4). K-grouped, sm_90a: A's K columns (gather_a) or B's K rows (gather_b) through it.
    gather_a: bool = False
    gather_b: bool = False
    c_major: str = "n"  # C's unit-stride mode: "n" (row-major) | "m" (sm_90a, 16-bit C: c_major_ok)

    @property
    def blockscaled(self) -> bool:
        return self.sf_vec > 0

    def __post_init__(self):
        if not isinstance(self.form, Form):  # a string such as "grouped" is accepted too
            object.__setattr__(self, "form", Form(self.form))

    # The form as booleans, for the rules and the kernels' branches.
    grouped = property(lambda self: self.form is Form.GROUPED)
    flat = property(lambda self: self.form is Form.FLAT)
    kgrouped = property(lambda self: self.form is Form.KGROUPED)
    listed = property(lambda self: self.form is Form.LISTED)
    gathers = property(lambda self: self.gather_a or self.gather_b)  # an operand read through an index
    fp8 = property(lambda self: self.a_dtype in FP8_DTYPES)  # FP8 (e4m3 / e5m2) A

    @property
    def name(self) -> str:
        """Spells out family, dtypes, majors, tile, epilogue, scheduler and arch."""
        tile = f"{self.tile_m}x{self.tile_n}" + ("_2cta" if self.two_cta else "") + ("_pp" if self.pingpong else "")
        tile += "_fastacc" if self.fast_accum else ""
        tile += f"_pk{self.promote_k}" if self.promote_k else ""
        tile += ("_bw128" + ("c" if self.sfb_cols else "") if self.fp8_blockwise else "") + ("_mx32" if self.fp8_mx else "")
        tile += ("_wgo" if self.wg_order else "") + ("_swab" if self.swap_ab else "")
        tile += f"_sk{self.split_k}" if self.split_k > 1 else ""
        tile += ("c" if self.split_cluster else "") + ("t" if self.split_tail else "")
        tile += f"_ar{self.a_rows}" if self.a_rows else ""
        tile += ("_ga" if self.gather_a else "") + ("_gb" if self.gather_b else "") + ("_cm" if self.c_major == "m" else "")
        tile += f"_e{self.epi_stages}" if self.epi_stages else ""
        tile += f"_s{self.stages}" if self.stages else ""
        family = Form(self.form).value
        if self.blockscaled:
            family += f"-bs-{self.sf_dtype}v{self.sf_vec}"
        return (f"{family}_{self.a_dtype}{self.b_dtype}_{self.out_dtype}_{self.a_major}{self.b_major}_t{tile}"
                f"_c{self.cluster_m}x{self.cluster_n}_epi-{self.epilogue.name}_{self.scheduler}-{self.raster}{self.group}_{self.arch}")  # fmt: skip


@dataclass(frozen=True)
class GemmProblem:
    """One (batched) problem: C[l] = A[l] @ B[l], A (M, K), B (K, N), C (M, N)."""

    m: int
    n: int
    k: int
    l: int = 1
    a_dtype: str = "bf16"
    b_dtype: str = "bf16"
    out_dtype: str = "bf16"
    a_major: str = "k"
    b_major: str = "n"
    # Element strides of the non-unit modes (None: compact), checked for TMA's 16-byte rule.
    a_strides: tuple[int, ...] | None = None
    b_strides: tuple[int, ...] | None = None
    out_strides: tuple[int, ...] | None = None


def config_errors(cfg: GemmConfig) -> list[str]:
    """Rules on the config alone (independent of problem size)."""
    err = []
    if cfg.arch not in ARCHS:
        err.append(f"arch {cfg.arch!r} not in {ARCHS}")
    if cfg.fast_accum and (not cfg.fp8 or cfg.arch != "sm_90a"):
        err.append("fast_accum is an sm_90a FP8 option (the sm_100a policy drops it: no promotion there)")
    if cfg.promote_k and (cfg.promote_k not in (32, 64) or not cfg.fp8 or cfg.fast_accum or cfg.fp8_blockwise
                          or cfg.arch != "sm_90a" or cfg.fp8_mx or cfg.wg_order or cfg.swap_ab or cfg.kgrouped or cfg.pingpong
                          or cfg.tile_n not in PROMOTE_TILE_N):  # fmt: skip
        err.append("promote_k (32 or 64): sm_90a FP8 with promotion, cooperative, tile_n 64 / 128 / 192; not "
                   "fast_accum, fp8_blockwise, fp8_mx, wg_order, swap_ab or K-grouped")  # fmt: skip
    if cfg.gather_a and not cfg.kgrouped and (not cfg.grouped or cfg.a_dtype not in INPUT_DTYPES or cfg.swap_ab
                                              or cfg.cluster_n != 1 or cfg.scheduler != "static" or cfg.a_major != "k"):  # fmt: skip
        err.append("gather_a: the packed grouped form with 16-bit operands, A K-major and not multicast (cluster_n "
                   "1), the static scheduler, not swap_ab; or the K-grouped form")  # fmt: skip
    err += ["gather_b: the K-grouped form only"] if cfg.gather_b and not cfg.kgrouped else []
    if cfg.sfb_cols and (not cfg.fp8_blockwise or cfg.form is not Form.DENSE or cfg.split_k > 1):
        err.append("sfb_cols (per-column 1x128 B scales): fp8_blockwise, the dense form, not split K")
    if cfg.c_major != "n" and not c_major_ok(cfg):
        err.append(f"c_major: 'n', or 'm' on sm_90a with a 16-bit C for the K-grouped form or the packed form (not "
                   f"swap_ab, no gated / quantized / preact epilogue); got {cfg.c_major!r}")  # fmt: skip
    if cfg.epilogue.preact and (cfg.arch != "sm_90a" or cfg.form not in (Form.DENSE, Form.GROUPED) or cfg.swap_ab
                                or cfg.split_k != 1 or cfg.out_dtype not in INPUT_DTYPES):  # fmt: skip
        err.append("preact (a gated epilogue's second output): sm_90a dense or packed grouped, bf16 / fp16 "
                   "output, not swap_ab or split K")  # fmt: skip
    if cfg.fp8_blockwise:
        err += fp8_blockwise_errors(cfg)
    if cfg.wg_order and (cfg.arch != "sm_90a" or not cfg.fp8 or cfg.fast_accum or cfg.fp8_mx or cfg.pingpong or cfg.tile_m != 128):
        err.append("wg_order: sm_90a FP8 with promotion (not fast_accum / fp8_mx), cooperative 128-row tiles only")
    if cfg.fp8_mx:
        err += fp8_mx_errors(cfg)
    if cfg.kgrouped:
        err += kgrouped_errors(cfg)
    if cfg.listed:
        err += listed_errors(cfg)
    if cfg.swap_ab:
        err += swap_ab_errors(cfg)
    if cfg.split_k != 1 or cfg.split_cluster or cfg.split_tail:
        err += split_k_errors(cfg)
    if cfg.a_rows:
        err += a_rows_errors(cfg)
    if cfg.flat and (cfg.grouped or cfg.blockscaled or cfg.epilogue.quant or cfg.epilogue.beta):
        err.append("flat (2-D launch): dense only, not block-scaled, no quantized output, no beta * C")
    if cfg.blockscaled:
        err += blockscaled_errors(cfg)
    elif cfg.sf_dtype:
        err.append(f"sf_dtype={cfg.sf_dtype!r} needs sf_vec > 0 (block-scaled)")
    elif cfg.fp8 and cfg.b_dtype in FP8_DTYPES:
        if cfg.a_major != "k" or cfg.b_major != "k":  # (sm_100a's UMMA could read MN-major FP8: not built)
            err.append("FP8 needs K-major A and B (a_major='k', b_major='k')")
        if "e5m2" in (cfg.a_dtype, cfg.b_dtype) and cfg.form not in (Form.DENSE, Form.FLAT):
            err.append(f"e5m2 operands: the dense form only, got {cfg.a_dtype}/{cfg.b_dtype} {Form(cfg.form).value}")
        if cfg.arch == "sm_90a" and not cfg.fast_accum and (cfg.tile_m * cfg.tile_n // (1 if cfg.pingpong else cfg.tile_m // 64)) > 64 * 192:
            err.append("FP8 with promotion holds two fp32 accumulators: at most 64x192 per warpgroup "
                       f"(tile {cfg.tile_m}x{cfg.tile_n}{' pingpong' if cfg.pingpong else ''}); or fast_accum=True")  # fmt: skip
    elif cfg.a_dtype not in INPUT_DTYPES or cfg.b_dtype != cfg.a_dtype:
        err.append(f"a/b dtype must be equal and one of {INPUT_DTYPES}, or both FP8 {FP8_DTYPES}; got {cfg.a_dtype}/{cfg.b_dtype}")
    epi = cfg.epilogue
    if epi.quant is not None:
        if cfg.out_dtype != QUANT_OUT_DTYPES[epi.quant]:
            err.append(f"quantized output {epi.quant} is stored as {QUANT_OUT_DTYPES[epi.quant]!r}, got out dtype {cfg.out_dtype!r}")
        if cfg.arch == "sm_100a" and cfg.tile_m // (2 if cfg.two_cta else 1) != 128:
            err.append("quantized-output epilogue on sm_100a: 128 rows per CTA (a thread must own whole rows)")
    elif cfg.out_dtype in FP8_DTYPES and (not cfg.fp8 or cfg.form not in (Form.DENSE, Form.FLAT) or cfg.c_major != "n"
                                          or epi.gated or epi.preact or epi.user or cfg.fp8_blockwise):  # fmt: skip
        err.append(f"out dtype {cfg.out_dtype!r} (an FP8 output, stored by coordinate, saturated): FP8 operands in the dense "
                   "kernel, per-tensor or row-wise scales, no gated, preact or user epilogue")  # fmt: skip
    elif cfg.out_dtype not in (*OUTPUT_DTYPES, *FP8_DTYPES):
        err.append(f"out dtype {cfg.out_dtype!r} not in {OUTPUT_DTYPES} (FP8 operands: or {FP8_DTYPES})")
    if cfg.a_major not in ("k", "m") or cfg.b_major not in ("k", "n"):
        err.append(f"a_major must be 'k' or 'm' and b_major 'k' or 'n', got {cfg.a_major!r} / {cfg.b_major!r}")
    for v, nm in ((cfg.cluster_m, "cluster_m"), (cfg.cluster_n, "cluster_n")):
        if v not in (1, 2, 4):
            err.append(f"{nm} must be 1, 2 or 4, got {v}")
    if cfg.cluster_m * cfg.cluster_n > 4:
        err.append("cluster size must be <= 4")
    if cfg.raster not in ("m", "n") or cfg.group < 1:
        err.append(f"raster must be 'm'/'n' and group >= 1, got {cfg.raster!r}/{cfg.group}")
    err += scheduler_errors(cfg)
    if cfg.grouped:
        if cfg.a_major != "k":
            err.append("grouped: A must be row-major (a_major='k')")
        if cfg.cluster_m != 1 and (cfg.arch != "sm_90a" or cfg.cluster_m != 2):
            err.append("grouped: cluster_m must be 1 (sm_90a: 1 or 2; the CTAs of a 2x1 cluster take two "
                       "consecutive m-tiles of one expert and share its B tile by multicast)")  # fmt: skip
        if cfg.epilogue.beta:
            err.append("grouped: beta * C is not supported (bias, activations, gated, quantized and user epilogues are)")
        if cfg.arch == "sm_100a" and cfg.two_cta:
            err.append("grouped: sm_100a supports 1-CTA MMA only (two_cta=False); a 2-CTA pair would need "
                       "cluster_m=2 sharing one expert m-tile and per-CTA row predicates, not implemented")  # fmt: skip
    if cfg.stages not in (0,) and not 2 <= cfg.stages <= 12:
        err.append(f"stages must be 0 (auto) or 2..12, got {cfg.stages}")
    if cfg.epi_stages and (cfg.arch != "sm_90a" or not 2 <= cfg.epi_stages <= 8):
        err.append(f"epi_stages: 0 (auto) or 2..8, sm_90a only (sm_100a sizes its ring itself), got {cfg.epi_stages}")
    if cfg.arch == "sm_90a":
        if cfg.two_cta:
            err.append("two_cta is an sm_100a feature")
        if cfg.pingpong and cfg.tile_m * cfg.tile_n > 128 * (192 if not cfg.fp8 and cfg.epilogue.light else 128):
            err.append(f"sm_90a pingpong tile must hold <= 128x128 accumulators per warpgroup (128x192: 16-bit, no beta, bias, quant, user or preact), got {cfg.tile_m}x{cfg.tile_n}")  # fmt: skip
        tall = not (cfg.pingpong or cfg.fp8 or cfg.split_k > 1 or cfg.form not in (Form.DENSE, Form.FLAT) or cfg.epilogue.quant)
        if cfg.tile_m not in (64, 128) and (cfg.tile_m != 192 or not tall):
            err.append(f"sm_90a tile_m must be 64 or 128 (192: 16-bit dense cooperative, unsplit, no quantized output), got {cfg.tile_m}")
        if cfg.tile_n not in SM90_TILE_N and not cfg.swap_ab:
            err.append(f"sm_90a tile_n must be one of {SM90_TILE_N}, got {cfg.tile_n}")
        elif cfg.tile_n in (80, 96, 224) and (cfg.form not in (Form.DENSE, Form.FLAT) or cfg.fp8 or cfg.epilogue.quant):
            err.append(f"sm_90a tile_n {cfg.tile_n}: 16-bit dense, no quantized output, so far (the variants run on a GPU)")
        elif cfg.tile_n == 80 and (cfg.pingpong or cfg.split_k > 1 or cfg.epilogue.gated or cfg.epilogue.preact or cfg.epilogue.user):  # fmt: skip
            err.append("sm_90a tile_n 80 (16-column epilogue subtiles): cooperative, unsplit, no gated, preact or user epilogue")
    elif cfg.arch == "sm_100a":
        if cfg.pingpong:
            err.append("pingpong is an sm_90a schedule")
        ok_m = (128, 256) if cfg.two_cta else (64, 128)
        if cfg.tile_m not in ok_m:
            err.append(f"sm_100a tile_m must be in {ok_m} (two_cta={cfg.two_cta}), got {cfg.tile_m}")
        if cfg.tile_n % 32 or not 32 <= cfg.tile_n <= 256:
            err.append(f"sm_100a tile_n must be a multiple of 32 in [32, 256], got {cfg.tile_n}")
        if cfg.two_cta and cfg.cluster_m % 2:
            err.append("two_cta needs cluster_m to be even")
    return err


SCHEDULERS = ("static", "dynamic", "clc")


def scheduler_errors(cfg: GemmConfig) -> list[str]:
    """static, dynamic (atomic counter), clc (cluster launch control, sm_100a). The dynamic ones
    broadcast each tile to every role: not with sm_90a pingpong (tiles alternate by position)."""
    if cfg.scheduler not in SCHEDULERS:
        return [f"scheduler must be one of {SCHEDULERS}, got {cfg.scheduler!r}"]
    err = []
    if cfg.scheduler == "clc" and cfg.arch != "sm_100a":
        err.append(f"scheduler 'clc' (cluster launch control) is an sm_100a feature, got arch {cfg.arch!r}")
    if cfg.scheduler != "static" and cfg.pingpong:
        err.append(f"scheduler {cfg.scheduler!r} supports the cooperative schedule only (pingpong=False)")
    return err


def fp8_blockwise_errors(cfg: GemmConfig) -> list[str]:
    """DeepSeek-style FP8 block scaling (sm_90a): the scales multiply each 128-wide K tile's partial
    sum as it is promoted, so a tile sees one or two B scales per K tile (tile_n 192: two)."""
    what = "fp8_blockwise (1x128 / 128x128 FP8 scales)"
    err = _fp8_scaled_mainloop_errors(cfg, what)
    if cfg.fast_accum:
        err.append(f"{what} scales the promoted partial sums: fast_accum must be False")
    if cfg.tile_n not in (64, 128, 192):
        err.append(f"{what}: tile_n must be 64, 128 (one 128-column scale block of B per tile) or 192 "
                   f"(two blocks, split 64 or 128 columns in), got {cfg.tile_n}")  # fmt: skip
    if cfg.blockscaled or cfg.sf_dtype:
        err.append(f"{what} cannot be combined with sm_100a block-scaled MMA (sf_vec/sf_dtype)")
    return err


def _fp8_scaled_mainloop_errors(cfg: GemmConfig, what: str) -> list[str]:
    """The rules both sm_90a scale-in-the-mainloop modes (fp8_blockwise, fp8_mx) share."""
    err = []
    if cfg.arch != "sm_90a":
        err.append(f"{what} is an sm_90a kernel, got arch {cfg.arch!r}")
    if cfg.a_dtype != "e4m3" or cfg.b_dtype != "e4m3":
        err.append(f"{what} needs e4m3 A and B, got {cfg.a_dtype}/{cfg.b_dtype}")
    if cfg.a_major != "k" or cfg.b_major != "k":
        err.append(f"{what} needs K-major A and B (a_major='k', b_major='k')")
    if cfg.epilogue.scale_a or cfg.epilogue.scale_b:
        err.append(f"{what} cannot be combined with per-row/per-column epilogue scales (scale_a/scale_b vectors)")
    return err


def kgrouped_errors(cfg: GemmConfig) -> list[str]:
    """K-grouped: bf16 / fp16, alpha only; sm_100a runs the list-form kernel on a table written
    from offs (an expert's M-major A / N-major B start 16-byte aligned; 1x1, 1-CTA, static)."""
    err = _alpha_only_errors(cfg, what := "kgrouped (K-grouped form)", cfg.grouped or cfg.listed, ("sm_90a", "sm_100a"))
    if cfg.arch == "sm_100a" and (cfg.a_major + cfg.b_major != "mn" or cfg.cluster_m * cfg.cluster_n > 1 or cfg.two_cta
                                  or cfg.scheduler != "static"):  # fmt: skip
        err.append(f"{what} on sm_100a: M-major A, N-major B, cluster 1x1, 1-CTA, the static scheduler")
    if cfg.gathers and (cfg.gather_a == cfg.gather_b or cfg.arch != "sm_90a" or (cfg.cluster_m, cfg.cluster_n)[cfg.gather_a] > 1
                        or cfg.scheduler != "static" or (cfg.a_major, cfg.b_major)[cfg.gather_b] not in "mn"
                        or (cfg.tile_n if cfg.gather_b else cfg.tile_m) not in GATHER_K_TILES):  # fmt: skip
        err.append(f"{what} gathering one operand (gather_a / gather_b): sm_90a, that operand MN-major, its tile "
                   "64, 128 or 256 and not multicast (gather_a: cluster_n 1, gather_b: cluster_m 1), static")  # fmt: skip
    return err


def listed_errors(cfg: GemmConfig) -> list[str]:
    """The list-form kernel (sm_90a; sm_100a 1-CTA): the K-grouped kernel's rules plus elementwise
    activations and, on sm_100a, CLC; no cluster (a peer CTA's tile may be another group's)."""
    what = "listed (list form)"
    err = _alpha_only_errors(cfg, what, cfg.grouped or cfg.kgrouped, archs=("sm_90a", "sm_100a"), activation=True,
                             clc=cfg.arch == "sm_100a")  # fmt: skip
    if cfg.cluster_m != 1 or cfg.cluster_n != 1 or cfg.two_cta:
        err.append(f"{what}: cluster 1x1, 1-CTA MMA")
    return err


def _alpha_only_errors(cfg: GemmConfig, what: str, other_form: bool, archs=("sm_90a",), activation=False,
                       clc=False) -> list[str]:  # fmt: skip
    """bf16 / fp16 A and B on ``archs``, no other form or scaled mode, alpha the only epilogue op
    (``activation``: and an elementwise one), static or dynamic scheduler (``clc``: or CLC)."""
    err = []
    if cfg.arch not in archs:
        err.append(f"{what} is an {' / '.join(archs)} kernel, got arch {cfg.arch!r}")
    if cfg.a_dtype not in INPUT_DTYPES or cfg.b_dtype != cfg.a_dtype:
        err.append(f"{what}: bf16 or fp16 A and B, got {cfg.a_dtype}/{cfg.b_dtype}")
    if other_form or cfg.flat or cfg.blockscaled or cfg.fp8_blockwise or cfg.fp8_mx:
        err.append(f"{what} cannot be combined with another grouped form, flat or scaled modes")
    epi = cfg.epilogue
    if epi.beta or epi.bias or (epi.activation and not activation) or epi.gated or epi.quant or epi.user or epi.scale_a or epi.scale_b:
        err.append(f"{what}: alpha is the only epilogue op" + (" (and relu / gelu / gelu_tanh / silu)" if activation else ""))
    if cfg.scheduler == "clc" and not clc:
        err.append(f"{what}: static or dynamic scheduler")
    return err


SWAP_CHUNK = 32  # swap_ab: tokens per TMA chunk of the token operand
SWAP_STEP = 16  # swap_ab: WGMMA widths run over multiples of this many tokens


def c_major_ok(cfg: GemmConfig) -> bool:
    """Where C may be stored M-major (``c_major`` "m"): sm_90a, a 16-bit C; the K-grouped form, or
    the packed form with a plain epilogue and no swap_ab (the swapped kernel stores C^T)."""
    epi = cfg.epilogue
    plain = cfg.grouped and not (cfg.swap_ab or epi.gated or epi.quant or epi.preact)
    return cfg.c_major == "m" and cfg.arch == "sm_90a" and cfg.out_dtype in INPUT_DTYPES and (cfg.kgrouped or plain)


def swap_ab_epilogue(epi: EpilogueSpec) -> bool:
    """Whether the swapped grouped kernel takes this epilogue: alpha, bias, elementwise and
    gated activations, FP8 row-wise scales (quantized outputs and user epilogues work on the
    stored output's rows, which the swapped accumulator holds as columns)."""
    return not (epi.beta or epi.quant or epi.user)


def swap_ab_errors(cfg: GemmConfig) -> list[str]:
    """Rules of the swapped grouped kernel (``GemmConfig.swap_ab``): sm_90a packed grouped form,
    bf16 / fp16 / e4m3 (FP8: the common rules hold, e.g. promotion up to tile_n 192, weights
    K-major), cooperative 128-row (weight) tiles, tile_n tokens a multiple of 32, clusters
    only along the weights (cluster_n 1: the CTAs of a cluster share the token tile by multicast),
    and the epilogues of :func:`swap_ab_epilogue`."""
    what = "swap_ab (grouped, tokens as the WGMMA's N)"
    err = []
    if cfg.arch != "sm_90a" or not cfg.grouped:
        err.append(f"{what} is an sm_90a packed grouped kernel (form=Form.GROUPED)")
    if cfg.a_dtype not in (*INPUT_DTYPES, "e4m3") or cfg.b_dtype != cfg.a_dtype:
        err.append(f"{what}: bf16, fp16 or e4m3 A and B, got {cfg.a_dtype}/{cfg.b_dtype}")
    if cfg.pingpong or cfg.tile_m != 128 or cfg.tile_n % SWAP_CHUNK or not 32 <= cfg.tile_n <= 256:
        err.append(f"{what}: cooperative 128 x tile_n tiles, tile_n a multiple of {SWAP_CHUNK} up to 256")
    if cfg.cluster_n != 1 or (cfg.tile_n // SWAP_CHUNK) % cfg.cluster_m:
        err.append(f"{what}: cluster_n must be 1 (cluster_m CTAs share one token tile, issuing its "
                   f"{SWAP_CHUNK}-token chunks in turn: tile_n / {SWAP_CHUNK} a multiple of cluster_m)")
    if not swap_ab_epilogue(cfg.epilogue):
        err.append(f"{what}: alpha, bias, elementwise and gated activations are its epilogue ops")
    if cfg.fp8_blockwise or cfg.fp8_mx or cfg.blockscaled or cfg.flat:
        err.append(f"{what} cannot be combined with scaled or flat modes")
    return err


SM90_TILE_N, SPLIT_K_CHOICES = (64, 80, 96, 128, 160, 192, 224, 256), (2, 3, 4, 5, 6, 8)  # tile_n: 32-column subtiles (80: 16)
SPLIT_CLUSTER_CHOICES = (2, 4, 8)  # split_cluster: a cluster of split_k CTAs along z
# split_cluster: range 0's receive slots, at most this many bytes (64x64 tiles, 8 ranges; the rest of 227 KiB: stages)
SPLIT_CLUSTER_RECV_MAX = 112 * 1024
GRID_Z_MAX = 65535  # split_cluster launches one CTA per work unit along the grid's z, which stops here


def split_k_errors(cfg: GemmConfig) -> list[str]:
    """Rules of split K (``GemmConfig.split_k``): the dense sm_90a cooperative kernel with the
    static scheduler and no cluster (a unit's workspace slot follows its CTA tile), K tiles without
    per-K-block scales (row-wise FP8 is fine: its scales act in the epilogue); split_cluster
    with a power of two (the cluster's size)."""
    what = "split_k (dense sm_90a, K cut into work units)"
    err = []
    if cfg.split_k != 1 and cfg.split_k not in SPLIT_K_CHOICES:
        err.append(f"{what}: split_k must be 1 or one of {SPLIT_K_CHOICES}, got {cfg.split_k}")
    if cfg.arch != "sm_90a":
        err.append(f"{what}: sm_90a only so far (sm_100a: not built)")
    if cfg.grouped or cfg.kgrouped or cfg.listed or cfg.swap_ab:
        err.append(f"{what}: dense only (not grouped, K-grouped, list or swap_ab)")
    if cfg.pingpong or cfg.scheduler != "static" or cfg.cluster_m != 1 or cfg.cluster_n != 1:
        err.append(f"{what}: cooperative tiles, the static scheduler and a 1x1 cluster")
    if cfg.fp8_blockwise or cfg.fp8_mx or cfg.blockscaled:
        err.append(f"{what}: not with per-K-block scales (fp8_blockwise, fp8_mx, block-scaled)")
    if cfg.split_cluster and cfg.split_k not in SPLIT_CLUSTER_CHOICES:
        err.append(f"split_cluster: needs split_k in {SPLIT_CLUSTER_CHOICES} (the cluster's size), got {cfg.split_k}")
    if cfg.split_tail and (cfg.split_k == 1 or cfg.split_cluster):
        err.append("split_tail: needs split_k > 1 through the workspace (not split_cluster)")
    recv = (cfg.split_k - 1) * cfg.tile_m * cfg.tile_n * 4
    if cfg.split_cluster and recv > SPLIT_CLUSTER_RECV_MAX:
        err.append(f"split_cluster: range 0 receives (split_k - 1) x tile_m x tile_n fp32 = {recv // 1024} KiB in "
                   f"shared memory, at most {SPLIT_CLUSTER_RECV_MAX // 1024} KiB (fewer ranges or a smaller tile)")
    return err


def a_rows_for(m: int) -> int:
    """A's box rows for M rows: 8, else M rounded up to 16 (see :func:`a_rows_errors`)."""
    return 8 if m <= 8 else -(-m // 16) * 16


def a_rows_errors(cfg: GemmConfig) -> list[str]:
    """Rules of a short A box (``GemmConfig.a_rows``): 8 or a multiple of 16 below tile_m (whole
    8-row swizzle atoms; DSL 4.8.1's TMA atom construction aborts on 3, 5, 7, ... of them, e.g. 24
    rows), dense sm_90a cooperative tiles (their threads zero the rest of the stages once), K-major
    A not multicast (cluster_n 1), no per-32 scales riding with A (DeepSeek block scales keep their
    own box). The problem must fit in the box (``problem_errors``)."""
    what = "a_rows (A's TMA box rows, decode-sized M)"
    err = []
    if (cfg.a_rows != 8 and cfg.a_rows % 16) or not 8 <= cfg.a_rows < cfg.tile_m:
        err.append(f"{what}: 8 or a multiple of 16 below tile_m={cfg.tile_m}, got {cfg.a_rows}")
    if cfg.arch != "sm_90a" or cfg.grouped or cfg.kgrouped or cfg.listed or cfg.swap_ab:
        err.append(f"{what}: the dense sm_90a kernel only")
    if cfg.a_major != "k" or cfg.cluster_n != 1 or cfg.pingpong:
        err.append(f"{what}: K-major A (a_major='k') that is not multicast (cluster_n=1), cooperative tiles")
    if cfg.fp8_mx or cfg.blockscaled:
        err.append(f"{what}: not with per-32 scales riding with A (fp8_mx, block-scaled)")
    return err


def fp8_mx_errors(cfg: GemmConfig) -> list[str]:
    """Rules of the MXFP8 emulation on sm_90a: per-32 promotion of e4m3 WGMMA partial sums. A
    warpgroup holds 64 x tile_n partial and promoted fp32 sums plus tile_n / 4 column scales."""
    what = "fp8_mx (MXFP8 emulation; sm_100a has the native block-scaled MMA)"
    err = _fp8_scaled_mainloop_errors(cfg, what)
    if cfg.fast_accum or cfg.fp8_blockwise or cfg.blockscaled or cfg.sf_dtype:
        err.append(f"{what} cannot be combined with fast_accum, fp8_blockwise or sf_vec/sf_dtype")
    if cfg.tile_n not in (64, 128) or cfg.tile_m not in (64, 128):
        err.append(f"{what}: tile_m and tile_n must be 64 or 128, got {cfg.tile_m}x{cfg.tile_n}")
    if cfg.pingpong:
        err.append(f"{what}: cooperative schedule only (pingpong=False)")
    if cfg.flat:
        err.append(f"{what}: (L, M, K) or grouped launches only (not flat)")
    return err


def blockscaled_errors(cfg: GemmConfig) -> list[str]:
    """Rules of the block-scaled MMA (tcgen05.mma.kind::mxf8f6f4 / mxf4 / mxf4nvf4)."""
    err = []
    if cfg.arch != "sm_100a":
        err.append(f"block-scaled GEMM is native on sm_100a only, got arch {cfg.arch!r}")
    recipe = (cfg.a_dtype, cfg.sf_dtype, cfg.sf_vec)
    mixed = (cfg.a_dtype, cfg.b_dtype) in BLOCKSCALED_MIXED and (cfg.sf_dtype, cfg.sf_vec) == ("e8m0", 32)
    if not mixed and (cfg.a_dtype != cfg.b_dtype or recipe not in BLOCKSCALED_RECIPES):
        err.append(f"block-scaled a/b dtype, sf dtype, sf_vec must be equal dtypes and one of "
                   f"{sorted(BLOCKSCALED_RECIPES)}, or MXFP8 x MXFP4 (e4m3/e2m1 either order, e8m0, 32), got "
                   f"{cfg.a_dtype}/{cfg.b_dtype}, {cfg.sf_dtype!r}, {cfg.sf_vec}")  # fmt: skip
    if cfg.a_major != "k" or cfg.b_major != "k":
        err.append("block-scaled: A and B must be K-major (a_major='k', b_major='k')")
    ok_m = 256 if cfg.two_cta else 128
    if cfg.tile_m != ok_m:
        err.append(f"block-scaled: MMA M must be 128 (1-CTA) or 256 (two_cta), got tile_m={cfg.tile_m} two_cta={cfg.two_cta}")
    # Scale factors of B are loaded and held in TMEM in 128-column granules (64 / 192: odd tiles
    # start half a granule in), so N = 96 or 224 is not possible.
    if cfg.tile_n not in (64, 128, 192, 256):
        err.append(f"block-scaled: tile_n must be 64, 128, 192 or 256, got {cfg.tile_n}")
    if cfg.grouped and (cfg.tile_m != 128 or cfg.two_cta or cfg.cluster_m != 1):
        err.append("grouped block-scaled: 1-CTA 128-row tiles, cluster_m 1 (every expert's scale rows "
                   "start a 128-row block of the padded layout, one per m-tile)")  # fmt: skip
    if cfg.cluster_m > 4 or cfg.cluster_n > 4:
        err.append("block-scaled: each cluster dim must be <= 4 (scale-factor multicast)")
    return err


def _aligned(count_elems: int, dtype: str) -> bool:
    return (count_elems * ELEMENT_BITS[dtype]) % (8 * TMA_ALIGN_BYTES) == 0


def problem_errors(cfg: GemmConfig, p: GemmProblem) -> list[str]:
    """Rules that tie a config to a problem: dtypes/majors match, TMA alignment."""
    err = []
    for attr in ("a_dtype", "b_dtype", "out_dtype", "a_major", "b_major"):
        if getattr(cfg, attr) != getattr(p, attr):
            err.append(f"config {attr}={getattr(cfg, attr)!r} but problem has {getattr(p, attr)!r}")
    if cfg.epilogue.quant is not None and (p.n // cfg.epilogue.cols_per_output) % 32:
        err.append(f"quantized output: the output's columns must be a multiple of 32, got {p.n // cfg.epilogue.cols_per_output}")
    if min(p.m, p.n, p.k, p.l) < 1:
        err.append(f"kernel needs M, N, K, L >= 1 (got {p.m}, {p.n}, {p.k}, {p.l})")
    if cfg.a_rows and p.m > cfg.a_rows:
        err.append(f"config a_rows={cfg.a_rows}: its TMA box loads A's first {cfg.a_rows} rows only, got M={p.m}")
    if cfg.split_cluster:  # one CTA per work unit along the grid's z
        units = -(-p.m // cfg.tile_m) * -(-p.n // cfg.tile_n) * p.l * cfg.split_k
        if units > GRID_Z_MAX:
            err.append(f"split_cluster: {units} work units (one CTA each) exceed the grid's {GRID_Z_MAX}; "
                       "use the workspace exchange (split_cluster=False) or fewer ranges")
    if cfg.blockscaled and cfg.a_dtype != cfg.b_dtype and p.k % 128:
        err.append(f"MXFP8 x MXFP4: K must be a multiple of 128 (the FP4 operand's unpacking TMA), got K={p.k}")
    for nm, strides, dtype in (
        ("a", p.a_strides, p.a_dtype),
        ("b", p.b_strides, p.b_dtype),
        ("out", p.out_strides, p.out_dtype),
    ):
        for s in strides or ():
            if not _aligned(s, dtype):
                err.append(f"{nm}: stride {s} elements is not a multiple of {TMA_ALIGN_BYTES} bytes "
                           f"(TMA needs 16-byte aligned strides)")  # fmt: skip
    return err


def can_implement(cfg: GemmConfig, p: GemmProblem | None = None) -> tuple[bool, str]:
    """(ok, reason). The public API raises ValueError with the reason when not ok."""
    err = config_errors(cfg) + (problem_errors(cfg, p) if p is not None else [])
    return (not err, "; ".join(err))
