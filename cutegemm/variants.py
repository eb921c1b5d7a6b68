"""The support matrix that `python -m cutegemm compile-check` builds: every GEMM kernel variant
(dense, FP8, K-grouped, list form, grouped, block-scaled, schedulers) per arch, each dimension
covered at least once (not the full product). :mod:`cutegemm.compile_check` compiles them and
checks their SASS."""

from __future__ import annotations

from dataclasses import replace

from .config import Form, GemmConfig
from .epilogue import EpilogueSpec, fn
from .epilogue.user import register


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
            # 1x2 clusters of odd M-tile counts (policy.odd_m_pairs_n), M-major raster
            GemmConfig(arch=arch, tile_m=128, tile_n=224, cluster_n=2, a_major="k", b_major="k", form=Form.FLAT),
            GemmConfig(arch=arch, tile_m=128, tile_n=224, cluster_n=2, a_major="k", b_major="k",
                       epilogue=EpilogueSpec(bias=True, gated="swiglu")),
            GemmConfig(arch=arch, tile_m=128, tile_n=192, cluster_n=2, a_major="k", b_major="k", form=Form.FLAT),
            # the wave model's 192-row (three consumer warpgroups), 64x96 1x2 / 2x1 and 128x96 1x2 picks
            GemmConfig(arch=arch, tile_m=128, tile_n=96, cluster_n=2, a_major="k", b_major="k", form=Form.FLAT),
            GemmConfig(arch=arch, tile_m=192, tile_n=192, a_major="k", b_major="k", form=Form.FLAT,
                       epilogue=EpilogueSpec(bias=True, activation="silu")),
            # 192x128 in 1x2 pairs and 192x160 (policy.TALL_128_RATE / TALL_160_RATE); 128x96 2x1 (wide_n_pairs_m)
            GemmConfig(arch=arch, tile_m=192, tile_n=128, cluster_n=2, a_major="k", b_major="k", form=Form.FLAT),
            GemmConfig(arch=arch, tile_m=192, tile_n=160, a_major="k", b_major="k", form=Form.FLAT,
                       epilogue=EpilogueSpec(bias=True, activation="silu")),
            GemmConfig(arch=arch, tile_m=128, tile_n=96, cluster_m=2, raster="n", a_major="k", b_major="k",
                       form=Form.FLAT),
            GemmConfig(arch=arch, tile_m=64, tile_n=96, cluster_n=2, raster="n", group=1, a_major="k", b_major="k",
                       form=Form.FLAT),
            GemmConfig(arch=arch, tile_m=64, tile_n=96, cluster_m=2, raster="n", group=1, a_major="k", b_major="k",
                       form=Form.FLAT),
            # 80-column tiles (16-column epilogue subtiles) and the 64-row 2x1 pairs of 112 < M <= 128
            # (policy.small_m_pair), with a short A box, bias + silu, an fp32 output, SwiGLU
            GemmConfig(arch=arch, tile_m=64, tile_n=80, cluster_m=2, raster="n", group=1, a_major="k", b_major="k",
                       form=Form.FLAT),
            GemmConfig(arch=arch, tile_m=64, tile_n=80, raster="n", group=1, a_major="k", b_major="k", form=Form.FLAT,
                       a_rows=16, epilogue=EpilogueSpec(bias=True, activation="silu")),
            GemmConfig(arch=arch, tile_m=128, tile_n=80, a_major="m", b_major="n", out_dtype="fp32"),
            GemmConfig(arch=arch, tile_m=64, tile_n=160, cluster_m=2, raster="n", group=1, a_major="k", b_major="k",
                       form=Form.FLAT, epilogue=EpilogueSpec(bias=True, gated="swiglu")),
            GemmConfig(arch=arch, tile_m=64, tile_n=192, cluster_m=2, raster="n", group=1, a_major="k", b_major="k",
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
        E(activation="relu_sq"),
        E(alpha=True, bias=True, bias_dtype="fp32", activation="tanh"),
        E(activation="sigmoid"),
        E(gated="swiglu"),
        E(gated="geglu", bias=True, bias_dtype="fp32"),
        E(gated="geglu_tanh", bias=True, bias_dtype="bf16"),
        E(gated="reglu"),
        E(gated="glu", bias=True, bias_dtype="fp32"),
        E(gated="swiglu_oai", bias=True, bias_dtype="bf16"),
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
    gated output with a bias, e5m2 A, FP8 outputs."""
    E = EpilogueSpec
    fp8 = dict(arch=arch, a_dtype="e4m3", b_dtype="e4m3", a_major="k", b_major="k")
    ab = E(scale_a=True, scale_b=True)
    return [
        GemmConfig(**fp8, tile_m=128, tile_n=128, epilogue=ab),
        GemmConfig(**fp8, tile_m=256, tile_n=256, two_cta=True, cluster_m=2, out_dtype="fp32", epilogue=ab),
        GemmConfig(**fp8, tile_m=128, tile_n=256, cluster_n=2, epilogue=E(scale_a=True, scale_b=True, bias=True,
                                                                           bias_dtype="bf16", gated="swiglu")),
        GemmConfig(**{**fp8, "a_dtype": "e5m2"}, tile_m=128, tile_n=128, epilogue=ab),  # e5m2 x e4m3 (FP8 training's dgrad)
        # FP8 outputs (saturated, stored by coordinate)
        GemmConfig(**fp8, tile_m=128, tile_n=128, out_dtype="e4m3", epilogue=ab),
        GemmConfig(**{**fp8, "a_dtype": "e5m2"}, tile_m=256, tile_n=256, two_cta=True, cluster_m=2, out_dtype="e5m2",
                   epilogue=E(scale_a=True, scale_b=True, bias=True, bias_dtype="bf16", activation="relu")),
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
                      split_cluster=True, epilogue=ab),
           # 1x2 clusters of odd M-tile counts (policy.odd_m_pairs_n), M-major raster
           GemmConfig(arch=arch, **fp8, tile_m=128, tile_n=192, cluster_n=2, form=Form.FLAT, epilogue=ab),
           # 112 < M <= 128 (small_m.FP8_ROW_SPLIT): 2x1 pairs of 64x64 tiles, fp32 out promoted per WGMMA
           GemmConfig(arch=arch, **fp8, tile_m=64, tile_n=64, cluster_m=2, raster="n", group=1, out_dtype="fp32",
                      promote_k=32, epilogue=ab),
           # 128x160 for M > 128 (policy.E4M3_160_RATE): 2x1 N-major, and 1x2 into an FP8 output
           GemmConfig(arch=arch, **fp8, tile_m=128, tile_n=160, cluster_m=2, raster="n", group=8, epilogue=ab),
           GemmConfig(arch=arch, **fp8, tile_m=128, tile_n=160, cluster_n=2, out_dtype="e4m3", epilogue=ab),
           GemmConfig(arch=arch, **fp8, tile_m=128, tile_n=128, cluster_n=2,
                      epilogue=E(scale_a=True, scale_b=True, bias=True, bias_dtype="bf16", activation="silu"))]
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
        # e5m2 operands (either side, or both): the policy's tiles of the same shapes
        GemmConfig(arch=arch, **{**fp8, "a_dtype": "e5m2"}, tile_m=128, tile_n=128, cluster_m=2, epilogue=ab),
        GemmConfig(arch=arch, **{**fp8, "b_dtype": "e5m2"}, tile_m=64, tile_n=128, raster="n", group=1, form=Form.FLAT,
                   epilogue=ab),
        GemmConfig(arch=arch, **{**fp8, "a_dtype": "e5m2", "b_dtype": "e5m2"}, tile_m=128, tile_n=256, cluster_m=2,
                   fast_accum=True, epilogue=E(scale_a=True)),
        # FP8 outputs (torch._scaled_mm's out_dtype float8): saturated, stored by coordinate
        *([GemmConfig(arch=arch, **fp8, tile_m=128, tile_n=128, cluster_m=2, out_dtype="e4m3", epilogue=ab),
           GemmConfig(arch=arch, **{**fp8, "a_dtype": "e5m2"}, tile_m=128, tile_n=128, cluster_n=2, out_dtype="e5m2",
                      epilogue=E(scale_a=True, scale_b=True, bias=True, bias_dtype="bf16", activation="relu")),
           GemmConfig(arch=arch, **fp8, tile_m=64, tile_n=128, raster="n", group=1, form=Form.FLAT, split_k=2,
                      out_dtype="e4m3", epilogue=ab)]
          if arch == "sm_90a" else []),
    ] + fp8_blockwise_variants(arch) + fp8_mx_variants(arch)  # fmt: skip


def kgrouped_variants(arch: str) -> list[GemmConfig]:
    """The K-grouped kernel (sm_90a; the MoE weight gradient, dW_e = x_e^T dy_e): the policy's
    128x256 2x1 with a column-major A (x.t()), 1x2 with a row-major A, 128x128 with the
    dynamic scheduler, an fp32 output and alpha, two pingpong tiles, and the gathered forms."""
    kg = dict(arch=arch, form=Form.KGROUPED, b_major="n")
    if arch == "sm_100a":  # the list-form kernel on a table written from offs
        kg.update(a_major="m", raster="m", group=1)
        return [GemmConfig(**kg, tile_m=128, tile_n=256), GemmConfig(**kg, tile_m=128, tile_n=128, out_dtype="fp32",
                                                                  epilogue=EpilogueSpec(alpha=True))]
    return [
        GemmConfig(**kg, a_major="m", tile_m=128, tile_n=256, cluster_m=2, raster="n", group=8),
        GemmConfig(**kg, a_major="k", tile_m=128, tile_n=256, cluster_n=2),
        GemmConfig(**kg, a_major="m", tile_m=128, tile_n=128, scheduler="dynamic", out_dtype="fp32",
                   epilogue=EpilogueSpec(alpha=True)),
        # pingpong: a warpgroup skips the other's tile by that tile's K-tile count
        GemmConfig(**kg, a_major="m", tile_m=128, tile_n=128, pingpong=True, cluster_m=2, raster="n", group=8),
        GemmConfig(**kg, a_major="k", tile_m=128, tile_n=128, pingpong=True, cluster_n=2),
        # the MoE weight gradients reading x / dout through the routing index (gather_a / gather_b)
        GemmConfig(**kg, a_major="m", tile_m=128, tile_n=256, gather_a=True),
        GemmConfig(**kg, a_major="m", tile_m=128, tile_n=128, pingpong=True, gather_b=True),
        GemmConfig(**kg, a_major="m", tile_m=128, tile_n=128, pingpong=True, gather_a=True, cluster_m=2),
        GemmConfig(**kg, a_major="m", tile_m=128, tile_n=128, pingpong=True, gather_b=True, cluster_n=2),
        # their default tiles (k_grouped.GATHER_WIDE_TILE): 128x256 cooperative, the TMA operand multicast
        GemmConfig(**kg, a_major="m", tile_m=128, tile_n=256, gather_a=True, cluster_m=2),
        GemmConfig(**kg, a_major="m", tile_m=128, tile_n=256, gather_b=True, cluster_n=2),
        GemmConfig(**kg, a_major="m", tile_m=128, tile_n=128, gather_a=True, a_dtype="fp16", b_dtype="fp16",
                   out_dtype="fp32", epilogue=EpilogueSpec(alpha=True)),
        # an M-major C (c_major "m"): gather "a" storing dW in an (E, N, K) weight's layout; the TMA kernel
        GemmConfig(**kg, a_major="m", tile_m=128, tile_n=256, gather_a=True, cluster_m=2, c_major="m"),
        GemmConfig(**kg, a_major="m", tile_m=128, tile_n=128, pingpong=True, cluster_m=2, raster="n", c_major="m",
                   a_dtype="fp16", b_dtype="fp16", out_dtype="fp16", epilogue=EpilogueSpec(alpha=True)),
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
        # B's scales per column (sfb_cols: torch's 1x128 x 1x128 / 128x128 x 1x128 recipes): the policy's tiles
        *([GemmConfig(arch=arch, **fp8, sfb_cols=True, tile_m=128, tile_n=192, cluster_m=2, raster="n", group=8,
                      wg_order=True),
           GemmConfig(arch=arch, **fp8, sfb_cols=True, tile_m=128, tile_n=128, cluster_n=2, raster="m", group=8,
                      wg_order=True),
           GemmConfig(arch=arch, **fp8, sfb_cols=True, tile_m=128, tile_n=64, raster="n", group=1, out_dtype="fp32",
                      epilogue=EpilogueSpec(alpha=True)),
           GemmConfig(arch=arch, **fp8, sfb_cols=True, tile_m=64, tile_n=64, raster="n", group=1, a_rows=16),
           GemmConfig(arch=arch, **fp8, sfb_cols=True, tile_m=64, tile_n=64, pingpong=True, raster="n", group=1)]
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
        *([replace(t64, tile_n=64, out_dtype="u8", epilogue=E(quant="mxfp4")),
           # the wave model's 1x2 pair over an odd M-tile count (policy.odd_m_pairs_n), 160 columns
           GemmConfig(arch=arch, tile_m=128, tile_n=160, cluster_n=2, out_dtype="e4m3",
                      epilogue=E(gated="swiglu", quant="mxfp8"))] if arch == "sm_90a" else []),
        replace(t256, epilogue=E(alpha=True, user=user, user_args=("bf16", "fp32"))),
        replace(t128, epilogue=E(user=user, user_args=("fp32", "fp32"))),
        replace(t256, out_dtype="e4m3", epilogue=E(user=user, user_args=("bf16", "bf16"), quant="mxfp8")),
    ]


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
        # the policy's short-K tile (policy.PINGPONG_MAX_K): pingpong 128x192 in 2x1 clusters, both B layouts
        GemmConfig(arch=arch, form=Form.GROUPED, tile_m=128, tile_n=192, cluster_m=2, pingpong=True, b_major="k",
                   raster="m", group=1),
        GemmConfig(arch=arch, form=Form.GROUPED, tile_m=128, tile_n=192, cluster_m=2, pingpong=True, raster="m",
                   group=1, a_dtype="fp16", b_dtype="fp16", epilogue=EpilogueSpec(gated="swiglu")),
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
        # C stored M-major (c_major "m": an M-major out, the 3d x 2d form's transposed result): the
        # policy's tiles for a K-major B (a^T of the 3d x 2d form), pingpong, FP8 row-wise
        GemmConfig(arch=arch, form=Form.GROUPED, tile_m=128, tile_n=256, cluster_n=2, scheduler="dynamic", b_major="k",
                   raster="m", group=1, c_major="m"),
        GemmConfig(arch=arch, form=Form.GROUPED, tile_m=64, tile_n=128, cluster_n=2, b_major="k", raster="m", group=1,
                   c_major="m"),
        GemmConfig(arch=arch, form=Form.GROUPED, tile_m=128, tile_n=192, cluster_m=2, pingpong=True, raster="m",
                   group=1, a_dtype="fp16", b_dtype="fp16", out_dtype="fp16", c_major="m",
                   epilogue=EpilogueSpec(alpha=True, activation="silu")),
        GemmConfig(arch=arch, form=Form.GROUPED, tile_m=128, tile_n=192, cluster_n=2, scheduler="dynamic",
                   a_dtype="e4m3", b_dtype="e4m3", b_major="k", raster="m", group=1, c_major="m",
                   epilogue=EpilogueSpec(scale_a=True, scale_b=True)),
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
        # the up projection of training: the gated output and the values before the gate (preact)
        # from one epilogue; gathered 2x1, and the plain packed form in pingpong fp16 with bias
        GemmConfig(arch=arch, form=Form.GROUPED, gather_a=True, tile_m=128, tile_n=256, cluster_m=2, raster="m", group=1,
                   epilogue=EpilogueSpec(gated="swiglu", preact=True)),
        GemmConfig(arch=arch, form=Form.GROUPED, tile_m=128, tile_n=128, pingpong=True, cluster_n=2, a_dtype="fp16",
                   b_dtype="fp16", out_dtype="fp16", epilogue=EpilogueSpec(bias=True, gated="geglu", preact=True)),
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
