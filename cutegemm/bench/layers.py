"""The real-model layer sweep (``python -m cutegemm bench sweep``): the linear layers of several
model families, ``x (M, K) @ W (N, K).T``, at every token count of ``M_VALUES``, ours against torch
on the same operands in one process.

- bf16: ``cutegemm.gemm(x, W.t())`` vs ``torch.matmul`` (cuBLAS);
- FP8 row-wise: ``cutegemm.gemm(x8, W8.t(), scale_a=(M, 1), scale_b=(1, N))`` vs
  ``torch._scaled_mm`` with the same scales (both with accurate accumulation).

Each case is timed in interleaved rounds (ours, torch, torch, ours, ...; CUDA-event medians of
L2-flushed reps per round, ``runtime.timer.Timer``), so clock drift under the power cap hits both
sides alike; the table gives the median ratio and its spread over the rounds. Operands are randn
(small integers draw less power and run faster). ``cases()`` lists the sweep without a GPU, so the
kernels it needs can be compiled ahead on a CPU machine (``python -m cutegemm.bench.layers
--configs``, then ``tools/precompile.py``).
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from .. import policy
from ..api import gemm
from ..gemm import dense
from ..runtime.timer import Timer

# (family, layer, N, K) of x (M, K) @ W (N, K).T; fused projections as the models run them.
LAYERS = [
    ("Llama-3-8B", "qkv", 6144, 4096),
    ("Llama-3-8B", "o", 4096, 4096),
    ("Llama-3-8B", "gate_up", 28672, 4096),
    ("Llama-3-8B", "down", 4096, 14336),
    ("Llama-3-70B", "qkv", 10240, 8192),
    ("Llama-3-70B", "down", 8192, 28672),
    ("Qwen3-32B", "qkv", 10240, 5120),
    ("Qwen3-32B", "gate_up", 51200, 5120),
    ("Qwen3-32B", "down", 5120, 25600),
    ("Qwen3-30B-A3B", "qkv", 5120, 2048),
    ("Qwen3-30B-A3B", "o", 2048, 4096),
    ("DeepSeek-V3", "q_a", 1536, 7168),
    ("DeepSeek-V3", "kv_a", 576, 7168),
    ("DeepSeek-V3", "q_b", 24576, 1536),
    ("DeepSeek-V3", "o", 7168, 16384),
    ("Mistral-7B", "lm_head", 32768, 4096),
]
M_VALUES = (1, 16, 64, 128, 512, 1024, 2048, 8192)
# "fp8t": FP8 with per-tensor scales against torch._scaled_mm's tensor-wise path (cuBLASLt's FP8
# kernels, faster than the row-wise CUTLASS kernels "fp8" meets), the same configs as "fp8"
KINDS = ALL_KINDS = ("bf16", "fp8", "fp8t")  # the default sweep: every kind
BASELINES = {"bf16": "cuBLAS (torch.matmul)", "fp8": "torch._scaled_mm (row-wise)",
             "fp8t": "torch._scaled_mm (per-tensor: cuBLASLt)"}


def layer_shapes(m_values) -> list[tuple[int, int, int]]:
    """(M, N, K) of the sweep's layers at each of ``m_values`` (``bench tiles --m-values``)."""
    return [(m, n, k) for m in m_values for _, _, n, k in LAYERS]


@dataclass
class Case:
    kind: str  # "bf16", "fp8" (row-wise scales) or "fp8t" (per-tensor scales)
    family: str
    layer: str
    m: int
    n: int
    k: int

    @property
    def name(self) -> str:
        return f"{self.family} {self.layer} M={self.m}"


@dataclass
class Result:
    case: Case
    ours_us: float
    torch_us: float
    ratio: float  # torch time / ours, median over rounds
    ratio_lo: float  # min / max over rounds
    ratio_hi: float
    config: str
    err: float  # max |ours - fp64 reference| / max |reference|
    torch_err: float
    waves: float = 0.0  # our config's work units (output tiles x split_k) per SM
    # The tile rule before the wave model (previous_config), timed in the same rounds where it
    # picks another config: torch time / its time, and its config ("" where it is the same).
    prev_ratio: float = 0.0
    prev_config: str = ""
    # The wave model's 64 < M <= 128 pick where the policy does not take it (SMALL_M_WAVES), timed
    # likewise where it differs from ours.
    alt_ratio: float = 0.0
    alt_config: str = ""


