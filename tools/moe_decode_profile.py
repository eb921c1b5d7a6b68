"""The decode MoE forward (`bench moe`'s decode shape: 64 tokens, Qwen3-30B-A3B's dims) against the
time to read the layer's weights once (issue target: within 10%): torch, cutegemm, cutegemm-routed
and cutegemm-gather under no_grad and the weights' read, 5 interleaved rounds of 10 L2-flushed reps;
then each cutegemm route's kernels (torch.profiler, 5 calls), to see what besides the two grouped
GEMMs the step launches.

    python tools/moe_decode_profile.py
"""

import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from cutegemm.bench import moe as bm
from cutegemm.runtime.timer import Timer


def main():
    shape = next(s for s in bm.SHAPES if s.name.startswith("decode"))
    layer, timer = bm.make_layer(shape), Timer()
    runs = {n: bm.build_runner(n, layer) for n in ("torch", "cutegemm", "cutegemm-routed", "cutegemm-gather")}
    fns = {k: (lambda r=r: bm.forward(r)) for k, r in runs.items() if not isinstance(r, str)}
    fns["read"] = lambda: bm.read_weights(layer)
    times = {k: [] for k in fns}
    for r in range(5):
        for k in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            times[k].append(timer(fns[k], reps=10))
    read = statistics.median(times["read"])
    for k, v in times.items():
        med = statistics.median(v)
        print(f"{k:18s} {med * 1e3:8.1f} us [{min(v) * 1e3:.1f}, {max(v) * 1e3:.1f}]  x read {med / read:.3f}")
    for k in ("cutegemm-routed", "cutegemm"):
        if k not in fns:
            continue
        for _ in range(3):
            fns[k]()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                timer.flush.fill_(1.0)
                fns[k]()
            torch.cuda.synchronize()
        print(f"--- {k} (5 calls; the flush fills are the timer's)")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=90))


if __name__ == "__main__":
    main()
