"""CPU: the packed grouped form's epilogue rules — grouped_gemm_ref against hand-written per-expert
loops (bias per expert / shared, activations, gated, FP8-style scales, user epilogues with packed
row indices), the per-expert vector conversion the kernel reads, config rules and errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cutegemm.config import Form, GemmConfig, config_errors
from cutegemm.epilogue import EpilogueSpec, interleave_gate_up
from cutegemm.gemm.fp8_scales import scale_vector
from cutegemm.grouped.packed import _per_expert, grouped_gemm, grouped_gemm_ref

F64 = torch.float64


def _setup(counts, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(sum(counts) + 2, k, generator=g, dtype=F64)
    b = torch.randn(len(counts), k, n, generator=g, dtype=F64)
    offs = torch.tensor(counts).cumsum(0).to(torch.int32)
    return a, b, offs


def _loop(a, b, counts, fn):
    """out[rows of e] = fn(e, a_e @ b_e); rows past the last expert stay 0."""
    rows = []
    start = 0
    out = None
    for e, c in enumerate(counts):
        y = fn(e, a[start : start + c] @ b[e])
        if out is None:
            out = torch.zeros(a.shape[0], y.shape[1], dtype=F64)
        out[start : start + c] = y
        rows.append((start, start + c))
        start += c
    return out


@settings(max_examples=30, deadline=None)
@given(
    counts=st.lists(st.integers(0, 9), min_size=1, max_size=5),
    n2=st.integers(1, 6),
    activation=st.sampled_from([None, "relu", "silu", "gelu", "gelu_tanh", "swiglu", "geglu"]),
    shared_bias=st.booleans(),
    alpha=st.sampled_from([1.0, -0.5]),
)
def test_ref_matches_per_expert_loop(counts, n2, activation, shared_bias, alpha):
    n, k = 2 * n2, 5
    a, b, offs = _setup(counts, n, k)
    E = len(counts)
    bias = torch.randn(n, dtype=F64) if shared_bias else torch.randn(E, n, dtype=F64)
    got = grouped_gemm_ref(a, b, offs=offs, alpha=alpha, bias=bias, activation=activation, compute_dtype=F64)
    act = {
        None: lambda y: y,
        "relu": torch.relu,
        "silu": torch.nn.functional.silu,
        "gelu": torch.nn.functional.gelu,
        "gelu_tanh": lambda y: torch.nn.functional.gelu(y, approximate="tanh"),
    }

    def fn(e, y):
        y = alpha * y + (bias if shared_bias else bias[e])
        if activation == "swiglu":
            return torch.nn.functional.silu(y[:, 0::2]) * y[:, 1::2]
        if activation == "geglu":
            return torch.nn.functional.gelu(y[:, 0::2]) * y[:, 1::2]
        return act[activation](y)

    want = _loop(a, b, counts, fn)
    assert got.dtype == F64 and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_ref_halves_layout_equals_interleaved():
    counts = [3, 0, 4]
    a, b, offs = _setup(counts, 8, 4, seed=2)
    bias = torch.randn(3, 8, dtype=F64)
    halves = grouped_gemm_ref(a, b, offs=offs, bias=bias, activation="swiglu", gate_layout="halves", compute_dtype=F64)
    inter = grouped_gemm_ref(a, interleave_gate_up(b, dim=-1), offs=offs, bias=interleave_gate_up(bias, dim=-1),
                             activation="swiglu", compute_dtype=F64)  # fmt: skip
    torch.testing.assert_close(halves, inter, rtol=0, atol=0)


def test_ref_scales_and_user_epilogue_use_packed_rows():
    counts = [2, 3]
    a, b, offs = _setup(counts, 4, 3, seed=3)
    sa = torch.rand(a.shape[0], dtype=torch.float32) + 0.5
    sb = torch.rand(2, 4, dtype=torch.float32) + 0.5
    got = grouped_gemm_ref(a, b, offs=offs, scale_a=sa, scale_b=sb, compute_dtype=F64, out_dtype=F64)
    want = _loop(a, b, counts, lambda e, y: y * sb[e].double())
    want = want * sa.double()[:, None]
    want[sum(counts) :] = 0
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)

    def epi(acc, row, col, rs):
        return acc * rs[row] + col

    rs = torch.arange(a.shape[0], dtype=F64)
    got = grouped_gemm_ref(a, b, offs=offs, epilogue=epi, epilogue_args=(rs,), compute_dtype=F64, out_dtype=F64)
    base = _loop(a, b, counts, lambda e, y: y)
    want = base * rs[:, None] + torch.arange(4, dtype=F64)
    want[sum(counts) :] = 0
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_per_expert_vector_forms():
    E, n = 3, 4
    full = torch.arange(E * n, dtype=torch.float32).reshape(E, n)
    assert torch.equal(_per_expert("bias", full, E, n, full.device), full.reshape(-1))
    shared = torch.arange(n, dtype=torch.float32)
    assert torch.equal(_per_expert("bias", shared, E, n, shared.device), shared.repeat(E))
    per_e = torch.tensor([1.0, 2.0, 3.0])
    assert torch.equal(_per_expert("s", per_e, E, n, per_e.device), per_e.repeat_interleave(n))
    strided = full.t().contiguous().t()  # (E, n) column-major: copied to the flat row layout
    assert torch.equal(_per_expert("bias", strided, E, n, full.device), full.reshape(-1))
    with pytest.raises(ValueError, match="bias must have shape"):
        _per_expert("bias", torch.zeros(E + 1, n), E, n, full.device)
    with pytest.raises(TypeError, match="dtype"):
        _per_expert("bias", torch.zeros(E, n, dtype=torch.int32), E, n, full.device)
    with pytest.raises(ValueError, match="1 or 5 elements"):
        scale_vector("scale_a", torch.ones(4), 5, full.device, "row of a")  # the packed form's scale_a rule
    assert scale_vector("scale_a", torch.ones(5, 1), 5, full.device, "row of a").shape == (5,)


def test_grouped_config_rules_allow_epilogues_but_beta():
    g = dict(arch="sm_90a", form=Form.GROUPED, tile_m=128, tile_n=128)
    assert not config_errors(GemmConfig(**g, epilogue=EpilogueSpec(bias=True, gated="swiglu")))
    assert not config_errors(GemmConfig(**g, out_dtype="e4m3", epilogue=EpilogueSpec(quant="mxfp8")))
    errs = config_errors(GemmConfig(**g, epilogue=EpilogueSpec(beta=True)))
    assert any("beta" in e for e in errs)


def test_cpu_tensors_and_other_forms_are_rejected():
    a, b, offs = _setup([2, 2], 8, 8)
    with pytest.raises(ValueError, match="CUDA"):
        grouped_gemm(a.float(), b.float(), offs=offs, activation="silu")
    with pytest.raises(ValueError, match="packed"):
        grouped_gemm([a], [b[0]], bias=torch.zeros(8))
    with pytest.raises(ValueError, match="no gated"):  # the list form takes elementwise activations only
        grouped_gemm([a], [b[0]], activation="swiglu")
