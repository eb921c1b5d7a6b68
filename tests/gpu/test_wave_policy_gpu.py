"""The configs the sm_90a wave model picks for M > 128 (policy.wave_choice: 128x192 2x1 tiles, 128x128
/ 128x96 M-major (2x1 / 1x2), e4m3 128x160 (2x1 / 1x2), 128x64, split K of 128x128 / 128x192 tiles, 192x192, 64x96 1x2), on the GPU
through the public API: every pick of a sweep of real-model shapes (bf16 and FP8 row-wise) against
an fp64 reference within 2x torch's error, into NaN-poisoned outputs, bitwise equal on a second call
(split K adds the ranges in range order)."""

from __future__ import annotations

import pytest
import torch

import cutegemm
from cutegemm import policy
from cutegemm.config import EpilogueSpec, GemmProblem
from cutegemm.policy import policy_for, small_m_alternative

from ..gemm_check import assert_outside_untouched, assert_within_torch_error, poisoned_out

pytestmark = pytest.mark.gpu
F8 = torch.float8_e4m3fn
SHAPES = [(512, 576, 7168), (1024, 576, 7168), (512, 1536, 7168), (1024, 6144, 4096), (512, 10240, 8192),
          (1024, 5120, 25600), (8192, 576, 7168), (512, 2048, 4096), (1000, 3000, 5000), (130, 4096, 4096), (2048, 5120, 2048),
          (1000, 5000, 3000), (512, 4096, 4096), (512, 4096, 14336), (1024, 2048, 4096), (1024, 1536, 7168),
          (2048, 576, 7168), (3072, 1536, 4096), (1000, 1536, 7168), (8000, 576, 7168), (512, 28672, 4096),
          (2048, 7168, 16384), (384, 28672, 4096), (640, 24576, 4096), (1000, 7000, 16000),
          # odd M tiles paired along N (policy.odd_m_pairs_n), an odd N tile count padded: 1x2 clusters
          (1152, 1536, 7168), (640, 7168, 16384), (384, 8192, 28672), (300, 6144, 4096), (1152, 2048, 4096),
          # short K: pingpong 128x192 2x1 (policy.short_k_pingpong); a partial last M and N tile
          (1024, 24576, 1536), (1500, 6100, 1024), (2048, 24576, 1536),
          # FP8 128x160 (policy.E4M3_160_RATE): 2x1 with a partial last N tile, 1x2 over odd M tiles
          (1024, 7168, 16384), (2000, 5120, 2048), (1000, 28672, 4096), (640, 7168, 16384), (896, 5120, 2048),
          # 16-bit 192x128 1x2 / 192x160 (policy.TALL_128_RATE / TALL_160_RATE), 128x96 2x1
          # (policy.wide_n_pairs_m), no pingpong over odd M tiles: partial last M and N tiles
          (1100, 5000, 25600), (1100, 10200, 5120), (6000, 570, 7000), (250, 6100, 2048), (640, 24576, 1536)]  # fmt: skip


def _sm90():
    return torch.cuda.get_device_capability()[0] == 9


def _operands(kind, m, n, k):
    """(x, w, kwargs of cutegemm.gemm, the GemmProblem, the epilogue) of an x @ w.T case."""
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", generator=g, dtype=torch.bfloat16)
    kwargs, dtype = {}, "bf16"
    if kind == "fp8":
        x, w, dtype = x.to(F8), w.to(F8), "e4m3"
        kwargs = dict(scale_a=torch.rand(m, 1, device="cuda") + 0.5, scale_b=torch.rand(1, n, device="cuda") + 0.5)
    epi = EpilogueSpec(scale_a=True, scale_b=True) if kind == "fp8" else EpilogueSpec()
    return x, w, kwargs, GemmProblem(m, n, k, 1, dtype, dtype, "bf16", "k", "k"), epi


