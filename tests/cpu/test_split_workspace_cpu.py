"""Split-K workspaces (cutegemm.gemm.launch.split_workspace): the dense plans that split K share
one zeroed buffer per (device, stream), so a process that sees many token counts holds one
buffer's worth, not a workspace per plan; a plan called on another stream moves to that stream's
buffer. CPU, through the fast-path harness (tests/host_overhead_cpu.py: the compiled kernel is a
no-op that records its arguments)."""

import pytest
import torch

import cutegemm
from cutegemm.gemm import dense, launch
from cutegemm.gemm.args import KernelArgs

from ..host_overhead_cpu import cpu_fast_path

WS = KernelArgs._fields.index("workspace")


@pytest.fixture
def kernel(monkeypatch):
    monkeypatch.setattr(launch, "_SPLIT_BUFFERS", {})
    monkeypatch.setattr(launch, "_SPLIT_RETIRED", [])
    with cpu_fast_path() as k:
        yield k


def split_plans():
    return [p for p in dense.PLANS.values() if p.ws_stream is not None]


def storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_plans_of_many_token_counts_share_one_buffer(kernel):
    """DeepSeek-V3 q_a (N 1536, K 7168) at 65..128 tokens: the policy splits K in 128x64 tiles;
    every plan's workspace is a zeroed prefix of one buffer, which holds at most twice the largest
    plan's words (it doubles when a plan needs more)."""
    b = torch.randn(1536, 7168, dtype=torch.bfloat16).t()
    need = []
    for m in range(65, 129, 9):
        cutegemm.gemm(torch.randn(m, 7168, dtype=torch.bfloat16), b)
        ws = kernel.args[WS]
        assert isinstance(ws, torch.Tensor) and ws.dtype == torch.int32 and not ws.any()
        need.append(ws.numel())
    plans = split_plans()
    assert len(plans) == len(need) > 1
    assert len({storage(p.workspace) for p in plans}) <= len(launch._SPLIT_RETIRED) + 1
    current = launch._SPLIT_BUFFERS[(torch.device("cpu"), 0)]
    assert current.numel() >= max(need) and current.numel() <= 2 * max(need)
    assert launch.split_buffer_bytes() <= 4 * 4 * max(need)  # the current buffer and the ones it doubled from
    # every plan's view lies inside a live buffer
    live = [current, *launch._SPLIT_RETIRED]
    for p in plans:
        assert any(storage(p.workspace) == storage(buf) and p.workspace.numel() <= buf.numel() for buf in live)


@pytest.mark.parametrize("fp8", [False, True])
def test_a_plan_follows_the_launch_stream(kernel, monkeypatch, fp8):
    """A split plan called on another stream launches with that stream's buffer (the argument
    tails are rebuilt, the FP8 row-wise one too), and back on the first stream with the first's."""
    dt = torch.float8_e4m3fn if fp8 else torch.bfloat16
    a = torch.randn(100, 7168).to(dt)
    b = torch.randn(1536, 7168).to(dt).t()
    kw = dict(scale_a=torch.ones(100, 1), scale_b=torch.ones(1, 1536)) if fp8 else {}
    cutegemm.gemm(a, b, **kw)
    (plan,) = split_plans()
    first = kernel.args[WS]
    cutegemm.gemm(a, b, **kw)  # warm, same stream: the same buffer
    assert storage(kernel.args[WS]) == storage(first)
    monkeypatch.setattr(launch, "stream_of", lambda device: 5)
    cutegemm.gemm(a, b, **kw)
    moved = kernel.args[WS]
    assert storage(moved) != storage(first) and moved.numel() == first.numel() and not moved.any()
    assert plan.ws_stream == (torch.device("cpu"), 5)
    assert storage(launch._SPLIT_BUFFERS[(torch.device("cpu"), 5)]) == storage(moved)
    monkeypatch.setattr(launch, "stream_of", lambda device: 0)
    cutegemm.gemm(a, b, **kw)
    assert storage(kernel.args[WS]) == storage(first) and plan.ws_stream == (torch.device("cpu"), 0)


def test_unsplit_and_cluster_split_plans_take_no_buffer(kernel):
    """Unsplit calls, and K ranges that meet in shared memory (split_cluster: 64x64 tiles at 16
    tokens), allocate no split buffer."""
    cutegemm.gemm(torch.randn(256, 512, dtype=torch.bfloat16), torch.randn(512, 1024, dtype=torch.bfloat16))
    cutegemm.gemm(torch.randn(16, 7168, dtype=torch.bfloat16), torch.randn(7168, 2048, dtype=torch.bfloat16))
    assert any(p.config.split_cluster for p in dense.PLANS.values())
    assert not split_plans() and launch.split_buffer_bytes() == 0


def test_growth_keeps_the_smaller_buffer():
    """A plan that needs more words than the stream's buffer gets a new, zeroed one of twice the
    size; the old one stays allocated (plans and captured graphs may point into it)."""
    saved = launch._SPLIT_BUFFERS, launch._SPLIT_RETIRED
    launch._SPLIT_BUFFERS, launch._SPLIT_RETIRED = {}, []
    try:
        small, s = launch.split_workspace("cpu", 100)
        same, _ = launch.split_workspace("cpu", 60)
        assert s == 0 and storage(same) == storage(small)
        big, _ = launch.split_workspace("cpu", 150)
        assert storage(big) != storage(small) and launch._SPLIT_RETIRED[0].numel() == 100
        assert launch._SPLIT_BUFFERS[(torch.device("cpu"), 0)].numel() == 200 and not big.any()
    finally:
        launch._SPLIT_BUFFERS, launch._SPLIT_RETIRED = saved
