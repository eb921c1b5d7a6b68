"""Gated (swiglu) grouped GEMM, the MoE up projection: the swapped kernel (the policy's since the
gated swap epilogue) against the unswapped kernel the policy took before and torch
(``torch._grouped_mm`` then ``silu(gate) * up`` on the interleaved columns), on the issue-4 MoE
shapes, one process, interleaved rounds. Checks the swapped output against the unswapped one.

    python tools/swap_gated_probe.py [ROUNDS] [SHAPE_INDEX ...]
"""

import sys
from dataclasses import replace

import torch
from probe_common import moe_operands

from cutegemm.benchmarks import GROUPED_NAMES, GROUPED_SHAPES, Timer
from cutegemm.epilogue import EpilogueSpec
from cutegemm.gemm.config import GemmProblem
from cutegemm.gemm.policy import policy_for
from cutegemm.grouped import grouped_gemm

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
only = [int(x) for x in sys.argv[2:]] or list(range(len(GROUPED_SHAPES)))
timer = Timer()
pol = policy_for("sm_90a", torch.cuda.get_device_properties(0).multi_processor_count)
epi = EpilogueSpec(gated="swiglu")


def torch_swiglu(a, b, offs):
    y = torch._grouped_mm(a, b, offs=offs)
    return torch.nn.functional.silu(y[:, 0::2]) * y[:, 1::2]


for i, ((e, tok, n, k), label) in enumerate(zip(GROUPED_SHAPES, GROUPED_NAMES, strict=True)):
    if i not in only:
        continue
    a, b, offs, fl = moe_operands(e, tok, n, k)
    p = GemmProblem(a.shape[0], n, k, 1, b_major="k")
    swapped = pol.choose_grouped(p, e, epilogue=epi)
    plain = pol.choose_grouped(p, e, allow_swap=False, epilogue=epi)
    cands = [("policy " + swapped.name, swapped), ("unswapped " + plain.name, plain)]
    if swapped.swap_ab:
        cands.append(("swap 128x192", replace(swapped, tile_n=192)))
    outs = [grouped_gemm(a, b, offs=offs, activation="swiglu", config=c) for _, c in cands]
    ref = torch_swiglu(a, b, offs)
    end = int(offs[-1])
    for (name, _), o in zip(cands, outs, strict=True):
        d = (o[:end].float() - outs[1][:end].float()).abs().max().item()
        t = (o[:end].float() - ref[:end].float()).abs().max().item()
        print(f"{label} {name}: max |x - unswapped| = {d:.3g}, bitwise {torch.equal(o[:end], outs[1][:end])}, "
              f"max |x - torch| = {t:.3g}", flush=True)  # fmt: skip
        assert d <= 1e-2 * ref[:end].float().abs().max().item(), (label, name, d)
    times = {}
    for _ in range(rounds):
        times.setdefault("torch _grouped_mm + silu*mul", []).append(timer(lambda a=a, b=b, offs=offs: torch_swiglu(a, b, offs), 20))
        for name, c in cands:
            times.setdefault(name, []).append(
                timer(lambda c=c, a=a, b=b, offs=offs: grouped_gemm(a, b, offs=offs, activation="swiglu", config=c), 20))
    print(f"== {label} + swiglu (E{e} x ~{tok}, N{n} K{k}): ms and TFLOP/s per round", flush=True)
    for name, ts in times.items():
        print(f"   {' '.join(f'{t:8.4f} ms {fl / t / 1e9:7.1f}' for t in ts)}  {name}", flush=True)
    del a, b
