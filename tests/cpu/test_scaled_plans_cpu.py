"""The warm paths of the FP8 row-wise calls (``gemm(a8, b8, scale_a=, scale_b=)`` and the packed
``grouped_gemm`` with scales), the K-grouped and the 3-D grouped forms on the CPU (no GPU): the
CUDA-only pieces are replaced (tests/host_overhead_cpu.py) and the compiled kernel is a no-op
that records its arguments. A warm call must hand the kernel what a cold call does, fall back
to the slow path when a source changes (and keep every check the slow path makes), and its
memoized scale views must neither go stale nor keep a tensor alive."""

import gc
import weakref

import pytest
import torch

import cutegemm
from cutegemm.gemm import dense, fp8_scales
from cutegemm.grouped import k_grouped, packed

from ..emulated_kernel import emulated_kernels
from ..host_overhead_cpu import counting_calls, cpu_fast_path, kernel_args

BF = torch.bfloat16
E4M3 = torch.float8_e4m3fn


@pytest.fixture
def kernel():
    with cpu_fast_path() as k:
        yield k


def _args(k, fresh=(2,)):
    """The kernel's arguments, tensors by (shape, strides, data pointer, dtype); the freshly
    allocated outputs (``fresh``) by shape, strides and dtype only."""
    return [(m[0], m[1], m[3]) if i in fresh and isinstance(x, torch.Tensor) else m
            for i, (x, m) in enumerate(zip(k.args, kernel_args(k), strict=True))]  # fmt: skip


def _fp8(*shape):
    return torch.randn(*shape).to(E4M3)


def _dense_operands(m=64, k=32, n=48):
    return _fp8(m, k), _fp8(n, k).t()  # b K-major (column-major), as torch._scaled_mm takes it


def _assert_memo_drops_scale_b(kernel, plan, holder: list):
    """The plan's memoized view of scale_b (``holder``'s only item, the caller's last reference
    handed over in a list) does not keep it alive: the memo empties once it is gone."""
    assert plan.sb_memo.b_memo is not None
    ref = weakref.ref(holder[0])
    kernel.args = None
    holder.clear()
    gc.collect()
    assert ref() is None and plan.sb_memo.b_memo is None


# ---------------------------------------------------------------------------------------------
# FP8 row-wise dense


@pytest.mark.parametrize(
    "sa_shape, sb_shape",
    [((64, 1), (1, 48)), ((64,), (48,)), ((1, 1), (1, 1)), ((), (1, 48)), ((64, 1), (1,))],
)
@pytest.mark.parametrize("opts", [{}, {"out_dtype": torch.float32}, {"fast_accum": True}], ids=["bf16", "fp32", "fast"])
def test_dense_rowwise_warm_call_passes_what_the_cold_call_passes(kernel, monkeypatch, sa_shape, sb_shape, opts):
    a, b = _dense_operands()
    sa, sb = torch.rand(sa_shape), torch.rand(sb_shape)
    plans = counting_calls(monkeypatch, dense, "_plan")
    first = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, **opts)
    cold = _args(kernel)
    scale_fns = counting_calls(monkeypatch, dense, "fp8_scales")
    second = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, **opts)
    warm = _args(kernel)
    assert len(plans) == 1 and kernel.calls == 2
    assert not scale_fns, "the warm call re-checked the scales: it did not take the row-wise warm path"
    assert cold == warm
    assert first.shape == second.shape == (64, 48)
    assert second.dtype == opts.get("out_dtype", BF) and kernel.args[2].data_ptr() == second.data_ptr()


def test_dense_rowwise_new_scale_a_each_call(kernel, monkeypatch):
    """A new scale_a per call (the activations' scales) takes the warm path with its own values."""
    a, b = _dense_operands()
    sb = torch.rand(1, 48)
    cutegemm.gemm(a, b, scale_a=torch.rand(64, 1), scale_b=sb)
    plans = counting_calls(monkeypatch, dense, "_plan")
    for _ in range(3):
        sa = torch.rand(64, 1)
        cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
        assert kernel.args[13].data_ptr() == sa.data_ptr() and torch.equal(kernel.args[13], sa.view(-1))
        assert kernel.args[14].data_ptr() == sb.data_ptr()
    assert not plans


