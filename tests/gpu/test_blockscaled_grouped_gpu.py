"""GPU: the grouped (MoE packed form) block-scaled GEMM, ``grouped_gemm(qa, qb, offs=offs)`` with
MXFP8 / MXFP4 / NVFP4 BlockScaledTensors. sm_100a runs the tcgen05 block-scaled MMA (those tests
run where ``torch.cuda.get_device_capability()[0] == 10``: never run on this project's H200);
sm_90a dequantizes both operands to bf16 and runs the bf16 grouped GEMM (MXFP8 with few rows
per expert: emulated, e4m3 WGMMAs with per-32 promotion).

Reference: the dequantized operands in float64 per expert (``grouped_gemm_ref``); ours within 2x
the error of the same products in fp32 rounded to the output dtype; outputs poisoned (NaN),
rows past offs[-1] must stay NaN."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cutegemm
from cutegemm.blockscaled import dequantize_ref, quantize
from cutegemm.config import Form

from ..gemm_check import assert_within_torch_error

pytestmark = pytest.mark.gpu


def _major():
    return torch.cuda.get_device_capability()[0]


def _operands(counts, n, k, fmt, pad=5, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(counts) + pad
    kw = {"global_scale": 0.3} if fmt == "nvfp4" else {}
    qa = quantize(torch.randn(total, k, generator=g, device="cuda").to(torch.bfloat16), fmt, **kw)
    qb = quantize(torch.randn(len(counts), n, k, generator=g, device="cuda").to(torch.bfloat16), fmt, **kw)
    offs = torch.tensor(counts, dtype=torch.int32, device="cuda").cumsum(0, dtype=torch.int32)
    return qa, qb, offs


def _check(counts, n, k, fmt, seed=0, config=None, out_dtype=torch.bfloat16):
    qa, qb, offs = _operands(counts, n, k, fmt, seed=seed)
    total, end = qa.shape[0], sum(counts)
    out = torch.full((total, n), float("nan"), dtype=out_dtype, device="cuda")
    res = cutegemm.grouped_gemm(qa, qb, offs=offs, out=out, config=config)
    assert res is out
    assert torch.isnan(out[end:]).all(), "rows past offs[-1] were written"
    ref = cutegemm.grouped_gemm_ref(qa, qb, offs=offs, out_dtype=torch.float64, compute_dtype=torch.float64)
    same = cutegemm.grouped_gemm_ref(qa, qb, offs=offs, out_dtype=out_dtype)
    # fp32 output: the FP8 tensor core's accumulation inside each 32-product partial sum (~7e-5 of
    # max |ref|, tests/test_blockscaled_sm90_gpu.py) is below no fp32 torch baseline: 2e-4 of max |ref|
    atol = 2e-4 if out_dtype == torch.float32 else 1e-5
    if end:
        assert_within_torch_error(out[:end], same[:end], ref[:end], atol=atol, what=f"grouped {fmt} {counts} n={n} k={k}")


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_hopper_fp4_dequantizes_first(fmt):
    """FP4 x FP4 grouped on sm_90a: both operands dequantized to bf16, then our bf16 grouped GEMM
    (bitwise equal to it on the reference-dequantized operands); empty experts, rows past
    offs[-1] untouched."""
    if _major() != 9:
        pytest.skip("the sm_90a path")
    counts = [3, 0, 300, 5, 129]
    qa, qb, offs = _operands(counts, 264, 256, fmt)
    end = sum(counts)
    out = torch.full((qa.shape[0], 264), float("nan"), dtype=torch.bfloat16, device="cuda")
    assert cutegemm.grouped_gemm(qa, qb, offs=offs, out=out) is out
    assert torch.isnan(out[end:]).all(), "rows past offs[-1] were written"
    a16, b16 = dequantize_ref(qa).to(torch.bfloat16), dequantize_ref(qb).to(torch.bfloat16)
    same = cutegemm.grouped_gemm(a16, b16.transpose(1, 2), offs=offs)
    assert torch.equal(out[:end], same[:end])


def _skip_unless_sm100():
    if _major() != 10:
        pytest.skip("the grouped block-scaled kernel is sm_100a")


def _skip_unless_runs(fmt):
    if not (_major() == 10 or (_major() == 9 and fmt == "mxfp8")):
        pytest.skip(f"grouped {fmt} runs on sm_100a (MXFP8 also emulated on sm_90a)")


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4"])
@pytest.mark.parametrize(
    "counts", [[0, 0, 0], [700], [0, 700, 0], [3, 1, 2], [129, 127, 128, 1, 0, 255], [16] * 32],
    ids=["all-empty", "one", "one-of-three", "tiny", "ragged", "decode"],
)
def test_grouped_blockscaled(fmt, counts):
    _skip_unless_runs(fmt)
    _check(counts, 256, 256, fmt, seed=len(counts))


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    counts=st.lists(st.one_of(st.just(0), st.integers(1, 300)), min_size=1, max_size=10),
    n16=st.integers(1, 40),
    k64=st.integers(1, 12),
    fmt=st.sampled_from(["mxfp8", "mxfp4", "nvfp4"]),
)
def test_grouped_blockscaled_hypothesis(counts, n16, k64, fmt):
    _skip_unless_runs(fmt)
    _check(counts, 16 * n16, 64 * k64, fmt, seed=sum(counts))


@pytest.mark.parametrize("scheduler", ["dynamic", "clc"])
def test_grouped_blockscaled_schedulers(scheduler):
    _skip_unless_sm100()
    from dataclasses import replace

    from cutegemm.blockscaled.gemm import blockscaled_config

    cfg = replace(blockscaled_config("mxfp8", 128, 384), tile_m=128, tile_n=128, two_cta=False, cluster_m=1,
                  form=Form.GROUPED, raster="m", group=1, scheduler=scheduler)  # fmt: skip
    _check([200, 0, 77, 130, 1], 384, 512, "mxfp8", seed=3, config=cfg)


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("scheduler", ["static", "dynamic"])
def test_grouped_blockscaled_overlapping_accumulators(fmt, scheduler):
    """tile_n = 256 (two accumulator buffers sharing TMEM columns): several tiles per CTA, so every
    CTA alternates buffers, and experts ending mid-tile (predicated stores of reversed subtiles)."""
    _skip_unless_sm100()
    from dataclasses import replace

    from cutegemm.blockscaled.gemm import blockscaled_config

    cfg = replace(blockscaled_config(fmt, 128, 2048), tile_m=128, tile_n=256, two_cta=False, cluster_m=1,
                  form=Form.GROUPED, raster="m", group=1, scheduler=scheduler)  # fmt: skip
    _check([1000, 0, 777, 1300, 1, 900, 640], 2048, 512, fmt, seed=4, config=cfg)


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_grouped_blockscaled_cuda_graph_replay(fmt):
    """No host sync (NVFP4's global scales are read by the kernel): captured once, replayed with
    20 different offs, each replay equal to an eager call bit for bit."""
    _skip_unless_runs(fmt)
    E, n, k, total = 8, 256, 256, 600
    qa, qb, offs = _operands([total // E] * E, n, k, fmt, pad=0)
    out = torch.empty(total, n, dtype=torch.bfloat16, device="cuda")
    cutegemm.grouped_gemm(qa, qb, offs=offs, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cutegemm.grouped_gemm(qa, qb, offs=offs, out=out)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        cuts = torch.sort(torch.randint(0, total + 1, (E - 1,), generator=g)).values
        offs.copy_(torch.cat([cuts, torch.tensor([total])]).to(torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        eager = cutegemm.grouped_gemm(qa, qb, offs=offs)
        torch.cuda.synchronize()
        assert torch.equal(out, eager)


@pytest.mark.parametrize(
    "override", [dict(tile_m=64), dict(tile_m=128, scheduler="dynamic", cluster_n=2), dict(out_dtype="fp32")]
)
def test_grouped_mxfp8_emulation_tiles(override):
    """sm_90a: the emulation's other tiles, the dynamic scheduler with a 1x2 cluster, fp32 output."""
    if _major() != 9:
        pytest.skip("the sm_90a MXFP8 emulation")
    from dataclasses import replace

    from cutegemm.blockscaled.mx_sm90 import mx_config

    out_dtype = torch.float32 if override.get("out_dtype") == "fp32" else torch.bfloat16
    cfg = replace(mx_config(1024, 384, out_dtype), form=Form.GROUPED, **override)
    _check([200, 0, 77, 130, 1], 384, 512, "mxfp8", seed=3, config=cfg, out_dtype=out_dtype)


@pytest.mark.parametrize("counts", [[3, 0, 300, 5, 129], [0, 0], [16] * 8])
def test_grouped_mixed_mx(counts):
    """MXFP8 activations x MXFP4 expert weights, grouped: sm_90a dequantizes each operand in its
    own format and runs the bf16 grouped GEMM (bitwise equal to it on the reference-dequantized
    operands); sm_100a runs the kind::mxf8f6f4 kernel (the FP4 weights unpacked to a byte per
    element by their TMA), checked against the reference. Rows past offs[-1] untouched."""
    if _major() not in (9, 10):
        pytest.skip("sm_90a / sm_100a")
    g = torch.Generator(device="cuda").manual_seed(len(counts))
    total, n, k = sum(counts) + 5, 256, 512
    qa = quantize(torch.randn(total, k, generator=g, device="cuda").to(torch.bfloat16), "mxfp8")
    qb = quantize(torch.randn(len(counts), n, k, generator=g, device="cuda").to(torch.bfloat16), "mxfp4")
    offs = torch.tensor(counts, dtype=torch.int32, device="cuda").cumsum(0, dtype=torch.int32)
    end = sum(counts)
    out = torch.full((total, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    assert cutegemm.grouped_gemm(qa, qb, offs=offs, out=out) is out
    assert torch.isnan(out[end:]).all(), "rows past offs[-1] were written"
    ref = cutegemm.grouped_gemm_ref(qa, qb, offs=offs, out_dtype=torch.float64, compute_dtype=torch.float64)
    same = cutegemm.grouped_gemm_ref(qa, qb, offs=offs, out_dtype=torch.bfloat16)
    if end:
        assert_within_torch_error(out[:end], same[:end], ref[:end], what=f"grouped mxfp8 x mxfp4 {counts}")
    if _major() == 9 and end:
        a16, b16 = dequantize_ref(qa).to(torch.bfloat16), dequantize_ref(qb).to(torch.bfloat16)
        assert torch.equal(out[:end], cutegemm.grouped_gemm(a16, b16.transpose(1, 2), offs=offs)[:end])
