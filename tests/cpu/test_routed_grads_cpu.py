"""The routed MoE backward's one-pass kernel (cutegemm.epilogue.routed_grads) without a GPU: every
variant compiles for both archs with 128-bit loads and stores and no local memory, compile-check
lists them; ``ops.routed_gated_grads``' formulas (what the kernel computes, and the route off the
kernels) against fp64 autograd of ``w * swiglu(Z)`` for both gate layouts; the custom op's schema
and fake kernel (opcheck)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cutegemm import ops
from cutegemm.epilogue import routed_grads as R
from cutegemm.epilogue import split_gate_up


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("layout", ["interleaved", "halves"])
def test_compiles_with_128_bit_accesses(arch, layout):
    ok, markers, err = R.check_variant(R.RoutedGradsConfig(layout=layout, arch=arch))
    assert ok, err
    assert markers["LDG.128"] > 0 and markers["STG.128"] > 0 and markers["LDL"] == markers["STL"] == 0


def test_config_rules_and_compile_check_listing(monkeypatch):
    from cutegemm import compile_check

    with pytest.raises(ValueError):
        R.RoutedGradsConfig(layout="stacked")
    seen = []
    monkeypatch.setattr(R, "check_variant", lambda cfg: seen.append(cfg) or (True, {}, ""))
    res = compile_check.routed_results(["sm_90a", "sm_100a"])
    assert seen == R.all_configs("sm_90a") + R.all_configs("sm_100a") and all(r.ok for r in res)
    assert len({c.name for c in seen}) == len(seen) == 8


@pytest.mark.parametrize("layout", ["interleaved", "halves"])
def test_formulas_against_fp64_autograd(layout):
    g = torch.Generator().manual_seed(3)
    rows, inter = 37, 24
    z = torch.randn(rows, 2 * inter, generator=g, dtype=torch.float64)
    dhp = torch.randn(rows, inter, generator=g, dtype=torch.float64)
    w = torch.rand(rows, generator=g, dtype=torch.float64)
    wh, dz, dots = ops.routed_gated_grads("swiglu", dhp, z, w, layout)
    zl = z.clone().requires_grad_()
    gate, up = split_gate_up(zl, layout)
    h = F.silu(gate) * up
    (dz_ref,) = torch.autograd.grad(h, zl, dhp * w.unsqueeze(-1))
    torch.testing.assert_close(wh, h.detach() * w.unsqueeze(-1))
    torch.testing.assert_close(dz, dz_ref)
    torch.testing.assert_close(dots, (dhp * h.detach()).sum(-1))
    # bf16 operands: fp32 math, each output rounded once to bf16
    wh16, dz16, dots16 = ops.routed_gated_grads("swiglu", dhp.bfloat16(), z.bfloat16(), w.float(), layout)
    assert (wh16.dtype, dz16.dtype, dots16.dtype) == (torch.bfloat16, torch.bfloat16, torch.float32)


def test_custom_op_opcheck():
    z = torch.randn(16, 32, dtype=torch.bfloat16)
    dhp = torch.randn(16, 16, dtype=torch.bfloat16)
    w = torch.rand(16)
    torch.library.opcheck(torch.ops.cutegemm.routed_swiglu_grads.default, (dhp, z, w, "interleaved"))


def test_kernel_refuses_cpu_and_bad_operands():
    z, dhp, w = torch.empty(8, 32, dtype=torch.bfloat16), torch.empty(8, 16, dtype=torch.bfloat16), torch.empty(8)
    assert not R.kernel_takes(dhp, z, w)  # CPU
