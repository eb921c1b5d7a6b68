"""The one argument list of every GEMM kernel (dense, grouped, K-grouped, list, FP8, block-scaled,
both archs): :class:`KernelArgs`, its fields in the order of the kernels' ``__call__``. Launches
build it by name (an operand added to the kernels is added here and where it is passed, nowhere
else), and the fake (symbolic) arguments that compile a config are built from the same fields.

Fake arguments: one compiled kernel serves every M, N, K, L and stride of a config. Shapes and
non-unit strides are dynamic; the unit stride encodes the operand's major mode, and the declared
stride divisibility is TMA's 16-byte rule, checked again by the TVM-FFI call."""

from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

from ..config import ELEMENT_BITS, TMA_ALIGN_BYTES, GemmConfig
from ..runtime.dtypes import CUTLASS_DTYPES, SF_DTYPES


class KernelArgs(NamedTuple):
    """A GEMM launch's arguments, by name. ``tuple(args)`` is what the compiled kernel takes (the
    stream is the caller's current one, TVM-FFI's environment stream); ``compile_args(stream)``
    what ``cute.compile`` takes. Inputs a config does not use stay None (compiled as constants)."""

    a: object  # (M, K, L) view of A (flat launches: the caller's (M, K))
    b: object  # (N, K, L) view of B
    out: object  # (M, N, L) view of the output (gated: N / 2 columns; swap AB: (N, M, 1))
    c: object = None  # (M, N, L) residual of beta * C
    bias: object = None  # (N,) bias
    alpha: object = 1.0  # fp32 scalar
    beta: object = 0.0  # fp32 scalar
    max_clusters: object = 1  # persistent grid size cap (clusters)
    offs: object = None  # grouped: (E,) int32 cumulative ends; list form: the group table
    sfa: object = None  # A's scales: block-scaled bytes, FP8 1x128 blocks, MX emulation
    sfb: object = None  # B's scales
    out_scales: object = None  # quantized output: its 128x4 swizzled scale bytes
    out_global_scale: object = None  # quantized NVFP4 output: (1,) fp32 global scale
    v0: object = None  # epilogue vectors: user epilogue inputs, FP8 row / column scales,
    v1: object = None  # the block-scaled NVFP4 global-scale product (v0)
    v2: object = None
    v3: object = None
    workspace: object = None  # dynamic scheduler counter / split-K counters and partial sums
    a_index: object = None  # gather_a: (packed rows,) int32 row of A per packed row
    preact: object = None  # epilogue.preact (sm_90a): (M, N, L) view of the values before the gate

    def compile_args(self, stream) -> tuple:
        """The arguments of ``cute.compile``: the kernels take the stream after ``max_clusters``."""
        return (*self[:8], stream, *self[8:])

    def tail(self) -> tuple:
        """The fields after ``offs``: the warm fast paths build them once per plan by name and pass
        the nine ``LEADING`` fields in front of them per call."""
        return tuple(self[len(LEADING):])


# What a warm fast path passes per call, in front of a plan's ``KernelArgs.tail()``.
LEADING = ("a", "b", "out", "c", "bias", "alpha", "beta", "max_clusters", "offs")
assert KernelArgs._fields[: len(LEADING)] == LEADING
_V0 = KernelArgs._fields.index("v0") - len(LEADING)  # v0 (then v1) in a plan's tail
assert KernelArgs._fields[len(LEADING) + _V0 + 1] == "v1"


def scaled_tail(tail: tuple, scale_b_shape) -> tuple:
    """What an FP8 row-wise warm call needs of a plan's tail: (the fields before v0, those after
    v1, scale_b's 1-D view shape); the call passes the scales' views as v0 / v1 between them."""
    return tail[:_V0], tail[_V0 + 2 :], scale_b_shape



