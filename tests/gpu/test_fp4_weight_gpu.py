"""FP4-weight GEMM (W4A16) on a GPU (sm_90 / sm_100): every element against a float64 reference
of the dequantized weights, error within 2x torch's own bf16 error; poisoned outputs; grouped
with empty experts and rows past the last offset untouched; CUDA-graph replay with new offs."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cutegemm
from cutegemm.blockscaled.reference import dequantize_ref

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] not in (9, 10),
    reason="needs an sm_90 / sm_100 GPU",
)
POISON = float("nan")


def _weights(shape, fmt, seed, special=True):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(*shape, device="cuda", generator=g)
    if special and shape[-1] >= 64:
        w[..., :1, :32] = 0.0  # a zero block
        w[..., 1:2, 32:64] *= 1e4  # large values (saturating scales)
        w[..., 2:3, :16] *= 1e-6  # tiny values
    return cutegemm.quantize(w.to(torch.bfloat16), fmt)


def _offs(counts):
    """Cumulative end rows (int32, on the GPU) of per-expert token counts."""
    return torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)


def _bounds(offs):
    """(start, end) rows of every expert of ``offs``."""
    return list(zip([0, *offs.tolist()[:-1]], offs.tolist(), strict=True))


def _check(out, x, qw, bounds=None):
    """Max error vs float64 <= 2x torch bf16 matmul's (same dequantized weights) + eps."""
    wd = dequantize_ref(qw).double()
    if bounds is None:
        ref = x.double() @ wd.T
        tref = (x @ wd.to(torch.bfloat16).T).double()
    else:
        ref = torch.zeros(out.shape, dtype=torch.float64, device=out.device)
        tref = ref.clone()
        for e, (s, t) in enumerate(bounds):
            ref[s:t] = x[s:t].double() @ wd[e].T
            tref[s:t] = (x[s:t] @ wd[e].to(torch.bfloat16).T).double()
    assert not torch.isnan(out).any(), "unwritten (poisoned) or NaN outputs"
    if out.numel() == 0:
        return
    err = (out.double() - ref).abs().max().item()
    terr = (tref - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert err <= 2 * terr + 1e-6 * scale + 1e-30, (err, terr)


def _mma_sync_config(m, fmt, out_dtype, grouped, experts):
    """The decode policy's config with the mma.sync consumers (sm_100a's choice; on sm_90a the
    policy takes the WGMMA consumers from 17 rows), built for this GPU's arch."""
    from dataclasses import replace

    from cutegemm.blockscaled.weight_only.launch import pick_config, weight_arch

    return replace(pick_config(m, fmt, out_dtype, "sm_100a", grouped, experts), arch=weight_arch(0))


def _run_checked(x, qw, counts, cfg, out_dtype=torch.bfloat16, x_call=None):
    """Run config ``cfg`` (grouped when ``counts`` is given) into a poisoned output and check it
    against ``x`` (the call gets ``x_call`` if given: a view of the same values)."""
    from cutegemm.blockscaled.weight_only.launch import gemm_fp4_weight

    offs = None if counts is None else _offs(counts)
    out = torch.full((x.shape[0], qw.shape[-2]), POISON, device="cuda", dtype=out_dtype)
    if x.shape[0]:
        gemm_fp4_weight(x if x_call is None else x_call, qw, offs=offs, out=out, config=cfg)
    _check(out, x, qw, None if offs is None else _bounds(offs))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 80),
    n=st.integers(1, 300),
    kb=st.integers(1, 24),
    fmt=st.sampled_from(["nvfp4", "mxfp4"]),
    out_dtype=st.sampled_from([torch.bfloat16, torch.float32]),
)
def test_dense_matches_reference(m, n, kb, fmt, out_dtype):
    k = 32 * kb
    qw = _weights((n, k), fmt, seed=m * 7 + n * 13 + kb)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    out = torch.full((m, n), POISON, device="cuda", dtype=out_dtype)
    res = cutegemm.gemm(x, qw, out=out)
    assert res is out
    _check(out, x, qw)


@pytest.mark.parametrize("m", [1, 16, 64])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_decode_shapes(m, fmt):
    qw = _weights((4096, 2048), fmt, seed=m)
    x = torch.randn(m, 2048, device="cuda").to(torch.bfloat16)
    _check(cutegemm.gemm(x, qw), x, qw)


