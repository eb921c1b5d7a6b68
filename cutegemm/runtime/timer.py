"""GPU timing of one call with the L2 flushed (benchmarks and the autotuner)."""

from __future__ import annotations

import statistics

import torch


class Timer:
    """GPU time of one call, L2-cold: before each rep the stream gets a spin kernel (so the host
    can enqueue the flush and the call while the GPU is busy: host overhead is not counted; it
    is measured separately) and a write of 512 MB that evicts the 60 MB L2.

    ``clean``: the write is followed by a read of the same 512 MB, so the L2 the timed call
    finds holds clean lines only. After the write alone it holds ~60 MB of the flush's dirty
    lines, and the timed call (ours and the baseline alike) pays their write-back to HBM as
    its loads evict them: 3-6 us per decode-sized call on the H200, a fixed cost that real calls, which follow kernels that mostly
    read weights, do not pay in this form."""

    def __init__(self, flush_mb: int = 512, spin_cycles: int = 2_000_000, clean: bool = False):
        self.flush = torch.empty(flush_mb * 2**20 // 4, dtype=torch.float32, device="cuda")
        self.sink = torch.empty((), dtype=torch.float32, device="cuda")
        self.spin_cycles = spin_cycles
        self.clean = clean

    def __call__(self, fn, reps: int = 30, warmup: int = 5) -> float:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(reps):
            torch.cuda._sleep(self.spin_cycles)
            self.flush.fill_(1.0)
            if self.clean:
                torch.sum(self.flush, 0, out=self.sink)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)
