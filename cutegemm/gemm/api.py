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


def _kernel_view(t3: torch.Tensor, unit_mode: int, order: tuple[int, int, int], name: str):
    """(size, stride) of the kernel's view of a (L, rows, cols) operand: ``unit_mode`` at stride 1,
    size-1 modes at a 16-byte stride (TMA validates every stride, used or not), modes reordered
    by ``order``. Raises if a stride breaks TMA's 16-byte rule."""
    align = TMA_ALIGN_BYTES // t3.element_size()
    strides = list(t3.stride())
    strides[unit_mode] = 1
    for i, size in enumerate(t3.shape):
        if i != unit_mode and size == 1:
            strides[i] = align
    for i, st in enumerate(strides):
        if i != unit_mode and st % align:
            raise ValueError(
                f"{name}: stride {st} (elements) of dim {i} is not a multiple of {align} elements: TMA "
                f"needs 16-byte aligned strides (for a contiguous {t3.dtype} matrix: its last dim "
                f"must be a multiple of {align})"
            )
    return tuple(t3.shape[i] for i in order), tuple(strides[i] for i in order)


def _unit_mode(t3: torch.Tensor) -> int | None:
    """Which of modes 2 (cols) / 1 (rows) of a (L, rows, cols) tensor is contiguous."""
    if t3.stride(2) == 1 or t3.shape[2] == 1:
        return 2
    if t3.stride(1) == 1 or t3.shape[1] == 1:
        return 1
    return None


def _aligned_operand(t3: torch.Tensor) -> torch.Tensor:
    """t3 itself, or a copy when no mode is contiguous or the base pointer is not 16-byte aligned."""
    unit = _unit_mode(t3)
    if unit is not None and t3.data_ptr() % TMA_ALIGN_BYTES == 0:
        return t3
    if unit == 1:
        return t3.mT.clone(memory_format=torch.contiguous_format).mT
    return t3.clone(memory_format=torch.contiguous_format)


class _Plan:
    """Everything one (shapes, strides, dtypes, device, options) signature needs to launch."""

    __slots__ = ("fn", "views", "out_shape", "out_dtype", "max_clusters", "config", "direct")

    def launch(self, sources, alpha):
        (sa, ta), (sb, tb), (sc, tc) = self.views
        self.fn(sources[0].as_strided(sa, ta), sources[1].as_strided(sb, tb), sources[2].as_strided(sc, tc),
                alpha, self.max_clusters)


_PLANS: dict = {}


def _check_args(a, b, out, out_dtype):
    _check_operand("a", a)
    _check_operand("b", b)
    if a.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"a.dtype must be torch.bfloat16 or torch.float16, got {a.dtype}")
    if b.dtype != a.dtype:
        raise TypeError(f"b.dtype ({b.dtype}) must equal a.dtype ({a.dtype})")
    if a.device != b.device:
        raise ValueError(f"a and b must be on the same device, got {a.device} and {b.device}")
    if out_dtype not in TORCH_TO_NAME:
        raise TypeError(f"out_dtype must be torch.bfloat16, torch.float16 or torch.float32, got {out_dtype}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"a and b shapes do not match for a @ b: {tuple(a.shape)} @ {tuple(b.shape)}")
    if a.dim() == 3 and b.dim() == 3 and a.shape[0] != b.shape[0]:
        raise ValueError(f"batch sizes differ: a has {a.shape[0]}, b has {b.shape[0]}")
    res_shape = torch.Size([*torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1]])
    if out is not None:
        _check_operand("out", out)
        if out.shape != res_shape:
            raise ValueError(f"out must have shape {tuple(res_shape)}, got {tuple(out.shape)}")
        if out.dtype != out_dtype:
            raise TypeError(f"out.dtype ({out.dtype}) differs from out_dtype ({out_dtype})")
        if out.device != a.device:
            raise ValueError(f"out must be on {a.device}, got {out.device}")
        if out.shape[-1] > 1 and out.stride(-1) != 1:
            raise ValueError("out must be row-major (stride 1 along its last dim)")
        if out.data_ptr() % TMA_ALIGN_BYTES:
            raise ValueError("out's data pointer must be 16-byte aligned")
    return res_shape


