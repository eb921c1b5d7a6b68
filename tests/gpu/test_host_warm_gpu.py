"""Warm (memoized) host paths on the GPU: the second call of a signature must take the warm path
and return exactly what the cold call returned (quantize, torch.ops.cutegemm.quantize,
dequantize, the sm_90a MXFP8 x MXFP8 gemm's ring route, the weight-only gemm / grouped_gemm from
the face with and without out_dtype / alpha, torch.ops.cutegemm's no-gradient path), and a wrong
input after warm calls must still raise."""

from __future__ import annotations

import pytest
import torch

import cutegemm
from cutegemm.blockscaled import dequant, mx_sm90
from cutegemm.blockscaled import quantize_launch as ql
from cutegemm.blockscaled.reference import dequantize_ref, quantize_ref

pytestmark = pytest.mark.gpu


def _x(shape, seed, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, device="cuda", generator=g) * 10).to(dtype)


def _same(a, b) -> bool:
    fields = ("data", "scales", "global_scale")
    return all(
        (getattr(a, f) is None and getattr(b, f) is None)
        or torch.equal(getattr(a, f).reshape(-1).view(torch.uint8), getattr(b, f).reshape(-1).view(torch.uint8))
        for f in fields
    ) and (a.fmt, a.shape) == (b.fmt, b.shape)


@pytest.mark.parametrize("fmt, gs", [("mxfp8", None), ("mxfp4", None), ("nvfp4", 0.25), ("nvfp4", None)])
@pytest.mark.parametrize("shape", [(128, 1024), (16, 512), (2, 40, 64)])
def test_warm_quantize_equals_cold(fmt, gs, shape):
    from cutegemm import ops

    ql._PLANS.clear()
    x = _x(shape, seed=sum(shape))
    kw = {} if gs is None else {"global_scale": gs}
    cold = cutegemm.quantize(x, fmt, **kw)
    assert ql._PLANS, "the cold call made no warm plan"
    x2 = x.clone()  # another tensor of the same signature
    warm = cutegemm.quantize(x2, fmt, **kw)
    assert _same(warm, cold) and _same(cold, quantize_ref(x, fmt, **kw))
    for _ in range(2):
        assert _same(ops.quantize(x2, fmt, **kw), cold)
    with pytest.raises(TypeError, match="dtype"):
        cutegemm.quantize(x.double(), fmt)
    with pytest.raises(ValueError, match="CUDA"):
        cutegemm.quantize(x.cpu(), fmt)


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4"])
def test_warm_dequantize_equals_cold(fmt):
    q = cutegemm.quantize(_x((3, 128, 256), seed=5), fmt)
    ref = dequantize_ref(q)
    dequant._WARM.clear()
    for dt in (torch.bfloat16, torch.float32, torch.float16):
        cold = cutegemm.dequantize(q, dt)
        warm = cutegemm.dequantize(q, dt)
        assert dequant._WARM and torch.equal(warm, cold) and torch.equal(cold, ref.to(dt))
    with pytest.raises(TypeError, match="out_dtype"):
        cutegemm.dequantize(q, torch.float64)