def test_dense_rowwise_plan_of_another_scale_shape_gets_its_own_key(kernel, monkeypatch):
    """scale_a (M,) after (M, 1): the full key's plan serves it once, then the row-wise key does."""
    a, b = _dense_operands()
    sb = torch.rand(1, 48)
    cutegemm.gemm(a, b, scale_a=torch.rand(64, 1), scale_b=sb)
    scale_fns = counting_calls(monkeypatch, dense, "fp8_scales")
    sa = torch.rand(64)
    cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
    cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
    assert len(scale_fns) == 1 and kernel.args[13].data_ptr() == sa.data_ptr()


def test_dense_rowwise_falls_back_when_a_source_changes(kernel, monkeypatch):
    a, b = _dense_operands()
    sa, sb = torch.rand(64, 1), torch.rand(1, 48)
    cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
    cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
    v1 = kernel.args[14]
    cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
    assert kernel.args[14] is v1, "same scale_b object: the memoized view is reused"
    # in place: the view shares the storage
    sb.mul_(2)
    cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
    assert torch.equal(kernel.args[14], sb.view(-1))
    # same object, new storage: the view follows
    new = torch.rand(1, 48)
    sb.set_(new)
    cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
    assert kernel.args[14].data_ptr() == new.data_ptr() and torch.equal(kernel.args[14], new.view(-1))
    # a scale off 16 bytes: the slow path copies it (aligned, same values)
    buf = torch.rand(65)
    sa_off = buf[1:].view(64, 1)
    cutegemm.gemm(a, b, scale_a=sa_off, scale_b=sb)
    assert kernel.args[13].data_ptr() % 16 == 0 and torch.equal(kernel.args[13], sa_off.view(-1))
    # a at an offset that breaks 16-byte alignment: a copy is passed
    big = torch.randn(64 * 32 + 16).to(E4M3)
    a_off = big[1 : 1 + 64 * 32].view(64, 32)
    cutegemm.gemm(a_off, b, scale_a=sa, scale_b=sb)
    assert kernel.args[0].data_ptr() != a_off.data_ptr() and kernel.args[0].data_ptr() % 16 == 0


def test_dense_rowwise_warm_path_keeps_every_check(kernel):
    a, b = _dense_operands()
    sa, sb = torch.rand(64, 1), torch.rand(1, 48)
    for _ in range(2):
        cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
    with pytest.raises(TypeError, match="float32"):
        cutegemm.gemm(a, b, scale_a=sa.double(), scale_b=sb)
    with pytest.raises(TypeError, match="float32"):
        cutegemm.gemm(a, b, scale_a=sa, scale_b=sb.half())
    with pytest.raises(ValueError, match="must be on"):
        cutegemm.gemm(a, b, scale_a=sa, scale_b=sb.to("meta"))
    with pytest.raises(ValueError, match="elements"):
        cutegemm.gemm(a, b, scale_a=torch.rand(63, 1), scale_b=sb)
    with pytest.raises(ValueError, match="elements"):
        cutegemm.gemm(a, b, scale_a=sa, scale_b=torch.rand(1, 47))
    with pytest.raises(TypeError, match="tensors"):
        cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, alpha=torch.tensor(1.0))
    with pytest.raises(ValueError, match="gate_layout"):
        cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, gate_layout="bogus")
    with pytest.raises(ValueError, match="scale_a / scale_b are for"):
        cutegemm.gemm(torch.randn(64, 32, dtype=BF), torch.randn(48, 32, dtype=BF).t(), scale_a=sa, scale_b=sb)
    with pytest.raises(TypeError, match="out_dtype"):
        cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.int8)


def test_plain_warm_path_keeps_the_alpha_and_gate_layout_checks(kernel):
    a, b = torch.randn(64, 32, dtype=BF), torch.randn(32, 48, dtype=BF)
    for _ in range(2):
        cutegemm.gemm(a, b)
    with pytest.raises(TypeError, match="tensors"):
        cutegemm.gemm(a, b, alpha=torch.tensor(1.0))
    with pytest.raises(ValueError, match="gate_layout"):
        cutegemm.gemm(a, b, gate_layout="bogus")


