"""The warm path of ``quantize`` on the CPU (no GPU): the CUDA check is replaced and the compiled
quantize / amax kernels are a no-op that records its arguments (tests/host_overhead_cpu.py
``cpu_quantize_path``). A warm call must hand the kernel what a cold call does and return the same
kind of BlockScaledTensor, keep every check of the cold call, fall back when x cannot be used in
place, and hold nothing of x."""

import gc
import weakref

import pytest
import torch

import cutegemm
from cutegemm.blockscaled import quantize_launch as ql

from ..host_overhead_cpu import cpu_quantize_path

BF = torch.bfloat16


@pytest.fixture
def kernel():
    with cpu_quantize_path() as k:
        yield k


def _args(k, fresh=(1, 2)):
    res = []
    for i, a in enumerate(k.args):
        if isinstance(a, torch.Tensor):
            meta = (tuple(a.shape), a.stride(), a.dtype, a.requires_grad)
            res.append(meta if i in fresh else (*meta, a.data_ptr()))
        else:
            res.append(a)
    return res


def _result(q):
    t = lambda x: None if x is None else (tuple(x.shape), x.stride(), x.dtype)  # noqa: E731
    return t(q.data), t(q.scales), q.fmt, q.shape, q.scales_swizzled, t(q.global_scale)


@pytest.mark.parametrize("shape", [(128, 1024), (16, 1024), (2, 40, 64), (8, 96)],
                         ids=["aligned", "rows-padded", "3d", "cols-padded"])  # fmt: skip
@pytest.mark.parametrize("fmt, gs", [("mxfp8", None), ("mxfp4", None), ("nvfp4", 0.5), ("nvfp4", None)],
                         ids=["mxfp8", "mxfp4", "nvfp4-gs", "nvfp4-amax"])  # fmt: skip
def test_warm_quantize_passes_what_the_cold_call_passes(kernel, fmt, gs, shape):
    x = torch.randn(shape, dtype=BF)
    cold_q = cutegemm.quantize(x, fmt, global_scale=gs)
    cold, cold_gs = _args(kernel), kernel.args[3].clone()
    assert len(ql._PLANS) == 1
    hits = ql._plan.cache_info().hits
    warm_q = cutegemm.quantize(x, fmt, global_scale=gs)
    warm = _args(kernel)
    assert ql._plan.cache_info().hits == hits, "the warm call did not take the warm plan"
    if fmt == "nvfp4":  # the global scale: a fresh tensor per call (its value, or the amax's)
        cold[3], warm[3] = cold[3][:3], warm[3][:3]
        assert torch.equal(kernel.args[3], cold_gs)
    assert warm == cold
    assert _result(warm_q) == _result(cold_q)
    if ql._PLANS[next(iter(ql._PLANS))].p.padded:  # the no-op kernel writes nothing: padding stays zero
        assert not warm_q.scales.view(torch.uint8).any()


def test_warm_quantize_keeps_every_check(kernel):
    x = torch.randn(64, 256, dtype=BF)
    for _ in range(2):
        cutegemm.quantize(x, "mxfp8")
        cutegemm.quantize(x, "nvfp4", global_scale=0.5)
    with pytest.raises(ValueError, match="global_scale"):
        cutegemm.quantize(x, "nvfp4", global_scale=-1.0)
    with pytest.raises(ValueError, match="global_scale"):
        cutegemm.quantize(x, "mxfp8", global_scale=0.5)
    with pytest.raises(ValueError, match="scale_rule"):
        cutegemm.quantize(x, "mxfp8", scale_rule="bogus")
    with pytest.raises(ValueError, match="scale_rule"):
        cutegemm.quantize(x, "nvfp4", scale_rule="ceil", global_scale=0.5)
    with pytest.raises(ValueError, match="fmt|format"):
        cutegemm.quantize(x, "mxfp7")
    with pytest.raises(TypeError, match="dtype"):
        cutegemm.quantize(x.double(), "mxfp8")
    with pytest.raises(ValueError, match="even"):
        cutegemm.quantize(torch.randn(64, 33, dtype=BF), "mxfp4")


def test_warm_quantize_falls_back_when_x_is_not_used_in_place(kernel):
    x = torch.randn(64, 256, dtype=BF)
    cutegemm.quantize(x, "mxfp8")
    cutegemm.quantize(x, "mxfp8")
    assert kernel.args[0].data_ptr() == x.data_ptr()
    buf = torch.randn(64 * 256 + 8, dtype=BF)
    x_off = buf[1 : 1 + 64 * 256].view(64, 256)  # same key, 2 bytes off 16: an aligned copy
    cutegemm.quantize(x_off, "mxfp8")
    assert kernel.args[0].data_ptr() % 16 == 0 and torch.equal(kernel.args[0], x_off.reshape(-1))
    n = len(ql._PLANS)
    for bad in (torch.randn(256, 64, dtype=BF).t(), torch.randn(64, 250, dtype=BF)):  # strided; K % 32 != 0
        for _ in range(2):
            q = cutegemm.quantize(bad, "mxfp8")
            assert q.shape == bad.shape and kernel.args[0].data_ptr() != bad.data_ptr()
    assert len(ql._PLANS) == n
    xg = x.clone().requires_grad_()
    cutegemm.quantize(xg, "mxfp8")
    assert kernel.args[0].data_ptr() == xg.data_ptr() and not kernel.args[0].requires_grad


