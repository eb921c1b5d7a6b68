"""Dynamic tile scheduler on a GPU (schedulers/dynamic.py, ``scheduler="dynamic"``): dense and
grouped results vs an fp64 reference and bitwise equal to the static scheduler (same tiles, same
k order, only the tile -> CTA assignment differs), poisoned outputs, the counter left at 0 by every
launch (consecutive calls with changing tile counts, a captured CUDA graph replayed 20 times with
changing offs): the fetcher of the launch's last ticket resets it, no host reset runs."""

from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cutegemm import gemm, grouped_gemm, grouped_gemm_ref
from cutegemm.config import Form, GemmConfig

from ..gemm_check import assert_outside_untouched, assert_within_torch_error, poisoned_out

pytestmark = pytest.mark.gpu

DENSE = [
    GemmConfig(arch="sm_90a", tile_m=128, tile_n=128, scheduler="dynamic"),
    GemmConfig(arch="sm_90a", tile_m=128, tile_n=256, cluster_m=2, raster="n", scheduler="dynamic"),
    GemmConfig(arch="sm_90a", tile_m=64, tile_n=128, cluster_n=2, scheduler="dynamic"),
]
GROUPED = [
    GemmConfig(
        arch="sm_90a", form=Form.GROUPED, tile_m=128, tile_n=256, cluster_n=2, group=1, scheduler="dynamic"
    ),
    GemmConfig(arch="sm_90a", form=Form.GROUPED, tile_m=64, tile_n=128, cluster_n=2, group=1, scheduler="dynamic"),
    GemmConfig(arch="sm_90a", form=Form.GROUPED, tile_m=128, tile_n=128, group=1, scheduler="dynamic"),
]
_ids = [c.name for c in DENSE]
_gids = [c.name for c in GROUPED]


def _on_this_gpu(cfg):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90a configs")
    return cfg


def _plan_workspace(plans, cfg):
    """The workspace of the cached plan that runs ``cfg`` (the module's PLANS dict)."""
    return next(
        p.workspace
        for p in reversed(list(plans.values()))  # the newest: earlier tests ran other shapes
        if p.workspace is not None and replace(p.config, epilogue=cfg.epilogue) == cfg
    )