def test_dense_rowwise_memo_does_not_keep_scale_b_alive(kernel):
    a, b = _dense_operands()
    sa, sb = torch.rand(64, 1), torch.rand(1, 48)
    for _ in range(2):
        cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
    holder = [sb]
    del sb  # the helper holds the last reference
    _assert_memo_drops_scale_b(kernel, next(p for k, p in dense.PLAIN_PLANS.items() if len(k) > 8), holder)


def test_dense_rowwise_copies_are_not_planned(kernel, monkeypatch):
    """A row-major b (FP8 reads B K-major: copied per call) never gets a row-wise warm plan; every
    call copies it again."""
    a, b = _fp8(64, 32), _fp8(32, 48)
    sa, sb = torch.rand(64, 1), torch.rand(1, 48)
    cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
    cold = _args(kernel, fresh=(1, 2))
    cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
    assert _args(kernel, fresh=(1, 2)) == cold and kernel.args[1].data_ptr() != b.data_ptr()
    assert not any(len(k) > 8 for k in dense.PLAIN_PLANS)


# ---------------------------------------------------------------------------------------------
# FP8 row-wise grouped (packed form)


ROWS = 384  # 128 rows per expert on average: the swap-AB kernel with fast_accum


def _grouped_operands(n=48):
    x = _fp8(ROWS, 32)
    w = _fp8(3, n, 32).transpose(1, 2)  # (E, K, N), K-major
    offs = torch.tensor([100, 100, 360], dtype=torch.int32)
    return x, w, offs


@pytest.mark.parametrize("sa_shape", [(ROWS,), (ROWS, 1), (1,)])
@pytest.mark.parametrize("sb_shape", [(3, 48), (48,), (3,), (1,)])
@pytest.mark.parametrize("fast_accum", [False, True], ids=["promoted", "fast-swap-ab"])
def test_grouped_rowwise_warm_call_passes_what_the_cold_call_passes(kernel, monkeypatch, sa_shape, sb_shape,
                                                                     fast_accum):  # fmt: skip
    x, w, offs = _grouped_operands()
    sa, sb = torch.rand(sa_shape), torch.rand(sb_shape)
    in_place = sb_shape == (3, 48)
    fresh = (2,) if in_place else (2, 14)  # other scale_b shapes are expanded: a copy per call
    plans = counting_calls(monkeypatch, packed, "_plan_packed")
    y1 = cutegemm.grouped_gemm(x, w, offs=offs, scale_a=sa, scale_b=sb, fast_accum=fast_accum)
    cold, cold_sb = _args(kernel, fresh), kernel.args[14].clone()
    plan = next(p for k, p in packed.PLANS.items() if packed._ROWWISE not in k)
    assert plan.swap == fast_accum  # fast_accum: the swap-AB kernel (its operands swapped at launch)
    prep = counting_calls(monkeypatch, packed, "_prepare_epilogue")
    y2 = cutegemm.grouped_gemm(x, w, offs=offs, scale_a=sa, scale_b=sb, fast_accum=fast_accum)
    warm = _args(kernel, fresh)
    assert len(plans) == 1 and cold == warm and torch.equal(kernel.args[14], cold_sb)
    assert y1.shape == y2.shape == (ROWS, 48) and y2.dtype == BF and kernel.args[2].data_ptr() == y2.data_ptr()
    # scale_b (E, N) is used in place: the warm path skips the epilogue preparation
    assert bool(prep) != in_place


