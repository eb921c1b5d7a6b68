"""`python -m cutegemm compile-check`: compile every kernel variant of the support matrix for each
arch with fake tensors (no GPU needed) and check the SASS for the intended instructions and for
no local-memory spills."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace

from .blockscaled import dequant
from .blockscaled import quantizer as quantize_kernels
from .blockscaled.weight_only import kernel as weight_only
from .config import ELEMENT_BITS, Form, GemmConfig
from .epilogue import EpilogueSpec, fn
from .epilogue import combine as combine_kernels
from .epilogue import dispatch as dispatch_kernels
from .epilogue import gated_grads as gated_kernels
from .epilogue.user import register
from .gemm.launch import build_dense, build_grouped
from .runtime.sass import compile_to_sass, count_markers

# SASS markers: required (count > 0) and forbidden (count == 0).
SPILLS = {"LDL": r"\bLDL(\.|\s)", "STL": r"\bSTL(\.|\s)"}
REQUIRED = {
    "sm_90a": {"HGMMA": r"\bHGMMA\.", "UTMALDG": r"\bUTMALDG", "UTMASTG": r"\bUTMASTG", "USETMAXREG": r"USETMAXREG"},
    "sm_100a": {"UTCHMMA": r"\bUTCHMMA", "LDTM": r"\bLDTM", "UTMALDG": r"\bUTMALDG", "UTMASTG": r"\bUTMASTG"},
}
# Block-scaled (sm_100a): the block-scaled MMA of the element kind (UTCQMMA: kind::mxf8f6f4,
# UTCOMMA: kind::mxf4 / mxf4nvf4) and the scale-factor copy SMEM -> TMEM (tcgen05.cp = UTCCP).
BLOCKSCALED_MMA = {"e4m3": "UTCQMMA", "e2m1": "UTCOMMA"}


# Dynamic schedulers: the atomic tile counter and the st.async broadcast into the ring ("dynamic";
# STAS only with a multi-CTA cluster: a 1-CTA cluster writes its ring slot with a plain st.shared),
# clusterlaunchcontrol.try_cancel (SELFCAST for 1-CTA clusters, BROADCAST = multicast) ("clc").
SCHEDULER_MARKERS = {
    "static": {},
    "dynamic": {"ATOMG.ADD": r"\bATOMG\S*ADD", "STAS": r"\bSTAS\b"},
    "clc": {"UGETNEXTWORKID": r"\bUGETNEXTWORKID"},
}
CLUSTER_ONLY_MARKERS = {"dynamic": ("STAS",)}


def scheduler_markers(cfg: GemmConfig) -> dict[str, str]:
    markers = dict(SCHEDULER_MARKERS[cfg.scheduler])
    if cfg.cluster_m * cfg.cluster_n == 1:
        for name in CLUSTER_ONLY_MARKERS.get(cfg.scheduler, ()):
            del markers[name]
    return markers


def required_markers(cfg: GemmConfig) -> dict[str, str]:
    listed = {"UTMACCTL.IV": r"\bUTMACCTL\.IV"} if cfg.listed else {}  # the groups' descriptors: acquire fences
    return {**_mma_markers(cfg), **scheduler_markers(cfg), **listed}


def forbidden_markers(cfg: GemmConfig) -> dict[str, str]:
    """No local-memory spills; no st.async in a 1-CTA-cluster "dynamic" kernel (the ring is then
    filled with st.shared: st.async to shared::cluster needs a cluster of >= 2 CTAs)."""
    forbidden = dict(SPILLS)
    if cfg.cluster_m * cfg.cluster_n == 1:
        for name in CLUSTER_ONLY_MARKERS.get(cfg.scheduler, ()):
            forbidden[name] = SCHEDULER_MARKERS[cfg.scheduler][name]
    return forbidden


def _mma_markers(cfg: GemmConfig) -> dict[str, str]:
    if not cfg.blockscaled:
        required = dict(REQUIRED[cfg.arch])
        if cfg.arch == "sm_90a" and cfg.a_dtype == "e4m3":  # FP8 WGMMA
            del required["HGMMA"]
            required["QGMMA"] = r"\bQGMMA\."
        mma = "UTCHMMA"
        if cfg.arch == "sm_100a" and cfg.a_dtype == "e4m3":  # FP8 UMMA: kind::f8f6f4
            del required["UTCHMMA"]
            required["UTCQMMA"] = r"\bUTCQMMA"
            mma = "UTCQMMA"
        if cfg.arch == "sm_100a" and cfg.two_cta:
            required[f"{mma}.2CTA"] = rf"\b{mma}\S*2CTA"
        if cfg.swap_ab:  # one WGMMA width per 16 tokens: the narrowest and the widest at least
            for n in (16, cfg.tile_n):
                required[f"GMMA.64x{n}"] = rf"\b[HQ]GMMA\.64x{n}x"
        if cfg.gather_a and cfg.arch == "sm_90a":  # A's rows by cp.async, tracked by the stage barrier
            required["LDGSTS"] = r"\bLDGSTS\.E\.BYPASS\.128"
            required["ARRIVES.LDGSTSBAR"] = r"\bARRIVES\.LDGSTSBAR"
        elif cfg.gather_a:  # sm_100a: A's rows by the TMA unit's gather4 mode
            required["UTMALDG.GATHER4"] = r"\bUTMALDG\.2D\.GATHER4"
        if cfg.split_cluster:  # partial sums by st.async into range 0's shared memory
            required["STAS"] = r"\bSTAS\b"
        elif cfg.split_k > 1:  # a unit counts in on its tile's counter, GPU scope
            required["ATOMG.ADD.GPU"] = r"\bATOMG\.E\.ADD\.STRONG\.GPU"
        return required
    mma = BLOCKSCALED_MMA["e4m3" if cfg.a_dtype != cfg.b_dtype else cfg.a_dtype]  # mixed: kind::mxf8f6f4
    required = {mma: rf"\b{mma}", "UTCCP": r"\bUTCCP", **{k: v for k, v in REQUIRED[cfg.arch].items() if k != "UTCHMMA"}}
    if cfg.two_cta:
        required[f"{mma}.2CTA"] = rf"\b{mma}\S*2CTA"
    return required


def dense_variants(arch: str) -> list[GemmConfig]:
    """The dense support matrix, each dimension covered at least once (not the full product)."""
    if arch == "sm_90a":
        big = GemmConfig(arch=arch, tile_m=128, tile_n=256, cluster_m=2)
        tiles = [
            replace(big, cluster_m=1, cluster_n=2),
            GemmConfig(arch=arch, tile_m=128, tile_n=128),
            GemmConfig(arch=arch, tile_m=128, tile_n=192),
            GemmConfig(arch=arch, tile_m=64, tile_n=128, raster="n", group=1),
            GemmConfig(arch=arch, tile_m=64, tile_n=64, raster="n", group=1, a_major="k", b_major="k", form=Form.FLAT),
            GemmConfig(arch=arch, tile_m=128, tile_n=64),
            GemmConfig(arch=arch, tile_m=128, tile_n=128, cluster_m=2, pingpong=True),
            GemmConfig(arch=arch, tile_m=64, tile_n=256, cluster_n=2, pingpong=True, out_dtype="fp32"),
            # decode-sized M: A's box of 16 rows (a 2-D launch, as the policy runs it), split K
            GemmConfig(arch=arch, tile_m=64, tile_n=64, raster="n", group=1, a_major="k", b_major="k", form=Form.FLAT,
                       a_rows=16),
            # M = 65..96 in a 128-row tile: a box of 96 rows (six swizzle atoms), split K in two
            GemmConfig(arch=arch, tile_m=128, tile_n=64, raster="n", group=1, a_major="k", b_major="k", form=Form.FLAT,
                       a_rows=96, split_k=2),
            GemmConfig(arch=arch, tile_m=64, tile_n=128, raster="n", group=1, a_major="k", b_major="k", split_k=4,
                       epilogue=EpilogueSpec(bias=True, activation="gelu")),
            # split K through distributed shared memory (a cluster per tile): 2 and 4 ranges
            GemmConfig(arch=arch, tile_m=128, tile_n=64, raster="n", group=1, a_major="k", b_major="k", form=Form.FLAT,
                       a_rows=96, split_k=2, split_cluster=True),
            GemmConfig(arch=arch, tile_m=64, tile_n=64, raster="n", group=1, a_major="k", b_major="k", form=Form.FLAT,
                       a_rows=16, split_k=4, split_cluster=True, epilogue=EpilogueSpec(bias=True, activation="gelu")),
            # the wave model's (policy.wave_choice) M > 128 picks: 128x192 2x1, split K of wide tiles
            GemmConfig(arch=arch, tile_m=128, tile_n=192, cluster_m=2, raster="n", a_major="k", b_major="k",
                       form=Form.FLAT),
            GemmConfig(arch=arch, tile_m=128, tile_n=192, a_major="k", b_major="k", form=Form.FLAT, split_k=4),
            GemmConfig(arch=arch, tile_m=128, tile_n=128, a_major="k", b_major="k", form=Form.FLAT, split_k=2),
            # 128x160: whole waves where N is a multiple of 5 x 1024
            GemmConfig(arch=arch, tile_m=128, tile_n=160, cluster_m=2, raster="n", a_major="k", b_major="k",
                       form=Form.FLAT),
            GemmConfig(arch=arch, tile_m=128, tile_n=160, a_major="k", b_major="k", form=Form.FLAT, split_k=4),
            # 3 K ranges (any count: the completing unit resets the counter); split K of the last wave
            GemmConfig(arch=arch, tile_m=128, tile_n=64, a_major="k", b_major="k", form=Form.FLAT, split_k=3),
            GemmConfig(arch=arch, tile_m=128, tile_n=192, a_major="k", b_major="k", form=Form.FLAT, split_k=2,
                       split_tail=True),
            # 128x96 (64 < M <= 128 wave picks) and 128x224: tile_n of 3 / 7 32-column subtiles
            GemmConfig(arch=arch, tile_m=128, tile_n=96, raster="n", group=1, a_major="k", b_major="k", form=Form.FLAT),
            GemmConfig(arch=arch, tile_m=128, tile_n=224, cluster_m=2, raster="n", a_major="k", b_major="k"),
            # the wave model's 192-row (three consumer warpgroups), 64x96 1x2 and 128x96 2x1 picks
            GemmConfig(arch=arch, tile_m=128, tile_n=96, cluster_m=2, a_major="k", b_major="k", form=Form.FLAT),
            GemmConfig(arch=arch, tile_m=192, tile_n=192, a_major="k", b_major="k", form=Form.FLAT,
                       epilogue=EpilogueSpec(bias=True, activation="silu")),
            GemmConfig(arch=arch, tile_m=64, tile_n=96, cluster_n=2, raster="n", group=1, a_major="k", b_major="k",
                       form=Form.FLAT),
            GemmConfig(arch=arch, tile_m=128, tile_n=64, pingpong=True, a_major="m", b_major="k"),  # last: see flat
        ]
    else:
        big = GemmConfig(arch=arch, tile_m=256, tile_n=256, two_cta=True, cluster_m=2)
        tiles = [
            GemmConfig(arch=arch, tile_m=128, tile_n=256),
            GemmConfig(arch=arch, tile_m=128, tile_n=128, cluster_n=2),
            GemmConfig(arch=arch, tile_m=64, tile_n=128),
        ]
    majors = [replace(big, a_major=am, b_major=bm) for am in "km" for bm in "kn"]
    dtypes = [
        replace(big, a_dtype="fp16", b_dtype="fp16", out_dtype="fp16"),
        replace(big, out_dtype="fp32"),
        replace(big, a_dtype="fp16", b_dtype="fp16", out_dtype="fp32", a_major="m", b_major="k"),
    ]
    epis = [replace(big, epilogue=EpilogueSpec(alpha=True))] + epilogue_variants(arch, big)
    # flat launches (2-D operands as torch holds them, see GemmConfig.flat): each major pair
    flat = [replace(big, form=Form.FLAT, a_major=am, b_major=bm) for am, bm in (("k", "k"), ("m", "n"))]
    flat.append(replace(tiles[-1], form=Form.FLAT, epilogue=EpilogueSpec(bias=True, activation="silu")))
    return majors + dtypes + tiles + epis + flat


def epilogue_variants(arch: str, big: GemmConfig) -> list[GemmConfig]:
    """Each epilogue op at least once on the arch's biggest tile (the register-hungriest), the
    gated ones also on the other accumulator fragment shapes (pingpong / 64-row tiles)."""
    E = EpilogueSpec
    ops = [
        E(bias=True, bias_dtype="bf16", activation="relu"),
        E(activation="gelu"),
        E(activation="gelu_tanh"),
        E(activation="silu"),
        E(gated="swiglu"),
        E(gated="geglu", bias=True, bias_dtype="fp32"),
        E(alpha=True, beta=True, c_dtype="bf16"),
        E(alpha=True, beta=True, c_dtype="fp32", bias=True, bias_dtype="fp16", activation="gelu_tanh"),
    ]
    out = [replace(big, epilogue=e) for e in ops]
    out.append(replace(big, out_dtype="fp32", epilogue=E(alpha=True, bias=True, bias_dtype="fp32")))
    out.append(replace(big, out_dtype="fp32", epilogue=E(gated="swiglu", bias=True, bias_dtype="bf16")))
    if arch == "sm_90a":
        others = [
            GemmConfig(arch=arch, tile_m=128, tile_n=128, cluster_m=2, pingpong=True),
            GemmConfig(arch=arch, tile_m=64, tile_n=128, raster="n", group=1),
            GemmConfig(arch=arch, tile_m=64, tile_n=64, raster="n", group=1, a_major="k", b_major="k", form=Form.FLAT),
            GemmConfig(arch=arch, tile_m=128, tile_n=64, pingpong=True, a_major="m", b_major="k"),
            GemmConfig(arch=arch, tile_m=192, tile_n=192, a_major="k", b_major="k", form=Form.FLAT),
        ]
    else:
        others = [
            GemmConfig(arch=arch, tile_m=128, tile_n=128, cluster_n=2),
            GemmConfig(arch=arch, tile_m=64, tile_n=128),
        ]
    out += [replace(cfg, epilogue=E(gated="swiglu", bias=True, bias_dtype="bf16")) for cfg in others]
    out += [replace(others[0], epilogue=E(alpha=True, beta=True, c_dtype="bf16", bias=True, activation="silu"))]
    out += quant_and_user_variants(arch)
    out += fp8_variants(arch) if arch == "sm_90a" else fp8_sm100_variants(arch)
    return out


def fp8_sm100_variants(arch: str) -> list[GemmConfig]:
    """Dense FP8 row-wise on sm_100a (tcgen05 ``kind::f8f6f4`` into the fp32 TMEM accumulator, the
    scales in the epilogue): the policy's 128x128 and 256x256 2-CTA tiles, an fp32 output, a
    gated output with a bias."""
    E = EpilogueSpec
    fp8 = dict(arch=arch, a_dtype="e4m3", b_dtype="e4m3", a_major="k", b_major="k")
    ab = E(scale_a=True, scale_b=True)
    return [
        GemmConfig(**fp8, tile_m=128, tile_n=128, epilogue=ab),
        GemmConfig(**fp8, tile_m=256, tile_n=256, two_cta=True, cluster_m=2, out_dtype="fp32", epilogue=ab),
        GemmConfig(**fp8, tile_m=128, tile_n=256, cluster_n=2, epilogue=E(scale_a=True, scale_b=True, bias=True,
                                                                           bias_dtype="bf16", gated="swiglu")),
    ]


def fp8_variants(arch: str) -> list[GemmConfig]:
    """Dense FP8 (e4m3, K-major A and B) with per-row / per-column fp32 scales in the epilogue:
    promoted accumulation (two fp32 accumulators, <= 64x128 per warpgroup; per K tile, or per one
    or two WGMMAs with promote_k) and fast accumulation."""
    E = EpilogueSpec
    fp8 = dict(a_dtype="e4m3", b_dtype="e4m3", a_major="k", b_major="k")
    ab = E(scale_a=True, scale_b=True)
    return [
        GemmConfig(arch=arch, **fp8, tile_m=128, tile_n=128, cluster_m=2, epilogue=ab),
        GemmConfig(arch=arch, **fp8, tile_m=128, tile_n=64, raster="n", group=1, epilogue=ab),
        # the policy's decode-sized M (<= 64 rows): one consumer warpgroup, 64x64 / 64x128
        GemmConfig(arch=arch, **fp8, tile_m=64, tile_n=64, raster="n", group=1, form=Form.FLAT, epilogue=ab),
        *([GemmConfig(arch=arch, **fp8, tile_m=64, tile_n=128, raster="n", group=1, form=Form.FLAT, a_rows=8, epilogue=ab),
           GemmConfig(arch=arch, **fp8, tile_m=128, tile_n=64, raster="n", group=1, split_k=2, epilogue=ab),
           GemmConfig(arch=arch, **fp8, tile_m=128, tile_n=192, form=Form.FLAT, split_k=2, split_tail=True, epilogue=ab),
           GemmConfig(arch=arch, **fp8, tile_m=64, tile_n=64, raster="n", group=1, form=Form.FLAT, a_rows=16, split_k=4,
                      split_cluster=True, epilogue=ab)]
          if arch == "sm_90a" else []),
        GemmConfig(arch=arch, **fp8, tile_m=64, tile_n=128, pingpong=True, cluster_n=2, epilogue=ab),
        GemmConfig(arch=arch, **fp8, tile_m=128, tile_n=192, form=Form.FLAT, split_k=4, epilogue=ab),
        GemmConfig(arch=arch, **fp8, tile_m=128, tile_n=128, pingpong=True, cluster_m=2, fast_accum=True, epilogue=ab),
        GemmConfig(arch=arch, **fp8, tile_m=128, tile_n=256, cluster_m=2, fast_accum=True, epilogue=ab),
        GemmConfig(arch=arch, **fp8, tile_m=64, tile_n=256, out_dtype="fp32", fast_accum=True, epilogue=E(scale_a=True)),
        # fp32 outputs (policy.fp32_promotion): a partial sum per WGMMA / per two WGMMAs
        GemmConfig(arch=arch, **fp8, tile_m=128, tile_n=192, cluster_m=2, raster="n", group=8, out_dtype="fp32",
                   promote_k=32, epilogue=ab),
        GemmConfig(arch=arch, **fp8, tile_m=64, tile_n=128, raster="n", group=1, form=Form.FLAT, out_dtype="fp32",
                   promote_k=64, split_k=2, epilogue=ab),
        GemmConfig(arch=arch, **fp8, tile_m=128, tile_n=128, out_dtype="e4m3",
                   epilogue=E(scale_a=True, scale_b=True, bias=True, bias_dtype="bf16", gated="swiglu", quant="mxfp8")),
    ] + fp8_blockwise_variants(arch) + fp8_mx_variants(arch)  # fmt: skip


def kgrouped_variants(arch: str) -> list[GemmConfig]:
    """The K-grouped kernel (sm_90a; the MoE weight gradient, dW_e = x_e^T dy_e): the policy's
    128x256 2x1 with a column-major A (x.t()), 1x2 with a row-major A, 128x128 with the
    dynamic scheduler, an fp32 output and alpha, and two pingpong tiles."""
    if arch != "sm_90a":
        return []
    kg = dict(arch=arch, form=Form.KGROUPED, b_major="n")
    return [
        GemmConfig(**kg, a_major="m", tile_m=128, tile_n=256, cluster_m=2, raster="n", group=8),
        GemmConfig(**kg, a_major="k", tile_m=128, tile_n=256, cluster_n=2),
        GemmConfig(**kg, a_major="m", tile_m=128, tile_n=128, scheduler="dynamic", out_dtype="fp32",
                   epilogue=EpilogueSpec(alpha=True)),
        # pingpong: a warpgroup skips the other's tile by that tile's K-tile count
        GemmConfig(**kg, a_major="m", tile_m=128, tile_n=128, pingpong=True, cluster_m=2, raster="n", group=8),
        GemmConfig(**kg, a_major="k", tile_m=128, tile_n=128, pingpong=True, cluster_n=2),
    ]


def listed_variants(arch: str) -> list[GemmConfig]:
    """The list-form kernel (per-group TMA descriptors written by a prep kernel). sm_90a: the
    policy's 128x256 with the dynamic scheduler, 64x128 (decode-size groups), pingpong 128x128,
    column-major A and K-major B with an fp32 output, alpha and gelu. sm_100a (1-CTA MMA): 128x128
    static, 64x128 dynamic with a column-major A, 128x256 with the CLC scheduler and silu."""
    ls = dict(arch=arch, form=Form.LISTED, raster="m", group=1)
    if arch == "sm_100a":
        return [
            GemmConfig(**ls, tile_m=128, tile_n=128),
            GemmConfig(**ls, a_major="m", tile_m=64, tile_n=128, scheduler="dynamic"),
            GemmConfig(**ls, tile_m=128, tile_n=256, scheduler="clc", epilogue=EpilogueSpec(activation="silu")),
        ]
    return [
        GemmConfig(**ls, tile_m=128, tile_n=256, scheduler="dynamic"),
        GemmConfig(**ls, tile_m=64, tile_n=128),
        GemmConfig(**ls, tile_m=128, tile_n=128, pingpong=True),
        GemmConfig(**ls, a_major="m", b_major="k", tile_m=128, tile_n=128, out_dtype="fp32",
                   epilogue=EpilogueSpec(alpha=True, activation="gelu")),
    ]


def fp8_blockwise_variants(arch: str) -> list[GemmConfig]:
    """DeepSeek-style FP8 block scaling (1x128 A / 128x128 B fp32 scales applied while promoting
    each K tile): the policy's cooperative 128x128 and 128x192 (two B scale blocks per tile) + 2x1
    cluster (warpgroups taking turns per K tile, wg_order), the small-M 128x64 and (M <= 64)
    pingpong 64x64 tiles,
    pingpong 64x128 (fp32 output), 128x128 with an alpha + bias + silu epilogue, and (sm_90a) the
    decode tile with A's short box."""
    fp8 = dict(a_dtype="e4m3", b_dtype="e4m3", a_major="k", b_major="k", fp8_blockwise=True)
    epi = EpilogueSpec(alpha=True, bias=True, bias_dtype="bf16", activation="silu")
    return [
        GemmConfig(arch=arch, **fp8, tile_m=128, tile_n=128, cluster_m=2, raster="n", group=8, wg_order=True),
        GemmConfig(arch=arch, **fp8, tile_m=128, tile_n=192, cluster_m=2, raster="n", group=8, wg_order=True),
        GemmConfig(arch=arch, **fp8, tile_m=128, tile_n=64, raster="n", group=1),
        GemmConfig(arch=arch, **fp8, tile_m=64, tile_n=64, pingpong=True, raster="n", group=1),
        GemmConfig(arch=arch, **fp8, tile_m=64, tile_n=128, pingpong=True, out_dtype="fp32"),
        GemmConfig(arch=arch, **fp8, tile_m=128, tile_n=128, epilogue=epi),
        # the policy's decode tile: cooperative 64x64 with A's 16-row box (sm_90a option)
        *([GemmConfig(arch=arch, **fp8, tile_m=64, tile_n=64, raster="n", group=1, a_rows=16)]
          if arch == "sm_90a" else []),
    ]


