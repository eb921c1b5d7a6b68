"""Autotuning: per (arch, family, dtypes, epilogue, shape bucket) a small candidate set of configs,
timed on a GPU, the winner persisted next to the compile cache; plus the tile/cluster sweep used
to set the policy (``sweep_dense``, ``python -m cutegemm bench tiles``).

Opt-in. Off (the default): :func:`tuned_config` returns None and the API uses the policy's
deterministic choice. On (``CUTEGEMM_AUTOTUNE=1`` or ``cutegemm.tuning.enable(True)``): the
first call of a bucket with no record times the candidates and persists the winner; later
calls (any process) read the record. ``python -m cutegemm tune`` tunes a list of shapes ahead.

Candidates (:func:`candidates`): the policy's default (``ArchPolicy.choose`` /
``choose_grouped``) first, then a few tile / cluster / pingpong / raster variants of it; every
one passes ``can_implement`` for the problem. A candidate that fails to compile or run, or
whose result is wrong, is dropped.

Records (:func:`tuning_file`): ``<compile cache root>/autotune.json`` (root: ``$CUTEGEMM_CACHE_DIR``
or ``~/.cache/cutegemm``), one entry per :func:`record_key` (arch, device name, family, dtypes,
majors, epilogue name, :func:`shape_bucket`). Only the tile knobs (:data:`KNOBS`) are stored;
a lookup re-derives the config from the policy's default for the actual problem and re-checks
``can_implement`` (a record that does not fit is ignored), so records survive code changes.

Never tunes while a CUDA graph is being captured (timing syncs), nor from inside a tuning run,
nor problems it cannot synthesize inputs for (:func:`tunable`: quantized-output and user
epilogues); a failed tuning run warns and falls back to the default.
"""

from __future__ import annotations

import json
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from .config import INPUT_DTYPES, OUTPUT_DTYPES, EpilogueSpec, GemmConfig, GemmProblem, can_implement
from .policy import ceil_div, policy_for, short_a_box
from .runtime.cache import cache_dir
from .runtime.timer import Timer

ENV_VAR = "CUTEGEMM_AUTOTUNE"
FILE_NAME = "autotune.json"
# 2: dense records hold knobs over choose_dense's config (1: over choose's; not read any more)
FORMAT_VERSION = 2
FAMILIES = ("dense", "grouped")
# The GemmConfig fields a record stores (everything else comes from the problem and the policy).
KNOBS = (
    "tile_m",
    "tile_n",
    "cluster_m",
    "cluster_n",
    "stages",
    "two_cta",
    "pingpong",
    "raster",
    "group",
    "scheduler",
    "swap_ab",
)
# Knobs a record written before they existed does not hold, and the value its kernel had.
KNOB_BEFORE = {"swap_ab": False}
MAX_CANDIDATES = 8
CHECK_RTOL = 2e-2  # a candidate whose relative (Frobenius) error exceeds this is wrong, not slow

# ---------------------------------------------------------------------------------------------- switch

_enabled: bool | None = None  # None: follow $CUTEGEMM_AUTOTUNE
_local = threading.local()  # .tuning: a tuning run is in progress on this thread


def enable(on: bool | None = True) -> None:
    """Turn autotuning on / off for this process; ``None`` goes back to ``$CUTEGEMM_AUTOTUNE``."""
    global _enabled
    _enabled = on


def enabled() -> bool:
    if _enabled is not None:
        return _enabled
    return os.environ.get(ENV_VAR, "") == "1"


# ---------------------------------------------------------------------------------------------- keys


def pow2_ceil(x: int) -> int:
    """Smallest power of two >= x (1 for x <= 1)."""
    return 1 if x <= 1 else 1 << (int(x) - 1).bit_length()


def shape_bucket(family: str, p: GemmProblem, num_groups: int = 1) -> str:
    """Dense: exact N, K, batch L, M rounded up to a power of two. Grouped: exact N, K, expert
    count, mean rows per expert rounded up to a power of two (what the policy looks at)."""
    if family == "dense":
        return f"M{pow2_ceil(p.m)}_N{p.n}_K{p.k}_L{p.l}"
    if family == "grouped":
        return f"E{num_groups}_rows{pow2_ceil(ceil_div(p.m, max(num_groups, 1)))}_N{p.n}_K{p.k}"
    raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")


def record_key(
    arch: str, device_name: str, family: str, p: GemmProblem, epilogue: EpilogueSpec, num_groups: int = 1
) -> str:
    return "|".join(
        (
            arch,
            device_name,
            family,
            f"{p.a_dtype}{p.b_dtype}->{p.out_dtype}",
            f"{p.a_major}{p.b_major}",
            f"epi-{epilogue.name}",
            shape_bucket(family, p, num_groups),
        )
    )


