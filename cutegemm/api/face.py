"""The public GEMM entry points: ``gemm``, ``gemm_ref``, ``grouped_gemm``, ``grouped_gemm_ref``.

Each decides its route once, from the operand types, and hands the call to one implementation:

| operands                                   | route                                              |
|--------------------------------------------|----------------------------------------------------|
| torch tensors (bf16 / fp16 / fp8)          | ``gemm.dense`` (dense), ``grouped.packed`` (grouped)|
| activation tensor x BlockScaledTensor weight | ``blockscaled.weight_only`` (FP4 / MXFP8 weights) |
| BlockScaledTensor x BlockScaledTensor      | ``blockscaled.gemm`` (block-scaled GEMM)           |
| grouped, ``gather_index=`` given           | ``grouped.gather`` (A's rows through the index)    |

A block-scaled route takes only the options listed for it (``BLOCKSCALED_OPTIONS``,
``WEIGHT_ONLY_OPTIONS``); any other option off its default is a ValueError naming it.
"""

from __future__ import annotations

import functools
import inspect

import torch

from ..blockscaled.fp8_blocks import gemm_fp8_vector_blocks, gemm_fp8_vector_blocks_ref, vector_block_recipe
from ..blockscaled.fp8_blocks import warm_call as warm_vector_blocks
from ..blockscaled.gemm import (
    gemm_blockscaled,
    gemm_blockscaled_ref,
    grouped_gemm_blockscaled,
    grouped_gemm_blockscaled_ref,
)
from ..blockscaled.reference import BlockScaledTensor
from ..blockscaled.weight_only.launch import gemm_fp4_weight, gemm_fp4_weight_ref, is_fp4_weight_call
from ..blockscaled.weight_only.launch import warm_call as warm_weight_only
from ..gemm import dense
from ..gemm.launch import check_offs_values
from ..grouped import packed
from ..grouped.gather import gathered_grouped_gemm, gathered_grouped_gemm_ref

# The options each block-scaled route takes (kernel / reference twin).
BLOCKSCALED_OPTIONS = ("out_dtype", "alpha", "config", "out")
BLOCKSCALED_REF_OPTIONS = ("out_dtype", "alpha", "compute_dtype")
GROUPED_OPTIONS = ("offs", "out_dtype", "alpha", "out", "config", "check_offs")
GROUPED_REF_OPTIONS = ("offs", "out_dtype", "alpha", "compute_dtype")
FP8_BLOCKS_OPTIONS = ("scale_a", "scale_b", "out_dtype", "alpha", "out", "config", "fast_accum")
FP8_BLOCKS_REF_OPTIONS = ("scale_a", "scale_b", "out_dtype", "alpha", "compute_dtype")
FP8_BLOCKS = "1x128 x 1x128 or 128x128 x 1x128 FP8 block scales"


@functools.cache
def _defaults(fn) -> tuple:
    """(name, default) of ``fn``'s keyword parameters."""
    params = inspect.signature(fn).parameters.items()
    return tuple((name, p.default) for name, p in params if name not in ("a", "b"))


def _is_default(value, default) -> bool:
    if value is default:
        return True
    if isinstance(value, torch.Tensor) or isinstance(default, torch.Tensor):
        return False
    try:
        return bool(value == default)
    except Exception:
        return False


def _supported(fn, options: dict, supported: tuple[str, ...], what: str = "BlockScaledTensor operands") -> dict:
    """The ``supported`` options of a call of ``fn`` (defaults filled in); a ValueError names every
    other option that is not at its default (not supported on the route of ``what``)."""
    if options.keys() <= _names(supported):  # no other option can be off its default
        opts = dict(_route_defaults(fn, supported))
        opts.update(options)
    else:
        unknown = set(options) - {name for name, _ in _defaults(fn)}
        if unknown:
            raise TypeError(f"{fn.__name__}() got unexpected keyword arguments {sorted(unknown)}")
        bad = [name for name, default in _defaults(fn)
               if name not in supported and not _is_default(options.get(name, default), default)]  # fmt: skip
        if bad:
            raise ValueError(
                f"{fn.__name__} with {what} supports only {', '.join(supported)} so far; "
                f"got {', '.join(bad)}"
            )
        opts = {name: options.get(name, default) for name, default in _defaults(fn) if name in supported}
    if "out_dtype" in opts and opts["out_dtype"] is None:
        out = opts.get("out")
        opts["out_dtype"] = out.dtype if isinstance(out, torch.Tensor) else torch.bfloat16
    return opts


@functools.cache
def _names(supported: tuple[str, ...]) -> frozenset:
    return frozenset(supported)


@functools.cache
def _route_defaults(fn, supported: tuple[str, ...]) -> dict:
    """``fn``'s defaults of the ``supported`` options."""
    return {name: default for name, default in _defaults(fn) if name in supported}


@functools.wraps(dense.gemm)
def gemm(a, b, **options):
    if not options and isinstance(b, BlockScaledTensor) and isinstance(a, torch.Tensor):  # the decode call
        res = warm_weight_only(a, b)  # its plan (filed by gemm_fp4_weight only), else the routing below
        if res is not None:
            return res
    if isinstance(a, BlockScaledTensor) or isinstance(b, BlockScaledTensor):
        if is_fp4_weight_call(a, b):
            if not options:  # every option at its default (the decode call): gemm_fp4_weight's defaults are the same
                return gemm_fp4_weight(a, b)
            return gemm_fp4_weight(a, b, **_supported(dense.gemm, options, ("scale_a", *BLOCKSCALED_OPTIONS)))
        return gemm_blockscaled(a, b, **_supported(dense.gemm, options, BLOCKSCALED_OPTIONS))
    sb = options.get("scale_b")
    if sb is not None and _n_rows_scale_b(b, sb):  # FP8 block scales of blockscaled.fp8_blocks?
        if options.keys() == _BARE_SCALED:  # a warm call
            res = warm_vector_blocks(a, b, options["scale_a"], sb)
            if res is not None:
                return res
        if _vector_blocks(a, b, options):
            opts = _supported(dense.gemm, options, FP8_BLOCKS_OPTIONS, FP8_BLOCKS)
            opts.pop("fast_accum")  # the kernel promotes every K tile (the emulation every 32 K) either way
            return gemm_fp8_vector_blocks(a, b, **opts)
    return dense.gemm(a, b, **options)


