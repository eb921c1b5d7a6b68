"""The swapped grouped kernel (``GemmConfig.swap_ab``: tokens along the WGMMA's N, one WGMMA
width per 16 tokens, token loads in 32-row chunks) on a GPU: ragged experts against an fp64
reference with poisoned outputs (every element of every expert written, nothing past the last
expert), clusters, both weight layouts, activations, CUDA-graph replay with changing offs."""

from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cutegemm
from cutegemm import grouped_gemm, grouped_gemm_ref
from cutegemm.config import Form
from cutegemm.epilogue import EpilogueSpec

from ..gemm_check import assert_within_torch_error
from .test_grouped_gpu import capture_graph, check_packed, expert_counts, make_offs

pytestmark = pytest.mark.gpu

SWAP = cutegemm.GemmConfig(arch="sm_90a", form=Form.GROUPED, swap_ab=True, b_major="k", tile_m=128, tile_n=256, raster="m", group=1)
CONFIGS = {
    "256-c1x1-static": dict(),
    "256-c2x1-dynamic": dict(cluster_m=2, scheduler="dynamic"),
    "160-c1x1-static-bn": dict(tile_n=160, b_major="n"),
    "192-c2x1-dynamic": dict(tile_n=192, cluster_m=2, scheduler="dynamic"),
    "64-c1x1-dynamic-bn": dict(tile_n=64, scheduler="dynamic", b_major="n"),
}
# Last tiles of every width class: 1..16 tokens, 17..32 (one chunk), 33 (two chunks), a whole
# tile, one past it, empty experts, and many experts of one token.
RAGGED = ([130, 0, 1, 257, 64, 65, 300], [1] * 9, [0, 0, 700], [16] * 32, [15, 17, 31, 33, 47, 255, 256, 257, 512, 513])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_swap_ragged_experts(name):
    cfg = replace(SWAP, **CONFIGS[name])
    for counts in RAGGED:
        check_packed(counts, 264, 136, b_transposed=cfg.b_major == "k", config=cfg)
    check_packed([1000, 37, 513], 2048, 512, b_transposed=cfg.b_major == "k", config=cfg)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counts=expert_counts(12), n8=st.integers(1, 48), k8=st.integers(1, 48), which=st.sampled_from(sorted(CONFIGS)))
def test_swap_property(counts, n8, k8, which):
    cfg = replace(SWAP, **CONFIGS[which])
    check_packed(counts, 8 * n8, 8 * k8, b_transposed=cfg.b_major == "k", config=cfg)


