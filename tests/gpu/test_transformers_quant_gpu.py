"""Quantized experts in the transformers experts backend on the GPU (cutegemm's kernels, bf16); the
CPU twin of these checks is tests/cpu/test_transformers_quant_cpu.py.

- FP8 block-scaled experts (transformers' ``FP8Experts``: e4m3 + fp32 128x128 block scales) on the
  DeepSeek block-scaled grouped GEMM (sm_90a): each projection, on the activations quantized by
  ``quantize_fp8_1x128``, against fp64 on the same quantized operands, within 2x the error of
  torch's blockwise ``torch._scaled_mm`` per expert (the fp32 dequantized product rounded to bf16
  where this torch does not run it) + a small atol; per-half gate/up scale grids; the whole layer
  against an fp64 emulation of the quantized math; tiny Qwen3-MoE / DeepSeek-V3 FP8 models against
  fp32 eager experts on the dequantized weights (FP8 activation quantization bounds the error).
- NVFP4 / MXFP4 / MXFP8 weights (``quantize_experts``; and FP4 ``FP8Experts`` as MXFP4) on the
  weight-only grouped kernels: a layer, decode to prefill sizes (the kernels' three regimes),
  within 2x the error of transformers' ``grouped_mm`` backend (``torch._grouped_mm``) on the
  dequantized weights in bf16 against fp64; tiny models likewise against fp32 eager.
- A quantized experts forward captured in a CUDA graph and replayed with new tokens and routing:
  bitwise equal to eager.
"""

import copy
import inspect

import pytest
import torch

pytest.importorskip("transformers")
hf_moe = pytest.importorskip("transformers.integrations.moe")
if not hasattr(hf_moe, "ExpertsInterface"):
    pytest.skip("needs transformers >= 5 (ExpertsInterface)", allow_module_level=True)
hf_fp8 = pytest.importorskip("transformers.integrations.finegrained_fp8")

import cutegemm  # noqa: E402
from cutegemm.blockscaled.reference import dequantize_ref, quantize_ref  # noqa: E402
from cutegemm.integrations import transformers as cg_tf  # noqa: E402

from ..cpu.test_transformers_cpu import tiny_model  # noqa: E402
from ..cpu.test_transformers_quant_cpu import fp8_class, fp8_experts, fp8_model, rel_err  # noqa: E402
from ..gemm_check import assert_within_torch_error  # noqa: E402

pytestmark = pytest.mark.gpu
BF16, F64 = torch.bfloat16, torch.float64
VOCAB = 64
HIDDEN = 512


def _skip_unless_sm90():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("FP8 block scaling is an sm_90a kernel")


def routing(tokens, experts, k, hidden, seed, device="cuda"):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(tokens, hidden, generator=g) * torch.rand(tokens, 1, generator=g) * 4).to(BF16)
    idx = torch.rand(tokens, experts, generator=g).argsort(1)[:, :k]
    w = torch.rand(tokens, k, generator=g).softmax(-1)
    return x.to(device), idx.to(device), w.to(device)


def layer(inter, dtype=BF16, seed=0, name="qwen3_moe"):
    """An experts layer (hidden 512, 6 experts) of a tiny model, on the CPU."""
    model = tiny_model(name, dtype=dtype, seed=seed, hidden_size=HIDDEN, num_hidden_layers=1, inter=inter)
    return next(m for m in model.modules() if hasattr(m, "gate_up_proj") and hasattr(m, "has_gate"))


def sorted_rows(counts, hidden, seed):
    g = torch.Generator().manual_seed(seed)
    rows = sum(counts)
    x = (torch.randn(rows, hidden, generator=g) * 10 ** (torch.rand(rows, 1, generator=g) * 2 - 1)).to(BF16)
    offs = torch.tensor(counts).cumsum(0).to(torch.int32)
    return x.cuda(), offs.cuda()


# ------------------------------------------------------------------------------------------------ FP8


def _torch_blockwise(x8, sa, b, sb, offs, n):
    """Per expert torch._scaled_mm with (1x128, 128x128) block scales, bf16; None when this torch /
    GPU does not run it."""
    out = torch.zeros(x8.shape[0], n, dtype=BF16, device=x8.device)
    prev = 0
    try:
        for e, end in enumerate(offs.tolist()):
            if end > prev:
                out[prev:end] = torch._scaled_mm(
                    x8[prev:end], b[e], scale_a=sa[prev:end].t().contiguous().t(),
                    scale_b=sb[e].t().contiguous().t(), out_dtype=BF16,
                )  # fmt: skip
            prev = end
    except (RuntimeError, NotImplementedError, ValueError, TypeError):
        return None
    return out


