"""CPU plumbing of quantized experts in the transformers experts backend
(cutegemm.integrations.transformers; CPU tensors run the reference twins of the same routes).

- FP8 block-scaled experts, the way transformers' fine-grained FP8 holds them (``FP8Experts``:
  e4m3 weights + fp32 ``*_scale_inv`` per 128x128 block, built here by quantizing the float
  weights per block as its loader does): tiny Qwen3-MoE and DeepSeek-V3 models with
  ``experts_implementation="cutegemm"`` against the same models' eager experts on the dequantized
  weights (the difference is the 1x128 activation quantization), and an experts layer against a
  plain-torch emulation of the quantized math; ue8m0 scales, per-half gate/up grids, the scale
  cache, expert-parallel sentinels, inference-only and unsupported-configuration errors.
- FP4 experts in ``FP8Experts`` (``expert_dtype="fp4"``) as MXFP4 on the weight-only route.
- ``quantize_experts`` (NVFP4 / MXFP4 / MXFP8) on Qwen3-MoE, DeepSeek-V3, Mixtral and gpt-oss
  against eager experts on the dequantized weights (``dequantize_experts``).

The same comparisons on the GPU in bf16: tests/gpu/test_transformers_quant_gpu.py."""

import copy
import inspect
import types

import pytest
import torch

transformers = pytest.importorskip("transformers")
hf_moe = pytest.importorskip("transformers.integrations.moe")
if not hasattr(hf_moe, "ExpertsInterface"):
    pytest.skip("needs transformers >= 5 (ExpertsInterface)", allow_module_level=True)
hf_fp8 = pytest.importorskip("transformers.integrations.finegrained_fp8")

from cutegemm.blockscaled.reference import dequantize_ref, quantize_ref  # noqa: E402
from cutegemm.integrations import transformers as cg_tf  # noqa: E402  (registers "cutegemm")

from ..emulated_kernel import emulated_kernels  # noqa: E402
from .test_transformers_cpu import tiny_model  # noqa: E402

VOCAB = 64
SIZES = dict(hidden_size=256, num_hidden_layers=1)  # two 128-wide K blocks of the hidden size
E4M3 = torch.float8_e4m3fn


# ------------------------------------------------------------------------------- FP8 weights, as transformers


