"""Warm (memoized) host paths of dequantize and the sm_90a block-scaled GEMM on the CPU (no GPU):
the kernels are no-ops that record their arguments (tests/host_overhead_cpu.py). A warm call must
hand the kernels what the cold call hands them, return the same kind of result, and raise what
the cold call raises for an input that differs from the warm signature."""

import pytest
import torch

import cutegemm
from cutegemm.blockscaled import dequant, quantize_ref
from cutegemm.blockscaled.formats import MXFP8_E5M2
from cutegemm.blockscaled.reference import BlockScaledTensor

from ..host_overhead_cpu import cpu_dequant_path, kernel_args

BF = torch.bfloat16


def test_only_dequantize_records_warm_keys():
    """dequantize_checked records a warm key only when its caller asks (dequantize does); the GEMM
    routes that call it (the sm_90a block-scaled path, the weight-only dequantize-first route)
    leave the table alone."""
    q = quantize_ref(torch.randn(128, 64), "mxfp8")
    with cpu_dequant_path() as k:
        out = dequant.dequantize_checked(q)
        assert k.calls == 1 and out.shape == q.shape and out.dtype == BF
        assert not dequant._WARM
        dequant.dequantize_checked(q, out_dtype=torch.float32)
        assert not dequant._WARM
        dequant.dequantize(q, BF)
        assert len(dequant._WARM) == 1
        calls = k.calls
        dequant.dequantize(q, BF)  # warm: the kernel, not dequantize_checked's lookups
        assert k.calls == calls + 1


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_warm_dequantize_is_the_cold_launch(fmt):
    """The warm launch passes the cold launch's arguments (the output a fresh tensor of the same
    layout) for each output dtype, float16 as the fp32 pass and a cast."""
    q = quantize_ref(torch.randn(3, 32, 64), fmt)
    with cpu_dequant_path() as k:
        for dt in (BF, torch.float32, torch.float16):
            dequant._WARM.clear()
            cold = dequant.dequantize(q, dt)
            cold_args = kernel_args(k)
            warm = dequant.dequantize(q, dt)
            warm_args = kernel_args(k)
            assert warm_args[:3] + warm_args[4:] == cold_args[:3] + cold_args[4:]
            assert warm_args[3][:2] + warm_args[3][3:] == cold_args[3][:2] + cold_args[3][3:]
            assert warm_args[3][2] != cold_args[3][2]  # a fresh output
            assert (warm.shape, warm.stride(), warm.dtype) == (cold.shape, cold.stride(), cold.dtype) == (
                q.shape, cold.stride(), dt)  # fmt: skip


def test_warm_dequantize_keeps_every_check():
    q = quantize_ref(torch.randn(64, 64), "mxfp8")
    with cpu_dequant_path() as k:
        for _ in range(2):
            dequant.dequantize(q, BF)
            dequant.dequantize(q)
        calls = k.calls
        with pytest.raises(TypeError, match="out_dtype"):
            dequant.dequantize(q, torch.float64)
        with pytest.raises(TypeError, match="out_dtype"):
            dequant.dequantize(q, [BF])  # unhashable
        with pytest.raises(TypeError, match="BlockScaledTensor"):
            dequant.dequantize(q.data.float(), BF)
        # the same key but transposed elements (not contiguous) or another shape: the reference
        qt = BlockScaledTensor(data=q.data.t().contiguous().t(), scales=q.scales, fmt=q.fmt, shape=q.shape)
        assert torch.equal(dequant.dequantize(qt), dequant.dequantize_ref(qt))
        q2 = quantize_ref(torch.randn(64, 40), "mxfp8")  # K % 16 != 0
        for _ in range(2):
            assert torch.equal(cutegemm.dequantize(q2), dequant.dequantize_ref(q2))
        assert k.calls == calls


