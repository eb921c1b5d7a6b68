"""tests/cpu/test_host_edges_cpu.py's cases that reach a kernel, on the GPU (sm_90a: FP8; the
16-bit cases on sm_90a and sm_100a), into NaN-poisoned buffers: FP8 with one output column (B
read K-major through a size-1 N mode), gather_index over a weight the gather kernel cannot read
in place, a 3d x 3d call with a 16-bit scale_a, and a BlockScaledTensor with cut-short scales
refused by the kernel paths after warm calls."""

from __future__ import annotations

import pytest
import torch

import cutegemm

pytestmark = pytest.mark.gpu
BF, E4 = torch.bfloat16, torch.float8_e4m3fn


def _major() -> int:
    return torch.cuda.get_device_capability()[0]


@pytest.fixture(autouse=True)
def _gpu():
    if _major() not in (9, 10):
        pytest.skip("sm_90 / sm_100 only")


def _offs(*ends):
    return torch.tensor(ends, dtype=torch.int32, device="cuda")


@pytest.mark.parametrize("form", ["dense_t", "dense_contiguous", "grouped", "3d_x_2d_m1"])
def test_fp8_with_one_column(form):
    if _major() != 9:
        pytest.skip("FP8 runs on sm_90a")
    torch.manual_seed(1)
    one = torch.ones(1, device="cuda")
    if form.startswith("dense"):
        a = torch.randn(40, 256, device="cuda").to(E4)
        w = torch.randn(1, 256, device="cuda").to(E4)
        w = w.t() if form == "dense_t" else w.t().contiguous()
        buf = torch.full((42, 1), float("nan"), dtype=BF, device="cuda")
        cutegemm.gemm(a, w, scale_a=one, scale_b=one, out=buf[:40])
        got, ref, rest = buf[:40], a.double() @ w.double(), buf[40:]
    elif form == "grouped":
        a = torch.randn(70, 256, device="cuda").to(E4)
        w = torch.randn(2, 1, 256, device="cuda").to(E4).transpose(1, 2)
        buf = torch.full((72, 1), float("nan"), dtype=BF, device="cuda")
        cutegemm.grouped_gemm(a, w, offs=_offs(30, 70), scale_a=torch.ones(70, device="cuda"),
                              scale_b=torch.ones(2, 1, device="cuda"), out=buf[:70])  # fmt: skip
        got, rest = buf[:70], buf[70:]
        ref = torch.cat([a[:30].double() @ w[0].double(), a[30:].double() @ w[1].double()])
    else:
        a = torch.randn(2, 1, 256, device="cuda").to(E4)
        w = torch.randn(40, 256, device="cuda").to(E4).t()
        got = cutegemm.grouped_gemm(a, w, offs=_offs(16, 40), scale_a=torch.ones(2, 1, device="cuda"),
                                    scale_b=torch.ones(40, device="cuda"))  # fmt: skip
        ref = torch.cat([a[0].double() @ w[:, :16].double(), a[1].double() @ w[:, 16:].double()], dim=1)
        rest = torch.empty(0)
    assert torch.isnan(rest).all()
    torch.testing.assert_close(got.double(), ref, atol=0.05 * ref.abs().max().item(), rtol=0.02)


@pytest.mark.parametrize("w_layout", ["transposed_n5", "rowmajor_n5", "rowmajor_n12_gated"])
def test_gather_index_over_layouts_the_kernel_cannot_read(w_layout):
    torch.manual_seed(2)
    x = torch.randn(64, 128, device="cuda", dtype=BF)
    idx = torch.randint(0, 64, (100,), device="cuda", dtype=torch.int32)
    offs, act = _offs(40, 100), ("swiglu" if w_layout.endswith("gated") else None)
    n = 12 if act else 5
    w = torch.randn(2, n, 128, device="cuda", dtype=BF)
    w = w.transpose(1, 2) if w_layout.startswith("transposed") else w.transpose(1, 2).contiguous()
    got = cutegemm.grouped_gemm(x, w, offs=offs, gather_index=idx, activation=act)
    ref = cutegemm.grouped_gemm(x[idx.long()], w, offs=offs, activation=act)
    assert torch.equal(got, ref)  # the same route: the packed form on the gathered copy


def test_3d_x_3d_16_bit_scale_a_is_applied():
    torch.manual_seed(3)
    a = torch.randn(3, 100, 64, device="cuda", dtype=BF)
    b = torch.randn(3, 64, 48, device="cuda", dtype=BF)
    sa = torch.rand(3, 100, device="cuda") + 0.5
    got = cutegemm.grouped_gemm(a, b, scale_a=sa)
    ref = torch.bmm(a.double(), b.double()) * sa.double().unsqueeze(-1)
    torch.testing.assert_close(got.double(), ref, atol=0.05, rtol=0.02)


@pytest.mark.parametrize("path", ["weight", "dequantize", "blockscaled"])
def test_edited_block_scaled_tensor_refused_after_warm_calls(path):
    """A BlockScaledTensor whose scales were cut short is refused by the kernel paths, after warm
    calls of the same elements' signature too (sm_90a routes; the MXFP8 x MXFP8 GEMM runs there)."""
    from dataclasses import replace

    if _major() != 9:
        pytest.skip("the sm_90a routes")
    torch.manual_seed(3)
    q = cutegemm.quantize(torch.randn(256, 512, device="cuda", dtype=BF), "mxfp8")
    qa = cutegemm.quantize(torch.randn(16, 512, device="cuda", dtype=BF), "mxfp8")
    x = torch.randn(16, 512, device="cuda", dtype=BF)
    call = {"weight": lambda w: cutegemm.gemm(x, w), "dequantize": lambda w: cutegemm.dequantize(w, BF),
            "blockscaled": lambda w: cutegemm.gemm(qa, w)}[path]  # fmt: skip
    want = call(q)
    torch.testing.assert_close(call(q), want, rtol=0, atol=0)  # warm
    with pytest.raises(ValueError, match=r"\.scales"):
        call(replace(q, scales=q.scales[:-1]))
