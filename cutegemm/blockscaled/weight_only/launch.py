"""Host side of the FP4-weight GEMM (:mod:`cutegemm.blockscaled.weight_only.kernel`), which also takes
MXFP8 (e4m3) weights.

``gemm_fp4_weight(x, qw)``: ``x @ dequantize(qw).mT`` for bf16 activations ``x`` (M, K) and an
NVFP4 / MXFP4 / MXFP8 :class:`BlockScaledTensor` weight ``qw`` of logical shape (N, K) (quantized along
K, the layout ``cutegemm.quantize(w, "nvfp4")`` gives for a ``(N, K)`` nn.Linear weight). With
``offs`` it is the MoE packed form: ``x`` (total_M, K), ``qw`` (E, N, K), ``offs`` int32 (E,)
cumulative end rows on the GPU; rows of expert e are ``offs[e-1] .. offs[e]``; rows at or past
``offs[-1]`` are not written. No host sync (the global scale stays on the device), so the
call can be captured in a CUDA graph. Public entry points: ``cutegemm.gemm(x, qw)`` and
``cutegemm.grouped_gemm(x, qw, offs=offs)``; ``cutegemm.gemm_ref`` / ``grouped_gemm_ref`` run
:func:`gemm_fp4_weight_ref`.

Supported: bf16 activations, or float8_e4m3fn ones with optional per-token / per-tensor fp32
``scale_a`` (converted to bf16 exactly by one copy, the scale applied to the fp32 results); K a
multiple of 32 (MXFP8: 16; the kernel loads 16-byte pieces of weight rows); out_dtype bf16 /
fp16 / fp32.
``x`` may be any strided view (the kernel reads rows of K contiguous, 16-byte aligned bf16; other
views are copied first). Any M works (other K: ValueError). The policy (``pick_config``,
``dequantize_first``): decode (up to 16 rows dense, 32 per expert grouped) on the kernel's
``mma.sync`` consumers; on sm_90a from 17 rows (33 per expert) its WGMMA consumers (64 tokens per
pass over a CTA's weight rows, 128 from 65 rows, 256 from 129 where fewer 256-token passes cost
less, more tokens taking more passes that re-read those rows, mostly from L2); from DQ_MIN_ROWS
dense rows / DQ_MIN_ROWS_GROUPED rows per expert the weight is dequantized once to bf16 (temporary
memory: 2 bytes per weight element) and the bf16 GEMM runs on it. MXFP8 weights: the mma.sync
consumers up to 32 dense rows, the WGMMA ones above, dequantize-first from DQ_MIN_ROWS_FP8 dense /
DQ_MIN_ROWS_GROUPED_FP8 rows per expert (``dq_min_rows``; on sm_100a, whose kernel has the mma.sync
consumers only, the lower ``*_MMA_SYNC`` thresholds). Dense calls whose 128-row weight tiles are
fewer than the SMs run on the split grid even with one token pass (``policy_config``). Dense
256-token passes are dealt in (weight tile, pass) units where that fills the SMs' waves better
than a CTA per tile running all its passes (``pass_grid_pays``; e.g. N=28672 on 132 SMs from 1024
rows: 896 units in 7 waves instead of 224 tiles in 2): FP4 weights on a persistent grid (one CTA
per SM taking units round-robin), MXFP8 a CTA per unit. Where the persistent grid's last round
would be less than half full (``tail_split_pays``; N=28672 on 132 SMs: 512 and 768 rows), it
runs its full rounds whole and cuts the last round's units into equal K ranges over all the
CTAs (``Fp4WeightConfig.tail_split``; cut units meet through the workspace below, bitwise
reproducibly). A forced ``config`` always runs the kernel.

Dense calls with several token passes use the split grid (``Fp4WeightConfig.split``) or the cut
tail: their workspace (counters the kernel leaves at zero + two fp32 partial-sum slots of a
CTA's tile per CTA: ~35 MB on 132 SMs) is a view of the split-K buffer of the current (device,
stream) that the dense split-K plans share (``gemm.launch.split_workspace``), so calls on one
stream are safe, and a buffer that is outgrown stays allocated. A CUDA graph keeps the workspace
of the stream it was captured on: do not replay it concurrently with split calls on that stream,
or with another graph captured on the same stream (replays one after another are fine).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from ...gemm.dense import gemm
from ...gemm.launch import current_device, split_workspace, stream_of
from ...gemm.sm90.split import split_counter_words
from ...grouped.packed import grouped_gemm
from ...runtime.device import device_info
from ...schedulers.grouped import expert_rows
from ..dequant import dequantizable, dequantize_checked
from ..formats import MXFP4, MXFP8, NVFP4
from ..quantize_launch import ones_on
from ..reference import BlockScaledTensor, check_block_scaled, dequantize_ref
from .kernel import kernel_cache
from .math import fragment_order_x
from .policy import OUT_NAMES, pick_config

__all__ = ["gemm_fp4_weight", "gemm_fp4_weight_ref", "pick_config", "is_fp4_weight_call", "warm_call"]

_FORMATS = (NVFP4.name, MXFP4.name, MXFP8.name)  # MXFP8: e4m3 elements (not the e5m2 variant)


def is_fp4_weight_call(a, b) -> bool:
    """True for (activation tensor, NVFP4 / MXFP4 / MXFP8 BlockScaledTensor weight)."""
    return isinstance(a, torch.Tensor) and isinstance(b, BlockScaledTensor) and b.fmt.name in _FORMATS


def check_args(x, qw, offs=None, out_dtype=torch.bfloat16, scale_a=None) -> None:
    """The argument rules shared by the kernel path and its reference twin (no device rule)."""
    if scale_a is not None:
        if getattr(x, "dtype", None) != torch.float8_e4m3fn:
            raise ValueError("scale_a (per-token activation scales) is for float8_e4m3fn activations")
        if not isinstance(scale_a, torch.Tensor) or scale_a.dtype != torch.float32:
            raise TypeError("scale_a must be a float32 tensor of shape (M,), (M, 1) or one element")
        if scale_a.numel() not in (1, x.shape[0]) or scale_a.dim() > 2:
            raise ValueError(f"scale_a must have 1 or M={x.shape[0]} elements, got shape {tuple(scale_a.shape)}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if not isinstance(qw, BlockScaledTensor):
        raise TypeError(f"qw: expected a BlockScaledTensor, got {type(qw).__name__}")
    if qw.fmt.name not in _FORMATS:
        raise ValueError(
            f"qw: the low-precision-weight GEMM takes {' / '.join(_FORMATS)} weights, got {qw.fmt.name} "
            "(block-scaled x block-scaled is cutegemm.gemm(qa, qb))"
        )
    if qw.fmt.name == MXFP8.name and qw.data.dtype != torch.float8_e4m3fn:
        raise TypeError(f"qw: MXFP8 weight elements must be float8_e4m3fn, got {qw.data.dtype}")
    check_block_scaled(qw, "qw")  # (cold calls only: a warm plan serves the very tensors it checked)
    if x.dtype not in (torch.bfloat16, torch.float8_e4m3fn):
        raise TypeError(f"x: the FP4-weight GEMM takes bf16 or float8_e4m3fn activations, got {x.dtype}")
    grouped = offs is not None
    if x.dim() != 2:
        raise ValueError(f"x: expected (M, K), got {tuple(x.shape)}")
    if len(qw.shape) != (3 if grouped else 2):
        want = "(E, N, K) with offs" if grouped else "(N, K) without offs"
        raise ValueError(f"qw: expected {want}, got {tuple(qw.shape)}")
    if x.shape[1] != qw.shape[-1]:
        raise ValueError(f"K mismatch: x {tuple(x.shape)} vs qw {tuple(qw.shape)}")
    if grouped:
        if not isinstance(offs, torch.Tensor) or offs.dtype != torch.int32 or offs.dim() != 1:
            raise TypeError("offs must be a 1-D torch.int32 tensor")
        if offs.numel() != qw.shape[0]:
            raise ValueError(f"offs has {offs.numel()} entries but qw has {qw.shape[0]} experts")
    if not isinstance(out_dtype, torch.dtype) or not out_dtype.is_floating_point:
        raise TypeError(f"out_dtype must be a floating torch dtype, got {out_dtype}")


def check_devices(x, qw, offs) -> None:
    dev = x.device
    if dev.type != "cuda" or qw.data.device != dev or (offs is not None and offs.device != dev):
        raise ValueError(f"x, qw (and offs) must be on one CUDA device, got {dev}, {qw.data.device}")


def weight_arch(index: int) -> str:
    try:
        return device_info(index)[0]
    except ValueError as exc:
        raise NotImplementedError(f"the FP4-weight GEMM: {exc}") from None


# Warm calls: (id(qw), the call's signature) -> _Plan. A plan holds what the call derives from
# the weight and the policy (config, compiled kernel, the weight's views, the split geometry); it
# serves only the BlockScaledTensor it was made for, and only while that object still holds the
# same data / scales / global-scale tensors (every cached tensor is a view of them, so in-place
# updates are seen); it is dropped when that object is freed.
_PLANS: dict = {}


@dataclass(eq=False)
class _Plan:
    qw: weakref.ref
    srcs: tuple  # qw's fields the plan was made from (_sources): data, scales, global scale, format, ...
    fn: object
    ring: bool
    data: torch.Tensor
    scales: torch.Tensor
    gs: torch.Tensor
    n: int
    k: int
    batches: int
    n_ctas: int
    split: tuple | None  # (segs, slot words) of a launch that meets through the workspace
    sf_cols: int
    out_dtype: torch.dtype
    device: torch.device
    m: int  # x's rows and dtype (both in the key)
    x_dtype: torch.dtype

    def serves(self, qw) -> bool:
        return self.qw() is qw and _same_sources(self.srcs, qw)

    def __post_init__(self):
        self.gs_words = self.gs.view(torch.int32)
        self.index = self.device.index  # what current_device() returns on the plan's device
        self.x_ready = self.ring and self.x_dtype == torch.bfloat16  # x itself where contiguous and aligned
        self.tail = self._tail(self.gs_words, 0)
        self.bound = None  # split: the stream handle whose workspace ``tail`` holds

    def _tail(self, work, slot0) -> tuple:
        """The kernel's arguments after (x, data, scales, out, offs) but alpha."""
        gs = self.gs
        return (gs, gs, work, self.m, self.n, self.k, self.batches, 1, self.n_ctas, slot0, self.sf_cols)

    def run(self, x, offs, alpha) -> torch.Tensor:
        """The call on this plan's weight (the slow path's steps that depend on ``x``)."""
        if self.x_ready and x.is_contiguous():
            xf = x
        elif self.ring:
            xf = x.to(torch.bfloat16).contiguous()
        else:
            xf = fragment_order_x(x)  # a fresh tensor: contiguous and aligned
        if self.ring and xf.data_ptr() % 16:
            xf = xf.clone()
        out = torch.empty(self.m, self.n, dtype=self.out_dtype, device=self.device)
        tail = self.tail
        if self.split is not None and stream_of(self.device) != self.bound:
            # the workspace of the stream it launches on (first call, or another stream than the last)
            work, slot0, self.bound = _workspace(self.device, *self.split)
            tail = self.tail = self._tail(work, slot0)
        # xf is contiguous (used as it is only then, else a contiguous copy): ravel is its flat
        # view with less argument parsing than view(-1)
        self.fn(xf.view(torch.int32).ravel(), self.data, self.scales, out.ravel(),
                self.gs_words if offs is None else offs, *tail, float(alpha))  # fmt: skip
        return out