@pytest.mark.parametrize(
    "shape",
    [dict(ring=0, stages=4, warps_n=2, warps_k=4, row_tiles=1), dict(ring=0, stages=3, warps_n=1, warps_k=4, row_tiles=1, min_blocks=4),
     dict(ring=0, stages=0, warps_n=4, warps_k=2, row_tiles=2), dict(ring=0, stages=6, warps_n=1, warps_k=8, row_tiles=1),
     dict(ring=0, stages=0, warps_n=1, warps_k=2, row_tiles=1, l2_prefetch=256),
     dict(stages=0, ring=3, ring_k=2, warps_n=8, warps_k=1, row_tiles=1), dict(stages=0, ring=2, ring_k=4, warps_n=2, warps_k=2, row_tiles=1),
     dict(stages=0, ring=4, ring_k=2, warps_n=4, warps_k=1, row_tiles=2)],
    ids=str,
)  # fmt: skip
@pytest.mark.parametrize("grouped", [False, True])
def test_other_pipelines(shape, grouped):
    """The variants the policy does not pick (cp.async ring vs register prefetch, other warp
    splits), dense and grouped, K with a tail chunk."""
    from dataclasses import replace

    k, n = 32 * 37, 200
    e = 3 if grouped else 1
    qw = _weights((e, n, k) if grouped else (n, k), "nvfp4", seed=11)
    counts = [9, 0, 30] if grouped else [21]
    x = torch.randn(sum(counts), k, device="cuda").to(torch.bfloat16)
    cfg = replace(_mma_sync_config(x.shape[0], "nvfp4", torch.bfloat16, grouped, e), **shape)
    _run_checked(x, qw, counts if grouped else None, cfg)


