"""Inputs a random search of the public host paths found mishandled (each case: what torch does, and
what cutegemm now does), on the CPU: the whole host path of every call runs with the compiled
kernels replaced by tests/emulated_kernel.py, into NaN-poisoned outputs where an output is given.
Wrong values (K = 0 with c being out; a dropped 16-bit scale_a; rows past offs[-1] written), valid
inputs refused (FP8 with N = 1, torch's padded one-block scale_b, gather_index over a weight the
gather kernel cannot read in place) and internal errors in place of clear ones."""

from __future__ import annotations

import pytest
import torch

import cutegemm
import cutegemm.ops  # noqa: F401  (registers torch.ops.cutegemm)

from ..emulated_kernel import emulated_kernels

BF, E4 = torch.bfloat16, torch.float8_e4m3fn


def _offs(*ends):
    return torch.tensor(ends, dtype=torch.int32)


def _randn(*shape, dtype=BF, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# ---------------------------------------------------------------------------------------------- dense


@pytest.mark.parametrize("view", ["stepped", "odd_rows"])
def test_k0_with_c_being_out_that_needs_a_scratch(view):
    """K = 0, ``c=out`` and an out the TMA store cannot write (a stepped view; rows of 6 bytes):
    beta * c (+ bias), as torch.addmm; it read the never-written scratch copied over c before."""
    a, b = _randn(4, 0), _randn(0, 3)
    buf = torch.full((4, 6), float("nan"), dtype=BF)
    out = buf[:, ::2] if view == "stepped" else torch.empty(4, 3, dtype=BF)
    out.copy_(_randn(4, 3, seed=1))
    c0, bias = out.clone(), _randn(3, seed=2)
    with emulated_kernels():
        res = cutegemm.gemm(a, b, out=out, beta=0.5, c=out, bias=bias)
    assert res is out
    torch.testing.assert_close(out, torch.addmm(bias.float(), a.float(), b.float(), beta=1).add(0.5 * c0.float()).to(BF))
    if view == "stepped":
        assert torch.isnan(buf[:, 1::2]).all()


@pytest.mark.parametrize("shapes", [((3, 5), (5, 0), (0,)), ((2, 3, 0), (0, 4)), ((3, 5), (2, 5, 0)), ((2, 0, 5), (5, 4))],
                         ids=["n0_bias", "3dx2d_k0", "2dx3d_n0", "m0"])  # fmt: skip
def test_op_backward_with_zero_size_dims(shapes):
    """torch.ops.cutegemm.gemm's backward where a dimension is 0: zero-size or zero gradients, as
    torch.matmul's (it raised reshaping a 0-element tensor with a -1)."""
    args = [_randn(*s, seed=i).requires_grad_() for i, s in enumerate(shapes)]
    torch.ops.cutegemm.gemm(*args).sum().backward()
    ref = [x.detach().double().requires_grad_() for x in args]
    (torch.matmul(ref[0], ref[1]) + (ref[2] if len(ref) > 2 else 0)).sum().backward()
    for x, r in zip(args, ref, strict=True):
        assert x.grad.shape == r.grad.shape
        torch.testing.assert_close(x.grad.double(), r.grad)


def test_bad_inputs_get_clear_errors():
    a, b = _randn(16, 32), _randn(32, 16)
    with emulated_kernels():
        with pytest.raises(ValueError, match="one memory location"):  # torch refuses it too
            cutegemm.gemm(a, b, out=torch.zeros(1, 16, dtype=BF).expand(16, 16))
        with pytest.raises(TypeError, match="dense \\(strided\\)"):
            cutegemm.gemm(a.to_sparse(), b)
        with pytest.raises(TypeError, match="real numbers"):
            cutegemm.gemm(a, b, alpha="2")
        with pytest.raises(TypeError, match="config must be a cutegemm.GemmConfig"):
            cutegemm.gemm(a, b, config="x")
        offs = _offs(8, 16)
        with pytest.raises(TypeError, match="config must be a cutegemm.GemmConfig"):
            cutegemm.grouped_gemm(a, _randn(2, 32, 16), offs=offs, config="x")
        with pytest.raises(TypeError, match="config must be a cutegemm.GemmConfig"):
            cutegemm.grouped_gemm(_randn(2, 8, 32), _randn(2, 32, 16), config="x")
        with pytest.raises(TypeError, match="config must be a cutegemm.GemmConfig"):
            cutegemm.grouped_gemm(a.t(), _randn(16, 8), offs=offs, config="x")  # K-grouped
        with pytest.raises(TypeError, match="alpha must be a real number"):
            cutegemm.grouped_gemm(a, _randn(2, 32, 16), offs=offs, alpha=None)
        with pytest.raises(ValueError, match="group 0"):
            cutegemm.grouped_gemm([1.0], [b])
        with pytest.raises(ValueError, match="gather_index: the packed form only"):
            cutegemm.grouped_gemm([a], [b], gather_index=torch.zeros(3, dtype=torch.int32))
        with pytest.raises(ValueError, match="gather_index: the packed form only"):
            cutegemm.grouped_gemm(_randn(2, 8, 32), _randn(2, 32, 16), offs=offs,
                                  gather_index=torch.zeros(3, dtype=torch.int32))  # fmt: skip


# ---------------------------------------------------------------------------------------------- grouped


@pytest.mark.parametrize("w_layout", ["transposed_n5", "rowmajor_n5", "rowmajor_n12_gated"])
def test_gather_index_over_layouts_the_kernel_cannot_read(w_layout):
    """gather_index with a weight whose strides are not 16-byte multiples (N = 5), or an output of
    rows that are not (gated N' = 6): the copy route (x[idx] and the packed form, which stages such
    layouts), as torch._grouped_mm(x[idx], w) computes; the gather route refused these."""
    x, idx, offs = _randn(4, 64), torch.tensor([2, 0, 1, 3, 3], dtype=torch.int32), _offs(3, 5)
    act = "swiglu" if w_layout.endswith("gated") else None
    n = 12 if act else 5
    w = _randn(2, n, 64, seed=1).transpose(1, 2) if w_layout.startswith("transposed") else _randn(2, 64, n, seed=1)
    with emulated_kernels():
        got = cutegemm.grouped_gemm(x, w, offs=offs, gather_index=idx, activation=act)
    ref = cutegemm.grouped_gemm_ref(x[idx.long()], w, offs=offs, activation=act)
    torch.testing.assert_close(got.float(), ref.float(), atol=0.05, rtol=0.02)


@pytest.mark.parametrize("case", ["bf16", "bf16_bias_relu", "fp8", "3d_x_2d"])
def test_k0_leaves_rows_past_offs_alone(case):
    """K = 0 into a given out: the epilogue of a zero product in rows below offs[-1] (columns, in
    the 3d x 2d form), the rest of out untouched (it zeroed or overwrote all of it)."""
    kw = {}
    if case == "3d_x_2d":
        a, b, offs = _randn(2, 4, 0), _randn(0, 10), _offs(3, 7)
        out = torch.full((4, 10), float("nan"), dtype=BF)
    else:
        dtype = E4 if case == "fp8" else BF
        a, b, offs = torch.zeros(8, 0, dtype=dtype), torch.zeros(2, 0, 6, dtype=dtype), _offs(2, 5)
        out = torch.full((8, 6), float("nan"), dtype=BF)
        if case == "fp8":
            kw = dict(scale_a=torch.ones(8), scale_b=torch.ones(2, 6))
        if case == "bf16_bias_relu":
            kw = dict(bias=torch.full((2, 6), 2.0, dtype=BF), activation="relu")
    with emulated_kernels():
        cutegemm.grouped_gemm(a, b, offs=offs, out=out, **kw)
    written = out[:, :7] if case == "3d_x_2d" else out[:5]
    rest = out[:, 7:] if case == "3d_x_2d" else out[5:]
    assert torch.equal(written, torch.full_like(written, 2.0 if kw.get("bias") is not None else 0.0))
    assert torch.isnan(rest).all()


def test_grouped_ref_k0_with_infinite_scales_is_zero():
    """K = 0: a zero product whatever the scales (torch._scaled_mm: zeros), as the dense twin."""
    a, b = torch.zeros(8, 0, dtype=E4), torch.zeros(2, 0, 32, dtype=E4)
    res = cutegemm.grouped_gemm_ref(a, b, offs=_offs(2, 4), scale_a=torch.full((8,), float("inf")),
                                    scale_b=torch.ones(2, 32))  # fmt: skip
    assert torch.equal(res[:4].float(), torch.zeros(4, 32))


def test_3d_x_3d_16_bit_scale_a_is_applied():
    """3d x 3d bf16 with scale_a (a per-row output scale): it was dropped on the way to the batched
    dense GEMM (its twin applied it)."""
    a, b, sa = _randn(2, 8, 16), _randn(2, 16, 8, seed=1), torch.rand(2, 8) + 0.5
    with emulated_kernels():
        got = cutegemm.grouped_gemm(a, b, scale_a=sa)
    ref = (torch.bmm(a.float(), b.float()) * sa.unsqueeze(-1)).to(BF)
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(cutegemm.grouped_gemm_ref(a, b, scale_a=sa), ref)


@pytest.mark.parametrize("scale", ["scale_a", "scale_b"])
def test_3d_x_2d_refuses_16_bit_scales(scale):
    """The 3d x 2d form's scales are FP8 ones; 16-bit scale_a got a misleading error and scale_b
    was applied per column of out, undocumented: both refused, by the twin too."""
    a, b, offs = _randn(2, 4, 16), _randn(16, 10), _offs(3, 10)
    kw = {scale: torch.ones(4 if scale == "scale_a" else 10)}
    for fn in (cutegemm.grouped_gemm, cutegemm.grouped_gemm_ref):
        with emulated_kernels(), pytest.raises(ValueError, match="FP8 scales"):
            fn(a, b, offs=offs, **kw)


@pytest.mark.parametrize("option", ["out", "config", "check_offs", "epilogue_args", "gate_layout", "fast_accum"])
def test_list_form_refuses_options_it_does_not_take(option):
    """The list form returns new outputs and takes out_dtype / alpha / activation only: the other
    options were ignored without a word."""
    a, b = _randn(4, 8), _randn(8, 6)
    value = {"out": torch.empty(4, 6, dtype=BF), "config": cutegemm.GemmConfig(arch="sm_90a"), "check_offs": True,
             "epilogue_args": (torch.ones(6),), "gate_layout": "halves", "fast_accum": True}[option]  # fmt: skip
    with emulated_kernels(), pytest.raises(ValueError, match="the list form takes"):
        cutegemm.grouped_gemm([a], [b], **{option: value})


# ---------------------------------------------------------------------------------------------- FP8


def test_padded_one_block_scale_b():
    """FP8 block scales of one K block and one N block in torch's padded layout (scale_b (4, 1),
    the padding inf): per-row x per-tensor scales, in gemm and its twin (refused before)."""
    a, b = _randn(64, 64, dtype=E4), _randn(80, 64, dtype=E4, seed=1).t()
    sa = torch.rand(64, 1) + 0.5
    sb = torch.tensor([[0.5], [float("inf")], [float("inf")], [float("inf")]])
    ref = cutegemm.gemm_ref(a, b, scale_a=sa, scale_b=sb[:1])
    with emulated_kernels():
        got = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, ref)
    assert torch.equal(cutegemm.gemm_ref(a, b, scale_a=sa, scale_b=sb), ref)