@pytest.mark.parametrize("inter", [256, 192])  # 192: gate / up scale grids per half (two GEMMs)
@pytest.mark.parametrize("counts", [[1, 0, 3, 2, 0, 1], [40, 7, 0, 130, 64, 9], [700, 900, 512, 1000, 3, 600]])
def test_fp8_projections_within_2x_torch(inter, counts):
    _skip_unless_sm90()
    fp8, *_ = fp8_experts(layer(inter))
    fp8 = fp8.cuda()
    for name, k in (("gate_up_proj", HIDDEN), ("down_proj", inter)):
        x, offs = sorted_rows(counts, k, seed=k + len(counts))
        with torch.no_grad():
            ours = cg_tf._fp8_projection(fp8, name, x, offs, BF16)
        x8, sa = cg_tf.quantize_fp8_1x128(x)
        n = getattr(fp8, name).shape[1]
        ref = torch.empty(x.shape[0], n, dtype=F64, device="cuda")
        base = torch.empty(x.shape[0], n, dtype=BF16, device="cuda")
        names = set()
        for cols, b, sb in cg_tf._fp8_parts(fp8, name):
            ref[:, cols] = cutegemm.grouped_gemm_ref(x8, b, offs=offs, scale_a=sa, scale_b=sb, out_dtype=F64,
                                                     compute_dtype=F64)  # fmt: skip
            t = _torch_blockwise(x8, sa, b, sb, offs, b.shape[-1])
            scale = ref[:, cols].abs().max().item() or 1.0
            if t is not None and torch.isfinite(t).all() and (t.double() - ref[:, cols]).abs().max() <= 2e-2 * scale:
                base[:, cols], _ = t, names.add("torch blockwise _scaled_mm")
            else:  # this torch / GPU does not run it (or not sanely): what an fp32-accumulating kernel reaches
                base[:, cols] = cutegemm.grouped_gemm_ref(x8, b, offs=offs, scale_a=sa, scale_b=sb)
                names.add("fp32 dequantized -> bf16")
        assert_within_torch_error(ours, base, ref, what=f"{name} counts={counts} (vs {' + '.join(sorted(names))})")


def _emulated(fp8, gu, down, x, idx, w):
    """fp64 emulation of the FP8 layer's math: 1x128-quantized activations times the dequantized
    weights, rounded to bf16 as the route's output, the module's gate (bf16), its output quantized
    again (so that e4m3 roundings of the gate's output see the same inputs: a bf16 ulp of
    difference flips an e4m3 rounding of 2^-3 spacing often enough to move the result by ~1%)."""
    out = torch.zeros(x.shape, dtype=F64, device=x.device)

    def deq(a):
        q, s = cg_tf.quantize_fp8_1x128(a)
        return q.double() * s.double().repeat_interleave(128, 1)[:, : a.shape[1]]

    for e in range(fp8.num_experts):
        tok, slot = torch.where(idx == e)
        if tok.numel():
            h = fp8._apply_gate((deq(x[tok]) @ gu[e].double().t()).to(BF16))
            out.index_add_(0, tok, (deq(h) @ down[e].double().t()) * w[tok, slot].double().unsqueeze(1))
    return out


@pytest.mark.parametrize("inter", [256, 192])
@pytest.mark.parametrize("tokens", [5, 300, 4096])
def test_fp8_layer_against_emulation(inter, tokens):
    _skip_unless_sm90()
    fp8, gu, down = fp8_experts(layer(inter))
    fp8, gu, down = fp8.cuda(), gu.cuda(), down.cuda()
    fp8.config._experts_implementation = "cutegemm"
    x, idx, w = routing(tokens, fp8.num_experts, 2, HIDDEN, seed=tokens)
    with torch.no_grad():
        got = fp8(x, idx, w)
    assert got.dtype == BF16 and torch.isfinite(got).all()
    # bf16 outputs (0.23% with the reference twins on the CPU); a gate input a bf16 ulp off (the FP8
    # tensor core's sums within a 128-K block) may flip an e4m3 rounding of the gate's output
    assert rel_err(got, _emulated(fp8, gu, down, x, idx, w)) < 1e-2


