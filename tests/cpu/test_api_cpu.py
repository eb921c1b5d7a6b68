"""CPU: the public API rejects bad input with a clear error before touching a GPU; gemm_ref."""

import pytest
import torch

import cutegemm


def test_cpu_tensors_rejected():
    with pytest.raises(ValueError, match="a must be a CUDA tensor"):
        cutegemm.gemm(torch.randn(8, 8, dtype=torch.bfloat16), torch.randn(8, 8, dtype=torch.bfloat16))


def test_non_tensor_rejected():
    with pytest.raises(TypeError, match="a must be a torch.Tensor"):
        cutegemm.gemm([[1.0]], torch.randn(8, 8))


def test_gemm_ref_matches_float64():
    a = torch.randn(33, 40, dtype=torch.bfloat16)
    b = torch.randn(40, 24, dtype=torch.bfloat16)
    ref = cutegemm.gemm_ref(a, b, out_dtype=torch.float32, alpha=0.5)
    exact = (a.double() @ b.double()) * 0.5
    assert ref.dtype == torch.float32
    torch.testing.assert_close(ref.double(), exact, atol=1e-4, rtol=1e-4)


def test_public_names():
    for name in ("gemm", "gemm_ref", "GemmConfig", "can_implement", "EpilogueSpec"):
        assert hasattr(cutegemm, name)