@pytest.mark.parametrize("form", ["dense_t", "dense_contiguous", "grouped", "3d_x_2d_m1"])
def test_fp8_with_one_column(form):
    """FP8 with N = 1 (or M = 1 in the 3d x 2d form, its packed N): B is read K-major, as FP8
    needs (a size-1 N mode was taken for B's unit-stride one and the call refused)."""
    one = torch.ones(1)
    with emulated_kernels():
        if form.startswith("dense"):
            a = _randn(8, 64, dtype=E4)
            w = _randn(1, 64, dtype=E4, seed=1).t() if form == "dense_t" else _randn(64, 1, dtype=E4, seed=1)
            got, ref = cutegemm.gemm(a, w, scale_a=one, scale_b=one), cutegemm.gemm_ref(a, w, scale_a=one, scale_b=one)
        elif form == "grouped":
            a, w = _randn(8, 64, dtype=E4), _randn(2, 1, 64, dtype=E4, seed=1).transpose(1, 2)
            kw = dict(offs=_offs(4, 8), scale_a=torch.ones(8), scale_b=torch.ones(2, 1))
            got, ref = cutegemm.grouped_gemm(a, w, **kw), cutegemm.grouped_gemm_ref(a, w, **kw)
        else:
            a, w = _randn(2, 1, 64, dtype=E4), _randn(10, 64, dtype=E4, seed=1).t()
            kw = dict(offs=_offs(3, 10), scale_a=torch.ones(2, 1), scale_b=torch.ones(10))
            got, ref = cutegemm.grouped_gemm(a, w, **kw), cutegemm.grouped_gemm_ref(a, w, **kw)
    torch.testing.assert_close(got.float(), ref.float(), atol=0.1, rtol=0.02)


