"""The packed grouped form with A's rows gathered through an index:
``grouped_gemm(x, w, offs=offs, gather_index=idx)`` computes what
``grouped_gemm(x.index_select(0, idx), w, offs=offs)`` computes (packed row r of expert e, in
[offs[e-1], offs[e]), gets ``x[idx[r]] @ w[e]``), without writing the gathered copy of x. In a MoE
layer ``idx`` is the token of every (token, slot) pair sorted by expert, so the up projection
reads the tokens as they are.

Routes (one per call):
- the gather kernel (``GemmConfig.gather_a``; sm_90a: cp.async row loads, sm_100a: the TMA
  unit's gather4 mode, compiled and SASS-checked only): bf16 / fp16 ``x`` row-major with 16-byte
  aligned rows, K a multiple of 64, ``w`` (E, K, N) with K or N contiguous and its other strides
  16-byte multiples, options ``alpha``, ``activation`` (elementwise, or gated on interleaved
  gate/up columns), ``out_dtype`` (bf16 / fp16 / fp32) and an ``out`` the TMA store can write
  (none given: output rows of whole 16-byte pieces). No host sync; the
  index is read on the device. A row whose index lies outside [0, x.shape[0]) gets unspecified
  values (sm_90a clamps the index into x, sm_100a's TMA reads zeros), and no load leaves x:
  ``check_offs=True`` checks offs and the index on the host (a sync) instead. sm_100a reads the
  index through a copy followed by ``INDEX_PAD`` zeros (the gather4 loads of a tile's last rows
  read past the last packed row): one small device copy per call.
- anything else (other options, layouts, archs, dtypes): ``x.index_select(0, idx)`` and the
  packed form, which takes every input it takes.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..config import ACTIVATIONS, GATED, EpilogueSpec, GemmProblem, can_implement
from ..gemm.args import KernelArgs
from ..gemm.launch import (
    GROUPED_CACHE,
    INPUT_TO_NAME,
    TORCH_TO_NAME,
    check_offs_values,
    current_device,
    kernel_view,
    new_workspace,
    tma_addressable,
    tma_storable,
)
from ..gemm.sm100.gather import INDEX_PAD
from ..policy import policy_for
from ..runtime.device import device_info, max_clusters_for

GATHER_K = 64  # the kernel's K tile (16-bit): every 16-byte chunk of a K tile lies inside its row
KERNEL_OPTIONS = ("offs", "out", "out_dtype", "alpha", "activation", "config", "check_offs", "preact_out")
# Warm plans of the kernel route: (shapes, strides, dtypes, device, options) -> _GatherPlan.
PLANS: dict = {}


class _GatherPlan:
    """What a warm call of one signature reuses: the kernel, the views' (size, stride), the grid
    cap and the workspace; the call passes its tensors, offs and index."""

    __slots__ = ("fn", "views", "max_clusters", "tail", "device_index", "out_dims", "out_dtype", "pad", "z_view")

    def launch(self, a, b, out, offs, index, alpha, preact=None):
        """KernelArgs' LEADING fields, the plan's tail up to a_index, then the index (sm_100a:
        :func:`padded_index`) and the kernel's view of ``preact`` (epilogue.preact; else None)."""
        if self.pad:
            index = padded_index(index)
        (sa, ta), (sb, tb), (so, to) = self.views
        self.fn(a.as_strided(sa, ta), b.as_strided(sb, tb), out.as_strided(so, to), None, None, alpha, 0.0,
                self.max_clusters, offs, *self.tail, index, None if preact is None else preact.as_strided(*self.z_view))  # fmt: skip


def gather_index_of(index, a: torch.Tensor) -> torch.Tensor:
    """The index as the kernel reads it: a contiguous 1-D int32 tensor on a's device (an int64 or
    strided one, as torch.argsort and slicing return, is converted: a small copy)."""
    if not isinstance(index, torch.Tensor) or index.dim() != 1:
        raise TypeError("gather_index must be a 1-D integer tensor (the row of a for every packed row)")
    if index.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"gather_index must be int32 or int64, got {index.dtype}")
    if index.device != a.device:
        raise ValueError(f"gather_index must be on {a.device}, got {index.device}")
    index = index if index.dtype == torch.int32 else index.to(torch.int32)
    return index if index.is_contiguous() else index.contiguous()  # the kernel reads it at unit stride


def padded_index(index: torch.Tensor) -> torch.Tensor:
    """The index as the sm_100a kernel reads it: a view of its rows in a copy followed by
    INDEX_PAD zeros, which the gather4 loads of the last tile's rows past the index read."""
    return torch.nn.functional.pad(index, (0, INDEX_PAD))[: index.shape[0]]


