"""The warm-call fast paths of ``gemm`` / ``grouped_gemm`` on the CPU (no GPU): the CUDA-only
pieces are replaced (tests/host_overhead_cpu.py) and the compiled kernel is a no-op that records
its arguments, so these tests check what the fast path hands the kernel, when it must fall back
to the slow path, and that the memoized weight view is never stale nor keeps a tensor alive."""

import gc

import pytest
import torch

import cutegemm
from cutegemm.gemm import dense
from cutegemm.grouped import packed as grouped

from ..host_overhead_cpu import cpu_fast_path

BF = torch.bfloat16


@pytest.fixture
def kernel():
    with cpu_fast_path() as k:
        yield k


def _meta(t):
    return None if t is None else (tuple(t.shape), t.stride(), t.data_ptr(), t.dtype)


def _tensor_args(k):
    return [_meta(x) if isinstance(x, torch.Tensor) else x for x in k.args]


def _count_plans(monkeypatch, module, name):
    calls = []
    real = getattr(module, name)

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls


@pytest.mark.parametrize("case", ["plain", "bias_alpha_act", "batched", "out_given", "col_major_b"])
def test_dense_fast_path_passes_what_the_slow_path_passes(kernel, monkeypatch, case):
    a, b = torch.randn(64, 32, dtype=BF), torch.randn(32, 48, dtype=BF)
    kw = {}
    if case == "bias_alpha_act":
        kw = dict(bias=torch.randn(48), alpha=0.5, activation="silu")
    elif case == "batched":
        a, b = torch.randn(3, 64, 32, dtype=BF), torch.randn(3, 32, 48, dtype=BF)
    elif case == "out_given":
        kw = dict(out=torch.empty(64, 48, dtype=torch.float32))
    elif case == "col_major_b":
        b = torch.randn(48, 32, dtype=BF).t()
    plans = _count_plans(monkeypatch, dense, "_plan")
    first = cutegemm.gemm(a, b, **kw)
    slow = _tensor_args(kernel)
    second = cutegemm.gemm(a, b, **kw)
    fast = _tensor_args(kernel)
    assert len(plans) == 1 and kernel.calls == 2
    assert first.shape == second.shape and first.dtype == second.dtype
    # identical arguments but the freshly allocated output (same shape and strides)
    out_i = 2
    if "out" in kw:
        assert fast == slow
    else:
        assert fast[:out_i] + fast[out_i + 1 :] == slow[:out_i] + slow[out_i + 1 :]
        assert fast[out_i][:2] == slow[out_i][:2] and fast[out_i][2] == second.data_ptr()


def test_dense_fast_path_falls_back_when_needed(kernel, monkeypatch):
    a, b = torch.randn(64, 32, dtype=BF), torch.randn(32, 48, dtype=BF)
    cutegemm.gemm(a, b)
    plans = _count_plans(monkeypatch, dense, "_plan")
    # another current device: the slow path switches device (torch.cuda.device rejects a CPU one)
    monkeypatch.setattr(dense, "current_device", lambda: 7)
    with pytest.raises(ValueError, match="cuda device"):
        cutegemm.gemm(a, b)
    monkeypatch.setattr(dense, "current_device", type(None))
    # b on another device (part of the key now): the slow path's error, not a launch
    with pytest.raises(ValueError, match="same device"):
        cutegemm.gemm(a, torch.empty(32, 48, dtype=BF, device="meta"))
    # a at a storage offset that breaks 16-byte alignment: a copy is passed
    big = torch.randn(64 * 32 + 1, dtype=BF)
    a_off = big[1:].view(64, 32)
    cutegemm.gemm(a_off, b)
    assert kernel.args[0].data_ptr() != a_off.data_ptr()
    torch.testing.assert_close(kernel.args[0][:, :, 0], a_off, rtol=0, atol=0)
    assert len(plans) == 3


def test_flat_launch_passes_the_callers_2d_tensors(kernel):
    """2-D operands whose strides TMA takes go to a flat (GemmConfig.flat) kernel as they are:
    no per-call views (host overhead); size-1 modes and batched calls keep the 3-D views."""
    a, b = torch.randn(64, 32, dtype=BF), torch.randn(48, 32, dtype=BF).t()
    for _ in range(2):
        out = cutegemm.gemm(a, b)
        assert kernel.args[0] is a and kernel.args[1] is b and kernel.args[2] is out
    plan = next(iter(dense.PLANS.values()))
    assert plan.config.flat and plan.config.name.startswith("dense-2d")
    cutegemm.gemm(torch.randn(1, 32, dtype=BF), b)  # M = 1: a's row stride is free, so a view
    assert kernel.args[0].dim() == 3
    cutegemm.gemm(a.unsqueeze(0), b.unsqueeze(0))
    assert kernel.args[0].dim() == 3 and kernel.args[1].dim() == 3