def cases(kinds=KINDS, layers=LAYERS, m_values=M_VALUES) -> list[Case]:
    return [Case(kind, fam, layer, m, n, k) for kind in kinds for fam, layer, n, k in layers for m in m_values]


def operands(case: Case, device="cuda"):
    """(args, kwargs) of the case's ``cutegemm.gemm`` call; ``torch.empty`` off the GPU (the
    host path only looks at shapes, strides and alignment)."""
    gen = torch.randn if device == "cuda" else torch.empty
    x = gen(case.m, case.k, device=device, dtype=torch.bfloat16)
    w = gen(case.n, case.k, device=device, dtype=torch.bfloat16)
    if case.kind == "bf16":
        return (x, w.t()), {}
    x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    rows, cols = ((case.m, 1), (1, case.n)) if case.kind == "fp8" else ((), ())  # fp8t: 0-d scales
    if device == "cuda":
        sa = torch.rand(rows, device=device) * 0.5 + 0.5
        sb = torch.rand(cols, device=device) * 0.5 + 0.5
    else:
        sa, sb = torch.ones(rows), torch.ones(cols)
    return (x8, w8.t()), dict(scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)


def torch_call(args, kwargs):
    a, b = args
    if not kwargs:
        return torch.matmul(a, b)
    return torch._scaled_mm(a, b, scale_a=kwargs["scale_a"], scale_b=kwargs["scale_b"], out_dtype=torch.bfloat16)


def reference(args, kwargs) -> torch.Tensor:
    a, b = args
    ref = a.double() @ b.double()
    if kwargs:
        ref = ref * kwargs["scale_a"].double() * kwargs["scale_b"].double()
    return ref