def _plan(a, b, out, out_dtype, alpha, config):
    """The slow path: validate, pick and compile the kernel, compute the kernel views.
    Returns (plan, sources): sources are the tensors the views apply to (copies if needed)."""
    res_shape = _check_args(a, b, out, out_dtype)
    if out is None:
        out = torch.empty(res_shape, dtype=out_dtype, device=a.device)
    if out.numel() == 0 or a.shape[-1] == 0:
        return None, (a, b, out)
    # Bring everything to (L, rows, cols).
    if a.dim() == 3 and b.dim() == 2:
        # One weight for every batch: fold the batch into M when the layouts allow it.
        try:
            a3 = a.view(1, a.shape[0] * a.shape[1], a.shape[2])
            c3 = out.view(1, a3.shape[1], out.shape[-1])
            b3 = b.unsqueeze(0)
        except RuntimeError:
            a3, b3, c3 = a, b.expand(a.shape[0], *b.shape), out
    else:
        a3 = a.unsqueeze(0) if a.dim() == 2 and b.dim() == 2 else a.expand(*res_shape[:-2], *a.shape[-2:])
        b3 = b.unsqueeze(0) if b.dim() == 2 and a.dim() == 2 else b.expand(*res_shape[:-2], *b.shape[-2:])
        c3 = out.unsqueeze(0) if out.dim() == 2 else out
    a3s, b3s = _aligned_operand(a3), _aligned_operand(b3)
    L, M, K = a3s.shape
    N = b3s.shape[2]
    a_unit, b_unit = _unit_mode(a3s), _unit_mode(b3s)
    a_major = "k" if a_unit == 2 else "m"
    b_major = "n" if b_unit == 2 else "k"
    # Kernel views: A (M, K, L), B (N, K, L), C (M, N, L).
    views = (
        _kernel_view(a3s, a_unit, (1, 2, 0), "a"),
        _kernel_view(b3s, b_unit, (2, 1, 0), "b"),
        _kernel_view(c3, 2, (1, 2, 0), "out"),
    )
    arch, num_sms = _device_info(a.device.index if a.device.index is not None else torch.cuda.current_device())
    problem = GemmProblem(
        M, N, K, L, TORCH_TO_NAME[a.dtype], TORCH_TO_NAME[b.dtype], TORCH_TO_NAME[out_dtype], a_major, b_major
    )
    epi = EpilogueSpec(alpha=alpha != 1.0)
    cfg = config if config is not None else policy_for(arch, num_sms).choose(problem, epilogue=epi)
    ok, why = can_implement(cfg, problem)
    if not ok:
        raise ValueError(f"cannot run {cfg.name}: {why}")
    if cfg.epilogue != epi and not cfg.epilogue.alpha:
        raise ValueError(f"alpha={alpha} needs a config with EpilogueSpec(alpha=True), got {cfg.name}")
    plan = _Plan()
    plan.fn = DENSE_CACHE.get(cfg)
    plan.views = views
    plan.out_shape = res_shape
    plan.out_dtype = out_dtype
    plan.max_clusters = max(1, num_sms // (cfg.cluster_m * cfg.cluster_n))
    plan.config = cfg
    # Cacheable when the views apply to the caller's own tensors (no copies were needed).
    plan.direct = a3s.data_ptr() == a.data_ptr() and b3s.data_ptr() == b.data_ptr() and (
        a3s.stride() == a3.stride() and b3s.stride() == b3.stride()
    )
    return plan, (a3s if not plan.direct else a, b3s if not plan.direct else b, out)


def gemm(a, b, *, out=None, out_dtype=None, alpha: float = 1.0, config: GemmConfig | None = None):
    """``out = alpha * (a @ b)`` with fp32 accumulation.

    a: (M, K) or (L, M, K); b: (K, N) or (L, K, N) (a 2-D operand is shared by every batch);
    any row- or column-major views with 16-byte aligned strides; bf16 or fp16, a.dtype == b.dtype.
    out_dtype: torch.bfloat16 / float16 / float32 (default: a.dtype). ``out``: optional row-major
    output of the result shape. ``config``: force a kernel configuration (must pass can_implement).

    Per-call cost: the first call for a (shapes, strides, dtypes, device, options) signature
    validates, picks the config and compiles (or loads it from the disk cache); later calls only
    check data-pointer alignment and launch.
    """
    if out_dtype is None:
        out_dtype = out.dtype if out is not None else getattr(a, "dtype", None)
    try:
        key = (
            a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.device, out_dtype,
            None if out is None else (out.shape, out.stride(), out.dtype, out.device),
            alpha != 1.0, config,
        )  # fmt: skip
    except AttributeError:
        key = None  # not tensors: the slow path raises the right TypeError
    plan = _PLANS.get(key) if key is not None else None
    if (
        plan is not None
        and not (a.data_ptr() % 16 or b.data_ptr() % 16 or (out is not None and out.data_ptr() % 16))
        and a.device.index == torch.cuda.current_device()
    ):
        if out is None:
            out = torch.empty(plan.out_shape, dtype=out_dtype, device=a.device)
        plan.launch((a, b, out), alpha)
        return out
    plan, sources = _plan(a, b, out, out_dtype, alpha, config)
    out = sources[2]
    if plan is None:  # empty output or K == 0
        return out if out.numel() == 0 else out.zero_()
    if plan.direct and key is not None:
        _PLANS[key] = plan
    if a.device.index == torch.cuda.current_device():
        plan.launch(sources, alpha)
    else:
        with torch.cuda.device(a.device):
            plan.launch(sources, alpha)
    return out


def gemm_ref(a, b, *, out_dtype=None, alpha: float = 1.0, compute_dtype=torch.float32):
    """Plain-torch twin of :func:`gemm`: computes in ``compute_dtype`` then casts."""
    out_dtype = out_dtype or a.dtype
    res = torch.matmul(a.to(compute_dtype), b.to(compute_dtype))
    if alpha != 1.0:
        res = res * alpha
    return res.to(out_dtype)


__all__ = ["gemm", "gemm_ref", "DENSE_CACHE", "DTYPE_BYTES"]
