"""Autotuning on a GPU: tune small dense and grouped shapes end to end (every candidate compiled,
checked and timed), the winner persisted, later calls (through the public API, with tuning on)
using the record without re-timing and matching an fp64 reference within torch's error; no
tuning inside a CUDA-graph capture. The tuning file goes to a temp dir; compiled kernels stay
in the shared kernel cache (recompiling every candidate would cost minutes)."""

import json
import warnings
from dataclasses import replace

import pytest
import torch

import cutegemm
from cutegemm import grouped_gemm_ref, tuning
from cutegemm.bench import tune as tuner
from cutegemm.config import Form, GemmProblem
from cutegemm.epilogue import EpilogueSpec
from cutegemm.gemm import dense as dense_api
from cutegemm.grouped import packed as grouped_api

from ..gemm_check import assert_within_torch_error

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _tuning_file(tmp_path, monkeypatch):
    path = tmp_path / "autotune.json"
    monkeypatch.setattr(tuning, "tuning_file", lambda: path)
    tuning._records.clear()
    tuning.enable(None)
    torch.manual_seed(0)
    yield path
    tuning.enable(None)
    tuning._records.clear()


def _no_timing(monkeypatch):
    def fail(*args):
        raise AssertionError("re-timed although a record exists")

    monkeypatch.setattr(tuning, "_measure", fail)


def test_tune_dense_end_to_end_persists_a_correct_winner(_tuning_file):
    m, n, k = 256, 512, 384
    res = tuner.tune_dense(m, n, k, reps=3)
    assert res.trials[0].ms is not None, f"the policy's default failed: {res.trials[0].error}"
    assert len(res.trials) >= 2 and res.winner_ms <= res.default_ms
    assert json.loads(_tuning_file.read_text())["records"][res.key]["config"] == tuning.knobs(res.winner)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)  # b = w.t(): K-major, as tuned
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    cutegemm.gemm(a, w.t(), out=out, config=res.winner)
    assert_within_torch_error(out, a @ w.t(), a.double() @ w.t().double(), what=res.winner.name)


