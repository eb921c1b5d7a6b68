"""Math for user-defined epilogues (:mod:`cutegemm.epilogue.user`): each function works on the
kernel's fp32 register vectors (CuTe DSL TensorSSA, traced into the kernel) and on torch tensors
(``gemm_ref``), with the same formulas as the built-in activations of
:mod:`cutegemm.epilogue.ops` (fast exp / reciprocal in the kernel)."""

from __future__ import annotations

import cutlass
import torch

from . import ops


def _is_torch(x) -> bool:
    return isinstance(x, torch.Tensor)


class _TorchMath:
    @staticmethod
    def exp(x):
        return torch.exp(x)

    @staticmethod
    def rcp(x):
        return torch.reciprocal(x)

    @staticmethod
    def abs(x):
        return torch.abs(x)

    @staticmethod
    def where(cond, x, y):
        return torch.where(cond, x, y)


TORCH_MATH = _TorchMath()


def _m(x):
    return TORCH_MATH if _is_torch(x) else ops.CUTE_MATH


def relu(x):
    return ops.relu(x, _m(x))


def silu(x):
    return ops.silu(x, _m(x))


def gelu(x):
    """erf GELU."""
    return ops.gelu(x, _m(x))


def gelu_tanh(x):
    return ops.gelu_tanh(x, _m(x))


def sigmoid(x):
    return ops._sigmoid(x, _m(x))


def exp(x):
    return _m(x).exp(x)


def abs(x):  # noqa: A001 - the natural name inside an epilogue
    return _m(x).abs(x)


def where(cond, x, y):
    """``x`` where ``cond`` else ``y`` (either of x / y may be a Python number)."""
    if _is_torch(cond):
        return torch.where(cond, x, y)

    x = cutlass.Float32(x) if isinstance(x, (int, float)) else x
    y = cutlass.Float32(y) if isinstance(y, (int, float)) else y
    return ops.CUTE_MATH.where(cond, x, y)


def maximum(x, y):
    return where(x < y, y, x) if not isinstance(x, (int, float)) else where(y < x, x, y)


def minimum(x, y):
    return where(y < x, y, x) if not isinstance(x, (int, float)) else where(x < y, x, y)


__all__ = ["relu", "silu", "gelu", "gelu_tanh", "sigmoid", "exp", "abs", "where", "maximum", "minimum"]
