"""Autotuning without a GPU: candidate sets (default first, all implementable), shape buckets,
record keys, persistence round trip with a fake timer, the opt-in switch, the recursion guard,
failing / wrong candidates, and the CLI's no-GPU answer."""

import json
from dataclasses import replace

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cutegemm import tuning
from cutegemm.config import GemmProblem, can_implement
from cutegemm.epilogue import EpilogueSpec

EPILOGUES = [
    EpilogueSpec(),
    EpilogueSpec(alpha=True),
    EpilogueSpec(bias=True, bias_dtype="bf16", activation="gelu_tanh"),
    EpilogueSpec(beta=True, c_dtype="fp32"),
    EpilogueSpec(gated="swiglu", bias=True),
]


def problem(m=4096, n=4096, k=4096, l=1, a_major="k", b_major="k", out="bf16", dtype="bf16"):
    return GemmProblem(m, n, k, l, dtype, dtype, out, a_major, b_major)


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """A private cache dir, tuning switched by each test, a fixed device name."""
    monkeypatch.setenv("CUTEGEMM_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(tuning.ENV_VAR, raising=False)
    monkeypatch.setattr(tuning, "_device_name", lambda: "Fake H200")
    tuning.enable(None)
    yield
    tuning.enable(None)


# ---------------------------------------------------------------------------------------------- candidates


@settings(max_examples=60, deadline=None)
@example(arch="sm_90a", m=129, n=5640, k=8, l=3, majors="kk", epi=EpilogueSpec(), out="fp32")  # 192x192 with A's short box
@example(arch="sm_90a", m=1, n=8, k=6088, l=1, majors="kk", epi=EpilogueSpec(), out="bf16")  # split K in a cluster
@given(
    arch=st.sampled_from(["sm_90a", "sm_100a"]),
    m=st.integers(1, 20000),
    n=st.integers(1, 3000).map(lambda x: 8 * x),
    k=st.integers(1, 3000).map(lambda x: 8 * x),
    l=st.sampled_from([1, 3]),
    majors=st.sampled_from(["kk", "kn", "mk", "mn"]),
    epi=st.sampled_from(EPILOGUES),
    out=st.sampled_from(["bf16", "fp32"]),
)
def test_dense_candidates_include_default_and_all_implementable(arch, m, n, k, l, majors, epi, out):
    p = problem(m, n, k, l, majors[0], majors[1], out)
    cands = tuning.candidates(arch, "dense", p, epi, num_sms=132)
    assert cands[0] == tuning.default_config(arch, "dense", p, epi, num_sms=132)
    assert 2 <= len(cands) <= tuning.MAX_CANDIDATES
    assert len(set(cands)) == len(cands)
    for cfg in cands:
        assert can_implement(cfg, p)[0], (cfg.name, can_implement(cfg, p)[1])
        assert cfg.epilogue == epi and not cfg.grouped and cfg.arch == arch


@settings(max_examples=60, deadline=None)
@given(
    arch=st.sampled_from(["sm_90a", "sm_100a"]),
    experts=st.integers(1, 128),
    rows=st.integers(1, 4096),
    n=st.integers(1, 2000).map(lambda x: 8 * x),
    k=st.integers(1, 2000).map(lambda x: 8 * x),
    b_major=st.sampled_from(["k", "n"]),
    alpha=st.booleans(),
)
def test_grouped_candidates_include_default_and_all_implementable(arch, experts, rows, n, k, b_major, alpha):
    p = problem(experts * rows, n, k, 1, "k", b_major)
    epi = EpilogueSpec(alpha=alpha)
    cands = tuning.candidates(arch, "grouped", p, epi, num_groups=experts)
    assert cands[0] == tuning.default_config(arch, "grouped", p, epi, num_groups=experts)
    assert len(cands) >= 2 and len(set(cands)) == len(cands)
    for cfg in cands:
        # 2x1 clusters (two m-tiles of one expert sharing B) are sm_90a's only (swap AB, pingpong 128x192)
        assert cfg.grouped and (cfg.cluster_m == 1 or cfg.arch == "sm_90a") and can_implement(cfg, p)[0], cfg.name


def test_default_config_is_the_policy_choice():
    from cutegemm.policy import policy_for

    p = problem(128, 7168, 2048)
    for dense in (p, problem(16, 4096, 7168), problem(96, 1536, 7168)):  # the latter two split K
        assert tuning.default_config("sm_90a", "dense", dense, num_sms=132) == policy_for("sm_90a", 132).choose_dense(
            dense, epilogue=EpilogueSpec()
        )  # fmt: skip
    assert tuning.default_config("sm_90a", "dense", problem(96, 1536, 7168), num_sms=132).split_k > 1
    assert tuning.default_config("sm_90a", "grouped", p, num_groups=8) == policy_for("sm_90a").choose_grouped(
        p, 8, epilogue=EpilogueSpec()
    )
    with pytest.raises(ValueError, match="family"):
        tuning.default_config("sm_90a", "blockscaled", p)


# ---------------------------------------------------------------------------------------------- buckets / keys


def test_pow2_ceil():
    cases = {0: 1, 1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 127: 128, 128: 128, 129: 256}
    assert {x: tuning.pow2_ceil(x) for x in cases} == cases


def test_shape_bucket_dense_rounds_m_only():
    b = lambda m, n=4096, k=4096, l=1: tuning.shape_bucket("dense", problem(m, n, k, l))  # noqa: E731
    assert b(100) == b(128) == "M128_N4096_K4096_L1"
    assert b(129) != b(128)
    assert b(128, n=4104) != b(128) and b(128, k=4104) != b(128) and b(128, l=2) != b(128)


def test_shape_bucket_grouped_uses_mean_rows_per_expert():
    b = lambda m, e, n=512: tuning.shape_bucket("grouped", problem(m, n, 256), e)  # noqa: E731
    assert b(8 * 100, 8) == b(8 * 128, 8) == "E8_rows128_N512_K256"
    assert b(8 * 129, 8) != b(8 * 128, 8)
    assert b(8 * 128, 4) != b(8 * 128, 8) and b(8 * 128, 8, n=1024) != b(8 * 128, 8)


def test_record_key_separates_arch_device_dtypes_majors_epilogue():
    p, epi = problem(256), EpilogueSpec()
    base = tuning.record_key("sm_90a", "H200", "dense", p, epi)
    others = [
        tuning.record_key("sm_100a", "H200", "dense", p, epi),
        tuning.record_key("sm_90a", "H100", "dense", p, epi),
        tuning.record_key("sm_90a", "H200", "grouped", p, epi),
        tuning.record_key("sm_90a", "H200", "dense", problem(256, out="fp32"), epi),
        tuning.record_key("sm_90a", "H200", "dense", problem(256, dtype="fp16"), epi),
        tuning.record_key("sm_90a", "H200", "dense", problem(256, b_major="n"), epi),
        tuning.record_key("sm_90a", "H200", "dense", p, EpilogueSpec(alpha=True)),
    ]
    assert len({base, *others}) == len(others) + 1
    assert base == tuning.record_key("sm_90a", "H200", "dense", problem(200), epi)  # same bucket


# ---------------------------------------------------------------------------------------------- tuning with a fake timer


_runner = {"fn": None}  # the runner the current test installs (FakeGpu, or its own)


def runner(p, epi, num_groups):
    """What gemm / grouped_gemm pass to the tuner: the installed fake runner."""
    return _runner["fn"](p, epi, num_groups)


class FakeGpu:
    """Stands in for the runner and _measure: run(cfg) returns the reference (or garbage / raises for
    configs listed in ``wrong`` / ``broken``); the time of a config is looked up by its knobs."""

    def __init__(self, monkeypatch, times, wrong=(), broken=()):
        self.times, self.wrong, self.broken = times, set(wrong), set(broken)
        self.measured = []
        self.ref = torch.randn(16, 16)
        monkeypatch.setitem(_runner, "fn", self.make_runner)
        monkeypatch.setattr(tuning, "_measure", self.measure)

    def key(self, cfg):
        return (cfg.tile_m, cfg.tile_n, cfg.cluster_m, cfg.cluster_n, cfg.pingpong)

    def make_runner(self, p, epi, num_groups):
        def run(cfg):
            if self.key(cfg) in self.broken:
                raise RuntimeError("does not compile")
            return self.ref + (1.0 if self.key(cfg) in self.wrong else 0.0)

        return run, self.ref

    def measure(self, run, cfg, reps):
        self.measured.append(cfg)
        return self.times.get(self.key(cfg), 1.0)


FAST = (128, 128, 1, 1, False)  # one of the sm_90a dense variants


def test_tune_picks_fastest_and_persists(monkeypatch, tmp_path):
    gpu = FakeGpu(monkeypatch, {FAST: 0.25})
    p = problem(4096, 4096, 4096)
    res = tuning.tune("sm_90a", "dense", p, runner=runner, num_sms=132, reps=3)
    cands = tuning.candidates("sm_90a", "dense", p, num_sms=132)
    assert gpu.measured == cands  # every candidate timed, default first
    assert gpu.key(res.winner) == FAST and res.winner_ms == 0.25 and res.default_ms == 1.0
    assert res.default == cands[0] and res.speedup == 4.0
    path = tuning.tuning_file()
    assert path.parent == tmp_path and path.name == "autotune.json"
    data = json.loads(path.read_text())
    rec = data["records"][res.key]
    assert data["version"] == tuning.FORMAT_VERSION
    assert rec["config"] == tuning.knobs(res.winner) and rec["name"] == res.winner.name


def test_lookup_round_trip_from_disk(monkeypatch):
    FakeGpu(monkeypatch, {FAST: 0.25})
    p = problem(4000, 4096, 4096)
    res = tuning.tune("sm_90a", "dense", p, runner=runner, num_sms=132)
    tuning._records.clear()  # a new process: read from the file
    tuning.enable(True)
    gpu2 = FakeGpu(monkeypatch, {})
    got = tuning.tuned_config("sm_90a", problem(3000, 4096, 4096), EpilogueSpec(), "dense", num_sms=132, runner=runner)
    assert got == replace(
        tuning.default_config("sm_90a", "dense", problem(3000), num_sms=132), **tuning.knobs(res.winner)
    )
    assert gpu2.measured == []  # the record was used, nothing re-timed


def test_disabled_returns_none_even_with_a_record(monkeypatch):
    gpu = FakeGpu(monkeypatch, {FAST: 0.25})
    p = problem(4096)
    tuning.tune("sm_90a", "dense", p, runner=runner, num_sms=132)
    n = len(gpu.measured)
    assert not tuning.enabled()
    assert tuning.tuned_config("sm_90a", p, EpilogueSpec(), "dense", runner=runner) is None
    assert len(gpu.measured) == n


def test_env_var_and_enable_switch(monkeypatch):
    assert not tuning.enabled()
    monkeypatch.setenv(tuning.ENV_VAR, "1")
    assert tuning.enabled()
    tuning.enable(False)
    assert not tuning.enabled()
    tuning.enable(True)
    monkeypatch.setenv(tuning.ENV_VAR, "0")
    assert tuning.enabled()


def test_first_enabled_call_tunes_then_reuses(monkeypatch):
    gpu = FakeGpu(monkeypatch, {(128, 256, 1, 2, False): 0.1, FAST: 0.5})
    monkeypatch.setenv(tuning.ENV_VAR, "1")
    p, epi = problem(1024, 2048, 512, b_major="n"), EpilogueSpec(alpha=True)
    first = tuning.tuned_config("sm_90a", p, epi, "dense", num_sms=132, runner=runner)
    n = len(gpu.measured)
    assert n == len(tuning.candidates("sm_90a", "dense", p, epi, num_sms=132))
    assert gpu.key(first) == (128, 256, 1, 2, False)
    assert first.epilogue == epi and can_implement(first, p)[0]
    assert tuning.tuned_config("sm_90a", p, epi, "dense", num_sms=132, runner=runner) == first
    assert len(gpu.measured) == n
    # another bucket / epilogue tunes again
    tuning.tuned_config("sm_90a", p, EpilogueSpec(), "dense", num_sms=132, runner=runner)
    assert len(gpu.measured) == 2 * n


def test_grouped_tuning_round_trip(monkeypatch):
    gpu = FakeGpu(monkeypatch, {(64, 128, 1, 2, False): 0.2})
    tuning.enable(True)
    p = problem(8 * 512, 1024, 512)
    got = tuning.tuned_config("sm_90a", p, EpilogueSpec(), "grouped", num_groups=8, runner=runner)
    assert got.grouped and gpu.key(got) == (64, 128, 1, 2, False)
    key = tuning.record_key("sm_90a", "Fake H200", "grouped", p, EpilogueSpec(), 8)
    assert key in json.loads(tuning.tuning_file().read_text())["records"]


def test_broken_and_wrong_candidates_are_dropped(monkeypatch):
    p = problem(4096)
    cands = tuning.candidates("sm_90a", "dense", p, num_sms=132)
    keys = [(c.tile_m, c.tile_n, c.cluster_m, c.cluster_n, c.pingpong) for c in cands]
    # the fastest two are broken / wrong: the third fastest wins
    gpu = FakeGpu(monkeypatch, {keys[1]: 0.1, keys[2]: 0.2, keys[3]: 0.3}, wrong=[keys[1]], broken=[keys[2]])
    res = tuning.tune("sm_90a", "dense", p, runner=runner, num_sms=132)
    assert gpu.key(res.winner) == keys[3]
    errors = {t.config: t.error for t in res.trials if t.ms is None}
    assert "wrong result" in errors[cands[1].name] and "does not compile" in errors[cands[2].name]


def test_all_candidates_failing_falls_back_to_default(monkeypatch):
    p = problem(4096)
    cands = tuning.candidates("sm_90a", "dense", p, num_sms=132)
    FakeGpu(
        monkeypatch, {}, broken=[(c.tile_m, c.tile_n, c.cluster_m, c.cluster_n, c.pingpong) for c in cands]
    )
    with pytest.raises(RuntimeError, match="no candidate"):
        tuning.tune("sm_90a", "dense", p, runner=runner, num_sms=132)
    tuning.enable(True)
    with pytest.warns(UserWarning, match="no candidate"):
        assert tuning.tuned_config("sm_90a", p, EpilogueSpec(), "dense", num_sms=132, runner=runner) is None
    assert not tuning.tuning_file().exists()


def test_no_reentry_while_tuning(monkeypatch):
    tuning.enable(True)
    gpu = FakeGpu(monkeypatch, {})
    seen = []
    inner = gpu.make_runner

    def make_runner(*args):
        run, ref = inner(*args)

        def nested(cfg):  # what gemm(config=None) inside a tuning run would ask
            seen.append(tuning.tuned_config("sm_90a", problem(64), EpilogueSpec(), "dense", runner=runner))
            return run(cfg)

        return nested, ref

    monkeypatch.setitem(_runner, "fn", make_runner)
    tuning.tuned_config("sm_90a", problem(4096), EpilogueSpec(), "dense", runner=runner)
    assert seen and all(s is None for s in seen)
    assert not getattr(tuning._local, "tuning", False)  # the guard is released afterwards


def test_unusable_records_are_ignored(monkeypatch, tmp_path):
    tuning.enable(True)
    p = problem(4096)
    default = tuning.default_config("sm_90a", "dense", p)
    assert tuning.config_from_record({"config": {"tile_m": 96}}, default, p) is None  # not implementable
    assert tuning.config_from_record({"nonsense": 1}, default, p) is None
    assert tuning.config_from_record({"config": {"tile_n": 128}}, default, p) == replace(default, tile_n=128)
    tuning.tuning_file().write_text("{not json")
    with pytest.warns(UserWarning, match="unreadable tuning file"):
        assert tuning.load_records(reload=True) == {}
    tuning.tuning_file().write_text(json.dumps({"version": 999, "records": {"x": {}}}))
    assert tuning.load_records(reload=True) == {}


def test_save_merges_with_records_of_other_processes():
    tuning.save_record("a", {"config": {"tile_m": 64}})
    path = tuning.tuning_file()
    data = json.loads(path.read_text())
    data["records"]["b"] = {"config": {"tile_m": 128}}  # written by someone else meanwhile
    path.write_text(json.dumps(data))
    tuning.save_record("c", {"config": {"tile_n": 64}})
    assert set(tuning.load_records()) == {"a", "b", "c"}
    assert not list(path.parent.glob("*.tmp*"))


# ---------------------------------------------------------------------------------------------- CLI


def test_cli_tune_without_gpu_exits_zero(monkeypatch, capsys):
    from cutegemm import __main__ as cli

    monkeypatch.setattr(cli, "_has_gpu", lambda: False)
    assert cli.main(["tune"]) == 0
    assert cli.main(["tune", "grouped", "--shapes", "8x4096x1024x512"]) == 0
    assert "needs a CUDA GPU" in capsys.readouterr().out


def test_cli_shape_parsing():
    from cutegemm.__main__ import _parse_shapes

    assert _parse_shapes("128x256x64,1x2x3", 3) == [(128, 256, 64), (1, 2, 3)]
    assert _parse_shapes("8x4096x1024x512", 4) == [(8, 4096, 1024, 512)]
    with pytest.raises(SystemExit):
        _parse_shapes("128x256", 3)


def test_untunable_problems_use_the_default(monkeypatch):
    gpu = FakeGpu(monkeypatch, {})
    tuning.enable(True)
    p = problem(256)
    assert tuning.tunable(p, EpilogueSpec(alpha=True, bias=True, activation="relu"))
    fields = EpilogueSpec.__dataclass_fields__
    if "quant" in fields:
        quant = EpilogueSpec(quant="mxfp8")
        assert not tuning.tunable(replace(p, out_dtype="e4m3"), quant)
        assert tuning.tuned_config("sm_90a", replace(p, out_dtype="e4m3"), quant, "dense", runner=runner) is None
    assert not tuning.tunable(replace(p, a_dtype="e4m3", b_dtype="e4m3"), EpilogueSpec())
    assert gpu.measured == [] and not tuning.tuning_file().exists()


def test_unexpected_tuning_errors_warn_and_fall_back(monkeypatch):
    def boom(*args):
        raise KeyError("no such dtype")

    monkeypatch.setitem(_runner, "fn", boom)
    tuning.enable(True)
    with pytest.warns(UserWarning, match="autotuning failed"):
        assert tuning.tuned_config("sm_90a", problem(256), EpilogueSpec(), "dense", runner=runner) is None


def test_progress_uses_tqdm_when_installed(monkeypatch):
    import sys
    import types

    calls = []
    fake = types.ModuleType("tqdm.auto")
    fake.tqdm = lambda items, **kw: calls.append(kw) or iter(items)
    monkeypatch.setitem(sys.modules, "tqdm", types.ModuleType("tqdm"))
    monkeypatch.setitem(sys.modules, "tqdm.auto", fake)
    assert list(tuning.progress([1, 2], "x")) == [1, 2] and calls and calls[0]["desc"] == "x"
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # not installed: the plain list
    assert tuning.progress([1, 2], "x") == [1, 2]


def test_unwritable_tuning_file_keeps_the_record_in_memory(monkeypatch, tmp_path):
    FakeGpu(monkeypatch, {FAST: 0.25})
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    monkeypatch.setattr(tuning, "tuning_file", lambda: blocked / "autotune.json")  # parent is a file
    tuning.enable(True)
    p = problem(4096)
    with pytest.warns(UserWarning, match="could not write tuning file"):
        first = tuning.tuned_config("sm_90a", p, EpilogueSpec(), "dense", num_sms=132, runner=runner)
    assert first is not None and (first.tile_m, first.tile_n) == (128, 128)
    monkeypatch.setattr(tuning, "_measure", lambda *a: pytest.fail("re-timed"))
    assert tuning.tuned_config("sm_90a", p, EpilogueSpec(), "dense", num_sms=132, runner=runner) == first


def test_grouped_records_keep_the_swapped_kernel_choice():
    """A record stores swap_ab (a swapped winner comes back swapped, a plain one plain); a record
    written before the knob existed describes an unswapped kernel."""
    p = problem(32 * 512, 4096, 7168)
    epi = EpilogueSpec()
    default = tuning.default_config("sm_90a", "grouped", p, epi, num_groups=32, num_sms=132)
    assert default.swap_ab
    for cfg in tuning.candidates("sm_90a", "grouped", p, epi, num_groups=32, num_sms=132):
        assert tuning.config_from_record({"config": tuning.knobs(cfg)}, default, p) == cfg
    old = {k: v for k, v in tuning.knobs(replace(default, swap_ab=False, cluster_m=1, cluster_n=2)).items() if k != "swap_ab"}
    restored = tuning.config_from_record({"config": old}, default, p)
    assert restored is not None and not restored.swap_ab


def test_tile_candidates_cover_every_variant_and_keep_the_short_box():
    """``bench tiles``' configs: the policy's pick first, all distinct and runnable; every
    SM90_CANDIDATES entry yields a config on some shape the sweep's worst cases have (an entry no
    shape can run would time nothing); decode-sized M keeps A's short box, and N = 576 at M = 1
    gets 4 and 8 K ranges of 64x64 tiles, in shared memory and through the workspace."""
    from cutegemm.bench.tune import SM90_CANDIDATES, tile_candidates
    from cutegemm.config import a_rows_errors, a_rows_for
    from cutegemm.policy import policy_for

    pol = policy_for("sm_90a", 132)
    shapes = [(1, 576, 7168), (128, 10240, 8192), (512, 4096, 14336), (8192, 576, 7168)]
    used = set()
    for m, n, k in shapes:
        p = GemmProblem(m, n, k, 1, "bf16", "bf16", "bf16", "k", "k")
        cfgs = tile_candidates(pol, p)
        assert cfgs[0] == pol.choose_dense(p)
        assert len(set(cfgs)) == len(cfgs) and all(can_implement(c, p)[0] for c in cfgs)
        if m <= 128:
            assert all(c.a_rows or a_rows_errors(replace(c, a_rows=a_rows_for(m))) for c in cfgs)
        for i, cand in enumerate(SM90_CANDIDATES):
            if any(all(getattr(c, f) == v for f, v in cand.items()) for c in cfgs):
                used.add(i)
        if (m, n) == (1, 576):
            splits = {(c.split_k, c.split_cluster) for c in cfgs if (c.tile_m, c.tile_n) == (64, 64)}
            assert {(4, False), (4, True), (8, False), (8, True)} <= splits
    assert used == set(range(len(SM90_CANDIDATES)))
