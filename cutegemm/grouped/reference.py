"""The plain-torch twin of :func:`cutegemm.grouped.packed.grouped_gemm` (every form), a loop over
the groups on the host: the reference the tests and the kernels' K = 0 paths compare with."""

from __future__ import annotations

import torch

from ..blockscaled.reference import quantize_ref
from ..epilogue import GATED, epilogue_ref
from ..epilogue.user import apply_user_ref
from ..gemm.fp8_scales import TORCH_FP8, fp8_blockwise_ref
from ..gemm.launch import global_scale
from ..schedulers.grouped import expert_rows
from .batched import grouped_3d_ref
from .k_grouped import k_scales


def grouped_gemm_ref(a, b, *, offs=None, out_dtype=None, alpha: float = 1.0, bias=None, activation=None,
                     gate_layout: str = "interleaved", epilogue=None, epilogue_args=(), out_global_scale=None,
                     scale_a=None, scale_b=None, compute_dtype=torch.float32):  # fmt: skip
    """Plain-torch twin (loops over groups on the host). Packed form: per expert e, rows
    [offs[e-1], offs[e]) get ``epilogue(alpha * (a_e @ b[e]) * scale_a * scale_b[e] + bias[e])``
    (the dense ``epilogue_ref`` / user epilogue with packed row indices); rows at or past
    offs[-1] are zero here and not written by the kernel. A quantized ``out_dtype`` returns
    ``quantize_ref`` of the fp32 result."""
    if isinstance(a, (list, tuple)):
        for i, (x, w) in enumerate(zip(a, b, strict=True)):  # the list form's rule (grouped_list)
            if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor) or x.dim() != 2 or w.dim() != 2:
                raise ValueError(f"group {i}: the list form takes 2-D a (M, K) and b (K, N) tensors")
        return [epilogue_ref(x.to(compute_dtype) @ w.to(compute_dtype), alpha=alpha, activation=activation).to(out_dtype or x.dtype)
                for x, w in zip(a, b, strict=True)]  # fmt: skip
    if a.dim() == 3:
        return grouped_3d_ref(a, b, offs, grouped_gemm_ref, out_dtype=out_dtype, alpha=alpha, bias=bias,
                              activation=activation, gate_layout=gate_layout, epilogue=epilogue,
                              epilogue_args=epilogue_args, out_global_scale=out_global_scale, scale_a=scale_a,
                              scale_b=scale_b, compute_dtype=compute_dtype)  # fmt: skip
    fp8 = a.dtype in TORCH_FP8
    out_dtype = out_dtype or (torch.bfloat16 if fp8 else a.dtype)
    if not isinstance(offs, torch.Tensor) or offs.dim() != 1:
        raise TypeError("offs must be a 1-D integer tensor (cumulative end of every group)")
    bounds = offs.tolist()
    if b.dim() == 3:
        E, _, N = b.shape
        if len(bounds) != E:
            raise ValueError(f"offs has {len(bounds)} entries but b has {E} experts")
        rows = expert_rows(bounds, a.shape[0])  # the kernel's clamping of bad offsets
        gated = activation in GATED
        acc = torch.zeros(a.shape[0], N, dtype=compute_dtype, device=a.device)
        blockwise = isinstance(scale_b, torch.Tensor) and scale_b.dim() == 3  # DeepSeek 1x128 / 128x128
        for e, (prev, end) in enumerate(rows):
            if blockwise:
                acc[prev:end] = fp8_blockwise_ref(a[prev:end], b[e], scale_a[prev:end], scale_b[e], compute_dtype)
            else:
                acc[prev:end] = a[prev:end].to(compute_dtype) @ b[e].to(compute_dtype)
        if blockwise or a.shape[1] == 0:  # applied per block above; K = 0: a zero product whatever the scales
            scale_a = scale_b = None
        if scale_a is not None:
            sa = scale_a.to(compute_dtype).reshape(-1)
            acc = acc * (sa if sa.numel() == 1 else sa.unsqueeze(-1))
        n_out = N // 2 if gated else N
        res = torch.zeros(a.shape[0], n_out, dtype=compute_dtype, device=a.device)
        last = rows[-1][1] if rows else 0
        if epilogue is not None:
            y = acc * alpha if alpha != 1.0 else acc
            res[:last] = apply_user_ref(epilogue, y, tuple(epilogue_args))[:last]
        else:
            for e, (prev, end) in enumerate(rows):
                if end > prev:
                    y = acc[prev:end]
                    if scale_b is not None:
                        y = y * _expert_row(scale_b, e, E, N, compute_dtype)
                    bias_e = None if bias is None else _expert_row(bias, e, E, N, compute_dtype)
                    res[prev:end] = epilogue_ref(y, alpha=alpha, bias=bias_e, activation=activation,
                                                 gate_layout=gate_layout)  # fmt: skip
        if isinstance(out_dtype, str):
            gs = global_scale(out_dtype, out_global_scale, res.device)
            return quantize_ref(res.float(), out_dtype, global_scale=gs)
        return res.to(out_dtype)
    M, N = a.shape[0], b.shape[1]
    out = torch.zeros(len(bounds), M, N, dtype=compute_dtype, device=a.device)
    sa, sb = k_scales(scale_a, scale_b, len(bounds), M, N) if fp8 else (None, None)
    for e, (start, end) in enumerate(expert_rows(bounds, a.shape[1])):
        if end > start:
            out[e] = a[:, start:end].to(compute_dtype) @ b[start:end].to(compute_dtype)
            if sa is not None:
                out[e] *= sa[e].to(compute_dtype).reshape(-1, 1)
            if sb is not None:
                out[e] *= sb[e].to(compute_dtype).reshape(1, -1)
    return (out * alpha).to(out_dtype)


def _expert_row(t: torch.Tensor, e: int, E: int, n: int, dtype) -> torch.Tensor:
    """Expert e's row of a per-(expert, column) vector given as (E, n), (n,), (E,) or one value."""
    t = t.to(dtype)
    if t.shape == (E, n):
        return t[e]
    if t.shape == (n,) or t.numel() == 1:
        return t.reshape(-1)
    return t.reshape(E)[e]


__all__ = ["grouped_gemm_ref"]
