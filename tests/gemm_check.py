"""Shared checks for GPU GEMM tests: error bound vs torch, poison, determinism."""

from __future__ import annotations

import torch


def error_stats(x: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    d = (x.double() - ref).abs()
    return d.max().item(), d.mean().item()


def assert_within_torch_error(ours, torch_same_precision, ref, atol=1e-5, what=""):
    """Our error vs an fp64 reference must be within 2x torch's own same-precision error + atol
    (max and mean), and NaN never passes."""
    assert not torch.isnan(ours).any(), f"{what}: NaN in output"
    o_max, o_mean = error_stats(ours, ref)
    t_max, t_mean = error_stats(torch_same_precision, ref)
    scale = ref.abs().max().item() or 1.0
    tol = atol * scale
    assert o_max <= 2 * t_max + tol, f"{what}: max err {o_max:.4g} > 2 x torch {t_max:.4g} + {tol:.3g}"
    assert o_mean <= 2 * t_mean + tol, f"{what}: mean err {o_mean:.4g} > 2 x torch {t_mean:.4g} + {tol:.3g}"


def poisoned_out(shape, dtype, pad_rows=3, pad_cols=8):
    """A NaN-filled buffer larger than the output; returns (buffer, view of the output shape).
    The padding proves nothing is written outside the view."""
    *batch, m, n = shape
    buf = torch.full((*batch, m + pad_rows, n + pad_cols), float("nan"), dtype=dtype, device="cuda")
    return buf, buf[..., :m, :n]


def assert_outside_untouched(buf, m, n):
    assert torch.isnan(buf[..., m:, :]).all(), "rows below the output were written"
    assert torch.isnan(buf[..., :, n:]).all(), "columns right of the output were written"
