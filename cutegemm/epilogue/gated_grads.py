"""The gated activation of a MoE layer outside the GEMMs, as one elementwise pass (CuTe DSL,
sm_90a and sm_100a): ``H = silu(gate) * up`` from the pre-activations Z and, for the backward,
``dZ = (dH * up * silu'(gate), dH * silu(gate))`` in Z's layout, in one read of Z and dH and one
write of H and dZ (torch's formulas take about ten passes, with fp32 copies of Z and dH).

Z is (T, 2I) with gate / up columns interleaved (2j gate j, 2j + 1 up j: the kernels' layout) or
as ``[gate | up]`` halves; dH and H are (T, I); all bf16 or fp16, contiguous, I a multiple of 8.
Each thread takes 8 output columns of a row per step (one 128-bit load of dH, two of Z, one
128-bit store of H, two of dZ), ``steps`` chunks per thread with every load issued before the
math. fp32 math with the GEMM epilogue's silu (``epilogue.ops``: fast-math exp and reciprocal),
``silu'(g) = s (1 + g (1 - s))`` with ``s = sigmoid(g)``, rounded to the operands' dtype: within
a few fp32 ulps of torch's own formulas before that rounding (``ops.gated_grads`` runs torch's
where this kernel does not apply, and is what the GPU test compares against).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_stream

from ..runtime.cache import KernelCache
from ..runtime.device import device_info
from ..runtime.sass import check_sass
from . import rowwise
from .rowwise import (
    CHUNK,
    DTYPE_NAMES,
    KERNEL_DTYPES,
    check_swiglu_config,
    flat_tensor,
    gate_up_f32,
    store_dz,
    swiglu_grads,
    swiglu_operands,
    swiglu_parts,
    swiglu_registers,
)


@dataclass(frozen=True)
class GatedGradsConfig:
    """What changes the compiled kernel (the compile-cache key)."""

    dtype: str = "bf16"
    layout: str = "interleaved"  # or "halves"
    backward: bool = True  # dZ too (else H only)
    arch: str = "sm_90a"
    threads: int = 256
    steps: int = 2

    def __post_init__(self):
        check_swiglu_config(self)

    @property
    def name(self) -> str:
        return f"swiglu_{'bwd' if self.backward else 'fwd'}_{self.layout}_{self.dtype}_{self.arch}"


class GatedGradsKernel:
    def __init__(self, cfg: GatedGradsConfig):
        self.cfg = cfg
        self.dtype = KERNEL_DTYPES[cfg.dtype]

    @cute.jit
    def __call__(
        self,
        mZ: cute.Tensor,  # (T * 2I,) flat row-major
        mDH: cute.Tensor,  # (T * I,) (read only for the backward)
        mH: cute.Tensor,  # (T * I,)
        mDZ: cute.Tensor,  # (T * 2I,) (written only for the backward)
        cpr: cutlass.Int32,  # chunks per row: I / 8
        total: cutlass.Int32,  # chunks in all: T * I / 8
        stream,
    ):
        per_cta = self.cfg.threads * self.cfg.steps
        grid = (total + per_cta - 1) // per_cta
        div_cpr = cute.fast_divmod_create_divisor_v2(cpr)
        self.kernel(mZ, mDH, mH, mDZ, div_cpr, cpr, total).launch(
            grid=[grid, 1, 1], block=[self.cfg.threads, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, mZ, mDH, mH, mDZ, div_cpr, cpr: cutlass.Int32, total: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        U, T = self.cfg.steps, self.cfg.threads
        halves = self.cfg.layout == "halves"
        base = bidx * (T * U) + tidx
        rD, rZ, rG, rU, fZ, fG, fU, oH, oG, oU, oZ = swiglu_registers(self.dtype, U)
        for u in cutlass.range_constexpr(U):
            chunk = cutlass.min(base + u * T, total - 1)  # past the end: the last chunk, never stored
            if cutlass.const_expr(halves):
                g_idx = _gate_chunk(chunk, div_cpr, cpr)
                cute.autovec_copy(cute.local_tile(mZ, (CHUNK,), (g_idx,)), rG[None, u])
                cute.autovec_copy(cute.local_tile(mZ, (CHUNK,), (g_idx + cpr,)), rU[None, u])
            else:
                cute.autovec_copy(cute.local_tile(mZ, (2 * CHUNK,), (chunk,)), rZ[None, u])
            if cutlass.const_expr(self.cfg.backward):
                cute.autovec_copy(cute.local_tile(mDH, (CHUNK,), (chunk,)), rD[None, u])
        for u in cutlass.range_constexpr(U):
            chunk = base + u * T
            gate_up_f32(halves, u, rZ, rG, rU, fZ, fG, fU)
            g = fG.load()
            up = fU.load()
            s, a, h = swiglu_parts(g, up)
            oH.store(h.to(self.dtype))
            if chunk < total:
                cute.autovec_copy(oH, cute.local_tile(mH, (CHUNK,), (chunk,)))
            if cutlass.const_expr(self.cfg.backward):
                d_gate, d_up = swiglu_grads(rD[None, u].load().to(cutlass.Float32), g, up, s, a)
                if chunk < total:
                    store_dz(halves, d_gate, d_up, mDZ, chunk, _gate_chunk(chunk, div_cpr, cpr) if halves else chunk,
                             cpr, self.dtype, fZ, fG, fU, oG, oU, oZ)  # fmt: skip



def _gate_chunk(chunk, div_cpr, cpr):
    """Halves layout: the 8-element chunk of flat Z holding the gates of H's chunk ``chunk``."""
    row, cc = divmod(chunk, div_cpr)
    return row * (2 * cpr) + cc


