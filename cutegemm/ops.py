"""torch.library custom ops: ``torch.ops.cutegemm.gemm`` and ``torch.ops.cutegemm.grouped_gemm``
(plus ``cutegemm::quantize`` / ``cutegemm::gemm_quantized`` and their BlockScaledTensor wrappers
``quantize`` / ``gemm_quantized``: see :mod:`cutegemm.dense.quantized`).

Registering them makes cutegemm usable inside ``torch.compile(fullgraph=True)`` (each op has a
fake implementation: output shape and dtype from the input shapes alone, never from offs'
contents) and differentiable (``torch.library.register_autograd``). Importing this module only
registers; it queries no device (``import cutegemm`` leaves it out: ``import cutegemm.ops``, or
``cutegemm.moe`` / ``cutegemm.nn``, which use the ops).

Schemas::

    cutegemm::gemm(Tensor a, Tensor b, Tensor? bias=None, *, float alpha=1.0,
                   ScalarType? out_dtype=None, str? activation=None) -> Tensor
    cutegemm::grouped_gemm(Tensor a, Tensor b, Tensor offs, *, float alpha=1.0,
                           ScalarType? out_dtype=None, str? activation=None) -> Tensor

Devices:
- CUDA: :func:`cutegemm.gemm` / :func:`cutegemm.grouped_gemm` (our kernels). Operands must be
  bf16 or fp16 (``a.dtype == b.dtype``), out_dtype bf16 / fp16 / fp32, and everything else those
  functions require (16-byte aligned strides, offs int32 on the GPU, ...).
- CPU: the plain-torch twins (``gemm_ref`` / ``grouped_gemm_ref``), so the ops, their fake
  implementations and their autograd are testable without a GPU. The CPU path also accepts
  float32 and float64 operands (float64 is computed in float64, so ``gradcheck`` works); the CUDA
  path does not.
- Host cost: a call that needs no gradient, on plain tensors of one device, runs the device's
  function straight from our AutogradCPU / AutogradCUDA kernel (one Python kernel where custom_op
  has two); every other call goes through custom_op's own Autograd kernel. The quantized ops of
  :mod:`cutegemm.quant_ops` (quantize, gemm_quantized, gemm_blockscaled, gemm_fp4_weight) take the
  same path once this module is imported.

``gemm``: ``act(alpha * (a @ b) + bias)`` (no ``beta * c`` / gate_layout: use :func:`cutegemm.gemm`), a (M, K) or (L, M, K), b (K, N) or (L, K, N), bias (N,)
(gated activations: b and bias have 2 * N' columns, interleaved gate/up, out has N'), activation
None or one of config.ACTIVATIONS / config.GATED. out_dtype defaults to a.dtype.

``grouped_gemm`` (form chosen by b's rank):
- packed MoE: a (T, K), b (E, K, N), offs int32 (E,) cumulative END rows -> (T, N); with an
  ``activation`` (packed form only: any of config.ACTIVATIONS, or of config.GATED over b's
  interleaved gate/up columns -> (T, N / 2)) applied in the kernel's epilogue.
  Contract: rows at or past ``offs[-1]`` of the result are UNSPECIFIED (the CUDA kernel does not
  write them: the output is ``torch.empty``, no memset; the CPU twin happens to give zeros).
  Compare / consume only rows < offs[-1]; before anything that mixes rows (a dense layer's
  weight gradient, a norm over tokens) zero them graph-safely, e.g.
  ``torch.where(torch.arange(T, device=d)[:, None] < offs[-1], y, 0)``. Graph-capturable on
  CUDA (no host sync), including replay with new offs contents.
- K-grouped: a (M, T), b (T, N), offs (E,) splitting T -> (E, M, N); an expert with no rows gets
  zeros. Offs read on the device (graph-capturable): sm_90a one kernel launch; sm_100a, a
  M-major and b N-major (the weight gradient's layouts), the list-form kernel on a table written
  from offs. Otherwise offs read on the host (see :mod:`cutegemm.grouped.k_grouped`).

Autograd (``Y = act(Z)``, ``Z = alpha * a @ b + bias``):
- gemm: ``dZ = dY * act'(Z)`` with Z recomputed in fp32 (fp64 for fp64 operands) by this same
  op (activation=None, so the pre-activation is not stored); every activation, gated ones
  included, is differentiated (aten's relu/silu/gelu backward formulas). ``da = alpha * dZ @ b^T``,
  ``db = alpha * a^T @ dZ`` (batch-broadcast operands summed over the batch), both through
  ``cutegemm::gemm`` with dZ cast to a.dtype (the kernels' operand dtype); ``dbias = dZ`` summed
  over every row, from the fp32 dZ.
- packed grouped_gemm: ``da = grouped_gemm(dZ, b^T, offs)`` (packed form) with rows at or past
  offs[-1] set to ZERO (those output rows do not depend on a; their dY is ignored, never read),
  ``db = grouped_gemm(a^T, dZ, offs)`` (K-grouped form, (E, K, N)); an expert with no rows gets
  a zero db[e]. With an activation, dZ = dY * act'(Z) with Z recomputed by this op in fp32 (as
  for gemm). Graph-capturable where the K-grouped form is (sm_90a; sm_100a compiled only).
- K-grouped grouped_gemm: ``da^T = grouped_gemm(b, dY^T, offs)`` and ``db = grouped_gemm(a^T, dY,
  offs)``, both packed; columns/rows of T past offs[-1] get zero gradient.
- offs, alpha, out_dtype, activation: no gradient.
The backward formulas call only these custom ops plus plain aten ops, so they trace under
torch.compile and run on both devices.

CUDA graphs (``torch.cuda.graph``; tests/gpu/test_ops_gpu.py): the forward of ``gemm`` and of the
packed ``grouped_gemm`` (alone or inside a model, e.g. an MoE block) can be captured and replayed
with new input contents and new offs contents (same shapes). Call each signature once eagerly
before capturing (on a side stream, as torch recommends): the first call compiles or loads the
kernel. The K-grouped form (and so the packed form's backward) is capturable where it reads offs
on the device (see above).
With autotuning on (:mod:`cutegemm.tuning`) a signature is never tuned during a capture.
"""