def _check(kind, x, w, kwargs, name, **call):
    """cutegemm.gemm into a NaN-poisoned output: within 2x torch's error of fp64, nothing written
    outside, bitwise equal on a second call."""
    (m, k), n = x.shape, w.shape[0]
    buf, out = poisoned_out((m, n), torch.bfloat16)
    cutegemm.gemm(x, w.t(), out=out, **kwargs, **call)
    assert_outside_untouched(buf, m, n)
    ref = x.double() @ w.double().t()
    if kind == "fp8":
        ref = ref * kwargs["scale_a"].double() * kwargs["scale_b"].double()
        # torch._scaled_mm takes K and N multiples of 16 only: its baseline on zero-padded K (the
        # same sums) and N (columns sliced off)
        pk, pn = -k % 16, -n % 16
        xp = torch.nn.functional.pad(x.view(torch.uint8), (0, pk)).view(F8)
        wp = torch.nn.functional.pad(w.view(torch.uint8), (0, pk, 0, pn)).view(F8)
        sbp = torch.nn.functional.pad(kwargs["scale_b"], (0, pn), value=1.0)
        same = torch._scaled_mm(xp, wp.t(), out_dtype=torch.bfloat16, scale_a=kwargs["scale_a"], scale_b=sbp)[:, :n]
    else:
        same = x @ w.t()
    assert_within_torch_error(out, same, ref, what=f"{kind} {m}x{n}x{k} {name}")
    assert torch.equal(out, cutegemm.gemm(x, w.t(), **kwargs, **call)), f"{name}: not bitwise reproducible"


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_wave_model_picks_are_correct_and_deterministic(kind, m, n, k):
    if not _sm90():
        pytest.skip("the wave model is the sm_90a policy")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    x, w, kwargs, p, epi = _operands(kind, m, n, k)
    cfg = policy_for("sm_90a", sms).choose_dense(p, epilogue=epi)
    _check(kind, x, w, kwargs, cfg.name)


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
@pytest.mark.parametrize("m,n,k", [(128, 10240, 8192), (100, 10240, 8192), (128, 5120, 25600), (128, 51200, 5120),
                                   (128, 8192, 28672), (72, 24576, 1536), (128, 28672, 4096)])  # fmt: skip
def test_small_m_wave_picks_are_correct_and_deterministic(kind, m, n, k, monkeypatch):
    """The 64 < M <= 128 wave picks (policy.small_m_alternative: taken for 16-bit, measured by the
    sweep for e4m3), forced through config=: as above."""
    if not _sm90():
        pytest.skip("the wave model is the sm_90a policy")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    x, w, kwargs, p, epi = _operands(kind, m, n, k)
    monkeypatch.setattr(policy, "SMALL_M_WAVES", frozenset())  # the decode rule's config
    alt = small_m_alternative(policy_for("sm_90a", sms).choose_dense(p, epilogue=epi), p, sms)
    if alt is None:
        pytest.skip(f"no wave pick for {kind} {m}x{n}x{k}")
    _check(kind, x, w, kwargs, alt.name, config=alt)


@pytest.mark.parametrize("m,n,k", [(128, 10240, 8192), (120, 5120, 2048), (128, 4096, 14336), (128, 24576, 1536),
                                   (128, 51200, 5120), (113, 7168, 16384)])  # fmt: skip
def test_64_row_pairs_at_m128_are_correct_and_deterministic(m, n, k):
    """The policy's 2x1 pairs of 64-row tiles at 112 < M <= 128 (policy.small_m_pair), bf16,
    through the public API: as above."""
    if not _sm90():
        pytest.skip("the 64-row pairs are the sm_90a policy's")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    x, w, kwargs, p, epi = _operands("bf16", m, n, k)
    cfg = policy_for("sm_90a", sms).choose_dense(p, epilogue=epi)
    assert (cfg.tile_m, cfg.cluster_m) == (64, 2), cfg.name
    _check("bf16", x, w, kwargs, cfg.name)
