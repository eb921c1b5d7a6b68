"""gpt-oss-20b's experts layer without a gradient (bf16, random weights, top-4 of 32): transformers'
`grouped_mm` backend against the cutegemm backend's fused route (biases and swiglu_oai in the
grouped GEMMs' epilogues) and its generic route (the same call with the route's test patched
off), in one process: 4 interleaved rounds of 10 L2-flushed reps, CUDA-event medians and their
spread, each output's error against the fp32 `grouped_mm` result.

    python tools/gpt_oss_ab.py 64,4096
"""

import copy
import statistics
import sys

import torch
import transformers
from transformers.integrations import moe as hf_moe
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

import cutegemm.integrations.transformers as cg
from cutegemm.runtime.timer import Timer

H, I, E, K = 2880, 2880, 32, 4  # gpt-oss-20b


def experts():
    cfg = transformers.GptOssConfig(hidden_size=H, intermediate_size=I, num_local_experts=E, num_experts_per_tok=K)
    torch.manual_seed(0)
    ex = GptOssExperts(cfg)
    with torch.no_grad():
        for name, p in ex.named_parameters():
            p.copy_(torch.randn_like(p) * (0.5 if "bias" in name else 0.02))
    return ex.cuda()


def calls(bf, x, idx, w):
    """name -> the layer's forward by that implementation."""
    oai = cg._oai_gate

    def generic():
        cg._oai_gate = lambda e: False
        try:
            return cg.experts_forward(bf, x, idx, w)
        finally:
            cg._oai_gate = oai

    return {"torch": lambda: hf_moe.grouped_mm_experts_forward(bf, x, idx, w),
            "cutegemm": lambda: cg.experts_forward(bf, x, idx, w), "generic": generic}  # fmt: skip


def main(tokens):
    ex32 = experts()
    bf = copy.deepcopy(ex32).to(torch.bfloat16)
    print("fused route taken:", cg._oai_gate(bf), flush=True)
    timer = Timer()
    for T in tokens:
        g = torch.Generator("cuda").manual_seed(T)
        x = torch.randn(T, H, device="cuda", generator=g) * 3
        w, idx = torch.randn(T, E, device="cuda", generator=g).topk(K, dim=-1)
        w = w.softmax(-1)
        with torch.no_grad():
            ref = hf_moe.grouped_mm_experts_forward(ex32, x, idx, w).double()
            fns = calls(bf, x.bfloat16(), idx, w.bfloat16())
            errs = {k: ((f().double() - ref).norm() / ref.norm()).item() for k, f in fns.items()}
            times = {k: [] for k in fns}
            for r in range(4):
                for k in list(fns) if r % 2 == 0 else list(fns)[::-1]:
                    times[k].append(timer(fns[k], reps=10))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"T={T}: " + "  ".join(f"{k} {med[k]:.4f} ms [{min(times[k]):.4f}, {max(times[k]):.4f}] "
                                     f"x{med['torch'] / med[k]:.2f} err {errs[k]:.4f}" for k in fns), flush=True)  # fmt: skip


if __name__ == "__main__":
    main([int(t) for t in sys.argv[1].split(",")])