def check_index_values(index: torch.Tensor, rows: int):
    """The ``check_offs=True`` rule for the index: every value in [0, rows) (a host sync)."""
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= rows):
        raise ValueError(f"gather_index values must lie in [0, {rows}) (the rows of a)")


def on_cuda(t: torch.Tensor) -> bool:
    """Whether the kernel route may take ``t`` (the CPU tests' emulated kernels stand in here)."""
    return t.is_cuda


def _kernel_route(a, b, options, rows: int = -1, archs=("sm_90a", "sm_100a")) -> bool:
    """Whether the gather kernel takes the call (see the module docstring); ``rows``: the index's
    length (a ``preact_out`` has that many rows)."""
    if any(options.get(k) is not None for k in options if k not in KERNEL_OPTIONS):
        return False
    if options.get("gate_layout", "interleaved") != "interleaved" or options.get("config") is not None:
        return False
    act, out, out_dtype = options.get("activation"), options.get("out"), options.get("out_dtype")
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and on_cuda(a) and a.dim() == 2 and b.dim() == 3):
        return False
    if a.dtype not in (torch.bfloat16, torch.float16) or b.dtype != a.dtype or b.device != a.device:
        return False
    if act is not None and act not in ACTIVATIONS and act not in GATED:
        return False
    if out_dtype is not None and out_dtype not in TORCH_TO_NAME:
        return False
    E, K, N = b.shape
    if K == 0 or K % GATHER_K or a.shape[1] != K or a.stride(1) != 1 or a.stride(0) % 8 or a.data_ptr() % 16:
        return False
    if not (b.stride(2) == 1 or b.stride(1) == 1) or (act in GATED and N % 2):
        return False
    if not tma_addressable(b, 2 if b.stride(2) == 1 else 1):  # the kernel reads b in place (no staging copy)
        return False
    if out is not None and not (isinstance(out, torch.Tensor) and tma_storable(out)):
        return False
    n_out = N // 2 if act in GATED else N
    if out is None and (n_out * (out_dtype or a.dtype).itemsize) % 16:  # the output it makes: whole 16-byte rows
        return False
    arch = device_info(a.device.index)[0]
    if options.get("preact_out") is not None:
        return arch == "sm_90a" and preact_fits(options["preact_out"], a, b, rows, act, out_dtype or a.dtype)
    return arch in archs


def preact_fits(z, a, b, rows: int, act, out_dtype) -> bool:
    """Whether ``z`` can take the values before the gate (epilogue.preact): a gated activation, a
    contiguous (rows, N) tensor of the output's 16-bit dtype on a's device, 16-byte aligned."""
    return (act in GATED and isinstance(z, torch.Tensor) and z.shape == (rows, b.shape[2]) and z.is_contiguous()
            and z.dtype == out_dtype and out_dtype in (torch.bfloat16, torch.float16) and z.device == a.device
            and not z.data_ptr() % 16)  # fmt: skip


def preact_route(a, b, offs, activation) -> bool:
    """Whether :func:`gathered_grouped_gemm` with ``preact_out`` (a contiguous (rows, N) tensor of
    a's dtype: one launch writes the values before the gate and the gated output) takes this
    call's tensors (sm_90a); the caller takes another route otherwise."""
    return activation in GATED and _kernel_route(a, b, dict(offs=offs, activation=activation), archs=("sm_90a",))


def _key(a, b, index, options):
    """A warm call's key: everything the route and the checks read but data pointers (16-byte
    alignment of a is checked per call) and the values of offs and the index."""
    out, offs, z = options.get("out"), options.get("offs"), options.get("preact_out")
    try:
        return (a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), b.dtype, b.device, index.shape,
                offs.shape, offs.dtype, offs.device, options.get("activation"), options.get("alpha", 1.0) != 1.0,
                options.get("out_dtype"), None if out is None else (out.shape, out.stride(), out.dtype, out.device),
                None if z is None else (z.shape, z.stride(), z.dtype, z.device),
                tuple(k for k, v in options.items() if v is not None))  # fmt: skip
    except (AttributeError, TypeError):
        return None


