"""The rows of a packed grouped GEMM's output past its last expert, zeroed on the device (CuTe DSL,
sm_90a and sm_100a):

    out[r, :] = 0    for offs[-1] <= r < R

with ``offs`` read on the device (no host sync, CUDA-graph capturable). The grouped kernels write
no row at or past offs[-1]; a backward's dA wants those rows zero (``ops.packed_zero_tail``).
Zeroing the whole output first writes it all once more (a Qwen3-30B-A3B layer's dX, 131072 x
2048 bf16: 0.16 ms of the training step on the H200); this kernel writes only the tail, usually
nothing.

A fixed grid (four CTAs per SM at most); each thread reads offs[-1] and stores 16-byte zeros
over a grid-strided share of the tail's 16-byte chunks. Any dtype: the output is seen as int32
words, rows a multiple of 16 bytes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

from ..runtime.cache import KernelCache
from ..runtime.device import device_info
from ..runtime.sass import check_sass
from .rowwise import MAX_ELEMENTS

WORDS = 4  # int32 words per 16-byte store
SASS_REQUIRED = {"STG.128": r"\bSTG\.E[.A-Z0-9]*\.128"}
SASS_FORBIDDEN = {"LDL": r"\bLDL(\.|\s)", "STL": r"\bSTL(\.|\s)"}


@dataclass(frozen=True)
class ZeroTailConfig:
    """What changes the compiled kernel (the compile-cache key)."""

    arch: str = "sm_90a"
    threads: int = 256

    def __post_init__(self):
        if self.arch not in ("sm_90a", "sm_100a") or self.threads % 32:
            raise ValueError(f"bad ZeroTailConfig {self}")

    @property
    def name(self) -> str:
        return f"zero_tail_t{self.threads}_{self.arch}"


class ZeroTailKernel:
    def __init__(self, cfg: ZeroTailConfig):
        self.cfg = cfg

    @cute.jit
    def __call__(
        self,
        mOut: cute.Tensor,  # (R * row_words,) int32: the output's rows as words
        mOffs: cute.Tensor,  # (E,) int32 cumulative end rows
        last: cutlass.Int32,  # E - 1
        cpr: cutlass.Int32,  # 16-byte chunks per row
        total: cutlass.Int32,  # chunks in all: R * cpr
        ctas: cutlass.Int32,  # the grid
        stream,
    ):
        self.kernel(mOut, mOffs, last, cpr, total).launch(grid=[ctas, 1, 1], block=[self.cfg.threads, 1, 1],
                                                          stream=stream)  # fmt: skip

    @cute.kernel
    def kernel(self, mOut, mOffs, last: cutlass.Int32, cpr: cutlass.Int32, total: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        # the first chunk past the last expert's rows (offs[-1] clamped into [0, R])
        first = cutlass.min(cutlass.max(mOffs[last], 0) * cpr, total)
        zero = cute.make_rmem_tensor((WORDS,), cutlass.Int32)
        zero.fill(0)
        for c in cutlass.range(first + bidx * self.cfg.threads + tidx, total, gdim * self.cfg.threads):
            cute.autovec_copy(zero, cute.local_tile(mOut, (WORDS,), (c,)))


def build_zero_tail(cfg: ZeroTailConfig):
    """(kernel object, fake args) for :class:`~cutegemm.runtime.cache.KernelCache`: one kernel
    serves every shape and dtype."""
    out = make_fake_tensor(cutlass.Int32, (cute.sym_int32(divisibility=WORDS),), (1,), assumed_align=16)
    offs = make_fake_tensor(cutlass.Int32, (cute.sym_int32(),), (1,), assumed_align=4)
    args = (out, offs, cutlass.Int32(0), cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1),
            make_fake_stream(use_tvm_ffi_env_stream=True))  # fmt: skip
    return ZeroTailKernel(cfg), args


@functools.cache
def kernel_cache() -> KernelCache:
    return KernelCache(build_zero_tail)


def all_configs(arch: str) -> list[ZeroTailConfig]:
    """Every kernel variant for ``arch`` (compile-check)."""
    return [ZeroTailConfig(arch=arch)]


def check_variant(cfg: ZeroTailConfig) -> tuple[bool, dict, str]:
    """Compile ``cfg`` to SASS (no GPU needed) and check it: (ok, marker counts, error)."""
    return check_sass(build_zero_tail(cfg), cfg.arch, SASS_REQUIRED, SASS_FORBIDDEN)


def kernel_takes(out: torch.Tensor, offs: torch.Tensor) -> bool:
    """Whether :func:`zero_tail_cuda` runs the call: CUDA out (R, N) contiguous, 16-byte aligned,
    its rows a multiple of 16 bytes, at most 2^31 - 1 int32 words; offs a non-empty contiguous
    int32 vector on out's device; sm_90a / sm_100a."""
    if not out.is_cuda or out.dim() != 2 or not out.is_contiguous() or out.data_ptr() % 16:
        return False
    row_bytes = out.shape[1] * out.element_size()
    if row_bytes % 16 or out.numel() * out.element_size() // 4 > MAX_ELEMENTS:
        return False
    if offs.dtype != torch.int32 or offs.dim() != 1 or offs.numel() == 0 or not offs.is_contiguous():
        return False
    return offs.device == out.device and device_info(out.device.index)[0] in ("sm_90a", "sm_100a")


def zero_tail_cuda(out: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Zero out's rows at or past offs[-1] in place (a call :func:`kernel_takes`); returns out."""
    cpr = out.shape[1] * out.element_size() // 16
    total = out.shape[0] * cpr
    if total == 0:
        return out
    arch, sms = device_info(out.device.index)
    cfg = ZeroTailConfig(arch=arch)
    ctas = max(1, min(4 * sms, (total + cfg.threads - 1) // cfg.threads))
    kernel_cache().get(cfg)(out.view(torch.int32).view(-1), offs, offs.numel() - 1, cpr, total, ctas)
    return out


__all__ = ["ZeroTailConfig", "all_configs", "check_variant", "kernel_takes", "zero_tail_cuda"]
