"""Fused epilogue ops on a GPU (sm_90a runs on the H200; the same tests run on sm_100 when present).

Each op against a float64 reference: our error must stay within 2x torch's own same-precision
error (torch.matmul in the input dtype, the op in fp32, then the cast), outputs are written into
NaN-poisoned buffers whose padding must stay untouched, shapes are ragged (M, N not multiples of
the tile). Few distinct kernels (each EpilogueSpec x tile is one compile): most tests force one
tile through ``config``.
"""

from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cutegemm
from cutegemm.config import GemmConfig
from cutegemm.epilogue import GATED, epilogue_ref, interleave_gate_up

from ..gemm_check import assert_outside_untouched, assert_within_torch_error, poisoned_out

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16


def _arch():
    return "sm_90a" if torch.cuda.get_device_capability()[0] == 9 else "sm_100a"


T128 = dict(tile_m=128, tile_n=128)
DTYPE_NAMES = {BF16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def tile(a, b, out_dtype=BF16, **kw) -> GemmConfig:
    """A forced tile for these operands; the epilogue comes from the call's arguments (see
    gemm's ``config``)."""
    cfg = GemmConfig(
        arch=_arch(),
        a_dtype=DTYPE_NAMES[a.dtype],
        b_dtype=DTYPE_NAMES[b.dtype],
        out_dtype=DTYPE_NAMES[out_dtype],
        a_major="k" if a.stride(-1) == 1 else "m",
        b_major="n" if b.stride(-1) == 1 else "k",
    )
    return replace(cfg, **kw)


def operand(rows, cols, dtype=BF16, row_major=True, batch=None, scale=1.0):
    shape = (rows, cols) if batch is None else (batch, rows, cols)
    if row_major:
        return torch.randn(shape, device="cuda").mul_(scale).to(dtype)
    return torch.randn((*shape[:-2], cols, rows), device="cuda").mul_(scale).to(dtype).mT


def check(a, b, out_dtype=BF16, *, alpha=1.0, beta=0.0, c=None, bias=None, activation=None,
          gate_layout="interleaved", tile_kw=None):  # fmt: skip
    """gemm into a poisoned out vs the float64 reference and torch's own error; ``tile_kw``
    forces a tile (None: the policy's choice)."""
    config = None if tile_kw is None else tile(a, b, out_dtype, **tile_kw)
    gated = activation in GATED
    n_out = b.shape[-1] // 2 if gated else b.shape[-1]
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m = a.shape[-2]
    buf, out = poisoned_out((*batch, m, n_out), out_dtype)
    ops = dict(alpha=alpha, beta=beta, c=c, bias=bias, activation=activation, gate_layout=gate_layout)
    res = cutegemm.gemm(a, b, out=out, config=config, **ops)
    assert res.data_ptr() == out.data_ptr()
    torch.cuda.synchronize()
    ref = cutegemm.gemm_ref(
        a.double(), b.double(), out_dtype=torch.float64, compute_dtype=torch.float64,
        **{**ops, "c": None if c is None else c.double(), "bias": None if bias is None else bias.double()},
    )  # fmt: skip
    same = epilogue_ref(torch.matmul(a, b).float(), **ops).to(out_dtype)
    what = f"{tuple(a.shape)}@{tuple(b.shape)}->{out_dtype} {activation} alpha={alpha} beta={beta} bias={bias is not None}"
    assert_within_torch_error(out, same, ref, what=what)
    assert_outside_untouched(buf, m, n_out)
    return out


# --- one op at a time, ragged M and N ---------------------------------------------------------
@pytest.mark.parametrize(
    "activation,bias_dtype,out_dtype",
    [
        ("relu", BF16, BF16),
        ("gelu", None, BF16),
        ("gelu_tanh", None, BF16),
        ("silu", None, torch.float32),
        (None, torch.float32, torch.float32),
        ("relu_sq", BF16, BF16),
        ("tanh", None, torch.float32),
        ("sigmoid", torch.float32, BF16),
    ],
)
def test_activation_and_bias(activation, bias_dtype, out_dtype):
    a = operand(333, 264)
    b = operand(264, 520, row_major=False)
    bias = None if bias_dtype is None else torch.randn(520, device="cuda").to(bias_dtype)
    check(a, b, out_dtype, bias=bias, activation=activation, tile_kw=T128)


@pytest.mark.parametrize("tile_kw", [dict(tile_m=192, tile_n=192), dict(tile_m=192, tile_n=128, cluster_n=2),
                                     dict(tile_m=192, tile_n=160),
                                     dict(tile_m=64, tile_n=96, cluster_n=2, raster="n", group=1),
                                     dict(tile_m=128, tile_n=224, cluster_m=2, raster="n"),
                                     dict(tile_m=128, tile_n=224, cluster_n=2, raster="m"),
                                     dict(tile_m=128, tile_n=192, cluster_n=2, raster="m"),
                                     dict(tile_m=64, tile_n=80, cluster_m=2, raster="n", group=1),
                                     dict(tile_m=64, tile_n=80, cluster_n=2, raster="m", group=1),
                                     dict(tile_m=128, tile_n=80)])  # fmt: skip
def test_wave_model_tiles_with_epilogues(tile_kw):
    """The sm_90a wave model's 192-row, 64x96, 128x224, 80-column and odd M-tile 1x2 tiles under
    alpha, beta * C, bias and silu, ragged (1000 columns: an odd count of 224-column tiles pads a
    1x2 cluster; 12.5 tiles of 80, 6.25 of 160; 421 rows: 2.2 tiles of 192)."""
    if _arch() != "sm_90a":
        pytest.skip("192-row and 96-column tiles are sm_90a")
    a = operand(421, 328)
    b = operand(328, 1000, row_major=False)
    c = operand(421, 1000)
    bias = torch.randn(1000, device="cuda").to(BF16)
    check(a, b, alpha=0.5, beta=0.75, c=c, bias=bias, activation="silu", tile_kw=tile_kw)


@pytest.mark.parametrize("tile_n", [64, 80, 96, 128, 160, 192])
def test_64_row_pairs_with_epilogues(tile_n):
    """The 2x1 pairs of 64-row tiles the sm_90a policy takes at 112 < M <= 128 (policy.small_m_pair),
    every tile_n of PAIR_TILE_N, under alpha, beta * C, bias and silu, and (not 80: its 16-column
    subtiles take no gated output) SwiGLU with a bias; ragged N (1000: a part tile)."""
    if _arch() != "sm_90a":
        pytest.skip("the 64-row pairs are the sm_90a policy's")
    kw = dict(tile_m=64, tile_n=tile_n, cluster_m=2, raster="n", group=1)
    a = operand(120, 328)
    b = operand(328, 1000, row_major=False)
    c = operand(120, 1000)
    bias = torch.randn(1000, device="cuda").to(BF16)
    check(a, b, alpha=0.5, beta=0.75, c=c, bias=bias, activation="silu", tile_kw=kw)
    if tile_n != 80:
        check(a, b, bias=bias, activation="swiglu", tile_kw=kw)


def test_alpha_bias_fp32_out_default_policy():
    """The policy's tile for a large problem (sm_90a: 128x256, 2x1 cluster: the fullest register file)."""
    a = operand(2048, 512)
    b = operand(512, 4096 + 8, row_major=False)
    check(a, b, torch.float32, alpha=0.5, bias=torch.randn(4104, device="cuda"), activation="gelu")


@pytest.mark.parametrize("c_dtype", [BF16, torch.float32])
def test_beta_c(c_dtype):
    a = operand(333, 264)
    b = operand(264, 520, row_major=False)
    c = torch.randn(333, 520, device="cuda").to(c_dtype)
    check(a, b, alpha=0.75, beta=-1.25, c=c, tile_kw=T128)


def test_beta_c_strided_views_and_batch():
    """c as a view with an aligned row stride (read in place), a column-major c (copied first),
    and batched a with a shared 2-D b (batch folded into M, c folded with it)."""
    a = operand(333, 264)
    b = operand(264, 520, row_major=False)
    wide = torch.randn(333, 600, device="cuda", dtype=BF16)
    check(a, b, beta=0.5, c=wide[:, 40:560], tile_kw=T128)
    check(a, b, beta=0.5, c=torch.randn(520, 333, device="cuda", dtype=BF16).t(), tile_kw=T128)
    a3 = operand(130, 64, batch=3)
    b2 = operand(64, 136, row_major=False)
    c3 = torch.randn(3, 130, 136, device="cuda", dtype=BF16)
    check(a3, b2, beta=2.0, c=c3, tile_kw=T128)
    check(a3, b2, beta=2.0, c=c3.transpose(0, 1).contiguous().transpose(0, 1), tile_kw=T128)


def test_beta_c_in_place():
    """c is out itself: every element is read before its subtile is stored."""
    a = operand(333, 264)
    b = operand(264, 520, row_major=False)
    c = torch.randn(333, 520, device="cuda", dtype=BF16)
    out = c.clone()
    cutegemm.gemm(a, b, out=out, beta=1.0, c=out, config=tile(a, b, tile_m=128, tile_n=128))
    ref = cutegemm.gemm_ref(a.double(), b.double(), beta=1.0, c=c.double(), compute_dtype=torch.float64)
    same = (torch.matmul(a, b).float() + c.float()).to(BF16)
    assert_within_torch_error(out, same, ref, what="in-place residual")


def test_beta_zero_never_reads_c():
    a = operand(200, 64)
    b = operand(64, 136)
    nan_c = torch.full((200, 136), float("nan"), device="cuda", dtype=BF16)
    out = cutegemm.gemm(a, b, beta=0.0, c=nan_c, config=tile(a, b, tile_m=128, tile_n=128))
    assert not torch.isnan(out).any()


# --- gated ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "activation,gate_layout,bias_dtype,out_dtype,tile_kw",
    [
        ("swiglu", "interleaved", None, BF16, dict(tile_m=128, tile_n=128)),
        ("swiglu", "halves", BF16, BF16, dict(tile_m=128, tile_n=128)),
        ("geglu", "interleaved", torch.float32, torch.float32, dict(tile_m=128, tile_n=128)),
        ("swiglu", "interleaved", BF16, BF16, dict(tile_m=128, tile_n=128, pingpong=True)),
        ("swiglu", "interleaved", None, BF16, dict(tile_m=128, tile_n=192, pingpong=True, cluster_m=2)),
        ("swiglu", "interleaved", BF16, BF16, dict(tile_m=64, tile_n=128)),
        ("swiglu", "interleaved", BF16, BF16, dict(tile_m=192, tile_n=192)),
        ("geglu", "halves", None, torch.float32, dict(tile_m=64, tile_n=96, cluster_n=2, raster="n", group=1)),
        ("swiglu", "interleaved", BF16, BF16, dict(tile_m=128, tile_n=224, cluster_m=2, raster="n")),
        ("geglu", "halves", None, BF16, dict(tile_m=128, tile_n=224, cluster_n=2, raster="m")),
        ("geglu_tanh", "interleaved", BF16, BF16, dict(tile_m=128, tile_n=128)),
        ("reglu", "halves", None, torch.float32, dict(tile_m=128, tile_n=128)),
        ("glu", "interleaved", torch.float32, BF16, dict(tile_m=128, tile_n=128, pingpong=True)),
        # pre-activations of about 16 standard deviation: swiglu_oai's clamps at +-7 taken often
        ("swiglu_oai", "interleaved", BF16, BF16, dict(tile_m=128, tile_n=128)),
        ("swiglu_oai", "halves", torch.float32, torch.float32, dict(tile_m=64, tile_n=128)),
    ],
)
def test_gated(activation, gate_layout, bias_dtype, out_dtype, tile_kw):
    if _arch() == "sm_100a" and (tile_kw.get("pingpong") or tile_kw["tile_m"] == 192 or tile_kw["tile_n"] in (96, 224)):
        pytest.skip("pingpong, 192-row and 96- / 224-column tiles are sm_90a")
    a = operand(333, 264)
    b = operand(264, 2 * 264, row_major=False)  # 528 GEMM columns -> 264 outputs (ragged in 128)
    bias = None if bias_dtype is None else torch.randn(528, device="cuda").to(bias_dtype)
    check(a, b, out_dtype, bias=bias, activation=activation, gate_layout=gate_layout, tile_kw=tile_kw)