def test_grouped_rowwise_falls_back_and_keeps_checks(kernel):
    x, w, offs = _grouped_operands()
    sa, sb = torch.rand(ROWS), torch.rand(3, 48)
    for _ in range(2):
        cutegemm.grouped_gemm(x, w, offs=offs, scale_a=sa, scale_b=sb)
    sb.add_(1)
    cutegemm.grouped_gemm(x, w, offs=offs, scale_a=sa, scale_b=sb)
    assert torch.equal(kernel.args[14], sb.view(-1))
    new = torch.rand(3, 48)
    sb.set_(new)
    cutegemm.grouped_gemm(x, w, offs=offs, scale_a=sa, scale_b=sb)
    assert kernel.args[14].data_ptr() == new.data_ptr()
    buf = torch.rand(ROWS + 1)
    cutegemm.grouped_gemm(x, w, offs=offs, scale_a=buf[1:], scale_b=sb)
    assert kernel.args[13].data_ptr() % 16 == 0 and torch.equal(kernel.args[13], buf[1:])
    with pytest.raises(ValueError, match="non-decreasing"):
        bad = torch.tensor([100, 10, 360], dtype=torch.int32)
        cutegemm.grouped_gemm(x, w, offs=bad, scale_a=sa, scale_b=sb, check_offs=True)
    with pytest.raises(TypeError, match="float32"):
        cutegemm.grouped_gemm(x, w, offs=offs, scale_a=sa, scale_b=sb.double())
    with pytest.raises(ValueError, match="must be on"):
        cutegemm.grouped_gemm(x, w, offs=offs, scale_a=sa.to("meta"), scale_b=sb)
    with pytest.raises(ValueError, match="shape"):
        cutegemm.grouped_gemm(x, w, offs=offs, scale_a=sa, scale_b=torch.rand(2, 48))
    with pytest.raises(TypeError, match="int32"):
        cutegemm.grouped_gemm(x, w, offs=offs.long(), scale_a=sa, scale_b=sb)
    with pytest.raises(ValueError, match="gate_layout"):
        cutegemm.grouped_gemm(x, w, offs=offs, scale_a=sa, scale_b=sb, gate_layout="bogus")


def test_grouped_plain_warm_path_keeps_the_gate_layout_and_epilogue_args_checks(kernel):
    x, w, offs = torch.randn(96, 32, dtype=BF), torch.randn(3, 32, 48, dtype=BF), torch.tensor([20, 20, 90], dtype=torch.int32)
    for _ in range(2):
        cutegemm.grouped_gemm(x, w, offs=offs)
    with pytest.raises(ValueError, match="gate_layout"):
        cutegemm.grouped_gemm(x, w, offs=offs, gate_layout="bogus")
    with pytest.raises(ValueError, match="epilogue_args given without"):
        cutegemm.grouped_gemm(x, w, offs=offs, epilogue_args=(torch.rand(48),))


def test_grouped_rowwise_memo_does_not_keep_scale_b_alive(kernel):
    x, w, offs = _grouped_operands()
    sa, sb = torch.rand(ROWS), torch.rand(3, 48)
    for _ in range(2):
        cutegemm.grouped_gemm(x, w, offs=offs, scale_a=sa, scale_b=sb)
    holder = [sb]
    del sb  # the helper holds the last reference
    _assert_memo_drops_scale_b(kernel, next(p for k, p in packed.PLANS.items() if packed._ROWWISE in k), holder)


def test_warm_scale_view_matches_the_checked_scale():
    for shape in [(5,), (5, 1), (1, 5), (1, 1), ()]:
        t = torch.rand(shape)
        n = max(t.numel(), 1)
        v = fp8_scales.scale_vector("s", t, n, t.device, "row")
        w = dense.warm_scale_view(t)
        assert (v.shape, v.stride(), v.data_ptr()) == (w.shape, w.stride(), w.data_ptr())


# ---------------------------------------------------------------------------------------------
# K-grouped (2d x 2d) and the 3-D forms


def _kg_operands(m=48, total_k=96, n=64):
    x = torch.randn(total_k, m, dtype=BF).t()  # (M, total_K), M-major: the weight gradient's x^T
    dy = torch.randn(total_k, n, dtype=BF)
    offs = torch.tensor([16, 16, 64, 96], dtype=torch.int32)
    return x, dy, offs


