"""The 3-D forms of ``torch._grouped_mm`` / ``torch._scaled_grouped_mm`` (a of shape (G, M, K)),
routed to the kernels of the other forms. :func:`cutegemm.grouped.packed.grouped_gemm` checks
nothing of them but the operand type and calls :func:`grouped_3d`; the packed form's function is
passed in (``run`` / ``run_ref``), so this module does not import it.

- 3d x 3d (batched): a (G, M, K) x b (G, K, N) -> (G, M, N), ``offs`` None (as torch):
  ``out[g] = a[g] @ b[g]``. bf16 / fp16 with at most a shared (N,) bias: the dense path's batched
  GEMM (any G; every layout torch accepts, staged where TMA cannot read it). FP8 row-wise scales
  (``scale_a`` (G, M), ``scale_b`` (G, N), torch._scaled_grouped_mm's shapes) or block scales,
  or a per-group (G, N) bias: the packed form over a (G*M, K) (a view when a's rows are packed,
  else a copy) with offs = (1..G) * M, one launch; the offs tensor is made once per (G, M,
  device) and kept (made anew, not kept, while a CUDA graph is being captured).
- 3d x 2d: a (G, M, K) x b (K, total_N) with offs (G,) splitting N -> (M, total_N):
  ``out[:, n_g] = a[g] @ b[:, n_g]``. Computed transposed, as the packed form: out^T (total_N, M)
  = b^T (total_N, K) x a^T (G, K, M) with the same offs (one launch, no host sync, capturable;
  FP8: ``scale_a`` (G, M) per group and row of a becomes the packed form's per-expert column scale,
  ``scale_b`` (total_N,) its per-row scale). The kernel writes a (total_N, M) buffer: an ``out``
  given column-major (``out.t()`` row-major, 16-byte rows) in place; on sm_90a with a 16-bit
  output the kernel stores out^T M-major, i.e. the row-major result in place
  (``gemm.launch.PACKED_M_MAJOR``); any other out (or none) by one copy into a row-major result.
  Columns at or past offs[-1] of a given out keep their values. Epilogue: alpha, an elementwise
  activation.

Both forms take ``out``, ``out_dtype``, ``alpha``, ``config``; quantized outputs and user
epilogues are for the 2-D forms. The reference twins apply the same rewriting to the packed
form's reference (``run_ref``); the conformance suite checks them against torch's per-group
products.
"""

from __future__ import annotations

import torch

from ..config import ACTIVATIONS, Form
from ..gemm.dense import gemm
from ..gemm.launch import TORCH_FP8, check_offs_values, packed_m_major, stores_m_major
from ..runtime.device import device_info

_BATCH_OFFS: dict = {}


def batch_offs(groups: int, rows: int, device) -> torch.Tensor:
    """offs = (1..groups) * rows as int32 on ``device``: the packed form of a batched problem."""
    key = (groups, rows, device)
    offs = _BATCH_OFFS.get(key)
    if offs is None:
        offs = torch.arange(1, groups + 1, dtype=torch.int32, device=device).mul_(rows)
        if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
            _BATCH_OFFS[key] = offs  # made inside a capture, it would live in the graph's memory
    return offs


def _check_3d(a, b, offs):
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if b.dim() not in (2, 3):
        raise ValueError(f"b must have 2 dims (the 3d x 2d form) or 3 (3d x 3d), got shape {tuple(b.shape)}")
    if b.dim() == 3:
        if offs is not None:
            raise ValueError("the 3d x 3d (batched) form takes no offs (as torch._grouped_mm): pass offs=None")
        if b.shape[0] != a.shape[0] or b.shape[1] != a.shape[2]:
            raise ValueError(f"a (G, M, K) = {tuple(a.shape)} and b (G, K, N) = {tuple(b.shape)} do not match")
        return
    if offs is None:
        raise ValueError("the 3d x 2d form needs offs (int32 cumulative end columns of b's groups)")
    if not isinstance(offs, torch.Tensor) or offs.dtype != torch.int32 or offs.dim() != 1:
        raise TypeError("offs must be a 1-D torch.int32 tensor")
    if offs.numel() != a.shape[0]:
        raise ValueError(f"offs has {offs.numel()} entries but a has {a.shape[0]} groups")
    if b.shape[0] != a.shape[2]:
        raise ValueError(f"a (G, M, K={a.shape[2]}) and b (K={b.shape[0]}, total_N) disagree on K")


