"""Reference (plain torch) quantizers for the block-scaled formats.

These are the ground truth the GEMM kernels are tested against: slow but simple, vectorised,
device-agnostic (CPU or GPU tensors), and byte-compatible with torch's storage dtypes.

Quantization blocks along the **last** dimension (K) of a 2-D ``(rows, K)`` or 3-D
``(L, rows, K)`` input. A K that is not a multiple of the block size is handled by padding
the last block with zeros for the amax computation only; the element data keeps K columns
and the scale tensor has ``ceil(K / block_size)`` columns. All arithmetic is fp32.

Rules (``amax`` is the largest ``|x|`` of a block):

MX formats (MXFP8, MXFP8_E5M2, MXFP4; OCP MX v1.0):
    * ``scale_rule="ocp"``: ``E = floor(log2(amax)) - emax_elem`` (``emax_elem`` = 8 for e4m3,
      15 for e5m2, 2 for e2m1), computed exactly from the fp32 exponent. Elements whose
      ``|x| / 2**E`` exceeds the element max saturate to ``±elem_max`` (this is how OCP
      clips amax values in ``(elem_max, 2**(emax_elem + 1))``).
    * ``scale_rule="ceil"``: the smallest ``E`` with ``amax <= elem_max * 2**E``, i.e.
      ``ceil(log2(amax / elem_max))`` evaluated exactly, so nothing saturates. (An element
      rounded up at the top of fp32's range, e.g. x = 3.4e38 stored as 256 x 2**120, then
      dequantizes to 2**128: inf in fp32.)
    * ``E`` is clamped to the e8m0 range ``[-127, 127]``; the scale byte is ``E + 127``.
    * All-zero block: ``E = -127`` (byte 0x00, the smallest e8m0) and all elements zero.
    * A block containing NaN or ±Inf: scale byte 0xFF (e8m0 NaN) and all elements stored as
      zero, so the whole block (and only that block) dequantizes to NaN.
    * Elements are ``x / 2**E`` rounded to nearest-even in the element type, saturating to
      ``±elem_max`` (never Inf/NaN). Scaling by the power of two is exact for every value
      that does not round to zero.

NVFP4 (NVIDIA's two-level recipe):
    * ``global_scale`` (fp32, per tensor) defaults to ``amax_tensor / (448 * 6)`` where
      ``amax_tensor`` is the largest finite ``|x|``, clamped below to the smallest normal
      fp32 (``2**-126``) so it never underflows; if there is no non-zero finite value it is
      1.0. A given ``global_scale`` must be a positive finite scalar.
    * Block scale ``s = amax / 6 / global_scale``, stored as e4m3 with round-to-nearest-even
      and saturation to 448 (values up to 2**-10, half the smallest e4m3 subnormal, become 0).
    * Elements are ``x / (s_e4m3 * global_scale)`` rounded to nearest-even on the e2m1 grid,
      saturating at ±6. A block whose e4m3 scale is 0 stores zero elements (no NaN).
    * A block containing NaN or ±Inf gets the e4m3 NaN scale (0x7F) and zero elements, so it
      (and only it) dequantizes to NaN.
    * Dequantization is ``(e2m1 * s_e4m3) * global_scale`` (the first product is exact).

E2M1 (FP4) has no NaN/Inf: :func:`pack_fp4` rounds to nearest-even on
``{0, 0.5, 1, 1.5, 2, 3, 4, 6}`` (with sign), saturates at ±6 and maps NaN to a zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .formats import BlockFormat, get_format
from .layout import from_swizzled, swizzled_shape, to_swizzled

__all__ = [
    "BlockScaledTensor",
    "quantize_ref",
    "dequantize_ref",
    "pack_fp4",
    "unpack_fp4",
]

_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_SCALE_RULES = ("ocp", "ceil")
_E8M0_BIAS = 127
_E8M0_NAN = 0xFF
_E4M3_MAX = 448.0
_E2M1_MAX = 6.0
_FP32_MIN_NORMAL = 2.0**-126
# e2m1 code (sign(1) exp(2) man(1)) -> value
_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@dataclass
class BlockScaledTensor:
    """A quantized tensor: elements, per-block scales and (NVFP4) a per-tensor scale.

    Attributes:
        data: elements, ``fmt.elem_dtype``; shape ``shape`` with the last dim halved for FP4.
        scales: per-block scales, ``fmt.scale_dtype``; plain shape ``(..., rows,
            ceil(K / block_size))`` or, if ``scales_swizzled``, the 128x4 swizzled layout of
            :mod:`cutegemm.blockscaled.layout` with shape ``(..., rows_p, cols_p)``.
        fmt: the :class:`BlockFormat`.
        shape: logical shape ``(rows, K)`` or ``(L, rows, K)``; K (last) is the blocked dim.
        global_scale: 0-d fp32 tensor for formats with a global scale, else None.
        scales_swizzled: whether ``scales`` is in the swizzled layout.
    """

    data: torch.Tensor
    scales: torch.Tensor
    fmt: BlockFormat
    shape: torch.Size
    global_scale: torch.Tensor | None = None
    scales_swizzled: bool = True

    def __post_init__(self):
        # A format given by name (``fmt="mxfp8"``) is looked up here, so every route sees a
        # BlockFormat; anything else is a TypeError at construction, not an AttributeError later.
        if not isinstance(self.fmt, BlockFormat):
            if not isinstance(self.fmt, str):
                raise TypeError(f"fmt: expected a BlockFormat or str, got {type(self.fmt).__name__}")
            self.fmt = get_format(self.fmt)

    def swizzled_scales(self) -> torch.Tensor:
        """The scales in the 128x4 swizzled layout (a copy when they are stored plain)."""
        return self.scales if self.scales_swizzled else to_swizzled(self.scales)

    def plain_scales(self) -> torch.Tensor:
        """The scales in the plain ``(..., rows, ceil(K / block_size))`` layout."""
        if not self.scales_swizzled:
            return self.scales
        rows, k = self.shape[-2], self.shape[-1]
        return from_swizzled(self.scales, rows, -(-k // self.fmt.block_size))


def _exp2_int(e: torch.Tensor) -> torch.Tensor:
    """Exact fp32 ``2**e`` for integer ``e`` in ``[-127, 127]`` (2**-127 is an fp32 subnormal)."""
    e = e.to(torch.int32)
    normal = ((e.clamp(min=-126) + 127) << 23).view(torch.float32)
    return torch.where(e < -126, torch.full_like(normal, 2.0**-127), normal)


def e8m0_to_float(scales: torch.Tensor) -> torch.Tensor:
    """Exact fp32 values of e8m0 scales (float8_e8m0fnu or their uint8 bytes): ``2**(byte - 127)``,
    NaN for byte 0xFF."""
    bits = scales.view(torch.uint8).int()
    return torch.where(bits == _E8M0_NAN, torch.nan, _exp2_int(bits - _E8M0_BIAS))


def pack_fp4(values: torch.Tensor) -> torch.Tensor:
    """Round fp values to e2m1 (nearest-even, saturating at ±6) and pack two per byte.

    Element ``2i`` of the last dimension goes to the low nibble and ``2i + 1`` to the high
    nibble of byte ``i``. NaN becomes a (signed) zero; the sign of zero is kept.

    Args:
        values: floating tensor whose last dimension is even.

    Returns:
        ``torch.float4_e2m1fn_x2`` tensor with the last dimension halved.
    """
    if not isinstance(values, torch.Tensor) or not values.is_floating_point():
        raise TypeError("values: expected a floating-point torch.Tensor")
    if values.dim() == 0 or values.shape[-1] % 2:
        raise ValueError(
            f"values: last dimension must be even to pack FP4 pairs, got shape {tuple(values.shape)}"
        )
    a = values.float().abs()
    # Midpoints of the grid; ties go to the even code (mantissa bit 0): 0.25->0, 0.75->1,
    # 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4. Inf counts all thresholds (saturates), NaN none.
    code = (
        (a > 0.25).to(torch.uint8)
        + (a >= 0.75)
        + (a > 1.25)
        + (a >= 1.75)
        + (a > 2.5)
        + (a >= 3.5)
        + (a > 5.0)
    )
    code = code | (torch.signbit(values).to(torch.uint8) << 3)
    packed = code[..., 0::2] | (code[..., 1::2] << 4)
    return packed.view(torch.float4_e2m1fn_x2)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Decode a ``torch.float4_e2m1fn_x2`` (or uint8) tensor to fp32, doubling the last dim."""
    if not isinstance(packed, torch.Tensor) or packed.dtype not in (
        torch.float4_e2m1fn_x2,
        torch.uint8,
    ):
        raise TypeError("packed: expected a torch.float4_e2m1fn_x2 or uint8 tensor")
    lut = torch.tensor(_E2M1_VALUES, dtype=torch.float32, device=packed.device)
    lut = torch.cat([lut, -lut])
    b = packed.view(torch.uint8).long()
    pairs = torch.stack([lut[b & 0xF], lut[b >> 4]], dim=-1)
    return pairs.flatten(-2)


