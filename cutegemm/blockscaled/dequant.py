"""Block-scaled -> bf16 / fp32 dequantization on the GPU (CuTe DSL, sm_90a and sm_100a):
``dequantize_bf16(q)`` (and ``dequantize(q, out_dtype)``) for MXFP8 (e4m3 / e5m2), MXFP4 and NVFP4.

Used by the sm_90a block-scaled GEMMs (``sm90_mx``): Hopper has no block-scaled MMA. For
MXFP8, one pass that writes bf16 copies of both operands, followed by the bf16 WGMMA GEMM, is
faster on compute-bound shapes than emulating the per-32 scaling inside the FP8 mainloop
(bench/RESULTS.md); FP4 x FP4 has only this path on Hopper.

Design (memory bound, arch-neutral: plain vector loads/stores, no tensor cores): the elements
are read as a flat row-major array of 16-element chunks (one 128-bit load of FP8, one 64-bit
load of packed FP4); consecutive threads take consecutive chunks (coalesced), a CTA of
``threads`` threads handles ``unroll`` tiles of ``threads`` chunks, and each thread issues all
its loads (elements and its chunk's scale byte, read from the 128x4-swizzled layout) before any
math. A value is ``fp32(element) * fp32(scale)`` (MX: ``2**(byte - 127)``; NVFP4: the e4m3
scale, then times the global scale, in ``dequantize_ref``'s order), stored as fp32 (the fp32
variant: ``dequantize_ref``'s value bit for bit, its IEEE multiplies with subnormals kept, no
FMUL.FTZ) or rounded to bf16 with round-to-nearest-even. For MX formats bf16 is exact unless
``|value| < 2**-130`` (bf16 subnormals keep fewer bits) or it exceeds bf16's range; NVFP4's
global scale makes it a rounding, as in any bf16 dequantization. A NaN scale gives NaN, as
``dequantize_ref`` does.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

from ..runtime.cache import KernelCache
from ..runtime.sass import check_sass
from .quantize_launch import arch_of, ones_on
from .quantizer import MAX_ELEMENTS, CuteOps, scale_strides, swizzle_offset
from .quantizer import TorchOps as T
from .reference import BlockScaledTensor, check_block_scaled, dequantize_ref

__all__ = ["DequantConfig", "dequantizable", "dequantize", "dequantize_bf16", "dequantize_bf16_ref"]

CHUNK = 16  # elements per thread per step: one 128-bit (FP8) / 64-bit (FP4) load, two 128-bit stores
_ELEM = {"mxfp8": cutlass.Float8E4M3FN, "mxfp8_e5m2": cutlass.Float8E5M2, "mxfp4": cutlass.Uint8, "nvfp4": cutlass.Uint8}
_TORCH_ELEM = {"mxfp8": torch.float8_e4m3fn, "mxfp8_e5m2": torch.float8_e5m2, "mxfp4": torch.float4_e2m1fn_x2,
               "nvfp4": torch.float4_e2m1fn_x2}  # fmt: skip
_BLOCK = {"mxfp8": 32, "mxfp8_e5m2": 32, "mxfp4": 32, "nvfp4": 16}
_OUT_KERNEL = {"bf16": cutlass.BFloat16, "fp32": cutlass.Float32}
_OUT_TORCH = {"bf16": torch.bfloat16, "fp32": torch.float32}
# SASS of every variant: 128-bit loads and stores, no local-memory spills (compile-check)
SASS_REQUIRED = {"LDG.128": r"\bLDG\.E[.A-Z0-9]*\.128", "STG.128": r"\bSTG\.E[.A-Z0-9]*\.128"}  # FP4: LDG.64
SASS_FORBIDDEN = {"LDL": r"\bLDL(\.|\s)", "STL": r"\bSTL(\.|\s)"}


@dataclass(frozen=True)
class DequantConfig:
    """What changes the compiled dequantize kernel (the compile-cache key)."""

    fmt: str = "mxfp8"
    arch: str = "sm_90a"
    threads: int = 256
    # chunks per thread (all loads issued first); 0 = the format's default (``default_unroll``)
    unroll: int = 0
    out: str = "bf16"  # or "fp32"

    def __post_init__(self):
        if self.fmt not in _ELEM:
            raise ValueError(f"DequantConfig.fmt must be one of {sorted(_ELEM)}, got {self.fmt!r}")
        if self.arch not in ("sm_90a", "sm_100a"):
            raise ValueError(f"DequantConfig.arch must be sm_90a or sm_100a, got {self.arch!r}")
        if self.out not in _OUT_KERNEL:
            raise ValueError(f"DequantConfig.out must be one of {sorted(_OUT_KERNEL)}, got {self.out!r}")

    @property
    def name(self) -> str:
        return f"dequant_{self.fmt}_{self.out}_{self.arch}"

    @property
    def steps(self) -> int:
        """Chunks per thread: ``unroll``, or 2 for FP8 / 4 for FP4 (H200:
        MXFP8 at 2 took 921 us on DeepSeek-V3's expert weights
        where 4 took 1075; NVFP4 was fastest at 4)."""
        return self.unroll or (4 if self.fp4 else 2)

    @property
    def fp4(self) -> bool:
        return self.fmt in ("mxfp4", "nvfp4")

    @property
    def chunk_bytes(self) -> int:
        return CHUNK // 2 if self.fp4 else CHUNK


def e2m1_bits(code, m):
    """fp32 bits of an e2m1 code (int32 nibble, sign in bit 3): magnitudes 0, 0.5, 1, 1.5, 2, 3,
    4, 6 are 2**(e - 1) * (1 + man / 2) for e = mag >> 1 > 0, and man * 0.5 for e = 0."""
    e = (code >> 1) & 3
    man = code & 1
    bits = _pick(m.to_int(e > 0), ((e + 126) << 23) | (man << 22), man * 0x3F000000)
    return bits | ((code & 8) << 28)


def _pick(flag, a, b):
    """``a`` where the 0/1 int ``flag`` is 1, else ``b`` (ints; one form for DSL and torch)."""
    return flag * a + (1 - flag) * b


def e4m3_scale_bits(b, m):
    """fp32 bits of an e4m3 scale byte (int32 in [0, 255]; NVFP4): normal (1 + man / 8) *
    2**(e - 7), subnormal man * 2**-9 (normalised: man = 2**p + frac), NaN for 0x7F / 0xFF."""
    e = (b >> 3) & 15
    man = b & 7
    normal = ((e + 120) << 23) | (man << 20)
    p = m.to_int(man >= 2) + m.to_int(man >= 4)
    sub = m.to_int(man > 0) * (((p + 118) << 23) | (((man - (1 << p)) << 23) >> p))
    bits = _pick(m.to_int(e > 0), normal, sub) | ((b & 0x80) << 24)
    return _pick(m.to_int((b & 0x7F) == 0x7F), 0x7FC00000, bits)


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
        self.chunks_per_block = _BLOCK[cfg.fmt] // CHUNK

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (bytes,) elements, flat row-major (FP4: packed bytes as uint8)
        mS: cute.Tensor,  # (scale bytes,) uint8, 128x4-swizzled
        mGs: cute.Tensor,  # (1,) fp32 global scale (NVFP4; unused otherwise)
        mOut: cute.Tensor,  # (numel,) bf16 / fp32
        rows: cutlass.Int32,  # rows per batch
        cpr: cutlass.Int32,  # chunks per row (K / 16)
        total: cutlass.Int32,  # chunks in all
        batch_stride: cutlass.Int32,  # scale bytes per batch (quantize.scale_strides)
        tile_stride: cutlass.Int32,  # scale bytes per 128-row tile row
        stream,
    ):
        per_cta = self.cfg.threads * self.cfg.steps
        grid = (total + per_cta - 1) // per_cta
        div_cpr = cute.fast_divmod_create_divisor_v2(cpr)
        div_rows = cute.fast_divmod_create_divisor_v2(rows)
        self.kernel(mQ, mS, mGs, mOut, div_rows, div_cpr, (batch_stride, tile_stride), total).launch(
            grid=[grid, 1, 1], block=[self.cfg.threads, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, mQ, mS, mGs, mOut, div_rows, div_cpr, strides, total: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        U, T, cb = self.cfg.steps, self.cfg.threads, self.cfg.chunk_bytes
        base = bidx * (T * U) + tidx
        rQ = cute.make_rmem_tensor((cb, U), self.elem)
        rS = cute.make_rmem_tensor((U,), cutlass.Int32)
        for u in cutlass.range_constexpr(U):
            # past the end: load the last chunk instead (never stored)
            chunk = cutlass.min(base + u * T, total - 1)
            cute.autovec_copy(cute.local_tile(mQ, (cb,), (chunk,)), rQ[None, u])
            row, cc = divmod(chunk, div_cpr)
            b, r = divmod(row, div_rows)
            col = cc // self.chunks_per_block  # the chunk's scale block
            rS[u] = cutlass.Int32(mS[swizzle_offset(b, r, col, *strides)])
        gs = cutlass.Float32(1.0)
        if cutlass.const_expr(self.cfg.fmt == "nvfp4"):
            gs = mGs[0]
        rF = cute.make_rmem_tensor((CHUNK,), cutlass.Float32)
        rO = cute.make_rmem_tensor((CHUNK,), _OUT_KERNEL[self.cfg.out])
        for u in cutlass.range_constexpr(U):
            chunk = base + u * T
            if cutlass.const_expr(self.cfg.fmt == "nvfp4"):
                scale = CuteOps.as_float(e4m3_scale_bits(rS[u], CuteOps))
            else:
                scale = CuteOps.as_float(scale_factor_bits(rS[u], CuteOps))
            if cutlass.const_expr(self.cfg.fp4):
                for i in cutlass.range_constexpr(cb):  # low nibble first (pack_fp4's order)
                    byte = cutlass.Int32(rQ[i, u])
                    rF[2 * i] = CuteOps.as_float(e2m1_bits(byte & 15, CuteOps))
                    rF[2 * i + 1] = CuteOps.as_float(e2m1_bits(byte >> 4, CuteOps))
                for i in cutlass.range_constexpr(CHUNK):
                    rF[i] = rF[i] * scale
                    if cutlass.const_expr(self.cfg.fmt == "nvfp4"):
                        rF[i] = rF[i] * gs  # (element * scale) * global scale, as dequantize_ref
            else:
                rF.store(rQ[None, u].load().to(cutlass.Float32) * scale)
            if cutlass.const_expr(self.cfg.out == "fp32"):
                rO.store(rF.load())
            else:
                rO.store(rF.load().to(cutlass.BFloat16))
            if chunk < total:
                cute.autovec_copy(rO, cute.local_tile(mOut, (CHUNK,), (chunk,)))


def _flat(dtype, div, align):
    return make_fake_tensor(dtype, (cute.sym_int32(divisibility=div),), (1,), assumed_align=align)


def build_dequant(cfg: DequantConfig):
    """(kernel object, fake args) for :class:`~cutegemm.runtime.cache.KernelCache`: one kernel
    serves every shape."""
    args = (
        _flat(_ELEM[cfg.fmt], cfg.chunk_bytes, 16),
        _flat(cutlass.Uint8, 1, 1),
        _flat(cutlass.Float32, 1, 4),
        _flat(_OUT_KERNEL[cfg.out], CHUNK, 16),
        *(cutlass.Int32(1),) * 5,
        make_fake_stream(use_tvm_ffi_env_stream=True),
    )
    return DequantKernel(cfg), args


@functools.cache
def _cache():
    return KernelCache(build_dequant)


def all_configs(arch: str) -> list[DequantConfig]:
    """Every kernel variant for ``arch`` (compile-check)."""
    return [DequantConfig(fmt=f, arch=arch, out=o) for f in _ELEM for o in _OUT_KERNEL]


def check_variant(cfg: DequantConfig) -> tuple[bool, dict, str]:
    """Compile ``cfg`` to SASS (no GPU needed) and check it: (ok, marker counts, error)."""
    required = {**SASS_REQUIRED, "LDG.64": r"\bLDG\.E[.A-Z0-9]*\.64"} if cfg.fp4 else SASS_REQUIRED
    if cfg.fp4:
        required.pop("LDG.128")
    return check_sass(build_dequant(cfg), cfg.arch, required, SASS_FORBIDDEN)


def check_elements(q: BlockScaledTensor, what: str = "q") -> None:
    """A supported format whose elements have its torch dtype (FP4: float4_e2m1fn_x2), and fields
    that agree (``check_block_scaled``: scales of the right dtype and shape, a global scale only
    for NVFP4)."""
    if q.fmt.name not in _ELEM:
        raise ValueError(f"{what}: dequantize_bf16 takes {sorted(_ELEM)}, got {q.fmt.name}")
    if q.data.dtype != _TORCH_ELEM[q.fmt.name]:
        raise ValueError(f"{what}: {q.fmt.name} elements must be {_TORCH_ELEM[q.fmt.name]}, got {q.data.dtype}")
    check_block_scaled(q, what)


def check_dequant_operand(q: BlockScaledTensor, what: str = "q") -> None:
    """The kernel's rules: a BlockScaledTensor of a supported format on a CUDA device, contiguous
    16-byte aligned elements, K a multiple of 16, fewer than 2**31 elements."""
    check_elements(q, what)
    d = q.data
    if d.device.type != "cuda":
        raise ValueError(f"{what}: expected a CUDA tensor, got device {d.device}")
    if not d.is_contiguous() or d.data_ptr() % 16:
        raise ValueError(f"{what}: the elements must be contiguous and 16-byte aligned")
    if q.shape[-1] % CHUNK:
        raise ValueError(f"{what}: K must be a multiple of {CHUNK}, got {q.shape[-1]}")
    if q.shape.numel() > MAX_ELEMENTS:
        raise ValueError(f"{what}: at most {MAX_ELEMENTS} elements per call, got {q.shape.numel()}")


def dequantizable(q: BlockScaledTensor) -> bool:
    """Whether ``q`` meets :func:`check_dequant_operand` (the policies' test before they route a
    call through the dequantize kernel)."""
    try:
        check_dequant_operand(q)
    except ValueError:
        return False
    return True


def dequantize_bf16(q: BlockScaledTensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """bf16 values of a :class:`BlockScaledTensor` (MXFP8, MXFP8-e5m2, MXFP4, NVFP4; ``q.shape``,
    on its device) from one kernel pass; equal to ``dequantize_ref(q).to(torch.bfloat16)`` (for MX
    formats exact unless a value is below 2**-130 in magnitude). ``out``: an optional contiguous,
    16-byte aligned bf16 tensor of ``q.shape``."""
    check_dequant_operand(q)
    if out is not None and (
        out.shape != q.shape or out.dtype != torch.bfloat16 or not out.is_contiguous() or out.data_ptr() % 16
    ):
        raise ValueError(f"out: expected a contiguous 16-byte aligned bf16 tensor of shape {tuple(q.shape)}")
    return dequantize_checked(q, out)


_OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# out_dtype -> the kernel's output dtype (float16: the fp32 pass, then a cast)
_KERNEL_DTYPE = {torch.float32: torch.float32, torch.bfloat16: torch.bfloat16, torch.float16: torch.float32}


def dequantize(q: BlockScaledTensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode a :class:`BlockScaledTensor` to ``out_dtype`` (float32, bfloat16 or float16), shape
    ``q.shape``, on q's device.

    - float32 (the default): ``dequantize_ref(q)`` bit for bit (exact for MX formats).
    - bfloat16: ``dequantize_ref(q).to(torch.bfloat16)`` bit for bit.
    - float16: ``dequantize_ref(q).to(torch.float16)``.

    Where the dequantize kernel takes ``q`` (:func:`dequantizable`: contiguous 16-byte aligned
    elements, K a multiple of 16; an sm_90a / sm_100a GPU), float32 and bfloat16 are one kernel
    pass (float16: the fp32 pass and a cast); elsewhere the torch reference computes them.
    """
    if not isinstance(q, BlockScaledTensor):
        raise TypeError(f"q: expected a BlockScaledTensor, got {type(q).__name__}")
    try:
        kernel_dtype = _KERNEL_DTYPE.get(out_dtype)
    except TypeError:  # unhashable
        kernel_dtype = None
    if kernel_dtype is None:
        raise TypeError(f"out_dtype must be one of {list(_OUT_DTYPES)}, got {out_dtype}")
    try:  # a warm call: the key fixes every rule of kernel_takes but the elements' alignment
        warm = _WARM.get(_warm_key(q, kernel_dtype))
    except (AttributeError, TypeError, RuntimeError):  # not strided tensors, an unhashable shape...
        warm = None  # ... the checks below say what is wrong
    if warm is not None and not q.data.data_ptr() % 16:
        out = warm.run_new(q, kernel_dtype)
        return out if out_dtype is kernel_dtype else out.to(out_dtype)
    if kernel_takes(q):
        if kernel_dtype is torch.bfloat16:
            return dequantize_checked(q, record=True)
        out = dequantize_checked(q, out_dtype=torch.float32, record=True)
    else:
        out = dequantize_ref(q)
    return out if out_dtype == torch.float32 else out.to(out_dtype)