@pytest.mark.parametrize("kw,error,match", [
    (dict(scale_a=torch.ones(33, 1), scale_b=torch.ones(1, 80)), ValueError, "scale_a must have 1 or 64"),
    (dict(scale_a=1.0, scale_b=1.0), TypeError, "scale_a must be a torch.Tensor"),
    (dict(scale_a=torch.ones(64, 1, dtype=torch.float16), scale_b=torch.ones(1, 80)), TypeError, "float32"),
    (dict(scale_a=torch.ones(64, 1), scale_b=torch.ones(1, 80), out_dtype=torch.int32), TypeError, "out_dtype"),
], ids=["scale_shape", "float_scales", "fp16_scales", "int_out"])  # fmt: skip
def test_gemm_ref_checks_fp8_arguments_as_gemm(kw, error, match):
    """gemm_ref ("same arguments, same rules") refuses what gemm refuses, with its error (it raised
    torch's broadcasting errors, an AttributeError, or computed)."""
    a, b = _randn(64, 64, dtype=E4), _randn(80, 64, dtype=E4, seed=1).t()
    with pytest.raises(error, match=match):
        cutegemm.gemm_ref(a, b, **kw)
    with emulated_kernels(), pytest.raises(error, match=match):
        cutegemm.gemm(a, b, **kw)
    with pytest.raises(ValueError, match="for FP8 inputs"):
        cutegemm.gemm_ref(_randn(4, 8), _randn(8, 4), scale_a=torch.ones(4))


