"""CPU: DeepSeek-style FP8 block scaling (1x128 scales of A, 128x128 scales of B) on sm_90a:
config rules, the policy's choice, argument validation (errors raised before any GPU work),
and gemm_ref against a hand-written float64 loop over K blocks."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cutegemm
from cutegemm.config import Form, GemmConfig, GemmProblem, can_implement
from cutegemm.epilogue import EpilogueSpec
from cutegemm.policy import policy_for

F8 = torch.float8_e4m3fn
BW = dict(arch="sm_90a", a_dtype="e4m3", b_dtype="e4m3", a_major="k", b_major="k", fp8_blockwise=True)


# ---- config rules ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw",
    [
        dict(tile_m=128, tile_n=128, cluster_m=2, raster="n"),
        dict(tile_m=128, tile_n=64),
        dict(tile_m=64, tile_n=128, pingpong=True),
        dict(tile_m=64, tile_n=64, out_dtype="fp32"),
        dict(tile_m=128, tile_n=128, epilogue=EpilogueSpec(bias=True, bias_dtype="bf16", activation="silu")),
        dict(tile_m=128, tile_n=128, cluster_n=2, form=Form.GROUPED),
        dict(tile_m=64, tile_n=128, form=Form.GROUPED, scheduler="dynamic"),
        dict(tile_m=128, tile_n=192, cluster_m=2, wg_order=True),
        dict(tile_m=128, tile_n=192, cluster_n=2, form=Form.GROUPED),
    ],
)
def test_blockwise_configs_accepted(kw):
    ok, why = can_implement(GemmConfig(**BW, **kw))
    assert ok, why


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(tile_n=256), "tile_n must be 64, 128"),
        (dict(tile_m=64, tile_n=256, pingpong=True), "tile_n must be 64, 128"),
        (dict(tile_n=128, fast_accum=True), "fast_accum must be False"),
        (dict(tile_n=128, b_major="n"), "K-major"),
        (dict(tile_n=128, a_major="m"), "K-major"),
        (dict(tile_n=128, a_dtype="bf16", b_dtype="bf16"), "e4m3"),
        (dict(tile_n=128, arch="sm_100a", tile_m=128), "sm_90a"),
        (dict(tile_n=128, epilogue=EpilogueSpec(scale_a=True, scale_b=True)), "per-row/per-column"),
        (dict(tile_n=128, sf_dtype="e8m0", sf_vec=32), "block-scaled"),
    ],
)
def test_blockwise_config_rejected(kw, match):
    cfg = GemmConfig(**{**BW, **kw})
    ok, why = can_implement(cfg)
    assert not ok
    assert match in why, why


def test_blockwise_is_in_the_name():
    plain = GemmConfig(**{**BW, "fp8_blockwise": False}, tile_n=128)
    bw = GemmConfig(**BW, tile_n=128)
    assert plain.name != bw.name and "bw128" in bw.name and hash(plain) != hash(bw)


@pytest.mark.parametrize("m", [1, 128, 129, 8192])
def test_policy_picks_a_valid_blockwise_tile(m):
    p = GemmProblem(m, 7168, 2048, 1, "e4m3", "e4m3", "bf16", "k", "k")
    cfg = policy_for("sm_90a", 132).choose(p, fp8_blockwise=True)
    assert cfg.fp8_blockwise and cfg.tile_n in (64, 128, 192)
    ok, why = can_implement(cfg, p)
    assert ok, why


@pytest.mark.parametrize("mnk,tile_n", [((8192, 8192, 8192), 192), ((16384, 7168, 2048), 192), ((2048, 7168, 2048), 192),
                                        ((512, 7168, 2048), 128), ((1024, 7168, 2048), 128)])  # fmt: skip
def test_policy_blockwise_tile_width(mnk, tile_n):
    """128x192 (two B scale blocks per tile) from 4 waves of such tiles on, else 128x128."""
    p = GemmProblem(*mnk, 1, "e4m3", "e4m3", "bf16", "k", "k")
    cfg = policy_for("sm_90a", 132).choose(p, fp8_blockwise=True)
    assert (cfg.tile_m, cfg.tile_n, cfg.wg_order) == (128, tile_n, True)


@pytest.mark.parametrize("m,n,tile", [(1, 7168, (64, 64, False)), (64, 7168, (64, 64, False)),
                                      (16, 28672, (64, 128, False)), (65, 7168, (128, 64, False)),
                                      (128, 7168, (128, 64, False))])  # fmt: skip
def test_policy_blockwise_small_m(m, n, tile):
    """Decode-sized M (<= 64): one warpgroup on 64x64 tiles, 64x128 from as many 128-column tiles
    as SMs; up to 128 rows the 128x64 tile."""
    p = GemmProblem(m, n, 2048, 1, "e4m3", "e4m3", "bf16", "k", "k")
    cfg = policy_for("sm_90a", 132).choose(p, fp8_blockwise=True)
    assert (cfg.tile_m, cfg.tile_n, cfg.pingpong) == tile
    assert can_implement(cfg, p)[0]


def test_compile_check_lists_blockwise_variants():
    from cutegemm.compile_check import _mma_markers, all_variants

    bw = [c for c in all_variants(["sm_90a"]) if c.fp8_blockwise]
    assert len(bw) >= 2
    for c in bw:
        assert can_implement(c)[0], c.name
        assert "QGMMA" in _mma_markers(c)


def test_fake_args_carry_the_scale_tensors():
    from cutegemm.gemm.args import dense_fake_args

    args = dense_fake_args(GemmConfig(**BW, tile_n=128))
    # (a, b, c, c_in, bias, alpha, beta, max_clusters, stream, offs, sfa, sfb, ...)
    assert args[10] is not None and args[11] is not None
    plain = dense_fake_args(GemmConfig(**{**BW, "fp8_blockwise": False}, tile_n=128))
    assert plain[10] is None and plain[11] is None


# ---- argument validation (CPU tensors: every check below runs before the CUDA check) -------------
def _fp8(m, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) * 2).to(F8)
    w = (torch.randn(n, k, generator=g) * 2).to(F8)
    return a, w.t()


def _block_scales(m, n, k, seed=0, lo=0.5, hi=2.0):
    g = torch.Generator().manual_seed(seed + 1)
    kb, nb = math.ceil(k / 128), math.ceil(n / 128)
    sa = torch.rand(m, kb, generator=g) * (hi - lo) + lo
    sb = torch.rand(kb, nb, generator=g) * (hi - lo) + lo
    return sa, sb


def test_scale_b_in_weight_orientation_gets_a_hint():
    a, b = _fp8(64, 384, 256)
    sa, sb = _block_scales(64, 384, 256)
    with pytest.raises(ValueError, match=r"scale_b must have shape .*\(2, 3\).*pass scale_b.t\(\)"):
        cutegemm.gemm(a, b, scale_a=sa, scale_b=sb.t().contiguous())


def test_bad_scale_a_shape():
    a, b = _fp8(64, 384, 256)
    _, sb = _block_scales(64, 384, 256)
    with pytest.raises(ValueError, match=r"scale_a must have shape \(M, ceil\(K/128\)\) = \(64, 2\)"):
        cutegemm.gemm(a, b, scale_a=torch.ones(64, 3), scale_b=sb)


def test_bad_scale_dtype_and_missing_scale_b():
    a, b = _fp8(64, 384, 256)
    sa, sb = _block_scales(64, 384, 256)
    with pytest.raises(TypeError, match="scale_a must be torch.float32"):
        cutegemm.gemm(a, b, scale_a=sa.to(torch.bfloat16), scale_b=sb)
    with pytest.raises(TypeError, match="scale_b must be torch.float32"):
        cutegemm.gemm(a, b, scale_a=sa, scale_b=sb.double())
    with pytest.raises(TypeError, match="scale_b must be a torch.Tensor"):
        cutegemm.gemm(a, b, scale_a=sa, scale_b=None)


def test_blockwise_needs_2d_operands():
    a, b = _fp8(64, 384, 256)
    sa, sb = _block_scales(64, 384, 256)
    with pytest.raises(ValueError, match="needs 2-D a and b"):
        cutegemm.gemm(a.unsqueeze(0), b, scale_a=sa, scale_b=sb)


def test_valid_blockwise_call_reaches_the_device_check():
    a, b = _fp8(64, 384, 256)
    sa, sb = _block_scales(64, 384, 256)
    with pytest.raises(ValueError, match="a must be a CUDA tensor"):
        cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)


def test_blockwise_detection():
    from cutegemm.gemm.fp8_scales import is_fp8_blockwise as _is_fp8_blockwise

    a, b = _fp8(64, 384, 256)
    sa, sb = _block_scales(64, 384, 256)
    assert _is_fp8_blockwise(a, b, sa, sb)
    assert not _is_fp8_blockwise(a, b, sa[:, :1], torch.ones(1, 384))  # row-wise
    assert not _is_fp8_blockwise(a, b, torch.ones(()), torch.ones(()))  # per tensor
    a1, b1 = _fp8(64, 100, 112)  # one K block, one N block: per-row x per-tensor, same product
    assert not _is_fp8_blockwise(a1, b1, torch.ones(64, 1), torch.ones(1, 1))


# ---- gemm_ref against a float64 loop over K blocks -----------------------------------------------
def _loop_reference(a, b, sa, sb):
    """out[m, n] = sum_kb (sum_{k in kb} a[m, k] b[k, n]) * sa[m, kb] * sb[kb, n // 128], float64."""
    m, k = a.shape
    n = b.shape[1]
    a64, b64, sa64, sb64 = a.double(), b.double(), sa.double(), sb.double()
    out = torch.zeros(m, n, dtype=torch.float64)
    for kb in range(math.ceil(k / 128)):
        part = a64[:, kb * 128 : (kb + 1) * 128] @ b64[kb * 128 : (kb + 1) * 128, :]
        col_scale = torch.stack([sb64[kb, j // 128] for j in range(n)])
        out += part * sa64[:, kb : kb + 1] * col_scale
    return out


@pytest.mark.parametrize("m,n,k", [(5, 130, 272), (33, 256, 128), (7, 384, 400), (2, 64, 16)])
def test_gemm_ref_matches_float64_loop(m, n, k):
    a, b = _fp8(m, n, k, seed=m + n + k)
    sa, sb = _block_scales(m, n, k, seed=k)
    exact = _loop_reference(a, b, sa, sb)
    ref64 = cutegemm.gemm_ref(
        a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float64, compute_dtype=torch.float64
    )
    torch.testing.assert_close(ref64, exact, atol=1e-9, rtol=1e-9)
    ref32 = cutegemm.gemm_ref(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float32)
    torch.testing.assert_close(ref32.double(), exact, atol=1e-3 * exact.abs().max().item(), rtol=1e-4)
    bf = cutegemm.gemm_ref(a, b, scale_a=sa, scale_b=sb)
    assert bf.dtype == torch.bfloat16 and bf.shape == (m, n)


@settings(max_examples=20, deadline=None)
@given(
    m=st.integers(1, 40),
    n=st.integers(1, 300),
    k16=st.integers(1, 30),
    exp_a=st.integers(-3, 3),
    exp_b=st.integers(-3, 3),
)
def test_gemm_ref_hypothesis(m, n, k16, exp_a, exp_b):
    k = 16 * k16
    a, b = _fp8(m, n, k, seed=m * 7 + n)
    sa, sb = _block_scales(m, n, k, seed=k, lo=0.5 * 10.0**exp_a, hi=2.0 * 10.0**exp_a)
    sb = sb * 10.0**exp_b
    exact = _loop_reference(a, b, sa, sb)
    # (one K block and one N block: the row-wise path computes it, the same product)
    ref = cutegemm.gemm_ref(
        a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float64, compute_dtype=torch.float64
    )
    torch.testing.assert_close(ref, exact, atol=1e-9 * max(exact.abs().max().item(), 1.0), rtol=1e-9)


def test_gemm_ref_zero_blocks():
    """A zero scale block of B zeroes exactly its 128x128 block's contribution."""
    m, n, k = 8, 256, 256
    a, b = _fp8(m, n, k, seed=3)
    sa, sb = _block_scales(m, n, k, seed=3)
    sb[1, 0] = 0.0  # K block 1, N block 0
    out = cutegemm.gemm_ref(
        a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float64, compute_dtype=torch.float64
    )
    only_kb0 = (a.double()[:, :128] @ b.double()[:128, :128]) * sa.double()[:, :1] * sb[0, 0].double()
    torch.testing.assert_close(out[:, :128], only_kb0, atol=1e-9, rtol=1e-9)


# ---- grouped (packed MoE form): scale_a (total_M, KB), scale_b (E, KB, NB) ------------------------
def _grouped(counts, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    E, total = len(counts), sum(counts)
    a = (torch.randn(total, k, generator=g) * 2).to(F8)
    w = (torch.randn(E, n, k, generator=g) * 2).to(F8)
    kb, nb = math.ceil(k / 128), math.ceil(n / 128)
    sa = torch.rand(total, kb, generator=g) + 0.5
    sb = torch.rand(E, nb, kb, generator=g) + 0.5  # the (E, N, K) weight's scales
    offs = torch.tensor(counts, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return a, w.transpose(1, 2), offs, sa, sb.transpose(1, 2)


def test_grouped_block_scales_validation():
    from cutegemm.gemm.fp8_scales import fp8_grouped_block_scales as f

    a, b, _, sa, sb = _grouped([5, 0, 7], 300, 400)  # KB = 4, NB = 3
    got_a, got_b = f(a, b, sa, sb)  # row-major scale_a: an M-major copy (tma_scale_a)
    assert torch.equal(got_a, sa) and got_a.stride(0) == 1
    assert got_b.shape == (3, 4, 3) and torch.equal(got_b, sb.permute(2, 1, 0))
    m_major = sa.t().contiguous().t()
    assert f(a, b, m_major, sb)[0] is m_major  # 12 rows: TMA-ready in place
    assert f(a, b, torch.ones(12), torch.ones(3, 300)) is None  # row-wise
    assert f(a, b, None, None) is None
    with pytest.raises(ValueError, match=r"pass scale_b.transpose\(1, 2\)"):
        f(a, b, sa, sb.transpose(1, 2))
    with pytest.raises(ValueError, match=r"scale_a must have shape \(total_M, ceil\(K/128\)\) = \(12, 4\)"):
        f(a, b, sa[:, :2], sb)
    with pytest.raises(ValueError, match="needs scale_b of shape"):
        f(a, b, sa, torch.ones(3, 300))
    with pytest.raises(TypeError, match="scale_b must be torch.float32"):
        f(a, b, sa, sb.double())


@pytest.mark.parametrize("counts", [[5, 0, 7], [0, 0], [40], [1, 2, 3, 0, 9]])
def test_grouped_ref_matches_per_expert_loop(counts):
    """grouped_gemm_ref with block scales = the float64 K-block loop on each expert's rows."""
    from cutegemm import grouped_gemm_ref

    n, k = 300, 400
    a, b, offs, sa, sb = _grouped(counts, n, k, seed=len(counts))
    ref = grouped_gemm_ref(a, b, offs=offs, scale_a=sa, scale_b=sb, out_dtype=torch.float64,
                           compute_dtype=torch.float64)  # fmt: skip
    bounds = [0, *offs.tolist()]
    for e in range(len(counts)):
        s, t = bounds[e], bounds[e + 1]
        torch.testing.assert_close(ref[s:t], _loop_reference(a[s:t], b[e], sa[s:t], sb[e]), atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("rows", [8, 64, 512, 4096])
def test_grouped_policy_picks_a_blockwise_tile(rows):
    p = GemmProblem(32 * rows, 4096, 7168, 1, "e4m3", "e4m3", "bf16", "k", "k")
    cfg = policy_for("sm_90a", 132).choose_grouped(p, 32, fp8_blockwise=True)
    assert cfg.grouped and cfg.fp8_blockwise and cfg.tile_n == (128 if rows <= 64 else 192)
    ok, why = can_implement(cfg, p)
    assert ok, why


def test_grouped_blockwise_variants_and_fake_args():
    from cutegemm.compile_check import _mma_markers, all_variants
    from cutegemm.gemm.args import grouped_fake_args

    gbw = [c for c in all_variants(["sm_90a"]) if c.fp8_blockwise and c.grouped]
    assert len(gbw) >= 2
    for c in gbw:
        assert can_implement(c)[0], c.name
        assert "QGMMA" in _mma_markers(c)
        args = grouped_fake_args(c)
        assert len(args[10].shape) == 2 and len(args[11].shape) == 3  # mSFA (M, KB), mSFB (NB, KB, E)


# ---- wg_order (FP8 with promotion: the consumer warpgroups take turns per K tile) -----------------
@pytest.mark.parametrize(
    "kw,ok",
    [
        (dict(tile_m=128, tile_n=128, cluster_m=2), True),
        (dict(tile_m=128, tile_n=128, form=Form.GROUPED, cluster_n=2), True),
        (dict(tile_m=128, tile_n=192, fp8_blockwise=False), True),  # row-wise promoted
        (dict(tile_m=64, tile_n=128), False),  # one warpgroup: nobody to take turns with
        (dict(tile_m=64, tile_n=128, pingpong=True), False),
        (dict(tile_m=128, tile_n=128, fp8_blockwise=False, fast_accum=True), False),
        (dict(tile_m=128, tile_n=128, fp8_blockwise=False, a_dtype="bf16", b_dtype="bf16"), False),
    ],
)
def test_wg_order_rules(kw, ok):
    cfg = GemmConfig(**{**BW, **kw, "wg_order": True})
    good, why = can_implement(cfg)
    assert good == ok, why
    if ok:
        assert "_wgo" in cfg.name and GemmConfig(**{**BW, **kw}).name != cfg.name
    else:
        assert "wg_order" in why


def test_policy_turns_wg_order_on_for_block_scaling_only():
    p = GemmProblem(8192, 8192, 8192, 1, "e4m3", "e4m3", "bf16", "k", "k")
    pol = policy_for("sm_90a", 132)
    assert pol.choose(p, fp8_blockwise=True).wg_order
    assert not pol.choose(p).wg_order  # row-wise promoted: measured slower with it
    g = GemmProblem(32 * 512, 4096, 7168, 1, "e4m3", "e4m3", "bf16", "k", "k")
    assert pol.choose_grouped(g, 32, fp8_blockwise=True).wg_order
    assert not pol.choose_grouped(GemmProblem(32 * 16, 4096, 7168, 1, "e4m3", "e4m3", "bf16", "k", "k"), 32,
                                  fp8_blockwise=True).wg_order  # 64-row tiles: one warpgroup


def test_scale_a_is_tma_ready_m_major():
    """The kernels TMA-load scale_a M-major with a 16-byte K-block stride: torch's M-major layout
    with rows % 4 == 0 and an M-major view inside a wider buffer are used in place; row-major,
    rows % 4 != 0 and misaligned views become an M-major copy with rows rounded up to 4 as the
    K-block stride. The values are always those given."""
    from cutegemm.gemm.fp8_scales import tma_scale_a

    def ready(t):
        return t.stride(0) == 1 and t.stride(1) % 4 == 0 and t.data_ptr() % 16 == 0

    m_major = torch.rand(7, 256).t()  # (256, 7) stride (1, 256)
    assert tma_scale_a(m_major) is m_major
    wide = torch.rand(7, 260).t()[:250]  # M-major inside a wider buffer: stride (1, 260)
    assert tma_scale_a(wide) is wide
    for t in (torch.rand(256, 7), torch.rand(7, 250).t(), torch.rand(1, 7), torch.rand(7 * 256 + 1)[1:].view(7, 256).t()):
        got = tma_scale_a(t)
        assert got is not t and ready(got) and torch.equal(got, t), t.stride()
        assert got.stride(1) == -(-t.shape[0] // 4) * 4


def test_scale_b_view_copied_to_k_contiguous_only_where_it_pays():
    """The kernel's (NB, KB[, E]) view of scale_b gets unit stride along K (one cache line per 32
    K tiles for each tile's B-scale loads) when it is K-strided and A has >= 256 rows: dense
    (torch's (KB, NB) row-major scale_b) and grouped ((E, KB, NB) row-major); torch._scaled_mm's
    own column-major layout, single-K-block scales and small calls are read in place. The values
    are those of the view."""
    from cutegemm.gemm.fp8_scales import SCALE_COPY_MIN_ROWS, k_contiguous_scale_b

    rows = SCALE_COPY_MIN_ROWS
    dense = torch.rand(7, 5).t()  # (NB, KB) view of a row-major (KB, NB) scale_b: K-strided
    got = k_contiguous_scale_b(dense, rows)
    assert got.stride(1) == 1 and torch.equal(got, dense)
    grouped = torch.rand(3, 7, 5).permute(2, 1, 0)  # (NB, KB, E) view of a row-major (E, KB, NB)
    got = k_contiguous_scale_b(grouped, rows)
    assert got.stride(1) == 1 and got.shape == grouped.shape and torch.equal(got, grouped)
    for t, r in ((dense, rows - 1), (torch.rand(5, 7).t().contiguous().t().t().contiguous(), rows),
                 (torch.rand(1, 5).t(), rows), (torch.rand(3, 5, 7).permute(1, 2, 0), rows)):  # fmt: skip
        assert k_contiguous_scale_b(t, r) is t


def test_torch_padded_scale_b_layout_is_accepted():
    """torch's block-scaling tests pad scale_b's K blocks to a multiple of 4 rows (K = 1280: 10
    blocks stored as 12): accepted, the padding never read (pytorch/pytorch
    test/test_scaled_matmul_cuda.py builds its 128x128 scales this way)."""
    from cutegemm.gemm.fp8_scales import fp8_block_scales

    torch.manual_seed(0)
    m, k, n = 64, 1280, 128
    a = (torch.randn(m, k) / 4).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k) / 4).to(torch.float8_e4m3fn).t()
    sa = torch.rand(m, 10) + 0.5
    sb = torch.rand(10, 1) + 0.5
    padded = torch.cat([sb, torch.full((2, 1), float("nan"))])  # (12, 1): the padding is NaN
    got_a, got_b = fp8_block_scales(a, b, sa, padded, kernel_layout=False)
    assert got_b.shape == (1, 10) and torch.equal(got_b, sb.t())
    ref = cutegemm.gemm_ref(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float32)
    ref_padded = cutegemm.gemm_ref(a, b, scale_a=sa, scale_b=padded, out_dtype=torch.float32)
    assert torch.equal(ref, ref_padded) and not torch.isnan(ref_padded).any()
    with pytest.raises(ValueError, match="multiple of 4 rows"):
        fp8_block_scales(a, b, sa, torch.rand(11, 1), kernel_layout=False)


def test_torch_padded_scale_b_layout_is_accepted_grouped():
    """The grouped form's 3-D scale_b (E, K blocks, N blocks) with its K blocks padded to a
    multiple of 4 rows, as torch builds 128x128 scales: accepted, the padding never read."""
    from cutegemm.gemm.fp8_scales import fp8_grouped_block_scales

    torch.manual_seed(0)
    e, m, k, n = 2, 64, 1280, 128
    a = (torch.randn(m, k) / 4).to(torch.float8_e4m3fn)
    b = (torch.randn(e, n, k) / 4).to(torch.float8_e4m3fn).transpose(1, 2)
    offs = torch.tensor([20, 64], dtype=torch.int32)
    sa = (torch.rand(m, 10) + 0.5).t().contiguous().t()
    sb = torch.rand(e, 10, 1) + 0.5
    padded = torch.cat([sb, torch.full((e, 2, 1), float("nan"))], dim=1)  # (E, 12, 1): NaN padding
    _, view = fp8_grouped_block_scales(a, b, sa, padded)
    assert view.shape == (1, 10, e) and torch.equal(view, sb.permute(2, 1, 0))
    ref = cutegemm.grouped_gemm_ref(a, b, offs=offs, scale_a=sa, scale_b=sb, out_dtype=torch.float32)
    ref_padded = cutegemm.grouped_gemm_ref(a, b, offs=offs, scale_a=sa, scale_b=padded, out_dtype=torch.float32)
    assert torch.equal(ref, ref_padded) and not torch.isnan(ref_padded).any()
    with pytest.raises(ValueError, match="multiple of 4 rows"):
        fp8_grouped_block_scales(a, b, sa, torch.rand(e, 11, 1))
