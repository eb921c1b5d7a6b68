"""Benchmarks: ours vs torch in one process, same inputs, median of CUDA-event-timed reps with
the L2 flushed before every rep (a 60 MB L2 would otherwise hold a decode-size weight)."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

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


class Timer:
    """GPU time of one call, L2-cold: before each rep the stream gets a spin kernel (so the host
    can enqueue the flush and the call while the GPU is busy: host overhead is not counted; it
    is measured separately) and a write of 512 MB that evicts the 60 MB L2."""

    def __init__(self, flush_mb: int = 512, spin_cycles: int = 2_000_000):
        self.flush = torch.empty(flush_mb * 2**20 // 4, dtype=torch.float32, device="cuda")
        self.spin_cycles = spin_cycles

    def __call__(self, fn, reps: int = 30, warmup: int = 5) -> float:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(reps):
            torch.cuda._sleep(self.spin_cycles)
            self.flush.fill_(1.0)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)


def _dense_inputs(m, n, k, dtype, b_layout="k"):
    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    if b_layout == "k":  # nn.Linear weight (N, K) used as b = w.t()
        b = torch.randn(n, k, device="cuda", dtype=dtype).t()
    else:
        b = torch.randn(k, n, device="cuda", dtype=dtype)
    return a, b


def bench_dense(shapes=DENSE_SHAPES, dtype=torch.bfloat16, b_layout="k", config_for=None, reps=30):
    from .gemm.api import gemm

    timer = Timer()
    rows = []
    for m, n, k in shapes:
        a, b = _dense_inputs(m, n, k, dtype, b_layout)
        cfg = config_for(m, n, k) if config_for else None
        out = gemm(a, b, config=cfg)
        ref = torch.matmul(a.double(), b.double())
        tout = torch.matmul(a, b)
        err = (out.double() - ref).abs().max().item()
        terr = (tout.double() - ref).abs().max().item()
        t_ours = timer(lambda a=a, b=b, cfg=cfg: gemm(a, b, config=cfg), reps)
        t_torch = timer(lambda a=a, b=b: torch.matmul(a, b), reps)
        flops = 2.0 * m * n * k
        from .gemm.api import TORCH_TO_NAME, _device_info
        from .gemm.config import GemmProblem
        from .gemm.policy import policy_for

        arch, sms = _device_info(torch.cuda.current_device())
        used = cfg or policy_for(arch, sms).choose(
            GemmProblem(m, n, k, 1, TORCH_TO_NAME[dtype], TORCH_TO_NAME[dtype], TORCH_TO_NAME[dtype], "k",
                        "k" if b_layout == "k" else "n")
        )
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


def host_overhead(calls: int = 2000, rounds: int = 5) -> dict:
    """Host time per warm call (µs) on tiny problems, ours beside torch's, all in one process:
    ``cutegemm.gemm`` vs ``torch.matmul`` (128^3 bf16) and ``cutegemm.grouped_gemm`` vs
    ``torch._grouped_mm`` (4 experts, 256 x 128 x 128, packed), plus our torch.library ops
    (``torch.ops.cutegemm.gemm`` / ``grouped_gemm``: what torch.compile'd code calls).

    ``calls`` back-to-back calls per timing (the kernels are shorter than the host work, so the
    GPU queue never fills and this is the per-call host cost); the functions are timed in turn,
    ``rounds`` times, and the fastest round of each is kept (drift hits all alike). Prints one
    table (µs and ours / torch) and returns ``{name: µs}``."""
    from .gemm.api import gemm
    from .grouped import grouped_gemm

    bf = torch.bfloat16
    a = torch.randn(128, 128, device="cuda", dtype=bf)
    b = torch.randn(128, 128, device="cuda", dtype=bf)
    x = torch.randn(256, 128, device="cuda", dtype=bf)
    w = torch.randn(4, 128, 128, device="cuda", dtype=bf).transpose(1, 2)  # (E, K, N) view, K-major
    offs = torch.tensor([64, 128, 192, 256], device="cuda", dtype=torch.int32)
    op = torch.ops.cutegemm
    fns = {
        "cutegemm.gemm": lambda: gemm(a, b),
        "torch.ops.cutegemm.gemm": lambda: op.gemm(a, b),
        "torch.matmul": lambda: torch.matmul(a, b),
        "cutegemm.grouped_gemm": lambda: grouped_gemm(x, w, offs=offs),
        "torch.ops.cutegemm.grouped_gemm": lambda: op.grouped_gemm(x, w, offs),
        "torch._grouped_mm": lambda: torch._grouped_mm(x, w, offs=offs),
    }
    res = {name: float("inf") for name in fns}
    for fn in fns.values():
        for _ in range(50):
            fn()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            res[name] = min(res[name], (t1 - t0) / calls * 1e6)
    base = {"cutegemm.gemm": "torch.matmul", "torch.ops.cutegemm.gemm": "torch.matmul",
            "cutegemm.grouped_gemm": "torch._grouped_mm", "torch.ops.cutegemm.grouped_gemm": "torch._grouped_mm"}  # fmt: skip
    print(f"host time per warm call, best of {rounds} x {calls} calls on {torch.cuda.get_device_name()}:")
    for name, us in res.items():
        ratio = f"  ({us / res[base[name]]:.2f}x {base[name]})" if name in base else ""
        print(f"  {name:34s} {us:6.1f} µs{ratio}")
    return res


GROUPED_SHAPES = [
    # (experts, mean tokens per expert, N, K), issue 4's MoE shapes:
    (32, 512, 4096, 7168),  # DeepSeek-V3 up projection
    (32, 512, 7168, 2048),  # DeepSeek-V3 down projection
    (128, 128, 1536, 2048),  # Qwen3-30B-A3B (many small experts)
    (8, 4096, 28672, 4096),  # Mixtral up projection
    (32, 16, 4096, 7168),  # decode
]
GROUPED_NAMES = ["DeepSeek-V3 up", "DeepSeek-V3 down", "Qwen3-30B-A3B", "Mixtral up", "decode"]


def _moe_counts(experts: int, tokens: int, seed: int = 0) -> list[int]:
    """Tokens per expert: Poisson around ``tokens``, rounded to a multiple of 8, one fixed seed."""
    gen = torch.Generator().manual_seed(seed)
    lam = torch.full((experts,), float(tokens))
    return [int(round(c / 8.0)) * 8 for c in torch.poisson(lam, generator=gen).tolist()]


def bench_grouped(shapes=GROUPED_SHAPES, dtype=torch.bfloat16, reps=30, names=None):
    """Ours vs torch._grouped_mm (and a loop of torch.matmul) on MoE shapes, uneven expert loads.
    Also prints the time torch takes to read the weights once (``b.sum()``: the bound of a
    memory-bound decode step) and our time relative to it."""
    from .grouped import grouped_gemm

    names = names or (GROUPED_NAMES if shapes is GROUPED_SHAPES else [None] * len(shapes))
    timer = Timer()
    rows = []
    for (e, tok, n, k), label in zip(shapes, names, strict=True):
        counts = _moe_counts(e, tok)
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
        from .grouped.api import _PLANS

        plan_cfg = next(p.config for key, p in _PLANS.items() if key[0] == a.shape and key[2] == b.shape)
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
    from dataclasses import replace

    from .gemm.api import gemm
    from .grouped import grouped_gemm
    from .grouped.api import _list_launch

    names = names or (GROUPED_NAMES if shapes is GROUPED_SHAPES else [None] * len(shapes))
    cases = [(label, [(c, n, k) for c in _moe_counts(e, tok)]) for (e, tok, n, k), label in zip(shapes, names, strict=True)]
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
        from .gemm.api import _device_info
        from .grouped.api import list_config

        arch, sms = _device_info(torch.cuda.current_device())
        live = [d for d in dims if all(d)]
        cfg = list_config(arch, sms, len(live), sum(m for m, _, _ in live), sum(n for _, n, _ in live) // len(live),
                          sum(k for _, _, k in live) // len(live), "bf16", "bf16", "k", "k", False)  # fmt: skip
        print("   config " + cfg.name, flush=True)
        for over in configs:
            alt = replace(cfg, **over)
            try:
                _list_launch(xs, ws, None, 1.0, config=alt)
                t = timer(lambda xs=xs, ws=ws, alt=alt: _list_launch(xs, ws, None, 1.0, config=alt), reps)
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
    from dataclasses import replace

    from .gemm.api import _device_info, gemm
    from .grouped import grouped_gemm
    from .grouped.api import kgrouped_config

    timer = Timer()
    for e, tok, m, n, label in shapes:
        counts = _moe_counts(e, tok)
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
        arch, sms = _device_info(torch.cuda.current_device())
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


def bench_grouped_fp8(shapes=((32, 512, 4096, 7168),), reps=20, configs=None):
    """FP8 row-wise grouped GEMM (scale_a per token row, scale_b per expert and column) vs
    ``torch._scaled_grouped_mm`` (same inputs, same run); our policy config and ``configs``
    overrides (dicts) beside it. Promoted configs are compared with torch's default
    (``use_fast_accum=False``), ``fast_accum`` configs with ``use_fast_accum=True``."""
    from dataclasses import replace

    from .grouped import grouped_gemm

    timer = Timer()
    rows = []
    for e, tok, n, k in shapes:
        counts = _moe_counts(e, tok)
        total = sum(counts)
        torch.manual_seed(0)
        a = torch.randn(total, k, device="cuda").to(torch.float8_e4m3fn)
        w = torch.randn(e, n, k, device="cuda").to(torch.float8_e4m3fn)
        b = w.transpose(1, 2)
        sa = torch.rand(total, device="cuda") * 0.1 + 0.01
        sb = torch.rand(e, n, device="cuda") * 0.1 + 0.01
        offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
        flops = 2.0 * total * n * k

        def run_torch(a=a, b=b, sa=sa, sb=sb, offs=offs, fast=False):
            return torch._scaled_grouped_mm(a, b, sa, sb, offs=offs, out_dtype=torch.bfloat16, use_fast_accum=fast)

        def ours(cfg=None, fast=False, a=a, b=b, sa=sa, sb=sb, offs=offs):
            return grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb, config=cfg, fast_accum=fast)

        torch_t = {}
        for fast in (False, True):
            try:
                torch_t[fast] = timer(lambda fast=fast: run_torch(fast=fast), reps)
                print(f"torch._scaled_grouped_mm use_fast_accum={fast}: {flops / torch_t[fast] / 1e9:.1f} TFLOP/s",
                      flush=True)  # fmt: skip
            except Exception as exc:
                print(f"torch._scaled_grouped_mm (use_fast_accum={fast}) unavailable: {type(exc).__name__}: "
                      f"{str(exc)[:200]}", flush=True)  # fmt: skip
                torch_t[fast] = float("nan")
        out = ours()
        from .grouped.api import _PLANS

        base = next(p.config for key, p in _PLANS.items() if key[0] == a.shape and key[2] == b.shape)
        ref = None
        try:
            ref = run_torch()
        except Exception:
            pass
        for cfg in [None] + [replace(base, **c) for c in (configs or [])]:
            try:
                fast = cfg is not None and cfg.fast_accum
                o = ours(cfg, fast)
                t = timer(lambda cfg=cfg, fast=fast: ours(cfg, fast), reps)
            except Exception as exc:
                print(f"   {(cfg or base).name}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                continue
            diff = float("nan") if ref is None else (o.float() - ref.float()).abs().max().item()
            tt = torch_t[fast]  # the same accumulation mode
            row = Row(f"FP8 rowwise E{e}x{tok}tok N{n} K{k}{' fast_accum' if fast else ''}", t, tt, flops / t / 1e9,
                      flops / tt / 1e9, tt / t, (cfg or base).name, diff, 0.0)  # fmt: skip
            rows.append(row)
            print(format_row(row) + " (err = max |ours - torch|)", flush=True)
        del out
    return rows


def _scheduler_times(timer, reps, a, b, offs, cfg, t_policy):
    """The policy's tile with the static and the dynamic scheduler side by side (the dynamic one is
    cooperative only: a pingpong policy tile is also timed static-cooperative). The policy's own
    time is reused for its scheduler."""
    from dataclasses import replace

    from .grouped import grouped_gemm

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


def bench_epilogue_quant(m=8192, n_out=4096, k=8192, reps=20):
    """Issue-3 benchmark: ``gemm + swiglu + MXFP8 output`` (B has 2 x n_out interleaved gate/up
    columns) against (a) our plain bf16 GEMM of the same shape, (b) cuBLAS of the same shape, and
    (c) the torch chain ``matmul -> silu(gate) * up -> quantize_ref``. Prints and returns rows."""
    from .blockscaled import quantize_ref
    from .gemm.api import gemm

    timer = Timer()
    a, b = _dense_inputs(m, 2 * n_out, k, torch.bfloat16)
    flops = 2.0 * m * 2 * n_out * k

    def torch_chain():
        y = torch.matmul(a, b)
        h = torch.nn.functional.silu(y[:, 0::2].float()) * y[:, 1::2].float()
        return quantize_ref(h, "mxfp8")

    cases = {
        "ours swiglu+mxfp8": lambda: gemm(a, b, activation="swiglu", out_dtype="mxfp8"),
        "ours plain bf16": lambda: gemm(a, b),
        "ours swiglu bf16": lambda: gemm(a, b, activation="swiglu"),
        "torch.matmul bf16": lambda: torch.matmul(a, b),
        "torch chain (matmul, silu*up, quantize_ref)": torch_chain,
    }
    times = {name: timer(f, reps) for name, f in cases.items()}
    base = times["ours plain bf16"]
    rows = []
    for name, t in times.items():
        line = f"{name:>45} | {t:8.4f} ms | {flops / t / 1e9:7.1f} TFLOP/s | {t / base:5.3f}x our plain GEMM time"
        print(line, flush=True)
        rows.append({"case": name, "ms": t, "tflops": flops / t / 1e9, "vs_plain": t / base})
    chain = times["torch chain (matmul, silu*up, quantize_ref)"] / times["ours swiglu+mxfp8"]
    print(f"fused swiglu+mxfp8 is {chain:.2f}x faster than the torch chain; "
          f"{times['ours swiglu+mxfp8'] / base:.3f}x our plain bf16 GEMM", flush=True)  # fmt: skip
    return rows


FP8_SHAPES = [(8192, 8192, 8192), (16384, 7168, 2048), (4096, 4096, 4096), (128, 7168, 2048)]


def bench_fp8(shapes=FP8_SHAPES, reps=20, configs=None):
    """FP8 e4m3 with row-wise fp32 scales vs ``torch._scaled_mm`` (row-wise), same inputs, same
    run. Promoted configs (accurate) are compared with torch's default, ``fast_accum`` configs with
    torch's ``use_fast_accum=True``. ``configs``: GemmConfig overrides (dicts) timed beside the
    policy's choice."""

    from .gemm.api import _device_info
    from .gemm.config import GemmProblem
    from .gemm.policy import policy_for

    timer = Timer()
    arch, sms = _device_info(torch.cuda.current_device())
    rows = []
    for m, n, k in shapes:
        torch.manual_seed(0)
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
        sa = torch.rand(m, 1, device="cuda") + 0.5
        sb = torch.rand(1, n, device="cuda") + 0.5
        ref = (a.double() @ b.double()) * sa.double() * sb.double()
        flops = 2.0 * m * n * k
        torch_t, torch_err = {}, {}
        for fast in (False, True):

            def run_torch(a=a, b=b, sa=sa, sb=sb, fast=fast):
                return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast)

            torch_err[fast] = (run_torch().double() - ref).abs().max().item()
            torch_t[fast] = timer(run_torch, reps)
            print(f"{m}x{n}x{k}: torch._scaled_mm fast_accum={fast}: {flops / torch_t[fast] / 1e9:.1f} TFLOP/s, "
                  f"max err {torch_err[fast]:.3g}", flush=True)  # fmt: skip
        default = policy_for(arch, sms).choose(GemmProblem(m, n, k, 1, "e4m3", "e4m3", "bf16", "k", "k"))
        for cfg, name, t, err in _fp8_candidates(timer, reps, a, b, sa, sb, ref, default, configs):
            fast = bool(cfg is not None and cfg.fast_accum)
            tt = torch_t[fast]
            row = Row(f"{m}x{n}x{k}", t, tt, flops / t / 1e9, flops / tt / 1e9, tt / t, name, err, torch_err[fast])
            rows.append(row)
            print(format_row(row), flush=True)
    return rows


