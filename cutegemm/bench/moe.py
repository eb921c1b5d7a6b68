"""The MoE expert layer benchmark (``python -m cutegemm bench moe``): one SwiGLU expert layer as the
models run it, forward and forward+backward, several implementations on the same weights and the
same routing in one process. The layer: tokens x (T, H); routing given (seeded random router logits
-> softmax -> top-k, renormalised, in x's dtype as the models pass it); E experts with ``w_gate_up``
(E, 2I, H) and ``w_down`` (E, H, I) (normal, std 0.02: the models' ``initializer_range``); ``out[t]
= sum_j w[t, j] * down(silu(gate) * up)`` of expert ``idx[t, j]``.

Implementations (``IMPLS``), all with the same dispatch (sort the (token, slot) pairs by expert,
offsets from the counts, gather the tokens) and combine (scale by the routing weights, unpermute,
sum over top-k; cutegemm's in one pass, :func:`cutegemm.moe.combine`) except SonicMoE, which fuses
both into its GEMMs:

- ``torch``: transformers' own ``grouped_mm`` experts backend (``grouped_mm_experts_forward``:
  ``torch._grouped_mm`` for gate/up, ``act(gate) * up``, ``torch._grouped_mm`` for down) on a
  transformers-style experts module holding ``[gate | up]`` halves; without transformers,
  :func:`torch_moe`, a re-implementation of it.
- ``cutegemm``: :func:`dispatch` / ``cutegemm.moe.combine`` around :func:`cutegemm.moe.grouped_experts` on
  interleaved gate/up weights (what ``GroupedExperts.forward`` runs): without grad the SwiGLU is
  fused into the gate/up GEMM's epilogue; with grad its autograd function (four grouped GEMMs back).
- ``cutegemm-gather``: as ``cutegemm``, with the tokens and the dispatch index instead of the
  gathered copy (forward: the gather kernel reads the up projection's rows through the index where
  ``policy.gather_pays``, the layer's copy elsewhere).
- ``cutegemm-hf``: cutegemm's transformers backend on the same module as ``torch`` (halves).
- ``sonicmoe``: SonicMoE's ``moe_general_routing_inputs`` (sonic-moe 0.1.2.post1) on interleaved
  weights, its quack GEMMs autotuned (quack's default: the configs are benchmarked on the first
  call of a shape, which the correctness check makes before timing); "not installed" without it.

Per shape and implementation: forward (no grad) and forward+backward (the gradient of a fixed random
dY into x, the routing weights and both weights) in ms, CUDA-event medians of L2-flushed reps
(``runtime.timer.Timer``) in interleaved rounds, the order reversed every other round; TFLOP/s of
the expert GEMMs (forward ``6 T k H I``, forward+backward 3x); the ratio to torch per round
(median [min, max]); peak memory over one call (``max_memory_allocated`` above what was allocated
before: outputs and gradients included); errors against an fp64 reference of the same layer
(``max |diff| / max |ref|`` per tensor); the time to read the layer's weights once.

CPU side (``tests/cpu/test_bench_moe_cpu.py``): the cases, the layer, every route at tiny sizes on
CPU tensors, the timing loop with a stand-in timer, the writers. ``--list`` prints the cases.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
import types
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..epilogue import interleave_gate_up
from ..moe import combine as moe_combine
from ..moe import dispatch as moe_dispatch
from ..moe import gather_tokens, grouped_experts, routed_experts, unpermute_rows
from ..runtime.timer import Timer


@dataclass(frozen=True)
class Shape:
    name: str
    tokens: int  # T
    hidden: int  # H
    intermediate: int  # I, per expert
    experts: int  # E
    top_k: int  # k

    @property
    def flops(self) -> float:
        """Forward flops of the expert GEMMs: gate/up 2 T k H 2I + down 2 T k I H."""
        return 6.0 * self.tokens * self.top_k * self.hidden * self.intermediate

    @property
    def dims(self) -> str:
        return f"T={self.tokens} H={self.hidden} I={self.intermediate} E={self.experts} k={self.top_k}"


SHAPES = [
    Shape("Qwen3-30B-A3B", 16384, 2048, 768, 128, 8),
    Shape("OLMoE-1B-7B", 16384, 2048, 1024, 64, 8),
    Shape("Mixtral-8x7B", 8192, 4096, 14336, 8, 2),
    Shape("DeepSeek-V3", 8192, 7168, 2048, 256, 8),
    Shape("decode Qwen3-30B-A3B", 64, 2048, 768, 128, 8),
]
IMPLS = ("torch", "cutegemm", "cutegemm-gather", "cutegemm-routed", "cutegemm-hf", "sonicmoe")
INIT_STD = 0.02
SPIN_CYCLES = 8_000_000  # ~4 ms of spin before each rep: longer than a fwd+bwd's host work


@dataclass(frozen=True)
class Case:
    shape: Shape
    impl: str


def cases(shapes=SHAPES, impls=IMPLS) -> list[Case]:
    return [Case(s, i) for s in shapes for i in impls]


def select_shapes(spec: str = "") -> list[Shape]:
    """The shapes whose name contains one of the comma-separated words (any case); all when empty."""
    words = [w.strip().lower() for w in spec.split(",") if w.strip()]
    picked = [s for s in SHAPES if not words or any(w in s.name.lower() for w in words)]
    if not picked:
        raise ValueError(f"no MoE shape matches {spec!r}; shapes: {[s.name for s in SHAPES]}")
    return picked


def select_impls(spec: str = "") -> tuple[str, ...]:
    """Comma-separated implementation names (all when empty); torch is always kept (the ratios' base)."""
    names = [w.strip() for w in spec.split(",") if w.strip()] or list(IMPLS)
    bad = [n for n in names if n not in IMPLS]
    if bad:
        raise ValueError(f"unknown MoE implementation(s) {bad}; choose from {IMPLS}")
    return tuple(n for n in IMPLS if n in names or n == "torch")


@dataclass
class Layer:
    """One layer's tensors, shared by every implementation (leaves for the gradients)."""

    shape: Shape
    x: torch.Tensor  # (T, H)
    top_k_index: torch.Tensor  # (T, k) int64 expert ids
    top_k_weights: torch.Tensor  # (T, k) routing weights, x's dtype
    w_gate_up: nn.Parameter  # (E, 2I, H), rows [gate | up] (transformers' storage)
    w_gate_up_il: nn.Parameter  # the same numbers, gate / up rows interleaved (cutegemm's, SonicMoE's)
    w_down: nn.Parameter  # (E, H, I)
    dy: torch.Tensor  # (T, H) the output gradient of every backward


def make_layer(shape: Shape, device="cuda", dtype=torch.bfloat16, seed: int = 0) -> Layer:
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(seed)

    def normal(*size, std=1.0, dt=dtype):
        return torch.empty(size, device=dev, dtype=dt).normal_(0.0, std, generator=gen)

    T, H, I, E, k = shape.tokens, shape.hidden, shape.intermediate, shape.experts, shape.top_k
    x = normal(T, H)
    probs = normal(T, E, dt=torch.float32).softmax(dim=-1)
    top_v, top_i = probs.topk(k, dim=-1)
    top_v = top_v / top_v.sum(dim=-1, keepdim=True)
    w1 = normal(E, 2 * I, H, std=INIT_STD)
    w2 = normal(E, H, I, std=INIT_STD)
    w1_il = interleave_gate_up(w1, dim=1)
    dy = normal(T, H)
    return Layer(shape, x.requires_grad_(), top_i, top_v.to(dtype).requires_grad_(), nn.Parameter(w1),
                 nn.Parameter(w1_il), nn.Parameter(w2), dy)  # fmt: skip



def dispatch(top_k_index: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(order, offs)``: ``order`` sorts the flat (token, slot) pairs ``t * k + j`` by expert
    (stable), ``offs`` (int32, E) is the cumulative end row of each expert, from the counts on
    the device (no host sync)."""
    ids = top_k_index.reshape(-1)
    order = torch.argsort(ids, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, ids, torch.ones_like(ids))
    return order, counts.cumsum(0).to(torch.int32)


def combine(y: torch.Tensor, top_k_weights: torch.Tensor, order: torch.Tensor, tokens: int) -> torch.Tensor:
    """The expert outputs ``y`` (rows in ``order``) back in token order
    (:func:`cutegemm.moe.unpermute_rows`: a gather forward and backward), scaled by their routing
    weights (the products of scaling first, on y's bytes rather than the product's), summed over
    the top-k slots (reshape + sum: deterministic, as transformers does)."""
    k = top_k_weights.shape[-1]
    return (unpermute_rows(y, order).view(tokens, k, -1) * top_k_weights.unsqueeze(-1)).sum(dim=1)


def grouped_mm_torch(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return torch._grouped_mm(a, b, offs=offs)


def grouped_mm_loop(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """CPU fallback for ``torch._grouped_mm`` (2-D x 3-D): one matmul per expert, rows past
    ``offs[-1]`` zero. Reads offs on the host: a fallback, never timed."""
    parts, start = [], 0
    for e, end in enumerate(offs.tolist()):
        parts.append(a[start:end] @ b[e])
        start = end
    parts.append(a.new_zeros(a.shape[0] - start, b.shape[-1]))
    return torch.cat(parts)


def torch_moe(x, top_k_index, top_k_weights, w_gate_up, w_down, act=F.silu, mm=grouped_mm_torch):
    """transformers' ``grouped_mm`` experts backend, re-implemented (the ``torch`` column where
    transformers is not installed): ``w_gate_up`` (E, 2I, H) halves, ``w_down`` (E, H, I), both
    used as transposed views; ``mm`` is ``torch._grouped_mm`` or :func:`grouped_mm_loop`."""
    tokens, k = top_k_index.shape
    order, offs = dispatch(top_k_index, w_down.shape[0])
    rows = x.index_select(0, torch.div(order, k, rounding_mode="floor"))  # torch's dispatch copy
    gate, up = mm(rows, w_gate_up.transpose(1, 2), offs).chunk(2, dim=-1)
    y = mm(act(gate) * up, w_down.transpose(1, 2), offs)
    return combine(y, top_k_weights, order, tokens).to(x.dtype)


def cutegemm_moe(x, top_k_index, top_k_weights, w_gate_up_il, w_down, fused_gather=False):
    """The dispatch by :func:`cutegemm.moe.dispatch` (the same stable sort), then
    :func:`cutegemm.moe.grouped_experts` (interleaved gate/up rows, the
    storage of ``GroupedExperts``; weights used as transposed views), the combine by
    :func:`cutegemm.moe.combine` (one pass forward and backward).
    ``fused_gather``: the tokens and the dispatch index instead of the gathered copy (without a
    gradient the up projection reads the rows through the index; with one the layer copies)."""
    k = top_k_index.shape[1]
    order, rows, _, offs, inverse = moe_dispatch(top_k_index, w_down.shape[0])
    w1, w2 = w_gate_up_il.transpose(1, 2), w_down.transpose(1, 2)
    if fused_gather:
        y = grouped_experts(x, w1, w2, offs, gather_index=rows)
    else:
        y = grouped_experts(gather_tokens(x, order, k, rows, inverse), w1, w2, offs)
    return moe_combine(y, order, k, top_k_weights, inverse=inverse)


def routed_moe(x, top_k_index, top_k_weights, w_gate_up_il, w_down):
    """:func:`cutegemm.moe.routed_experts` on the layer (weights as transposed views)."""
    return routed_experts(x, top_k_index, top_k_weights, w_gate_up_il.transpose(1, 2), w_down.transpose(1, 2))


def sonic_moe(sonic, x, top_k_index, top_k_weights, w_gate_up_il, w_down, stream_id):
    """SonicMoE 0.1.2.post1's general-routing entry point: token indices sorted ascending (int32),
    expert ids (int32), one score per pair; w1 (2I, H, E) interleaved and w2 (H, I, E), both with
    stride order (2, 0, 1), i.e. permuted views of the (E, 2I, H) / (E, H, I) weights."""
    tokens, k = top_k_index.shape
    token_idx = torch.arange(tokens, device=x.device, dtype=torch.int32).unsqueeze(1).expand(-1, k).reshape(-1)  # fmt: skip
    out, _ = sonic.moe_general_routing_inputs(
        x, top_k_weights.reshape(-1), token_idx, top_k_index.reshape(-1).to(torch.int32),
        w_gate_up_il.permute(1, 2, 0), None, w_down.permute(1, 2, 0), None, w_down.shape[0], stream_id,
        sonic.enums.ActivationType.SWIGLU, is_inference_mode_enabled=not torch.is_grad_enabled(),
    )  # fmt: skip
    return out


class Experts(nn.Module):
    """A transformers-style experts module over the layer's weights (shared, not copied): the
    attributes of Qwen3-MoE's / Mixtral's experts (``gate_up_proj`` (E, 2I, H) ``[gate | up]``,
    ``down_proj`` (E, H, I), ``act_fn`` silu). :func:`hf_experts` decorates a subclass with
    transformers' ``use_experts_implementation``, so its forward dispatches on
    ``config._experts_implementation`` as in a model; ``"eager"`` runs :func:`torch_moe`."""

    def __init__(self, config, layer: Layer):
        super().__init__()
        self.config = config
        self.num_experts = layer.shape.experts
        self.hidden_dim, self.intermediate_dim = layer.shape.hidden, layer.shape.intermediate
        self.gate_up_proj = layer.w_gate_up
        self.down_proj = layer.w_down
        self.act_fn = nn.SiLU()

    def forward(self, hidden_states, top_k_index, top_k_weights):
        return torch_moe(hidden_states, top_k_index, top_k_weights, self.gate_up_proj, self.down_proj)


def hf_experts(layer: Layer, hf_moe, implementation: str) -> Experts:
    cls = hf_moe.use_experts_implementation(type("BenchExperts", (Experts,), {}))
    return cls(types.SimpleNamespace(_experts_implementation=implementation, hidden_act="silu"), layer)


def load_transformers():
    """``(transformers.integrations.moe, note)`` with cutegemm's backend registered (importing
    ``cutegemm.integrations.transformers`` registers it), or ``(None, why)``."""
    try:
        from transformers.integrations import moe as hf_moe

        from ..integrations import transformers as backend
    except ImportError as exc:
        return None, f"not installed (transformers >= 5: {exc})"
    return hf_moe, f"transformers, cutegemm backend {backend.NAME!r} registered"


def load_sonicmoe():
    """``(sonicmoe, version)`` or ``(None, why)``: "not installed", or why an installed one did not load."""
    # quack's compile workers take the arch from CUTE_DSL_ARCH (else sm_100a): this GPU's
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        os.environ.setdefault("CUTE_DSL_ARCH", f"sm_{major}{minor}a")
    try:
        import sonicmoe
    except ModuleNotFoundError as exc:
        if exc.name == "sonicmoe":
            return None, "not installed"
        return None, f"import failed: {exc}"
    except Exception as exc:  # noqa: BLE001 (an installed SonicMoE that cannot load is reported, not fatal)
        return None, f"import failed: {type(exc).__name__}: {exc}"
    return sonicmoe, f"sonic-moe {getattr(sonicmoe, '__version__', '?')} moe_general_routing_inputs, autotuned"  # fmt: skip


@dataclass
class Runner:
    name: str
    detail: str  # what runs
    call: Callable[[], torch.Tensor]  # the layer's output; the grad mode picks the route
    w_gate_up: torch.Tensor  # the gate/up leaf it reads
    gate_layout: str  # "halves" or "interleaved"


def build_runner(name: str, layer: Layer) -> Runner | str:
    """The implementation ``name`` on ``layer``, or a string saying why it cannot run."""
    x, idx, rw, w2 = layer.x, layer.top_k_index, layer.top_k_weights, layer.w_down
    if name == "cutegemm":
        return Runner(name, "dispatch in torch, cutegemm.moe.grouped_experts (interleaved gate/up; no grad: "
                      "SwiGLU fused), cutegemm.moe.combine", partial(cutegemm_moe, x, idx, rw, layer.w_gate_up_il, w2),
                      layer.w_gate_up_il, "interleaved")  # fmt: skip
    if name == "cutegemm-gather":
        return Runner(name, "as cutegemm, the dispatch index handed to the layer (no grad: the sm_90a gather "
                      "kernel where policy.gather_pays, else the copy)",
                      partial(cutegemm_moe, x, idx, rw, layer.w_gate_up_il, w2, fused_gather=True),
                      layer.w_gate_up_il, "interleaved")  # fmt: skip
    if name == "cutegemm-routed":
        return Runner(name, "cutegemm.moe.routed_experts: dispatch, experts and combine in one autograd node "
                      "(keeps x, Z and the routing; the backward gathers the rows again)",
                      partial(routed_moe, x, idx, rw, layer.w_gate_up_il, w2), layer.w_gate_up_il, "interleaved")  # fmt: skip
    if name == "sonicmoe":
        sonic, why = load_sonicmoe()
        if sonic is None:
            return why
        stream = torch.cuda.current_stream().cuda_stream if x.is_cuda else 0
        return Runner(name, why, partial(sonic_moe, sonic, x, idx, rw, layer.w_gate_up_il, w2, stream),
                      layer.w_gate_up_il, "interleaved")  # fmt: skip
    if name not in ("torch", "cutegemm-hf"):
        raise ValueError(f"unknown MoE implementation {name!r}; choose from {IMPLS}")
    hf_moe, why = load_transformers()
    if hf_moe is None and name == "torch":
        return Runner(name, "re-implementation of transformers' grouped_mm experts (torch._grouped_mm)",
                      partial(torch_moe, x, idx, rw, layer.w_gate_up, w2), layer.w_gate_up, "halves")  # fmt: skip
    if hf_moe is None:
        return why
    impl = "grouped_mm" if name == "torch" else "cutegemm"
    experts = hf_experts(layer, hf_moe, impl)
    detail = f"transformers experts_implementation={impl!r}, [gate | up] halves"
    return Runner(name, detail, partial(experts, x, idx, rw), layer.w_gate_up, "halves")


def forward(run: Runner) -> torch.Tensor:
    with torch.no_grad():
        return run.call()


def train_step(run: Runner, layer: Layer):
    """``(out, (dx, d_routing, dw_gate_up, dw_down))`` for the output gradient ``layer.dy``."""
    with torch.enable_grad():
        out = run.call()
        leaves = (layer.x, layer.top_k_weights, run.w_gate_up, layer.w_down)
        return out, torch.autograd.grad(out, leaves, layer.dy)


def read_weights(layer: Layer):
    """Read every expert weight once (the bound of a decode step that touches all experts)."""
    return layer.w_gate_up.sum(dtype=torch.float32), layer.w_down.sum(dtype=torch.float32)



@dataclass
class Reference:
    out: torch.Tensor
    dx: torch.Tensor
    d_routing: torch.Tensor  # (T, k)
    weight_err: dict = field(default_factory=dict)  # dw_gate_up, dw_down: rel. errors of given grads


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    """max |a - ref| / max |ref|."""
    if ref.numel() == 0:
        return 0.0
    return ((a.detach().to(ref.dtype) - ref).abs().max() / ref.abs().max().clamp(min=1e-30)).item()


def _as_halves(g: torch.Tensor, gate_layout: str) -> torch.Tensor:
    """One expert's (2I, H) gate/up rows in ``[gate | up]`` order."""
    return g if gate_layout == "halves" else torch.cat([g[0::2], g[1::2]])


