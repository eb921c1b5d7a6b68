"""Shared pieces of the H200 probe scripts in tools/ (run by path: ``python tools/x.py``): the
repository on sys.path (appended, so a package first on PYTHONPATH, e.g. an A/B's old copy,
wins), MoE operands with the benchmarks' Poisson expert counts, and the one-launch-each
profiling loop for ``ncu --profile-from-start off``."""

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.append(_ROOT)

import torch  # noqa: E402

from cutegemm.benchmarks import _moe_counts  # noqa: E402

F8 = torch.float8_e4m3fn


def moe_operands(e: int, tok: int, n: int, k: int, dtype=torch.bfloat16, seed: int = 0):
    """(a (total, K), b (E, K, N) as the transposed view of (E, N, K) weights, offs, flops) with
    the seed-0 Poisson counts of ``cutegemm.benchmarks``; FP8 dtypes are cast from fp32 randn."""
    counts = _moe_counts(e, tok)
    total = sum(counts)
    torch.manual_seed(seed)
    if dtype == F8:
        a = torch.randn(total, k, device="cuda").to(F8)
        b = torch.randn(e, n, k, device="cuda").to(F8).transpose(1, 2)
    else:
        a = torch.randn(total, k, device="cuda", dtype=dtype)
        b = torch.randn(e, n, k, device="cuda", dtype=dtype).transpose(1, 2)
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    return a, b, offs, 2.0 * total * n * k


def quantized_moe(e: int, tok: int, n: int, k: int, fmt: str, seed: int = 0):
    """(counts, offs, qw, w16, x) for the low-precision-weight probes: expert weights (E, N, K)
    quantized to ``fmt``, their bf16 dequantization (the baseline's weights) and bf16 tokens."""
    import cutegemm
    from cutegemm.blockscaled.dequant import dequantize_checked

    torch.manual_seed(seed)
    counts = _moe_counts(e, tok)
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    qw = cutegemm.quantize(torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16), fmt)
    x = torch.randn(sum(counts), k, device="cuda", dtype=torch.bfloat16)
    return counts, offs, qw, dequantize_checked(qw), x


def dense_block_scaled(m: int, n: int, k: int, seed: int = 0):
    """FP8 a (M, K), b (K, N) (a K-major view) and DeepSeek block scales sa (M, K/128), sb
    (K/128, N/128), both row-major (uniform in [0.5, 1.5))."""
    torch.manual_seed(seed)
    a, b = torch.randn(m, k, device="cuda").to(F8), torch.randn(n, k, device="cuda").to(F8).t()
    sa = torch.rand(m, k // 128, device="cuda") + 0.5
    sb = torch.rand(k // 128, n // 128, device="cuda") + 0.5
    return a, b, sa, sb


def profile_each(jobs):
    """jobs: [(name, fn)]. Compile and warm every fn up, then run each once between
    cudaProfilerStart / Stop."""
    for _, f in jobs:
        f()
    torch.cuda.synchronize()
    for name, f in jobs:
        print("profiling", name, flush=True)
        torch.cuda.profiler.start()
        f()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


def interleaved_rounds(timer, runs: dict, rounds: int, reps: int = 30) -> dict:
    """{name: [L2-cold median of ``reps`` per round]}: every round times each of ``runs`` once, in
    turn, so clock and power drift fall on all of them alike."""
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, f in runs.items():
            times[name].append(timer(f, reps))
    return times


def report_vs_base(tag, runs: dict, timer, rounds: int, flops: float, unchecked=("base", "read")):
    """Check every run but ``unchecked`` against ``runs["base"]`` (prints a line past 2% of the
    output's scale), then print best-of-rounds L2-cold times (µs) and each run's speedup over base."""
    ref = runs["base"]().float()
    scale = ref.abs().max().item()
    for name, f in runs.items():
        if name in unchecked:
            continue
        err = (f().float() - ref).abs().max().item()
        if err > 0.02 * scale:
            print(f"  {tag} {name}: max err {err:.3g} vs base (scale {scale:.3g}): check", flush=True)
    times = interleaved_rounds(timer, runs, rounds)
    best = {r: min(ts) * 1e3 for r, ts in times.items()}
    t0 = best["base"]
    parts = " | ".join(f"{r} {t:8.1f}" + ("" if r in ("base", "read") else f" ({t0 / t:.2f}x)") for r, t in best.items())
    print(f"{tag}: base {flops / t0 / 1e6:.0f} TFLOP/s | {parts}", flush=True)