def _fp8_candidates(timer, reps, a, b, sa, sb, ref, default, configs):
    """[(config or None, name, ms, max err)] of ``gemm(a, b, scale_a=sa, scale_b=sb)`` with the
    policy's config (None) and each override of ``default`` in ``configs`` (dicts); a candidate
    that is not implementable or fails is reported and left out."""
    from dataclasses import replace

    from .gemm.api import gemm
    from .gemm.config import can_implement

    out = []
    for cfg in [None] + [replace(default, **c) for c in (configs or [])]:
        if cfg is not None and not can_implement(cfg)[0]:
            print(f"   {cfg.name}: skipped ({can_implement(cfg)[1]})", flush=True)
            continue
        try:
            o = gemm(a, b, scale_a=sa, scale_b=sb, config=cfg)
            err = (o.double() - ref).abs().max().item()
            t = timer(lambda cfg=cfg: gemm(a, b, scale_a=sa, scale_b=sb, config=cfg), reps)
        except Exception as exc:  # a candidate that fails is reported, not fatal
            print(f"   {(cfg or default).name}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        out.append((cfg, (cfg or default).name + ("" if cfg is not None else " (policy)"), t, err))
    return out


def bench_fp8_blockwise(shapes=((8192, 8192, 8192),), reps=20, configs=None):
    """DeepSeek-style FP8 block scaling (1x128 scales of A, 128x128 of B) vs torch in one run,
    same inputs: torch's blockwise ``torch._scaled_mm`` (cuBLAS; the same recipe) when this torch
    runs it on this GPU, else (reported as such) torch._scaled_mm row-wise; plain bf16 cuBLAS
    (torch.matmul) is printed beside. ``configs``: GemmConfig overrides (dicts, e.g.
    ``dict(tile_n=64)``) timed beside the policy's choice. Returns Rows (torch_ms: the blockwise
    baseline when available)."""

    from .gemm.api import _device_info, gemm_ref
    from .gemm.config import GemmProblem
    from .gemm.policy import policy_for

    timer = Timer()
    arch, sms = _device_info(torch.cuda.current_device())
    rows = []
    for m, n, k in shapes:
        torch.manual_seed(0)
        kb, nb = -(-k // 128), -(-n // 128)
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
        sa = torch.rand(m, kb, device="cuda") + 0.5  # (M, K/128)
        sb = torch.rand(kb, nb, device="cuda") + 0.5  # (K/128, N/128)
        ref = gemm_ref(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float64, compute_dtype=torch.float64)
        flops = 2.0 * m * n * k
        case = f"{m}x{n}x{k} blockwise"

        def torch_blockwise(a=a, b=b, sa=sa.t().contiguous().t(), sb=sb.t().contiguous().t()):
            return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)

        try:
            base_err = (torch_blockwise().double() - ref).abs().max().item()
            base_t, base_name = timer(torch_blockwise, reps), "torch blockwise _scaled_mm"
        except (RuntimeError, NotImplementedError, ValueError, TypeError) as exc:
            print(f"{case}: torch blockwise _scaled_mm unavailable ({type(exc).__name__}: {str(exc)[:200]})")
            ra, rb = torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5

            def torch_rowwise(a=a, b=b, ra=ra, rb=rb):
                return torch._scaled_mm(a, b, scale_a=ra, scale_b=rb, out_dtype=torch.bfloat16)

            base_err = float("nan")  # a different recipe: its error is not comparable
            base_t, base_name = timer(torch_rowwise, reps), "torch row-wise _scaled_mm (other recipe)"
        print(f"{case}: {base_name}: {flops / base_t / 1e9:.1f} TFLOP/s, max err {base_err:.3g}", flush=True)
        a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)
        t16 = timer(lambda a16=a16, b16=b16: torch.matmul(a16, b16), reps)
        print(f"{case}: torch.matmul bf16 (cuBLAS): {flops / t16 / 1e9:.1f} TFLOP/s", flush=True)
        del a16, b16
        p = GemmProblem(m, n, k, 1, "e4m3", "e4m3", "bf16", "k", "k")
        default = policy_for(arch, sms).choose(p, fp8_blockwise=True)
        for _, name, t, err in _fp8_candidates(timer, reps, a, b, sa, sb, ref, default, configs):
            row = Row(case, t, base_t, flops / t / 1e9, flops / base_t / 1e9, base_t / t, name, err, base_err)
            rows.append(row)
            print(format_row(row) + f" | vs bf16 cuBLAS {t16 / t:.3f}x", flush=True)
    return rows