def _fake_matrix(dtype: str, unit_mode: int):
    """A (rows, cols, L) tensor whose mode ``unit_mode`` (0 or 1) has stride 1."""
    div = 8 * TMA_ALIGN_BYTES // ELEMENT_BITS[dtype]
    shape = [cute.sym_int32(), cute.sym_int32(), cute.sym_int32()]
    if ELEMENT_BITS[dtype] < 8:  # packed sub-byte elements: the unit mode holds whole bytes
        shape[unit_mode] = cute.sym_int32(divisibility=8 // ELEMENT_BITS[dtype])
    shape = tuple(shape)
    stride = [cute.sym_int64(divisibility=div), cute.sym_int64(divisibility=div), cute.sym_int64(divisibility=div)]
    stride[unit_mode] = 1
    return make_fake_tensor(CUTLASS_DTYPES[dtype], shape, tuple(stride), assumed_align=TMA_ALIGN_BYTES)


def _fake_matrix2(dtype: str, unit_mode: int):
    """A 2-D (rows, cols) tensor whose mode ``unit_mode`` has stride 1 (flat launches)."""
    div = 8 * TMA_ALIGN_BYTES // ELEMENT_BITS[dtype]
    stride = [cute.sym_int64(divisibility=div), cute.sym_int64(divisibility=div)]
    stride[unit_mode] = 1
    return make_fake_tensor(
        CUTLASS_DTYPES[dtype], (cute.sym_int32(), cute.sym_int32()), tuple(stride), assumed_align=TMA_ALIGN_BYTES
    )


def _fake_vector(dtype: str):
    """A contiguous (N,) tensor."""
    return make_fake_tensor(CUTLASS_DTYPES[dtype], (cute.sym_int32(),), (1,), assumed_align=TMA_ALIGN_BYTES)


def dense_fake_args(cfg: GemmConfig, offs=None):
    """The fake :class:`KernelArgs` of ``cfg`` as ``cute.compile`` takes them (with the stream).
    Inputs the config does not use are ``None``: compiled as constants, the launch passes ``None``
    in their place."""
    epi = cfg.epilogue
    if cfg.flat:  # torch's own orientation: A (M, K), B (K, N), C (M, N)
        a = _fake_matrix2(cfg.a_dtype, 1 if cfg.a_major == "k" else 0)
        b = _fake_matrix2(cfg.b_dtype, 0 if cfg.b_major == "k" else 1)
        c = _fake_matrix2(cfg.out_dtype, 1)
    elif cfg.swap_ab:  # C^T = B^T A^T: the weights (N, K, E), the tokens (total_M, K, 1), C (N, total_M, 1)
        a = _fake_matrix(cfg.b_dtype, 1 if cfg.b_major == "k" else 0)
        b = _fake_matrix(cfg.a_dtype, 1)
        c = _fake_matrix(cfg.out_dtype, 0)
    else:
        a = _fake_matrix(cfg.a_dtype, 1 if cfg.a_major == "k" else 0)
        b = _fake_matrix(cfg.b_dtype, 1 if cfg.b_major == "k" else 0)
        c = _fake_matrix(cfg.out_dtype, 0 if cfg.c_major == "m" else 1)
    c_in = _fake_matrix(epi.c_dtype, 1) if epi.beta else None
    bias = _fake_vector(epi.bias_dtype) if epi.bias else None
    sfa = sfb = None
    if cfg.blockscaled:
        sfa, sfb = _fake_scales(cfg.sf_dtype), _fake_scales(cfg.sf_dtype)
    elif cfg.fp8_blockwise:
        # sfb_cols: scale_b (N, ceil(K/128)) per column, N-major, TMA-loaded like scale_a's layout
        sfa, sfb = _fake_block_scale_a(), _fake_block_scale_a() if cfg.sfb_cols else _fake_block_scales(3 if cfg.grouped else 2)
    elif cfg.fp8_mx:
        sfa, sfb = _fake_mx_scales(k_major=True), _fake_mx_scales(k_major=False)
    out_scales, out_gs, *vecs = epilogue_fake_args(epi)
    a_index = None
    if cfg.gathers:  # (packed rows or K positions,) int32; the gathered rows are read 16 bytes at a time
        a_index = make_fake_tensor(cutlass.Int32, (cute.sym_int32(),), (1,), assumed_align=4)
    args = KernelArgs(
        a, b, out=c, c=c_in, bias=bias, alpha=cutlass.Float32(1.0), beta=cutlass.Float32(0.0),
        max_clusters=cutlass.Int32(1), offs=offs, sfa=sfa, sfb=sfb, out_scales=out_scales,
        out_global_scale=out_gs, v0=vecs[0], v1=vecs[1], v2=vecs[2], v3=vecs[3], workspace=_fake_workspace(cfg),
        a_index=a_index, preact=_fake_matrix(cfg.out_dtype, 1) if epi.preact else None,
    )  # fmt: skip
    return args.compile_args(make_fake_stream(use_tvm_ffi_env_stream=True))


def _fake_workspace(cfg: GemmConfig):
    """Scheduler "dynamic": the (1,) int32 tile counter (the last kernel argument); split K: the
    int32 counters and slots of ``gemm.sm90.split`` (not with ``split_cluster``); sm_100a
    K-grouped: the group table; else None."""
    if cfg.split_k > 1 and not cfg.split_cluster:
        return make_fake_tensor(cutlass.Int32, (cute.sym_int32(),), (1,), assumed_align=16)
    if cfg.kgrouped and cfg.arch == "sm_100a":  # the list-form group table the kernel writes from offs
        return fake_list_table()
    if cfg.scheduler != "dynamic":
        return None
    return make_fake_tensor(cutlass.Int32, (1,), (1,), assumed_align=4)


def epilogue_fake_args(epi):
    """(scale bytes of a quantized output | None, (1,) fp32 NVFP4 global scale | None, user
    epilogue vectors v0..v3 | None): the last kernel arguments, in this order."""
    sf = gs = None
    if epi.quant is not None:
        sf = make_fake_tensor(cutlass.Uint8 if epi.quant != "nvfp4" else cutlass.Float8E4M3FN,
                              (cute.sym_int32(),), (1,), assumed_align=TMA_ALIGN_BYTES)  # fmt: skip
        if epi.quant == "nvfp4":
            gs = make_fake_tensor(cutlass.Float32, (1,), (1,), assumed_align=4)
    vecs = [_fake_vector(d) for d in epi.user_args]
    if epi.scale_a or epi.scale_b:  # FP8 scales: v0 = scale_a, v1 = scale_b (fp32)
        vecs = [_fake_vector("fp32") if epi.scale_a else None, _fake_vector("fp32") if epi.scale_b else None]
    vecs += [None] * (4 - len(vecs))
    return (sf, gs, *vecs)


def _fake_scales(sf_dtype: str):
    """Block-scaled scale factors: the contiguous bytes of the 128x4 swizzled layout (a flat
    (bytes,) tensor; the kernel views it in the scale-factor atom layout over A's / B's shape)."""
    return make_fake_tensor(SF_DTYPES[sf_dtype], (cute.sym_int32(),), (1,), assumed_align=TMA_ALIGN_BYTES)


def _fake_block_scale_a():
    """FP8 block scaling (sm_90a, config.fp8_blockwise): mSFA (M, ceil(K/128)) fp32 per 1x128
    block of A's rows, M-major (unit stride along M, as torch._scaled_mm), the K-block stride a
    multiple of 4 (16 bytes): TMA-loaded into every stage beside A (``fp8_args.tma_scale_a``)."""
    return make_fake_tensor(
        cutlass.Float32,
        (cute.sym_int32(), cute.sym_int32()),
        (1, cute.sym_int64(divisibility=4)),
        assumed_align=TMA_ALIGN_BYTES,
    )


def _fake_block_scales(dims: int):
    """FP8 block scaling (sm_90a, config.fp8_blockwise): mSFB, fp32 with dynamic shape and every
    stride dynamic (any layout): (ceil(N/128), ceil(K/128)) per 128x128 block of B (the
    transposed view of torch's (ceil(K/128), ceil(N/128)) scale_b); grouped: (ceil(N/128),
    ceil(K/128), E), the permuted view of (E, ceil(K/128), ceil(N/128)). Read element-wise by
    the consumer warps."""
    return make_fake_tensor(
        cutlass.Float32,
        tuple(cute.sym_int32() for _ in range(dims)),
        tuple(cute.sym_int64() for _ in range(dims)),
        assumed_align=4,
    )


def _fake_mx_scales(k_major: bool):
    """MXFP8 emulation (sm_90a, config.fp8_mx): fp32 scales, 3-D with dynamic shape, TMA-loaded.
    mSFA (M, Kb, L) with unit stride along Kb (K blocks, a multiple of 4); mSFB (Np, Kb, L) with
    unit stride along Np (the columns, permuted and padded per tile; see ``blockscaled.sm90_mx``)."""
    shape = (cute.sym_int32(), cute.sym_int32(), cute.sym_int32())
    if k_major:
        stride = (cute.sym_int64(divisibility=4), 1, cute.sym_int64(divisibility=4))
    else:
        stride = (1, cute.sym_int64(divisibility=4), cute.sym_int64(divisibility=4))
    return make_fake_tensor(cutlass.Float32, shape, stride, assumed_align=TMA_ALIGN_BYTES)


def fake_offs():
    """offs (E,) int32: cumulative ends of the experts' rows (grouped) or K slices (kgrouped)."""
    return make_fake_tensor(cutlass.Int32, (cute.sym_int32(),), (1,), assumed_align=4)


def fake_list_table():
    """The list form's group table: LIST_FIELDS int64 per group and one more row
    (``schedulers.grouped``), then the groups' descriptors (``gemm.grouped_parts``), 128-byte
    aligned."""
    return make_fake_tensor(cutlass.Int64, (cute.sym_int32(),), (1,), assumed_align=128)


def grouped_fake_args(cfg: GemmConfig):
    """Dense args + offs (E,) int32: A is the packed (total_M, K, 1), B (N, K, E), C (total_M, N, 1)."""
    return dense_fake_args(cfg, offs=fake_offs())
