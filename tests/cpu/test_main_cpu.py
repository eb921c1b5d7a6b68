"""`python -m cutegemm bench FAMILY` dispatch on a (stubbed) GPU: every table family calls its
benchmark, writes its results and prints its table; no kernels run."""

from __future__ import annotations

import types

import pytest


@pytest.mark.parametrize(
    "family, expected",
    [
        ("dense", ["bench_dense"]),
        ("grouped", ["bench_grouped"]),
        ("fp4w", ["bench_fp4_weight"]),
        ("all", ["bench_dense", "bench_grouped"]),
    ],
)
def test_bench_families_dispatch(monkeypatch, tmp_path, capsys, family, expected):
    import torch

    import cutegemm.__main__ as main
    import cutegemm.bench.core as bench
    import cutegemm.bench.scaled as scaled

    calls = []
    monkeypatch.setattr(main, "_has_gpu", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    for mod, name in ((bench, "bench_dense"), (bench, "bench_grouped"), (scaled, "bench_fp4_weight")):
        monkeypatch.setattr(mod, name, lambda reps, name=name: calls.append((name, reps)) or [])
    monkeypatch.setattr(bench, "write_results", lambda rows, prefix, out: out / prefix)
    monkeypatch.setattr(bench, "markdown_table", lambda rows, title: f"TABLE {title}")
    assert main.cmd_bench(types.SimpleNamespace(family=family, reps=3, out=str(tmp_path))) == 0
    assert calls == [(name, 3) for name in expected]
    out = capsys.readouterr().out
    assert out.count("TABLE ") == len(expected) and "Fake_GPU" in out


def test_compile_check_reaches_every_kernel_family(monkeypatch):
    """compile_check.main's family plumbing (the SASS check itself stubbed): every variant of
    the quantize, dequantize and FP4-weight families is listed and checked, for both archs."""
    import importlib

    from cutegemm import compile_check

    seen = []
    families = ("cutegemm.blockscaled.quantizer", "cutegemm.blockscaled.dequant", "cutegemm.blockscaled.weight_only.kernel")
    for name in families:
        mod = importlib.import_module(name)
        monkeypatch.setattr(mod, "check_variant", lambda cfg: seen.append(cfg) or (True, {}, ""))
    archs = ["sm_90a", "sm_100a"]
    res = (compile_check.quantize_results(archs) + compile_check.dequant_results(archs)
           + compile_check.fp4_weight_results(archs))  # fmt: skip
    want = [
        cfg
        for name in families
        for arch in archs
        for cfg in importlib.import_module(name).all_configs(arch)
    ]
    assert seen == want and len(res) == len(want) and all(r.ok for r in res)


def test_bench_host_without_a_gpu_says_so(capsys):
    """`bench host` times warm calls on a GPU; without one it prints why and exits 0."""
    import cutegemm.__main__ as main

    assert main.main(["bench", "host"]) == 0
    assert "no" in capsys.readouterr().out.lower()


def test_bench_host_table(monkeypatch, capsys):
    """With a (stubbed) GPU: one row per public path, ours beside torch's nearest equivalent and
    the ratio; a path whose setup failed shows its reason instead of a number."""
    import torch

    import cutegemm.__main__ as main
    import cutegemm.bench.host as host

    rows = [("gemm(a, b) bf16 128^3", 9.0, "torch.matmul", 12.0, ""),
            ("FP8 block-wise dense", 20.0, "F.scaled_mm block-wise", None, "torch: not in this torch")]  # fmt: skip
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    monkeypatch.setattr(host, "host_table", lambda calls, rounds: rows)
    assert main.main(["bench", "host", "--calls", "10"]) == 0
    out = capsys.readouterr().out
    assert "Fake GPU" in out and "0.75x" in out and "n/a" in out and "not in this torch" in out
    assert [group for group, _ in host.GROUPS] == ["dense", "grouped", "FP8", "quantized", "torch ops"]


@pytest.mark.parametrize(
    "shapes, m_values, rounds, expected",
    [
        ("", "384,640", 3, "layers"),
        ("512x576x7168,64x4096x4096", "", 2, [(512, 576, 7168), (64, 4096, 4096)]),
        ("", "", 4, "dense"),
    ],
)
def test_bench_tiles_shapes(monkeypatch, tmp_path, shapes, m_values, rounds, expected):
    """`bench tiles`: --shapes, else the sweep's layers at --m-values (interleaved --rounds), else
    the dense benchmark's shapes in one round; every candidate's times go to OUT/tiles."""
    import cutegemm.__main__ as main
    import cutegemm.bench.core as bench
    from cutegemm.bench.layers import LAYERS

    seen = {}
    monkeypatch.setattr(main, "_has_gpu", lambda: True)
    monkeypatch.setattr(main, "sweep_dense", lambda shapes, reps, rounds, out: seen.update(shapes=shapes, rounds=rounds, out=out))
    args = types.SimpleNamespace(family="tiles", reps=5, out=str(tmp_path), shapes=shapes, m_values=m_values, rounds=rounds)
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    assert main.cmd_bench(args) == 0
    if expected == "layers":
        assert seen["shapes"] == [(m, n, k) for m in (384, 640) for _, _, n, k in LAYERS] and seen["rounds"] == 3
    elif expected == "dense":
        assert seen["shapes"] == bench.DENSE_SHAPES and seen["rounds"] == 1
    else:
        assert seen["shapes"] == expected and seen["rounds"] == 2
    assert seen["out"] == tmp_path / "tiles"