class _Recorder:
    """A no-op kernel that keeps every call's arguments (tensors as shape, strides, dtype, and
    whether they alias an operand's elements)."""

    def __init__(self):
        self.calls, self.args, self.log = 0, None, []

    def __call__(self, *args):
        self.calls += 1
        self.args = args
        self.log.append(args)

    def metas(self, start: int, owners) -> list:
        ptrs = {t.data_ptr(): name for name, t in owners.items()}
        return [[(tuple(a.shape), a.stride(), a.dtype, ptrs.get(a.data_ptr())) if isinstance(a, torch.Tensor) else a
                 for a in args] for args in self.log[start:]]  # fmt: skip


def _mx(rows, k=512, seed=0):
    return quantize_ref(torch.randn(rows, k, generator=torch.Generator().manual_seed(seed)), "mxfp8")


def test_warm_ring_route_is_the_cold_route():
    """gemm(MXFP8 qa, MXFP8 qb) on sm_90a (A dequantized, then the MXFP8-weight GEMM): the warm
    call launches what the cold call launches (fresh outputs aside), for each output dtype and
    alpha, and returns the same kind of result."""
    from cutegemm.blockscaled import mx_sm90

    from ..host_overhead_cpu import cpu_blockscaled_path

    qa, qb = _mx(16), _mx(256, seed=1)
    owners = {"qa": qa.data, "qa_scales": qa.scales, "qb": qb.data}
    with cpu_blockscaled_path(_Recorder()) as k:
        for out_dtype, alpha in ((BF, 1.0), (torch.float32, 0.5), (torch.float16, 2)):
            mx_sm90._RING.clear()
            n = len(k.log)
            cold = cutegemm.gemm(qa, qb, out_dtype=out_dtype, alpha=alpha)
            cold_log = k.metas(n, owners)
            assert len(cold_log) == 2 and len(mx_sm90._RING) == 1  # A's dequantize, the weight GEMM
            n = len(k.log)
            warm = cutegemm.gemm(qa, qb, out_dtype=out_dtype, alpha=alpha)
            assert k.metas(n, owners) == cold_log
            assert (warm.shape, warm.stride(), warm.dtype) == (cold.shape, cold.stride(), cold.dtype) == (
                (16, 256), cold.stride(), out_dtype)  # fmt: skip


def test_warm_ring_route_keeps_every_check():
    """After warm calls, an input off the warm signature raises the cold call's error or takes
    the cold route: another format, K, rank, element dtype or out_dtype; misaligned A elements;
    ``out`` or ``config`` given."""
    from cutegemm.blockscaled import mx_sm90

    from ..host_overhead_cpu import cpu_blockscaled_path

    qa, qb = _mx(16), _mx(256, seed=1)
    with cpu_blockscaled_path(_Recorder()) as k:
        for _ in range(2):
            cutegemm.gemm(qa, qb)
        assert len(mx_sm90._RING) == 1
        with pytest.raises(ValueError, match="K mismatch"):
            cutegemm.gemm(qa, _mx(256, k=256))
        with pytest.raises(ValueError, match="out_dtype"):
            cutegemm.gemm(qa, qb, out_dtype=torch.float64)
        with pytest.raises(TypeError, match="BlockScaledTensor"):
            cutegemm.gemm(qa, qb.data)
        with pytest.raises(ValueError, match="format|share"):
            cutegemm.gemm(qa, quantize_ref(torch.randn(256, 512), "nvfp4"))
        with pytest.raises(ValueError, match="no block-scaled GEMM"):  # the same key but the format
            cutegemm.gemm(qa, BlockScaledTensor(qb.data, qb.scales, MXFP8_E5M2, qb.shape))
        with pytest.raises(ValueError, match=r"elements must be|qb\.data: expected torch\.float8_e4m3fn"):  # e5m2 bytes labelled MXFP8
            cutegemm.gemm(qa, BlockScaledTensor(qb.data.view(torch.float8_e5m2), qb.scales, qb.fmt, qb.shape))
        with pytest.raises(ValueError, match="batch mismatch"):
            cutegemm.gemm(qa, quantize_ref(torch.randn(1, 256, 512), "mxfp8"))
        # misaligned A elements (the same key): the cold checks, which take the emulation route
        buf = torch.empty(qa.data.numel() + 1, dtype=torch.uint8)
        data = buf[1:].view(qa.data.dtype).view(qa.data.shape)
        data.copy_(qa.data)
        q_off = BlockScaledTensor(data=data, scales=qa.scales, fmt=qa.fmt, shape=qa.shape)
        routes = []
        real = mx_sm90.launch_emulated
        mx_sm90.launch_emulated = lambda *a, **kw: routes.append("emulated") or torch.empty(16, 256, dtype=BF)
        try:
            cutegemm.gemm(q_off, qb)
        finally:
            mx_sm90.launch_emulated = real
        assert routes == ["emulated"]
        with pytest.raises(ValueError, match="out must be"):
            cutegemm.gemm(qa, qb, out=torch.empty(16, 255, dtype=BF))
        with pytest.raises(ValueError, match="config"):
            cutegemm.gemm(qa, qb, config=cutegemm.GemmConfig(arch="sm_90a"))
        assert len(mx_sm90._RING) == 1 and k.calls


