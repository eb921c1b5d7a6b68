"""torch.library custom ops for block-scaled quantization: ``torch.ops.cutegemm.quantize`` and
``torch.ops.cutegemm.gemm_quantized``, with the wrappers :func:`quantize` and
:func:`gemm_quantized` (also ``cutegemm.ops.quantize`` / ``cutegemm.ops.gemm_quantized``) that
return a :class:`~cutegemm.blockscaled.BlockScaledTensor`; and the block-scaled GEMM
``torch.ops.cutegemm.gemm_blockscaled`` with the wrapper :func:`gemm_blockscaled`, which takes
two BlockScaledTensors.

A custom op returns tensors, not a dataclass, so the ops return tuples and the wrappers (plain
Python, traced through by torch.compile) put them back together. Each op has a fake
implementation that gives the exact output shapes and dtypes from the input shapes alone
(scales in the 128x4 swizzled, zero-padded ``(..., rows_p, cols_p)`` layout of
:mod:`cutegemm.blockscaled.layout`), so ``torch.compile(fullgraph=True)`` traces them.

Schemas::

    cutegemm::quantize(Tensor x, str fmt, Tensor? global_scale=None, *, str scale_rule="ocp")
        -> (Tensor data, Tensor scales, Tensor global_scale)
    cutegemm::gemm_quantized(Tensor a, Tensor b, Tensor? bias=None, Tensor? out_global_scale=None,
        *, str out_dtype, float alpha=1.0, str? activation=None) -> (Tensor data, Tensor scales)
    cutegemm::gemm_blockscaled(Tensor a, Tensor a_scales, Tensor b, Tensor b_scales,
        Tensor? a_global_scale=None, Tensor? b_global_scale=None, *, str fmt,
        ScalarType? out_dtype=None, float alpha=1.0) -> Tensor
    cutegemm::gemm_fp4_weight(Tensor x, Tensor w, Tensor w_scales, Tensor? w_global_scale=None,
        Tensor? offs=None, Tensor? scale_a=None, *, str fmt, ScalarType? out_dtype=None,
        float alpha=1.0) -> Tensor

``quantize``: x (rows, K) or (L, rows, K), fp32 / bf16 / fp16; fmt "mxfp8", "mxfp8_e5m2",
"mxfp4" or "nvfp4". data: ``fmt.elem_dtype``, K (FP4: K / 2, two elements per byte) on the last
dim; scales: ``fmt.scale_dtype``, ``(..., rows_p, cols_p)`` = ``swizzled_shape(rows,
ceil(K / block))``; global_scale: NVFP4: a 0-d fp32 tensor (the given one, copied, or the
default ``amax / (448 * 6)`` computed on the device); MX formats: an empty ``(0,)`` fp32 tensor
(the wrapper turns it into None). CUDA: :func:`cutegemm.quantize` (the fast kernel); CPU:
:func:`cutegemm.blockscaled.quantize_ref`.

``gemm_quantized``: ``act(alpha * (a @ b) + bias)`` quantized by the GEMM's epilogue, as
``cutegemm.gemm(..., out_dtype=fmt, out_global_scale=...)``; out_dtype "mxfp8", "mxfp4" or
"nvfp4" (NVFP4 needs ``out_global_scale``, a one-element fp32 tensor; MX formats take none);
shapes and the gated activations as ``cutegemm::gemm``; the output must have a multiple of 32
columns. data: e4m3 (..., M, N) or e2m1 x2 (..., M, N / 2); scales as above with the block size
of the format (32 MX, 16 NVFP4). CUDA: :func:`cutegemm.gemm` (sm_90a); CPU: ``gemm_ref`` then
``quantize_ref`` (fp64 operands are accumulated in fp64, then quantized from fp32).

``gemm_blockscaled``: ``alpha * dequantize(A) @ dequantize(B).mT`` -> (M, N) or (L, M, N) in
out_dtype (bf16 default, fp16, fp32), the raw fields of two BlockScaledTensors (a custom op takes
tensors only): a (M, K') / (L, M, K') and b (N, K') / (L, N, K') elements, both quantized along K
(B as torch ``_scaled_mm``'s column-major operand, e.g. an (N, K) weight), ``fmt.elem_dtype``,
K' = K (MXFP8) or K / 2 (FP4, two per byte); their scales in the 128x4 swizzled layout
(``fmt.scale_dtype``, ``(..., rows_p, cols_p)``, as :func:`quantize` returns them); NVFP4 global
scales (one-element fp32, None = 1; MX formats take none); fmt "mxfp8", "mxfp4" or "nvfp4".
CUDA: :func:`cutegemm.blockscaled.gemm.gemm_blockscaled` (sm_100a; on sm_90a dequantize-first, or
the MXFP8 emulation for few rows);
CPU: ``gemm_ref`` (dequantize_ref both, fp32 matmul, cast).

``gemm_fp4_weight``: ``alpha * x @ dequantize(W).mT`` for bf16 activations x (M, K) and an
NVFP4 / MXFP4 / MXFP8 weight W (N, K) (or (E, N, K) with ``offs``: the MoE packed form, rows of expert e
are ``offs[e-1] .. offs[e]``; rows at or past ``offs[-1]`` are zero: the op zero-fills the
output first, since a custom op's output must be fully defined), the raw fields
of the weight's BlockScaledTensor (elements ``float4_e2m1fn_x2`` (.., N, K / 2) or MXFP8's
``float8_e4m3fn`` (.., N, K), swizzled
scales, NVFP4 global scale). CUDA: :func:`cutegemm.blockscaled.weight_only.launch.gemm_fp4_weight`
(no host sync: graph-capturable); CPU: its reference twin. Wrapper: :func:`gemm_fp4_weight`.

Not differentiable: no autograd formula is registered (quantization is a step function; the
outputs are FP8 / FP4 elements and scale bytes). Inputs that require grad are accepted; a
backward through these ops raises torch's "no autograd formula was registered" RuntimeError.

CUDA graphs: both ops can be captured and replayed (no host sync) except ``quantize`` with a
given NVFP4 ``global_scale``, whose validation reads it on the host (pass None to compute it on
the device, or quantize outside the graph).
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import torch

from .blockscaled.formats import get_format
from .blockscaled.gemm import RECIPES as _BLOCKSCALED_RECIPES
from .blockscaled.gemm import gemm_blockscaled as _gemm_blockscaled_kernel
from .blockscaled.gemm import gemm_blockscaled_ref as _gemm_blockscaled_ref
from .blockscaled.layout import swizzled_shape
from .blockscaled.quantize_launch import quantize_tensors
from .blockscaled.reference import BlockScaledTensor, quantize_ref
from .blockscaled.weight_only.launch import check_args, gemm_fp4_weight_ref
from .blockscaled.weight_only.launch import gemm_fp4_weight as kernel
from .config import QUANT_FORMATS
from .epilogue import ACTIVATIONS, GATED
from .epilogue.quant import QUANT
from .gemm.dense import gemm as _gemm_kernel
from .gemm.dense import gemm_ref as _gemm_ref

CPU_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def check_gemm_operands(a, b, bias, activation):
    """The a / b / bias / activation rules of the gemm ops (CPU, fake and quantized variants);
    returns the result's shape (gated: half of b's columns)."""
    if a.dim() not in (2, 3) or b.dim() not in (2, 3):
        raise ValueError(f"a and b must have 2 or 3 dims, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.dtype not in CPU_DTYPES or b.dtype != a.dtype:
        raise TypeError(
            f"a and b must share one of {CPU_DTYPES} (CUDA: bf16/fp16), got {a.dtype} and {b.dtype}"
        )
    if activation is not None and activation not in (*ACTIVATIONS, *GATED):
        raise ValueError(f"activation must be None or one of {(*ACTIVATIONS, *GATED)}, got {activation!r}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"a and b shapes do not match for a @ b: {tuple(a.shape)} @ {tuple(b.shape)}")
    if a.dim() == 3 and b.dim() == 3 and a.shape[0] != b.shape[0]:
        raise ValueError(f"batch sizes differ: a has {a.shape[0]}, b has {b.shape[0]}")
    n = b.shape[-1]
    if bias is not None:
        if bias.dim() != 1 or bias.shape[0] != n:
            raise ValueError(f"bias must have shape ({n},), got {tuple(bias.shape)}")
        if bias.dtype not in CPU_DTYPES:
            raise TypeError(f"bias.dtype must be one of {CPU_DTYPES}, got {bias.dtype}")
    if activation in GATED:
        if n % 2:
            raise ValueError(f"a gated activation needs b with an even number of columns, got {n}")
        n = n // 2
    batch = a.shape[:1] if a.dim() == 3 else b.shape[:1] if b.dim() == 3 else ()
    return (*batch, a.shape[-2], n)


QUANTIZE_SCHEMA = (
    '(Tensor x, str fmt, Tensor? global_scale=None, *, str scale_rule="ocp") -> (Tensor, Tensor, Tensor)'
)
GEMM_QUANTIZED_SCHEMA = (
    "(Tensor a, Tensor b, Tensor? bias=None, Tensor? out_global_scale=None, *, str out_dtype, "
    "float alpha=1.0, str? activation=None) -> (Tensor, Tensor)"
)
GEMM_BLOCKSCALED_SCHEMA = (
    "(Tensor a, Tensor a_scales, Tensor b, Tensor b_scales, Tensor? a_global_scale=None, "
    "Tensor? b_global_scale=None, *, str fmt, ScalarType? out_dtype=None, float alpha=1.0) -> Tensor"
)
_BLOCKSCALED_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
GEMM_FP4_WEIGHT_SCHEMA = (
    "(Tensor x, Tensor w, Tensor w_scales, Tensor? w_global_scale=None, Tensor? offs=None, "
    "Tensor? scale_a=None, *, str fmt, ScalarType? out_dtype=None, float alpha=1.0) -> Tensor"
)

_QUANTIZE_FORMATS = ("mxfp8", "mxfp8_e5m2", "mxfp4", "nvfp4")
_X_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# ----------------------------------------------------------------------------------------------
# shape / dtype rules shared by the CPU, CUDA and fake implementations


def _quantize_outputs(x, fmt_name: str, global_scale, scale_rule: str):
    """Validates a quantize call; returns (data shape, data dtype, scales shape, scales dtype)."""
    gs_shape = None if global_scale is None else global_scale.shape
    return _quantize_layout(x.shape, x.dtype, fmt_name, gs_shape, scale_rule)


def _quantize_layout(shape, dtype, fmt_name: str, gs_shape, scale_rule: str):
    """:func:`_quantize_outputs` from x's shape and dtype and the global scale's shape (None: no
    global scale); shapes may hold SymInts (the fake implementation)."""
    if fmt_name not in _QUANTIZE_FORMATS:
        raise ValueError(f"fmt must be one of {_QUANTIZE_FORMATS}, got {fmt_name!r}")
    fmt = get_format(fmt_name)
    if dtype not in _X_DTYPES:
        raise TypeError(f"x: expected dtype float32, bfloat16 or float16, got {dtype}")
    if len(shape) not in (2, 3) or any(d == 0 for d in shape):  # (as quantize and quantize_ref refuse)
        raise ValueError(f"x: expected a non-empty (rows, K) or (L, rows, K) tensor, got {tuple(shape)}")
    if scale_rule not in ("ocp", "ceil") or (fmt.has_global_scale and scale_rule != "ocp"):
        raise ValueError(f"scale_rule: {scale_rule!r} is not valid for {fmt.name} ('ocp', or 'ceil' for MX)")
    if gs_shape is not None and not fmt.has_global_scale:
        raise ValueError(f"global_scale: format {fmt.name} has no global scale")
    if gs_shape is not None and math.prod(gs_shape) != 1:
        raise TypeError(f"global_scale: expected a one-element tensor, got shape {tuple(gs_shape)}")
    k = shape[-1]
    if fmt.elems_per_byte == 2 and k % 2:
        raise ValueError(f"x: {fmt.name} packs two elements per byte, so K must be even, got {k}")
    rows_p, cols_p = swizzled_shape(shape[-2], -(-k // fmt.block_size))
    data_shape = (*shape[:-1], k // fmt.elems_per_byte)
    return data_shape, fmt.elem_dtype, (*shape[:-2], rows_p, cols_p), fmt.scale_dtype


# The CUDA function's validation, memoized per (shape, dtype, format, global-scale shape, rule):
# a pure function of those (concrete shapes only; an invalid call raises every time, nothing is
# cached for it), and about 2 us of Python per call where a key lookup costs a few hundred ns.
_quantize_layout_cached = functools.lru_cache(maxsize=512)(_quantize_layout)


def _gemm_quantized_outputs(a, b, bias, out_global_scale, out_dtype, activation):
    """Validates a gemm_quantized call; returns (data shape, data dtype, scales shape, scales dtype)."""
    if out_dtype not in QUANT_FORMATS:
        raise ValueError(f"out_dtype must be one of {QUANT_FORMATS}, got {out_dtype!r}")

    n = check_gemm_operands(a, b, bias, activation)[-1]
    if n % 32:
        raise ValueError(f"a quantized output needs a multiple of 32 columns, got {n}")
    if out_dtype == "nvfp4":
        if out_global_scale is None:
            raise ValueError(
                "an NVFP4 output needs out_global_scale (fp32 per-tensor scale; e.g. amax / (448 * 6))"
            )
        if out_global_scale.numel() != 1:
            raise ValueError(
                f"out_global_scale must have one element, got shape {tuple(out_global_scale.shape)}"
            )
    elif out_global_scale is not None:
        raise ValueError(f"out_global_scale is for NVFP4 outputs only, got out_dtype={out_dtype!r}")
    fmt, q = get_format(out_dtype), QUANT[out_dtype]
    batch = a.shape[:1] if a.dim() == 3 else b.shape[:1] if b.dim() == 3 else ()
    rows_p, cols_p = swizzled_shape(a.shape[-2], n // q.block)
    return (
        (*batch, a.shape[-2], n // fmt.elems_per_byte),
        fmt.elem_dtype,
        (*batch, rows_p, cols_p),
        fmt.scale_dtype,
    )


def _gemm_blockscaled_outputs(a, a_scales, b, b_scales, a_global_scale, b_global_scale, fmt_name, out_dtype):
    """Validates a gemm_blockscaled call; returns (output shape, output dtype, K)."""
    if fmt_name not in _BLOCKSCALED_RECIPES:
        raise ValueError(f"fmt must be one of {sorted(_BLOCKSCALED_RECIPES)}, got {fmt_name!r}")
    fmt = get_format(fmt_name)
    out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
    if out_dtype not in _BLOCKSCALED_OUT_DTYPES:
        raise ValueError(f"out_dtype must be one of {_BLOCKSCALED_OUT_DTYPES}, got {out_dtype}")
    for nm, t in (("a", a), ("b", b)):
        _check_elements(nm, t, fmt)
    shapes = f"a {tuple(a.shape)} vs b {tuple(b.shape)} (b is (N, K) or (L, N, K))"
    if a.dim() != b.dim() or (a.dim() == 3 and a.shape[0] != b.shape[0]):
        raise ValueError(f"batch mismatch: {shapes}")
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(f"K mismatch: {shapes}")
    for nm, t, s, g in (("a", a, a_scales, a_global_scale), ("b", b, b_scales, b_global_scale)):
        _check_scales(nm, t, s, g, fmt)
    return (*a.shape[:-1], b.shape[-2]), out_dtype, a.shape[-1] * fmt.elems_per_byte


def _check_elements(nm: str, t, fmt) -> None:
    """The raw elements of a BlockScaledTensor operand: ``fmt.elem_dtype``, (rows, K') or (L, rows, K')."""
    if t.dtype != fmt.elem_dtype:
        raise TypeError(f"{nm}: expected {fmt.name} data ({fmt.name} elements are {fmt.elem_dtype}), got {t.dtype}")
    if t.dim() not in (2, 3):
        raise ValueError(f"{nm}: expected a (rows, K) or (L, rows, K) tensor, got {tuple(t.shape)}")


def _check_scales(nm: str, t, scales, global_scale, fmt) -> None:
    """The scales (128x4 swizzled, of elements ``t``) and global scale of a BlockScaledTensor operand."""
    k = t.shape[-1] * fmt.elems_per_byte
    want = (*t.shape[:-2], *swizzled_shape(t.shape[-2], -(-k // fmt.block_size)))
    if scales.dtype != fmt.scale_dtype or tuple(scales.shape) != want:
        raise ValueError(
            f"{nm}_scales: expected {fmt.scale_dtype} of the 128x4 swizzled shape {want}, "
            f"got {scales.dtype} {tuple(scales.shape)}"
        )
    if global_scale is not None and not fmt.has_global_scale:
        raise ValueError(f"{nm}_global_scale: format {fmt.name} has no global scale")
    if global_scale is not None and global_scale.numel() != 1:
        raise ValueError(f"{nm}_global_scale: expected a one-element tensor, got shape {tuple(global_scale.shape)}")


def _fresh(t: torch.Tensor, inputs) -> torch.Tensor:
    """t, or a copy when it shares storage with an input (custom-op outputs must not alias)."""
    for x in inputs:
        if isinstance(x, torch.Tensor) and t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
            return t.clone()
    return t


# ----------------------------------------------------------------------------------------------
# cutegemm::quantize


@torch.library.custom_op("cutegemm::quantize", mutates_args=(), device_types="cpu", schema=QUANTIZE_SCHEMA)
def quantize_op(
    x: torch.Tensor, fmt: str, global_scale: Optional[torch.Tensor] = None, *, scale_rule: str = "ocp"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(data, scales, global_scale); see the module docstring. (This body is the CPU kernel.)"""
    _quantize_outputs(x, fmt, global_scale, scale_rule)
    q = quantize_ref(x, fmt, global_scale=global_scale, scale_rule=scale_rule)
    return _quantize_tuple(q, x, global_scale)


