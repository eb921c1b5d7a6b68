"""Public grouped GEMM (``torch._grouped_mm`` semantics for the packed MoE form).

Forms:
- packed MoE: ``grouped_gemm(a, b, offs=offs)``: a (total_M, K) row-major, b (E, K, N) (any
  16-byte aligned view, e.g. ``w.transpose(1, 2)`` of an (E, N, K) weight), offs int32 (E,) on the
  GPU, cumulative END row of each expert. One kernel launch; the tile -> (expert, m-tile, n-tile)
  map is computed on the device from offs, so there is no host sync and the call can be captured
  in a CUDA graph and replayed with new offs contents. Rows at or past ``offs[-1]`` are not
  written. offs contents are not checked on this path (that would need a sync): bad offsets are
  clamped into [0, total_M] and made non-decreasing per expert, so the kernel stays memory-safe;
  ``check_offs=True`` validates them with a sync and raises ValueError.
- K-grouped (weight gradient): ``grouped_gemm(a, b, offs=offs)`` with a (M, total_K), b (total_K, N)
  -> (E, M, N), offs splitting K. Implemented as one dense GEMM per expert on K-slices: it reads
  offs on the host (one sync), so it is NOT graph-capturable (documented limitation).
- list: ``grouped_gemm([a0, a1, ...], [b0, b1, ...])`` -> list, arbitrary per-group M, N, K, one
  dense launch per group (no sync; graph-capturable when shapes are fixed).
"""

from __future__ import annotations

import torch

from ..gemm.api import (
    TORCH_TO_NAME,
    _check_operand,
    _current_device,
    _device_info,
    _kernel_view,
    gemm,
    memo_view,
    new_workspace,
    reset_workspace,
)
from ..gemm.config import TMA_ALIGN_BYTES, GemmConfig, GemmProblem, can_implement
from ..gemm.policy import policy_for
from ..runtime.cache import KernelCache
from .kernel_parts import GROUPED_MAX_GROUPS


def build_grouped(config: GemmConfig):
    from ..gemm.api import kernel_class
    from ..runtime.signature import grouped_fake_args

    return kernel_class(config.arch)(config), grouped_fake_args(config)


GROUPED_CACHE = KernelCache(build_grouped)
_PLANS: dict = {}


class _GroupedPlan:
    __slots__ = ("fn", "views", "max_clusters", "config", "workspace", "device", "device_index", "out_dims",
                 "out_dtype", "b_memo")  # fmt: skip

    def launch(self, a, b, out, offs, alpha):
        (sa, ta), (sb, tb), (sc, tc) = self.views
        # (offs, scale factors A/B, quantized-output scales, global scale, 4 epilogue vectors, workspace)
        self.fn(a.as_strided(sa, ta), memo_view(self, b, sb, tb), out.as_strided(sc, tc), None, None,
                alpha, 0.0, self.max_clusters, offs, *(None,) * 8, reset_workspace(self.workspace))  # fmt: skip


def _check_offs_values(offs: torch.Tensor, total_m: int):
    o = offs.tolist()  # host sync: only with check_offs=True
    prev = 0
    for e, v in enumerate(o):
        if v < prev:
            raise ValueError(f"offs must be non-decreasing and >= 0: offs[{e}] = {v} < {prev}")
        prev = v
    if o and o[-1] > total_m:
        raise ValueError(f"offs[-1] = {o[-1]} exceeds a.shape[0] = {total_m}")


