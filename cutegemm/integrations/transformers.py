"""The ``"cutegemm"`` experts implementation for Hugging Face transformers (>= 5).

    import cutegemm.integrations.transformers  # registers "cutegemm" with transformers' ExpertsInterface
    model = AutoModelForCausalLM.from_pretrained(name, experts_implementation="cutegemm")
    # or, on a loaded model: model.set_experts_implementation("cutegemm")

Importing this module registers :func:`experts_forward` under ``"cutegemm"`` (``register()`` does it
again, e.g. under another name). It serves every experts class transformers decorates with
``@use_experts_implementation`` (Qwen3-MoE, Mixtral, OLMoE, DeepSeek-V3, gpt-oss, ...), for
inference and training, and follows transformers' own ``grouped_mm`` backend step by step: sort the
(token, slot) pairs by expert (stable, on the device), ``offs`` from the per-expert counts (no host
sync), gather the tokens, the expert MLPs as grouped GEMMs, scale by the routing weights, unsort,
sum over the top-k slots (a deterministic reshape + sum, as transformers does).

The expert MLPs, by what the experts class declares:
- plain gated experts (``has_gate``, no bias, no post-expert norm, no clamping ``limit``,
  transformers' default gate ``act(gate) * up`` with a silu or erf-gelu ``act_fn``): through
  :func:`cutegemm.moe.grouped_experts`, the autograd function of ``cutegemm.nn.GroupedExperts``.
  Weights are read in place in either storage (``gate_up_proj`` (E, 2I, H) used as a transposed
  view, or (E, H, 2I) when ``is_transposed``) and either gate/up layout: ``[gate | up]`` halves
  (``is_concatenated``, what Qwen3-MoE, Mixtral, OLMoE and DeepSeek-V3 store) or interleaved.
  Without a gradient and with interleaved weights the activation is fused into the gate/up GEMM's
  epilogue; with halves (the usual checkpoints) the kernels' fused epilogue does not apply (it
  reads interleaved columns; interleaving would copy the weight on every call), so
  ``act(gate) * up`` runs in torch between the two grouped GEMMs (fp32 math). Training saves the
  pre-activations (T k, 2I) and runs the backward as four grouped GEMMs (see :mod:`cutegemm.moe`).
- gpt-oss's experts (interleaved gate / up with biases, its clamped ``(up + 1) * gate *
  sigmoid(alpha * gate)`` at alpha 1.702, limit 7) without a gradient: two grouped GEMMs, the
  gate / up bias and that gate fused into the first one's epilogue (``activation="swiglu_oai"``,
  fp32 math), the down bias into the second's. With a gradient, as below.
- anything else (biases, a model's own gate such as gpt-oss's when training, ungated experts, a
  post-expert norm): both projections through
  ``torch.ops.cutegemm.grouped_gemm`` (differentiable custom op), with the bias, the model's own
  ``_apply_gate`` / ``act_fn`` and the norm in torch, exactly as transformers' ``grouped_mm``
  backend composes them.

Quantized experts, for inference (a forward that would need a gradient raises RuntimeError: run
under ``torch.no_grad()`` / ``torch.inference_mode()``). Both projections through
:func:`cutegemm.grouped_gemm` (CPU tensors: :func:`cutegemm.grouped_gemm_ref`), the bias, the
model's own ``_apply_gate`` / ``act_fn`` and the norm in torch between them, as above:
- FP8 block-scaled weights, transformers' fine-grained FP8 (``FineGrainedFP8Config`` with
  ``weight_block_size=(128, 128)``; DeepSeek-V3 / Qwen3-FP8 checkpoints): its ``FP8Experts``
  hold ``gate_up_proj`` (E, 2I, H) / ``down_proj`` (E, H, I) e4m3 and ``*_scale_inv`` (E,
  ceil(out/128), ceil(in/128)) and dispatch through transformers' FP8 experts interface, where
  "cutegemm" is registered too. Each projection: the activations quantized per token and
  128-wide K block on the device (:func:`quantize_fp8_1x128`), then cutegemm's DeepSeek
  block-scaled FP8 grouped GEMM (sm_90a) with ``b = w.transpose(1, 2)`` and ``scale_b =
  scale_inv.transpose(1, 2)``: views of the parameters, no copy (the kernel reads that scale
  layout K-contiguous in place), bf16 / fp16 / fp32 out. A gate_up scale grid of 2 ceil(I/128)
  rows with I not a multiple of 128 (gate and up quantized separately, as checkpoints store
  them) runs as two GEMMs, one per half. ue8m0 (``float8_e8m0fnu``) scales are converted to fp32
  once and cached (:func:`cached`). ``activation_scheme="static"``, other block sizes and
  transposed FP8 storage raise NotImplementedError.
- FP4 expert weights in ``FP8Experts`` (``expert_dtype="fp4"``: int8 bytes of two e2m1 values,
  ue8m0 scales per 1x32 block) are MXFP4: cutegemm's weight-only grouped kernels (bf16
  activations, weights dequantized in registers), the weight bytes read in place, the scales
  re-laid out once into the 128x4 tile layout (cached).
- NVFP4 / MXFP4 / MXFP8 weights made by :func:`quantize_experts` (any experts class, from its
  bf16 / fp16 / fp32 weights): the weight-only grouped kernels likewise.

Devices: CUDA tensors run cutegemm's kernels (bf16 / fp16 expert weights, the hidden states cast
to the weights' dtype as transformers does; or the quantized ones above); CPU tensors run the
reference twins (fp32 math, any float dtype), which is what the CPU plumbing tests exercise. Expert parallelism: slots whose
expert id is at or past ``num_experts`` (transformers' EP sentinels) sort last, past ``offs[-1]``:
they cost no GEMM work and contribute nothing (their rows are masked), as in ``grouped_mm``.
Not CUDA-graph capturable where the K-grouped weight gradient reads offs on the host (non-sm_90a
GPUs); the forward always is.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from transformers.integrations import moe as hf_moe

from ..api import dequantize, grouped_gemm, grouped_gemm_ref, quantize
from ..blockscaled.formats import MXFP4, get_format
from ..blockscaled.layout import to_swizzled
from ..blockscaled.reference import BlockScaledTensor, dequantize_ref, e8m0_to_float, quantize_ref
from ..epilogue.ops import SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT
from ..gemm.fp8_scales import FP8_BLOCK
from ..moe import (
    combine,
    dispatch,
    gather_tokens,
    grouped_experts,
    routed_experts,
    zero_rows_past_end,
)

try:  # transformers' fine-grained FP8 (its FP8Experts dispatch through their own experts interface)
    from transformers.integrations import finegrained_fp8 as hf_fp8
except ImportError:  # pragma: no cover - a transformers without it
    hf_fp8 = None

NAME = "cutegemm"
KERNEL_DTYPES = (torch.bfloat16, torch.float16)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # what the quantized routes write
# Gated experts' forward without a gradient reads the tokens through the dispatch index
# (grouped_experts(gather_index=...): the sm_90a gather kernel) instead of a permuted copy, and
# scales the rows by their routing weights in the down projection's epilogue (out_scale); the
# gather kernel and the 16-bit row scale pass tests/gpu/test_grouped_gather_gpu.py on the H200.
FUSED_DISPATCH = True
# Gated experts with a gradient: moe.routed_experts (dispatch, experts and combine in one autograd
# node that keeps x, Z and the routing instead of the gathered rows and the expert outputs) instead
# of gather_tokens + grouped_experts + combine. On: 27% less peak memory in the Qwen3-30B-A3B training
# step and level in time (this backend on the H100, two runs: 7.873 against 7.908 ms, routed against
# plain 7.843 / 7.893; bench/RESULTS.md); its GPU tests pass (test_moe_train_gpu, test_transformers_gpu).
ROUTED_TRAINING = True
DEFAULT_GATE = getattr(hf_moe, "_default_apply_gate", None)  # transformers' act_fn(gate) * up
E4M3_MAX = 448.0
FP4_STORAGE = (torch.int8, torch.uint8, torch.float4_e2m1fn_x2)  # transformers' packed e2m1 experts
WEIGHT_FORMATS = ("nvfp4", "mxfp4", "mxfp8")  # quantize_experts: the weight-only kernels' formats


def _gated_activation(experts) -> str | None:
    """The fused route's activation, "swiglu" / "geglu", when the experts compute transformers'
    default ``act_fn(gate) * up`` with silu / erf gelu and nothing else (no bias, norm or
    clamping), else None."""
    if not getattr(experts, "has_gate", False) or getattr(experts, "has_bias", False):
        return None
    if getattr(experts, "has_post_expert_norm", False) or getattr(experts, "limit", None) is not None:
        return None
    if DEFAULT_GATE is None or getattr(type(experts), "_apply_gate", None) is not DEFAULT_GATE:
        return None
    act = getattr(experts, "act_fn", None)
    if isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation":
        return "swiglu"
    if (isinstance(act, torch.nn.GELU) and act.approximate == "none") or (
        type(act).__name__ == "GELUActivation" and getattr(act, "act", None) is F.gelu
    ):
        return "geglu"
    return None


def _b(weight: torch.Tensor, transposed: bool) -> torch.Tensor:
    """The grouped GEMM's b operand (E, in, out) of an expert weight: stored (E, out, in) (the
    default) it is the transposed view, no copy."""
    return weight if transposed else weight.transpose(1, 2)


def _mlp(experts, x, ids, offs, sentinels, project):
    """The expert MLP with both projections by ``project(name, x)`` (``name``: "gate_up_proj" /
    "up_proj", then "down_proj"), the bias, the model's own gate / activation in torch, composed
    like transformers' ``grouped_mm`` backend."""
    up = "gate_up_proj" if experts.has_gate else "up_proj"
    z = project(up, x)
    if sentinels:
        z = zero_rows_past_end(z, offs)
    if experts.has_bias:
        z = z + getattr(experts, f"{up}_bias")[ids]
    h = experts._apply_gate(z) if experts.has_gate else experts.act_fn(z)
    y = project("down_proj", h)
    if experts.has_bias:
        y = y + experts.down_proj_bias[ids]
    return y


