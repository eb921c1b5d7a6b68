"""What the tail m-tiles of ragged experts cost: DeepSeek-V3 up (E32, N4096, K7168) with the
benchmarks' Poisson counts (multiples of 8, ~10.8% padded row work at 128-row tiles) against
the same total rows in counts that are multiples of 128 (no padding) and in counts of 128 q + 8
(a nearly empty tail tile per expert). Ours (policy) and torch's, bf16 and FP8 row-wise, rounds
interleaved. FP8 also times ``FP8_CONFIGS`` beside the policy.

    python tools/pad_probe.py [ROUNDS]
"""

import sys
from dataclasses import replace

import torch
from probe_common import F8

from cutegemm.benchmarks import Timer, _moe_counts
from cutegemm.gemm.config import GemmProblem
from cutegemm.gemm.policy import policy_for
from cutegemm.grouped import grouped_gemm

E, TOK, N, K = 32, 512, 4096, 7168
FP8_CONFIGS = (dict(epi_stages=2), dict(epi_stages=3), dict(stages=5))


def counts_sets():
    poisson = _moe_counts(E, TOK)
    total = sum(poisson)
    aligned = [128 * round(total / E / 128)] * E
    tail = [128 * (TOK // 128) + 8] * E
    return {"poisson": poisson, "x128": aligned, "128q+8": tail}


def main(rounds: int):
    timer = Timer()
    pol = policy_for("sm_90a", 132)
    for dtype in (torch.bfloat16, F8):
        for label, counts in counts_sets().items():
            total = sum(counts)
            torch.manual_seed(0)
            if dtype == F8:
                a = torch.randn(total, K, device="cuda").to(F8)
                b = torch.randn(E, N, K, device="cuda").to(F8).transpose(1, 2)
                sa = torch.rand(total, device="cuda") * 0.1 + 0.01
                sb = torch.rand(E, N, device="cuda") * 0.1 + 0.01
            else:
                a = torch.randn(total, K, device="cuda", dtype=dtype)
                b = torch.randn(E, N, K, device="cuda", dtype=dtype).transpose(1, 2)
            offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
            real = sum(counts)
            padded = sum(-(-c // 128) * 128 for c in counts)
            fl = 2.0 * real * N * K
            runs = {}
            if dtype == F8:
                runs["torch"] = lambda a=a, b=b, sa=sa, sb=sb, offs=offs: torch._scaled_grouped_mm(
                    a, b, sa, sb, offs=offs, out_dtype=torch.bfloat16
                )
                runs["ours"] = lambda a=a, b=b, sa=sa, sb=sb, offs=offs: grouped_gemm(
                    a, b, offs=offs, scale_a=sa, scale_b=sb
                )
                base = pol.choose_grouped(GemmProblem(real, N, K, 1, "e4m3", "e4m3", "bf16", "k", "k"), E)
                for over in FP8_CONFIGS:
                    cfg = replace(base, **over)
                    runs[cfg.name] = lambda a=a, b=b, sa=sa, sb=sb, offs=offs, cfg=cfg: grouped_gemm(
                        a, b, offs=offs, scale_a=sa, scale_b=sb, config=cfg
                    )
            else:
                runs["torch"] = lambda a=a, b=b, offs=offs: torch._grouped_mm(a, b, offs=offs)
                runs["ours"] = lambda a=a, b=b, offs=offs: grouped_gemm(a, b, offs=offs)
            times = {k_: [] for k_ in runs}
            for _ in range(rounds):
                for name, f in runs.items():
                    times[name].append(timer(f, 20))
            print(
                f"== {'fp8' if dtype == F8 else 'bf16'} {label}: rows {real}, padded {padded / real:.3f}x; TFLOP/s per round",
                flush=True,
            )
            for name, ts in times.items():
                print(f"   {' '.join(f'{fl / t / 1e9:7.1f}' for t in ts)}  {name}", flush=True)
            del a, b


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
