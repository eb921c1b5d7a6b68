"""Benchmarks: ours vs torch in one process, same inputs, median of CUDA-event-timed reps with
the L2 flushed before every rep (a 60 MB L2 would otherwise hold a decode-size weight)."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from ..api import gemm, grouped_gemm
from ..config import GemmProblem
from ..gemm.launch import TORCH_TO_NAME
from ..grouped.k_grouped import kgrouped_config
from ..grouped.list_form import list_config, list_launch
from ..grouped.packed import PLANS
from ..policy import policy_for
from ..runtime.device import device_info
from ..runtime.timer import Timer

DENSE_SHAPES = [
    (8192, 8192, 8192),
    (4096, 4096, 4096),
    (16384, 7168, 2048),
    (2048, 4096, 7168),
    (128, 7168, 2048),
]


@dataclass
class Row:
    case: str
    ours_ms: float
    torch_ms: float
    ours_tflops: float
    torch_tflops: float
    ratio: float
    config: str
    max_abs_err: float
    torch_max_abs_err: float
    # bench_grouped: the same tile with scheduler="dynamic" (cooperative), and static cooperative
    scheduler_ms: dict | None = None


def dense_inputs(m, n, k, dtype, b_layout="k"):
    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    if b_layout == "k":  # nn.Linear weight (N, K) used as b = w.t()
        b = torch.randn(n, k, device="cuda", dtype=dtype).t()
    else:
        b = torch.randn(k, n, device="cuda", dtype=dtype)
    return a, b


def bench_dense(shapes=DENSE_SHAPES, dtype=torch.bfloat16, b_layout="k", config_for=None, reps=30):
    timer = Timer()
    rows = []
    for m, n, k in shapes:
        a, b = dense_inputs(m, n, k, dtype, b_layout)
        cfg = config_for(m, n, k) if config_for else None
        out = gemm(a, b, config=cfg)
        ref = torch.matmul(a.double(), b.double())
        tout = torch.matmul(a, b)
        err = (out.double() - ref).abs().max().item()
        terr = (tout.double() - ref).abs().max().item()
        t_ours = timer(lambda a=a, b=b, cfg=cfg: gemm(a, b, config=cfg), reps)
        t_torch = timer(lambda a=a, b=b: torch.matmul(a, b), reps)
        flops = 2.0 * m * n * k

        arch, sms = device_info(torch.cuda.current_device())
        prob = GemmProblem(m, n, k, 1, TORCH_TO_NAME[dtype], TORCH_TO_NAME[dtype], TORCH_TO_NAME[dtype], "k",
                           "k" if b_layout == "k" else "n")  # fmt: skip
        used = cfg or policy_for(arch, sms).choose_dense(prob)
        rows.append(
            Row(
                f"{m}x{n}x{k}",
                t_ours,
                t_torch,
                flops / t_ours / 1e9,
                flops / t_torch / 1e9,
                t_torch / t_ours,
                used.name,
                err,
                terr,
            )
        )
        print(format_row(rows[-1]), flush=True)
    return rows


def format_row(r: Row) -> str:
    return (
        f"{r.case:>20} | ours {r.ours_tflops:7.1f} TFLOP/s ({r.ours_ms:8.4f} ms) | torch {r.torch_tflops:7.1f} "
        f"({r.torch_ms:8.4f} ms) | {r.ratio:5.2f}x torch | err {r.max_abs_err:.3g} (torch {r.torch_max_abs_err:.3g}) | {r.config}"
    )


def markdown_table(rows: list[Row], title: str) -> str:
    lines = [f"### {title}", "", "| case | ours TFLOP/s | torch TFLOP/s | ×torch | config |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.case} | {r.ours_tflops:.1f} | {r.torch_tflops:.1f} | {r.ratio:.2f} | `{r.config}` |")
    ratios = [r.ratio for r in rows]
    geo = statistics.geometric_mean(ratios) if ratios else float("nan")
    lines.append(f"| **geomean** | | | **{geo:.2f}** | |")
    sched = [r for r in rows if r.scheduler_ms]
    if sched:  # bench_grouped: static vs dynamic scheduler on the policy's tile
        names = list(sched[0].scheduler_ms)
        lines += ["", "| case | " + " | ".join(f"{k} ms" for k in names) + " |"]
        lines.append("|---|" + "---|" * len(names))
        for r in sched:
            times = " | ".join(f"{r.scheduler_ms.get(k, float('nan')):.4f}" for k in names)
            lines.append(f"| {r.case} | {times} |")
    return "\n".join(lines)


def write_results(rows: list[Row], family: str, outdir: Path) -> Path:
    outdir.mkdir(parents=True, exist_ok=True)
    meta = {
        "family": family,
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "rows": [asdict(r) for r in rows],
    }
    path = outdir / f"{family}.json"
    path.write_text(json.dumps(meta, indent=1))
    (outdir / f"{family}.md").write_text(markdown_table(rows, f"{family} on {meta['gpu']} ({meta['date']})") + "\n")
    plot(path)
    return path


def plot(json_path: Path) -> Path | None:
    """Bar chart ours vs torch (TFLOP/s) per case; skipped when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (run `python -m cutegemm plot <json>` elsewhere)")
        return None
    meta = json.loads(Path(json_path).read_text())
    rows = meta["rows"]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(rows)), 4))
    ax.bar([x - 0.2 for x in xs], [r["ours_tflops"] for r in rows], 0.4, label="cutegemm")
    ax.bar([x + 0.2 for x in xs], [r["torch_tflops"] for r in rows], 0.4, label="torch")
    for x, r in zip(xs, rows, strict=True):
        ax.text(x, max(r["ours_tflops"], r["torch_tflops"]) * 1.01, f"{r['ratio']:.2f}x", ha="center")
    ax.set_xticks(list(xs), [r["case"] for r in rows], rotation=20)
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"{meta['family']} — {meta['gpu']} — {meta['date']}")
    ax.legend()
    fig.tight_layout()
    out = Path(json_path).with_suffix(".png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


GROUPED_SHAPES = [
    # (experts, mean tokens per expert, N, K), issue 4's MoE shapes:
    (32, 512, 4096, 7168),  # DeepSeek-V3 up projection
    (32, 512, 7168, 2048),  # DeepSeek-V3 down projection
    (128, 128, 1536, 2048),  # Qwen3-30B-A3B (many small experts)
    (8, 4096, 28672, 4096),  # Mixtral up projection
    (32, 16, 4096, 7168),  # decode
]
GROUPED_NAMES = ["DeepSeek-V3 up", "DeepSeek-V3 down", "Qwen3-30B-A3B", "Mixtral up", "decode"]


def moe_counts(experts: int, tokens: int, seed: int = 0) -> list[int]:
    """Tokens per expert: Poisson around ``tokens``, rounded to a multiple of 8, one fixed seed."""
    gen = torch.Generator().manual_seed(seed)
    lam = torch.full((experts,), float(tokens))
    return [int(round(c / 8.0)) * 8 for c in torch.poisson(lam, generator=gen).tolist()]


def bench_grouped(shapes=GROUPED_SHAPES, dtype=torch.bfloat16, reps=30, names=None):
    """Ours vs torch._grouped_mm (and a loop of torch.matmul) on MoE shapes, uneven expert loads.
    Also prints the time torch takes to read the weights once (``b.sum()``: the bound of a
    memory-bound decode step) and our time relative to it."""
    names = names or (GROUPED_NAMES if shapes is GROUPED_SHAPES else [None] * len(shapes))
    timer = Timer()
    rows = []
    for (e, tok, n, k), label in zip(shapes, names, strict=True):
        counts = moe_counts(e, tok)
        total = sum(counts)
        a = torch.randn(total, k, device="cuda", dtype=dtype)
        w = torch.randn(e, n, k, device="cuda", dtype=dtype)
        b = w.transpose(1, 2)  # (E, K, N) view
        offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
        out = grouped_gemm(a, b, offs=offs)
        tref = torch._grouped_mm(a, b, offs=offs)
        ref = torch.cat([a[s:t].double() @ b[i].double() for i, (s, t) in enumerate(zip([0, *offs.tolist()[:-1]], offs.tolist(), strict=True))])
        err = (out.double() - ref).abs().max().item()
        terr = (tref.double() - ref).abs().max().item()
        del ref
        t_ours = timer(lambda a=a, b=b, offs=offs: grouped_gemm(a, b, offs=offs), reps)
        t_torch = timer(lambda a=a, b=b, offs=offs: torch._grouped_mm(a, b, offs=offs), reps)
        bounds = list(zip([0, *offs.tolist()[:-1]], offs.tolist(), strict=True))
        t_loop = timer(lambda a=a, b=b, bounds=bounds: [a[s:t] @ b[i] for i, (s, t) in enumerate(bounds)], reps)
        t_read = timer(lambda w=w: w.sum(dtype=torch.float32), reps)
        flops = 2.0 * total * n * k

        plan_cfg = next(p.config for key, p in PLANS.items() if key[0] == a.shape and key[2] == b.shape and key[4] == a.dtype)
        cfg = plan_cfg.name
        sched = _scheduler_times(timer, reps, a, b, offs, plan_cfg, t_ours)
        case = f"{label + ': ' if label else ''}E{e}x{tok}tok N{n} K{k}"
        rows.append(Row(case, t_ours, t_torch, flops / t_ours / 1e9, flops / t_torch / 1e9,
                        t_torch / t_ours, cfg, err, terr, sched))  # fmt: skip
        wbytes = w.numel() * w.element_size()
        print(format_row(rows[-1]) + f" | loop of matmul {flops / t_loop / 1e9:.1f} TFLOP/s | weights read once "
              f"(torch sum) {t_read:.4f} ms = {wbytes / t_read / 1e6:.0f} GB/s; ours {t_ours / t_read:.3f}x that | "
              + " ".join(f"{k} {v:.4f} ms" for k, v in sched.items()), flush=True)  # fmt: skip
        del a, w, b, out, tref
    return rows


def host_time_us(fn, reps: int = 20) -> float:
    """Median host time of one call (µs), the GPU idle before each (synchronized)."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def _mixed_list_shapes(groups: int = 24, seed: int = 0) -> list[tuple[int, int, int]]:
    """(M, N, K) of groups that share nothing: M 16..2048, N and K 256..4096 (multiples of 8)."""
    gen = torch.Generator().manual_seed(seed)

    def pick(lo, hi):
        return int(torch.randint(lo // 8, hi // 8 + 1, (1,), generator=gen)) * 8

    return [(pick(16, 2048), pick(256, 4096), pick(256, 4096)) for _ in range(groups)]


def bench_grouped_list(shapes=GROUPED_SHAPES, names=None, mixed=True, reps=20, configs=()):
    """List form, ``grouped_gemm(xs, ws)`` with one (tokens_e, K) activation and one (K, N)
    weight (a transposed view of an (N, K) tensor) per expert, on the MoE shapes of
    :func:`bench_grouped` and (``mixed``) a list of groups with unrelated M, N, K. Same run, same
    operands: our list-form kernel (one launch + its descriptor prep), our per-group loop of
    dense GEMMs (the form's implementation before the kernel), a loop of torch.matmul, and, where
    the groups share N and K, torch._grouped_mm on the same data packed beforehand (packing not
    timed). GPU time L2-cold (:class:`Timer`); host time per call printed beside it.
    ``configs``: overrides (dicts) of the policy's list config, timed beside it."""
    names = names or (GROUPED_NAMES if shapes is GROUPED_SHAPES else [None] * len(shapes))
    cases = [(label, [(c, n, k) for c in moe_counts(e, tok)]) for (e, tok, n, k), label in zip(shapes, names, strict=True)]
    if mixed:
        cases.append(("mixed M, N, K", _mixed_list_shapes()))
    timer = Timer(spin_cycles=8_000_000)  # ~4 ms of spin: longer than the host time of a 128-group call
    for label, dims in cases:
        torch.manual_seed(0)
        xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for m, _, k in dims]
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t() for _, n, k in dims]
        flops = sum(2.0 * m * n * k for m, n, k in dims)
        outs = grouped_gemm(xs, ws)
        err = terr = 0.0
        for g in range(min(3, len(dims))):
            ref = xs[g].double() @ ws[g].double()
            err = max(err, (outs[g].double() - ref).abs().max().item())
            terr = max(terr, ((xs[g] @ ws[g]).double() - ref).abs().max().item())
        del outs
        t_ours = timer(lambda xs=xs, ws=ws: grouped_gemm(xs, ws), reps)
        t_loop = timer(lambda xs=xs, ws=ws: [gemm(x, w) for x, w in zip(xs, ws, strict=True)], reps)
        t_tloop = timer(lambda xs=xs, ws=ws: [x @ w for x, w in zip(xs, ws, strict=True)], reps)
        host = host_time_us(lambda xs=xs, ws=ws: grouped_gemm(xs, ws))
        line = (f"{label}: G{len(dims)} | ours {flops / t_ours / 1e9:7.1f} TFLOP/s ({t_ours:.4f} ms, host "
                f"{host:.0f} us/call) | our per-group loop {flops / t_loop / 1e9:7.1f} "
                f"({t_loop / t_ours:.2f}x) | loop of torch.matmul {flops / t_tloop / 1e9:7.1f} ({t_tloop / t_ours:.2f}x)")  # fmt: skip
        if len({(n, k) for _, n, k in dims}) == 1:
            a = torch.cat(xs)
            b = torch.stack([w.t() for w in ws]).transpose(1, 2)
            offs = torch.tensor([m for m, _, _ in dims], device="cuda").cumsum(0).to(torch.int32)
            t_gmm = timer(lambda a=a, b=b, offs=offs: torch._grouped_mm(a, b, offs=offs), reps)
            line += f" | torch._grouped_mm packed {flops / t_gmm / 1e9:7.1f} ({t_gmm / t_ours:.2f}x)"
            del a, b
        line += f" | max err groups 0-2 {err:.3g} (torch {terr:.3g})"
        print(line, flush=True)

        arch, sms = device_info(torch.cuda.current_device())
        live = [d for d in dims if all(d)]
        cfg = list_config(arch, sms, len(live), sum(m for m, _, _ in live), sum(n for _, n, _ in live) // len(live),
                          sum(k for _, _, k in live) // len(live), "bf16", "bf16", "k", "k", False)  # fmt: skip
        print("   config " + cfg.name, flush=True)
        for over in configs:
            alt = replace(cfg, **over)
            try:
                list_launch(xs, ws, None, 1.0, config=alt)
                t = timer(lambda xs=xs, ws=ws, alt=alt: list_launch(xs, ws, None, 1.0, config=alt), reps)
            except Exception as exc:  # noqa: BLE001 (report and go on)
                print(f"   {alt.name}: FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            print(f"   {alt.name}: {flops / t / 1e9:7.1f} TFLOP/s ({t:.4f} ms), {t_ours / t:.3f}x the policy's", flush=True)
        del xs, ws


# K-grouped (MoE weight gradient dW_e = x_e^T dy_e): (E, mean tokens, M = x's columns, N = dy's)
KGROUPED_SHAPES = [
    (32, 512, 7168, 4096, "DeepSeek-V3 dW up"),
    (32, 512, 2048, 7168, "DeepSeek-V3 dW down"),
    (128, 128, 2048, 1536, "Qwen3-30B-A3B dW"),
    (8, 4096, 4096, 14336, "Mixtral dW up"),
]


def bench_grouped_k(shapes=KGROUPED_SHAPES, reps=20, configs=None, loops=True):
    """K-grouped form, ``grouped_gemm(x.t(), dy, offs=offs)`` -> (E, M, N), the weight gradient
    of an MoE layer, against ``torch._grouped_mm`` on the same 2-D x 2-D operands, a loop of
    torch.matmul, and the per-expert loop of our dense GEMM (the form's implementation before
    the K-grouped kernel; ``loops=False`` leaves both loops out). Same run, same operands; errors
    on the first three experts against float64. ``configs``: overrides (dicts) of the policy's
    K-grouped config, timed beside it."""
    timer = Timer()
    for e, tok, m, n, label in shapes:
        counts = moe_counts(e, tok)
        total = sum(counts)
        torch.manual_seed(0)
        x = torch.randn(total, m, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(total, n, device="cuda", dtype=torch.bfloat16)
        a = x.t()
        offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
        bounds = list(zip([0, *offs.tolist()[:-1]], offs.tolist(), strict=True))
        flops = 2.0 * total * m * n
        out = grouped_gemm(a, dy, offs=offs)
        errs = []
        for i, (s, t) in enumerate(bounds[:3]):
            ref = a[:, s:t].double() @ dy[s:t].double()
            errs.append(((out[i].double() - ref).abs().max().item(), ((a[:, s:t] @ dy[s:t]).double() - ref).abs().max().item()))
        del out
        line = f"{label}: E{e}x{tok}tok M{m} N{n} |"
        t_ours = timer(lambda a=a, dy=dy, offs=offs: grouped_gemm(a, dy, offs=offs), reps)
        line += f" ours {flops / t_ours / 1e9:7.1f} TFLOP/s ({t_ours:.4f} ms)"
        try:
            t_torch = timer(lambda a=a, dy=dy, offs=offs: torch._grouped_mm(a, dy, offs=offs), reps)
            line += f" | torch._grouped_mm {flops / t_torch / 1e9:7.1f} ({t_torch:.4f} ms) {t_torch / t_ours:5.2f}x"
        except Exception as exc:  # noqa: BLE001 (report and go on)
            line += f" | torch._grouped_mm unavailable ({type(exc).__name__}: {str(exc)[:80]})"
        res = torch.empty(e, m, n, device="cuda", dtype=torch.bfloat16)

        def our_loop(a=a, dy=dy, bounds=bounds, res=res):
            for i, (s, t) in enumerate(bounds):
                gemm(a[:, s:t], dy[s:t], out=res[i])

        if loops:
            t_loop = timer(our_loop, reps)
            t_tloop = timer(lambda a=a, dy=dy, bounds=bounds: [a[:, s:t] @ dy[s:t] for s, t in bounds], reps)
            line += f" | our per-expert loop {flops / t_loop / 1e9:7.1f} ({t_loop / t_ours:.2f}x)"
            line += f" | loop of torch.matmul {flops / t_tloop / 1e9:7.1f} ({t_tloop / t_ours:.2f}x)"
        line += " | max err experts 0-2 (torch's): " + ", ".join(f"{o:.3g} ({t:.3g})" for o, t in errs)
        print(line, flush=True)
        arch, sms = device_info(torch.cuda.current_device())
        base = kgrouped_config(arch, sms, m, n, total // e, e, "bf16", "bf16", "m", "n", False)
        print(f"   policy config {base.name}", flush=True)
        for over in configs or []:
            cfg = replace(base, **over)
            try:
                o = grouped_gemm(a, dy, offs=offs, config=cfg)
                t = timer(lambda a=a, dy=dy, offs=offs, cfg=cfg: grouped_gemm(a, dy, offs=offs, config=cfg), reps)
            except Exception as exc:  # noqa: BLE001 (report and go on)
                print(f"   {cfg.name}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                continue
            diff = max((o[i].double() - (a[:, s:t].double() @ dy[s:t].double())).abs().max().item()
                       for i, (s, t) in enumerate(bounds[:3]))  # fmt: skip
            print(f"   {cfg.name}: {flops / t / 1e9:7.1f} TFLOP/s ({t:.4f} ms), {t_ours / t:.3f}x the policy's, "
                  f"max err experts 0-2 {diff:.3g}", flush=True)  # fmt: skip
            del o
        del x, dy, a, res


def _scheduler_times(timer, reps, a, b, offs, cfg, t_policy):
    """The policy's tile with the static and the dynamic scheduler side by side (the dynamic one is
    cooperative only: a pingpong policy tile is also timed static-cooperative). The policy's own
    time is reused for its scheduler."""
    def run(c):
        grouped_gemm(a, b, offs=offs, config=c)  # compile outside the timing
        return timer(lambda: grouped_gemm(a, b, offs=offs, config=c), reps)

    static = replace(cfg, scheduler="static")
    times = {"static": t_policy if cfg == static else run(static)}
    coop = replace(static, pingpong=False)
    if cfg.pingpong:
        times["static-coop"] = run(coop)
    dyn = replace(coop, scheduler="dynamic")
    times["dynamic"] = t_policy if cfg == dyn else run(dyn)
    return times
