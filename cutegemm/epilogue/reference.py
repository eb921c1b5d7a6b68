"""Plain-torch twins of the epilogue ops (:mod:`cutegemm.epilogue.ops`), used by ``gemm_ref`` and
the tests, and the activations' derivatives (the autograd of :mod:`cutegemm.ops` and the MoE
backward). Same formulas, same order; torch's own activation functions and aten's derivatives."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import ACTIVATIONS, GATED
from .ops import GATE_ACTIVATION, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT, UP_MAP

GATE_LAYOUTS = ("interleaved", "halves")


def activation_ref(name: str, x: torch.Tensor) -> torch.Tensor:
    """relu, gelu (erf), gelu_tanh, silu, relu_sq, tanh, sigmoid: torch's definitions; and the
    gated forms' own maps of their gate / up columns (:data:`GATE_ACTIVATION`, :data:`UP_MAP`)."""
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
    if name == "swiglu_oai_gate":
        g = x.clamp(max=SWIGLU_OAI_LIMIT)
        return g * torch.sigmoid(g * SWIGLU_OAI_ALPHA)
    if name == "swiglu_oai_up":
        return x.clamp(-SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT) + 1.0
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {name!r}")


def gated_ref(name: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """A gated form's output from its gate and up columns, act(gate) * up_map(up) (the kernels'
    ``gated_out``): act by :data:`GATE_ACTIVATION`, up_map the identity but where :data:`UP_MAP`
    names one (swiglu_oai: gpt-oss's ``g * sigmoid(1.702 g) * (u + 1)``, g = min(gate, 7), u =
    clamp(up, -7, 7))."""
    if name not in GATE_ACTIVATION:
        raise ValueError(f"gated activation must be one of {GATED}, got {name!r}")
    return activation_ref(GATE_ACTIVATION[name], gate) * up_ref(name, up)


def up_ref(name: str, up: torch.Tensor) -> torch.Tensor:
    """The gated form's map of its up column (:data:`UP_MAP`; the identity elsewhere)."""
    return activation_ref(UP_MAP[name], up) if name in UP_MAP else up


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
    :func:`gated_ref` of the gate / up columns (half the columns). ``c`` is read only when ``beta != 0``."""
    y = acc
    if alpha != 1.0:
        y = y * alpha
    if beta != 0.0:
        y = y + beta * c.to(y.dtype)
    if bias is not None:
        y = y + bias.to(y.dtype)
    if activation in GATED:
        gate, up = split_gate_up(y, gate_layout)
        return gated_ref(activation, gate, up)
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


# --- derivatives -------------------------------------------------------------------------------
def act_backward(name: str, grad: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """grad * act'(z) with aten's own derivative formulas."""
    if name == "relu":
        return torch.ops.aten.threshold_backward(grad, z, 0)
    if name == "silu":
        return torch.ops.aten.silu_backward(grad, z)
    if name == "gelu":
        return torch.ops.aten.gelu_backward(grad, z, approximate="none")
    if name == "gelu_tanh":
        return torch.ops.aten.gelu_backward(grad, z, approximate="tanh")
    if name == "tanh":  # aten's tanh / sigmoid backward take the output
        return torch.ops.aten.tanh_backward(grad, torch.tanh(z))
    if name == "sigmoid":
        return torch.ops.aten.sigmoid_backward(grad, torch.sigmoid(z))
    if name == "relu_sq":
        return grad * (2.0 * torch.relu(z))
    zero = grad.new_zeros(())  # the clamps: torch.clamp's gradient, zero where the clamp took the limit
    if name == "swiglu_oai_gate":
        s = torch.sigmoid(z.clamp(max=SWIGLU_OAI_LIMIT) * SWIGLU_OAI_ALPHA)
        d = grad * (s + SWIGLU_OAI_ALPHA * activation_ref(name, z) * (1.0 - s))
        return torch.where(z <= SWIGLU_OAI_LIMIT, d, zero)
    if name == "swiglu_oai_up":
        return torch.where((z >= -SWIGLU_OAI_LIMIT) & (z <= SWIGLU_OAI_LIMIT), grad, zero)
    raise NotImplementedError(f"no derivative for activation {name!r}")


def activation_grad(
    activation: str, g: torch.Tensor, z: torch.Tensor, gate_layout: str = "interleaved"
) -> torch.Tensor:
    """dZ = g * act'(z) in g's and z's dtype, with aten's derivative formulas. Gated activations
    (:data:`GATED`): z holds 2 * N' gate/up columns, interleaved (the kernels' layout: 2j gate j,
    2j + 1 up j) or as ``[gate | up]`` halves (``gate_layout="halves"``), and g has N' columns;
    dZ comes back in z's layout."""
    if activation in GATED:
        gate, up = split_gate_up(z, gate_layout)
        d_gate, d_up = gated_backward(activation, g, gate, up)
        if gate_layout == "halves":
            return torch.cat((d_gate, d_up), dim=-1)
        return torch.stack((d_gate, d_up), dim=-1).flatten(-2)
    return act_backward(activation, g, z)


def gated_backward(activation: str, d, gate, up, a=None):
    """(dgate, dup) of a gated form's output (:func:`gated_ref`) for its gradient d; ``a`` is
    act(gate) (:func:`gate_act`) when the caller has it."""
    act = GATE_ACTIVATION[activation]
    a = activation_ref(act, gate) if a is None else a
    d_up = d * a
    if activation in UP_MAP:
        d_up = act_backward(UP_MAP[activation], d_up, up)
    return act_backward(act, d * up_ref(activation, up), gate), d_up


def gate_act(activation, gate):
    """act(gate) of a gated form, shared by H and dZ."""
    return activation_ref(GATE_ACTIVATION[activation], gate)


def gated_h(activation, gate, up, a):
    """H of a gated form from a = act(gate)."""
    return a * up_ref(activation, up)


def gated_dz(activation, d, gate, up, a, z, gate_layout):
    """dZ of H = gated(gate, up) for the gradient d of H (a from :func:`gate_act`, all in the
    compute dtype), written straight into Z's layout and dtype."""
    dz = torch.empty_like(z)
    dz_gate, dz_up = split_gate_up(dz, gate_layout)
    d_gate, d_up = gated_backward(activation, d, gate, up, a)
    dz_up.copy_(d_up)
    dz_gate.copy_(d_gate)
    return dz