from typing import Optional

import torch

try:  # private (custom_op's own Autograd kernel); without it the ops keep custom_op's path only
    from torch._library.autograd import make_autograd_impl
except ImportError:
    make_autograd_impl = None

from .epilogue import ACTIVATIONS, GATED, split_gate_up
from .epilogue.combine import combine_rows_cuda
from .epilogue.combine import kernel_takes as combine_takes
from .epilogue.dispatch import dispatch_cuda, dispatch_ref
from .epilogue.dispatch import kernel_takes as dispatch_takes
from .epilogue.gated_grads import gated_grads_cuda, kernel_takes
from .epilogue.reference import activation_grad, gate_act, gated_dz, gated_h
from .epilogue.routed_grads import kernel_takes as routed_takes
from .epilogue.routed_grads import routed_grads_cuda
from .epilogue.zero_tail import kernel_takes as zero_tail_takes
from .epilogue.zero_tail import zero_tail_cuda
from .gemm.dense import gemm as _gemm_kernel
from .gemm.dense import gemm_ref as _gemm_ref
from .grouped.packed import grouped_gemm as _grouped_kernel
from .grouped.packed import grouped_gemm_ref as _grouped_ref
from .quant_ops import CPU_DTYPES, check_gemm_operands, gemm_quantized, quantize
from .quant_ops import CUDA_FUNCTIONS as QUANT_CUDA_FUNCTIONS
from .runtime.device import eager_cuda

# bias is positional-or-keyword, not keyword-only: torch.library.custom_op refuses keyword-only
# Tensor arguments (and its autograd would not differentiate them).
GEMM_SCHEMA = (
    "(Tensor a, Tensor b, Tensor? bias=None, *, float alpha=1.0, ScalarType? out_dtype=None, "
    "str? activation=None) -> Tensor"
)
GROUPED_SCHEMA = (
    "(Tensor a, Tensor b, Tensor offs, *, float alpha=1.0, ScalarType? out_dtype=None, "
    "str? activation=None) -> Tensor"
)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# ----------------------------------------------------------------------------------------------
# validation shared by the CPU and fake implementations (the CUDA functions validate themselves)


def _check_gemm(a, b, out_dtype, bias, activation):
    """Returns the result's shape."""
    if out_dtype is not None and out_dtype not in CPU_DTYPES:
        raise TypeError(f"out_dtype must be one of {CPU_DTYPES} (CUDA: bf16/fp16/fp32), got {out_dtype}")
    return check_gemm_operands(a, b, bias, activation)