def reference(layer: Layer, dtype=torch.float64, weight_grads=None, gate_layout="halves") -> Reference:
    """The layer in ``dtype``, expert by expert with autograd: the output and the gradients of x and
    of the routing weights for ``layer.dy``; with ``weight_grads`` = (dw_gate_up in
    ``gate_layout``, dw_down) of an implementation, their errors against the reference's weight
    gradients, compared expert by expert (one expert's reference gradient in memory at a time)."""
    s = layer.shape
    k = s.top_k
    ids = layer.top_k_index.reshape(-1)
    order = torch.argsort(ids, stable=True)
    ends = torch.bincount(ids, minlength=s.experts).cumsum(0).tolist()
    x = layer.x.detach().to(dtype)
    dy = layer.dy.to(dtype)
    rw = layer.top_k_weights.detach().reshape(-1).to(dtype)
    out = torch.zeros(s.tokens, s.hidden, dtype=dtype, device=x.device)
    dx = torch.zeros_like(out)
    drw = torch.zeros_like(rw)
    diff = {"dw_gate_up": 0.0, "dw_down": 0.0}
    scale = dict.fromkeys(diff, 0.0)
    start = 0
    with torch.enable_grad():
        for e, end in enumerate(ends):
            rows = order[start:end]
            tok = torch.div(rows, k, rounding_mode="floor")
            start = end
            w1 = layer.w_gate_up[e].detach().to(dtype).requires_grad_()
            w2 = layer.w_down[e].detach().to(dtype).requires_grad_()
            xe, we = x[tok].requires_grad_(), rw[rows].requires_grad_()
            gate, up = (xe @ w1.T).chunk(2, dim=-1)
            ye = ((F.silu(gate) * up) @ w2.T) * we.unsqueeze(-1)
            gx, gw, g1, g2 = torch.autograd.grad(ye, (xe, we, w1, w2), dy[tok])
            out.index_add_(0, tok, ye.detach())
            dx.index_add_(0, tok, gx)
            drw[rows] = gw
            if weight_grads is not None:
                for key, got, want in (("dw_gate_up", _as_halves(weight_grads[0][e], gate_layout), g1),
                                       ("dw_down", weight_grads[1][e], g2)):  # fmt: skip
                    diff[key] = max(diff[key], (got.to(dtype) - want).abs().max().item())
                    scale[key] = max(scale[key], want.abs().max().item())
    errs = {key: diff[key] / max(scale[key], 1e-30) for key in diff} if weight_grads is not None else {}
    return Reference(out, dx, drw.view(s.tokens, k), errs)


