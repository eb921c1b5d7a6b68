"""Epilogues of the packed grouped (MoE) GEMM on a GPU: per-expert bias, activations, gated
swiglu / geglu, quantized outputs, user epilogues and FP8 row-wise scales, against the fp64
reference ``grouped_gemm_ref`` and torch's own same-precision error; NaN-poisoned outputs (every
row of an expert written, rows past offs[-1] untouched); CUDA-graph replay with new offs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cutegemm import grouped_gemm, grouped_gemm_ref
from cutegemm.config import Form
from cutegemm.epilogue import GATED, epilogue_ref, interleave_gate_up
from cutegemm.nn import GroupedExperts

from ..gemm_check import assert_within_torch_error
from .test_quant_epilogue_gpu import check_quantized

pytestmark = pytest.mark.gpu
BF16 = torch.bfloat16


def make_offs(counts):
    return torch.tensor(counts, dtype=torch.int32, device="cuda").cumsum(0, dtype=torch.int32)


def _bounds(counts):
    ends = torch.tensor(counts).cumsum(0).tolist()
    return list(zip([0, *ends[:-1]], ends, strict=True))


def _operands(counts, n, k, pad_rows, seed, dtype=BF16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    E = len(counts)
    a = torch.randn(sum(counts) + pad_rows, k, generator=g, device="cuda").to(dtype)
    b = (torch.randn(E, n, k, generator=g, device="cuda") / k**0.5).to(dtype).transpose(1, 2)  # (E, K, N) view
    return a, b


def _torch_same_precision(a, b, counts, bias, activation, n_out, gate_layout="interleaved"):
    """torch's own error: per-expert bf16 matmul, then the fp32 epilogue, then the cast."""
    out = torch.zeros(a.shape[0], n_out, dtype=BF16, device="cuda")
    for e, (s, t) in enumerate(_bounds(counts)):
        if t > s:
            y = (a[s:t] @ b[e]).float()
            be = None if bias is None else (bias[e] if bias.dim() == 2 else bias).float()
            out[s:t] = epilogue_ref(y, bias=be, activation=activation, gate_layout=gate_layout).to(BF16)
    return out


def check_epilogue(counts, n, k, *, bias_kind="expert", activation=None, gate_layout="interleaved", pad_rows=5,
                   alpha=1.0, seed=0):  # fmt: skip
    a, b = _operands(counts, n, k, pad_rows, seed)
    E = len(counts)
    bias = None
    if bias_kind == "expert":
        bias = torch.randn(E, n, device="cuda").to(BF16)
    elif bias_kind == "shared":
        bias = torch.randn(n, device="cuda", dtype=torch.float32)
    gated = activation in GATED
    n_out = n // 2 if gated else n
    out = torch.full((a.shape[0], n_out), float("nan"), device="cuda", dtype=BF16)
    kw = dict(bias=bias, activation=activation, gate_layout=gate_layout)
    grouped_gemm(a, b, offs=make_offs(counts), out=out, alpha=alpha, **kw)
    torch.cuda.synchronize()
    ref = grouped_gemm_ref(a, b, offs=make_offs(counts), alpha=alpha, compute_dtype=torch.float64, **kw)
    same = _torch_same_precision(a * alpha if alpha != 1.0 else a, b, counts, bias, activation, n_out, gate_layout)
    end = sum(counts)
    if end:
        assert_within_torch_error(out[:end], same[:end], ref[:end], what=f"grouped {kw} counts={counts}")
    assert torch.isnan(out[end:]).all(), "rows past offs[-1] were written"


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu", "relu_sq", "tanh"])
@pytest.mark.parametrize("bias_kind", ["expert", "shared"])
def test_bias_and_activations(activation, bias_kind):
    check_epilogue([129, 0, 300, 1, 77], 320, 192, bias_kind=bias_kind, activation=activation)


