"""A MoE layer's row combines outside the GEMMs, as one pass (CuTe DSL, sm_90a and sm_100a):

    out[i, :] = sum_{j < k} w[i k + j] * src[idx[i k + j], :]        (fp32 sums, in slot order)

(``ragged``: over j in [ptr[i], ptr[i + 1]) instead, unweighted) and, with ``dot`` (k = 1),
``dots[i] = <src[idx[i]], other[i]>`` beside it. What it serves
(``ops.combine_rows``, ``moe.combine`` / ``moe.gather_tokens``):
- the combine's forward: each token's k expert rows (gathered by the inverse of the dispatch
  order), weighted by the routing weights and summed: one read of the rows, one write of the
  tokens (torch: a gathered copy, a product and a sum: five passes over the k rows);
- its backward: each expert row's gradient ``w * dout[token]`` and, by ``dot``, the routing
  weight's ``<dout[token], y[row]>``;
- the dispatch's backward (``w`` all ones): each token's k row gradients summed; ``ragged``: a
  gather by any index (``moe.gather_rows``), each token's rows (any count) summed.

src, out and other are row-major bf16 / fp16 with H a multiple of 8 columns and 16-byte aligned
rows; idx int32, w and dots fp32. One warp per output row, each lane 8 columns per step (128-bit
loads and stores), the k source rows read in slot order with fp32 products and sums, rounded once
to the output dtype: the same bits every run (no atomics).
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
from . import rowwise
from .rowwise import CHUNK, DTYPE_NAMES, KERNEL_DTYPES, MAX_ELEMENTS, flat_tensor


@dataclass(frozen=True)
class CombineConfig:
    """What changes the compiled kernel (the compile-cache key)."""

    dtype: str = "bf16"
    weighted: bool = True  # w given (else every weight is 1)
    dot: bool = False  # dots[i] = <src[idx[i]], other[i]> too (k = 1)
    ragged: bool = False  # row i sums idx[ptr[i]:ptr[i + 1]] (unweighted) instead of k per row
    arch: str = "sm_90a"
    warps: int = 8  # per CTA, one output row each

    def __post_init__(self):
        if self.dtype not in KERNEL_DTYPES or self.arch not in ("sm_90a", "sm_100a") or (
                self.ragged and (self.weighted or self.dot)):  # fmt: skip
            raise ValueError(f"bad CombineConfig {self}")

    @property
    def name(self) -> str:
        what = ("weighted" if self.weighted else "ragged" if self.ragged else "sum") + ("_dot" if self.dot else "")
        return f"combine_{what}_{self.dtype}_{self.arch}"


class CombineKernel:
    def __init__(self, cfg: CombineConfig):
        self.cfg = cfg
        self.dtype = KERNEL_DTYPES[cfg.dtype]

    @cute.jit
    def __call__(
        self,
        mSrc: cute.Tensor,  # (S * H,) flat row-major
        mIdx: cute.Tensor,  # (R * k,) int32 source rows
        mW: cute.Tensor,  # (R * k,) fp32 weights (read only when weighted); ragged: (R + 1,) int32 ptr
        mOut: cute.Tensor,  # (R * H,)
        mOther: cute.Tensor,  # (R * H,) (read only with dot)
        mDots: cute.Tensor,  # (R,) fp32 (written only with dot)
        k: cutlass.Int32,
        cpr: cutlass.Int32,  # chunks per row: H / 8
        rows: cutlass.Int32,  # R
        stream,
    ):
        warps = self.cfg.warps
        grid = (rows + warps - 1) // warps
        self.kernel(mSrc, mIdx, mW, mOut, mOther, mDots, k, cpr, rows).launch(
            grid=[grid, 1, 1], block=[warps * 32, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, mSrc, mIdx, mW, mOut, mOther, mDots, k: cutlass.Int32, cpr: cutlass.Int32,
               rows: cutlass.Int32):  # fmt: skip
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % 32
        row = bidx * self.cfg.warps + tidx // 32
        rV = cute.make_rmem_tensor((CHUNK,), self.dtype)
        rO = cute.make_rmem_tensor((CHUNK,), self.dtype)
        acc = cute.make_rmem_tensor((CHUNK,), cutlass.Float32)
        out = cute.make_rmem_tensor((CHUNK,), self.dtype)
        dot = cutlass.Float32(0.0)
        if row < rows:  # the whole warp: one row
            for c in cutlass.range(lane, cpr, 32):
                acc.fill(0.0)
                first, count = row * k, k
                if cutlass.const_expr(self.cfg.ragged):
                    first = mW[row]
                    count = mW[row + 1] - first
                for j in cutlass.range(count):
                    src_row = mIdx[first + j]
                    cute.autovec_copy(cute.local_tile(mSrc, (CHUNK,), (src_row * cpr + c,)), rV)
                    v = rV.load().to(cutlass.Float32)
                    if cutlass.const_expr(self.cfg.weighted):
                        acc.store(acc.load() + v * mW[first + j])
                    else:
                        acc.store(acc.load() + v)
                    if cutlass.const_expr(self.cfg.dot):
                        cute.autovec_copy(cute.local_tile(mOther, (CHUNK,), (row * cpr + c,)), rO)
                        dot = dot + (v * rO.load().to(cutlass.Float32)).reduce(cute.ReductionOp.ADD, 0.0, 0)
                out.store(acc.load().to(self.dtype))
                cute.autovec_copy(out, cute.local_tile(mOut, (CHUNK,), (row * cpr + c,)))
            if cutlass.const_expr(self.cfg.dot):
                dot = cute.arch.warp_reduction_sum(dot)
                if lane == 0:
                    mDots[row] = dot



def build_combine(cfg: CombineConfig):
    """(kernel object, fake args) for :class:`~cutegemm.runtime.cache.KernelCache`: one kernel
    serves every shape."""
    dt = KERNEL_DTYPES[cfg.dtype]
    one = make_fake_tensor(cutlass.Int32, (cute.sym_int32(),), (1,), assumed_align=4)
    f32 = make_fake_tensor(cutlass.Int32 if cfg.ragged else cutlass.Float32, (cute.sym_int32(),), (1,), assumed_align=4)
    dots = make_fake_tensor(cutlass.Float32, (cute.sym_int32(),), (1,), assumed_align=4)
    args = (flat_tensor(dt, CHUNK), one, f32, flat_tensor(dt, CHUNK), flat_tensor(dt, CHUNK), dots, cutlass.Int32(1),
            cutlass.Int32(1), cutlass.Int32(1), make_fake_stream(use_tvm_ffi_env_stream=True))  # fmt: skip
    return CombineKernel(cfg), args


@functools.cache
def kernel_cache() -> KernelCache:
    return KernelCache(build_combine)


def all_configs(arch: str) -> list[CombineConfig]:
    """Every kernel variant for ``arch`` (compile-check)."""
    return [CombineConfig(dtype=d, weighted=w, dot=dot, ragged=r, arch=arch) for d in KERNEL_DTYPES
            for w, dot, r in ((True, False, False), (False, False, False), (True, True, False), (False, False, True))]  # fmt: skip


def check_variant(cfg: CombineConfig) -> tuple[bool, dict, str]:
    """Compile ``cfg`` to SASS (no GPU needed) and check it: (ok, marker counts, error)."""
    return check_sass(build_combine(cfg), cfg.arch, rowwise.SASS_REQUIRED, rowwise.SASS_FORBIDDEN)


def _rows_ok(t: torch.Tensor, dtype) -> bool:
    return (t.dim() == 2 and t.dtype == dtype and t.is_contiguous() and t.data_ptr() % 16 == 0
            and t.numel() <= MAX_ELEMENTS)  # fmt: skip


def kernel_takes(src: torch.Tensor, idx: torch.Tensor, w, other=None) -> bool:
    """Whether :func:`combine_rows_cuda` runs the call: CUDA bf16 / fp16 src (S, H) row-major,
    H a multiple of 8, 16-byte aligned; idx int32 and w fp32 (or None; ragged: the int32 ptr),
    contiguous, on src's device; other (with dot) like src; sm_90a / sm_100a."""
    if not src.is_cuda or src.dtype not in DTYPE_NAMES or not _rows_ok(src, src.dtype) or src.shape[1] % CHUNK:
        return False
    if idx.dtype != torch.int32 or idx.dim() != 1 or not idx.is_contiguous() or idx.device != src.device:
        return False
    if w is not None and (w.dtype not in (torch.float32, torch.int32) or w.dim() != 1 or not w.is_contiguous()
                          or w.device != src.device):  # fmt: skip
        return False
    if other is not None and (not _rows_ok(other, src.dtype) or other.shape[1] != src.shape[1]
                              or other.device != src.device):  # fmt: skip
        return False
    return device_info(src.device.index)[0] in ("sm_90a", "sm_100a")