def check(run: Runner, layer: Layer, dtype=torch.float64) -> dict:
    """An implementation's errors against :func:`reference`: the forward without grad (``out``; the
    route timed as the forward) and the forward+backward (``train_out``, ``dx``, ``d_routing``,
    ``dw_gate_up``, ``dw_down``). Its first calls, so they compile / autotune before any timing."""
    out_fwd = forward(run)
    out, (dx, drw, dw1, dw2) = train_step(run, layer)
    ref = reference(layer, dtype, (dw1, dw2), run.gate_layout)
    return {"out": rel_err(out_fwd, ref.out), "train_out": rel_err(out, ref.out), "dx": rel_err(dx, ref.dx),
            "d_routing": rel_err(drw, ref.d_routing), **ref.weight_err}  # fmt: skip


def peak_mb(fn, device) -> float | None:
    """Peak memory of one ``fn()`` above what was allocated before it (MiB); None off CUDA."""
    if torch.device(device).type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    res = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del res
    return peak / 2**20


def grads_mb(layer: Layer) -> float:
    """Size of the gradients one forward+backward returns (x, routing weights, both weights), MiB."""
    leaves = (layer.x, layer.top_k_weights, layer.w_gate_up, layer.w_down)
    return sum(t.numel() * t.element_size() for t in leaves) / 2**20