def fp8_mx_variants(arch: str) -> list[GemmConfig]:
    """MXFP8 emulation (sm_90a only: per-32 promotion with e8m0 scales decoded to fp32, TMA-loaded
    with A and B): the default 128x128, tile N 64 with a 1x2 cluster, 64-row tiles, fp32 output
    with the dynamic scheduler, a 2x1 cluster with an alpha + bias + gelu epilogue."""
    if arch != "sm_90a":
        return []
    mx = dict(a_dtype="e4m3", b_dtype="e4m3", a_major="k", b_major="k", fp8_mx=True)
    epi = EpilogueSpec(alpha=True, bias=True, bias_dtype="bf16", activation="gelu")
    return [
        GemmConfig(arch=arch, **mx, tile_m=128, tile_n=128),
        GemmConfig(arch=arch, **mx, tile_m=128, tile_n=64, cluster_n=2, raster="n", group=4),
        GemmConfig(arch=arch, **mx, tile_m=64, tile_n=128),
        GemmConfig(arch=arch, **mx, tile_m=128, tile_n=128, out_dtype="fp32", scheduler="dynamic"),
        GemmConfig(arch=arch, **mx, tile_m=128, tile_n=128, cluster_m=2, epilogue=epi),
    ]


def sample_user_epilogue(acc, row, col, bias, scale):
    """The user-defined epilogue compiled by compile-check: silu(acc + bias[col]) * scale[row]."""
    return fn.silu(acc + bias[col]) * scale[row]


