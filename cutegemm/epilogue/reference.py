"""Plain-torch twins of the epilogue ops (:mod:`cutegemm.epilogue.ops`), used by ``gemm_ref`` and
the tests. Same formulas, same order; torch's own activation functions."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import ACTIVATIONS, GATED
from .ops import GATE_ACTIVATION

GATE_LAYOUTS = ("interleaved", "halves")


def activation_ref(name: str, x: torch.Tensor) -> torch.Tensor:
    """relu, gelu (erf), gelu_tanh, silu, relu_sq, tanh, sigmoid: torch's definitions."""
    if name == "relu":
        return torch.relu(x)
    if name == "gelu":
        return F.gelu(x)
    if name == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if name == "silu":
        return F.silu(x)
    if name == "relu_sq":
        return torch.relu(x).square()
    if name == "tanh":
        return torch.tanh(x)
    if name == "sigmoid":
        return torch.sigmoid(x)
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {name!r}")


def split_gate_up(y: torch.Tensor, gate_layout: str = "interleaved") -> tuple[torch.Tensor, torch.Tensor]:
    """(gate, up) columns of a gated GEMM result with 2*N' columns.

    interleaved: gate j is column 2j, up j is column 2j + 1; halves: y = [gate | up]."""
    if gate_layout == "interleaved":
        return y[..., 0::2], y[..., 1::2]
    if gate_layout == "halves":
        n = y.shape[-1] // 2
        return y[..., :n], y[..., n:]
    raise ValueError(f"gate_layout must be one of {GATE_LAYOUTS}, got {gate_layout!r}")


def epilogue_ref(
    acc: torch.Tensor,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    c: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    gate_layout: str = "interleaved",
) -> torch.Tensor:
    """The epilogue on an accumulator ``acc`` (..., M, N), computed in ``acc.dtype``:
    ``act(alpha * acc + beta * c + bias)``; gated activations (:data:`GATED`) return
    ``act(gate) * up`` with half the columns. ``c`` is read only when ``beta != 0``."""
    y = acc
    if alpha != 1.0:
        y = y * alpha
    if beta != 0.0:
        y = y + beta * c.to(y.dtype)
    if bias is not None:
        y = y + bias.to(y.dtype)
    if activation in GATED:
        gate, up = split_gate_up(y, gate_layout)
        return activation_ref(GATE_ACTIVATION[activation], gate) * up
    if activation is not None:
        y = activation_ref(activation, y)
    return y


def interleave_gate_up(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``[gate | up]`` along ``dim`` -> ``gate0, up0, gate1, up1, ...`` (a copy).

    The kernels read gated weights interleaved; convert a "halves" weight once with this (for a
    (K, 2N') B that is a column-major view, e.g. ``weight.t()``, pass ``weight`` and ``dim=0``
    and transpose back, to keep it K-major)."""
    dim = dim % t.dim()
    n2 = t.shape[dim]
    if n2 % 2:
        raise ValueError(f"gated tensor needs an even size along dim {dim}, got {n2}")
    return t.unflatten(dim, (2, n2 // 2)).transpose(dim, dim + 1).flatten(dim, dim + 1).contiguous()
