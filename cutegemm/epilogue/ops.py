"""Epilogue ops: one implementation, used by the sm90 and the sm100 kernels alike.

The mainloop hands every epilogue subtile to :func:`epilogue_subtile` as an fp32 ``TensorSSA``
(registers on sm90, loaded from TMEM on sm100) together with the global ``(m, n, l)``
coordinate of each element (an identity tensor partitioned exactly like the accumulator);
the result is cast to the output dtype and stored. :class:`EpilogueSpec` is the one statement of
what a kernel fuses and part of the compile-cache key (``GemmConfig.epilogue``).

Order of operations on the fp32 accumulator ``acc`` of GEMM column ``n`` (all in fp32)::

    y = alpha * acc            (alpha)
    y = y + beta * C[m, n]     (beta; C is read in its own dtype and converted to fp32)
    y = y + bias[n]            (bias; bias converted to fp32)
    out = act(y)               (activation: relu | gelu | gelu_tanh | silu | relu_sq | tanh | sigmoid)

Gated (``gated``: swiglu | geglu | geglu_tanh | reglu | glu | swiglu_oai): the GEMM computes 2*N'
columns, interleaved gate, up, gate, up, ... (column 2j is gate j, 2j+1 is up j); ``y`` above is
computed for every GEMM column (bias has 2*N' entries, one per pre-activation column) and output
column j is ``act(y[2j]) * y[2j+1]`` with act = silu (swiglu), erf gelu (geglu), tanh gelu
(geglu_tanh), relu (reglu) or sigmoid (glu); swiglu_oai is gpt-oss's clamped form,
``g * sigmoid(1.702 g) * (u + 1)`` with g = min(y[2j], 7) and u = clamp(y[2j+1], -7, 7).

The torch twins of these formulas are in :mod:`cutegemm.epilogue.reference`.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute

from ..config import EpilogueSpec
from .user import apply_user_kernel


# --- activations ----------------------------------------------------------------------------
# Written once over a small math namespace ``m``: in the kernels ``m`` is CUTE_MATH (fp32
# TensorSSA, fast-math exp / rcp); tests/cpu/test_epilogue_cpu.py runs the very same formulas with
# fp32 torch tensors (``TorchMath`` there) against float64 references.
class CuteMath:
    """The few primitives the activations use, on fp32 TensorSSA."""

    @staticmethod
    def exp(x):
        return cute.math.exp(x, fastmath=True)  # ex2.approx.ftz (rel. error ~2^-22)

    @staticmethod
    def rcp(x):
        return cute.math.rcp(x, approx=True, ftz=True)  # rcp.approx.ftz (rel. error ~2^-23)

    @staticmethod
    def abs(x):
        return cute.math.abs(x)

    @staticmethod
    def where(cond, x, y):
        return cute.where(cond, x, y)


CUTE_MATH = CuteMath()

_SQRT1_2 = 1.0 / math.sqrt(2.0)
_GELU_TANH_2K = 2.0 * math.sqrt(2.0 / math.pi)  # 0.5 * (1 + tanh(u)) == sigmoid(2u)
# Phi(x) = 0.5 * (1 + erf(x / sqrt(2))) from erfc(z), z = |x| / sqrt(2):
#   erfc(z) = exp(-z^2 + Q(z)), Q a degree-11 polynomial fitted in float64 (mpmath reference)
#   on [0, 4.5]; erfc(4.5) = 2e-10. In fp32 (tests/cpu/test_epilogue_cpu.py): Phi within 5e-8
#   absolute, erfc within 6e-6 relative (the fp32 rounding of z^2 dominates).
_ERFC_Q = (8.078845326053852e-08, -1.1283843517303467, 0.3634340167045593, -0.10299013555049896,
           0.019567711278796196, -0.0002747102698776871, -0.00142836628947407, 0.0005849004373885691,
           -0.00013137023779563606, 1.8087161151925102e-05, -1.429832309440826e-06,
           4.984368118243765e-08)  # fmt: skip


def _poly(x, coeffs):
    r = coeffs[-1]
    for c in reversed(coeffs[:-1]):
        r = r * x + c
    return r


def _sigmoid(z, m):
    """1 / (1 + exp(-z)); exp overflow gives 0, as it should."""
    return m.rcp(1.0 + m.exp(z * -1.0))


def _normal_cdf(x, m):
    """Phi(x): one polynomial, one exp, two selects (no branch; NaN stays NaN). Past the fit
    (x < -6.36) Phi flushes to 0: GELU's absolute error there is below 7e-10."""
    z = m.abs(x) * _SQRT1_2
    half_erfc = m.where(z > 4.5, 0.0, m.exp(_poly(z, _ERFC_Q) - z * z) * 0.5)
    return m.where(x < 0.0, half_erfc, 1.0 - half_erfc)