def _check_grouped(a, b, offs, out_dtype, activation=None):
    """Returns the result's shape."""
    if not isinstance(offs, torch.Tensor) or offs.dtype != torch.int32 or offs.dim() != 1:
        raise TypeError("offs must be a 1-D torch.int32 tensor")
    if a.dim() != 2 or b.dim() not in (2, 3):
        raise ValueError(f"a must have 2 dims and b 2 or 3, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.dtype not in CPU_DTYPES or b.dtype != a.dtype:
        raise TypeError(
            f"a and b must share one of {CPU_DTYPES} (CUDA: bf16/fp16), got {a.dtype} and {b.dtype}"
        )
    if out_dtype is not None and out_dtype not in CPU_DTYPES:
        raise TypeError(f"out_dtype must be one of {CPU_DTYPES} (CUDA: bf16/fp16/fp32), got {out_dtype}")
    if activation is not None and activation not in (*ACTIVATIONS, *GATED):
        raise ValueError(f"activation must be None or one of {(*ACTIVATIONS, *GATED)}, got {activation!r}")
    if b.dim() == 3:  # packed
        if a.shape[1] != b.shape[1]:
            raise ValueError(f"a (T, K={a.shape[1]}) and b (E, K={b.shape[1]}, N) disagree on K")
        if offs.shape[0] != b.shape[0]:
            raise ValueError(f"offs has {offs.shape[0]} entries but b has {b.shape[0]} experts")
        n = b.shape[2]
        if activation in GATED:
            if n % 2:
                raise ValueError(f"a gated activation needs b with an even number of columns, got {n}")
            n //= 2
        return (a.shape[0], n)
    if activation is not None:
        raise ValueError("the K-grouped form (b 2-D) takes no activation")
    if a.shape[1] != b.shape[0]:  # K-grouped
        raise ValueError(f"a (M, T={a.shape[1]}) and b (T={b.shape[0]}, N) disagree on T")
    return (offs.shape[0], a.shape[0], b.shape[1])


# ----------------------------------------------------------------------------------------------
# cutegemm::gemm


@torch.library.custom_op("cutegemm::gemm", mutates_args=(), device_types="cpu", schema=GEMM_SCHEMA)
def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    alpha: float = 1.0,
    out_dtype: Optional[torch.dtype] = None,
    activation: Optional[str] = None,
) -> torch.Tensor:
    """``act(alpha * (a @ b) + bias)``; see the module docstring. (This body is the CPU kernel.)"""
    _check_gemm(a, b, out_dtype, bias, activation)
    return _gemm_ref(
        a, b, out_dtype=out_dtype or a.dtype, alpha=alpha, bias=bias, activation=activation,
        compute_dtype=_compute_dtype(a.dtype),
    )  # fmt: skip


@gemm.register_kernel("cuda")
def _gemm_cuda(a, b, bias=None, *, alpha=1.0, out_dtype=None, activation=None):
    return _gemm_kernel(a, b, out_dtype=out_dtype, alpha=alpha, bias=bias, activation=activation)


@gemm.register_fake
def _gemm_fake(a, b, bias=None, *, alpha=1.0, out_dtype=None, activation=None):
    shape = _check_gemm(a, b, out_dtype, bias, activation)
    return a.new_empty(shape, dtype=out_dtype or a.dtype)


def _gemm_setup_context(ctx, inputs, keyword_only_inputs, output):
    a, b, bias = inputs
    ctx.alpha = keyword_only_inputs.get("alpha", 1.0)
    ctx.activation = keyword_only_inputs.get("activation")
    ctx.has_bias = bias is not None
    ctx.save_for_backward(a, b, bias)


def _pre_activation_grad(a, b, bias, alpha, activation, grad):
    """dZ in the compute dtype (fp32, or fp64 for fp64 operands)."""
    cd = _compute_dtype(a.dtype)
    g = grad.to(cd)
    if activation is None:
        return g
    z = torch.ops.cutegemm.gemm(a, b, bias, alpha=alpha, out_dtype=cd)  # recomputed pre-activation
    return activation_grad(activation, g, z)


def _on_kernels(t: torch.Tensor) -> bool:
    """A CUDA bf16 / fp16 tensor: the MoE glue ops' custom-op route (their kernels where they
    take the operands, torch inside the op otherwise)."""
    return t.is_cuda and t.dtype in (torch.bfloat16, torch.float16)


# swiglu's H / dZ by one elementwise kernel (cutegemm.epilogue.gated_grads) on CUDA bf16 / fp16
# (tests/gpu/test_gated_grads_gpu.py; on the H100 it took the Qwen3-30B-A3B layer's fwd+bwd from
# 17.1 to 11.5 ms). False: the torch formulas below.
FUSED_GATED = True


