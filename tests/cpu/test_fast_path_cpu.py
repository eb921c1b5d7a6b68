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

from ..host_overhead_cpu import counting_calls, cpu_fast_path, kernel_args

BF = torch.bfloat16


@pytest.fixture
def kernel():
    with cpu_fast_path() as k:
        yield k


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
    plans = counting_calls(monkeypatch, dense, "_plan")
    first = cutegemm.gemm(a, b, **kw)
    slow = kernel_args(kernel)
    second = cutegemm.gemm(a, b, **kw)
    fast = kernel_args(kernel)
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
    plans = counting_calls(monkeypatch, dense, "_plan")
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
    plans = counting_calls(monkeypatch, grouped, "_plan_packed")
    y1 = cutegemm.grouped_gemm(x, w, offs=offs, alpha=0.5)
    slow = kernel_args(kernel)
    y2 = cutegemm.grouped_gemm(x, w, offs=offs, alpha=0.5)
    fast = kernel_args(kernel)
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
    # a at a storage offset that breaks 16-byte alignment: the kernel gets an aligned copy
    big = torch.randn(96 * 32 + 1, dtype=BF)
    a_off = big[1:].view(96, 32)
    cutegemm.grouped_gemm(a_off, w, offs=offs)
    assert kernel.args[0].data_ptr() % 16 == 0 and kernel.args[0].data_ptr() != a_off.data_ptr()
    assert torch.equal(kernel.args[0][:, :, 0], a_off)


def test_grouped_quantized_output_keeps_its_scales_on_the_warm_path(kernel):
    """A quantized grouped output (no other epilogue input) is a BlockScaledTensor on every call:
    the warm path must not take the plain-dtype branch (it once allocated with the format name
    as a torch dtype)."""
    from cutegemm.blockscaled import BlockScaledTensor

    x, w, offs = _grouped_inputs(n=64)
    results = [cutegemm.grouped_gemm(x, w, offs=offs, out_dtype="mxfp8") for _ in range(3)]
    assert all(isinstance(r, BlockScaledTensor) and r.shape == (96, 64) for r in results)
    assert kernel.args[11] is not None, "the kernel got no scale bytes on the warm path"


class _FillKernel:
    """A fake kernel that writes 7 into every element of its output view (argument 2)."""

    def __init__(self):
        self.calls, self.args = 0, None

    def __call__(self, *args):
        self.calls += 1
        self.args = args
        args[2].fill_(7.0)


@pytest.mark.parametrize(
    "make_out",
    [lambda buf: buf[:64, 1:49],  # a column offset: the start is 2 bytes past a 16-byte boundary
     lambda buf: buf[1:65, :48],  # a row offset into rows of 57 elements (114 bytes)
     lambda buf: buf[:48, :64].t(),  # column-major
     lambda buf: buf[:64, :47]],  # rows of 94 bytes
    ids=["column-offset", "odd-row-stride", "column-major", "odd-n"],
)  # fmt: skip
def test_dense_out_of_any_layout_goes_through_an_aligned_scratch(make_out):
    """out= views the TMA store cannot write in place are computed into an aligned scratch and
    copied in: every element of out written, nothing around it in the larger buffer touched."""
    fill = _FillKernel()
    with cpu_fast_path(fill):
        buf = torch.full((80, 57), float("nan"), dtype=BF)
        out = make_out(buf)
        m, n = out.shape
        a, b = torch.randn(m, 32, dtype=BF), torch.randn(32, n, dtype=BF)
        for _ in range(2):  # the slow path, then again (no plan may hold the scratch)
            buf.fill_(float("nan"))
            assert cutegemm.gemm(a, b, out=out) is out
            assert fill.args[2].data_ptr() % 16 == 0 and fill.args[2].data_ptr() != out.data_ptr()
            assert (out == 7).all(), "out not fully written"
            assert int(torch.isnan(buf).sum()) == buf.numel() - m * n, "written outside out"


def test_gemm_ref_fp8_k0_is_zero_with_infinite_scales():
    a = torch.empty(5, 0).to(torch.float8_e4m3fn)
    b = torch.empty(0, 7).to(torch.float8_e4m3fn)
    sa, sb = torch.full((5, 1), float("inf")), torch.full((1, 7), float("inf"))
    out = cutegemm.gemm_ref(a, b, scale_a=sa, scale_b=sb)
    assert out.shape == (5, 7) and torch.equal(out.float(), torch.zeros(5, 7))


@pytest.mark.parametrize(
    "make",
    [lambda: (torch.randn(64, 100, dtype=torch.float16).t(), torch.randn(64, 40, dtype=torch.float16)),  # M-major A, 200-byte stride
     lambda: (torch.randn(30, 32, dtype=BF), torch.randn(32, 47, dtype=BF)),  # B rows of 94 bytes
     lambda: (torch.randn(33, 40, dtype=BF)[:, 1:33], torch.randn(48, 32, dtype=BF).t()),  # A at an odd offset
     lambda: (torch.randn(2, 7, 24, dtype=BF).transpose(1, 2), torch.randn(2, 7, 40, dtype=BF))],  # batched, 14-byte stride
    ids=["m-major-a-odd-rows", "b-odd-n", "a-offset-and-stride", "batched-k-major-odd"],
)  # fmt: skip
def test_operands_tma_cannot_read_are_staged_not_rejected(kernel, make):
    """torch.matmul accepts these; the kernel gets an aligned copy of the same values (the staging
    route: leading dimension padded to 16 bytes), never a ValueError."""
    a, b = make()
    cutegemm.gemm(a, b)
    ka, kb = kernel.args[0], kernel.args[1]
    for t in (ka, kb):
        assert t.data_ptr() % 16 == 0
        assert all(st == 1 or (st * t.element_size()) % 16 == 0 for st in t.stride())
    a3 = a if a.dim() == 3 else a.unsqueeze(0)
    b3 = b if b.dim() == 3 else b.unsqueeze(0)
    got_a = ka.permute(2, 0, 1) if ka.dim() == 3 else ka.unsqueeze(0)  # kernel view (M, K, L)
    got_b = kb.permute(2, 1, 0) if kb.dim() == 3 else kb.unsqueeze(0)  # kernel view (N, K, L)
    assert torch.equal(got_a, a3) and torch.equal(got_b, b3)