def relu(x, m=CUTE_MATH):
    """max(x, 0); NaN stays NaN (like torch.relu)."""
    return m.where(x < 0.0, 0.0, x)


def silu(x, m=CUTE_MATH):
    """x * sigmoid(x)."""
    return x * _sigmoid(x, m)


def gelu(x, m=CUTE_MATH):
    """Exact (erf) GELU: x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2)))."""
    return x * _normal_cdf(x, m)


def gelu_tanh(x, m=CUTE_MATH):
    """tanh GELU, 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), written as
    x * sigmoid(2u): the same function without cancellation near tanh = -1."""
    return x * _sigmoid(x * _GELU_TANH_2K * (1.0 + 0.044715 * x * x), m)


def relu_sq(x, m=CUTE_MATH):
    """relu(x)^2 (squared ReLU); NaN stays NaN."""
    r = relu(x, m)
    return r * r


def sigmoid(x, m=CUTE_MATH):
    """1 / (1 + exp(-x))."""
    return _sigmoid(x, m)


# tanh(x) = x (1 + x^2 P(x^2)) for |x| < _TANH_SMALL (the Taylor series through x^17: its next
# term is below 2^-25 of the value there); above it 1 - 2 / (exp(2|x|) + 1), whose cancellation
# costs at most a factor 2 at |x| = _TANH_SMALL (tanh = 0.50): a few fp32 ulps either way
_TANH_SMALL = 0.55
_TANH_TAYLOR = (-1.0 / 3.0, 2.0 / 15.0, -17.0 / 315.0, 62.0 / 2835.0, -1382.0 / 155925.0, 21844.0 / 6081075.0,
                -929569.0 / 638512875.0, 6404582.0 / 10854718875.0)  # fmt: skip


def tanh(x, m=CUTE_MATH):
    """tanh(x), odd, +-1 at +-inf, NaN stays NaN (see _TANH_SMALL)."""
    a = m.abs(x)
    x2 = x * x
    small = x + x * (x2 * _poly(x2, _TANH_TAYLOR))
    big = 1.0 - 2.0 * m.rcp(m.exp(a * 2.0) + 1.0)
    return m.where(a < _TANH_SMALL, small, m.where(x < 0.0, big * -1.0, big))


ACTIVATION_FNS = {"relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh, "silu": silu, "relu_sq": relu_sq, "tanh": tanh,
                  "sigmoid": sigmoid}  # fmt: skip
# gpt-oss's clamped SwiGLU (vLLM / SGLang / ggml call it swiglu_oai): gate clamped above at the
# limit, up clamped to +-limit, then gate * sigmoid(alpha * gate) * (up + 1)
SWIGLU_OAI_ALPHA = 1.702
SWIGLU_OAI_LIMIT = 7.0


def swiglu_oai_gate(x, m=CUTE_MATH):
    """g * sigmoid(1.702 g), g = min(x, 7); NaN stays NaN (the clamp selects only on a true
    comparison, as torch.clamp propagates NaN)."""
    g = m.where(x > SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT, x)
    return g * _sigmoid(g * SWIGLU_OAI_ALPHA, m)


def swiglu_oai_up(x, m=CUTE_MATH):
    """clamp(x, -7, 7) + 1; NaN stays NaN."""
    lim = SWIGLU_OAI_LIMIT
    return m.where(x > lim, lim, m.where(x < -lim, -lim, x)) + 1.0


# A gated form's output column j is gate_act(gate) * up_map(up): the act of each form's gate column
# (by name, as the torch twins and derivatives name them), and the map of its up column where it
# is not the identity
GATE_ACTIVATION = {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_tanh", "reglu": "relu", "glu": "sigmoid",
                   "swiglu_oai": "swiglu_oai_gate"}  # fmt: skip
UP_MAP = {"swiglu_oai": "swiglu_oai_up"}
GATE_FNS = {**ACTIVATION_FNS, "swiglu_oai_gate": swiglu_oai_gate, "swiglu_oai_up": swiglu_oai_up}


def gated_out(name: str, gate, up, m=CUTE_MATH):
    """Output column j of a gated form from its gate and up pre-activations."""
    if name in UP_MAP:
        up = GATE_FNS[UP_MAP[name]](up, m)
    return GATE_FNS[GATE_ACTIVATION[name]](gate, m) * up