def _oai_gate(experts) -> bool:
    """gpt-oss's experts (its class's ``_apply_gate``, interleaved, biases, no norm) at the alpha and
    limit that cutegemm's swiglu_oai epilogue computes."""
    gate = getattr(type(experts), "_apply_gate", None)
    return (getattr(gate, "__qualname__", "") == "GptOssExperts._apply_gate" and experts.has_gate
            and experts.has_bias and not experts.is_concatenated
            and not getattr(experts, "has_post_expert_norm", False)
            and getattr(experts, "alpha", None) == SWIGLU_OAI_ALPHA
            and getattr(experts, "limit", None) == SWIGLU_OAI_LIMIT)  # fmt: skip


def _oai_mlp(experts, x, offs):
    """gpt-oss's expert MLP without a gradient: bias and gate in the gate / up GEMM's epilogue,
    the down bias in the down GEMM's."""
    t = experts.is_transposed
    h = _grouped(x, _b(experts.gate_up_proj, t), offs, None, bias=experts.gate_up_proj_bias, activation="swiglu_oai")
    return _grouped(h, _b(experts.down_proj, t), offs, None, bias=experts.down_proj_bias)


def _generic_mlp(experts, x, ids, offs, sentinels):
    """Anything but plain gated experts: ``torch.ops.cutegemm.grouped_gemm`` (differentiable) for
    both projections."""
    op, transposed, dtype = torch.ops.cutegemm.grouped_gemm, experts.is_transposed, x.dtype

    def project(name, a):
        return op(a.to(dtype), _b(getattr(experts, name), transposed), offs)

    return _mlp(experts, x, ids, offs, sentinels, project)


