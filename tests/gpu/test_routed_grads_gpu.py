"""The routed MoE backward's one-pass kernel (cutegemm.epilogue.routed_grads) on the GPU, against
ops.routed_gated_grads' torch formulas in fp32 (the same math) and fp64: w H and dZ within two
steps of the operands' dtype everywhere, the dots within fp32 summation error, bitwise equal on a
second call; both gate layouts, bf16 and fp16, row lengths whose chunks do not fill a lane's
steps, rows that do not fill the last CTA; NaN-poisoned neighbours untouched (outputs are fresh
tensors, so the check is on the values)."""

from __future__ import annotations

import pytest
import torch

from cutegemm import ops
from cutegemm.epilogue.routed_grads import kernel_takes, routed_grads_cuda

pytestmark = pytest.mark.gpu


def _within_steps(ours, ref, what, steps=2):
    assert ours.dtype == ref.dtype and ours.shape == ref.shape, what
    step = torch.finfo(ref.dtype).eps * ref.float().abs().clamp(min=torch.finfo(ref.dtype).tiny)
    off = (ours.float() - ref.float()).abs()
    assert (off <= steps * step + 1e-30).all(), f"{what}: {int((off > steps * step).sum())} elements off"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["interleaved", "halves"])
@pytest.mark.parametrize("rows,inter", [(1, 8), (13, 24), (1031, 768), (4099, 1024), (70, 2056)])
def test_kernel_against_torch_formulas(dtype, layout, rows, inter):
    g = torch.Generator(device="cuda").manual_seed(rows + inter)
    z = (torch.randn(rows, 2 * inter, device="cuda", generator=g) * 2).to(dtype)
    dhp = torch.randn(rows, inter, device="cuda", generator=g).to(dtype)
    w = torch.rand(rows, device="cuda", generator=g)
    assert kernel_takes(dhp, z, w)
    wh, dz, dots = routed_grads_cuda(dhp, z, w, layout)
    twh, tdz, tdots = ops._routed_grads_torch("swiglu", dhp, z, w, layout)
    _within_steps(wh, twh, "wH")
    _within_steps(dz, tdz, "dZ")
    d64 = ops._routed_grads_torch("swiglu", dhp.double(), z.double(), w.double(), layout)[2]
    tol = 1e-5 * (dhp.double().abs() * ops._routed_grads_torch("swiglu", torch.ones_like(dhp).double(), z.double(),
                                                                torch.ones_like(w).double(), layout)[0].abs()).sum(-1)
    assert ((dots.double() - d64).abs() <= tol + 1e-6).all(), "dots"
    again = routed_grads_cuda(dhp, z, w, layout)
    assert all(torch.equal(a, b) for a, b in zip((wh, dz, dots), again, strict=True)), "not bitwise reproducible"


def test_zero_weight_rows_and_nonfinite_inputs_stay_in_their_rows():
    """A zero routing weight gives zero w H and dZ in its row; a NaN in one row's Z reaches only
    that row's outputs and dot."""
    z = torch.randn(64, 512, device="cuda").bfloat16()
    dhp = torch.randn(64, 256, device="cuda").bfloat16()
    w = torch.rand(64, device="cuda")
    w[5] = 0.0
    z[9, 17] = float("nan")
    wh, dz, dots = routed_grads_cuda(dhp, z, w, "interleaved")
    assert (wh[5] == 0).all() and (dz[5] == 0).all()
    bad = torch.zeros(64, dtype=torch.bool, device="cuda")
    bad[9] = True
    assert torch.isfinite(wh[~bad]).all() and torch.isfinite(dz[~bad]).all() and torch.isfinite(dots[~bad]).all()
    assert torch.isnan(dots[9])
