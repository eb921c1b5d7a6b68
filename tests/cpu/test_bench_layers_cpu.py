"""The layer sweep's CPU side (``cutegemm.bench.layers``): the case list, the configs its calls run
(found without a GPU, for precompiling), and the table / heat map from results."""

import random

import torch

from cutegemm.bench import layers
from cutegemm.bench.layers import Case, Result
from cutegemm.config import GemmConfig
from cutegemm.gemm import dense


def test_the_sweep_covers_ten_layers_of_four_families_at_every_m():
    fams = {f for f, *_ in layers.LAYERS}
    assert len(layers.LAYERS) >= 10 and len(fams) >= 4
    assert set(layers.M_VALUES) >= {1, 16, 64, 128, 512, 1024, 2048, 8192}
    cs = layers.cases()
    assert len(cs) == len(layers.KINDS) * len(layers.LAYERS) * len(layers.M_VALUES)


def test_configs_of_the_sweep_are_found_on_the_cpu():
    lay = [("Llama-3-8B", "o", 4096, 4096), ("DeepSeek-V3", "kv_a", 576, 7168)]
    cfgs = layers.configs_of_sweep(layers=lay, m_values=(1, 1024))
    dtypes = {c.a_dtype for c in cfgs}
    assert dtypes == {"bf16", "e4m3"} and all(c.arch == "sm_90a" for c in cfgs)
    assert not dense.PLANS  # no plan with the recording cache's no-op kernel is left behind


def _results():
    rng = random.Random(0)
    out = []
    for case in layers.cases(layers=layers.LAYERS[:3], m_values=(1, 128, 8192)):
        r = rng.uniform(0.8, 1.2)
        out.append(Result(case, 10.0, 10.0 * r, r, r - 0.02, r + 0.02, "cfg", 1e-3, 1e-3))
    return out


def test_table_summary_and_heat_map(tmp_path):
    res = _results()
    md = layers.markdown(res)
    assert md.count("####") == len(layers.KINDS) == 3 and "| Llama-3-8B qkv (6144 x 4096) |" in md
    stats = layers.summary(res)
    bf = [r.ratio for r in res if r.case.kind == "bf16"]
    assert abs(stats["bf16"]["min"] - min(bf)) < 1e-12 and stats["bf16"]["cases"] == len(bf)
    path = layers.write(res, tmp_path)
    assert layers.load(path)[0].case == res[0].case
    assert (tmp_path / "sweep.md").read_text().strip() == md.strip()
    assert (tmp_path / "sweep.png").stat().st_size > 1000


def test_waves_count_tiles_and_splits_per_sm():
    cfg = GemmConfig(arch="sm_90a", tile_m=128, tile_n=64)
    assert layers.waves(cfg, 128, 10240, 132) == 160 / 132  # the 1.2-wave cliff of a 128-row layer
    assert layers.waves(GemmConfig(arch="sm_90a", tile_m=64, tile_n=128, split_k=4, a_major="k", b_major="k"),
                        1, 4096, 132) == 32 * 4 / 132  # fmt: skip


def test_case_names():
    assert Case("fp8", "Qwen3-32B", "qkv", 128, 10240, 5120).name == "Qwen3-32B qkv M=128"


def test_previous_rule_is_timed_where_it_differs():
    """The sweep times the tile rule from before the wave model where it picks another config
    (and precompiles it); its ratios go into the summary's before_* figures."""
    lay = [("Llama-3-8B", "qkv", 6144, 4096), ("Llama-3-8B", "gate_up", 28672, 4096)]
    plan = dict((c.name + c.kind, cfgs[-1]) for c, cfgs in layers.sweep_plan(layers=lay, m_values=(16, 1024, 8192)))
    qkv = plan["Llama-3-8B qkv M=1024bf16"]
    prev = layers.previous_config(qkv, 1024, 6144, 132)
    assert (qkv.tile_n, prev.tile_n, prev.cluster_m, prev.split_k) == (192, 256, 2, 1)
    assert layers.previous_config(plan["Llama-3-8B gate_up M=8192bf16"], 8192, 28672, 132) is None  # unchanged
    assert layers.previous_config(plan["Llama-3-8B qkv M=16bf16"], 16, 6144, 132) is None  # M <= 128
    cfgs = layers.configs_of_sweep(layers=lay, m_values=(1024,))
    assert prev in cfgs and qkv in cfgs
    res = _results()
    res[0].prev_ratio, res[0].prev_config = 0.5, "old"
    stats = layers.summary(res)[res[0].case.kind]
    assert stats["changed"] == 1 and stats["before_min"] == 0.5 and stats["before_geomean"] < stats["geomean"]
    assert "previous tile rule" in layers.markdown(res)