RING_SHAPES = [
    dict(ring=3, ring_k=2, warps_n=8, warps_k=1, row_tiles=1),
    dict(ring=4, ring_k=2, warps_n=4, warps_k=1, row_tiles=1),
    dict(ring=3, ring_k=2, warps_n=4, warps_k=2, row_tiles=2),
    dict(ring=2, ring_k=4, warps_n=1, warps_k=1, row_tiles=1, n_tiles=1),
]
if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9:  # the WGMMA consumers (sm_90a)
    RING_SHAPES += [dict(ring=ring, ring_k=2, warps_n=8, warps_k=1, row_tiles=1, n_tiles=n_tiles, wgmma=True,
                         producer_pairs=False) for n_tiles, ring in ((2, 4), (4, 4), (8, 3), (8, 2), (16, 2))]  # fmt: skip
    # 128 K per stage (64-byte weight boxes, two stages per loop trip, an odd last one after it) and
    # the producer warpgroup's registers handed to the consumers
    RING_SHAPES += [dict(ring=ring, ring_k=1, warps_n=8, warps_k=1, row_tiles=1, n_tiles=n_tiles, wgmma=True,
                         producer_pairs=False, producer_wg=pwg) for n_tiles, ring, pwg in ((16, 4, True), (8, 6, True),
                                                                                           (4, 3, False))]  # fmt: skip
    RING_SHAPES += [dict(ring=2, ring_k=2, warps_n=8, warps_k=1, row_tiles=1, n_tiles=16, wgmma=True,
                         producer_pairs=False, producer_wg=True)]  # fmt: skip
    # 256 tokens per pass (commit groups of 4 steps, one stage per loop trip; two stages per trip,
    # four groups, a wait for all at the trip's end; groups of 8), and groups of 4 in 256-K stages
    RING_SHAPES += [dict(ring=3, ring_k=1, warps_n=8, warps_k=1, row_tiles=1, n_tiles=32, wgmma=True,
                         producer_pairs=False, producer_wg=True, wg_steps=ws, wg_trip=u, split=False)
                    for ws, u in ((0, 0), (0, 2), (8, 0))]  # fmt: skip
    RING_SHAPES += [dict(ring=3, ring_k=1, warps_n=8, warps_k=1, row_tiles=1, n_tiles=32, wgmma=True,
                         producer_pairs=False, producer_wg=True, split=False, staged_store=True)]  # fmt: skip
    RING_SHAPES += [dict(ring=ring, ring_k=rk, warps_n=8, warps_k=1, row_tiles=1, n_tiles=nt, wgmma=True,
                         producer_pairs=False, producer_wg=nt == 16, split=False, staged_store=True)
                    for nt, ring, rk in ((8, 3, 2), (16, 4, 1))]  # fmt: skip
    RING_SHAPES += [dict(ring=2, ring_k=2, warps_n=8, warps_k=1, row_tiles=1, n_tiles=16, wgmma=True,
                         producer_pairs=False, producer_wg=True, wg_steps=4)]  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    counts=st.lists(st.integers(0, 150), min_size=1, max_size=4),
    n=st.integers(1, 300),
    kb=st.integers(1, 40),
    fmt=st.sampled_from(["nvfp4", "mxfp4"]),
    grouped=st.booleans(),
    shape=st.sampled_from(RING_SHAPES),
    out_dtype=st.sampled_from([torch.bfloat16, torch.float32]),
)
def test_bulk_copy_ring(counts, n, kb, fmt, grouped, shape, out_dtype):
    """The streaming ring (cfg.ring: TMA + bulk copies) with the mma.sync consumers and on sm_90a
    the WGMMA ones: rows past N inside a CTA, K with a partial last chunk and partial stages,
    several token passes (tokens past a pass's end: zeros or the next expert's rows), empty
    experts, both formats."""
    from dataclasses import replace


    k = 32 * kb
    if not grouped:
        counts = [max(sum(counts), 1)]
    e = len(counts)
    qw = _weights((e, n, k) if grouped else (n, k), fmt, seed=n * 31 + kb * 7 + e)
    m = sum(counts)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    cfg = replace(_mma_sync_config(min(max(m, 1), 32 * e), fmt, out_dtype, grouped, e), stages=0, l2_prefetch=0,
                  **shape)  # fmt: skip
    _run_checked(x, qw, counts if grouped else None, cfg, out_dtype)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9, reason="WGMMA: sm_90")
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("n", "offset"), [(264, 0), (260, 0), (264, 2)])
@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("tokens", [256, 64])
def test_staged_store(fmt, out_dtype, n, offset, grouped, tokens):
    """``staged_store`` (256 / 64 tokens per pass): outputs through shared memory, 16-byte row pieces;
    N not a multiple of a piece's values (260 bf16) or an output 2 values off 16-byte alignment:
    the direct stores. Partial passes and weight tiles, empty / tiny experts; every output
    written, nothing beside the output (poisoned guard values around it)."""
    from dataclasses import replace

    from cutegemm.blockscaled.weight_only import launch as api

    k = 512
    counts = [0, 257, 3, 100] if grouped else [300]
    e, m = len(counts), sum(counts)
    qw = _weights((e, n, k) if grouped else (n, k), fmt, seed=n + offset + e)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    cfg = replace(api.pick_config((1024 if tokens == 256 else 64) * e, fmt, out_dtype, "sm_90a", grouped, e),
                  split=False, staged_store=True)  # fmt: skip
    assert cfg.tokens_per_pass == tokens
    buf = torch.full((offset + m * n + 64,), POISON, device="cuda", dtype=out_dtype)
    out = buf[offset : offset + m * n].view(m, n)
    offs = _offs(counts) if grouped else None
    api.gemm_fp4_weight(x, qw, offs=offs, out=out, config=cfg)
    _check(out, x, qw, _bounds(offs) if grouped else None)
    assert torch.isnan(buf[:offset]).all() and torch.isnan(buf[offset + m * n :]).all(), "wrote beside the output"


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9, reason="WGMMA: sm_90")
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [1, 256, 300, 777])
@pytest.mark.parametrize("staged", [True, False])
@pytest.mark.parametrize(("mode", "sms"), [(1, 132), (2, 132), (2, 3)])
def test_pass_ctas(fmt, out_dtype, m, staged, mode, sms):
    """``pass_ctas`` (256-token passes dealt as (weight tile, pass) units: 1 a CTA per unit, 2 a
    persistent grid taking them round-robin, here also on a faked 3-SM device so CTAs run several
    units, their ring streaming on): one to four passes, the last one partial; a partial weight
    tile (N = 3 x 128 + 8) and a partial last K stage; staged and direct stores; every output
    written, nothing beside the output (poisoned guard values)."""
    from dataclasses import replace

    from cutegemm.blockscaled.weight_only import launch as api

    n, k = 392, 544
    qw = _weights((n, k), fmt, seed=m + 7 * staged)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    cfg = replace(api.pick_config(1024, fmt, out_dtype, "sm_90a", False, tiles_sms=(224, 132)), staged_store=staged,
                  pass_ctas=mode)  # fmt: skip
    assert cfg.tokens_per_pass == 256
    buf = torch.full((m * n + 64,), POISON, device="cuda", dtype=out_dtype)
    out = buf[: m * n].view(m, n)
    with mock.patch.object(api, "_sm_count", lambda index: sms):
        api.gemm_fp4_weight(x, qw, out=out, config=cfg)
    _check(out, x, qw)
    assert torch.isnan(buf[m * n :]).all(), "wrote beside the output"


