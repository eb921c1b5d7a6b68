"""List form (``grouped_gemm([a...], [b...])``) without a GPU: the tile map twin of the device
scheduler, the config rules and policy, the compile-check variants."""

import bisect
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutegemm.config import EpilogueSpec, Form, GemmConfig, config_errors
from cutegemm.schedulers.grouped import list_tile_map, list_tile_starts

from ..host_overhead_cpu import NoOpKernel, cpu_list_path


def _search(starts, work):
    """What the device scheduler's binary search (``owner_group``) must find: the last group g
    with starts[g] <= work (empty groups share a start with the group after them)."""
    return bisect.bisect_right(starts[:-1], work) - 1


@settings(max_examples=200, deadline=None)
@given(
    shapes=st.lists(st.tuples(st.one_of(st.just(0), st.integers(1, 700)), st.one_of(st.just(0), st.integers(1, 700))),
                    min_size=1, max_size=40),
    tile=st.sampled_from([(64, 128), (128, 128), (128, 256)]),
)  # fmt: skip
def test_list_tile_map_covers_every_tile_once(shapes, tile):
    tm, tn = tile
    starts = list_tile_starts(shapes, tm, tn)
    tiles = list_tile_map(shapes, tm, tn)
    assert len(tiles) == starts[-1]
    expect = {(g, i, j) for g, (m, n) in enumerate(shapes) for i in range(-(-m // tm)) for j in range(-(-n // tn))}
    assert set(tiles) == expect and len(set(tiles)) == len(tiles)
    for work, (g, mi, ni) in enumerate(tiles):
        # the device's mapping: binary search for the group, then m fastest inside it
        gg = _search(starts, work)
        local = work - starts[gg]
        mt = -(-shapes[gg][0] // tm)
        assert (gg, local % mt, local // mt) == (g, mi, ni)


def test_listed_config_rules():
    for arch in ("sm_90a", "sm_100a"):
        ok = GemmConfig(arch=arch, form=Form.LISTED)
        assert config_errors(ok) == [] and ok.name.startswith("listed_")
    assert config_errors(GemmConfig(arch="sm_100a", form=Form.LISTED, scheduler="clc")) == []
    bad = {
        "sm_100a 2-CTA": GemmConfig(arch="sm_100a", form=Form.LISTED, tile_m=256, two_cta=True, cluster_m=2),
        "cluster": GemmConfig(arch="sm_90a", form=Form.LISTED, cluster_n=2),
        "fp8": GemmConfig(arch="sm_90a", form=Form.LISTED, a_dtype="e4m3", b_dtype="e4m3", a_major="k", b_major="k"),
        "bias": GemmConfig(arch="sm_90a", form=Form.LISTED, epilogue=EpilogueSpec(bias=True)),
        "clc on sm_90a": GemmConfig(arch="sm_90a", form=Form.LISTED, scheduler="clc"),
    }
    for what, cfg in bad.items():
        assert any("listed" in e or "kgrouped" in e for e in config_errors(cfg)), what


@pytest.mark.parametrize("groups", [(32, 32 * 16, 4096, 7168), (8, 8 * 512, 4096, 7168), (1, 3, 24, 16), (0, 0, 0, 0)])
@pytest.mark.parametrize("majors", [("k", "n"), ("m", "k")])
def test_list_config_is_valid(groups, majors):
    from cutegemm.grouped.list_form import list_config

    cfg = list_config("sm_90a", 132, *groups, "bf16", "fp32", *majors, True)
    assert cfg.listed and not cfg.grouped and (cfg.cluster_m, cfg.cluster_n) == (1, 1)
    assert cfg.epilogue.alpha and (cfg.a_major, cfg.b_major) == majors
    assert config_errors(cfg) == []


@settings(max_examples=100, deadline=None)
@given(shapes=st.lists(st.tuples(st.integers(0, 600), st.integers(0, 600), st.integers(0, 600)), min_size=1, max_size=30))
def test_list_table_rows(shapes):
    """The host's group table: each row's fields, the first tiles and the total match the tile
    map twin; groups without work carry the template's operands."""
    from cutegemm.grouped.list_form import LIST_COUNTER, list_table
    from cutegemm.schedulers.grouped import (
        LIST_FIELDS,
        LIST_K,
        LIST_LD_A,
        LIST_LD_C,
        LIST_M,
        LIST_PTR_A,
        LIST_PTR_C,
        LIST_TILE,
    )

    live = [g for g, (m, n, k) in enumerate(shapes) if m and n and k]
    t = live[0] if live else 0
    G = len(shapes)
    a_ptrs, b_ptrs, c_ptrs = [1000 + g for g in range(G)], [2000 + g for g in range(G)], [3000 + g for g in range(G)]
    lds = ([10 + g for g in range(G)], [20 + g for g in range(G)])
    table = list_table(shapes, a_ptrs, b_ptrs, c_ptrs, lds, 128, 256, t)
    assert len(table) == LIST_FIELDS * (G + 1)
    starts = list_tile_starts([(m if k else 0, n) for m, n, k in shapes], 128, 256)  # K = 0: no tiles
    assert table[G * LIST_FIELDS + LIST_TILE] == starts[-1]
    assert LIST_TILE < LIST_COUNTER < LIST_FIELDS and table[G * LIST_FIELDS + LIST_COUNTER] == 0  # the tile counter
    for g, (m, n, k) in enumerate(shapes):
        row = table[g * LIST_FIELDS : (g + 1) * LIST_FIELDS]
        assert row[LIST_M : LIST_K + 1] == [m, n, k] and row[LIST_TILE] == starts[g] and row[LIST_LD_C] == n
        src = g if m and n and k else t
        assert row[LIST_PTR_A] == 1000 + src and row[LIST_LD_A] == 10 + src
        assert row[LIST_PTR_C] == (3000 + g if m and n else 3000 + t)


def test_compile_check_lists_listed_variants():
    from cutegemm.compile_check import all_variants, required_markers

    vs = [c for c in all_variants(["sm_90a", "sm_100a"]) if c.listed]
    assert len(vs) >= 6 and {c.arch for c in vs} == {"sm_90a", "sm_100a"}
    assert all("UTMACCTL.IV" in required_markers(c) for c in vs)
    assert {c.scheduler for c in vs} == {"static", "dynamic", "clc"} and any(c.pingpong for c in vs)
    assert all(c.arch == "sm_100a" for c in vs if c.scheduler == "clc")


def test_list_leading_dims_rules():
    """``_list_lds``: the leading dimension of each group's operand read with the given mode
    contiguous, or None when TMA cannot read one in place (no unit stride, a base or a leading
    stride off 16 bytes); groups without work are not checked (0)."""
    import torch

    from cutegemm.grouped.list_form import _list_lds

    def lds(ts, unit, live=None):
        live = live if live is not None else [True] * len(ts)
        return _list_lds([t.shape for t in ts], [t.stride() for t in ts], [t.data_ptr() for t in ts], unit, 8, live)

    buf = torch.empty(4096 + 8, dtype=torch.bfloat16)
    base = (-buf.data_ptr() // 2) % 8  # first 16-byte aligned element
    row = buf[base : base + 40 * 64].view(40, 64)  # K-contiguous, ld 64
    col = buf[base : base + 64 * 40].view(64, 40).t()  # (40, 64) M-contiguous, ld 40
    assert lds([row], 1) == [64] and lds([col], 0) == [40]
    assert lds([row], 0) is None and lds([col], 1) is None  # the wrong mode is not contiguous
    assert lds([buf[base + 1 : base + 1 + 40 * 64].view(40, 64)], 1) is None  # base 2 bytes off
    assert lds([buf[base : base + 40 * 60].view(40, 60)], 1) is None  # ld 60: 120 bytes
    one = buf[base : base + 12].view(1, 12)  # a single row: ld rounded up to 16 bytes
    assert lds([one], 1) == [16]
    assert lds([row, buf[base + 1 : base + 9].view(1, 8)], 1, live=[True, False]) == [64, 0]  # not checked


# --- the warm plan (list_form.PLANS) against the cold call, CUDA pieces replaced -----------------
class _Recorder(NoOpKernel):
    """A no-op kernel that keeps every call's arguments (``seen``)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __call__(self, *args):
        super().__call__(*args)
        self.seen.append(args)


def _table(args):
    from cutegemm.gemm.args import KernelArgs

    return KernelArgs(*args).offs.tolist()


@settings(max_examples=60, deadline=None)
@given(
    shapes=st.lists(st.tuples(st.sampled_from([0, 1, 17, 64, 130]), st.sampled_from([8, 24, 64]),
                              st.sampled_from([0, 8, 40])), min_size=1, max_size=6),
    same_n=st.booleans(), alpha=st.sampled_from([1.0, 0.5]),
)  # fmt: skip
def test_warm_list_call_launches_what_the_cold_call_does(shapes, same_n, alpha):
    """A second call of one signature (new tensors) takes the plan: the same kernel config, views
    and table as a cold call on those tensors, but for the output pointers, which point at its
    own outputs; outputs of the same shapes, K = 0 groups zeroed; a misaligned operand declines."""
    import torch

    from cutegemm.gemm.args import KernelArgs
    from cutegemm.grouped import list_form

    if same_n:
        shapes = [(m, shapes[0][1], k) for m, _, k in shapes]
    rec = _Recorder()
    with cpu_list_path(rec):

        def operands():
            return ([torch.randn(m, k).bfloat16() for m, _, k in shapes],
                    [torch.randn(n, k).bfloat16().t() for _, n, k in shapes])  # fmt: skip

        xs, ws = operands()
        list_form.grouped_list(xs, ws, offs=None, out_dtype=None, alpha=alpha)
        launched = bool(rec.seen)
        assert len(list_form.PLANS) == launched  # a plan exactly where a kernel was launched
        if not launched:
            return
        xs2, ws2 = operands()
        outs = list_form.grouped_list(xs2, ws2, offs=None, out_dtype=None, alpha=alpha)
        warm = rec.seen[-1]
        list_form.PLANS.clear()
        cold_outs = list_form.grouped_list(xs2, ws2, offs=None, out_dtype=None, alpha=alpha)
        cold = rec.seen[-1]
        assert len(rec.seen) == 3
        assert [o.shape for o in outs] == [o.shape for o in cold_outs]
        for g, (m, n, k) in enumerate(shapes):
            if m and n and not k:
                assert (outs[g] == 0).all()
        tw, tc = _table(warm), _table(cold)
        fields = list_form.LIST_FIELDS
        live = [g for g, (m, n, k) in enumerate(shapes) if m and n and k]
        for g, (m, n, _) in enumerate(shapes):
            rw, rc = tw[g * fields : (g + 1) * fields], tc[g * fields : (g + 1) * fields]
            assert rw[:2] == rc[:2] and rw[3:] == rc[3:]  # operand pointers, sizes, lds, tile starts
            assert rw[2] == (outs[g] if m and n else outs[live[0]]).data_ptr()
        end = (len(shapes) + 1) * fields  # the groups' rows and the tile-count row; then descriptor space
        assert len(tw) == len(tc) and tw[len(shapes) * fields : end] == tc[len(shapes) * fields : end]
        kw, kc = KernelArgs(*warm), KernelArgs(*cold)
        for name in ("a", "b", "out"):
            vw, vc = getattr(kw, name), getattr(kc, name)
            assert (vw.shape, vw.stride()) == (vc.shape, vc.stride())
        assert (kw.alpha, kw.max_clusters) == (kc.alpha, kc.max_clusters)
        xs3, ws3 = operands()
        t = live[0]
        xs3[t] = torch.empty(xs3[t].numel() + 1, dtype=torch.bfloat16)[1:].view(xs3[t].shape)  # 2 bytes off
        assert list_form.PLANS[next(iter(list_form.PLANS))].run(xs3, ws3, alpha) is None


@pytest.mark.parametrize("warm", [False, True])
def test_dynamic_list_call_counts_tiles_in_its_table(warm):
    """A list config on the dynamic scheduler gets no separately zeroed counter: its workspace is
    the (1,) int32 low half of the table's LIST_COUNTER word of the last row, zero as copied, cold
    and warm."""
    import torch

    from cutegemm.gemm.args import KernelArgs
    from cutegemm.grouped import list_form
    from cutegemm.grouped.list_form import LIST_COUNTER
    from cutegemm.schedulers.grouped import LIST_FIELDS

    shapes = [(300, 256, 64), (0, 256, 64), (1000, 256, 128)]
    rec = _Recorder()
    with cpu_list_path(rec), pytest.MonkeyPatch.context() as mp:
        dyn = replace(list_form.list_config("sm_90a", 132, 2, 1300, 256, 96, "bf16", "bf16", "k", "n", False),
                      scheduler="dynamic", tile_m=128, tile_n=256)  # fmt: skip
        mp.setattr(list_form, "list_config", lambda *a, **k: dyn)
        for _ in range(2 if warm else 1):
            xs = [torch.randn(m, k).bfloat16() for m, _, k in shapes]
            ws = [torch.randn(k, n).bfloat16() for _, n, k in shapes]
            list_form.grouped_list(xs, ws, offs=None, out_dtype=None, alpha=1.0)
        assert len(rec.seen) == (2 if warm else 1) and len(list_form.PLANS) == 1
        args = KernelArgs(*rec.seen[-1])
        table, ws = args.offs, args.workspace
        word = len(shapes) * LIST_FIELDS + LIST_COUNTER
        assert ws.dtype == torch.int32 and tuple(ws.shape) == (1,)
        assert ws.data_ptr() == table.data_ptr() + 8 * word and int(ws[0]) == 0 and int(table[word]) == 0
        assert int(table[len(shapes) * LIST_FIELDS + list_form.LIST_TILE]) == 3 + 8  # 3 x 1 and 8 x 1 tiles


def test_list_plans_are_bounded():
    """Per-group sizes that change every call must not grow PLANS without bound."""
    import torch

    from cutegemm.grouped import list_form

    with cpu_list_path(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(list_form, "MAX_PLANS", 4)
        for m in range(1, 11):
            list_form.grouped_list([torch.randn(m, 8).bfloat16()], [torch.randn(8, 8).bfloat16()], offs=None,
                                   out_dtype=None, alpha=1.0)  # fmt: skip
            assert len(list_form.PLANS) == min(m, 4)
        assert [key[0][0][0][0] for key in list_form.PLANS] == [7, 8, 9, 10]  # the newest, in order


def test_kgrouped_without_its_kernel_runs_as_one_list_call():
    """The K-grouped form where its kernel does not take the call (sm_100a with a K-major a):
    offs read on the host, then the experts' K slices as one list-form call writing out[e] in
    place (the table's rows point at the slices of a and dY and at out[e]); an empty slice gets
    zeros and no tiles."""
    import torch

    import cutegemm
    from cutegemm.grouped import k_grouped, list_form, packed

    rec = _Recorder()
    with cpu_list_path(rec), pytest.MonkeyPatch.context() as mp:
        for mod in (list_form, k_grouped):
            mp.setattr(mod, "device_info", lambda index: ("sm_100a", 148))
        for mod in (packed, k_grouped):
            mp.setattr(mod, "check_operand", lambda name, t, dims=(2, 3): None)  # CPU tensors stand in
        mp.setattr(k_grouped, "_KG_PLANS", {})
        a, dy = torch.randn(64, 40).bfloat16(), torch.randn(40, 32).bfloat16()  # a K-major: slices at 16-byte steps
        offs = torch.tensor([8, 8, 24, 40], dtype=torch.int32)
        out = cutegemm.grouped_gemm(a, dy, offs=offs)
        assert len(rec.seen) == 1 and out.shape == (4, 64, 32)
        assert (out[1] == 0).all()
        table, fields = _table(rec.seen[0]), list_form.LIST_FIELDS
        starts = [0, 8, 8, 24]
        for g, (s, e) in enumerate(zip(starts, offs.tolist(), strict=True)):
            row = table[g * fields : (g + 1) * fields]
            assert row[2] == out[g].data_ptr()
            assert row[3:6] == [64, 32, e - s]  # M, N, the expert's K
            if e > s:
                assert row[:2] == [a.data_ptr() + 2 * s, dy.data_ptr() + 2 * 32 * s]


def test_kgrouped_sm100_route_writes_its_table_on_the_device():
    """sm_100a with the weight gradient's layouts (a = x.t() M-major, b = dY N-major): one launch
    of the K-grouped config (the list-form kernel on a table its own table kernel writes from
    offs: offs never read on the host) with a fresh int64 table of (E + 1) rows and 3
    descriptors per expert as its workspace, every call; the emulated kernel's result equals the
    twin's, the empty expert's zeros included."""
    import torch

    import cutegemm
    from cutegemm.grouped import k_grouped

    from ..emulated_kernel import emulated_kernels

    x, dy = torch.randn(40, 64).bfloat16(), torch.randn(40, 32).bfloat16()
    offs = torch.tensor([10, 10, 25, 40], dtype=torch.int32)
    tables = []
    make_table = k_grouped._launch_workspace

    def record(workspace, device):
        tables.append(make_table(workspace, device))
        return tables[-1]

    with emulated_kernels() as cache:
        saved = k_grouped.device_info, k_grouped._KG_PLANS, k_grouped._launch_workspace
        k_grouped.device_info, k_grouped._KG_PLANS = (lambda index: ("sm_100a", 148)), {}
        k_grouped._launch_workspace = record
        try:
            outs = [cutegemm.grouped_gemm(x.t(), dy, offs=offs) for _ in range(2)]
        finally:
            k_grouped.device_info, k_grouped._KG_PLANS, k_grouped._launch_workspace = saved
        cfg = cache.kernels[-1].cfg
        assert cfg.kgrouped and cfg.arch == "sm_100a" and (cfg.a_major, cfg.b_major) == ("m", "n")
        assert len(cache.kernels) == 1 and cache.kernels[0].calls == 2
    fields = 16  # schedulers.grouped.LIST_FIELDS
    assert [(t.dtype, t.numel()) for t in tables] == [(torch.int64, 5 * fields + 4 * 3 * fields)] * 2
    assert tables[0] is not tables[1]  # a table per launch
    ref = cutegemm.grouped_gemm_ref(x.t(), dy, offs=offs)
    for out in outs:
        torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
        assert (out[1] == 0).all()
