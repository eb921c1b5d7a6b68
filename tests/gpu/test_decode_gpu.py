"""Dense GEMM at decode-sized M on a GPU: the short A box (``GemmConfig.a_rows``, M rounded up
to 8 or 16 rows) and split K (``GemmConfig.split_k``), both sm_90a.

Every result against a float64 reference within 2x torch's own error at the same precision, in
NaN-poisoned buffers (nothing written outside the output); the short box must give the same bits
as the whole-tile box (the rows past M are zeros either way); split K must give the same bits on
every call (partial sums added in range order) and under CUDA-graph replay.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import cutegemm
from cutegemm.config import GemmConfig
from cutegemm.policy import policy_for, short_a_box

from ..gemm_check import assert_outside_untouched, assert_within_torch_error, poisoned_out

pytestmark = pytest.mark.gpu
BF16, F8 = torch.bfloat16, torch.float8_e4m3fn


def _sm90():
    return torch.cuda.get_device_capability()[0] == 9


def _need_sm90():
    if not _sm90():
        pytest.skip("a_rows and split_k are sm_90a kernel options so far")


def _ops(m, n, k, dtype=BF16, seed=0, batch=None):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape_a = (m, k) if batch is None else (batch, m, k)
    shape_w = (n, k) if batch is None else (batch, n, k)
    a = torch.randn(shape_a, generator=g, device="cuda").to(dtype)
    w = torch.randn(shape_w, generator=g, device="cuda").to(dtype)
    return a, w.mT  # b = w^T: K-major, as a linear layer's weight


def _cfg(dtype=BF16, **kw):
    name = {BF16: "bf16", torch.float16: "fp16", F8: "e4m3"}[dtype]
    base = dict(arch="sm_90a", a_dtype=name, b_dtype=name, out_dtype="bf16" if dtype == F8 else name, a_major="k",
                b_major="k", tile_m=64, tile_n=64, raster="n", group=1)  # fmt: skip
    return GemmConfig(**{**base, **kw})


def _check(out, a, b, what):
    ref = a.double() @ b.double()
    same = (a @ b).to(out.dtype) if a.dtype != F8 else (a.float() @ b.float()).to(out.dtype)
    assert_within_torch_error(out, same, ref, what=what)


# --- the short A box ---------------------------------------------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    m=st.integers(1, 120),
    n8=st.integers(1, 80),
    k8=st.integers(1, 120),
    dtype=st.sampled_from([BF16, torch.float16]),
    batch=st.sampled_from([None, 3]),
)
def test_a_rows_equals_whole_box(m, n8, k8, dtype, batch):
    """Short boxes (M rounded up to 8 or 16 rows, and 16 rows more) give the bits of the whole box,
    in 64-row tiles (M <= 64) and 128-row tiles; so does the policy's call."""
    _need_sm90()
    n, k = 8 * n8, 8 * k8
    a, b = _ops(m, n, k, dtype, seed=m * 7 + n + k, batch=batch)
    shape = (m, n) if batch is None else (batch, m, n)
    buf, out = poisoned_out(shape, dtype)
    cutegemm.gemm(a, b, out=out)
    assert_outside_untouched(buf, m, n)
    _check(out, a, b, f"a_rows {m}x{n}x{k}")
    tm = 64 if m <= 64 else 128
    whole = cutegemm.gemm(a, b, config=_cfg(dtype, tile_m=tm))
    assert torch.equal(whole, out), "the policy's call: not the bits of the whole box"
    box = 8 if m <= 8 else -(-m // 16) * 16
    for rows in {box, -(-m // 16) * 16 + 16} - {tm, tm + 16}:  # short boxes holding M
        buf, other = poisoned_out(shape, dtype)
        cutegemm.gemm(a, b, out=other, config=_cfg(dtype, tile_m=tm, a_rows=rows))
        assert_outside_untouched(buf, m, n)
        assert torch.equal(other, whole), f"a_rows={rows} (tile_m {tm}): not the bits of the whole box"


def test_a_rows_policy_and_refusal():
    """The policy takes the short box (M rounded up to 8 or 16) below the tile's rows; a config whose box is shorter
    than M is refused (its rows past the box would read as zeros)."""
    _need_sm90()
    from cutegemm.config import GemmProblem

    for m, rows in ((1, 8), (8, 8), (9, 16), (16, 16), (17, 32), (32, 32), (33, 48), (49, 0), (64, 0), (65, 80), (113, 0)):
        p = GemmProblem(m, 4096, 7168, 1, "bf16", "bf16", "bf16", "k", "k")
        cfg = short_a_box(policy_for("sm_90a", 132).choose(p), p)
        assert cfg.a_rows == rows, (m, cfg.name)
    a, b = _ops(20, 256, 512)
    with pytest.raises(ValueError, match="a_rows=16"):
        cutegemm.gemm(a, b, config=_cfg(a_rows=16))


@pytest.mark.parametrize("m", [1, 5, 16, 24])
def test_a_rows_epilogues(m):
    """Bias + GELU, beta * C with fp32 output, FP8 row-wise scales and an MXFP8 output (its scale
    bytes included): the short box gives the bits of the whole box."""
    _need_sm90()
    n, k = 320, 496  # 8 K tiles: the policy does not split K here (same summation as the whole box)
    a, b = _ops(m, n, k, seed=m)
    bias = torch.randn(n, device="cuda", dtype=BF16)
    c = torch.randn(m, n, device="cuda", dtype=torch.float32)
    whole = _cfg(a_rows=0)
    got = cutegemm.gemm(a, b, bias=bias, activation="gelu")
    assert torch.equal(got, cutegemm.gemm(a, b, bias=bias, activation="gelu", config=whole))
    got = cutegemm.gemm(a, b, c=c, beta=0.5, out_dtype=torch.float32)
    whole32 = replace(whole, out_dtype="fp32")
    assert torch.equal(got, cutegemm.gemm(a, b, c=c, beta=0.5, out_dtype=torch.float32, config=whole32))
    a8, b8 = a.to(F8), b.to(F8)
    sa, sb = torch.rand(m, device="cuda") + 0.5, torch.rand(n, device="cuda") + 0.5
    got = cutegemm.gemm(a8, b8, scale_a=sa, scale_b=sb)
    assert torch.equal(got, cutegemm.gemm(a8, b8, scale_a=sa, scale_b=sb, config=_cfg(F8)))
    q = cutegemm.gemm(a, b, out_dtype="mxfp8")
    q_whole = cutegemm.gemm(a, b, out_dtype="mxfp8", config=replace(whole, out_dtype="e4m3"))
    assert torch.equal(q.data.view(torch.uint8), q_whole.data.view(torch.uint8))
    assert torch.equal(q.scales.view(torch.uint8), q_whole.scales.view(torch.uint8))


@pytest.mark.parametrize("m", [3, 16, 40, 96])
def test_a_rows_block_scales(m):
    """DeepSeek block scales (1x128 of A, 128x128 of B): the policy's short box (scale_a's rows keep
    their own box) gives the bits of the whole box, and writes nothing outside the output."""
    _need_sm90()
    from cutegemm.config import GemmProblem

    n, k = 384, 1024
    a, b = _ops(m, n, k, seed=m)
    a8, b8 = a.to(F8), b.to(F8)
    g = torch.Generator(device="cuda").manual_seed(m)
    sa = torch.rand(m, k // 128, generator=g, device="cuda") + 0.5
    sb = torch.rand(k // 128, n // 128, generator=g, device="cuda") + 0.5
    p = GemmProblem(m, n, k, 1, "e4m3", "e4m3", "bf16", "k", "k")
    cfg = policy_for("sm_90a", 132).choose_dense(p, fp8_blockwise=True)
    assert cfg.fp8_blockwise and cfg.a_rows == (8 if m <= 8 else -(-m // 16) * 16), cfg.name
    buf, out = poisoned_out((m, n), BF16)
    cutegemm.gemm(a8, b8, scale_a=sa, scale_b=sb, out=out)
    assert_outside_untouched(buf, m, n)
    whole = cutegemm.gemm(a8, b8, scale_a=sa, scale_b=sb, config=replace(cfg, a_rows=0, epilogue=type(cfg.epilogue)()))
    assert torch.equal(out, whole), f"a_rows={cfg.a_rows}: not the bits of the whole box"
    ref = (a8.double().view(m, k // 128, 128) * sa.double()[..., None]).view(m, k) @ (
        b8.double().contiguous().view(k // 128, 128, n // 128, 128) * sb.double()[:, None, :, None]).view(k, n)
    assert (out.double() - ref).abs().max().item() <= 2e-2 * ref.abs().max().item()


# --- split K -----------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    m=st.integers(1, 300),
    n8=st.integers(1, 64),
    k8=st.integers(1, 400),
    split=st.sampled_from([2, 3, 4, 5, 6, 8]),
    tile=st.sampled_from([(64, 64), (64, 128), (128, 64)]),
    dtype=st.sampled_from([BF16, F8]),
)
def test_split_k_shapes(m, n8, k8, split, tile, dtype):
    """Ragged M, N, K (K tiles fewer than ranges included); more units than CTAs at the larger M;
    repeat calls give the same bits."""
    _need_sm90()
    n, k = 8 * n8, 8 * k8
    if dtype == F8:
        k = 16 * max(1, k // 16)
    a, b = _ops(m, n, k, dtype, seed=m + 3 * n + 5 * k)
    cfg = _cfg(dtype, tile_m=tile[0], tile_n=tile[1], split_k=split)
    buf, out = poisoned_out((m, n), BF16)
    cutegemm.gemm(a, b, out=out, config=cfg)
    assert_outside_untouched(buf, m, n)
    _check(out, a, b, f"split_k={split} {tile} {m}x{n}x{k}")
    assert torch.equal(out, cutegemm.gemm(a, b, config=cfg)), "split K is not bitwise reproducible"


def test_split_k_epilogues_and_scales():
    """Bias + SiLU, beta * C, FP8 row-wise scales and MXFP8 output run once, on the full sum."""
    _need_sm90()
    m, n, k = 48, 384, 2048
    a, b = _ops(m, n, k, seed=11)
    bias = torch.randn(n, device="cuda", dtype=BF16)
    c = torch.randn(m, n, device="cuda", dtype=BF16)
    cfg = _cfg(split_k=4)
    got = cutegemm.gemm(a, b, bias=bias, activation="silu", config=cfg)
    ref = torch.nn.functional.silu(a.double() @ b.double() + bias.double())
    same = torch.nn.functional.silu((a @ b).float() + bias.float()).to(BF16)
    assert_within_torch_error(got, same, ref, what="split bias+silu")
    got = cutegemm.gemm(a, b, c=c, beta=-1.5, config=cfg)
    ref = a.double() @ b.double() - 1.5 * c.double()
    assert_within_torch_error(got, (a @ b).float().sub(1.5 * c.float()).to(BF16), ref, what="split beta")
    a8, b8 = a.to(F8), b.to(F8)
    sa, sb = torch.rand(m, device="cuda") + 0.5, torch.rand(n, device="cuda") + 0.5
    got = cutegemm.gemm(a8, b8, scale_a=sa, scale_b=sb, config=_cfg(F8, tile_n=128, split_k=2))
    plain = cutegemm.gemm(a8, b8, scale_a=sa, scale_b=sb, config=_cfg(F8, tile_n=128))
    ref = (a8.double() @ b8.double()) * sa.double()[:, None] * sb.double()[None]
    assert_within_torch_error(got, plain, ref, what="split fp8 row-wise")
    q = cutegemm.gemm(a, b, out_dtype="mxfp8", config=replace(cfg, out_dtype="e4m3"))
    deq = cutegemm.dequantize(q).double()
    q_plain = cutegemm.dequantize(cutegemm.gemm(a, b, out_dtype="mxfp8")).double()
    ref = a.double() @ b.double()
    assert (deq - ref).abs().max() <= 2 * (q_plain - ref).abs().max() + 1e-6


def test_split_k_cuda_graph_replay():
    """Captured once, replayed with 20 new activations: every replay gives the eager call's bits
    (each launch leaves the tiles' counters at 0)."""
    _need_sm90()
    _graph_replays(_cfg(tile_n=128, split_k=4))
    _graph_replays(_cfg(tile_n=128, split_k=3, split_tail=True))


def _graph_replays(cfg):
    """A 16 x 512 x 3072 call captured once and replayed with 20 new activations: each replay
    gives the eager call's bits."""
    m, n, k = 16, 512, 3072
    _, b = _ops(m, n, k, seed=5)
    x = torch.randn(m, k, device="cuda").to(BF16)
    out = cutegemm.gemm(x, b, config=cfg)  # compile and build the plan outside the capture
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            cutegemm.gemm(x, b, out=out, config=cfg)
    torch.cuda.current_stream().wait_stream(s)
    for i in range(20):
        x.copy_(torch.randn(m, k, device="cuda", generator=torch.Generator(device="cuda").manual_seed(i)).to(BF16))
        g.replay()
        eager = cutegemm.gemm(x, b, config=cfg)
        torch.cuda.synchronize()
        assert torch.equal(out, eager), f"replay {i}"


def _tail_tile_bits(out, a, b, cfg, ctas):
    """split_tail's output tile by tile: the whole tiles (linear index below (T // ctas) * ctas)
    bit-equal to the unsplit config's, the split ones to plain split K's (same ranges, same
    order)."""
    from cutegemm.schedulers.static import swizzled_tile_coord, tail_units

    m, n = out.shape
    tm, tn = cfg.tile_m, cfg.tile_n
    tiles_m, tiles_n = -(-m // tm), -(-n // tn)
    whole, _ = tail_units(tiles_m * tiles_n, ctas, cfg.split_k)
    unsplit = cutegemm.gemm(a, b, config=replace(cfg, split_k=1, split_tail=False))
    split = cutegemm.gemm(a, b, config=replace(cfg, split_tail=False))
    for t in range(tiles_m * tiles_n):
        cm, cn, _ = swizzled_tile_coord(t, tiles_m, tiles_n, cfg.group, cfg.raster == "m")
        rows, cols = slice(cm * tm, (cm + 1) * tm), slice(cn * tn, (cn + 1) * tn)
        want = (unsplit if t < whole else split)[rows, cols]
        assert torch.equal(out[rows, cols], want), f"tile {t} ({'whole' if t < whole else 'split'})"


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    m=st.integers(1, 700),
    n8=st.integers(1, 64),
    k8=st.integers(1, 400),
    split=st.sampled_from([2, 3, 4]),
    ctas=st.sampled_from([1, 3, 7, 12]),
    tile=st.sampled_from([(64, 64), (128, 64)]),
    dtype=st.sampled_from([BF16, F8]),
)
def test_split_tail_shapes(m, n8, k8, split, ctas, tile, dtype):
    """split_tail on a small persistent grid (the plans' max_clusters set to ``ctas``), so that
    small problems have whole waves and a split last wave: the error bound, poisoned padding,
    whole tiles bit-equal to the unsplit kernel's and split ones to plain split K's, repeat calls
    the same bits."""
    _need_sm90()
    from cutegemm.gemm import dense

    n, k = 8 * n8, 8 * k8
    if dtype == F8:
        k = 16 * max(1, k // 16)
    a, b = _ops(m, n, k, dtype, seed=m + 3 * n + 5 * k)
    cfg = _cfg(dtype, tile_m=tile[0], tile_n=tile[1], split_k=split, split_tail=True)
    saved = dense.max_clusters_for
    dense.PLANS.clear()
    dense.max_clusters_for = lambda cfg, device, num_sms=None: ctas
    try:
        buf, out = poisoned_out((m, n), BF16)
        cutegemm.gemm(a, b, out=out, config=cfg)
        assert_outside_untouched(buf, m, n)
        _check(out, a, b, f"split_tail {split} {tile} on {ctas} CTAs, {m}x{n}x{k}")
        _tail_tile_bits(out, a, b, cfg, ctas)
        assert torch.equal(out, cutegemm.gemm(a, b, config=cfg)), "split_tail is not bitwise reproducible"
    finally:
        dense.max_clusters_for = saved
        dense.PLANS.clear()


@pytest.mark.parametrize("m,n,k,tile,split", [(8192, 576, 7168, (128, 192), 2), (8192, 576, 7168, (128, 160), 3),
                                              (2048, 7168, 4096, (128, 160), 2), (700, 3000, 1000, (128, 128), 4)])
def test_split_tail_full_grid(m, n, k, tile, split):
    """split_tail on the whole GPU (the DeepSeek-V3 kv_a shape included): poisoned padding, the
    error bound, tile by tile the bits of the unsplit / split kernels, repeat calls the same bits."""
    _need_sm90()
    from cutegemm.runtime.device import max_clusters_for

    a, b = _ops(m, n, k, seed=m + n)
    cfg = _cfg(tile_m=tile[0], tile_n=tile[1], split_k=split, split_tail=True)
    buf, out = poisoned_out((m, n), BF16)
    cutegemm.gemm(a, b, out=out, config=cfg)
    assert_outside_untouched(buf, m, n)
    _check(out, a, b, f"split_tail {cfg.name} {m}x{n}x{k}")
    _tail_tile_bits(out, a, b, cfg, max_clusters_for(cfg, a.device))
    assert torch.equal(out, cutegemm.gemm(a, b, config=cfg))


@pytest.mark.parametrize("split", [3, 4, 5])
def test_split_k_counters_back_to_zero(split):
    """Each launch leaves the tiles' counters at 0 (the completing unit resets its tile's), so
    every launch counts from 0: repeated calls give the same bits, and the counters read 0 after
    each; a counter left at split_k - 1 by hand makes the next launch's first unit complete the
    tile early (the test that the counter is what decides)."""
    _need_sm90()
    from cutegemm.gemm.dense import PLANS

    m, n, k = 16, 256, 4096
    a, b = _ops(m, n, k, seed=9)
    cfg = _cfg(split_k=split)
    want = cutegemm.gemm(a, b, config=cfg)
    plans = [p for p in PLANS.values() if p.config.split_k == split and p.config.tile_n == 64 and p.out_shape[-1] == n]
    assert plans, "the split plan is not cached"
    tiles = (n + 63) // 64
    for _ in range(4):
        assert torch.equal(cutegemm.gemm(a, b, config=cfg), want)
        torch.cuda.synchronize()
        for p in plans:
            assert int(p.workspace[:tiles].abs().sum()) == 0, "a launch left a tile counter off 0"
    # a counter left at split_k: no unit reads split_k - 1, so no unit completes a tile and the
    # output keeps its poison (the count, not the arrival, decides who stores)
    out = torch.empty(m, n, dtype=BF16, device="cuda")
    cutegemm.gemm(a, b, out=out, config=cfg)  # the out= call's plan
    plans = [p for p in PLANS.values() if p.config.split_k == split and p.config.tile_n == 64 and p.out_shape[-1] == n]
    out.fill_(float("nan"))
    for p in plans:
        p.workspace[:tiles] = split
    cutegemm.gemm(a, b, out=out, config=cfg)
    torch.cuda.synchronize()
    assert torch.isnan(out).all(), "a unit completed a tile its counter did not reach"
    for p in plans:
        p.workspace[:tiles] = 0
    assert torch.equal(cutegemm.gemm(a, b, out=out, config=cfg), want)


def test_split_k_config_rules():
    _need_sm90()
    a, b = _ops(16, 256, 512)
    for bad, match in ((dict(split_k=7), "split_k must be"), (dict(split_k=2, cluster_n=2), "1x1 cluster"),
                       (dict(split_k=2, pingpong=True), "cooperative"),
                       (dict(split_k=3, split_cluster=True), "cluster's size")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            cutegemm.gemm(a, b, config=replace(_cfg(), **bad))


@pytest.mark.parametrize("m,n,k", [(96, 1536, 7168), (128, 4096, 7168), (16, 2048, 7168), (5, 2048, 4104),
                                   (1, 576, 7168), (64, 576, 7168), (128, 576, 7168), (100, 576, 7168)])  # fmt: skip
def test_policy_split_calls(m, n, k):
    """Shapes where the policy splits K (few output tiles), plain calls: poisoned output,
    the error bound, the same bits on a second call."""
    _need_sm90()
    a, b = _ops(m, n, k, seed=m + n)
    buf, out = poisoned_out((m, n), BF16)
    cutegemm.gemm(a, b, out=out)
    assert_outside_untouched(buf, m, n)
    _check(out, a, b, f"policy {m}x{n}x{k}")
    assert torch.equal(out, cutegemm.gemm(a, b))


@pytest.mark.parametrize("m,n,k", [(96, 1536, 7168), (16, 2048, 7168), (128, 2048, 7168), (40, 2048, 3072),
                                   (1, 576, 7168), (16, 1536, 7168), (64, 576, 7168), (40, 1500, 7168)])  # fmt: skip
def test_policy_split_calls_fp8(m, n, k):
    """FP8 row-wise calls the policy splits (4 ranges in a cluster where their units fill at most
    small_m.FP8_CLUSTER4_SHARE of the SMs: N = 576 / 1536): poisoned output, the same error as the
    whole-K config's (its bits may differ: the partial sums add per range), the same bits on a
    second call."""
    _need_sm90()
    from cutegemm.config import GemmProblem

    a, b = _ops(m, n, k, seed=m + n)
    a8, b8 = a.to(F8), b.to(F8)
    sa, sb = torch.rand(m, device="cuda") + 0.5, torch.rand(n, device="cuda") + 0.5
    cfg = policy_for("sm_90a", 132).choose_dense(GemmProblem(m, n, k, 1, "e4m3", "e4m3", "bf16", "k", "k"))
    assert cfg.split_k > 1, cfg.name
    buf, out = poisoned_out((m, n), BF16)
    cutegemm.gemm(a8, b8, scale_a=sa, scale_b=sb, out=out)
    assert_outside_untouched(buf, m, n)
    ref = (a8.double() * sa.double()[:, None]) @ (b8.double() * sb.double()[None, :])
    whole = cutegemm.gemm(a8, b8, scale_a=sa, scale_b=sb, config=replace(cfg, split_k=1, split_cluster=False, split_tail=False,
                                                                            epilogue=type(cfg.epilogue)()))
    err, err_whole = ((out.double() - ref).abs().max().item(), (whole.double() - ref).abs().max().item())
    assert err <= 2 * err_whole + 1e-6, (err, err_whole)
    assert torch.equal(out, cutegemm.gemm(a8, b8, scale_a=sa, scale_b=sb))


# --- split K through distributed shared memory (GemmConfig.split_cluster) -----------------------
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    m=st.integers(1, 300),
    n8=st.integers(1, 96),
    k8=st.integers(1, 600),
    split=st.sampled_from([2, 4, 8]),
    tile=st.sampled_from([(64, 64), (64, 128), (128, 64)]),
    dtype=st.sampled_from([BF16, F8]),
    box=st.booleans(),
)
def test_split_cluster_matches_workspace(m, n8, k8, split, tile, dtype, box):
    """The cluster exchange gives the workspace exchange's bits (same ranges, same order), in a
    poisoned buffer, within the error bound; ragged M, N, K, fewer K tiles than ranges, more
    clusters than fit on the GPU at once (large M), A's short box."""
    _need_sm90()
    from cutegemm.config import a_rows_for, split_k_errors

    n, k = 8 * n8, 8 * k8
    if dtype == F8:
        k = 16 * max(1, k // 16)
    a, b = _ops(m, n, k, dtype, seed=m + 7 * n + 3 * k)
    rows = a_rows_for(m) if box and a_rows_for(m) < tile[0] else 0
    cfg = _cfg(dtype, tile_m=tile[0], tile_n=tile[1], split_k=split, a_rows=rows)
    assume(not split_k_errors(replace(cfg, split_cluster=True)))  # the receive slots must fit
    want = cutegemm.gemm(a, b, config=cfg)
    buf, out = poisoned_out((m, n), BF16)
    cutegemm.gemm(a, b, out=out, config=replace(cfg, split_cluster=True))
    assert_outside_untouched(buf, m, n)
    _check(out, a, b, f"split_cluster {split} {tile} rows={rows} {m}x{n}x{k}")
    assert torch.equal(out, want), f"cluster and workspace exchanges differ: {m}x{n}x{k} {cfg.name}"


def test_split_cluster_epilogues_and_scales():
    """Bias + SiLU, beta * C, FP8 row-wise scales and MXFP8 output on the cluster exchange: the
    workspace exchange's bits."""
    _need_sm90()
    m, n, k = 48, 384, 2048
    a, b = _ops(m, n, k, seed=11)
    bias = torch.randn(n, device="cuda", dtype=BF16)
    c = torch.randn(m, n, device="cuda", dtype=BF16)
    cfg = _cfg(split_k=4, a_rows=48)
    cl = replace(cfg, split_cluster=True)
    for kw in (dict(bias=bias, activation="silu"), dict(c=c, beta=-1.5)):
        assert torch.equal(cutegemm.gemm(a, b, config=cl, **kw), cutegemm.gemm(a, b, config=cfg, **kw)), sorted(kw)
    a8, b8 = a.to(F8), b.to(F8)
    sa, sb = torch.rand(m, device="cuda") + 0.5, torch.rand(n, device="cuda") + 0.5
    f8 = _cfg(F8, tile_n=128, split_k=2)
    got = cutegemm.gemm(a8, b8, scale_a=sa, scale_b=sb, config=replace(f8, split_cluster=True))
    assert torch.equal(got, cutegemm.gemm(a8, b8, scale_a=sa, scale_b=sb, config=f8))
    q = cutegemm.gemm(a, b, out_dtype="mxfp8", config=replace(cl, out_dtype="e4m3"))
    q_ws = cutegemm.gemm(a, b, out_dtype="mxfp8", config=replace(cfg, out_dtype="e4m3"))
    assert torch.equal(q.data.view(torch.uint8), q_ws.data.view(torch.uint8))
    assert torch.equal(q.scales.view(torch.uint8), q_ws.scales.view(torch.uint8))


def test_split_cluster_cuda_graph_replay():
    """Captured once, replayed with 20 new activations: every replay gives the eager call's bits."""
    _need_sm90()
    _graph_replays(_cfg(tile_n=128, split_k=4, a_rows=16, split_cluster=True))


def test_split_cluster_config_rules():
    _need_sm90()
    a, b = _ops(16, 256, 512)
    for bad, match in ((dict(split_cluster=True), "needs split_k in"),
                       (dict(split_k=2, split_cluster=True, pingpong=True), "cooperative"),
                       (dict(split_k=8, tile_n=128, split_cluster=True), "receives")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            cutegemm.gemm(a, b, config=replace(_cfg(), **bad))


# --- clusters of four 64x128 tiles (small_m.quad_clusters) -------------------------------------
@pytest.mark.parametrize("m,n,k,dtype", [(64, 10240, 8192, BF16), (56, 6000, 5120, BF16), (49, 5656, 5184, torch.float16),
                                         (64, 8200, 5120, BF16), (64, 6144, 6144, torch.float16)])  # fmt: skip
def test_quad_clusters_policy_calls(m, n, k, dtype):
    """The policy's 1x4 clusters of 64x128 tiles (A multicast to four CTAs), including N tile
    counts that are not a multiple of 4 (a cluster's CTAs past the last tile run on nothing):
    poisoned output, within 2x torch's error, the same bits as the 1x1 config's (the same
    per-tile sums) and on a second call; with a bias and an activation too."""
    _need_sm90()
    a, b = _ops(m, n, k, dtype, seed=m + n)
    pol = policy_for("sm_90a", 132)
    from cutegemm.config import GemmProblem

    name = {BF16: "bf16", torch.float16: "fp16"}[dtype]
    cfg = pol.choose_dense(GemmProblem(m, n, k, 1, name, name, name, "k", "k"))
    assert (cfg.tile_m, cfg.tile_n, cfg.cluster_n) == (64, 128, 4), cfg.name
    buf, out = poisoned_out((m, n), dtype)
    cutegemm.gemm(a, b, out=out)
    assert_outside_untouched(buf, m, n)
    _check(out, a, b, f"1x4 {m}x{n}x{k}")
    assert torch.equal(out, cutegemm.gemm(a, b))
    single = cutegemm.gemm(a, b, config=replace(cfg, cluster_n=1, raster="n"))
    assert torch.equal(out, single), "1x4 and 1x1 clusters gave other bits"
    bias = torch.randn(n, device="cuda").to(dtype)
    fused = cutegemm.gemm(a, b, bias=bias, activation="silu")
    ref = torch.nn.functional.silu(a.double() @ b.double() + bias.double())
    same = torch.nn.functional.silu((a @ b).float() + bias.float()).to(dtype)
    assert_within_torch_error(fused, same, ref, what="1x4 bias + silu")


def _fp8_policy_call(m, n, k, rowwise):
    """An e4m3 policy call (per-tensor or row-wise scales) into a poisoned output, checked within 2x
    torch._scaled_mm's error of fp64 (torch on N padded to 16) and for writes outside:
    (a, b, sa, sb, the GemmProblem, the policy's config, out)."""
    from cutegemm.config import EpilogueSpec, GemmProblem

    a, b = _ops(m, n, k, F8, seed=m + n + k)
    g = torch.Generator(device="cuda").manual_seed(k)
    if rowwise:
        sa, sb = torch.rand(m, 1, generator=g, device="cuda") + 0.5, torch.rand(1, n, generator=g, device="cuda") + 0.5
    else:
        sa, sb = torch.tensor(0.25, device="cuda"), torch.tensor(1.5, device="cuda")
    p = GemmProblem(m, n, k, 1, "e4m3", "e4m3", "bf16", "k", "k")
    cfg = policy_for("sm_90a", 132).choose_dense(p, epilogue=EpilogueSpec(scale_a=True, scale_b=True))
    buf, out = poisoned_out((m, n), BF16)
    cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out_dtype=BF16, out=out)
    assert_outside_untouched(buf, m, n)
    ref = (a.double() @ b.double()) * sa.double() * sb.double()
    pn = -n % 16
    bp = torch.nn.functional.pad(b.t().contiguous().view(torch.uint8), (0, 0, 0, pn)).view(F8).t()
    sbp = torch.nn.functional.pad(sb, (0, pn), value=1.0) if rowwise else sb
    same = torch._scaled_mm(a, bp, scale_a=sa, scale_b=sbp, out_dtype=BF16)[:, :n]
    assert_within_torch_error(out, same, ref, what=f"fp8 {m}x{n}x{k} {cfg.name}")
    return a, b, sa, sb, p, cfg, out


@pytest.mark.parametrize("m,n,k", [(1, 10240, 5120), (16, 10240, 8192), (40, 10000, 5120), (64, 10240, 5120),
                                   (7, 9000, 8192)])  # fmt: skip
@pytest.mark.parametrize("rowwise", [False, True])
def test_quad_clusters_fp8_policy_calls(m, n, k, rowwise):
    """e4m3 decode calls in the policy's 1x4 clusters of 64x128 tiles (small_m.QUAD_FP8: A's whole
    64-row box, the short one given up), N tile counts not a multiple of 4 included: per-tensor and
    row-wise scales (_fp8_policy_call), the same bits as the 1x1 short-box config's and on a second
    call."""
    _need_sm90()
    a, b, sa, sb, p, cfg, out = _fp8_policy_call(m, n, k, rowwise)
    assert (cfg.tile_m, cfg.tile_n, cfg.cluster_n, cfg.a_rows) == (64, 128, 4, 0), cfg.name
    single = short_a_box(replace(cfg, cluster_n=1, raster="n"), p)
    assert torch.equal(out, cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out_dtype=BF16, config=single)), single.name
    assert torch.equal(out, cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out_dtype=BF16))


@pytest.mark.parametrize("m,n,k", [(128, 576, 7168), (120, 1536, 7168), (128, 2048, 4096), (113, 4096, 4096),
                                   (128, 4000, 14336)])  # fmt: skip
@pytest.mark.parametrize("rowwise", [False, True])
def test_fp8_row_split_policy_calls(m, n, k, rowwise):
    """e4m3 at 112 < M <= 128 in the policy's 64x64 tiles where its 128x64 pick cut K
    (small_m.FP8_ROW_SPLIT: K ranges meeting in a cluster, or 2x1 pairs): per-tensor and row-wise
    scales (_fp8_policy_call), the same bits on a second call (the ranges added in range order)."""
    _need_sm90()
    a, b, sa, sb, _, cfg, out = _fp8_policy_call(m, n, k, rowwise)
    assert (cfg.tile_m, cfg.tile_n) == (64, 64) and (cfg.split_cluster or cfg.cluster_m == 2), cfg.name
    for _ in range(2):
        assert torch.equal(out, cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out_dtype=BF16)), cfg.name