# ---------------------------------------------------------------------------------------------- custom ops


def _opcheck_cases():
    zt = _randn(6, 5, dtype=torch.float32).t()  # a column-major Z (T = 5, 2I = 6)
    zb, dh = _randn(4, 6), _randn(4, 3, dtype=torch.float32)
    src, idx = _randn(3, 4, dtype=torch.float64), torch.tensor([0, 2], dtype=torch.int32)
    return {
        "swiglu_colmajor_z": (torch.ops.cutegemm.swiglu.default, (zt, "interleaved")),
        "swiglu_grads_colmajor_z": (torch.ops.cutegemm.swiglu_grads.default, (_randn(5, 3, dtype=torch.float32), zt,
                                                                             "halves")),  # fmt: skip
        "routed_colmajor_z": (torch.ops.cutegemm.routed_swiglu_grads.default, (_randn(5, 3, dtype=torch.float32), zt,
                                                                              torch.rand(5), "interleaved")),  # fmt: skip
        "routed_bf16_z": (torch.ops.cutegemm.routed_swiglu_grads.default, (dh, zb, torch.rand(4), "halves")),
        "routed_fp64": (torch.ops.cutegemm.routed_swiglu_grads.default, (dh.double(), zb.double(),
                                                                        torch.rand(4, dtype=torch.float64), "halves")),  # fmt: skip
        "combine_dot_fp64": (torch.ops.cutegemm.combine_rows_dot.default, (src, idx, None, _randn(2, 4, dtype=torch.float64))),
    }


