"""Split-K workspaces shared per stream (cutegemm.gemm.launch.split_workspace), on a GPU: the
policy's split calls of several token counts (different tile counts: each plan's counters sit in
the buffer's counter zone, past the slots the others leave full) stay correct (within 2x torch's
error against float64, the same bits on every call) while one buffer serves them all; the same plan enqueued
on two streams at once gives each stream's results their sequential bits; a CUDA graph captured
with a split call replays correctly after the stream's buffer has grown."""

from __future__ import annotations

import pytest
import torch

import cutegemm
from cutegemm.config import GemmConfig
from cutegemm.gemm import dense, launch

from ..gemm_check import assert_within_torch_error

pytestmark = pytest.mark.gpu
BF16, F8 = torch.bfloat16, torch.float8_e4m3fn


@pytest.fixture(autouse=True)
def _sm90():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("split K is an sm_90a kernel option so far")


def _ops(m, n, k, dtype=BF16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, generator=g, device="cuda").to(dtype)
    return a, torch.randn(n, k, generator=g, device="cuda").to(dtype).t()


def _split_plan(a, b):
    plans = [p for key, p in dense.PLANS.items() if key[0] == a.shape and key[2] == b.shape and p.ws_stream is not None]
    assert plans, "the policy did not split K here"
    return plans[0]


# DeepSeek-V3 q_a (N 1536, K 7168) at 72 / 104 tokens: 128x64 tiles in 4 K ranges; kv_a (N 576) at
# 512 tokens: 128x64 in 3 ranges, a larger workspace (the buffer grows)
SHAPES = [(72, 1536, 7168), (104, 1536, 7168), (512, 576, 7168)]


def test_policy_split_calls_share_one_buffer():
    words = []
    for m, n, k in SHAPES:
        a, b = _ops(m, n, k, seed=m)
        out = cutegemm.gemm(a, b)
        ref = a.double() @ b.double()
        assert_within_torch_error(out, a @ b, ref, what=f"{m}x{n}x{k}")
        plan = _split_plan(a, b)
        words.append(plan.workspace.numel())
        for _ in range(3):
            assert torch.equal(cutegemm.gemm(a, b), out), f"{m}x{n}x{k}: another call, other bits"
        torch.cuda.synchronize()
        assert not plan.workspace[: plan.ws_stream[2]].any(), "a launch left a tile counter off 0"
    assert launch.split_buffer_bytes() <= 2 * 4 * 2 * max(words) + 4 * sum(words)


def test_fp8_row_wise_split_call():
    m, n, k = 100, 1536, 7168
    a, b = _ops(m, n, k, F8, seed=3)
    sa = torch.rand(m, 1, device="cuda") + 0.5
    sb = torch.rand(1, n, device="cuda") + 0.5
    out = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
    _split_plan(a, b)
    ref = (a.double() @ b.double()) * sa.double() * sb.double()
    same = ((a.float() @ b.float()) * sa * sb).to(out.dtype)
    assert_within_torch_error(out, same, ref, what="fp8 split")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # the warm FP8 path on another stream: that stream's buffer
        again = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(again, out)


def test_one_plan_on_two_streams_at_once():
    """The same split plan enqueued on two streams alternately, never synchronized in between:
    each launch uses its stream's buffer, so every result has its sequential bits."""
    m, n, k = 72, 1536, 7168
    a1, b = _ops(m, n, k, seed=11)
    a2, _ = _ops(m, n, k, seed=12)
    want1, want2 = cutegemm.gemm(a1, b), cutegemm.gemm(a2, b)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    for s in (s1, s2):
        s.wait_stream(torch.cuda.current_stream())
    outs1, outs2 = [], []
    for _ in range(20):
        with torch.cuda.stream(s1):
            outs1.append(cutegemm.gemm(a1, b))
        with torch.cuda.stream(s2):
            outs2.append(cutegemm.gemm(a2, b))
    torch.cuda.synchronize()
    assert all(torch.equal(o, want1) for o in outs1) and all(torch.equal(o, want2) for o in outs2)


def test_graph_replay_after_the_buffer_grew():
    m, n, k = 72, 1536, 7168
    x, b = _ops(m, n, k, seed=21)
    out = cutegemm.gemm(x, b)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            cutegemm.gemm(x, b, out=out)
        # a split call with more tiles and ranges on the capture stream grows its buffer after the
        # capture (64 tiles of 128x64 in 4 ranges: more counters and slots than the 24-tile plan's)
        retired = len(launch._SPLIT_RETIRED)
        big_a, big_b = _ops(96, 4096, 7168, seed=22)
        cfg = GemmConfig(arch="sm_90a", a_dtype="bf16", b_dtype="bf16", out_dtype="bf16", a_major="k", b_major="k",
                         tile_m=128, tile_n=64, split_k=4, raster="n", group=1)  # fmt: skip
        big = cutegemm.gemm(big_a, big_b, config=cfg)
        assert len(launch._SPLIT_RETIRED) > retired, "the capture stream's buffer did not grow"
    torch.cuda.current_stream().wait_stream(s)
    assert_within_torch_error(big, big_a @ big_b, big_a.double() @ big_b.double(), what="the larger split call")
    for i in range(10):
        x.copy_(_ops(m, n, k, seed=100 + i)[0])
        g.replay()
        eager = cutegemm.gemm(x, b)
        torch.cuda.synchronize()
        assert torch.equal(out, eager), f"replay {i}"


def test_weight_only_graph_replay_after_the_buffer_grew():
    """The MXFP8-weight kernel's split grid takes its counters and slots from the same per-stream
    buffer: a graph captured with a weight-only split call (the stream's buffer made before the
    capture, in the allocator's common pool) replays with the same bits as eager calls after a
    larger call moved that stream to a new buffer and fresh NaN-filled allocations took the freed
    memory (the outgrown buffer stays allocated)."""
    from cutegemm.blockscaled.weight_only import launch as weight_only

    g = torch.Generator(device="cuda").manual_seed(31)
    qw = cutegemm.quantize(torch.randn(1024, 256, generator=g, device="cuda"), "mxfp8")
    x = torch.randn(16, 256, generator=g, device="cuda").to(BF16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = cutegemm.gemm(x, qw)  # the plan, and stream s's buffer, before the capture
        assert weight_only._PLANS[weight_only._plan_key(x, qw, None, BF16)].split is not None, "no split grid"
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s):
            cutegemm.gemm(x, qw, out=out)
        retired = len(launch._SPLIT_RETIRED)
        big_x = torch.randn(512, 256, generator=g, device="cuda").to(BF16)
        big = cutegemm.gemm(big_x, qw)  # more slots: stream s moves to a larger buffer
        assert len(launch._SPLIT_RETIRED) > retired, "stream s's buffer did not grow"
    torch.cuda.current_stream().wait_stream(s)
    junk = [torch.full((1 << 20,), float("nan"), device="cuda") for _ in range(64)]  # reuse of freed memory
    w = cutegemm.dequantize(qw, torch.float32)
    assert_within_torch_error(big, (big_x.float() @ w.t()).to(BF16), big_x.double() @ w.double().t(), what="big")
    for i in range(5):
        x.copy_(torch.randn(16, 256, generator=g, device="cuda").to(BF16))
        graph.replay()
        eager = cutegemm.gemm(x, qw)
        torch.cuda.synchronize()
        assert torch.equal(out, eager), f"replay {i}"
    del junk
