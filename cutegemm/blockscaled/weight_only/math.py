"""The register math of the FP4-weight kernel (:mod:`cutegemm.blockscaled.weight_only.kernel`) and its
torch twins: e2m1 -> bf16 by shifts and masks plus one or two packed bf16 multiplies by the
block's scale factor, the scale-factor decodes (NVFP4 e4m3, MXFP4 e8m0), the ``mma.sync``
m16n8k16 wrapper, the activations' pairing with the weights (four PRMTs in the ring, or the
host-side reorder into the per-thread pipelines' fragment order). The
twins reproduce the kernel's arithmetic bit for bit on torch tensors (the CPU tests check them
against ``dequantize_ref``)."""

from __future__ import annotations

import cutlass
import torch
from cutlass.cutlass_dsl import dsl_user_op

from ...runtime.ptx import V4, asm, i32

CHUNK_K = 128  # K values per thread-row step (4 threads x 32 values)
_BF16X2_2P126 = 0x7E807E80  # bf16x2 (2**126, 2**126)
_F32_2P118 = "0f7A800000"  # fp32 2**118 as a PTX immediate


# (mag shift, sign shift) of word i: nibble i's magnitude -> bf16 bits 6-8, its sign -> bit 15
# (and nibble i + 4's -> bits 22-24 / 31). A negative shift is a right shift.
_WORD_SHIFTS = ((6, 12), (2, 8), (-2, 4), (-6, 0))


def _shift_ptx(dst: str, src: str, s: int) -> str:
    if s > 0:
        return f"shl.b32 {dst}, {src}, {s};"
    if s < 0:
        return f"shr.b32 {dst}, {src}, {-s};"
    return f"mov.b32 {dst}, {src};"


# Word i's two nibbles as placed for the multiply below: words 0 / 2 take the nibbles at bits 0-3
# and 16-19 (of w / of w >> 8), words 1 / 3 those at bits 4-7 and 20-23.
_WORD_MASKS = (0x000F000F, 0x00F000F0)
# Multiplying the masked word by (2**a + 2**b) writes each nibble twice, at disjoint bit ranges
# (no carries): once shifted so its magnitude lands on bf16 bits 6-8 (22-24), once so its sign
# lands on bit 15 (31); the output mask keeps exactly those bits.
_WORD_MULS = ((1 << 6) + (1 << 12), (1 << 2) + (1 << 8))
_OUT_MASK = 0x81C081C0


def _dequant_ptx(two_muls: bool) -> str:
    """Per output word: one AND, one integer multiply by a constant (two shifted copies of the
    nibbles, IMAD), one AND, the bf16x2 multiply; words 2 and 3 read w >> 8 (one shift for
    both). The same bits as the shift-and-mask form of :func:`dequant_words_ref`."""
    lines = ["{", ".reg .b32 x, h;", "shr.b32 h, $4, 8;"]
    if two_muls:
        lines += [".reg .b32 t, c;", f"mov.b32 c, {_BF16X2_2P126:#x};"]
    for i in range(4):
        src = "$4" if i < 2 else "h"
        lines += [
            f"and.b32 x, {src}, {_WORD_MASKS[i % 2]:#x};",
            f"mul.lo.u32 x, x, {_WORD_MULS[i % 2]:#x};",
            f"and.b32 x, x, {_OUT_MASK:#x};",
        ]
        if two_muls:
            lines += ["mul.rn.bf16x2 t, x, c;", f"mul.rn.bf16x2 ${i}, t, $5;"]
        else:
            lines.append(f"mul.rn.bf16x2 ${i}, x, $5;")
    lines.append("}")
    return "\n".join(lines)


_DQ_ONE = _dequant_ptx(False)
_DQ_TWO = _dequant_ptx(True)


