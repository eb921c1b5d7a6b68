"""Block-scaled dense GEMM on Blackwell (sm_100a): host entry for ``GemmSm100`` in block-scaled
mode (``GemmConfig.sf_vec > 0``; see ``cutegemm.gemm.sm100``).

``gemm_blockscaled(qa, qb)`` computes ``dequantize(qa) @ dequantize(qb).T`` with the tcgen05
block-scaled MMA: qa holds A (M, K) [or (L, M, K)] and qb holds B as (N, K) [or (L, N, K)], both
quantized along K (torch ``_scaled_mm``'s A row-major / B column-major). Scales go to the kernel
as the raw bytes of the 128x4 swizzled layout; NVFP4's per-tensor global scales are folded into
the epilogue's alpha.

Not yet exposed through ``cutegemm.gemm``: the public ``gemm(qa, qb)`` is the lead's to wire. On
sm_90a there is no block-scaled MMA; the emulated Hopper path is not written yet, so this raises
``NotImplementedError`` there.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..epilogue import EpilogueSpec
from ..gemm.config import GemmConfig, GemmProblem, can_implement
from .formats import MXFP4, MXFP8, NVFP4
from .layout import to_swizzled
from .reference import BlockScaledTensor

# format name -> (element dtype, scale dtype, vec) of GemmConfig
RECIPES = {
    MXFP8.name: ("e4m3", "e8m0", MXFP8.block_size),
    MXFP4.name: ("e2m1", "e8m0", MXFP4.block_size),
    NVFP4.name: ("e2m1", "e4m3", NVFP4.block_size),
}
_OUT_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def blockscaled_config(fmt_name: str, m: int, n: int, out_dtype: torch.dtype = torch.bfloat16, alpha: bool = False):
    """A simple tile choice for sm_100a: 2-CTA 256x256 for large problems, else 1-CTA 128 x N."""
    elem, sf, vec = RECIPES[fmt_name]
    base = GemmConfig(
        arch="sm_100a", a_dtype=elem, b_dtype=elem, sf_dtype=sf, sf_vec=vec, a_major="k", b_major="k",
        out_dtype=_OUT_NAMES[out_dtype], epilogue=EpilogueSpec(alpha=alpha),
    )  # fmt: skip
    if m >= 256 and n >= 256:
        return replace(base, tile_m=256, tile_n=256, two_cta=True, cluster_m=2)
    return replace(base, tile_m=128, tile_n=256 if n > 128 else 128)


def _check(qa, qb):
    for nm, q in (("qa", qa), ("qb", qb)):
        if not isinstance(q, BlockScaledTensor):
            raise TypeError(f"{nm} must be a BlockScaledTensor, got {type(q).__name__}")
        if q.fmt.name not in RECIPES:
            raise ValueError(f"{nm}: format {q.fmt.name!r} has no sm_100a kernel (have {sorted(RECIPES)})")
        if q.data.device.type != "cuda":
            raise ValueError(f"{nm} must be on a CUDA device, got {q.data.device}")
        if len(q.shape) not in (2, 3):
            raise ValueError(f"{nm} must be (rows, K) or (L, rows, K), got {tuple(q.shape)}")
    if qa.fmt != qb.fmt:
        raise ValueError(f"qa and qb must share a format, got {qa.fmt.name} and {qb.fmt.name}")
    if qa.shape[-1] != qb.shape[-1]:
        raise ValueError(f"K mismatch: qa {tuple(qa.shape)} vs qb {tuple(qb.shape)}")
    if len(qa.shape) != len(qb.shape) or (len(qa.shape) == 3 and qa.shape[0] != qb.shape[0]):
        raise ValueError(f"batch mismatch: qa {tuple(qa.shape)} vs qb {tuple(qb.shape)}")


def _operand_view(q: BlockScaledTensor) -> torch.Tensor:
    """(rows, K, L) view of the K-major elements (FP4: in packed byte units of torch's x2 dtype)."""
    d = q.data if q.data.dim() == 3 else q.data.unsqueeze(0)
    d = d.contiguous()
    L, rows, kk = d.shape
    return d.as_strided((rows, kk, L), (kk, 1, rows * kk))


def _scale_bytes(q: BlockScaledTensor) -> torch.Tensor:
    s = q.scales if q.scales_swizzled else to_swizzled(q.scales)
    return s.contiguous().reshape(-1)


def gemm_blockscaled(
    qa: BlockScaledTensor,
    qb: BlockScaledTensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    config: GemmConfig | None = None,
) -> torch.Tensor:
    """``dequantize(qa) @ dequantize(qb).mT`` (fp32 accumulation) -> (M, N) or (L, M, N)."""
    _check(qa, qb)
    major, _ = torch.cuda.get_device_capability(qa.data.device)
    if major != 10:
        raise NotImplementedError(
            f"block-scaled GEMM runs natively on sm_100 (Blackwell) only; this GPU is sm_{major}x "
            "(the Hopper emulation is not implemented yet)"
        )
    from ..gemm.api import DENSE_CACHE

    fmt = qa.fmt
    m, k = qa.shape[-2], qa.shape[-1]
    n = qb.shape[-2]
    alpha = 1.0
    if qa.global_scale is not None or qb.global_scale is not None:
        # NVFP4: value = e2m1 * e4m3 scale * global scale; fold both global scales into alpha.
        ga = 1.0 if qa.global_scale is None else float(qa.global_scale)
        gb = 1.0 if qb.global_scale is None else float(qb.global_scale)
        alpha = ga * gb
    cfg = config or blockscaled_config(fmt.name, m, n, out_dtype, alpha=alpha != 1.0)
    elem = RECIPES[fmt.name][0]
    ok, why = can_implement(cfg, GemmProblem(m, n, k, 1, elem, elem, _OUT_NAMES[out_dtype], "k", "k", (k,), (k,)))
    if not ok:
        raise ValueError(f"cannot run {cfg.name}: {why}")
    batched = len(qa.shape) == 3
    L = qa.shape[0] if batched else 1
    out = torch.empty((L, m, n), dtype=out_dtype, device=qa.data.device)
    c_view = out.as_strided((m, n, L), (n, 1, m * n))
    num_sms = torch.cuda.get_device_properties(qa.data.device).multi_processor_count
    max_clusters = max(1, num_sms // (cfg.cluster_m * cfg.cluster_n))
    fn = DENSE_CACHE.get(cfg)
    fn(
        _operand_view(qa), _operand_view(qb), c_view, None, None,
        alpha, 0.0, max_clusters, None, _scale_bytes(qa), _scale_bytes(qb),
        *(None,) * 6, None,  # quantized-output scales, global scale, 4 epilogue vectors, workspace
    )  # fmt: skip
    return out if batched else out[0]


__all__ = ["gemm_blockscaled", "blockscaled_config", "RECIPES"]