def previous_config(cfg, m: int, n: int, sms: int):
    """The config the sm_90a policy picked for M > 128 before the wave model (policy.wave_choice):
    FP8 128x192 2x1; 16-bit 128x256 2x1 once its tiles fill the SMs, else
    128x128 1x1; no split K. None where that is ``cfg``'s own tile (or M <= 128, unchanged)."""
    if cfg is None or m <= 128 or cfg.arch != "sm_90a":
        return None
    if cfg.a_dtype == "e4m3":
        tile = dict(tile_m=128, tile_n=192, cluster_m=2, raster="n", group=8)
    elif -(-m // 128) * -(-n // 256) >= sms:
        tile = dict(tile_m=128, tile_n=256, cluster_m=2, raster="n", group=8)
    else:
        tile = dict(tile_m=128, tile_n=128, cluster_m=1, raster="m", group=8)
    prev = replace(cfg, **tile, split_k=1, split_cluster=False, split_tail=False, pingpong=False)
    return None if prev == cfg else prev


PREVIOUS_POLICY = "policy before the 192x128 / 192x160 tiles, 128x96 2x1 pairs and the odd-M short-K exception"


@contextlib.contextmanager
def previous_policy():
    """The policy before the 16-bit 192x128 / 192x160 tiles of the wave model (policy.TALL_128_RATE,
    TALL_160_RATE), 128x96's 2x1 clusters (policy.wide_n_pairs_m) and short_k_pingpong's odd-M
    exception (policy.PINGPONG_ODD_M), for the sweep's same-round comparison on the cases where it
    picks another config."""
    rates, ratio, odd = policy.TILE_RATES["16-bit"], policy.WIDE_N_TILES_PER_M, policy.PINGPONG_ODD_M
    policy.TILE_RATES["16-bit"] = {t: r for t, r in rates.items() if t not in ((192, 128), (192, 160))}
    policy.WIDE_N_TILES_PER_M, policy.PINGPONG_ODD_M = math.inf, True  # inf: no 2x1 pairs of 128x96
    try:
        yield
    finally:
        policy.TILE_RATES["16-bit"], policy.WIDE_N_TILES_PER_M, policy.PINGPONG_ODD_M = rates, ratio, odd


def alternative_config(cfg, args, kwargs):
    """The config :func:`previous_policy` runs for the call, where it differs from ``cfg``; else None."""
    with previous_policy():
        alt = our_config(args, kwargs)
    return None if alt == cfg else alt


def run_case(case: Case, timer, rounds: int = 4, reps: int = 10) -> Result:
    args, kwargs = operands(case)
    cfg = our_config(args, kwargs)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    prev = previous_config(cfg, case.m, case.n, sms)
    alt = alternative_config(cfg, args, kwargs)
    ref = reference(args, kwargs)
    scale = ref.abs().max().clamp(min=1e-30)
    err = ((gemm(*args, **kwargs).double() - ref).abs().max() / scale).item()
    torch_err = ((torch_call(args, kwargs).double() - ref).abs().max() / scale).item()
    ours, theirs, before, other = [], [], [], []
    order = [(ours, lambda: gemm(*args, **kwargs)), (theirs, lambda: torch_call(args, kwargs))]
    if prev is not None:
        order.append((before, lambda: gemm(*args, config=prev, **kwargs)))
    if alt is not None:
        order.append((other, lambda: gemm(*args, config=alt, **kwargs)))
    for r in range(rounds):  # interleaved, alternating which side goes first
        for times, fn in order if r % 2 == 0 else order[::-1]:
            times.append(timer(fn, reps) * 1e3)
    ratios = [t / o for o, t in zip(ours, theirs, strict=True)]
    prev_ratio = statistics.median(t / b for b, t in zip(before, theirs, strict=True)) if before else 0.0
    alt_ratio = statistics.median(t / b for b, t in zip(other, theirs, strict=True)) if other else 0.0
    return Result(case, statistics.median(ours), statistics.median(theirs), statistics.median(ratios),
                  min(ratios), max(ratios), cfg.name if cfg else "?", err, torch_err,
                  waves(cfg, case.m, case.n, sms) if cfg else 0.0, prev_ratio, prev.name if prev else "",
                  alt_ratio, alt.name if alt else "")  # fmt: skip


def our_config(args, kwargs):
    """The config our call runs (its host path run once with a recording cache; the dense path's
    plans are cleared before and after, so no plan keeps the no-op kernel), or None."""
    _clear_plans()
    try:
        seen = record_configs(lambda: gemm(*args, **kwargs))
    finally:
        _clear_plans()
    return seen[-1] if seen else None


def waves(cfg, m: int, n: int, sms: int) -> float:
    """Work units per SM of ``cfg`` on an (m, n) output: output tiles x split_k over the SMs (a
    2.1 is two full waves and a tenth of a third; the wave quantization the policy must model)."""
    return -(-m // cfg.tile_m) * -(-n // cfg.tile_n) * max(1, cfg.split_k) / sms


def _clear_plans():
    dense.PLANS.clear()
    getattr(dense, "PLAIN_PLANS", {}).clear()


def record_configs(call) -> list:
    """The GemmConfigs the dense path asks its kernel cache for while ``call()`` runs (no kernel is
    compiled or launched: the cache returns a no-op)."""
    seen = []

    class _Recorder:
        def get(self, cfg):
            seen.append(cfg)
            return lambda *a: None

    saved = dense.DENSE_CACHE
    dense.DENSE_CACHE = _Recorder()
    try:
        call()
    finally:
        dense.DENSE_CACHE = saved
    return seen


def sweep(kinds=KINDS, layers=LAYERS, m_values=M_VALUES, rounds: int = 4, reps: int = 10, out=None) -> list[Result]:
    timer = Timer()
    results = []
    for case in cases(kinds, layers, m_values):
        res = run_case(case, timer, rounds, reps)
        results.append(res)
        print(f"{case.kind:4} {case.name:34} ours {res.ours_us:9.1f} us  torch {res.torch_us:9.1f} us  "
              f"{res.ratio:5.2f}x [{res.ratio_lo:.2f}, {res.ratio_hi:.2f}]  err {res.err:.2g} "
              f"(torch {res.torch_err:.2g})  {res.waves:.2f} waves  {res.config}"
              + (f"  | previous policy {res.alt_ratio:.2f}x {res.alt_config}" if res.alt_config else ""),
              flush=True)  # fmt: skip
    if out is not None:
        write(results, Path(out))
    return results


def summary(results: list[Result]) -> dict:
    """Per kind: geomean ratio, minimum and the five worst cases."""
    out = {}
    for kind in sorted({r.case.kind for r in results}):
        rs = [r for r in results if r.case.kind == kind]
        worst = sorted(rs, key=lambda r: r.ratio)[:5]
        out[kind] = {
            "geomean": statistics.geometric_mean([r.ratio for r in rs]),
            "min": worst[0].ratio,
            "below_0.95": sum(r.ratio < 0.95 for r in rs),
            "cases": len(rs),
            "worst": [(r.case.name, round(r.ratio, 3), f"{r.config}, {r.waves:.2f} waves") for r in worst],
            # the whole sweep had the previous tile rule run (its config where it picks another)
            "before_geomean": statistics.geometric_mean([r.prev_ratio or r.ratio for r in rs]),
            "before_min": min(r.prev_ratio or r.ratio for r in rs),
            "changed": sum(bool(r.prev_config) for r in rs),
        }
        changed = [r for r in rs if r.prev_config]
        if changed:  # the cases where the rules differ: ours and the previous rule's
            out[kind]["changed_geomean"] = statistics.geometric_mean([r.ratio for r in changed])
            out[kind]["changed_before_geomean"] = statistics.geometric_mean([r.prev_ratio for r in changed])
        alts = [r for r in rs if r.alt_config and r.alt_ratio]
        out[kind]["alternatives"] = len(alts)
        if alts:  # the previous wave model (previous_policy): ours and its on the cases where they differ
            out[kind]["alt_ours_geomean"] = statistics.geometric_mean([r.ratio for r in alts])
            out[kind]["alt_geomean"] = statistics.geometric_mean([r.alt_ratio for r in alts])
            out[kind]["alt_cases"] = [(r.case.name, round(r.ratio, 3), round(r.alt_ratio, 3), r.alt_config) for r in alts]
    return out


def _cell(ratio: float) -> str:
    """A table cell of the ratio, bold below 0.95 (the issue's floor): the table's own heat map."""
    return f"**{ratio:.2f}**" if ratio < 0.95 else f"{ratio:.2f}"


def markdown(results: list[Result]) -> str:
    """One table per kind: a row per layer, a column per M, the ratio (torch time / ours), bold
    below 0.95."""
    lines = []
    for kind, stats in summary(results).items():
        rs = [r for r in results if r.case.kind == kind]
        ms = sorted({r.case.m for r in rs})
        base = BASELINES[kind]
        lines += [f"#### {kind}: torch time / ours vs {base}", "",
                  "| layer (N x K) | " + " | ".join(f"M={m}" for m in ms) + " |",
                  "|---|" + "---|" * len(ms)]  # fmt: skip
        for fam, layer, n, k in dict.fromkeys((r.case.family, r.case.layer, r.case.n, r.case.k) for r in rs):
            by_m = {r.case.m: r for r in rs if (r.case.family, r.case.layer) == (fam, layer)}
            cells = [_cell(by_m[m].ratio) if m in by_m else "" for m in ms]
            lines.append(f"| {fam} {layer} ({n} x {k}) | " + " | ".join(cells) + " |")
        lines += ["", f"geomean {stats['geomean']:.3f}, min {stats['min']:.2f}, "
                      f"{stats['below_0.95']} of {stats['cases']} below 0.95; worst: "
                      + "; ".join(f"{name} {ratio:.2f} (`{cfg}`)" for name, ratio, cfg in stats["worst"]), "",
                  f"The previous tile rule (before the wave model), timed in the same rounds where it picks "
                  f"another config ({stats['changed']} cases): the sweep with it, geomean "
                  f"{stats['before_geomean']:.3f}, min {stats['before_min']:.2f}"
                  + (f"; on those cases ours {stats['changed_geomean']:.3f}, the previous rule "
                     f"{stats['changed_before_geomean']:.3f}." if stats["changed"] else "."), ""]  # fmt: skip
        if stats["alternatives"]:
            lines += [f"The {PREVIOUS_POLICY} (previous_policy), timed in the same rounds on "
                      f"the {stats['alternatives']} cases where they differ: ours {stats['alt_ours_geomean']:.3f}, "
                      f"the picks {stats['alt_geomean']:.3f} ("
                      + "; ".join(f"{name} {ours:.2f} -> {alt:.2f}" for name, ours, alt, _ in stats["alt_cases"])
                      + ").", ""]  # fmt: skip
    return "\n".join(lines)


def heatmap(results: list[Result], path: Path) -> Path | None:
    """A heat map of the ratios per kind (layers x M); None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    kinds = sorted({r.case.kind for r in results})
    fig, axes = plt.subplots(1, len(kinds), figsize=(7 * len(kinds), 7), squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=True):
        rs = [r for r in results if r.case.kind == kind]
        ms = sorted({r.case.m for r in rs})
        rows = list(dict.fromkeys((r.case.family, r.case.layer) for r in rs))
        grid = [[next((r.ratio for r in rs if (r.case.family, r.case.layer) == row and r.case.m == m), float("nan"))
                 for m in ms] for row in rows]  # fmt: skip
        im = ax.imshow(grid, cmap="RdYlGn", vmin=0.8, vmax=1.2, aspect="auto")
        ax.set_xticks(range(len(ms)), [str(m) for m in ms])
        ax.set_yticks(range(len(rows)), [f"{f} {layer}" for f, layer in rows])
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7)
        ax.set_title(f"{kind}: torch time / ours")
        ax.set_xlabel("M (tokens)")
        fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(results: list[Result], outdir: Path) -> Path:
    outdir.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M"),
            "results": [{**asdict(r), "case": asdict(r.case)} for r in results]}  # fmt: skip
    path = outdir / "sweep.json"
    path.write_text(json.dumps(meta, indent=1))
    (outdir / "sweep.md").write_text(markdown(results) + "\n")
    heatmap(results, outdir / "sweep.png")
    return path


def load(path: Path) -> list[Result]:
    meta = json.loads(Path(path).read_text())
    return [Result(**{**r, "case": Case(**r["case"])}) for r in meta["results"]]


def sweep_plan(arch: str = "sm_90a", sms: int = 132, kinds=KINDS, layers=LAYERS, m_values=M_VALUES) -> list:
    """[(case, the configs its call runs)] of the sweep, found on the CPU: every case's host path
    runs with shape-only CPU operands and a recording kernel cache (the arch and SM count given)."""
    saved = dense.check_operand, dense.device_info, dense.current_device, torch.cuda.current_device
    dense.check_operand = lambda name, t, dims=(2, 3): None
    dense.device_info = lambda index: (arch, sms)
    dense.current_device = torch.cuda.current_device = type(None)  # a CPU tensor's device index
    plan = []
    try:
        for case in cases(kinds, layers, m_values):
            args, kwargs = operands(case, device="cpu")
            _clear_plans()
            plan.append((case, record_configs(lambda args=args, kwargs=kwargs: gemm(*args, **kwargs))))
    finally:
        dense.check_operand, dense.device_info, dense.current_device, torch.cuda.current_device = saved
        _clear_plans()
    return plan


def configs_of_sweep(arch: str = "sm_90a", sms: int = 132, **sweep) -> list:
    """The distinct kernel configs of :func:`sweep_plan`, of the previous tile rule and of the
    previous wave model (what to precompile)."""
    out = []
    for case, cfgs in sweep_plan(arch, sms, **sweep):
        out += cfgs
        prev = previous_config(cfgs[-1] if cfgs else None, case.m, case.n, sms)
        out += [prev] if prev is not None else []
    with previous_policy():
        out += [c for _, cfgs in sweep_plan(arch, sms, **sweep) for c in cfgs]
    return list(dict.fromkeys(out))


if __name__ == "__main__":
    if "--configs" in sys.argv:  # one GemmConfig repr per line: tools/precompile.py's LOG format
        for cfg in configs_of_sweep():
            print(repr(cfg))
    if "--waves" in sys.argv:  # the policy's config per case and its waves on an H200 (132 SMs)
        for case, cfgs in sweep_plan():
            cfg = cfgs[-1]
            print(f"{case.kind:4} {case.name:34} {waves(cfg, case.m, case.n, 132):6.2f} waves  {cfg.name}")
