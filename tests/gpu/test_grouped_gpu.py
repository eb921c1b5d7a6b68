"""Grouped (MoE) GEMM on a GPU: packed offs form vs an fp64 reference, poisoned outputs, rows
outside every expert untouched, CUDA-graph replay with changing offs; K-grouped and list forms."""

from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cutegemm
from cutegemm import grouped_gemm, grouped_gemm_ref
from cutegemm.config import Form

from ..gemm_check import assert_within_torch_error

pytestmark = pytest.mark.gpu


def make_offs(counts):
    return torch.tensor(counts, dtype=torch.int32, device="cuda").cumsum(0, dtype=torch.int32)


def check_packed(counts, n, k, dtype=torch.bfloat16, b_transposed=True, pad_rows=5, config=None):
    E = len(counts)
    total = sum(counts) + pad_rows  # rows past offs[-1] belong to no expert
    a = torch.randn(total, k, device="cuda", dtype=dtype)
    b = (torch.randn(E, n, k, device="cuda", dtype=dtype).transpose(1, 2) if b_transposed
         else torch.randn(E, k, n, device="cuda", dtype=dtype))  # fmt: skip
    offs = make_offs(counts)
    out = torch.full((total, n), float("nan"), device="cuda", dtype=dtype)
    grouped_gemm(a, b, offs=offs, out=out, config=config)
    torch.cuda.synchronize()
    end = sum(counts)
    ref = grouped_gemm_ref(a, b, offs=offs, compute_dtype=torch.float64)
    # torch's own same-precision error: per-expert bf16 matmuls.
    same = torch.cat([a[s:e] @ b[i] for i, (s, e) in enumerate(zip([0, *offs.tolist()[:-1]], offs.tolist(), strict=True))])
    if end:
        assert_within_torch_error(out[:end], same, ref[:end], what=f"grouped E={E} n={n} k={k}")
    assert torch.isnan(out[end:]).all(), "rows past offs[-1] were written"
    return a, b, offs, out


def capture_graph(fn):
    """Run ``fn`` once (compile + plan outside the capture), then capture it in a CUDA graph on a
    side stream (run once more there first); returns the graph."""
    fn()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            fn()
    return g


def expert_counts(max_experts: int):
    """Rows (or K values) per expert: zeros and 1..300, up to max_experts experts."""
    return st.lists(st.one_of(st.just(0), st.integers(1, 300)), min_size=1, max_size=max_experts)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counts=expert_counts(12), n8=st.integers(1, 48), k8=st.integers(1, 48), b_transposed=st.booleans())
def test_packed_property(counts, n8, k8, b_transposed):
    check_packed(counts, 8 * n8, 8 * k8, b_transposed=b_transposed)


@pytest.mark.parametrize(
    "counts",
    [[0, 0, 0], [700], [0, 700, 0], [3, 1, 2], [129, 127, 128, 1, 0, 255], [16] * 32],
    ids=["all-empty", "one", "one-of-three", "tiny", "ragged", "decode"],
)
def test_packed_edge_cases(counts):
    check_packed(counts, 264, 136)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counts=expert_counts(10), n8=st.integers(1, 60), k8=st.integers(1, 200), b_transposed=st.booleans(),
       fp16=st.booleans(), gated=st.booleans())  # fmt: skip
