"""Print the GemmConfig reprs a GPU round is expected to compile (grouped epilogue tests, FP8 grouped
and blockwise benches, the grouped sweep), chosen by the same policy the API uses, so
``tools/precompile.py LIST --jobs N`` can build them in parallel before the tests run.

    python tools/round_configs.py > configs.log
"""

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cutegemm.epilogue import EpilogueSpec as E  # noqa: E402
from cutegemm.gemm.config import GemmConfig, GemmProblem  # noqa: E402
from cutegemm.gemm.policy import policy_for  # noqa: E402

SMS = 132
pol = policy_for("sm_90a", SMS)
out = []


def grouped(total, experts, n, specs, a="bf16", out_dtype="bf16", **kw):
    for spec, od in specs:
        p = GemmProblem(total, n, 256, 1, a, a, od or out_dtype, "k", "k")
        out.append(pol.choose_grouped(p, experts, epilogue=spec, **kw))


bias_specs = []
for act in (None, "relu", "gelu", "gelu_tanh", "silu"):
    bias_specs.append((E(bias=True, bias_dtype="bf16", activation=act), None))
    bias_specs.append((E(bias=True, bias_dtype="fp32", activation=act), None))
gated_specs = [(E(bias=True, bias_dtype="bf16", gated=g), None) for g in ("swiglu", "geglu")]
hyp_specs = []
for act in (None, "silu", "swiglu", "gelu_tanh"):
    for bias in (None, "bf16", "fp32"):
        for alpha in (False, True):
            gated = act == "swiglu"
            hyp_specs.append((E(alpha=alpha, bias=bias is not None, bias_dtype=bias or "fp32",
                                activation=None if gated else act, gated="swiglu" if gated else None), None))  # fmt: skip
quant_specs = []
for fmt, od in (("mxfp8", "e4m3"), ("mxfp4", "u8"), ("nvfp4", "u8")):
    quant_specs.append((E(quant=fmt), od))
    quant_specs.append((E(quant=fmt, gated="swiglu", bias=True, bias_dtype="bf16"), od))
for rows in (32, 128, 512):  # the three row classes of choose_grouped
    grouped(rows * 8, 8, 512, bias_specs + gated_specs + hyp_specs + quant_specs)
grouped(768, 6, 512, [(E(), None), (E(gated="swiglu"), None)])  # GroupedExperts, graph test
# FP8 row-wise grouped: tests (153 rows per expert) and the DeepSeek-V3 up bench (512)
fp8 = [(E(scale_a=True, scale_b=True), None)]
for rows in (40, 153, 512):
    grouped(rows * 8, 8, 4096, fp8, a="e4m3")
    grouped(rows * 8, 8, 4096, fp8, a="e4m3", fast_accum=True)
base = pol.choose_grouped(GemmProblem(16384, 4096, 7168, 1, "e4m3", "e4m3", "bf16", "k", "k"), 32,
                          epilogue=fp8[0][0])  # fmt: skip
for c in (dict(cluster_m=2, cluster_n=1),
          dict(tile_m=128, tile_n=128, pingpong=True, fast_accum=True),
          dict(tile_n=256, cluster_m=2, cluster_n=1, fast_accum=True), dict(tile_n=256, fast_accum=True)):  # fmt: skip
    out.append(replace(base, **c))
# DeepSeek blockwise FP8 (dense): the policy for M > 128 and M <= 128, the bench's overlap variants
for m in (8192, 64):
    p = GemmProblem(m, 8192, 8192, 1, "e4m3", "e4m3", "bf16", "k", "k")
    out.append(pol.choose(p, fp8_blockwise=True))
bw = pol.choose(GemmProblem(8192, 8192, 8192, 1, "e4m3", "e4m3", "bf16", "k", "k"), fp8_blockwise=True)
out += [replace(bw, cluster_m=1, cluster_n=2), replace(bw, tile_n=64)]
# FP8 row-wise dense bench candidates and the overlap test configs (tests/test_fp8_gpu.py)
rw = pol.choose(GemmProblem(8192, 8192, 8192, 1, "e4m3", "e4m3", "bf16", "k", "k"))
E8 = E(scale_a=True, scale_b=True)
for c in (dict(tile_n=128, pingpong=True, fast_accum=True), dict(tile_n=256, fast_accum=True),
          dict(tile_n=256, fast_accum=True, cluster_m=1, cluster_n=2)):  # fmt: skip
    out.append(replace(rw, epilogue=E8, **c))
# tests/test_grouped_gpu.py::test_two_cta_clusters_and_ragged_experts
g = GemmConfig(arch="sm_90a", grouped=True, b_major="k", raster="m", group=1)
for c in (dict(tile_m=128, tile_n=256, cluster_m=2), dict(tile_m=128, tile_n=128, cluster_m=2, cluster_n=2),
          dict(tile_m=128, tile_n=192, cluster_m=2, scheduler="dynamic"), dict(tile_m=64, tile_n=256, cluster_m=2)):  # fmt: skip
    out.append(replace(g, **c))
seen = set()
for c in out:
    if c not in seen:
        seen.add(c)
        print(repr(c))