def _quantize_tuple(q: BlockScaledTensor, x, global_scale):
    """The op's outputs (copies of q's tensors that share storage with x)."""
    return _fresh(q.data, (x,)), _fresh(q.scales, (x,)), _op_global_scale(q.global_scale, x, global_scale)


def _op_global_scale(gs, x, global_scale) -> torch.Tensor:
    """The op's global-scale output: gs (0-d; a copy where it shares storage with x or the given
    one), or an empty fp32 tensor on x's device when the format has none."""
    # (an empty fp32 tensor on x's device: x.new_empty((0,), dtype=torch.float32) for a strided x)
    if gs is None:
        return torch.empty(0, dtype=torch.float32, device=x.device)
    return _fresh(gs.reshape(()), (x, global_scale))


@quantize_op.register_kernel("cuda")
def _quantize_cuda(x, fmt, global_scale=None, *, scale_rule="ocp"):
    _quantize_layout_cached(x.shape, x.dtype, fmt, None if global_scale is None else global_scale.shape, scale_rule)
    # the kernel's data and scales are new tensors: only the global scale (maybe the given one) is checked
    data, scales, gs = quantize_tensors(x, fmt, global_scale, scale_rule)
    return data, scales, _op_global_scale(gs, x, global_scale)


@quantize_op.register_fake
def _quantize_fake(x, fmt, global_scale=None, *, scale_rule="ocp"):
    data_shape, data_dtype, scales_shape, scales_dtype = _quantize_outputs(x, fmt, global_scale, scale_rule)
    gs_shape = () if get_format(fmt).has_global_scale else (0,)
    return (
        x.new_empty(data_shape, dtype=data_dtype),
        x.new_empty(scales_shape, dtype=scales_dtype),
        x.new_empty(gs_shape, dtype=torch.float32),
    )