@dsl_user_op
def dequant_fp4x8(word, factor, two_muls: bool, *, loc=None, ip=None):
    """8 e2m1 nibbles (k0..k7, k0 in the low bits) -> 4 bf16x2 words ``(k_i, k_{i+4}) * c``:
    ``c = factor * 2**-126`` (one multiply) or ``factor`` (two_muls: by 2**126, then factor)."""
    ptx = _DQ_TWO if two_muls else _DQ_ONE
    return asm(ptx, [i32(word, loc, ip), i32(factor, loc, ip)], "=r,=r,=r,=r,r,r", 4, loc=loc, ip=ip)


def _dequant_byte_ptx(two_muls: bool) -> str:
    """A byte's two nibbles (K order: low nibble first) -> one bf16x2 word: PRMT picks the byte
    (selector register: byte index + 0x4440, zeros elsewhere), a multiply by 0x1001 puts its
    high nibble 16 bits above the low one, then the steps of :func:`dequant_fp4x8`."""
    lines = ["{", ".reg .b32 x, z;", "mov.b32 z, 0;", "prmt.b32 x, $1, z, $2;", "mul.lo.u32 x, x, 0x1001;",
             f"and.b32 x, x, {_WORD_MASKS[0]:#x};", f"mul.lo.u32 x, x, {_WORD_MULS[0]:#x};",
             f"and.b32 x, x, {_OUT_MASK:#x};"]  # fmt: skip
    if two_muls:
        lines += [".reg .b32 c;", f"mov.b32 c, {_BF16X2_2P126:#x};", "mul.rn.bf16x2 x, x, c;"]
    lines += ["mul.rn.bf16x2 $0, x, $3;", "}"]
    return "\n".join(lines)


_DQB_ONE = _dequant_byte_ptx(False)
_DQB_TWO = _dequant_byte_ptx(True)


@dsl_user_op
def dequant_fp4_byte(word, selector, factor, two_muls: bool, *, loc=None, ip=None):
    """Byte ``selector - 0x4440`` of ``word`` (two e2m1 values, K in order) -> the bf16x2 word
    ``(k_lo, k_hi) * c`` (``c`` as in :func:`dequant_fp4x8`): natural K pairs, the A fragment
    the WGMMA kernel reads against activations in K order."""
    ptx = _DQB_TWO if two_muls else _DQB_ONE
    ins = [i32(word, loc, ip), i32(selector, loc, ip), i32(factor, loc, ip)]
    return asm(ptx, ins, "=r,r,r,r", 1, loc=loc, ip=ip)


# --- 8-bit weights (MXFP8 e4m3) -----------------------------------------------------------------
FP8_CHUNK_K = 64  # K values per thread-row step of 8-bit weights (4 threads x 16 values, 64 bytes)
_BF16X2_2P120 = 0x7B807B80  # bf16x2 (2**120, 2**120)
_E4M3_LOW7 = 0x7F7F7F7F
_E4M3_ONES = 0x01010101
WORD_NAN_MASK = 0x80808080  # the flags' bits of :func:`e4m3_nan_flags`

# An e4m3 byte's low 7 bits at bf16 bits 4-10 and its sign at bit 15: the bf16 value is the e4m3
# value times 2**-120 (exponent field 0..15 of 255, so e4m3 subnormals are bf16 subnormals). PRMT
# with sign replication spreads bytes (b0, b1) into the halves as [sign(b1)][b1][sign(b0)][b0];
# one shift by 4 and one mask keep exactly those bits.
_DQ8 = (
    "{\n.reg .b32 x, y, z, c;\n"
    "mov.b32 z, 0;\n"
    f"mov.b32 c, {_BF16X2_2P120:#x};\n"
    "prmt.b32 x, $2, z, 0x9180;\n"
    "prmt.b32 y, $2, z, 0xB3A2;\n"
    "shl.b32 x, x, 4;\nshl.b32 y, y, 4;\n"
    "and.b32 x, x, 0x87F087F0;\nand.b32 y, y, 0x87F087F0;\n"
    "mul.rn.bf16x2 x, x, c;\nmul.rn.bf16x2 y, y, c;\n"
    "mul.rn.bf16x2 $0, x, $3;\nmul.rn.bf16x2 $1, y, $3;\n}"
)