@pytest.mark.parametrize("gated", GATED)
@pytest.mark.parametrize("gate_layout", ["interleaved", "halves"])
def test_gated(gated, gate_layout):
    check_epilogue([200, 64, 0, 513, 3], 512, 256, bias_kind="expert", activation=gated, gate_layout=gate_layout)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    counts=st.lists(st.one_of(st.just(0), st.integers(1, 300)), min_size=1, max_size=10),
    n16=st.integers(1, 24),
    k8=st.integers(1, 40),
    activation=st.sampled_from([None, "silu", "swiglu", "gelu_tanh"]),
    bias_kind=st.sampled_from([None, "expert", "shared"]),
    alpha=st.sampled_from([1.0, 0.25]),
)
def test_epilogue_hypothesis(counts, n16, k8, activation, bias_kind, alpha):
    check_epilogue(counts, 16 * n16, 8 * k8, bias_kind=bias_kind, activation=activation, alpha=alpha,
                   seed=len(counts) * 1000 + n16)  # fmt: skip


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("epi", ["plain", "swiglu_bias"])
def test_quantized_output(fmt, epi):
    counts = [200, 0, 77, 333, 1, 128]
    n, k = (512, 256) if epi == "swiglu_bias" else (256, 256)
    a, b = _operands(counts, n, k, 0, seed=hash((fmt, epi)) % 997)
    kw = {}
    if epi == "swiglu_bias":
        kw = dict(activation="swiglu", bias=torch.randn(len(counts), n, device="cuda").to(BF16))
    gs = 0.01 if fmt == "nvfp4" else None
    offs = make_offs(counts)
    q = grouped_gemm(a, b, offs=offs, out_dtype=fmt, out_global_scale=gs, **kw)
    ref = grouped_gemm_ref(a, b, offs=offs, out_dtype=fmt, out_global_scale=gs, **kw)
    check_quantized(q, ref, fmt)


def epi_rowscale_colshift(acc, row, col, rs):
    return acc * rs[row] + col * 0.001


def test_user_epilogue_packed_rows():
    counts = [100, 0, 260, 33]
    n, k = 256, 128
    a, b = _operands(counts, n, k, 3, seed=5)
    rs = torch.rand(a.shape[0], device="cuda") + 0.5
    out = torch.full((a.shape[0], n), float("nan"), device="cuda", dtype=BF16)
    offs = make_offs(counts)
    grouped_gemm(a, b, offs=offs, out=out, epilogue=epi_rowscale_colshift, epilogue_args=(rs,))
    ref = grouped_gemm_ref(a, b, offs=offs, epilogue=epi_rowscale_colshift, epilogue_args=(rs,),
                           compute_dtype=torch.float64)  # fmt: skip
    same = torch.zeros_like(out)
    cols = torch.arange(n, device="cuda").float()
    for e, (s, t) in enumerate(_bounds(counts)):
        same[s:t] = ((a[s:t] @ b[e]).float() * rs[s:t, None] + cols * 0.001).to(BF16)
    end = sum(counts)
    assert_within_torch_error(out[:end], same[:end], ref[:end], what="grouped user epilogue")
    assert torch.isnan(out[end:]).all()


def _sm90():
    return torch.cuda.get_device_capability()[0] == 9


