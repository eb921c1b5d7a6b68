"""GPU: the one-launch MoE dispatch sort (cutegemm.epilogue.dispatch) against its torch twin.

Every output must equal ``dispatch_ref``'s exactly (the stable sort: order, rows, experts of the
rows, offs, the inverse), over random routings (ids outside [0, E) included, int32 and int64 ids, up to
MAX_PAIRS pairs and MAX_EXPERTS experts), on memory poisoned before the call, the same bits on a
second call; ``moe.dispatch`` with ``ops.DISPATCH_KERNEL`` on equals it off (these passed on an
H100 before ``ops.DISPATCH_KERNEL`` was turned on).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cutegemm import moe, ops
from cutegemm.epilogue import dispatch as D

pytestmark = pytest.mark.gpu


def _poison_allocator(n: int):
    """Fill memory the caching allocator hands out next with -7 (int32), so an output element the
    kernel never writes cannot equal the reference by accident."""
    junk = [torch.full((max(n, 1024),), -7, dtype=torch.int32, device="cuda") for _ in range(8)]
    del junk


def _check(ids, k, experts):
    assert D.kernel_takes(ids, experts)
    _poison_allocator(ids.numel())
    got = D.dispatch_cuda(ids, k, experts)
    want = D.dispatch_ref(ids, k, experts)
    for name, g, w in zip(("order", "rows", "experts", "offs", "inverse"), got, want, strict=True):
        assert g.dtype == torch.int32 and torch.equal(g, w), name
    again = D.dispatch_cuda(ids, k, experts)
    assert all(torch.equal(a, b) for a, b in zip(got, again, strict=True)), "not deterministic"


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("tokens,k,experts", [(64, 8, 128), (1, 1, 1), (7, 2, 8), (1024, 8, 256), (128, 8, 1023),
                                              (3, 4, 40), (4096, 2, 64)])  # fmt: skip
def test_kernel_equals_torch(tokens, k, experts, dtype):
    g = torch.Generator(device="cuda").manual_seed(tokens * k + experts)
    ids = torch.randint(0, experts, (tokens * k,), generator=g, device="cuda").to(dtype)
    _check(ids, k, experts)


def test_sentinels_skew_and_empty():
    """Ids outside [0, E) sort last and count in no expert; every pair on one expert; no pairs."""
    ids = torch.tensor([5, -1, 2, 9, 2, 0, 5, 5], device="cuda")
    _check(ids, 2, 6)
    _check(torch.full((8 * 300,), 3, device="cuda"), 8, 16)
    # int64 ids past 2**31 are outside too (not wrapped into [0, E) by a narrowing)
    _check(torch.tensor([2**32 + 3, 3, -(2**32) + 1, 2**31, 1, 0], device="cuda"), 3, 6)
    order, rows, experts, offs, inverse = D.dispatch_cuda(torch.empty(0, dtype=torch.int64, device="cuda"), 8, 5)
    assert order.numel() == rows.numel() == experts.numel() == inverse.numel() == 0 and offs.tolist() == [0] * 5


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(experts=st.integers(1, D.MAX_EXPERTS), k=st.integers(1, 8), tokens=st.integers(0, 1024),
       spill=st.integers(0, 3), int32=st.booleans(), seed=st.integers(0, 2**16))  # fmt: skip
def test_kernel_hypothesis(experts, k, tokens, spill, int32, seed):
    tokens = min(tokens, D.MAX_PAIRS // k)
    if tokens == 0:
        return
    g = torch.Generator(device="cuda").manual_seed(seed)
    ids = torch.randint(-spill, experts + spill, (tokens * k,), generator=g, device="cuda")
    _check(ids.to(torch.int32) if int32 else ids, k, experts)


def test_moe_dispatch_kernel_route_equals_torch(monkeypatch):
    top = torch.randint(0, 128, (64, 8), device="cuda")
    off = moe.dispatch(top, 128)
    monkeypatch.setattr(ops, "DISPATCH_KERNEL", True)
    on = moe.dispatch(top, 128)
    assert all(torch.equal(a, b) for a, b in zip(on, off, strict=True))
    big = torch.randint(0, 8, (D.MAX_PAIRS // 2 + 1, 2), device="cuda")  # past MAX_PAIRS: torch
    assert not D.kernel_takes(big.reshape(-1), 8)
    assert all(torch.equal(a, b) for a, b in zip(moe.dispatch(big, 8), D.dispatch_ref(big.reshape(-1), 2, 8),
                                                  strict=True))  # fmt: skip