# --- the weight-only GEMM's warm call from the face (cutegemm.gemm(x, qw), grouped_gemm(x, qw, offs=offs))


def _weight_args(k, owners):
    """The last launch's arguments: tensors as (shape, strides, dtype, which operand's memory)."""
    return k.metas(len(k.log) - 1, owners)[0]


def _x_variants(m, k=512):
    """x as the caller may pass it: contiguous bf16, a strided view, 2-byte misaligned, e4m3."""
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m), dtype=BF)
    wide = torch.randn(m, 2 * k, dtype=BF)[:, ::2].copy_(x)
    buf = torch.empty(m * k + 1, dtype=BF)
    off = buf[1:].view(m, k).copy_(x)
    return {"contiguous": x, "strided": wide, "misaligned": off, "e4m3": x.to(torch.float8_e4m3fn)}


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
@pytest.mark.parametrize("n, m", [(1024, 1), (1024, 16), (28672, 1), (28672, 64)])  # split grid or not
def test_warm_weight_only_call_is_the_cold_call(fmt, n, m):
    """cutegemm.gemm(x, qw) with no options: the warm call (launch.warm_call from the face)
    launches what the cold call launches (x's copies and the output fresh tensors of the same
    layout), for each kind of x, and returns the same kind of result."""
    from cutegemm.blockscaled.weight_only import launch

    from ..host_overhead_cpu import cpu_weight_path

    qw = quantize_ref(torch.randn(n, 256), fmt, **({"global_scale": 0.5} if fmt == "nvfp4" else {}))
    owners = {"data": qw.data, "scales": qw.scales}
    with cpu_weight_path(_Recorder()) as k:
        for name, x in _x_variants(m, 256).items():
            owners["x"] = x
            launch._PLANS.clear()
            cold = cutegemm.gemm(x, qw)
            cold_args = _weight_args(k, owners)
            assert len(launch._PLANS) == 1, name
            calls = k.calls
            warm = cutegemm.gemm(x, qw)
            assert k.calls == calls + 1
            assert _weight_args(k, owners) == cold_args, name
            assert (warm.shape, warm.stride(), warm.dtype) == (cold.shape, cold.stride(), cold.dtype) == (
                (m, n), cold.stride(), BF)  # fmt: skip
            if name == "contiguous" and launch._PLANS[launch._plan_key(x, qw, None, BF)].ring:
                assert cold_args[0][3] == "x"  # x itself, no copy
            if name == "misaligned":
                assert cold_args[0][3] != "x"  # an aligned copy


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_warm_grouped_weight_only_call_is_the_cold_call(fmt):
    from cutegemm.blockscaled.weight_only import launch

    from ..host_overhead_cpu import cpu_weight_path

    qe = quantize_ref(torch.randn(4, 256, 512), fmt)
    offs = torch.tensor([10, 10, 40, 64], dtype=torch.int32)
    owners = {"data": qe.data, "scales": qe.scales, "offs": offs}
    with cpu_weight_path(_Recorder()) as k:
        for name, x in _x_variants(70).items():
            owners["x"] = x
            launch._PLANS.clear()
            cold = cutegemm.grouped_gemm(x, qe, offs=offs)
            cold_args = _weight_args(k, owners)
            assert len(launch._PLANS) == 1 and cold_args[4][3] == "offs"
            warm = cutegemm.grouped_gemm(x, qe, offs=offs)
            assert _weight_args(k, owners) == cold_args, name
            assert (warm.shape, warm.dtype) == (cold.shape, cold.dtype) == ((70, 256), BF)
            offs2 = offs.clone()  # other offs contents, the same key: passed as they are
            owners["offs"] = offs2
            cutegemm.grouped_gemm(x, qe, offs=offs2)
            assert _weight_args(k, owners)[4][3] == "offs"
            owners["offs"] = offs