def combine_rows_cuda(src: torch.Tensor, idx: torch.Tensor, w, k: int, other=None, ptr=None):
    """(out, dots): out (R, H) in src's dtype with R = idx.numel() / k (``ptr``: R = ptr.numel()
    - 1, row i the sum of src[idx[ptr[i]:ptr[i + 1]]], w unused), dots (R,) fp32 with ``other``
    (k = 1), else None; for a call :func:`kernel_takes`."""
    rows, cols = (ptr.numel() - 1 if ptr is not None else idx.numel() // k), src.shape[1]
    out = torch.empty(rows, cols, dtype=src.dtype, device=src.device)
    dots = torch.empty(rows, dtype=torch.float32, device=src.device) if other is not None else None
    if rows == 0 or cols == 0:
        if dots is not None:
            dots.zero_()
        return out, dots
    if other is not None and (k != 1 or other.shape[0] != rows or ptr is not None):
        raise ValueError(f"dot takes k = 1 and other with {rows} rows, got k = {k}, {other.shape[0]} rows")
    if (w is not None and w.numel() != idx.numel()) or (ptr is not None and ptr.dtype != torch.int32):
        raise ValueError("w must hold one weight per index and ptr be int32")
    cfg = CombineConfig(dtype=DTYPE_NAMES[src.dtype], weighted=w is not None, dot=other is not None,
                        ragged=ptr is not None, arch=device_info(src.device.index)[0])  # fmt: skip
    wt = ptr if ptr is not None else w if w is not None else torch.empty(1, dtype=torch.float32, device=src.device)
    dummy = wt if wt.dtype == torch.float32 else torch.empty(1, dtype=torch.float32, device=src.device)
    kernel_cache().get(cfg)(src.view(-1), idx, wt, out.view(-1), (other if other is not None else out).view(-1),
                            dots if dots is not None else dummy, k, cols // CHUNK, rows)  # fmt: skip
    return out, dots


__all__ = ["CombineConfig", "all_configs", "check_variant", "combine_rows_cuda", "kernel_takes"]