def apply_epilogue(
    spec: EpilogueSpec, acc: cute.TensorSSA, alpha: cutlass.Float32, *, beta=None, c=None, bias=None
):
    """``act(alpha * acc + beta * c + bias)`` on one fp32 subtile (TensorSSA), each op only when
    ``spec`` enables it. ``c`` / ``bias`` are fp32 TensorSSA of the same shape as ``acc``. For a
    gated spec this returns the pre-activation values (gating pairs columns: see
    :func:`epilogue_subtile`).

    A plain Python function traced inside the kernel: ``spec`` is a compile-time value.
    """
    if spec.alpha:
        acc = acc * alpha
    if spec.beta:
        acc = acc + c * beta
    if spec.bias:
        acc = acc + bias
    if spec.activation is not None:
        acc = ACTIVATION_FNS[spec.activation](acc)
    return acc


def apply_gate(spec: EpilogueSpec, gate: cute.TensorSSA, up: cute.TensorSSA):
    """The gated spec's output from its gate and up columns (:func:`gated_out`)."""
    return gated_out(spec.gated, gate, up)


# --- per-element inputs and gating, from a coordinate tensor ----------------------------------
def static_offsets(coords: cute.Tensor) -> list[tuple]:
    """The compile-time coordinate offset of every element of a (per-thread) coordinate tensor
    from its first element. The thread's base coordinate is dynamic; these offsets are not."""
    out = []
    for v in range(cute.size(coords)):
        off = coords.layout(v)
        out.append(tuple(off) if isinstance(off, tuple) else (off,))
    return out


def gate_up_pairs(coords: cute.Tensor) -> list[tuple[int, int]]:
    """(gate index, up index) of every interleaved pair in a fragment with coordinates ``coords``:
    the up element sits one column right of its gate, in the same thread.

    Proven at compile time (raises otherwise): the value layout is static, so every element's
    column offset from the thread's first element is known; the first element's column is a
    dynamic value whose divisibility the DSL tracks through the partition (WGMMA fragments start
    at column 2 * (lane % 4), tcgen05.ld ones at a multiple of 32). Even first column + even
    offset = gate column."""
    n0 = coords.iterator[1]
    if cute.get_divisibility(n0) % 2:
        raise ValueError(f"gated epilogue: a thread's first column {n0} is not provably even")
    offs = static_offsets(coords)
    index = {o: v for v, o in enumerate(offs)}
    pairs = []
    for v, o in enumerate(offs):
        if o[1] % 2:
            continue
        partner = (o[0], o[1] + 1, *o[2:])
        if partner not in index:
            raise ValueError(
                f"gated epilogue: fragment element {v} at offset {o} has no up partner {partner}"
            )
        pairs.append((v, index[partner]))
    if 2 * len(pairs) != len(offs):
        raise ValueError(f"gated epilogue: fragment offsets {offs} do not split into (gate, up) pairs")
    return pairs


def _gather_fp32(coords: cute.Tensor, shape, load):
    """fp32 register tensor of ``shape``: element v = ``load(coordinate of element v)``."""
    r = cute.make_rmem_tensor(shape, cutlass.Float32)
    for v in range(cute.size(coords)):
        r[v] = load(coords[v]).to(cutlass.Float32)
    return r.load()


def col_index(mnl, vec, group_cols):
    """Index of coordinate ``mnl``'s entry in a per-column vector, clamped into it (elements
    past N are never stored; clamping avoids a branch). Grouped: the expert's row of N."""
    if group_cols is None:
        return cutlass.min(mnl[1], vec.shape[0] - 1)
    return cutlass.min(mnl[1], group_cols - 1) + mnl[2] * group_cols