def test_autotune_on_first_gemm_call_tunes_then_reuses(_tuning_file, monkeypatch):
    """Needs the hook in gemm/api.py ``_plan`` (tuned_config when config is None)."""
    tuning.enable(True)
    k, n = 320, 640  # a shape no other test uses: the first call takes the slow path
    a = torch.randn(200, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    out = cutegemm.gemm(a, b, alpha=0.5)
    records = json.loads(_tuning_file.read_text())["records"]
    assert len(records) == 1, "the first call with tuning on did not tune"
    (key,) = records
    assert "|dense|" in key and "M256_N640_K320_L1" in key
    ref = 0.5 * (a.double() @ b.double())
    assert_within_torch_error(out, (0.5 * (a @ b).float()).to(torch.bfloat16), ref, what="tuned first call")
    # Same bucket (M 129..256), new signature: the record is used, nothing is timed again.
    _no_timing(monkeypatch)
    a2 = torch.randn(150, k, device="cuda", dtype=torch.bfloat16)
    out2 = cutegemm.gemm(a2, b, alpha=0.5)
    arch, sms = dense_api.device_info(torch.cuda.current_device())
    p = GemmProblem(150, n, k, 1, "bf16", "bf16", "bf16", "k", "n")
    expected = tuning.tuned_config(arch, p, EpilogueSpec(alpha=True), "dense", runner=dense_api.dense_runner, num_sms=sms)
    assert expected is not None and tuning.knobs(expected) == records[key]["config"]
    used = {
        plan.config for key2, plan in dense_api.PLANS.items() if key2[0] == a2.shape and key2[2] == b.shape
    }
    # (the API launches 2-D operands flat: GemmConfig.flat, not a tuning knob)
    assert {replace(c, form=Form.DENSE) for c in used} == {expected}, "the second call did not use the record"
    ref2 = 0.5 * (a2.double() @ b.double())
    assert_within_torch_error(out2, (0.5 * (a2 @ b).float()).to(torch.bfloat16), ref2, what="record reused")


def test_autotune_on_grouped_call_tunes_then_reuses(_tuning_file, monkeypatch):
    tuning.enable(True)
    E, k, n = 4, 192, 320
    counts = [70, 0, 130, 56]
    end, total = sum(counts), sum(counts) + 9
    a = torch.randn(total, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(E, n, k, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    out = torch.full((total, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    cutegemm.grouped_gemm(a, b, offs=offs, out=out)
    records = json.loads(_tuning_file.read_text())["records"]
    assert len(records) == 1 and "|grouped|" in next(iter(records))
    ref = grouped_gemm_ref(a, b, offs=offs, compute_dtype=torch.float64)
    ends = offs.tolist()
    same = torch.cat([a[s:e] @ b[i] for i, (s, e) in enumerate(zip([0, *ends[:-1]], ends, strict=True))])
    assert_within_torch_error(out[:end], same, ref[:end], what="tuned grouped")
    assert torch.isnan(out[end:]).all(), "rows past offs[-1] were written"
    cfg = next(
        p.config
        for key, p in grouped_api.PLANS.items()
        if key[0] == a.shape and key[2] == b.shape and key[-1] is None  # the user's call (config=None)
    )
    assert cfg.grouped and tuning.knobs(cfg) == next(iter(records.values()))["config"]
    # a second call with new offs: same plan, no timing, still correct
    _no_timing(monkeypatch)
    offs.copy_(torch.tensor([0, 256, 0, 0], device="cuda").cumsum(0).to(torch.int32))
    out2 = cutegemm.grouped_gemm(a, b, offs=offs)
    assert_within_torch_error(out2[:256], a[:256] @ b[1], a[:256].double() @ b[1].double(), what="new offs")


@pytest.mark.parametrize("activation,bias", [("swiglu", False), ("silu", True)])
def test_autotune_grouped_with_an_epilogue(_tuning_file, activation, bias):
    """The grouped runner synthesizes the call's epilogue (the MoE up projection's fused SwiGLU,
    a per-expert bias): every candidate runs, none fails on an epilogue mismatch (an H100 run
    of ``bench moe`` with autotuning on fell back to the default for the SwiGLU call)."""
    tuning.enable(True)
    E, k, n = 4, 256, 384
    counts = [40, 0, 100, 60]
    a = torch.randn(sum(counts), k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(E, n, k, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    bb = torch.randn(E, n, device="cuda", dtype=torch.bfloat16) if bias else None
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="cutegemm: autotuning failed")  # the fallback fails the test
        out = cutegemm.grouped_gemm(a, b, offs=offs, activation=activation, bias=bb)
    records = json.loads(_tuning_file.read_text())["records"]
    assert len(records) == 1 and f"epi-{'biasbf16+' if bias else ''}{activation}" in next(iter(records))
    ref = grouped_gemm_ref(a, b, offs=offs, activation=activation, bias=bb, compute_dtype=torch.float64)
    same = grouped_gemm_ref(a, b, offs=offs, activation=activation, bias=bb)
    assert_within_torch_error(out, same, ref, what=f"tuned grouped {activation}")


def test_no_tuning_inside_cuda_graph_capture(_tuning_file):
    tuning.enable(True)
    arch, sms = dense_api.device_info(torch.cuda.current_device())
    p = GemmProblem(4096, 1024, 1024, 1, "bf16", "bf16", "bf16", "k", "k")
    x = torch.zeros(16, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = tuning.tuned_config(arch, p, EpilogueSpec(), "dense", runner=dense_api.dense_runner, num_sms=sms)
        x.add_(1.0)
    graph.replay()
    torch.cuda.synchronize()
    assert got is None and not _tuning_file.exists()
    assert (x == 1.0).all()
