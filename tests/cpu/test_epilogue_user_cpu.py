"""CPU checks of user-defined epilogues (keys, reference evaluation) and of the quantized-output
config rules; the kernels themselves are compiled by tests/test_compile_check.py."""

from __future__ import annotations

import pytest
import torch

import cutegemm
from cutegemm.config import Form, GemmConfig, GemmProblem, can_implement
from cutegemm.epilogue import EpilogueSpec, fn
from cutegemm.epilogue.quant import quant_groups
from cutegemm.epilogue.user import apply_user_ref, register, user_key


def epi_a(acc, row, col, bias):
    return fn.silu(acc + bias[col])


def test_key_is_stable_and_source_sensitive():
    assert user_key(epi_a) == user_key(epi_a)

    def epi_b(acc, row, col, bias):
        return fn.silu(acc - bias[col])

    assert user_key(epi_b) != user_key(epi_a)


def test_key_depends_on_closure_values():
    def make(k):
        def epi(acc, row, col):
            return acc * k

        return epi

    assert user_key(make(2.0)) == user_key(make(2.0))
    assert user_key(make(2.0)) != user_key(make(3.0))


def test_closure_over_tensor_rejected():
    t = torch.ones(2)

    def epi(acc, row, col):
        return acc * t[0]

    with pytest.raises(TypeError, match="epilogue_args"):
        user_key(epi)


def test_register_needs_three_parameters():
    with pytest.raises(TypeError, match="acc, row, col"):
        register(lambda acc, row: acc)


def test_apply_user_ref_matches_direct_formula():
    acc = torch.randn(5, 7, dtype=torch.float64)
    bias = torch.randn(7)
    got = apply_user_ref(epi_a, acc, (bias,))
    want = torch.nn.functional.silu(acc + bias.double())
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-9)


def test_apply_user_ref_row_vector_and_clamp():
    acc = torch.zeros(4, 3)

    def epi(acc, row, col, v):
        return acc + v[row]

    v = torch.tensor([1.0, 2.0])  # shorter than M: indices clamp to the last element
    got = apply_user_ref(epi, acc, (v,))
    assert got[:, 0].tolist() == [1.0, 2.0, 2.0, 2.0]


def test_vector_indexed_by_expression_rejected():
    def epi(acc, row, col, v):
        return acc + v[col + 1]

    with pytest.raises(TypeError, match="row or col"):
        apply_user_ref(epi, torch.zeros(2, 2), (torch.ones(3),))


def test_gemm_ref_user_and_quantized():
    a = torch.randn(40, 64)
    b = torch.randn(64, 96)
    bias = torch.randn(96)
    y = cutegemm.gemm_ref(a, b, epilogue=epi_a, epilogue_args=(bias,), out_dtype=torch.float32)
    torch.testing.assert_close(y, torch.nn.functional.silu(a @ b + bias), rtol=1e-5, atol=1e-5)
    q = cutegemm.gemm_ref(a, b, out_dtype="mxfp8")
    assert q.data.shape == (40, 96) and q.fmt.name == "mxfp8"
    with pytest.raises(ValueError, match="out_global_scale"):
        cutegemm.gemm_ref(a, b, out_dtype="nvfp4")


def test_fn_torch_path_matches_torch():
    x = torch.linspace(-8, 8, 1001, dtype=torch.float64)
    torch.testing.assert_close(fn.silu(x), torch.nn.functional.silu(x), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(fn.gelu(x), torch.nn.functional.gelu(x), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(fn.maximum(x, 0.5), torch.clamp(x, min=0.5))
    torch.testing.assert_close(fn.minimum(x, 0.5), torch.clamp(x, max=0.5))


def test_quant_config_rules():
    E = EpilogueSpec
    ok = GemmConfig("sm_90a", out_dtype="e4m3", epilogue=E(quant="mxfp8"))
    assert can_implement(ok)[0]
    assert not can_implement(GemmConfig("sm_90a", out_dtype="bf16", epilogue=E(quant="mxfp8")))[0]
    assert can_implement(GemmConfig("sm_100a", out_dtype="e4m3", epilogue=E(quant="mxfp8")))[0]
    assert not can_implement(GemmConfig("sm_100a", out_dtype="e4m3", tile_m=64, epilogue=E(quant="mxfp8")))[0]
    assert can_implement(GemmConfig("sm_90a", out_dtype="u8", form=Form.GROUPED, epilogue=E(quant="nvfp4")))[0]
    assert not can_implement(GemmConfig("sm_90a", out_dtype="u8", form=Form.GROUPED, epilogue=E(quant="nvfp4", beta=True)))[0]
    p = GemmProblem(128, 48, 64, out_dtype="e4m3")
    assert "multiple of 32" in can_implement(ok, p)[1]
    with pytest.raises(ValueError):
        E(quant="int8")
    with pytest.raises(ValueError, match="user epilogue"):
        E(user="abc", bias=True)


def test_quant_groups_proves_hopper_fragment_layout():
    # WGMMA: a thread's columns 2*(lane%4) + {0,1} + 8j, rows r and r+8
    offs = [(r, c + 8 * j) for j in range(4) for r in (0, 8) for c in (0, 1)]
    g = quant_groups(offs, 32, 4, 2)
    assert sorted(g) == [(0, 0), (8, 0)] and all(len(v) == 8 for v in g.values())
    g16 = quant_groups(offs, 16, 4, 2)
    assert len(g16) == 4
    with pytest.raises(ValueError, match="cross"):
        quant_groups([(0, 30)], 32, 4, 2)