def release(device) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()



def time_interleaved(fns: dict, timer, rounds: int, reps: int):
    """``(times, failed)``: ``times[name]`` one ``timer(fn, reps)`` per round, the functions in turn,
    the order reversed every other round (drift hits all alike); a function that raises is
    dropped from the rounds after and named in ``failed`` with the error."""
    times = {name: [] for name in fns}
    failed = {}
    for r in range(rounds):
        names = list(fns) if r % 2 == 0 else list(fns)[::-1]
        for name in names:
            if name in failed:
                continue
            try:
                times[name].append(timer(fns[name], reps))
            except Exception as exc:  # noqa: BLE001 (report and go on)
                failed[name] = f"failed while timing: {type(exc).__name__}: {str(exc)[:200]}"
    return {n: t for n, t in times.items() if n not in failed}, failed


def _median_spread(values):
    return (statistics.median(values), min(values), max(values)) if values else (None, None, None)


def _ratios(base, times):
    """torch time / its time per round: (median, min, max)."""
    if not base or not times:
        return None, None, None
    return _median_spread([b / t for b, t in zip(base, times, strict=False)])


@dataclass
class Result:
    shape: str
    tokens: int
    hidden: int
    intermediate: int
    experts: int
    top_k: int
    impl: str
    status: str  # "ok", "not installed", "failed: ..."
    detail: str = ""
    fwd_ms: float | None = None
    fwd_lo: float | None = None  # min / max over rounds
    fwd_hi: float | None = None
    train_ms: float | None = None
    train_lo: float | None = None
    train_hi: float | None = None
    fwd_tflops: float | None = None
    train_tflops: float | None = None
    fwd_ratio: float | None = None  # torch time / its time, median over rounds
    fwd_ratio_lo: float | None = None
    fwd_ratio_hi: float | None = None
    train_ratio: float | None = None
    train_ratio_lo: float | None = None
    train_ratio_hi: float | None = None
    fwd_peak_mb: float | None = None
    train_peak_mb: float | None = None
    grads_mb: float | None = None  # the gradients' own size (every implementation returns the same)
    read_ms: float | None = None  # the layer's weights read once
    errors: dict = field(default_factory=dict)  # rel. errors vs the fp64 reference, per tensor


