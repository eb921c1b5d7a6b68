"""Reference checks shared by tools/stress.py and tools/sanitize.py.

The project's error criterion (tests/gemm_check.py): our error against an fp64 reference within
2x torch's own same-precision error (torch.matmul in the input dtype, the epilogue in fp32, then
the cast) + a small atol, NaN never passes. Tensors may live on the CPU or the GPU (all on one
device). Outputs are written into NaN-poisoned buffers by the callers: the checks here also
assert that nothing outside the problem was written.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: cutegemm, tests

from cutegemm import gemm_ref, grouped_gemm_ref  # noqa: E402
from cutegemm.epilogue import epilogue_ref  # noqa: E402
from cutegemm.schedulers.grouped import expert_rows  # noqa: E402
from tests.gemm_check import assert_within_torch_error  # noqa: E402

EPI_KEYS = ("alpha", "beta", "c", "bias", "activation", "gate_layout")


def poisoned(shape, dtype, device, pad_rows=3, pad_cols=8):
    """(buffer, view): a NaN buffer larger than ``shape`` and the output view into it."""
    *batch, m, n = shape
    buf = torch.full((*batch, m + pad_rows, n + pad_cols), float("nan"), dtype=dtype, device=device)
    return buf, buf[..., :m, :n]


def assert_pad_untouched(buf, m, n, what=""):
    assert torch.isnan(buf[..., m:, :]).all(), f"{what}: rows below the output were written"
    assert torch.isnan(buf[..., :, n:]).all(), f"{what}: columns right of the output were written"


def check_dense(out, a, b, what="", **ops):
    """``out`` = gemm(a, b, **ops) (every element written, within the error bound)."""
    if out.numel() == 0:
        return
    d = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in ops.items()}
    ref = gemm_ref(a.double(), b.double(), out_dtype=torch.float64, compute_dtype=torch.float64, **d)
    same = epilogue_ref(torch.matmul(a, b).float(), **ops).to(out.dtype)
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    assert_within_torch_error(out, same, ref, what=what)


def check_fp8_blockwise(out, a, b, scale_a, scale_b, offs: list[int] | None = None, what=""):
    """FP8 with DeepSeek block scales, dense (offs None) or packed grouped: within 2x the error
    of the fp32 dequantize-then-matmul at bf16 output, against an fp64 reference; grouped rows
    at or past offs[-1] untouched."""
    end = out.shape[0] if offs is None else (offs[-1] if offs else 0)
    if offs is not None:
        assert torch.isnan(out[end:]).all(), f"{what}: a row at or past offs[-1] was written"
    if end == 0 or out.shape[1] == 0:
        return
    kw = dict(scale_a=scale_a, scale_b=scale_b)
    if offs is None:
        ref = gemm_ref(a, b, out_dtype=torch.float64, compute_dtype=torch.float64, **kw)
        same = gemm_ref(a, b, out_dtype=out.dtype, **kw)
    else:
        offs_t = torch.tensor(offs, dtype=torch.int32, device=a.device)
        ref = grouped_gemm_ref(a, b, offs=offs_t, out_dtype=torch.float64, compute_dtype=torch.float64, **kw)
        same = grouped_gemm_ref(a, b, offs=offs_t, out_dtype=out.dtype, **kw)
    assert_within_torch_error(out[:end], same[:end], ref[:end], what=what)


def check_packed(out, a, b, offs: list[int], alpha=1.0, what=""):
    """Packed grouped result for *valid* offs: expert rows within the bound, rows at or past
    offs[-1] untouched (NaN poison)."""
    end = offs[-1] if offs else 0
    assert torch.isnan(out[end:]).all(), f"{what}: a row at or past offs[-1] was written"
    if end == 0 or out.shape[1] == 0:
        return
    offs_t = torch.tensor(offs, dtype=torch.int32)
    ref = grouped_gemm_ref(a.double(), b.double(), offs=offs_t, alpha=alpha, compute_dtype=torch.float64)
    bounds = [0, *offs]
    same = torch.cat(
        [
            (a[s:t] @ b[e]).float() * alpha
            for e, (s, t) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
        ]
    )
    assert_within_torch_error(out[:end], same.to(out.dtype), ref[:end], what=what)


def check_fp4w(out, x, wd, offs: list[int] | None = None, what=""):
    """FP4-weight result: ``wd`` the exactly dequantized weights ((N, K), or (E, N, K) with the
    packed form's ``offs``), in fp32 or fp64. The reference is fp64 on them; torch's error is that
    of the bf16 matmul on the weights rounded to bf16 (a Hopper user's path). NVFP4's global
    scale is not a power of two, so e2m1 x scale x global_scale does not fit bf16: checking against
    the bf16-rounded weights would charge the kernel (which applies the global scale to its fp32
    sums) with that rounding."""
    end = out.shape[0] if offs is None else (offs[-1] if offs else 0)
    if offs is not None:
        assert torch.isnan(out[end:]).all(), f"{what}: a row at or past offs[-1] was written"
    if end == 0 or out.shape[1] == 0:
        return
    w64, w16 = wd.double(), wd.to(torch.bfloat16)
    if offs is None:
        ref, same = x.double() @ w64.T, (x @ w16.T).float()
    else:
        bounds = [0, *offs]
        ref = torch.cat([x[s:t].double() @ w64[e].T for e, (s, t) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))])
        same = torch.cat([(x[s:t] @ w16[e].T).float() for e, (s, t) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))])
    assert_within_torch_error(out[:end], same.to(out.dtype), ref, what=what)


def check_clamped(out, offs: list[int], what=""):
    """Packed result for *bad* offs (unchecked, graph-safe path): rows of the clamped experts
    written, every other row untouched."""
    covered = torch.zeros(out.shape[0], dtype=torch.bool)
    for s, t in expert_rows(offs, out.shape[0]):
        covered[s:t] = True
    covered = covered.to(out.device)
    assert torch.isnan(out[~covered]).all(), f"{what}: a row of no (clamped) expert was written"
    assert not torch.isnan(out[covered]).any(), f"{what}: a row of a (clamped) expert was not written"


def check_kgrouped(out, a, b, offs: list[int], alpha=1.0, what=""):
    """K-grouped result (E, M, N): out[e] = alpha * a[:, k_e] @ b[k_e]; empty slices give zeros."""
    offs_t = torch.tensor(offs, dtype=torch.int32)
    ref = grouped_gemm_ref(a.double(), b.double(), offs=offs_t, alpha=alpha, compute_dtype=torch.float64)
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    if out.numel() == 0:
        return
    bounds = [0, *offs]
    same = torch.stack(
        [(a[:, s:t] @ b[s:t]).float() * alpha for s, t in zip(bounds[:-1], bounds[1:], strict=True)]
    )
    assert_within_torch_error(out, same.to(out.dtype), ref, what=what)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit pattern (so that NaN poison compares equal in determinism checks)."""
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(view)


def bitwise_equal(x: torch.Tensor, y: torch.Tensor) -> bool:
    return x.shape == y.shape and x.dtype == y.dtype and torch.equal(bits(x), bits(y))
