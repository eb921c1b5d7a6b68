"""List form of the grouped GEMM: ``grouped_gemm([a0, a1, ...], [b0, b1, ...])`` -> list,
arbitrary per-group M, N, K, one dtype; epilogue: alpha, an elementwise activation (relu / gelu /
gelu_tanh / silu), out_dtype. :func:`cutegemm.grouped.packed.grouped_gemm` checks the epilogue
arguments and calls :func:`grouped_list`.

Launch path (:func:`list_launch`; a warm call of a seen signature replays its plan, ``PLANS``): sm_90a
and sm_100a, bf16 / fp16: one launch of the list-form
kernel (``GemmConfig.listed``, compiled in the dense kernel cache; :func:`list_config` picks its
tile) after a small prep kernel that writes each group's TMA descriptors (A, B, C) on the device
from a group table the host builds from the tensors' metadata (:func:`list_table`): no sync;
outputs are views of one buffer; more groups than the kernel's shared-memory tile table holds
run in chunks. Elsewhere, and for operands TMA cannot read in place, groups whose operands are
stored with different majors, output rows that are not 16-byte multiples, or a call made while
a CUDA graph is being captured (the table is copied from the host per call): one dense GEMM per
group (no sync; graph-capturable when shapes are fixed).
"""

from __future__ import annotations

import array
import functools
from dataclasses import replace

import torch

from ..config import TMA_ALIGN_BYTES, Form, GemmConfig, GemmProblem
from ..epilogue import EpilogueSpec
from ..gemm.args import KernelArgs
from ..gemm.dense import gemm
from ..gemm.grouped_parts import GROUPED_MAX_GROUPS
from ..gemm.launch import DENSE_CACHE, INPUT_TO_NAME, TORCH_TO_NAME, kernel_view
from ..policy import policy_for
from ..runtime.device import device_info
from ..schedulers.grouped import LIST_FIELDS, LIST_TILE

# The word of the table's last row (after its LIST_TILE total) that holds the dynamic scheduler's
# tile counter of a launch: zero as the host writes the table, so it needs no fill kernel.
LIST_COUNTER = LIST_TILE + 1


def grouped_list(a_list, b_list, *, offs, out_dtype, alpha, activation=None):
    key = _plan_key(a_list, b_list, out_dtype, alpha, activation) if offs is None else None
    plan = PLANS.get(key) if key is not None else None
    if plan is not None and not torch.cuda.is_current_stream_capturing():
        outs = plan.run(a_list, b_list, alpha)
        if outs is not None:
            return outs
    if offs is not None:
        raise ValueError("offs is not used with lists of tensors")
    if not isinstance(a_list, (list, tuple)) or not isinstance(b_list, (list, tuple)) or len(a_list) != len(b_list):
        raise ValueError("the list form takes two lists of equal length")
    a_shapes, b_shapes = [], []
    for i, (x, w) in enumerate(zip(a_list, b_list, strict=True)):
        if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor) or x.dim() != 2 or w.dim() != 2:
            raise ValueError(f"group {i}: the list form takes 2-D a (M, K) and b (K, N) tensors")
        sa, sb = x.shape, w.shape
        if sa[1] != sb[0]:
            raise ValueError(f"group {i}: shapes do not match: a (M, K={sa[1]}) and b (K={sb[0]}, N)")
        a_shapes.append(sa)
        b_shapes.append(sb)
    if a_list and len({t.dtype for t in [*a_list, *b_list]}) != 1:
        raise TypeError("all groups must share one dtype")
    outs = list_launch(list(a_list), list(b_list), out_dtype, alpha, activation=activation, shapes=(a_shapes, b_shapes),
                       plan_key=key)  # fmt: skip
    if outs is not None:
        return outs
    return [gemm(x, w, out_dtype=out_dtype, alpha=alpha, activation=activation) for x, w in zip(a_list, b_list, strict=True)]


# Warm calls: a plan per signature (every group's shape, strides, dtype and device, the output
# dtype, alpha != 1, the activation) holds what list_launch derived from it (config, kernel, table
# rows but their pointers, kernel views); a call then only allocates the outputs, writes the
# pointers into the table rows and launches, as the cold call does. Per-group sizes often change
# from call to call (so would the keys): at most MAX_PLANS are kept, the oldest dropped first.
PLANS: dict = {}
MAX_PLANS = 256


def _plan_key(a_list, b_list, out_dtype, alpha, activation):
    """The plan key of a list call, or None (not two lists of tensors)."""
    try:
        return (tuple((x.shape, x.stride(), x.dtype, x.get_device()) for x in a_list),
                tuple((w.shape, w.stride(), w.dtype, w.get_device()) for w in b_list),
                out_dtype, alpha != 1.0, activation)  # fmt: skip
    except (AttributeError, TypeError):
        return None