def test_packed_pingpong_128x192(counts, n8, k8, b_transposed, fp16, gated):
    """The policy's short-K tile (policy.PINGPONG_MAX_K): pingpong 128x192 in 2x1 clusters, every
    expert size (0, ragged, a pair of CTAs over two experts), both B layouts, the gated epilogue;
    the policy picks it for Qwen3-30B-A3B's down projection."""
    dtype = torch.float16 if fp16 else torch.bfloat16
    name = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    cfg = cutegemm.GemmConfig(arch="sm_90a", form=Form.GROUPED, a_dtype=name, b_dtype=name, out_dtype=name,
                              b_major="k" if b_transposed else "n", tile_m=128, tile_n=192, cluster_m=2,
                              pingpong=True, raster="m", group=1)  # fmt: skip
    if not gated:
        check_packed(counts, 8 * n8, 8 * k8, dtype=dtype, b_transposed=b_transposed, config=cfg)
        return
    E, n, k = len(counts), 16 * n8, 8 * k8
    a = torch.randn(sum(counts) + 3, k, device="cuda", dtype=dtype)
    b = torch.randn(E, k, n, device="cuda", dtype=dtype)
    b = b.mT.contiguous().mT if b_transposed else b
    offs = make_offs(counts)
    cfg = replace(cfg, epilogue=cutegemm.EpilogueSpec(gated="swiglu"))
    out = torch.full((a.shape[0], n // 2), float("nan"), device="cuda", dtype=dtype)
    grouped_gemm(a, b, offs=offs, activation="swiglu", out=out, config=cfg)
    end = sum(counts)
    ref = grouped_gemm_ref(a, b, offs=offs, activation="swiglu", compute_dtype=torch.float64)
    # torch's own precision: per-expert matmuls rounded to the dtype, then silu(gate) * up in it
    bounds = zip([0, *offs.tolist()[:-1]], offs.tolist(), strict=True)
    z = torch.cat([a[s:e] @ b[i] for i, (s, e) in enumerate(bounds)])
    same = torch.nn.functional.silu(z[:, 0::2]) * z[:, 1::2]
    if end:
        assert_within_torch_error(out[:end], same[:end], ref[:end], what=f"pingpong 128x192 swiglu E={E} n={n} k={k}")
    assert torch.isnan(out[end:]).all(), "rows past offs[-1] were written"


def test_packed_large_tiles_and_fp16():
    check_packed([1000, 37, 513], 2048, 512)
    check_packed([300, 5], 256, 128, dtype=torch.float16)


def test_cuda_graph_replay_with_changing_offs():
    torch.manual_seed(0)
    E, n, k, total = 8, 256, 128, 1024
    a = torch.randn(total, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(E, k, n, device="cuda", dtype=torch.bfloat16)
    offs = make_offs([total // E] * E)
    out = torch.zeros(total, n, device="cuda", dtype=torch.bfloat16)
    g = capture_graph(lambda: grouped_gemm(a, b, offs=offs, out=out))
    gen = torch.Generator().manual_seed(1)
    exact = 0
    for _ in range(24):
        counts = torch.multinomial(torch.ones(E), total, replacement=True, generator=gen).bincount(minlength=E)
        counts[torch.randint(0, E, (2,), generator=gen)] = 0  # some empty experts
        offs.copy_(torch.cumsum(counts, 0).to(torch.int32))
        out.zero_()
        g.replay()
        eager = torch.zeros_like(out)
        grouped_gemm(a, b, offs=offs, out=eager)
        torch.cuda.synchronize()
        exact += int(torch.equal(out, eager))
    assert exact == 24


def test_bitwise_deterministic():
    a, b, offs, out = check_packed([100, 200, 0, 300], 512, 256)
    again = torch.full_like(out, float("nan"))
    grouped_gemm(a, b, offs=offs, out=again)
    end = int(offs[-1])
    assert torch.equal(out[:end], again[:end])


def test_k_grouped_and_list_forms():
    m, n = 96, 136
    counts = [40, 0, 88, 8]
    a = torch.randn(m, sum(counts), device="cuda", dtype=torch.bfloat16)
    b = torch.randn(sum(counts), n, device="cuda", dtype=torch.bfloat16)
    offs = make_offs(counts)
    out = grouped_gemm(a, b, offs=offs)
    ref = grouped_gemm_ref(a, b, offs=offs, compute_dtype=torch.float64)
    assert out.shape == (4, m, n)
    torch.testing.assert_close(out.double(), ref.double(), atol=0.1, rtol=0.02)
    xs = [torch.randn(mm, kk, device="cuda", dtype=torch.bfloat16) for mm, kk in [(5, 64), (130, 8), (64, 256)]]
    ws = [torch.randn(kk, nn, device="cuda", dtype=torch.bfloat16) for kk, nn in [(64, 24), (8, 512), (256, 8)]]
    for o, x, w in zip(grouped_gemm(xs, ws), xs, ws, strict=True):
        torch.testing.assert_close(o.float(), (x.float() @ w.float()), atol=0.1, rtol=0.02)


def test_grouped_bad_inputs():
    a = torch.randn(64, 32, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4, 32, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="int32"):
        grouped_gemm(a, b, offs=torch.tensor([16, 32, 48, 64], device="cuda"))
    with pytest.raises(ValueError, match="entries"):
        grouped_gemm(a, b, offs=make_offs([16, 16, 32]))
    with pytest.raises(ValueError, match="on cuda"):
        grouped_gemm(a, b, offs=make_offs([16] * 4).cpu())
    with pytest.raises(ValueError, match="non-decreasing"):
        grouped_gemm(a, b, offs=torch.tensor([16, 8, 48, 64], dtype=torch.int32, device="cuda"), check_offs=True)
    b60 = torch.randn(4, 32, 60, device="cuda", dtype=torch.bfloat16)  # rows of 120 bytes: staged, not rejected
    out60 = grouped_gemm(a, b60, offs=make_offs([16] * 4))
    ref60 = grouped_gemm_ref(a, b60, offs=make_offs([16] * 4), compute_dtype=torch.float64)
    assert out60.shape == (64, 60) and out60.is_contiguous()
    torch.testing.assert_close(out60.double(), ref60.double(), atol=0.05, rtol=0.02)
    with pytest.raises(ValueError, match="exceeds"):
        grouped_gemm(a, b, offs=make_offs([16, 16, 16, 17]), check_offs=True)


def test_bad_offs_stay_memory_safe():
    """Unchecked bad offsets (decreasing, negative, past the end) clamp: nothing outside out is written."""
    a = torch.randn(200, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4, 64, 64, device="cuda", dtype=torch.bfloat16)
    buf = torch.full((210, 64), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = buf[:200]
    grouped_gemm(a, b, offs=torch.tensor([150, -3, 100, 10_000], dtype=torch.int32, device="cuda"), out=out)
    torch.cuda.synchronize()
    assert torch.isnan(buf[200:]).all()


def test_public_export():
    assert cutegemm.grouped_gemm is grouped_gemm


def test_grouped_experts_module():
    from cutegemm.nn import GroupedExperts

    torch.manual_seed(0)
    moe = GroupedExperts(4, 256, 128, device="cuda")
    counts = [30, 0, 70, 28]
    x = torch.randn(sum(counts), 256, device="cuda", dtype=torch.bfloat16)
    offs = make_offs(counts)
    y = moe(x, offs)
    ref = moe.forward_ref(x, offs)
    torch.testing.assert_close(y.float(), ref.float(), atol=0.05, rtol=0.05)


@pytest.mark.parametrize(
    "cfg",
    [
        dict(tile_m=128, tile_n=256, cluster_m=2),
        dict(tile_m=128, tile_n=128, cluster_m=2, cluster_n=2),
        dict(tile_m=128, tile_n=192, cluster_m=2, scheduler="dynamic"),
        dict(tile_m=64, tile_n=256, cluster_m=2),
    ],
    ids=["c2x1", "c2x2", "c2x1-dynamic", "64x256-c2x1"],
)
def test_two_cta_clusters_and_ragged_experts(cfg):
    """2x1 clusters (two consecutive m-tiles of one expert per cluster; the second CTA of an
    expert with an odd m-tile count has an empty tile: it must store nothing): ragged counts,
    empty experts, one-row experts, rows past offs[-1]."""

    config = replace(cutegemm.GemmConfig(arch="sm_90a", form=Form.GROUPED, b_major="k", raster="m", group=1), **cfg)
    for counts in ([130, 0, 1, 257, 64, 65, 300], [1] * 9, [0, 0, 700], [383, 129]):
        check_packed(counts, 264, 136, config=config)


@pytest.mark.parametrize(
    "cfg",
    [
        dict(tile_m=128, tile_n=256, cluster_n=2),
        dict(tile_m=128, tile_n=256, cluster_n=2, scheduler="dynamic"),
        dict(tile_m=128, tile_n=128, cluster_m=2),
    ],
    ids=["128x256-c1x2", "128x256-c1x2-dynamic", "128x128-c2x1"],
)
def test_half_empty_last_tiles(cfg):
    """128-row tiles whose second warpgroup's 64 rows lie wholly or partly past the expert's end
    (its rows must be right, and nothing past the expert may be written): last tiles of 1, 63, 64,
    65 and 127 rows."""

    config = replace(cutegemm.GemmConfig(arch="sm_90a", form=Form.GROUPED, b_major="k"), **cfg)
    check_packed([64, 65, 192, 193, 1, 63, 0, 128, 127, 320], 264, 200, config=config)


@pytest.mark.parametrize(
    "cfg",
    [
        dict(tile_m=128, tile_n=128, cluster_n=2, scheduler="dynamic", raster="n", group=2),
        dict(tile_m=128, tile_n=128, cluster_m=2, raster="n", group=3),
        dict(tile_m=64, tile_n=128, cluster_n=2, raster="m", group=2),
    ],
    ids=["band2-c1x2-dynamic", "band3-c2x1", "nband2-64x128"],
)
def test_band_orders(cfg):
    """Tile orders inside an expert other than the default (bands of m-tiles walked along N,
    or of n-tiles walked along M; the last band shorter): every tile once, nothing outside the
    experts written. Experts of many m-tiles and N of several cluster tiles."""

    config = replace(cutegemm.GemmConfig(arch="sm_90a", form=Form.GROUPED, b_major="k"), **cfg)
    check_packed([1000, 0, 130, 777, 1, 64], 1000, 136, config=config)
    check_packed([2050, 3], 520, 64, config=config)


def _k_grouped_check(counts, m, n, a_col_major=False, dtype=torch.bfloat16, pad_k=0, config=None):
    """K-grouped out[e] = a[:, k_e] @ b[k_e] vs float64, within 2x torch's own per-expert error;
    out poisoned (NaN) so every element must be written; K columns past offs[-1] (pad_k) hold
    Inf, which must not reach any expert."""
    total = sum(counts)
    K = total + pad_k
    a = (torch.randn(K, m, device="cuda", dtype=dtype).t() if a_col_major
         else torch.randn(m, K, device="cuda", dtype=dtype))  # fmt: skip
    b = torch.randn(K, n, device="cuda", dtype=dtype)
    if pad_k:
        a[:, total:] = float("inf")
        b[total:] = float("inf")
    offs = make_offs(counts)
    out = torch.full((len(counts), m, n), float("nan"), device="cuda", dtype=dtype)
    grouped_gemm(a, b, offs=offs, out=out, config=config)
    # float64 out: a reference rounded to bf16 would give torch's own result an error of exactly
    # 0 wherever its fp32 sum rounds like the float64 one (short slices), leaving no tolerance
    ref = grouped_gemm_ref(a[:, :total], b[:total], offs=offs, out_dtype=torch.float64, compute_dtype=torch.float64)
    same = torch.stack([a[:, s:t] @ b[s:t] if t > s else torch.zeros(m, n, device="cuda", dtype=dtype)
                        for s, t in zip([0, *offs.tolist()[:-1]], offs.tolist(), strict=True)])  # fmt: skip
    assert torch.isfinite(out).all(), "an expert read K columns outside its slice (or was not written)"
    assert_within_torch_error(out.reshape(-1, n), same.reshape(-1, n), ref.reshape(-1, n),
                              what=f"K-grouped {counts} m={m} n={n}")  # fmt: skip
    return a, b, offs, out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counts=expert_counts(8), m8=st.integers(1, 40), n8=st.integers(1, 40), a_col_major=st.booleans())
def test_k_grouped_kernel_property(counts, m8, n8, a_col_major):
    """The K-grouped kernel (sm_90a: one launch; elsewhere the list form where it reads the slices
    in place, else the per-expert loop): slices of any
    length (zero, shorter than a K tile, not multiples of it), a row- or column-major a (the
    weight gradient's x.t()), neighbours' columns never leaking into an expert."""
    _k_grouped_check(counts, 8 * m8, 8 * n8, a_col_major=a_col_major, pad_k=8)


@pytest.mark.parametrize(
    "counts", [[0, 0], [1], [63, 64, 65], [512, 0, 7, 129], [16] * 40], ids=["empty", "one", "tile-edges", "mixed", "many"]
)
def test_k_grouped_kernel_edges(counts):
    _k_grouped_check(counts, 200, 264, pad_k=3)
    _k_grouped_check(counts, 136, 72, a_col_major=True, dtype=torch.float16)


def test_k_grouped_forced_configs():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the K-grouped kernel is sm_90a")

    base = cutegemm.GemmConfig(arch="sm_90a", form=Form.KGROUPED, a_major="m", b_major="n")
    for over in (dict(tile_m=128, tile_n=256, cluster_m=2), dict(tile_m=128, tile_n=128, scheduler="dynamic"),
                 dict(tile_m=128, tile_n=256, cluster_n=2), dict(tile_m=64, tile_n=128)):  # fmt: skip
        _k_grouped_check([100, 0, 64, 300, 1], 256, 512, a_col_major=True, config=replace(base, **over), pad_k=5)
    with pytest.raises(ValueError, match="not a K-grouped"):
        _k_grouped_check([8], 64, 64, config=cutegemm.GemmConfig(arch="sm_90a"))


@pytest.mark.parametrize(
    "over",
    [dict(tile_m=128, tile_n=128, cluster_m=2), dict(tile_m=128, tile_n=128), dict(tile_m=128, tile_n=128, cluster_n=2)],
    ids=["128x128-c2x1", "128x128", "128x128-c1x2"],
)  # fmt: skip
def test_k_grouped_pingpong(over):
    """Pingpong K-grouped: a warpgroup skips the other's tile by that tile's own K-tile count
    (experts of 0, 1, 64, 100, 129, 300 and 700 K values). 448+ tiles, so every CTA's warpgroups
    take several turns."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the K-grouped kernel is sm_90a")

    base = cutegemm.GemmConfig(arch="sm_90a", form=Form.KGROUPED, a_major="m", b_major="n", pingpong=True)
    _k_grouped_check([100, 0, 64, 300, 1, 700, 129], 1024, 1024, a_col_major=True, config=replace(base, **over), pad_k=5)
    _k_grouped_check([700, 0, 3, 257], 1040, 1032, config=replace(base, a_major="k", **over))


def test_k_grouped_cuda_graph_replay():
    """The K-grouped kernel reads offs on the device (sm_100a: its table kernel does): captured
    once, replayed with 20 different splits of K, each bitwise equal to an eager call."""
    if torch.cuda.get_device_capability()[0] not in (9, 10):
        pytest.skip("the K-grouped kernel (graph-capturable) is sm_90a / sm_100a")
    E, m, n, total = 6, 256, 384, 1000
    a = torch.randn(total, m, device="cuda", dtype=torch.bfloat16).t()
    b = torch.randn(total, n, device="cuda", dtype=torch.bfloat16)
    offs = make_offs([total // E] * (E - 1) + [total - (E - 1) * (total // E)])
    out = torch.empty(E, m, n, device="cuda", dtype=torch.bfloat16)
    grouped_gemm(a, b, offs=offs, out=out)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
        grouped_gemm(a, b, offs=offs, out=out)
    torch.cuda.current_stream().wait_stream(s)
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        cuts = sorted(torch.randint(0, total + 1, (E - 1,), generator=gen).tolist())
        offs.copy_(make_offs([x - y for x, y in zip([*cuts, total], [0, *cuts], strict=True)]))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, grouped_gemm(a, b, offs=offs)), f"replay differs for cuts {cuts}"
