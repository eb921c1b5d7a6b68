"""The backward of a routed MoE layer's SwiGLU and routing weights between its GEMMs, as one row
pass (CuTe DSL, sm_90a and sm_100a). For expert row r with routing weight w_r, pre-activations
Z_r = (gate, up) and dH'_r = dout[token_r] W_down^T (the output gradient *not* yet weighted):

    H     = silu(gate) * up                                   (fp32, not stored)
    dZ_r  = (w_r dH'_r * up * silu'(gate), w_r dH'_r * silu(gate))     (Z's layout and dtype)
    WH_r  = w_r H_r                                           (the down projection's dW operand)
    dot_r = <dH'_r, H_r>                                      (fp32: the routing weight's gradient)

``moe.routed_experts``' backward did this in four passes over the R x I rows (H from Z, w dH' and
the dots, dZ, w H), each product rounded to bf16 on the way; here one read of dH' and Z and one
write of WH and dZ, every product in fp32 rounded once.

Z is (R, 2I) with gate / up interleaved (column 2j gate j, 2j + 1 up j) or as ``[gate | up]``
halves; dH' and WH are (R, I); all bf16 or fp16, contiguous, I a multiple of 8; w and dots fp32.
One warp per row, each lane 8 columns per step (128-bit loads and stores), ``steps`` chunks per
lane with every load issued before the math; the dot summed per lane in column order, then across
the warp by a fixed butterfly: the same bits every run (no atomics). silu as the GEMM epilogue's
(fast-math exp and reciprocal), silu'(g) = s (1 + g (1 - s)) with s = sigmoid(g).
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
class RoutedGradsConfig:
    """What changes the compiled kernel (the compile-cache key)."""

    dtype: str = "bf16"
    layout: str = "interleaved"  # or "halves"
    arch: str = "sm_90a"
    warps: int = 8  # rows per CTA
    steps: int = 4  # chunks per lane with their loads in flight together

    def __post_init__(self):
        check_swiglu_config(self)

    @property
    def name(self) -> str:
        return f"routed_swiglu_bwd_{self.layout}_{self.dtype}_w{self.warps}s{self.steps}_{self.arch}"


class RoutedGradsKernel:
    def __init__(self, cfg: RoutedGradsConfig):
        self.cfg = cfg
        self.dtype = KERNEL_DTYPES[cfg.dtype]

    @cute.jit
    def __call__(
        self,
        mDH: cute.Tensor,  # (R * I,) flat row-major dH'
        mZ: cute.Tensor,  # (R * 2I,)
        mW: cute.Tensor,  # (R,) fp32 routing weights
        mWH: cute.Tensor,  # (R * I,) out: w H
        mDZ: cute.Tensor,  # (R * 2I,) out: dZ
        mDots: cute.Tensor,  # (R,) fp32 out: <dH', H>
        cpr: cutlass.Int32,  # chunks per row: I / 8
        rows: cutlass.Int32,  # R
        stream,
    ):
        warps = self.cfg.warps
        self.kernel(mDH, mZ, mW, mWH, mDZ, mDots, cpr, rows).launch(
            grid=[(rows + warps - 1) // warps, 1, 1], block=[warps * 32, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, mDH, mZ, mW, mWH, mDZ, mDots, cpr: cutlass.Int32, rows: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        U = self.cfg.steps
        halves = self.cfg.layout == "halves"
        lane = tidx % 32
        row = bidx * self.cfg.warps + tidx // 32
        rD, rZ, rG, rU, fZ, fG, fU, oH, oG, oU, oZ = swiglu_registers(self.dtype, U)
        dot = cutlass.Float32(0.0)
        if row < rows:  # the whole warp: one row
            w = mW[row]
            for c0 in cutlass.range(0, cpr, 32 * U):
                for u in cutlass.range_constexpr(U):  # every load of the U chunks first
                    c = cutlass.min(c0 + u * 32 + lane, cpr - 1)  # past the row: its last chunk, never stored
                    chunk = row * cpr + c
                    cute.autovec_copy(cute.local_tile(mDH, (CHUNK,), (chunk,)), rD[None, u])
                    if cutlass.const_expr(halves):
                        g_idx = row * (2 * cpr) + c  # in units of 8 elements of the flat Z
                        cute.autovec_copy(cute.local_tile(mZ, (CHUNK,), (g_idx,)), rG[None, u])
                        cute.autovec_copy(cute.local_tile(mZ, (CHUNK,), (g_idx + cpr,)), rU[None, u])
                    else:
                        cute.autovec_copy(cute.local_tile(mZ, (2 * CHUNK,), (chunk,)), rZ[None, u])
                for u in cutlass.range_constexpr(U):
                    c = c0 + u * 32 + lane
                    gate_up_f32(halves, u, rZ, rG, rU, fZ, fG, fU)
                    g = fG.load()
                    up = fU.load()
                    s, a, h = swiglu_parts(g, up)
                    dp = rD[None, u].load().to(cutlass.Float32)
                    d_gate, d_up = swiglu_grads(dp * w, g, up, s, a)
                    if c < cpr:
                        dot = dot + (dp * h).reduce(cute.ReductionOp.ADD, 0.0, 0)
                        oH.store((h * w).to(self.dtype))
                        cute.autovec_copy(oH, cute.local_tile(mWH, (CHUNK,), (row * cpr + c,)))
                        store_dz(halves, d_gate, d_up, mDZ, row * cpr + c, row * (2 * cpr) + c, cpr, self.dtype,
                                 fZ, fG, fU, oG, oU, oZ)  # fmt: skip
            dot = cute.arch.warp_reduction_sum(dot)
            if lane == 0:
                mDots[row] = dot


def build_routed_grads(cfg: RoutedGradsConfig):
    """(kernel object, fake args) for :class:`~cutegemm.runtime.cache.KernelCache`: one kernel
    serves every shape."""
    dt = KERNEL_DTYPES[cfg.dtype]
    vec = make_fake_tensor(cutlass.Float32, (cute.sym_int32(),), (1,), assumed_align=4)
    dots = make_fake_tensor(cutlass.Float32, (cute.sym_int32(),), (1,), assumed_align=4)
    args = (flat_tensor(dt, CHUNK), flat_tensor(dt, 2 * CHUNK), vec, flat_tensor(dt, CHUNK), flat_tensor(dt, 2 * CHUNK),
            dots, cutlass.Int32(1), cutlass.Int32(1), make_fake_stream(use_tvm_ffi_env_stream=True))  # fmt: skip
    return RoutedGradsKernel(cfg), args


@functools.cache
def kernel_cache() -> KernelCache:
    return KernelCache(build_routed_grads)


def all_configs(arch: str) -> list[RoutedGradsConfig]:
    """Every kernel variant for ``arch`` (compile-check)."""
    return [RoutedGradsConfig(dtype=d, layout=lay, arch=arch) for d in KERNEL_DTYPES for lay in ("interleaved", "halves")]


def check_variant(cfg: RoutedGradsConfig) -> tuple[bool, dict, str]:
    """Compile ``cfg`` to SASS (no GPU needed) and check it: (ok, marker counts, error)."""
    return check_sass(build_routed_grads(cfg), cfg.arch, rowwise.SASS_REQUIRED, rowwise.SASS_FORBIDDEN)


def kernel_takes(dhp: torch.Tensor, z: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether :func:`routed_grads_cuda` runs the call: CUDA bf16 / fp16 Z (R, 2I) and dH' (R, I)
    contiguous, 16-byte aligned, I a multiple of 8; w (R,) fp32 contiguous; one device; sm_90a /
    sm_100a."""
    if not swiglu_operands(dhp, z) or w.dtype != torch.float32 or w.shape != (z.shape[0],) or not w.is_contiguous():
        return False
    return w.device == z.device and device_info(z.device.index)[0] in ("sm_90a", "sm_100a")


def routed_grads_cuda(dhp: torch.Tensor, z: torch.Tensor, w: torch.Tensor, gate_layout: str):
    """(WH, dZ, dots) of swiglu's routed backward by the kernel, for a call :func:`kernel_takes`."""
    rows, inter = z.shape[0], z.shape[1] // 2
    wh = torch.empty(rows, inter, dtype=z.dtype, device=z.device)
    dz = torch.empty_like(z)
    dots = torch.empty(rows, dtype=torch.float32, device=z.device)
    if rows == 0:
        return wh, dz, dots
    if inter == 0:
        return wh, dz, dots.zero_()
    cfg = RoutedGradsConfig(dtype=DTYPE_NAMES[z.dtype], layout=gate_layout, arch=device_info(z.device.index)[0])
    kernel_cache().get(cfg)(dhp.view(-1), z.view(-1), w, wh.view(-1), dz.view(-1), dots, inter // CHUNK, rows)
    return wh, dz, dots


__all__ = ["RoutedGradsConfig", "all_configs", "check_variant", "kernel_takes", "routed_grads_cuda"]