# ---------------------------------------------------------------------------------------------- candidates

# Variants tried on top of the default (each dict sets every knob it cares about).
_SM90_DENSE = [
    dict(tile_m=128, tile_n=256, cluster_m=2, cluster_n=1, pingpong=False, raster="n", group=8),
    dict(tile_m=128, tile_n=256, cluster_m=1, cluster_n=2, pingpong=False, raster="m", group=8),
    dict(tile_m=128, tile_n=224, cluster_m=2, cluster_n=1, pingpong=False, raster="n", group=8),  # 16-bit dense
    dict(tile_m=128, tile_n=128, cluster_m=2, cluster_n=1, pingpong=True, raster="m", group=8),
    dict(tile_m=128, tile_n=192, cluster_m=2, cluster_n=1, pingpong=True, raster="n", group=8),  # 16-bit, light epilogues
    dict(tile_m=128, tile_n=128, cluster_m=1, cluster_n=1, pingpong=False, raster="m", group=8),
    dict(tile_m=128, tile_n=64, cluster_m=1, cluster_n=2, pingpong=False, raster="n", group=1),
    dict(tile_m=64, tile_n=256, cluster_m=1, cluster_n=2, pingpong=True, raster="n", group=1),
    dict(tile_m=128, tile_n=192, cluster_m=2, cluster_n=1, pingpong=False, raster="m", group=8),
]
_SM90_GROUPED_SWAP = dict(swap_ab=True, tile_m=128, cluster_m=2, cluster_n=1, pingpong=False, scheduler="dynamic")
_SM90_GROUPED_PLAIN = dict(swap_ab=False, cluster_m=1)
_SM90_GROUPED = [
    dict(_SM90_GROUPED_PLAIN, tile_m=128, tile_n=256, cluster_n=2, pingpong=False, scheduler="dynamic"),
    dict(_SM90_GROUPED_SWAP, tile_n=256),
    dict(_SM90_GROUPED_SWAP, tile_n=192),
    dict(_SM90_GROUPED_PLAIN, tile_m=128, tile_n=128, cluster_n=2, pingpong=True, scheduler="static"),
    dict(_SM90_GROUPED_PLAIN, tile_m=128, tile_n=192, cluster_m=2, cluster_n=1, pingpong=True, scheduler="static"),
    dict(_SM90_GROUPED_PLAIN, tile_m=64, tile_n=128, cluster_n=2, pingpong=False),
    dict(_SM90_GROUPED_PLAIN, tile_m=128, tile_n=256, cluster_n=1, pingpong=False),
    dict(_SM90_GROUPED_PLAIN, tile_m=64, tile_n=256, cluster_n=2, pingpong=False),
]
_SM100_DENSE = [
    dict(tile_m=256, tile_n=256, two_cta=True, cluster_m=2, cluster_n=1),
    dict(tile_m=256, tile_n=128, two_cta=True, cluster_m=2, cluster_n=1),
    dict(tile_m=128, tile_n=256, two_cta=False, cluster_m=1, cluster_n=1),
    dict(tile_m=128, tile_n=128, two_cta=False, cluster_m=1, cluster_n=1),
    dict(tile_m=128, tile_n=128, two_cta=False, cluster_m=2, cluster_n=1),
]
_SM100_GROUPED = [
    dict(tile_m=128, tile_n=128, cluster_n=1),
    dict(tile_m=128, tile_n=256, cluster_n=1),
    dict(tile_m=64, tile_n=128, cluster_n=1),
    dict(tile_m=128, tile_n=128, cluster_n=2),
]
_VARIANTS = {
    ("sm_90a", "dense"): _SM90_DENSE,
    ("sm_90a", "grouped"): _SM90_GROUPED,
    ("sm_100a", "dense"): _SM100_DENSE,
    ("sm_100a", "grouped"): _SM100_GROUPED,
}


def default_config(
    arch: str,
    family: str,
    p: GemmProblem,
    epilogue: EpilogueSpec = EpilogueSpec(),
    num_groups: int = 1,
    num_sms: int | None = None,
) -> GemmConfig:
    """The policy's deterministic choice (what the API uses when tuning is off): dense calls the
    full dense rule (``choose_dense``: the wave model's K split, the short A box and the K split
    of decode-sized M), so the candidates built on it keep those and a tuned winner is timed
    against the config the call would run untuned."""
    pol = policy_for(arch, num_sms)
    if family == "dense":
        return pol.choose_dense(p, epilogue=epilogue)
    if family == "grouped":
        return pol.choose_grouped(p, num_groups, epilogue=epilogue)
    raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")


