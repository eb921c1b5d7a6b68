"""CPU plumbing of the transformers experts backend (cutegemm.integrations.transformers).

Tiny random-initialised Qwen3-MoE, Mixtral, OLMoE, DeepSeek-V3 and gpt-oss models (fp32, CPU: the
backend runs cutegemm's reference twins) with ``experts_implementation="cutegemm"`` against the same
model with transformers' ``"eager"`` experts: logits, loss and the gradient of every parameter,
and the no-grad forward. Also: which route each experts class takes, the interleaved / transposed
storages, expert-parallel sentinel slots against transformers' ``grouped_mm`` backend, the
registration, torch.compile(fullgraph=True) of an experts layer, and that ``import cutegemm``
never imports transformers. Skipped when transformers (>= 5) is not installed (CI installs the
``transformers`` extra). The same models in bf16 on the GPU: tests/gpu/test_transformers_gpu.py."""

import copy
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")
hf_moe = pytest.importorskip("transformers.integrations.moe")
if not hasattr(hf_moe, "ExpertsInterface"):
    pytest.skip("needs transformers >= 5 (ExpertsInterface)", allow_module_level=True)

from cutegemm.epilogue import interleave_gate_up  # noqa: E402
from cutegemm.integrations import transformers as cg_tf  # noqa: E402  (registers "cutegemm")

VOCAB = 64
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
MODELS = ["qwen3_moe", "mixtral", "olmoe", "deepseek_v3", "gpt_oss"]


def tiny_config(name: str, inter: int = 16, **over):
    """A small random-initialisable config of each model family (hidden 32, 2 layers, 4-8 experts,
    expert intermediate size ``inter``); ``over`` overrides the shared sizes."""
    c = {**COMMON, **over}
    if name == "qwen3_moe":
        kw = dict(
            moe_intermediate_size=inter,
            intermediate_size=3 * inter,
            num_experts=6,
            num_experts_per_tok=2,
            head_dim=8,
            norm_topk_prob=True,
        )
        return transformers.Qwen3MoeConfig(**c, **kw)
    if name == "mixtral":
        return transformers.MixtralConfig(
            **c, intermediate_size=inter, num_local_experts=4, num_experts_per_tok=2
        )
    if name == "olmoe":
        return transformers.OlmoeConfig(**c, intermediate_size=inter, num_experts=6, num_experts_per_tok=2)
    if name == "deepseek_v3":
        c["num_key_value_heads"] = c["num_attention_heads"]  # MLA
        kw = dict(
            intermediate_size=3 * inter,
            moe_intermediate_size=inter,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_shared_experts=1,
            first_k_dense_replace=0,
            n_group=2,
            topk_group=1,
            q_lora_rank=16,
            kv_lora_rank=16,
            qk_nope_head_dim=8,
            qk_rope_head_dim=8,
            v_head_dim=8,
        )
        return transformers.DeepseekV3Config(**c, **kw)
    if name == "gpt_oss":
        kw = dict(
            intermediate_size=inter, num_local_experts=4, num_experts_per_tok=2, head_dim=8, sliding_window=16
        )
        return transformers.GptOssConfig(**c, **kw)
    raise ValueError(name)


def tiny_model(name: str, dtype=torch.float32, device="cpu", seed=0, **over):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        tiny_config(name, **over), experts_implementation="eager", dtype=dtype
    )
    return model.to(device)


def experts_modules(model):
    return [m for m in model.modules() if hasattr(m, "gate_up_proj") or hasattr(m, "up_proj_bias")]


def run(model, ids):
    """(logits, loss, {name: grad}) of one training step."""
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=ids)
    out.loss.backward()
    return out.logits.detach(), out.loss.detach(), {n: p.grad for n, p in model.named_parameters()}


# ---------------------------------------------------------------------------------------------- whole models


@pytest.mark.parametrize("name", MODELS)
def test_model_matches_eager_forward_and_gradients(name):
    eager = tiny_model(name)
    ours = copy.deepcopy(eager)
    ours.set_experts_implementation("cutegemm")
    assert ours.config._experts_implementation == "cutegemm"
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(1))
    logits_e, loss_e, grads_e = run(eager, ids)
    logits_o, loss_o, grads_o = run(ours, ids)
    torch.testing.assert_close(logits_o, logits_e, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss_o, loss_e, atol=1e-6, rtol=1e-6)
    assert grads_o.keys() == grads_e.keys()
    expert_grads = 0
    for n, ge in grads_e.items():
        go = grads_o[n]
        assert (go is None) == (ge is None), n
        if ge is not None:
            torch.testing.assert_close(go, ge, atol=1e-5, rtol=1e-4, msg=lambda m, n=n: f"{n}: {m}")
            expert_grads += ("gate_up_proj" in n or "down_proj" in n) and ge.abs().max().item() > 0
    assert expert_grads >= 4, "the expert weights must receive gradients"
    with torch.no_grad():  # inference: the no-grad route
        torch.testing.assert_close(ours(ids).logits, logits_e, atol=1e-5, rtol=1e-5)


