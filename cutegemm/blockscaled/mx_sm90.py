"""Block-scaled GEMMs on Hopper (sm_90a): MXFP8 x MXFP8 dequantize-first or emulated (host side
of ``GemmSm90`` with ``config.fp8_mx``, kernel pieces: ``gemm.sm90.mx``); MXFP4 / NVFP4 x
the same format and MXFP8 x MXFP4 dequantize-first always (Hopper's tensor cores take no FP4).

``gemm_mx_sm90(qa, qb)`` computes ``dequantize(qa) @ dequantize(qb).T``. Compute-bound shapes
(``dequantize_first``: at least DEQUANT_MIN_ROWS rows, per expert when grouped) run as one bf16
dequantize pass per operand (``dequant``) plus the bf16 GEMM, which is faster on the H200; the
others, and every call with an explicit ``config``, run the emulation: from the e4m3 elements
and e8m0 scales (one per 32 K of every row) of two MXFP8 ``BlockScaledTensor``s: e4m3 WGMMAs of
K 32, each partial sum promoted into fp32 with ``scale_a[row] * scale_b[col]`` of its K block. The
result equals the fp32 GEMM of the dequantized operands up to fp32 summation order (the tensor
core sums 32 products per promotion). The dequantized operands never exist in memory.

The scales are decoded here, per call, to fp32 (exact: powers of two, NaN for byte 0xFF):
  * ``sfa`` (M, Kb, L) with Kb = ceil(K / 32) rounded up to a multiple of 4 (one 128-wide K tile
    per TMA box of 4), padding 0;
  * ``sfb`` (Np, Kb, L), Np = N rounded up to the tile, unit stride along Np, each tile's columns
    permuted so that one consumer thread's columns are contiguous (``sfb_permutation``).
Padding scales meet zero-filled elements (TMA fills out-of-bounds A / B with zeros), so they add
nothing.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import torch

from ..config import Form, GemmConfig, GemmProblem, can_implement
from ..epilogue import EpilogueSpec
from ..gemm.args import KernelArgs
from ..gemm.dense import gemm
from ..gemm.launch import DENSE_CACHE, GROUPED_CACHE, new_workspace
from ..grouped.packed import grouped_gemm
from ..runtime.device import max_clusters_for
from .dequant import check_dequant_operand, check_elements, dequantizable, dequantize_checked, launch_of
from .formats import MXFP8
from .operands import OUT_NAMES, finish_output, l1_view, operand_view, output_view
from .reference import BlockScaledTensor, e8m0_to_float
from .weight_only.launch import gemm_fp4_weight

MX_K_BLOCK = 32
K_TILE_BLOCKS = 4  # 32-wide K blocks per 128-wide K tile (the kernel's TMA box of scales)


def mx_config(m: int, n: int, out_dtype: torch.dtype = torch.bfloat16, alpha: bool = False) -> GemmConfig:
    """The default MXFP8-emulation config: cooperative 128 x 128 (two warpgroups of 64 x 128;
    each holds a partial and a promoted fp32 sum), 64 rows when M is small (bf16 / fp16 output:
    64 x 128 with an fp32 output spills registers)."""
    base = GemmConfig(
        arch="sm_90a", a_dtype="e4m3", b_dtype="e4m3", a_major="k", b_major="k", out_dtype=OUT_NAMES[out_dtype],
        tile_m=128, tile_n=128, fp8_mx=True, epilogue=EpilogueSpec(alpha=alpha),
    )  # fmt: skip
    if m <= 64 and out_dtype != torch.float32:
        return replace(base, tile_m=64)
    return base


@functools.cache
def sfb_permutation(tile_n: int) -> torch.Tensor:
    """perm[p] = the tile-local column whose B scale the kernel reads at position p of a tile.

    A consumer thread (q = lane % 4) holds accumulator register v = 2 j + e of column
    8 j + 2 q + e and reads its scales, four at a time, from positions (v // 4) * 16 + 4 q + v % 4.
    """
    perm = torch.empty(tile_n, dtype=torch.long)
    for p in range(tile_n):
        g, q, w = p // 16, (p % 16) // 4, p % 4
        v = 4 * g + w
        perm[p] = 8 * (v // 2) + 2 * q + v % 2
    return perm


def _plain_scales3(q: BlockScaledTensor) -> torch.Tensor:
    """(L, rows, ceil(K / 32)) fp32 scales."""
    s = e8m0_to_float(q.plain_scales())
    return s if s.dim() == 3 else s.unsqueeze(0)


def padded_kb(k: int) -> int:
    kb = -(-k // MX_K_BLOCK)
    return -(-kb // K_TILE_BLOCKS) * K_TILE_BLOCKS


def _k_blocks(s: torch.Tensor, k: int, repeat: int, dim: int) -> torch.Tensor:
    """``s`` (fp32, 3-D) with its dimension ``dim`` (K blocks: kbs values, each covering
    ``repeat`` 32-wide blocks) made one value per 32-wide block, cut to ceil(K / 32) and zero-padded
    to Kbp (``padded_kb``), contiguous: s itself where nothing changes, else one or two copies."""
    kbs = s.shape[dim]
    kb, kbp = -(-k // MX_K_BLOCK), padded_kb(k)
    if repeat > 1:
        shape = list(s.shape)
        shape[dim] = kbs * repeat
        s = s.unsqueeze(dim + 1).expand(*s.shape[:dim + 1], repeat, *s.shape[dim + 1:]).reshape(shape)
    if s.shape[dim] != kb or kb != kbp:
        pad = [0, 0] * (s.dim() - 1 - dim) + [0, kbp - kb]
        s = torch.nn.functional.pad(s.narrow(dim, 0, kb), pad)
    return s.contiguous()


def kernel_sfa(s: torch.Tensor, k: int, repeat: int = 1) -> torch.Tensor:
    """The kernel's mSFA from scales ``s`` (L, M, kbs), one per row per ``repeat`` 32-wide K blocks
    (MXFP8: 1, torch's 128-wide blocks: 4): an (M, Kb, L) view, unit stride along Kb (padded with 0
    to a multiple of 4), 16-byte aligned. No copy for fp32 MXFP8 scales with Kb blocks, one or two
    otherwise."""
    buf = _k_blocks(s.float(), k, repeat, 2)
    if buf.data_ptr() % 16:
        buf = buf.clone()
    return buf.permute(1, 2, 0)


@functools.cache
def permutation_on(tile_n: int, device: torch.device) -> torch.Tensor:
    """:func:`sfb_permutation` on ``device``, copied once (a host copy inside a CUDA-graph capture
    would fail; every eager scale build of a CUDA call makes it first)."""
    return sfb_permutation(tile_n).to(device)


def _sfb_positions(n: int, tile_n: int, perm: torch.Tensor) -> torch.Tensor:
    """index[p] = the column of B (of N) whose scales the kernel reads at position p (of Np = N
    rounded up to the tile; ``perm`` = ``sfb_permutation`` within each tile), N past the last
    column (a zero row)."""
    n_tiles = -(-n // tile_n)
    cols = (torch.arange(n_tiles, device=perm.device).unsqueeze(1) * tile_n + perm.unsqueeze(0)).reshape(-1)
    return torch.where(cols < n, cols, n)


@functools.lru_cache(maxsize=256)
def _sfb_index(n: int, tile_n: int, device: torch.device) -> torch.Tensor:
    """:func:`_sfb_positions` built on the host and copied once per (N, tile_n, device)."""
    return _sfb_positions(n, tile_n, sfb_permutation(tile_n)).to(device)


def _sfb_index_for(n: int, tile_n: int, device: torch.device) -> torch.Tensor:
    """The position index of :func:`kernel_sfb`: cached, except inside a CUDA-graph capture (no
    host copy is allowed there, and a tensor made there belongs to the graph's memory pool): then
    made on the device from the tile's cached permutation, part of the graph."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return _sfb_positions(n, tile_n, permutation_on(tile_n, device))
    if device.type == "cuda":
        permutation_on(tile_n, device)  # made here, eagerly, for a later capture
    return _sfb_index(n, tile_n, device)


def kernel_sfb(s: torch.Tensor, k: int, tile_n: int, repeat: int = 1) -> torch.Tensor:
    """The kernel's mSFB from scales ``s`` (L, N, kbs), one per column of the product per
    ``repeat`` 32-wide K blocks: an (Np, Kb, L) view, unit stride along Np; each tile_n-column
    tile's scales in ``sfb_permutation`` order. Two copies (a zero row after the N rows; the
    gather into position order, (Kb, Np) per L), one or two more for repeat or padding."""
    L, n, kbs = s.shape
    rows = torch.nn.functional.pad(s.float(), (0, 0, 0, 1))  # (L, N + 1, kbs), row N zero
    by_pos = rows.transpose(1, 2).index_select(2, _sfb_index_for(n, tile_n, s.device))  # (L, kbs, Np)
    return _k_blocks(by_pos, k, repeat, 1).permute(2, 1, 0)


def mx_scales_a(qa: BlockScaledTensor) -> torch.Tensor:
    """The kernel's mSFA of an MXFP8 operand (``kernel_sfa`` of its decoded scales)."""
    return kernel_sfa(_plain_scales3(qa), qa.shape[-1])


def mx_scales_b(qb: BlockScaledTensor, tile_n: int) -> torch.Tensor:
    """The kernel's mSFB of an MXFP8 operand (``kernel_sfb`` of its decoded scales)."""
    return kernel_sfb(_plain_scales3(qb), qb.shape[-1], tile_n)


def check_mx_operands(qa, qb) -> None:
    """Rules of the sm_90a path beyond ``sm100.check_operands``: elements of the format's dtype
    (MXFP8: float8_e4m3fn; FP4: float4_e2m1fn_x2), K a multiple of 16 (TMA / the dequantize
    kernel's 16-element chunks)."""
    check_elements(qa, "qa")
    check_elements(qb, "qb")
    k = qa.shape[-1]
    if k % 16:
        raise ValueError(f"block-scaled GEMM on sm_90a: K must be a multiple of 16, got K={k}")


# Dense: M rows (grouped: mean rows per expert) and N at least these take the dequantize-first
# path. H200, same run, N = K = 8192: dequantize-first
# 1.73x the emulation at 8192 rows, 1.44x at 256, 1.13x at 64, 1.09x at 16 (the emulation's
# 64-row tiles leave half the SMs idle there); fewer rows not measured.
DEQUANT_MIN_ROWS = 16
DEQUANT_MIN_COLS = 256


def dequantize_first(rows: int, n: int, qa: BlockScaledTensor, qb: BlockScaledTensor) -> bool:
    """Whether the policy runs ``gemm_mx_sm90`` as one bf16 dequantize pass over each operand
    (``dequant.dequantize_bf16``) plus the bf16 GEMM: for compute-bound shapes (the emulated
    mainloop's per-32 promotion makes it issue-bound at about half the bf16 GEMM's speed), when
    both operands meet the dequantize kernel's rules. Below 16 rows (not measured) the emulation
    stays: it reads the FP8 weights once instead of writing and reading a bf16 copy."""
    return rows >= DEQUANT_MIN_ROWS and n >= DEQUANT_MIN_COLS and dequantizable(qa) and dequantizable(qb)


def ring_first(qa: BlockScaledTensor, qb: BlockScaledTensor) -> bool:
    """Whether the policy runs ``gemm_mx_sm90`` as A dequantized to bf16 (exact; one kernel pass
    over M x K elements) plus the MXFP8-weight GEMM of ``weight_only.launch`` with qb as the weight:
    MXFP8 (e4m3) x MXFP8 (e4m3), 2-D A (dense) or the packed grouped form, K a multiple of 16, A
    accepted by the dequantize kernel (the element dtypes: ``check_mx_operands``, before). That GEMM's own policy streams the FP8 weight through the
    ring kernel (dequantized in registers) for up to DQ_MIN_ROWS_FP8 - 1 rows (per expert:
    DQ_MIN_ROWS_GROUPED_FP8 - 1) and above dequantizes it once and runs the bf16 GEMM, as the
    dequantize-first path here does. H200 (bench/RESULTS.md),
    N=28672 K=4096, us: M=1 48.1, M=16 49.3 (cuBLAS bf16 on the dequantized weights 67.7 / 68.1;
    the emulation's 64-row tiles and dequantize-first were slower), M=128 ~95 vs 188.2 (both
    operands dequantized first)."""
    return (
        qa.fmt.name == qb.fmt.name == "mxfp8" and len(qa.shape) == 2 and qa.shape[-1] % 16 == 0 and dequantizable(qa)
    )  # fmt: skip


def _ring_gemm(qa, qb, out_dtype, alpha, out, offs):
    """A as bf16 (one dequantize pass), then ``gemm_fp4_weight(a16, qb)`` (dense, or grouped with
    ``offs``: rows at or past ``offs[-1]`` are not written)."""
    return gemm_fp4_weight(dequantize_checked(qa), qb, offs=offs, out=out, out_dtype=out_dtype, alpha=alpha)


# Warm dense MXFP8 x MXFP8 calls of the ring route (gemm_blockscaled with no config and no out):
# ring_key -> A's dequantize launch (dequant.launch_of). The key fixes every rule checked on the way
# to _ring_gemm (sm100.check_operands, the CUDA device and its arch, check_mx_operands, ring_first)
# but A's elements' alignment, re-checked per call; both formats must be the MXFP8 object itself.
# qb's own rules are gemm_fp4_weight's (its warm plan, or its checks), as on the cold route.
_RING: dict = {}
_MAX_RING = 512  # as the other plan tables: a stream of new shapes cannot grow it forever


def ring_key(qa: BlockScaledTensor, qb: BlockScaledTensor, out_dtype) -> tuple:
    a, b, s = qa.data, qb.data, qa.scales
    # A's scales and global scale too (a warm hit skips check_block_scaled on qa; qb: its weight plan)
    return (a.shape, a.stride(), a.dtype, a.device, qa.shape, b.dtype, b.device, qb.shape, out_dtype,
            s.shape, s.dtype, qa.scales_swizzled, qa.global_scale is None)  # fmt: skip


def _record_ring(qa: BlockScaledTensor, qb: BlockScaledTensor, out_dtype) -> None:
    launch = launch_of(qa)
    if qa.fmt is MXFP8 and qb.fmt is MXFP8 and launch is not None:
        if len(_RING) >= _MAX_RING:
            _RING.clear()
        _RING[ring_key(qa, qb, out_dtype)] = launch


def warm_ring(qa, qb, out_dtype, alpha) -> torch.Tensor | None:
    """The result of a dense sm_90a call (no config, no out) whose signature took the ring route
    before: A dequantized by the kept launch, then the MXFP8-weight GEMM, as :func:`_ring_gemm`;
    None for any other call (the caller then checks and routes it)."""
    if not _RING or not (isinstance(qa, BlockScaledTensor) and isinstance(qb, BlockScaledTensor)):
        return None
    if qa.fmt is not MXFP8 or qb.fmt is not MXFP8:
        return None
    try:
        launch = _RING.get(ring_key(qa, qb, out_dtype))
    except (AttributeError, TypeError, RuntimeError):  # not strided tensors, an unhashable out_dtype...
        return None
    if launch is None or qa.data.data_ptr() % 16:
        return None
    return gemm_fp4_weight(launch.run_new(qa, torch.bfloat16), qb, out_dtype=out_dtype, alpha=float(alpha))


def dequantized_gemm(qa, qb, out_dtype, alpha, out, offs):
    """bf16 copies of both operands (one kernel pass each), then the bf16 GEMM (dense / batched,
    or the packed grouped form with ``offs``). MX operands are exact in bf16, NVFP4's global
    scale makes them a rounding (see ``dequant``); fp32 accumulation; temporary memory 2 bytes x
    (rows of A + rows of B) x K."""
    a16, b16 = dequantize_checked(qa), dequantize_checked(qb)
    if offs is not None:
        return grouped_gemm(a16, b16.transpose(1, 2), offs=offs, out=out, out_dtype=out_dtype, alpha=alpha)
    return gemm(a16, b16.mT, out=out, out_dtype=out_dtype, alpha=alpha)


def gemm_mx_sm90(
    qa: BlockScaledTensor,
    qb: BlockScaledTensor,
    out_dtype: torch.dtype,
    alpha: float,
    config: GemmConfig | None,
    out: torch.Tensor | None = None,
    offs: torch.Tensor | None = None,
) -> torch.Tensor:
    """Launch of the emulated MXFP8 GEMM (operands already checked by the caller with
    ``sm100.check_operands`` and ``check_mx_operands``; ``out`` as in ``gemm_blockscaled``).
    Grouped (``offs``: qa (total_M, K), qb (E, N, K), ``out`` (total_M, N) checked by
    ``sm100.grouped_gemm_blockscaled``): the packed MoE form, A's scale rows read from each
    expert's first row, B's scales per expert."""
    grouped = offs is not None
    m, k = qa.shape[-2], qa.shape[-1]
    n = qb.shape[-2]
    if qa.fmt.name != "mxfp8" or qb.fmt != qa.fmt:  # an FP4 operand: no FP4 tensor-core input on Hopper

        if config is not None:
            raise ValueError(
                f"{qa.fmt.name} x {qb.fmt.name} on sm_90a has no kernel config to force: it dequantizes to bf16 first"
            )
        check_dequant_operand(qa, "qa")
        check_dequant_operand(qb, "qb")
        return dequantized_gemm(qa, qb, out_dtype, alpha, out, offs)
    if config is None and ring_first(qa, qb):
        if offs is None and out is None:  # gemm_blockscaled's call: warm from now on (warm_ring)
            _record_ring(qa, qb, out_dtype)
        return _ring_gemm(qa, qb, out_dtype, alpha, out, offs)
    if config is None and dequantize_first(m // qb.shape[0] if grouped else m, n, qa, qb):
        return dequantized_gemm(qa, qb, out_dtype, alpha, out, offs)
    a, b = operand_view(qa), operand_view(qb)  # (M, K, L), (N, K, L) (grouped: L = E)
    if grouped:
        cfg = emulation_config(m, n, k, out_dtype, alpha, config, experts=qb.shape[0])
        GROUPED_CACHE.get(cfg)(*KernelArgs(
            a, b, l1_view(out), alpha=alpha, max_clusters=max_clusters_for(cfg, qa.data.device), offs=offs,
            sfa=mx_scales_a(qa), sfb=mx_scales_b(qb, cfg.tile_n),
            workspace=new_workspace(cfg, qa.data.device),  # zeroed in-stream
        ))  # fmt: skip
        return out
    cfg = emulation_config(m, n, k, out_dtype, alpha, config)
    return launch_emulated(cfg, a, b, _plain_scales3(qa), _plain_scales3(qb), out_dtype, alpha, out,
                           batched=len(qa.shape) == 3)  # fmt: skip


def emulation_config(m: int, n: int, k: int, out_dtype, alpha: float, config: GemmConfig | None,
                     experts: int = 0) -> GemmConfig:  # fmt: skip
    """The emulation kernel's config of an (m, n, k) call (``config``, or ``mx_config`` of the
    rows; grouped when ``experts``: the tile follows the mean rows per expert), alpha on where
    the call scales, checked by ``can_implement``. Kept per signature (a pure function of it:
    ~20 µs of host time per call otherwise); errors are raised anew each call."""
    return _emulation_config(m, n, k, out_dtype, alpha != 1.0, config, experts)


@functools.lru_cache(maxsize=1024)
def _emulation_config(m: int, n: int, k: int, out_dtype, scaled: bool, config: GemmConfig | None,
                      experts: int) -> GemmConfig:  # fmt: skip
    if config is not None and (not config.fp8_mx or config.grouped != bool(experts)):
        raise ValueError(
            f"config {config.name} is not an MXFP8-emulation kernel (fp8_mx=True, grouped={bool(experts)}, see mx_config)"
        )
    rows = -(-m // experts) if experts else m
    cfg = config or replace(mx_config(rows, n, out_dtype, alpha=scaled), form=Form.GROUPED if experts else Form.DENSE)
    if scaled and not cfg.epilogue.alpha:
        cfg = replace(cfg, epilogue=replace(cfg.epilogue, alpha=True))
    ok, why = can_implement(cfg, GemmProblem(m, n, k, 1, "e4m3", "e4m3", OUT_NAMES[out_dtype], "k", "k", (k,), (k,)))
    if not ok:
        raise ValueError(f"cannot run {cfg.name}: {why}")
    return cfg


def launch_emulated(cfg: GemmConfig, a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
                    out_dtype, alpha: float, out, batched: bool, repeat: int = 1,
                    kernel_scales=None) -> torch.Tensor:  # fmt: skip
    """The dense emulation kernel on e4m3 operands ``a`` (M, K, L) and ``b`` (N, K, L) (K-major
    views, 16-byte aligned rows) with scales ``sa`` (L, M, kbs) and ``sb`` (L, N, kbs), one per row
    of a / column of the product per ``repeat`` 32-wide K blocks (kbs = ceil(K / (32 repeat))):
    ``out[l] = sum_kb (a[:, kb] @ b[:, kb].T) * sa[l, :, kb, None] * sb[l, None, :, kb]``.
    ``kernel_scales``: (mSFA, mSFB) already built (what ``kernel_sfa`` / ``kernel_sfb`` of sa / sb
    give, e.g. by one gather); sa / sb are then not read."""
    m, k, L = a.shape
    n = b.shape[0]
    written, c_view = output_view(out, L, m, n, out_dtype, a.device, batched)
    if kernel_scales is None:
        kernel_scales = kernel_sfa(sa, k, repeat), kernel_sfb(sb, k, cfg.tile_n, repeat)
    DENSE_CACHE.get(cfg)(*KernelArgs(
        a, b, c_view, alpha=alpha, max_clusters=max_clusters_for(cfg, a.device), sfa=kernel_scales[0],
        sfb=kernel_scales[1],
        workspace=new_workspace(cfg, a.device),  # scheduler "dynamic": a fresh tile counter, zeroed in-stream
    ))  # fmt: skip
    return finish_output(out, written)


def mx_emulation_ref(qa: BlockScaledTensor, qb: BlockScaledTensor, tile_n: int = 128) -> torch.Tensor:
    """Plain-torch model of the kernel's arithmetic from the kernel's own inputs (any device,
    fp32, 2-D MXFP8 operands): :func:`emulation_ref` of their elements and decoded scales.
    Agrees with ``dequantize_ref`` math only if the layouts and the read positions agree (CPU
    tests)."""
    return emulation_ref(qa.data, qb.data, _plain_scales3(qa), _plain_scales3(qb), tile_n)


def emulation_ref(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, tile_n: int = 128,
                  repeat: int = 1):  # fmt: skip
    """What the kernel computes from ``launch_emulated``'s inputs (a (M, K), b (N, K) e4m3; sa
    (1, M, kbs), sb (1, N, kbs), ``repeat``): per 32-K block, the block's partial product of the
    raw e4m3 values, scaled by the A scale read from ``kernel_sfa`` at (row, block) and the B scale
    read from ``kernel_sfb`` where a thread holding column c reads it."""
    m, k = a.shape
    n = b.shape[0]
    sfa = kernel_sfa(sa, k, repeat)[:, :, 0]
    sfb = kernel_sfb(sb, k, tile_n, repeat)[:, :, 0]  # (Np, Kb): position-ordered
    # position of column c: its tile, then the inverse of the permutation
    inv = torch.argsort(sfb_permutation(tile_n))
    cols = torch.arange(n)
    pos = (cols // tile_n) * tile_n + inv[cols % tile_n]
    af, bf = a.float(), b.float()
    acc = torch.zeros((m, n), dtype=torch.float32)
    for kb in range(-(-k // MX_K_BLOCK)):
        sl = slice(kb * MX_K_BLOCK, min(k, (kb + 1) * MX_K_BLOCK))
        part = af[:, sl] @ bf[:, sl].T
        acc += part * (sfa[:, kb, None] * sfb[pos, kb][None, :])
    return acc
