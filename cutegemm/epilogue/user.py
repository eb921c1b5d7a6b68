"""User-defined epilogues, traced into the kernel (in the spirit of FlexAttention's score_mod).

A user epilogue is a plain Python function over the fp32 accumulator and its coordinates::

    from cutegemm.epilogue import fn

    def epi(acc, row, col, bias, scale):
        return fn.silu(acc + bias[col]) * scale[row]

    out = cutegemm.gemm(a, b, epilogue=epi, epilogue_args=(bias, scale))
    ref = cutegemm.gemm_ref(a, b, epilogue=epi, epilogue_args=(bias, scale))

Contract:
- ``acc``: the fp32 accumulator (times ``alpha`` when alpha != 1); ``row`` / ``col``: the output
  coordinates (int32); then one argument per tensor of ``epilogue_args`` (at most 4): contiguous
  1-D vectors (bf16 / fp16 / fp32) read as fp32, and indexed ONLY as ``v[row]`` or ``v[col]``
  (indices past the vector's end are clamped; elements past M / N are never stored).
- The body may use arithmetic (+ - * /), comparisons, Python float / int constants and the
  functions of :mod:`cutegemm.epilogue.fn` (relu, silu, gelu, gelu_tanh, sigmoid, exp, abs,
  where, minimum, maximum). The same function runs in the kernel on the DSL's register vectors
  and in :func:`cutegemm.gemm_ref` on torch tensors (``row`` (M, 1), ``col`` (1, N)).
- The result is the output value before the cast (or before the quantized-output epilogue).
- Compiled kernels are cached by the function's identity key: its source code, the values of its
  closure cells and of the simple globals it names (numbers, strings, functions of this
  package). Closures over tensors or other mutable objects are rejected: pass tensors as
  ``epilogue_args``.
- A function the DSL cannot trace raises ``ValueError("... could not be traced ...")``.
"""

from __future__ import annotations

import hashlib
import inspect
import textwrap
import types

import cutlass
import cutlass.cute as cute
import torch

_REGISTRY: dict[str, object] = {}
_CONST_TYPES = (int, float, bool, str, type(None))


def _describe(value, name: str) -> str:
    """A stable text for one captured value, or TypeError when it cannot key a kernel."""
    if isinstance(value, _CONST_TYPES):
        return repr(value)
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
        mod = getattr(value, "__module__", "") or ""
        if mod.startswith("cutegemm.") or mod in ("math", "builtins"):
            return f"{mod}.{value.__qualname__}"
        return "fn:" + user_key(value)
    if isinstance(value, types.ModuleType):
        return f"module:{value.__name__}"
    if isinstance(value, (tuple, frozenset)) and all(isinstance(v, _CONST_TYPES) for v in value):
        return repr(value)
    raise TypeError(
        f"user epilogue captures {name!r} of type {type(value).__name__}: only numbers, strings, "
        f"functions and modules can be captured (pass tensors as epilogue_args)"
    )


def user_key(func) -> str:
    """Identity key of an epilogue function: its source, closure values and named globals."""
    if not callable(func) or not isinstance(func, types.FunctionType):
        raise TypeError(f"epilogue must be a Python function, got {type(func).__name__}")
    try:
        src = textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError) as exc:
        raise TypeError(f"epilogue {func.__qualname__}: its source is not available ({exc})") from exc
    parts = [func.__qualname__, src]
    code = func.__code__
    for name, cell in zip(code.co_freevars, func.__closure__ or (), strict=True):
        parts.append(f"{name}={_describe(cell.cell_contents, name)}")
    for name in sorted(set(code.co_names)):
        if name in func.__globals__:
            parts.append(f"{name}={_describe(func.__globals__[name], name)}")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def register(func) -> str:
    """Key of ``func`` (see :func:`user_key`), remembered so a kernel build can find it."""
    n_params = len(inspect.signature(func).parameters)
    if n_params < 3:
        raise TypeError(
            f"epilogue {func.__qualname__} must take (acc, row, col, *vectors), got {n_params} parameters"
        )
    key = user_key(func)
    _REGISTRY[key] = func
    return key


def lookup(key: str):
    try:
        return _REGISTRY[key]
    except KeyError:
        raise KeyError(f"user epilogue {key} is not registered in this process") from None


class KernelVector:
    """An epilogue vector inside the kernel: ``v[row]`` / ``v[col]`` gather fp32 values."""

    def __init__(self, tensor, coords, shape, axes, name: str):
        self.tensor = tensor
        self.coords = coords
        self.shape = shape
        self.axes = axes  # ((row values, 0), (col values, 1))
        self.name = name

    def __getitem__(self, idx):
        axis = next((a for values, a in self.axes if idx is values), None)
        if axis is None:
            raise TypeError(f"epilogue vector {self.name} can only be indexed by row or col")
        last = self.tensor.shape[0] - 1
        n = cute.size(self.coords)
        r = cute.make_rmem_tensor(self.shape, cutlass.Float32)
        for v in range(n):
            r[v] = self.tensor[cutlass.min(self.coords[v][axis], last)].to(cutlass.Float32)
        return r.load()


class RefVector:
    """The same vector in :func:`gemm_ref`: ``v[row]`` -> (M, 1), ``v[col]`` -> (1, N) fp32."""

    def __init__(self, tensor, axes, name: str):
        self.tensor = tensor.float()
        self.axes = axes
        self.name = name

    def __getitem__(self, idx):
        if not any(idx is values for values in self.axes):
            raise TypeError(f"epilogue vector {self.name} can only be indexed by row or col")
        return self.tensor[idx.clamp(max=self.tensor.shape[0] - 1)]


def apply_user_ref(func, acc, vectors):
    """Evaluate ``func`` on a (..., M, N) fp32 accumulator in torch."""
    m, n = acc.shape[-2], acc.shape[-1]
    row = torch.arange(m, device=acc.device).unsqueeze(1)
    col = torch.arange(n, device=acc.device).unsqueeze(0)
    args = [RefVector(t, (row, col), f"epilogue_args[{i}]") for i, t in enumerate(vectors)]
    out = func(acc, row, col, *args)
    if not isinstance(out, torch.Tensor):
        out = torch.full_like(acc, float(out))
    return out.to(acc.dtype).expand_as(acc)


def apply_user_kernel(key: str, acc, coords, vectors):
    """Trace the registered epilogue ``key`` on one subtile: ``acc`` fp32 TensorSSA, ``coords``
    the per-element global (m, n, l) coordinates (same order), ``vectors`` the global 1-D
    tensors. Returns an fp32 TensorSSA of ``acc``'s shape."""
    func = lookup(key)
    n = cute.size(coords)
    r_row = cute.make_rmem_tensor(acc.shape, cutlass.Int32)
    r_col = cute.make_rmem_tensor(acc.shape, cutlass.Int32)
    for v in range(n):
        r_row[v] = coords[v][0]
        r_col[v] = coords[v][1]
    row, col = r_row.load(), r_col.load()
    axes = ((row, 0), (col, 1))
    args = [KernelVector(t, coords, acc.shape, axes, f"epilogue_args[{i}]") for i, t in enumerate(vectors)]
    out = func(acc, row, col, *args)
    if isinstance(out, (int, float)):
        out = cute.full(acc.shape, float(out), cutlass.Float32)
    if out.dtype != cutlass.Float32:
        out = out.to(cutlass.Float32)
    return out
