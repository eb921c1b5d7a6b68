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


_BF16 = torch.bfloat16


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


class _Route:
    """The options a route of the public function ``fn`` takes (``supported``), for
    :func:`_supported`; ``fn``'s defaults are read at the first call."""

    def __init__(self, fn, supported: tuple[str, ...], what: str = "BlockScaledTensor operands"):
        self.fn, self.supported, self.what = fn, supported, what
        self.names = frozenset(supported)
        self.out_dtype = "out_dtype" in self.names
        self.defaults = None  # the supported options' defaults

    def fill(self, options: dict) -> dict:
        if self.defaults is None:
            self.defaults = {name: default for name, default in _defaults(self.fn) if name in self.names}
        return {**self.defaults, **options}


def _supported(route: _Route, options: dict) -> dict:
    """The options of a call on ``route`` (its defaults filled in); a ValueError names every
    other option that is not at its default (not supported on the route)."""
    if options.keys() <= route.names:  # no other option can be off its default
        opts = route.fill(options)
    else:
        fn, supported = route.fn, route.supported
        unknown = set(options) - {name for name, _ in _defaults(fn)}
        if unknown:
            raise TypeError(f"{fn.__name__}() got unexpected keyword arguments {sorted(unknown)}")
        bad = [name for name, default in _defaults(fn)
               if name not in supported and not _is_default(options.get(name, default), default)]  # fmt: skip
        if bad:
            raise ValueError(
                f"{fn.__name__} with {route.what} supports only {', '.join(supported)} so far; "
                f"got {', '.join(bad)}"
            )
        opts = {name: options.get(name, default) for name, default in _defaults(fn) if name in supported}
    if route.out_dtype and opts["out_dtype"] is None:
        out = opts.get("out")
        opts["out_dtype"] = out.dtype if isinstance(out, torch.Tensor) else _BF16
    return opts


# each route's options (kernel / reference twin)
_BLOCKSCALED = _Route(dense.gemm, BLOCKSCALED_OPTIONS)
_WEIGHT_ONLY = _Route(dense.gemm, ("scale_a", *BLOCKSCALED_OPTIONS))
_FP8_BLOCKS = _Route(dense.gemm, FP8_BLOCKS_OPTIONS, FP8_BLOCKS)
_BLOCKSCALED_REF = _Route(dense.gemm_ref, BLOCKSCALED_REF_OPTIONS)
_WEIGHT_ONLY_REF = _Route(dense.gemm_ref, ("scale_a", *BLOCKSCALED_REF_OPTIONS))
_FP8_BLOCKS_REF = _Route(dense.gemm_ref, FP8_BLOCKS_REF_OPTIONS, FP8_BLOCKS)
_GROUPED = {(fn, extra): _Route(fn, (*(GROUPED_REF_OPTIONS if fn is packed.grouped_gemm_ref else GROUPED_OPTIONS), *extra))
            for fn in (packed.grouped_gemm, packed.grouped_gemm_ref) for extra in ((), ("scale_a",))}  # fmt: skip
# the options of a warm block-scaled call (out_dtype None: bf16, as _supported gives without out)
_OUT_ALPHA = frozenset({"out_dtype", "alpha"})
_OFFS_OUT_ALPHA = frozenset({"offs", "out_dtype", "alpha"})


def _warm_out_dtype(options: dict) -> torch.dtype:
    """A warm block-scaled call's output dtype: ``out_dtype``, bf16 where None or left out (no
    ``out`` on these calls, so :func:`_supported`'s default)."""
    out_dtype = options.get("out_dtype")
    return _BF16 if out_dtype is None else out_dtype