def quant_and_user_variants(arch: str) -> list[GemmConfig]:
    """Quantized outputs (each format, plain / gated / pingpong / 64-row tiles) and a user
    epilogue (sm_90a so far)."""
    E = EpilogueSpec
    user = register(sample_user_epilogue)
    if arch == "sm_90a":
        t256 = GemmConfig(arch=arch, tile_m=128, tile_n=256, cluster_m=2)
        t128 = GemmConfig(arch=arch, tile_m=128, tile_n=128, cluster_m=2, pingpong=True)
        t64 = GemmConfig(arch=arch, tile_m=64, tile_n=128, raster="n", group=1)
    else:
        t256 = GemmConfig(arch=arch, tile_m=256, tile_n=256, two_cta=True, cluster_m=2)
        t128 = GemmConfig(arch=arch, tile_m=128, tile_n=128, cluster_n=2)
        t64 = GemmConfig(arch=arch, tile_m=128, tile_n=64)
    return [
        replace(t256, out_dtype="e4m3", epilogue=E(quant="mxfp8")),
        replace(t256, out_dtype="e4m3", epilogue=E(gated="swiglu", quant="mxfp8")),
        replace(t256, out_dtype="u8", epilogue=E(bias=True, bias_dtype="bf16", activation="gelu", quant="nvfp4")),
        replace(t256, out_dtype="u8", epilogue=E(gated="swiglu", quant="nvfp4")),
        replace(t128, out_dtype="u8", epilogue=E(alpha=True, quant="mxfp4")),
        replace(t64, out_dtype="e4m3", epilogue=E(gated="geglu", quant="mxfp8")),
        # the decode policy's 64x64 tile with an FP4 output (its stage budget once overflowed)
        *([replace(t64, tile_n=64, out_dtype="u8", epilogue=E(quant="mxfp4"))] if arch == "sm_90a" else []),
        replace(t256, epilogue=E(alpha=True, user=user, user_args=("bf16", "fp32"))),
        replace(t128, epilogue=E(user=user, user_args=("fp32", "fp32"))),
        replace(t256, out_dtype="e4m3", epilogue=E(user=user, user_args=("bf16", "bf16"), quant="mxfp8")),
    ]