def test_previous_policy_is_precompiled_and_restored():
    """``previous_policy`` (before the 16-bit 192x128 / 192x160 tiles, 128x96's 2x1 pairs and the
    short-K pingpong's odd-M exception) picks the earlier configs inside and restores the policy
    after; the sweep's precompile list holds both picks. bf16: Llama-3-70B down at M = 384 192x128
    1x2 now, 128x192 1x2 before; Qwen3-32B qkv at M = 1152 192x160 now, 128x256 1x2 before;
    Qwen3-30B-A3B qkv at M = 256 128x96 2x1 now, 1x2 before; DeepSeek-V3 q_b at M = 640 128x192
    1x2 now, pingpong 128x192 2x1 before; FP8 unchanged."""
    from cutegemm import policy

    rates, ratio, odd = dict(policy.TILE_RATES["16-bit"]), policy.WIDE_N_TILES_PER_M, policy.PINGPONG_ODD_M
    assert (192, 128) in rates and (192, 160) in rates and not odd
    lay = [("Llama-3-70B", "down", 8192, 28672), ("Qwen3-32B", "qkv", 10240, 5120),
           ("Qwen3-30B-A3B", "qkv", 5120, 2048), ("DeepSeek-V3", "q_b", 24576, 1536)]  # fmt: skip
    plan = dict(layers=lay, m_values=(256, 384, 640, 1152), kinds=("bf16", "fp8"))
    now = {(c.kind, c.name): cfgs[-1] for c, cfgs in layers.sweep_plan(**plan)}
    with layers.previous_policy():
        assert (192, 128) not in policy.TILE_RATES["16-bit"] and policy.PINGPONG_ODD_M
        old = {(c.kind, c.name): cfgs[-1] for c, cfgs in layers.sweep_plan(**plan)}
    assert policy.TILE_RATES["16-bit"] == rates and (policy.WIDE_N_TILES_PER_M, policy.PINGPONG_ODD_M) == (ratio, odd)

    def tile(c):
        return c.tile_m, c.tile_n, c.cluster_m, c.cluster_n, c.pingpong

    tiles = {name: (tile(now[name]), tile(old[name])) for name in now}
    assert tiles["bf16", "Llama-3-70B down M=384"] == ((192, 128, 1, 2, False), (128, 192, 1, 2, False)), tiles
    assert tiles["bf16", "Qwen3-32B qkv M=1152"] == ((192, 160, 1, 1, False), (128, 256, 1, 2, False)), tiles
    assert tiles["bf16", "Qwen3-30B-A3B qkv M=256"] == ((128, 96, 2, 1, False), (128, 96, 1, 2, False)), tiles
    assert tiles["bf16", "DeepSeek-V3 q_b M=640"] == ((128, 192, 1, 2, False), (128, 192, 2, 1, True)), tiles
    assert all(now[n] == old[n] for n in now if n[0] == "fp8"), tiles
    cfgs = layers.configs_of_sweep(**plan)
    assert all(now[n] in cfgs and old[n] in cfgs for n in now)


def test_every_config_of_the_sweep_is_valid():
    """The sweep's precompile list (its picks, the previous tile rule's and the previous policy's)
    holds valid configs only: the sweep times each with ``config=`` (the layers of each rule: the
    short-K pingpong tile, whose previous tile rule's twin was once a 128x256 pingpong tile)."""
    from cutegemm.config import config_errors

    lay = [("Llama-3-70B", "qkv", 10240, 8192), ("DeepSeek-V3", "q_b", 24576, 1536), ("DeepSeek-V3", "kv_a", 576, 7168)]
    bad = {c.name: config_errors(c) for c in layers.configs_of_sweep(layers=lay) if config_errors(c)}
    assert not bad, bad


def test_per_tensor_fp8_kind():
    """``--kinds ...,fp8t``: FP8 with 0-d scales, against torch._scaled_mm's tensor-wise (cuBLASLt)
    path; its calls run valid configs found on the CPU, and its table names that baseline."""
    case = Case("fp8t", "Llama-3-8B", "o", 1024, 4096, 4096)
    (a, b), kw = layers.operands(case, device="cpu")
    assert a.dtype == b.dtype == torch.float8_e4m3fn and kw["out_dtype"] == torch.bfloat16
    assert kw["scale_a"].dim() == kw["scale_b"].dim() == 0 and a.shape == (1024, 4096) and b.shape == (4096, 4096)
    row = Case("fp8", "Llama-3-8B", "o", 1024, 4096, 4096)
    assert layers.operands(row, device="cpu")[1]["scale_a"].shape == (1024, 1)
    lay = [("Llama-3-8B", "o", 4096, 4096), ("DeepSeek-V3", "kv_a", 576, 7168)]
    plan = layers.sweep_plan(kinds=("fp8t",), layers=lay, m_values=(1, 128, 1024))
    assert len(plan) == 6 and all(cfgs and cfgs[-1].a_dtype == "e4m3" for _, cfgs in plan)
    res = [Result(c, 10.0, 9.0, 0.9, 0.9, 0.9, "cfg", 1e-3, 1e-3) for c, _ in plan]
    md = layers.markdown(res)
    assert "fp8t: torch time / ours vs torch._scaled_mm (per-tensor: cuBLASLt)" in md and "**0.90**" in md
    assert layers.KINDS == layers.ALL_KINDS == ("bf16", "fp8", "fp8t")  # the default sweep has every baseline