# ------------------------------------------------------------------------------- quantized experts


def quantize_fp8_1x128(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token, per-128-column FP8 quantization of activations x (T, K) -> (e4m3 (T, K), fp32
    scale_a (T, ceil(K/128))): each 1x128 block's scale is amax / 448 (1 for an all-zero block),
    its elements x / scale rounded to e4m3 (saturating at 448), so ``x ~ e4m3 * scale``. On the
    device, no host sync. scale_a is M-major with its K-block stride rounded up to 4 rows, the
    layout the block-scaled grouped kernel loads in place (DeepGEMM's ``per_token_cast_to_fp8``
    recipe with fp32 scales)."""
    t, k = x.shape
    kb = -(-k // FP8_BLOCK)
    if k % FP8_BLOCK:
        x = F.pad(x, (0, kb * FP8_BLOCK - k))
    blocks = x.reshape(t, kb, FP8_BLOCK)
    amax = torch.linalg.vector_norm(blocks, ord=float("inf"), dim=-1).float()  # exact; no |x| temporary
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    xf = blocks.to(torch.float32, copy=True)  # the one fp32 temporary (4 bytes per element), scaled in place
    q = (
        xf.div_(scale.unsqueeze(-1))
        .clamp_(-E4M3_MAX, E4M3_MAX)
        .to(torch.float8_e4m3fn)
        .view(t, kb * FP8_BLOCK)
    )
    if k % FP8_BLOCK:
        q = q[:, :k].contiguous()
    scale_a = torch.empty(kb, -(-t // 4) * 4, dtype=torch.float32, device=x.device).t()[:t]
    return q, scale_a.copy_(scale)


def _version(t: torch.Tensor):
    try:
        return t._version
    except RuntimeError:  # an inference-mode tensor has no version counter (it cannot change in place)
        return None


def cached(module, key: str, sources: tuple, build):
    """``build()``, cached on ``module`` under ``key`` while each of ``sources`` (tensors) is the
    same object with the same data pointer, device and version counter: an in-place update, a
    ``.data`` swap, ``module.to(...)`` or a replaced parameter rebuilds it. The sources are held
    weakly (the cache keeps no replaced tensor alive)."""
    store = module.__dict__.setdefault("_cutegemm_cache", {})
    sig = tuple((t.data_ptr(), t.device, _version(t)) for t in sources)
    hit = store.get(key)
    if hit is not None and hit[1] == sig and all(r() is t for r, t in zip(hit[0], sources, strict=True)):
        return hit[2]
    value = build()
    store[key] = (tuple(weakref.ref(t) for t in sources), sig, value)
    return value


def _grouped(a, b, offs, out_dtype, out=None, **scales):
    """The packed grouped GEMM by operand type (cutegemm's routes): the kernels on CUDA tensors,
    the reference twins on CPU tensors."""
    if a.is_cuda:
        return grouped_gemm(a, b, offs=offs, out=out, out_dtype=out_dtype, **scales)
    ref = grouped_gemm_ref(a, b, offs=offs, out_dtype=out_dtype, **scales)
    return ref if out is None else out.copy_(ref)


def _check_fp8(experts) -> None:
    block = getattr(experts, "block_size", None)
    if block is None or tuple(block) != (FP8_BLOCK, FP8_BLOCK):
        raise NotImplementedError(
            f"the cutegemm experts backend runs FP8 experts with 128x128 weight blocks "
            f"(weight_block_size=(128, 128)), got block_size={block} ({type(experts).__name__})"
        )
    if getattr(experts, "activation_scheme", "dynamic") != "dynamic":
        raise NotImplementedError("the cutegemm experts backend quantizes FP8 activations dynamically "
                                  f"(activation_scheme='dynamic'), got {experts.activation_scheme!r}")  # fmt: skip
    if experts.is_transposed:
        raise NotImplementedError("the cutegemm experts backend takes FP8 expert weights stored (E, out, in)")


def _fp8_parts(experts, name: str) -> list:
    """[(columns, b, scale_b)] of an FP8 projection: its weight (E, N, K) e4m3 as the grouped
    GEMM's b (E, K, N) and its ``{name}_scale_inv`` (E, ceil(N/128), ceil(K/128)) as scale_b
    (E, ceil(K/128), ceil(N/128)), both transposed views; ue8m0 scales as a cached fp32 copy. A
    gate_up grid of 2 ceil(I/128) rows with I % 128 != 0 gives one part per half."""
    w, s = getattr(experts, name), getattr(experts, f"{name}_scale_inv", None)
    e, n, k = w.shape
    kb, nb = -(-k // FP8_BLOCK), -(-n // FP8_BLOCK)
    if not isinstance(s, torch.Tensor) or s.dim() != 3 or s.shape[0] != e or s.shape[2] != kb:
        raise ValueError(f"{name}_scale_inv must be ({e}, ceil(N/128), {kb}) block scales of the ({e}, {n}, {k}) "
                         f"FP8 weight, got {None if s is None else tuple(s.shape)}")  # fmt: skip
    if s.dtype != torch.float32:
        if s.element_size() != 1 or (
            s.is_floating_point() and s.dtype != torch.float8_e8m0fnu
        ):  # ue8m0 or its bytes
            raise TypeError(f"{name}_scale_inv must be float32 or ue8m0 (float8_e8m0fnu), got {s.dtype}")
        s = cached(experts, f"{name}_scale_fp32", (s,), lambda s=s: e8m0_to_float(s))
    half = n // 2
    hb = -(-half // FP8_BLOCK)
    if name == "gate_up_proj" and n % 2 == 0 and half % FP8_BLOCK and s.shape[1] == 2 * hb:
        return [(slice(0, half), w[:, :half].transpose(1, 2), s[:, :hb].transpose(1, 2)),
                (slice(half, n), w[:, half:].transpose(1, 2), s[:, hb:].transpose(1, 2))]  # fmt: skip
    if s.shape[1] != nb:
        raise ValueError(
            f"{name}_scale_inv has {s.shape[1]} row blocks, the ({e}, {n}, {k}) weight needs {nb}"
        )
    return [(slice(0, n), w.transpose(1, 2), s.transpose(1, 2))]


def _fp8_projection(experts, name: str, x: torch.Tensor, offs, out_dtype) -> torch.Tensor:
    """x (T, K) through an FP8 block-scaled projection: 1x128 activation quantization, then the
    DeepSeek block-scaled grouped GEMM (one per part, into its columns of one output)."""
    x8, scale_a = quantize_fp8_1x128(x)
    parts = _fp8_parts(experts, name)
    if len(parts) == 1:
        return _grouped(x8, parts[0][1], offs, out_dtype, scale_a=scale_a, scale_b=parts[0][2])
    out = torch.empty(x.shape[0], getattr(experts, name).shape[1], dtype=out_dtype, device=x.device)
    for cols, b, scale_b in parts:
        _grouped(x8, b, offs, out_dtype, out=out[:, cols], scale_a=scale_a, scale_b=scale_b)
    return out


def _packed_fp4(experts, name: str) -> BlockScaledTensor:
    """transformers' FP4 experts (int8 bytes of two e2m1, low nibble first; ue8m0 scales per 1x32
    block) as an MXFP4 BlockScaledTensor: the bytes in place, the scales swizzled once (cached)."""
    w, s = getattr(experts, name), getattr(experts, f"{name}_scale_inv", None)
    e, n, k = w.shape[0], w.shape[1], 2 * w.shape[2]
    if not isinstance(s, torch.Tensor) or tuple(s.shape) != (e, n, -(-k // 32)) or s.element_size() != 1:
        raise ValueError(f"{name}_scale_inv must be ({e}, {n}, {-(-k // 32)}) ue8m0 scales (one per 1x32 block) of "
                         f"the FP4 weight, got {None if s is None else (tuple(s.shape), s.dtype)}")  # fmt: skip

    def build():
        scales = to_swizzled(s.detach().view(torch.float8_e8m0fnu))
        return BlockScaledTensor(
            w.detach().view(torch.float4_e2m1fn_x2), scales, MXFP4, torch.Size((e, n, k))
        )

    return cached(experts, f"{name}_mxfp4", (w, s), build)


def _held_weight(experts, name: str) -> BlockScaledTensor:
    """The BlockScaledTensor :func:`quantize_experts` left on the module (views of its byte
    buffers), one object while they are unchanged (the weight-only GEMM caches its plan per
    weight object)."""
    fmt = get_format(experts.cutegemm_format)
    data, scales = getattr(experts, f"{name}_qdata"), getattr(experts, f"{name}_qscales")
    gs = getattr(experts, f"{name}_qglobal_scale", None)

    def build():
        shape = torch.Size((*data.shape[:-1], data.shape[-1] * fmt.elems_per_byte))
        scale = None if gs is None else gs.view(torch.float32).reshape(())
        return BlockScaledTensor(data.view(fmt.elem_dtype), scales.view(fmt.scale_dtype), fmt, shape, scale)

    return cached(experts, f"{name}_q", (data, scales) if gs is None else (data, scales, gs), build)


def _quantized_projection(experts):
    """``project(name, x, offs, out_dtype)`` of quantized experts, or None for float weights."""
    if getattr(experts, "cutegemm_format", None) is not None:
        return lambda name, x, offs, od: _grouped(x.to(torch.bfloat16), _held_weight(experts, name), offs, od)
    weight = experts.gate_up_proj if experts.has_gate else experts.up_proj
    if weight.dtype == torch.float8_e4m3fn:
        _check_fp8(experts)
        return lambda name, x, offs, od: _fp8_projection(experts, name, x, offs, od)
    if weight.dtype in FP4_STORAGE:
        return lambda name, x, offs, od: _grouped(x.to(torch.bfloat16), _packed_fp4(experts, name), offs, od)
    return None


def _inference_only(experts, hidden_states, top_k_weights) -> None:
    if torch.is_grad_enabled() and (
        hidden_states.requires_grad
        or top_k_weights.requires_grad
        or any(p.requires_grad for p in experts.parameters())
    ):
        raise RuntimeError(
            f"quantized experts ({type(experts).__name__}) run inference only in the cutegemm experts backend "
            "(no gradient through FP8 / FP4 expert weights): call the model under torch.no_grad() or "
            "torch.inference_mode()"
        )


def experts_forward(experts, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """transformers' experts forward signature: hidden_states (T, H), top_k_index (T, k) expert
    ids, top_k_weights (T, k) routing weights -> (T, H) in hidden_states' dtype."""
    if hidden_states.dim() != 2 or top_k_index.dim() != 2 or top_k_index.shape[0] != hidden_states.shape[0]:
        raise ValueError(
            "the cutegemm experts backend takes hidden_states (tokens, hidden) and top_k_index (tokens, k), "
            f"got {tuple(hidden_states.shape)} and {tuple(top_k_index.shape)}"
        )
    project = _quantized_projection(experts)
    if project is not None:
        _inference_only(experts, hidden_states, top_k_weights)
        dtype = hidden_states.dtype if hidden_states.dtype in OUT_DTYPES else torch.float32
    else:
        dtype = (experts.gate_up_proj if experts.has_gate else experts.up_proj).dtype
        if hidden_states.is_cuda and dtype not in KERNEL_DTYPES:
            raise TypeError(
                f"the cutegemm experts backend runs bf16 / fp16 expert weights on CUDA, got {dtype} "
                f"({type(experts).__name__}); load the model with dtype=torch.bfloat16"
            )
    T, H = hidden_states.shape
    k = top_k_index.shape[1]
    E = experts.num_experts
    sentinels = bool(getattr(experts, "_is_expert_parallel", False))

    # Sort the (token, slot) pairs by expert (stable: deterministic); EP sentinels (>= E) sort last.
    routing = dispatch(top_k_index, E)
    order, rows, ids, offs = routing.order, routing.rows, routing.experts, routing.offs
    if sentinels:
        ids = ids.clamp(0, E - 1)  # in-bounds bias gathers; those rows are masked

    activation = None if project is not None else _gated_activation(experts)
    # FUSED_DISPATCH: plain gated experts without a gradient read the tokens through the index (no
    # permuted copy) and weight the rows in the down projection; else the copy, whose backward
    # sums each token's rows in slot order, and the weights in torch
    train = torch.is_grad_enabled() and (hidden_states.requires_grad or top_k_weights.requires_grad
                                         or any(p.requires_grad for p in experts.parameters()))  # fmt: skip
    if activation is not None:  # plain gated experts: the weights as the grouped GEMMs' b operands
        w1, w2 = _b(experts.gate_up_proj, experts.is_transposed), _b(experts.down_proj, experts.is_transposed)
        layout = "halves" if experts.is_concatenated else "interleaved"
    if (ROUTED_TRAINING and train and activation is not None and dtype == hidden_states.dtype
            and not getattr(experts, "has_post_expert_norm", False)):  # fmt: skip
        return routed_experts(hidden_states, top_k_index, top_k_weights, w1, w2, activation=activation,
                              gate_layout=layout, routing=routing)  # fmt: skip
    gather = FUSED_DISPATCH and activation is not None and not train
    fuse_weights = gather and not getattr(experts, "has_post_expert_norm", False)
    row_weights = top_k_weights.reshape(-1).index_select(0, order) if fuse_weights else None
    x = hidden_states.to(dtype) if gather else gather_tokens(hidden_states, order, k, rows, routing.inverse).to(dtype)
    if project is not None:
        y = _mlp(experts, x, ids, offs, sentinels, lambda name, a: project(name, a, offs, dtype))
    elif activation is not None:
        y = grouped_experts(x, w1, w2, offs, activation=activation, gate_layout=layout,
                            gather_index=rows if gather else None,
                            out_scale=row_weights.float() if fuse_weights else None)  # fmt: skip
    elif not train and _oai_gate(experts):
        y = _oai_mlp(experts, x, offs)
    else:
        y = _generic_mlp(experts, x, ids, offs, sentinels)
    if sentinels:
        y = zero_rows_past_end(y, offs)  # rows past offs[-1] are not written by the kernels
    if getattr(experts, "has_post_expert_norm", False):
        y = experts.post_expert_norm(y)

    # back per token, weighted and summed over the slots (fp32 sums; one pass in the experts' dtype)
    return combine(y, order, k, None if fuse_weights else top_k_weights, out_dtype=hidden_states.dtype,
                   inverse=routing.inverse)


# ----------------------------------------------------------------- NVFP4 / MXFP4 / MXFP8 expert weights


def _is_experts(module) -> bool:
    """An experts module of transformers' ``@use_experts_implementation`` (Qwen3-MoE, Mixtral, ...)."""
    return hasattr(module, "has_gate") and hasattr(module, "is_transposed") and hasattr(module, "num_experts")


def _projections(experts) -> tuple[str, str]:
    return ("gate_up_proj" if experts.has_gate else "up_proj", "down_proj")


def quantize_experts(model: torch.nn.Module, fmt: str = "nvfp4", *, set_implementation: bool = True) -> int:
    """Quantize the expert weights of every experts module in ``model`` to ``fmt`` ("nvfp4",
    "mxfp4" or "mxfp8") for inference through this backend; returns the number of experts modules
    quantized.

    Each projection weight (``gate_up_proj`` or ``up_proj``, and ``down_proj``; bf16 / fp16 /
    fp32, either storage) is quantized along its input dimension as an (E, out, in)
    :class:`BlockScaledTensor` (``cutegemm.quantize`` on CUDA, ``quantize_ref`` elsewhere; NVFP4:
    one per-tensor global scale per projection), and the parameter is replaced by buffers
    ``{name}_qdata``, ``{name}_qscales`` (128x4 swizzled) and, NVFP4, ``{name}_qglobal_scale`` (fp32),
    held as bytes (uint8, so ``model.to(dtype)`` leaves them alone while ``model.to(device)``
    moves them); the float weights' memory is freed. Biases and everything
    else stay as they are; the model's own gate runs in torch. The module then runs only through
    this backend (``set_implementation`` switches the model to it): both projections on the
    weight-only grouped kernels with bf16 activations. Inference only. Not serializable with
    ``save_pretrained`` / ``from_pretrained`` (transformers has no NVFP4 / MXFP4 experts format):
    quantize after loading. :func:`dequantize_experts` restores float parameters.

    Why a transform after loading and not a transformers quantizer: transformers' own quantized
    experts (fine-grained FP8) replace the experts class at load time and dispatch through their
    own interface, which needs a checkpoint format and a quantizer registered per format; NVFP4
    / MXFP4 experts have neither in transformers, so this takes any loaded model, like torchao's
    ``quantize_``, and keeps the experts class (its gate, biases, norms, routing) unchanged.
    """
    name = get_format(fmt).name if isinstance(fmt, str) else fmt
    if name not in WEIGHT_FORMATS:
        raise ValueError(
            f"fmt must be one of {WEIGHT_FORMATS} (the weight-only grouped kernels' formats), got {fmt!r}"
        )
    count = 0
    for module in model.modules():
        if not _is_experts(module) or getattr(module, "cutegemm_format", None) is not None:
            continue
        weights = [getattr(module, p) for p in _projections(module)]
        if any(not w.is_floating_point() or w.element_size() < 2 for w in weights):
            raise TypeError(f"{type(module).__name__}: quantize_experts takes bf16 / fp16 / fp32 expert weights, got "
                            f"{[w.dtype for w in weights]} (already quantized?)")  # fmt: skip
        with torch.no_grad():
            for proj, w in zip(_projections(module), weights, strict=True):
                wk = (w.transpose(1, 2) if module.is_transposed else w).detach()
                q = quantize(wk.contiguous(), name) if wk.is_cuda else quantize_ref(wk.float(), name)
                delattr(module, proj)
                # bytes (uint8): model.to(dtype) casts floating buffers, FP8 / FP4 ones included
                module.register_buffer(f"{proj}_qdata", q.data.view(torch.uint8))
                module.register_buffer(f"{proj}_qscales", q.scales.view(torch.uint8))
                if q.global_scale is not None:
                    gs = q.global_scale.detach().to(torch.float32).reshape(1)
                    module.register_buffer(f"{proj}_qglobal_scale", gs.view(torch.uint8))
        module.cutegemm_format, module.cutegemm_dtype = name, weights[0].dtype
        count += 1
    if set_implementation and count and hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(NAME)
    return count


def _dequantized(q: BlockScaledTensor, dtype: torch.dtype) -> torch.Tensor:
    """q's values in ``dtype`` (bf16 on a GPU: one kernel pass, no fp32 copy of the weight)."""
    if dtype in (torch.float32, torch.bfloat16, torch.float16):
        return dequantize(q, dtype)
    return dequantize_ref(q).to(dtype)


def dequantize_experts(model: torch.nn.Module, dtype: torch.dtype | None = None) -> int:
    """Undo :func:`quantize_experts`: each quantized projection becomes a float parameter again
    (the dequantized weights, in the storage it had and ``dtype``, by default the dtype it had),
    so any experts implementation can run it. Returns the number of experts modules restored."""
    count = 0
    for module in model.modules():
        if getattr(module, "cutegemm_format", None) is None:
            continue
        for proj in _projections(module):
            w = _dequantized(_held_weight(module, proj), dtype or module.cutegemm_dtype)
            w = (w.transpose(1, 2) if module.is_transposed else w).contiguous()
            for suffix in ("_qdata", "_qscales", "_qglobal_scale"):
                if hasattr(module, proj + suffix):
                    delattr(module, proj + suffix)
            module.register_parameter(proj, torch.nn.Parameter(w))
        del module.cutegemm_format, module.cutegemm_dtype
        module.__dict__.pop("_cutegemm_cache", None)
        count += 1
    return count


def register(name: str = NAME) -> None:
    """Register :func:`experts_forward` under ``name`` with transformers' ``ExpertsInterface`` and
    (where transformers has it) the FP8 experts interface its ``FP8Experts`` dispatch through."""
    hf_moe.ExpertsInterface.register(name, experts_forward)
    if hf_fp8 is not None and hasattr(hf_fp8, "FP8ExpertsInterface"):
        hf_fp8.FP8ExpertsInterface.register(name, experts_forward)


if not hasattr(hf_moe, "ExpertsInterface"):
    raise ImportError("cutegemm.integrations.transformers needs transformers >= 5 (its ExpertsInterface)")
register()

__all__ = ["NAME", "experts_forward", "register", "quantize_experts", "dequantize_experts", "quantize_fp8_1x128",
           "cached"]  # fmt: skip