def epilogue_subtile(
    spec: EpilogueSpec,
    acc: cute.TensorSSA,
    coords,
    alpha: cutlass.Float32,
    beta: cutlass.Float32,
    mCin,
    mBias,
    vectors=(),
    group_cols=None,
    preact: bool = False,
):
    """The whole epilogue of one fp32 accumulator subtile; returns the values to cast and store.

    coords: a per-thread coordinate tensor with one global (m, n, l) GEMM coordinate per element
    of ``acc``, in the same order (None when ``spec.needs_coords`` is False). mCin (M, N, L) and
    mBias (N,): global tensors (None when unused). Reads of C and bias clamp the coordinate into
    the tensor, so elements past M / N (never stored: the TMA store clips them) read a valid
    address instead of branching.

    group_cols: grouped kernels pass the GEMM's column count N: then l of a coordinate is the
    expert, and the per-column vectors (bias, scale_b) hold one row of N per expert (flat
    (E * N,), element ``l * N + n``). None (dense): one vector shared by every batch.

    Non-gated: returns a TensorSSA of ``acc``'s shape. Gated: returns a 1-D TensorSSA with one
    value per (gate, up) pair, in the order of :func:`gate_up_pairs` (``coords``); with
    ``preact`` (gated), the pair (values before the gate, in ``acc``'s shape; gated values).
    """
    if spec.user is not None:
        y = acc * alpha if spec.alpha else acc
        return apply_user_kernel(spec.user, y, coords, vectors[: len(spec.user_args)])
    # FP8 scales (per row of A / per column of B; a 1-element vector is a per-tensor scale): the
    # dequantization of the accumulator, before every other op. vectors = (scale_a, scale_b).
    if spec.scale_a:
        sa, last_a = vectors[0], vectors[0].shape[0] - 1
        acc = acc * _gather_fp32(coords, acc.shape, lambda mnl: sa[cutlass.min(mnl[0], last_a)])
    if spec.scale_b:
        sb = vectors[1]
        acc = acc * _gather_fp32(coords, acc.shape, lambda mnl: sb[col_index(mnl, sb, group_cols)])
    c = bias = None
    if spec.beta:
        last_m, last_n = mCin.shape[0] - 1, mCin.shape[1] - 1
        c = _gather_fp32(
            coords,
            acc.shape,
            lambda mnl: mCin[(cutlass.min(mnl[0], last_m), cutlass.min(mnl[1], last_n), mnl[2])],
        )
    if spec.bias:
        bias = _gather_fp32(coords, acc.shape, lambda mnl: mBias[col_index(mnl, mBias, group_cols)])
    y = apply_epilogue(spec, acc, alpha, beta=beta, c=c, bias=bias)
    if spec.gated is None:
        return y
    pairs = gate_up_pairs(coords)
    r_y = cute.make_rmem_tensor(acc.shape, cutlass.Float32)
    r_y.store(y)
    r_gate = cute.make_rmem_tensor(len(pairs), cutlass.Float32)
    r_up = cute.make_rmem_tensor(len(pairs), cutlass.Float32)
    for k, (g, u) in enumerate(pairs):
        r_gate[k] = r_y[g]
        r_up[k] = r_y[u]
    gated = apply_gate(spec, r_gate.load(), r_up.load())
    return (y, gated) if preact else gated


# The largest finite value of each FP8 output type (an FP8 output saturates to it, as PTX's
# cvt.satfinite: finite overflow and infinities go to +-max, NaN stays NaN)
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}


def store_saturated(out: cute.TensorSSA, local, s_out: cute.Tensor, max_value: float):
    """Write one subtile's values into an 8-bit (FP8) output subtile in shared memory.

    out: from :func:`epilogue_subtile`; local: the subtile-local (m, n) of every value (same
    order); s_out: (EPI_M, EPI_N) smem buffer of the FP8 type; max_value: its largest finite
    value (:data:`FP8_MAX`). Values are clamped to +-max_value (NaN kept), then rounded to
    nearest-even. One st.shared per value: stmatrix moves 16-bit elements.
    """
    n = cute.size(out.shape)
    r = cute.make_rmem_tensor(n, cutlass.Float32)
    r.store(out)
    for v in range(n):
        y = r[v]
        r[v] = cutlass.select_(y == y, cute.arch.fmin(cute.arch.fmax(y, -max_value), max_value), y)
    r8 = cute.make_rmem_tensor(n, s_out.element_type)
    r8.store(r.load().to(s_out.element_type))
    for v in range(n):
        mn = local[v]
        s_out[(mn[0], mn[1])] = r8[v]


def store_gated(out: cute.TensorSSA, coords, local, s_out: cute.Tensor, dtype):
    """Write the gated values of one subtile into the output subtile in shared memory.

    out: from :func:`epilogue_subtile` (one value per pair); coords: the same coordinate tensor
    (gives the pairing); local: the subtile-local (m, n) coordinate of every accumulator element
    (same order); s_out: (EPI_M, EPI_N / 2) smem buffer. Gate column n lands in output column n/2.
    One st.shared per value: the halved fragment matches no stmatrix layout.
    """
    pairs = gate_up_pairs(coords)
    r_out = cute.make_rmem_tensor(len(pairs), dtype)
    r_out.store(out.to(dtype))
    for k, (g, _) in enumerate(pairs):
        mn = local[g]
        s_out[(mn[0], mn[1] >> 1)] = r_out[k]
