"""How the GEMM kernels are launched from torch: the compiled-kernel caches (dense and grouped),
the workspaces of the dynamic scheduler and split K, the kernel's views of torch operands (TMA's
16-byte rules), quantized-output buffers, and the argument checks every face shares."""

from __future__ import annotations

import weakref

import torch

from ..blockscaled.formats import get_format
from ..blockscaled.layout import swizzled_shape
from ..blockscaled.reference import BlockScaledTensor, quantize_ref
from ..config import ACTIVATIONS, GATED, MAX_EPILOGUE_ARGS, TMA_ALIGN_BYTES, GemmConfig, GemmProblem
from ..epilogue.quant import QUANT
from ..epilogue.reference import GATE_LAYOUTS, epilogue_ref, interleave_gate_up
from ..epilogue.user import apply_user_ref
from ..runtime.cache import KernelCache
from ..runtime.device import current_stream_id
from ..schedulers.static import tail_units
from .args import KernelArgs, dense_fake_args, fake_list_table, fake_offs, grouped_fake_args, scaled_tail
from .fp8_scales import TORCH_FP8, fp8_saturated
from .sm90.kernel import GemmSm90
from .sm90.split import split_counter_words, split_workspace_words
from .sm100.kernel import GemmSm100

TORCH_TO_NAME = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
INPUT_TO_NAME = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float8_e4m3fn: "e4m3"}
DENSE_INPUT_TO_NAME = {**INPUT_TO_NAME, torch.float8_e5m2: "e5m2"}  # e5m2: the dense form only
OUT_TO_NAME = {**TORCH_TO_NAME, torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}  # FP8: FP8 operands' dense form
NAME_TO_TORCH = {v: k for k, v in TORCH_TO_NAME.items()}


def new_workspace(config: GemmConfig, device, problem: GemmProblem | None = None, max_clusters: int = 0):
    """Scheduler "dynamic": the (1,) int32 tile counter, allocated once per plan. Split K (dense,
    ``problem`` given): the split tiles' counters and partial-sum slots (``gemm.sm90.split``;
    split_tail: only the tiles past the whole waves of the launch's ``max_clusters`` CTAs), a view
    of the current stream's shared buffer (:func:`split_workspace`; ``split_cluster``: none, the
    partial sums meet in shared memory). Else None.
    Every launch leaves its counters at zero (the dynamic scheduler's: ``schedulers.dynamic``;
    split K's: ``gemm.sm90.split``), so no reset runs between launches; one plan must not run on
    two streams at once (split K: a plan called on another stream moves to that stream's buffer,
    :func:`follow_stream`)."""
    if config.split_k > 1 and not config.split_cluster:
        return split_workspace(device, *split_words(config, problem, max_clusters))[0]
    return torch.zeros(1, dtype=torch.int32, device=device) if config.scheduler == "dynamic" else None