@functools.wraps(dense.gemm)
def gemm(a, b, **options):
    if isinstance(b, BlockScaledTensor):
        if not options or options.keys() <= _OUT_ALPHA:  # every other option at its default: the routes' own
            out_dtype, alpha = (_warm_out_dtype(options), options.get("alpha", 1.0)) if options else (_BF16, 1.0)
            if isinstance(a, torch.Tensor):  # the decode call: its plan (filed by gemm_fp4_weight), else the route
                res = warm_weight_only(a, b, None, out_dtype, alpha)
                if res is not None:
                    return res
            if is_fp4_weight_call(a, b):
                return gemm_fp4_weight(a, b, out_dtype=out_dtype, alpha=alpha)
            if isinstance(a, BlockScaledTensor):
                return gemm_blockscaled(a, b, out_dtype=out_dtype, alpha=alpha)
    if isinstance(a, BlockScaledTensor) or isinstance(b, BlockScaledTensor):
        if is_fp4_weight_call(a, b):
            return gemm_fp4_weight(a, b, **_supported(_WEIGHT_ONLY, options))
        return gemm_blockscaled(a, b, **_supported(_BLOCKSCALED, options))
    sb = options.get("scale_b")
    if sb is not None and _n_rows_scale_b(b, sb):  # FP8 block scales of blockscaled.fp8_blocks?
        if options.keys() == _BARE_SCALED:  # a warm call
            res = warm_vector_blocks(a, b, options["scale_a"], sb)
            if res is not None:
                return res
        if _vector_blocks(a, b, options):
            opts = _supported(_FP8_BLOCKS, options)
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
            return gemm_fp4_weight_ref(a, b, **_supported(_WEIGHT_ONLY_REF, options))
        return gemm_blockscaled_ref(a, b, **_supported(_BLOCKSCALED_REF, options))
    if _vector_blocks(a, b, options):
        opts = _supported(_FP8_BLOCKS_REF, options)
        return gemm_fp8_vector_blocks_ref(a, b, **opts)
    return dense.gemm_ref(a, b, **options)


def _grouped_quantized(fn, a, b, options: dict, run, run_ref, extra: tuple):
    """A grouped call with a BlockScaledTensor operand: ``run`` (``run_ref`` for the reference
    twin) with its options only."""
    if options.get("offs") is None:
        raise ValueError("offs is required (int32 cumulative end rows of the experts, on the GPU)")
    opts = _supported(_GROUPED[fn, extra], options)
    if opts.pop("check_offs", False):
        check_offs_values(opts["offs"], a.shape[0])
    return (run_ref if fn is packed.grouped_gemm_ref else run)(a, b, **opts)


def _grouped_route(fn, a, b, options: dict):
    """The grouped call's route: a BlockScaledTensor A (and weight) -> the block-scaled grouped
    GEMM; a BlockScaledTensor weight only -> the weight-only kernels; ``gather_index`` -> A's rows
    through it (``grouped.gather``); else ``fn`` itself."""
    if options.get("gather_index") is not None:
        if isinstance(a, BlockScaledTensor) or isinstance(b, BlockScaledTensor):
            raise ValueError("gather_index is for bf16 / fp16 / fp8 tensor operands, not BlockScaledTensor")
        if not (isinstance(a, torch.Tensor) and a.dim() == 2 and isinstance(b, torch.Tensor) and b.dim() == 3):
            raise ValueError("gather_index: the packed form only, a 2-D a (rows, K) and a 3-D b (E, K, N) tensor")
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
    if isinstance(b, BlockScaledTensor) and isinstance(a, torch.Tensor) and options.keys() <= _OFFS_OUT_ALPHA:
        offs = options.get("offs")  # the MoE weight-only call: its plan
        if isinstance(offs, torch.Tensor):
            res = warm_weight_only(a, b, offs, _warm_out_dtype(options), options.get("alpha", 1.0))
            if res is not None:
                return res
    return _grouped_route(packed.grouped_gemm, a, b, options)


@functools.wraps(packed.grouped_gemm_ref)
def grouped_gemm_ref(a, b, **options):
    return _grouped_route(packed.grouped_gemm_ref, a, b, options)


GATHER_DOC = """

``gather_index=idx`` (packed form): packed row r reads ``a[idx[r]]``, as ``grouped_gemm(a[idx], b,
offs=offs)`` computes it, without the copy (``cutegemm.grouped.gather``)."""
grouped_gemm.__doc__ = (grouped_gemm.__doc__ or "") + GATHER_DOC
grouped_gemm_ref.__doc__ = (grouped_gemm_ref.__doc__ or "") + GATHER_DOC


__all__ = ["gemm", "gemm_ref", "grouped_gemm", "grouped_gemm_ref"]
