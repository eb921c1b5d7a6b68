"""Fast block-scaled quantization on the GPU: ``quantize(x, fmt)`` (CuTe DSL, sm_90a and sm_100a).

The kernel is byte-identical to :func:`~cutegemm.blockscaled.reference.quantize_ref` run on the
same CUDA device (elements, swizzled scales including the zero padding bytes, global scale),
for MXFP8 (e4m3), MXFP8_E5M2, MXFP4 and NVFP4, from bf16 / fp16 / fp32 inputs of shape
``(rows, K)`` or ``(L, rows, K)``.

Design (memory bound, arch-neutral: plain vector loads/stores, no tensor cores):
    * The input is read as a flat row-major array of 8-element *chunks* (one 128-bit load for
      bf16/fp16, two for fp32). Consecutive threads take consecutive chunks, so every warp load
      is fully coalesced; a block of 32 (MX) / 16 (NVFP4) elements is 4 / 2 neighbouring lanes,
      which combine their partial ``|x|`` maxima with butterfly shuffles.
    * A CTA of ``THREADS`` threads handles ``UNROLL`` tiles of ``THREADS`` chunks; each thread
      issues all its loads before any math (bytes in flight for HBM).
    * All rounding is done with exact integer / IEEE fp32 operations whose torch twin
      (:class:`TorchOps`) is tested on the CPU against ``quantize_ref``:
      - MX: the shared exponent from the fp32 bits of the block amax (exact floor / ceil of log2,
        clamped to the e8m0 range), elements ``x * 2**-E`` (an exact power-of-two scaling);
      - e4m3 / e5m2 elements: ``cvt.rn.satfinite`` (round to nearest even, saturating; equal to
        torch's ``clamp(-max, max).to(float8)``);
      - e2m1 elements: round to nearest even on the e2m1 grid with one fp32 add of a magic
        power of two (same result as :func:`~cutegemm.blockscaled.reference.pack_fp4`);
      - NVFP4 block scale: ``amax * fp32(1/6) / global_scale`` (torch on CUDA divides by a Python
        scalar as a multiply by its fp32 reciprocal; ``quantize_ref`` on a CUDA tensor does
        exactly this), rounded to e4m3 with integer RNE; elements ``x / (s_e4m3 * global_scale)``
        with an IEEE division.
    * NaN/Inf blocks get the NaN scale (0xFF e8m0 / 0x7F e4m3) and zero elements; all-zero MX
      blocks get scale byte 0.

Host side: a launch plan per (shape, dtype, device, format, rule) is cached (``_plan``); kernels
are compiled once per :class:`QuantizeConfig` through the TVM-FFI path
(:class:`~cutegemm.runtime.cache.KernelCache`, memory + disk).
The NVFP4 default global scale needs the tensor's finite amax: a small reduction kernel
(:class:`FiniteAmaxKernel`, one read of x, one atomic per CTA) runs first, then quantize_ref's own
torch expression turns it into the scale on the device (no host sync).

Limits: K not a multiple of the block size (a tail block) is supported through a zero-padded copy of
the input (slower; the padding only enters the amax, exactly like the reference). Non-contiguous or
misaligned inputs are copied. At most 2**31 - 1 elements per call (ValueError otherwise).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import torch
from cutlass import memory
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

from ..runtime.cache import KernelCache
from ..runtime.sass import check_sass
from .formats import BlockFormat, get_format
from .layout import swizzled_shape

__all__ = ["QuantizeConfig", "TorchOps", "block_math_ref", "kernel_cache", "all_configs", "check_variant"]

CHUNK = 8  # elements per thread per chunk
THREADS = 256
UNROLL = 4
IN_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
KINDS = {"mxfp8": "e4m3", "mxfp8_e5m2": "e5m2", "mxfp4": "e2m1", "nvfp4": "e2m1"}
MAX_ELEMENTS = 2**31 - 1

# fp32 bit patterns / constants shared by the kernel and its torch twin
_ABS_MASK = 0x7FFFFFFF
_EXP_INF = 0x7F800000  # |bits| >= this: Inf or NaN
_MANT_MASK = 0x7FFFFF
_RCP6 = torch.tensor(1.0 / 6.0, dtype=torch.float32).item()  # torch CUDA: `t / 6.0` is `t * fp32(1/6)`
_E4M3_MAX = 448.0
_E4M3_MIN_NORMAL = 2.0**-6
_MAGIC_INT = 8388608.0  # 2**23: x + 2**23 - 2**23 rounds x in [0, 2**22] to an integer, RNE
# SASS of every variant: 128-bit vector loads, no local-memory spills (compile-check, CPU tests)
SASS_REQUIRED = {"LDG.128": r"\bLDG\.E[.A-Z0-9]*\.128"}
SASS_FORBIDDEN = {"LDL": r"\bLDL(\.|\s)", "STL": r"\bSTL(\.|\s)"}


@dataclass(frozen=True)
class QuantizeConfig:
    """What changes the compiled quantize kernel (the compile-cache key).

    fmt: format name (``mxfp8``, ``mxfp8_e5m2``, ``mxfp4``, ``nvfp4``); in_dtype: ``bf16`` /
    ``fp16`` / ``fp32``; scale_rule: ``ocp`` | ``ceil`` (MX only); arch: ``sm_90a`` | ``sm_100a``.
    """

    fmt: str
    in_dtype: str = "bf16"
    scale_rule: str = "ocp"
    arch: str = "sm_90a"
    threads: int = THREADS
    unroll: int = UNROLL

    def __post_init__(self):
        if self.fmt not in KINDS:
            raise ValueError(f"QuantizeConfig.fmt must be one of {sorted(KINDS)}, got {self.fmt!r}")
        if self.in_dtype not in IN_DTYPES.values():
            raise ValueError(f"QuantizeConfig.in_dtype must be bf16/fp16/fp32, got {self.in_dtype!r}")
        if self.scale_rule not in ("ocp", "ceil") or (self.fmt == "nvfp4" and self.scale_rule != "ocp"):
            raise ValueError(f"QuantizeConfig.scale_rule {self.scale_rule!r} is invalid for {self.fmt}")
        if self.arch not in ("sm_90a", "sm_100a"):
            raise ValueError(f"QuantizeConfig.arch must be sm_90a or sm_100a, got {self.arch!r}")

    @property
    def format(self) -> BlockFormat:
        return get_format(self.fmt)

    @property
    def lanes_per_block(self) -> int:
        return self.format.block_size // CHUNK

    @property
    def words_per_chunk(self) -> int:
        """int32 words of element data per 8-element chunk: 2 (fp8) or 1 (packed fp4)."""
        return 1 if KINDS[self.fmt] == "e2m1" else 2

    @property
    def name(self) -> str:
        return f"quantize_{self.fmt}_{self.in_dtype}_{self.scale_rule}_{self.arch}"


# --- the per-block math, written once over a small ops namespace ------------------------------
# In the kernel ``m`` is CuteOps (DSL scalars); TorchOps runs the same code on int32/fp32 torch
# tensors (one entry per block or element), tested on the CPU against quantize_ref.
class TorchOps:
    """The primitives of the block math on torch tensors (int32 bits, fp32 values)."""

    @staticmethod
    def select(cond, a, b):
        return torch.where(cond, a, b)

    @staticmethod
    def imax(a, b):
        return torch.maximum(a, torch.as_tensor(b, dtype=a.dtype))

    @staticmethod
    def imin(a, b):
        return torch.minimum(a, torch.as_tensor(b, dtype=a.dtype))

    @staticmethod
    def as_float(bits):
        return bits.view(torch.float32)

    @staticmethod
    def as_bits(x):
        return x.view(torch.int32)

    @staticmethod
    def to_int(cond):
        return cond.to(torch.int32)

    @staticmethod
    def fmin(a, b):
        return torch.minimum(a, torch.as_tensor(b, dtype=a.dtype))


def mx_exponent(amax_bits, fmt: BlockFormat, ceil: bool, m):
    """Shared exponent E of an MX block from the fp32 bits of its finite amax (>= 0).

    ``floor(log2(amax)) - emax`` is the biased fp32 exponent minus ``127 + emax``; the clamp to
    -127 also covers zero and fp32-subnormal amax (their floor is below -126 - emax). "ceil" adds
    one when the significand exceeds ``elem_max / 2**emax`` (exact: compare the mantissa bits).
    """
    e = (amax_bits >> 23) - (127 + fmt.elem_emax)
    if ceil:
        thr = round((fmt.elem_max / 2**fmt.elem_emax - 1.0) * 2**23)
        e = e + m.to_int((amax_bits & _MANT_MASK) > thr)
    return m.imax(e, -127)


def mx_factor_bits(e):
    """fp32 bits of ``2**-e`` for e in [-127, 127 - emax] (always a normal fp32)."""
    return (127 - e) << 23


def e4m3_round(s, m):
    """RNE of a finite fp32 ``0 <= s <= 448`` to e4m3: returns (code int32, value fp32)."""
    bits = m.as_bits(s)
    # normal range: drop 20 mantissa bits with round-to-nearest-even
    rbits = (bits + (0x7FFFF + ((bits >> 20) & 1))) & ~0xFFFFF
    code_n = (rbits >> 20) - (120 << 3)
    # subnormal range (s < 2**-6): k = RNE(s * 2**9) in [0, 8]; code k (8 is 2**-6, code 0x08)
    t = s * 512.0 + _MAGIC_INT
    k = m.as_bits(t) - 0x4B000000  # bits of 2**23 + k minus bits of 2**23
    val_s = (t - _MAGIC_INT) * (1.0 / 512.0)
    small = s < _E4M3_MIN_NORMAL
    return m.select(small, k, code_n), m.select(small, val_s, m.as_float(rbits))


def fp4_code(q, m):
    """e2m1 code (sign in bit 3) of fp32 ``q``, rounded as pack_fp4 does (nearest even, Inf and
    large values saturate to 6). The grid spacing is 0.5 on [0, 2), 1 on [2, 4), 2 above, so
    adding 2**22 / 2**23 / 2**24 (one fp32 add, round-to-nearest-even) rounds ``|q|`` to it."""
    bits = m.as_bits(q)
    ab = bits & _ABS_MASK
    e = m.imin(m.imax(ab >> 23, 127), 130)  # biased exponent, clamped to [127, 130]
    magic = (e + 22) << 23  # fp32 bits of 2**(e - 105): 2**22 for |q| < 2
    k = m.as_bits(m.as_float(ab) + m.as_float(magic)) - magic  # |q| rounded, in grid steps
    code = m.imin(k + 2 * e - 254, 7)
    return code | ((bits >> 28) & 8)


def nvfp4_scale(amax, gs, m, cuda_div6: bool = True):
    """NVFP4 block scale: (e4m3 code, its fp32 value) of ``min(amax / 6 / gs, 448)``, where
    ``amax / 6`` is ``amax * fp32(1/6)`` as torch computes it on CUDA (``cuda_div6``, what the
    kernel does) or an IEEE division as torch computes it on the CPU (twin tests only)."""
    s = m.fmin(((amax * _RCP6) if cuda_div6 else (amax / 6.0)) / gs, _E4M3_MAX)
    return e4m3_round(s, m)


def scale_strides(rows: int, cols: int) -> tuple[int, int]:
    """(batch stride, 128-row tile-row stride) in bytes of the swizzled layout of (L, rows, cols)."""
    rows_p, cols_p = swizzled_shape(rows, cols)
    return rows_p * cols_p, cols_p * 128


def swizzle_offset(b, r, col, batch_stride, tile_stride):
    """Byte offset of scale (batch b, row r, block column col) in the (L, rows_p, cols_p)
    128x4-swizzled layout of :mod:`cutegemm.blockscaled.layout` (ints, torch or DSL Int32 >= 0;
    strides from :func:`scale_strides`)."""
    tile = (r >> 7) * tile_stride + (col >> 2) * 512
    return b * batch_stride + tile + (r & 31) * 16 + ((r >> 5) & 3) * 4 + (col & 3)


def block_math_ref(
    x: torch.Tensor,
    fmt: BlockFormat | str,
    scale_rule: str = "ocp",
    global_scale=None,
    cuda_div6: bool = True,
):
    """The kernel's math in torch (the twin tested against quantize_ref): plain (unswizzled)
    ``(scale bytes uint8, element codes)`` of a 2-D ``(rows, K)`` input with K a multiple of the
    block size. Element codes: fp32 scaled values for fp8 formats (the cast is torch's),
    uint8 e2m1 codes for FP4. ``global_scale``: NVFP4 fp32 0-d tensor (required for NVFP4);
    ``cuda_div6``: see :func:`nvfp4_scale` (False reproduces quantize_ref on the CPU)."""
    fmt = get_format(fmt)
    m = TorchOps
    xf = x.float().unflatten(-1, (-1, fmt.block_size))
    bits = xf.view(torch.int32)
    amax_bits = (bits & _ABS_MASK).amax(dim=-1)
    nonfinite = amax_bits >= _EXP_INF
    keep = ~nonfinite.unsqueeze(-1)
    if fmt.is_mx:
        e = mx_exponent(amax_bits, fmt, scale_rule == "ceil", m)
        sbytes = torch.where(nonfinite, 0xFF, e + 127)
        q = xf * m.as_float(mx_factor_bits(e)).unsqueeze(-1)
    else:
        gs = global_scale.float()
        code, sval = nvfp4_scale(m.as_float(amax_bits), gs, m, cuda_div6)
        sbytes = torch.where(nonfinite, 0x7F, code)
        denom = (sval * gs).unsqueeze(-1)
        q = torch.where(denom > 0, xf / denom, 0.0)
    q = torch.where(keep, q, 0.0)
    if fmt.elems_per_byte == 2:
        codes = torch.where(keep, fp4_code(q, m), 0).to(torch.uint8)
        return sbytes.to(torch.uint8), codes.flatten(-2)
    return sbytes.to(torch.uint8), q.flatten(-2)


# --- the kernel -------------------------------------------------------------------------------
class CuteOps:
    """The block-math primitives on CuTe DSL scalars (Int32 bits, Float32 values)."""

    @staticmethod
    def select(cond, a, b):
        return cutlass.select_(cond, a, b)

    @staticmethod
    def imax(a, b):
        return cutlass.max(a, cutlass.Int32(b))

    @staticmethod
    def imin(a, b):
        return cutlass.min(a, cutlass.Int32(b))

    @staticmethod
    def as_float(bits):
        return cutlass.Int32(bits).bitcast(cutlass.Float32)

    @staticmethod
    def as_bits(x):
        return cutlass.Float32(x).bitcast(cutlass.Int32)

    @staticmethod
    def to_int(cond):
        return cutlass.Int32(cond)

    @staticmethod
    def fmin(a, b):
        return cutlass.min(a, cutlass.Float32(b))


_DSL_IN = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16, "fp32": cutlass.Float32}
_DSL_FP8 = {"e4m3": cutlass.Float8E4M3FN, "e5m2": cutlass.Float8E5M2}
m = CuteOps


class QuantizeKernel:
    """One thread per 8-element chunk per unroll step; see the module docstring."""

    def __init__(self, cfg: QuantizeConfig):
        self.cfg = cfg
        self.fmt = cfg.format
        self.kind = KINDS[cfg.fmt]
        self.in_dtype = _DSL_IN[cfg.in_dtype]
        self.lanes = cfg.lanes_per_block
        self.words = cfg.words_per_chunk

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,  # (numel,) input, flat row-major
        mQ: cute.Tensor,  # (numel * words / 8,) int32 element data
        mS: cute.Tensor,  # (scale bytes,) uint8, swizzled, pre-zeroed where padded
        mGs: cute.Tensor,  # (1,) fp32 global scale (NVFP4; unused otherwise)
        rows: cutlass.Int32,  # rows per batch
        cpr: cutlass.Int32,  # chunks per row (K / 8)
        total: cutlass.Int32,  # chunks in all (L * rows * K / 8)
        batch_stride: cutlass.Int32,  # scale bytes per batch (scale_strides)
        tile_stride: cutlass.Int32,  # scale bytes per 128-row tile row
        stream,
    ):
        per_cta = self.cfg.threads * self.cfg.unroll
        grid = (total + per_cta - 1) // per_cta
        div_cpr = cute.fast_divmod_create_divisor_v2(cpr)  # multiply-shift divisions in the kernel
        div_rows = cute.fast_divmod_create_divisor_v2(rows)
        strides = (batch_stride, tile_stride)
        self.kernel(mX, mQ, mS, mGs, div_rows, div_cpr, strides, total).launch(
            grid=[grid, 1, 1], block=[self.cfg.threads, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, mX, mQ, mS, mGs, div_rows, div_cpr, strides, total: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        U = self.cfg.unroll
        T = self.cfg.threads
        base = bidx * (T * U) + tidx
        # (CHUNK, U) registers: all loads issued before any math
        rX = cute.make_rmem_tensor((CHUNK, U), self.in_dtype)
        for u in cutlass.range_constexpr(U):
            # past the end: load the last chunk instead (unpredicated loads all issue up front;
            # such chunks are never stored, and whole blocks lie on one side of the end)
            chunk = cutlass.min(base + u * T, total - 1)
            cute.autovec_copy(cute.local_tile(mX, (CHUNK,), (chunk,)), rX[None, u])
        gs = cutlass.Float32(1.0)
        if cutlass.const_expr(self.kind == "e2m1" and not self.fmt.is_mx):
            gs = mGs[0]
        for u in cutlass.range_constexpr(U):
            chunk = base + u * T
            self.quantize_chunk(
                rX[None, u].load().to(cutlass.Float32),
                chunk,
                total,
                gs,
                mQ,
                mS,
                (div_rows, div_cpr, strides),
            )

    @cute.jit
    def quantize_chunk(self, v, chunk, total, gs, mQ, mS, shape):
        """Quantize one 8-element chunk (fp32 TensorSSA ``v``) and store it (and, on the
        block's first lane, the block's scale byte) when ``chunk < total``."""
        rF = cute.make_rmem_tensor((CHUNK,), cutlass.Float32)
        rF.store(v)
        rB = cute.make_rmem_tensor((CHUNK,), cutlass.Int32)
        rB.store(v.bitcast(cutlass.Int32))
        amax_bits = rB[0] & _ABS_MASK
        for i in cutlass.range_constexpr(1, CHUNK):
            amax_bits = cutlass.max(amax_bits, rB[i] & _ABS_MASK)
        off = 1
        while off < self.lanes:  # Python loop: unrolled at trace time
            amax_bits = cutlass.max(amax_bits, cute.arch.shuffle_sync_bfly(amax_bits, off))
            off *= 2
        nonfinite = amax_bits >= _EXP_INF
        keep = cutlass.Int32(0) - m.to_int(amax_bits < _EXP_INF)  # all ones for finite blocks
        rW = cute.make_rmem_tensor((self.words,), cutlass.Int32)
        sbyte = cutlass.Int32(0)
        if cutlass.const_expr(self.fmt.is_mx):
            e = mx_exponent(amax_bits, self.fmt, self.cfg.scale_rule == "ceil", m)
            sbyte = m.select(nonfinite, cutlass.Int32(0xFF), e + 127)
            factor = m.as_float(mx_factor_bits(e))
            for i in cutlass.range_constexpr(CHUNK):
                rF[i] = rF[i] * factor
        else:
            code, sval = nvfp4_scale(m.as_float(amax_bits), gs, m)
            sbyte = m.select(nonfinite, cutlass.Int32(0x7F), code)
            denom = sval * gs
            live = m.to_int(denom > 0.0)
            safe = m.select(denom > 0.0, denom, cutlass.Float32(1.0))
            for i in cutlass.range_constexpr(CHUNK):
                rF[i] = rF[i] / safe
            keep = keep & (cutlass.Int32(0) - live)
        if cutlass.const_expr(self.kind == "e2m1"):
            word = cutlass.Int32(0)
            for i in cutlass.range_constexpr(CHUNK):
                word = word | (fp4_code(rF[i], m) << (4 * i))
            rW[0] = word & keep
        else:
            packed = rF.load().to(_DSL_FP8[self.kind]).bitcast(cutlass.Int32)
            rW.store(packed)
            for w in cutlass.range_constexpr(self.words):
                rW[w] = rW[w] & keep
        if chunk < total:
            cute.autovec_copy(rW, cute.local_tile(mQ, (self.words,), (chunk,)))
            if chunk & (self.lanes - 1) == 0:
                mS[self.scale_offset(chunk, *shape)] = cutlass.Uint8(sbyte)

    @cute.jit
    def scale_offset(self, chunk, div_rows, div_cpr, strides):
        """Byte offset of the chunk's block scale in the (L, rows_p, cols_p) swizzled layout."""
        row, cc = divmod(chunk, div_cpr)
        b, r = divmod(row, div_rows)
        return swizzle_offset(b, r, cc >> (self.lanes.bit_length() - 1), *strides)


@dataclass(frozen=True)
class AmaxConfig:
    """The finite-amax kernel (NVFP4's default global scale), per input dtype and arch."""

    in_dtype: str = "bf16"
    arch: str = "sm_90a"
    threads: int = THREADS
    unroll: int = 8

    @property
    def name(self) -> str:
        return f"finite_amax_{self.in_dtype}_{self.arch}"


class FiniteAmaxKernel:
    """``mOut[0] = max(mOut[0], bits of the largest finite |x|)`` (int32; fp32 bits of values
    >= 0 order like the values). Each CTA reduces its tile in registers, shuffles and shared
    memory, then issues one atomic max; ``mOut`` must be zeroed before the launch."""

    def __init__(self, cfg: AmaxConfig):
        self.cfg = cfg
        self.in_dtype = _DSL_IN[cfg.in_dtype]
        self.warps = cfg.threads // 32

    @cute.jit
    def __call__(self, mX: cute.Tensor, mOut: cute.Tensor, total: cutlass.Int32, stream):
        per_cta = self.cfg.threads * self.cfg.unroll
        grid = (total + per_cta - 1) // per_cta
        self.kernel(mX, mOut, total).launch(grid=[grid, 1, 1], block=[self.cfg.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mX, mOut, total: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        U, T = self.cfg.unroll, self.cfg.threads
        sRed = memory.SmemAllocator().allocate_tensor(cutlass.Int32, cute.make_layout(self.warps), 16)
        rX = cute.make_rmem_tensor((CHUNK, U), self.in_dtype)
        for u in cutlass.range_constexpr(U):
            chunk = cutlass.min(bidx * (T * U) + u * T + tidx, total - 1)  # a repeat is harmless for a max
            cute.autovec_copy(cute.local_tile(mX, (CHUNK,), (chunk,)), rX[None, u])
        best = cutlass.Int32(0)
        rB = cute.make_rmem_tensor((CHUNK,), cutlass.Int32)
        for u in cutlass.range_constexpr(U):
            rB.store(rX[None, u].load().to(cutlass.Float32).bitcast(cutlass.Int32))
            for i in cutlass.range_constexpr(CHUNK):
                b = rB[i] & _ABS_MASK
                best = cutlass.max(best, m.select(b < _EXP_INF, b, cutlass.Int32(0)))
        for off in (16, 8, 4, 2, 1):
            best = cutlass.max(best, cute.arch.shuffle_sync_bfly(best, off))
        if tidx % 32 == 0:
            sRed[tidx // 32] = best
        cute.arch.sync_threads()
        if tidx == 0:
            for w in cutlass.range_constexpr(self.warps):
                best = cutlass.max(best, sRed[w])
            cute.arch.atomic_max(mOut.iterator, best)


def _flat(dtype, div, align):
    return make_fake_tensor(dtype, (cute.sym_int32(divisibility=div),), (1,), assumed_align=align)


def fake_args(cfg: QuantizeConfig | AmaxConfig):
    """Symbolic arguments for ``cute.compile`` (one kernel serves every shape)."""
    flat = _flat
    if isinstance(cfg, AmaxConfig):
        return (
            flat(_DSL_IN[cfg.in_dtype], CHUNK, 16),
            flat(cutlass.Int32, 1, 4),
            cutlass.Int32(1),
            make_fake_stream(use_tvm_ffi_env_stream=True),
        )
    return (
        flat(_DSL_IN[cfg.in_dtype], CHUNK * cfg.lanes_per_block, 16),
        flat(cutlass.Int32, cfg.words_per_chunk * cfg.lanes_per_block, 4 * cfg.words_per_chunk),
        flat(cutlass.Uint8, 1, 16),
        flat(cutlass.Float32, 1, 4),
        cutlass.Int32(1),
        cutlass.Int32(1),
        cutlass.Int32(1),
        cutlass.Int32(1),
        cutlass.Int32(1),
        make_fake_stream(use_tvm_ffi_env_stream=True),
    )


def build_quantize(cfg: QuantizeConfig | AmaxConfig):
    """(kernel object, fake args) for :class:`~cutegemm.runtime.cache.KernelCache`."""
    kernel = FiniteAmaxKernel(cfg) if isinstance(cfg, AmaxConfig) else QuantizeKernel(cfg)
    return kernel, fake_args(cfg)


@functools.cache
def kernel_cache():
    return KernelCache(build_quantize)


def all_configs(arch: str) -> list[QuantizeConfig | AmaxConfig]:
    """Every kernel variant for ``arch`` (compile-check / tests)."""
    out: list = [AmaxConfig(in_dtype=dt, arch=arch) for dt in IN_DTYPES.values()]
    for fmt in KINDS:
        rules = ("ocp",) if fmt == "nvfp4" else ("ocp", "ceil")
        for dt in IN_DTYPES.values():
            for rule in rules:
                out.append(QuantizeConfig(fmt=fmt, in_dtype=dt, scale_rule=rule, arch=arch))
    return out


def check_variant(cfg: QuantizeConfig) -> tuple[bool, dict, str]:
    """Compile ``cfg`` to SASS (no GPU needed) and check it: (ok, marker counts, error)."""
    return check_sass(build_quantize(cfg), cfg.arch, SASS_REQUIRED, SASS_FORBIDDEN)
