"""CPU: the MoE dispatch sort (cutegemm.epilogue.dispatch, moe.dispatch).

- ``dispatch_ref`` (the torch route) against a plain Python sort, over random routings with ids
  outside [0, E);
- a step-by-step model of the one-warp kernel (32 lanes per step, the match groups, the leaders'
  adds, the 32-counter scan with shuffle-up, the ranks) against ``dispatch_ref``: the kernel's
  algorithm gives the stable sort;
- every kernel variant compiles for sm_90a and sm_100a with its SASS markers;
- ``moe.dispatch``'s argument rules and routes (``ops.DISPATCH_KERNEL``; the custom op's CPU body
  and fake kernel: opcheck).
The kernel itself against ``dispatch_ref`` on a GPU: tests/gpu/test_dispatch_gpu.py."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cutegemm import moe, ops
from cutegemm.epilogue import dispatch as D


def oracle(ids, k, experts):
    """The four outputs by a Python sort of (bucket, pair index)."""
    bucket = [e if 0 <= e < experts else experts for e in ids.tolist()]
    order = sorted(range(len(bucket)), key=lambda i: (bucket[i], i))
    offs, total = [], 0
    for e in range(experts):
        total += bucket.count(e)
        offs.append(total)
    inverse = [0] * len(order)
    for r, p in enumerate(order):
        inverse[p] = r
    return order, [i // k for i in order], [bucket[i] for i in order], offs, inverse


routings = st.integers(1, 40).flatmap(lambda e: st.tuples(
    st.just(e), st.integers(1, 8), st.lists(st.integers(-3, e + 3), max_size=300)))  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(routing=routings, dtype=st.sampled_from([torch.int32, torch.int64]))
def test_dispatch_ref_is_the_stable_sort(routing, dtype):
    experts, k, ids = routing
    ids = ids[: len(ids) // k * k]
    got = D.dispatch_ref(torch.tensor(ids, dtype=dtype), k, experts)
    assert all(t.dtype == torch.int32 for t in got)
    assert [t.tolist() for t in got] == list(oracle(torch.tensor(ids, dtype=dtype), k, experts))


@pytest.mark.parametrize("experts,key", [(255, torch.uint8), (256, torch.int16), (32766, torch.int16),
                                         (32767, torch.int32), (40000, torch.int32)])  # fmt: skip
def test_dispatch_ref_sorts_narrow_keys(monkeypatch, experts, key):
    """The argsort's keys: the narrowest integers holding 0..E (one radix pass per byte on CUDA),
    the same stable order at each width's edge (ids at 0, E - 1, E and outside)."""
    ids = torch.tensor([experts - 1, 0, experts, -1, experts - 1, 3, experts + 7, 0, 5, experts - 1, 2, 3])
    seen, argsort = [], torch.argsort
    monkeypatch.setattr(torch, "argsort", lambda t, **kw: seen.append(t.dtype) or argsort(t, **kw))
    got = D.dispatch_ref(ids, 2, experts)
    assert seen == [key]
    assert [t.tolist() for t in got] == list(oracle(ids, 2, experts))


