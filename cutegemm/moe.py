"""Gated MoE experts with autograd: ``down(act(gate) * up)`` per expert on the grouped GEMMs.

:func:`grouped_experts` is what :class:`cutegemm.nn.GroupedExperts`, the expert-parallel layer and
the transformers backend run. Around it: :func:`dispatch` (the routing sorted by expert),
:func:`gather_tokens` / :func:`gather_rows` (the dispatch copy), :func:`combine` (the weighted
top-k sum); :func:`routed_experts` is the three in one autograd node that keeps less for the
backward (see there). Tokens arrive sorted by expert with ``offs`` (int32, cumulative end
row per expert, on the tokens' device), as for :func:`cutegemm.grouped_gemm`.

Which GEMM runs (:func:`grouped_mm`, the one place that decides): CUDA tensors -> the kernels
(:func:`cutegemm.grouped_gemm`); CPU tensors -> the reference twins (:func:`cutegemm.grouped_gemm_ref`,
fp32 math, fp64 for fp64 operands), so the whole autograd path runs and is tested without a GPU;
while ``torch.compile`` traces -> ``torch.ops.cutegemm.grouped_gemm`` (an opaque custom op with a
fake implementation, which dispatches to the same two by device).

Forward:
- no gradient needed (``torch.no_grad()``, inference, or nothing requires grad), weights
  interleaved: gate/up grouped GEMM with the gated activation fused into its epilogue (the
  pre-activations are never written), then the down grouped GEMM. Two launches.
- gradient needed, or ``[gate | up]`` halves (the fused epilogue reads interleaved columns; the
  kernels' ``gate_layout="halves"`` would copy the weight on every call, so this path does not
  use it): gate/up grouped GEMM -> Z (T, 2I) in the operands' dtype, ``act(gate) * up`` by
  ``ops.gated_grads`` (fp32 math, rounded to the operands' dtype) -> H (T, I), down grouped GEMM.

Backward (``_GatedExperts``): with Y = H W_down[e], H = act(gate) * up, Z = X W_gate_up[e] per expert,

    dH  = dY W_down[e]^T                       packed grouped GEMM
    H, dZ = act(gate) * up, act'(Z; dH)        one pass over Z (``ops.gated_grads``: the swiglu
                                               kernel on CUDA bf16 / fp16, else torch in fp32),
                                               dZ written in Z's layout
    dW_down[e] = H_e^T dY_e                    K-grouped grouped GEMM (in W_down's storage layout)
    dX  = dZ W_gate_up[e]^T                    packed grouped GEMM; rows past offs[-1] set to 0
    dW_gate_up[e] = X_e^T dZ_e                 K-grouped grouped GEMM (storage layout)

Save, not recompute: the forward saves Z, the pre-activations (T, 2I) in the operands' dtype
(bf16: 4 T I bytes per layer) next to X and the weights (which autograd holds anyway); H is not
saved but rebuilt from Z in the backward, next to dZ (dH and H are dropped as soon as they are
used, before dX and dW_gate_up are allocated) (the torch route holds Z in fp32 meanwhile:
8 T I bytes transient). Recomputing Z instead
would save those 4 T I bytes at the cost of a third gate/up grouped GEMM (4 T H I flops: a
training step's expert GEMMs would grow from 18 T H I to 22 T H I flops, +22%). torch's
``grouped_mm`` experts path keeps Z, act(gate) and H (about 8 T I bytes in bf16). T counts
rows of x, i.e. (token, top-k slot) pairs.

No host sync anywhere on the CUDA path (no ``.item()`` / ``.tolist()``; dX's rows past
``offs[-1]`` are zero by ``ops.packed_zero_tail``: a kernel that writes those rows only,
``torch.where`` while tracing), so a training step can be captured in a CUDA graph where the
K-grouped kernel reads offs on the device (sm_90a; sm_100a for the weight gradients' M-major x
N-major operands, compiled only; elsewhere that form loops over the experts on the host).
Deterministic: the grouped GEMMs have no split-K atomics and the torch glue is elementwise. Only
first derivatives (the backward is ``once_differentiable``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

from . import ops
from .api.face import grouped_gemm, grouped_gemm_ref
from .epilogue import GATED
from .grouped.gather import gathered_grouped_gemm, preact_route
from .grouped.k_grouped import GATHER_WIDE_TILE, grouped_k_gather
from .ops import combine_rows, gated_grads, packed_zero_tail, routed_gated_grads, sum_rows, zero_rows_past_end
from .policy import gather_pays
from .runtime.device import eager_cuda


def grouped_mm(a, b, offs, *, activation=None, out_dtype=None, gate_layout="interleaved"):
    """The packed or K-grouped grouped GEMM of the layers: the kernels on CUDA tensors, the
    reference twins on CPU tensors (fp32 math, fp64 for fp64 operands), the custom op
    ``torch.ops.cutegemm.grouped_gemm`` while ``torch.compile`` traces (interleaved only)."""
    if torch.compiler.is_compiling() or (a.is_cuda and not eager_cuda(a)):
        return torch.ops.cutegemm.grouped_gemm(a, b, offs, out_dtype=out_dtype, activation=activation)
    if a.is_cuda:
        return grouped_gemm(
            a, b, offs=offs, out_dtype=out_dtype, activation=activation, gate_layout=gate_layout
        )
    cd = torch.float64 if a.dtype == torch.float64 else torch.float32
    return grouped_gemm_ref(a, b, offs=offs, out_dtype=out_dtype or a.dtype, activation=activation,
                            gate_layout=gate_layout, compute_dtype=cd)  # fmt: skip


# The routed backward (eager CUDA, where policy.gather_pays as for the forward's up projection)
# reads x and dout through the routing index instead of gathered copies: dH' by the gathered packed
# GEMM, dW_down and dW_gate_up by the gathering K-grouped kernel in 128x256 tiles (sm_90a;
# grouped_k_gather makes the copy elsewhere). Qwen3-30B-A3B training step (H100, same rounds):
# 7.403 ms against 7.654 with the copies, peak 2051 MiB against 2563 (bench/RESULTS.md).
GATHER_WEIGHT_GRADS = True


def _weight_grad_rows(inp, grad, offs, w, rows, gathered: str) -> torch.Tensor:
    """:func:`_weight_grad` with ``inp`` (gathered "inp") or ``grad`` ("grad") given as the tokens
    whose rows ``rows`` picks (x or dout as they are): read through the index, no gathered copy,
    where the gathering kernel has its tile (``GATHER_WIDE_TILE["a"]``), else the copy. Always
    gather "a" (the gathered operand is the product's left factor: each token row's values serve
    256 output columns), the result stored in w's layout: M-major (``transposed``) where w's
    storage is the other orientation of that product (e.g. dW_gate_up = x[rows]^T dZ into an
    (E, 2I, H) weight). Qwen3-30B-A3B dW_gate_up, H100: 1.367 ms against 1.565 by gather "b"."""
    if GATHER_WIDE_TILE.get("a") is None:
        if gathered == "inp":
            return _weight_grad(inp.index_select(0, rows), grad, offs, w)
        return _weight_grad(inp, grad.index_select(0, rows), offs, w)
    w_transposed = w.mT.is_contiguous() and not w.is_contiguous()  # an (E, N, K) weight's (E, K, N) view
    store_t = w_transposed == (gathered == "inp")  # w's storage holds the product's transpose
    first, second = (inp, grad) if gathered == "inp" else (grad, inp)
    res = grouped_k_gather(first, second, offs, rows, "a", w.dtype, transposed=store_t)
    return res if (gathered == "inp") != store_t else res.mT


def _weight_grad(inp: torch.Tensor, grad: torch.Tensor, offs: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """dW[e] = inp_e^T grad_e for the b operand w (E, K, N) of ``grouped_mm(inp, w, offs)``, by the
    K-grouped form, written in w's storage layout: an (E, N, K) weight used as a transposed view
    (``nn.Linear`` style) gets dW^T = grad_e^T inp_e and comes back as its transposed view."""
    if w.mT.is_contiguous() and not w.is_contiguous():
        return grouped_mm(grad.mT, inp, offs, out_dtype=w.dtype).mT
    return grouped_mm(inp.mT, grad, offs, out_dtype=w.dtype)


def _down_grad_last(kept: int, w_down: torch.Tensor) -> bool:
    """Whether a backward computes dW_down last, after dZ's consumers (dX, dW_gate_up) and with dZ
    dropped: dW_down's operands (``kept`` elements: H or w H and the output-gradient rows) then stay
    alive beside dW_gate_up, where computing it first keeps dW_down (E x I x H) beside dZ and
    dW_gate_up; the fewer bytes at the peak. Mixtral-8x7B at 8192 tokens, 2 of 8 experts: R (I + H)
    = 302M elements against E I H = 470M, so last; from I H / (I + H) rows per expert on, first."""
    return kept < w_down.numel()


class _GatedExperts(torch.autograd.Function):
    """See the module docstring (forward: Z saved; backward: four grouped GEMMs + torch glue)."""

    @staticmethod
    def forward(ctx, x, w_gate_up, w_down, offs, activation, gate_layout):
        z = grouped_mm(x, w_gate_up, offs)  # (T, 2I) pre-activations
        h, _ = gated_grads(activation, None, z, gate_layout)  # (T, I)
        y = grouped_mm(h, w_down, offs)  # (T, H)
        ctx.save_for_backward(x, w_gate_up, w_down, offs, z)
        ctx.activation, ctx.gate_layout = activation, gate_layout
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, w_gate_up, w_down, offs, z = ctx.saved_tensors
        need_x, need_w1, need_w2 = ctx.needs_input_grad[:3]
        dx = dw1 = dw2 = None
        dy = dy.to(x.dtype).contiguous()  # the kernels' operand dtype; the packed form wants row-major
        dh = grouped_mm(dy, w_down.mT, offs) if need_x or need_w1 else None  # (T, I)
        h, dz = gated_grads(ctx.activation, dh, z, ctx.gate_layout, want_h=need_w2)  # one pass over Z
        del dh  # each temporary goes once used

        def down():  # dW_down (reads h and dy as they are when called)
            return _weight_grad(h, dy, offs, w_down)

        late = need_w2 and _down_grad_last(h.numel() + dy.numel(), w_down)
        if not late:
            dw2 = down() if need_w2 else None
            h = dy = None
        if need_x:
            dx = packed_zero_tail(dz, w_gate_up.mT, offs)
        if need_w1:
            dw1 = _weight_grad(x, dz, offs, w_gate_up)
        del dz
        if late:
            dw2 = down()
        return dx, dw1, dw2, None, None, None


def inverse_permutation(order: torch.Tensor) -> torch.Tensor:
    """inv with inv[order[r]] = r (int64), on order's device."""
    return torch.empty_like(order, dtype=torch.int64).scatter_(
        0, order.long(), torch.arange(order.numel(), device=order.device))  # fmt: skip


