"""Public dense GEMM: ``gemm`` (our kernels) and ``gemm_ref`` (plain torch twin)."""

from __future__ import annotations

import functools

import torch

from ..epilogue import EpilogueSpec
from ..runtime.cache import KernelCache
from .config import DTYPE_BYTES, TMA_ALIGN_BYTES, GemmConfig, GemmProblem, can_implement
from .policy import policy_for

TORCH_TO_NAME = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
NAME_TO_TORCH = {v: k for k, v in TORCH_TO_NAME.items()}


def kernel_class(arch: str):
    if arch == "sm_90a":
        from .sm90 import GemmSm90

        return GemmSm90
    if arch == "sm_100a":
        from .sm100 import GemmSm100

        return GemmSm100
    raise ValueError(f"no dense kernel for arch {arch!r}")


def build_dense(config: GemmConfig):
    from ..runtime.signature import dense_fake_args

    return kernel_class(config.arch)(config), dense_fake_args(config)


DENSE_CACHE = KernelCache(build_dense)


@functools.cache
def _device_info(index: int) -> tuple[str, int]:
    major, minor = torch.cuda.get_device_capability(index)
    if major == 9:
        arch = "sm_90a"
    elif major == 10:
        arch = "sm_100a"
    else:
        raise ValueError(
            f"cutegemm runs on sm_90 (Hopper) and sm_100 (Blackwell) GPUs; device {index} is sm_{major}{minor}"
        )
    return arch, torch.cuda.get_device_properties(index).multi_processor_count


def _check_operand(name: str, t, dims=(2, 3)):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise ValueError(f"{name} must be a CUDA tensor, got device {t.device}")
    if t.dim() not in dims:
        raise ValueError(f"{name} must have {' or '.join(map(str, dims))} dims, got shape {tuple(t.shape)}")


def _major(t3: torch.Tensor, rows_mode: int, cols_mode: int) -> str | None:
    """'cols' if the cols mode is contiguous, 'rows' if the rows mode is, else None."""
    if t3.stride(cols_mode) == 1 or t3.shape[cols_mode] == 1:
        return "cols"
    if t3.stride(rows_mode) == 1 or t3.shape[rows_mode] == 1:
        return "rows"
    return None


def _tma_view(t3: torch.Tensor, unit_mode: int, name: str) -> torch.Tensor:
    """Return ``t3`` (or an aligned copy) with mode ``unit_mode`` at stride 1 and size-1 modes at
    a 16-byte stride (TMA validates every stride, used or not); raise if a stride breaks TMA's
    16-byte rule."""
    elem = t3.element_size()
    align = TMA_ALIGN_BYTES // elem
    if t3.data_ptr() % TMA_ALIGN_BYTES:
        # A storage offset broke the 16-byte base alignment: a fresh allocation is aligned.
        t3 = t3.clone(memory_format=torch.contiguous_format) if unit_mode == 2 else t3.mT.clone(memory_format=torch.contiguous_format).mT
    strides = list(t3.stride())
    strides[unit_mode] = 1
    for i, size in enumerate(t3.shape):
        if i != unit_mode and size == 1:
            strides[i] = align
    if strides != list(t3.stride()):
        t3 = t3.as_strided(t3.shape, strides)
    for i, s in enumerate(strides):
        if i != unit_mode and s % align:
            raise ValueError(
                f"{name}: stride {s} (elements) of dim {i} is not a multiple of {align} elements: TMA "
                f"needs 16-byte aligned strides (for a contiguous {t3.dtype} matrix: its last dim "
                f"must be a multiple of {align})"
            )
    return t3


