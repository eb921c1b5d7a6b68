"""CPU part of the bad-input suite: what every public function does with input it cannot take,
checked without a GPU (CPU tensors, wrong types, bad arguments rejected before any device work),
and the plain-torch twins / CPU custom ops on empty problems (M = 0, E = 0, K = 0).

Table-driven: each case is (id, call, expected) with expected an exception type (plus a message
pattern) or "ok" plus a reference check. The GPU half is tests/test_bad_inputs_gpu.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

import cutegemm
import cutegemm.ops  # noqa: F401  (registers torch.ops.cutegemm)
from cutegemm.blockscaled import BlockScaledTensor, dequantize_ref, quantize_ref
from cutegemm.nn import GroupedExperts

BF = torch.bfloat16
OP = torch.ops.cutegemm


@dataclass(frozen=True)
class Case:
    """``call()`` must raise ``expect`` (message matching ``match``), or, with expect="ok",
    return a value that ``check(value)`` accepts (it asserts)."""

    id: str
    call: Callable
    expect: type[BaseException] | str
    match: str | None = None
    check: Callable | None = None


def r(*shape, dtype=BF):
    return torch.randn(*shape).to(dtype)


def offs_of(*counts):
    return torch.tensor(counts, dtype=torch.int32).cumsum(0, dtype=torch.int32)


def close64(ref_fn):
    """A check: the value equals ``ref_fn()`` (fp64 math) within bf16 rounding."""

    def check(value):
        ref = ref_fn()
        assert value.shape == ref.shape, (value.shape, ref.shape)
        torch.testing.assert_close(value.double(), ref.double(), atol=2e-2, rtol=2e-2)

    return check


def shape_is(*shape, dtype=None):
    def check(value):
        assert tuple(value.shape) == shape, (tuple(value.shape), shape)
        assert dtype is None or value.dtype == dtype

    return check


def _quantize():
    return getattr(cutegemm, "quantize", None)


def _gemm_cases():
    a, b = r(16, 32), r(32, 24)
    return [
        Case("gemm-cpu-a", lambda: cutegemm.gemm(a, b), ValueError, "a must be a CUDA tensor"),
        Case("gemm-list-a", lambda: cutegemm.gemm([[1.0]], b), TypeError, "a must be a torch.Tensor"),
        Case("gemm-none-b", lambda: cutegemm.gemm(a, None), (TypeError, ValueError), "CUDA|Tensor"),
        Case("gemm-bad-activation", lambda: cutegemm.gemm(a, b, activation="softplus"), ValueError, "activation"),
        Case(
            "gemm-bad-gate-layout", lambda: cutegemm.gemm(a, b, gate_layout="rows"), ValueError, "gate_layout"
        ),
        Case(
            "gemm-halves-cpu",
            lambda: cutegemm.gemm(a, b, activation="swiglu", gate_layout="halves"),
            ValueError,
            "CUDA",
        ),
        Case(
            "gemm_ref-bad-activation",
            lambda: cutegemm.gemm_ref(a, b, activation="softplus"),
            ValueError,
            "activation",
        ),
        Case(
            "gemm_ref-beta-no-c", lambda: cutegemm.gemm_ref(a, b, beta=1.0), ValueError, "needs the residual"
        ),
        Case(
            "gemm_ref-beta-gated",
            lambda: cutegemm.gemm_ref(a, b, beta=1.0, c=r(16, 12), activation="swiglu"),
            ValueError,
            "gated",
        ),
        Case("gemm_ref-M0", lambda: cutegemm.gemm_ref(r(0, 32), b), "ok", check=shape_is(0, 24, dtype=BF)),
        Case(
            "gemm_ref-K0-bias",
            lambda: cutegemm.gemm_ref(r(5, 0), r(0, 8), bias=torch.ones(8)),
            "ok",
            check=close64(lambda: torch.ones(5, 8)),
        ),
        Case("gemm_ref-N0", lambda: cutegemm.gemm_ref(a, r(32, 0)), "ok", check=shape_is(16, 0)),
        Case("gemm_ref-L0", lambda: cutegemm.gemm_ref(r(0, 16, 32), b), "ok", check=shape_is(0, 16, 24)),
    ]


def _grouped_cases():
    a, b, offs = r(40, 32), r(3, 32, 24), offs_of(10, 0, 30)
    ak, bk = r(16, 40), r(40, 24)
    return [
        Case("grouped-cpu-a", lambda: cutegemm.grouped_gemm(a, b, offs=offs), ValueError, "CUDA"),
        Case("grouped-str-a", lambda: cutegemm.grouped_gemm("a", b, offs=offs), TypeError, "torch.Tensor"),
        Case(
            "grouped-list-uneven",
            lambda: cutegemm.grouped_gemm([a], [b[0], b[1]]),
            ValueError,
            "equal length",
        ),
        Case("grouped-list-and-tensor", lambda: cutegemm.grouped_gemm([a], b[0]), ValueError, "two lists"),
        Case(
            "grouped-list-with-offs",
            lambda: cutegemm.grouped_gemm([a], [b[0]], offs=offs),
            ValueError,
            "offs",
        ),
        Case(
            "grouped-list-mixed-dtype",
            lambda: cutegemm.grouped_gemm([a, a.half()], [b[0], b[1].half()]),
            TypeError,
            "dtype",
        ),
        Case("grouped-list-cpu", lambda: cutegemm.grouped_gemm([a], [b[0]]), ValueError, "CUDA"),
        Case("grouped-list-empty", lambda: cutegemm.grouped_gemm([], []), "ok", check=lambda v: v == []),
        Case(
            "grouped_ref-packed-empty-expert",
            lambda: cutegemm.grouped_gemm_ref(a, b, offs=offs),
            "ok",
            check=close64(
                lambda: torch.cat([a[:10].double() @ b[0].double(), a[10:].double() @ b[2].double()])
            ),
        ),
        Case(
            "grouped_ref-E0",
            lambda: cutegemm.grouped_gemm_ref(a, r(0, 32, 24), offs=offs_of()),
            "ok",
            check=close64(lambda: torch.zeros(40, 24)),
        ),
        Case(
            "grouped_ref-kgrouped-K0-expert",
            lambda: cutegemm.grouped_gemm_ref(ak, bk, offs=offs_of(40, 0)),
            "ok",
            check=close64(
                lambda: torch.stack([ak.double() @ bk.double(), torch.zeros(16, 24, dtype=torch.float64)])
            ),
        ),
        Case(  # CPU tensors run the reference twins (GroupedExperts' autograd path is tested on the CPU)
            "experts-cpu-x",
            lambda: _experts_cpu(),
            "ok",
            check=lambda v: torch.testing.assert_close(v[0].float(), v[1].float(), atol=2e-2, rtol=2e-2),
        ),
        Case(
            "experts-device-mix",
            lambda: GroupedExperts(2, 32, 16)(r(8, 32).to("meta"), offs_of(4, 4)),
            ValueError,
            "one device",
        ),
        Case(
            "experts-ref-empty-expert",
            lambda: _experts_pair(),
            "ok",
            check=lambda v: torch.testing.assert_close(v[0], v[1]),
        ),
    ]


def _experts_cpu():
    """GroupedExperts on CPU bf16 tensors (the reference twins, bf16 between the GEMMs) vs forward_ref."""
    torch.manual_seed(0)
    m = GroupedExperts(2, 32, 16)
    x, offs = r(8, 32), offs_of(4, 4)
    return m(x, offs), m.forward_ref(x, offs)


def _experts_pair():
    """GroupedExperts.forward_ref with an empty expert vs an explicit per-expert loop."""
    torch.manual_seed(0)
    m = GroupedExperts(3, 32, 16, dtype=torch.float32)
    x, offs = torch.randn(12, 32), offs_of(5, 0, 7)
    ref = m.forward_ref(x, offs)
    rows = []
    for e, (s, t) in enumerate([(0, 5), (5, 5), (5, 12)]):
        gu = x[s:t] @ m.w_gate_up[e].t()
        rows.append((torch.nn.functional.silu(gu[:, 0::2]) * gu[:, 1::2]) @ m.w_down[e].t())  # interleaved
    return ref, torch.cat(rows).detach()


def _op_cases():
    a, b = r(7, 16), r(16, 10)
    return [
        Case("op-gemm-1d", lambda: OP.gemm(r(16), b), ValueError, "2 or 3 dims"),
        Case("op-gemm-int", lambda: OP.gemm(a.int(), b.int()), TypeError, "share one of"),
        Case("op-gemm-out-int", lambda: OP.gemm(a, b, out_dtype=torch.int32), TypeError, "out_dtype"),
        Case("op-gemm-batch", lambda: OP.gemm(r(2, 7, 16), r(3, 16, 10)), ValueError, "batch sizes"),
        Case("op-gemm-gated-odd", lambda: OP.gemm(a, r(16, 9), activation="swiglu"), ValueError, "even"),
        Case("op-gemm-M0", lambda: OP.gemm(r(0, 16), b), "ok", check=shape_is(0, 10, dtype=BF)),
        Case(
            "op-gemm-K0",
            lambda: OP.gemm(r(7, 0), r(0, 10), torch.ones(10)),
            "ok",
            check=close64(lambda: torch.ones(7, 10)),
        ),
        Case(
            "op-grouped-offs-2d",
            lambda: OP.grouped_gemm(r(8, 6), r(2, 6, 4), offs_of(4, 8).view(2, 1)),
            TypeError,
            "1-D",
        ),
        Case(
            "op-grouped-offs-float",
            lambda: OP.grouped_gemm(r(8, 6), r(2, 6, 4), offs_of(4, 8).float()),
            TypeError,
            "int32",
        ),
        Case(
            "op-grouped-a-3d",
            lambda: OP.grouped_gemm(r(1, 8, 6), r(2, 6, 4), offs_of(4, 8)),
            ValueError,
            "dims",
        ),
        Case(
            "op-grouped-k-mismatch",
            lambda: OP.grouped_gemm(r(4, 8), r(9, 4), offs_of(4, 4)),
            ValueError,
            "disagree",
        ),
        Case(
            "op-grouped-E0",
            lambda: OP.grouped_gemm(r(8, 6), r(0, 6, 4), offs_of()),
            "ok",
            check=shape_is(8, 4, dtype=BF),
        ),
        Case(
            "op-grouped-k-E0",
            lambda: OP.grouped_gemm(r(4, 8), r(8, 4), offs_of()),
            "ok",
            check=shape_is(0, 4, 4),
        ),
    ]


def _blockscaled_cases():
    x = torch.randn(4, 64)
    cases = [
        Case("qref-list", lambda: quantize_ref([[1.0]], "mxfp8"), TypeError, "torch.Tensor"),
        Case("qref-int", lambda: quantize_ref(x.int(), "mxfp8"), TypeError, "dtype"),
        Case("qref-1d", lambda: quantize_ref(x[0], "mxfp8"), ValueError, "rows, K"),
        Case("qref-empty", lambda: quantize_ref(x[:0], "mxfp8"), ValueError, "non-empty"),
        Case("qref-fmt-int", lambda: quantize_ref(x, 8), TypeError, "fmt"),
        Case("qref-fmt-unknown", lambda: quantize_ref(x, "mxfp7"), ValueError, "mxfp7"),
        Case("qref-fp4-odd-k", lambda: quantize_ref(x[:, :33], "nvfp4"), ValueError, "even"),
        Case("qref-gs-on-mx", lambda: quantize_ref(x, "mxfp8", global_scale=1.0), ValueError, "global_scale"),
        Case("qref-gs-negative", lambda: quantize_ref(x, "nvfp4", global_scale=-1.0), ValueError, "positive"),
        Case("qref-bad-rule", lambda: quantize_ref(x, "mxfp8", scale_rule="round"), ValueError, "scale_rule"),
        Case("dqref-tensor", lambda: dequantize_ref(x), TypeError, "BlockScaledTensor"),
        Case(
            "qref-roundtrip-ragged-k",
            lambda: dequantize_ref(quantize_ref(x[:, :40], "mxfp8", scale_rule="ceil")),
            "ok",
            check=lambda v: torch.testing.assert_close(v, x[:, :40], atol=1e-4, rtol=0.07),
        ),
    ]
    q = _quantize()
    if q is not None:  # cutegemm.quantize (GPU kernel) exists: its type checks happen before any device work
        cases += [
            Case("quantize-list", lambda: q([[1.0]], "mxfp8"), TypeError, "torch.Tensor"),
            Case("quantize-cpu", lambda: q(x, "mxfp8"), ValueError, "CUDA"),
        ]
    return cases


CASES = [*_gemm_cases(), *_grouped_cases(), *_op_cases(), *_blockscaled_cases()]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case(case: Case):
    torch.manual_seed(0)
    if case.expect == "ok":
        case.check(case.call())
    else:
        with pytest.raises(case.expect, match=case.match):
            case.call()


def test_case_table_is_large_and_unique():
    ids = [c.id for c in CASES]
    assert len(set(ids)) == len(ids)
    assert len(CASES) >= 40
    assert isinstance(quantize_ref(torch.randn(2, 32), "mxfp8"), BlockScaledTensor)