@pytest.mark.parametrize("cfg", DENSE, ids=_ids)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=st.integers(1, 1200), n8=st.integers(1, 160), k8=st.integers(1, 96), batch=st.integers(1, 3))
def test_dense_dynamic_matches_static_and_reference(cfg, m, n8, k8, batch):
    cfg = _on_this_gpu(cfg)
    n, k = 8 * n8, 8 * k8
    a = torch.randn(batch, m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(batch, k, n, device="cuda", dtype=torch.bfloat16)
    buf, out = poisoned_out((batch, m, n), torch.bfloat16)
    gemm(a, b, out=out, config=cfg)
    static = gemm(a, b, config=replace(cfg, scheduler="static"))
    torch.cuda.synchronize()
    ref = torch.matmul(a.double(), b.double())
    assert_within_torch_error(out, a @ b, ref, what=cfg.name)
    assert_outside_untouched(buf, m, n)
    assert torch.equal(out, static), "dynamic and static schedulers disagree"


@pytest.mark.parametrize("cfg", DENSE[:1], ids=_ids[:1])
def test_counter_is_reset_between_calls_and_counts_every_tile(cfg):
    """Every launch leaves the counter at 0 (no host reset runs): were it not, the next call
    would start past its last tile and leave most of the output unwritten. The calls change the
    tile count (M), so a counter left at one launch's count would fail the next."""
    cfg = _on_this_gpu(cfg)
    from cutegemm.gemm.dense import PLANS

    m, n, k = 2048, 2048, 256
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    ref = torch.matmul(a.double(), b.double())
    for rows in (m, m, 640, 64, m, 1):
        out = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm(a[:rows], b, out=out, config=cfg)
        torch.cuda.synchronize()
        assert_within_torch_error(out, a[:rows] @ b, ref[:rows], what=f"repeated call, {rows} rows")
        _plan_workspace(PLANS, cfg)  # (a plan of this config exists)
        counters = [p.workspace.item() for p in PLANS.values()
                    if p.workspace is not None and replace(p.config, epilogue=cfg.epilogue) == cfg]  # fmt: skip
        assert counters and not any(counters), "a launch left the tile counter non-zero"


@pytest.mark.parametrize("cfg", GROUPED, ids=_gids)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(counts=st.lists(st.one_of(st.just(0), st.integers(0, 700)), min_size=1, max_size=24),
       n8=st.integers(2, 64), k8=st.integers(1, 64), pad=st.integers(0, 9))  # fmt: skip
def test_grouped_dynamic_matches_static_and_reference(cfg, counts, n8, k8, pad):
    cfg = _on_this_gpu(cfg)
    E, n, k = len(counts), 8 * n8, 8 * k8
    total = sum(counts) + pad
    a = torch.randn(total, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(E, k, n, device="cuda", dtype=torch.bfloat16)  # N-major, as the configs' b_major
    offs = torch.tensor(counts, dtype=torch.int32, device="cuda").cumsum(0, dtype=torch.int32)
    out = torch.full((total, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    grouped_gemm(a, b, offs=offs, out=out, config=cfg)
    static = torch.full_like(out, float("nan"))
    grouped_gemm(a, b, offs=offs, out=static, config=replace(cfg, scheduler="static"))
    torch.cuda.synchronize()
    end = sum(counts)
    if end:
        ref = grouped_gemm_ref(a, b, offs=offs, compute_dtype=torch.float64)
        bounds = list(zip([0, *offs.tolist()[:-1]], offs.tolist(), strict=True))
        same = torch.cat([a[s:e] @ b[i] for i, (s, e) in enumerate(bounds)])
        assert_within_torch_error(out[:end], same, ref[:end], what=cfg.name)
    assert torch.isnan(out[end:]).all(), "rows past offs[-1] were written"
    assert torch.equal(out[:end], static[:end]), "dynamic and static schedulers disagree"


@pytest.mark.parametrize("cfg", GROUPED[:2], ids=_gids[:2])
def test_grouped_graph_replay_with_changing_offs(cfg):
    """20 replays of one captured graph, offs changed in place before each (some experts empty):
    each replay must equal an eager static-scheduler call. Every replay leaves the counter at 0 for the next."""
    cfg = _on_this_gpu(cfg)
    torch.manual_seed(0)
    E, n, k, total = 16, 512, 256, 4096
    a = torch.randn(total, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(E, k, n, device="cuda", dtype=torch.bfloat16)
    offs = torch.arange(1, E + 1, device="cuda", dtype=torch.int32) * (total // E)
    out = torch.zeros(total, n, device="cuda", dtype=torch.bfloat16)
    grouped_gemm(a, b, offs=offs, out=out, config=cfg)  # compile + plan outside the capture
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        grouped_gemm(a, b, offs=offs, out=out, config=cfg)
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            grouped_gemm(a, b, offs=offs, out=out, config=cfg)
    gen = torch.Generator().manual_seed(1)
    exact = 0
    for _ in range(20):
        counts = torch.multinomial(torch.ones(E), total, replacement=True, generator=gen).bincount(
            minlength=E
        )
        counts[torch.randint(0, E, (3,), generator=gen)] = 0
        offs.copy_(torch.cumsum(counts, 0).to(torch.int32))
        out.fill_(float("nan"))
        g.replay()
        eager = torch.full_like(out, float("nan"))
        grouped_gemm(a, b, offs=offs, out=eager, config=replace(cfg, scheduler="static"))
        torch.cuda.synchronize()
        end = int(counts.sum())
        exact += int(torch.equal(out[:end], eager[:end]) and torch.isnan(out[end:]).all().item())
    assert exact == 20


def test_resident_clusters_bound_the_persistent_grid():
    """gemm.api.resident_clusters: at most SMs // size clusters, at least one; clusters of 1
    are the SM count; a config's grid follows its cluster size (H200: 30 clusters of 4 fit, not
    33, so a grid of 33 left 3 clusters' static tiles to run after all others)."""
    from cutegemm.runtime.device import max_clusters_for, resident_clusters

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert resident_clusters(0, 1) == sms
    for size in (2, 4, 8):
        assert 1 <= resident_clusters(0, size) <= sms // size
    cfg = GemmConfig(arch="sm_90a", tile_m=128, tile_n=128, cluster_m=2, cluster_n=2)
    assert max_clusters_for(cfg, torch.device("cuda", 0)) == resident_clusters(0, 4)