def fp8_blocks(w: torch.Tensor, ue8m0: bool = False):
    """(E, N, K) float -> (e4m3 (E, N, K), scale_inv (E, ceil(N/128), ceil(K/128)) fp32): transformers'
    ``Fp8Quantize`` per 128x128 block (scale_inv = amax / 448, 1 for an all-zero block; ue8m0: rounded up
    to a power of two), with ragged edge blocks padded for the amax."""
    e, n, k = w.shape
    nb, kb = -(-n // 128), -(-k // 128)
    wp = torch.nn.functional.pad(w.float(), (0, kb * 128 - k, 0, nb * 128 - n)).view(e, nb, 128, kb, 128)
    amax = wp.abs().amax(dim=(2, 4))
    scale = torch.where(amax > 0, 448.0 / torch.where(amax > 0, amax, torch.ones_like(amax)), torch.ones_like(amax))
    inv = 1.0 / scale
    if ue8m0:
        inv = torch.pow(2.0, torch.ceil(torch.log2(inv)))
        scale = 1.0 / inv
    q = (wp * scale[:, :, None, :, None]).clamp(-448, 448).to(E4M3).view(e, nb * 128, kb * 128)[:, :n, :k]
    return q.contiguous(), inv


def fp8_dequant(q: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    n, k = q.shape[-2:]
    s = inv.float().repeat_interleave(128, -2)[..., :n, :].repeat_interleave(128, -1)[..., :k]
    return q.float() * s


def fp8_gate_up(w: torch.Tensor, ue8m0: bool = False):
    """gate_up (E, 2I, H) as checkpoints store it: gate and up quantized separately, concatenated
    (weights and scales) by the loader; returns (e4m3, scale_inv, dequantized)."""
    half = w.shape[1] // 2
    (qg, sg), (qu, su) = fp8_blocks(w[:, :half], ue8m0), fp8_blocks(w[:, half:], ue8m0)
    deq = torch.cat([fp8_dequant(qg, sg), fp8_dequant(qu, su)], dim=1)
    return torch.cat([qg, qu], 1), torch.cat([sg, su], 1), deq


_FP8_CLASS = []


def fp8_class():
    """transformers' FP8Experts, decorated as its FP8 quantizer does (once per session)."""
    if not _FP8_CLASS:
        _FP8_CLASS.append(hf_moe.use_experts_implementation(
            experts_class=hf_fp8.FP8Experts, experts_interface=hf_fp8.ALL_FP8_EXPERTS_FUNCTIONS
        ))  # fmt: skip
    return _FP8_CLASS[0]


def fp8_experts(experts, ue8m0: bool = False, **kw):
    """An FP8Experts layer holding ``experts``' weights quantized per 128x128 block, and the
    dequantized (E, out, in) weights (fp32)."""
    new = fp8_class()(experts.config, block_size=(128, 128), scale_fmt="ue8m0" if ue8m0 else "float", **kw)
    gu8, gus, gu = fp8_gate_up(experts.gate_up_proj.detach(), ue8m0)
    d8, ds = fp8_blocks(experts.down_proj.detach(), ue8m0)
    with torch.no_grad():
        new.gate_up_proj.copy_(gu8)
        new.down_proj.copy_(d8)
        new.gate_up_proj_scale_inv = torch.nn.Parameter(gus.to(new.gate_up_proj_scale_inv.dtype), requires_grad=False)
        new.down_proj_scale_inv = torch.nn.Parameter(ds.to(new.down_proj_scale_inv.dtype), requires_grad=False)
    return new, gu, fp8_dequant(d8, ds)


def fp8_model(name: str, ue8m0: bool = False, dtype=torch.float32, **over):
    """(FP8 model on the cutegemm backend, its other parameters in ``dtype``; the same model in fp32
    with eager experts on the dequantized weights), on the CPU."""
    ref = tiny_model(name, **{**SIZES, **over})
    model = copy.deepcopy(ref).to(dtype)
    for mod_name, experts in list(model.named_modules()):
        if mod_name.endswith(".experts"):
            new, gu, down = fp8_experts(experts, ue8m0)
            model.set_submodule(mod_name, new)
            r = ref.get_submodule(mod_name)
            with torch.no_grad():
                r.gate_up_proj.copy_(gu)
                r.down_proj.copy_(down)
    model.set_experts_implementation("cutegemm")
    return model, ref


def rel_err(x, ref):
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


def test_block_quantization_is_transformers_loaders():
    """fp8_blocks equals transformers' own on-the-fly FP8 quantization (Fp8Quantize) bitwise."""
    cfg = transformers.FineGrainedFP8Config(weight_block_size=(128, 128))
    op = hf_fp8.Fp8Quantize(types.SimpleNamespace(quantization_config=cfg))
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 256, 384, generator=g) * torch.rand(3, 256, 1, generator=g)
    got = op.convert({"mlp.experts.gate_up_proj": [w]})
    q, inv = fp8_blocks(w)
    assert torch.equal(got["mlp.experts.gate_up_proj"].view(torch.uint8), q.view(torch.uint8))
    torch.testing.assert_close(got["mlp.experts.gate_up_proj_scale_inv"], inv, rtol=0, atol=0)


def test_registered_with_both_interfaces():
    assert hf_moe.ALL_EXPERTS_FUNCTIONS["cutegemm"] is cg_tf.experts_forward
    assert hf_fp8.ALL_FP8_EXPERTS_FUNCTIONS["cutegemm"] is cg_tf.experts_forward


# ----------------------------------------------------------------------------- activation quantization


@pytest.mark.parametrize("k", [128, 256, 200, 40])
def test_quantize_fp8_1x128(k):
    g = torch.Generator().manual_seed(k)
    x = torch.randn(7, k, generator=g) * torch.logspace(-3, 3, 7).unsqueeze(1)
    x[2] = 0.0
    q, s = cg_tf.quantize_fp8_1x128(x.to(torch.bfloat16))
    kb = -(-k // 128)
    assert q.dtype == E4M3 and q.shape == (7, k) and q.is_contiguous()
    assert s.dtype == torch.float32 and s.shape == (7, kb) and s.stride() == (1, 8)  # M-major, 4-row aligned
    xb = torch.nn.functional.pad(x.to(torch.bfloat16).float(), (0, kb * 128 - k)).view(7, kb, 128)
    amax = xb.abs().amax(-1)
    torch.testing.assert_close(s, torch.where(amax > 0, amax / 448, torch.ones_like(amax)), rtol=0, atol=0)
    deq = q.float() * s.repeat_interleave(128, 1)[:, :k]
    err = (deq - x.to(torch.bfloat16).float()).abs()
    assert (err <= 2.0**-4 * x.to(torch.bfloat16).float().abs() + s.repeat_interleave(128, 1)[:, :k] * 2.0**-9).all()
    assert (q[2].float() == 0).all() and (s[2] == 1).all()


# ------------------------------------------------------------------------------------- FP8 whole models


@pytest.mark.parametrize("name", ["qwen3_moe", "deepseek_v3"])
@pytest.mark.parametrize("inter", [128, 192])  # 192: gate and up blocks do not tile the concatenated rows
def test_fp8_model_close_to_eager_on_dequantized_weights(name, inter):
    model, ref = fp8_model(name, inter=inter)
    (experts, *_) = [m for m in model.modules() if isinstance(m, hf_fp8.FP8Experts)]
    assert experts.gate_up_proj.dtype == E4M3 and experts.gate_up_proj_scale_inv.shape[1] == 2 * -(-inter // 128)
    ids = torch.randint(0, VOCAB, (2, 13), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got, want = model(ids).logits, ref(ids).logits
    assert torch.isfinite(got).all()
    # 1x128 e4m3 activations (2^-4 relative rounding) in both projections: measured 1.3-1.6% (Qwen3-MoE),
    # 3.0-3.1% (DeepSeek-V3: 8 experts, scaled routing) with these seeds; the layer test checks the math exactly
    assert rel_err(got, want) < 5e-2
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, got, rtol=0, atol=0)


def _routing(t, e, k, hidden, seed, sentinel_every=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, hidden, generator=g)
    idx = torch.rand(t, e, generator=g).argsort(1)[:, :k]
    w = torch.rand(t, k, generator=g).softmax(-1)
    if sentinel_every:
        idx[::sentinel_every, 0] = e  # expert parallelism: another rank's expert
        w[::sentinel_every, 0] = 0.0
    return x, idx, w


def _emulated_fp8(x, idx, w, gu, down, e):
    """The quantized math in plain torch, per (token, slot): 1x128-quantized x times the dequantized
    gate_up, silu(gate) * up, quantized again, times the dequantized down, weighted, summed."""
    out = torch.zeros_like(x, dtype=torch.float64)

    def deq(a):
        q, s = cg_tf.quantize_fp8_1x128(a)
        return q.double() * s.double().repeat_interleave(128, 1)[:, : a.shape[1]]

    for t in range(x.shape[0]):
        for j in range(idx.shape[1]):
            ex = int(idx[t, j])
            if ex >= e:
                continue
            z = deq(x[t : t + 1]) @ gu[ex].double().t()
            gate, up = z.chunk(2, dim=-1)
            h = (torch.nn.functional.silu(gate) * up).float()
            out[t] += w[t, j].double() * (deq(h) @ down[ex].double().t())[0]
    return out


@pytest.mark.parametrize("inter", [128, 64])
@pytest.mark.parametrize("sentinels", [False, True])
def test_fp8_layer_is_the_quantized_math(inter, sentinels):
    model = tiny_model("qwen3_moe", inter=inter, **SIZES)
    (experts, *_) = [m for m in model.modules() if hasattr(m, "gate_up_proj")]
    fp8, gu, down = fp8_experts(experts)
    fp8.config._experts_implementation = "cutegemm"
    fp8._is_expert_parallel = sentinels
    x, idx, w = _routing(11, fp8.num_experts, 2, 256, seed=inter, sentinel_every=3 if sentinels else 0)
    with torch.no_grad():
        got = fp8(x, idx, w)
    want = _emulated_fp8(x, idx, w, gu, down, fp8.num_experts)
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    assert rel_err(got, want) < 1e-3  # fp32 sums in another order, rarely an e4m3 rounding flipped


@pytest.mark.parametrize("inter", [128, 192])
def test_fp8_layer_through_the_kernel_host_path(monkeypatch, inter):
    """The CUDA route's host path on CPU tensors (tests/emulated_kernel.py computes what the kernel
    would from the views it is handed): the weights and scale grids as views, the per-half GEMMs
    writing their columns of one output, the 1x128 scales' layout; equal to the reference route."""
    model = tiny_model("qwen3_moe", inter=inter, **SIZES)
    (experts, *_) = [m for m in model.modules() if hasattr(m, "gate_up_proj")]
    fp8, *_ = fp8_experts(experts)
    fp8.config._experts_implementation = "cutegemm"
    x, idx, w = _routing(21, fp8.num_experts, 2, 256, seed=7)
    with torch.no_grad():
        want = fp8(x, idx, w)

    def kernel_route(a, b, offs, out_dtype, out=None, **scales):  # what CUDA tensors take
        return cg_tf.grouped_gemm(a, b, offs=offs, out=out, out_dtype=out_dtype, **scales)

    monkeypatch.setattr(cg_tf, "_grouped", kernel_route)
    with emulated_kernels() as cache, torch.no_grad():
        got = fp8(x, idx, w)
        got_again = fp8(x, idx, w)  # the warm plans
    assert all(k.cfg.fp8_blockwise and k.cfg.grouped for k in cache.kernels) and cache.kernels
    assert sum(k.calls for k in cache.kernels) == 2 * (3 if inter % 128 else 2)  # per-half gate/up: 2 GEMMs
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_again, got, rtol=0, atol=0)


def test_fp8_weights_are_read_in_place():
    """b and scale_b are views of the parameters (no per-call copies of the weights)."""
    (experts, *_) = [m for m in tiny_model("qwen3_moe", inter=192, **SIZES).modules() if hasattr(m, "gate_up_proj")]
    fp8, *_ = fp8_experts(experts)
    for name in ("gate_up_proj", "down_proj"):
        w, s = getattr(fp8, name), getattr(fp8, f"{name}_scale_inv")
        parts = cg_tf._fp8_parts(fp8, name)
        assert len(parts) == (2 if name == "gate_up_proj" else 1)
        for _, b, sb in parts:
            assert b.untyped_storage().data_ptr() == w.untyped_storage().data_ptr() and b.stride(1) == 1
            assert sb.untyped_storage().data_ptr() == s.untyped_storage().data_ptr()


def test_fp8_ue8m0_scales_cached_and_equal_to_fp32():
    torch.manual_seed(0)
    model = tiny_model("qwen3_moe", inter=128, **SIZES)
    (experts, *_) = [m for m in model.modules() if hasattr(m, "gate_up_proj")]
    e8, *_ = fp8_experts(experts, ue8m0=True)
    f32 = copy.deepcopy(e8)
    with torch.no_grad():
        for name in ("gate_up_proj_scale_inv", "down_proj_scale_inv"):
            setattr(f32, name, torch.nn.Parameter(getattr(e8, name).float(), requires_grad=False))
    assert e8.down_proj_scale_inv.dtype == torch.float8_e8m0fnu
    for m in (e8, f32):
        m.config._experts_implementation = "cutegemm"
    x, idx, w = _routing(9, e8.num_experts, 2, 256, seed=1)
    with torch.no_grad():
        got = e8(x, idx, w)
        torch.testing.assert_close(got, f32(x, idx, w), rtol=0, atol=0)
        first = cg_tf._fp8_parts(e8, "down_proj")[0][2]
        assert cg_tf._fp8_parts(e8, "down_proj")[0][2].data_ptr() == first.data_ptr()  # the cached conversion
        e8.down_proj_scale_inv.view(torch.uint8).add_(1)  # every scale doubled, in place: a new version
        assert cg_tf._fp8_parts(e8, "down_proj")[0][2].data_ptr() != first.data_ptr()
        torch.testing.assert_close(e8(x, idx, w), 2 * got, rtol=1e-6, atol=1e-6)


def test_fp8_inference_only_and_unsupported():
    model, _ = fp8_model("qwen3_moe", inter=128)
    ids = torch.randint(0, VOCAB, (1, 5))
    with pytest.raises(RuntimeError, match="inference only"):
        model(ids)  # grad mode on, parameters requiring grad
    (experts, *_) = [m for m in model.modules() if isinstance(m, hf_fp8.FP8Experts)]
    x, idx, w = _routing(4, experts.num_experts, 2, 256, seed=0)
    with torch.no_grad():
        experts.block_size = (1, 128)
        with pytest.raises(NotImplementedError, match="128x128"):
            experts(x, idx, w)
        experts.block_size, experts.activation_scheme = (128, 128), "static"
        with pytest.raises(NotImplementedError, match="dynamically"):
            experts(x, idx, w)


# ------------------------------------------------------------------------ FP4 experts in FP8Experts (MXFP4)


def test_fp4_experts_run_as_mxfp4():
    if "expert_dtype" not in inspect.signature(hf_fp8.FP8Experts.__init__).parameters:
        pytest.skip("this transformers' FP8Experts has no FP4 expert weights")
    model = tiny_model("qwen3_moe", inter=128, **SIZES)
    (experts, *_) = [m for m in model.modules() if hasattr(m, "gate_up_proj")]
    fp4 = fp8_class()(experts.config, block_size=(128, 128), scale_fmt="ue8m0", expert_dtype="fp4")
    ref = copy.deepcopy(experts)
    with torch.no_grad():
        for name in ("gate_up_proj", "down_proj"):
            q = quantize_ref(getattr(experts, name).detach(), "mxfp4", swizzle=False)
            assert getattr(fp4, name).dtype == torch.int8
            getattr(fp4, name).copy_(q.data.view(torch.int8))
            getattr(fp4, f"{name}_scale_inv").copy_(q.scales)
            getattr(ref, name).copy_(dequantize_ref(q))
    fp4.config._experts_implementation = "cutegemm"
    x, idx, w = _routing(10, fp4.num_experts, 2, 256, seed=4)
    with torch.no_grad():
        got = fp4(x, idx, w)
        want = hf_moe.grouped_mm_experts_forward(ref, x.to(torch.bfloat16).float(), idx, w)
    assert rel_err(got, want) < 1e-2  # the weight-only route runs bf16 activations (and a bf16 gate input)
    assert cg_tf._packed_fp4(fp4, "down_proj") is cg_tf._packed_fp4(fp4, "down_proj")  # cached


# ------------------------------------------------------------------------------------- quantize_experts


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
@pytest.mark.parametrize("name", ["qwen3_moe", "deepseek_v3", "mixtral", "gpt_oss"])
def test_quantize_experts_close_to_eager_on_dequantized_weights(name, fmt):
    base = tiny_model(name, inter=64, hidden_size=64, num_hidden_layers=1)
    model = copy.deepcopy(base)
    assert cg_tf.quantize_experts(model, fmt) == 1
    assert model.config._experts_implementation == "cutegemm"
    (experts, *_) = [m for m in model.modules() if getattr(m, "cutegemm_format", None)]
    proj = "gate_up_proj" if experts.has_gate else "up_proj"
    assert not hasattr(experts, proj) and experts.get_buffer(f"{proj}_qdata").dtype == torch.uint8
    ref = copy.deepcopy(model)
    assert cg_tf.dequantize_experts(ref) == 1
    ref.set_experts_implementation("eager")
    (restored, *_) = [m for m in ref.modules() if hasattr(m, proj) and hasattr(m, "has_gate")]
    orig = [m for m in base.modules() if hasattr(m, proj) and hasattr(m, "has_gate")][0]
    assert getattr(restored, proj).shape == getattr(orig, proj).shape
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got, want, full = model(ids).logits, ref(ids).logits, base(ids).logits
    assert torch.isfinite(got).all()
    assert rel_err(got, want) < 2e-2  # bf16 activations into the weight-only route vs fp32 eager
    assert rel_err(got, full) < 0.3  # and a sane quantization of the float model
    with pytest.raises(RuntimeError, match="inference only"):
        model(ids)


def test_quantize_experts_layer_with_sentinels_matches_grouped_mm():
    """Expert-parallel sentinel slots on the weight-only route: the result equals transformers'
    grouped_mm backend on the dequantized weights (bf16 activations both)."""
    (experts, *_) = [m for m in tiny_model("qwen3_moe", inter=64, **SIZES).modules() if hasattr(m, "gate_up_proj")]
    cg_tf.quantize_experts(experts, "nvfp4")
    ref = copy.deepcopy(experts)
    cg_tf.dequantize_experts(ref)
    experts._is_expert_parallel = ref._is_expert_parallel = True
    x, idx, w = _routing(13, experts.num_experts, 2, 256, seed=6, sentinel_every=4)
    x = x.to(torch.bfloat16).float()
    with torch.no_grad():
        got = cg_tf.experts_forward(experts, x, idx, w)
        want = hf_moe.grouped_mm_experts_forward(ref, x, idx, w)
    assert torch.isfinite(got).all()
    assert rel_err(got, want) < 1e-2


def test_quantize_experts_buffers_survive_dtype_casts_and_rules():
    model = tiny_model("qwen3_moe", inter=64, hidden_size=64, num_hidden_layers=1)
    cg_tf.quantize_experts(model, "nvfp4")
    (experts, *_) = [m for m in model.modules() if getattr(m, "cutegemm_format", None)]
    q = cg_tf._held_weight(experts, "down_proj")
    assert q is cg_tf._held_weight(experts, "down_proj")  # one object: the weight-only plan cache's key
    model.to(torch.bfloat16)  # casts float parameters; the quantized bytes and the global scale stay
    q2 = cg_tf._held_weight(experts, "down_proj")
    assert torch.equal(q2.data.view(torch.uint8), q.data.view(torch.uint8)) and q2.global_scale.dtype == torch.float32
    ids = torch.randint(0, VOCAB, (1, 7))
    with torch.no_grad():
        assert model(ids).logits.dtype == torch.bfloat16
    assert cg_tf.quantize_experts(model, "nvfp4") == 0  # already quantized: left alone
    with pytest.raises(ValueError, match="fmt must be"):
        cg_tf.quantize_experts(model, "mxfp8_e5m2")
    fp8, _ = fp8_model("qwen3_moe", inter=128)
    with pytest.raises(TypeError, match="already quantized"):
        cg_tf.quantize_experts(fp8, "nvfp4")