def kernel_takes(q: BlockScaledTensor) -> bool:
    """Whether :func:`dequantize` runs the kernel on ``q``: CUDA elements :func:`dequantizable`
    on an sm_90a / sm_100a GPU."""
    return q.data.is_cuda and dequantizable(q) and arch_of(q.data.device.index or 0) in ("sm_90a", "sm_100a")


# Warm dequantize calls: _warm_key -> a _Launch (the launch plan of a q that :func:`kernel_takes`),
# recorded by :func:`dequantize_checked` when its caller asks (``record``: :func:`dequantize`,
# the one reader of the table; the GEMM routes that launch through dequantize_checked do not
# pay for a key they never look up). The key fixes everything that test reads but the elements'
# data pointer (re-checked per call); the plan holds no tensor of q.
_WARM: dict = {}
_MAX_WARM = 512  # as _launch_plan's cache: a stream of new shapes cannot grow it forever


def _warm_key(q: BlockScaledTensor, kernel_dtype: torch.dtype) -> tuple:
    d, s, g = q.data, q.scales, q.global_scale
    # the scales' and global scale's shapes and dtypes too: a warm hit skips check_block_scaled
    return (q.fmt.name, d.dtype, d.shape, d.stride(), d.device, q.shape, kernel_dtype, s.shape, s.dtype,
            q.scales_swizzled, None if g is None else g.shape)  # fmt: skip


