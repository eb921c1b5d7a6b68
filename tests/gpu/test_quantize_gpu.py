"""cutegemm.quantize on a GPU: byte-identical to quantize_ref on the same device (elements,
swizzled scales with their zero padding, global scale), for every format, input dtype and scale
rule; 2-D and 3-D; K tails; poisoned outputs; bad inputs raise."""

import importlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cutegemm
from cutegemm.blockscaled import dequantize_ref, quantize_ref

# the module (cutegemm.blockscaled.quantizer is also the name of the function it exports)
qmod = importlib.import_module("cutegemm.blockscaled.quantizer")
lmod = importlib.import_module("cutegemm.blockscaled.quantize_launch")

pytestmark = pytest.mark.gpu

FMTS = ("mxfp8", "mxfp8_e5m2", "mxfp4", "nvfp4")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SPECIAL = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-45, -3e-39, 2.0**-126, 3e38, -3.4e38,
           448.0, 464.0, 57344.0, 6.0, 5.0, 0.25, 0.75, 2.5]  # fmt: skip


def make_x(shape, dtype, seed, special_frac=0.0, spread=20):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape, device="cuda", generator=g)
    blocks = torch.randint(
        -spread, spread + 1, (*shape[:-1], -(-shape[-1] // 16), 1), device="cuda", generator=g
    )
    x = x * torch.exp2(blocks.float()).repeat_interleave(16, -2).flatten(-2)[..., : shape[-1]]
    if special_frac:
        pick = torch.rand(shape, device="cuda", generator=g) < special_frac
        vals = torch.tensor(SPECIAL, device="cuda")[
            torch.randint(0, len(SPECIAL), shape, device="cuda", generator=g)
        ]
        x = torch.where(pick, vals, x)
    return x.to(dtype)


def assert_same(q, ref):
    assert q.fmt == ref.fmt and q.shape == ref.shape and q.scales_swizzled
    assert q.data.dtype == ref.data.dtype and q.data.shape == ref.data.shape
    assert q.scales.dtype == ref.scales.dtype and q.scales.shape == ref.scales.shape
    d, rd = q.data.view(torch.uint8), ref.data.view(torch.uint8)
    s, rs = q.scales.view(torch.uint8), ref.scales.view(torch.uint8)
    if not torch.equal(d, rd):
        idx = torch.nonzero(d != rd)[:5].tolist()
        raise AssertionError(
            f"data differ at {idx}: {[(d[tuple(i)].item(), rd[tuple(i)].item()) for i in idx]}"
        )
    if not torch.equal(s, rs):
        idx = torch.nonzero(s != rs)[:5].tolist()
        raise AssertionError(
            f"scales differ at {idx}: {[(s[tuple(i)].item(), rs[tuple(i)].item()) for i in idx]}"
        )
    if ref.global_scale is None:
        assert q.global_scale is None
    else:
        assert torch.equal(q.global_scale.reshape(()), ref.global_scale.reshape(()))


def check(x, fmt, rule="ocp", gs=None):
    q = cutegemm.quantize(x, fmt, scale_rule=rule, global_scale=gs)
    torch.cuda.synchronize()
    assert_same(q, quantize_ref(x, fmt, scale_rule=rule, global_scale=gs))
    return q


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fmt=st.sampled_from(FMTS),
    dtype=st.sampled_from(DTYPES),
    rule=st.sampled_from(["ocp", "ceil"]),
    batch=st.sampled_from([None, 1, 3]),
    rows=st.integers(1, 300),
    nblocks=st.integers(1, 40),
    tail=st.sampled_from([0, 0, 0, 2, 6]),
    seed=st.integers(0, 2**31 - 1),
    special_frac=st.sampled_from([0.0, 0.0, 0.003, 0.1]),
    gs=st.sampled_from([None, None, 0.37, 2.0**-120]),
)
def test_bit_identical(fmt, dtype, rule, batch, rows, nblocks, tail, seed, special_frac, gs):
    f = cutegemm.blockscaled.get_format(fmt)
    if f.has_global_scale:
        rule = "ocp"
    else:
        gs = None
    k = nblocks * f.block_size + (tail if nblocks > 1 else 0)
    shape = (rows, k) if batch is None else (batch, rows, k)
    check(make_x(shape, dtype, seed, special_frac), fmt, rule, gs)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_bf16_value(fmt, dtype):
    """Every bf16 bit pattern alone in a block whose amax is set by a random power of two."""
    f = cutegemm.blockscaled.get_format(fmt)
    v = (
        torch.arange(-(2**15), 2**15, dtype=torch.int32, device="cuda")
        .to(torch.int16)
        .view(torch.bfloat16)
        .float()
    )
    x = torch.zeros(v.numel(), f.block_size, device="cuda")
    x[:, 0] = v
    x[:, 3] = torch.exp2(torch.randint(-130, 128, (v.numel(),), device="cuda").float())
    x = x.reshape(-1, 32 * f.block_size).to(dtype)
    for rule in ("ocp",) if f.has_global_scale else ("ocp", "ceil"):
        check(x, fmt, rule, 0.5 if f.has_global_scale else None)


@pytest.mark.parametrize("fmt", FMTS)
def test_large_and_random_fp32_values(fmt):
    """fp32 inputs with random mantissas over the whole exponent range (rounding ties included)."""
    bits = torch.randint(0, 2**31 - 1, (4096, 1024), device="cuda", dtype=torch.int64).to(torch.int32)
    x = bits.view(torch.float32)
    x = torch.where(torch.isfinite(x), x, 1.0) * torch.where(torch.rand_like(x) < 0.5, -1.0, 1.0)
    check(x, fmt)
    check((torch.randn(4096, 1024, device="cuda") * 3).round() / 4, fmt)  # exact ties of the grids


@pytest.mark.parametrize("fmt", FMTS)
def test_poisoned_outputs_fully_written(fmt, monkeypatch):
    """Outputs allocated full of 0xAB inside guard bands: every data and scale byte ends up equal
    to the reference (scale padding is zero-filled by the host; unpadded scales are all written by
    the kernel) and the guard bands stay untouched."""
    guard, bufs = 256, []

    def poisoned_empty(shape, dtype, device):
        n = torch.empty((), dtype=dtype).element_size()
        for d in (shape,) if isinstance(shape, int) else shape:
            n *= d
        buf = torch.full((n + 2 * guard,), 0xAB, dtype=torch.uint8, device=device)
        bufs.append(buf)
        return buf[guard : guard + n].view(dtype).view(shape)

    monkeypatch.setattr(lmod, "_empty", poisoned_empty)
    for shape in ((257, 96), (2, 130, 64), (128, 512), (3, 128, 1024)):
        bufs.clear()
        check(make_x(shape, torch.bfloat16, 7), fmt)
        assert bufs, "the output allocation hook was not used"
        for buf in bufs:  # nothing written outside the outputs
            assert bool((buf[:guard] == 0xAB).all()) and bool((buf[-guard:] == 0xAB).all())


def test_large_problem_and_3d():
    x = make_x((16384, 7168), torch.bfloat16, 3)
    for fmt in FMTS:
        check(x, fmt)
    check(make_x((4, 1000, 2048), torch.float16, 4), "mxfp8")


def test_noncontiguous_and_misaligned_inputs():
    x = make_x((64, 512), torch.bfloat16, 5)
    check(x[:, ::2], "mxfp8")  # strided: copied
    check(x.t().contiguous().t(), "nvfp4")  # column-major view
    flat = make_x((1, 64 * 256 + 3), torch.bfloat16, 6)
    check(flat[0, 3:].view(64, 256), "mxfp4")  # 6-byte offset: copied to an aligned buffer


def test_dequantize_roundtrip():
    x = make_x((256, 1024), torch.bfloat16, 8)
    for fmt in FMTS:
        q = cutegemm.quantize(x, fmt)
        assert torch.equal(cutegemm.dequantize(q), dequantize_ref(quantize_ref(x, fmt)))


def test_bad_inputs_raise():
    x = make_x((64, 64), torch.bfloat16, 9)
    with pytest.raises(TypeError):
        cutegemm.quantize(x.double(), "mxfp8")
    with pytest.raises(ValueError, match="fmt|format"):
        cutegemm.quantize(x, "int4")
    with pytest.raises(ValueError, match="scale_rule"):
        cutegemm.quantize(x, "nvfp4", scale_rule="ceil")
    with pytest.raises(ValueError, match="global_scale"):
        cutegemm.quantize(x, "mxfp8", global_scale=1.0)
    with pytest.raises(ValueError, match="global_scale"):
        cutegemm.quantize(x, "nvfp4", global_scale=-1.0)
    with pytest.raises(ValueError, match="even"):
        cutegemm.quantize(make_x((4, 33), torch.bfloat16, 1), "mxfp4")
    with pytest.raises(ValueError, match="rows, K"):
        cutegemm.quantize(x[0], "mxfp8")
    with pytest.raises(ValueError, match="CUDA"):
        cutegemm.quantize(x.cpu(), "mxfp8")


def test_launch_plan_and_kernel_cache_reused():
    x = make_x((128, 256), torch.bfloat16, 10)
    cutegemm.quantize(x, "mxfp8")
    compiled, hits = qmod.kernel_cache().stats["compiled"], lmod._plan.cache_info().hits
    cutegemm.quantize(x.clone(), "mxfp8")  # the warm plan (same shape, strides, dtype, format)
    assert qmod.kernel_cache().stats["compiled"] == compiled
    assert lmod._plan.cache_info().hits == hits and any(k[0] == x.shape for k in lmod._PLANS)
    y = make_x((128, 250), torch.bfloat16, 10)  # K % 32 != 0: a padded copy per call, no warm plan
    cutegemm.quantize(y, "mxfp8")
    hits = lmod._plan.cache_info().hits
    check(y, "mxfp8")
    assert qmod.kernel_cache().stats["compiled"] == compiled and lmod._plan.cache_info().hits == hits + 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("numel", [8, 4096 * 8 + 8, 3 * 1000 * 2048])
def test_finite_abs_max_kernel(dtype, numel):
    x = make_x((1, numel), dtype, numel, special_frac=0.001)
    xf = x.float()
    want = torch.where(torch.isfinite(xf), xf.abs(), 0.0).amax()
    assert torch.equal(lmod.finite_abs_max(x), want)
    assert torch.equal(
        lmod.finite_abs_max(torch.zeros(64, device="cuda", dtype=dtype)), torch.tensor(0.0).cuda()
    )


def test_nvfp4_global_scale_kinds():
    """A float, a CPU tensor and a CUDA tensor as global_scale give the reference's bytes."""
    x = make_x((256, 512), torch.bfloat16, 11)
    for gs in (0.0123, torch.tensor([0.0123]), torch.tensor(0.0123, device="cuda")):
        check(x, "nvfp4", gs=gs)
    with pytest.raises(TypeError, match="global_scale"):
        cutegemm.quantize(x, "nvfp4", global_scale="big")
    with pytest.raises(ValueError, match="global_scale"):
        cutegemm.quantize(x, "nvfp4", global_scale=torch.tensor(float("inf")))