def check_global_scale(global_scale: object, device: torch.device) -> torch.Tensor:
    if isinstance(global_scale, (int, float)) and not isinstance(global_scale, bool):
        gs = torch.tensor(float(global_scale), dtype=torch.float32, device=device)
    elif isinstance(global_scale, torch.Tensor) and global_scale.numel() == 1:
        gs = global_scale.detach().to(device=device, dtype=torch.float32).reshape(())
    else:
        raise TypeError("global_scale: expected a float or a one-element tensor")
    if not (torch.isfinite(gs) and gs > 0):
        raise ValueError(f"global_scale: must be positive and finite, got {gs.item()}")
    return gs


def check_quantize_args(x: torch.Tensor, fmt, global_scale, scale_rule: str) -> BlockFormat:
    """The format / scale-rule / global-scale / K rules shared by :func:`quantize_ref` and the
    quantize kernel; returns the :class:`BlockFormat`."""
    if not isinstance(fmt, (BlockFormat, str)):
        raise TypeError(f"fmt: expected a BlockFormat or str, got {type(fmt).__name__}")
    fmt = get_format(fmt)
    if scale_rule not in _SCALE_RULES:
        raise ValueError(f"scale_rule: expected one of {_SCALE_RULES}, got {scale_rule!r}")
    if fmt.has_global_scale and scale_rule != "ocp":
        raise ValueError(f"scale_rule: {fmt.name} uses a fixed recipe, got {scale_rule!r}")
    if global_scale is not None and not fmt.has_global_scale:
        raise ValueError(f"global_scale: format {fmt.name} has no global scale")
    k = x.shape[-1]
    if fmt.elems_per_byte == 2 and k % 2:
        raise ValueError(f"x: {fmt.name} packs two elements per byte, so K must be even, got {k}")
    return fmt