def split_words(config: GemmConfig, problem: GemmProblem, max_clusters: int) -> tuple[int, int]:
    """(counter words, slot words) of a split-K launch's workspace (``gemm.sm90.split``)."""
    tiles = -(-problem.m // config.tile_m) * -(-problem.n // config.tile_n) * problem.l
    if config.split_tail:
        if max_clusters < 1:
            raise ValueError("split_tail: the workspace needs the launch's max_clusters")
        tiles -= tail_units(tiles, max_clusters, config.split_k)[0]
    tiles = max(tiles, 1)
    counters = split_counter_words(tiles)
    return counters, split_workspace_words(tiles, config.split_k, config.tile_m, config.tile_n) - counters


# Split-K workspaces: one buffer per (device, stream), shared by the split plans that launch on that
# stream, where each plan held its own (a plan per token count: DeepSeek-V3's kv_a projection over M
# = 1..2048 held 640 of them, 2.9 GB). A workspace is its tiles' counters, then their partial-sum
# slots; a launch leaves its counters at zero but its slots full. So the buffer is a zeroed
# counter zone of ``zone`` words, then the slot zone, and a plan's view starts ``counters`` words
# before the zone's end: every plan's counters lie in the counter zone (zero between launches,
# whatever plan ran last) and its slots in the slot zone (stale sums, never read before written).
# Launches on one stream run one after another, so they can share it. A plan that needs a larger
# zone gets a new buffer of twice the need; the old one stays allocated (plans and captured CUDA
# graphs keep pointing into it): no buffer is ever freed.
_SPLIT_BUFFERS: dict = {}  # (device, stream handle) -> (counter zone words, the current buffer)
_SPLIT_RETIRED: list = []  # the buffers grown out of, kept alive


def stream_of(device: torch.device) -> int:
    """The handle of ``device``'s current stream (0 off CUDA: the CPU test harness)."""
    return current_stream_id(device.index) if device.type == "cuda" else 0


def split_workspace(device, counters: int, slots: int) -> tuple[torch.Tensor, int]:
    """A split-K workspace of ``counters`` counter words then ``slots`` slot words, from the
    current stream's shared buffer (see _SPLIT_BUFFERS; a new, larger buffer where it is too
    small), and that stream's handle."""
    device = torch.device(device)
    stream = stream_of(device)
    zone, buf = _SPLIT_BUFFERS.get((device, stream), (0, None))
    if buf is None or counters > zone or zone + slots > buf.numel():
        if buf is not None:
            _SPLIT_RETIRED.append(buf)
        zone, size = max(zone, 2 * counters), max(buf.numel() - zone if buf is not None else 0, 2 * slots)
        buf = torch.zeros(zone + size, dtype=torch.int32, device=device)
        _SPLIT_BUFFERS[(device, stream)] = zone, buf
    return buf[zone - counters : zone + slots], stream


def split_buffer_bytes() -> int:
    """Bytes held by split-K workspaces (current and grown-out buffers, every device and stream)."""
    return sum(b.numel() * 4 for b in (*(buf for _, buf in _SPLIT_BUFFERS.values()), *_SPLIT_RETIRED))


def dense_workspace(config: GemmConfig, device, problem: GemmProblem, max_clusters: int):
    """A dense plan's (workspace, ``ws_stream``): :func:`new_workspace`'s workspace, and for a
    split-K one in the current stream's buffer, (device, stream handle, counter words), else None."""
    if config.split_k < 2 or config.split_cluster:
        return new_workspace(config, device), None
    counters, slots = split_words(config, problem, max_clusters)
    ws, stream = split_workspace(device, counters, slots)
    return ws, (device, stream, counters)


def follow_stream(plan) -> None:
    """Points a split-K dense plan (``plan.ws_stream``: (device, stream handle, counter words) of
    its workspace) at the buffer of the stream it launches on now, where that is another one: its
    workspace and the argument tails built on it."""
    device, bound, counters = plan.ws_stream
    if stream_of(device) == bound:
        return
    ws, stream = split_workspace(device, counters, plan.workspace.numel() - counters)
    plan.workspace, plan.ws_stream = ws, (device, stream, counters)
    plan.tail = KernelArgs(None, None, None, workspace=ws).tail()
    if plan.scaled_tail is not None:
        plan.scaled_tail = scaled_tail(plan.tail, plan.scaled_tail[2])


def kernel_class(arch: str):
    if arch == "sm_90a":
        return GemmSm90
    if arch == "sm_100a":
        return GemmSm100
    raise ValueError(f"no dense kernel for arch {arch!r}")


def build_dense(config: GemmConfig):
    offs = fake_offs() if config.kgrouped else fake_list_table() if config.listed else None
    return kernel_class(config.arch)(config), dense_fake_args(config, offs=offs)


DENSE_CACHE = KernelCache(build_dense)
def check_operand(name: str, t, dims=(2, 3), written: bool = False):
    """A dense (strided) CUDA tensor of ``dims`` dims (:func:`check_tensor`)."""
    check_tensor(name, t, dims, written)
    if t.device.type != "cuda":
        raise ValueError(f"{name} must be a CUDA tensor, got device {t.device}")


def check_tensor(name: str, t, dims=(2, 3), written: bool = False):
    """A dense (strided) tensor of ``dims`` dims; ``written`` (an output): no two of its elements
    at one address (a stride-0 mode, e.g. an ``expand``ed view), as torch refuses."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided or t.is_nested:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}{' (nested)' * t.is_nested}")
    if t.dim() not in dims:
        raise ValueError(f"{name} must have {' or '.join(map(str, dims))} dims, got shape {tuple(t.shape)}")
    if written and any(st == 0 and size > 1 for size, st in zip(t.shape, t.stride(), strict=True)):
        raise ValueError(f"{name}: more than one of its elements refers to one memory location (a stride-0 "
                         "view); clone() it first")  # fmt: skip


def check_config(config) -> None:
    """A ``config=`` argument: None (the policy picks) or a GemmConfig (TypeError otherwise)."""
    if config is not None and not isinstance(config, GemmConfig):
        raise TypeError(f"config must be a cutegemm.GemmConfig (None: the policy's), got {type(config).__name__}")


def kernel_view(t3: torch.Tensor, unit_mode: int, order: tuple[int, int, int], name: str):
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


def unit_mode(t3: torch.Tensor, prefer: int = 2) -> int | None:
    """Which of modes 2 (cols) / 1 (rows) of a (L, rows, cols) tensor is contiguous (a size-1 mode
    is, at any stride); ``prefer`` where both are (an FP8 B: 1, its K mode)."""
    other = 3 - prefer
    if t3.stride(prefer) == 1 or t3.shape[prefer] == 1:
        return prefer
    if t3.stride(other) == 1 or t3.shape[other] == 1:
        return other
    return None


def padded_rows(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """A ``shape`` view into a fresh buffer whose rows are padded to a multiple of 16 bytes (the
    TMA store writes whole 16-byte row pieces: up to 15 bytes past the last column)."""
    align = TMA_ALIGN_BYTES // dtype.itemsize
    n = shape[-1]
    if n % align == 0:  # rows of whole 16-byte pieces: no padding (and no slice: ~1 us less per call)
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.empty((*shape[:-1], -(-n // align) * align), dtype=dtype, device=device)[..., :n]


def copy_unaligned_out(out, written):
    """After the launch: ``written`` is out itself, or the ``padded_rows`` scratch (copied into out)."""
    if out is not None and written is not out:
        out.copy_(written)
        return out
    return written


def degenerate_result(out, b, quant, scales, gs, alpha, beta, c, bias, activation, epilogue, vectors):
    """Empty output or K == 0: the epilogue of a zero accumulator, in torch."""
    shape = (*out.shape[:-1], b.shape[-1] if activation not in GATED else b.shape[-1] // 2)
    if quant is not None and out.numel() == 0:
        return quant_result(quant, shape, out, scales, gs)
    if out.numel() == 0:
        return out
    acc = torch.zeros(*out.shape[:-1], b.shape[-1], dtype=torch.float32, device=out.device)
    if epilogue is not None:
        y = apply_user_ref(epilogue, acc * alpha, vectors)
    else:
        y = epilogue_ref(acc, alpha=alpha, beta=beta, c=c, bias=bias, activation=activation)
    if quant is not None:
        return quantize_ref(y, quant, global_scale=None if gs is None else gs)
    if beta == 0.0 and bias is None and activation is None and epilogue is None:
        return out.zero_()
    return out.copy_(fp8_saturated(y, out.dtype) if out.dtype in TORCH_FP8 else y)


def tma_addressable(t: torch.Tensor, unit: int) -> bool:
    """Whether TMA addresses ``t`` in place with mode ``unit`` as its unit-stride mode: a 16-byte
    aligned start and every other stride (of a mode longer than 1) a multiple of 16 bytes."""
    es = t.element_size()
    return t.data_ptr() % TMA_ALIGN_BYTES == 0 and all(
        i == unit or size == 1 or (st * es) % TMA_ALIGN_BYTES == 0
        for i, (size, st) in enumerate(zip(t.shape, t.stride(), strict=True))
    )


def aligned_operand(t3: torch.Tensor, prefer: int = 2) -> torch.Tensor:
    """t3 (L, rows, cols) itself when TMA can read it in place (a unit-stride mode,
    ``tma_addressable``), else a copy that it can: the same major mode, its leading dimension
    padded to 16 bytes (a slice of a larger or odd-sized buffer, any strides torch accepts);
    ``prefer``: :func:`unit_mode`'s."""
    unit = unit_mode(t3, prefer)
    if unit is not None and tma_addressable(t3, unit):
        return t3
    if unit == 1:  # column-major: keep the rows contiguous, pad the columns' stride
        return padded_rows((t3.shape[0], t3.shape[2], t3.shape[1]), t3.dtype, t3.device).copy_(t3.mT).mT
    return padded_rows(t3.shape, t3.dtype, t3.device).copy_(t3)


def rowmajor_operand(t: torch.Tensor) -> torch.Tensor:
    """t itself when the kernel reads it in place as a row-major operand (unit stride along its
    last dim, ``tma_addressable``), else a row-major copy with rows padded to 16 bytes."""
    if (t.shape[-1] == 1 or t.stride(-1) == 1) and tma_addressable(t, t.dim() - 1):
        return t
    return padded_rows(t.shape, t.dtype, t.device).copy_(t)


def views_are_flat(a, b, out, views) -> bool:
    """Whether the caller's 2-D a, b, out are exactly the kernel's views without their unit L
    mode (so a flat launch passes them as they are): same sizes and strides, no size-1 mode
    whose stride the view had to replace."""
    if a.dim() != 2 or b.dim() != 2 or out.dim() != 2:
        return False
    (sa, ta), (sb, tb), (sc, tc) = views
    return (
        (tuple(a.shape), a.stride()) == (tuple(sa[:2]), tuple(ta[:2]))
        and (tuple(b.shape), b.stride()) == ((sb[1], sb[0]), (tb[1], tb[0]))
        and (tuple(out.shape), out.stride()) == (tuple(sc[:2]), tuple(tc[:2]))
    )


def tma_storable(out: torch.Tensor) -> bool:
    """Whether the kernel's TMA store can write ``out`` in place: row-major (unit stride along the
    columns), 16-byte aligned start and strides, and rows a multiple of 16 bytes (the store writes
    whole 16-byte row pieces: up to 15 bytes past column N, where a caller's view of a larger
    buffer may hold data). Any other ``out`` gets an aligned scratch and a copy."""
    return (
        (out.shape[-1] * out.element_size()) % TMA_ALIGN_BYTES == 0
        and (out.shape[-1] == 1 or out.stride(-1) == 1)
        and tma_addressable(out, out.dim() - 1)
    )


def tma_storable_t(out: torch.Tensor) -> bool:
    """:func:`tma_storable` for an M-major ``out`` (unit stride along the rows, e.g. the transposed
    view of a row-major buffer): columns a multiple of 16 bytes, 16-byte aligned start and strides."""
    return (
        out.dim() >= 2
        and (out.shape[-2] * out.element_size()) % TMA_ALIGN_BYTES == 0
        and (out.shape[-2] == 1 or out.stride(-2) == 1)
        and tma_addressable(out, out.dim() - 2)
    )


def c_major_of(out: torch.Tensor) -> str | None:
    """C's unit-stride mode (``config.c_major``) of an output whose last two dims are (M, N): "n"
    (row-major, or one column), "m" (M-major), None (neither has unit stride)."""
    if out.stride(-1) == 1 or out.shape[-1] == 1:
        return "n"
    return "m" if out.stride(-2) == 1 else None


def m_major_ok(arch: str, itemsize: int, n: int) -> bool:
    """Where the sm_90a kernels store C M-major (config.c_major "m", ``config.c_major_ok``): a
    16-bit C of more than one column (a one-column C takes the N-major kernel, as it always did)."""
    return arch == "sm_90a" and itemsize == 2 and n > 1


# The packed form's M-major store (``c_major`` "m" on a grouped config: an M-major ``out``, the 3d x
# 2d form's transposed result). Where an expert starts at a row that is not a multiple of 8, the TMA
# store's box would start inside a 16-byte piece of the unit-stride mode (an H100 faulted with an
# illegal instruction there): the epilogue stores such experts' tiles by predicated copies. H100:
# the GPU test of the route (hypothesis over counts, tails, K and M, the faulting case included)
# passed, and compute-sanitizer's memcheck found no error on it. Off: M-major outs take a row-major
# scratch and a copy (the route before it).
PACKED_M_MAJOR = True


def packed_m_major() -> bool:
    """Whether the packed form stores M-major outs in place (:data:`PACKED_M_MAJOR`)."""
    return PACKED_M_MAJOR


def stores_m_major(out: torch.Tensor, arch: str) -> bool:
    """Whether an M-major ``out`` is stored in place by an M-major kernel on ``arch``
    (:func:`m_major_ok` and :func:`tma_storable_t`); the packed form adds its epilogue's rules
    (no gated or quantized output, not the swapped kernel)."""
    return tma_storable_t(out) and m_major_ok(arch, out.element_size(), out.shape[-1])


def memo_view(plan, t: torch.Tensor, size, stride) -> torch.Tensor:
    """``t.as_strided(size, stride)``, memoized on ``plan`` for the same tensor object (the weight
    operand is usually passed again and again). The memo is used only for that very object at
    the same data pointer (a ``t.set_()`` / ``t.data = ...`` swap misses; t's shape, strides and
    dtype are fixed by the plan key). It is a view of ``t.detach()``, so it never keeps ``t``
    alive, and ``t``'s death drops it (weakref callback): no stale view, no leaked storage."""
    ptr = t.data_ptr()
    memo = getattr(plan, "b_memo", None)
    if memo is not None and memo[0]() is t and memo[1] == ptr:
        return memo[2]
    view = t.detach().as_strided(size, stride)

    def drop(ref, plan=plan):
        m = getattr(plan, "b_memo", None)
        if m is not None and m[0] is ref:
            plan.b_memo = None

    plan.b_memo = (weakref.ref(t, drop), ptr, view)
    return view


# The current CUDA device index. torch._C._cuda_getDevice is what torch.cuda.current_device()
# returns after its lazy-init check; a cached plan implies CUDA is initialized already.
current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
ACTIVATION_NAMES = (*ACTIVATIONS, *GATED)
def quant_outputs(fmt: str, shape, device):
    """(data the kernel writes: e4m3 (.., N) or uint8 (.., N / 2), scale bytes: zeroed 128x4
    swizzled (L, rows_p, cols_p) uint8) for a quantized output of logical ``shape``."""
    q = QUANT[fmt]
    n = shape[-1]
    if q.packed:
        data = torch.empty((*shape[:-1], n // 2), dtype=torch.uint8, device=device)
    else:
        data = torch.empty(shape, dtype=torch.float8_e4m3fn, device=device)
    rows_p, cols_p = swizzled_shape(shape[-2], -(-n // q.block))
    batch = 1
    for d in shape[:-2]:
        batch *= d
    # flat: the kernel's view (e8m0 bytes as uint8; NVFP4 scales as e4m3, as the kernel writes them)
    sdtype = torch.uint8 if q.scale == "e8m0" else torch.float8_e4m3fn
    scales = torch.zeros(batch * rows_p * cols_p, dtype=sdtype, device=device)
    return data, scales


def quant_result(fmt: str, shape, data, scales, gs):
    f = get_format(fmt)
    rows_p, cols_p = swizzled_shape(shape[-2], -(-shape[-1] // f.block_size))
    scales = scales.view(*shape[:-2], rows_p, cols_p)
    return BlockScaledTensor(
        data=data.view(f.elem_dtype), scales=scales.view(f.scale_dtype), fmt=f, shape=torch.Size(shape),
        global_scale=None if gs is None else gs.reshape(()), scales_swizzled=True,
    )  # fmt: skip


def global_scale(fmt, out_global_scale, device):
    """The NVFP4 output's (1,) fp32 global scale on ``device`` (None for MX formats)."""
    if fmt != "nvfp4":
        if out_global_scale is not None:
            raise ValueError(f"out_global_scale is for NVFP4 outputs only, got out_dtype={fmt!r}")
        return None
    if out_global_scale is None:
        raise ValueError(
            "an NVFP4 output needs out_global_scale (fp32 per-tensor scale; e.g. amax / (448 * 6))"
        )
    if isinstance(out_global_scale, torch.Tensor):
        if out_global_scale.numel() != 1:
            raise ValueError(
                f"out_global_scale must have one element, got shape {tuple(out_global_scale.shape)}"
            )
        return out_global_scale.detach().to(device=device, dtype=torch.float32).reshape(1)
    gs = float(out_global_scale)
    if not (gs > 0 and gs < float("inf")):
        raise ValueError(f"out_global_scale must be positive and finite, got {gs}")
    return torch.tensor([gs], dtype=torch.float32, device=device)


def epilogue_vectors(epilogue_args, device):
    """User-epilogue vectors as contiguous, 16-byte aligned 1-D tensors on ``device``."""
    if not isinstance(epilogue_args, (tuple, list)):
        raise TypeError(f"epilogue_args must be a tuple of tensors, got {type(epilogue_args).__name__}")
    if len(epilogue_args) > MAX_EPILOGUE_ARGS:
        raise ValueError(f"at most {MAX_EPILOGUE_ARGS} epilogue_args, got {len(epilogue_args)}")
    out = []
    for i, t in enumerate(epilogue_args):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"epilogue_args[{i}] must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 1 or t.numel() == 0:
            raise ValueError(f"epilogue_args[{i}] must be a non-empty 1-D vector, got shape {tuple(t.shape)}")
        if t.dtype not in EPI_TORCH_DTYPES:
            raise TypeError(f"epilogue_args[{i}].dtype must be bf16, fp16 or fp32, got {t.dtype}")
        if t.device != device:
            raise ValueError(f"epilogue_args[{i}] must be on {device}, got {t.device}")
        if t.stride(0) != 1 or t.data_ptr() % TMA_ALIGN_BYTES:
            t = t.clone(memory_format=torch.contiguous_format)
        out.append(t)
    return tuple(out)


EPI_TORCH_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
def check_activation(activation, gate_layout):
    if activation is not None and activation not in ACTIVATION_NAMES:
        raise ValueError(f"activation must be None or one of {ACTIVATION_NAMES}, got {activation!r}")
    if gate_layout not in GATE_LAYOUTS:
        raise ValueError(f"gate_layout must be one of {GATE_LAYOUTS}, got {gate_layout!r}")


def interleave_b(b: torch.Tensor) -> torch.Tensor:
    """``[gate | up]`` columns of b -> interleaved (a copy), keeping a K-major b K-major."""
    if b.shape[-1] > 1 and b.stride(-2) == 1 and b.stride(-1) != 1:
        return interleave_gate_up(b.mT, dim=-2).mT
    return interleave_gate_up(b, dim=-1)



def build_grouped(config: GemmConfig):
    return kernel_class(config.arch)(config), grouped_fake_args(config)


GROUPED_CACHE = KernelCache(build_grouped)


def check_offs_values(offs: torch.Tensor, total_m: int):
    """The ``check_offs=True`` rule: offs non-decreasing, >= 0, and within a's rows."""
    o = offs.tolist()  # host sync: only with check_offs=True
    prev = 0
    for e, v in enumerate(o):
        if v < prev:
            raise ValueError(f"offs must be non-decreasing and >= 0: offs[{e}] = {v} < {prev}")
        prev = v
    if o and o[-1] > total_m:
        raise ValueError(f"offs[-1] = {o[-1]} exceeds a.shape[0] = {total_m}")