def _plan_key(x, qw, offs, out_dtype):
    """A plan's key: what its config and views depend on (x's strides are not: the warm call
    reads or copies x as the cold call does)."""
    return (id(qw), x.shape, x.dtype, x.device, out_dtype,
            None if offs is None else (offs.dtype, offs.shape, offs.device))  # fmt: skip


_BF16 = torch.bfloat16


def warm_call(x, qw, offs=None, out_dtype=_BF16, alpha=1.0):
    """``gemm_fp4_weight(x, qw, offs=offs, out_dtype=out_dtype, alpha=alpha)`` (no out, scale_a
    or config) from the plan an earlier such call filed; None where no plan serves the call (the
    caller then runs :func:`gemm_fp4_weight`). ``x`` a torch.Tensor, ``offs`` None or one."""
    if out_dtype.__class__ is not torch.dtype:  # (unhashable or not a dtype: the checks' error)
        return None
    plan = _PLANS.get(_plan_key(x, qw, offs, out_dtype))
    if plan is None or not plan.serves(qw) or current_device() != plan.index:
        return None
    return plan.run(x, offs, alpha)


def _sources(qw) -> tuple:
    """The fields of ``qw`` a plan is made from: its tensors (the plan holds views of them), its
    format, logical shape and scale layout (the weight's config, views and checks)."""
    return qw.data, qw.scales, qw.global_scale, qw.fmt, qw.shape, qw.scales_swizzled