def test_swap_fp16_and_activation():
    cfg = replace(SWAP, cluster_m=2, scheduler="dynamic")
    check_packed([300, 5, 0, 77], 256, 128, dtype=torch.float16, config=replace(cfg, a_dtype="fp16", b_dtype="fp16", out_dtype="fp16"))
    torch.manual_seed(0)
    counts = [40, 0, 300, 7]
    a = torch.randn(sum(counts) + 3, 192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4, 320, 192, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    offs = make_offs(counts)
    for act in ("relu", "silu"):
        out = torch.full((a.shape[0], 320), float("nan"), device="cuda", dtype=torch.bfloat16)
        grouped_gemm(a, b, offs=offs, out=out, activation=act, alpha=0.5, config=replace(cfg, epilogue=EpilogueSpec(alpha=True, activation=act)))
        ref = grouped_gemm_ref(a, b, offs=offs, activation=act, alpha=0.5, compute_dtype=torch.float64)
        end = sum(counts)
        torch.testing.assert_close(out[:end].float(), ref[:end].float(), atol=2e-2, rtol=2e-2)
        assert torch.isnan(out[end:]).all()


def test_swap_cuda_graph_replay_with_changing_offs():
    torch.manual_seed(0)
    cfg = replace(SWAP, cluster_m=2, scheduler="dynamic")
    E, n, k, total = 8, 384, 128, 1024
    a = torch.randn(total, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(E, n, k, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    offs = make_offs([total // E] * E)
    out = torch.zeros(total, n, device="cuda", dtype=torch.bfloat16)
    g = capture_graph(lambda: grouped_gemm(a, b, offs=offs, out=out, config=cfg))
    gen = torch.Generator().manual_seed(1)
    for _ in range(21):
        counts = torch.multinomial(torch.ones(E), total, replacement=True, generator=gen).bincount(minlength=E)
        counts[torch.randint(0, E, (2,), generator=gen)] = 0
        offs.copy_(torch.cumsum(counts, 0).to(torch.int32))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ref = grouped_gemm_ref(a, b, offs=offs, compute_dtype=torch.float64)
        end = int(counts.sum())
        torch.testing.assert_close(out[:end].float(), ref[:end].float(), atol=0.1, rtol=2e-2)
        assert torch.isnan(out[end:]).all()


def test_swap_fp32_output():
    """fp16 inputs, fp32 output (the transposed stmatrix path at 4-byte elements)."""
    torch.manual_seed(0)
    counts = [100, 0, 33, 250]
    a = torch.randn(sum(counts) + 4, 96, device="cuda", dtype=torch.float16)
    b = torch.randn(4, 96, 200, device="cuda", dtype=torch.float16)
    offs = make_offs(counts)
    cfg = replace(SWAP, tile_n=160, a_dtype="fp16", b_dtype="fp16", out_dtype="fp32", b_major="n")
    out = torch.full((a.shape[0], 200), float("nan"), device="cuda", dtype=torch.float32)
    grouped_gemm(a, b, offs=offs, out=out, out_dtype=torch.float32, config=cfg)
    ref = grouped_gemm_ref(a, b, offs=offs, compute_dtype=torch.float64)
    end = sum(counts)
    torch.testing.assert_close(out[:end].double(), ref[:end].double(), atol=1e-2, rtol=1e-3)
    assert torch.isnan(out[end:]).all()


def test_policy_picks_swap_for_moe_sized_experts():
    """The packed form's default config for 64 < mean rows per expert <= 1024 (bf16, no bias)."""
    from cutegemm.policy import policy_for

    pol = policy_for("sm_90a", torch.cuda.get_device_properties(0).multi_processor_count)
    p = cutegemm.GemmProblem(32 * 512, 4096, 7168, 1, b_major="k")
    assert pol.choose_grouped(p, 32).swap_ab
    assert not pol.choose_grouped(p, 4).swap_ab  # 4096 rows per expert


@pytest.mark.parametrize("bias_dtype", [torch.float32, torch.bfloat16])
def test_swap_bias_alpha_activation(bias_dtype):
    """Per-(expert, column) bias after alpha, then an activation: the swapped accumulator's rows
    are the GEMM's columns, so the bias runs along them (tiles at N's edge, ragged tokens)."""
    torch.manual_seed(1)
    counts = [150, 0, 1, 40, 300, 17]
    E, n, k = len(counts), 264, 136
    a = torch.randn(sum(counts) + 6, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(E, n, k, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    bias = torch.randn(E, n, device="cuda", dtype=bias_dtype)
    offs = make_offs(counts)
    for cfg in (replace(SWAP, cluster_m=2, scheduler="dynamic"), replace(SWAP, tile_n=160)):
        out = torch.full((a.shape[0], n), float("nan"), device="cuda", dtype=torch.bfloat16)
        grouped_gemm(a, b, offs=offs, out=out, bias=bias, alpha=0.75, activation="gelu", config=cfg)
        ref = grouped_gemm_ref(a, b, offs=offs, bias=bias, alpha=0.75, activation="gelu", compute_dtype=torch.float64)
        end = sum(counts)
        torch.testing.assert_close(out[:end].float(), ref[:end].float(), atol=5e-2, rtol=2e-2)
        assert torch.isnan(out[end:]).all()


@pytest.mark.parametrize("gated", ["swiglu", "geglu"])
@pytest.mark.parametrize("name", ["256-c2x1-dynamic", "160-c1x1-static-bn", "64-c1x1-dynamic-bn"])
def test_swap_gated(name, gated):
    """Gated outputs: a (gate, up) pair is two accumulator rows of lanes 4 apart, paired by a
    shuffle. Against fp64 and against the unswapped kernel (same K order and epilogue math: at
    most one bf16 ulp apart); N' = 136 leaves an 8-column last weight tile, the ragged token
    counts every subtile kind; bias (E, 2N') and alpha before the gate."""
    torch.manual_seed(2)
    cfg = replace(SWAP, **CONFIGS[name])
    counts = [150, 0, 1, 40, 300, 17, 33, 256]
    E, n, k = len(counts), 272, 136
    a = torch.randn(sum(counts) + 6, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(E, n, k, device="cuda", dtype=torch.bfloat16)
    b = w.transpose(1, 2) if cfg.b_major == "k" else w.transpose(1, 2).contiguous()
    bias = torch.randn(E, n, device="cuda", dtype=torch.float32)
    offs = make_offs(counts)
    end = sum(counts)
    ref = grouped_gemm_ref(a, b, offs=offs, bias=bias, alpha=0.5, activation=gated, compute_dtype=torch.float64)
    outs = []
    for c in (cfg, replace(cfg, swap_ab=False, tile_n=128, cluster_m=1)):
        out = torch.full((a.shape[0], n // 2), float("nan"), device="cuda", dtype=torch.bfloat16)
        grouped_gemm(a, b, offs=offs, out=out, bias=bias, alpha=0.5, activation=gated, config=c)
        torch.testing.assert_close(out[:end].float(), ref[:end].float(), atol=5e-2, rtol=2e-2)
        assert torch.isnan(out[end:]).all(), "rows past offs[-1] were written"
        outs.append(out[:end].float())
    torch.testing.assert_close(outs[0], outs[1], atol=0, rtol=2**-7)


@pytest.mark.parametrize("fast_accum", [False, True])
@pytest.mark.parametrize("tile_n", [192, 128])
def test_swap_fp8_rowwise(tile_n, fast_accum):
    """FP8 e4m3 with row-wise scales (scale_a per token, scale_b per expert and column) and, by
    default, promotion per 128-wide K tile: against fp64 within torch's own error (per-expert
    ``_scaled_mm``), and bitwise against the unswapped kernel (same K tiles, same order); ragged
    counts incl. empty experts and single tokens, N off the 128-row weight tile, bias."""
    torch.manual_seed(3)
    counts = [256, 0, 96, 1, 400, 17, 33, 130]
    E, n, k = len(counts), 272, 512
    f8 = torch.float8_e4m3fn
    a = torch.randn(sum(counts) + 4, k, device="cuda").to(f8)
    w = torch.randn(E, n, k, device="cuda").to(f8)
    sa = torch.rand(a.shape[0], device="cuda") * 0.1 + 0.01
    sb = torch.rand(E, n, device="cuda") * 0.1 + 0.01
    bias = torch.randn(E, n, device="cuda")
    offs = make_offs(counts)
    end = sum(counts)
    cfg = replace(SWAP, a_dtype="e4m3", b_dtype="e4m3", tile_n=tile_n, cluster_m=2, scheduler="dynamic",
                  fast_accum=fast_accum)  # fmt: skip
    outs = []
    for c in (cfg, replace(cfg, swap_ab=False, cluster_m=1)):
        out = torch.full((a.shape[0], n), float("nan"), device="cuda", dtype=torch.bfloat16)
        grouped_gemm(a, w.transpose(1, 2), offs=offs, out=out, scale_a=sa, scale_b=sb, fast_accum=fast_accum, config=c)
        assert torch.isnan(out[end:]).all(), "rows past offs[-1] were written"
        outs.append(out[:end])
    ref = grouped_gemm_ref(a, w.transpose(1, 2), offs=offs, scale_a=sa, scale_b=sb, compute_dtype=torch.float64)[:end]
    same = torch.zeros_like(outs[0])
    for e, (s, t) in enumerate(zip([0, *offs.tolist()[:-1]], offs.tolist(), strict=True)):
        if t > s:
            # (cuBLAS wants 16-byte aligned scale vectors: copies)
            same[s:t] = torch._scaled_mm(a[s:t], w[e].t(), scale_a=sa[s:t].clone()[:, None], scale_b=sb[e].clone()[None, :],
                                         out_dtype=torch.bfloat16, use_fast_accum=fast_accum)  # fmt: skip
    assert_within_torch_error(outs[0], same, ref, what=f"swap FP8 tile_n={tile_n} fast_accum={fast_accum}")
    if not fast_accum:
        assert torch.equal(outs[0], outs[1]), "swapped and unswapped promoted FP8 differ"
    # bias after the scales
    out = grouped_gemm(a, w.transpose(1, 2), offs=offs, scale_a=sa, scale_b=sb, bias=bias, fast_accum=fast_accum,
                       config=replace(cfg, epilogue=EpilogueSpec(scale_a=True, scale_b=True, bias=True)))  # fmt: skip
    ref_b = grouped_gemm_ref(a, w.transpose(1, 2), offs=offs, scale_a=sa, scale_b=sb, bias=bias, compute_dtype=torch.float64)
    torch.testing.assert_close(out[:end].float(), ref_b[:end].float(), atol=5e-2, rtol=2e-2)
