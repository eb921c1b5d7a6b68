"""K-grouped form of the grouped GEMM (the MoE weight gradient, dW_e = x_e^T dy_e):
``grouped_gemm(a, b, offs=offs)`` with a (M, total_K), b (total_K, N) -> (E, M, N), offs splitting
K (an expert with an empty slice gets zeros). :func:`cutegemm.grouped.packed.grouped_gemm` checks the
arguments and calls :func:`grouped_k`.

Launch path, bf16 / fp16 (``GemmConfig.kgrouped``, compiled in the dense kernel cache;
:func:`kgrouped_config` picks its tile; :func:`_kgrouped_launch` builds its plan once per call
signature). No host sync: CUDA-graph capturable.
- sm_90a: one launch of the K-grouped kernel: tile (m, n, expert) reads the expert's K range
  from offs on the device.
- sm_100a (compiled only), a M-major (the weight gradient's x.t()) and b N-major: three launches
  of the list-form machinery: a table kernel writes each expert's row of the group table from
  offs (its operands' addresses at its first K row, its K, its tile start; an empty expert gets
  no tiles and zeros), the descriptor prep kernel, the list-form GEMM.
Gathered (:func:`grouped_k_gather`, the MoE weight gradients of a routed layer): one operand's K
rows are read through the routing index (x or dout as they are, no gathered copy); sm_90a: one
launch of the K-grouped kernel with ``gather_a`` / ``gather_b``; elsewhere the copy, then the
form above.
Elsewhere, or other layouts: offs read on the host (not capturable), then the experts' K slices
as one call of the list form where it reads them in place, else one dense GEMM per expert (the
dense path stages a K slice that breaks TMA's 16-byte rule, like any operand). Bad offs are
clamped as in the packed form (``schedulers.grouped.expert_rows``).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..config import GATHER_K_TILES, TMA_ALIGN_BYTES, Form, GemmConfig, GemmProblem, can_implement
from ..epilogue import EpilogueSpec
from ..gemm.args import KernelArgs
from ..gemm.dense import gemm
from ..gemm.fp8_scales import check_fp32_scale
from ..gemm.grouped_parts import DESC_BYTES, GROUPED_MAX_GROUPS
from ..gemm.launch import (
    DENSE_CACHE,
    INPUT_TO_NAME,
    TORCH_TO_NAME,
    aligned_operand,
    c_major_of,
    check_offs_values,
    check_operand,
    kernel_view,
    m_major_ok,
    new_workspace,
    padded_rows,
    stores_m_major,
    tma_addressable,
    tma_storable,
    unit_mode,
)
from ..policy import policy_for
from ..runtime.device import device_info, max_clusters_for
from ..schedulers.grouped import LIST_FIELDS, expert_rows
from .list_form import list_launch


def _kgrouped_out(out, shape, out_dtype, device, offs, K, check_offs):
    """The K-grouped call's (E, M, N) result: ``out`` checked, or a new one; offs' values checked
    against K when asked (a host sync)."""
    if out is None:
        out = torch.empty(shape, dtype=out_dtype, device=device)
    elif check_operand("out", out, dims=(3,), written=True) or out.shape != shape or out.dtype != out_dtype:
        raise ValueError(f"out must be an ({shape[0]}, {shape[1]}, {shape[2]}) {out_dtype} tensor")
    if check_offs:
        check_offs_values(offs, K)
    return out


def grouped_k(a, b, offs, out, out_dtype, alpha, check_offs, config=None):
    """K-grouped: out[e] = a[:, k_e] @ b[k_e, :] with k_e the e-th slice of K given by offs.
    sm_90a: one launch of the K-grouped kernel (each tile reads its expert's K range from offs:
    no host sync, CUDA-graph capturable); elsewhere (or for an out the kernel cannot store) one
    dense launch per expert, reading offs on the host."""
    M, K = a.shape
    if b.shape[0] != K:
        raise ValueError(f"a (M, K={K}) and b (K={b.shape[0]}, N) disagree on K")
    E, N = offs.numel(), b.shape[1]
    user_out = out
    out = _kgrouped_out(out, (E, M, N), out_dtype, a.device, offs, K, check_offs)
    if config is not None and not config.kgrouped:
        raise ValueError(f"config {config.name} is not a K-grouped kernel (form=Form.KGROUPED)")
    if out.numel() == 0:
        return out
    # An out the TMA store cannot write (rows not a multiple of 16 bytes, e.g. N = 7 in bf16; any
    # view of odd strides or offset): the kernel writes a padded scratch (every element: empty
    # slices get zeros), then the result is copied into out or returned compact. An M-major out
    # (the transposed view of an (E, N, M) buffer) is stored in place where the kernel can.
    dst = out if tma_storable(out) or stores_m_major(out, _arch(out)) else padded_rows(out.shape, out.dtype, out.device)
    if _kgrouped_launch(a, b, offs, dst, alpha, config):
        if dst is not out:
            if user_out is None:
                return dst.contiguous()
            out.copy_(dst)
        return out
    if config is not None:
        raise ValueError(f"config {config.name} cannot run this K-grouped call (sm_90a, bf16 / fp16, out rows of 16-byte multiples)")
    bounds = expert_rows(offs.tolist(), K)  # host sync: not graph-capturable
    if _as_list(a, b, out, bounds, alpha):
        return out
    for e, (start, end) in enumerate(bounds):
        if end > start:  # a slice (or out[e]) TMA cannot address is staged by the dense path
            gemm(a[:, start:end], b[start:end], out=out[e], alpha=alpha)
        else:
            out[e].zero_()
    return out


def _arch(t) -> str:
    return device_info(t.device.index if t.device.index is not None else torch.cuda.current_device())[0]


def _as_list(a, b, out, bounds, alpha) -> bool:
    """The experts' K slices as one call of the list form (its kernel, sm_90a / sm_100a, writing
    out[e] in place; an empty slice gets zeros): True when it ran. Where the list form does not
    take the call (another arch or dtype, slices TMA cannot read in place, a CUDA graph being
    captured) the caller launches one GEMM per expert."""
    if not out.is_contiguous() or len(bounds) > GROUPED_MAX_GROUPS:
        return False
    a_list, b_list = [a[:, s:e] for s, e in bounds], [b[s:e] for s, e in bounds]
    return list_launch(a_list, b_list, out.dtype, alpha, flat=out.view(-1)) is not None


def k_scales(scale_a, scale_b, E: int, M: int, N: int):
    """FP8 scales of the K-grouped form (torch._scaled_grouped_mm's 2d x 2d row-wise recipe):
    scale_a (E * M,) / (E, M) per expert and row of a, scale_b (E * N,) / (E, N) per expert and
    column of b, or one per-tensor value each; as (E, M) / (E, 1) and (E, N) / (E, 1) views
    (None when not given)."""
    res = []
    for name, t, n, what in (("scale_a", scale_a, M, "row of a"), ("scale_b", scale_b, N, "column of b")):
        if t is None:
            res.append(None)
            continue
        check_fp32_scale(name, t, getattr(t, "device", None))
        if t.numel() == 1:
            res.append(t.reshape(1, 1).expand(E, 1))
        elif t.numel() == E * n and (t.dim() == 1 or tuple(t.shape) == (E, n)):
            res.append(t.reshape(E, n))
        else:
            raise ValueError(
                f"the K-grouped form's {name} must have {E} x {n} elements (one per expert and {what}: "
                f"({E * n},) or ({E}, {n})) or one, got shape {tuple(t.shape)}"
            )
    return tuple(res)


def grouped_k_fp8(a, b, offs, out, out_dtype, alpha, check_offs, scale_a=None, scale_b=None, fast_accum=False):
    """K-grouped FP8 (e4m3, row-wise scales, ``k_scales``): out[e] = (a[:, k_e] @ b[k_e, :]) *
    scale_a[e] (per row) * scale_b[e] (per column). One dense FP8 GEMM per expert, reading offs on
    the host (not capturable); an empty slice gives zeros."""
    M, K = a.shape
    if b.dim() != 2 or b.shape[0] != K:
        raise ValueError(f"a (M, K={K}) and b (K={b.shape[0]}, N) disagree on K")
    E, N = offs.numel(), b.shape[1]
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        if t is not None:
            check_fp32_scale(name, t, a.device)
    sa, sb = k_scales(scale_a, scale_b, E, M, N)
    out = _kgrouped_out(out, (E, M, N), out_dtype, a.device, offs, K, check_offs)
    if out.numel() == 0:
        return out
    for e, (start, end) in enumerate(expert_rows(offs.tolist(), K)):  # host sync: not graph-capturable
        if end > start:
            gemm(a[:, start:end], b[start:end], out=out[e], alpha=alpha, scale_a=None if sa is None else sa[e],
                 scale_b=None if sb is None else sb[e], fast_accum=fast_accum)  # fmt: skip
        else:
            out[e].zero_()
    return out


def kgrouped_config(arch: str, num_sms: int, m: int, n: int, k_mean: int, e: int, dtype: str, out_dtype: str,
                    a_major: str, b_major: str, alpha: bool, c_major: str = "n") -> GemmConfig:  # fmt: skip
    """The K-grouped kernel's config: the dense policy's tile for one expert's (M, N, mean K)
    problem batched over the experts, cooperative; with at most 1024 K values per expert (a
    tile's mainloop is short next to its epilogue) pingpong 128x128 instead, so one
    warpgroup's epilogue runs under the other's mainloop. H200, same run:
    pingpong 128x128 2x1 against cooperative 128x256 2x1 +2.7% on
    DeepSeek-V3 dW up (512 K per expert), +3.3% dW down, +1.1% Qwen3 (128), -5.4% Mixtral (4096)."""
    if arch == "sm_100a":  # the list-form kernel on a table written from offs (config.kgrouped_errors)
        return GemmConfig(arch=arch, form=Form.KGROUPED, a_dtype=dtype, b_dtype=dtype, out_dtype=out_dtype,
                          a_major=a_major, b_major=b_major, tile_m=128, tile_n=256 if n >= 256 else 128, raster="m",
                          group=1, epilogue=EpilogueSpec(alpha=alpha))  # fmt: skip
    problem = GemmProblem(m, n, max(k_mean, 1), e, dtype, dtype, out_dtype, a_major, b_major)
    # (promote_k 0: its K-edge zeroing is in the plain mainloop; the form given, so the policy keeps
    # to the tiles the K-grouped kernel takes)
    cfg = policy_for(arch, num_sms).choose(problem, epilogue=EpilogueSpec(alpha=alpha), form=Form.KGROUPED, promote_k=0)
    if k_mean <= 1024 and cfg.tile_m == 128 and cfg.tile_n >= 128 and cfg.scheduler == "static":
        cfg = replace(cfg, tile_n=128, pingpong=True)
    return replace(cfg, c_major=c_major)


_KG_PLANS: dict = {}


def _kgrouped_launch(a, b, offs, out, alpha, config) -> bool:
    """The K-grouped kernel (sm_90a): True when it ran. False where it does not apply (another
    arch; an out whose N columns are not contiguous or whose rows are not 16-byte multiples): the
    caller loops over the experts then. The plan (config, kernel views, workspace) is built once
    per (shapes, strides, 16-byte alignment of the bases, dtypes, device, alpha != 1, config)."""
    if a.shape[1] == 0:
        out.zero_()
        return True
    key = (a.shape, a.stride(), a.data_ptr() % TMA_ALIGN_BYTES, b.shape, b.stride(), b.data_ptr() % TMA_ALIGN_BYTES,
           out.shape, out.stride(), out.dtype, a.dtype, a.device, alpha != 1.0, config)  # fmt: skip
    plan = _KG_PLANS.get(key)
    if plan is None:
        plan = _KG_PLANS[key] = _kgrouped_plan(a, b, out, alpha, config)
    if not plan:
        return False
    fn, (va, vb, vc), copy, max_clusters, workspace = plan
    if copy:  # no contiguous mode, or a base off 16 bytes: the operands are copied on every call

        a, b = aligned_operand(a.unsqueeze(0)), aligned_operand(b.unsqueeze(0))
    fn(*KernelArgs(
        a.as_strided(*va), b.as_strided(*vb), out.as_strided(*vc), alpha=float(alpha), max_clusters=max_clusters,
        offs=offs if offs.is_contiguous() else offs.contiguous(), workspace=_launch_workspace(workspace, out.device),
    ))  # fmt: skip
    return True


def _launch_workspace(workspace, device):
    """A launch's workspace: the plan's (left zeroed by every launch), or on sm_100a a new group table
    of ``workspace`` int64 words, which the kernel writes from offs (one per launch: launches on
    two streams never share one)."""
    if isinstance(workspace, int):
        return torch.empty(workspace, dtype=torch.int64, device=device)
    return workspace


class KGroupedWarm:
    """A warm K-grouped call (``grouped_gemm(a, b, offs=offs)``, a (M, total_K), b (total_K, N),
    no other option but out / out_dtype / alpha / config / check_offs): the packed form's plan
    key (shapes, strides, dtypes, devices, offs, out) fixes every check of the cold call but
    data-pointer alignment, which the caller checks. Made by :func:`kgrouped_warm` only for a
    call the K-grouped kernel ran on the call's own tensors (no staging copy, no scratch out)."""

    __slots__ = ("fn", "views", "max_clusters", "workspace", "out_dims", "out_dtype", "device", "device_index",
                 "tail")  # fmt: skip

    def run(self, a, b, out, offs, alpha, check_offs):
        """What the cold call passes the kernel (``_kgrouped_launch``), for these tensors."""
        if check_offs:
            check_offs_values(offs, a.shape[1])
        if out is None:
            out = torch.empty(*self.out_dims, dtype=self.out_dtype, device=self.device)
        va, vb, vc = self.views
        # LEADING fields, then the plan's tail (gemm.args)
        self.fn(a.as_strided(*va), b.as_strided(*vb), out.as_strided(*vc), None, None, float(alpha), 0.0,
                self.max_clusters, offs if offs.is_contiguous() else offs.contiguous(), *self.tail)  # fmt: skip
        return out


def kgrouped_warm(a, b, out, res, alpha, config) -> KGroupedWarm | None:
    """The warm plan of a K-grouped call that just returned ``res`` (``out``: the caller's, or
    None), or None when its launch cannot be repeated as it is: not the K-grouped kernel (another
    arch, K == 0, an empty output: no launch), operands copied, or a scratch output."""
    storable = tma_storable(res) or stores_m_major(res, _arch(res))
    if a.shape[1] == 0 or res.numel() == 0 or (out is not None and res is not out) or not storable:
        return None
    key = (a.shape, a.stride(), a.data_ptr() % TMA_ALIGN_BYTES, b.shape, b.stride(), b.data_ptr() % TMA_ALIGN_BYTES,
           res.shape, res.stride(), res.dtype, a.dtype, a.device, alpha != 1.0, config)  # fmt: skip
    plan = _KG_PLANS.get(key)
    if not plan or plan[2] or isinstance(plan[4], int):  # no launch, operands copied per call, or a table per call
        return None
    w = KGroupedWarm()
    w.fn, w.views, _, w.max_clusters, w.workspace = plan
    w.out_dims, w.out_dtype, w.device, w.device_index = tuple(res.shape), res.dtype, res.device, res.device.index
    w.tail = KernelArgs(None, None, None, workspace=w.workspace).tail()
    return w


def _kgrouped_plan(a, b, out, alpha, config):
    """(kernel, (A (M, K, 1), B (N, K, 1), C (M, N, E)) views, operands copied, max clusters,
    workspace) for :func:`_kgrouped_launch`, or False where the kernel does not apply."""
    dev = a.device
    arch, num_sms = device_info(dev.index if dev.index is not None else torch.cuda.current_device())
    # C row-major, or M-major (sm_90a, 16-bit: config.c_major "m")
    c_major = c_major_of(out)
    if arch not in ("sm_90a", "sm_100a") or c_major is None:
        return False
    if c_major == "m" and not m_major_ok(arch, out.element_size(), out.shape[2]):
        return False
    if arch == "sm_100a" and out.shape[0] > GROUPED_MAX_GROUPS:
        return False
    (M, K), E, N = a.shape, out.shape[0], b.shape[1]
    a3, b3 = aligned_operand(a.unsqueeze(0)), aligned_operand(b.unsqueeze(0))
    a_unit, b_unit = unit_mode(a3), unit_mode(b3)
    try:
        views = (kernel_view(a3, a_unit, (1, 2, 0), "a"), kernel_view(b3, b_unit, (2, 1, 0), "b"),
                 kernel_view(out, 2 if c_major == "n" else 1, (1, 2, 0), "out"))  # fmt: skip
    except ValueError:
        return False
    majors = ("k" if a_unit == 2 else "m", "n" if b_unit == 2 else "k")
    dtype, out_name = INPUT_TO_NAME[a.dtype], TORCH_TO_NAME[out.dtype]
    cfg = config or kgrouped_config(arch, num_sms, M, N, K // max(E, 1), E, dtype, out_name, *majors, alpha != 1.0, c_major)
    if alpha != 1.0 and not cfg.epilogue.alpha:
        cfg = replace(cfg, epilogue=replace(cfg.epilogue, alpha=True))
    ok, why = can_implement(cfg, GemmProblem(M, N, K, E, dtype, dtype, out_name, *majors))
    if not ok or (cfg.a_major, cfg.b_major, cfg.c_major) != (*majors, c_major):
        if config is not None:
            raise ValueError(f"cannot run {cfg.name}: {why or 'operand (or out) majors differ from the config'}")
        return False
    copy = a3.data_ptr() != a.data_ptr() or b3.data_ptr() != b.data_ptr()
    workspace = new_workspace(cfg, dev)
    if arch == "sm_100a":  # the list form's group table: a row per expert and one, then 3 descriptors each
        workspace = (E + 1) * LIST_FIELDS + E * 3 * DESC_BYTES // 8
    return DENSE_CACHE.get(cfg), views, copy, max_clusters_for(cfg, dev, num_sms), workspace


def grouped_k_gather(a, b, offs, index, gather: str, out_dtype=None, transposed: bool = False):
    """The K-grouped form with one operand's K rows read through ``index`` (R,) (the MoE weight
    gradients of a routed layer, without the gathered copy); offs (E,) splits the R positions.

    gather "a": ``out[e] = a[index[k_e]]^T @ b[k_e]``, a (tokens, M) holding the rows, b (R, N);
    gather "b": ``out[e] = a[:, k_e] @ b[index[k_e]]``, a (M, R), b (tokens, N) holding the rows.
    Returns a new (E, M, N) tensor (an expert with no positions gets zeros); ``transposed``: a new
    contiguous (E, N, M) tensor holding each out[e]^T, which the kernel stores M-major (16-bit
    outputs; a weight gradient in an (E, N, M) weight's layout, with no transposing copy). sm_90a, bf16 / fp16,
    the gathered operand row-major with 16-byte aligned rows of a multiple of 16 bytes, an int32
    index: one launch of the gathering kernel (:func:`_gather_launch`: no host sync); otherwise the
    gathered copy (``index_select``) and :func:`grouped_k`. Index values outside [0, tokens) read
    a clamped row on the kernel route and raise in the copy: pass valid ones."""
    if gather not in ("a", "b"):
        raise ValueError(f"gather must be 'a' or 'b', got {gather!r}")
    rows_of = a if gather == "a" else b
    R = b.shape[0] if gather == "a" else a.shape[1]
    if a.dim() != 2 or b.dim() != 2 or index.dim() != 1 or index.shape[0] != R:
        raise ValueError(f"grouped_k_gather: 2-D a and b and an index of {R} positions, got a {tuple(a.shape)}, "
                         f"b {tuple(b.shape)}, index {tuple(index.shape)}")  # fmt: skip
    out_dtype = out_dtype or a.dtype
    res = _gather_launch(a, b, offs, index, gather, out_dtype, transposed)
    if res is not None:
        return res
    rows = rows_of.index_select(0, index)
    a2, b2 = (rows.mT, b) if gather == "a" else (a, rows)
    M, N = a2.shape[0], b2.shape[1]
    out = torch.empty((offs.numel(), N, M), dtype=out_dtype, device=a.device).mT if transposed else None
    res = grouped_k(a2, b2, offs, out, out_dtype, 1.0, False)
    return res.mT if transposed else res


_KG_GATHER: dict = {}
# The gathering kernel's tile (M x N, cooperative) where the output is that wide, per gathered
# operand: gather "a" reads 128 values of each token row for 256 output columns, gather "b" 256
# values for 128 rows. H100, the Qwen3-30B-A3B weight gradients (one process each): gather "a"
# 1.435 / 0.887 ms (dW_gate_up / dW_down^T) against 1.706 / 1.031 in the policy's 128x128
# pingpong tiles and 1.764 / 1.078 for the copy plus the TMA kernel; gather "b" (dW_gate_up^T)
# 1.687 against 1.839 in 128x128 pingpong and 1.677 for the copy plus the TMA kernel.
# None: no tile that pays. moe.routed_experts gathers "a" only (``transposed``, an M-major store, where
# the weight's layout holds the product's transpose: Qwen3-30B-A3B dW_gate_up 1.367 ms against gather
# "b"'s 1.565, H100); with "a" None it copies the operand.
GATHER_WIDE_TILE: dict = {"a": (128, 256), "b": (128, 256)}


def on_cuda(t: torch.Tensor) -> bool:
    """Whether the gathering kernel may take ``t`` (the CPU tests' emulated kernels stand in here)."""
    return t.is_cuda


def _gather_launch(a, b, offs, index, gather, out_dtype, transposed=False):
    """:func:`grouped_k_gather` as one launch of the gathering K-grouped kernel, or None where it
    does not apply (see there): its (E, M, N) result (``transposed``: the contiguous (E, N, M)
    one; the kernel's C view is M-major). The plan is built once per (shapes, strides, dtypes, device)."""
    rows_of, other = (a, b) if gather == "a" else (b, a)
    es = rows_of.element_size()
    if not (on_cuda(rows_of) and rows_of.dtype in (torch.bfloat16, torch.float16) and other.dtype == rows_of.dtype
            and index.dtype == torch.int32 and index.is_contiguous() and rows_of.stride(1) == 1
            and rows_of.shape[1] >= 8 and (rows_of.shape[1] * es) % TMA_ALIGN_BYTES == 0
            and tma_addressable(rows_of, 1) and tma_addressable(other, 1 if other.stride(1) == 1 else 0)
            and out_dtype in (torch.bfloat16, torch.float16, torch.float32)):  # fmt: skip
        return None
    a_op = a.mT if gather == "a" else a  # A (M, K): x^T over the tokens, or (M, R)
    M, N, E = a_op.shape[0], b.shape[1], offs.numel()
    key = (a.shape, a.stride(), b.shape, b.stride(), index.shape, E, a.dtype, out_dtype, a.device, gather, transposed)
    plan = _KG_GATHER.get(key)
    if plan is None:
        plan = _KG_GATHER[key] = _gather_plan(a_op, b, E, index.shape[0], gather, out_dtype, transposed)
    if not plan:
        return None
    fn, (va, vb, vc), max_clusters, _ = plan
    out = torch.empty((E, N, M) if transposed else (E, M, N), dtype=out_dtype, device=a.device)
    if index.shape[0] == 0 or M == 0 or N == 0:
        return out.zero_()
    fn(*KernelArgs(
        a_op.as_strided(*va), b.as_strided(*vb), out.as_strided(*vc), alpha=1.0, max_clusters=max_clusters,
        offs=offs if offs.is_contiguous() else offs.contiguous(), a_index=index,
    ))  # fmt: skip
    return out


def _gather_plan(a_op, b, E, R, gather, out_dtype, transposed=False):
    """(kernel, (A (M, K, 1), B (N, K, 1), out (M, N, E)) views, max clusters, config) of
    :func:`_gather_launch`, or False."""
    dev = a_op.device
    arch, num_sms = device_info(dev.index if dev.index is not None else torch.cuda.current_device())
    M, N = a_op.shape[0], b.shape[1]
    if arch != "sm_90a" or ((M if transposed else N) * out_dtype.itemsize) % TMA_ALIGN_BYTES:
        return False
    if transposed and not m_major_ok(arch, out_dtype.itemsize, N):
        return False
    a3, b3 = a_op.unsqueeze(0), b.unsqueeze(0)
    # the gathered operand is MN-major (its rows contiguous, checked by the caller) whatever its sizes
    a_unit, b_unit = (1, unit_mode(b3)) if gather == "a" else (unit_mode(a3), 2)
    if a_unit is None or b_unit is None:
        return False
    try:
        views = (kernel_view(a3, a_unit, (1, 2, 0), "a"), kernel_view(b3, b_unit, (2, 1, 0), "b"))
    except ValueError:
        return False
    majors = ("k" if a_unit == 2 else "m", "n" if b_unit == 2 else "k")
    dtype, out_name = INPUT_TO_NAME[a_op.dtype], TORCH_TO_NAME[out_dtype]
    cfg = kgrouped_config(arch, num_sms, M, N, R // max(E, 1), E, dtype, out_name, *majors, False,
                          "m" if transposed else "n")  # fmt: skip
    # the TMA operand keeps the policy's multicast pair, along the other mode for a gathered B
    pair = max(cfg.cluster_m, cfg.cluster_n)
    cfg = replace(cfg, cluster_m=pair if gather == "a" else 1, cluster_n=1 if gather == "a" else pair, scheduler="static",
                  gather_a=gather == "a", gather_b=gather == "b")  # fmt: skip
    if (cfg.tile_n if cfg.gather_b else cfg.tile_m) not in GATHER_K_TILES:
        cfg = replace(cfg, **{"tile_n" if cfg.gather_b else "tile_m": 128})
    wide = GATHER_WIDE_TILE.get(gather)
    if wide is not None and N >= wide[1] and M >= wide[0]:
        cfg = replace(cfg, tile_m=wide[0], tile_n=wide[1], pingpong=False)
    ok, _ = can_implement(cfg, GemmProblem(M, N, max(R, 1), E, dtype, dtype, out_name, *majors))
    if not ok:
        return False
    out_meta = torch.empty((E, N, M) if transposed else (E, M, N), dtype=out_dtype, device="meta")
    out_view = kernel_view(out_meta.mT if transposed else out_meta, 1 if transposed else 2, (1, 2, 0), "out")
    return DENSE_CACHE.get(cfg), (*views, out_view), max_clusters_for(cfg, dev, num_sms), cfg
