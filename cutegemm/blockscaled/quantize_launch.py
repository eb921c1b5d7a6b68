"""The torch face of the block-scaled quantizer: ``quantize`` (bf16 / fp16 / fp32 -> MXFP8, MXFP4,
NVFP4 with 128x4 swizzled scales, the NVFP4 global scale from one amax pass); the kernels it
launches are in :mod:`cutegemm.blockscaled.quantizer` (``dequantize`` is in :mod:`.dequant`)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..runtime.device import device_info
from .formats import BlockFormat, get_format
from .layout import swizzled_shape
from .quantizer import (
    CHUNK,
    IN_DTYPES,
    KINDS,
    MAX_ELEMENTS,
    AmaxConfig,
    QuantizeConfig,
    kernel_cache,
    scale_strides,
)
from .reference import BlockScaledTensor, check_global_scale, check_quantize_args


@functools.cache
def arch_of(index: int) -> str:
    return device_info(index)[0]


def _check_x(x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in IN_DTYPES:
        raise TypeError(f"x: expected dtype float32, bfloat16 or float16, got {x.dtype}")
    if x.device.type != "cuda":
        raise ValueError(f"x: expected a CUDA tensor, got device {x.device} (use quantize_ref on the CPU)")
    if x.dim() not in (2, 3) or x.numel() == 0:
        raise ValueError(f"x: expected a non-empty (rows, K) or (L, rows, K) tensor, got {tuple(x.shape)}")


def _global_scale(x: torch.Tensor, global_scale) -> torch.Tensor:
    """NVFP4 fp32 0-d global scale on x's device: the given one, or quantize_ref's default
    ``amax / (448 * 6)`` (same torch expression, same device) from the finite amax of one
    reduction kernel pass. Never synchronizes with the device: a Python number or a CPU tensor is
    validated (positive, finite) like quantize_ref does; the value of a CUDA tensor is not."""
    if global_scale is None:
        finite_amax = finite_abs_max(x)
        return torch.where(finite_amax > 0, (finite_amax / (448.0 * 6.0)).clamp(min=2.0**-126), 1.0)
    if isinstance(global_scale, torch.Tensor) and global_scale.numel() == 1 and global_scale.is_cuda:
        return global_scale.detach().to(device=x.device, dtype=torch.float32).reshape(())
    if isinstance(global_scale, (int, float)) and not isinstance(global_scale, bool):
        if not (math.isfinite(global_scale) and global_scale > 0):
            raise ValueError(f"global_scale: must be positive and finite, got {global_scale}")
        return scalar_on(float(global_scale), x.device).clone()  # a fresh tensor, no H2D copy

    return check_global_scale(global_scale, x.device)  # CPU tensors (and the type errors)


@functools.lru_cache(maxsize=64)
def scalar_on(value: float, device: torch.device) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32, device=device)


def finite_abs_max(x: torch.Tensor) -> torch.Tensor:
    """The largest finite ``|x|`` (0 if none) as a 0-d fp32 tensor, from one kernel pass over a
    contiguous, 16-byte aligned CUDA ``x`` whose size is a multiple of 8 (else torch ops)."""
    if not x.is_contiguous() or x.data_ptr() % 16 or x.numel() % CHUNK or x.numel() > MAX_ELEMENTS:
        xf = x.float()
        return torch.where(torch.isfinite(xf), xf.abs(), 0.0).amax()
    out = torch.zeros(1, dtype=torch.int32, device=x.device)
    cfg = AmaxConfig(in_dtype=IN_DTYPES[x.dtype], arch=arch_of(x.device.index or 0))
    kernel_cache().get(cfg)(x.view(-1), out, x.numel() // CHUNK)
    return out.view(torch.float32).reshape(())


def quantize(
    x: torch.Tensor,
    fmt: BlockFormat | str,
    *,
    global_scale: torch.Tensor | float | None = None,
    scale_rule: str = "ocp",
) -> BlockScaledTensor:
    """Quantize a CUDA tensor to a block-scaled format with the fast kernel.

    Byte-identical to ``quantize_ref(x, fmt, global_scale=..., scale_rule=...)`` (swizzled
    scales) on the same device; see :mod:`cutegemm.blockscaled.reference` for the rules.

    Args:
        x: CUDA bf16 / fp16 / fp32 tensor ``(rows, K)`` or ``(L, rows, K)``. K a multiple of the
            block size (32 MX, 16 NVFP4) is the fast path; other K run on a zero-padded copy.
            Non-contiguous or non-16-byte-aligned inputs are copied first.
        fmt: ``"mxfp8"``, ``"mxfp8_e5m2"``, ``"mxfp4"``, ``"nvfp4"`` or a BlockFormat.
        global_scale: NVFP4 only: a positive finite float or one-element tensor (the value of a
            CUDA tensor is not checked: that would synchronize); None computes quantize_ref's
            default ``amax / 2688`` on the device (one extra read of x by a reduction kernel).
        scale_rule: MX formats: ``"ocp"`` (default) or ``"ceil"``; NVFP4: ``"ocp"`` only.

    Returns:
        A :class:`BlockScaledTensor` with swizzled scales.

    Raises:
        TypeError / ValueError: as ``quantize_ref`` does, plus: x not on a CUDA device, more than
            2**31 - 1 elements, or a GPU other than sm_90 / sm_100.
    """
    key, warm = _warm_plan(x, fmt, global_scale, scale_rule)
    if warm is not None:
        data, scales, gs = warm.run(x, global_scale)
        # positional arguments: ~0.15 us less than keywords
        return BlockScaledTensor(data, scales, warm.fmt, x.shape, gs)
    return _quantize_cold(x, fmt, global_scale, scale_rule, key)


def quantize_tensors(x: torch.Tensor, fmt: BlockFormat | str, global_scale=None, scale_rule: str = "ocp"):
    """:func:`quantize`'s (data, scales, global scale) without the BlockScaledTensor (the custom
    op returns the tensors): the same checks, warm path and results."""
    key, warm = _warm_plan(x, fmt, global_scale, scale_rule)
    if warm is not None:
        return warm.run(x, global_scale)
    q = _quantize_cold(x, fmt, global_scale, scale_rule, key)
    return q.data, q.scales, q.global_scale


def _warm_plan(x, fmt, global_scale, scale_rule: str):
    """(the call's plan key, its warm plan where one serves x, else None); (None, None) where the
    arguments cannot form a key (the checks then say what is wrong). The key fixes every check of
    the cold path but x's alignment (and the global scale's), checked here."""
    try:
        key = (x.shape, x.stride(), x.dtype, x.device, fmt, scale_rule, global_scale is None)
        warm = _PLANS.get(key)
    except (AttributeError, TypeError):
        return None, None
    return key, (warm if warm is not None and not x.data_ptr() % 16 else None)


def _quantize_cold(x, fmt, global_scale, scale_rule: str, key) -> BlockScaledTensor:
    """:func:`quantize` checked in full; makes ``key`` (None: unhashable) warm where x is used in place."""
    _check_x(x)
    fmt = check_quantize_args(x, fmt, global_scale, scale_rule)
    if fmt.name not in KINDS:
        raise ValueError(f"fmt: no quantize kernel for {fmt.name!r}")
    k = x.shape[-1]
    x = x.detach()
    bs = fmt.block_size
    padded_numel = x.numel() // k * (k + (-k % bs))
    if padded_numel > MAX_ELEMENTS:
        raise ValueError(f"x: at most {MAX_ELEMENTS} elements per call, got {padded_numel} (split the rows)")
    gs = _global_scale(x, global_scale) if fmt.has_global_scale else None
    xk = x if k % bs == 0 else F.pad(x, (0, -k % bs))  # tail: zeros only enter the amax
    if not xk.is_contiguous() or xk.data_ptr() % 16:
        xk = xk.clone(memory_format=torch.contiguous_format)
        if xk.data_ptr() % 16:
            raise ValueError("x: could not obtain a 16-byte aligned copy")
    data, scales, p = _launch(xk, fmt, scale_rule, gs)
    if key is not None and xk.shape[-1] == k and xk.data_ptr() == x.data_ptr() and xk.stride() == x.stride():
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = _Warm(p, fmt, xk.device)  # x is used in place: later calls can skip to the launch
    if xk.shape[-1] != k:
        data = data[..., : k // fmt.elems_per_byte].contiguous()
    return BlockScaledTensor(
        data=data.view(fmt.elem_dtype),
        scales=scales.view(fmt.scale_dtype),
        fmt=fmt,
        shape=x.shape,
        global_scale=gs,
    )


@dataclass(frozen=True)
class _Plan:
    """Everything one (shape, dtype, device, format, rule) needs to launch: computed once."""

    fn: object
    scale_shape: tuple
    padded: bool
    data_shape: tuple
    rows: int
    cpr: int
    total: int
    strides: tuple


@functools.lru_cache(maxsize=512)
def _plan(shape: tuple, dtype: torch.dtype, device: torch.device, fmt_name: str, scale_rule: str) -> _Plan:
    fmt = get_format(fmt_name)
    rows, kp = shape[-2], shape[-1]
    cfg = QuantizeConfig(
        fmt=fmt.name, in_dtype=IN_DTYPES[dtype], scale_rule=scale_rule, arch=arch_of(device.index or 0)
    )
    rows_p, cols_p = swizzled_shape(rows, kp // fmt.block_size)
    numel = 1
    for d in shape:
        numel *= d
    return _Plan(
        fn=kernel_cache().get(cfg),
        scale_shape=(rows_p, cols_p) if len(shape) == 2 else (shape[0], rows_p, cols_p),
        padded=rows_p != rows or cols_p != kp // fmt.block_size,
        data_shape=(*shape[:-1], kp // fmt.elems_per_byte),
        rows=rows,
        cpr=kp // CHUNK,
        strides=scale_strides(rows, kp // fmt.block_size),
        total=numel // CHUNK,
    )


class _Warm:
    """A warm ``quantize`` call: x used in place (K a multiple of the block size, contiguous),
    keyed by (x's shape, strides, dtype, device, fmt, scale_rule, whether global_scale is None).
    Passes the kernel what :func:`_launch` passes, with fewer tensor objects: the data and scale
    bytes allocated flat (the kernel's views), the result's views made from them."""

    __slots__ = ("p", "fmt", "device", "ones", "n_words", "n_scales", "fn", "ints", "has_gs", "padded",
                 "elem_dtype", "scale_dtype", "data_shape", "scale_shape")  # fmt: skip

    def __init__(self, p: _Plan, fmt: BlockFormat, device: torch.device):
        self.p, self.fmt, self.device, self.ones = p, fmt, device, ones_on(device)
        self.n_words = math.prod(p.data_shape) // 4  # the data bytes as int32 words (rows of whole words)
        self.n_scales = math.prod(p.scale_shape)
        # what run reads, as plain attributes of this object (one lookup each)
        self.fn, self.ints = p.fn, (p.rows, p.cpr, p.total, *p.strides)
        self.has_gs, self.padded = fmt.has_global_scale, p.padded
        self.elem_dtype, self.scale_dtype = fmt.elem_dtype, fmt.scale_dtype
        self.data_shape, self.scale_shape = p.data_shape, p.scale_shape

    def run(self, x: torch.Tensor, global_scale) -> tuple:
        """(data, scales, global scale or None) of x: the result's tensors."""
        # Host cost: torch parses a shape given as one tuple argument (``view((a, b))``) about
        # 0.4 us slower than the same ints unpacked, so shapes go in unpacked; x is contiguous (its
        # key fixes the strides of a plan made for x in place), so ``ravel`` is the flat view
        # ``view(-1)`` gives, with less argument parsing.
        dev = self.device
        gs = None
        if self.has_gs:  # x itself is read only by the amax pass (a given global scale: no detach)
            gs = _global_scale(x.detach() if global_scale is None else x, global_scale)
        words = _empty(self.n_words, torch.int32, dev)
        if self.padded:  # the kernel never writes the padding: zeroed (one fill, as _launch)
            scales = torch.zeros(self.n_scales, dtype=torch.uint8, device=dev)
        else:
            scales = _empty(self.n_scales, torch.uint8, dev)
        xf = x.ravel() if not x.requires_grad else x.detach().ravel()
        self.fn(xf, words, scales, self.ones if gs is None else gs.reshape(1), *self.ints)
        data = words.view(self.elem_dtype).view(*self.data_shape)
        return data, scales.view(self.scale_dtype).view(*self.scale_shape), gs


_PLANS: dict = {}
_MAX_PLANS = 512  # as _plan's cache: one plan per shape, so a stream of new token counts cannot grow it forever


def _launch(xk: torch.Tensor, fmt: BlockFormat, scale_rule: str, gs):
    """Run the kernel on a contiguous, aligned input whose K is a multiple of the block size;
    returns (data, swizzled scales) as uint8 tensors and the launch plan."""
    dev = xk.device
    p = _plan(tuple(xk.shape), xk.dtype, dev, fmt.name, scale_rule)
    scales = (
        torch.zeros(p.scale_shape, dtype=torch.uint8, device=dev)
        if p.padded
        else _empty(p.scale_shape, torch.uint8, dev)
    )
    data = _empty(p.data_shape, torch.uint8, dev)
    gs_arg = gs.reshape(1) if gs is not None else ones_on(dev)
    p.fn(
        xk.view(-1),
        data.view(-1).view(torch.int32),
        scales.view(-1),
        gs_arg,
        p.rows,
        p.cpr,
        p.total,
        *p.strides,
    )
    return data, scales, p


def _empty(shape, dtype, device) -> torch.Tensor:
    """Output allocation (every byte is written by the kernel; tests poison it here); ``shape``: a
    tuple or one int."""
    return torch.empty(shape, dtype=dtype, device=device)


@functools.cache
def ones_on(device: torch.device) -> torch.Tensor:
    """A (1,) fp32 one on ``device``, made once per device object."""
    return torch.ones(1, dtype=torch.float32, device=device)


__all__ = ["quantize", "quantize_tensors", "finite_abs_max"]