def test_warm_weight_only_call_keeps_every_check():
    """After warm calls, an input off the plan raises the cold call's error or takes the cold
    path: another K, rank, format or element dtype; a replaced data / scales / global scale; a
    weight of the same id after the first was freed; another current device; options given."""
    import gc

    from cutegemm.blockscaled.weight_only import launch

    from ..host_overhead_cpu import cpu_weight_path

    qw = quantize_ref(torch.randn(512, 256), "nvfp4", global_scale=2.0)
    x = torch.randn(4, 256, dtype=BF)
    with cpu_weight_path(_Recorder()) as k:
        for _ in range(2):
            cutegemm.gemm(x, qw)
        assert len(launch._PLANS) == 1
        with pytest.raises(ValueError, match="K mismatch"):
            cutegemm.gemm(torch.randn(4, 512, dtype=BF), qw)
        with pytest.raises(ValueError, match="expected \\(M, K\\)"):
            cutegemm.gemm(x.view(1, 4, 256), qw)
        with pytest.raises(TypeError, match="bf16 or float8_e4m3fn"):
            cutegemm.gemm(x.half(), qw)
        with pytest.raises(TypeError, match="float8_e4m3fn"):  # e5m2 bytes labelled MXFP8
            q8 = quantize_ref(torch.randn(512, 256), "mxfp8")
            cutegemm.gemm(x, q8)
            cutegemm.gemm(x, BlockScaledTensor(q8.data.view(torch.float8_e5m2), q8.scales, q8.fmt, q8.shape))
        with pytest.raises(ValueError, match="out must be"):
            cutegemm.gemm(x, qw, out=torch.empty(4, 511, dtype=BF))
        with pytest.raises(ValueError, match="supports only"):
            cutegemm.gemm(x, qw, bias=torch.zeros(512, dtype=BF))
        with pytest.raises(ValueError, match="offs"):
            cutegemm.grouped_gemm(x, quantize_ref(torch.randn(2, 512, 256), "nvfp4"), offs=None)
        for field in ("data", "scales", "global_scale"):  # replaced tensors: the new ones are passed
            new = getattr(qw, field).clone()
            setattr(qw, field, new)
            cutegemm.gemm(x, qw)
            assert any(isinstance(a, torch.Tensor) and a.data_ptr() == new.data_ptr() for a in k.args), field
        plan = launch._PLANS[launch._plan_key(x, qw, None, BF)]
        real = launch.current_device
        launch.current_device = lambda: 1  # another device than the plan's: the cold path
        cold_calls = []
        check = launch.check_args
        launch.check_args = lambda *a: cold_calls.append(1) or check(*a)
        try:
            cutegemm.gemm(x, qw)
        finally:
            launch.current_device, launch.check_args = real, check
        assert cold_calls == [1] and plan.serves(qw)
        # a freed weight takes its plans with it; a new weight never meets them
        del qw, q8, plan
        gc.collect()
        assert not launch._PLANS
        q2 = quantize_ref(torch.randn(512, 256), "mxfp4")
        cutegemm.gemm(x, q2)
        assert any(isinstance(a, torch.Tensor) and a.data_ptr() == q2.data.data_ptr() for a in k.args)