def gated_grads(activation: str, dh: torch.Tensor | None, z: torch.Tensor, gate_layout: str = "interleaved",
                want_h: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(H, dZ) of a gated activation H = act(gate) * up from its pre-activations Z and, unless
    None, dH: one compute-dtype copy of Z, act(gate) shared by H and dZ's up half, dZ written
    straight into Z's layout and dtype. The values (and bits) of ``act(gate) * up`` rounded to Z's
    dtype and of :func:`activation_grad` rounded likewise, with fewer passes over memory. With
    FUSED_GATED, CUDA bf16 / fp16 swiglu calls go through ``torch.ops.cutegemm.swiglu[_grads]``
    (opaque to torch.compile), which run the one-pass kernel where it takes the operands (within
    an fp32 rounding of these) and these formulas otherwise."""
    if FUSED_GATED and activation == "swiglu" and _on_kernels(z):
        if dh is None:
            return torch.ops.cutegemm.swiglu(z, gate_layout), None
        h, dz = torch.ops.cutegemm.swiglu_grads(dh, z, gate_layout)
        return (h if want_h else None), dz
    return _gated_grads_torch(activation, dh, z, gate_layout, want_h)


def _gated_grads_torch(activation, dh, z, gate_layout, want_h=True):
    cd = _compute_dtype(z.dtype)
    gate, up = split_gate_up(z.to(cd), gate_layout)
    a = gate_act(activation, gate)
    h = gated_h(activation, gate, up, a).to(z.dtype).contiguous() if want_h else None  # row-major, as the kernel's
    if dh is None:
        return h, None
    return h, gated_dz(activation, dh.to(cd), gate, up, a, z, gate_layout).contiguous()


@torch.library.custom_op("cutegemm::swiglu", mutates_args=())
def swiglu(z: torch.Tensor, gate_layout: str) -> torch.Tensor:
    """H = silu(gate) * up of Z (T, 2I): the kernel where it takes Z (kernel_takes), else torch."""
    if kernel_takes("swiglu", None, z):
        return gated_grads_cuda(None, z, gate_layout)[0]
    return _gated_grads_torch("swiglu", None, z, gate_layout)[0]


@torch.library.custom_op("cutegemm::swiglu_grads", mutates_args=())
def swiglu_grads(dh: torch.Tensor, z: torch.Tensor, gate_layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(H, dZ) of swiglu from Z (T, 2I) and dH (T, I), as :func:`swiglu`."""
    if kernel_takes("swiglu", dh, z):
        return gated_grads_cuda(dh, z, gate_layout)
    return _gated_grads_torch("swiglu", dh, z, gate_layout)


@swiglu.register_fake
def _(z, gate_layout):
    return z.new_empty(z.shape[:-1] + (z.shape[-1] // 2,))


@swiglu_grads.register_fake
def _(dh, z, gate_layout):
    return z.new_empty(z.shape[:-1] + (z.shape[-1] // 2,)), z.new_empty(z.shape)


def routed_gated_grads(activation: str, dhp: torch.Tensor, z: torch.Tensor, w: torch.Tensor,
                       gate_layout: str = "interleaved") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A routed MoE layer's backward between its GEMMs, from the unweighted dH' (R, I), the
    pre-activations Z (R, 2I) and each row's routing weight w (R,): ``(w H, dZ, <dH', H>)`` with
    H = act(gate) * up, dZ the gated activation's gradient for dH = w dH' in Z's layout and dtype,
    the dots in fp32 (fp64 for fp64). fp32 math, each output rounded once. With FUSED_GATED, CUDA
    bf16 / fp16 swiglu calls go through ``torch.ops.cutegemm.routed_swiglu_grads`` (opaque to
    torch.compile): one row pass (cutegemm.epilogue.routed_grads) where it takes the operands,
    these formulas otherwise."""
    if FUSED_GATED and activation == "swiglu" and _on_kernels(z):
        return torch.ops.cutegemm.routed_swiglu_grads(dhp, z, w.to(torch.float32), gate_layout)
    return _routed_grads_torch(activation, dhp, z, w, gate_layout)


def _routed_grads_torch(activation, dhp, z, w, gate_layout):
    cd = _compute_dtype(z.dtype)
    gate, up = split_gate_up(z.to(cd), gate_layout)
    a = gate_act(activation, gate)
    h = gated_h(activation, gate, up, a)
    g = dhp.to(cd)
    wc = w.to(cd).unsqueeze(-1)
    dz = gated_dz(activation, g * wc, gate, up, a, z, gate_layout)
    return (h * wc).to(z.dtype).contiguous(), dz.contiguous(), (g * h).sum(-1)  # row-major, as the kernel's


@torch.library.custom_op("cutegemm::routed_swiglu_grads", mutates_args=())
def routed_swiglu_grads(dhp: torch.Tensor, z: torch.Tensor, w: torch.Tensor,
                        gate_layout: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(w H, dZ, dots) of swiglu's routed backward (:func:`routed_gated_grads`): the kernel where it
    takes the operands (kernel_takes), else torch."""
    if routed_takes(dhp, z, w):
        return routed_grads_cuda(dhp, z, w, gate_layout)
    return _routed_grads_torch("swiglu", dhp, z, w, gate_layout)


@routed_swiglu_grads.register_fake
def _(dhp, z, w, gate_layout):  # w H in Z's dtype, the dots fp32 (fp64 for fp64)
    return z.new_empty(dhp.shape), z.new_empty(z.shape), z.new_empty(z.shape[0], dtype=_compute_dtype(z.dtype))


def combine_rows(src: torch.Tensor, idx: torch.Tensor, w: torch.Tensor | None, k: int,
                 other: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A MoE layer's row combine, ``out[i] = sum_{j<k} w[i k + j] * src[idx[i k + j]]`` (w None: all
    ones), fp32 sums in slot order rounded once to src's dtype; with ``other`` (k = 1) also
    ``dots[i] = <src[idx[i]], other[i]>`` (fp32; fp64 for fp64). Returns (out, dots or None). CUDA bf16 / fp16
    calls go through ``torch.ops.cutegemm.combine_rows[_dot]`` (opaque to torch.compile), which
    run the one-pass kernel (cutegemm.epilogue.combine) where it takes the operands; the same
    formulas in torch otherwise. idx int32, w fp32 (fp64 for fp64 src)."""
    if _on_kernels(src):
        if other is not None:
            return torch.ops.cutegemm.combine_rows_dot(src, idx, w, other)
        return torch.ops.cutegemm.combine_rows(src, idx, w, k), None
    return _combine_rows_torch(src, idx, w, k, other)


def _combine_rows_torch(src, idx, w, k, other=None):
    cd = _compute_dtype(src.dtype)
    rows = src.index_select(0, idx.long()).to(cd)
    dots = (rows * other.to(cd)).sum(1) if other is not None else None  # fp32 (fp64 for fp64)
    if w is not None:
        rows = rows * w.to(cd).unsqueeze(1)
    return rows.view(idx.numel() // max(k, 1), k, src.shape[1]).sum(1).to(src.dtype), dots


# moe.gather_rows' backward by the ragged row-combine kernel (ops.sum_rows) on CUDA: each token's
# row gradients summed in row order, bitwise reproducible (tests/gpu/test_combine_gpu.py's ragged
# cases and compute-sanitizer memcheck passed on an H100). False: index_select's own backward
# (index_add: atomics, not bitwise reproducible).
RAGGED_KERNEL = True


def sum_rows(src: torch.Tensor, idx: torch.Tensor, ptr: torch.Tensor) -> torch.Tensor:
    """Segment sums of gathered rows: ``out[i] = sum_{j in [ptr[i], ptr[i+1])} src[idx[j]]``
    (fp32 sums in j order, rounded once to src's dtype; empty segments zero). idx and ptr int32.
    CUDA bf16 / fp16 go through ``torch.ops.cutegemm.sum_rows`` (the ragged row-combine kernel
    where it takes the operands, ``torch.segment_reduce`` otherwise)."""
    if _on_kernels(src):
        return torch.ops.cutegemm.sum_rows(src, idx, ptr)
    return _sum_rows_torch(src, idx, ptr)


def _sum_rows_torch(src, idx, ptr):
    rows = src.index_select(0, idx.long()).to(_compute_dtype(src.dtype))
    return torch.segment_reduce(rows, "sum", offsets=ptr.long(), axis=0).to(src.dtype)


@torch.library.custom_op("cutegemm::sum_rows", mutates_args=())
def _sum_rows_op(src: torch.Tensor, idx: torch.Tensor, ptr: torch.Tensor) -> torch.Tensor:
    if combine_takes(src, idx, ptr) and ptr.dtype == torch.int32:
        return combine_rows_cuda(src, idx, None, 1, ptr=ptr)[0]
    return _sum_rows_torch(src, idx, ptr)


@_sum_rows_op.register_fake
def _(src, idx, ptr):
    return src.new_empty(ptr.shape[0] - 1, src.shape[1])


@torch.library.custom_op("cutegemm::combine_rows", mutates_args=())
def _combine_rows_op(src: torch.Tensor, idx: torch.Tensor, w: Optional[torch.Tensor], k: int) -> torch.Tensor:
    if combine_takes(src, idx, w):
        return combine_rows_cuda(src, idx, w, k)[0]
    return _combine_rows_torch(src, idx, w, k)[0]


@torch.library.custom_op("cutegemm::combine_rows_dot", mutates_args=())
def _combine_rows_dot_op(src: torch.Tensor, idx: torch.Tensor, w: Optional[torch.Tensor],
                         other: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    if combine_takes(src, idx, w, other):
        return combine_rows_cuda(src, idx, w, 1, other)
    return _combine_rows_torch(src, idx, w, 1, other)


@_combine_rows_op.register_fake
def _(src, idx, w, k):
    return src.new_empty(idx.shape[0] // max(k, 1), src.shape[1])


@_combine_rows_dot_op.register_fake
def _(src, idx, w, other):
    return src.new_empty(idx.shape[0], src.shape[1]), src.new_empty(idx.shape[0], dtype=_compute_dtype(src.dtype))


# moe.dispatch's one-launch sort (cutegemm.epilogue.dispatch) on CUDA where it takes the ids (up to
# 8192 pairs and 1023 experts: decode and small batches); tests/gpu/test_dispatch_gpu.py and
# compute-sanitizer memcheck passed on an H100. False (and above those sizes): the same five
# tensors by torch (dispatch_ref: argsort, gather, binary search, scatter).
DISPATCH_KERNEL = True


def dispatch(ids: torch.Tensor, k: int, experts: int):
    """(order, rows, experts of the rows, offs, inverse) of the flattened top-k ids (see
    :mod:`cutegemm.epilogue.dispatch`), int32. With DISPATCH_KERNEL, CUDA calls go through
    ``torch.ops.cutegemm.dispatch`` (opaque to torch.compile), which runs the one-launch kernel
    where it takes the ids; torch otherwise."""
    if DISPATCH_KERNEL and ids.is_cuda:
        return torch.ops.cutegemm.dispatch(ids, k, experts)
    return dispatch_ref(ids, k, experts)


@torch.library.custom_op("cutegemm::dispatch", mutates_args=())
def _dispatch_op(ids: torch.Tensor, k: int, experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                    torch.Tensor, torch.Tensor]:  # fmt: skip
    if dispatch_takes(ids, experts):
        return dispatch_cuda(ids, k, experts)
    return dispatch_ref(ids, k, experts)


@_dispatch_op.register_fake
def _(ids, k, experts):
    n = ids.shape[0]
    return tuple(ids.new_empty(size, dtype=torch.int32) for size in (n, n, n, experts, n))


def _gemm_backward(ctx, grad):
    a, b, bias = ctx.saved_tensors
    need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    need_bias = ctx.has_bias and ctx.needs_input_grad[2]
    alpha = ctx.alpha
    da = db = dbias = None
    if not (need_a or need_b or need_bias):
        return None, None, None
    dz = _pre_activation_grad(a, b, bias, alpha, ctx.activation, grad)
    if need_bias:
        dbias = dz.flatten(0, -2).sum(0).to(bias.dtype)  # (flatten: zero-size dims too)
    dzk = dz.to(a.dtype)  # the kernels' operand dtype
    op = torch.ops.cutegemm.gemm
    if need_a:
        if a.dim() == 2 and b.dim() == 3:  # a shared by every batch: sum over L
            L, M, N = dzk.shape
            da = op(
                dzk.permute(1, 0, 2).reshape(M, L * N),
                b.mT.reshape(L * N, b.shape[-2]),
                alpha=alpha,
                out_dtype=a.dtype,
            )
        else:
            da = op(dzk, b.mT, alpha=alpha, out_dtype=a.dtype)
    if need_b:
        if a.dim() == 3 and b.dim() == 2:  # b shared by every batch: sum over L
            db = op(a.flatten(0, -2).mT, dzk.flatten(0, -2), alpha=alpha, out_dtype=b.dtype)
        else:
            db = op(a.mT, dzk, alpha=alpha, out_dtype=b.dtype)
    return da, db, dbias  # one gradient per positional input (a, b, bias)


gemm.register_autograd(_gemm_backward, setup_context=_gemm_setup_context)


# ----------------------------------------------------------------------------------------------
# cutegemm::grouped_gemm


@torch.library.custom_op("cutegemm::grouped_gemm", mutates_args=(), device_types="cpu", schema=GROUPED_SCHEMA)
def grouped_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor,
    *,
    alpha: float = 1.0,
    out_dtype: Optional[torch.dtype] = None,
    activation: Optional[str] = None,
) -> torch.Tensor:
    """Packed (b 3-D) or K-grouped (b 2-D) grouped GEMM; see the module docstring. (This body is
    the CPU kernel.)"""
    _check_grouped(a, b, offs, out_dtype, activation)
    return _grouped_ref(a, b, offs=offs, out_dtype=out_dtype or a.dtype, alpha=alpha, activation=activation,
                        compute_dtype=_compute_dtype(a.dtype))  # fmt: skip


@grouped_gemm.register_kernel("cuda")
def _grouped_cuda(a, b, offs, *, alpha=1.0, out_dtype=None, activation=None):
    return _grouped_kernel(a, b, offs=offs, out_dtype=out_dtype, alpha=alpha, activation=activation)


@grouped_gemm.register_fake
def _grouped_fake(a, b, offs, *, alpha=1.0, out_dtype=None, activation=None):
    shape = _check_grouped(a, b, offs, out_dtype, activation)
    return a.new_empty(shape, dtype=out_dtype or a.dtype)


def _grouped_setup_context(ctx, inputs, keyword_only_inputs, output):
    a, b, offs = inputs
    ctx.alpha = keyword_only_inputs.get("alpha", 1.0)
    ctx.activation = keyword_only_inputs.get("activation")
    ctx.save_for_backward(a, b, offs)


def zero_rows_past_end(t: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """t (T, ...) with rows at or past offs[-1] set to zero (no host sync)."""
    if offs.shape[0] == 0:
        return torch.zeros_like(t)
    rows = torch.arange(t.shape[0], device=t.device).unsqueeze(1)
    return torch.where(rows < offs[-1], t, torch.zeros((), dtype=t.dtype, device=t.device))


# The rows past offs[-1] of packed_zero_tail's output by the tail kernel (cutegemm.epilogue.zero_tail),
# where a memset of the whole output took 0.16 ms of a Qwen3-30B-A3B training step on the H200.
# False: the memset.
ZERO_TAIL_KERNEL = True


def packed_zero_tail(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """The packed grouped GEMM ``a[rows_e] @ b[e]`` in a's dtype with rows at or past offs[-1]
    zero (the backward's dA / dB). Eager CUDA with no gradient of its own to record: the kernel
    (it writes no row past offs[-1]) and the tail kernel (``epilogue.zero_tail``: those rows
    only, usually none), or the kernel into a zeroed output where the tail kernel does not take
    it. Otherwise (CPU, tracing, ``create_graph``): the op, then :func:`zero_rows_past_end`."""
    if eager_cuda(a) and not torch.is_grad_enabled():
        out = torch.empty(a.shape[0], b.shape[-1], dtype=a.dtype, device=a.device)
        if ZERO_TAIL_KERNEL and zero_tail_takes(out, offs):
            return zero_tail_cuda(_grouped_kernel(a, b, offs=offs, out=out, alpha=alpha), offs)
        return _grouped_kernel(a, b, offs=offs, out=out.zero_(), alpha=alpha)
    return zero_rows_past_end(torch.ops.cutegemm.grouped_gemm(a, b, offs, alpha=alpha, out_dtype=a.dtype), offs)


def _grouped_backward(ctx, grad):
    a, b, offs = ctx.saved_tensors
    need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    alpha = ctx.alpha
    op = torch.ops.cutegemm.grouped_gemm
    if ctx.activation is not None and (need_a or need_b):  # packed only: dZ = dY * act'(Z), Z recomputed
        cd = _compute_dtype(a.dtype)
        grad = activation_grad(ctx.activation, grad.to(cd), op(a, b, offs, alpha=alpha, out_dtype=cd))
    g = grad.to(a.dtype).contiguous()  # the kernels' operand dtype; the packed form wants row-major
    da = db = None
    if b.dim() == 3:  # packed: Y[rows_e] = alpha * a[rows_e] @ b[e]
        if need_a:
            da = packed_zero_tail(g, b.mT, offs, alpha)
        if need_b:
            db = op(a.mT, g, offs, alpha=alpha, out_dtype=b.dtype)  # K-grouped: (E, K, N)
    else:  # K-grouped: Y[e] = alpha * a[:, k_e] @ b[k_e]
        if need_a:  # da^T[k_e] = b[k_e] @ dY[e]^T
            da = packed_zero_tail(b.contiguous(), g.mT, offs, alpha).mT
        if need_b:  # db[k_e] = a[:, k_e]^T @ dY[e]
            db = packed_zero_tail(a.mT.contiguous(), g, offs, alpha)
    return da, db, None  # a, b, offs


grouped_gemm.register_autograd(_grouped_backward, setup_context=_grouped_setup_context)


# ----------------------------------------------------------------------------------------------
# the calls that need no gradient: one Python kernel instead of two

# holds the AutogradCPU / AutogradCUDA registrations below (dropped with it)
_LIB = torch.library.Library("cutegemm", "FRAGMENT")
_BELOW_AUTOGRAD = torch._C._after_autograd_keyset.remove(torch._C.DispatchKey.ADInplaceOrView)
_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_CUDA_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)

_BELOW: dict = {}  # a dispatch key set's bits -> _below_autograd's answer


def _below_autograd(keyset) -> int:
    """Below autograd in a call's ``keyset``: 0 only the CPU key, 1 only CUDA, 2 anything else."""
    below = keyset & _BELOW_AUTOGRAD
    kind = 0 if below == _CPU_KEYS else 1 if below == _CUDA_KEYS else 2
    _BELOW[keyset.raw_repr()] = kind
    return kind


# op name -> [CPU function, CUDA function] of its no-gradient path, read on every call (so
# tests/host_overhead_cpu.py can point the CPU entry at the CUDA function on CPU tensors)
NO_GRAD_FUNCTIONS: dict = {}


def _register_no_grad_path(opdef, cuda_fn) -> None:
    """Registers ``opdef``'s AutogradCPU and AutogradCUDA kernels (they take precedence over the
    Autograd kernel custom_op registered). A call that needs no gradient and would redispatch
    straight to the CPU or CUDA kernel (plain tensors of one device, no mode or subclass below
    autograd) runs that device's function below autograd in this frame, as custom_op's Autograd
    kernel does through a redispatch into a second Python kernel (its output-aliasing check:
    ours return fresh tensors) at about twice the host time. Every other call takes custom_op's
    own Autograd kernel, so gradients, fake tensors and tracing are unchanged. Dynamo never traces
    them, as custom_op's (``torch._disable_dynamo``): with Dynamo off on this thread (no eval-frame
    callback: eager code, a compiled graph's own run) and no export, the kernel runs as the disable
    wrapper would run it, without its cost (~0.6 us); otherwise through it. Dynamo skips its frame."""
    slow = make_autograd_impl(opdef._opoverload, opdef)  # what custom_op registers for "Autograd"
    fns = NO_GRAD_FUNCTIONS[opdef._name] = [opdef._init_fn, cuda_fn]
    disabled = getattr(opdef, "_disabled_kernel", set())  # set_kernel_enabled's set, updated in place

    def kernel(keyset, *args, _below_dynamo=False, **kwargs):
        if not _below_dynamo and (_dynamo_callback() is not None or torch.compiler.is_exporting()):
            return off(keyset, *args, _below_dynamo=True, **kwargs)  # Dynamo on: through its disable
        if not (torch._C.is_grad_enabled() and torch._C._any_requires_grad(*args)):
            below = _BELOW.get(keyset.raw_repr())
            if below is None:
                below = _below_autograd(keyset)
            if below == 1 and "cuda" in disabled:  # switched off: custom_op runs the body too
                below = 0
            if below < 2:
                with torch._C._AutoDispatchBelowAutograd():
                    return fns[below](*args, **kwargs)
        return slow(keyset, *args, **kwargs)

    off = torch._disable_dynamo(kernel)  # as custom_op's kernels: never traced by Dynamo
    registered = kernel if _dynamo_callback is not None and _skip_frame(kernel) else off
    for key in ("AutogradCPU", "AutogradCUDA"):
        _LIB.impl(opdef._name, registered, key, with_keyset=True)


try:  # private: this thread's eval-frame callback (None: Dynamo off); a code's frame action
    from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
    from torch._C._dynamo.eval_frame import get_eval_frame_callback as _dynamo_callback
except ImportError:
    _dynamo_callback = None


def _skip_frame(fn) -> bool:
    """Dynamo skips ``fn``'s frames, not its callees' (torch._dynamo's skip_code without importing it)."""
    try:
        set_code_exec_strategy(fn.__code__, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.DEFAULT))
    except (AttributeError, TypeError, RuntimeError):
        return False
    return True


try:  # private torch names (make_autograd_impl, CustomOpDef._init_fn): without them, custom_op's path
    if make_autograd_impl is not None:
        _register_no_grad_path(gemm, _gemm_cuda)
        _register_no_grad_path(grouped_gemm, _grouped_cuda)
        for _op, _cuda_fn in QUANT_CUDA_FUNCTIONS:  # no autograd of their own: the path still halves the host work
            _register_no_grad_path(_op, _cuda_fn)
except (AttributeError, TypeError):
    pass

__all__ = [
    "gemm", "grouped_gemm", "activation_grad", "gated_grads", "quantize", "gemm_quantized", "GEMM_SCHEMA", "GROUPED_SCHEMA",
]  # fmt: skip