def test_gated_default_policy_and_weight_layout():
    """nn.Linear-style weight (2N', K) = [gate | up], passed as w.t() (K-major), halves; and the
    same weight interleaved once up front; the policy's large tile."""
    a = operand(2048, 512)
    w = torch.randn(2 * 2056, 512, device="cuda", dtype=BF16)
    bias = torch.randn(2 * 2056, device="cuda", dtype=BF16)
    out_h = check(a, w.t(), bias=bias, activation="swiglu", gate_layout="halves")
    w_il = interleave_gate_up(w, dim=0)
    out_i = check(a, w_il.t(), bias=interleave_gate_up(bias), activation="swiglu")
    assert torch.equal(out_h, out_i)


# --- edge cases ---------------------------------------------------------------------------------
def test_k_zero_applies_epilogue_to_zero():
    a = torch.randn(5, 0, device="cuda", dtype=BF16)
    b = torch.randn(0, 16, device="cuda", dtype=BF16)
    bias = torch.randn(16, device="cuda")
    out = cutegemm.gemm(a, b, bias=bias, activation="relu")
    torch.testing.assert_close(out, torch.relu(bias).to(BF16).expand(5, 16))
    out = cutegemm.gemm(a, b, bias=bias, activation="swiglu")
    assert out.shape == (5, 8)


