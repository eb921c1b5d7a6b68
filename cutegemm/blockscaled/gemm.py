"""Block-scaled dense GEMM on Blackwell (sm_100a): host entry for ``GemmSm100`` in block-scaled
mode (``GemmConfig.sf_vec > 0``; see ``cutegemm.gemm.sm100.kernel``).

``gemm_blockscaled(qa, qb)`` computes ``dequantize(qa) @ dequantize(qb).T`` with the tcgen05
block-scaled MMA: qa holds A (M, K) [or (L, M, K)] and qb holds B as (N, K) [or (L, N, K)], both
quantized along K (torch ``_scaled_mm``'s A row-major / B column-major). Scales go to the kernel
as the raw bytes of the 128x4 swizzled layout; NVFP4's per-tensor global scales are folded into
the epilogue's alpha.

Public entry points: ``cutegemm.gemm(qa, qb, out_dtype=..., alpha=..., config=..., out=...)`` and its twin
``cutegemm.gemm_ref(qa, qb, ...)`` dispatch here when an operand is a BlockScaledTensor
(:func:`gemm_api` / :func:`gemm_ref_api`; every other option of theirs must stay at its default),
and the custom op ``torch.ops.cutegemm.gemm_blockscaled`` (:mod:`cutegemm.dense.quantized`). On sm_90a
there is no block-scaled MMA: :mod:`.sm90_mx` dequantizes both operands to bf16 (one kernel pass
each) and runs the bf16 GEMM, or for MXFP8 with few rows emulates the scaling in an e4m3 WGMMA
mainloop.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..config import Form, GemmConfig, GemmProblem, can_implement
from ..epilogue import EpilogueSpec
from ..gemm.args import KernelArgs
from ..gemm.grouped_parts import GROUPED_MAX_GROUPS
from ..gemm.launch import DENSE_CACHE, GROUPED_CACHE, new_workspace
from ..grouped.packed import grouped_gemm_ref
from ..runtime.device import capability, device_info, max_clusters_for
from .formats import MXFP4, MXFP8, NVFP4
from .grouped_sf import grouped_scales_a
from .mx_sm90 import check_mx_operands, gemm_mx_sm90, warm_ring
from .operands import OUT_NAMES, check_out, finish_output, l1_view, operand_view, output_view
from .reference import BlockScaledTensor, check_block_scaled, dequantize_ref

# format name -> (element dtype, scale dtype, vec) of GemmConfig
RECIPES = {
    MXFP8.name: ("e4m3", "e8m0", MXFP8.block_size),
    MXFP4.name: ("e2m1", "e8m0", MXFP4.block_size),
    NVFP4.name: ("e2m1", "e4m3", NVFP4.block_size),
}
# Formats that may be paired with each other (kind::mxf8f6f4: both e8m0 scales per 32 K).
MIXED_FORMATS = {MXFP8.name, MXFP4.name}


def pair_recipe(qa, qb) -> tuple[str, str, str, int]:
    """(A element dtype, B element dtype, scale dtype, vec) of GemmConfig for qa x qb."""
    a_elem, sf, vec = RECIPES[qa.fmt.name]
    return a_elem, RECIPES[qb.fmt.name][0], sf, vec


def blockscaled_config(
    fmt_name: str, m: int, n: int, out_dtype: torch.dtype = torch.bfloat16, alpha: bool = False,
    global_scale: bool | None = None, b_fmt_name: str | None = None,
):  # fmt: skip
    """A simple tile choice for sm_100a: 2-CTA 256x256 for large problems, else 1-CTA 128 x N.
    global_scale (default: NVFP4): the epilogue multiplies by a 1-element device vector, the
    product of the operands' global scales (``global_scale_vector``), read in the kernel.
    ``b_fmt_name``: B's format when it differs from A's (MXFP8 x MXFP4)."""
    elem, sf, vec = RECIPES[fmt_name]
    b_elem = RECIPES[b_fmt_name or fmt_name][0]
    if global_scale is None:
        global_scale = fmt_name == "nvfp4"
    base = GemmConfig(
        arch="sm_100a", a_dtype=elem, b_dtype=b_elem, sf_dtype=sf, sf_vec=vec, a_major="k", b_major="k",
        out_dtype=OUT_NAMES[out_dtype], epilogue=EpilogueSpec(alpha=alpha, scale_a=global_scale),
    )  # fmt: skip
    if m >= 256 and n >= 256:
        return replace(base, tile_m=256, tile_n=256, two_cta=True, cluster_m=2)
    return replace(base, tile_m=128, tile_n=256 if n > 128 else 128)


def check_operands(qa, qb, out_dtype=torch.bfloat16, grouped: bool = False):
    """The operand rules of :func:`gemm_blockscaled` and its reference twin (no device rule);
    ``grouped``: qa (total_M, K) and qb (E, N, K) instead of equal ranks."""
    for nm, q in (("qa", qa), ("qb", qb)):
        if not isinstance(q, BlockScaledTensor):
            raise TypeError(f"{nm} must be a BlockScaledTensor, got {type(q).__name__}")
        if q.fmt.name not in RECIPES:
            raise ValueError(f"{nm}: format {q.fmt.name!r} has no block-scaled GEMM (have {sorted(RECIPES)})")
        if len(q.shape) not in (2, 3):
            raise ValueError(f"{nm} must be (rows, K) or (L, rows, K), got {tuple(q.shape)}")
        check_block_scaled(q, nm)  # fields that disagree would send the kernel past its scales
    if qa.fmt != qb.fmt and {qa.fmt.name, qb.fmt.name} != MIXED_FORMATS:
        raise ValueError(
            f"qa and qb must share a format (or pair MXFP8 with MXFP4), got {qa.fmt.name} and {qb.fmt.name}"
        )
    if qa.shape[-1] != qb.shape[-1]:
        raise ValueError(f"K mismatch: qa {tuple(qa.shape)} vs qb {tuple(qb.shape)}")
    if grouped:
        if len(qa.shape) != 2 or len(qb.shape) != 3:
            raise ValueError(
                f"grouped block-scaled: qa must be (total_M, K) and qb (E, N, K), got {tuple(qa.shape)} and {tuple(qb.shape)}"
            )
    elif len(qa.shape) != len(qb.shape) or (len(qa.shape) == 3 and qa.shape[0] != qb.shape[0]):
        raise ValueError(f"batch mismatch: qa {tuple(qa.shape)} vs qb {tuple(qb.shape)}")
    if out_dtype not in OUT_NAMES:
        raise ValueError(f"out_dtype must be one of {list(OUT_NAMES)}, got {out_dtype}")


def _check(qa, qb, out_dtype):
    check_operands(qa, qb, out_dtype)
    for nm, q in (("qa", qa), ("qb", qb)):
        if q.data.device.type != "cuda":
            raise ValueError(f"{nm} must be on a CUDA device, got {q.data.device}")


def global_scale_vector(qa: BlockScaledTensor, qb: BlockScaledTensor) -> torch.Tensor | None:
    """NVFP4: value = e2m1 x e4m3 block scale x per-tensor global scale. The two global scales'
    product as a (1,) fp32 tensor on the operands' device (torch ops, no host read: the call stays
    sync-free and CUDA-graph capturable; a replay reads the scales' current values), or None when
    neither operand has one. The kernel's epilogue multiplies by it (EpilogueSpec.scale_a with a
    1-element vector: a per-tensor scale)."""
    gs = [q.global_scale for q in (qa, qb) if q.global_scale is not None]
    if not gs:
        return None
    dev = qa.data.device
    v = gs[0].detach().to(device=dev, dtype=torch.float32).reshape(1)
    if len(gs) == 2:
        v = v * gs[1].detach().to(device=dev, dtype=torch.float32).reshape(1)
    return v


def with_global_scale(cfg: GemmConfig, vec: torch.Tensor | None, alpha: float) -> GemmConfig:
    """``cfg`` with the epilogue ops this call needs: alpha when alpha != 1, the per-tensor
    scale vector when the operands carry global scales (a given config may lack either)."""
    epi = cfg.epilogue
    if alpha != 1.0 and not epi.alpha:
        epi = replace(epi, alpha=True)
    if vec is not None and not epi.scale_a:
        epi = replace(epi, scale_a=True)
    if vec is None and epi.scale_a:
        raise ValueError(f"config {cfg.name} multiplies by a global scale, but the operands have none")
    return replace(cfg, epilogue=epi) if epi is not cfg.epilogue else cfg


def _scale_bytes(q: BlockScaledTensor) -> torch.Tensor:
    return q.swizzled_scales().contiguous().reshape(-1)


def gemm_blockscaled(
    qa: BlockScaledTensor,
    qb: BlockScaledTensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    alpha: float = 1.0,
    config: GemmConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``alpha * dequantize(qa) @ dequantize(qb).mT`` (fp32 accumulation) -> (M, N) or (L, M, N).

    ``out``: an optional (M, N) / (L, M, N) result tensor of ``out_dtype`` (unit column stride,
    16-byte aligned row stride, e.g. a view into a larger buffer); it is returned.

    Raises ValueError for CPU operands or a bad shape / format / out_dtype, NotImplementedError
    on a GPU other than sm_100 / sm_90 (sm_90: :mod:`.sm90_mx`, dequantize-first or the MXFP8
    emulation)."""
    if config is None and out is None:  # a warm sm_90a MXFP8 x MXFP8 signature: its checks are kept
        res = warm_ring(qa, qb, out_dtype, alpha)
        if res is not None:
            return res
    _check(qa, qb, out_dtype)
    major, minor = capability(qa.data.device.index or 0)
    if major == 9:  # Hopper: dequantize-first, or MXFP8 emulated with e4m3 WGMMAs

        check_mx_operands(qa, qb)
        alpha = float(alpha)
        return gemm_mx_sm90(qa, qb, out_dtype, alpha, config, out)
    if major != 10:
        raise NotImplementedError(
            f"block-scaled GEMM needs sm_100a (Blackwell); this GPU is sm_{major}{minor}: dequantize "
            "the operands (cutegemm.dequantize) and run a bf16 GEMM instead"
        )

    m, k = qa.shape[-2], qa.shape[-1]
    n = qb.shape[-2]
    alpha = float(alpha)
    gs = global_scale_vector(qa, qb)  # NVFP4's global scales, applied in the epilogue
    recipe = pair_recipe(qa, qb)
    if config is not None and (config.a_dtype, config.b_dtype, config.sf_dtype, config.sf_vec) != recipe:
        raise ValueError(
            f"config {config.name} is not a {qa.fmt.name} x {qb.fmt.name} kernel (a_dtype, b_dtype, sf_dtype, "
            f"sf_vec must be {recipe}, see blockscaled_config)"
        )
    cfg = config or blockscaled_config(qa.fmt.name, m, n, out_dtype, alpha=alpha != 1.0, global_scale=gs is not None,
                                       b_fmt_name=qb.fmt.name)  # fmt: skip
    cfg = with_global_scale(cfg, gs, alpha)
    ok, why = can_implement(
        cfg, GemmProblem(m, n, k, 1, recipe[0], recipe[1], OUT_NAMES[out_dtype], "k", "k", (k,), (k,))
    )
    if not ok:
        raise ValueError(f"cannot run {cfg.name}: {why}")
    batched = len(qa.shape) == 3
    L = qa.shape[0] if batched else 1
    written, c_view = output_view(out, L, m, n, out_dtype, qa.data.device, batched)
    max_clusters = max_clusters_for(cfg, qa.data.device)
    fn = DENSE_CACHE.get(cfg)
    fn(*KernelArgs(
        operand_view(qa), operand_view(qb), c_view, alpha=alpha, max_clusters=max_clusters,
        sfa=_scale_bytes(qa), sfb=_scale_bytes(qb), v0=gs,  # v0: the NVFP4 global-scale product
        workspace=new_workspace(cfg, qa.data.device),  # scheduler "dynamic": a fresh counter, zeroed in-stream
    ))  # fmt: skip
    return finish_output(out, written)