def dequantize_checked(q: BlockScaledTensor, out: torch.Tensor | None = None,
                       out_dtype: torch.dtype = torch.bfloat16, record: bool = False) -> torch.Tensor:  # fmt: skip
    """:func:`dequantize_bf16` (``out_dtype`` bf16, or fp32) for a caller that has already checked
    ``q`` with :func:`check_dequant_operand` (and ``out``, which then sets the dtype): the launch
    only (its kernel and integer arguments kept per format, shape, output dtype and device).
    ``record``: a ``q`` that :func:`kernel_takes` makes its key warm for :func:`dequantize`."""
    dev = q.data.device
    if out is None:
        out = torch.empty(*q.shape, dtype=out_dtype, device=dev)  # ints: a torch.Size costs ~1 us more to parse
    plan = _launch_plan(q.fmt.name, q.shape, out.dtype, dev)
    if plan is None:  # no elements
        return out
    plan.run(q, out)
    if record:
        key = _warm_key(q, out.dtype)
        if key not in _WARM and kernel_takes(q):
            if len(_WARM) >= _MAX_WARM:
                _WARM.clear()
            _WARM[key] = plan
    return out


class _Launch:
    """One dequantize launch signature (format, shape, output dtype, device): the kernel, its
    integer arguments, and what :meth:`run` needs to pass them without looking anything up."""

    __slots__ = ("fn", "fp4", "ints", "shape", "device", "ones")

    def __init__(self, fn, fp4: bool, ints: tuple, shape: tuple, device: torch.device):
        self.fn, self.fp4, self.ints, self.shape, self.device = fn, fp4, ints, shape, device
        self.ones = ones_on(device)

    def run(self, q: BlockScaledTensor, out: torch.Tensor) -> torch.Tensor:
        """Runs the kernel on q's contiguous elements into the contiguous ``out``; returns ``out``.
        (``ravel`` of a contiguous tensor is the flat view ``view(-1)`` gives, with less argument
        parsing; of the scales, a contiguous copy where they are not.)"""
        gs = q.global_scale
        gs = self.ones if gs is None else gs.detach().to(device=self.device, dtype=torch.float32).reshape(1)
        d = q.data
        self.fn(d.view(torch.uint8).ravel() if self.fp4 else d.ravel(),
                q.swizzled_scales().view(torch.uint8).ravel(), gs, out.ravel(), *self.ints)  # fmt: skip
        return out

    def run_new(self, q: BlockScaledTensor, out_dtype: torch.dtype) -> torch.Tensor:
        """:meth:`run` into a new ``out_dtype`` tensor of q's shape (the launch's output dtype)."""
        return self.run(q, torch.empty(*self.shape, dtype=out_dtype, device=self.device))