@pytest.mark.parametrize("opts", [{}, {"alpha": 0.5}, {"out_dtype": torch.float32}], ids=["plain", "alpha", "fp32"])
def test_k_grouped_warm_call_passes_what_the_cold_call_passes(kernel, monkeypatch, opts):
    x, dy, offs = _kg_operands()
    y1 = cutegemm.grouped_gemm(x, dy, offs=offs, **opts)
    cold = _args(kernel)
    slow = counting_calls(monkeypatch, k_grouped, "_kgrouped_launch")
    y2 = cutegemm.grouped_gemm(x, dy, offs=offs, **opts)
    assert not slow, "the warm call went through grouped_k"
    assert _args(kernel) == cold and kernel.calls == 2
    assert y1.shape == y2.shape == (4, 48, 64) and kernel.args[2].data_ptr() == y2.data_ptr()
    assert y2.dtype == opts.get("out_dtype", BF)
    # out given
    out = torch.empty(4, 48, 64, dtype=y2.dtype)
    for _ in range(2):
        assert cutegemm.grouped_gemm(x, dy, offs=offs, out=out, **opts) is out
        assert kernel.args[2].data_ptr() == out.data_ptr()
    assert len(slow) == 1


def test_k_grouped_warm_path_keeps_every_check_and_falls_back(kernel):
    x, dy, offs = _kg_operands()
    for _ in range(2):
        cutegemm.grouped_gemm(x, dy, offs=offs)
    with pytest.raises(ValueError, match="exceeds"):
        cutegemm.grouped_gemm(x, dy, offs=torch.tensor([16, 16, 64, 97], dtype=torch.int32), check_offs=True)
    with pytest.raises(ValueError, match="gate_layout"):
        cutegemm.grouped_gemm(x, dy, offs=offs, gate_layout="bogus")
    with pytest.raises(ValueError, match="takes alpha only"):
        cutegemm.grouped_gemm(x, dy, offs=offs, bias=torch.rand(64))
    with pytest.raises(TypeError, match="int32"):
        cutegemm.grouped_gemm(x, dy, offs=offs.long())
    with pytest.raises(ValueError, match="disagree"):
        cutegemm.grouped_gemm(x, dy[:95], offs=offs)
    # a misaligned dy (a copy per call): never planned, the kernel gets aligned copies each call
    buf = torch.randn(96 * 64 + 8, dtype=BF)
    dy_off = buf[1 : 1 + 96 * 64].view(96, 64)
    n_plans = len(packed.PLANS)
    for _ in range(2):
        cutegemm.grouped_gemm(x, dy_off, offs=offs)
        assert kernel.args[1].data_ptr() % 16 == 0 and kernel.args[1].data_ptr() != dy_off.data_ptr()
    assert len(packed.PLANS) == n_plans
    # an odd N (a padded scratch, then a compact result): never planned
    cutegemm.grouped_gemm(x, dy[:, :7].contiguous(), offs=offs)
    cutegemm.grouped_gemm(x, dy[:, :7].contiguous(), offs=offs)
    assert len(packed.PLANS) == n_plans


def test_3d_forms_warm_calls_match_the_twin():
    """Warm 3d x 3d / 3d x 2d / K-grouped calls through the emulated kernel (it computes from the
    views it is handed) give the reference twin's result, and follow in-place and set_() updates
    of the operands."""
    a3, b3 = torch.randn(3, 40, 32, dtype=BF), torch.randn(3, 32, 48, dtype=BF)
    b2 = torch.randn(72, 32, dtype=BF).t()  # (K, total_N)
    offs = torch.tensor([16, 48, 72], dtype=torch.int32)
    x, dy, koffs = _kg_operands()
    calls = [(a3, b3, None), (a3, b2, offs), (a3, b2.contiguous(), offs), (x, dy, koffs)]
    with emulated_kernels():
        for a, b, o in calls:
            want = cutegemm.grouped_gemm_ref(a, b, offs=o)
            for _ in range(3):
                torch.testing.assert_close(cutegemm.grouped_gemm(a, b, offs=o), want, atol=2e-2, rtol=2e-2)
            b.mul_(-1)
            torch.testing.assert_close(cutegemm.grouped_gemm(a, b, offs=o), -want, atol=2e-2, rtol=2e-2)
            b.mul_(-1)
            a.set_(torch.randn(a.numel(), dtype=a.dtype).as_strided(a.shape, a.stride()))  # same key, new storage
            torch.testing.assert_close(
                cutegemm.grouped_gemm(a, b, offs=o), cutegemm.grouped_gemm_ref(a, b, offs=o), atol=2e-2, rtol=2e-2
            )