def test_warm_split_call_takes_the_current_streams_workspace():
    """A split-grid plan passes the workspace of the stream current at the call, as the cold call
    does: a view of that stream's split-K buffer (``gemm.launch.split_workspace``, shared with the
    dense split plans), its counters ending where the buffer's counter zone does."""
    from cutegemm.blockscaled.weight_only import launch
    from cutegemm.gemm import launch as split_launch

    from ..host_overhead_cpu import _Stream, cpu_weight_path

    def at(ws):  # (buffer storage, where the view's slots start)
        return ws.untyped_storage().data_ptr(), ws.storage_offset()

    def current(stream):
        zone, buf = split_launch._SPLIT_BUFFERS[(torch.device("cpu"), stream)]
        return buf.untyped_storage().data_ptr(), zone

    qw = quantize_ref(torch.randn(1024, 256), "mxfp8")
    x = torch.randn(16, 256, dtype=BF)
    saved = split_launch._SPLIT_BUFFERS, split_launch._SPLIT_RETIRED, _Stream.cuda_stream
    split_launch._SPLIT_BUFFERS, split_launch._SPLIT_RETIRED = {}, []
    try:
        with cpu_weight_path(_Recorder()) as k:
            cutegemm.gemm(x, qw)
            assert launch._PLANS[launch._plan_key(x, qw, None, BF)].split is not None
            ws0, slot0 = k.args[7], k.args[14]
            assert slot0 % 4 == 0 and (at(ws0)[0], at(ws0)[1] + slot0) == current(0) and not ws0[:slot0].any()
            cutegemm.gemm(x, qw)
            assert at(k.args[7]) == at(ws0) and k.args[14] == slot0
            _Stream.cuda_stream = 7
            cutegemm.gemm(x, qw)
            ws7, slot7 = k.args[7], k.args[14]
            assert (at(ws7)[0], at(ws7)[1] + slot7) == current(7) != current(0)
            launch._PLANS.clear()
            cutegemm.gemm(x, qw)  # the cold call on stream 7 passes the same
            assert at(k.args[7]) == at(ws7) and k.args[14] == slot7
            cutegemm.gemm(torch.randn(128, 256, dtype=BF), qw)  # more slots: stream 7's buffer grows
            assert current(7)[0] != at(ws7)[0] and split_launch._SPLIT_RETIRED  # the old one kept alive
            _Stream.cuda_stream = 0
            cutegemm.gemm(x, qw)
            assert at(k.args[7])[0] == current(0)[0]
            _Stream.cuda_stream = 7
            cutegemm.gemm(x, qw)  # back on stream 7: its current (grown) buffer
            assert (at(k.args[7])[0], at(k.args[7])[1] + k.args[14]) == current(7)
    finally:
        split_launch._SPLIT_BUFFERS, split_launch._SPLIT_RETIRED, _Stream.cuda_stream = saved


@pytest.mark.parametrize("opts", [{}, {"out_dtype": None}, {"alpha": 0.5}, {"out_dtype": torch.float16, "alpha": 2},
                                  {"out_dtype": torch.float32}])  # fmt: skip
def test_face_block_scaled_options_pass_what_gemm_fp4_weight_passes(opts):
    """cutegemm.gemm(x, qw, **opts) with only out_dtype / alpha (the face's branch that skips
    _supported, cold and warm) launches what gemm_fp4_weight with every option spelled out does."""
    from cutegemm.blockscaled.weight_only import launch

    from ..host_overhead_cpu import cpu_weight_path

    qw = quantize_ref(torch.randn(512, 256), "nvfp4", global_scale=0.5)
    x = torch.randn(8, 256, dtype=BF)
    owners = {"x": x, "data": qw.data, "scales": qw.scales}
    out_dtype = opts.get("out_dtype") or BF
    with cpu_weight_path(_Recorder()) as k:
        launch._PLANS.clear()
        launch.gemm_fp4_weight(x, qw, out_dtype=out_dtype, alpha=opts.get("alpha", 1.0), out=None, scale_a=None,
                               config=None)  # fmt: skip
        want = _weight_args(k, owners)
        launch._PLANS.clear()
        for _ in range(2):  # cold, warm
            res = cutegemm.gemm(x, qw, **opts)
            assert _weight_args(k, owners) == want and res.dtype == out_dtype and res.shape == (8, 512)
        grouped = quantize_ref(torch.randn(2, 512, 256), "mxfp8")
        offs = torch.tensor([3, 8], dtype=torch.int32)
        owners.update(data=grouped.data, scales=grouped.scales, offs=offs)
        launch.gemm_fp4_weight(x, grouped, offs=offs, out_dtype=out_dtype, alpha=opts.get("alpha", 1.0))
        want = _weight_args(k, owners)
        launch._PLANS.clear()
        for _ in range(2):
            res = cutegemm.grouped_gemm(x, grouped, offs=offs, **opts)
            assert _weight_args(k, owners) == want and res.dtype == out_dtype


