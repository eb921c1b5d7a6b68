"""The MoE layer benchmark's CPU side (``cutegemm.bench.moe``): the case list, the seeded layer,
dispatch / combine, the fp64 reference, every implementation's route on CPU tensors at a tiny size
(forward and every gradient against the reference; cutegemm's autograd path runs its reference
twins, the torch re-implementation runs ``torch._grouped_mm`` and its per-expert-matmul CPU
fallback), the interleaved timing loop with a stand-in timer, the writers and the command line."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from functools import partial

import pytest
import torch

from cutegemm.bench import moe
from cutegemm.bench.moe import Result, Runner, Shape
from cutegemm.moe import inverse_permutation

TINY = Shape("tiny", 64, 32, 16, 4, 2)
HAS_HF = importlib.util.find_spec("transformers") is not None
needs_hf = pytest.mark.skipif(not HAS_HF, reason="transformers (>= 5) not installed")
TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}


def test_the_cases_are_the_issues_shapes_with_deepseeks_256_experts():
    dims = {s.name: (s.tokens, s.hidden, s.intermediate, s.experts, s.top_k) for s in moe.SHAPES}
    assert dims == {
        "Qwen3-30B-A3B": (16384, 2048, 768, 128, 8),
        "OLMoE-1B-7B": (16384, 2048, 1024, 64, 8),
        "Mixtral-8x7B": (8192, 4096, 14336, 8, 2),
        "DeepSeek-V3": (8192, 7168, 2048, 256, 8),
        "decode Qwen3-30B-A3B": (64, 2048, 768, 128, 8),
    }
    assert len(moe.cases()) == len(moe.SHAPES) * len(moe.IMPLS) == 30
    t, h, i, _, k = dims["Mixtral-8x7B"]
    assert moe.SHAPES[2].flops == 2 * t * k * h * 2 * i + 2 * t * k * i * h
    assert len(moe.describe().splitlines()) == len(moe.SHAPES)


def test_select_shapes_and_implementations():
    assert [s.name for s in moe.select_shapes("qwen3")] == ["Qwen3-30B-A3B", "decode Qwen3-30B-A3B"]
    assert moe.select_shapes("") == moe.SHAPES
    assert moe.select_impls("sonicmoe") == ("torch", "sonicmoe")  # torch is the ratios' base
    assert moe.select_impls("") == moe.IMPLS
    with pytest.raises(ValueError, match="no MoE shape"):
        moe.select_shapes("llama")
    with pytest.raises(ValueError, match="unknown MoE implementation"):
        moe.select_impls("triton")


def test_the_layer_is_seeded_and_both_gate_up_storages_hold_the_same_weights():
    a, b = moe.make_layer(TINY, "cpu", seed=3), moe.make_layer(TINY, "cpu", seed=3)
    assert torch.equal(a.x, b.x) and torch.equal(a.top_k_index, b.top_k_index) and torch.equal(a.dy, b.dy)
    assert torch.equal(a.w_gate_up, b.w_gate_up) and torch.equal(a.w_down, b.w_down)
    il = a.w_gate_up_il
    assert torch.equal(torch.cat([il[:, 0::2], il[:, 1::2]], dim=1), a.w_gate_up)
    assert a.w_gate_up.shape == (4, 32, 32) and a.w_down.shape == (4, 32, 16)
    assert a.top_k_weights.dtype == torch.bfloat16 and a.top_k_index.shape == (64, 2)
    assert torch.allclose(a.top_k_weights.float().sum(-1), torch.ones(64), atol=1e-2)
    assert (a.top_k_index[:, 0] != a.top_k_index[:, 1]).all()
    assert abs(a.w_gate_up.float().std().item() - moe.INIT_STD) < 0.005
    assert all(t.requires_grad for t in (a.x, a.top_k_weights, a.w_gate_up, a.w_gate_up_il, a.w_down))


def test_dispatch_sorts_by_expert_and_combine_inverts_it():
    layer = moe.make_layer(TINY, "cpu", dtype=torch.float32)
    idx, w = layer.top_k_index, layer.top_k_weights.detach()
    order, offs = moe.dispatch(idx, TINY.experts)
    ids = idx.reshape(-1)[order]
    assert (ids[1:] >= ids[:-1]).all() and offs.dtype == torch.int32
    assert offs.tolist() == torch.bincount(idx.reshape(-1), minlength=4).cumsum(0).tolist()
    x = layer.x.detach()
    y = moe.gather_tokens(x, order, TINY.top_k)  # identity experts
    assert torch.equal(y, x[order // 2])
    assert torch.allclose(moe.combine(y, w, order, TINY.tokens), x * w.sum(-1, keepdim=True), atol=1e-6)
    assert torch.equal(order[inverse_permutation(order)], torch.arange(order.numel()))


def test_grouped_mm_loop_is_torch_grouped_mm():
    a, b = torch.randn(40, 32), torch.randn(3, 16, 32).transpose(1, 2)
    offs = torch.tensor([10, 10, 33], dtype=torch.int32)  # an empty expert, rows past offs[-1]
    got = moe.grouped_mm_loop(a, b, offs)
    assert torch.equal(got[33:], torch.zeros(7, 16))
    assert torch.allclose(got[:33], moe.grouped_mm_torch(a, b, offs)[:33], atol=1e-5)


def _runner(name, layer):
    """The implementations the CPU can run: the benchmark's own (build_runner) and the torch
    re-implementation with torch._grouped_mm and with its per-expert-matmul fallback."""
    if name.startswith("torch_moe"):
        mm = moe.grouped_mm_loop if name.endswith("loop") else moe.grouped_mm_torch
        call = partial(moe.torch_moe, layer.x, layer.top_k_index, layer.top_k_weights, layer.w_gate_up,
                       layer.w_down, mm=mm)  # fmt: skip
        return Runner(name, "re-implementation", call, layer.w_gate_up, "halves")
    return moe.build_runner(name, layer)


ROUTES = ["torch_moe", "torch_moe_loop", "cutegemm", pytest.param("torch", marks=needs_hf),
          pytest.param("cutegemm-hf", marks=needs_hf)]  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ROUTES)
def test_each_implementation_matches_the_fp64_reference(name, dtype):
    layer = moe.make_layer(TINY, "cpu", dtype=dtype)
    run = _runner(name, layer)
    assert isinstance(run, Runner), run
    errs = moe.check(run, layer)
    assert set(errs) == {"out", *moe.GRAD_KEYS}
    assert max(errs.values()) < TOL[dtype], errs
    assert all(t.grad is None for t in (layer.x, layer.w_gate_up, layer.w_down))  # autograd.grad, no .grad


@pytest.mark.parametrize("name", ["cutegemm", "torch_moe_loop"])
def test_an_expert_without_tokens_gets_a_zero_weight_gradient(name):
    layer = moe.make_layer(TINY, "cpu", dtype=torch.float32)
    layer.top_k_index = layer.top_k_index % 3  # expert 3 idle (a token may send both slots to one expert)
    run = _runner(name, layer)
    assert max(moe.check(run, layer).values()) < 1e-5
    _, (_, _, dw1, dw2) = moe.train_step(run, layer)
    assert not dw1[3].any() and not dw2[3].any() and dw1[:3].abs().sum() > 0


def test_the_reference_compares_weight_gradients_in_either_gate_layout():
    layer = moe.make_layer(TINY, "cpu", dtype=torch.float32)
    ref = moe.reference(layer)
    assert ref.out.dtype == torch.float64 and ref.d_routing.shape == (64, 2) and not ref.weight_err
    _, (_, _, dw1, dw2) = moe.train_step(_runner("cutegemm", layer), layer)  # interleaved leaf
    assert max(moe.reference(layer, weight_grads=(dw1, dw2), gate_layout="interleaved").weight_err.values()) < 1e-5
    assert moe.reference(layer, weight_grads=(dw1, dw2), gate_layout="halves").weight_err["dw_gate_up"] > 0.1


@pytest.mark.skipif(importlib.util.find_spec("sonicmoe") is not None, reason="sonicmoe is installed")
def test_sonicmoe_absent_is_not_installed():
    assert moe.build_runner("sonicmoe", moe.make_layer(TINY, "cpu")) == "not installed"
    assert moe.load_sonicmoe() == (None, "not installed")


def test_the_rounds_alternate_their_order_and_a_failure_is_dropped():
    seen = []

    def timer(fn, reps):
        seen.append(fn())
        return 1.0

    def boom():
        raise RuntimeError("out of memory")

    fns = {"a": lambda: "a", "b": lambda: "b", "c": boom}
    times, failed = moe.time_interleaved(fns, timer, rounds=3, reps=1)
    assert seen == ["a", "b", "b", "a", "a", "b"]
    assert times == {"a": [1.0] * 3, "b": [1.0] * 3} and "RuntimeError: out of memory" in failed["c"]


def test_run_shape_on_cpu_with_a_stand_in_timer():
    """The whole per-shape flow (build, check, peak memory, interleaved timing, ratios)."""
    speed = {"torch": 2.0, "cutegemm": 1.0, "cutegemm-hf": 4.0}
    order = []

    def timer(fn, reps):
        fn()
        name = getattr(fn.args[0], "name", "read")
        order.append(name)
        return speed.get(name, 0.5)

    layer = moe.make_layer(TINY, "cpu")
    res = {r.impl: r for r in moe.run_shape(layer, moe.IMPLS, timer, rounds=2, reps=1)}
    assert list(res) == list(moe.IMPLS)
    ran = ["torch", "cutegemm", "cutegemm-gather", "cutegemm-routed"] + (["cutegemm-hf"] if HAS_HF else [])
    assert order == ran + ran[::-1] + ran + ran[::-1] + ["read"]
    assert res["torch"].fwd_ratio == 1.0 and res["cutegemm"].fwd_ratio == 2.0 and res["cutegemm"].train_ratio == 2.0
    assert res["cutegemm"].fwd_tflops == TINY.flops / 1.0 / 1e9 and res["cutegemm"].train_tflops == 3 * TINY.flops / 1e9
    assert res["cutegemm"].read_ms == 0.5 and res["cutegemm"].fwd_peak_mb is None  # no CUDA: no peak
    assert max(res["cutegemm"].errors.values()) < 3e-2 and "fused" in res["cutegemm"].detail
    assert max(res["cutegemm-gather"].errors.values()) < 3e-2 and "dispatch index" in res["cutegemm-gather"].detail
    assert max(res["cutegemm-routed"].errors.values()) < 3e-2 and "one autograd node" in res["cutegemm-routed"].detail
    if HAS_HF:
        assert res["cutegemm-hf"].fwd_ratio == 0.5 and "grouped_mm" in res["torch"].detail
    if importlib.util.find_spec("sonicmoe") is None:
        assert res["sonicmoe"].status == "not installed" and res["sonicmoe"].fwd_ms is None


def _synthetic():
    out = []
    for s in (moe.SHAPES[0], moe.SHAPES[4]):
        for i, impl in enumerate(moe.IMPLS):
            r = Result(s.name, s.tokens, s.hidden, s.intermediate, s.experts, s.top_k, impl, "ok",
                       f"{impl} [gate | up]", read_ms=0.3, grads_mb=1200.0)  # fmt: skip
            if impl == "sonicmoe":
                r.status = "not installed"
            elif impl == "cutegemm-hf" and s.tokens == 64:
                r.status = "failed: RuntimeError: boom"
            else:
                base = 2.0 if impl == "torch" else 2.0 / (1 + i)
                r.fwd_ms, r.fwd_lo, r.fwd_hi = base, base * 0.98, base * 1.02
                r.train_ms, r.train_lo, r.train_hi = 3 * base, 2.9 * base, 3.1 * base
                r.fwd_tflops, r.train_tflops = s.flops / base / 1e9, 3 * s.flops / (3 * base) / 1e9
                r.fwd_ratio = r.train_ratio = 2.0 / base
                r.fwd_ratio_lo = r.train_ratio_lo = 0.95 * 2.0 / base
                r.fwd_ratio_hi = r.train_ratio_hi = 1.05 * 2.0 / base
                r.fwd_peak_mb, r.train_peak_mb = 100.0, 1500.0
                r.errors = {"out": 4e-3, "train_out": 5e-3, "dx": 6e-3, "d_routing": 1e-3, "dw_gate_up": 7e-3, "dw_down": 2e-3}
            out.append(r)
    return out


def test_table_json_and_lines_from_results(tmp_path):
    res = _synthetic()
    md = moe.markdown(res)
    head = ("| shape (T, H, I, E, k) | cutegemm fwd | cutegemm-gather fwd | cutegemm-routed fwd | cutegemm-hf fwd "
            "| sonicmoe fwd | cutegemm fwd+bwd |")
    assert head in md
    assert ("| Qwen3-30B-A3B (16384, 2048, 768, 128, 8) | 2.00x [1.90, 2.10] | 3.00x [2.85, 3.15] | 4.00x [3.80, 4.20] "
            "| 5.00x [4.75, 5.25] | not installed |") in md
    assert "| decode Qwen3-30B-A3B | cutegemm-hf | failed: RuntimeError: boom |" in md
    assert "| cutegemm [gate \\| up] |" in md  # cells escape the table's separator
    assert "- decode Qwen3-30B-A3B: 0.300 ms; forward / that: torch 6.67x, cutegemm 3.33x" in md
    for line in md.splitlines():
        if line.startswith("| Qwen3") or line.startswith("| decode"):
            assert line.replace("\\|", "").count("|") in (11, 12), line  # every row fills its table
    path = moe.write(res, tmp_path)
    meta = json.loads(path.read_text())
    assert meta["gpu"] and len(meta["results"]) == 2 * len(moe.IMPLS)
    assert moe.load(path) == res
    assert (tmp_path / "moe.md").read_text().strip() == md.strip()
    assert "not installed" in moe.format_result(res[moe.IMPLS.index("sonicmoe")]) and "2.00x [1.90, 2.10]" in moe.format_result(res[1])


def test_bench_moe_command_line(monkeypatch, tmp_path, capsys):
    import cutegemm.__main__ as main

    calls = []
    monkeypatch.setattr(main, "_has_gpu", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    monkeypatch.setattr(moe, "bench_moe", lambda *a, **kw: calls.append((a, kw)) or _synthetic())
    argv = ["bench", "moe", "--shapes", "decode", "--impls", "cutegemm", "--rounds", "2", "--reps", "3",
            "--out", str(tmp_path)]  # fmt: skip
    assert main.main(argv) == 0
    (shapes, impls), kw = calls[0]
    assert [s.name for s in shapes] == ["decode Qwen3-30B-A3B"] and impls == ("torch", "cutegemm")
    assert kw == {"rounds": 2, "reps": 3, "out": tmp_path / "moe"}
    assert "#### MoE expert layer" in capsys.readouterr().out


def test_the_benchmark_module_imports_no_optional_dependency():
    code = "import sys, cutegemm.__main__; assert not {'transformers', 'sonicmoe'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)