@dataclass
class CheckResult:
    name: str
    ok: bool
    markers: dict
    seconds: float
    error: str = ""

    def line(self) -> str:
        status = "PASS" if self.ok else "FAIL"
        found = " ".join(f"{k}={v}" for k, v in self.markers.items())
        tail = f"  ({self.error})" if self.error else ""
        return f"{status} {self.name:<80} {found} [{self.seconds:.1f}s]{tail}"


def wgmma_serialized(cfg: GemmConfig, sass: str) -> bool:
    """ptxas serializes every WGMMA of a kernel (warning C7520) when it cannot prove a branch
    around them warpgroup-uniform: then each HGMMA / QGMMA carries its own gsb0 wait. In our
    sm_90a mainloops only the last WGMMA of a K tile's batch does (the MXFP8 emulation and
    promote_k 32 commit each 32-wide K block alone, so they are not checked)."""
    if cfg.arch != "sm_90a" or cfg.fp8_mx or cfg.promote_k == 32:
        return False
    gmma = re.findall(r"[HQ]GMMA\.[^\n]*", sass)
    return bool(gmma) and all("gsb0" in g for g in gmma)


def stage_k(cfg: GemmConfig) -> int:
    """K elements of one stage: sm_90a 128 bytes of A; sm_100a four MMA instructions, each
    16 (f16 kinds), 32 (kind::f8f6f4, mixed pairs included) or 64 (kind::mxf4 / mxf4nvf4) deep."""
    a_bits, b_bits = ELEMENT_BITS[cfg.a_dtype], ELEMENT_BITS[cfg.b_dtype]
    if cfg.arch == "sm_90a":
        return 1024 // a_bits
    return 4 * (16 if a_bits == 16 else 64 if a_bits == b_bits == 4 else 32)