TAIL_CASES = [  # (m, n, k, faked SMs): passes x tiles vs the grid -> tail units, cuts, contributors
    (300, 392, 4096, 3),  # 8 segments, 2 full rounds, 2 tail segments over 3 CTAs (a CTA with two pieces)
    (777, 392, 4000, 5),  # 16 segments, 3 full rounds, 1 tail segment cut 4 ways, partial last K stage
    (777, 392, 4096, 132),  # no full round: 16 segments over 64 CTAs (8 K stages each), partial pass
    (1, 700, 2048, 2),  # one partial pass, 6 tiles (the last partial), 3 full rounds, no tail
    (600, 130, 544, 4),  # tails shorter than TAIL_MIN_STAGES: one CTA, whole segments
]


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9, reason="WGMMA: sm_90")
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("staged", [True, False])
@pytest.mark.parametrize(("m", "n", "k", "sms"), TAIL_CASES)
def test_tail_split(fmt, out_dtype, staged, m, n, k, sms):
    """``tail_split`` (the persistent pass grid, the units after its last full round cut into
    equal K ranges over the CTAs, cut units meeting through the workspace): every output
    written once and right, nothing beside the output (poisoned guards), bitwise equal on a
    second call (the finisher adds the partial sums in CTA order), the counters left at zero."""
    from dataclasses import replace

    from cutegemm.blockscaled.weight_only import launch as api

    qw = _weights((n, k), fmt, seed=m + n + 7 * staged)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    cfg = replace(api.pick_config(1024, fmt, out_dtype, "sm_90a", False, tiles_sms=(224, 132)), staged_store=staged,
                  pass_ctas=2, tail_split=True)  # fmt: skip
    buf = torch.full((m * n + 64,), POISON, device="cuda", dtype=out_dtype)
    out = buf[: m * n].view(m, n)
    with mock.patch.object(api, "_sm_count", lambda index: sms):
        api.gemm_fp4_weight(x, qw, out=out, config=cfg)
        again = api.gemm_fp4_weight(x, qw, config=cfg, out_dtype=out_dtype)
    _check(out, x, qw)
    assert torch.isnan(buf[m * n :]).all(), "wrote beside the output"
    bits = torch.int16 if out_dtype == torch.bfloat16 else torch.int32
    assert torch.equal(again.view(bits), out.view(bits)), "not bitwise reproducible"
    _assert_counters_zero()


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9, reason="WGMMA: sm_90")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 1100),
    n=st.integers(1, 700),
    kb=st.integers(1, 160),
    fmt=st.sampled_from(["nvfp4", "mxfp4", "mxfp8"]),
    staged=st.booleans(),
    sms=st.sampled_from([1, 2, 3, 5, 7, 132]),
)
def test_tail_split_shapes(m, n, kb, fmt, staged, sms):
    """``tail_split`` over random shapes and faked SM counts (full rounds or none, tails cut 1..many
    ways or left whole, K tails, partial passes and tiles): right, bitwise reproducible, the
    counters left at zero (the examples reuse the workspace)."""
    from dataclasses import replace

    from cutegemm.blockscaled.weight_only import launch as api

    k = 32 * kb
    qw = _weights((n, k), fmt, seed=m * 7 + n + kb)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    cfg = replace(api.pick_config(1024, fmt, torch.bfloat16, "sm_90a", False, tiles_sms=(224, 132)),
                  staged_store=staged, pass_ctas=2, tail_split=True)  # fmt: skip
    out = torch.full((m, n), POISON, device="cuda", dtype=torch.bfloat16)
    with mock.patch.object(api, "_sm_count", lambda index: sms):
        api.gemm_fp4_weight(x, qw, out=out, config=cfg)
        again = api.gemm_fp4_weight(x, qw, config=cfg)
    _check(out, x, qw)
    assert torch.equal(again.view(torch.int16), out.view(torch.int16)), "not bitwise reproducible"
    _assert_counters_zero()


def _assert_counters_zero():
    """The current stream's split-K buffer (shared by the dense and weight-only split launches):
    every counter back at zero after the launches."""
    from cutegemm.gemm import launch

    key = (torch.device("cuda", torch.cuda.current_device()), torch.cuda.current_stream().cuda_stream)
    zone, buf = launch._SPLIT_BUFFERS[key]
    assert not buf[:zone].any(), "counters left non-zero"