def candidates(
    arch: str,
    family: str,
    p: GemmProblem,
    epilogue: EpilogueSpec = EpilogueSpec(),
    num_groups: int = 1,
    num_sms: int | None = None,
) -> list[GemmConfig]:
    """The default first, then up to MAX_CANDIDATES - 1 variants; all distinct, all pass
    ``can_implement(cfg, p)``."""
    default = default_config(arch, family, p, epilogue, num_groups, num_sms)
    out = [default]
    for v in _VARIANTS.get((arch, family), []):
        cfg = replace(default, **v)
        if cfg.a_rows:  # the default's short A box (policy.short_a_box), fitted to the variant's tile
            cfg = short_a_box(replace(cfg, a_rows=0), p)
        ok = can_implement(cfg, p)[0]
        if not ok and cfg.split_k > 1:  # the default's K split does not take this tile: unsplit
            cfg = replace(cfg, split_k=1, split_cluster=False, split_tail=False)
            ok = can_implement(cfg, p)[0]
        if ok and cfg not in out:
            out.append(cfg)
        if len(out) >= MAX_CANDIDATES:
            break
    return out


_TUNABLE_EPI_FIELDS = ("alpha", "beta", "bias", "activation", "gated", "c_dtype", "bias_dtype")


def tunable(p: GemmProblem, epilogue: EpilogueSpec) -> bool:
    """Whether the tuner can synthesize inputs for this problem: bf16/fp16 operands, a bf16 /
    fp16 / fp32 output and an epilogue made of alpha / beta*C / bias / activation / gated only
    (quantized-output and user epilogues are not tuned: the policy's default is used)."""
    plain = EpilogueSpec(**{f: getattr(epilogue, f) for f in _TUNABLE_EPI_FIELDS})
    return plain == epilogue and p.a_dtype in INPUT_DTYPES and p.out_dtype in OUTPUT_DTYPES


def knobs(cfg: GemmConfig) -> dict:
    return {k: getattr(cfg, k) for k in KNOBS}


# ---------------------------------------------------------------------------------------------- records


def tuning_file() -> Path:
    """``autotune.json`` in the root of the compile cache (next to the per-source-hash kernel dirs)."""
    return cache_dir().parent / FILE_NAME


_records: dict[Path, dict] = {}  # loaded files, by path
_lock = threading.Lock()


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        warnings.warn(f"cutegemm: ignoring unreadable tuning file {path}: {exc}", stacklevel=3)
        return {}
    if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
        return {}
    recs = data.get("records")
    return recs if isinstance(recs, dict) else {}


def load_records(path: Path | None = None, reload: bool = False) -> dict:
    path = path or tuning_file()
    with _lock:
        if reload or path not in _records:
            _records[path] = _read(path)
        return _records[path]


def save_record(key: str, record: dict, path: Path | None = None) -> Path:
    """Merge one record into the file (re-read first: other processes may have added some),
    written to a temp file and renamed into place. A file that cannot be written only warns: the
    record is kept in memory for this process."""
    path = path or tuning_file()
    with _lock:
        recs = {**_records.get(path, {}), **_read(path), key: record}
        _records[path] = recs
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".json.tmp{os.getpid()}")
            tmp.write_text(json.dumps({"version": FORMAT_VERSION, "records": recs}, indent=1, sort_keys=True))
            os.replace(tmp, path)
        except OSError as exc:
            warnings.warn(f"cutegemm: could not write tuning file {path}: {exc}", stacklevel=3)
    return path


def config_from_record(record: dict, default: GemmConfig, p: GemmProblem) -> GemmConfig | None:
    """The default with the record's knobs, or None when the record is malformed or does not fit."""
    try:
        knobs = {**KNOB_BEFORE, **record["config"]}
        cfg = replace(default, **{k: knobs[k] for k in KNOBS if k in knobs})
    except (KeyError, TypeError):
        return None
    return cfg if can_implement(cfg, p)[0] else None


# ---------------------------------------------------------------------------------------------- timing


@dataclass
class Trial:
    config: str
    ms: float | None  # None: failed (error or wrong result)
    error: str = ""


@dataclass
class TuneResult:
    key: str
    winner: GemmConfig
    default: GemmConfig
    winner_ms: float
    default_ms: float | None
    trials: list[Trial]

    @property
    def speedup(self) -> float | None:
        return self.default_ms / self.winner_ms if self.default_ms else None


