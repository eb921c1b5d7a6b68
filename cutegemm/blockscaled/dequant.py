"""MXFP8 -> bf16 dequantization on the GPU (CuTe DSL, sm_90a and sm_100a): ``dequantize_bf16(q)``.

Used by the sm_90a MXFP8 x MXFP8 GEMM for compute-bound shapes (``sm90_mx``): Hopper has no
block-scaled MMA, and one pass that writes bf16 copies of both operands, followed by the bf16
WGMMA GEMM, is faster there than emulating the per-32 scaling inside the FP8 mainloop
(bench/RESULTS.md, 2026-11-30 sixth session).

Design (memory bound, arch-neutral: plain vector loads/stores, no tensor cores): the elements
are read as a flat row-major array of 16-byte chunks (16 e4m3 / e5m2 values, one 128-bit load);
consecutive threads take consecutive chunks (coalesced), a CTA of ``threads`` threads handles
``unroll`` tiles of ``threads`` chunks, and each thread issues all its loads (elements and its
chunk's scale byte, read from the 128x4-swizzled layout) before any math. A value is
``fp32(element) * 2**(scale - 127)`` (exact in fp32: a power-of-two scaling of an 8-bit float),
rounded to bf16 with round-to-nearest-even, which is exact too unless ``|value| < 2**-130``
(bf16 subnormals keep fewer bits) or it exceeds bf16's range; a NaN scale (0xFF) gives NaN, as
``dequantize_ref`` does.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

from .quantize import MAX_ELEMENTS, CuteOps, scale_strides, swizzle_offset
from .reference import BlockScaledTensor

__all__ = ["DequantConfig", "dequantize_bf16", "dequantize_bf16_ref"]

CHUNK = 16  # elements per thread per step: one 128-bit load, two 128-bit stores
MX_BLOCK = 32
_ELEM = {"mxfp8": cutlass.Float8E4M3FN, "mxfp8_e5m2": cutlass.Float8E5M2}
_TORCH_ELEM = {"mxfp8": torch.float8_e4m3fn, "mxfp8_e5m2": torch.float8_e5m2}
# SASS of every variant: 128-bit loads and stores, no local-memory spills (compile-check)
SASS_REQUIRED = {"LDG.128": r"\bLDG\.E[.A-Z0-9]*\.128", "STG.128": r"\bSTG\.E[.A-Z0-9]*\.128"}
SASS_FORBIDDEN = {"LDL": r"\bLDL(\.|\s)", "STL": r"\bSTL(\.|\s)"}


@dataclass(frozen=True)
class DequantConfig:
    """What changes the compiled dequantize kernel (the compile-cache key)."""

    fmt: str = "mxfp8"
    arch: str = "sm_90a"
    threads: int = 256
    unroll: int = 4

    def __post_init__(self):
        if self.fmt not in _ELEM:
            raise ValueError(f"DequantConfig.fmt must be one of {sorted(_ELEM)}, got {self.fmt!r}")
        if self.arch not in ("sm_90a", "sm_100a"):
            raise ValueError(f"DequantConfig.arch must be sm_90a or sm_100a, got {self.arch!r}")

    @property
    def name(self) -> str:
        return f"dequant_{self.fmt}_bf16_{self.arch}"


def scale_factor_bits(sbyte, m):
    """fp32 bits of an e8m0 scale byte's value ``2**(sbyte - 127)`` (int32 in [0, 255]): byte 0
    is 2**-127 (an fp32 subnormal), 0xFF NaN. ``m``: CuteOps in the kernel, TorchOps in twins."""
    edge = m.to_int(sbyte == 0) + m.to_int(sbyte == 255)  # 1 for 0x00 / 0xFF: mantissa bit 22
    return (sbyte << 23) | (edge << 22)


class DequantKernel:
    """One thread per 16-element chunk per unroll step; see the module docstring."""

    def __init__(self, cfg: DequantConfig):
        self.cfg = cfg
        self.elem = _ELEM[cfg.fmt]

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (numel,) elements, flat row-major
        mS: cute.Tensor,  # (scale bytes,) uint8, 128x4-swizzled
        mOut: cute.Tensor,  # (numel,) bf16
        rows: cutlass.Int32,  # rows per batch
        cpr: cutlass.Int32,  # chunks per row (K / 16)
        total: cutlass.Int32,  # chunks in all
        batch_stride: cutlass.Int32,  # scale bytes per batch (quantize.scale_strides)
        tile_stride: cutlass.Int32,  # scale bytes per 128-row tile row
        stream,
    ):
        per_cta = self.cfg.threads * self.cfg.unroll
        grid = (total + per_cta - 1) // per_cta
        div_cpr = cute.fast_divmod_create_divisor_v2(cpr)
        div_rows = cute.fast_divmod_create_divisor_v2(rows)
        self.kernel(mQ, mS, mOut, div_rows, div_cpr, (batch_stride, tile_stride), total).launch(
            grid=[grid, 1, 1], block=[self.cfg.threads, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, mQ, mS, mOut, div_rows, div_cpr, strides, total: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        U, T = self.cfg.unroll, self.cfg.threads
        base = bidx * (T * U) + tidx
        rQ = cute.make_rmem_tensor((CHUNK, U), self.elem)
        rS = cute.make_rmem_tensor((U,), cutlass.Int32)
        for u in cutlass.range_constexpr(U):
            # past the end: load the last chunk instead (never stored)
            chunk = cutlass.min(base + u * T, total - 1)
            cute.autovec_copy(cute.local_tile(mQ, (CHUNK,), (chunk,)), rQ[None, u])
            row, cc = divmod(chunk, div_cpr)
            b, r = divmod(row, div_rows)
            rS[u] = cutlass.Int32(mS[swizzle_offset(b, r, cc >> 1, *strides)])  # 2 chunks per block
        rO = cute.make_rmem_tensor((CHUNK,), cutlass.BFloat16)
        for u in cutlass.range_constexpr(U):
            chunk = base + u * T
            factor = CuteOps.as_float(scale_factor_bits(rS[u], CuteOps))
            rO.store((rQ[None, u].load().to(cutlass.Float32) * factor).to(cutlass.BFloat16))
            if chunk < total:
                cute.autovec_copy(rO, cute.local_tile(mOut, (CHUNK,), (chunk,)))


def _flat(dtype, div, align):
    return make_fake_tensor(dtype, (cute.sym_int32(divisibility=div),), (1,), assumed_align=align)


def build_dequant(cfg: DequantConfig):
    """(kernel object, fake args) for :class:`~cutegemm.runtime.cache.KernelCache`: one kernel
    serves every shape."""
    args = (
        _flat(_ELEM[cfg.fmt], CHUNK, 16),
        _flat(cutlass.Uint8, 1, 1),
        _flat(cutlass.BFloat16, CHUNK, 16),
        *(cutlass.Int32(1),) * 5,
        make_fake_stream(use_tvm_ffi_env_stream=True),
    )
    return DequantKernel(cfg), args


@functools.cache
def _cache():
    from ..runtime.cache import KernelCache

    return KernelCache(build_dequant)


def all_configs(arch: str) -> list[DequantConfig]:
    """Every kernel variant for ``arch`` (compile-check)."""
    return [DequantConfig(fmt=f, arch=arch) for f in _ELEM]


def check_variant(cfg: DequantConfig) -> tuple[bool, dict, str]:
    """Compile ``cfg`` to SASS (no GPU needed) and check it: (ok, marker counts, error)."""
    from ..runtime.sass import check_sass

    return check_sass(build_dequant(cfg), cfg.arch, SASS_REQUIRED, SASS_FORBIDDEN)


def check_dequant_operand(q: BlockScaledTensor, what: str = "q") -> None:
    """The kernel's rules: an MXFP8 (e4m3 / e5m2) tensor on a CUDA device, contiguous 16-byte
    aligned elements, K a multiple of 16, fewer than 2**31 elements, swizzled scales."""
    if q.fmt.name not in _ELEM:
        raise ValueError(f"{what}: dequantize_bf16 takes MXFP8 tensors, got {q.fmt.name}")
    d = q.data
    if d.device.type != "cuda":
        raise ValueError(f"{what}: expected a CUDA tensor, got device {d.device}")
    if d.dtype != _TORCH_ELEM[q.fmt.name]:
        raise ValueError(f"{what}: {q.fmt.name} elements must be {_TORCH_ELEM[q.fmt.name]}, got {d.dtype}")
    if not d.is_contiguous() or d.data_ptr() % 16:
        raise ValueError(f"{what}: the elements must be contiguous and 16-byte aligned")
    if q.shape[-1] % CHUNK:
        raise ValueError(f"{what}: K must be a multiple of {CHUNK}, got {q.shape[-1]}")
    if d.numel() > MAX_ELEMENTS:
        raise ValueError(f"{what}: at most {MAX_ELEMENTS} elements per call, got {d.numel()}")


def dequantize_bf16(q: BlockScaledTensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """bf16 values of an MXFP8 :class:`BlockScaledTensor` (``q.shape``, on its device) from one
    kernel pass; equal to ``dequantize_ref(q).to(torch.bfloat16)`` (exact unless a value is below
    2**-130 in magnitude). ``out``: an optional contiguous bf16 tensor of ``q.shape``."""
    from .quantize import _arch_of

    check_dequant_operand(q)
    if out is None:
        out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.data.device)
    elif out.shape != q.shape or out.dtype != torch.bfloat16 or not out.is_contiguous() or out.data_ptr() % 16:
        raise ValueError(f"out: expected a contiguous 16-byte aligned bf16 tensor of shape {tuple(q.shape)}")
    if q.data.numel() == 0:
        return out
    rows, k = q.shape[-2], q.shape[-1]
    scales = q.swizzled_scales()
    batch_stride, tile_stride = scale_strides(rows, -(-k // MX_BLOCK))
    cfg = DequantConfig(fmt=q.fmt.name, arch=_arch_of(q.data.device.index or 0))
    _cache().get(cfg)(
        q.data.view(-1), scales.view(torch.uint8).reshape(-1), out.view(-1),
        rows, k // CHUNK, q.data.numel() // CHUNK, batch_stride, tile_stride,
    )  # fmt: skip
    return out


def dequantize_bf16_ref(q: BlockScaledTensor) -> torch.Tensor:
    """The kernel's arithmetic in torch (any device): fp32 element times the scale's fp32 value
    (from :func:`scale_factor_bits`), rounded to bf16."""
    from .quantize import TorchOps

    sbytes = q.plain_scales().view(torch.uint8).to(torch.int32)
    factor = TorchOps.as_float(scale_factor_bits(sbytes, TorchOps).contiguous())
    k = q.shape[-1]
    factor = factor.repeat_interleave(MX_BLOCK, dim=-1)[..., :k]
    return (q.data.float() * factor).to(torch.bfloat16)