SPLIT_SHAPES = [
    dict(ring=4, ring_k=2, warps_n=4, warps_k=2, row_tiles=2),
    dict(ring=3, ring_k=2, warps_n=4, warps_k=1, row_tiles=1),
    dict(ring=2, ring_k=4, warps_n=8, warps_k=1, row_tiles=1, n_tiles=1),
]
if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9:  # the WGMMA consumers (sm_90a)
    SPLIT_SHAPES += [dict(ring=3, ring_k=2, warps_n=8, warps_k=1, row_tiles=1, n_tiles=n_tiles, wgmma=True,
                          producer_pairs=False) for n_tiles in (2, 8)]  # fmt: skip
    SPLIT_SHAPES += [dict(ring=ring, ring_k=1, warps_n=8, warps_k=1, row_tiles=1, n_tiles=n_tiles, wgmma=True,
                          producer_pairs=False, producer_wg=True) for n_tiles, ring in ((16, 4), (8, 5))]  # fmt: skip


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 70),
    n=st.integers(1, 700),
    kb=st.integers(1, 48),
    fmt=st.sampled_from(["nvfp4", "mxfp4"]),
    shape=st.sampled_from(SPLIT_SHAPES),
    sms=st.sampled_from([1, 2, 3, 5, 132]),
    out_dtype=st.sampled_from([torch.bfloat16, torch.float32]),
)
def test_split_ring(m, n, kb, fmt, shape, sms, out_dtype):
    """The split (persistent, equal unit ranges) ring: segments cut between 1..many CTAs, CTAs
    spanning several segments (the SM count is faked to vary the cut points), several token
    passes, K tails; every output written once, deterministic, the counters left at zero (every
    example reuses the workspace)."""
    from dataclasses import replace

    from cutegemm.blockscaled.weight_only import launch as api

    k = 32 * kb
    qw = _weights((n, k), fmt, seed=n * 13 + kb)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    cfg = replace(_mma_sync_config(min(m, 32), fmt, out_dtype, False, 1), stages=0, l2_prefetch=0, split=True, **shape)
    out = torch.full((m, n), POISON, device="cuda", dtype=out_dtype)
    with mock.patch.object(api, "_sm_count", lambda index: sms):
        api.gemm_fp4_weight(x, qw, out=out, config=cfg)
        _check(out, x, qw)
        again = api.gemm_fp4_weight(x, qw, out_dtype=out_dtype, config=cfg)
    assert torch.equal(again, out), "split results differ between two runs"


def test_split_cuda_graph_replay():
    """A captured split call replays correctly with new activations (the counters reset)."""
    from dataclasses import replace

    from cutegemm.blockscaled.weight_only import launch as api

    m, n, k = 16, 1000, 32 * 40
    qw = _weights((n, k), "nvfp4", seed=5)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    cfg = replace(api.pick_config(m, "nvfp4", torch.bfloat16, api.weight_arch(0), False, 1), split=True)
    api.gemm_fp4_weight(x, qw, config=cfg)  # compile + workspace outside the capture
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        api.gemm_fp4_weight(x, qw, config=cfg)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            out = api.gemm_fp4_weight(x, qw, config=cfg)
    torch.cuda.current_stream().wait_stream(s)
    for i in range(20):
        x.copy_(torch.randn(m, k, device="cuda").to(torch.bfloat16) * (1 + i))
        g.replay()
        torch.cuda.synchronize()
        _check(out, x, qw)


@pytest.mark.parametrize("view", ["column_slice", "misaligned", "neighbours_nan"])
@pytest.mark.parametrize("grouped", [False, True])
def test_activation_views(view, grouped):
    """The ring reads x with TMA as the caller stored it: a column slice of a wider tensor, a view
    2 bytes off 16-byte alignment, and NaN / Inf in the memory around x (other rows, columns past
    K) must not change a result."""
    m, n, k = 37, 200, 32 * 9
    counts = [5, 0, 32]
    qw = _weights((3, n, k) if grouped else (n, k), "nvfp4", seed=11)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    if view == "column_slice":
        wide = torch.full((m, k + 48), float("nan"), device="cuda", dtype=torch.bfloat16)
        wide[:, :k] = x
        xv = wide[:, :k]
    elif view == "misaligned":
        flat = torch.randn(m * k + 1, device="cuda").to(torch.bfloat16)
        flat[1:] = x.reshape(-1)
        xv = flat[1:].view(m, k)
        assert xv.data_ptr() % 16
    else:
        buf = torch.full((m + 64, k), float("inf"), device="cuda", dtype=torch.bfloat16)
        buf[32 : 32 + m] = x
        xv = buf[32 : 32 + m]
    _run_checked(x, qw, counts if grouped else None, None, x_call=xv)  # the policy's config


