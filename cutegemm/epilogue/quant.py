"""Quantized-output epilogue: the kernel writes MXFP8 / MXFP4 / NVFP4 data plus 128x4-swizzled
scale factors straight from the fp32 epilogue values in registers (no bf16 round trip).

Arch-neutral: both kernels call :func:`store_quantized` on one epilogue subtile with the values
(:func:`cutegemm.epilogue.ops.epilogue_subtile`'s result), their global coordinates, and two
facts about their fragment layout:

- ``quad``: how many consecutive lanes share one row segment of the subtile (4 for Hopper's
  WGMMA accumulator: lane % 4 picks the column pair; 1 for Blackwell's tcgen05.ld 32dp32b, where
  a thread owns a whole row);
- ``lane_col_step``: the output-column distance between those lanes (2 non-gated / 1 gated on
  Hopper; unused when ``quad == 1``).

A scale block (32 or 16 consecutive output columns of one row) is then the union of one element
group per lane of the quad; its amax is a local max plus ``log2(quad)`` butterfly shuffles. The
grouping is proven at trace time from the fragment's static offsets (raises otherwise).

Rules (identical to :func:`cutegemm.blockscaled.quantize_ref`, ``scale_rule="ocp"``):
MX: ``E = max(floor(log2(amax)) - emax_elem, -127)`` from the fp32 exponent bits (a subnormal or
zero amax gives -127), scale byte ``E + 127``, elements ``y * 2**-E`` saturated to the element max
and rounded to nearest-even; NVFP4: ``s = e4m3(min(amax / 6 / global_scale, 448))``, elements
``y / (s * global_scale)`` (0 when that is 0) on the e2m1 grid. A block with a NaN or Inf gets the
NaN scale (0xFF e8m0 / 0x7F e4m3) and zero elements. FP4 packs element 2i in the low nibble.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T

from .ops import gate_up_pairs, static_offsets

_FLT_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class QuantSpec:
    block: int  # output columns per scale
    elem: str  # "e4m3" | "e2m1"
    scale: str  # "e8m0" | "e4m3"
    emax: int  # MX: exponent of the element type's largest binade
    elem_max: float

    @property
    def packed(self) -> bool:
        return self.elem == "e2m1"


QUANT = {
    "mxfp8": QuantSpec(32, "e4m3", "e8m0", 8, 448.0),
    "mxfp4": QuantSpec(32, "e2m1", "e8m0", 2, 6.0),
    "nvfp4": QuantSpec(16, "e2m1", "e4m3", 2, 6.0),
}


def quant_storage(fmt: str) -> tuple[str, int]:
    """(config out_dtype of the data tensor, output columns per stored element)."""
    return ("e4m3", 1) if QUANT[fmt].elem == "e4m3" else ("u8", 2)


def _bits(x) -> cutlass.Int32:
    return cutlass.Int32(llvm.bitcast(T.i32(), cutlass.Float32(x).ir_value()))


def _from_bits(i) -> cutlass.Float32:
    return cutlass.Float32(llvm.bitcast(T.f32(), cutlass.Int32(i).ir_value()))


def _e2m1_code(q) -> cutlass.Int32:
    """Nibble of fp32 ``q`` on the e2m1 grid: nearest-even, saturating at 6 (as pack_fp4)."""
    a = cute.arch.fmax(q, q * -1.0)
    code = cutlass.Int32(a > 0.25) + cutlass.Int32(a >= 0.75) + cutlass.Int32(a > 1.25)
    code = code + cutlass.Int32(a >= 1.75) + cutlass.Int32(a > 2.5) + cutlass.Int32(a >= 3.5)
    code = code + cutlass.Int32(a > 5.0)
    return code | ((_bits(q) >> 28) & 8)


def _to_e4m3(x, dtype=cutlass.Float8E4M3FN):
    """fp32 scalar -> (e4m3 register tensor of one element, its value back in fp32)."""
    r = cute.make_rmem_tensor(1, cutlass.Float32)
    r[0] = x
    r8 = cute.make_rmem_tensor(1, dtype)
    r8.store(r.load().to(dtype))
    return r8, r8.load().to(cutlass.Float32)[0]


@cute.jit
def _store_if(pred: cutlass.Boolean, t: cute.Tensor, idx: cutlass.Int32, val):
    if pred:
        t[idx] = val


@cute.jit
def _store_if_2d(pred: cutlass.Boolean, t: cute.Tensor, i: cutlass.Int32, j: cutlass.Int32, val):
    if pred:
        t[(i, j)] = val


def quant_groups(offsets, block: int, quad: int, lane_col_step: int):
    """Group element indices by (row offset, block of the output column offset); proves that
    every block of the quad's lanes is the union of one group per lane."""
    groups: dict = {}
    for v, (row, col) in enumerate(offsets):
        if col % block + (quad - 1) * lane_col_step >= block:
            raise ValueError(
                f"quantized epilogue: fragment column offset {col} and {quad} lanes {lane_col_step} "
                f"columns apart cross a {block}-column scale block"
            )
        groups.setdefault((row, col // block), []).append(v)
    for key, members in groups.items():
        if len(members) * quad != block:
            raise ValueError(
                f"quantized epilogue: a thread holds {len(members)} values of scale block {key}; with "
                f"{quad} lanes that is not the block's {block} columns"
            )
    return groups


def store_quantized(
    fmt: str,
    out: cute.TensorSSA,
    out_offsets: list[tuple[int, int]],
    out_local: list[tuple[int, int]],
    first_coord,
    s_out: cute.Tensor,
    mSF: cute.Tensor,
    gs,
    m_rows,
    n_out,
    l_idx,
    quad: int,
    lane_col_step: int,
    row_limit=None,
):
    """Quantize one subtile's values and stage them; write their scales to global memory.

    out: fp32 values (1-D order); out_offsets[v]: (row, output column) offset of value v from
    value 0 (static); out_local[v]: its (row, output column) in the subtile (dynamic, from the
    identity partition); first_coord: global (row, output column) of value 0. s_out: the
    subtile's staging buffer, (EPI_M, EPI_N_out) elements (e4m3) or bytes (fp4 pairs). mSF: the
    output's scale bytes, 128x4 swizzled, (L * rows_p * cols_p,). gs: NVFP4 global scale (fp32).
    m_rows / n_out: rows and output columns of the output (scales of rows >= M and blocks past
    N are not written: the swizzled padding stays as the caller allocated it, zero).
    row_limit: rows >= it get no scale either (grouped: the expert's end row; default m_rows).
    """
    q = QUANT[fmt]
    groups = quant_groups(out_offsets, q.block, quad, lane_col_step)
    n = len(out_offsets)
    r_y = cute.make_rmem_tensor(n, cutlass.Float32)
    r_y.store(out)
    r_q = cute.make_rmem_tensor(n, cutlass.Float32)
    lane = cute.arch.lane_idx()
    n_blocks = (n_out + q.block - 1) // q.block
    cols_p = (n_blocks + 3) // 4 * 4
    rows_p = (m_rows + 127) // 128 * 128
    for (row_off, blk_off), members in groups.items():
        amax = cutlass.Float32(0.0)
        finite = cutlass.Int32(1)
        for v in members:
            a = cute.arch.fmax(r_y[v], r_y[v] * -1.0)
            amax = cute.arch.fmax(amax, a)
            finite = finite & cutlass.Int32(a <= _FLT_MAX)
        sh = 1
        while sh < quad:
            amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=sh))
            finite = finite & cute.arch.shuffle_sync_bfly(finite, offset=sh)
            sh *= 2
        ok = finite != 0
        if q.scale == "e8m0":
            e = cutlass.max(((_bits(amax) >> 23) & 0xFF) - (127 + q.emax), -127)
            inv = _from_bits((127 - e) << 23)
            sf_val = cutlass.Uint8(cutlass.select_(ok, e + 127, 0xFF))
            for v in members:
                y = cutlass.select_(ok, r_y[v] * inv, cutlass.Float32(0.0))
                r_q[v] = cute.arch.fmin(cute.arch.fmax(y, -q.elem_max), q.elem_max)
        else:
            # amax * fp32(1/6), then / gs: what torch computes on CUDA for quantize_ref's
            # ``amax / 6.0 / global_scale`` (a scalar divisor becomes a reciprocal multiply).
            s = cutlass.select_(ok, amax * (1.0 / 6.0) / gs, cutlass.Float32(float("nan")))
            sf_reg, sf = _to_e4m3(cutlass.select_(ok, cute.arch.fmin(s, 448.0), s))
            sf_val = sf_reg[0]
            denom = sf * gs
            for v in members:
                y = cutlass.select_(ok & (denom > 0.0), r_y[v] / denom, cutlass.Float32(0.0))
                r_q[v] = y
        # One lane per quad writes the block's scale (global row / block of value `members[0]`
        # of lane 0: by the grouping, every lane's group lies in that block).
        row = first_coord[0] + row_off
        blk = (first_coord[1] + out_offsets[members[0]][1]) // q.block
        inner = (row % 32) * 16 + ((row // 32) % 4) * 4 + blk % 4
        idx = l_idx * (rows_p * cols_p) + ((row // 128) * (cols_p // 4) + blk // 4) * 512 + inner
        pred = (lane % quad == 0) & (row < (m_rows if row_limit is None else row_limit)) & (blk < n_blocks)
        _store_if(pred, mSF, cutlass.select_(pred, idx, 0), sf_val)
        del blk_off
    if not q.packed:
        r8 = cute.make_rmem_tensor(n, s_out.element_type)
        r8.store(r_q.load().to(s_out.element_type))
        for v in range(n):
            s_out[out_local[v]] = r8[v]
        return
    # FP4: two elements per byte, low nibble = even column.
    by_pos = {o: v for v, o in enumerate(out_offsets)}
    partner_in_thread = all((o[0], o[1] + 1) in by_pos for o in out_offsets if o[1] % 2 == 0)
    if partner_in_thread and lane_col_step != 1:
        for v, o in enumerate(out_offsets):
            if o[1] % 2 == 0:
                byte = _e2m1_code(r_q[v]) | (_e2m1_code(r_q[by_pos[(o[0], o[1] + 1)]]) << 4)
                loc = out_local[v]
                s_out[(loc[0], loc[1] // 2)] = cutlass.Uint8(byte)
        return
    if quad < 2 or lane_col_step != 1:
        raise ValueError("quantized epilogue: cannot pair FP4 columns in this fragment layout")
    # Gated (Hopper): column c of this lane and c + 1 of lane ^ 1; even lanes store the byte.
    for v in range(n):
        code = _e2m1_code(r_q[v])
        other = cute.arch.shuffle_sync_bfly(code, offset=1)
        loc = out_local[v]
        byte = cutlass.Uint8(code | (other << 4))
        _store_if_2d((lane % 2) == 0, s_out, loc[0], loc[1] // 2, byte)


def store_quantized_subtile(spec, out, coords, local, s_out, quant_args, quad: int, lane_col_step: int):
    """:func:`store_quantized` for one epilogue subtile of a kernel.

    spec: the EpilogueSpec (``quant`` set); out: :func:`epilogue_subtile`'s values (gated: one
    per (gate, up) pair); coords / local: the global (m, n, l) GEMM coordinate and the
    subtile-local (m, n) of every accumulator element; quant_args: (scale bytes, (1,) fp32
    global scale or None, output rows, output columns[, row limit: grouped, the expert's end
    row])."""
    mSF, mGS, m_rows, n_out = quant_args[:4]
    row_limit = quant_args[4] if len(quant_args) > 4 else None
    cpo = spec.cols_per_output
    offs = static_offsets(coords)
    idx = [g for g, _ in gate_up_pairs(coords)] if spec.gated else list(range(len(offs)))
    out_offsets = [(offs[v][0], offs[v][1] // cpo) for v in idx]
    out_local = [(local[v][0], local[v][1] // cpo) for v in idx]
    first = (coords[0][0], coords[0][1] // cpo)
    gs = mGS[0] if QUANT[spec.quant].scale == "e4m3" else cutlass.Float32(1.0)
    store_quantized(
        spec.quant, out, out_offsets, out_local, first, s_out, mSF, gs, m_rows, n_out,
        0 if row_limit is not None else coords[0][2], quad, lane_col_step, row_limit,
    )  # fmt: skip