def build_gated_grads(cfg: GatedGradsConfig):
    """(kernel object, fake args) for :class:`~cutegemm.runtime.cache.KernelCache`: one kernel
    serves every shape."""
    dt = KERNEL_DTYPES[cfg.dtype]
    args = (flat_tensor(dt, 2 * CHUNK), flat_tensor(dt, CHUNK), flat_tensor(dt, CHUNK), flat_tensor(dt, 2 * CHUNK), cutlass.Int32(1),
            cutlass.Int32(1), make_fake_stream(use_tvm_ffi_env_stream=True))  # fmt: skip
    return GatedGradsKernel(cfg), args


@functools.cache
def kernel_cache() -> KernelCache:
    return KernelCache(build_gated_grads)


def all_configs(arch: str) -> list[GatedGradsConfig]:
    """Every kernel variant for ``arch`` (compile-check)."""
    return [GatedGradsConfig(dtype=d, layout=lay, backward=bwd, arch=arch)
            for d in KERNEL_DTYPES for lay in ("interleaved", "halves") for bwd in (True, False)]  # fmt: skip


def check_variant(cfg: GatedGradsConfig) -> tuple[bool, dict, str]:
    """Compile ``cfg`` to SASS (no GPU needed) and check it: (ok, marker counts, error)."""
    return check_sass(build_gated_grads(cfg), cfg.arch, rowwise.SASS_REQUIRED, rowwise.SASS_FORBIDDEN)


def kernel_takes(activation: str, dh, z: torch.Tensor) -> bool:
    """Whether :func:`gated_grads_cuda` runs the call: swiglu, CUDA bf16 / fp16, Z (T, 2I) and dH
    (T, I) contiguous, 16-byte aligned, I a multiple of 8, on sm_90a / sm_100a."""
    if activation != "swiglu" or not swiglu_operands(dh, z):
        return False
    return device_info(z.device.index)[0] in ("sm_90a", "sm_100a")


def gated_grads_cuda(dh, z: torch.Tensor, gate_layout: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(H, dZ) (dZ None without dH) of swiglu by the kernel, for a call :func:`kernel_takes`."""
    rows, inter = z.shape[0], z.shape[1] // 2
    h = torch.empty(rows, inter, dtype=z.dtype, device=z.device)
    dz = torch.empty_like(z) if dh is not None else None
    total = rows * inter // CHUNK
    if total == 0:
        return h, dz
    cfg = GatedGradsConfig(dtype=DTYPE_NAMES[z.dtype], layout=gate_layout, backward=dh is not None,
                           arch=device_info(z.device.index)[0])  # fmt: skip
    kernel_cache().get(cfg)(z.view(-1), (dh if dh is not None else h).view(-1), h.view(-1), (dz if dz is not None else z).view(-1),
                      inter // CHUNK, total)  # fmt: skip
    return h, dz


__all__ = ["GatedGradsConfig", "all_configs", "check_variant", "gated_grads_cuda", "kernel_takes"]
