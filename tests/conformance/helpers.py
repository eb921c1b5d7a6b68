"""Shared pieces of the conformance suite: the two variants of every case and small torch
emulations of what the sources compare against.

Each case runs as

- ``cuda``: cutegemm's kernels on the GPU (marked ``gpu``: skipped without an sm_90 / sm_100 GPU),
  compared as the source compares torch's own op;
- ``cpu``: the same call on CPU tensors through cutegemm's whole host path (argument checks,
  routing, staging copies, kernel views) with the compiled kernel replaced by
  ``tests.emulated_kernel.EmulatedKernel`` (the GEMM of the views it is handed, in fp32), plus the
  reference twin (``gemm_ref`` / ``grouped_gemm_ref``), both against the source's torch
  emulation on the CPU, with the source's tolerance. Where the emulated kernel does not model a
  feature (FP8 block scales) the CPU variant checks that the call is accepted up to the kernel
  and the reference twin only.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import cutegemm

from ..emulated_kernel import emulated_kernels

DEVICES = [pytest.param("cuda", marks=pytest.mark.gpu), "cpu"]
E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max


@contextlib.contextmanager
def backend(device: str):
    """The context cutegemm's public calls of one variant run in (see the module docstring)."""
    if device == "cpu":
        with emulated_kernels() as cache:
            yield cache
    else:
        yield None


def randn(*shape, device, dtype=torch.bfloat16, generator=None):
    return torch.randn(*shape, device=device, generator=generator).to(dtype)


class Unmodelled(Exception):
    """The emulated kernel does not model this call (the CPU variant checks the twin only)."""


def run(device: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` (a cutegemm public function) in the variant's context; on the CPU
    an unmodelled kernel feature is raised as :class:`Unmodelled` after the host path accepted
    the call."""
    with backend(device):
        try:
            return fn(*args, **kwargs)
        except NotImplementedError as exc:
            if device == "cpu" and "emulated kernel" in str(exc):
                raise Unmodelled(str(exc)) from exc
            raise


def run_and_ref(device: str, fn, ref_fn, *args, **kwargs):
    """(ours, reference twin) of one call; ours is None where the CPU emulation does not model
    the kernel (the call passed every check up to it)."""
    try:
        ours = run(device, fn, *args, **kwargs)
    except Unmodelled:
        ours = None
    return ours, ref_fn(*args, **kwargs)


# ------------------------------------------------------------------------- FP8 scales (torch's recipes)
def amax_scale(x: torch.Tensor, dim=None) -> torch.Tensor:
    """fp32 quantization scale E4M3_MAX / amax (per tensor, or per ``dim`` with keepdim), the
    recipe of torch's FP8 tests; an fp16 source keeps it within fp16's range."""
    amax = x.abs().amax() if dim is None else x.abs().amax(dim=dim, keepdim=True)
    scale = E4M3_MAX / amax.float().clamp(min=1e-12)
    if x.dtype == torch.float16:
        scale = scale.clamp(max=torch.finfo(torch.float16).max)
    return scale.float()


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Saturating cast to float8_e4m3fn."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def dequant_mm(x8, x_scale, y8, y_scale, out_dtype, bias=None) -> torch.Tensor:
    """torch's FP8 emulation: (x8 / x_scale) @ (y8 / y_scale) in fp32 (+ bias), cast."""
    out = (x8.float() / x_scale) @ (y8.float() / y_scale)
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


def block_quantize(x: torch.Tensor, block_rows: int, block_cols: int = 128):
    """(x8, scale) with one scale E4M3_MAX / amax per (block_rows x block_cols) block of x (an
    all-zero block gets scale 1 after its elements are zeroed), as torch's block-scaling tests
    build their operands; scale has shape (rows / block_rows, cols / block_cols)."""
    r, c = x.shape
    blocks = x.float().reshape(r // block_rows, block_rows, c // block_cols, block_cols)
    amax = blocks.abs().amax(dim=(1, 3), keepdim=True)
    scale = torch.where(amax == 0, torch.zeros_like(amax), E4M3_MAX / amax)
    x8 = (blocks * scale).to(E4M3).reshape(r, c)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return x8, scale.reshape(r // block_rows, c // block_cols)


def block_dequant_mm(x8, x_scale, y8t, y_scale_t, out_dtype) -> torch.Tensor:
    """fp32 emulation of a block-scaled product: x8 (M, K) with per-block quantization scales
    x_scale, y8t (K, N) with y_scale_t (K blocks, N blocks); each element divided by its block's
    scale, then one matmul."""
    def dq(t, s):
        rb, cb = t.shape[0] // s.shape[0], t.shape[1] // s.shape[1]
        return t.float() / s.repeat_interleave(rb, 0).repeat_interleave(cb, 1)

    return (dq(x8, x_scale) @ dq(y8t, y_scale_t)).to(out_dtype)


def pad_k_blocks(scale: torch.Tensor) -> torch.Tensor:
    """A (rows, K/128) 128x128 scale with its K blocks padded with zeros to a multiple of 4, the
    layout cuBLAS (and torch's tests) want; the caller takes ``.t()``: (L4, rows) K-major."""
    pad = (-scale.shape[1]) % 4
    return torch.nn.functional.pad(scale, (0, pad)) if pad else scale


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.flatten().float(), b.flatten().float(), dim=0))


__all__ = [
    "DEVICES", "E4M3", "Unmodelled", "amax_scale", "backend", "block_dequant_mm", "block_quantize", "cosine",
    "cutegemm", "dequant_mm", "pad_k_blocks", "randn", "run", "run_and_ref", "to_e4m3",
]  # fmt: skip
