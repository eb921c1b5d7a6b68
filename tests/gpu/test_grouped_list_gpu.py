"""List form on a GPU (sm_90a: one launch of the list-form kernel with per-group TMA descriptors
written on the device): hypothesis over groups of arbitrary M, N, K (zeros included), operand
majors, dtypes and alpha against an fp64 reference; a poisoned output buffer; the fallbacks
(mixed majors, unaligned rows, > 1024 groups chunked, CUDA-graph capture); explicit configs."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cutegemm import grouped_gemm, grouped_gemm_ref
from cutegemm.config import EpilogueSpec, Form, GemmConfig
from cutegemm.grouped import list_form

from ..gemm_check import assert_within_torch_error

pytestmark = pytest.mark.gpu


def _sm90():
    """The list-form kernel's archs: sm_90a (run on the H200) and sm_100a (compile-verified)."""
    return torch.cuda.get_device_capability()[0] in (9, 10)


def make_groups(shapes, dtype=torch.bfloat16, a_col_major=False, b_k_major=False):
    xs, ws = [], []
    for m, n, k in shapes:
        x = torch.randn(k, m, device="cuda", dtype=dtype).t() if a_col_major else torch.randn(m, k, device="cuda", dtype=dtype)
        w = torch.randn(n, k, device="cuda", dtype=dtype).t() if b_k_major else torch.randn(k, n, device="cuda", dtype=dtype)
        xs.append(x)
        ws.append(w)
    return xs, ws


def check_outputs(outs, xs, ws, alpha=1.0, out_dtype=None):
    assert len(outs) == len(xs)
    for g, (o, x, w) in enumerate(zip(outs, xs, ws, strict=True)):
        assert o.shape == (x.shape[0], w.shape[1]) and o.dtype == (out_dtype or x.dtype), g
        if o.numel() == 0:
            continue
        ref = alpha * (x.double() @ w.double())
        same = (alpha * (x @ w).float()).to(o.dtype) if x.shape[1] else torch.zeros_like(o)
        assert_within_torch_error(o, same, ref, what=f"group {g} {tuple(x.shape)} x {tuple(w.shape)}")


def run_kernel(xs, ws, out_dtype=None, alpha=1.0, config=None, pad=64, activation=None):
    """The list-form kernel itself (not the fallback) on a NaN-poisoned buffer with a tail guard."""
    odt = out_dtype or xs[0].dtype
    total = sum(x.shape[0] * w.shape[1] for x, w in zip(xs, ws, strict=True))
    flat = torch.full((total + pad,), float("nan"), dtype=odt, device="cuda")
    outs = list_form.list_launch(xs, ws, out_dtype, alpha, config=config, flat=flat, activation=activation)
    assert outs is not None, "the list-form kernel did not take this call"
    torch.cuda.synchronize()
    assert torch.isnan(flat[total:]).all(), "written past the last group's output"
    return outs


dims8 = st.one_of(st.just(0), st.integers(1, 48).map(lambda v: 8 * v))