def _plan_packed(a, b, offs, out, out_dtype, alpha, config):
    E, K, N = b.shape
    total_m = a.shape[0]
    if a.stride(1) != 1 and K > 1:
        raise ValueError("a must be row-major (stride 1 along K) for the packed grouped form")
    b_unit = 2 if (b.stride(2) == 1 or N == 1) else 1 if (b.stride(1) == 1 or K == 1) else None
    if b_unit is None:
        raise ValueError("b must have a contiguous K or N dim (e.g. (E, K, N) or (E, N, K).transpose(1, 2))")
    views = (
        _kernel_view(a.unsqueeze(0), 2, (1, 2, 0), "a"),
        _kernel_view(b, b_unit, (2, 1, 0), "b"),
        _kernel_view(out.unsqueeze(0), 2, (1, 2, 0), "out"),
    )
    arch, num_sms = _device_info(a.device.index)
    name = TORCH_TO_NAME
    problem = GemmProblem(
        total_m, N, K, 1, name[a.dtype], name[b.dtype], name[out_dtype], "k", "n" if b_unit == 2 else "k"
    )
    from ..epilogue import EpilogueSpec

    epi = EpilogueSpec(alpha=alpha != 1.0)
    if config is None:  # opt-in autotuning (cutegemm.tuning); None when off: the policy's default
        from ..tuning import tuned_config

        config = tuned_config(arch, problem, epi, "grouped", num_groups=E, num_sms=num_sms)
    if config is not None and (config.arch != arch or not config.grouped):
        raise ValueError(f"config {config.name} cannot run the grouped form on this GPU (arch {arch}; needs grouped=True and that arch)")
    cfg = config if config is not None else policy_for(arch, num_sms).choose_grouped(problem, E, epilogue=epi)
    ok, why = can_implement(cfg, problem)
    if not ok:
        raise ValueError(f"cannot run {cfg.name}: {why}")
    plan = _GroupedPlan()
    plan.fn = GROUPED_CACHE.get(cfg)
    plan.views = views
    plan.max_clusters = max(1, num_sms // (cfg.cluster_m * cfg.cluster_n))
    plan.workspace = new_workspace(cfg, a.device)
    plan.config = cfg
    return plan


def _fast_key(a, b, offs, out, out_dtype, alpha, config):
    """The plan key of a packed call: every property the checks below read, so a cached plan
    implies they all pass (but data-pointer alignment). Positions 0 / 2 / -1 (a.shape, b.shape,
    config) are read by benchmarks and tests. None when the inputs are not tensors."""
    try:
        return (
            a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.device, b.device,
            offs.shape, offs.dtype, offs.device, out_dtype,
            None if out is None else (out.shape, out.stride(), out.dtype, out.device),
            alpha != 1.0, config,
        )  # fmt: skip
    except AttributeError:
        return None


def grouped_gemm(a, b, *, offs=None, out=None, out_dtype=None, alpha: float = 1.0, config=None,
                 check_offs: bool = False):  # fmt: skip
    """See the module docstring for the three forms."""
    key = _fast_key(a, b, offs, out, out_dtype, alpha, config)
    plan = _PLANS.get(key) if key is not None else None
    if (
        plan is not None
        and _current_device() == plan.device_index
        and not (a.data_ptr() % 16 or b.data_ptr() % 16 or (out is not None and out.data_ptr() % 16))
    ):
        if check_offs:
            _check_offs_values(offs, a.shape[0])
        if out is None:
            out = torch.empty(*plan.out_dims, dtype=plan.out_dtype, device=plan.device)
        plan.launch(a, b, out, offs, float(alpha))
        return out
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return _grouped_list(a, b, offs=offs, out_dtype=out_dtype, alpha=alpha)
    _check_operand("a", a, dims=(2,))
    _check_operand("b", b, dims=(2, 3))
    if offs is None:
        raise ValueError("offs is required for tensor inputs (int32 cumulative end offsets, on the GPU)")
    if not isinstance(offs, torch.Tensor) or offs.dtype != torch.int32 or offs.dim() != 1:
        raise TypeError("offs must be a 1-D torch.int32 tensor")
    if offs.device != a.device:
        raise ValueError(f"offs must be on {a.device} (no host sync on this path), got {offs.device}")
    if a.dtype not in (torch.bfloat16, torch.float16) or b.dtype != a.dtype:
        raise TypeError(f"a and b must both be bf16 or both fp16, got {a.dtype} and {b.dtype}")
    if b.device != a.device:
        raise ValueError(f"b must be on {a.device}, got {b.device}")
    out_dtype = out_dtype or (out.dtype if isinstance(out, torch.Tensor) else a.dtype)
    if out_dtype not in TORCH_TO_NAME:
        raise TypeError(f"out_dtype must be bf16, fp16 or fp32, got {out_dtype}")
    if b.dim() == 2:
        return _grouped_k(a, b, offs, out, out_dtype, alpha, check_offs)
    E, K, N = b.shape
    if a.shape[1] != K:
        raise ValueError(f"a (total_M, K={a.shape[1]}) and b (E, K={K}, N) disagree on K")
    if offs.numel() != E:
        raise ValueError(f"offs has {offs.numel()} entries but b has {E} experts")
    total_m = a.shape[0]
    if E > GROUPED_MAX_GROUPS:
        raise ValueError(f"at most {GROUPED_MAX_GROUPS} experts are supported (the kernel's tile table), got {E}")
    out_elem = torch.empty((), dtype=out_dtype).element_size()
    if (N * out_elem) % TMA_ALIGN_BYTES:
        # Partial tiles are stored in 16-byte pieces: N must end on a 16-byte boundary so no piece
        # reaches past the last column.
        raise ValueError(f"N * {out_elem} bytes must be a multiple of 16 for the grouped form, got N={N}")
    if out is None:
        out = torch.empty(total_m, N, dtype=out_dtype, device=a.device)
    else:
        _check_operand("out", out, dims=(2,))
        if out.shape != (total_m, N) or out.dtype != out_dtype or out.device != a.device:
            raise ValueError(f"out must be a ({total_m}, {N}) {out_dtype} tensor on {a.device}")
        if N > 1 and out.stride(1) != 1:
            raise ValueError("out must be row-major (stride 1 along its last dim)")
    if check_offs:
        _check_offs_values(offs, total_m)
    if E == 0 or total_m == 0 or N == 0:
        return out
    if K == 0:
        return out.zero_()
    for name, t in (("a", a), ("b", b), ("out", out)):
        if t.data_ptr() % TMA_ALIGN_BYTES:
            raise ValueError(f"{name}'s data pointer must be 16-byte aligned (got a storage offset that breaks it)")
    if plan is None:
        plan = _plan_packed(a, b, offs, out, out_dtype, alpha, config)
        plan.device, plan.device_index = a.device, a.device.index
        plan.out_dims, plan.out_dtype = (total_m, N), out_dtype
        if key is not None:
            _PLANS[key] = plan
    if a.device.index == _current_device():
        plan.launch(a, b, out, offs, float(alpha))
    else:
        with torch.cuda.device(a.device):
            plan.launch(a, b, out, offs, float(alpha))
    return out


def _padded_k_slice(a, b, start, end):
    """a[:, start:end], b[start:end] copied with K padded by zeros to a multiple of 16 bytes."""
    align = TMA_ALIGN_BYTES // a.element_size()
    w = end - start
    wp = -(-w // align) * align
    a_e = torch.zeros(a.shape[0], wp, dtype=a.dtype, device=a.device)
    a_e[:, :w] = a[:, start:end]
    b_e = torch.zeros(wp, b.shape[1], dtype=b.dtype, device=b.device)
    b_e[:w] = b[start:end]
    return a_e, b_e


def _grouped_k(a, b, offs, out, out_dtype, alpha, check_offs):
    """K-grouped: out[e] = a[:, k_e] @ b[k_e, :] with k_e the e-th slice of K given by offs."""
    M, K = a.shape
    if b.shape[0] != K:
        raise ValueError(f"a (M, K={K}) and b (K={b.shape[0]}, N) disagree on K")
    E, N = offs.numel(), b.shape[1]
    if out is None:
        out = torch.empty(E, M, N, dtype=out_dtype, device=a.device)
    elif _check_operand("out", out, dims=(3,)) or out.shape != (E, M, N) or out.dtype != out_dtype:
        raise ValueError(f"out must be an ({E}, {M}, {N}) {out_dtype} tensor")
    if check_offs:
        _check_offs_values(offs, K)
    # K slices of a (M, K) keep a's strides (and b's): when one breaks TMA's 16-byte rule, the
    # slice is copied into a zero-padded aligned buffer (the padding adds zero products).
    prev = 0
    for e, end in enumerate(offs.tolist()):  # host sync: this form is not graph-capturable
        end = min(max(end, prev), K)
        if end > prev:
            try:
                gemm(a[:, prev:end], b[prev:end], out=out[e], alpha=alpha)
            except ValueError as exc:
                if "16-byte" not in str(exc):
                    raise
                a_e, b_e = _padded_k_slice(a, b, prev, end)
                gemm(a_e, b_e, out=out[e], alpha=alpha)
        else:
            out[e].zero_()
        prev = end
    return out


def _grouped_list(a_list, b_list, *, offs, out_dtype, alpha):
    if offs is not None:
        raise ValueError("offs is not used with lists of tensors")
    if not isinstance(a_list, (list, tuple)) or not isinstance(b_list, (list, tuple)) or len(a_list) != len(b_list):
        raise ValueError("the list form takes two lists of equal length")
    if a_list and len({t.dtype for t in [*a_list, *b_list]}) != 1:
        raise TypeError("all groups must share one dtype")
    return [gemm(x, w, out_dtype=out_dtype, alpha=alpha) for x, w in zip(a_list, b_list, strict=True)]


def grouped_gemm_ref(a, b, *, offs=None, out_dtype=None, alpha: float = 1.0, compute_dtype=torch.float32):
    """Plain-torch twin (loops over groups on the host)."""
    if isinstance(a, (list, tuple)):
        return [((x.to(compute_dtype) @ w.to(compute_dtype)) * alpha).to(out_dtype or x.dtype) for x, w in zip(a, b, strict=True)]
    out_dtype = out_dtype or a.dtype
    bounds = offs.tolist()
    if b.dim() == 3:
        out = torch.zeros(a.shape[0], b.shape[2], dtype=compute_dtype, device=a.device)
        prev = 0
        for e, end in enumerate(bounds):
            out[prev:end] = a[prev:end].to(compute_dtype) @ b[e].to(compute_dtype)
            prev = end
        return (out * alpha).to(out_dtype)
    out = torch.zeros(len(bounds), a.shape[0], b.shape[1], dtype=compute_dtype, device=a.device)
    prev = 0
    for e, end in enumerate(bounds):
        out[e] = a[:, prev:end].to(compute_dtype) @ b[prev:end].to(compute_dtype)
        prev = end
    return (out * alpha).to(out_dtype)