@dsl_user_op
def dequant_e4m3x4(word, factor, *, loc=None, ip=None):
    """4 e4m3 bytes (k0..k3, k0 in the low byte) -> 2 bf16x2 words ``(k0, k1) * f``, ``(k2, k3) * f``
    with ``f`` the block's scale factor (:func:`mx_factor_bf16x2`): the
    placed bytes (the e4m3 value x 2**-120) times 2**120 (exact), then times the factor (no
    intermediate over- or underflow; the one rounding is the product's). The e4m3 NaN code
    (0x7F / 0xFF) becomes a finite value here: :func:`e4m3_nan_flags` finds it."""
    return asm(_DQ8, [i32(word, loc, ip), i32(factor, loc, ip)], "=r,=r,r,r", 2, loc=loc, ip=ip)


_DQ8_PAIR = (
    "{\n.reg .b32 x, c;\n"
    "prmt.b32 x, $2, $3, $4;\n"
    "shl.b32 x, x, 4;\nand.b32 x, x, 0x87F087F0;\n"
    "add.u32 c, x, 0x00100010;\nor.b32 $1, $6, c;\n"  # a NaN's 0x7F at bits 4-10 carries into bit 11
    f"mov.b32 c, {_BF16X2_2P120:#x};\n"
    "mul.rn.bf16x2 x, x, c;\nmul.rn.bf16x2 $0, x, $5;\n}"
)
PAIR_NAN_MASK = 0x08000800  # the flags' bits of :func:`dequant_e4m3_pair`


def e4m3_pair_selector(i: int):
    """PRMT selector of :func:`dequant_e4m3_pair` for bytes ``i``, ``i + 1`` (i = 0..6) of the two
    words: [sign(b_i+1)][b_i+1][sign(b_i)][b_i] (a selector nibble's bit 3 replicates the sign)."""
    return i | ((8 | i) << 4) | ((i + 1) << 8) | ((8 | (i + 1)) << 12)


@dsl_user_op
def dequant_e4m3_pair(lo, hi, selector, factor, flags, *, loc=None, ip=None):
    """Bytes ``i``, ``i + 1`` of the 8-byte pool (``lo``: bytes 0-3, ``hi``: 4-7; ``selector`` from
    :func:`e4m3_pair_selector`) -> (the bf16x2 word of their e4m3 values times ``factor``, the
    NaN flags): the placement and the two multiplies of :func:`dequant_e4m3x4` for one pair
    (natural K order: the A fragment the WGMMA consumers read against activations in K order);
    ``flags | (placed + 0x00100010)``, whose PAIR_NAN_MASK bits are set once a pair held an e4m3
    NaN (its low 7 bits, all ones at bits 4-10 of a half, carry into bit 11; nothing else does)."""
    ins = [i32(v, loc, ip) for v in (lo, hi, selector, factor, flags)]
    return asm(_DQ8_PAIR, ins, "=r,=r,r,r,r,r,r", 2, loc=loc, ip=ip)


@dsl_user_op
def e4m3_nan_flags(word, flags, *, loc=None, ip=None):
    """``flags | ((word & 0x7F7F7F7F) + 0x01010101)``: bit 7 of a byte of the result is set once a
    byte there was an e4m3 NaN (low 7 bits all ones; the add never carries between bytes). Test
    ``flags & WORD_NAN_MASK`` at the end."""
    ptx = f"{{\n.reg .b32 x;\nand.b32 x, $1, {_E4M3_LOW7:#x};\nadd.u32 x, x, {_E4M3_ONES:#x};\nor.b32 $0, $2, x;\n}}"
    return asm(ptx, [i32(word, loc, ip), i32(flags, loc, ip)], "=r,r,r", 1, loc=loc, ip=ip)