def launch_of(q: BlockScaledTensor, out_dtype: torch.dtype = torch.bfloat16):
    """The launch :func:`dequantize_checked` runs for ``q`` into ``out_dtype`` (None: no
    elements): a caller that memoizes its own checks keeps it and calls its ``run_new(q, out_dtype)``
    on a ``q`` of the same format, shape and device, its elements checked as before."""
    return _launch_plan(q.fmt.name, q.shape, out_dtype, q.data.device)


@functools.lru_cache(maxsize=512)
def _launch_plan(fmt: str, shape: torch.Size, out_dtype: torch.dtype, device: torch.device):
    """The :class:`_Launch` of a :func:`dequantize_checked` call; None for an empty tensor."""
    numel = shape.numel()
    if numel == 0:
        return None
    rows, k = shape[-2], shape[-1]
    cfg = DequantConfig(fmt=fmt, arch=arch_of(device.index or 0), out="fp32" if out_dtype == torch.float32 else "bf16")
    strides = scale_strides(rows, -(-k // _BLOCK[fmt]))
    ints = (rows, k // CHUNK, numel // CHUNK, *strides)
    return _Launch(_cache().get(cfg), cfg.fp4, ints, tuple(shape), device)


def dequantize_bf16_ref(q: BlockScaledTensor) -> torch.Tensor:
    """The kernel's arithmetic in torch (any device): fp32 element (FP4 decoded by
    :func:`e2m1_bits`) times the scale's fp32 value (:func:`scale_factor_bits` /
    :func:`e4m3_scale_bits`), NVFP4 then times the global scale, rounded to bf16."""
    k = q.shape[-1]
    sbytes = q.plain_scales().view(torch.uint8).to(torch.int32)
    scale_bits = e4m3_scale_bits(sbytes, T) if q.fmt.name == "nvfp4" else scale_factor_bits(sbytes, T)
    scale = T.as_float(scale_bits.to(torch.int32).contiguous()).repeat_interleave(q.fmt.block_size, dim=-1)[..., :k]
    if q.fmt.elems_per_byte == 2:
        b = q.data.view(torch.uint8).to(torch.int32)
        codes = torch.stack([b & 15, b >> 4], dim=-1).flatten(-2)
        elems = T.as_float(e2m1_bits(codes, T).to(torch.int32).contiguous())
    else:
        elems = q.data.float()
    out = elems * scale
    if q.fmt.name == "nvfp4" and q.global_scale is not None:
        out = out * q.global_scale.to(out.device)
    return out.to(torch.bfloat16)