@pytest.mark.parametrize("name", ["qwen3_moe", "deepseek_v3"])
@pytest.mark.parametrize("inter", [128, 192])
def test_fp8_model_against_fp32_eager(name, inter):
    _skip_unless_sm90()
    ours, ref = fp8_model(name, dtype=BF16, inter=inter)
    ours, ref = ours.cuda(), ref.cuda()
    theirs = copy.deepcopy(ref).to(BF16)  # bf16 eager experts on the dequantized weights: bf16's own error
    ids = torch.randint(0, VOCAB, (4, 64), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    with torch.no_grad():
        r, o, t = ref(ids).logits, ours(ids).logits, theirs(ids).logits
    assert torch.isfinite(o).all()
    eo, et = rel_err(o, r), rel_err(t, r)
    # 1x128 e4m3 activations in both projections: 1.3-3.1% on these models in fp32 on the CPU
    assert eo < 5e-2 + 2 * et, f"{name}: rel err {eo:.3g} (bf16 eager on the dequantized weights: {et:.3g})"


# ------------------------------------------------------------------------------- weight-only (FP4 / MXFP8)


def _fp64_eager(module, x, idx, w):
    ref = copy.deepcopy(module).to(F64)
    ref.config = copy.copy(ref.config)
    ref.config._experts_implementation = "eager"
    return ref(x.to(F64), idx, w.to(F64))


def _grouped_mm_bf16(module, x, idx, w):
    return hf_moe.grouped_mm_experts_forward(copy.deepcopy(module).to(BF16), x, idx, w)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
@pytest.mark.parametrize("tokens", [8, 200, 8000])  # decode (mma.sync), WGMMA passes, dequantize-first
@pytest.mark.parametrize("name", ["qwen3_moe", "gpt_oss"])
def test_weight_only_layer_within_2x_grouped_mm(name, fmt, tokens):
    experts = layer(256, name=name).cuda()
    cg_tf.quantize_experts(experts, fmt)
    deq = copy.deepcopy(experts)
    cg_tf.dequantize_experts(deq, dtype=torch.float32)  # exact dequantized weights
    x, idx, w = routing(tokens, experts.num_experts, 2, HIDDEN, seed=tokens)
    with torch.no_grad():
        ours = cg_tf.experts_forward(experts, x, idx, w)
        ref = _fp64_eager(deq, x, idx, w)
        base = _grouped_mm_bf16(deq, x, idx, w)
    assert_within_torch_error(ours, base, ref, atol=2e-3, what=f"{name} {fmt} T={tokens}")


def test_fp4_fp8experts_within_2x_grouped_mm():
    if "expert_dtype" not in inspect.signature(hf_fp8.FP8Experts.__init__).parameters:
        pytest.skip("this transformers' FP8Experts has no expert_dtype (FP4 experts came later)")
    experts = layer(256)
    fp4 = fp8_class()(experts.config, block_size=(128, 128), scale_fmt="ue8m0", expert_dtype="fp4")
    deq = copy.deepcopy(experts).float()
    with torch.no_grad():
        for proj in ("gate_up_proj", "down_proj"):
            q = quantize_ref(getattr(experts, proj).detach().float(), "mxfp4", swizzle=False)
            getattr(fp4, proj).copy_(q.data.view(torch.int8))
            getattr(fp4, f"{proj}_scale_inv").copy_(q.scales)
            getattr(deq, proj).copy_(dequantize_ref(q))
    fp4, deq = fp4.cuda(), deq.cuda()
    fp4.config._experts_implementation = "cutegemm"
    x, idx, w = routing(300, fp4.num_experts, 2, HIDDEN, seed=3)
    with torch.no_grad():
        ours = fp4(x, idx, w)
        ref = _fp64_eager(deq, x, idx, w)
        base = _grouped_mm_bf16(deq, x, idx, w)
    assert_within_torch_error(ours, base, ref, atol=2e-3, what="FP8Experts expert_dtype=fp4 as MXFP4")


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("name", ["qwen3_moe", "deepseek_v3", "mixtral", "gpt_oss"])
def test_weight_only_model_within_2x_grouped_mm(name, fmt):
    base = tiny_model(name, dtype=torch.float32, device="cuda", hidden_size=256, num_hidden_layers=1, inter=128)
    ours = copy.deepcopy(base).to(BF16)
    cg_tf.quantize_experts(ours, fmt)
    ref = copy.deepcopy(ours).float()
    cg_tf.dequantize_experts(ref, dtype=torch.float32)
    ref.set_experts_implementation("eager")
    theirs = copy.deepcopy(ours)
    cg_tf.dequantize_experts(theirs)  # bf16
    theirs.set_experts_implementation("grouped_mm")
    ids = torch.randint(0, VOCAB, (4, 64), device="cuda", generator=torch.Generator("cuda").manual_seed(2))
    with torch.no_grad():
        r, o, t = ref(ids).logits, ours(ids).logits, theirs(ids).logits
    assert torch.isfinite(o).all()
    eo, et = rel_err(o, r), rel_err(t, r)
    assert eo <= 2 * et + 2e-3, f"{name} {fmt}: rel err {eo:.3g} > 2 x grouped_mm {et:.3g} + 2e-3"


# ------------------------------------------------------------------------------------------ CUDA graphs


@pytest.mark.parametrize("kind", ["fp8", "nvfp4"])
def test_graph_capture_with_new_routing(kind):
    if kind == "fp8":
        _skip_unless_sm90()
        experts, *_ = fp8_experts(layer(256))
    else:
        experts = layer(256)
        cg_tf.quantize_experts(experts, "nvfp4")
    experts = experts.cuda()
    experts.config._experts_implementation = "cutegemm"
    x, idx, w = routing(64, experts.num_experts, 2, HIDDEN, seed=0)
    with torch.no_grad():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm: plans, caches
                experts(x, idx, w)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = experts(x, idx, w)
        for seed in (1, 2):
            x2, idx2, w2 = routing(64, experts.num_experts, 2, HIDDEN, seed=seed)
            x.copy_(x2), idx.copy_(idx2), w.copy_(w2)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, experts(x2, idx2, w2)), f"{kind}: replay with routing {seed} != eager"