def _n_rows_scale_b(b, sb) -> bool:
    """A 2-D scale_b with N rows (unlike row-wise (1, N), per-tensor or DeepSeek's (K/128, N/128))."""
    return (isinstance(sb, torch.Tensor) and sb.dim() == 2 and isinstance(b, torch.Tensor) and b.dim() == 2
            and sb.shape[0] == b.shape[1])  # fmt: skip


def _vector_blocks(a, b, options: dict) -> bool:
    """Whether the call has FP8 block scales of ``blockscaled.fp8_blocks`` (:func:`_n_rows_scale_b`
    first, the cheap test)."""
    sb = options.get("scale_b")
    return _n_rows_scale_b(b, sb) and vector_block_recipe(a, b, options.get("scale_a"), sb) is not None


_BARE_SCALED = frozenset({"scale_a", "scale_b"})


@functools.wraps(dense.gemm_ref)
def gemm_ref(a, b, **options):
    if isinstance(a, BlockScaledTensor) or isinstance(b, BlockScaledTensor):
        if is_fp4_weight_call(a, b):
            opts = _supported(dense.gemm_ref, options, ("scale_a", *BLOCKSCALED_REF_OPTIONS))
            return gemm_fp4_weight_ref(a, b, **opts)
        return gemm_blockscaled_ref(a, b, **_supported(dense.gemm_ref, options, BLOCKSCALED_REF_OPTIONS))
    if _vector_blocks(a, b, options):
        opts = _supported(dense.gemm_ref, options, FP8_BLOCKS_REF_OPTIONS, FP8_BLOCKS)
        return gemm_fp8_vector_blocks_ref(a, b, **opts)
    return dense.gemm_ref(a, b, **options)


def _grouped_quantized(fn, a, b, options: dict, run, run_ref, extra: tuple):
    """A grouped call with a BlockScaledTensor operand: ``run`` (``run_ref`` for the reference
    twin) with its options only."""
    if options.get("offs") is None:
        raise ValueError("offs is required (int32 cumulative end rows of the experts, on the GPU)")
    ref = fn is packed.grouped_gemm_ref
    opts = _supported(fn, options, (*(GROUPED_REF_OPTIONS if ref else GROUPED_OPTIONS), *extra))
    if opts.pop("check_offs", False):
        check_offs_values(opts["offs"], a.shape[0])
    return (run_ref if ref else run)(a, b, **opts)


def _grouped_route(fn, a, b, options: dict):
    """The grouped call's route: a BlockScaledTensor A (and weight) -> the block-scaled grouped
    GEMM; a BlockScaledTensor weight only -> the weight-only kernels; ``gather_index`` -> A's rows
    through it (``grouped.gather``); else ``fn`` itself."""
    if options.get("gather_index") is not None:
        if isinstance(a, BlockScaledTensor) or isinstance(b, BlockScaledTensor):
            raise ValueError("gather_index is for bf16 / fp16 / fp8 tensor operands, not BlockScaledTensor")
        if fn is packed.grouped_gemm_ref:
            return gathered_grouped_gemm_ref(a, b, run_ref=fn, **options)
        return gathered_grouped_gemm(a, b, run=fn, **options)
    options.pop("gather_index", None)
    if isinstance(a, BlockScaledTensor):
        return _grouped_quantized(fn, a, b, options, grouped_gemm_blockscaled, grouped_gemm_blockscaled_ref, ())
    if isinstance(b, BlockScaledTensor):
        return _grouped_quantized(fn, a, b, options, gemm_fp4_weight, gemm_fp4_weight_ref, ("scale_a",))
    return fn(a, b, **options)


@functools.wraps(packed.grouped_gemm)
def grouped_gemm(a, b, **options):
    if options.keys() == _OFFS_ONLY and isinstance(b, BlockScaledTensor) and isinstance(a, torch.Tensor):
        offs = options["offs"]  # the MoE weight-only call: its plan (filed by gemm_fp4_weight), else the route
        res = warm_weight_only(a, b, offs) if isinstance(offs, torch.Tensor) else None
        if res is not None:
            return res
    return _grouped_route(packed.grouped_gemm, a, b, options)


_OFFS_ONLY = frozenset({"offs"})


@functools.wraps(packed.grouped_gemm_ref)
def grouped_gemm_ref(a, b, **options):
    return _grouped_route(packed.grouped_gemm_ref, a, b, options)


GATHER_DOC = """

``gather_index=idx`` (packed form): packed row r reads ``a[idx[r]]``, as ``grouped_gemm(a[idx], b,
offs=offs)`` computes it, without the copy (``cutegemm.grouped.gather``)."""
grouped_gemm.__doc__ = (grouped_gemm.__doc__ or "") + GATHER_DOC
grouped_gemm_ref.__doc__ = (grouped_gemm_ref.__doc__ or "") + GATHER_DOC


__all__ = ["gemm", "gemm_ref", "grouped_gemm", "grouped_gemm_ref"]