class _TokenGather(torch.autograd.Function):
    """rows = x[order // k]: see :func:`gather_tokens`."""

    @staticmethod
    def forward(ctx, x, order, k, rows, inverse):
        ctx.save_for_backward(order if inverse is None else inverse)
        ctx.k, ctx.inverse = k, inverse is not None
        return x.index_select(0, torch.div(order, k, rounding_mode="floor") if rows is None else rows)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (saved,) = ctx.saved_tensors
        # token t: the sum of rows inv[t k + j] (pair t k + j's row), j in slot order, in one pass
        inv = saved.to(torch.int32) if ctx.inverse else inverse_permutation(saved).to(torch.int32)
        return combine_rows(grad.contiguous(), inv, None, ctx.k)[0], None, None, None, None


class Dispatch(NamedTuple):
    """A MoE layer's routing sorted by expert (int32, on the ids' device): ``order`` the (token,
    slot) pairs ``t * k + j`` by expert (equal experts in pair order), ``rows`` their tokens
    (``order // k``), ``experts`` their experts (ids outside [0, E) as E, sorted last), ``offs``
    the cumulative end row of each expert, ``inverse`` each pair's row (``inverse[order[r]] = r``:
    :func:`combine`'s gather index)."""

    order: torch.Tensor
    rows: torch.Tensor
    experts: torch.Tensor
    offs: torch.Tensor
    inverse: torch.Tensor