class _ListPlan:
    """The launch of one list-call signature (see PLANS): ``run`` repeats list_launch's steps that
    depend on the tensors' data pointers, or returns None where an operand's pointer is not
    16-byte aligned (the cold call's fallback decides then)."""

    __slots__ = ("fn", "cfg", "odt", "total", "uniform", "shapes", "offsets", "c_offsets", "zero", "live", "srcs",
                 "out_bytes", "template", "words", "views", "max_clusters")  # fmt: skip

    def __init__(self, **fields):
        for name, value in fields.items():
            setattr(self, name, value)

    def run(self, a_list, b_list, alpha):
        a_ptrs, b_ptrs = [x.data_ptr() for x in a_list], [w.data_ptr() for w in b_list]
        if any(a_ptrs[g] % TMA_ALIGN_BYTES or b_ptrs[g] % TMA_ALIGN_BYTES for g in self.live):
            return None
        dev = a_list[0].device
        flat = torch.empty(self.total, dtype=self.odt, device=dev)
        outs = _output_views(flat, self.shapes, self.offsets, self.uniform)
        for g in self.zero:
            outs[g].zero_()
        base, rows = flat.data_ptr(), self.template[:]
        for g, (src, off) in enumerate(zip(self.srcs, self.c_offsets, strict=True)):
            rows[g * LIST_FIELDS : g * LIST_FIELDS + 3] = (a_ptrs[src], b_ptrs[src], base + off * self.out_bytes)
        return _launch(self.fn, self.cfg, rows, self.words, dev, a_list, b_list, outs, self.live[0], self.views,
                       alpha, self.max_clusters)  # fmt: skip


def _output_views(flat, shapes, offsets, uniform):
    """The groups' (M, N) outputs as views of ``flat`` (exactly their elements): one
    ``split_with_sizes`` of a 2-D view when every N is the same (host time: ~0.7 us per group, the
    Python ``Tensor.split`` wrapper costs ~0.5 us more per group), else one as_strided view each."""
    if uniform:
        return list(flat.view(-1, shapes[0][1]).split_with_sizes([m for m, _, _ in shapes]))
    return [flat.as_strided((m, n), (n, 1), off) for (m, n, _), off in zip(shapes, offsets, strict=True)]


def _launch(fn, cfg, rows, words, dev, a_list, b_list, outs, t, views, alpha, max_clusters):
    """The group table (its rows, then room for the descriptors the prep kernel writes: one
    device tensor) and the launch on the template group ``t``'s views. The table is copied from
    pageable memory: the copy returns once CUDA has staged the bytes (the array may go at once)
    and is ordered in the stream like any copy, with no pinned block to allocate and track (about
    17 us less per call than ``pin_memory()`` first on an H100 host). Never inside a capture:
    ``grouped_list`` takes the per-group route there. The dynamic scheduler's tile counter is the
    table's LIST_COUNTER word of its last row: zero as copied in-stream with the rows, so no fill
    kernel runs before the launch."""
    host = array.array("q", rows) + _zero_words(words - len(rows))  # the descriptors' space: zeros, overwritten
    table = torch.frombuffer(host, dtype=torch.int64).to(dev, non_blocking=True)
    workspace = None
    if cfg.scheduler == "dynamic":  # (1,) int32: the low half of the counter word (little-endian)
        workspace = table.view(torch.int32).as_strided((1,), (1,), 2 * (len(rows) - LIST_FIELDS + LIST_COUNTER))
    va, vb, vc = views
    # KernelArgs' LEADING fields (c, bias and beta unused), then its tail (gemm.args)
    fn(a_list[t].as_strided(*va), b_list[t].as_strided(*vb), outs[t].as_strided(*vc), None, None, float(alpha), 0.0,
       max_clusters, table, *(_NO_TAIL if workspace is None else KernelArgs(None, None, None, workspace=workspace).tail()))
    return outs


@functools.lru_cache(maxsize=64)
def _zero_words(n: int) -> array.array:
    """n zero int64 words (the table's descriptor space: 48 per group), made once per n."""
    return array.array("q", bytes(8 * n))


_NO_TAIL = KernelArgs(None, None, None).tail()  # every field after offs None: no scales, vectors or workspace