def run_shape(layer: Layer, impls=IMPLS, timer=None, rounds: int = 4, reps: int = 10,
              ref_dtype=torch.float64) -> list[Result]:  # fmt: skip
    """Every implementation on one layer: errors and peak memory one at a time, then forward and
    forward+backward in interleaved rounds. ``timer(fn, reps) -> ms`` (default: an L2-flushing
    :class:`Timer`; the CPU tests pass a stand-in)."""
    s = layer.shape
    dev = layer.x.device
    timer = timer or Timer(spin_cycles=SPIN_CYCLES)
    runners, status, errs, peaks = {}, {}, {}, {}
    for name in impls:
        built = build_runner(name, layer)
        if isinstance(built, str):
            status[name] = built
            continue
        t0 = time.perf_counter()
        try:
            errs[name] = check(built, layer, ref_dtype)
            release(dev)
            peaks[name] = (peak_mb(partial(forward, built), dev), peak_mb(partial(train_step, built, layer), dev))  # fmt: skip
            runners[name] = built
        except Exception as exc:  # noqa: BLE001 (report and go on)
            status[name] = f"failed: {type(exc).__name__}: {str(exc)[:300]}"
        release(dev)
        print(f"{s.name} {name}: {status.get(name, 'checked')} ({time.perf_counter() - t0:.1f} s with its first "
              "calls' compiles / autotuning)", flush=True)  # fmt: skip
    fwd, failed = time_interleaved({n: partial(forward, r) for n, r in runners.items()}, timer, rounds, reps)
    train, failed_train = time_interleaved({n: partial(train_step, r, layer) for n, r in runners.items() if n in fwd},
                                           timer, rounds, reps)  # fmt: skip
    status.update(failed)
    status.update(failed_train)
    read_ms = timer(partial(read_weights, layer), reps)
    results = []
    for name in impls:
        res = Result(s.name, s.tokens, s.hidden, s.intermediate, s.experts, s.top_k, name,
                     status.get(name, "ok"), read_ms=read_ms, grads_mb=grads_mb(layer))  # fmt: skip
        if name in runners:
            res.detail, res.errors = runners[name].detail, errs[name]
            res.fwd_peak_mb, res.train_peak_mb = peaks[name]
        if res.status == "ok":
            res.fwd_ms, res.fwd_lo, res.fwd_hi = _median_spread(fwd[name])
            res.train_ms, res.train_lo, res.train_hi = _median_spread(train[name])
            res.fwd_tflops = s.flops / res.fwd_ms / 1e9
            res.train_tflops = 3 * s.flops / res.train_ms / 1e9
            res.fwd_ratio, res.fwd_ratio_lo, res.fwd_ratio_hi = _ratios(fwd.get("torch"), fwd[name])
            res.train_ratio, res.train_ratio_lo, res.train_ratio_hi = _ratios(train.get("torch"), train[name])
        results.append(res)
    return results