def stage_data_bytes(cfg: GemmConfig) -> int:
    """The A and B bytes one stage's TMA copies deliver to its full barrier, from the config alone:
    elements times the operands' real widths (a 4-bit operand is read as 4 bits even where shared
    memory holds it a byte per element). sm_100a with 2-CTA: the pair's bytes (they land on the
    leader CTA's barrier); sm_90a: A's box rows (``a_rows``; none with ``gather_a``, whose A
    arrives by cp.async) and the tile's B columns. sm_100a ``gather_a``: the tile's rows, by the
    gather4 loads on the same barrier."""
    k = stage_k(cfg)
    a_bits, b_bits = ELEMENT_BITS[cfg.a_dtype], ELEMENT_BITS[cfg.b_dtype]
    rows = (cfg.a_rows or cfg.tile_m) if cfg.arch == "sm_90a" else cfg.tile_m
    rows = 0 if cfg.gather_a and cfg.arch == "sm_90a" else rows
    return (rows * k * a_bits + cfg.tile_n * k * b_bits) // 8


def stage_tx_errors(cfg: GemmConfig, kernel) -> list[str]:
    """The transaction-byte rule: the bytes a kernel arms its stage barrier with equal the bytes
    its TMA copies deliver (``stage_data_bytes`` plus the scale factors loaded on the same
    barrier). A mismatch never completes the barrier (a hang) or completes it early (a race).
    Swap AB arms per tile (its token chunks): not covered here."""
    armed = getattr(kernel, "tma_bytes", None)
    if armed is None or cfg.swap_ab:
        return []
    data = stage_data_bytes(cfg)
    if cfg.arch == "sm_90a":
        extra = 0
        if cfg.fp8_mx:
            extra = kernel.mx.mx_stage_bytes()
        elif cfg.fp8_blockwise:
            extra = kernel.blockwise.sfa_rows() * 4
    else:
        extra = (2 if cfg.two_cta else 1) * getattr(kernel, "tx_sf_bytes", 0)
    if armed != data + extra:
        return [f"stage barrier armed with {armed} B, the TMA copies deliver {data + extra} B "
                f"({data} of A and B at their element widths + {extra} of scales)"]
    return []


