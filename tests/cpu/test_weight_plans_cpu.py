"""The warm-call plans of the low-precision-weight GEMM (``weight_only.launch``) on the CPU: the
CUDA-only pieces are replaced (tests/host_overhead_cpu.py ``cpu_weight_path``) and the kernel is a
no-op that records its arguments. A warm call must hand the kernel what a cold call does, and a
plan must never serve a weight whose tensors changed, nor keep a freed weight alive."""

import gc
import weakref

import pytest
import torch

import cutegemm
from cutegemm.blockscaled import quantize_ref
from cutegemm.blockscaled.weight_only import launch

from ..host_overhead_cpu import cpu_weight_path, kernel_args

BF = torch.bfloat16


@pytest.fixture
def kernel():
    with cpu_weight_path() as k:
        yield k


def _cold_then_warm(k, call):
    """Kernel arguments of a cold call (plans cleared) and of the warm call after it; the output
    tensors (fresh each call) are compared by shape and dtype only."""
    launch._PLANS.clear()
    call()
    cold = kernel_args(k)
    assert launch._PLANS, "the cold call made no plan"
    call()
    warm = kernel_args(k)
    for i in (3,):  # out
        cold[i], warm[i] = cold[i][:2] + cold[i][3:], warm[i][:2] + warm[i][3:]
    return cold, warm


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
@pytest.mark.parametrize("m", [1, 16, 48, 300])
def test_warm_dense_call_passes_what_the_cold_call_passes(kernel, fmt, m):
    qw = quantize_ref(torch.randn(1024, 512), fmt, **({"global_scale": 0.5} if fmt == "nvfp4" else {}))
    x = torch.randn(m, 512, dtype=BF)
    cold, warm = _cold_then_warm(kernel, lambda: cutegemm.gemm(x, qw, alpha=0.25))
    if kernel.args[0].data_ptr() != x.data_ptr():  # x copied per call (fragment order, or a cast)
        cold[0], warm[0] = cold[0][:2], warm[0][:2]
    assert cold == warm


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_warm_grouped_call_passes_what_the_cold_call_passes(kernel, fmt):
    qe = quantize_ref(torch.randn(4, 256, 512), fmt)
    x = torch.randn(70, 512, dtype=BF)
    offs = torch.tensor([10, 10, 40, 64], dtype=torch.int32)
    cold, warm = _cold_then_warm(kernel, lambda: cutegemm.grouped_gemm(x, qe, offs=offs))
    cold[0], warm[0] = cold[0][:2], warm[0][:2]
    assert cold == warm and kernel.args[4] is offs


def test_a_plan_never_serves_changed_weight_tensors(kernel):
    qw = quantize_ref(torch.randn(512, 256), "nvfp4", global_scale=2.0)
    x = torch.randn(4, 256, dtype=BF)
    cutegemm.gemm(x, qw)
    cutegemm.gemm(x, qw)
    for field, new in (("data", qw.data.clone()), ("scales", qw.scales.clone()),
                       ("global_scale", qw.global_scale.clone())):  # fmt: skip
        setattr(qw, field, new)
        cutegemm.gemm(x, qw)
        ptrs = {a.data_ptr() for a in kernel.args if isinstance(a, torch.Tensor)}
        assert new.data_ptr() in ptrs, f"a replaced {field} was not passed"
    plan = launch._PLANS[launch._plan_key(x, qw, None, BF)]
    assert plan.serves(qw)


def test_in_place_updates_are_seen_and_copies_are_not_planned(kernel):
    qw = quantize_ref(torch.randn(512, 256), "mxfp4")
    x = torch.randn(4, 256, dtype=BF)
    cutegemm.gemm(x, qw)
    cutegemm.gemm(x, qw)
    assert kernel.args[1].data_ptr() == qw.data.data_ptr()  # a view: in-place writes reach the kernel
    plain = quantize_ref(torch.randn(512, 256), "mxfp4", swizzle=False)  # swizzled per call: a copy
    launch._PLANS.clear()
    cutegemm.gemm(x, plain)
    assert not launch._PLANS


def test_a_plan_does_not_keep_its_weight_alive(kernel):
    qw = quantize_ref(torch.randn(512, 256), "nvfp4")
    x = torch.randn(4, 256, dtype=BF)
    cutegemm.gemm(x, qw)
    data = weakref.ref(qw.data)
    assert launch._PLANS
    del qw
    gc.collect()
    assert not launch._PLANS and data() is None


def test_calls_with_out_scale_a_or_config_are_not_planned(kernel):
    qw = quantize_ref(torch.randn(512, 256), "nvfp4")
    x = torch.randn(4, 256, dtype=BF)
    cutegemm.gemm(x, qw, out=torch.empty(4, 512, dtype=BF))
    xq = x.to(torch.float8_e4m3fn)
    cutegemm.gemm(xq, qw, scale_a=torch.ones(4))
    assert not launch._PLANS