def test_face_block_scaled_options_keep_every_check():
    """After warm calls: a bad out_dtype (not a dtype, unhashable, not floating, unsupported) or
    alpha raises the cold call's error; other options off their default are named; a weight
    whose format, shape or scale layout was changed in place takes the cold path."""
    from cutegemm.blockscaled.formats import MXFP4
    from cutegemm.blockscaled.weight_only import launch

    from ..host_overhead_cpu import cpu_weight_path

    qw = quantize_ref(torch.randn(512, 256), "nvfp4")
    x = torch.randn(8, 256, dtype=BF)
    with cpu_weight_path(_Recorder()):
        for od in (None, torch.float16):
            for _ in range(2):
                cutegemm.gemm(x, qw, out_dtype=od, alpha=0.5)
        for bad, err in ((0, TypeError), ([BF], TypeError), (torch.int32, TypeError), (torch.float64, TypeError),
                         ("mxfp8", TypeError)):  # fmt: skip
            with pytest.raises(err, match="out_dtype"):
                cutegemm.gemm(x, qw, out_dtype=bad)
        with pytest.raises(ValueError, match="float"):
            cutegemm.gemm(x, qw, alpha="half")
        with pytest.raises(ValueError, match="supports only .*got bias"):
            cutegemm.gemm(x, qw, alpha=0.5, bias=torch.zeros(512))
        with pytest.raises(TypeError, match="unexpected keyword"):
            cutegemm.gemm(x, qw, alpah=0.5)
        plan = launch._PLANS[launch._plan_key(x, qw, None, BF)]
        cold = []
        real = launch.check_args
        launch.check_args = lambda *a: cold.append(1) or real(*a)
        try:
            for field, value in (("fmt", MXFP4), ("shape", torch.Size(qw.shape)), ("scales_swizzled", False)):
                old = getattr(qw, field)
                setattr(qw, field, value)
                assert not plan.serves(qw), field
                cold.clear()
                try:
                    cutegemm.gemm(x, qw)
                except (ValueError, TypeError):
                    pass  # the cold checks may refuse the changed weight: either way not the plan
                assert cold, f"a changed {field} took the warm path"
                setattr(qw, field, old)
            assert plan.serves(qw)
        finally:
            launch.check_args = real


def test_routes_fill_defaults_as_the_signature():
    """face._supported over each route: the route's options with the public function's defaults,
    out_dtype None -> out's dtype or bf16."""
    from cutegemm.api import face

    opts = face._supported(face._WEIGHT_ONLY, {"alpha": 2})
    assert opts == {"scale_a": None, "out_dtype": BF, "alpha": 2, "config": None, "out": None}
    out = torch.empty(2, 2, dtype=torch.float16)
    assert face._supported(face._BLOCKSCALED, {"out": out})["out_dtype"] == torch.float16
    assert face._supported(face._BLOCKSCALED, {"out": out, "bias": None, "beta": 0.0})["out_dtype"] == torch.float16
    ref = face._supported(face._BLOCKSCALED_REF, {})
    assert ref == {"out_dtype": BF, "alpha": 1.0, "compute_dtype": torch.float32}
    grouped = face._supported(face._GROUPED[cutegemm.grouped.packed.grouped_gemm, ("scale_a",)], {"offs": 1})
    assert grouped == {"offs": 1, "out_dtype": BF, "alpha": 1.0, "out": None, "config": None, "check_offs": False,
                       "scale_a": None}  # fmt: skip