def quantize_ref(
    x: torch.Tensor,
    fmt: BlockFormat | str,
    *,
    global_scale: torch.Tensor | float | None = None,
    scale_rule: str = "ocp",
    swizzle: bool = True,
) -> BlockScaledTensor:
    """Quantize ``x`` to a block-scaled format, blocking along the last dimension.

    See the module docstring for the exact scale/element rounding rules and the handling of
    zeros, NaN/Inf, saturation and K tails.

    Args:
        x: fp32/bf16/fp16 tensor of shape ``(rows, K)`` or ``(L, rows, K)``, any device.
        fmt: a :class:`BlockFormat` or its name (``"mxfp8"``, ``"mxfp4"``, ``"nvfp4"``, ...).
        global_scale: NVFP4 only: fp32 per-tensor scale; None computes the default.
        scale_rule: MX shared-exponent rule, ``"ocp"`` (floor, may saturate) or ``"ceil"``
            (never saturates). NVFP4 always uses NVIDIA's recipe and accepts only ``"ocp"``
            (the default).
        swizzle: store the scales in the 128x4 swizzled layout (default) or plain.

    Returns:
        The :class:`BlockScaledTensor`.

    Raises:
        TypeError: wrong type/dtype of ``x``, ``fmt`` or ``global_scale``.
        ValueError: bad shape of ``x`` (incl. odd K for FP4), unknown ``fmt`` or
            ``scale_rule``, or a ``global_scale`` that is invalid or given for an MX format.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _INPUT_DTYPES:
        raise TypeError(f"x: expected dtype float32, bfloat16 or float16, got {x.dtype}")
    if x.dim() not in (2, 3) or x.numel() == 0:
        raise ValueError(f"x: expected a non-empty (rows, K) or (L, rows, K) tensor, got {tuple(x.shape)}")
    fmt = check_quantize_args(x, fmt, global_scale, scale_rule)
    k = x.shape[-1]

    bs = fmt.block_size
    xf = x.detach().float()
    blocks = F.pad(xf, (0, -k % bs)).unflatten(-1, (-1, bs))
    nonfinite = ~torch.isfinite(blocks).all(dim=-1)
    amax = torch.where(nonfinite, 0.0, blocks.abs().amax(dim=-1))

    gs = None
    if fmt.is_mx:
        mant, exp = torch.frexp(amax)  # amax = mant * 2**exp, mant in [0.5, 1)
        e = exp - 1 - fmt.elem_emax  # floor(log2(amax)) - emax_elem
        if scale_rule == "ceil":
            e = e + (mant * 2.0 ** (fmt.elem_emax + 1) > fmt.elem_max).to(e.dtype)
        e = torch.where(amax == 0, -_E8M0_BIAS, e).clamp(-_E8M0_BIAS, _E8M0_BIAS)
        scale_bits = torch.where(nonfinite, _E8M0_NAN, e + _E8M0_BIAS).to(torch.uint8)
        scales = scale_bits.view(torch.float8_e8m0fnu)
        # e <= 127 - emax_elem, so 2**-e is a normal fp32 and the product rounds only for
        # values that are far below the element grid anyway (fp32 subnormal results).
        scaled = blocks * _exp2_int(-e).unsqueeze(-1)
    else:
        if global_scale is None:
            finite_amax = torch.where(torch.isfinite(xf), xf.abs(), 0.0).amax()
            gs = torch.where(
                finite_amax > 0,
                (finite_amax / (_E4M3_MAX * _E2M1_MAX)).clamp(min=_FP32_MIN_NORMAL),
                1.0,
            )
        else:
            gs = check_global_scale(global_scale, x.device)
        s = torch.where(nonfinite, torch.nan, amax / _E2M1_MAX / gs)
        scales = s.clamp(max=_E4M3_MAX).to(torch.float8_e4m3fn)
        denom = (scales.float() * gs).unsqueeze(-1)
        scaled = torch.where(denom > 0, blocks / denom, 0.0)

    scaled = torch.where(nonfinite.unsqueeze(-1), 0.0, scaled).flatten(-2)[..., :k]
    if fmt.elems_per_byte == 2:
        data = pack_fp4(scaled)
    else:
        data = scaled.clamp(-fmt.elem_max, fmt.elem_max).to(fmt.elem_dtype)
    if swizzle:
        scales = to_swizzled(scales)
    return BlockScaledTensor(
        data=data,
        scales=scales,
        fmt=fmt,
        shape=x.shape,
        global_scale=gs,
        scales_swizzled=swizzle,
    )


def check_block_scaled(q, name: str = "q") -> None:
    """That a BlockScaledTensor's fields agree (one built or edited by hand): its format, element
    dtype and shape, scale dtype and (plain or swizzled) shape, and a one-element global scale
    only for a format that has one (TypeError / ValueError naming the field)."""
    if not isinstance(q, BlockScaledTensor):
        raise TypeError(f"{name}: expected a BlockScaledTensor, got {type(q).__name__}")
    fmt, shape = q.fmt, tuple(q.shape)
    if not isinstance(fmt, BlockFormat):
        raise TypeError(f"{name}.fmt: expected a BlockFormat (get_format(name)), got {type(fmt).__name__}")
    if len(shape) not in (2, 3) or fmt.elems_per_byte == 2 and shape[-1] % 2:
        raise ValueError(f"{name}.shape: expected (rows, K) or (L, rows, K) (FP4: K even), got {shape}")
    data_shape = (*shape[:-1], shape[-1] // fmt.elems_per_byte)
    if q.data.dtype != fmt.elem_dtype or tuple(q.data.shape) != data_shape:
        raise ValueError(f"{name}.data: expected {fmt.elem_dtype} {data_shape} ({fmt.name} of shape {shape}), got "
                         f"{q.data.dtype} {tuple(q.data.shape)}")  # fmt: skip
    kb = -(-shape[-1] // fmt.block_size)
    scale_shape = (*shape[:-2], *swizzled_shape(shape[-2], kb)) if q.scales_swizzled else (*shape[:-1], kb)
    if q.scales.dtype != fmt.scale_dtype or tuple(q.scales.shape) != scale_shape:
        raise ValueError(f"{name}.scales: expected {fmt.scale_dtype} {scale_shape} "
                         f"({'swizzled' if q.scales_swizzled else 'plain'}), got {q.scales.dtype} {tuple(q.scales.shape)}")  # fmt: skip
    gs = q.global_scale
    if gs is not None and (not fmt.has_global_scale or not isinstance(gs, torch.Tensor) or gs.numel() != 1):
        raise ValueError(f"{name}.global_scale: a one-element tensor for a format with a global scale (NVFP4), got "
                         f"{type(gs).__name__} with format {fmt.name}")  # fmt: skip


def dequantize_ref(q: BlockScaledTensor) -> torch.Tensor:
    """Decode a :class:`BlockScaledTensor` to fp32 of shape ``q.shape``.

    Value = ``element * scale`` (MX: ``scale = 2**(byte - 127)``, NaN for byte 0xFF), and for
    NVFP4 ``(element * scale_e4m3) * global_scale``. A NaN scale makes its whole block NaN.
    For MX formats the result is exact in fp32 where it is in fp32's range (an element times
    2**127, or a "ceil"-rule element rounded up next to fp32's max, can pass it: inf).
    """
    check_block_scaled(q)
    fmt = q.fmt
    k = q.shape[-1]
    if fmt.elems_per_byte == 2:
        elems = unpack_fp4(q.data)
    else:
        elems = q.data.float()
    scales = q.plain_scales()
    if fmt.is_mx:
        scale_f = e8m0_to_float(scales)
    else:
        scale_f = scales.float()
    out = elems * scale_f.repeat_interleave(fmt.block_size, dim=-1)[..., :k]
    if q.global_scale is not None:
        out = out * q.global_scale
    return out