def _list_lds(shapes, strides, ptrs, unit_dim: int, align: int, live) -> list[int] | None:
    """Leading dimensions (elements) of 2-D operands read with dim ``unit_dim`` contiguous, or
    None when one cannot be (TMA: unit stride, 16-byte aligned base and leading stride). Groups
    not in ``live`` (no work: never read) get 0."""
    other = 1 - unit_dim
    lds = []
    for shape, stride, ptr, has_work in zip(shapes, strides, ptrs, live, strict=True):
        if not has_work:
            lds.append(0)
            continue
        if (shape[unit_dim] > 1 and stride[unit_dim] != 1) or ptr % TMA_ALIGN_BYTES:
            return None
        ld = stride[other] if shape[other] > 1 else -(-shape[unit_dim] // align) * align
        if ld % align or ld <= 0:
            return None
        lds.append(ld)
    return lds


@functools.lru_cache(maxsize=256)
def list_config(arch: str, num_sms: int, groups: int, total_m: int, n: int, k: int, dtype: str, out_dtype: str,
                a_major: str, b_major: str, alpha: bool, activation: str | None = None) -> GemmConfig:  # fmt: skip
    """The list-form kernel's config: the packed grouped policy's tile for ``groups`` groups of
    ``total_m`` rows in all and mean N, K (one CTA per tile: no cluster)."""
    problem = GemmProblem(max(total_m, 1), max(n, 1), max(k, 1), 1, dtype, dtype, out_dtype, a_major, b_major)
    epi = EpilogueSpec(alpha=alpha, activation=activation)
    cfg = policy_for(arch, num_sms).choose_grouped(problem, max(groups, 1), packed=False, epilogue=epi)
    return replace(cfg, form=Form.LISTED, cluster_m=1, cluster_n=1)


def list_table(shapes, a_ptrs, b_ptrs, c_ptrs, lds, tile_m: int, tile_n: int, template: int) -> list[int]:
    """The list-form kernel's group table (``schedulers.grouped.LIST_FIELDS`` int64 per group,
    then one row holding the total tile count), flattened. A group without work (M, N or K = 0)
    keeps the template group's operand pointers and leading dimensions (never read); a K = 0
    group owns no tiles (the caller zeroes its output)."""
    lda, ldb = lds
    row_pad = [0] * (LIST_FIELDS - LIST_TILE - 1)
    table, start = [], 0
    for g, (m, n, k) in enumerate(shapes):
        src = g if m and n and k else template
        c = c_ptrs[g] if m and n else c_ptrs[template]
        table += [a_ptrs[src], b_ptrs[src], c, m, n, k, lda[src], ldb[src], n, start, *row_pad]
        start += -(-m // tile_m) * -(-n // tile_n) if k else 0
    table += [0] * LIST_TILE + [start] + row_pad
    return table


_LIST_OUT = (torch.bfloat16, torch.float16, torch.float32)


def list_launch(a_list, b_list, out_dtype, alpha, config=None, flat=None, activation=None, shapes=None, plan_key=None):
    """The list-form kernel (sm_90a / sm_100a, bf16 / fp16): one launch (plus its descriptor prep kernel)
    for every group; the list of outputs, or None where it does not apply (another arch or
    dtype, operands TMA cannot read in place, groups with different majors, outputs whose rows
    are not 16-byte multiples, or a CUDA graph being captured: the group table is copied from
    the host per call), and the caller launches one dense GEMM per group then. ``flat``: the
    buffer the outputs are views of (tests poison it), else a new one. ``shapes``: (a shapes, b
    shapes) when the caller has read them already (chunks of many groups read them again). Host
    work per group: a few attribute reads and one table row; the table reaches the GPU by one
    stream-ordered copy (no sync)."""
    if not a_list:
        return []
    x0 = a_list[0]
    if not x0.is_cuda or x0.dtype not in (torch.bfloat16, torch.float16):
        return None
    odt = out_dtype or x0.dtype
    if odt not in _LIST_OUT or torch.cuda.is_current_stream_capturing():
        return None
    dev = x0.device
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    if {t.get_device() for t in a_list} | {t.get_device() for t in b_list} != {idx}:
        return None
    arch, num_sms = device_info(idx)
    if len(a_list) > GROUPED_MAX_GROUPS:  # the kernel's shared-memory tile table: chunks of groups
        outs = []
        for i in range(0, len(a_list), GROUPED_MAX_GROUPS):
            part = list_launch(a_list[i : i + GROUPED_MAX_GROUPS], b_list[i : i + GROUPED_MAX_GROUPS], out_dtype, alpha,
                                activation=activation)  # fmt: skip
            if part is None:
                return None
            outs += part
        return outs
    a_shapes, b_shapes = shapes or ([t.shape for t in a_list], [t.shape for t in b_list])
    shapes = [(sa[0], sb[1], sa[1]) for sa, sb in zip(a_shapes, b_shapes, strict=True)]
    out_bytes = 4 if odt == torch.float32 else 2
    sizes = [m * n for m, n, _ in shapes]
    total = sum(sizes)
    flat = torch.empty(total, dtype=odt, device=dev) if flat is None else flat
    offsets, o = [], 0
    for size in sizes:
        offsets.append(o)
        o += size
    n0 = shapes[0][1]
    uniform = bool(n0) and all(n == n0 for _, n, _ in shapes)
    outs = _output_views(flat[:total], shapes, offsets, uniform)  # (the cold call: a given flat may be longer)
    has_work = [bool(m and n and k) for m, n, k in shapes]
    live = [g for g, w in enumerate(has_work) if w]
    for g, (m, n, k) in enumerate(shapes):
        if m and n and not k:  # a K = 0 product: zeros (the kernel gives such a group no tiles)
            outs[g].zero_()
    if not live:
        return outs
    if any(n * out_bytes % TMA_ALIGN_BYTES for _, n, _ in shapes):
        return None
    t = live[0]
    # Majors from the template group (the first with work): A (M, K) K- or M-contiguous, B (K, N)
    # N- or K-contiguous; every group must be readable the same way.
    a_strides, b_strides = [x.stride() for x in a_list], [w.stride() for w in b_list]
    a_ptrs, b_ptrs = [x.data_ptr() for x in a_list], [w.data_ptr() for w in b_list]
    align = TMA_ALIGN_BYTES // x0.element_size()
    sa, sb = a_strides[t], b_strides[t]
    a_major = "k" if a_shapes[t][1] <= 1 or sa[1] == 1 else "m"
    b_major = "n" if b_shapes[t][1] <= 1 or sb[1] == 1 else "k"
    lda = _list_lds(a_shapes, a_strides, a_ptrs, 1 if a_major == "k" else 0, align, has_work)
    ldb = _list_lds(b_shapes, b_strides, b_ptrs, 1 if b_major == "n" else 0, align, has_work)
    if lda is None or ldb is None:
        return None
    dtype, out_name = INPUT_TO_NAME[x0.dtype], TORCH_TO_NAME[odt]
    if config is None:
        m_live = sum(shapes[g][0] for g in live)
        n_mean, k_mean = sum(shapes[g][1] for g in live) // len(live), sum(shapes[g][2] for g in live) // len(live)
        cfg = list_config(arch, num_sms, len(live), m_live, n_mean, k_mean, dtype, out_name, a_major, b_major,
                          alpha != 1.0, activation)  # fmt: skip
    else:
        cfg = config
    if alpha != 1.0 and not cfg.epilogue.alpha:
        cfg = replace(cfg, epilogue=replace(cfg.epilogue, alpha=True))
    if cfg.epilogue.activation != activation:
        raise ValueError(f"config {cfg.name} has activation {cfg.epilogue.activation!r}, the call {activation!r}")
    if not cfg.listed or (cfg.a_major, cfg.b_major, cfg.a_dtype, cfg.out_dtype) != (a_major, b_major, dtype, out_name):
        raise ValueError(f"config {cfg.name} cannot run this list call (form=Form.LISTED, majors {a_major}{b_major}, "
                         f"{dtype} -> {out_name})")  # fmt: skip
    base = flat.data_ptr()
    c_ptrs = [base + off * out_bytes for off in offsets]
    rows = list_table(shapes, a_ptrs, b_ptrs, c_ptrs, (lda, ldb), cfg.tile_m, cfg.tile_n, t)
    # One device buffer: the table's rows, then the descriptors the prep kernel writes (3 x 128
    # bytes per group).
    words = len(rows) + len(shapes) * 3 * 16
    views = (kernel_view(a_list[t].unsqueeze(0), 2 if a_major == "k" else 1, (1, 2, 0), "a"),
             kernel_view(b_list[t].unsqueeze(0), 2 if b_major == "n" else 1, (2, 1, 0), "b"),
             kernel_view(outs[t].unsqueeze(0), 2, (1, 2, 0), "out"))  # fmt: skip
    # CLC (sm_100a): one cluster per tile, so the grid is the table's tile count (host-known).
    max_clusters = max(1, rows[len(shapes) * LIST_FIELDS + LIST_TILE]) if cfg.scheduler == "clc" else num_sms
    fn = DENSE_CACHE.get(cfg)
    if plan_key is not None and config is None:
        # the rows with the template group's pointers where a group has no work (list_table)
        srcs = [g if m and n and k else t for g, (m, n, k) in enumerate(shapes)]
        c_offsets = [off if m and n else offsets[t] for (m, n, _), off in zip(shapes, offsets, strict=True)]
        while len(PLANS) >= MAX_PLANS:
            PLANS.pop(next(iter(PLANS)))
        PLANS[plan_key] = _ListPlan(
            fn=fn, cfg=cfg, odt=odt, total=total, uniform=uniform, shapes=shapes, offsets=offsets, c_offsets=c_offsets,
            zero=[g for g, (m, n, k) in enumerate(shapes) if m and n and not k], live=live, srcs=srcs,
            out_bytes=out_bytes, template=rows, words=words, views=views, max_clusters=max_clusters,
        )  # fmt: skip
    return _launch(fn, cfg, rows, words, dev, a_list, b_list, outs, t, views, alpha, max_clusters)
