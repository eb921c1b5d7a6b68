"""Sustained clock, power and throughput of GEMMs run back to back (~3 s each), ours vs torch:
nvidia-smi samples SM clock and board power every 50 ms while one call repeats; prints the
medians and TFLOP/s per watt. Shows how the 700 W limit sets the clock each kernel gets.

    python tools/clock_probe.py [--seconds 3] [--set bf16|bound|fp4w]

``--set bound``: the issue targets' shapes (FP8 row-wise and DeepSeek block scales 8192^3,
Qwen3-30B-A3B and Mixtral grouped bf16), each line with the dense tensor peak at the clock the
kernel got (132 SMs x 4096 bf16 / 8192 FP8 FLOP per SM clock), and the Qwen3 weights' read time
by ``w.sum()`` (the bandwidth bound of that call).
"""

import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import cutegemm  # noqa: E402
from cutegemm.benchmarks import _moe_counts  # noqa: E402
from cutegemm.grouped import grouped_gemm  # noqa: E402
from cutegemm.grouped.api import _PLANS  # noqa: E402


def probe(name, fn, flops, seconds, flop_per_clk=None):
    fn()
    torch.cuda.synchronize()
    smi = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "50"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(0.3)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0, n = time.time(), 0
    start.record()
    while time.time() - t0 < seconds:
        for _ in range(10):
            fn()
        n += 10
        torch.cuda.synchronize()
    end.record()
    end.synchronize()
    smi.terminate()
    out = smi.communicate()[0].strip().splitlines()
    samples = [tuple(float(x) for x in line.split(",")) for line in out if "," in line]
    samples = samples[len(samples) // 4 :]  # skip the ramp
    clk = sorted(s[0] for s in samples)[len(samples) // 2] if samples else float("nan")
    pw = sorted(s[1] for s in samples)[len(samples) // 2] if samples else float("nan")
    tflops = flops * n / (start.elapsed_time(end) / 1e3) / 1e12
    peak = ""
    if flop_per_clk:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        pk = sms * flop_per_clk * clk * 1e6 / 1e12
        peak = f"  peak at this clock {pk:7.1f} TFLOP/s ({tflops / pk:5.1%})"
    print(f"{name:<48} {tflops:7.1f} TFLOP/s  SM {clk:6.0f} MHz  {pw:6.1f} W  {tflops / pw:5.3f} TFLOP/s/W{peak}", flush=True)
    return tflops


def moe_pair(label, e, tok, n, k, seconds, flop_per_clk=None):
    """MoE operands (bf16, the benchmark's token counts) and the probes of torch._grouped_mm and
    our policy on them; returns (x, w, offs)."""
    counts = _moe_counts(e, tok)
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    x = torch.randn(sum(counts), k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    fl = 2 * sum(counts) * n * k
    probe(f"{label} torch._grouped_mm", lambda: torch._grouped_mm(x, w, offs=offs), fl, seconds, flop_per_clk)
    probe(f"{label} ours (policy)", lambda: grouped_gemm(x, w, offs=offs), fl, seconds, flop_per_clk)
    return x, w, offs


def bound_set(seconds):
    """The issue targets' shapes, ours and torch's, with the tensor peak at the clock each got."""
    from cutegemm.benchmarks import Timer

    torch.manual_seed(0)
    m = n = k = 8192
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
    sa, sb = torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5
    fl = 2.0 * m * n * k
    probe("fp8 row-wise 8192^3 torch._scaled_mm", lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb,
          out_dtype=torch.bfloat16), fl, seconds, 8192)  # fmt: skip
    probe("fp8 row-wise 8192^3 ours", lambda: cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16),
          fl, seconds, 8192)  # fmt: skip
    ba, bb = torch.rand(m, k // 128, device="cuda") + 0.5, torch.rand(k // 128, n // 128, device="cuda") + 0.5
    ta, tb = ba.t().contiguous().t(), bb.t().contiguous().t()
    try:
        probe("fp8 blockwise 8192^3 torch._scaled_mm", lambda: torch._scaled_mm(a, b, scale_a=ta, scale_b=tb,
              out_dtype=torch.bfloat16), fl, seconds, 8192)  # fmt: skip
    except Exception as exc:  # noqa: BLE001
        print(f"fp8 blockwise torch: unavailable ({type(exc).__name__}: {str(exc)[:120]})")
    probe("fp8 blockwise 8192^3 ours", lambda: cutegemm.gemm(a, b, scale_a=ba, scale_b=bb, out_dtype=torch.bfloat16),
          fl, seconds, 8192)  # fmt: skip
    for label, e, tok, n, k in [("qwen3 E128x128 N1536 K2048", 128, 128, 1536, 2048),
                                ("mixtral E8x4096 N28672 K4096", 8, 4096, 28672, 4096)]:  # fmt: skip
        x, w, offs = moe_pair(label, e, tok, n, k, seconds, 4096)
        if e == 128:
            timer = Timer()
            t_sum = timer(lambda w=w: w.sum(), 30)
            t_ours = timer(lambda x=x, w=w, offs=offs: grouped_gemm(x, w, offs=offs), 30)
            t_torch = timer(lambda x=x, w=w, offs=offs: torch._grouped_mm(x, w, offs=offs), 30)
            gb = (w.numel() + x.numel()) * 2 / 1e9
            print(f"{label}: L2-flushed medians: w.sum() {t_sum * 1e3:.1f} us ({w.numel() * 2 / t_sum / 1e6:.0f} GB/s), "
                  f"ours {t_ours * 1e3:.1f} us, torch {t_torch * 1e3:.1f} us; operands {gb:.3f} GB; 1.5x torch "
                  f"= {t_torch / 1.5 * 1e3:.1f} us = {gb / (t_torch / 1.5) * 1e3:.0f} GB/s of operand reads", flush=True)
        del x, w


def fp4w_set(seconds):
    """FP4-weight prefill (NVFP4 x bf16, N=28672 K=4096; grouped E=32 N=4096 K=7168) beside cuBLAS /
    torch._grouped_mm on the dequantized weight: whether the gap is the clock (power) or work per clock."""
    from cutegemm.blockscaled.dequant import dequantize_checked

    torch.manual_seed(0)
    n, k = 28672, 4096
    qw = cutegemm.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), "nvfp4")
    w16 = dequantize_checked(qw)
    for m in (256, 1024):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        fl = 2.0 * m * n * k
        probe(f"nvfp4 dense M={m} cuBLAS bf16", lambda x=x: x @ w16.t(), fl, seconds, 4096)
        probe(f"nvfp4 dense M={m} ours", lambda x=x: cutegemm.gemm(x, qw), fl, seconds, 4096)
    from probe_common import quantized_moe  # (tools/ is on sys.path when run as a script)

    counts, offs, gq, g16, x = quantized_moe(32, 512, 4096, 7168, "nvfp4")
    fl = 2.0 * sum(counts) * 4096 * 7168
    b = g16.transpose(1, 2)
    probe("nvfp4 grouped E32 ~512 torch._grouped_mm", lambda: torch._grouped_mm(x, b, offs=offs), fl, seconds, 4096)
    probe("nvfp4 grouped E32 ~512 ours", lambda: grouped_gemm(x, gq, offs=offs), fl, seconds, 4096)


def main():
    seconds = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 3.0
    which = sys.argv[sys.argv.index("--set") + 1] if "--set" in sys.argv else "bf16"
    if which in ("bound", "fp4w"):
        (bound_set if which == "bound" else fp4w_set)(seconds)
        return
    torch.manual_seed(0)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16).t()
    probe("dense 8192^3 ours", lambda: cutegemm.gemm(a, b), 2 * 8192**3, seconds)
    probe("dense 8192^3 cuBLAS", lambda: torch.matmul(a, b), 2 * 8192**3, seconds)
    for label, e, tok, n, k in [("mixtral E8x4096 N28672 K4096", 8, 4096, 28672, 4096),
                                ("dsv3-down E32x512 N7168 K2048", 32, 512, 7168, 2048)]:  # fmt: skip
        x, w, offs = moe_pair(label, e, tok, n, k, seconds)
        fl = 2 * x.shape[0] * n * k
        base = next(p.config for key, p in _PLANS.items() if key[0] == x.shape and key[2] == w.shape)
        for over in (dict(cluster_m=2, cluster_n=1), dict(cluster_m=2, cluster_n=2)):
            cfg = replace(base, **over)
            tag = f"c{cfg.cluster_m}x{cfg.cluster_n}"
            try:
                probe(f"{label} ours {tag}", lambda x=x, w=w, offs=offs, cfg=cfg: grouped_gemm(x, w, offs=offs, config=cfg), fl, seconds)
            except Exception as exc:  # noqa: BLE001
                print(f"{label} ours {tag}: FAILED {type(exc).__name__}: {str(exc)[:200]}")
        del x, w


if __name__ == "__main__":
    main()