def test_3d_x_2d_warm_plan_keeps_checks_and_frees_a(kernel):
    a3, b2 = torch.randn(3, 40, 32, dtype=BF), torch.randn(72, 32, dtype=BF).t()
    offs = torch.tensor([16, 48, 72], dtype=torch.int32)
    cutegemm.grouped_gemm(a3, b2, offs=offs)
    cold = _args(kernel)
    res = cutegemm.grouped_gemm(a3, b2, offs=offs)
    assert _args(kernel) == cold and res.shape == (40, 72) and res.is_contiguous()
    assert any(type(p).__name__ == "Transposed3d2d" for p in packed.PLANS.values())
    with pytest.raises(ValueError, match="exceeds"):
        cutegemm.grouped_gemm(a3, b2, offs=torch.tensor([16, 48, 73], dtype=torch.int32), check_offs=True)
    with pytest.raises(ValueError, match="groups"):
        cutegemm.grouped_gemm(a3, b2, offs=offs[:2])
    with pytest.raises(ValueError, match="does not take"):
        cutegemm.grouped_gemm(a3, b2, offs=offs, bias=torch.rand(72))
    ref = weakref.ref(a3)
    kernel.args = None
    del a3
    gc.collect()
    assert ref() is None, "a warm 3d x 2d plan keeps a alive"


def test_3d_x_2d_row_major_b_gets_a_warm_plan(kernel):
    """A row-major b (the usual (K, total_N) weight) makes b^T M-major: b^T is copied row-major
    before the packed form sees it, so the second call is warm (no new plan) and reads the copy."""
    a3, b2 = torch.randn(3, 40, 32, dtype=BF), torch.randn(32, 72, dtype=BF)
    offs = torch.tensor([16, 48, 72], dtype=torch.int32)
    cutegemm.grouped_gemm(a3, b2, offs=offs)
    n_plans = len(packed.PLANS)
    assert any(type(p).__name__ == "Transposed3d2d" for p in packed.PLANS.values())
    res = cutegemm.grouped_gemm(a3, b2, offs=offs)
    assert len(packed.PLANS) == n_plans and res.shape == (40, 72) and res.is_contiguous()
    assert kernel.args[0].data_ptr() != b2.data_ptr()  # A: the row-major copy of b^T


def test_3d_x_3d_fast_route_keeps_the_3d_checks(kernel):
    a3, b3 = torch.randn(3, 40, 32, dtype=BF), torch.randn(3, 32, 48, dtype=BF)
    for _ in range(2):
        assert cutegemm.grouped_gemm(a3, b3).shape == (3, 40, 48)
    with pytest.raises(ValueError, match="do not match"):
        cutegemm.grouped_gemm(a3, torch.randn(2, 32, 48, dtype=BF))
    with pytest.raises(ValueError, match="takes no offs"):
        cutegemm.grouped_gemm(a3, b3, offs=torch.tensor([40, 80, 120], dtype=torch.int32))
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        cutegemm.grouped_gemm(a3, object())
    out = torch.empty(3, 40, 48, dtype=torch.float32)
    assert cutegemm.grouped_gemm(a3, b3, out=out, alpha=0.5) is out


# ---------------------------------------------------------------------------------------------
# FP8 block scales, grouped (DeepSeek 1x128 / 128x128; transformers' fine-grained FP8 experts)


def _block_operands(copy_layout=False):
    x = _fp8(ROWS, 256)
    w = _fp8(3, 256, 256).transpose(1, 2)  # (E, K, N) view of (E, N, K)
    offs = torch.tensor([100, 100, 360], dtype=torch.int32)
    sa = torch.rand(2, ROWS).t()  # (total_M, K/128), M-major: torch's layout, read in place
    sb = torch.rand(3, 2, 2) if copy_layout else torch.rand(3, 2, 2).transpose(1, 2)  # (E, K/128, N/128)
    return x, w, offs, sa, sb