def bench_grouped_fp8_blockwise(shapes=((32, 512, 4096, 7168), (32, 512, 7168, 2048)), reps=20, configs=None):
    """Grouped DeepSeek FP8 block scaling (scale_a (total_M, K/128), scale_b (E, K/128, N/128)) on
    MoE shapes (E, mean tokens, N, K), same operands, same run, against what torch offers: a loop
    of torch's blockwise ``torch._scaled_mm`` over the experts (the same recipe; one launch per
    expert, host-synced counts), ``torch._scaled_grouped_mm`` row-wise (one launch, a coarser
    recipe: per-token x per-(expert, column) scales) and ``torch._grouped_mm`` bf16. ``configs``:
    GemmConfig override dicts timed beside the policy's choice. Returns Rows (torch_ms: the loop
    of blockwise _scaled_mm when this torch runs it, else the row-wise grouped call)."""
    timer = Timer()
    return [row for shape in shapes for row in _bench_gbw_shape(timer, *shape, reps, configs)]


def _bench_gbw_shape(timer, e, tok, n, k, reps, configs):
    from dataclasses import replace

    from .grouped import grouped_gemm, grouped_gemm_ref

    rows = []
    counts = _moe_counts(e, tok)
    total = sum(counts)
    kb, nb = -(-k // 128), -(-n // 128)
    torch.manual_seed(0)
    a = torch.randn(total, k, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(e, n, k, device="cuda").to(torch.float8_e4m3fn)
    b = w.transpose(1, 2)
    sa = torch.rand(total, kb, device="cuda") + 0.5
    sb = (torch.rand(e, nb, kb, device="cuda") + 0.5).transpose(1, 2)  # the weight's scales, (E, KB, NB)
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    bounds = [0, *offs.tolist()]
    flops = 2.0 * total * n * k
    case = f"E{e}x{tok}tok N{n} K{k} blockwise"
    ref = grouped_gemm_ref(a, b, offs=offs, scale_a=sa, scale_b=sb, out_dtype=torch.float64)
    # torch's blockwise layouts, per expert: M-major scale_a of the expert's rows, .t() of (NB, KB)
    sa_m = [sa[bounds[i] : bounds[i + 1]].t().contiguous().t() for i in range(e)]
    sb_m = [sb[i].t().contiguous().t() for i in range(e)]

    def torch_loop():
        out = torch.empty(total, n, device="cuda", dtype=torch.bfloat16)
        for i in range(e):
            s, t = bounds[i], bounds[i + 1]
            if t > s:
                out[s:t] = torch._scaled_mm(a[s:t], b[i], scale_a=sa_m[i], scale_b=sb_m[i], out_dtype=torch.bfloat16)
        return out

    base_t, base_err, base_name = float("nan"), float("nan"), "none"
    try:
        base_err = (torch_loop().double() - ref).abs().max().item()
        base_t, base_name = timer(torch_loop, reps), "loop of torch blockwise _scaled_mm"
        print(f"{case}: {base_name}: {flops / base_t / 1e9:.1f} TFLOP/s, max err {base_err:.3g}", flush=True)
    except (RuntimeError, NotImplementedError, ValueError, TypeError) as exc:
        print(f"{case}: torch blockwise _scaled_mm unavailable ({type(exc).__name__}: {str(exc)[:200]})")
    ra, rb = torch.rand(total, device="cuda") + 0.5, torch.rand(e, n, device="cuda") + 0.5
    try:
        t_rw = timer(lambda: torch._scaled_grouped_mm(a, b, ra, rb, offs=offs, out_dtype=torch.bfloat16), reps)
        print(f"{case}: torch._scaled_grouped_mm row-wise (other recipe): {flops / t_rw / 1e9:.1f} TFLOP/s", flush=True)
        if base_t != base_t:
            base_t, base_name = t_rw, "torch._scaled_grouped_mm row-wise (other recipe)"
    except (RuntimeError, NotImplementedError, ValueError, TypeError) as exc:
        print(f"{case}: torch._scaled_grouped_mm unavailable ({type(exc).__name__}: {str(exc)[:200]})")
    a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)
    t16 = timer(lambda a16=a16, b16=b16: torch._grouped_mm(a16, b16, offs=offs), reps)
    print(f"{case}: torch._grouped_mm bf16: {flops / t16 / 1e9:.1f} TFLOP/s", flush=True)
    out = grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb)
    from .grouped.api import _PLANS

    base = next(p.config for key, p in _PLANS.items() if key[0] == a.shape and key[2] == b.shape and p.config.fp8_blockwise)
    for cfg in [None] + [replace(base, **c) for c in (configs or [])]:
        try:
            o = grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb, config=cfg)
            t = timer(lambda cfg=cfg: grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb, config=cfg), reps)
        except Exception as exc:
            print(f"   {(cfg or base).name}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        err = (o.double() - ref).abs().max().item()
        row = Row(case, t, base_t, flops / t / 1e9, flops / base_t / 1e9, base_t / t, (cfg or base).name, err, base_err)
        rows.append(row)
        print(format_row(row) + f" | vs bf16 _grouped_mm {t16 / t:.3f}x", flush=True)
    del out
    return rows


MXFP8_SHAPES = [(8192, 8192, 8192), (16384, 7168, 2048), (4096, 4096, 4096), (256, 8192, 8192), (64, 8192, 8192),
                (16, 8192, 8192)]  # fmt: skip


def bench_mxfp8(shapes=MXFP8_SHAPES, reps=20, configs=()):
    """MXFP8 x MXFP8 on sm_90a (``blockscaled.sm90_mx``) vs what a Hopper user has, same run, same
    operands: (1) cuBLAS bf16 on the dequantized operands (exact in bf16; the issue's ">= 1.0x
    cuBLAS bf16"), (2) dequantize-then-cuBLAS (bf16 scale multiply of the e4m3 elements in torch,
    then torch.matmul: the path without an MX kernel; the scales are decoded to bf16 once, outside
    the timing), (3) torch._scaled_mm row-wise FP8 (another recipe, for scale). Ours: the policy
    (``gemm(qa, qb)``), then both of its paths forced: the emulation (mx_config) and
    dequantize-first (one bf16 dequantize pass per operand + the bf16 GEMM), then ``configs``
    (dicts of GemmConfig overrides of mx_config). Returns Rows (torch_ms: dequantize-then-cuBLAS)."""
    timer = Timer()
    return [row for m, n, k in shapes for row in _bench_mxfp8_shape(timer, m, n, k, reps, configs)]


def _bench_mxfp8_shape(timer, m, n, k, reps, configs):
    from dataclasses import replace

    from . import gemm, quantize
    from .blockscaled.reference import dequantize_ref, e8m0_to_float
    from .blockscaled.sm90_mx import mx_config

    torch.manual_seed(0)
    qa = quantize(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), "mxfp8")
    qb = quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), "mxfp8")
    a16, b16 = dequantize_ref(qa).to(torch.bfloat16), dequantize_ref(qb).to(torch.bfloat16)
    ref = a16.double() @ b16.double().T
    flops = 2.0 * m * n * k
    case = f"mxfp8 {m}x{n}x{k}"
    t16 = timer(lambda: a16 @ b16.T, reps)
    err16 = ((a16 @ b16.T).double() - ref).abs().max().item()
    sa16 = e8m0_to_float(qa.plain_scales()).to(torch.bfloat16).unsqueeze(-1)
    sb16 = e8m0_to_float(qb.plain_scales()).to(torch.bfloat16).unsqueeze(-1)

    def dq_then_cublas():
        a = (qa.data.view(m, k // 32, 32).to(torch.bfloat16) * sa16).view(m, k)
        b = (qb.data.view(n, k // 32, 32).to(torch.bfloat16) * sb16).view(n, k)
        return a @ b.T

    t_dq = timer(dq_then_cublas, reps)
    ones_a = torch.ones(m, 1, device="cuda")
    ones_b = torch.ones(1, n, device="cuda")
    t_rw = timer(
        lambda: torch._scaled_mm(qa.data, qb.data.T, scale_a=ones_a, scale_b=ones_b, out_dtype=torch.bfloat16),
        reps,
    )
    print(
        f"{case}: cuBLAS bf16 {flops / t16 / 1e9:.1f} TFLOP/s (max err {err16:.3g}); dequantize+cuBLAS "
        f"{flops / t_dq / 1e9:.1f}; torch._scaled_mm row-wise FP8 (other recipe) {flops / t_rw / 1e9:.1f}",
        flush=True,
    )
    from .blockscaled.sm90_mx import _dequantized_gemm, dequantize_first

    rows = []
    default = mx_config(m, n)
    policy = "dequantize-first" if dequantize_first(m, n, qa, qb) else "emulation"
    candidates = [(f"policy ({policy})", lambda: gemm(qa, qb)), (default.name + " (emulation)", lambda: gemm(qa, qb, config=default)),
                  ("dequantize-first", lambda: _dequantized_gemm(qa, qb, torch.bfloat16, 1.0, None, None))]  # fmt: skip
    candidates += [(c.name, lambda c=c: gemm(qa, qb, config=c)) for c in (replace(default, **o) for o in configs)]
    for name, fn in candidates:
        try:
            out = fn()
            err = (out.double() - ref).abs().max().item()
            t = timer(fn, reps)
        except Exception as exc:  # a candidate that does not compile / fit is reported, not fatal
            print(f"{case}: {name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            continue
        row = Row(case, t, t_dq, flops / t / 1e9, flops / t_dq / 1e9, t_dq / t, name, err, err16)
        rows.append(row)
        print(format_row(row) + f" | vs cuBLAS bf16 {t16 / t:.3f}x | vs row-wise FP8 {t_rw / t:.3f}x", flush=True)
    return rows


def bench_fp4x4_hopper(shapes=((8192, 8192, 8192), (16, 8192, 8192)), fmts=("nvfp4", "mxfp4"), reps=20):
    """FP4 x FP4 on sm_90a (dequantize-first: one bf16 dequantize pass per operand + our bf16 GEMM)
    vs the torch path on the same operands, same run: ``dequantize_ref`` (torch ops) of both to
    bf16, then torch.matmul; and cuBLAS bf16 on operands dequantized beforehand."""
    from . import gemm, quantize
    from .blockscaled.reference import dequantize_ref

    timer = Timer()
    for fmt in fmts:
        for m, n, k in shapes:
            torch.manual_seed(0)
            kw = {"global_scale": 0.37} if fmt == "nvfp4" else {}
            qa = quantize(torch.randn(m, k, device="cuda"), fmt, **kw)
            qb = quantize(torch.randn(n, k, device="cuda"), fmt, **kw)
            a16, b16 = dequantize_ref(qa).to(torch.bfloat16), dequantize_ref(qb).to(torch.bfloat16)
            flops = 2.0 * m * n * k
            t_ours = timer(lambda qa=qa, qb=qb: gemm(qa, qb), reps)
            t_torch = timer(lambda qa=qa, qb=qb: dequantize_ref(qa).to(torch.bfloat16) @ dequantize_ref(qb).to(torch.bfloat16).T, reps)
            t16 = timer(lambda a16=a16, b16=b16: a16 @ b16.T, reps)
            same = torch.equal(gemm(qa, qb), gemm(a16, b16.T))
            print(f"{fmt} x {fmt} {m}x{n}x{k}: ours {flops / t_ours / 1e9:.1f} TFLOP/s ({t_ours:.4f} ms) | "
                  f"dequantize_ref + torch.matmul {t_torch:.4f} ms ({t_torch / t_ours:.2f}x) | cuBLAS bf16 on "
                  f"pre-dequantized operands {flops / t16 / 1e9:.1f} ({t16 / t_ours:.2f}x) | equal to our bf16 GEMM "
                  f"of the dequantized operands: {same}", flush=True)  # fmt: skip


FP4W_DENSE = [(1, 28672, 4096), (16, 28672, 4096), (64, 28672, 4096)]
FP4W_GROUPED = [(32, 16, 4096, 7168)]


def bench_fp4_weight(reps=30, dense=FP4W_DENSE, grouped=FP4W_GROUPED, fmts=("nvfp4", "mxfp4"), configs=()):
    """FP4 weights x bf16 activations (decode) vs the bf16 baselines a Hopper user has, same run,
    same (dequantized) weights: cuBLAS ``x @ w.T`` / ``torch._grouped_mm``, and dequantize-then-
    cuBLAS. ``configs``: dicts of Fp4WeightConfig overrides timed beside the default."""
    from dataclasses import replace

    from . import dequantize, quantize
    from .blockscaled.fp4_weight_api import _arch, gemm_fp4_weight, pick_config

    timer = Timer()
    arch = _arch(torch.cuda.current_device())
    rows = []
    cases = [("dense", None, m, n, k) for m, n, k in dense] + [("grouped", e, t, n, k) for e, t, n, k in grouped]
    for fmt in fmts:
        for kind, e, m, n, k in cases:
            torch.manual_seed(0)
            if kind == "dense":
                w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
                offs, total, experts = None, m, 1
            else:
                counts = _moe_counts(e, m)
                total, experts = sum(counts), e
                w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16)
                offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
            qw = quantize(w, fmt)
            del w
            wd = dequantize(qw).to(torch.bfloat16)  # exact: e2m1 * scale fits bf16
            x = torch.randn(total, k, device="cuda", dtype=torch.bfloat16)
            if offs is None:
                ref = x.double() @ wd.double().T
                base = lambda x=x, wd=wd: torch.matmul(x, wd.T)  # noqa: E731
                deq = lambda x=x, qw=qw: torch.matmul(x, dequantize(qw).to(torch.bfloat16).T)  # noqa: E731
                base_name = "cuBLAS bf16"
            else:
                bounds = list(zip([0, *offs.tolist()[:-1]], offs.tolist(), strict=True))
                ref = torch.cat([x[s:t].double() @ wd[i].double().T for i, (s, t) in enumerate(bounds)])
                wt = wd.transpose(1, 2)
                base = lambda x=x, wt=wt, offs=offs: torch._grouped_mm(x, wt, offs=offs)  # noqa: E731
                deq = lambda x=x, qw=qw, offs=offs: torch._grouped_mm(  # noqa: E731
                    x, dequantize(qw).to(torch.bfloat16).transpose(1, 2), offs=offs
                )
                base_name = "torch._grouped_mm bf16"
            terr = (base().double() - ref).abs().max().item()
            t_base = timer(base, reps)
            t_deq = timer(deq, max(5, reps // 3))
            qbytes = qw.data.numel() * qw.data.element_size() + qw.scales.numel()
            default = pick_config(total, fmt, torch.bfloat16, arch, offs is not None, experts)
            for overrides in [{}, *configs]:
                try:
                    cfg = replace(default, **overrides)
                    fn = lambda x=x, qw=qw, offs=offs, cfg=cfg: gemm_fp4_weight(x, qw, offs=offs, config=cfg)  # noqa: E731
                    err = (fn().double() - ref).abs().max().item()
                    t = timer(fn, reps)
                except Exception as exc:  # a candidate that does not fit or fails is reported, not fatal
                    print(f"   {overrides}: FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    continue
                flops = 2.0 * total * n * k
                case = f"{fmt} {kind} M={total}{f' E={e}' if e else ''} N={n} K={k}"
                row = Row(case, t, t_base, flops / t / 1e9, flops / t_base / 1e9, t_base / t, cfg.name, err, terr)
                rows.append(row)
                print(format_row(row) + f" | baseline {base_name} | ours reads {qbytes / t / 1e6:.0f} GB/s of FP4 weights"
                      f" | cutegemm.dequantize (torch ops, unoptimized) + {base_name} {t_deq:.4f} ms", flush=True)  # fmt: skip
            del qw, wd, x, ref
    return rows