def gemm_blockscaled_ref(
    qa: BlockScaledTensor,
    qb: BlockScaledTensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    alpha: float = 1.0,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Plain-torch twin of :func:`gemm_blockscaled` (any device): ``dequantize_ref`` of both
    operands, ``alpha * A @ B.mT`` in ``compute_dtype``, then the cast. Same operand rules; any
    floating out_dtype (float64 too, for fp64 checks)."""
    check_operands(qa, qb)
    if not (isinstance(out_dtype, torch.dtype) and out_dtype.is_floating_point):
        raise ValueError(
            f"out_dtype must be one of {list(OUT_NAMES)} (or float64 for the reference), got {out_dtype}"
        )
    acc = torch.matmul(dequantize_ref(qa).to(compute_dtype), dequantize_ref(qb).to(compute_dtype).mT)
    if alpha != 1.0:
        acc = acc * alpha
    return acc.to(out_dtype)


# -- cutegemm.gemm / cutegemm.gemm_ref with BlockScaledTensor operands --------------------------
GEMM_OPTIONS = ("out_dtype", "alpha", "config", "out")
GEMM_REF_OPTIONS = ("out_dtype", "alpha", "compute_dtype")


__all__ = [
    "gemm_blockscaled",
    "grouped_gemm_blockscaled",
    "grouped_gemm_blockscaled_ref",
    "gemm_blockscaled_ref",
    "blockscaled_config",
    "check_operands",
    "RECIPES",
]


# -- grouped (MoE packed form): grouped_gemm(qa, qb, offs=offs) ------------------------------------
def check_grouped_operands(qa, qb, offs, out_dtype=torch.bfloat16) -> None:
    """Rules of the grouped block-scaled GEMM and its twin: qa (total_M, K) and qb (E, N, K) in one
    sm_100a format, offs int32 (E,) on qa's device."""
    check_operands(qa, qb, out_dtype, grouped=True)
    if not isinstance(offs, torch.Tensor) or offs.dtype != torch.int32 or offs.dim() != 1:
        raise TypeError("offs must be a 1-D torch.int32 tensor (cumulative end rows of the experts)")
    if offs.numel() != qb.shape[0]:
        raise ValueError(f"offs has {offs.numel()} entries but qb has {qb.shape[0]} experts")
    if offs.device != qa.data.device or qb.data.device != qa.data.device:
        raise ValueError(f"qa, qb and offs must be on one device, got {qa.data.device}, {qb.data.device}, {offs.device}")


def grouped_gemm_blockscaled(qa, qb, *, offs, out_dtype=torch.bfloat16, alpha: float = 1.0, config=None, out=None):
    """``alpha * dequantize(qa_e) @ dequantize(qb[e]).T`` per expert e of the packed rows (``offs``,
    ``torch._grouped_mm`` semantics) -> (total_M, N); rows past offs[-1] are not written. sm_100a
    (tcgen05 block-scaled MMA, MXFP8 / MXFP4 / NVFP4): A's scales are re-laid out per expert on
    the device (``grouped_sf``) and NVFP4's global scales are multiplied in the epilogue from
    device memory: no host sync, CUDA-graph capturable. sm_90a (``sm90_mx``): both operands
    dequantized to bf16 (one kernel pass each) and the bf16 grouped GEMM, or for MXFP8 with few
    rows per expert the e4m3-WGMMA emulation; other GPUs raise NotImplementedError."""
    check_grouped_operands(qa, qb, offs, out_dtype)
    dev = qa.data.device
    if dev.type != "cuda":
        raise ValueError(f"qa must be on a CUDA device, got {dev}")
    arch, num_sms = device_info(dev.index if dev.index is not None else torch.cuda.current_device())
    if arch not in ("sm_100a", "sm_90a"):
        raise NotImplementedError(
            f"grouped block-scaled GEMM needs sm_100a (Blackwell) or sm_90a (Hopper); this GPU is {arch}: "
            "dequantize and run bf16"
        )
    E, n, k = qb.shape
    total_m = qa.shape[0]
    if E > GROUPED_MAX_GROUPS:
        raise ValueError(f"at most {GROUPED_MAX_GROUPS} experts are supported, got {E}")
    elem_bytes = out_dtype.itemsize
    if (n * elem_bytes) % 16:  # partial tiles store whole 16-byte row pieces
        raise ValueError(f"N * {elem_bytes} bytes must be a multiple of 16, got N={n}")
    if out is None:
        out = torch.empty(total_m, n, dtype=out_dtype, device=dev)
    else:
        check_out(out, (total_m, n), out_dtype, dev)
    if total_m == 0 or n == 0 or E == 0:
        return out
    if arch == "sm_90a":  # Hopper: dequantize-first, or MXFP8 emulated

        check_mx_operands(qa, qb)
        return gemm_mx_sm90(qa, qb, out_dtype, float(alpha), config, out, offs=offs)
    alpha = float(alpha)
    gs = global_scale_vector(qa, qb)  # NVFP4's global scales, applied in the epilogue (no host read)
    a_elem, b_elem, sf, vec = pair_recipe(qa, qb)
    if config is not None and (config.a_dtype, config.b_dtype, config.sf_dtype, config.sf_vec, config.grouped) != (
        a_elem, b_elem, sf, vec, True
    ):
        raise ValueError(f"config {config.name} is not a grouped {qa.fmt.name} x {qb.fmt.name} kernel")
    cfg = config or replace(
        blockscaled_config(qa.fmt.name, 128, n, out_dtype, alpha=alpha != 1.0, global_scale=gs is not None,
                           b_fmt_name=qb.fmt.name),
        tile_m=128, two_cta=False, cluster_m=1, form=Form.GROUPED, raster="m", group=1,
    )  # fmt: skip
    cfg = with_global_scale(cfg, gs, alpha)
    ok, why = can_implement(cfg, GemmProblem(total_m, n, k, 1, a_elem, b_elem, OUT_NAMES[out_dtype], "k", "k", (k,), (k,)))
    if not ok:
        raise ValueError(f"cannot run {cfg.name}: {why}")
    max_clusters = max_clusters_for(cfg, qa.data.device, num_sms)
    GROUPED_CACHE.get(cfg)(*KernelArgs(
        operand_view(qa), operand_view(qb), l1_view(out), alpha=alpha, max_clusters=max_clusters, offs=offs,
        sfa=grouped_scales_a(qa, offs), sfb=_scale_bytes(qb), v0=gs,  # v0: the NVFP4 global-scale product
        workspace=new_workspace(cfg, dev),  # a fresh counter: zeroed in-stream
    ))  # fmt: skip
    return out


def grouped_gemm_blockscaled_ref(qa, qb, *, offs, out_dtype=torch.bfloat16, alpha: float = 1.0,
                                 compute_dtype=torch.float32):  # fmt: skip
    """Plain-torch twin: dequantize both, then the grouped reference per expert (rows past
    offs[-1] are zero here, unwritten by the kernel)."""
    check_grouped_operands(qa, qb, offs, out_dtype if out_dtype in OUT_NAMES else torch.bfloat16)
    if not (isinstance(out_dtype, torch.dtype) and out_dtype.is_floating_point):  # as gemm_blockscaled_ref
        raise ValueError(
            f"out_dtype must be one of {list(OUT_NAMES)} (or float64 for the reference), got {out_dtype}"
        )
    a = dequantize_ref(qa).to(compute_dtype)
    b = dequantize_ref(qb).to(compute_dtype).transpose(1, 2)
    return grouped_gemm_ref(a, b, offs=offs, out_dtype=out_dtype, alpha=alpha, compute_dtype=compute_dtype)