def progress(items: list, desc: str) -> Iterable:
    """A tqdm progress bar over ``items`` when tqdm is installed, else the plain list (for long
    tune / compile loops)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, leave=False)


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    if not torch.isfinite(x).all():
        return float("inf")
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


_TIMER: list = []


def _measure(run: Callable, cfg: GemmConfig, reps: int) -> float:
    """Median GPU ms of ``run(cfg)`` (L2-cold, ``benchmarks.Timer``; one shared flush buffer)."""
    if not _TIMER:
        _TIMER.append(Timer())
    return _TIMER[0](lambda: run(cfg), reps=reps, warmup=2)


def _trial(run: Callable, ref: torch.Tensor, cfg: GemmConfig, reps: int) -> Trial:
    try:
        err = _rel_err(run(cfg), ref)  # also compiles the candidate (or loads it from disk)
        if not err <= CHECK_RTOL:
            return Trial(cfg.name, None, f"wrong result (relative error {err:.3g})")
        return Trial(cfg.name, _measure(run, cfg, reps))
    except Exception as exc:  # a candidate that does not compile or run is dropped, not fatal
        return Trial(cfg.name, None, f"{type(exc).__name__}: {str(exc)[:200]}")


def _device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def tune(
    arch: str,
    family: str,
    p: GemmProblem,
    epilogue: EpilogueSpec = EpilogueSpec(),
    *,
    num_groups: int = 1,
    num_sms: int | None = None,
    runner: Callable,
    reps: int = 20,
    device_name: str | None = None,
    persist: bool = True,
    path: Path | None = None,
) -> TuneResult:
    """Time every candidate on the current GPU, persist the fastest correct one (unless
    ``persist=False``) and return it. ``runner(p, epilogue, num_groups)`` returns (run(cfg) -> out,
    reference) on random inputs of the problem (``gemm.dense.dense_runner``,
    ``grouped.packed.grouped_runner``). Raises RuntimeError when no candidate works."""
    device_name = device_name or _device_name()
    key = record_key(arch, device_name, family, p, epilogue, num_groups)
    cands = candidates(arch, family, p, epilogue, num_groups, num_sms)
    prev = getattr(_local, "tuning", False)
    _local.tuning = True
    try:
        run, ref = runner(p, epilogue, num_groups)
        trials = [_trial(run, ref, cfg, reps) for cfg in progress(cands, f"cutegemm tune {key}")]
    finally:
        _local.tuning = prev
        _TIMER.clear()  # frees the 512 MB L2-flush buffer
    ok = [(t.ms, i) for i, t in enumerate(trials) if t.ms is not None]
    if not ok:
        errors = "; ".join(f"{t.config}: {t.error}" for t in trials)
        raise RuntimeError(f"cutegemm: no candidate config works for {key}: {errors}")
    best_ms, best = min(ok)
    res = TuneResult(key, cands[best], cands[0], best_ms, trials[0].ms, trials)
    if persist:
        record = {
            "config": knobs(res.winner), "name": res.winner.name, "ms": best_ms, "default_ms": res.default_ms,
            "default": res.default.name, "candidates": len(cands), "shape": [p.m, p.n, p.k, p.l, num_groups],
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "trials": [asdict(t) for t in trials],
        }  # fmt: skip
        save_record(key, record, path)
    return res


def tuned_config(
    arch: str,
    problem: GemmProblem,
    epilogue: EpilogueSpec = EpilogueSpec(),
    family: str = "dense",
    *,
    runner: Callable,
    num_groups: int = 1,
    num_sms: int | None = None,
) -> GemmConfig | None:
    """The API's hook: None when tuning is off (the caller uses the policy's default), inside a
    tuning run, or when no usable record exists and tuning is not possible now (CUDA-graph
    capture); else the persisted winner, tuning first (and persisting) when there is no record."""
    if not enabled() or getattr(_local, "tuning", False):
        return None
    key = record_key(arch, _device_name(), family, problem, epilogue, num_groups)
    default = default_config(arch, family, problem, epilogue, num_groups, num_sms)
    record = load_records().get(key)
    if record is not None:
        return config_from_record(record, default, problem)
    if not tunable(problem, epilogue):
        return None
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return None  # timing would break the capture; the default is used, nothing is recorded
    try:
        return tune(arch, family, problem, epilogue, runner=runner, num_groups=num_groups, num_sms=num_sms).winner
    except Exception as exc:  # tuning must never break a call the default config can serve
        warnings.warn(f"cutegemm: autotuning failed, using the default config: {exc}", stacklevel=2)
        return None
