"""What the MoE layer's elementwise / row kernels between the GEMMs share (``gated_grads``,
``routed_grads``, ``combine``): 128-bit chunks of 8 bf16 / fp16 values, flat 1-D fake tensors for
the compile cache, the SASS markers compile-check holds them to, and the SwiGLU math of a chunk
(traced inline: plain Python over fp32 register tensors)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_tensor

from .ops import CuteMath

CHUNK = 8  # 16-bit values per 128-bit load / store
MAX_ELEMENTS = 2**31 - 1  # flat int32 indexing
KERNEL_DTYPES = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16}
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
SASS_REQUIRED = {"LDG.128": r"\bLDG\.E[.A-Z0-9]*\.128", "STG.128": r"\bSTG\.E[.A-Z0-9]*\.128"}
SASS_FORBIDDEN = {"LDL": r"\bLDL(\.|\s)", "STL": r"\bSTL(\.|\s)"}


def flat_tensor(dtype, divisibility: int):
    """A 1-D fake tensor of ``dtype``, 16-byte aligned, its length a multiple of ``divisibility``."""
    return make_fake_tensor(dtype, (cute.sym_int32(divisibility=divisibility),), (1,), assumed_align=16)


def check_swiglu_config(cfg) -> None:
    """Raise ValueError unless ``cfg`` (a SwiGLU row kernel's config) names a kernel dtype, a gate
    layout and an arch these kernels build for."""
    if cfg.dtype not in KERNEL_DTYPES or cfg.layout not in ("interleaved", "halves") or cfg.arch not in (
            "sm_90a", "sm_100a"):  # fmt: skip
        raise ValueError(f"bad {type(cfg).__name__} {cfg}")


def swiglu_operands(dh, z) -> bool:
    """Whether Z (R, 2I) and dH (R, I) (None: not given) are what the SwiGLU row kernels read:
    CUDA bf16 / fp16 of one dtype on one device, contiguous, 16-byte aligned, I a multiple of 8,
    within flat int32 indexing."""
    if not z.is_cuda or z.dtype not in DTYPE_NAMES or z.dim() != 2 or z.shape[1] % (2 * CHUNK):
        return False
    if not z.is_contiguous() or z.data_ptr() % 16 or z.numel() > MAX_ELEMENTS:
        return False
    return dh is None or (dh.dtype == z.dtype and dh.shape == (z.shape[0], z.shape[1] // 2) and dh.is_contiguous()
                          and dh.data_ptr() % 16 == 0 and dh.device == z.device)  # fmt: skip


def swiglu_registers(dtype, steps: int):
    """The register tensors of a SwiGLU row kernel, made at the kernel's top level: (rD, rZ, rG,
    rU) the loads of ``steps`` chunks (dH; interleaved Z; halves' gates and ups), (fZ, fG, fU) one
    chunk in fp32, (oH, oG, oU, oZ) one chunk's stores."""
    f32 = cutlass.Float32
    return (cute.make_rmem_tensor((CHUNK, steps), dtype), cute.make_rmem_tensor((2 * CHUNK, steps), dtype),
            cute.make_rmem_tensor((CHUNK, steps), dtype), cute.make_rmem_tensor((CHUNK, steps), dtype),
            cute.make_rmem_tensor((2 * CHUNK,), f32), cute.make_rmem_tensor((CHUNK,), f32),
            cute.make_rmem_tensor((CHUNK,), f32), cute.make_rmem_tensor((CHUNK,), dtype),
            cute.make_rmem_tensor((CHUNK,), dtype), cute.make_rmem_tensor((CHUNK,), dtype),
            cute.make_rmem_tensor((2 * CHUNK,), dtype))  # fmt: skip


def split_pairs(fZ, fG, fU):
    """The interleaved chunk fZ (16 fp32: gate, up, gate, ...) into its 8 gates fG and ups fU."""
    for i in range(CHUNK):  # a plain loop: helpers are traced, not preprocessed
        fG[i] = fZ[2 * i]
        fU[i] = fZ[2 * i + 1]


def join_pairs(fZ, fG, fU):
    """The inverse of :func:`split_pairs`: fG and fU interleaved into fZ."""
    for i in range(CHUNK):
        fZ[2 * i] = fG[i]
        fZ[2 * i + 1] = fU[i]


def gate_up_f32(halves: bool, u: int, rZ, rG, rU, fZ, fG, fU):
    """The fp32 gates fG and ups fU of loaded chunk ``u``: from rG / rU (halves layout) or from the
    interleaved rZ (through fZ)."""
    if halves:
        fG.store(rG[None, u].load().to(cutlass.Float32))
        fU.store(rU[None, u].load().to(cutlass.Float32))
    else:
        fZ.store(rZ[None, u].load().to(cutlass.Float32))
        split_pairs(fZ, fG, fU)


def store_dz(halves: bool, d_gate, d_up, mDZ, z_chunk, g_idx, cpr, dtype, fZ, fG, fU, oG, oU, oZ):
    """dZ's chunk in Z's layout: gates at 8-element chunk ``g_idx`` and ups ``cpr`` chunks later
    (halves), or the pairs interleaved at 16-element chunk ``z_chunk`` (through fZ)."""
    if halves:
        oG.store(d_gate.to(dtype))
        oU.store(d_up.to(dtype))
        cute.autovec_copy(oG, cute.local_tile(mDZ, (CHUNK,), (g_idx,)))
        cute.autovec_copy(oU, cute.local_tile(mDZ, (CHUNK,), (g_idx + cpr,)))
    else:
        fG.store(d_gate)
        fU.store(d_up)
        join_pairs(fZ, fG, fU)
        oZ.store(fZ.load().to(dtype))
        cute.autovec_copy(oZ, cute.local_tile(mDZ, (2 * CHUNK,), (z_chunk,)))


def swiglu_parts(g, up):
    """(s, a, h) of fp32 gates g and ups: s = sigmoid(g) (the GEMM epilogue's fast-math silu),
    a = silu(g) = g s, h = a up."""
    s = CuteMath.rcp(1.0 + CuteMath.exp(g * -1.0))
    a = g * s
    return s, a, a * up


def swiglu_grads(d, g, up, s, a):
    """(dgate, dup) of h = silu(g) up for the gradient d of h: d up silu'(g) with
    silu'(g) = s (1 + g (1 - s)), and d a."""
    return d * up * (s * (1.0 + g * (1.0 - s))), d * a


__all__ = ["CHUNK", "DTYPE_NAMES", "KERNEL_DTYPES", "MAX_ELEMENTS", "SASS_FORBIDDEN", "SASS_REQUIRED", "check_swiglu_config", "flat_tensor", "gate_up_f32", "join_pairs", "split_pairs", "store_dz",
           "swiglu_grads", "swiglu_operands", "swiglu_parts", "swiglu_registers"]