@pytest.mark.parametrize("grouped", [False, True])
def test_out_views(grouped):
    """out as a view into a larger NaN buffer (row stride past N) and as a column-transposed
    view: every output element written, nothing outside it, rows past offs[-1] kept."""
    from cutegemm.blockscaled.weight_only.launch import gemm_fp4_weight

    m, n, k = 41, 136, 32 * 5
    counts = [5, 0, 30]  # rows 35..40 belong to no expert
    qw = _weights((3, n, k) if grouped else (n, k), "mxfp4", seed=5)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    offs = _offs(counts) if grouped else None
    bounds = _bounds(offs) if grouped else None
    end = sum(counts) if grouped else m
    buf = torch.full((m + 3, n + 8), POISON, device="cuda", dtype=torch.bfloat16)
    res = gemm_fp4_weight(x, qw, offs=offs, out=buf[:m, :n])
    assert res.data_ptr() == buf.data_ptr()
    assert torch.isnan(buf[m:]).all() and torch.isnan(buf[:, n:]).all(), "written outside out"
    assert torch.isnan(buf[end:m, :n]).all(), "rows past offs[-1] were written"
    _check(buf[:end, :n], x[:end], qw, bounds)
    t = torch.full((n, m), POISON, device="cuda", dtype=torch.bfloat16)
    gemm_fp4_weight(x, qw, offs=offs, out=t.T)
    assert torch.equal(t.T[:end], buf[:end, :n])
    assert torch.isnan(t.T[end:]).all()


def test_alpha_and_global_scale():
    qw = cutegemm.quantize(torch.randn(96, 256, device="cuda").to(torch.bfloat16), "nvfp4", global_scale=0.37)
    x = torch.randn(5, 256, device="cuda").to(torch.bfloat16)
    got = cutegemm.gemm(x, qw, alpha=0.5, out_dtype=torch.float32)
    want = cutegemm.gemm_ref(x, qw, alpha=0.5, out_dtype=torch.float64).float()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    counts=st.lists(st.sampled_from([0, 0, 1, 3, 8, 16, 17, 40, 70]), min_size=1, max_size=8),
    extra=st.integers(0, 9),
    n=st.integers(1, 200),
    kb=st.integers(1, 10),
    fmt=st.sampled_from(["nvfp4", "mxfp4"]),
)
def test_grouped_matches_reference(counts, extra, n, kb, fmt):
    k = 32 * kb
    e = len(counts)
    qw = _weights((e, n, k), fmt, seed=sum(counts) + n + kb)
    total = sum(counts) + extra  # rows past offs[-1] must stay untouched
    x = torch.randn(total, k, device="cuda").to(torch.bfloat16)
    offs = _offs(counts)
    out = torch.full((total, n), POISON, device="cuda", dtype=torch.bfloat16)
    cutegemm.grouped_gemm(x, qw, offs=offs, out=out)
    end = sum(counts)
    assert torch.isnan(out[end:]).all(), "a row past offs[-1] was written"
    bounds = _bounds(offs)
    _check(out[:end], x[:end], qw, bounds)


def test_grouped_cuda_graph_replay_with_new_offs():
    e, n, k, total = 8, 256, 512, 96
    qw = _weights((e, n, k), "nvfp4", seed=5)
    x = torch.randn(total, k, device="cuda").to(torch.bfloat16)
    offs = torch.zeros(e, dtype=torch.int32, device="cuda")
    out = torch.empty(total, n, device="cuda", dtype=torch.bfloat16)
    cutegemm.grouped_gemm(x, qw, offs=offs.copy_(torch.arange(1, e + 1, device="cuda") * 12), out=out)  # compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cutegemm.grouped_gemm(x, qw, offs=offs, out=out)
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        cuts = torch.sort(torch.randint(0, total + 1, (e,), generator=gen)).values
        offs.copy_(cuts.to(torch.int32))
        out.fill_(POISON)
        graph.replay()
        torch.cuda.synchronize()
        want = cutegemm.grouped_gemm(x, qw, offs=offs)
        end = int(cuts[-1])
        assert torch.equal(out[:end], want[:end])
        assert torch.isnan(out[end:]).all()
        bounds = _bounds(cuts)
        _check(out[:end], x[:end], qw, bounds)


def test_grouped_bad_offs_are_clamped_and_checked():
    """offs past total_M / decreasing: clamped like the bf16 grouped path (memory-safe, rows of
    no clamped expert untouched); check_offs=True raises."""
    e, n, k, total = 3, 64, 128, 20
    qw = _weights((e, n, k), "nvfp4", seed=2, special=False)
    x = torch.randn(total, k, device="cuda").to(torch.bfloat16)
    offs = torch.tensor([12, 5, 100], dtype=torch.int32, device="cuda")
    out = torch.full((total, n), POISON, device="cuda", dtype=torch.bfloat16)
    cutegemm.grouped_gemm(x, qw, offs=offs, out=out)
    # expert 0: [0, 12), expert 1: [12, max(5, 12)) = empty, expert 2: [5, 20) (clamped)
    wd = dequantize_ref(qw).double()
    torch.testing.assert_close(out[12:].double(), x[12:].double() @ wd[2].T, rtol=2e-2, atol=2e-2)
    assert not torch.isnan(out).any()
    with pytest.raises(ValueError):
        cutegemm.grouped_gemm(x, qw, offs=offs, check_offs=True)


