"""The transformers experts backend on the GPU (cutegemm's kernels), bf16: tiny random-initialised
Qwen3-MoE, Mixtral, OLMoE, DeepSeek-V3 and gpt-oss models (the configs of
tests/cpu/test_transformers_cpu.py at kernel-friendly sizes) with ``experts_implementation=
"cutegemm"``; logits, loss and the gradient of every parameter against the same model in fp32
with transformers' ``"eager"`` experts: our error within 2x the error of transformers' own
``"grouped_mm"`` backend in bf16 (+ a small floor), and the no-grad forward likewise.

One decoder layer, so that the bf16 runs route their tokens from identical hidden states (the
router and attention are the same code in both backends)."""

import copy

import pytest
import torch

pytest.importorskip("transformers")
hf_moe = pytest.importorskip("transformers.integrations.moe")
if not hasattr(hf_moe, "ExpertsInterface"):
    pytest.skip("needs transformers >= 5 (ExpertsInterface)", allow_module_level=True)

import cutegemm.integrations.transformers as cg_tf  # noqa: E402  (registers "cutegemm")

from ..cpu.test_transformers_cpu import MODELS, tiny_model  # noqa: E402

pytestmark = pytest.mark.gpu

SIZES = dict(hidden_size=256, num_hidden_layers=1, inter=128)  # every grouped GEMM N a multiple of 8
VOCAB = 64


def rel_err(x, ref):
    if x is None or ref is None:
        return 0.0
    ref = ref.double()
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def run(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=ids)
    out.loss.backward()
    torch.cuda.synchronize()
    return out.logits.detach(), out.loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("routed", [False, True])
@pytest.mark.parametrize("name", MODELS)
def test_model_within_2x_grouped_mm_error(name, routed, monkeypatch):
    """Logits, loss and every gradient within 2x the grouped_mm backend's error against fp32
    eager; ``routed``: with ROUTED_TRAINING (plain gated experts train through
    moe.routed_experts)."""
    monkeypatch.setattr(cg_tf, "ROUTED_TRAINING", routed)
    base = tiny_model(name, dtype=torch.float32, device="cuda", **SIZES)
    ref = copy.deepcopy(base)  # fp32, eager experts: the reference
    theirs = copy.deepcopy(base).to(torch.bfloat16)
    theirs.set_experts_implementation("grouped_mm")
    ours = copy.deepcopy(base).to(torch.bfloat16)
    ours.set_experts_implementation("cutegemm")
    ids = torch.randint(0, VOCAB, (4, 64), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    r_logits, r_loss, r_grads = run(ref, ids)
    t_logits, t_loss, t_grads = run(theirs, ids)
    o_logits, o_loss, o_grads = run(ours, ids)
    floor = 2e-3

    def check(what, o, t, r):
        assert o is None or torch.isfinite(o).all(), f"{name} {what}: not finite"
        eo, et = rel_err(o, r), rel_err(t, r)
        assert eo <= 2 * et + floor, f"{name} {what}: rel err {eo:.3g} > 2 x grouped_mm {et:.3g} + {floor}"

    check("logits", o_logits, t_logits, r_logits)
    check("loss", o_loss, t_loss, r_loss)
    expert_grads = 0
    for n, r in r_grads.items():
        assert (o_grads[n] is None) == (r is None), n
        check(f"grad {n}", o_grads[n], t_grads[n], r)
        expert_grads += r is not None and ("gate_up_proj" in n or "down_proj" in n)
    assert expert_grads >= 2
    with torch.no_grad():
        check("no-grad logits", ours(ids).logits, theirs(ids).logits, r_logits)


@pytest.mark.parametrize("routed", [False, True])
@pytest.mark.parametrize("name", MODELS[:2])
def test_training_step_is_bitwise_deterministic(name, routed, monkeypatch):
    """Two training steps of the same batch give the same loss and gradients bit for bit: the
    dispatch copy's backward sums each token's rows in slot order (cutegemm.moe.gather_tokens,
    not index_select's atomics), the grouped GEMMs have no split-K atomics."""
    monkeypatch.setattr(cg_tf, "ROUTED_TRAINING", routed)
    model = tiny_model(name, dtype=torch.float32, device="cuda", **SIZES).to(torch.bfloat16)
    model.set_experts_implementation("cutegemm")
    ids = torch.randint(0, VOCAB, (4, 64), device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    _, loss_a, grads_a = run(model, ids)
    grads_a = {n: None if g is None else g.clone() for n, g in grads_a.items()}
    _, loss_b, grads_b = run(model, ids)
    assert torch.equal(loss_a, loss_b)
    for n, g in grads_a.items():
        assert (g is None and grads_b[n] is None) or torch.equal(g, grads_b[n]), n


@pytest.mark.parametrize("tokens", [1, 37, 512])
def test_gpt_oss_fused_inference_layer(tokens):
    """gpt-oss's experts layer without a gradient (bias and clamped gate in the grouped GEMMs'
    epilogues), bf16, pre-activations past the clamps at +-7: within 2x the grouped_mm backend's
    error against its fp32 result, into outputs that are then finite; the fused route is taken."""
    model = tiny_model("gpt_oss", dtype=torch.float32, device="cuda", **SIZES)
    experts = next(m for m in model.modules() if type(m).__name__ == "GptOssExperts")
    assert cg_tf._oai_gate(experts)
    g = torch.Generator("cuda").manual_seed(tokens)
    x = torch.randn(tokens, SIZES["hidden_size"], device="cuda", generator=g) * 20
    idx = torch.rand(tokens, experts.num_experts, device="cuda", generator=g).argsort(1)[:, :2]
    w = torch.rand(tokens, 2, device="cuda", generator=g).softmax(-1)
    with torch.no_grad():
        z = x @ experts.gate_up_proj[0] + experts.gate_up_proj_bias[0]
        assert (z.abs() > 7).any() and (z.abs() < 7).any()
        ref = hf_moe.grouped_mm_experts_forward(experts, x, idx, w)
        bf = copy.deepcopy(experts).to(torch.bfloat16)
        ours = cg_tf.experts_forward(bf, x.bfloat16(), idx, w.bfloat16())
        theirs = hf_moe.grouped_mm_experts_forward(bf, x.bfloat16(), idx, w.bfloat16())
    assert torch.isfinite(ours).all()
    eo, et = rel_err(ours, ref), rel_err(theirs, ref)
    assert eo <= 2 * et + 1e-3, f"rel err {eo:.3g} > 2 x grouped_mm {et:.3g}"