def tmem_errors(cfg: GemmConfig, kernel) -> list[str]:
    """The TMEM rule of the sm_100a kernels, from the config alone: the accumulators (tile_n fp32
    columns per CTA per buffer) and the scale factors (32-row groups x 4 K blocks of SFA and of
    SFB, whose tile is rounded up to 128 columns) fit in the allocation; there are two accumulator
    buffers (side by side, or overlapping behind a one-stage pipeline whose epilogue releases the
    stage only after it has read every shared column), so a tile's epilogue overlaps the next
    tile's mainloop."""
    plan = getattr(kernel, "tmem", None)
    if cfg.arch != "sm_100a" or not cfg.blockscaled or plan is None:
        return []
    acc = cfg.tile_n
    sf = ((cfg.tile_m // (2 if cfg.two_cta else 1)) // 32 + -(-cfg.tile_n // 128) * 128 // 32) * 4
    err = []
    if plan.alloc_cols > 512 or plan.stage_cols + acc + sf > plan.alloc_cols:
        err.append(f"TMEM: {plan.stage_cols} + {acc} accumulator + {sf} scale columns > {plan.alloc_cols} allocated")
    if kernel.num_acc_tmem_cols != plan.stage_cols + acc:
        err.append(f"TMEM: scale factors start at column {kernel.num_acc_tmem_cols}, not {plan.stage_cols + acc}")
    if plan.buffers != 2 or plan.stage_cols <= 0:
        err.append("TMEM: one accumulator buffer (the mainloop waits for every epilogue)")
    if plan.acc_stage == 1 and plan.overlap_cols != acc - plan.stage_cols:
        err.append(f"TMEM: buffers share {acc - plan.stage_cols} columns, the plan says {plan.overlap_cols}")
    return err


def check_config(cfg: GemmConfig) -> CheckResult:
    t0 = time.time()
    try:
        kernel, args = (build_grouped if cfg.grouped else build_dense)(cfg)
        sass = compile_to_sass(kernel, args, cfg.arch)
    except Exception as exc:  # report every variant, then fail at the end
        return CheckResult(cfg.name, False, {}, time.time() - t0, f"{type(exc).__name__}: {exc}"[:300])
    req = count_markers(sass, required_markers(cfg))
    bad = count_markers(sass, forbidden_markers(cfg))
    missing = [k for k, v in req.items() if v == 0]
    spilled = [k for k, v in bad.items() if v and k in SPILLS]
    unwanted = [k for k, v in bad.items() if v and k not in SPILLS]
    err = ""
    if missing:
        err += f"missing {missing} "
    if spilled:
        err += f"local-memory spills {spilled} "
    if unwanted:
        err += f"forbidden {unwanted} "
    for problem in (*stage_tx_errors(cfg, kernel), *tmem_errors(cfg, kernel)):
        err += problem + " "
    if wgmma_serialized(cfg, sass):
        err += "serialized WGMMA (every HGMMA/QGMMA waits for itself: ptxas C7520)"
    return CheckResult(cfg.name, not err, {**req, **bad}, time.time() - t0, err.strip())


def scheduler_variants(arch: str) -> list[GemmConfig]:
    """Dynamic schedulers (schedulers/dynamic.py), dense and grouped, with and without clusters."""
    if arch == "sm_90a":
        return [
            GemmConfig(arch=arch, tile_m=128, tile_n=256, cluster_m=2, scheduler="dynamic"),
            GemmConfig(
                arch=arch, tile_m=128, tile_n=128, scheduler="dynamic", epilogue=EpilogueSpec(alpha=True)
            ),
            GemmConfig(arch=arch, form=Form.GROUPED, tile_m=128, tile_n=256, cluster_n=2, scheduler="dynamic"),
            GemmConfig(arch=arch, form=Form.GROUPED, tile_m=64, tile_n=128, cluster_n=2, scheduler="dynamic"),
            GemmConfig(arch=arch, form=Form.GROUPED, tile_m=128, tile_n=128, scheduler="dynamic", b_major="k"),
        ]
    return [
        GemmConfig(arch=arch, tile_m=128, tile_n=256, scheduler="clc"),
        GemmConfig(arch=arch, tile_m=256, tile_n=256, two_cta=True, cluster_m=2, scheduler="clc"),
        GemmConfig(arch=arch, tile_m=128, tile_n=128, scheduler="dynamic"),
        GemmConfig(arch=arch, form=Form.GROUPED, tile_m=128, tile_n=128, scheduler="clc"),
        GemmConfig(arch=arch, form=Form.GROUPED, tile_m=64, tile_n=128, cluster_n=2, scheduler="clc"),
        GemmConfig(arch=arch, form=Form.GROUPED, tile_m=128, tile_n=256, b_major="k", scheduler="dynamic"),
        # multi-CTA clusters: the st.async ring broadcast (1-CTA clusters use st.shared)
        GemmConfig(arch=arch, tile_m=256, tile_n=256, two_cta=True, cluster_m=2, scheduler="dynamic"),
        GemmConfig(arch=arch, form=Form.GROUPED, tile_m=64, tile_n=128, cluster_n=2, scheduler="dynamic"),
    ]


def grouped_variants(arch: str) -> list[GemmConfig]:
    if arch == "sm_100a":  # 1-CTA only (config rule)
        return [
            GemmConfig(arch=arch, form=Form.GROUPED, tile_m=128, tile_n=256, b_major="k"),
            GemmConfig(arch=arch, form=Form.GROUPED, tile_m=64, tile_n=128, cluster_n=2),
            GemmConfig(arch=arch, form=Form.GROUPED, tile_m=128, tile_n=128, out_dtype="fp32"),
            GemmConfig(arch=arch, form=Form.GROUPED, tile_m=64, tile_n=256, cluster_n=2, out_dtype="fp32", b_major="k"),
            # A's rows gathered through an index by TMA gather4 (gather_a: the MoE up projection)
            GemmConfig(arch=arch, form=Form.GROUPED, gather_a=True, tile_m=128, tile_n=128, raster="m", group=1,
                       b_major="k", epilogue=EpilogueSpec(gated="swiglu")),
            GemmConfig(arch=arch, form=Form.GROUPED, gather_a=True, tile_m=64, tile_n=128, raster="m", group=1,
                       epilogue=EpilogueSpec(alpha=True, activation="silu")),
            GemmConfig(arch=arch, form=Form.GROUPED, gather_a=True, tile_m=128, tile_n=128, a_dtype="fp16",
                       b_dtype="fp16", out_dtype="fp32", raster="m", group=1),
        ] + grouped_epilogue_variants(arch)
    return [
        GemmConfig(arch=arch, form=Form.GROUPED, tile_m=128, tile_n=256, b_major="k"),
        GemmConfig(arch=arch, form=Form.GROUPED, tile_m=64, tile_n=128, cluster_n=2),
        GemmConfig(arch=arch, form=Form.GROUPED, tile_m=128, tile_n=128, pingpong=True, out_dtype="fp32"),
        # MXFP8 x MXFP8 emulated per expert (grouped_gemm of two BlockScaledTensors on sm_90a)
        GemmConfig(arch=arch, form=Form.GROUPED, tile_m=128, tile_n=128, a_dtype="e4m3", b_dtype="e4m3",
                   a_major="k", b_major="k", fp8_mx=True),
        # swap_ab (tokens along the WGMMA's N): the policy's two tiles, a 1-CTA odd-chunk tile
        GemmConfig(arch=arch, form=Form.GROUPED, swap_ab=True, tile_m=128, tile_n=256, cluster_m=2, b_major="k",
                   scheduler="dynamic", raster="m", group=1),
        GemmConfig(arch=arch, form=Form.GROUPED, swap_ab=True, tile_m=128, tile_n=192, cluster_m=2, scheduler="dynamic",
                   raster="m", group=1, epilogue=EpilogueSpec(alpha=True, bias=True, bias_dtype="bf16", activation="silu")),
        GemmConfig(arch=arch, form=Form.GROUPED, swap_ab=True, tile_m=128, tile_n=160, a_dtype="fp16", b_dtype="fp16",
                   out_dtype="fp32", raster="m", group=1),
        # swap_ab FP8 row-wise, promoted (each K tile's partial sum accumulates from zeros)
        GemmConfig(arch=arch, form=Form.GROUPED, swap_ab=True, tile_m=128, tile_n=192, cluster_m=2, scheduler="dynamic",
                   a_dtype="e4m3", b_dtype="e4m3", raster="m", group=1, b_major="k",
                   epilogue=EpilogueSpec(scale_a=True, scale_b=True)),
        # swap_ab with a gated output (the MoE up projection): gate / up pairs across lanes
        GemmConfig(arch=arch, form=Form.GROUPED, swap_ab=True, tile_m=128, tile_n=256, cluster_m=2, scheduler="dynamic",
                   raster="m", group=1, epilogue=EpilogueSpec(alpha=True, bias=True, gated="swiglu")),
        # 16-bit with a per-row output scale (scale_a: the MoE down projection's routing weights):
        # the swapped kernel and the row tile
        GemmConfig(arch=arch, form=Form.GROUPED, swap_ab=True, tile_m=128, tile_n=256, cluster_m=2, scheduler="dynamic",
                   raster="m", group=1, b_major="k", epilogue=EpilogueSpec(scale_a=True)),
        GemmConfig(arch=arch, form=Form.GROUPED, tile_m=128, tile_n=256, cluster_n=2, scheduler="dynamic",
                   b_major="k", epilogue=EpilogueSpec(scale_a=True)),
        # A's rows gathered through an index by cp.async (gather_a: the MoE up projection on the
        # tokens as they are): B multicast over 2x1, with swiglu; decode-sized 64x128; pingpong
        GemmConfig(arch=arch, form=Form.GROUPED, gather_a=True, tile_m=128, tile_n=256, cluster_m=2, raster="m", group=1,
                   b_major="k", epilogue=EpilogueSpec(gated="swiglu")),
        GemmConfig(arch=arch, form=Form.GROUPED, gather_a=True, tile_m=64, tile_n=128, raster="m", group=1,
                   epilogue=EpilogueSpec(alpha=True, activation="silu")),
        GemmConfig(arch=arch, form=Form.GROUPED, gather_a=True, tile_m=128, tile_n=128, pingpong=True, a_dtype="fp16",
                   b_dtype="fp16", out_dtype="fp32", raster="m", group=1),
    ] + grouped_epilogue_variants(arch)  # fmt: skip


def grouped_epilogue_variants(arch: str) -> list[GemmConfig]:
    """Epilogues of the packed grouped kernel: per-expert bias + activation, gated swiglu,
    quantized outputs (MXFP8 after swiglu, NVFP4, MXFP4), a user epilogue; FP8 row-wise scales
    (sm_90a: promoted and fast accumulation) and DeepSeek block scales (sm_90a)."""
    E = EpilogueSpec
    user = register(sample_user_epilogue)
    g = dict(arch=arch, form=Form.GROUPED)
    if arch == "sm_90a":
        big, mid, small = dict(tile_m=128, tile_n=256, cluster_n=2), dict(tile_m=128, tile_n=128, pingpong=True, cluster_n=2), dict(tile_m=64, tile_n=128, cluster_n=2)  # fmt: skip
    else:
        big, mid, small = dict(tile_m=128, tile_n=256), dict(tile_m=128, tile_n=128), dict(tile_m=128, tile_n=128, cluster_n=2)  # fmt: skip
    out = [
        GemmConfig(**g, **big, epilogue=E(bias=True, bias_dtype="bf16", activation="gelu_tanh")),
        GemmConfig(**g, **mid, epilogue=E(alpha=True, gated="swiglu", bias=True)),
        GemmConfig(**g, **big, out_dtype="e4m3", epilogue=E(gated="swiglu", quant="mxfp8")),
        GemmConfig(**g, **mid, out_dtype="u8", epilogue=E(bias=True, quant="nvfp4")),
        GemmConfig(**g, **small, out_dtype="u8", epilogue=E(alpha=True, quant="mxfp4")),
        GemmConfig(**g, **mid, epilogue=E(user=user, user_args=("bf16", "fp32"))),
    ]
    fp8 = dict(a_dtype="e4m3", b_dtype="e4m3", b_major="k", epilogue=E(scale_a=True, scale_b=True))
    if arch == "sm_100a":  # FP8 row-wise per expert (scale_b (E, N)): the policy's two tiles
        out += [GemmConfig(**g, tile_m=128, tile_n=128, **fp8), GemmConfig(**g, tile_m=64, tile_n=128, **fp8)]
    if arch == "sm_90a":
        out += [
            GemmConfig(**g, tile_m=128, tile_n=192, cluster_n=2, scheduler="dynamic", **fp8),  # the policy's
            GemmConfig(**g, tile_m=64, tile_n=128, cluster_n=2, **fp8),
            GemmConfig(**g, tile_m=128, tile_n=256, cluster_n=2, fast_accum=True, **fp8),
        ]
        # DeepSeek block scaling per expert (1x128 / 128x128): the policy's tiles, and one with a
        # swiglu + MXFP8 output (the MoE up projection's usual next step)
        bw = dict(a_dtype="e4m3", b_dtype="e4m3", b_major="k", fp8_blockwise=True)
        out += [
            GemmConfig(**g, tile_m=128, tile_n=128, cluster_n=2, wg_order=True, **bw),
            GemmConfig(**g, tile_m=128, tile_n=192, cluster_n=2, wg_order=True, **bw),
            GemmConfig(**g, tile_m=64, tile_n=128, cluster_n=2, **bw),
            GemmConfig(**g, tile_m=128, tile_n=128, scheduler="dynamic", out_dtype="e4m3",
                       epilogue=E(gated="swiglu", quant="mxfp8"), **bw),
        ]  # fmt: skip
    return out


def blockscaled_variants(arch: str) -> list[GemmConfig]:
    """Block-scaled recipes (native on sm_100a only; sm_90a emulation is not a kernel variant yet):
    each recipe on the 1-CTA and the 2-CTA MMA, tile N 64/128/192/256, clusters with scale multicast;
    grouped (MoE) with the static, CLC and dynamic schedulers."""
    if arch != "sm_100a":
        return []
    E = EpilogueSpec
    mxfp8 = dict(a_dtype="e4m3", b_dtype="e4m3", sf_dtype="e8m0", sf_vec=32)
    mxfp4 = dict(a_dtype="e2m1", b_dtype="e2m1", sf_dtype="e8m0", sf_vec=32)
    mixed = dict(a_dtype="e4m3", b_dtype="e2m1", sf_dtype="e8m0", sf_vec=32)
    # NVFP4: the product of A's and B's per-tensor global scales is a 1-element device vector that
    # the epilogue multiplies by (scale_a; no host read); one variant also has the call's alpha.
    nvfp4 = dict(a_dtype="e2m1", b_dtype="e2m1", sf_dtype="e4m3", sf_vec=16, epilogue=E(scale_a=True))
    base = GemmConfig(arch=arch, a_major="k", b_major="k")
    big = dict(tile_m=256, tile_n=256, two_cta=True, cluster_m=2)
    return [
        replace(base, **mxfp8, tile_m=128, tile_n=256),
        replace(base, **mxfp8, **big),
        replace(base, **mxfp8, tile_m=128, tile_n=128, cluster_m=2, cluster_n=2, out_dtype="fp32"),
        replace(base, **mxfp8, **big, epilogue=E(alpha=True, bias=True, bias_dtype="bf16", activation="gelu")),
        replace(base, **nvfp4, tile_m=128, tile_n=256),
        replace(base, **nvfp4, **big),
        replace(base, **nvfp4, tile_m=256, tile_n=128, two_cta=True, cluster_m=2, cluster_n=2),
        replace(base, **{**nvfp4, "epilogue": E(alpha=True, scale_a=True)}, tile_m=128, tile_n=128, cluster_n=2,
                out_dtype="fp16"),
        replace(base, **mxfp4, tile_m=128, tile_n=128),
        # N = 64 / 192: SFB granules of 128 columns, odd tiles shift into them
        replace(base, **mxfp8, tile_m=128, tile_n=192, cluster_n=2),
        replace(base, **nvfp4, tile_m=256, tile_n=64, two_cta=True, cluster_m=2),
        replace(base, **mxfp4, **big),
        # MXFP8 x MXFP4 (kind::mxf8f6f4; the FP4 operand unpacked to a byte per element in shared
        # memory by its TMA): 1-CTA, 2-CTA with B multicast, FP4 activations x FP8 weights
        replace(base, **mixed, tile_m=128, tile_n=256),
        replace(base, **mixed, **big),
        replace(base, **{**mixed, "a_dtype": "e2m1", "b_dtype": "e4m3"}, tile_m=128, tile_n=128, cluster_n=2),
        # grouped (MoE packed form): per-expert padded A scales, B scales per expert (L = E)
        replace(base, **mxfp8, tile_m=128, tile_n=128, form=Form.GROUPED),
        replace(base, **nvfp4, tile_m=128, tile_n=256, form=Form.GROUPED, cluster_n=2),
        replace(base, **mxfp4, tile_m=128, tile_n=128, form=Form.GROUPED, scheduler="clc"),
        replace(base, **mixed, tile_m=128, tile_n=256, form=Form.GROUPED, cluster_n=2),
        replace(base, **mxfp8, tile_m=128, tile_n=256, form=Form.GROUPED, scheduler="dynamic",
                epilogue=E(bias=True, bias_dtype="bf16", gated="swiglu")),
    ]  # fmt: skip


def all_variants(archs) -> list[GemmConfig]:
    return [
        cfg
        for arch in archs
        for family in (dense_variants, kgrouped_variants, listed_variants, grouped_variants, blockscaled_variants,
                       scheduler_variants)
        for cfg in family(arch)
    ]


def family_results(archs, all_configs, check_variant) -> list[CheckResult]:
    """Every variant of a kernel family: ``all_configs(arch)`` lists them, ``check_variant(cfg)``
    compiles one and checks its SASS."""
    out = []
    for cfg in (c for arch in archs for c in all_configs(arch)):
        t0 = time.time()
        ok, markers, err = check_variant(cfg)
        res = CheckResult(cfg.name, ok, markers, time.time() - t0, err)
        print(res.line(), flush=True)
        out.append(res)
    return out


def quantize_results(archs) -> list[CheckResult]:
    """The block-scaled quantize kernels (cutegemm.blockscaled.quantizer), every variant."""
    return family_results(archs, quantize_kernels.all_configs, quantize_kernels.check_variant)


def dequant_results(archs) -> list[CheckResult]:
    """The block-scaled -> bf16 dequantize kernels (cutegemm.blockscaled.dequant), every variant."""
    return family_results(archs, dequant.all_configs, dequant.check_variant)


def gated_results(archs) -> list[CheckResult]:
    """The MoE layer's elementwise swiglu forward / backward kernels (cutegemm.epilogue.gated_grads)."""
    return family_results(archs, gated_kernels.all_configs, gated_kernels.check_variant)


def combine_results(archs) -> list[CheckResult]:
    """The MoE layer's one-pass row combines (cutegemm.epilogue.combine), every variant."""
    return family_results(archs, combine_kernels.all_configs, combine_kernels.check_variant)


def dispatch_results(archs) -> list[CheckResult]:
    """The MoE layer's one-launch dispatch sort (cutegemm.epilogue.dispatch), every variant."""
    return family_results(archs, dispatch_kernels.all_configs, dispatch_kernels.check_variant)


def fp4_weight_results(archs) -> list[CheckResult]:
    """The FP4-weight (W4A16) kernels (cutegemm.blockscaled.weight_only.kernel), every variant."""
    return family_results(archs, weight_only.all_configs, weight_only.check_variant)


def main(archs) -> int:
    results = []
    for cfg in all_variants(archs):
        res = check_config(cfg)
        print(res.line(), flush=True)
        results.append(res)
    results += quantize_results(archs)
    results += dequant_results(archs)
    results += gated_results(archs)
    results += combine_results(archs)
    results += dispatch_results(archs)
    results += fp4_weight_results(archs)
    failed = [r for r in results if not r.ok]
    print(f"compile-check: {len(results) - len(failed)}/{len(results)} variants passed for {', '.join(archs)}")
    return 1 if failed else 0