def test_nan_propagates_through_activation():
    a = operand(256, 128)
    b = operand(128, 256)
    a[7, 3] = float("nan")
    for act in ("relu", "gelu", "silu"):
        out = cutegemm.gemm(a, b, activation=act, config=tile(a, b, tile_m=128, tile_n=128))
        assert torch.isnan(out[7]).all() and not torch.isnan(out[:7]).any() and not torch.isnan(out[8:]).any(), act


def test_fast_path_changes_with_optional_tensors():
    """The plan cache keys on which optional tensors are present: the same shapes with and
    without bias / c / activation give different results, each right."""
    a = operand(256, 128)
    b = operand(128, 256)
    bias = torch.randn(256, device="cuda")
    cfg = tile(a, b, tile_m=128, tile_n=128)
    for _ in range(2):  # second round: every call on the fast path
        plain = cutegemm.gemm(a, b, config=cfg)
        biased = cutegemm.gemm(a, b, bias=bias, config=cfg)
        relu = cutegemm.gemm(a, b, bias=bias, activation="relu", config=cfg)
        torch.testing.assert_close(biased.float(), plain.float() + bias, atol=0.1, rtol=0.02)
        torch.testing.assert_close(relu.float(), torch.relu(biased.float()), atol=0.1, rtol=0.02)


