"""GPU: the block-scaled -> bf16 / fp32 dequantize kernel and the sm_90a MXFP8 GEMM's dequantize-first path.

The kernel must equal ``dequantize_ref(q).to(bf16)`` (fp32 variant: ``dequantize_ref(q)``) bit for bit (random values over a wide
range of scales, zero / NaN blocks, batches, K tail blocks) and write nothing past its output.
The routed GEMM (compute-bound shapes, ``sm90_mx.dequantize_first``) must equal our bf16 GEMM of
the reference-dequantized operands bit for bit (same kernel, same inputs), and stay within 2x
torch's error of the float64 product.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cutegemm
from cutegemm.blockscaled import dequant
from cutegemm.blockscaled.mx_sm90 import dequantize_first
from cutegemm.blockscaled.reference import dequantize_ref

from ..gemm_check import assert_outside_untouched, assert_within_torch_error, poisoned_out

pytestmark = pytest.mark.gpu


def _wide(lead, rows, k, seed, spread=100):
    """randn times 2**e, e drawn per (row, 32-K block) in [-spread, spread)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(*lead, rows, k, generator=g, device="cuda")
    e = torch.randint(-spread, spread, (*lead, rows, -(-k // 32)), generator=g, device="cuda").float()
    return x * torch.exp2(e).repeat_interleave(32, dim=-1)[..., :k]


def _check_kernel(q):
    n = q.shape.numel()  # elements (FP4 data holds two per byte)
    buf = torch.full((n + 64,), -1, dtype=torch.int16, device="cuda")  # 0xFFFF: a NaN bf16 pattern
    out = buf[:n].view(torch.bfloat16).view(q.shape)
    res = dequant.dequantize_bf16(q, out=out)
    assert res is out
    ref = dequantize_ref(q).to(torch.bfloat16)
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16))
    assert (buf[n:] == -1).all(), "written past the output"
    assert torch.equal(dequant.dequantize_bf16(q).view(torch.int16), out.view(torch.int16))  # allocating form
    # the fp32 variant: dequantize_ref's values bit for bit (NaN where it has NaN), nothing past the end
    buf32 = torch.full((n + 64,), -1, dtype=torch.int32, device="cuda")  # 0xFFFFFFFF: a NaN pattern
    out32 = buf32[:n].view(torch.float32).view(q.shape)
    assert dequant.dequantize_checked(q, out32) is out32
    ref32 = dequantize_ref(q)
    nan = torch.isnan(ref32)
    assert torch.equal(torch.isnan(out32), nan)
    assert torch.equal(out32.view(torch.int32)[~nan], ref32.view(torch.int32)[~nan])
    assert (buf32[n:] == -1).all(), "fp32: written past the output"


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp8_e5m2", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("shape", [(300, 4096), (3, 129, 48), (1, 16), (257, 2064)])
def test_kernel_equals_reference_bitwise(fmt, shape):
    x = _wide(shape[:-2], shape[-2], shape[-1], seed=sum(shape))
    x[..., 0, :16] = 0.0
    if shape[-2] > 3:
        x[..., 2, :] = float("nan")
    _check_kernel(cutegemm.quantize(x, fmt))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.integers(1, 700), k16=st.integers(1, 40), batch=st.sampled_from([None, 2]),
       fmt=st.sampled_from(["mxfp8", "mxfp8_e5m2", "mxfp4", "nvfp4"]))  # fmt: skip