def test_warm_quantize_plan_holds_nothing_of_x(kernel):
    x = torch.randn(64, 256, dtype=BF)
    for _ in range(2):
        cutegemm.quantize(x, "mxfp8")
    ref = weakref.ref(x)
    kernel.args = None
    del x
    gc.collect()
    assert ref() is None


def test_warm_quantize_plans_are_bounded(kernel, monkeypatch):
    monkeypatch.setattr(ql, "_MAX_PLANS", 4)
    for m in range(1, 11):
        cutegemm.quantize(torch.randn(m, 64, dtype=BF), "mxfp8")
        assert len(ql._PLANS) <= 4


class _WriteKernel:
    """Writes a byte pattern into the data words (argument 1) and 7 into every scale byte
    (argument 2): the returned BlockScaledTensor must be views of exactly those buffers."""

    def __init__(self):
        self.calls, self.args = 0, None

    def __call__(self, *args):
        self.calls += 1
        self.args = args
        args[1].fill_(0x01020304)
        args[2].fill_(7)


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4"])
def test_warm_result_is_what_the_kernel_wrote(fmt):
    with cpu_quantize_path(_WriteKernel()):
        x = torch.randn(2, 128, 64, dtype=BF)
        for _ in range(3):  # cold, then warm
            q = cutegemm.quantize(x, fmt, **({"global_scale": 0.5} if fmt == "nvfp4" else {}))
            data, scales = q.data.view(torch.uint8), q.scales.view(torch.uint8)
            assert data.shape == (2, 128, 64 // (2 if fmt != "mxfp8" else 1))
            assert torch.equal(data.reshape(-1, 4), torch.tensor([[4, 3, 2, 1]], dtype=torch.uint8).expand(data.numel() // 4, 4))
            assert bool((scales == 7).all()) and scales.shape == (2, 128, 4)
        assert len(ql._PLANS) == 1


def test_quantize_op_cuda_function_keeps_its_checks_and_results(kernel, monkeypatch):
    """torch.ops.cutegemm.quantize through its CUDA function (CPU tensors, the warm quantize path
    below it): the wrapper's BlockScaledTensor matches cutegemm.quantize's and the kernel gets the
    same arguments (the default scale rule left out of the dispatcher call, 'ceil' passed); the
    memoized validation still rejects every invalid call, also after valid calls of its shape."""
    from cutegemm import ops, quant_ops

    from ..host_overhead_cpu import cuda_functions_on_cpu

    rules, real = [], quant_ops.quantize_tensors
    monkeypatch.setattr(quant_ops, "quantize_tensors", lambda x, f, gs, rule: rules.append(rule) or real(x, f, gs, rule))
    x = torch.randn(64, 256, dtype=BF)
    with cuda_functions_on_cpu("quantize") as routed:
        if not routed:
            pytest.skip("this torch has no make_autograd_impl: custom_op's own path only")
        for fmt, kw in (("mxfp8", {}), ("mxfp8", {"scale_rule": "ceil"}), ("mxfp4", {}), ("nvfp4", {"global_scale": 0.5})):
            direct = cutegemm.quantize(x, fmt, **kw)
            want = _args(kernel, fresh=(1, 2, 3))
            for _ in range(2):
                rules.clear()
                q = ops.quantize(x, fmt, **kw)
                assert rules == [kw.get("scale_rule", "ocp")]
                assert _args(kernel, fresh=(1, 2, 3)) == want
                assert _result(q) == _result(direct) and q.fmt is direct.fmt and q.scales_swizzled
                assert (q.global_scale is None) == (fmt != "nvfp4")
        gs2 = torch.ones(2)
        for _ in range(2):
            with pytest.raises(TypeError, match="one-element"):
                torch.ops.cutegemm.quantize(x, "nvfp4", gs2)
            with pytest.raises(ValueError, match="fmt must be"):
                torch.ops.cutegemm.quantize(x, "MXFP8", None)
            with pytest.raises(ValueError, match="scale_rule"):
                torch.ops.cutegemm.quantize(x, "mxfp8", None, scale_rule="bogus")
            with pytest.raises(ValueError, match="global scale"):
                torch.ops.cutegemm.quantize(x, "mxfp8", torch.ones(()))
            with pytest.raises(TypeError, match="dtype"):
                torch.ops.cutegemm.quantize(x.double(), "mxfp8", None)
        data, scales, gs = torch.ops.cutegemm.quantize(x, "mxfp8", None)
        assert gs.shape == (0,) and gs.dtype == torch.float32 and gs.device == x.device
