"""FP8 row-wise on sm_100a without a GPU: the policy's configs (tcgen05 ``kind::f8f6f4`` into the
fp32 TMEM accumulator, the scales in the epilogue: no sm_90a promotion or fast-accumulation
option), and the host routes of ``gemm`` / ``grouped_gemm`` on an emulated sm_100a device with
the compiled kernel replaced by tests/emulated_kernel.py, against the reference twins. The
kernels' numerics are the GPU tests' (tests/gpu/test_fp8_gpu.py, on an sm_100 GPU)."""

from __future__ import annotations

import contextlib

import pytest
import torch

import cutegemm
from cutegemm.config import EpilogueSpec, GemmProblem, config_errors
from cutegemm.policy import policy_for

from ..emulated_kernel import emulated_kernels

E4M3 = torch.float8_e4m3fn


@contextlib.contextmanager
def _sm100():
    """emulated_kernels on a device that says sm_100a (148 SMs)."""
    from cutegemm.gemm import dense
    from cutegemm.grouped import packed

    with emulated_kernels() as cache:
        saved = [(mod, mod.device_info) for mod in (dense, packed)]
        for mod, _ in saved:
            mod.device_info = lambda index: ("sm_100a", 148)
        try:
            yield cache
        finally:
            for mod, fn in saved:
                mod.device_info = fn


@pytest.mark.parametrize("out", ["bf16", "fp32"])
@pytest.mark.parametrize("fast_accum", [False, True])
def test_policy_configs_are_sm100_fp8(out, fast_accum):
    pol = policy_for("sm_100a", 148)
    epi = EpilogueSpec(scale_a=True, scale_b=True)
    for m in (1, 16, 64, 128, 512, 4096, 8192):
        for n, k in ((7168, 2048), (4096, 7168), (576, 7168), (28672, 4096)):
            cfg = pol.choose_dense(GemmProblem(m, n, k, 1, "e4m3", "e4m3", out, "k", "k"), epilogue=epi,
                                   fast_accum=fast_accum)  # fmt: skip
            assert not config_errors(cfg), (cfg.name, config_errors(cfg))
            assert cfg.arch == "sm_100a" and not (cfg.fast_accum or cfg.promote_k or cfg.split_k > 1), cfg.name
        cfg = pol.choose_grouped(GemmProblem(8 * m, 1536, 2048, 1, "e4m3", "e4m3", out, "k", "k"), 8, epilogue=epi)
        assert not config_errors(cfg) and cfg.grouped and cfg.arch == "sm_100a", cfg.name


def test_sm90_only_fp8_options_are_refused_on_sm100():
    cfg = policy_for("sm_100a", 148).choose_dense(GemmProblem(4096, 4096, 4096, 1, "e4m3", "e4m3", "bf16", "k", "k"),
                                                  epilogue=EpilogueSpec(scale_a=True, scale_b=True))  # fmt: skip
    for bad, what in ((dict(fast_accum=True), "fast_accum"), (dict(promote_k=32, tile_n=128), "promote_k"),
                      (dict(b_major="n"), "K-major"), (dict(fp8_blockwise=True), "fp8_blockwise")):  # fmt: skip
        assert any(what in e for e in config_errors(cfg.__class__(**{**cfg.__dict__, **bad}))), bad


@pytest.mark.parametrize("m,n,k", [(1, 64, 128), (37, 96, 256), (200, 160, 384)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_dense_fp8_rowwise_route(m, n, k, out_dtype):
    gen = torch.Generator().manual_seed(m + n)
    a = torch.randn(m, k, generator=gen).to(E4M3)
    b = torch.randn(n, k, generator=gen).to(E4M3).t()  # (K, N), K-major
    sa, sb = torch.rand(m, 1, generator=gen) + 0.5, torch.rand(1, n, generator=gen) + 0.5
    with _sm100() as cache:
        for fast_accum in (False, True):
            out = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype, fast_accum=fast_accum)
            cfg = cache.kernels[-1].cfg
            assert cfg.arch == "sm_100a" and cfg.a_dtype == "e4m3" and not cfg.fast_accum and not cfg.promote_k
            ref = cutegemm.gemm_ref(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype)
            torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


def test_grouped_fp8_rowwise_route():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(50, 128, generator=gen).to(E4M3)
    w = torch.randn(3, 64, 128, generator=gen).to(E4M3).transpose(1, 2)  # (E, K, N), K-major
    offs = torch.tensor([10, 10, 50], dtype=torch.int32)
    sa, sb = torch.rand(50, generator=gen) + 0.5, torch.rand(3, 64, generator=gen) + 0.5
    with _sm100() as cache:
        out = cutegemm.grouped_gemm(x, w, offs=offs, scale_a=sa, scale_b=sb)
        cfg = cache.kernels[-1].cfg
        assert cfg.arch == "sm_100a" and cfg.grouped and cfg.a_dtype == "e4m3"
    ref = cutegemm.grouped_gemm_ref(x, w, offs=offs, scale_a=sa, scale_b=sb)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
