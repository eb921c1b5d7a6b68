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
- anything else (biases, a model's own gate such as gpt-oss's clamped ``(up + 1) * gate *
  sigmoid(alpha * gate)``, ungated experts, a post-expert norm): both projections through
  ``torch.ops.cutegemm.grouped_gemm`` (differentiable custom op), with the bias, the model's own
  ``_apply_gate`` / ``act_fn`` and the norm in torch, exactly as transformers' ``grouped_mm``
  backend composes them.

Devices: CUDA tensors run cutegemm's kernels (bf16 / fp16 expert weights; the hidden states are
cast to the weights' dtype as transformers does); CPU tensors run the reference twins (fp32 math,
any float dtype), which is what the CPU plumbing test exercises. Expert parallelism: slots whose
expert id is at or past ``num_experts`` (transformers' EP sentinels) sort last, past ``offs[-1]``:
they cost no GEMM work and contribute nothing (their rows are masked), as in ``grouped_mm``.
Not CUDA-graph capturable where the K-grouped weight gradient reads offs on the host (non-sm_90a
GPUs); the forward always is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.integrations import moe as hf_moe

from ..moe import grouped_experts, zero_rows_past_end

NAME = "cutegemm"
KERNEL_DTYPES = (torch.bfloat16, torch.float16)
DEFAULT_GATE = getattr(hf_moe, "_default_apply_gate", None)  # transformers' act_fn(gate) * up


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


def _inverse(perm: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(perm).scatter_(0, perm, torch.arange(perm.numel(), device=perm.device))


def _generic_mlp(experts, x, ids, offs, sentinels):
    """The expert MLP for anything but plain gated experts, composed like transformers'
    ``grouped_mm`` backend with ``torch.ops.cutegemm.grouped_gemm`` for both projections."""
    op = torch.ops.cutegemm.grouped_gemm
    transposed = experts.is_transposed
    if experts.has_gate:
        w_up, b_up = experts.gate_up_proj, getattr(experts, "gate_up_proj_bias", None)
    else:
        w_up, b_up = experts.up_proj, getattr(experts, "up_proj_bias", None)
    z = op(x, _b(w_up, transposed), offs)
    if sentinels:
        z = zero_rows_past_end(z, offs)
    if experts.has_bias:
        z = z + b_up[ids]
    h = experts._apply_gate(z) if experts.has_gate else experts.act_fn(z)
    y = op(h.to(x.dtype), _b(experts.down_proj, transposed), offs)
    if experts.has_bias:
        y = y + experts.down_proj_bias[ids]
    return y


def experts_forward(experts, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """transformers' experts forward signature: hidden_states (T, H), top_k_index (T, k) expert
    ids, top_k_weights (T, k) routing weights -> (T, H) in hidden_states' dtype."""
    if hidden_states.dim() != 2 or top_k_index.dim() != 2 or top_k_index.shape[0] != hidden_states.shape[0]:
        raise ValueError(
            "the cutegemm experts backend takes hidden_states (tokens, hidden) and top_k_index (tokens, k), "
            f"got {tuple(hidden_states.shape)} and {tuple(top_k_index.shape)}"
        )
    weight = experts.gate_up_proj if experts.has_gate else experts.up_proj
    if hidden_states.is_cuda and weight.dtype not in KERNEL_DTYPES:
        raise TypeError(
            f"the cutegemm experts backend runs bf16 / fp16 expert weights on CUDA, got {weight.dtype} "
            f"({type(experts).__name__}); load the model with dtype=torch.bfloat16"
        )
    T, H = hidden_states.shape
    k = top_k_index.shape[1]
    E = experts.num_experts
    sentinels = bool(getattr(experts, "_is_expert_parallel", False))

    # Sort the (token, slot) pairs by expert (stable: deterministic); EP sentinels (>= E) sort last.
    expert_ids = top_k_index.reshape(-1)
    order = torch.argsort(expert_ids, stable=True)
    ids = expert_ids.index_select(0, order)
    counts = torch.zeros(E + 1, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, ids.clamp(0, E).long(), torch.ones_like(ids, dtype=torch.int64))
    offs = counts[:E].cumsum(0).to(torch.int32)
    if sentinels:
        ids = ids.clamp(0, E - 1)  # in-bounds bias gathers; those rows are masked

    x = hidden_states.index_select(0, torch.div(order, k, rounding_mode="floor")).to(weight.dtype)
    activation = _gated_activation(experts)
    if activation is not None:
        layout = "halves" if experts.is_concatenated else "interleaved"
        y = grouped_experts(x, _b(experts.gate_up_proj, experts.is_transposed),
                            _b(experts.down_proj, experts.is_transposed), offs, activation=activation,
                            gate_layout=layout)  # fmt: skip
    else:
        y = _generic_mlp(experts, x, ids, offs, sentinels)
    if sentinels:
        y = zero_rows_past_end(y, offs)  # rows past offs[-1] are not written by the kernels
    if getattr(experts, "has_post_expert_norm", False):
        y = experts.post_expert_norm(y)

    weighted = y * top_k_weights.reshape(-1).index_select(0, order).unsqueeze(-1)
    out = weighted.index_select(0, _inverse(order)).view(T, k, H).sum(dim=1)
    return out.to(hidden_states.dtype)


def register(name: str = NAME) -> None:
    """Register :func:`experts_forward` with transformers' ``ExpertsInterface`` under ``name``."""
    hf_moe.ExpertsInterface.register(name, experts_forward)


if not hasattr(hf_moe, "ExpertsInterface"):
    raise ImportError("cutegemm.integrations.transformers needs transformers >= 5 (its ExpertsInterface)")
register()

__all__ = ["NAME", "experts_forward", "register"]