def test_warm_ring_gemm_equals_cold():
    """sm_90a, 2-D MXFP8 x MXFP8 without config / out: A dequantized, then the MXFP8-weight GEMM."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the ring route is the sm_90a path")
    mx_sm90._RING.clear()
    qb = cutegemm.quantize(_x((1024, 512), seed=1), "mxfp8")
    for m, out_dtype, alpha in (
        (16, torch.bfloat16, 1.0),
        (1, torch.float32, 0.5),
        (200, torch.bfloat16, 2.0),
    ):
        qa = cutegemm.quantize(_x((m, 512), seed=m), "mxfp8")
        cold = cutegemm.gemm(qa, qb, out_dtype=out_dtype, alpha=alpha)
        assert mx_sm90._RING, "the cold call did not make its signature warm"
        qa2 = cutegemm.quantize(_x((m, 512), seed=m), "mxfp8")  # new tensors, the same signature
        warm = cutegemm.gemm(qa2, qb, out_dtype=out_dtype, alpha=alpha)
        assert warm.dtype == out_dtype and warm.shape == (m, 1024)
        assert torch.equal(warm, cold)
        ref = cutegemm.gemm_ref(qa, qb, out_dtype=torch.float32, alpha=alpha)
        torch.testing.assert_close(warm.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())
    with pytest.raises(ValueError, match="K mismatch"):
        cutegemm.gemm(qa2, cutegemm.quantize(_x((1024, 256), seed=3), "mxfp8"))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
@pytest.mark.parametrize("n", [1024, 17408])  # split grid (fewer weight tiles than SMs) or not
def test_warm_weight_only_gemm_equals_cold(fmt, n):
    """cutegemm.gemm(x, qw) with no options (decode rows; the face's launch.warm_call) and the
    grouped form with only offs: the warm call returns the cold call's bits, for a contiguous, a
    strided and a misaligned x."""
    from cutegemm.blockscaled.weight_only import launch

    qw = cutegemm.quantize(_x((n, 512), seed=n), fmt, **({"global_scale": 0.5} if fmt == "nvfp4" else {}))
    for m in (1, 16, 64):
        x = _x((m, 512), seed=m)
        wide = torch.empty(m, 1024, dtype=torch.bfloat16, device="cuda")[:, ::2]
        off = torch.empty(m * 512 + 1, dtype=torch.bfloat16, device="cuda")[1:].view(m, 512)
        for xv in (x, wide.copy_(x), off.copy_(x)):
            launch._PLANS.clear()
            cold = cutegemm.gemm(xv, qw)
            assert launch._PLANS, "the cold call made no plan"
            warm = cutegemm.gemm(xv.clone() if xv.is_contiguous() else xv, qw)
            assert torch.equal(warm, cold)
            assert torch.equal(cutegemm.gemm(xv, qw), cold)
        ref = cutegemm.gemm_ref(x, qw, out_dtype=torch.float32)
        torch.testing.assert_close(cold.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())
        for opts in ({"out_dtype": torch.float16, "alpha": 0.5}, {"out_dtype": torch.float32}, {"alpha": 2.0}):
            launch._PLANS.clear()  # the face's out_dtype / alpha branch: cold, warm, and spelled out in full
            cold = cutegemm.gemm(x, qw, **opts)
            assert torch.equal(cutegemm.gemm(x.clone(), qw, **opts), cold)
            full = launch.gemm_fp4_weight(x, qw, out=None, scale_a=None, config=None, out_dtype=opts.get(
                "out_dtype", torch.bfloat16), alpha=opts.get("alpha", 1.0))  # fmt: skip
            assert torch.equal(full, cold) and cold.dtype == opts.get("out_dtype", torch.bfloat16)
    qe = cutegemm.quantize(_x((4, 256, 512), seed=7), fmt)
    x = _x((70, 512), seed=70)
    offs = torch.tensor([10, 10, 40, 64], dtype=torch.int32, device="cuda")
    launch._PLANS.clear()
    cold = cutegemm.grouped_gemm(x, qe, offs=offs)
    warm = cutegemm.grouped_gemm(x.clone(), qe, offs=offs.clone())
    assert launch._PLANS and torch.equal(warm[:64], cold[:64])
    cold = cutegemm.grouped_gemm(x, qe, offs=offs, out_dtype=torch.float32, alpha=0.5)
    warm = cutegemm.grouped_gemm(x.clone(), qe, offs=offs, out_dtype=torch.float32, alpha=0.5)
    assert torch.equal(warm[:64], cold[:64]) and warm.dtype == torch.float32
    with pytest.raises(ValueError, match="K mismatch"):
        cutegemm.gemm(_x((16, 256), seed=2), qw)


def test_ops_no_grad_path_equals_custom_ops_path():
    """torch.ops.cutegemm.gemm / grouped_gemm / quantize with no gradient needed (our Autograd
    kernel, Dynamo's disable wrapper skipped where Dynamo is off) return the bits of custom_op's
    own path (an operand requiring grad), of cutegemm.gemm / grouped_gemm, and of a
    torch.compile(fullgraph=True) call."""
    op = torch.ops.cutegemm
    a, b = _x((64, 256), seed=11), _x((256, 512), seed=12)
    x, w = _x((96, 256), seed=13), _x((4, 256, 128), seed=14)
    offs = torch.tensor([16, 40, 40, 96], dtype=torch.int32, device="cuda")
    for _ in range(2):  # cold, then warm
        fast = op.gemm(a, b, alpha=0.5, activation="silu")
        slow = op.gemm(a.clone().requires_grad_(), b, alpha=0.5, activation="silu").detach()
        assert torch.equal(fast, slow) and torch.equal(fast, cutegemm.gemm(a, b, alpha=0.5, activation="silu"))
        g_fast = op.grouped_gemm(x, w, offs)
        g_slow = op.grouped_gemm(x, w.clone().requires_grad_(), offs).detach()
        assert torch.equal(g_fast, g_slow) and torch.equal(g_fast, cutegemm.grouped_gemm(x, w, offs=offs))
        q_fast = op.quantize(a, "mxfp8", None)
        q_slow = op.quantize(a.clone().requires_grad_(), "mxfp8", None)
        for f, s in zip(q_fast[:2], q_slow[:2], strict=True):
            assert torch.equal(f.view(torch.uint8), s.view(torch.uint8))
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b, x, w, offs: (op.gemm(a, b, alpha=0.5, activation="silu"),
                                                       op.grouped_gemm(x, w, offs)), fullgraph=True)  # fmt: skip
    got = compiled(a, b, x, w, offs)
    assert torch.equal(got[0], fast) and torch.equal(got[1], g_fast)