def quantize(x: torch.Tensor, fmt: str, *, global_scale=None, scale_rule: str = "ocp") -> BlockScaledTensor:
    """``cutegemm.quantize`` through the ``cutegemm::quantize`` custom op (torch.compile /
    CUDA graphs; CPU: ``quantize_ref``): a :class:`BlockScaledTensor` with swizzled scales.
    ``global_scale``: NVFP4 only, a float or one-element tensor, None for the default."""
    f = get_format(fmt)
    if global_scale is not None and not isinstance(global_scale, torch.Tensor):
        global_scale = torch.tensor(float(global_scale), dtype=torch.float32, device=x.device)
    if scale_rule == "ocp":  # the schema's default, left out: a keyword argument costs the dispatcher ~2 us
        data, scales, gs = torch.ops.cutegemm.quantize(x, f.name, global_scale)
    else:
        data, scales, gs = torch.ops.cutegemm.quantize(x, f.name, global_scale, scale_rule=scale_rule)
    return BlockScaledTensor(
        data=data, scales=scales, fmt=f, shape=x.shape, global_scale=gs if f.has_global_scale else None,
        scales_swizzled=True,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# cutegemm::gemm_quantized


@torch.library.custom_op(
    "cutegemm::gemm_quantized", mutates_args=(), device_types="cpu", schema=GEMM_QUANTIZED_SCHEMA
)
def gemm_quantized_op(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    out_global_scale: Optional[torch.Tensor] = None,
    *,
    out_dtype: str,
    alpha: float = 1.0,
    activation: Optional[str] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, scales); see the module docstring. (This body is the CPU kernel.)"""
    _gemm_quantized_outputs(a, b, bias, out_global_scale, out_dtype, activation)
    q = _gemm_ref(
        a, b, out_dtype=out_dtype, alpha=alpha, bias=bias, activation=activation,
        compute_dtype=torch.float64 if a.dtype == torch.float64 else torch.float32,
        out_global_scale=out_global_scale,
    )  # fmt: skip
    return q.data, q.scales


@gemm_quantized_op.register_kernel("cuda")
def _gemm_quantized_cuda(a, b, bias=None, out_global_scale=None, *, out_dtype, alpha=1.0, activation=None):
    q = _gemm_kernel(
        a,
        b,
        out_dtype=out_dtype,
        alpha=alpha,
        bias=bias,
        activation=activation,
        out_global_scale=out_global_scale,
    )
    return q.data, q.scales


@gemm_quantized_op.register_fake
def _gemm_quantized_fake(a, b, bias=None, out_global_scale=None, *, out_dtype, alpha=1.0, activation=None):
    data_shape, data_dtype, scales_shape, scales_dtype = _gemm_quantized_outputs(
        a, b, bias, out_global_scale, out_dtype, activation
    )
    return a.new_empty(data_shape, dtype=data_dtype), a.new_empty(scales_shape, dtype=scales_dtype)


def gemm_quantized(
    a, b, bias=None, *, out_dtype: str, out_global_scale=None, alpha: float = 1.0, activation=None
) -> BlockScaledTensor:
    """``cutegemm.gemm(a, b, bias=bias, alpha=alpha, activation=activation, out_dtype=out_dtype,
    out_global_scale=out_global_scale)`` through the ``cutegemm::gemm_quantized`` custom op
    (torch.compile / CUDA graphs; CPU: gemm_ref + quantize_ref). ``out_global_scale``: NVFP4
    only, a float or one-element tensor; it becomes the result's 0-d fp32 ``global_scale``."""
    gs = out_global_scale
    if gs is not None and not isinstance(gs, torch.Tensor):
        gs = torch.tensor(float(gs), dtype=torch.float32, device=a.device)
    data, scales = torch.ops.cutegemm.gemm_quantized(
        a, b, bias, gs, out_dtype=out_dtype, alpha=alpha, activation=activation
    )
    n = b.shape[-1] // 2 if activation in GATED else b.shape[-1]
    batch = a.shape[:1] if a.dim() == 3 else b.shape[:1] if b.dim() == 3 else ()
    return BlockScaledTensor(
        data=data, scales=scales, fmt=get_format(out_dtype), shape=torch.Size((*batch, a.shape[-2], n)),
        global_scale=None if gs is None else gs.to(torch.float32).reshape(()), scales_swizzled=True,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# cutegemm::gemm_blockscaled


def _blockscaled_operands(a, a_scales, b, b_scales, a_global_scale, b_global_scale, fmt_name, out_dtype):
    """Validates; returns (qa, qb, out_dtype) rebuilt as BlockScaledTensors."""
    _, out_dtype, k = _gemm_blockscaled_outputs(
        a, a_scales, b, b_scales, a_global_scale, b_global_scale, fmt_name, out_dtype
    )
    fmt = get_format(fmt_name)

    def rebuild(data, scales, gs):
        gs = None if gs is None else gs.to(torch.float32).reshape(())
        shape = torch.Size((*data.shape[:-1], k))
        return BlockScaledTensor(data=data, scales=scales, fmt=fmt, shape=shape, global_scale=gs)

    return rebuild(a, a_scales, a_global_scale), rebuild(b, b_scales, b_global_scale), out_dtype


@torch.library.custom_op(
    "cutegemm::gemm_blockscaled", mutates_args=(), device_types="cpu", schema=GEMM_BLOCKSCALED_SCHEMA
)
def gemm_blockscaled_op(
    a: torch.Tensor,
    a_scales: torch.Tensor,
    b: torch.Tensor,
    b_scales: torch.Tensor,
    a_global_scale: Optional[torch.Tensor] = None,
    b_global_scale: Optional[torch.Tensor] = None,
    *,
    fmt: str,
    out_dtype: Optional[torch.dtype] = None,
    alpha: float = 1.0,
) -> torch.Tensor:
    """alpha * dequantize(A) @ dequantize(B).mT; see the module docstring. (This body is the CPU
    kernel: the reference twin.)"""
    qa, qb, out_dtype = _blockscaled_operands(
        a, a_scales, b, b_scales, a_global_scale, b_global_scale, fmt, out_dtype
    )
    return _gemm_blockscaled_ref(qa, qb, out_dtype=out_dtype, alpha=alpha)


@gemm_blockscaled_op.register_kernel("cuda")
def _gemm_blockscaled_cuda(
    a, a_scales, b, b_scales, a_global_scale=None, b_global_scale=None, *, fmt, out_dtype=None, alpha=1.0
):
    qa, qb, out_dtype = _blockscaled_operands(
        a, a_scales, b, b_scales, a_global_scale, b_global_scale, fmt, out_dtype
    )
    return _gemm_blockscaled_kernel(qa, qb, out_dtype=out_dtype, alpha=alpha)


@gemm_blockscaled_op.register_fake
def _gemm_blockscaled_fake(
    a, a_scales, b, b_scales, a_global_scale=None, b_global_scale=None, *, fmt, out_dtype=None, alpha=1.0
):
    shape, out_dtype, _ = _gemm_blockscaled_outputs(
        a, a_scales, b, b_scales, a_global_scale, b_global_scale, fmt, out_dtype
    )
    return a.new_empty(shape, dtype=out_dtype)


def gemm_blockscaled(
    qa: BlockScaledTensor,
    qb: BlockScaledTensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    alpha: float = 1.0,
) -> torch.Tensor:
    """``cutegemm.gemm(qa, qb, out_dtype=out_dtype, alpha=alpha)`` through the
    ``cutegemm::gemm_blockscaled`` custom op (torch.compile; CPU: the reference twin). qa holds
    A (M, K) / (L, M, K), qb holds B as (N, K) / (L, N, K), both quantized along K with the same
    format; plain (unswizzled) scales are swizzled first (a copy)."""
    for nm, q in (("qa", qa), ("qb", qb)):
        if not isinstance(q, BlockScaledTensor):
            raise TypeError(f"{nm} must be a BlockScaledTensor, got {type(q).__name__}")
    if qa.fmt.name != qb.fmt.name:  # names: dynamo cannot compare the formats' float fields
        raise ValueError(f"qa and qb must share a format, got {qa.fmt.name} and {qb.fmt.name}")
    return torch.ops.cutegemm.gemm_blockscaled(
        qa.data, qa.swizzled_scales(), qb.data, qb.swizzled_scales(), qa.global_scale, qb.global_scale,
        fmt=qa.fmt.name, out_dtype=out_dtype, alpha=alpha,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# cutegemm::gemm_fp4_weight


def _fp4_weight_operand(x, w, w_scales, w_global_scale, offs, scale_a, fmt_name, out_dtype):
    """Validates; returns (qw, out_dtype): the weight rebuilt as a BlockScaledTensor."""
    if fmt_name not in ("nvfp4", "mxfp4", "mxfp8"):
        raise ValueError(f"fmt must be 'nvfp4', 'mxfp4' or 'mxfp8', got {fmt_name!r}")
    fmt = get_format(fmt_name)
    out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
    if out_dtype not in _BLOCKSCALED_OUT_DTYPES:
        raise ValueError(f"out_dtype must be one of {_BLOCKSCALED_OUT_DTYPES}, got {out_dtype}")
    _check_elements("w", w, fmt)
    _check_scales("w", w, w_scales, w_global_scale, fmt)
    k = w.shape[-1] * fmt.elems_per_byte
    gs = None if w_global_scale is None else w_global_scale.to(torch.float32).reshape(())
    qw = BlockScaledTensor(data=w, scales=w_scales, fmt=fmt, shape=torch.Size((*w.shape[:-1], k)), global_scale=gs)
    check_args(x, qw, offs, out_dtype, scale_a)
    return qw, out_dtype


@torch.library.custom_op(
    "cutegemm::gemm_fp4_weight", mutates_args=(), device_types="cpu", schema=GEMM_FP4_WEIGHT_SCHEMA
)
def gemm_fp4_weight_op(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scales: torch.Tensor,
    w_global_scale: Optional[torch.Tensor] = None,
    offs: Optional[torch.Tensor] = None,
    scale_a: Optional[torch.Tensor] = None,
    *,
    fmt: str,
    out_dtype: Optional[torch.dtype] = None,
    alpha: float = 1.0,
) -> torch.Tensor:
    """alpha * x @ dequantize(W).mT; see the module docstring. (This body is the CPU kernel: the
    reference twin.)"""
    qw, out_dtype = _fp4_weight_operand(x, w, w_scales, w_global_scale, offs, scale_a, fmt, out_dtype)
    return gemm_fp4_weight_ref(x, qw, offs=offs, out_dtype=out_dtype, alpha=alpha, scale_a=scale_a)


@gemm_fp4_weight_op.register_kernel("cuda")
def _gemm_fp4_weight_cuda(
    x, w, w_scales, w_global_scale=None, offs=None, scale_a=None, *, fmt, out_dtype=None, alpha=1.0
):
    qw, out_dtype = _fp4_weight_operand(x, w, w_scales, w_global_scale, offs, scale_a, fmt, out_dtype)
    # rows past offs[-1] are not written by the kernel: zero them (the op's output is defined)
    out = None if offs is None else torch.zeros(x.shape[0], w.shape[-2], dtype=out_dtype, device=x.device)
    return kernel(x, qw, offs=offs, out=out, out_dtype=out_dtype, alpha=alpha, scale_a=scale_a)


@gemm_fp4_weight_op.register_fake
def _gemm_fp4_weight_fake(
    x, w, w_scales, w_global_scale=None, offs=None, scale_a=None, *, fmt, out_dtype=None, alpha=1.0
):
    _, out_dtype = _fp4_weight_operand(x, w, w_scales, w_global_scale, offs, scale_a, fmt, out_dtype)
    return x.new_empty((x.shape[0], w.shape[-2]), dtype=out_dtype)


def gemm_fp4_weight(x, qw: BlockScaledTensor, *, offs=None, scale_a=None, out_dtype=torch.bfloat16, alpha: float = 1.0):
    """``cutegemm.gemm(x, qw)`` / ``cutegemm.grouped_gemm(x, qw, offs=offs)`` (FP4 weight, bf16
    activations) through the ``cutegemm::gemm_fp4_weight`` custom op (torch.compile, CUDA graphs;
    CPU: the reference twin). Plain (unswizzled) scales are swizzled first (a copy)."""
    if not isinstance(qw, BlockScaledTensor):
        raise TypeError(f"qw must be a BlockScaledTensor, got {type(qw).__name__}")
    return torch.ops.cutegemm.gemm_fp4_weight(
        x, qw.data, qw.swizzled_scales(), qw.global_scale, offs, scale_a, fmt=qw.fmt.name, out_dtype=out_dtype, alpha=alpha
    )


# each op's CUDA function (cutegemm.ops registers their no-gradient fast path with it)
CUDA_FUNCTIONS = (
    (quantize_op, _quantize_cuda),
    (gemm_quantized_op, _gemm_quantized_cuda),
    (gemm_blockscaled_op, _gemm_blockscaled_cuda),
    (gemm_fp4_weight_op, _gemm_fp4_weight_cuda),
)

__all__ = [
    "CUDA_FUNCTIONS",
    "gemm_fp4_weight",
    "gemm_fp4_weight_op",
    "GEMM_FP4_WEIGHT_SCHEMA",
    "quantize",
    "gemm_quantized",
    "gemm_blockscaled",
    "quantize_op",
    "gemm_quantized_op",
    "gemm_blockscaled_op",
    "QUANTIZE_SCHEMA",
    "GEMM_QUANTIZED_SCHEMA",
    "GEMM_BLOCKSCALED_SCHEMA",
]