_NVFP4_FACTORS = (
    "{\n.reg .b32 h;\n.reg .b16 p, lo, hi;\n.reg .f32 f0, f1;\n"
    "cvt.u16.u32 p, $2;\n"
    "cvt.rn.f16x2.e4m3x2 h, p;\n"
    "mov.b32 {lo, hi}, h;\n"
    "cvt.f32.f16 f0, lo;\ncvt.f32.f16 f1, hi;\n"
    f"mul.f32 f0, f0, {_F32_2P118};\nmul.f32 f1, f1, {_F32_2P118};\n"
    "cvt.rn.bf16x2.f32 $0, f0, f0;\ncvt.rn.bf16x2.f32 $1, f1, f1;\n}"
)


@dsl_user_op
def nvfp4_factors(pair, *, loc=None, ip=None):
    """Two e4m3 scale bytes (low byte first) -> two bf16x2 words, each ``(s * 2**118)`` twice."""
    return asm(_NVFP4_FACTORS, [i32(pair, loc, ip)], "=r,=r,r", 2, loc=loc, ip=ip)


_PAIRS = (
    "prmt.b32 $0, $4, $6, 0x5410;\nprmt.b32 $1, $4, $6, 0x7632;\n"
    "prmt.b32 $2, $5, $7, 0x5410;\nprmt.b32 $3, $5, $7, 0x7632;"
)


@dsl_user_op
def pair_natural_x(words, *, loc=None, ip=None):
    """4 words of 8 bf16 activations in K order ((x0, x1), (x2, x3), (x4, x5), (x6, x7)) ->
    the dequantized weights' pairing ((x0, x4), (x1, x5), (x2, x6), (x3, x7)): four PRMTs."""
    return asm(_PAIRS, [i32(w, loc, ip) for w in words], "=r,=r,=r,=r,r,r,r,r", 4, loc=loc, ip=ip)