def _matches_eager(name, seed):
    """One training step of a tiny model with transformers' eager experts and with ours: logits,
    loss and every gradient match. Returns our model, the batch and eager's logits."""
    eager = tiny_model(name)
    ours = copy.deepcopy(eager)
    ours.set_experts_implementation("cutegemm")
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(seed))
    logits_e, loss_e, grads_e = run(eager, ids)
    logits_o, loss_o, grads_o = run(ours, ids)
    torch.testing.assert_close(logits_o, logits_e, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss_o, loss_e, atol=1e-6, rtol=1e-6)
    for n, ge in grads_e.items():
        if ge is not None:
            torch.testing.assert_close(grads_o[n], ge, atol=1e-5, rtol=1e-4, msg=lambda m, n=n: f"{n}: {m}")
    return ours, ids, logits_e


@pytest.mark.parametrize("name", MODELS[:2])
def test_fused_gather_route_matches(name, monkeypatch):
    """FUSED_DISPATCH on: the gated experts get the tokens, the dispatch index and the routing
    weights (on the CPU the layer makes the copy and weights the rows itself); training and
    inference match eager as before."""
    monkeypatch.setattr(cg_tf, "FUSED_DISPATCH", True)
    ours, ids, logits_e = _matches_eager(name, 2)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, logits_e, atol=1e-5, rtol=1e-5)


def test_from_config_with_cutegemm():
    model = transformers.AutoModelForCausalLM.from_config(
        tiny_config("qwen3_moe"), experts_implementation="cutegemm"
    )
    assert model.config._experts_implementation == "cutegemm"
    ids = torch.randint(0, VOCAB, (1, 5))
    assert torch.isfinite(model(ids).logits).all()


# ------------------------------------------------------------------------------------------- routes, layouts


def test_routes():
    """Plain SwiGLU experts take grouped_experts (halves layout); gpt-oss (biases, clamped custom
    gate, interleaved, transposed) takes the generic custom-op route when training and the fused
    swiglu_oai epilogue without a gradient."""
    for name in ("qwen3_moe", "mixtral", "olmoe", "deepseek_v3"):
        (experts, *_) = experts_modules(tiny_model(name))
        assert cg_tf._gated_activation(experts) == "swiglu", name
        assert experts.is_concatenated and not experts.is_transposed
        assert not cg_tf._oai_gate(experts), name
    (experts, *_) = experts_modules(tiny_model("gpt_oss"))
    assert cg_tf._gated_activation(experts) is None
    assert experts.has_bias and experts.is_transposed and not experts.is_concatenated
    assert cg_tf._oai_gate(experts)  # without a gradient: bias and gate in the GEMMs' epilogues
    experts.limit = 6.0
    assert not cg_tf._oai_gate(experts)  # another clamp than the epilogue's: the generic route


def test_gpt_oss_fused_inference_route():
    """gpt-oss without a gradient (bias and clamped gate in the grouped GEMMs' epilogues), with
    expert-parallel sentinels and pre-activations past the clamps at +-7: transformers' grouped_mm
    backend's result."""
    (experts, *_) = experts_modules(tiny_model("gpt_oss"))
    experts._is_expert_parallel = True
    x, idx, w = _routing(17, experts.num_experts, 2, seed=6, sentinel_every=4)
    x = x * 40  # gate / up pre-activations well past the clamps
    with torch.no_grad():
        z = x @ experts.gate_up_proj[0] + experts.gate_up_proj_bias[0]
        assert z.abs().max() > 7 and z.abs().min() < 7
        got = cg_tf.experts_forward(experts, x, idx, w)
        want = hf_moe.grouped_mm_experts_forward(experts, x, idx, w)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


def _routing(T, E, k, seed, sentinel_every=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, 32, generator=g)
    idx = torch.rand(T, E, generator=g).argsort(1)[:, :k]
    w = torch.rand(T, k, generator=g).softmax(-1)
    if sentinel_every:
        idx[::sentinel_every, 0] = E  # an expert-parallel sentinel: another rank's expert
        w[::sentinel_every, 0] = 0.0
    return x, idx, w


def _grads(fn, experts, x, idx, w):
    experts.zero_grad(set_to_none=True)
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = fn(experts, x, idx, w)
    y.square().sum().backward()
    return [y.detach(), x.grad, w.grad, *(p.grad for p in experts.parameters())]


@pytest.mark.parametrize("name", MODELS)
def test_routed_training_matches_eager(name, monkeypatch):
    """ROUTED_TRAINING on: plain gated experts train through moe.routed_experts (one node, no
    gathered rows or expert outputs kept); the model's loss and every gradient match eager, the
    other experts keep their routes."""
    monkeypatch.setattr(cg_tf, "ROUTED_TRAINING", True)
    seen = []
    real = cg_tf.routed_experts
    monkeypatch.setattr(cg_tf, "routed_experts", lambda *a, **kw: seen.append(1) or real(*a, **kw))
    ours, _, _ = _matches_eager(name, 4)
    assert bool(seen) == (cg_tf._gated_activation(experts_modules(ours)[0]) is not None)


