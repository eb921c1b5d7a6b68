"""The tail-zeroing kernel (cutegemm.epilogue.zero_tail) without a GPU: it compiles for both archs
with 16-byte stores and no local memory, compile-check lists it, its config is checked, and
``ops.packed_zero_tail``'s eager CUDA route calls the GEMM into an uninitialised output and then
the tail kernel (the memset route where the kernel does not take the output)."""

from __future__ import annotations

import pytest
import torch

from cutegemm import ops
from cutegemm.epilogue import zero_tail as Z


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_compiles_with_16_byte_stores(arch):
    ok, markers, err = Z.check_variant(Z.ZeroTailConfig(arch=arch))
    assert ok, err
    assert markers["STG.128"] > 0 and markers["LDL"] == markers["STL"] == 0


def test_config_rules():
    with pytest.raises(ValueError):
        Z.ZeroTailConfig(arch="sm_80")
    with pytest.raises(ValueError):
        Z.ZeroTailConfig(threads=100)
    assert Z.ZeroTailConfig().name == "zero_tail_t256_sm_90a"


def test_compile_check_lists_the_family(monkeypatch):
    from cutegemm import compile_check

    seen = []
    monkeypatch.setattr(Z, "check_variant", lambda cfg: seen.append(cfg) or (True, {}, ""))
    res = compile_check.zero_tail_results(["sm_90a", "sm_100a"])
    assert seen == Z.all_configs("sm_90a") + Z.all_configs("sm_100a") and all(r.ok for r in res)


def test_kernel_refuses_cpu_tensors():
    assert not Z.kernel_takes(torch.empty(8, 8, dtype=torch.bfloat16), torch.tensor([4], dtype=torch.int32))


@pytest.mark.parametrize("takes", [True, False])
def test_packed_zero_tail_eager_route(monkeypatch, takes):
    """GEMM rows < offs[-1] from the kernel entry, the rest zeroed by the tail kernel (emulated
    here) or by a memset before the GEMM: the result is the same either way, and the tail
    kernel's route never zeroes the whole output."""
    a, b = torch.randn(10, 16), torch.randn(2, 16, 8)
    offs = torch.tensor([3, 7], dtype=torch.int32)
    calls = []

    def gemm(a_, b_, offs, out, alpha):
        calls.append(("gemm", bool(torch.isnan(out).all()) if out.is_floating_point() else None))
        end, start = int(offs[-1]), 0
        for e, stop in enumerate(offs.tolist()):
            out[start:stop] = a_[start:stop] @ b_[e] * alpha
            start = stop
        assert end <= out.shape[0]
        return out

    def tail(out, offs):
        calls.append(("tail",))
        out[int(offs[-1]):] = 0
        return out

    real_empty = torch.empty
    monkeypatch.setattr(ops, "eager_cuda", lambda t: True)
    monkeypatch.setattr(ops, "zero_tail_takes", lambda out, offs: takes)
    monkeypatch.setattr(ops, "zero_tail_cuda", tail)
    monkeypatch.setattr(ops, "_grouped_kernel", gemm)
    monkeypatch.setattr(torch, "empty", lambda *s, **kw: real_empty(*s, **kw).fill_(float("nan")))
    with torch.no_grad():
        out = ops.packed_zero_tail(a, b, offs, alpha=2.0)
    ref = torch.cat((a[:3] @ b[0], a[3:7] @ b[1], torch.zeros(3, 8))) * 2.0
    torch.testing.assert_close(out, ref)
    assert calls == ([("gemm", True), ("tail",)] if takes else [("gemm", False)])