@pytest.mark.parametrize("name", list(_opcheck_cases()))
def test_helper_ops_fakes_match_the_real_ops(name):
    """The fake (meta) kernels give the real ops' shapes, strides and dtypes (torch.library.opcheck):
    the torch fallbacks kept Z's strides in H / dZ where the fakes and the kernels are row-major,
    and the fakes gave fp32 w H / dots where the ops give Z's dtype / fp64 for fp64."""
    op, args = _opcheck_cases()[name]
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


def test_quantize_fake_refuses_empty_x_as_the_op_does():
    """torch.ops.cutegemm.quantize refuses an empty x (as cutegemm.quantize and quantize_ref); its
    fake accepted it, so a compiled graph traced and then failed at run time."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    for shape in ((0, 32), (4, 0)):
        with pytest.raises(ValueError, match="non-empty"):
            torch.ops.cutegemm.quantize(torch.randn(*shape), "mxfp8")
        with FakeTensorMode(), pytest.raises(ValueError, match="non-empty"):
            torch.ops.cutegemm.quantize(torch.empty(*shape), "mxfp8")


# ---------------------------------------------------------------------------------------------- MoE layer


def _moe(T=5, H=8, I=4, E=3, k=2):
    g = torch.Generator().manual_seed(0)
    x, w1, w2 = torch.randn(T, H, generator=g), torch.randn(E, H, 2 * I, generator=g), torch.randn(E, I, H, generator=g)
    return x, torch.randint(0, E, (T, k), generator=g), torch.rand(T, k, generator=g), w1, w2


def test_routed_experts_without_slots_or_experts():
    """k = 0 (no slots: zeros, x's gradient zero; it returned (0, H) and its backward failed) and
    E = 0 (every slot a sentinel: zeros; it raised an IndexError)."""
    from cutegemm.moe import routed_experts

    x, ids, w, w1, w2 = _moe()
    xg = x.clone().requires_grad_()
    out = routed_experts(xg, ids[:, :0], w[:, :0], w1, w2)
    assert out.shape == x.shape and not out.any()
    out.sum().backward()
    assert torch.equal(xg.grad, torch.zeros_like(x))
    assert not routed_experts(x, torch.full_like(ids, -1), w, w1[:0], w2[:0]).any()


def test_moe_bad_inputs_get_clear_errors():
    from cutegemm.moe import combine, dispatch, grouped_experts, routed_experts

    x, ids, w, w1, w2 = _moe()
    offs = _offs(2, 3, 5)
    with pytest.raises(ValueError, match="k must be a positive int"):
        combine(torch.zeros(0, 4), torch.zeros(0, dtype=torch.int32), 0)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        routed_experts(x.tolist(), ids, w, w1, w2)
    with pytest.raises(TypeError, match="top_k_index must be a torch.Tensor"):
        dispatch(ids.tolist(), 3)
    with pytest.raises(TypeError, match="out_scale must be"):
        grouped_experts(x, w1, w2, offs, out_scale=2.0)
    with pytest.raises(ValueError, match="out_scale must hold one value per row"):  # it broadcast to (5, 5, 8)
        grouped_experts(x, w1, w2, offs, out_scale=torch.rand(5, 1))
    with pytest.raises(ValueError, match="routing sorts 5"):  # a routing of another top_k_index
        routed_experts(x, ids, w, w1, w2, routing=dispatch(ids[:, :1], 3))


@pytest.mark.parametrize("shape_a,shape_b,fmt", [((0, 3), (3, 32), "mxfp8"), ((2, 0, 3), (2, 3, 64), "nvfp4")])
def test_quantized_output_of_no_rows(shape_a, shape_b, fmt):
    """A quantized output of M = 0 rows: the twin (and the custom op's CPU kernel) return an empty
    BlockScaledTensor, as the kernel path and the op's fake do (the twin raised quantize_ref's
    non-empty error)."""
    a, b = torch.randn(*shape_a), torch.randn(*shape_b)
    gs = torch.ones(()) if fmt == "nvfp4" else None
    q = cutegemm.gemm_ref(a, b, out_dtype=fmt, out_global_scale=gs)
    assert q.shape == (*shape_a[:-1], shape_b[-1]) and q.data.numel() == 0
    args, kwargs = (a, b, None, gs), dict(out_dtype=fmt)
    torch.library.opcheck(torch.ops.cutegemm.gemm_quantized.default, args, kwargs,
                          test_utils=("test_schema", "test_faketensor"))  # fmt: skip


# ---------------------------------------------------------------------------------------------- block-scaled


def test_block_scaled_twins_follow_the_kernel_rules():
    """The block-scaled twins: the grouped one refuses a non-floating out_dtype (as its dense twin
    and the kernel), the weight-only grouped one clamps offs as the kernel does (negative offs
    sliced from the end), a list-form call with a BlockScaledTensor gets the list form's error."""
    from cutegemm.blockscaled.reference import dequantize_ref, quantize_ref

    torch.manual_seed(0)
    qa, qb = quantize_ref(torch.randn(4, 32), "nvfp4"), quantize_ref(torch.randn(2, 8, 32), "nvfp4")
    with pytest.raises(ValueError, match="out_dtype"):
        cutegemm.grouped_gemm_ref(qa, qb, offs=_offs(2, 4), out_dtype=torch.int32)
    x, offs = torch.randn(4, 32).bfloat16(), _offs(-2, 4)
    got = cutegemm.grouped_gemm_ref(x, qb, offs=offs, out_dtype=torch.float32)
    ref = cutegemm.grouped_gemm_ref(x.float(), dequantize_ref(qb).mT.contiguous(), offs=offs, out_dtype=torch.float32)
    torch.testing.assert_close(got, ref)
    with pytest.raises(ValueError, match="group 0"):
        cutegemm.grouped_gemm_ref([x], [quantize_ref(torch.randn(16, 32), "nvfp4")])


@pytest.mark.parametrize("edit", ["fp32_scales", "short_scales", "wide_scales", "mx_global_scale", "e5m2_data",
                                  "shape", "fp4_uint8_scales", "data_k", "swizzled_flag", "global_scale_2"])  # fmt: skip
def test_edited_block_scaled_tensor_is_refused(edit):
    """A BlockScaledTensor whose fields disagree (built or edited by hand) is refused by the twins
    (dequantize_ref, gemm_ref) with an error naming the field; they computed silently wrong values
    (float32 scales, a broadcast scale row, a global scale on an MX format...) or raised internal
    errors."""
    from dataclasses import replace

    from cutegemm.blockscaled.reference import dequantize_ref, quantize_ref

    torch.manual_seed(0)
    q8 = quantize_ref(torch.randn(4, 64), "mxfp8", swizzle=False)
    q4 = quantize_ref(torch.randn(4, 32), "nvfp4", swizzle=False)
    bad = {
        "fp32_scales": replace(q8, scales=q8.scales.float()),
        "short_scales": replace(q8, scales=q8.scales[:1]),
        "wide_scales": replace(q8, scales=torch.cat([q8.scales, q8.scales[:, :1]], 1)),
        "mx_global_scale": replace(q8, global_scale=torch.tensor(2.0)),
        "e5m2_data": replace(q8, data=q8.data.view(torch.float8_e5m2)),
        "shape": replace(q8, shape=torch.Size((2, 64))),
        "fp4_uint8_scales": replace(q4, scales=q4.scales.view(torch.uint8)),
        "data_k": replace(q8, data=q8.data[:, :32]),
        "swizzled_flag": replace(q8, scales=q8.swizzled_scales()),
        "global_scale_2": replace(q4, global_scale=torch.ones(2)),
    }[edit]
    with pytest.raises(ValueError, match=r"q\.(scales|global_scale|data|shape)"):
        dequantize_ref(bad)
    with pytest.raises((TypeError, ValueError)):
        cutegemm.gemm_ref(torch.randn(2, bad.shape[-1]).bfloat16(), bad)


def test_block_scaled_tensor_format_by_name():
    """``fmt`` given by name is looked up at construction (gemm_ref raised AttributeError on a str),
    anything else is a TypeError there."""
    from dataclasses import replace

    from cutegemm.blockscaled.reference import dequantize_ref, quantize_ref

    torch.manual_seed(0)
    q = quantize_ref(torch.randn(8, 64), "mxfp8")
    named = replace(q, fmt="mxfp8")
    assert named.fmt is q.fmt
    x = torch.randn(3, 64).bfloat16()
    assert torch.equal(cutegemm.gemm_ref(x, named), cutegemm.gemm_ref(x, q))
    assert torch.equal(dequantize_ref(named), dequantize_ref(q))
    with pytest.raises(TypeError, match="fmt: expected a BlockFormat or str, got int"):
        replace(q, fmt=8)
    with pytest.raises(ValueError, match="unknown block-scaled format"):
        replace(q, fmt="mxfp9")


@pytest.mark.parametrize("edit", ["short_scales", "wide_scales", "fp32_scales", "mx_global_scale"])
@pytest.mark.parametrize("path", ["weight", "dequantize", "blockscaled_a", "blockscaled_b"])
def test_kernel_paths_refuse_edited_block_scaled_tensor(edit, path):
    """The kernel paths (weight-only GEMM, dequantize, MXFP8 x MXFP8) check a BlockScaledTensor's
    fields as the twins do, on a cold call and after warm calls of the same elements' signature
    (the warm keys carry the scales' and global scale's shapes): short or wide scales sent the
    kernel reading past or beside them, silently."""
    from dataclasses import replace

    from cutegemm.blockscaled.reference import quantize_ref

    from ..host_overhead_cpu import cpu_blockscaled_path, cpu_dequant_path, cpu_weight_path

    g = torch.Generator().manual_seed(0)
    q = quantize_ref(torch.randn(256, 512, generator=g), "mxfp8")
    qa = quantize_ref(torch.randn(16, 512, generator=g), "mxfp8")
    s = q.scales if path != "blockscaled_a" else qa.scales
    base = qa if path == "blockscaled_a" else q
    bad = {
        "short_scales": replace(base, scales=s[:-1]),
        "wide_scales": replace(base, scales=torch.cat([s, s[:, :1]], 1)),
        "fp32_scales": replace(base, scales=s.float()),
        "mx_global_scale": replace(base, global_scale=torch.tensor(2.0)),
    }[edit]
    x = torch.randn(16, 512, generator=g).bfloat16()
    ctx, call, good = {
        "weight": (cpu_weight_path, lambda w: cutegemm.gemm(x, w), q),
        "dequantize": (cpu_dequant_path, lambda w: cutegemm.dequantize(w, torch.bfloat16), q),
        "blockscaled_a": (cpu_blockscaled_path, lambda a: cutegemm.gemm(a, q), qa),
        "blockscaled_b": (cpu_blockscaled_path, lambda b: cutegemm.gemm(qa, b), q),
    }[path]
    with ctx():
        with pytest.raises((TypeError, ValueError), match=r"\.(scales|global_scale)"):
            call(bad)
        for _ in range(2):
            call(good)  # warm
        with pytest.raises((TypeError, ValueError), match=r"\.(scales|global_scale)"):
            call(bad)