def test_bad_epilogue_inputs_on_gpu():
    a = operand(64, 64)
    b = operand(64, 64)
    cutegemm.gemm(a, b)  # a cached plan for these shapes must not let the calls below through
    with pytest.raises(ValueError, match="needs the residual tensor c"):
        cutegemm.gemm(a, b, beta=1.0)
    with pytest.raises(ValueError, match="c must have the output's shape"):
        cutegemm.gemm(a, b, beta=1.0, c=torch.zeros(64, 32, device="cuda", dtype=BF16))
    with pytest.raises(ValueError, match=r"bias must have shape \(64,\)"):
        cutegemm.gemm(a, b, bias=torch.zeros(32, device="cuda"))
    with pytest.raises(ValueError, match="bias must be on"):
        cutegemm.gemm(a, b, bias=torch.zeros(64))
    with pytest.raises(ValueError, match="even number of columns"):
        cutegemm.gemm(a, operand(64, 72)[:, :63], activation="swiglu")
    with pytest.raises(ValueError, match="cannot be combined with the gated"):
        cutegemm.gemm(a, b, beta=1.0, c=torch.zeros(64, 32, device="cuda", dtype=BF16), activation="geglu")
    with pytest.raises(ValueError, match="out must have shape"):
        cutegemm.gemm(a, b, activation="swiglu", out=torch.empty(64, 64, device="cuda", dtype=BF16))


# --- combined, hypothesis over shapes (one kernel per test: fixed spec and tile) ----------------
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 600),
    n8=st.integers(1, 70),
    k8=st.integers(1, 70),
    batch=st.sampled_from([None, 2]),
    alpha=st.sampled_from([0.5, -1.5]),
    beta=st.sampled_from([1.0, -0.25]),
)
def test_combined_alpha_beta_bias_silu_shapes(m, n8, k8, batch, alpha, beta):
    n, k = 8 * n8, 8 * k8
    a = operand(m, k, batch=batch)
    b = operand(k, n, row_major=False)
    shape = (m, n) if batch is None else (batch, m, n)
    c = torch.randn(shape, device="cuda").to(BF16)
    bias = torch.randn(n, device="cuda").to(BF16)
    check(a, b, alpha=alpha, beta=beta, c=c, bias=bias, activation="silu", tile_kw=T128)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(1, 600), n8=st.integers(1, 70), k8=st.integers(1, 70), halves=st.booleans())
def test_gated_bias_shapes(m, n8, k8, halves):
    n, k = 8 * n8, 8 * k8  # n output columns, 2n GEMM columns
    a = operand(m, k)
    b = operand(k, 2 * n, row_major=False)
    bias = torch.randn(2 * n, device="cuda")
    check(a, b, bias=bias, activation="geglu", gate_layout="halves" if halves else "interleaved",
          tile_kw=T128)  # fmt: skip