_EXTRAS = {"bias": None, "activation": None, "gate_layout": "interleaved", "epilogue": None, "epilogue_args": (),
           "out_global_scale": None}  # fmt: skip


def _no_extras(form: str, options: dict, allowed: tuple[str, ...]):
    """A ValueError naming every epilogue option off its default that ``form`` does not take."""
    bad = [k for k, d in _EXTRAS.items() if k not in allowed and k in options
           and options[k] is not d and not (k in ("gate_layout", "epilogue_args") and options[k] == d)]  # fmt: skip
    if isinstance(options.get("out_dtype"), str):
        bad.append("a quantized out_dtype")
    if bad:
        raise ValueError(f"the {form} form does not take {', '.join(bad)} (they are for the 2-D forms)")


def _rows_scale(t, groups: int, rows: int):
    """A per-(group, row) scale or block scale of a 3-D a ((G, M), (G, M, KB), (G*M,), ...) as the
    packed form's per-row one ((G*M,) / (G*M, KB)); a per-tensor value unchanged."""
    if not isinstance(t, torch.Tensor) or t.numel() == 1:
        return t
    if t.dim() >= 2 and tuple(t.shape[:2]) == (groups, rows):
        return t.reshape(groups * rows, *t.shape[2:])
    return t


def _packed_3d3d(a, b, kwargs, run):
    G, M, K = a.shape
    out = kwargs.pop("out", None)
    a2 = a.reshape(G * M, K)
    sa = kwargs.pop("scale_a", None)
    kw = {**kwargs, "scale_a": _rows_scale(sa, G, M)}
    offs = batch_offs(G, M, a.device)
    out2 = None
    if out is not None:
        try:
            out2 = out.view(G * M, out.shape[-1])
        except RuntimeError:
            out2 = None
    res = run(a2, b, offs=offs, out=out2, **kw)
    if out is None:
        return res.view(G, M, res.shape[-1])
    if out2 is None:
        out.copy_(res.view(out.shape))
    return out


def batched_dense(a, b, out, out_dtype, alpha):
    """3d x 3d with no option but out / out_dtype / alpha, bf16 / fp16: the dense batched GEMM
    (what :func:`grouped_3d` runs for it, without sorting its options)."""
    _check_3d(a, b, None)
    return gemm(a, b, out=out, out_dtype=out_dtype, alpha=alpha)


def transposed_operands(a, b, out_dtype, out=None):
    """3d x 2d as the packed form: (A = b^T (total_N, K), B = a^T (G, K, M), the output dtype). A
    row-major b makes an M-major A, which the packed form would stage on every call (a cold call):
    b^T is made row-major here instead (the same copy), so a repeated call finds its plan."""
    fp8 = a.dtype in TORCH_FP8
    out_dtype = out_dtype or (out.dtype if isinstance(out, torch.Tensor) else torch.bfloat16 if fp8 else a.dtype)
    return k_major_t(b), a.mT, out_dtype


def k_major_t(b):
    """b^T, row-major: a view of a column-major b, else a copy."""
    bt = b.t()
    return bt if bt.stride(-1) == 1 or bt.shape[-1] == 1 else bt.contiguous()


class Transposed3d2d:
    """A warm 3d x 2d call (no option but out_dtype / alpha / config / check_offs): ``inner``, the
    packed form's plan of out^T = b^T x a^T, launched on b^T (row-major: ``k_major_t``) and a
    (its kernel views are ``as_strided`` views, and a.mT starts where a does), then out^T's row-major
    transpose, as the cold call returns. The packed form's key of the 3-D call fixes the inner
    call's key; the caller checks data-pointer alignment and the device, as for the inner plan."""

    __slots__ = ("inner", "device_index")

    def __init__(self, inner):
        self.inner, self.device_index = inner, inner.device_index

    def run(self, a, b, out, offs, alpha, check_offs):
        if check_offs:
            check_offs_values(offs, b.shape[1])
        inner = self.inner
        if inner.config.c_major == "m":  # the kernel stores the (M, total_N) result M-major, in place
            res = torch.empty(inner.out_dims[1], inner.out_dims[0], dtype=inner.out_dtype, device=inner.device)
            inner.launch(k_major_t(b), a, res.t(), offs, float(alpha))
            return res
        out_t = torch.empty(*inner.out_dims, dtype=inner.out_dtype, device=inner.device)
        inner.launch(k_major_t(b), a, out_t, offs, float(alpha))
        return out_t.t().contiguous()