@pytest.mark.parametrize("copy_layout", [False, True], ids=["in-place", "k-strided-scale_b"])
def test_grouped_blockwise_warm_call_passes_what_the_cold_call_passes(kernel, monkeypatch, copy_layout):
    """A block-scaled call whose kernel reads both scales in place gets a warm plan under its own
    key: the warm call passes the cold call's arguments (scale_b's view memoized, scale_a as
    given) without preparing the epilogue again; a scale_b the cold call copies (K-strided, >= 256
    rows) is prepared on every call."""
    x, w, offs, sa, sb = _block_operands(copy_layout)
    y1 = cutegemm.grouped_gemm(x, w, offs=offs, scale_a=sa, scale_b=sb)
    cold = _args(kernel, (2,) if not copy_layout else (2, 10))
    prep = counting_calls(monkeypatch, packed, "_prepare_epilogue")
    y2 = cutegemm.grouped_gemm(x, w, offs=offs, scale_a=sa, scale_b=sb)
    assert _args(kernel, (2,) if not copy_layout else (2, 10)) == cold and y1.shape == y2.shape == (ROWS, 256)
    assert bool(prep) == copy_layout
    if not copy_layout:
        assert kernel.args[9].data_ptr() == sa.data_ptr() and kernel.args[10].data_ptr() == sb.data_ptr()
        sa2 = torch.rand(2, ROWS).t()  # new activations' scales each call: passed as they are
        cutegemm.grouped_gemm(x, w, offs=offs, scale_a=sa2, scale_b=sb)
        assert kernel.args[9].data_ptr() == sa2.data_ptr() and not prep


def test_grouped_blockwise_warm_results_follow_the_scales():
    """Through the emulated kernel: warm calls compute with the scales' current values (scale_b's
    memoized view is a view: an in-place update shows), as the twin."""
    x, w, offs, sa, sb = _block_operands()
    with emulated_kernels():
        for step in range(3):
            if step == 2:
                sb.mul_(2)
            y = cutegemm.grouped_gemm(x, w, offs=offs, scale_a=sa, scale_b=sb)
            ref = cutegemm.grouped_gemm_ref(x, w, offs=offs, scale_a=sa, scale_b=sb)
            torch.testing.assert_close(y[:360].float(), ref[:360].float(), atol=0.3, rtol=2e-2)


# ---------------------------------------------------------------------------------------------
# FP8 block scales, dense


@pytest.mark.parametrize("m", [64, 300])
@pytest.mark.parametrize("scale_b_layout", ["weight-view", "row-major"])
def test_dense_blockwise_warm_call_passes_what_the_cold_call_passes(kernel, monkeypatch, m, scale_b_layout):
    """torch._scaled_mm's block-scale layouts: the warm call passes the cold call's arguments;
    scale_b read in place (the (K/128, N/128) view of an (N/128, K/128) weight scale, or a
    row-major one below 256 rows) gets the warm plan, a copied one (row-major from 256 rows on)
    is prepared on every call."""
    a, b = _fp8(m, 256), _fp8(384, 256).t()
    sa = torch.rand(2, m).t()  # (M, K/128) M-major
    sb = torch.rand(3, 2).t() if scale_b_layout == "weight-view" else torch.rand(2, 3)
    copied = scale_b_layout == "row-major" and m >= fp8_scales.SCALE_COPY_MIN_ROWS
    fresh = (2, 10) if copied else (2,)
    y1 = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
    cold = _args(kernel, fresh)
    plans = counting_calls(monkeypatch, dense, "_plan")
    y2 = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
    assert _args(kernel, fresh) == cold and y1.shape == y2.shape == (m, 384) and not plans
    warm = any(getattr(p, "sfb", None) is not None for p in dense.PLAIN_PLANS.values())
    assert warm != copied
    if warm:
        assert kernel.args[9].data_ptr() == sa.data_ptr() and kernel.args[10].data_ptr() == sb.data_ptr()


def test_dense_blockwise_warm_results_follow_the_scales():
    """Through the emulated kernel: warm calls compute with the scales' current values (scale_b's
    memoized view is a view: an in-place update shows), as the twin."""
    a, b = _fp8(64, 256), _fp8(384, 256).t()
    sa, sb = torch.rand(2, 64).t(), torch.rand(3, 2).t()
    with emulated_kernels():
        for step in range(3):
            if step == 2:
                sb.mul_(2)
            y = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
            ref = cutegemm.gemm_ref(a, b, scale_a=sa, scale_b=sb)
            torch.testing.assert_close(y.float(), ref.float(), atol=0.3, rtol=2e-2)