def test_weight_view_memo_is_never_stale(kernel):
    # batched operands: the kernel gets (N, K, L) views of b (2-D calls pass b itself)
    a, b = torch.randn(2, 64, 32, dtype=BF), torch.randn(2, 32, 48, dtype=BF)
    cutegemm.gemm(a, b)
    cutegemm.gemm(a, b)
    v1 = kernel.args[1]
    cutegemm.gemm(a, b)
    assert kernel.args[1] is v1, "same weight object: the memoized view is reused"
    b2 = b.clone()
    cutegemm.gemm(a, b2)
    assert kernel.args[1].data_ptr() == b2.data_ptr()
    # same object, new storage (b.data = ..., b.set_()): the view follows
    new = torch.randn(2, 32, 48, dtype=BF)
    b.set_(new)
    cutegemm.gemm(a, b)
    assert kernel.args[1].data_ptr() == new.data_ptr()
    assert torch.equal(kernel.args[1][:, :, 0].t(), new[0])


def test_weight_view_memo_does_not_keep_the_weight_alive(kernel):
    a, b = torch.randn(2, 64, 32, dtype=BF), torch.randn(2, 32, 48, dtype=BF)
    for _ in range(2):
        cutegemm.gemm(a, b)
    plan = next(iter(dense.PLANS.values()))
    assert plan.b_memo is not None
    kernel.args = None
    del b
    gc.collect()
    assert plan.b_memo is None


def _grouped_inputs(n=48):
    x = torch.randn(96, 32, dtype=BF)
    w = torch.randn(3, n, 32, dtype=BF).transpose(1, 2)
    offs = torch.tensor([20, 20, 90], dtype=torch.int32)
    return x, w, offs


def test_grouped_fast_path_passes_what_the_slow_path_passes(kernel, monkeypatch):
    x, w, offs = _grouped_inputs()
    plans = _count_plans(monkeypatch, grouped, "_plan_packed")
    y1 = cutegemm.grouped_gemm(x, w, offs=offs, alpha=0.5)
    slow = _tensor_args(kernel)
    y2 = cutegemm.grouped_gemm(x, w, offs=offs, alpha=0.5)
    fast = _tensor_args(kernel)
    assert len(plans) == 1 and kernel.calls == 2
    assert y1.shape == y2.shape == (96, 48) and y2.dtype == BF
    assert fast[:2] + fast[3:] == slow[:2] + slow[3:]
    assert fast[2][:2] == slow[2][:2] and fast[2][2] == y2.data_ptr()
    out = torch.empty(96, 48, dtype=torch.float32)
    assert cutegemm.grouped_gemm(x, w, offs=offs, out=out) is out
    assert cutegemm.grouped_gemm(x, w, offs=offs, out=out) is out
    assert kernel.args[2].data_ptr() == out.data_ptr() and len(plans) == 2


def test_grouped_fast_path_keeps_every_check(kernel):
    x, w, offs = _grouped_inputs()
    cutegemm.grouped_gemm(x, w, offs=offs)
    with pytest.raises(ValueError, match="non-decreasing"):
        cutegemm.grouped_gemm(x, w, offs=torch.tensor([20, 10, 90], dtype=torch.int32), check_offs=True)
    with pytest.raises(TypeError, match="int32"):
        cutegemm.grouped_gemm(x, w, offs=offs.long())
    with pytest.raises(ValueError, match="experts"):
        cutegemm.grouped_gemm(x, w, offs=offs[:2])
    with pytest.raises(ValueError, match="must be on"):
        cutegemm.grouped_gemm(x, w.to("meta"), offs=offs)
    with pytest.raises(ValueError, match="16-byte aligned"):
        big = torch.randn(96 * 32 + 1, dtype=BF)
        cutegemm.grouped_gemm(big[1:].view(96, 32), w, offs=offs)


def test_grouped_quantized_output_keeps_its_scales_on_the_warm_path(kernel):
    """A quantized grouped output (no other epilogue input) is a BlockScaledTensor on every call:
    the warm path must not take the plain-dtype branch (it once allocated with the format name
    as a torch dtype)."""
    from cutegemm.blockscaled import BlockScaledTensor

    x, w, offs = _grouped_inputs(n=64)
    results = [cutegemm.grouped_gemm(x, w, offs=offs, out_dtype="mxfp8") for _ in range(3)]
    assert all(isinstance(r, BlockScaledTensor) and r.shape == (96, 64) for r in results)
    assert kernel.args[11] is not None, "the kernel got no scale bytes on the warm path"