@pytest.mark.skipif(not torch.cuda.is_available() or not _sm90(), reason="FP8 grouped is an sm_90a kernel")
@pytest.mark.parametrize("fast_accum", [False, True])
@pytest.mark.parametrize("tile_m", [None, 128])
def test_fp8_rowwise_grouped(fast_accum, tile_m):
    """tile_m=128: the 128 x 192 cooperative tile of the DeepSeek-V3 policy, forced (last tiles of
    96, 16 and 16 + 128 * 3 rows)."""
    from cutegemm.config import GemmConfig

    config = None
    if tile_m:
        config = GemmConfig(arch="sm_90a", a_dtype="e4m3", b_dtype="e4m3", b_major="k", form=Form.GROUPED, tile_m=128,
                            tile_n=192, cluster_n=2, fast_accum=fast_accum)  # fmt: skip
    counts = [256, 0, 96, 400, 16]
    E, n, k = len(counts), 384, 512
    g = torch.Generator(device="cuda").manual_seed(11)
    a = torch.randn(sum(counts), k, generator=g, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(E, n, k, generator=g, device="cuda").to(torch.float8_e4m3fn)
    sa = torch.rand(sum(counts), generator=g, device="cuda") * 0.1 + 0.01
    sb = torch.rand(E, n, generator=g, device="cuda") * 0.1 + 0.01
    offs = make_offs(counts)
    out = torch.full((sum(counts), n), float("nan"), device="cuda", dtype=BF16)
    grouped_gemm(a, w.transpose(1, 2), offs=offs, out=out, scale_a=sa, scale_b=sb, fast_accum=fast_accum, config=config)
    ref = grouped_gemm_ref(a, w.transpose(1, 2), offs=offs, scale_a=sa, scale_b=sb, compute_dtype=torch.float64)
    same = torch.zeros_like(out)
    for e, (s, t) in enumerate(_bounds(counts)):
        if t > s:
            same[s:t] = torch._scaled_mm(a[s:t], w[e].t(), scale_a=sa[s:t, None], scale_b=sb[e][None, :],
                                         out_dtype=BF16, use_fast_accum=fast_accum)  # fmt: skip
    assert_within_torch_error(out, same, ref, what=f"FP8 grouped fast_accum={fast_accum}")


def test_graph_replay_with_epilogue_and_changing_offs():
    torch.manual_seed(0)
    E, n, k, total = 6, 256, 128, 768
    a = torch.randn(total, k, device="cuda", dtype=BF16)
    b = (torch.randn(E, k, n, device="cuda") / k**0.5).to(BF16)
    bias = torch.randn(E, n, device="cuda", dtype=BF16)
    offs = make_offs([total // E] * E)
    out = torch.zeros(total, n // 2, device="cuda", dtype=BF16)
    grouped_gemm(a, b, offs=offs, out=out, bias=bias, activation="swiglu")  # compile outside the capture
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            grouped_gemm(a, b, offs=offs, out=out, bias=bias, activation="swiglu")
    torch.cuda.current_stream().wait_stream(s)
    gen = torch.Generator().manual_seed(1)
    for _ in range(20):
        cuts = sorted(torch.randint(0, total + 1, (E - 1,), generator=gen).tolist())
        counts = [x - y for x, y in zip([*cuts, total], [0, *cuts], strict=True)]
        offs.copy_(make_offs(counts))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        eager = grouped_gemm(a, b, offs=offs, bias=bias, activation="swiglu")
        assert torch.equal(out, eager), f"graph replay differs from eager for counts {counts}"


def test_grouped_experts_fused_swiglu_matches_reference():
    torch.manual_seed(3)
    layer = GroupedExperts(8, 256, 384, device="cuda")
    counts = [40, 0, 130, 7, 64, 1, 200, 22]
    x = torch.randn(sum(counts), 256, device="cuda", dtype=BF16)
    offs = make_offs(counts)
    with torch.no_grad():  # the fused route (with a gradient the layer saves the pre-activations)
        y = layer(x, offs)
    ref = layer.forward_ref(x, offs)
    assert torch.isfinite(y).all()
    err = (y.float() - ref.float()).abs().max().item()
    assert err <= 0.03 * ref.float().abs().max().item(), err


def test_grouped_epilogue_bad_inputs():
    counts = [16, 16]
    a, b = _operands(counts, 64, 32, 0, seed=1)
    offs = make_offs(counts)
    with pytest.raises(ValueError, match="bias must have shape"):
        grouped_gemm(a, b, offs=offs, bias=torch.zeros(3, 64, device="cuda"))
    with pytest.raises(ValueError, match="activation"):
        grouped_gemm(a, b, offs=offs, activation="softplus")
    with pytest.raises(ValueError, match="even number"):
        grouped_gemm(a, b[:, :, :48].contiguous()[:, :, :47], offs=offs, activation="swiglu")
    with pytest.raises(ValueError, match="packed"):
        grouped_gemm([a], [b[0]], bias=torch.zeros(64, device="cuda"))
    with pytest.raises(ValueError, match="multiple of 32"):
        grouped_gemm(a, b[:, :, :48], offs=offs, out_dtype="mxfp8")
    with pytest.raises(ValueError, match="out_global_scale"):
        grouped_gemm(a, b, offs=offs, out_dtype="nvfp4")
    with pytest.raises(ValueError, match="scale_a only"):  # 16-bit: scale_a is a per-row output scale
        grouped_gemm(a, b, offs=offs, scale_a=torch.ones(a.shape[0], device="cuda"), scale_b=torch.ones(64, device="cuda"))
    with pytest.raises(ValueError, match="scale_a"):
        grouped_gemm(a, b, offs=offs, scale_a=torch.ones(5, device="cuda"))


def test_interleave_helper_round_trip():
    # the halves layout is converted with the public helper: it must equal an explicit interleave
    w = torch.randn(2, 8, 6, device="cuda")
    il = interleave_gate_up(w, dim=-1)
    assert torch.equal(il[..., 0::2], w[..., :3]) and torch.equal(il[..., 1::2], w[..., 3:])