def bench_moe(shapes=SHAPES, impls=IMPLS, rounds: int = 4, reps: int = 10, out=None, seed: int = 0) -> list[Result]:  # fmt: skip
    """The benchmark on the GPU: one layer per shape (bf16), every implementation on it; the
    results are written (``out``) after each shape, so a run cut short keeps what it measured."""
    timer = Timer(spin_cycles=SPIN_CYCLES)
    results = []
    for shape in shapes:
        layer = make_layer(shape, "cuda", seed=seed)
        rows = run_shape(layer, impls, timer, rounds, reps)
        results += rows
        for r in rows:
            print(format_result(r), flush=True)
        del layer
        release("cuda")
        if out is not None:
            write(results, Path(out))
    return results



def _num(v, spec=".2f", suffix=""):
    return "—" if v is None else f"{v:{spec}}{suffix}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _ratio_cell(r: Result, mode: str) -> str:
    if r.status != "ok":
        return r.status.split(":")[0]
    med, lo, hi = (getattr(r, f"{mode}_ratio{s}") for s in ("", "_lo", "_hi"))
    return "—" if med is None else f"{med:.2f}x [{lo:.2f}, {hi:.2f}]"


def _err(v, torch_err) -> str:
    """An error and its multiple of torch's (the tests' rule: within 2x torch's)."""
    if v is None:
        return "—"
    return f"{v:.2g} ({v / torch_err:.1f}x)" if torch_err else f"{v:.2g}"


