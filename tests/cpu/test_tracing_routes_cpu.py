"""The Python routes that launch kernels directly (data pointers and all) must step aside while
torch traces: AOTAutograd traces a compiled backward on fake tensors without Dynamo, so
``torch.compiler.is_compiling()`` is False there (the H100 run of tests/gpu/test_ops_gpu.py's
compiled MoE blocks failed in ``ops.packed_zero_tail`` on a FakeTensor's data pointer).
``runtime.device.eager_cuda`` is the one test they use."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from cutegemm import moe, ops
from cutegemm.runtime.device import eager_cuda


class _Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_eager_cuda_refuses_fakes_modes_and_cpu():
    assert not eager_cuda(torch.empty(2))
    assert not eager_cuda(torch.nn.Parameter(torch.empty(2)))  # a Parameter counts as plain, on CUDA
    with FakeTensorMode():
        assert not eager_cuda(torch.empty(2, 2, device="cuda"))
    with _Passthrough():
        assert not eager_cuda(torch.empty(2))


def test_fake_cuda_operands_take_the_ops(monkeypatch):
    """With fake CUDA operands the routes call the custom op (its fake kernel gives the shape),
    never a kernel entry."""

    def no_kernel(*args, **kwargs):
        raise AssertionError("a kernel entry was called on fake tensors")

    monkeypatch.setattr(ops, "_grouped_kernel", no_kernel)
    monkeypatch.setattr(moe, "grouped_gemm", no_kernel)
    monkeypatch.setattr(ops, "zero_rows_past_end", lambda t, offs: t)  # offs[-1] needs a CUDA build
    with FakeTensorMode():
        a = torch.empty(64, 32, device="cuda", dtype=torch.bfloat16)
        b = torch.empty(4, 32, 48, device="cuda", dtype=torch.bfloat16)
        offs = torch.empty(4, device="cuda", dtype=torch.int32)
        with torch.no_grad():
            assert ops.packed_zero_tail(a, b, offs).shape == (64, 48)
            assert moe.grouped_mm(a, b, offs).shape == (64, 48)
        assert not moe._gather_in_loads(a, offs, 4)


@pytest.mark.parametrize("grad", [False, True])
def test_cpu_operands_unchanged(grad):
    """CPU tensors keep their route (the op with zeroed tail rows), with or without grad mode."""
    a = torch.randn(8, 16)
    b = torch.randn(2, 16, 4)
    offs = torch.tensor([3, 6], dtype=torch.int32)
    with torch.set_grad_enabled(grad):
        out = ops.packed_zero_tail(a, b, offs)
    ref = torch.cat((a[:3] @ b[0], a[3:6] @ b[1], torch.zeros(2, 4)))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
