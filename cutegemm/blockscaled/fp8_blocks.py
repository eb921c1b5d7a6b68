"""torch._scaled_mm's other FP8 block recipes on sm_90a: per-column 1x128 scales of b, with 1x128
(per row) or 128x128 scales of a.

``gemm(a, b, scale_a=..., scale_b=...)`` with e4m3 a (M, K), b (K, N) and fp32 scales, as
``torch._scaled_mm`` takes them (its BlockWise recipes; the dequantization scales, so
``out = sum_kb (a[:, kb] @ b[kb, :]) * sa(row, kb) * sb(kb, col)`` over the 128-wide K blocks kb):

=========================  =======================================  ===============================
recipe (a x b)             scale_a                                  scale_b
=========================  =======================================  ===============================
1x128 x 1x128              (M, ceil(K/128)): per row per K block    (N, ceil(K/128)): per column
128x128 x 1x128            (ceil(K/128), ceil(M/128)): per 128x128  (N, ceil(K/128))
                           block of a (its K blocks may be padded
                           to a multiple of 4 rows, never read)
=========================  =======================================  ===============================

(1x128 x 128x128, DeepSeek-V3's recipe, has its own kernel: ``gemm.fp8_scales``; 1x128 x 1x128
with one K block is row-wise x column-wise, computed by the row-wise path.) Any strides.

The kernel is the DeepSeek block-scaled one (``gemm.sm90.blockwise``) with B's scales per column
(``GemmConfig.sfb_cols``): each 128-wide K tile's WGMMA partial sum is promoted into fp32 times
scale_a[row, kt] * scale_b[column, kt], both scale tensors riding the TMA stage ring beside A and
B (mSFA (M, K/128) M-major and mSFB (N, K/128) N-major: torch's layouts, read in place; others
copied, :func:`column_scales`; 128x128 blocks of a: each block's scale spread over its rows by
one repeat_interleave). Operands are read K-major: a row-major, b column-major (``w.t()`` of an
(N, K) weight); other layouts are copied first; K a multiple of 16. Epilogue: ``alpha`` and the
output dtype (bf16 / fp16 / fp32), ``out``. sm_100a: not built (NotImplementedError).

A config with ``fp8_mx`` (``mx_sm90.emulation_config``) runs the MXFP8 emulation instead (e4m3
WGMMAs of K 32, each partial sum promoted times the scales repeated over the four 32-wide
blocks of each 128-wide one; its scale buffers from one ``cat`` and one gather through an index
cached per signature, :func:`gathered_scales`): 2-2.6x slower on the H100, kept for a config
that asks for it. A bare call (no option but the scales) launches from a
warm plan after its first call (:func:`warm_call`): the scales' views, the output's
allocation, the GEMM.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import NamedTuple

import torch

from ..config import Form, GemmProblem, can_implement
from ..epilogue import EpilogueSpec
from ..gemm.args import KernelArgs
from ..gemm.fp8_scales import FP8_BLOCK, check_fp32_scale, tma_scale_a
from ..gemm.launch import DENSE_CACHE, current_device, new_workspace, tma_addressable
from ..policy import policy_for
from ..runtime.device import device_info, eager_cuda, max_clusters_for
from .mx_sm90 import MX_K_BLOCK, emulation_config, launch_emulated, padded_kb, permutation_on, sfb_permutation
from .operands import OUT_NAMES, finish_output, output_view

RECIPES = ("1x128 x 1x128", "128x128 x 1x128")
_REPEAT = FP8_BLOCK // MX_K_BLOCK  # 32-wide blocks per 128-wide one


def _blocks(n: int) -> int:
    return -(-n // FP8_BLOCK)


def vector_block_recipe(a, b, scale_a, scale_b) -> str | None:
    """The recipe of RECIPES that 2-D e4m3 ``a`` (M, K), ``b`` (K, N) and 2-D scales ask for, or
    None (row-wise, per-tensor, DeepSeek's 1x128 x 128x128, or nothing valid: the dense path
    decides and names the error). Shapes only: scale_b (N, ceil(K/128)); scale_a (M, ceil(K/128))
    for 1x128, or (ceil(K/128) or that padded to a multiple of 4, ceil(M/128)) for 128x128; with
    one K block, scale_a (M, 1) or one element is the row-wise recipe (checked before these, as
    torch does)."""
    if not all(isinstance(t, torch.Tensor) for t in (a, b, scale_a, scale_b)):
        return None
    if a.dtype != torch.float8_e4m3fn or a.dim() != 2 or b.dim() != 2 or scale_a.dim() != 2 or scale_b.dim() != 2:
        return None
    m, k = a.shape
    n = b.shape[1]
    kb = _blocks(k)
    if tuple(scale_b.shape) != (n, kb) or _deepseek_shapes(m, n, k, scale_a, scale_b):
        return None
    if kb == 1 and tuple(scale_a.shape) in ((m, 1), (1, 1)):
        return None  # one K block: per-row or per-tensor x per-column, the row-wise recipe (torch's order)
    if tuple(scale_a.shape) == (m, kb):
        return RECIPES[0]
    if scale_a.shape[1] == _blocks(m) and scale_a.shape[0] in (kb, -(-kb // 4) * 4):
        return RECIPES[1]
    return None


def _deepseek_shapes(m, n, k, scale_a, scale_b) -> bool:
    """Whether the scales also have the 1x128 x 128x128 shapes (that recipe is checked first, as
    torch's own order; only tiny N can collide)."""
    kb, nb = _blocks(k), _blocks(n)
    return tuple(scale_a.shape) == (m, kb) and scale_b.shape[1] == nb and scale_b.shape[0] in (kb, -(-kb // 4) * 4)


def recipe_scales(recipe: str, m: int, k: int, scale_a, scale_b):
    """(sa (1, M, ceil(K/128)), sb (1, N, ceil(K/128))): the recipe's scales per row / column per
    128-wide K block, for ``launch_emulated`` with repeat 4 (its scale builders spread them over
    the 32-wide blocks). 1x128: views of the caller's; 128x128: one copy, each block's scale over
    its 128 rows."""
    if recipe == RECIPES[0]:
        sa = scale_a
    else:  # (K blocks [padded], M blocks) -> per row
        sa = scale_a[:_blocks(k)].t().repeat_interleave(FP8_BLOCK, dim=0)[:m]
    return sa.unsqueeze(0), scale_b.unsqueeze(0)


def expanded_scales(recipe: str, m: int, n: int, k: int, scale_a, scale_b):
    """(sa (1, M, 4 ceil(K/128)), sb (1, N, 4 ceil(K/128))): fp32 scales per row / column per
    32-wide K block (the emulation kernel's), from the recipe's scales: :func:`recipe_scales`,
    each repeated over its four 32-wide blocks (the twin's form)."""
    return tuple(s.float().repeat_interleave(_REPEAT, dim=2) for s in recipe_scales(recipe, m, k, scale_a, scale_b))


def _span(t: torch.Tensor) -> torch.Tensor:
    """A 1-D view of the memory ``t`` spans (from its first element to its last, padding between
    rows included): element (i, j) of t is element i * stride(0) + j * stride(1) of it."""
    return t.as_strided((1 + sum((d - 1) * st for d, st in zip(t.shape, t.stride(), strict=True)),), (1,))


def _gather_index(recipe: str, m: int, n: int, k: int, tile_n: int, a_key: tuple, b_key: tuple,
                  device: torch.device) -> tuple[torch.Tensor, int, int]:  # fmt: skip
    """(index, sfb offset, Np): where each value of the kernel's two scale buffers comes from in
    ``cat([_span(scale_a), _span(scale_b), zero])``. The buffer is mSFA's (M, Kbp) rows, zeros up
    to a multiple of 4 values (16 bytes), then mSFB's (Kbp, Np) rows: what ``kernel_sfa`` /
    ``kernel_sfb`` build from :func:`recipe_scales` with repeat 4, value for value (each 32-wide K
    block takes its 128-wide block's scale; K blocks past ceil(K / 32) and positions past N zero).
    ``a_key`` / ``b_key``: (span length, stride 0, stride 1) of each scale tensor. Built on the host
    (:data:`_INDEX` keeps it per key, in a :class:`_Gather`)."""
    (len_a, sa0, sa1), (len_b, sb0, sb1) = a_key, b_key
    zero = len_a + len_b
    kb, kbp = -(-k // MX_K_BLOCK), padded_kb(k)
    j = torch.arange(kbp)
    blk = torch.div(j, _REPEAT, rounding_mode="floor")  # the 128-wide block of each 32-wide one
    rows = torch.arange(m).unsqueeze(1)
    if recipe == RECIPES[0]:  # scale_a (M, KB)
        ia = rows * sa0 + blk * sa1
    else:  # scale_a (KB [padded], MB): block (blk, row // 128)
        ia = blk * sa0 + torch.div(rows, FP8_BLOCK, rounding_mode="floor") * sa1
    ia = torch.where(j < kb, ia, zero).reshape(-1)
    n_tiles = -(-n // tile_n)
    cols = (torch.arange(n_tiles).unsqueeze(1) * tile_n + sfb_permutation(tile_n).unsqueeze(0)).reshape(-1)
    ib = len_a + cols.unsqueeze(0) * sb0 + blk.unsqueeze(1) * sb1  # (Kbp, Np)
    ib = torch.where((j.unsqueeze(1) < kb) & (cols.unsqueeze(0) < n), ib, zero).reshape(-1)
    off = -(-ia.numel() // 4) * 4
    gap = torch.full((off - ia.numel(),), zero, dtype=torch.long)
    return torch.cat([ia, gap, ib]).to(device), off, cols.numel()


class _Gather(NamedTuple):
    """One gather signature's launch data: the index on the device, mSFB's offset in the buffer,
    mSFA's rows, the padded K blocks, mSFB's positions (Np), the zero element."""

    index: torch.Tensor
    off: int
    m: int
    kbp: int
    np_: int
    zero: torch.Tensor

    def scales(self, span_a: torch.Tensor, span_b: torch.Tensor):
        """(mSFA, mSFB): one cat of the scale spans and one gather; views of one buffer, as
        ``kernel_sfa`` / ``kernel_sfb`` lay them out."""
        buf = torch.cat([span_a, span_b, self.zero]).index_select(0, self.index)
        m, kbp = self.m, self.kbp
        return buf[: m * kbp].view(1, m, kbp).permute(1, 2, 0), buf[self.off :].view(1, kbp, self.np_).permute(2, 1, 0)


def _gather_for(recipe: str, m: int, n: int, k: int, tile_n: int, scale_a, scale_b):
    """(the :class:`_Gather` of this call or None, the two scale spans). None (the caller builds
    the scales the other way) inside a CUDA-graph capture before the index exists for this key
    (no host copy is allowed there), or for a scale tensor whose memory span is far larger than
    its elements."""
    span_a, span_b = _span(scale_a), _span(scale_b)
    if any(sp.numel() > _MAX_SPAN_RATIO * t.numel() + 4096 for sp, t in ((span_a, scale_a), (span_b, scale_b))):
        return None, span_a, span_b  # a slice of a much larger buffer: the builders copy only its elements
    key = (recipe, m, n, k, tile_n, (span_a.numel(), *scale_a.stride()), (span_b.numel(), *scale_b.stride()),
           scale_a.device)  # fmt: skip
    got = _INDEX.get(key)
    if got is None:
        if scale_a.is_cuda and torch.cuda.is_current_stream_capturing():
            return None, span_a, span_b
        if len(_INDEX) >= _MAX_INDEX:
            _INDEX.clear()
        index, off, np_ = _gather_index(*key)
        got = _INDEX[key] = _Gather(index, off, m, padded_kb(k), np_, _zero_on(scale_a.device))
        if scale_a.is_cuda:
            permutation_on(tile_n, scale_a.device)  # the capture path's builders need it made eagerly
    return got, span_a, span_b


def gathered_scales(recipe: str, m: int, n: int, k: int, tile_n: int, scale_a, scale_b):
    """(mSFA, mSFB) of the recipe's scales in two launches (one cat, one gather of a cached
    index) instead of the scale builders' five or six (:class:`_Gather`), or None where
    :func:`_gather_for` declines."""
    gather, span_a, span_b = _gather_for(recipe, m, n, k, tile_n, scale_a, scale_b)
    return None if gather is None else gather.scales(span_a, span_b)


_INDEX: dict = {}  # _gather_for's key -> _Gather
_MAX_INDEX = 128
# The gather copies each scale tensor's whole span: torch's layouts span at most ~4x their
# elements (the padded 128x128 scale rows), a column slice of a wide buffer far more.
_MAX_SPAN_RATIO = 4


@functools.cache
def _zero_on(device: torch.device) -> torch.Tensor:
    """One fp32 zero on ``device`` (the gather's zero element), made by an eager call."""
    return torch.zeros(1, dtype=torch.float32, device=device)


def _check(recipe, a, b, scale_a, scale_b, out_dtype, out_dtypes=OUT_NAMES):
    rule = f"FP8 block scaling {recipe}"
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        check_fp32_scale(name, t, a.device, rule)
    if b.dtype != torch.float8_e4m3fn:
        raise ValueError(f"{rule}: b must be torch.float8_e4m3fn like a, got {b.dtype}")
    if b.device != a.device:
        raise ValueError(f"{rule}: a is on {a.device}, b on {b.device}")
    if out_dtype not in out_dtypes:
        raise TypeError(f"{rule}: out_dtype must be one of {list(out_dtypes)}, got {out_dtype}")


def _k_major(t: torch.Tensor) -> torch.Tensor:
    """``t`` (rows, K) as TMA reads it: unit K stride, 16-byte aligned rows and start (else a
    contiguous copy; K is a multiple of 16)."""
    return t if t.stride(1) == 1 and tma_addressable(t, 1) else t.clone(memory_format=torch.contiguous_format)


def _direct_out(out, m: int, n: int, out_dtype, device) -> bool:
    """Whether the kernel can write the caller's ``out`` (checked: shape, dtype, device) in place:
    unit column stride, 16-byte aligned rows and start (else the result is copied into it)."""
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (m, n) or out.dtype != out_dtype:
        raise ValueError(f"out must be an ({m}, {n}) {out_dtype} tensor")
    if out.device != device:
        raise ValueError(f"out is on {out.device}, the operands on {device}")
    return out.stride(1) == 1 and tma_addressable(out, 1)


def gemm_fp8_vector_blocks(a, b, *, scale_a, scale_b, out_dtype=None, alpha: float = 1.0, out=None, config=None):
    """``alpha * sum_kb (a[:, kb] @ b[kb, :]) * sa * sb`` for a recipe of RECIPES (see the module
    docstring), on sm_90a; (M, N) of ``out_dtype`` (default bf16, or ``out``'s dtype)."""
    recipe = vector_block_recipe(a, b, scale_a, scale_b)
    if recipe is None:
        raise ValueError("gemm_fp8_vector_blocks: the scales are not 1x128 x 1x128 or 128x128 x 1x128 block scales")
    if out_dtype is None:
        out_dtype = out.dtype if isinstance(out, torch.Tensor) else torch.bfloat16
    _check(recipe, a, b, scale_a, scale_b, out_dtype)
    m, k = a.shape
    n = b.shape[1]
    if out is not None and not _direct_out(out, m, n, out_dtype, a.device):
        return out.copy_(gemm_fp8_vector_blocks(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype,
                                                alpha=alpha, config=config))  # fmt: skip
    if a.device.type != "cuda":
        raise ValueError(f"FP8 block scaling {recipe}: expected CUDA tensors, got {a.device}")
    arch, num_sms = device_info(a.device.index if a.device.index is not None else torch.cuda.current_device())
    if arch != "sm_90a":
        raise NotImplementedError(f"FP8 block scaling {recipe} is built for sm_90a only (this GPU: {arch})")
    if k % 16:
        raise ValueError(f"FP8 block scaling {recipe}: K must be a multiple of 16 (TMA), got K={k}")
    if m == 0 or n == 0 or k == 0:
        res = torch.zeros(m, n, dtype=out_dtype, device=a.device)
        return res if out is None else out.copy_(res)
    alpha = float(alpha)
    a_k, b_k = _k_major(a), _k_major(b.t())  # (M, K), (N, K)
    views = [t.as_strided((t.shape[0], k, 1), (t.stride(0), 1, t.shape[0] * t.stride(0))) for t in (a_k, b_k)]
    if config is None or not config.fp8_mx:  # the block-scaled kernel with per-column B scales
        cfg = column_config(m, n, k, a_k.stride(0), b_k.stride(0), out_dtype, alpha != 1.0, config, num_sms)
        sfa, sfb = column_scales(recipe, m, k, scale_a, scale_b)
        written, c_view = output_view(out, 1, m, n, out_dtype, a.device, False)
        DENSE_CACHE.get(cfg)(*KernelArgs(
            *views, c_view, alpha=alpha, max_clusters=max_clusters_for(cfg, a.device), sfa=sfa, sfb=sfb,
            workspace=new_workspace(cfg, a.device),
        ))  # fmt: skip
        in_place = a_k is a and b_k.data_ptr() == b.data_ptr() and b_k.stride() == (b.stride(1), b.stride(0))
        if out is None and config is None and alpha == 1.0 and out_dtype == torch.bfloat16 and in_place:
            _remember_warm(recipe, a, b, scale_a, scale_b, cfg, views)
        return finish_output(out, written)
    cfg = emulation_config(m, n, k, out_dtype, alpha, config)  # a forced MXFP8-emulation config
    gather, span_a, span_b = _gather_for(recipe, m, n, k, cfg.tile_n, scale_a, scale_b)
    if gather is not None:
        return launch_emulated(cfg, *views, None, None, out_dtype, alpha, out, batched=False,
                               kernel_scales=gather.scales(span_a, span_b))  # fmt: skip
    return launch_emulated(cfg, *views, *recipe_scales(recipe, m, k, scale_a, scale_b), out_dtype, alpha, out,
                           batched=False, repeat=_REPEAT)  # fmt: skip


def column_scales(recipe: str, m: int, k: int, scale_a, scale_b):
    """(mSFA (M, ceil(K/128)) M-major, mSFB (N, ceil(K/128)) N-major) as the block-scaled kernel's
    TMA reads them (``config.sfb_cols``): torch's layouts in place (``gemm.fp8_scales.tma_scale_a``
    copies any other); 128x128 blocks of a: each block's scale over its 128 rows, by one
    repeat_interleave whose result is already M-major."""
    if recipe == RECIPES[0]:
        sa = tma_scale_a(scale_a)
    else:  # (K blocks [padded], M blocks): (KB, MB * 128) row-major, its first M columns transposed
        ld = -(-m // 4) * 4  # (<= MB * 128: the rows' stride stays the buffer's MB * 128)
        sa = scale_a[: _blocks(k)].repeat_interleave(FP8_BLOCK, dim=1)[:, :ld].t()[:m]
    return sa, tma_scale_a(scale_b)


@functools.lru_cache(maxsize=1024)
def column_config(m: int, n: int, k: int, lda: int, ldb: int, out_dtype, scaled: bool, config, num_sms: int):
    """The config of the block-scaled kernel with per-column B scales (``fp8_blockwise`` and
    ``sfb_cols``): ``config``, or the dense policy's DeepSeek-recipe tile for (m, n, k) (unsplit);
    alpha on where the call scales; checked by ``can_implement`` (cached; a failure is not, so its
    error is raised anew per call)."""
    if config is not None and not (config.fp8_blockwise and config.sfb_cols and config.form is Form.DENSE):
        raise ValueError(f"config {config.name}: the 1x128 x 1x128 / 128x128 x 1x128 recipes run a dense "
                         "fp8_blockwise config with sfb_cols=True (or an fp8_mx one: the MXFP8 emulation)")  # fmt: skip
    problem = GemmProblem(m, n, k, 1, "e4m3", "e4m3", OUT_NAMES[out_dtype], "k", "k", (lda,), (ldb,))
    cfg = config
    if cfg is None:
        cfg = policy_for("sm_90a", num_sms).choose_dense(problem, epilogue=EpilogueSpec(alpha=scaled), fp8_blockwise=True)
        cfg = replace(cfg, sfb_cols=True, split_k=1, split_cluster=False, split_tail=False)
        if cfg.tile_m == 128 and cfg.tile_n >= 128:
            # The DeepSeek recipe's 128-row tiles, as 128x128 in 1x2 clusters with the warpgroups
            # taking turns: H100, 1x128 x 1x128, x F.scaled_mm, its pick -> this: 512 x 4096 x 7168
            # 0.92 -> 0.96, 2048 / 4096 x 7168 x 2048 0.91 -> 0.97, 8192 x 2048 x 7168 0.86 -> 0.96,
            # 1024 x 1536 x 7168 1.11 -> 1.17, 8192^3 0.95 -> 0.94 (bench/RESULTS.md)
            cfg = replace(cfg, tile_n=128, cluster_m=1, cluster_n=2, wg_order=True, raster="m", group=8)
    if scaled and not cfg.epilogue.alpha:
        cfg = replace(cfg, epilogue=replace(cfg.epilogue, alpha=True))
    ok, why = can_implement(cfg, problem)
    if not ok:
        raise ValueError(f"cannot run {cfg.name}: {why}")
    return cfg


_WARM: dict = {}  # warm_key -> _Warm
_MAX_WARM = 256


def warm_key(a, b, scale_a, scale_b) -> tuple:
    """What fixes every check and choice of a bare call (no option but the scales): shapes,
    strides, dtypes and devices of the four tensors (not their data-pointer alignment)."""
    return (a.shape, a.stride(), b.shape, b.stride(), scale_a.shape, scale_a.stride(), scale_b.shape,
            scale_b.stride(), a.dtype, b.dtype, scale_a.dtype, scale_b.dtype, a.device, b.device, scale_a.device,
            scale_b.device)  # fmt: skip


class _Warm:
    """A warm bare call's launch (the per-column kernel): the kernel, its operand views' shapes and
    strides, the recipe and K, the persistent grid and the workspace (left zeroed by every
    launch)."""

    __slots__ = ("fn", "a_view", "b_view", "recipe", "k", "m", "n", "device", "device_index", "max_clusters",
                 "workspace")  # fmt: skip

    def run(self, a, b, scale_a, scale_b):
        sfa, sfb = column_scales(self.recipe, self.m, self.k, scale_a, scale_b)
        written, c_view = output_view(None, 1, self.m, self.n, torch.bfloat16, self.device, False)
        self.fn(*KernelArgs(
            a.as_strided(*self.a_view), b.as_strided(*self.b_view), c_view, alpha=1.0, max_clusters=self.max_clusters,
            sfa=sfa, sfb=sfb, workspace=self.workspace,
        ))  # fmt: skip
        return finish_output(None, written)


def _remember_warm(recipe, a, b, scale_a, scale_b, cfg, views) -> None:
    """Records the bare call's launch for :func:`warm_call`, after a cold call ran it."""
    m, n = a.shape[0], b.shape[1]
    w = _Warm()
    w.fn, w.m, w.n, w.k, w.recipe, w.device, w.device_index = DENSE_CACHE.get(cfg), m, n, a.shape[1], recipe, a.device, a.device.index
    w.a_view, w.b_view = ((v.shape, v.stride()) for v in views)
    w.max_clusters = max_clusters_for(cfg, a.device)
    w.workspace = new_workspace(cfg, a.device)
    if len(_WARM) >= _MAX_WARM:
        _WARM.clear()
    _WARM[warm_key(a, b, scale_a, scale_b)] = w


def warm_call(a, b, scale_a, scale_b):
    """``gemm(a, b, scale_a=..., scale_b=...)`` with no other option, launched from its warm plan
    (a cold call with the same :func:`warm_key` made it), or None (no plan, a tensor seen under
    tracing (``eager_cuda``), a data pointer TMA cannot read, another current device)."""
    try:
        w = _WARM.get(warm_key(a, b, scale_a, scale_b))
    except (AttributeError, TypeError):
        return None
    if w is None or not eager_cuda(a) or a.data_ptr() % 16 or b.data_ptr() % 16 or current_device() != w.device_index:
        return None
    return w.run(a, b, scale_a, scale_b)


def gemm_fp8_vector_blocks_ref(a, b, *, scale_a, scale_b, out_dtype=None, alpha: float = 1.0,
                               compute_dtype=torch.float32):  # fmt: skip
    """The twin (any device): every element of a / b times its block's scale, one matmul in
    ``compute_dtype``, times alpha, cast to ``out_dtype`` (default bf16; float64 too, for
    references)."""
    recipe = vector_block_recipe(a, b, scale_a, scale_b)
    if recipe is None:
        raise ValueError("gemm_fp8_vector_blocks_ref: the scales are not 1x128 x 1x128 or 128x128 x 1x128 block scales")
    out_dtype = out_dtype or torch.bfloat16
    _check(recipe, a, b, scale_a, scale_b, out_dtype, (*OUT_NAMES, torch.float64))
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0 or k == 0:
        return torch.zeros(m, n, dtype=out_dtype, device=a.device)
    sa, sb = expanded_scales(recipe, m, n, k, scale_a, scale_b)
    sa = sa[0].to(compute_dtype).repeat_interleave(MX_K_BLOCK, dim=1)[:, :k]  # (M, K)
    sb = sb[0].to(compute_dtype).repeat_interleave(MX_K_BLOCK, dim=1)[:, :k]  # (N, K)
    acc = torch.matmul(a.to(compute_dtype) * sa, (b.t().to(compute_dtype) * sb).t())
    return (acc * alpha).to(out_dtype)


__all__ = ["RECIPES", "expanded_scales", "gathered_scales", "recipe_scales", "warm_call", "gemm_fp8_vector_blocks", "gemm_fp8_vector_blocks_ref",
           "vector_block_recipe"]  # fmt: skip