def _max_err(errors: dict, keys) -> float | None:
    vals = [errors[k] for k in keys if k in errors]
    return max(vals) if vals else None


def format_result(r: Result) -> str:
    head = f"{r.shape:22} {r.impl:12}"
    if r.status != "ok":
        return f"{head} {r.status}"
    return (f"{head} fwd {r.fwd_ms:8.3f} ms {r.fwd_tflops:6.1f} TFLOP/s {_ratio_cell(r, 'fwd'):22} | fwd+bwd "
            f"{r.train_ms:8.3f} ms {r.train_tflops:6.1f} TFLOP/s {_ratio_cell(r, 'train'):22} | peak "
            f"{_num(r.train_peak_mb, '.0f')} MiB | err out {_num(r.errors.get('out'), '.2g')} grads "
            f"{_num(_max_err(r.errors, GRAD_KEYS), '.2g')}")  # fmt: skip


GRAD_KEYS = ("train_out", "dx", "d_routing", "dw_gate_up", "dw_down")


def markdown(results: list[Result]) -> str:
    impls = list(dict.fromkeys(r.impl for r in results))
    others = [i for i in impls if i != "torch"]
    shapes = list(dict.fromkeys((r.shape, r.tokens, r.hidden, r.intermediate, r.experts, r.top_k) for r in results))  # fmt: skip
    by = {(r.shape, r.impl): r for r in results}
    cols = [f"{i} fwd" for i in others] + [f"{i} fwd+bwd" for i in others]
    lines = ["#### MoE expert layer: torch time / its time (median over rounds [min, max])", "",
             "| shape (T, H, I, E, k) | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]  # fmt: skip
    for name, *dims in shapes:
        cells = [_ratio_cell(by[name, i], mode) if (name, i) in by else "" for mode in ("fwd", "train") for i in others]  # fmt: skip
        lines.append(f"| {name} ({', '.join(map(str, dims))}) | " + " | ".join(cells) + " |")
    lines += ["", "#### Per implementation (errors: max |diff| / max |ref| against an fp64 reference, (x torch's); "
              "err grads: the worst of the fwd+bwd output and every gradient)", "",
              "| shape | impl | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | peak MiB fwd / fwd+bwd "
              "| err out | err grads | what ran |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, *_ in shapes:
        base = by.get((name, "torch"))
        base_out = base.errors.get("out") if base else None
        base_grads = _max_err(base.errors, GRAD_KEYS) if base else None
        for i in impls:
            r = by.get((name, i))
            if r is None:
                continue
            if r.status != "ok":
                lines.append(f"| {name} | {i} | {_cell(r.status)} | | | | | | | {_cell(r.detail)} |")
                continue
            lines.append(
                f"| {name} | {i} | {_num(r.fwd_ms, '.3f')} | {_num(r.fwd_tflops, '.1f')} | {_num(r.train_ms, '.3f')} "
                f"| {_num(r.train_tflops, '.1f')} | {_num(r.fwd_peak_mb, '.0f')} / {_num(r.train_peak_mb, '.0f')} "
                f"| {_err(r.errors.get('out'), base_out)} | {_err(_max_err(r.errors, GRAD_KEYS), base_grads)} "
                f"| {_cell(r.detail)} |"
            )
    lines += ["", "Weights read once (the bound of a memory-bound step) and each forward against it:", ""]
    for name, *_ in shapes:
        rows = [r for r in results if r.shape == name]
        read = rows[0].read_ms if rows else None
        fwd = ", ".join(f"{r.impl} {r.fwd_ms / read:.2f}x" for r in rows if r.fwd_ms and read)
        lines.append(f"- {name}: {_num(read, '.3f', ' ms')}; forward / that: {fwd or '—'}; gradients "
                     f"{_num(rows[0].grads_mb if rows else None, '.0f', ' MiB')} (inside every fwd+bwd peak)")  # fmt: skip
    return "\n".join(lines)


def write(results: list[Result], outdir: Path) -> Path:
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M"),
            "results": [asdict(r) for r in results]}  # fmt: skip
    path = outdir / "moe.json"
    path.write_text(json.dumps(meta, indent=1))
    (outdir / "moe.md").write_text(markdown(results) + "\n")
    return path


def load(path: Path) -> list[Result]:
    return [Result(**r) for r in json.loads(Path(path).read_text())["results"]]


def describe(shapes=SHAPES, impls=IMPLS) -> str:
    """The cases, one line per shape, with the weights and gradients a GPU run holds."""
    lines = []
    for s in shapes:
        w = 3 * s.experts * s.hidden * s.intermediate * 2 / 2**30
        lines.append(f"{s.name:22} {s.dims:42} fwd {s.flops / 1e9:7.0f} GFLOP | weights {w:5.1f} GiB bf16 "
                     f"(+{2 * w / 3:.1f} GiB interleaved gate/up copy, +{w:.1f} GiB gradients) | {', '.join(impls)}")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    if "--list" in sys.argv:
        print(describe())