def _same_sources(srcs: tuple, qw) -> bool:
    """Whether ``qw`` still holds the very objects of ``srcs`` (:func:`_sources`)."""
    return (srcs[0] is qw.data and srcs[1] is qw.scales and srcs[2] is qw.global_scale and srcs[3] is qw.fmt
            and srcs[4] is qw.shape and srcs[5] is qw.scales_swizzled)  # fmt: skip


def gemm_fp4_weight(
    x: torch.Tensor,
    qw: BlockScaledTensor,
    *,
    offs: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    alpha: float = 1.0,
    scale_a: torch.Tensor | None = None,
    config=None,
) -> torch.Tensor:
    """``alpha * x @ dequantize(qw).mT`` (fp32 accumulation), dense or MoE packed; see the
    module docstring. ``out``: an (M, N) tensor to write (its dtype is the output dtype); any
    view: one that is not contiguous (or not 4-byte aligned) is written through a contiguous
    copy of itself (two extra copies; rows the kernel does not write keep their values). ``x``
    float8_e4m3fn: converted to bf16 (exact) by one copy on the host; ``scale_a`` (fp32, (M,) /
    (M, 1) per token or one element) multiplies each token's outputs in the kernel. Raises
    TypeError / ValueError for bad arguments, NotImplementedError on a GPU other than sm_90 /
    sm_100."""
    if out_dtype is None:
        out_dtype = out.dtype if isinstance(out, torch.Tensor) else torch.bfloat16
    warm = (out is None and scale_a is None and config is None and isinstance(x, torch.Tensor)
            and out_dtype.__class__ is torch.dtype)  # (else unhashable, or the checks' error)  # fmt: skip
    if warm:
        res = warm_call(x, qw, offs, out_dtype, alpha)
        if res is not None:
            return res
    check_args(x, qw, offs, out_dtype, scale_a)
    if out_dtype not in OUT_NAMES:
        raise TypeError(f"out_dtype must be one of {list(OUT_NAMES)}, got {out_dtype}")
    dev = x.device
    check_devices(x, qw, offs)
    m, k = x.shape
    n = qw.shape[-2]
    k_mult = 16 * qw.fmt.elems_per_byte  # the kernel reads 16-byte pieces of weight rows
    if k % k_mult or k == 0:
        raise ValueError(f"the {qw.fmt.name}-weight GEMM needs K a positive multiple of {k_mult}, got K={k}")
    grouped = offs is not None
    batches = qw.shape[0] if grouped else 1
    if out is None:
        out = torch.empty(m, n, dtype=out_dtype, device=dev)
    elif not isinstance(out, torch.Tensor) or out.shape != (m, n) or out.dtype != out_dtype or out.device != dev:
        raise ValueError(f"out must be a ({m}, {n}) {out_dtype} tensor on {dev}")
    if m == 0 or n == 0 or batches == 0:
        return out
    if not out.is_contiguous() or out.data_ptr() % 4:
        staged = out.clone(memory_format=torch.contiguous_format)  # keeps the rows not written
        gemm_fp4_weight(x, qw, offs=offs, out=staged, out_dtype=out_dtype, alpha=alpha, scale_a=scale_a, config=config)
        return out.copy_(staged)
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    arch = weight_arch(idx)
    x_scale = scale_a is not None
    if x_scale:
        if scale_a.device != dev:
            raise ValueError(f"scale_a must be on {dev}, got {scale_a.device}")
        scale_a = scale_a.reshape(-1).expand(m).contiguous()  # one element: broadcast, no host read
    if config is None and dequantize_first(m, batches, grouped, x_scale, qw, arch):
        return _dequantized(x, qw, offs, out, out_dtype, alpha, scale_a)
    cfg = config or policy_config(m, n, qw.fmt.name, out_dtype, arch, grouped, batches, x_scale, idx)
    if (cfg.fmt, cfg.grouped, cfg.out_dtype, cfg.x_scale) != (qw.fmt.name, grouped, OUT_NAMES[out_dtype], x_scale):
        raise ValueError(
            f"config {cfg.name} does not match this call ({qw.fmt.name}, grouped={grouped}, {out_dtype}, "
            f"scale_a={'yes' if x_scale else 'no'})"
        )

    if cfg.ring:
        # the ring reads x as it is (TMA boxes): bf16, rows of K contiguous, 16-byte aligned
        xf = x.to(torch.bfloat16).contiguous()
        if xf.data_ptr() % 16:
            xf = xf.clone()
    else:
        xf = fragment_order_x(x)  # a small copy: the activations in the kernel's fragment order
    data = qw.data.contiguous().view(torch.uint8).reshape(-1)
    if data.data_ptr() % 16:
        data = data.clone()
    scales = qw.swizzled_scales().contiguous().view(torch.uint8).reshape(-1)
    n_p = -(-n // 128) * 128
    cols_p = scales.numel() // (batches * n_p)
    gs = qw.global_scale
    gs = ones_on(dev) if gs is None else gs.detach().to(device=dev, dtype=torch.float32).reshape(1)
    m_slices = 1  # a CTA's passes over its weight rows run back to back: the repeats hit L2
    n_ctas, work, slot0, split = 0, gs.view(torch.int32), 0, None
    if cfg.split:
        n_ctas, split = _split_geometry(cfg, idx, m, n, k, batches)
    elif cfg.pass_ctas:
        n_ctas = pass_grid_ctas(cfg, m, n, idx)
        if cfg.tail_split:
            segs = batches * -(-n // cfg.rows_per_cta) * -(-m // cfg.tokens_per_pass)
            slot_words = batches * n_ctas * 2 * cfg.rows_per_cta * cfg.tokens_per_pass
            if split_counter_words(segs) + slot_words >= 2**31:  # the kernel's Int32 word offsets (its view: counters, slots)
                raise ValueError(f"Fp4WeightConfig.tail_split: {batches} batches need too large a workspace")
            split = (segs, slot_words)
    if split is not None:
        work, slot0, _ = _workspace(dev, *split)
    fn = kernel_cache().get(cfg)
    fn(
        xf.view(torch.int32).reshape(-1),
        data.view(torch.int32),
        scales,
        out.view(-1),
        offs if grouped else gs.view(torch.int32),  # dense: unused
        gs,
        scale_a if x_scale else gs,  # unused without scale_a
        work,
        m,
        n,
        k,
        batches,
        m_slices,
        n_ctas,
        slot0,
        128 * cols_p,
        float(alpha),
    )
    if warm and out.is_contiguous() and _views_of(qw, data, scales, gs):
        key = _plan_key(x, qw, offs, out_dtype)
        weakref.finalize(qw, _PLANS.pop, key, None)  # the plan goes with the weight
        _PLANS[key] = _Plan(
            weakref.ref(qw), _sources(qw), fn, bool(cfg.ring), data.view(torch.int32),
            scales, gs, n, k, batches, n_ctas, split, 128 * cols_p, out_dtype, dev, m, x.dtype,
        )  # fmt: skip
    return out


def _views_of(qw, data, scales, gs) -> bool:
    """Whether the kernel's weight tensors are views of ``qw``'s own (no copy was made), so a
    plan holding them sees in-place updates of the weight."""
    same = data.data_ptr() == qw.data.data_ptr() and scales.data_ptr() == qw.scales.data_ptr()
    return same and (qw.global_scale is None or gs.data_ptr() == qw.global_scale.data_ptr())


# Prefill: the kernel re-reads (and re-dequantizes) a CTA's weight rows once per pass of 64 /
# 128 / 256 tokens, so its time grows with M while a bf16 GEMM's stays flat until it is compute
# bound. From these rows on (dense: M; grouped: mean rows per expert) the policy dequantizes the
# weight once (``dequant.dequantize_bf16``, our kernel) and runs the bf16 GEMM on it. H200, same
# run (bench/RESULTS.md), the WGMMA consumers with 256 tokens per pass /
# dequantize-first / cuBLAS bf16, us: NVFP4 N=28672 K=4096 M=1024 371.6 / 384.4 / 305.9, M=1280
# 460.5 / 469.9 / 380.4, M=1536 549.7 / 555.0 / 445.1, M=2048 726.2 / 684.0 / 597.7 (another
# run; crossover ~1600). Grouped E=32 N=4096 K=7168, mean rows per expert: ~768 2331.4 / 2592.3
# (torch._grouped_mm 2131.5), ~1024 3012.4 / 3228.5 (2715.8), ~1536 4393.9 / 4534.2 (4004.8),
# ~2048 5948.8 / 5920.1 (5534.7; crossover ~2000). (Previously, with 128 tokens per pass:
# dense crossover ~763, grouped ~634.) MXFP4 takes NVFP4's thresholds. MXFP8,
# 256 tokens per pass in 64-K stages: M=512 212.8 / 285.4, M=1024 411.2 / 405.5
# (crossover ~1000); grouped ~512 1788.2 / 2188.3; ~768 2562.5 / 2772.4
# (torch._grouped_mm 2010.6), ~1024 3312.1 / 3273.7 (2525.4): crossover ~1000. With the outputs
# staged through shared memory (same run): MXFP8 M=1024 387.7 / 405.9 (cuBLAS bf16
# 300.0), M=1280 482.4 / 488.0 (373.1), M=1536 578.3 / 569.9 (427.6): crossover ~1400.
# With a CTA per (weight tile, pass) (``pass_ctas``, same run, us, pass grid / a CTA per tile /
# dequantize-first (cuBLAS bf16)): MXFP8
# M=1024 347.6 / 382.1 / 402.3 (294.9), M=1280 442.5 / 474.4 / 481.4 (366.8), M=1536 537.7 /
# 567.2 / 561.7 (417.6), M=2048 689.1 / 755.5 / 686.0 (578.9): crossover ~2048. FP4 (the same
# columns): NVFP4 M=1024 311.2 / 335.5 / 381.0 (299.9), M=2048 618.8 / 662.8 / 679.1
# (592.2), M=3072 946.6 / 995.2 / 997.6 (909.3), M=4096 1284.1 / 1331.9 / 1303.8 (1205.6), M=6144
# 1952.3 / 2027.3 / 1891.7 (1820.2); MXFP4 M=3072 938.4 / 994.8 / 954.0, M=4096 1277.5 / 1334.0 /
# 1238.9, M=6144 1923.8 / 2002.7 / 1776.5: crossover ~3500-5000, taken at 4096 for both formats.
DQ_MIN_ROWS = 4096
DQ_MIN_ROWS_GROUPED = 2048
DQ_MIN_ROWS_FP8 = 2048
DQ_MIN_ROWS_GROUPED_FP8 = 1024
# sm_100a runs the mma.sync consumers (no WGMMA there; compile-verified only), whose time grows
# with the token passes: the thresholds measured for them on the H200 before the 128-token WGMMA
# consumers (NVFP4 M=256 mma.sync 217.7 us vs
# dequantize-first 179.0; grouped crossover ~400 rows per expert; MXFP8 ~390 rows).
DQ_MIN_ROWS_MMA_SYNC = 257
DQ_MIN_ROWS_GROUPED_MMA_SYNC = 384
DQ_MIN_ROWS_FP8_MMA_SYNC = 384


def dequantize_first(m: int, batches: int, grouped: bool, x_scale: bool, qw: BlockScaledTensor,
                     arch: str = "sm_90a") -> bool:  # fmt: skip
    """Whether the policy takes the dequantize-first path (no config forced): enough rows
    (``dq_min_rows``), a weight the dequantize kernel takes, and not grouped with ``scale_a`` (the
    per-token scale there stays in the decode kernel's epilogue)."""
    rows = -(-m // batches) if grouped else m
    return rows >= dq_min_rows(qw.fmt.name, grouped, arch) and not (grouped and x_scale) and dequantizable(qw)


def dq_min_rows(fmt: str, grouped: bool, arch: str = "sm_90a") -> int:
    """The rows (dense) / mean rows per expert (grouped) from which the policy dequantizes first:
    sm_90a's WGMMA consumers keep up longer than the mma.sync ones of other archs."""
    fp8 = fmt == MXFP8.name
    if arch != "sm_90a":
        return DQ_MIN_ROWS_GROUPED_MMA_SYNC if grouped else DQ_MIN_ROWS_FP8_MMA_SYNC if fp8 else DQ_MIN_ROWS_MMA_SYNC
    if fp8:
        return DQ_MIN_ROWS_GROUPED_FP8 if grouped else DQ_MIN_ROWS_FP8
    return DQ_MIN_ROWS_GROUPED if grouped else DQ_MIN_ROWS


def _dequantized(x, qw, offs, out, out_dtype, alpha, scale_a):
    """The dequantize-first path: a bf16 copy of the weight (temporary memory: 2 bytes x its
    elements), then our bf16 GEMM (dense, or the packed grouped form with ``offs``: rows at or
    past ``offs[-1]`` are not written). e4m3 activations become bf16 exactly; a per-token
    ``scale_a`` (dense) multiplies the fp32 results before the one rounding to ``out_dtype``."""
    w16 = dequantize_checked(qw)
    x16 = x.to(torch.bfloat16).contiguous()
    if x16.data_ptr() % 16:
        x16 = x16.clone()
    if offs is not None:
        return grouped_gemm(x16, w16.transpose(1, 2), offs=offs, out=out, out_dtype=out_dtype, alpha=alpha)
    if scale_a is None:
        return gemm(x16, w16.mT, out=out, out_dtype=out_dtype, alpha=alpha)
    n = w16.shape[-2]
    acc = torch.empty(x16.shape[0], -(-n // 4) * 4, dtype=torch.float32, device=x16.device)[:, :n]  # 16-byte rows
    gemm(x16, w16.mT, out=acc, alpha=alpha)
    return out.copy_(acc.mul_(scale_a.view(-1, 1)))


def _split_geometry(cfg, idx: int, m: int, n: int, k: int, batches: int) -> tuple[int, tuple[int, int]]:
    """(CTA count, (counters, slot words)) of a split launch: as many CTAs as the SMs' shared
    memory holds at once, at most 2 per SM (never more than there are units; a grid larger than
    what is resident is still correct: no CTA waits for another), and its Int32 workspace
    (``_workspace``): a counter per segment (zero; every launch leaves its counters zero), then 2
    partial-sum slots per CTA."""
    segs = batches * -(-n // cfg.rows_per_cta) * -(-m // cfg.tokens_per_pass)
    n_chunks = -(-k // cfg.chunk_k)
    units = segs * -(-n_chunks // cfg.ring_k)
    per_sm = max(1, min(2, (227 * 1024) // cfg.smem_bytes))
    n_ctas = max(1, min(units, _sm_count(idx) * per_sm))
    return n_ctas, (segs, n_ctas * 2 * cfg.rows_per_cta * cfg.tokens_per_pass)


def _workspace(dev: torch.device, segs: int, slot_words: int) -> tuple[torch.Tensor, int, int]:
    """(workspace, first slot word, stream handle) of a launch that meets partial sums through memory
    (the split grid, ``tail_split``): ``segs`` counters (zero; every launch leaves its counters zero)
    rounded up to 16 bytes, then ``slot_words`` of partial-sum slots, a view of the current stream's
    split-K buffer, the one the dense split-K plans share (``gemm.launch.split_workspace``: a buffer
    that is outgrown stays allocated, so a captured CUDA graph never points into freed memory)."""
    counters = split_counter_words(segs)
    ws, stream = split_workspace(dev, counters, slot_words)
    return ws, counters, stream


def policy_config(m: int, n: int, fmt: str, out_dtype: torch.dtype, arch: str, grouped: bool, batches: int,
                  x_scale: bool, idx: int):  # fmt: skip
    """The config the policy runs for a kernel call on device ``idx``: :func:`pick_config` told
    whether a dense weight's 128-row tiles are fewer than the SMs and how they fill its waves."""
    tiles_sms = None if grouped else (-(-n // 128) * batches, _sm_count(idx))
    few = tiles_sms is not None and tiles_sms[0] < tiles_sms[1]
    return pick_config(m, fmt, out_dtype, arch, grouped, batches, x_scale, few, tiles_sms)


def pass_grid_ctas(cfg, m: int, n: int, idx: int) -> int:
    """The pass grid's CTAs (``Fp4WeightConfig.pass_ctas``): one per (weight tile, token pass)
    unit, or (2) at most one per SM of device ``idx`` (256-token passes: one CTA fits an SM)."""
    units = -(-n // cfg.rows_per_cta) * -(-m // cfg.tokens_per_pass)
    return units if cfg.pass_ctas == 1 else min(units, _sm_count(idx))


def _sm_count(index: int) -> int:
    """The device's SM count (the tests fake it to move the split grid's cut points)."""
    return device_info(index)[1]


def gemm_fp4_weight_ref(
    x: torch.Tensor,
    qw: BlockScaledTensor,
    *,
    offs: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    alpha: float = 1.0,
    scale_a: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Plain-torch twin (any device): dequantize the weight, multiply in ``compute_dtype``. Rows
    at or past ``offs[-1]`` are zero here (the kernel leaves them unwritten)."""
    check_args(x, qw, offs, out_dtype, scale_a)
    w = dequantize_ref(qw).to(compute_dtype)
    xc = x.to(compute_dtype)
    if scale_a is not None:
        xc = xc * scale_a.to(compute_dtype).reshape(-1, 1)
    if offs is None:
        acc = xc @ w.mT
    else:
        acc = torch.zeros(x.shape[0], w.shape[-2], dtype=compute_dtype, device=x.device)
        for e, (start, end) in enumerate(expert_rows(offs.tolist(), x.shape[0])):  # the kernel's clamping
            acc[start:end] = xc[start:end] @ w[e].mT
    return (acc * alpha if alpha != 1.0 else acc).to(out_dtype)