@dsl_user_op
def mma_bf16_16816(a, b, c, *, loc=None, ip=None):
    """``mma.sync.m16n8k16`` bf16 x bf16 -> fp32: a 4 words, b 2 words, c 4 fp32; returns d."""
    ins = [i32(v, loc, ip) for v in (*a, *b)] + [cutlass.Float32(v).ir_value(loc=loc, ip=ip) for v in c]
    ptx = f"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {V4}, {{$4, $5, $6, $7}}, {{$8, $9}}, {{$10, $11, $12, $13}};"
    return asm(ptx, ins, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", 4, out=cutlass.Float32, loc=loc, ip=ip)


def mx_factor_bf16x2(e):
    """e8m0 byte -> the bf16x2 word of 2**(e - 127) in both halves (e = 0: the subnormal
    2**-127; 255: NaN): the packed scale factor of the MX dequantizations."""
    sel = cutlass.select_
    f = sel(e == 0, cutlass.Int32(0x40), sel(e == 255, cutlass.Int32(0x7FC0), e << 7))
    return f | (f << 16)


def fragment_order_x(x: torch.Tensor) -> torch.Tensor:
    """(rows, K) bf16 (or float8_e4m3fn: converted to bf16, exactly) activations -> the kernel's
    fragment order, zero-padded to whole 128-wide K chunks: a bf16 (K_p / 128 * 4, rows, 4, 8)
    tensor whose [4 c + j, m, t] holds token m's K values 128 c + 32 t + 8 j + (0, 4, 1, 5, 2, 6,
    3, 7). One LDG.128 of a warp then reads 512 contiguous bytes (8 tokens x 4 threads), already
    paired as the B fragments want. One copy kernel (the cast included)."""
    rows, k = x.shape
    kp = -(-k // CHUNK_K) * CHUNK_K
    if kp != k:
        x = torch.nn.functional.pad(x.view(torch.uint8) if x.element_size() == 1 else x, (0, kp - k))
        x = x.view(torch.float8_e4m3fn) if x.dtype == torch.uint8 else x
    v = x.reshape(rows, kp // CHUNK_K, 4, 4, 2, 4)  # (m, c, t, j, half, i): K = 128c + 32t + 8j + 4half + i
    out = torch.empty(kp // CHUNK_K, 4, rows, 4, 4, 2, dtype=torch.bfloat16, device=x.device)  # ints: cheaper than a tuple
    out.copy_(v.permute(1, 3, 0, 2, 5, 4))
    return out.view(kp // CHUNK_K * 4, rows, 4, 8)


# --- torch twin of the register math (CPU tests check it against dequantize_ref) ---------------
def _bf16_pair_ref(bits: torch.Tensor) -> torch.Tensor:
    """(..., 2) fp32 values of bf16x2 words (int64 tensors holding uint32 values; low half first)."""
    lo = ((bits & 0xFFFF) << 16).to(torch.int32).view(torch.float32)
    hi = (((bits >> 16) & 0xFFFF) << 16).to(torch.int32).view(torch.float32)
    return torch.stack([lo, hi], dim=-1)


def _bf16_mul_ref(a: torch.Tensor, b) -> torch.Tensor:
    """A packed bf16 multiply: the exact product rounded once to bf16 (as fp32 values)."""
    return (a.double() * (b.double() if isinstance(b, torch.Tensor) else b)).to(torch.bfloat16).float()


def dequant_words_ref(word: torch.Tensor, factor_bits: torch.Tensor, two_muls: bool) -> torch.Tensor:
    """Twin of :func:`dequant_fp4x8` on int64 tensors holding uint32 values: (..., 4, 2) fp32
    values of the 4 bf16x2 words (low half first), computed with the kernel's shifts and masks
    and bf16 multiplies (exact products: rounding to bf16 changes nothing)."""

    out = []
    for sm, ss in _WORD_SHIFTS:
        m = ((word << sm) if sm >= 0 else (word >> -sm)) & 0x01C001C0
        sg = (word << ss) & 0x80008000
        v = _bf16_pair_ref((m | sg) & 0xFFFFFFFF)
        f = _bf16_pair_ref(factor_bits & 0xFFFFFFFF)
        if two_muls:
            v = _bf16_mul_ref(v, torch.full_like(v, 2.0**126))
        out.append(_bf16_mul_ref(v, f))
    return torch.stack(out, dim=-2)


def placed_words_multiply_ref(word: torch.Tensor) -> torch.Tensor:
    """The kernel's integer steps of :func:`dequant_fp4x8` on int64 tensors holding uint32
    values: (..., 4) bf16x2 bit patterns before the bf16 multiply (masked word times a constant,
    masked). The CPU tests check them against the shift-and-mask placement of
    :func:`dequant_words_ref` for every byte value in every position."""
    out = []
    for i in range(4):
        src = word if i < 2 else word >> 8
        x = ((src & _WORD_MASKS[i % 2]) * _WORD_MULS[i % 2]) & 0xFFFFFFFF
        out.append(x & _OUT_MASK)
    return torch.stack(out, dim=-1)


def placed_words_shift_ref(word: torch.Tensor) -> torch.Tensor:
    """The shift-and-mask placement (magnitude to bf16 bits 6-8, sign to bit 15, per lane)."""
    out = []
    for sm, ss in _WORD_SHIFTS:
        m = ((word << sm) if sm >= 0 else (word >> -sm)) & 0x01C001C0
        out.append(m | ((word << ss) & 0x80008000))
    return torch.stack(out, dim=-1)


def pair_natural_x_ref(words: torch.Tensor) -> torch.Tensor:
    """Twin of :func:`pair_natural_x` on (..., 4) int64 tensors holding uint32 words."""
    lo = [w & 0xFFFF for w in words.unbind(-1)]
    hi = [(w >> 16) & 0xFFFF for w in words.unbind(-1)]
    x = [lo[0], hi[0], lo[1], hi[1], lo[2], hi[2], lo[3], hi[3]]
    return torch.stack([x[i] | (x[i + 4] << 16) for i in range(4)], dim=-1)


def dequant_e4m3_words_ref(word: torch.Tensor, factor_bits: torch.Tensor) -> torch.Tensor:
    """Twin of :func:`dequant_e4m3x4` on int64 tensors holding uint32 values: (..., 2, 2) fp32
    values of the 2 bf16x2 words (low half first), from the kernel's PRMT / shift / mask
    placement and its two bf16 multiplies."""

    def sx(b):  # PRMT sign replication: 0xFF if bit 7 of the byte is set
        return torch.where((b & 0x80) != 0, 0xFF, 0)

    b = [(word >> (8 * i)) & 0xFF for i in range(4)]
    f = _bf16_pair_ref(factor_bits & 0xFFFFFFFF)
    out = []
    for lo, hi in ((b[0], b[1]), (b[2], b[3])):
        x = lo | (sx(lo) << 8) | (hi << 16) | (sx(hi) << 24)
        placed = ((x << 4) & 0xFFFFFFFF) & 0x87F087F0
        v = _bf16_mul_ref(_bf16_pair_ref(placed), torch.full_like(f, 2.0**120))
        out.append(_bf16_mul_ref(v, f))
    return torch.stack(out, dim=-2)


def prmt_ref(a: torch.Tensor, b: torch.Tensor, selector: int) -> torch.Tensor:
    """Twin of PTX ``prmt.b32 d, a, b, selector`` (default mode) on int64 tensors holding uint32
    values: byte k of d is byte (nibble k & 7) of the pool (a: bytes 0-3, b: 4-7), or its sign
    bit replicated when nibble k has bit 3 set."""
    pool = (a & 0xFFFFFFFF) | ((b & 0xFFFFFFFF) << 32)
    out = torch.zeros_like(a)
    for k in range(4):
        nib = (selector >> (4 * k)) & 0xF
        byte = (pool >> (8 * (nib & 7))) & 0xFF
        if nib & 8:
            byte = torch.where((byte & 0x80) != 0, 0xFF, 0)
        out |= byte << (8 * k)
    return out


def dequant_e4m3_pair_ref(lo: torch.Tensor, hi: torch.Tensor, i: int, factor_bits: torch.Tensor,
                          nan_out: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """Twin of :func:`dequant_e4m3_pair`: (..., 2) fp32 values of the bf16x2 word; ``nan_out``
    (bool, the shape of ``lo``) receives whether the flags' PAIR_NAN_MASK bits are set."""
    x = prmt_ref(lo, hi, e4m3_pair_selector(i))
    placed = ((x << 4) & 0xFFFFFFFF) & 0x87F087F0
    if nan_out is not None:
        nan_out.copy_(((placed + 0x00100010) & PAIR_NAN_MASK) != 0)
    v = _bf16_mul_ref(_bf16_pair_ref(placed), 2.0**120)
    return _bf16_mul_ref(v, _bf16_pair_ref(factor_bits & 0xFFFFFFFF))


def e4m3_nan_flags_ref(word: torch.Tensor) -> torch.Tensor:
    """Twin of :func:`e4m3_nan_flags` (from zero flags), masked: bit 7 of each byte set where the
    byte is an e4m3 NaN."""
    return ((word & _E4M3_LOW7) + _E4M3_ONES) & WORD_NAN_MASK


def nvfp4_factor_ref(scale_byte: torch.Tensor) -> torch.Tensor:
    """Twin of :func:`nvfp4_factors` for one e4m3 byte: bf16x2 bits of ``s * 2**118`` twice."""
    s = scale_byte.to(torch.uint8).view(torch.float8_e4m3fn).float() * 2.0**118
    b = s.to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF
    return b | (b << 16)


def mx_scale_bf16_ref(e: torch.Tensor) -> torch.Tensor:
    """Twin of :func:`mx_factor_bf16x2`."""
    e = e.to(torch.int64)
    f = torch.where(e == 0, 0x40, torch.where(e == 255, 0x7FC0, e << 7))
    return f | (f << 16)