def grouped_3d(a, b, offs, run, **options):
    """``grouped_gemm`` with a 3-D a: the 3d x 3d or the 3d x 2d form (see the module docstring).
    ``run`` is the packed form's ``grouped_gemm``; ``options`` its keyword arguments."""
    _check_3d(a, b, offs)
    G, M, K = a.shape
    fp8 = a.dtype in TORCH_FP8  # (e5m2: the packed form's checks name what it takes)
    config = options.get("config")
    if b.dim() == 3:
        _no_extras("3d x 3d", options, ("bias", "activation", "gate_layout"))
        options.pop("check_offs", None)
        bias = options.get("bias")
        per_group_bias = isinstance(bias, torch.Tensor) and tuple(bias.shape) != (b.shape[-1],)
        scaled = options.get("scale_a") is not None or options.get("scale_b") is not None
        if fp8 or scaled or per_group_bias or (config is not None and config.form == Form.GROUPED):
            return _packed_3d3d(a, b, options, run)  # (16-bit scale_a: the packed form's per-row output scale)
        kw = {k: v for k, v in options.items() if k not in ("scale_a", "scale_b", "fast_accum")}
        return gemm(a, b, **kw)  # the dense path's batched GEMM
    _no_extras("3d x 2d", options, ("activation",))
    act = options.get("activation")
    if act is not None and act not in ACTIVATIONS:
        raise ValueError(f"the 3d x 2d form takes activation None or one of {ACTIVATIONS} (no gated ones), got {act!r}")
    out = options.pop("out", None)
    sa, sb = options.pop("scale_a", None), options.pop("scale_b", None)
    _fp8_scales_only(a, sa, sb)
    total_n = b.shape[1]
    # out^T (total_N, M) = b^T (total_N, K) x a^T (G, K, M), grouped over the rows of b^T
    bt, at, out_dtype = transposed_operands(a, b, options.get("out_dtype"), out)
    if out is not None and (not isinstance(out, torch.Tensor) or out.shape != (M, total_n) or out.dtype != out_dtype):
        raise ValueError(f"out must be an ({M}, {total_n}) {out_dtype} tensor")
    options["out_dtype"] = out_dtype
    if out is None:
        if packed_m_major() and not (config is not None and config.swap_ab):  # the result stored in place, M-major
            res = torch.empty(M, total_n, dtype=out_dtype, device=a.device)
            if stores_m_major(res.t(), device_info(a.device.index)[0]):
                run(bt, at, offs=offs, out=res.t(), scale_a=sb, scale_b=sa, **options)
                return res
        return run(bt, at, offs=offs, scale_a=sb, scale_b=sa, **options).t().contiguous()
    run(bt, at, offs=offs, out=out.t(), scale_a=sb, scale_b=sa, **options)
    return out


def _fp8_scales_only(a, sa, sb) -> None:
    """The 3d x 2d form's scales are FP8 ones: with 16-bit operands (the packed form's per-row output
    scale would fall on out's columns here) they are refused."""
    if a.dtype not in TORCH_FP8 and (sa is not None or sb is not None):
        raise ValueError("scale_a / scale_b in the 3d x 2d form are FP8 scales (float8_e4m3fn operands); with "
                         f"{a.dtype} operands scale the result instead")  # fmt: skip


def grouped_3d_ref(a, b, offs, run_ref, **options):
    """The reference twin of :func:`grouped_3d`: the same rewriting, on the packed form's
    reference ``run_ref``."""
    _check_3d(a, b, offs)
    G, M, K = a.shape
    if b.dim() == 3:
        sa = _rows_scale(options.pop("scale_a", None), G, M)
        res = run_ref(a.reshape(G * M, K), b, offs=batch_offs(G, M, a.device), scale_a=sa, **options)
        return res.view(G, M, res.shape[-1])
    sa, sb = options.pop("scale_a", None), options.pop("scale_b", None)
    _fp8_scales_only(a, sa, sb)
    return run_ref(b.t(), a.mT, offs=offs, scale_a=sb, scale_b=sa, **options).t()


__all__ = ["Transposed3d2d", "batch_offs", "batched_dense", "grouped_3d", "grouped_3d_ref", "transposed_operands"]