@pytest.mark.skipif(not torch.cuda.is_available() or not _sm90(), reason="sm_90a / sm_100a list-form kernel")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shapes=st.lists(st.tuples(st.one_of(st.just(0), st.integers(1, 300)), dims8, dims8), min_size=1, max_size=10),
    a_col_major=st.booleans(), b_k_major=st.booleans(), fp16=st.booleans(),
    out32=st.booleans(), alpha=st.sampled_from([1.0, 0.5, -3.0]),
)  # fmt: skip
def test_list_kernel_property(shapes, a_col_major, b_k_major, fp16, out32, alpha):
    dtype = torch.float16 if fp16 else torch.bfloat16
    if a_col_major and any(m % 8 for m, _, _ in shapes):  # a column-major a needs M * 2 bytes % 16
        shapes = [(-(-m // 8) * 8, n, k) for m, n, k in shapes]
    xs, ws = make_groups(shapes, dtype, a_col_major, b_k_major)
    out_dtype = torch.float32 if out32 else None
    outs = run_kernel(xs, ws, out_dtype, alpha)
    check_outputs(outs, xs, ws, alpha, out_dtype)


@pytest.mark.skipif(not torch.cuda.is_available() or not _sm90(), reason="sm_90a / sm_100a list-form kernel")
@pytest.mark.parametrize(
    "shapes",
    [
        [(5, 64, 64), (130, 8, 512), (64, 256, 8)],
        [(0, 64, 64), (1, 8, 8), (300, 1000, 0), (129, 264, 136)],  # empty, 1x8x8, K = 0, ragged
        [(16, 4096, 256)] * 40,  # many decode-size groups
        [(2000, 520, 72), (3, 8, 4096)],  # many m-tiles; long K
    ],
    ids=["small", "edges", "decode", "tall-long"],
)
def test_list_kernel_edge_cases(shapes):
    xs, ws = make_groups(shapes)
    check_outputs(run_kernel(xs, ws), xs, ws)


@pytest.mark.skipif(not torch.cuda.is_available() or not _sm90(), reason="sm_90a / sm_100a list-form kernel")
def _arch():
    return "sm_90a" if torch.cuda.get_device_capability()[0] == 9 else "sm_100a"


@pytest.mark.parametrize(
    "over",
    [
        dict(tile_m=128, tile_n=256, scheduler="dynamic"),
        dict(tile_m=64, tile_n=128),
        dict(tile_m=128, tile_n=128, pingpong=True),  # sm_90a
        dict(tile_m=128, tile_n=256, scheduler="clc"),  # sm_100a
    ],
    ids=["128x256-dynamic", "64x128", "128x128-pingpong", "128x256-clc"],
)
def test_list_kernel_configs(over):
    arch = _arch()
    if (arch == "sm_100a" and over.get("pingpong")) or (arch == "sm_90a" and over.get("scheduler") == "clc"):
        pytest.skip(f"not a {arch} schedule")
    cfg = GemmConfig(arch=arch, form=Form.LISTED, raster="m", group=1, **over)
    shapes = [(100, 264, 72), (0, 8, 8), (513, 136, 200), (7, 1024, 1024), (260, 8, 0), (64, 64, 64)] * 3
    xs, ws = make_groups(shapes)
    outs = run_kernel(xs, ws, config=cfg)
    check_outputs(outs, xs, ws)
    again = run_kernel(xs, ws, config=cfg)
    assert all(torch.equal(o, p) for o, p in zip(outs, again, strict=True)), "not bitwise reproducible"


@pytest.mark.skipif(not torch.cuda.is_available() or not _sm90(), reason="sm_90a / sm_100a list-form kernel")
def test_list_fallbacks_stay_correct():
    # mixed majors, a misaligned base, > 1024 groups (chunked launches)
    xs, ws = make_groups([(40, 64, 32), (24, 64, 32)])
    xs[1] = xs[1].t().contiguous().t()
    assert list_form.list_launch(xs, ws, None, 1.0) is None
    check_outputs(grouped_gemm(xs, ws), xs, ws)
    # a base 2 bytes off a 16-byte boundary (the dense GEMM copies such an operand)
    xs, ws = make_groups([(40, 64, 32), (24, 64, 32)])
    xs[1] = torch.randn(24 * 40 + 1, device="cuda", dtype=torch.bfloat16)[1:].view(24, 40)[:, :32]
    assert list_form.list_launch(xs, ws, None, 1.0) is None
    check_outputs(grouped_gemm(xs, ws), xs, ws)
    shapes = [((7 * g) % 50, 8 * (1 + g % 5), 8 * (1 + g % 7)) for g in range(1300)]
    xs, ws = make_groups(shapes)
    outs = list_form.list_launch(xs, ws, None, 1.0)
    assert outs is not None
    check_outputs(outs, xs, ws)


@pytest.mark.skipif(not torch.cuda.is_available() or not _sm90(), reason="sm_90a / sm_100a list-form kernel")
def test_list_in_cuda_graph_falls_back_and_replays():
    xs, ws = make_groups([(40, 64, 32), (24, 128, 64)])
    grouped_gemm(xs, ws)  # compile outside the capture
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        grouped_gemm(xs, ws)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = grouped_gemm(xs, ws)
    for _ in range(3):
        for x in xs:
            x.normal_()
        g.replay()
        torch.cuda.synchronize()
        check_outputs(outs, xs, ws)


@pytest.mark.skipif(not torch.cuda.is_available() or not _sm90(), reason="sm_90a / sm_100a list-form kernel")
def test_list_alpha_epilogue_config_explicit():
    cfg = GemmConfig(arch=_arch(), form=Form.LISTED, a_major="m", b_major="k", tile_m=128, tile_n=128, out_dtype="fp32",
                     epilogue=EpilogueSpec(alpha=True))  # fmt: skip
    xs, ws = make_groups([(64, 136, 72), (200, 8, 520)], a_col_major=True, b_k_major=True)
    outs = run_kernel(xs, ws, torch.float32, 0.25, config=cfg)
    check_outputs(outs, xs, ws, 0.25, torch.float32)


@pytest.mark.skipif(not torch.cuda.is_available() or not _sm90(), reason="sm_90a / sm_100a list-form kernel")
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu"])
def test_list_kernel_activation(activation):
    """An elementwise activation in the list-form kernel's epilogue: within 2x torch's error of
    act(x @ w) in bf16 (fp64 reference), and the public call takes the kernel path."""
    from cutegemm.epilogue import epilogue_ref

    shapes = [(100, 264, 72), (0, 8, 8), (513, 136, 200), (7, 1024, 1024), (260, 8, 0)]
    xs, ws = make_groups(shapes)
    outs = run_kernel(xs, ws, alpha=0.5, activation=activation)
    for g, (o, x, w) in enumerate(zip(outs, xs, ws, strict=True)):
        if o.numel() == 0:
            continue
        ref = epilogue_ref(x.double() @ w.double(), alpha=0.5, activation=activation)
        same = epilogue_ref((x @ w).float(), alpha=0.5, activation=activation).to(o.dtype)
        assert_within_torch_error(o, same, ref, what=f"group {g} {activation}")
    public = grouped_gemm(xs, ws, alpha=0.5, activation=activation)
    assert all(torch.equal(o, p) for o, p in zip(outs, public, strict=True))
    refs = grouped_gemm_ref(xs, ws, alpha=0.5, activation=activation)
    assert all(r.shape == o.shape for r, o in zip(refs, outs, strict=True))