def test_errors_on_gpu():
    qw = _weights((64, 48), "nvfp4", seed=1, special=False)
    x = torch.randn(4, 48, device="cuda").to(torch.bfloat16)
    with pytest.raises(ValueError, match="positive multiple of 32"):
        cutegemm.gemm(x, qw)
    qw = _weights((64, 128), "nvfp4", seed=1, special=False)
    x = torch.randn(4, 128, device="cuda").to(torch.bfloat16)
    with pytest.raises(ValueError, match="out must be"):
        cutegemm.gemm(x, qw, out=torch.empty(4, 63, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="bf16 or float8_e4m3fn activations"):
        cutegemm.gemm(x.half(), qw)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_quantized_grouped_experts(fmt):
    from cutegemm.nn import GroupedExperts

    torch.manual_seed(0)
    layer = GroupedExperts(4, 256, 128, device="cuda")
    q = layer.quantized(fmt)
    counts = [5, 0, 17, 3]
    x = torch.randn(sum(counts), 256, device="cuda").to(torch.bfloat16)
    offs = _offs(counts)
    got, want = q(x, offs), q.forward_ref(x, offs)
    torch.testing.assert_close(got.float(), want.float(), rtol=3e-2, atol=3e-2)
    # quantization error vs the bf16 layer: small relative to the output
    full = layer.forward_ref(x, offs).float()
    assert (got.float() - full).norm() <= 0.25 * full.norm()


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_custom_op_matches_the_direct_call_and_compiles(fmt):
    """The ``cutegemm::gemm_fp4_weight`` op (FP4 and MXFP8 weights): the direct call's result,
    rows past offs[-1] zero; fullgraph torch.compile."""
    from cutegemm import quant_ops

    qw = _weights((3, 96, 256), fmt, seed=4)
    x = torch.randn(40, 256, device="cuda").to(torch.bfloat16)
    offs = torch.tensor([10, 10, 33], dtype=torch.int32, device="cuda")
    got = quant_ops.gemm_fp4_weight(x, qw, offs=offs)
    want = cutegemm.grouped_gemm(x, qw, offs=offs)
    assert torch.equal(got[:33], want[:33]) and torch.equal(got[33:], torch.zeros_like(got[33:]))
    torch._dynamo.reset()
    f = torch.compile(lambda x, offs: quant_ops.gemm_fp4_weight(x, qw, offs=offs).float().relu(), backend="aot_eager", fullgraph=True)
    assert torch.equal(f(x, offs), got.float().relu())


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("per_tensor", [False, True])
@pytest.mark.parametrize("rows", ["decode", "wgmma", "t256"])
def test_fp8_activations(grouped, per_tensor, rows):
    """float8_e4m3fn activations with a per-token (or per-tensor) fp32 scale (few rows: the
    mma.sync consumers; more: on sm_90a the WGMMA consumers; "t256": their 256-token passes,
    whose outputs go through shared memory with the token scales)."""
    e, n, k = 3, 152 if rows == "t256" else 150, 32 * 11
    qw = _weights((e, n, k) if grouped else (n, k), "nvfp4", seed=9)
    if rows == "decode":
        counts = [7, 0, 19] if grouped else [13]
    elif rows == "wgmma":
        counts = [70, 0, 60] if grouped else [45]
    else:
        counts = [300, 0, 150] if grouped else [600]
    total = sum(counts)
    x8 = (torch.randn(total, k, device="cuda") * 4).to(torch.float8_e4m3fn)
    sa = torch.rand(1 if per_tensor else total, device="cuda") + 0.25
    offs = _offs(counts) if grouped else None
    out = torch.full((total, n), POISON, device="cuda", dtype=torch.bfloat16)
    if grouped:
        cutegemm.grouped_gemm(x8, qw, offs=offs, scale_a=sa, out=out)
    else:
        cutegemm.gemm(x8, qw, scale_a=sa, out=out)
    xd = x8.double() * sa.double().reshape(-1, 1)
    wd = dequantize_ref(qw).double()
    bounds = _bounds(offs) if grouped else [(0, total)]
    ref = torch.cat([xd[s:t] @ (wd[i] if grouped else wd).T for i, (s, t) in enumerate(bounds)])
    tref = torch.cat([(xd[s:t].to(torch.bfloat16) @ (wd[i] if grouped else wd).to(torch.bfloat16).T).double()
                      for i, (s, t) in enumerate(bounds)])  # fmt: skip
    assert not torch.isnan(out).any()
    err = (out.double() - ref).abs().max().item()
    terr = (tref - ref).abs().max().item()
    assert err <= 2 * terr + 1e-6 * ref.abs().max().item(), (err, terr)


def _spy_dequant():
    """A spy on the dequantize-first path's weight dequantization (counts its calls)."""
    from cutegemm.blockscaled.weight_only import launch

    return mock.patch.object(launch, "dequantize_checked", wraps=launch.dequantize_checked)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_prefill_dequantize_first(fmt, out_dtype):
    """Dense calls from the threshold on (``dq_min_rows`` for this GPU's arch) dequantize the
    weight once and run the bf16 GEMM (the spy proves which path ran): every element within the
    bound, nothing written outside ``out`` (a view into a larger poisoned buffer); one row fewer
    stays on the decode kernel."""
    from cutegemm.blockscaled.weight_only import launch as api

    rows = api.dq_min_rows(fmt, False, api.weight_arch(0))
    m, n, k = rows + 37, 328, 32 * 9
    qw = _weights((n, k), fmt, seed=m)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    buf = torch.full((m + 2, n + 5), POISON, device="cuda", dtype=out_dtype)
    with _spy_dequant() as spy:
        res = cutegemm.gemm(x, qw, out=buf[:m, :n])
    assert spy.call_count == 1 and res.data_ptr() == buf.data_ptr()
    assert torch.isnan(buf[m:]).all() and torch.isnan(buf[:, n:]).all(), "written outside out"
    _check(buf[:m, :n], x, qw)
    with _spy_dequant() as spy:
        small = cutegemm.gemm(x[: rows - 1], qw)
    assert spy.call_count == 0
    _check(small, x[: rows - 1], qw)


def test_prefill_alpha_fp8_scale_a():
    """The dequantize-first path with alpha (fp32 out, MXFP4: exact in bf16) and with e4m3
    activations times a per-token scale (fp32 results scaled before the one rounding)."""
    from cutegemm.blockscaled.weight_only import launch as api

    m, n, k = api.dq_min_rows("mxfp4", False, api.weight_arch(0)) + 3, 200, 32 * 7  # NVFP4: the same
    qw = _weights((n, k), "mxfp4", seed=4)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    with _spy_dequant() as spy:
        got = cutegemm.gemm(x, qw, alpha=0.75, out_dtype=torch.float32)
    assert spy.call_count == 1
    want = x.double() @ dequantize_ref(qw).double().T * 0.75
    assert (got.double() - want).abs().max().item() <= 1e-5 * want.abs().max().item()
    qn = _weights((n, k), "nvfp4", seed=6)
    x8 = (torch.randn(m, k, device="cuda") * 4).to(torch.float8_e4m3fn)
    sa = torch.rand(m, device="cuda") + 0.25
    out = torch.full((m, n), POISON, device="cuda", dtype=torch.bfloat16)
    with _spy_dequant() as spy:
        cutegemm.gemm(x8, qn, scale_a=sa, out=out)
    assert spy.call_count == 1
    xd = x8.double() * sa.double().reshape(-1, 1)
    wd = dequantize_ref(qn).double()
    ref = xd @ wd.T
    terr = ((xd.to(torch.bfloat16) @ wd.to(torch.bfloat16).T).double() - ref).abs().max().item()
    assert not torch.isnan(out).any()
    assert (out.double() - ref).abs().max().item() <= 2 * terr + 1e-6 * ref.abs().max().item()


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_grouped_prefill_dequantize_first(fmt):
    """Grouped calls with the threshold's mean rows per expert: the dequantize-first path
    (empty expert, rows past offs[-1] untouched), and a CUDA graph of it replayed with new
    activations."""
    from cutegemm.blockscaled.weight_only import launch as api

    r = api.dq_min_rows(fmt, True, api.weight_arch(0))
    counts = [2 * r + 5, 0, r + 60, r - 40]
    e, n, k = len(counts), 136, 32 * 6
    qw = _weights((e, n, k), fmt, seed=11)
    total = sum(counts) + 7
    x = torch.randn(total, k, device="cuda").to(torch.bfloat16)
    offs = _offs(counts)
    out = torch.full((total, n), POISON, device="cuda", dtype=torch.bfloat16)
    with _spy_dequant() as spy:
        cutegemm.grouped_gemm(x, qw, offs=offs, out=out)
    assert spy.call_count == 1
    end = sum(counts)
    assert torch.isnan(out[end:]).all(), "a row past offs[-1] was written"
    _check(out[:end], x[:end], qw, _bounds(offs))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cutegemm.grouped_gemm(x, qw, offs=offs, out=out)
    for seed in range(3):
        x.copy_(torch.randn(total, k, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed)))
        out.fill_(POISON)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.isnan(out[end:]).all()
        _check(out[:end], x[:end], qw, _bounds(offs))
