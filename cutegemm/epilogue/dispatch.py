"""A MoE layer's dispatch for few (token, slot) pairs as one launch (CuTe DSL, sm_90a and sm_100a):
the stable counting sort of the N = T k flattened top-k expert ids into

    order (N,)   the pair indices t * k + j sorted by expert, equal experts in pair order
    rows (N,)    order // k: the token of each sorted row (the grouped GEMM's gather index)
    experts (N,) the expert of each sorted row; an id outside [0, E) (an expert-parallel
                 sentinel, a dropped slot) counts as E and sorts last
    offs (E,)    the cumulative end row of each expert (rows at or past offs[-1]: the ids outside)
    inverse (N,) each pair's row: inverse[order[r]] = r (the combine's gather index)

all int32, what a stable ``torch.argsort`` of the ids, a gather and the experts' counts give in
torch (about ten launches at decode sizes). One CTA: its 1024 threads stage each pair's expert in
shared memory (all loads in flight at once), then one warp runs three passes over them, N / 32
steps each, with the E + 1 counters in shared memory: a histogram (the lanes holding one
expert found by ``match.any``; the lowest of them adds the group's size), a warp scan of the
counters into each expert's first row, then the scatter (a lane's row: its expert's next row plus
the number of lanes below it with the same expert). Deterministic: no atomics, the same output for
the same ids. For N up to MAX_PAIRS and E up to MAX_EXPERTS (decode and small prefill batches);
larger calls sort in torch (:func:`dispatch_ref`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import torch
from cutlass import memory
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

from ..runtime.cache import KernelCache
from ..runtime.device import device_info
from ..runtime.sass import check_sass

MAX_PAIRS = 8192  # staged in shared memory (32 KB); one warp: N / 32 steps per pass (decode: 16)
THREADS = 1024  # that stage the ids
MAX_EXPERTS = 1023  # E + 1 int32 counters in shared memory
ID_DTYPES = {torch.int32: "int32", torch.int64: "int64"}
_ID_KERNEL = {"int32": cutlass.Int32, "int64": cutlass.Int64}
FULL_MASK = 0xFFFFFFFF
# SASS of every variant: the warp match and no local-memory spills
SASS_REQUIRED = {"MATCH": r"\bMATCH\.ANY"}
SASS_FORBIDDEN = {"LDL": r"\bLDL(\.|\s)", "STL": r"\bSTL(\.|\s)"}


@dataclass(frozen=True)
class DispatchConfig:
    """What changes the compiled kernel (the compile-cache key)."""

    ids: str = "int64"  # the top-k ids' dtype (torch.topk gives int64)
    arch: str = "sm_90a"

    def __post_init__(self):
        if self.ids not in _ID_KERNEL or self.arch not in ("sm_90a", "sm_100a"):
            raise ValueError(f"bad DispatchConfig {self}")

    @property
    def name(self) -> str:
        return f"dispatch_{self.ids}_{self.arch}"


class DispatchKernel:
    def __init__(self, cfg: DispatchConfig):
        self.cfg = cfg

    @cute.jit
    def __call__(
        self,
        mIds: cute.Tensor,  # (N,) expert id per (token, slot) pair
        mOrder: cute.Tensor,  # (N,) int32
        mRows: cute.Tensor,  # (N,) int32
        mExperts: cute.Tensor,  # (N,) int32
        mOffs: cute.Tensor,  # (E,) int32
        mInv: cute.Tensor,  # (N,) int32
        n: cutlass.Int32,
        k: cutlass.Int32,
        experts: cutlass.Int32,
        stream,
    ):
        self.kernel(mIds, mOrder, mRows, mExperts, mOffs, mInv, n, k, experts).launch(
            grid=[1, 1, 1], block=[THREADS, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, mIds, mOrder, mRows, mExperts, mOffs, mInv, n: cutlass.Int32, k: cutlass.Int32,
               experts: cutlass.Int32):  # fmt: skip
        tidx, _, _ = cute.arch.thread_idx()
        lane = tidx % 32
        smem = memory.SmemAllocator()
        sBucket = smem.allocate_tensor(cutlass.Int32, cute.make_layout(MAX_PAIRS), 16)
        sCount = smem.allocate_tensor(cutlass.Int32, cute.make_layout(MAX_EXPERTS + 1), 16)
        # every thread: the pairs' counters (expert, or E outside [0, E)) staged in shared memory,
        # the loads of all warps in flight at once; the counters zeroed
        id_type = _ID_KERNEL[self.cfg.ids]
        for i in cutlass.range(tidx, n, THREADS):
            e = mIds[i]  # compared in its own width: an int64 id past 2**31 must not wrap into [0, E)
            bucket = experts
            if e >= id_type(0):
                if e < id_type(experts):
                    bucket = cutlass.Int32(e)
            sBucket[i] = bucket
        for b in cutlass.range(tidx, experts + 1, THREADS):
            sCount[b] = cutlass.Int32(0)
        cute.arch.sync_threads()
        if tidx < 32:  # warp 0: the three passes, in pair order
            # histogram: per step, the lowest lane of each expert's group adds the group's size
            for base in cutlass.range(0, n, 32):
                i = base + lane
                bucket = experts + 1  # a lane with no pair: its own group, never counted
                if i < n:
                    bucket = sBucket[i]
                peers = cute.arch.match_sync(FULL_MASK, bucket)
                if i < n:
                    if (peers & cute.arch.lanemask_lt()) == cutlass.Uint32(0):
                        sCount[bucket] = sCount[bucket] + cutlass.Int32(cute.arch.popc(peers))
                cute.arch.sync_warp()
            # exclusive scan of the E + 1 counters: each expert's first row; offs its end row
            carry = cutlass.Int32(0)
            for base in cutlass.range(0, experts + 1, 32):
                b = base + lane
                v = cutlass.Int32(0)
                if b <= experts:
                    v = sCount[b]
                incl = v
                for d in cutlass.range_constexpr(5):
                    up = cute.arch.shuffle_sync_up(incl, 1 << d)
                    if lane >= (1 << d):
                        incl = incl + up
                if b <= experts:
                    sCount[b] = carry + incl - v
                if b < experts:
                    mOffs[b] = carry + incl
                carry = carry + cute.arch.shuffle_sync(incl, 31)
            cute.arch.sync_warp()
            # scatter: a lane's row is its expert's next row plus its rank among the lanes below it
            for base in cutlass.range(0, n, 32):
                i = base + lane
                bucket = experts + 1
                if i < n:
                    bucket = sBucket[i]
                peers = cute.arch.match_sync(FULL_MASK, bucket)
                rank = cutlass.Int32(cute.arch.popc(peers & cute.arch.lanemask_lt()))
                if i < n:
                    row = sCount[bucket] + rank
                    mOrder[row] = i
                    mRows[row] = i // k
                    mExperts[row] = bucket
                    mInv[i] = row
                cute.arch.sync_warp()
                if i < n:
                    if rank == 0:
                        sCount[bucket] = sCount[bucket] + cutlass.Int32(cute.arch.popc(peers))
                cute.arch.sync_warp()


def build_dispatch(cfg: DispatchConfig):
    """(kernel object, fake args) for :class:`~cutegemm.runtime.cache.KernelCache`: one kernel
    serves every N and E."""

    def vec(dtype):
        return make_fake_tensor(dtype, (cute.sym_int32(),), (1,), assumed_align=4)

    i32 = cutlass.Int32
    args = (vec(_ID_KERNEL[cfg.ids]), vec(i32), vec(i32), vec(i32), vec(i32), vec(i32), i32(1), i32(1), i32(1),
            make_fake_stream(use_tvm_ffi_env_stream=True))  # fmt: skip
    return DispatchKernel(cfg), args


@functools.cache
def kernel_cache() -> KernelCache:
    return KernelCache(build_dispatch)


def all_configs(arch: str) -> list[DispatchConfig]:
    """Every kernel variant for ``arch`` (compile-check)."""
    return [DispatchConfig(ids=ids, arch=arch) for ids in _ID_KERNEL]


def check_variant(cfg: DispatchConfig) -> tuple[bool, dict, str]:
    """Compile ``cfg`` to SASS (no GPU needed) and check it: (ok, marker counts, error)."""
    return check_sass(build_dispatch(cfg), cfg.arch, SASS_REQUIRED, SASS_FORBIDDEN)


def kernel_takes(ids: torch.Tensor, experts: int) -> bool:
    """Whether :func:`dispatch_cuda` runs the call: contiguous 1-D int32 / int64 CUDA ids, at most
    MAX_PAIRS of them, 1 <= E <= MAX_EXPERTS, sm_90a / sm_100a."""
    return (ids.is_cuda and ids.dtype in ID_DTYPES and ids.dim() == 1 and ids.is_contiguous()
            and ids.numel() <= MAX_PAIRS and 1 <= experts <= MAX_EXPERTS
            and device_info(ids.device.index)[0] in ("sm_90a", "sm_100a"))  # fmt: skip


def dispatch_cuda(ids: torch.Tensor, k: int, experts: int):
    """(order, rows, experts of the rows, offs, inverse) of a call :func:`kernel_takes`: one launch."""
    n = ids.numel()
    order, rows, sorted_ids, inverse = (torch.empty(n, dtype=torch.int32, device=ids.device) for _ in range(4))
    offs = torch.empty(experts, dtype=torch.int32, device=ids.device)
    if n == 0:
        offs.zero_()
        return order, rows, sorted_ids, offs, inverse
    cfg = DispatchConfig(ids=ID_DTYPES[ids.dtype], arch=device_info(ids.device.index)[0])
    kernel_cache().get(cfg)(ids, order, rows, sorted_ids, offs, inverse, n, k, experts)
    return order, rows, sorted_ids, offs, inverse


def dispatch_ref(ids: torch.Tensor, k: int, experts: int):
    """The same five tensors in torch (any device, any N): the ids outside [0, E) made E (clamp,
    then remainder), a stable argsort, the gather of the sorted ids, each expert's end row by a
    binary search of them (no host sync), the inverse by a scatter. The sort's keys are the
    narrowest integers holding 0..E (uint8 up to 255 experts): a radix sort makes one pass per key
    byte (int64 ids took eight)."""
    key = torch.uint8 if experts < 256 else torch.int16 if experts < 2**15 - 1 else torch.int32
    bucket = ids.clamp(-1, experts).remainder(experts + 1).to(key)
    order = torch.argsort(bucket, stable=True).to(torch.int32)
    ends = torch.arange(1, experts + 1, dtype=bucket.dtype, device=ids.device)
    sorted_ids = bucket.index_select(0, order)
    offs = torch.searchsorted(sorted_ids, ends, out_int32=True)
    inverse = torch.empty_like(order).scatter_(0, order.long(), torch.arange(order.numel(), dtype=torch.int32,
                                                                              device=ids.device))  # fmt: skip
    return order, torch.div(order, k, rounding_mode="floor"), sorted_ids.to(torch.int32), offs, inverse


__all__ = ["DispatchConfig", "MAX_EXPERTS", "MAX_PAIRS", "all_configs", "check_variant", "dispatch_cuda",
           "dispatch_ref", "kernel_takes"]