def test_routed_training_sentinels_and_storages(monkeypatch):
    """The routed route with expert-parallel sentinel slots and every weight storage: equal to the
    default route (and so to transformers' grouped_mm backend)."""
    (ref, *_) = experts_modules(tiny_model("qwen3_moe"))
    ref._is_expert_parallel = True
    x, idx, w = _routing(17, ref.num_experts, 2, seed=5, sentinel_every=3)
    want = _grads(cg_tf.experts_forward, ref, x, idx, w)
    monkeypatch.setattr(cg_tf, "ROUTED_TRAINING", True)
    got = _grads(cg_tf.experts_forward, ref, x, idx, w)
    for a, b in zip(got, want, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("storage", ["interleaved", "transposed", "interleaved+transposed"])
def test_other_storages_match(storage):
    """The same experts stored interleaved (is_concatenated=False) and / or transposed
    (is_transposed=True) give the same outputs and (re-laid-out) weight gradients."""
    (ref, *_) = experts_modules(tiny_model("qwen3_moe"))
    other = copy.deepcopy(ref)
    with torch.no_grad():
        w1, w2 = other.gate_up_proj.data, other.down_proj.data
        if "interleaved" in storage:
            w1 = interleave_gate_up(w1, dim=1)
            other.is_concatenated = False
        if "transposed" in storage:
            w1, w2 = w1.transpose(1, 2).contiguous(), w2.transpose(1, 2).contiguous()
            other.is_transposed = True
        other.gate_up_proj = torch.nn.Parameter(w1)
        other.down_proj = torch.nn.Parameter(w2)
    x, idx, w = _routing(13, other.num_experts, 2, seed=3)
    got = _grads(cg_tf.experts_forward, other, x, idx, w)
    want = _grads(cg_tf.experts_forward, ref, x, idx, w)
    for a, b in zip(got[:3], want[:3], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    g1, g2 = want[3], want[4]
    if "interleaved" in storage:
        g1 = interleave_gate_up(g1, dim=1)
    if "transposed" in storage:
        g1, g2 = g1.transpose(1, 2), g2.transpose(1, 2)
    torch.testing.assert_close(got[3], g1, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[4], g2, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["qwen3_moe", "gpt_oss"])
def test_expert_parallel_sentinels_match_grouped_mm(name):
    """Slots routed to an expert of another rank (id == num_experts, weight 0) sort past offs[-1]:
    the result and every gradient equal transformers' grouped_mm backend's."""
    (experts, *_) = experts_modules(tiny_model(name))
    experts._is_expert_parallel = True
    x, idx, w = _routing(17, experts.num_experts, 2, seed=5, sentinel_every=3)
    got = _grads(cg_tf.experts_forward, experts, x, idx, w)
    want = _grads(hf_moe.grouped_mm_experts_forward, experts, x, idx, w)
    for a, b in zip(got, want, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_zero_tokens():
    (experts, *_) = experts_modules(tiny_model("mixtral"))
    x, idx, w = _routing(0, experts.num_experts, 2, seed=0)
    out = _grads(cg_tf.experts_forward, experts, x, idx, w)
    assert out[0].shape == (0, 32) and all((g == 0).all() for g in out[3:])


def test_bad_inputs():
    (experts, *_) = experts_modules(tiny_model("qwen3_moe"))
    x, idx, w = _routing(4, experts.num_experts, 2, seed=0)
    with pytest.raises(ValueError, match="hidden_states"):
        cg_tf.experts_forward(experts, x.unsqueeze(0), idx, w)


# ---------------------------------------------------------------------------------------------- registration


def test_registered():
    assert hf_moe.ALL_EXPERTS_FUNCTIONS["cutegemm"] is cg_tf.experts_forward
    cg_tf.register("cutegemm_alias")
    assert hf_moe.ALL_EXPERTS_FUNCTIONS["cutegemm_alias"] is cg_tf.experts_forward


def test_compile_experts_layer_fullgraph():
    torch._dynamo.reset()
    model = tiny_model("qwen3_moe")
    model.set_experts_implementation("cutegemm")
    (experts, *_) = experts_modules(model)
    x, idx, w = _routing(9, experts.num_experts, 2, seed=7)
    compiled = torch.compile(experts, backend="aot_eager", fullgraph=True)
    got = _grads(lambda e, *a: compiled(*a), experts, x, idx, w)
    want = _grads(lambda e, *a: e(*a), experts, x, idx, w)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_import_cutegemm_does_not_import_transformers():
    code = (
        "import sys, cutegemm, cutegemm.ops, cutegemm.nn, cutegemm.moe, cutegemm.parallel, "
        "cutegemm.integrations; "
        "assert 'transformers' not in sys.modules, 'transformers imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