def gathered_grouped_gemm(a, b, *, gather_index, run, **options):
    """``grouped_gemm`` with ``gather_index`` (see the module docstring); ``run`` is the packed
    form's ``grouped_gemm`` (the copying route)."""
    index = gather_index_of(gather_index, a)
    key = _key(a, b, index, options)
    plan = PLANS.get(key) if key is not None else None
    if plan is not None and not options.get("check_offs") and not a.data_ptr() % 16 and (
            current_device() == plan.device_index):  # fmt: skip
        out, z = options.get("out"), options.get("preact_out")
        if out is None:
            out = torch.empty(*plan.out_dims, dtype=plan.out_dtype, device=a.device)
        elif out.data_ptr() % 16:
            plan = None
        if z is not None and z.data_ptr() % 16:
            plan = None
        if plan is not None:  # (plans are made for non-empty outputs only)
            plan.launch(a, b, out, options["offs"], index, float(options.get("alpha", 1.0)), z)
            return out
    if not _kernel_route(a, b, options, index.shape[0]):
        if options.get("preact_out") is not None:
            raise ValueError("preact_out: the gather kernel on sm_90a only, with a gated activation and a "
                             "contiguous (rows, N) preact_out of the output's 16-bit dtype (see preact_route)")
        if options.get("check_offs"):
            check_index_values(index, a.shape[0])
        return run(a.index_select(0, index), b, **options)
    offs, out = options.get("offs"), options.get("out")
    alpha, act = options.get("alpha", 1.0), options.get("activation")
    if not isinstance(offs, torch.Tensor) or offs.dtype != torch.int32 or offs.dim() != 1 or offs.device != a.device:
        raise TypeError(f"offs must be a 1-D torch.int32 tensor on {a.device}")
    E, K, N = b.shape
    if offs.numel() != E:
        raise ValueError(f"offs has {offs.numel()} entries but b has {E} experts")
    if isinstance(alpha, torch.Tensor):
        raise TypeError("alpha must be a Python number, not a tensor (reading its value is a host sync)")
    total = index.shape[0]
    if options.get("check_offs"):
        check_offs_values(offs, total)
        check_index_values(index, a.shape[0])
    out_dtype = options.get("out_dtype") or (out.dtype if out is not None else a.dtype)
    n_out = N // 2 if act in GATED else N
    if out is None:
        out = torch.empty(total, n_out, dtype=out_dtype, device=a.device)
    elif out.shape != (total, n_out) or out.dtype != out_dtype or out.device != a.device:
        raise ValueError(f"out must be a ({total}, {n_out}) {out_dtype} tensor on {a.device}")
    if total == 0 or n_out == 0 or E == 0:
        return out
    arch, num_sms = device_info(a.device.index)
    b_unit = 2 if b.stride(2) == 1 else 1
    problem = GemmProblem(total, N, K, 1, INPUT_TO_NAME[a.dtype], INPUT_TO_NAME[b.dtype], TORCH_TO_NAME[out_dtype],
                          "k", "n" if b_unit == 2 else "k")  # fmt: skip
    z = options.get("preact_out")
    epi = EpilogueSpec(alpha=alpha != 1.0, activation=act if act in ACTIVATIONS else None,
                       gated=act if act in GATED else None, preact=z is not None)  # fmt: skip
    cfg = policy_for(arch, num_sms).choose_gathered(problem, E, epilogue=epi)
    ok, why = can_implement(cfg, replace(problem, a_strides=None))
    if not ok:
        raise ValueError(f"cannot run {cfg.name}: {why}")
    plan = _GatherPlan()
    plan.fn = GROUPED_CACHE.get(cfg)
    plan.views = (kernel_view(a.unsqueeze(0), 2, (1, 2, 0), "a"), kernel_view(b, b_unit, (2, 1, 0), "b"),
                  kernel_view(out.unsqueeze(0), 2, (1, 2, 0), "out"))  # fmt: skip
    plan.max_clusters = max_clusters_for(cfg, a.device, num_sms)
    tail = KernelArgs(None, None, None, workspace=new_workspace(cfg, a.device)).tail()  # static scheduler: no workspace
    assert KernelArgs._fields[-2:] == ("a_index", "preact")
    plan.tail = tail[:-2]
    plan.z_view = None if z is None else kernel_view(z.unsqueeze(0), 2, (1, 2, 0), "preact_out")
    plan.device_index, plan.out_dims, plan.out_dtype = a.device.index, (total, n_out), out_dtype
    plan.pad = arch == "sm_100a"
    if key is not None:
        PLANS[key] = plan
    if a.device.index == current_device():
        plan.launch(a, b, out, offs, index, float(alpha), z)
    else:
        with torch.cuda.device(a.device):
            plan.launch(a, b, out, offs, index, float(alpha), z)
    return out


def gathered_grouped_gemm_ref(a, b, *, gather_index, run_ref, **options):
    """The reference twin: the packed form's twin of the gathered rows."""
    index = gather_index_of(gather_index, a)
    return run_ref(a.index_select(0, index.long()), b, **options)
