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


def _zone_and_buffer(stream=0):
    return launch._SPLIT_BUFFERS[(torch.device("cpu"), stream)]


def test_plans_of_many_token_counts_share_one_buffer(kernel):
    """DeepSeek-V3 q_a (N 1536, K 7168) at 65..128 tokens, then kv_a (N 576) at 512: the policy
    splits K; every plan's workspace is a zeroed view of one live buffer, its counters in the
    buffer's counter zone and its slots past it, and the buffers hold at most twice the largest
    need plus the smaller steps."""
    need = []
    for m, n in [*((m, 1536) for m in range(65, 129, 9)), (512, 576)]:
        cutegemm.gemm(torch.randn(m, 7168, dtype=torch.bfloat16), torch.randn(n, 7168, dtype=torch.bfloat16).t())
        ws = kernel.args[WS]
        assert isinstance(ws, torch.Tensor) and ws.dtype == torch.int32 and not ws.any()
        need.append(ws.numel())
    plans = split_plans()
    assert len(plans) == len(need) > 2
    assert len({storage(p.workspace) for p in plans}) <= len(launch._SPLIT_RETIRED) + 1 < len(plans)
    zone, current = _zone_and_buffer()
    assert launch.split_buffer_bytes() <= 4 * 4 * max(need)
    live = {storage(buf): buf for buf in (current, *launch._SPLIT_RETIRED)}
    zones = {storage(current): zone}
    for p in plans:
        buf = live[storage(p.workspace)]
        counters = p.ws_stream[2]
        end = p.workspace.storage_offset() + counters  # where its counters end and its slots start
        assert p.workspace.storage_offset() + p.workspace.numel() <= buf.numel()
        assert zones.setdefault(storage(buf), end) == end, "plans of one buffer disagree on its counter zone"


def test_stale_slots_never_reach_another_plans_counters(kernel):
    """A launch leaves its counters at zero but its slots full of partial sums. With the slot zone
    of every buffer filled with garbage (what earlier launches leave), every plan's counters still
    read zero, whichever plan ran last and however many tiles it had."""
    for m, n in ((72, 1536), (104, 1536), (512, 576), (100, 576)):
        cutegemm.gemm(torch.randn(m, 7168, dtype=torch.bfloat16), torch.randn(n, 7168, dtype=torch.bfloat16).t())
    plans = split_plans()
    assert len({p.ws_stream[2] for p in plans}) > 1  # plans of different counter counts
    for p in plans:  # each launch leaves its slots full of partial sums (fp32 1.0 here)
        p.workspace[p.ws_stream[2]:] = 0x3F800000
    for p in plans:
        counters = p.ws_stream[2]
        assert not p.workspace[:counters].any(), f"{p.config.name}: its counters overlap another plan's slots"
        assert p.workspace.numel() - counters >= p.config.split_k * p.config.tile_m * p.config.tile_n


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
    assert plan.ws_stream[:2] == (torch.device("cpu"), 5)
    assert storage(_zone_and_buffer(5)[1]) == storage(moved)
    monkeypatch.setattr(launch, "stream_of", lambda device: 0)
    cutegemm.gemm(a, b, **kw)
    assert storage(kernel.args[WS]) == storage(first) and plan.ws_stream[:2] == (torch.device("cpu"), 0)


def test_unsplit_and_cluster_split_plans_take_no_buffer(kernel):
    """Unsplit calls, and K ranges that meet in shared memory (split_cluster: 64x64 tiles at 16
    tokens), allocate no split buffer."""
    cutegemm.gemm(torch.randn(256, 512, dtype=torch.bfloat16), torch.randn(512, 1024, dtype=torch.bfloat16))
    cutegemm.gemm(torch.randn(16, 7168, dtype=torch.bfloat16), torch.randn(7168, 2048, dtype=torch.bfloat16))
    assert any(p.config.split_cluster for p in dense.PLANS.values())
    assert not split_plans() and launch.split_buffer_bytes() == 0


def test_growth_keeps_the_smaller_buffer():
    """A plan whose counters or slots do not fit gets a new, zeroed buffer of twice its need (the
    counter zone and the slot zone alike); the old one stays allocated (plans and captured graphs
    may point into it). A view's counters end where the counter zone does."""
    saved = launch._SPLIT_BUFFERS, launch._SPLIT_RETIRED
    launch._SPLIT_BUFFERS, launch._SPLIT_RETIRED = {}, []
    try:
        small, s = launch.split_workspace("cpu", 8, 100)
        zone, buf = _zone_and_buffer()
        assert s == 0 and (zone, buf.numel()) == (16, 216) and small.storage_offset() == 8 and small.numel() == 108
        same, _ = launch.split_workspace("cpu", 4, 150)
        assert storage(same) == storage(small) and same.storage_offset() == 12
        big, _ = launch.split_workspace("cpu", 20, 50)  # more counters than the zone holds
        zone, buf = _zone_and_buffer()
        assert storage(big) != storage(small) and launch._SPLIT_RETIRED[0].numel() == 216
        assert (zone, buf.numel()) == (40, 240) and big.storage_offset() == 20 and not big.any()
    finally:
        launch._SPLIT_BUFFERS, launch._SPLIT_RETIRED = saved


def test_weight_only_workspace_is_a_view_of_the_shared_buffer(monkeypatch):
    """The FP4 / MXFP8-weight kernel's split grid and cut tail take their counters and slots from
    the same per-(device, stream) buffer as the dense split-K plans: counters rounded up to 16
    bytes (the first slot word), zero, ahead of the slots; a larger need moves to a new buffer and
    keeps the outgrown one alive (a captured graph may still point into it)."""
    from cutegemm.blockscaled.weight_only import launch as weight_only

    monkeypatch.setattr(launch, "_SPLIT_BUFFERS", {})
    monkeypatch.setattr(launch, "_SPLIT_RETIRED", [])
    cpu = torch.device("cpu")
    ws, slot0, stream = weight_only._workspace(cpu, 5, 1000)
    assert (slot0, stream) == (8, 0) and ws.dtype == torch.int32 and ws.numel() == 8 + 1000 and not ws.any()
    zone, buf = _zone_and_buffer()
    assert storage(ws) == storage(buf) and ws.storage_offset() + slot0 == zone  # counters end where the zone does
    ws.fill_(7)  # slots written by a launch: the counter zone of the next view is still zero
    ws[:slot0] = 0
    again, slot0, _ = weight_only._workspace(cpu, 3, 500)
    assert slot0 == 4 and storage(again) == storage(buf) and not again[:slot0].any()
    big, slot0, _ = weight_only._workspace(cpu, 40, 10**5)
    assert storage(big) != storage(buf) and launch._SPLIT_RETIRED[-1] is buf and not big[:slot0].any()
