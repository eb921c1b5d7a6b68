"""Dense GEMM on a GPU (sm_90a runs on the H200; the same tests run on sm_100 when present)."""

from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cutegemm
from cutegemm.config import GemmConfig, a_rows_for

from ..gemm_check import assert_outside_untouched, assert_within_torch_error, poisoned_out

pytestmark = pytest.mark.gpu

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def make_operand(rows, cols, dtype, contiguous_rows: bool, batch=None, scale=1.0):
    """A (batch, rows, cols) operand, row-major if contiguous_rows else a column-major view."""
    shape = (rows, cols) if batch is None else (batch, rows, cols)
    if contiguous_rows:
        return torch.randn(shape, device="cuda", dtype=torch.float32).mul_(scale).to(dtype)
    t = torch.randn((*shape[:-2], cols, rows), device="cuda", dtype=torch.float32).mul_(scale).to(dtype)
    return t.mT


def check_gemm(a, b, out_dtype, alpha=1.0, config=None):
    L = a.shape[0] if a.dim() == 3 else None
    m, n = a.shape[-2], b.shape[-1]
    shape = (m, n) if L is None else (L, m, n)
    buf, out = poisoned_out(shape, out_dtype)
    res = cutegemm.gemm(a, b, out=out, alpha=alpha, config=config)
    assert res.data_ptr() == out.data_ptr()
    torch.cuda.synchronize()
    ref = torch.matmul(a.double(), b.double()) * alpha
    same = (torch.matmul(a, b).to(torch.float64) * alpha).to(out_dtype)
    assert_within_torch_error(out, same, ref, what=f"{tuple(a.shape)}@{tuple(b.shape)}->{out_dtype}")
    assert_outside_untouched(buf, m, n)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 700),
    n8=st.integers(1, 90),
    k8=st.integers(1, 90),
    batch=st.sampled_from([None, 1, 3]),
    a_rowmajor=st.booleans(),
    b_rowmajor=st.booleans(),
)
def test_dense_shapes_and_majors(m, n8, k8, batch, a_rowmajor, b_rowmajor):
    n, k = 8 * n8, 8 * k8
    if not a_rowmajor:
        m = 8 * max(1, m // 8)  # column-major A: M is the contiguous dim, 16-byte aligned
    a = make_operand(m, k, torch.bfloat16, a_rowmajor, batch)
    b = make_operand(k, n, torch.bfloat16, b_rowmajor, batch)
    check_gemm(a, b, torch.bfloat16)


@pytest.mark.parametrize(
    "in_dtype,out_dtype", [("fp16", "fp16"), ("bf16", "fp32"), ("fp16", "fp32"), ("bf16", "fp16")]
)
def test_dense_dtypes(in_dtype, out_dtype):
    a = make_operand(333, 264, DTYPES[in_dtype], True)
    b = make_operand(264, 520, DTYPES[in_dtype], False)
    check_gemm(a, b, DTYPES[out_dtype])


@pytest.mark.parametrize(
    "tile",
    [
        dict(tile_m=128, tile_n=256, cluster_m=2),
        dict(tile_m=128, tile_n=256, cluster_n=2),
        dict(tile_m=128, tile_n=192),
        dict(tile_m=128, tile_n=128, cluster_m=2),
        dict(tile_m=64, tile_n=128, raster="n", group=1),
        dict(tile_m=128, tile_n=64, cluster_n=2, raster="n", group=3),
        dict(tile_m=128, tile_n=128, cluster_m=2, pingpong=True),
        dict(tile_m=128, tile_n=192, cluster_m=2, pingpong=True),
        dict(tile_m=64, tile_n=256, cluster_n=2, pingpong=True),
        dict(tile_m=128, tile_n=64, pingpong=True, raster="n", group=1),
        dict(tile_m=64, tile_n=96, cluster_n=2, raster="n", group=1),
        dict(tile_m=128, tile_n=96, cluster_m=2),
    ],
)
def test_dense_tiles_and_clusters(tile):
    """Every tile/cluster/raster of the policy on ragged shapes (partial tiles and clusters)."""
    arch = "sm_90a" if torch.cuda.get_device_capability()[0] == 9 else "sm_100a"
    if arch == "sm_100a" and (tile.get("pingpong") or tile["tile_n"] == 96):
        pytest.skip("pingpong and 96-column tiles are sm_90a")
    a = make_operand(1000, 328, torch.bfloat16, True)
    b = make_operand(328, 1032, torch.bfloat16, False)
    cfg = replace(GemmConfig(arch=arch, a_major="k", b_major="k"), **tile)
    check_gemm(a, b, torch.bfloat16, config=cfg)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 900),
    n8=st.integers(1, 120),
    k8=st.integers(1, 120),
    tile=st.sampled_from([(96, 1, 1), (128, 1, 1), (128, 2, 1), (128, 1, 2), (160, 1, 1), (192, 1, 1), (192, 2, 1),
                          (192, 1, 2)]),
    a_rowmajor=st.booleans(),
    b_rowmajor=st.booleans(),
    out_dtype=st.sampled_from(["bf16", "fp32"]),
)
def test_192_row_tiles(m, n8, k8, tile, a_rowmajor, b_rowmajor, out_dtype):
    """sm_90a 192-row tiles (three consumer warpgroups) on ragged shapes, both majors, partial
    tiles and clusters: within 2x torch's error, nothing written outside the output."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("192-row tiles are sm_90a")
    n, k = 8 * n8, 8 * k8
    if not a_rowmajor:
        m = 8 * max(1, m // 8)
    a = make_operand(m, k, torch.bfloat16, a_rowmajor)
    b = make_operand(k, n, torch.bfloat16, b_rowmajor)
    tn, cm, cn = tile
    cfg = GemmConfig(arch="sm_90a", a_major="k" if a_rowmajor else "m", b_major="n" if b_rowmajor else "k",
                     out_dtype=out_dtype, tile_m=192, tile_n=tn, cluster_m=cm, cluster_n=cn)  # fmt: skip
    check_gemm(a, b, DTYPES[out_dtype], config=cfg)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 400),
    n8=st.integers(1, 120),
    k8=st.integers(1, 120),
    tile=st.sampled_from([(64, 1, 1), (64, 2, 1), (64, 1, 2), (128, 1, 1), (128, 2, 1)]),
    a_rowmajor=st.booleans(),
    b_rowmajor=st.booleans(),
    out_dtype=st.sampled_from(["bf16", "fp16", "fp32"]),
    short_box=st.booleans(),
)
def test_80_column_tiles(m, n8, k8, tile, a_rowmajor, b_rowmajor, out_dtype, short_box):
    """sm_90a 80-column tiles (16-column epilogue subtiles) on ragged shapes, both majors, partial
    tiles and clusters, a short A box (M <= 16); fp16 operands for an fp16 output: within
    2x torch's error, nothing written outside the output."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("80-column tiles are sm_90a")
    n, k = 8 * n8, 8 * k8
    if not a_rowmajor:
        m = 8 * max(1, m // 8)
    in_dtype = "fp16" if out_dtype == "fp16" else "bf16"
    a = make_operand(m, k, DTYPES[in_dtype], a_rowmajor)
    b = make_operand(k, n, DTYPES[in_dtype], b_rowmajor)
    tm, cm, cn = tile
    cfg = GemmConfig(arch="sm_90a", a_dtype=in_dtype, b_dtype=in_dtype, a_major="k" if a_rowmajor else "m",
                     b_major="n" if b_rowmajor else "k", out_dtype=out_dtype, tile_m=tm, tile_n=80, cluster_m=cm,
                     cluster_n=cn, raster="m" if cn == 2 else "n", group=1)  # fmt: skip
    if short_box and a_rowmajor and cn == 1 and m <= 16:
        cfg = replace(cfg, a_rows=a_rows_for(m))
    check_gemm(a, b, DTYPES[out_dtype], config=cfg)


def test_alpha_and_broadcast_weight():
    a = make_operand(3 * 130, 64, torch.bfloat16, True).view(3, 130, 64)
    b = make_operand(64, 136, torch.bfloat16, False)
    check_gemm(a, b, torch.bfloat16, alpha=0.37)


def test_bitwise_deterministic():
    a = make_operand(2048, 1024, torch.bfloat16, True)
    b = make_operand(1024, 3072, torch.bfloat16, False)
    outs = [cutegemm.gemm(a, b) for _ in range(3)]
    for o in outs[1:]:
        assert torch.equal(o, outs[0])


def test_large_values_and_nan_propagation():
    a = make_operand(256, 512, torch.bfloat16, True, scale=100.0)
    b = make_operand(512, 256, torch.bfloat16, True, scale=100.0)
    check_gemm(a, b, torch.float32)
    a[7, 3] = float("nan")
    out = cutegemm.gemm(a, b)
    assert torch.isnan(out[7]).all() and not torch.isnan(out[:7]).any() and not torch.isnan(out[8:]).any()


def test_empty_and_k_zero():
    a = torch.randn(0, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(64, 32, device="cuda", dtype=torch.bfloat16)
    assert cutegemm.gemm(a, b).shape == (0, 32)
    a = torch.randn(5, 0, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(0, 16, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(cutegemm.gemm(a, b), torch.zeros(5, 16, device="cuda", dtype=torch.bfloat16))


def test_misaligned_storage_offset_is_copied():
    base = torch.randn(64 * 72 + 1, device="cuda", dtype=torch.bfloat16)
    a = base[1:].view(64, 72)  # data pointer 2 bytes past an aligned address
    b = make_operand(72, 64, torch.bfloat16, True)
    check_gemm(a, b, torch.bfloat16)


def test_bad_inputs_on_gpu():
    a = torch.randn(64, 60, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(60, 64, device="cuda", dtype=torch.bfloat16)
    got = cutegemm.gemm(a, b)  # K=60: lda 120 B, which TMA cannot address: staged, then computed
    torch.testing.assert_close(got.float(), (a.double() @ b.double()).float(), atol=0.1, rtol=0.02)
    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="b.dtype"):
        cutegemm.gemm(a, torch.randn(64, 64, device="cuda", dtype=torch.float16))
    with pytest.raises(ValueError, match="shapes do not match"):
        cutegemm.gemm(a, torch.randn(32, 64, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="out must have shape"):
        cutegemm.gemm(a, a, out=torch.empty(64, 32, device="cuda", dtype=torch.bfloat16))
    col = torch.empty(64, 64, device="cuda", dtype=torch.bfloat16).t()  # column-major out: scratch + copy
    assert cutegemm.gemm(a, a, out=col) is col
    torch.testing.assert_close(col.float(), (a.double() @ a.double()).float(), atol=0.1, rtol=0.02)
    with pytest.raises(ValueError, match="CUDA"):
        cutegemm.gemm(a, a.cpu())


def test_second_process_loads_from_disk_cache(tmp_path):
    """A fresh process gets its first result from the disk cache without recompiling."""
    import os
    import subprocess
    import sys

    code = (
        "import torch, cutegemm\n"
        "from cutegemm.gemm.dense import DENSE_CACHE\n"
        "a = torch.randn(256, 128, device='cuda', dtype=torch.bfloat16)\n"
        "b = torch.randn(128, 256, device='cuda', dtype=torch.bfloat16)\n"
        "torch.testing.assert_close(cutegemm.gemm(a, b).float(), (a.float() @ b.float()), atol=0.5, rtol=0.02)\n"
        "print(DENSE_CACHE.stats)\n"
    )
    env = dict(os.environ, CUTEGEMM_CACHE_DIR=str(tmp_path))
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "'compiled': 1" in first.stdout, first.stdout + first.stderr
    assert "'compiled': 0" in second.stdout and "'disk': 1" in second.stdout, second.stdout + second.stderr