def warp_model(ids, k, experts):
    """The kernel's steps in Python: what each of the 32 lanes holds and does, step by step."""
    n = len(ids)
    count = [0] * (experts + 1)

    def bucket(i):
        if i >= n:
            return experts + 1
        e = ids[i]
        return e if 0 <= e < experts else experts

    for base in range(0, n, 32):
        lanes = [bucket(base + lane) for lane in range(32)]
        for lane in range(32):
            peers = [q for q in range(32) if lanes[q] == lanes[lane]]  # match.any
            if base + lane < n and min(peers) == lane:  # no peer below: the leader
                count[lanes[lane]] += len(peers)
    offs = [0] * experts
    carry = 0
    for base in range(0, experts + 1, 32):
        v = [count[base + lane] if base + lane <= experts else 0 for lane in range(32)]
        incl = list(v)
        for d in range(5):  # shfl.up by 1 << d: lanes below the offset keep their value
            up = [incl[lane - (1 << d)] if lane >= (1 << d) else incl[lane] for lane in range(32)]
            incl = [incl[lane] + up[lane] if lane >= (1 << d) else incl[lane] for lane in range(32)]
        for lane in range(32):
            b = base + lane
            if b <= experts:
                count[b] = carry + incl[lane] - v[lane]
            if b < experts:
                offs[b] = carry + incl[lane]
        carry += incl[31]
    order, rows, sorted_ids, inverse = [None] * n, [None] * n, [None] * n, [None] * n
    for base in range(0, n, 32):
        lanes = [bucket(base + lane) for lane in range(32)]
        ranks = [sum(1 for q in range(lane) if lanes[q] == lanes[lane]) for lane in range(32)]
        for lane in range(32):  # every lane reads its expert's next row before any leader moves it
            i = base + lane
            if i < n:
                row = count[lanes[lane]] + ranks[lane]
                order[row], rows[row], sorted_ids[row], inverse[i] = i, i // k, lanes[lane], row
        for lane in range(32):
            if base + lane < n and ranks[lane] == 0:
                count[lanes[lane]] += sum(1 for q in range(32) if lanes[q] == lanes[lane])
    return order, rows, sorted_ids, offs, inverse


@settings(max_examples=120, deadline=None)
@given(routing=routings)
def test_the_kernels_steps_give_the_stable_sort(routing):
    experts, k, ids = routing
    ids = ids[: len(ids) // k * k]
    ref = D.dispatch_ref(torch.tensor(ids), k, experts)
    assert list(warp_model(ids, k, experts)) == [t.tolist() for t in ref]


def test_warp_model_with_many_experts():
    """More than 32 counters (several scan steps) and more than 32 pairs per expert."""
    g = torch.Generator().manual_seed(3)
    for experts in (33, 64, 100, 1023):
        ids = torch.randint(-1, experts + 1, (8 * 97,), generator=g).tolist()
        ref = D.dispatch_ref(torch.tensor(ids), 8, experts)
        assert list(warp_model(ids, 8, experts)) == [t.tolist() for t in ref]


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_every_variant_compiles_with_its_markers(arch):
    for cfg in D.all_configs(arch):
        ok, markers, err = D.check_variant(cfg)
        assert ok, (cfg.name, markers, err)
    with pytest.raises(ValueError):
        D.DispatchConfig(ids="int16")


def test_moe_dispatch_rules_and_routes(monkeypatch):
    top = torch.tensor([[3, 1], [0, 3], [1, 1], [9, 2]])
    want = D.dispatch_ref(top.reshape(-1), 2, 4)
    got = moe.dispatch(top, 4)
    assert isinstance(got, moe.Dispatch) and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert got.offs.tolist() == [1, 4, 5, 7]  # expert 3 ends at 7; the id 9 sorts last
    with pytest.raises(ValueError, match="top_k_index"):
        moe.dispatch(top.reshape(-1), 4)
    with pytest.raises(ValueError, match="top_k_index"):
        moe.dispatch(top.float(), 4)
    monkeypatch.setattr(ops, "DISPATCH_KERNEL", True)  # CPU tensors stay on torch
    assert all(torch.equal(a, b) for a, b in zip(moe.dispatch(top, 4), want, strict=True))


def test_dispatch_op_opcheck():
    """The custom op (the CUDA route with DISPATCH_KERNEL): its CPU body and fake kernel."""
    ids = torch.randint(-1, 7, (24,))
    out = torch.ops.cutegemm.dispatch(ids, 3, 6)
    assert all(torch.equal(a, b) for a, b in zip(out, D.dispatch_ref(ids, 3, 6), strict=True))
    torch.library.opcheck(torch.ops.cutegemm.dispatch.default, (ids, 3, 6))


def test_compile_check_lists_the_dispatch_family(monkeypatch):
    from cutegemm import compile_check

    seen = []
    monkeypatch.setattr(D, "check_variant", lambda cfg: seen.append(cfg) or (True, {}, ""))
    res = compile_check.dispatch_results(["sm_90a", "sm_100a"])
    assert seen == D.all_configs("sm_90a") + D.all_configs("sm_100a") and all(r.ok for r in res)