def test_kernel_hypothesis(rows, k16, batch, fmt):
    lead = () if batch is None else (batch,)
    _check_kernel(cutegemm.quantize(_wide(lead, rows, 16 * k16, seed=rows * k16), fmt))


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("shape", [(300, 4096), (2, 17, 48), (5, 40)])
def test_public_dequantize_out_dtypes(fmt, shape):
    """``cutegemm.dequantize(q, out_dtype)``: bf16 is the reference's cast bit for bit, fp32 the
    reference, fp16 its cast (the kernel where it takes q; K = 40 is not a multiple of 16: torch)."""
    q = cutegemm.quantize(_wide(shape[:-2], shape[-2], shape[-1], seed=7), fmt)
    ref = dequantize_ref(q)
    assert dequant.dequantizable(q) == (shape[-1] % 16 == 0)
    bf = cutegemm.dequantize(q, torch.bfloat16)
    assert bf.dtype == torch.bfloat16 and bf.shape == q.shape
    assert torch.equal(bf.view(torch.int16), ref.to(torch.bfloat16).view(torch.int16))
    assert torch.equal(cutegemm.dequantize(q), ref)
    assert torch.equal(cutegemm.dequantize(q, torch.float16), ref.to(torch.float16))


def _sm90():
    return torch.cuda.get_device_capability()[0] == 9


# (2-D MXFP8 x MXFP8 calls take the MXFP8-weight path, dequantize-first from dq_min_rows("mxfp8")
# rows: m is counted from there; batched calls dequantize first from 16 rows)
@pytest.mark.parametrize("m,n,k,batch", [(76, 520, 768, None), (0, 4096, 2048, None), (300, 264, 512, 3)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_routed_gemm_equals_bf16_gemm_of_dequantized(m, n, k, batch, out_dtype):
    if not _sm90():
        pytest.skip("the dequantize-first MXFP8 path is sm_90a's")
    if batch is None:
        from cutegemm.blockscaled.weight_only.launch import dq_min_rows

        m += dq_min_rows("mxfp8", False, "sm_90a")
    lead = () if batch is None else (batch,)
    qa = cutegemm.quantize(_wide(lead, m, k, 1, spread=12) * 1e-3, "mxfp8")
    qb = cutegemm.quantize(_wide(lead, n, k, 2, spread=12), "mxfp8")
    assert dequantize_first(m, n, qa, qb)
    buf, out = poisoned_out((*lead, m, n), out_dtype)
    res = cutegemm.gemm(qa, qb, out=out, alpha=0.5)
    assert res is out
    assert_outside_untouched(buf, m, n)
    a16, b16 = dequantize_ref(qa).to(torch.bfloat16), dequantize_ref(qb).to(torch.bfloat16)
    same = cutegemm.gemm(a16, b16.mT, out_dtype=out_dtype, alpha=0.5)
    assert torch.equal(out, same)
    ref = (dequantize_ref(qa).double() @ dequantize_ref(qb).double().mT) * 0.5
    torch_base = ((a16 @ b16.mT).double() * 0.5).to(out_dtype)
    if out_dtype == torch.bfloat16:
        assert_within_torch_error(out, torch_base, ref, what=f"mxfp8 dequantize-first {m}x{n}x{k}")


def test_routed_grouped_equals_bf16_grouped_of_dequantized():
    if not _sm90():
        pytest.skip("the dequantize-first MXFP8 path is sm_90a's")
    counts = [300, 0, 257, 512, 1, 400]
    E, n, k = len(counts), 520, 768
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    qa = cutegemm.quantize(_wide((), sum(counts), k, 3, spread=12), "mxfp8")
    qw = cutegemm.quantize(_wide((E,), n, k, 4, spread=12), "mxfp8")
    assert dequantize_first(sum(counts) // E, n, qa, qw)
    buf, out = poisoned_out((sum(counts) + 5, n), torch.bfloat16)
    out = out[: sum(counts)]
    cutegemm.grouped_gemm(qa, qw, offs=offs, out=out)
    a16, w16 = dequantize_ref(qa).to(torch.bfloat16), dequantize_ref(qw).to(torch.bfloat16)
    same = cutegemm.grouped_gemm(a16, w16.transpose(1, 2), offs=offs)
    assert torch.equal(out, same)
    assert torch.isnan(buf[sum(counts):, :]).all(), "rows past offs[-1] written"
    assert torch.isnan(buf[:, n:]).all(), "columns right of the output written"
