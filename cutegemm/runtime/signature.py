"""Fake (symbolic) kernel arguments: one compiled kernel serves every M, N, K, L and stride of a
config. Shapes and non-unit strides are dynamic; the unit stride encodes the operand's major mode,
and the declared stride divisibility is TMA's 16-byte rule, checked again by the TVM-FFI call."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

from ..config import ELEMENT_BITS, TMA_ALIGN_BYTES, GemmConfig
from .dtypes import CUTLASS_DTYPES, SF_DTYPES


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
    """(mA (M,K,L), mB (N,K,L), mC (M,N,L), mCin (M,N,L) | None, mBias (N,) | None, alpha, beta,
    max_clusters, stream, mOffs | None) for ``cute.compile``. Epilogue inputs the spec does not use are
    ``None``: compiled as constants, the caller passes ``None`` in their place."""
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
        c = _fake_matrix(cfg.out_dtype, 1)
    c_in = _fake_matrix(epi.c_dtype, 1) if epi.beta else None
    bias = _fake_vector(epi.bias_dtype) if epi.bias else None
    args = (
        a, b, c, c_in, bias,
        cutlass.Float32(1.0), cutlass.Float32(0.0), cutlass.Int32(1),
        make_fake_stream(use_tvm_ffi_env_stream=True), offs,
    )  # fmt: skip
    if cfg.blockscaled:
        args += (_fake_scales(cfg.sf_dtype), _fake_scales(cfg.sf_dtype))
    elif cfg.fp8_blockwise:
        args += (_fake_block_scale_a(), _fake_block_scales(3 if cfg.grouped else 2))
    elif cfg.fp8_mx:
        args += (_fake_mx_scales(k_major=True), _fake_mx_scales(k_major=False))
    else:
        args += (None, None)
    return args + epilogue_fake_args(epi) + (_fake_workspace(cfg),)


def _fake_workspace(cfg: GemmConfig):
    """Scheduler "dynamic": the (1,) int32 tile counter (the last kernel argument); split K: the
    int32 counters and slots of ``gemm.sm90_split`` (not with ``split_cluster``); else None."""
    if cfg.split_k > 1 and not cfg.split_cluster:
        return make_fake_tensor(cutlass.Int32, (cute.sym_int32(),), (1,), assumed_align=16)
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
    (``schedulers.grouped``), then the groups' descriptors (``grouped.kernel_parts``), 128-byte
    aligned."""
    return make_fake_tensor(cutlass.Int64, (cute.sym_int32(),), (1,), assumed_align=128)


def grouped_fake_args(cfg: GemmConfig):
    """Dense args + offs (E,) int32: A is the packed (total_M, K, 1), B (N, K, E), C (total_M, N, 1)."""
    return dense_fake_args(cfg, offs=fake_offs())