def gemm(a, b, *, out=None, out_dtype=None, alpha: float = 1.0, config: GemmConfig | None = None):
    """``out = alpha * (a @ b)`` with fp32 accumulation.

    a: (M, K) or (L, M, K); b: (K, N) or (L, K, N) (a 2-D operand is shared by every batch);
    any row- or column-major views with 16-byte aligned strides; bf16 or fp16, a.dtype == b.dtype.
    out_dtype: torch.bfloat16 / float16 / float32 (default: a.dtype). ``out``: optional row-major
    output of the result shape. ``config``: force a kernel configuration (must pass can_implement).
    """
    _check_operand("a", a)
    _check_operand("b", b)
    if a.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"a.dtype must be torch.bfloat16 or torch.float16, got {a.dtype}")
    if b.dtype != a.dtype:
        raise TypeError(f"b.dtype ({b.dtype}) must equal a.dtype ({a.dtype})")
    if a.device != b.device:
        raise ValueError(f"a and b must be on the same device, got {a.device} and {b.device}")
    if out_dtype is None:
        out_dtype = out.dtype if out is not None else a.dtype
    if out_dtype not in TORCH_TO_NAME:
        raise TypeError(f"out_dtype must be torch.bfloat16, torch.float16 or torch.float32, got {out_dtype}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"a and b shapes do not match for a @ b: {tuple(a.shape)} @ {tuple(b.shape)}")
    if a.dim() == 3 and b.dim() == 3 and a.shape[0] != b.shape[0]:
        raise ValueError(f"batch sizes differ: a has {a.shape[0]}, b has {b.shape[0]}")
    if a.dim() == 3 and b.dim() == 2:
        # One weight for every batch: fold the batch into M when the layouts allow it.
        rows = a.shape[0] * a.shape[1]
        try:
            a2 = a.view(rows, a.shape[2])
            out2 = None if out is None else out.view(rows, out.shape[-1])
        except RuntimeError:
            b = b.expand(a.shape[0], *b.shape)
        else:
            res = gemm(a2, b, out=out2, out_dtype=out_dtype, alpha=alpha, config=config)
            return res.view(a.shape[0], a.shape[1], -1) if out is None else out
    if a.dim() == 2 and b.dim() == 3:
        a = a.expand(b.shape[0], *a.shape)
    squeeze = a.dim() == 2
    a3 = a.unsqueeze(0) if squeeze else a  # (L, M, K)
    b3 = b.unsqueeze(0) if squeeze else b  # (L, K, N)
    L, M, K = a3.shape
    N = b3.shape[2]
    res_shape = (M, N) if squeeze else (L, M, N)
    if out is not None:
        _check_operand("out", out)
        if tuple(out.shape) != res_shape:
            raise ValueError(f"out must have shape {res_shape}, got {tuple(out.shape)}")
        if out.dtype != out_dtype:
            raise TypeError(f"out.dtype ({out.dtype}) differs from out_dtype ({out_dtype})")
        if out.device != a.device:
            raise ValueError(f"out must be on {a.device}, got {out.device}")
        if N > 1 and out.stride(-1) != 1:
            raise ValueError("out must be row-major (stride 1 along its last dim)")
    else:
        out = torch.empty(res_shape, dtype=out_dtype, device=a.device)
    if out.numel() == 0:
        return out
    if K == 0:
        return out.zero_()

    # Kernel views: A (M, K, L), B (N, K, L), C (M, N, L).
    a_major = "k" if _major(a3, 1, 2) == "cols" else "m" if _major(a3, 1, 2) == "rows" else None
    if a_major is None:
        a3, a_major = a3.contiguous(), "k"
    b_major = "n" if _major(b3, 1, 2) == "cols" else "k" if _major(b3, 1, 2) == "rows" else None
    if b_major is None:
        b3, b_major = b3.contiguous(), "n"
    a3 = _tma_view(a3, 2 if a_major == "k" else 1, "a")
    b3 = _tma_view(b3, 1 if b_major == "k" else 2, "b")
    out3 = out.unsqueeze(0) if squeeze else out
    c3 = _tma_view(out3, 2, "out")
    if c3.data_ptr() != out3.data_ptr():
        raise ValueError("out's data pointer must be 16-byte aligned")

    arch, num_sms = _device_info(a.device.index if a.device.index is not None else torch.cuda.current_device())
    problem = GemmProblem(
        M, N, K, L, TORCH_TO_NAME[a.dtype], TORCH_TO_NAME[b.dtype], TORCH_TO_NAME[out_dtype], a_major, b_major
    )
    epi = EpilogueSpec(alpha=alpha != 1.0)
    pol = policy_for(arch, num_sms)
    cfg = config if config is not None else pol.choose(problem, epilogue=epi)
    ok, why = can_implement(cfg, problem)
    if not ok:
        raise ValueError(f"cannot run {cfg.name}: {why}")
    fn = DENSE_CACHE.get(cfg)
    args = (
        a3.permute(1, 2, 0),
        b3.permute(2, 1, 0),
        c3.permute(1, 2, 0),
        float(alpha),
        max(1, num_sms // (cfg.cluster_m * cfg.cluster_n)),
    )
    if a.device.index == torch.cuda.current_device():
        fn(*args)
    else:
        with torch.cuda.device(a.device):
            fn(*args)
    return out


def gemm_ref(a, b, *, out_dtype=None, alpha: float = 1.0, compute_dtype=torch.float32):
    """Plain-torch twin of :func:`gemm`: computes in ``compute_dtype`` then casts."""
    out_dtype = out_dtype or a.dtype
    res = torch.matmul(a.to(compute_dtype), b.to(compute_dtype))
    if alpha != 1.0:
        res = res * alpha
    return res.to(out_dtype)


__all__ = ["gemm", "gemm_ref", "DENSE_CACHE", "DTYPE_BYTES"]