def dispatch(top_k_index: torch.Tensor, num_experts: int) -> Dispatch:
    """Sort the (token, slot) pairs of ``top_k_index`` (T, k) by expert (see :class:`Dispatch`):
    a stable sort, no host sync; on CUDA with ``ops.DISPATCH_KERNEL``, one launch for up to
    ``epilogue.dispatch.MAX_PAIRS`` pairs (torch's argsort, gather and counts otherwise)."""
    if not isinstance(top_k_index, torch.Tensor):
        raise TypeError(f"top_k_index must be a torch.Tensor, got {type(top_k_index).__name__}")
    if top_k_index.dim() != 2 or top_k_index.dtype not in (torch.int32, torch.int64) or top_k_index.shape[1] == 0:
        raise ValueError(f"top_k_index must be a (tokens, k >= 1) int32 / int64 tensor, got {top_k_index.dtype} "
                         f"{tuple(top_k_index.shape)}")  # fmt: skip
    return Dispatch(*ops.dispatch(top_k_index.reshape(-1).contiguous(), top_k_index.shape[1], num_experts))


def gather_tokens(x: torch.Tensor, order: torch.Tensor, k: int, rows: torch.Tensor | None = None,
                  inverse: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """A MoE dispatch's gathered copy: row r is ``x[order[r] // k]`` for ``order`` a permutation of
    the T * k (token, slot) pairs (``argsort`` of the flattened top-k expert ids). Its backward
    sums each token's k row gradients in slot order, the same bits every run (torch's
    ``index_select`` backward adds them with atomics, in whatever order they land). ``rows``
    (``order // k``) and ``inverse`` (order's inverse permutation), when the caller has them
    (:class:`Dispatch`), are used instead of being computed."""
    if not (torch.is_grad_enabled() and x.requires_grad):
        return x.index_select(0, torch.div(order, k, rounding_mode="floor") if rows is None else rows)
    if order.numel() != x.shape[0] * k:
        raise ValueError(f"order must hold the {x.shape[0]} x {k} (token, slot) pairs, got {order.numel()}")
    return _TokenGather.apply(x, order, k, rows, inverse)


class _RowGather(torch.autograd.Function):
    """rows = x[index]: see :func:`gather_rows`."""

    @staticmethod
    def forward(ctx, x, index):
        ctx.save_for_backward(index)
        ctx.tokens = x.shape[0]
        return x.index_select(0, index)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        # each token's rows together, in row order: the routing sort with the tokens as the experts
        perm, _, _, ends, _ = ops.dispatch(index, 1, ctx.tokens)
        ptr = torch.cat((ends.new_zeros(1), ends))
        return sum_rows(grad.contiguous(), perm, ptr), None


def gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x.index_select(0, index)`` for any index (tokens may repeat any number of times or not
    at all), with a deterministic backward: each token's row gradients summed in row order in one
    pass (``ops.sum_rows``), where index_select's backward adds them with atomics. On CUDA while
    ``ops.RAGGED_KERNEL`` is off: index_select's own backward."""
    if not (torch.is_grad_enabled() and x.requires_grad) or (x.is_cuda and not ops.RAGGED_KERNEL):
        return x.index_select(0, index)
    return _RowGather.apply(x, index)


class _RowPermute(torch.autograd.Function):
    """out = y[perm]: see :func:`permute_rows`."""

    @staticmethod
    def forward(ctx, y, perm, inverse):
        ctx.save_for_backward(inverse)
        return y.index_select(0, perm)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (inverse,) = ctx.saved_tensors
        return grad.index_select(0, inverse), None, None


def permute_rows(y: torch.Tensor, perm: torch.Tensor, inverse: torch.Tensor | None = None) -> torch.Tensor:
    """``y.index_select(0, perm)`` for ``perm`` a permutation of y's rows, with a gather for its
    backward too (``grad.index_select(0, inverse)``) where index_select's own is a scatter-add over
    every row (the combine's: 2.3 of a Qwen3-30B-A3B training step's 20.7 ms on the H200).
    ``inverse``: ``inverse_permutation(perm)`` if the caller has it."""
    if perm.shape[0] != y.shape[0]:
        raise ValueError(f"perm must hold one entry per row of y ({y.shape[0]}), got {perm.shape[0]}")
    if not (torch.is_grad_enabled() and y.requires_grad):
        return y.index_select(0, perm)
    return _RowPermute.apply(y, perm, inverse_permutation(perm) if inverse is None else inverse)


def unpermute_rows(y: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """A MoE combine's unpermute: rows of ``y`` in dispatch order (row r is pair ``order[r]``) back
    in (token, slot) order (:func:`permute_rows` by ``inverse_permutation(order)``)."""
    return permute_rows(y, inverse_permutation(order), order)


def _weights_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class _Combine(torch.autograd.Function):
    """out[t] = sum_j w[t, j] y[inv[t k + j]]: see :func:`combine`."""

    @staticmethod
    def forward(ctx, y, order, k, weights, inv):
        inv = inverse_permutation(order) if inv is None else inv
        w = weights.reshape(-1).to(_weights_dtype(y.dtype)) if weights is not None else None
        out = combine_rows(y.contiguous(), inv.to(torch.int32), w, k)[0]
        # y (R rows) only for the weights' gradient: not held when the weights need none
        keep_y = weights is not None and ctx.needs_input_grad[3]
        ctx.save_for_backward(y if keep_y else None, order, inv, weights)
        ctx.k, ctx.dtype = k, y.dtype
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        y, order, inv, weights = ctx.saved_tensors
        need_y, need_w = ctx.needs_input_grad[0], weights is not None and ctx.needs_input_grad[3]
        # row r of y is pair p = order[r] of token p // k: dy[r] = w[p] dout[p // k], and
        # dw[p] = <dout[p // k], y[r]>, both in one pass over the rows
        tok = torch.div(order, ctx.k, rounding_mode="floor").to(torch.int32)
        w = weights.reshape(-1).to(_weights_dtype(ctx.dtype)).index_select(0, order) if weights is not None else None
        dy, dots = combine_rows(dout.to(ctx.dtype).contiguous(), tok, w, 1, y if need_w else None)
        dw = dots.index_select(0, inv).view(weights.shape).to(weights.dtype) if need_w else None
        return (dy if need_y else None), None, None, dw, None


def combine(y: torch.Tensor, order: torch.Tensor, k: int, weights: torch.Tensor | None = None,
            out_dtype: torch.dtype | None = None, inverse: torch.Tensor | None = None) -> torch.Tensor:
    """A MoE combine: the expert outputs ``y`` (R = T k rows in dispatch order: row r is the
    (token, slot) pair ``order[r]``) back per token, weighted by ``weights`` (T, k) (None: already
    weighted) and summed over the k slots: ``out[t] = sum_j weights[t, j] y[r(t, j)]`` (T, H),
    fp32 sums (fp64 for fp64) in slot order, rounded once to ``out_dtype`` (default y's dtype).
    In y's dtype on CUDA bf16 / fp16, one pass (``ops.combine_rows``), and its backward too (y's
    rows and the weights' gradients, no atomics): torch's unpermute, product and sum take five
    passes over the R rows. Another ``out_dtype`` takes those in torch (the sums unrounded).
    ``inverse``: order's inverse permutation when the caller has it (:class:`Dispatch`), else it
    is computed here. Differentiable in y and weights."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int (slots per token), got {k!r}")
    if order.numel() != y.shape[0] or order.numel() % k:
        raise ValueError(f"order must hold one entry per row of y ({y.shape[0]}), a multiple of k = {k}")
    if weights is not None and weights.shape != (order.numel() // k, k):
        raise ValueError(f"weights must be (tokens, k) = ({order.numel() // k}, {k}), got {tuple(weights.shape)}")
    if out_dtype is None or out_dtype == y.dtype:
        return _Combine.apply(y, order, k, weights, inverse)
    cd = torch.float64 if torch.float64 in (y.dtype, out_dtype) else torch.float32
    pairs = (unpermute_rows(y, order) if inverse is None else y.index_select(0, inverse)).view(-1, k, y.shape[1]).to(cd)
    if weights is not None:
        pairs = pairs * weights.to(cd).unsqueeze(-1)
    return pairs.sum(1).to(out_dtype)


def check_experts(x, w_gate_up, w_down, offs, activation="swiglu", gate_layout="interleaved"):
    """The argument rules of :func:`grouped_experts` (ValueError / TypeError naming the argument)."""
    if activation not in GATED:
        raise ValueError(f"activation must be one of {GATED} (gated experts), got {activation!r}")
    if gate_layout not in ("interleaved", "halves"):
        raise ValueError(f"gate_layout must be 'interleaved' or 'halves', got {gate_layout!r}")
    for name, t in (("x", x), ("w_gate_up", w_gate_up), ("w_down", w_down), ("offs", offs)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if x.dim() != 2 or w_gate_up.dim() != 3 or w_down.dim() != 3:
        raise ValueError(
            f"x must be (tokens, hidden), w_gate_up (E, hidden, 2I), w_down (E, I, hidden); got "
            f"{tuple(x.shape)}, {tuple(w_gate_up.shape)}, {tuple(w_down.shape)}"
        )
    if offs.dtype != torch.int32 or offs.dim() != 1:
        raise TypeError(f"offs must be a 1-D torch.int32 tensor, got {offs.dtype} with {offs.dim()} dims")
    devices = {t.device for t in (x, w_gate_up, w_down, offs)}
    if len(devices) > 1:
        raise ValueError(
            f"x, w_gate_up, w_down and offs must be on one device (CUDA: the kernels; CPU: the reference "
            f"twins), got {sorted(map(str, devices))}"
        )
    if w_gate_up.dtype != x.dtype or w_down.dtype != x.dtype:
        raise TypeError(
            f"x, w_gate_up and w_down must share one dtype (CUDA: bf16 or fp16), got {x.dtype}, "
            f"{w_gate_up.dtype}, {w_down.dtype}"
        )
    E, H, I2 = w_gate_up.shape
    if offs.shape[0] != E or w_down.shape[0] != E:
        raise ValueError(
            f"offs has {offs.shape[0]} entries, w_gate_up {E} experts and w_down {w_down.shape[0]}"
        )
    if x.shape[1] != H:
        raise ValueError(
            f"x (T, K={x.shape[1]}) and w_gate_up (E, K={H}, 2I) disagree on K (the hidden size)"
        )
    if I2 % 2 or w_down.shape[1:] != (I2 // 2, H):
        raise ValueError(
            f"w_down must be (E, I={I2 // 2}, hidden={H}) for w_gate_up (E, {H}, 2I={I2}), "
            f"got {tuple(w_down.shape)}"
        )


def grouped_experts(
    x, w_gate_up, w_down, offs, *, activation: str = "swiglu", gate_layout: str = "interleaved", gather_index=None,
    out_scale=None,
):
    """Gated MoE experts, differentiable: per expert e, rows [offs[e-1], offs[e]) of x get
    ``act(gate) * up`` of ``x @ w_gate_up[e]``, times ``w_down[e]``.

    Args:
        x: (T, hidden) tokens sorted by expert.
        w_gate_up: (E, hidden, 2I), the b operand of the grouped GEMM (any view it accepts, e.g.
            ``w.transpose(1, 2)`` of an (E, 2I, hidden) ``nn.Linear``-style weight); its columns
            interleave gate and up (2j gate j, 2j + 1 up j) or, with ``gate_layout="halves"``,
            are ``[gate | up]``.
        w_down: (E, I, hidden), the down projection's b operand (likewise any view).
        offs: int32 (E,) cumulative end row of each expert, on x's device.
        activation: a gated activation (config.GATED: "swiglu", "geglu", "geglu_tanh", "reglu",
            "glu", "swiglu_oai"; the one-pass SwiGLU kernels serve "swiglu", torch's formulas the
            others).
        gather_index: optional (rows,) int32 / int64: x then holds the tokens as they are and row
            r of the experts' input is ``x[gather_index[r]]`` (a MoE dispatch's token per sorted
            (token, slot) pair). Without a gradient, on CUDA, with interleaved gate/up, the up
            projection reads the rows through the index (``cutegemm.grouped.gather``: no permuted
            copy of x); otherwise this makes the copy (:func:`gather_rows`, whose backward sums
            each token's row gradients in row order, deterministic).
        out_scale: optional fp32 (rows,): output row r times ``out_scale[r]`` (a MoE layer's
            routing weight of each sorted (token, slot) row), rounded once to x's dtype: in the
            down projection's epilogue without a gradient on CUDA (``scale_a`` of the grouped
            GEMM), else here, differentiable in torch.

    Returns (T, hidden) in x's dtype; rows at or past offs[-1] are unspecified (not written on
    CUDA) and get a zero gradient. Gradients flow to x, w_gate_up and w_down (see the module
    docstring for what is saved and how the backward runs).
    """
    check_experts(x, w_gate_up, w_down, offs, activation, gate_layout)
    if out_scale is not None:
        rows = x.shape[0] if gather_index is None else getattr(gather_index, "shape", (None,))[0]
        if not isinstance(out_scale, torch.Tensor) or not out_scale.is_floating_point():
            raise TypeError(f"out_scale must be a floating-point tensor, got {getattr(out_scale, 'dtype', type(out_scale).__name__)}")
        if out_scale.shape != (rows,):
            raise ValueError(f"out_scale must hold one value per row, shape ({rows},), got {tuple(out_scale.shape)}")
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or w_gate_up.requires_grad or w_down.requires_grad
    )
    if gather_index is not None and (needs_grad or gate_layout != "interleaved"
                                     or not _gather_in_loads(x, gather_index, w_gate_up.shape[0])):  # fmt: skip
        x, gather_index = gather_rows(x, gather_index), None
    if needs_grad:
        return _scaled(_GatedExperts.apply(x, w_gate_up, w_down, offs, activation, gate_layout), out_scale)
    h = _gated_up(x, gather_index, w_gate_up, offs, activation, gate_layout)
    if (out_scale is not None and eager_cuda(x)
            and not (torch.is_grad_enabled() and out_scale.requires_grad)):  # fmt: skip
        return grouped_gemm(h, w_down, offs=offs, scale_a=out_scale.float())  # in the epilogue
    return _scaled(grouped_mm(h, w_down, offs), out_scale)


class _RoutedExperts(torch.autograd.Function):
    """out = combine(experts(x[rows]), weights) in one node: see :func:`routed_experts`."""

    @staticmethod
    def forward(ctx, x, weights, w_gate_up, w_down, order, rows, offs, inverse, k, activation, gate_layout):
        z, h = _gathered_gated(x, rows, w_gate_up, offs, activation, gate_layout)  # rows past offs[-1] unspecified
        y = _with_zero_row(h, w_down, offs)  # (R + 1, H) unweighted, row R zero
        del h
        out, inv = _routed_combine(y, weights, rows, offs, inverse, k)
        ctx.save_for_backward(x, weights, w_gate_up, w_down, order, rows, offs, inv, z)
        ctx.k, ctx.activation, ctx.gate_layout = k, activation, gate_layout
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        x, weights, w_gate_up, w_down, order, rows, offs, inv, z = ctx.saved_tensors
        need_x, need_w, need_w1, need_w2 = ctx.needs_input_grad[:4]
        dx = dw = dw1 = dw2 = None
        cd = _weights_dtype(x.dtype)
        wr = weights.reshape(-1).to(cd).index_select(0, order)  # (R,): each row's routing weight
        # y_r = H_r W_down: dY_r = w_r dout[t_r] = w_r dY'_r, so dH_r = w_r dY'_r W_down^T = w_r dH'_r and
        # dw_r = <dout[t_r], y_r> = <dH'_r, H_r> (no y saved); dW_down = sum_r (w_r H_r)^T dY'_r.
        # w H, dZ and the dots in one row pass (ops.routed_gated_grads). Rows past offs[-1] hold
        # unspecified values no GEMM and no gather of the pairs reads (inv: the zero row).
        dout = dout.to(x.dtype).contiguous()
        gk = GATHER_WEIGHT_GRADS and _gather_in_loads(x, rows, offs.shape[0])  # as the forward's up projection
        dyp = None if gk else dout.index_select(0, rows)  # (R, H): dY'
        dhp = _gathered_mm(dout, rows, w_down.mT, offs) if gk else grouped_mm(dyp, w_down.mT, offs)  # (R, I): dH'
        wh, dz, dots = routed_gated_grads(ctx.activation, dhp, z, wr, ctx.gate_layout)
        del dhp
        if need_w:
            dots = torch.cat((dots, dots.new_zeros(1)))  # row R: the pairs outside [0, E)
            dw = dots.index_select(0, inv).view(weights.shape).to(weights.dtype)

        def down():  # dW_down (reads wh and dyp as they are when called)
            if gk:
                return _weight_grad_rows(wh, dout, offs, w_down, rows, "grad")
            return _weight_grad(wh, dyp, offs, w_down)

        late = need_w2 and _down_grad_last(wh.numel() + (0 if dyp is None else dyp.numel()), w_down)
        if not late:
            dw2 = down() if need_w2 else None
            wh = dyp = None
        if need_x:  # each token's k row gradients, summed in slot order
            dx = combine_rows(_with_zero_row(dz, w_gate_up.mT, offs), inv, None, ctx.k)[0]
        if need_w1:
            if gk:
                dw1 = _weight_grad_rows(x, dz, offs, w_gate_up, rows, "inp")
            else:
                dw1 = _weight_grad(x.index_select(0, rows), dz, offs, w_gate_up)  # the gathered rows again
        del dz
        if late:
            dw2 = down()
        return dx, dw, dw1, dw2, None, None, None, None, None, None, None


def _routed_combine(y, weights, rows, offs, inverse, k):
    """The routed layer's combine of y (R + 1, H: the down projection's rows and a zero row R):
    (out, its row index per pair). The pairs routed outside [0, E) (rows past offs[-1]) read row R."""
    end = offs[-1] if offs.numel() else 0  # no experts: every pair reads the zero row
    inv = torch.where(inverse < end, inverse, rows.shape[0]).to(torch.int32)
    return combine_rows(y, inv, weights.reshape(-1).to(_weights_dtype(y.dtype)), k)[0], inv


def _routed_inference(x, weights, w_gate_up, w_down, routing, k, activation, gate_layout):
    """:func:`routed_experts` without a gradient: H alone from the up projection's fused gated
    epilogue (interleaved gate / up; through the row index where it pays), so Z (R x 2I) is never
    written; ``[gate | up]`` halves: Z, then the SwiGLU pass."""
    rows, offs = routing.rows, routing.offs
    h = _gated_up(x, rows, w_gate_up, offs, activation, gate_layout)
    y = _with_zero_row(h, w_down, offs)
    del h
    return _routed_combine(y, weights, rows, offs, routing.inverse, k)[0]


def _with_zero_row(a, b, offs):
    """The packed grouped GEMM ``a[rows_e] @ b[e]`` (rows past offs[-1] unspecified) and one zero
    row after them: (R + 1, N). Eager CUDA: the kernel writes into the first R rows of the buffer,
    only row R is zeroed; otherwise a concatenation."""
    if eager_cuda(a):
        out = torch.empty(a.shape[0] + 1, b.shape[-1], dtype=a.dtype, device=a.device)
        out[-1].zero_()
        grouped_gemm(a, b, offs=offs, out=out[:-1])
        return out
    y = grouped_mm(a, b, offs)
    return torch.cat((y, y.new_zeros(1, y.shape[1])))


def _gather_in_loads(x, rows, experts: int) -> bool:
    """Whether the up projection reads x's rows through the index (the gather kernel: eager CUDA,
    where policy.gather_pays) rather than from a gathered copy."""
    return eager_cuda(x) and gather_pays(x.shape[1], rows.shape[0], experts)


def _gathered_mm(x, rows, w, offs):
    """x[rows] W[e] (the up projection's Z, the backward's dH'): through the row index in the
    packed GEMM's loads (:func:`_gather_in_loads`), else a transient gathered copy."""
    if _gather_in_loads(x, rows, offs.shape[0]):
        return grouped_gemm(x, w, offs=offs, gather_index=rows)
    return grouped_mm(x.index_select(0, rows), w, offs)


def _gated_up(x, rows, w, offs, activation, gate_layout):
    """H = act(gate) * up of the up projection on x (``rows`` given: on x[rows]) without a gradient:
    interleaved gate / up, the fused gated epilogue (Z never written), reading x through the row
    index where it pays (:func:`_gather_in_loads`), else from a gathered copy; ``[gate | up]``
    halves, Z and then the SwiGLU pass."""
    if gate_layout == "interleaved":
        if rows is not None and _gather_in_loads(x, rows, offs.shape[0]):
            return grouped_gemm(x, w, offs=offs, activation=activation, gather_index=rows)
        return grouped_mm(x if rows is None else x.index_select(0, rows), w, offs, activation=activation)
    z = grouped_mm(x, w, offs) if rows is None else _gathered_mm(x, rows, w, offs)
    return gated_grads(activation, None, z, gate_layout)[0]


def _gathered_gated(x, rows, w, offs, activation, gate_layout):
    """(Z, H) of the up projection on x[rows]: Z (R, 2I) and H = act(gate) * up (R, I). One launch
    writes both where the gather kernel stores the values before the gate (``preact_route``:
    sm_90a, interleaved gate / up; H then comes from the fp32 accumulators), else Z and the
    SwiGLU row pass over it."""
    if gate_layout == "interleaved" and _gather_in_loads(x, rows, offs.shape[0]) and preact_route(x, w, offs, activation):
        z = torch.empty(rows.shape[0], w.shape[2], dtype=x.dtype, device=x.device)
        h = gathered_grouped_gemm(x, w, gather_index=rows, run=None, offs=offs, activation=activation, preact_out=z)
        return z, h
    z = _gathered_mm(x, rows, w, offs)
    return z, gated_grads(activation, None, z, gate_layout)[0]


def routed_experts(x, top_k_index, top_k_weights, w_gate_up, w_down, *, activation: str = "swiglu",
                   gate_layout: str = "interleaved", routing: Dispatch | None = None):  # fmt: skip
    """A routed MoE expert layer in one autograd node: ``out[t] = sum_j top_k_weights[t, j] *
    expert_{top_k_index[t, j]}(x[t])`` with gated experts as :func:`grouped_experts` (weights as
    there), the routing sorted by :func:`dispatch` (or ``routing``, its result), the combine as
    :func:`combine`. Slots whose expert is outside [0, E) contribute nothing. The up projection
    writes Z and H in one launch where it reads x through the routing index (sm_90a, interleaved
    gate / up: :func:`_gathered_gated`). Without a gradient (no_grad, or no input requiring one)
    there is no node and no Z: H from the fused gated epilogue (:func:`_routed_inference`).

    What it keeps for the backward: x, Z (R = T k rows of 2I pre-activations) and the routing; not
    the gathered rows (R x H) nor the expert outputs (R x H), which ``grouped_experts`` after
    :func:`gather_tokens` and :func:`combine` keep (bf16: 4 R I + 2 T H bytes instead of
    4 R I + 4 R H). The backward gathers the rows again for dW_gate_up and gets the routing
    weights' gradient from dH' and H (``<dout[t], y_r> = <dout[t] W_down^T, H_r>``), so it makes
    no extra GEMM: its cost is one row pass over R x I (``ops.routed_gated_grads``: w H, dZ and the
    dots from dH', Z and w; the swiglu kernel on CUDA bf16 / fp16) and the gather. Gradients flow
    to x, top_k_weights, w_gate_up and w_down; deterministic (no atomics)."""
    for name, t in (("x", x), ("top_k_index", top_k_index), ("top_k_weights", top_k_weights)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if top_k_index.dim() != 2 or top_k_weights.shape != top_k_index.shape or x.shape[0] != top_k_index.shape[0]:
        raise ValueError(f"x (T, H), top_k_index and top_k_weights (T, k) must agree, got {tuple(x.shape)}, "
                         f"{tuple(top_k_index.shape)}, {tuple(top_k_weights.shape)}")  # fmt: skip
    if top_k_weights.device != x.device or top_k_index.device != x.device or not top_k_weights.is_floating_point():
        raise ValueError(f"top_k_index and top_k_weights (floating point) must be on x's device {x.device}, got "
                         f"{top_k_index.device} and {top_k_weights.dtype} on {top_k_weights.device}")  # fmt: skip
    if top_k_index.shape[1] == 0:  # no slots: every token's sum is empty (zeros; gradients zero / none)
        no_rows = torch.zeros(getattr(w_gate_up, "shape", (0,))[0], dtype=torch.int32, device=x.device)  # all empty
        check_experts(x, w_gate_up, w_down, no_rows, activation, gate_layout)
        return x[:, :0].sum(-1, keepdim=True).expand(x.shape).contiguous()  # zeros, x's zero gradient (no NaN)
    routing = dispatch(top_k_index, w_gate_up.shape[0]) if routing is None else routing
    if routing.order.numel() != top_k_index.numel():
        raise ValueError(f"routing sorts {routing.order.numel()} (token, slot) pairs, top_k_index has "
                         f"{top_k_index.numel()}: pass the dispatch of this top_k_index")  # fmt: skip
    check_experts(x, w_gate_up, w_down, routing.offs, activation, gate_layout)
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in (x, top_k_weights, w_gate_up, w_down))):
        return _routed_inference(x, top_k_weights, w_gate_up, w_down, routing, top_k_index.shape[1], activation,
                                 gate_layout)  # fmt: skip
    return _RoutedExperts.apply(x, top_k_weights, w_gate_up, w_down, routing.order, routing.rows, routing.offs,
                                routing.inverse, top_k_index.shape[1], activation, gate_layout)  # fmt: skip


def _scaled(y: torch.Tensor, out_scale) -> torch.Tensor:
    """y's rows times out_scale in fp32 (fp64 for fp64), rounded once to y's dtype (differentiable)."""
    if out_scale is None:
        return y
    return (y.to(torch.promote_types(y.dtype, torch.float32)) * out_scale.unsqueeze(-1)).to(y.dtype)


__all__ = ["grouped_experts", "routed_experts", "grouped_mm", "check_experts", "Dispatch", "dispatch", "gather_tokens", "permute_rows",
           "unpermute_rows", "inverse_permutation", "zero_rows_past_end", "combine", "gather_rows"]
