"""e5m2 operands in the dense FP8 form, on the CPU: the host path builds a kernel config with
each operand's own type (the policy's tile for the e4m3 pair of the same shape), the warm
row-wise path keys on both dtypes, the rules keep e5m2 out of the forms that take e4m3 only
(grouped, block scales, the K-grouped and swapped kernels), and the reference twin computes every
pair. The GPU half (QGMMA with both types against float64 and torch._scaled_mm) is
tests/gpu/test_fp8_e5m2_gpu.py; the SASS types are checked by the compile check."""

import pytest
import torch

import cutegemm
from cutegemm.config import FP8_DTYPES, Form, GemmConfig, GemmProblem, config_errors
from cutegemm.gemm import dense
from cutegemm.policy import policy_for

from ..host_overhead_cpu import cpu_fast_path

E4, E5, BF = torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16
PAIRS = [(E5, E4), (E4, E5), (E5, E5)]
NAMES = {E4: "e4m3", E5: "e5m2"}


@pytest.fixture
def kernel():
    with cpu_fast_path() as k:
        yield k


def _last_config():
    return list(dense.PLANS.values())[-1].config


def _skey(a, b, sa, sb):  # dense.gemm's row-wise warm key
    return (a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.device, b.device, sa.shape, sa.stride(),
            sa.dtype, sa.device, sb.shape, sb.stride(), sb.dtype, sb.device, None, False)  # fmt: skip


def _operands(m, n, k, a_dtype, b_dtype):
    return torch.randn(m, k).to(a_dtype), torch.randn(n, k).to(b_dtype).t()


@pytest.mark.parametrize("a_dtype,b_dtype", PAIRS)
@pytest.mark.parametrize("m,n,k", [(1, 576, 7168), (16, 2048, 7168), (100, 1536, 7168), (1024, 4096, 4096)])
def test_config_carries_each_operands_type(kernel, a_dtype, b_dtype, m, n, k):
    a, b = _operands(m, n, k, a_dtype, b_dtype)
    out = cutegemm.gemm(a, b, scale_a=torch.rand(m, 1), scale_b=torch.rand(1, n))
    assert out.shape == (m, n) and out.dtype == BF
    cfg = _last_config()
    assert (cfg.a_dtype, cfg.b_dtype) == (NAMES[a_dtype], NAMES[b_dtype])
    pol = policy_for("sm_90a", 132)
    e4 = pol.choose_dense(GemmProblem(m, n, k, 1, "e4m3", "e4m3", "bf16", "k", "k"), epilogue=cfg.epilogue)
    ours = pol.choose_dense(GemmProblem(m, n, k, 1, NAMES[a_dtype], NAMES[b_dtype], "bf16", "k", "k"),
                            epilogue=cfg.epilogue)  # fmt: skip
    assert ours == e4.__class__(**{**e4.__dict__, "a_dtype": NAMES[a_dtype], "b_dtype": NAMES[b_dtype]})


def test_warm_path_keys_on_both_dtypes(kernel):
    """The same shapes with e4m3 and then e5m2 operands: two plans, each with its operands' types."""
    sa, sb = torch.rand(64, 1), torch.rand(1, 48)
    for a_dtype, b_dtype in [(E4, E4), (E5, E4), (E5, E4), (E4, E5), (E4, E4)]:
        a, b = _operands(64, 48, 32, a_dtype, b_dtype)
        cutegemm.gemm(a, b, scale_a=sa, scale_b=sb)
        cfg = next(p.config for p in dense.PLANS.values() if p is dense.PLAIN_PLANS.get(_skey(a, b, sa, sb)))
        assert (cfg.a_dtype, cfg.b_dtype) == (NAMES[a_dtype], NAMES[b_dtype])
        assert (kernel.args[0].dtype, kernel.args[1].dtype) == (a_dtype, b_dtype)


@pytest.mark.parametrize("a_dtype,b_dtype", PAIRS)
def test_reference_twin_is_the_dequantized_product(a_dtype, b_dtype):
    a, b = _operands(33, 40, 96, a_dtype, b_dtype)
    sa, sb = torch.rand(33, 1) + 0.5, torch.rand(1, 40) + 0.5
    ref = cutegemm.gemm_ref(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float32)
    exact = (a.double() @ b.double()) * sa.double() * sb.double()
    torch.testing.assert_close(ref.double(), exact, rtol=1e-5, atol=1e-4)


def test_errors(kernel):
    a5 = torch.randn(32, 256).to(E5)
    with pytest.raises(TypeError, match="must equal a.dtype"):  # FP8 with a 16-bit operand
        cutegemm.gemm(a5, torch.randn(256, 64, dtype=BF))
    with pytest.raises(ValueError, match="takes float8_e4m3fn a and b"):  # DeepSeek block scales
        cutegemm.gemm(a5, torch.randn(64, 256).to(E4).t(), scale_a=torch.ones(32, 2), scale_b=torch.ones(2, 1))
    with pytest.raises(ValueError, match="for FP8 inputs"):
        cutegemm.gemm(torch.randn(4, 8, dtype=BF), torch.randn(8, 4, dtype=BF), scale_a=torch.ones(1), scale_b=torch.ones(1))
    with pytest.raises((TypeError, ValueError), match="e4m3"):  # the grouped forms take e4m3 only
        cutegemm.grouped_gemm(a5, torch.randn(2, 64, 256).to(E4).transpose(-2, -1),
                              offs=torch.tensor([16, 32], dtype=torch.int32), scale_a=torch.ones(32),
                              scale_b=torch.ones(2, 64))  # fmt: skip


@pytest.mark.parametrize("a_dtype,b_dtype", PAIRS)
@pytest.mark.parametrize("scaled", [False, True])
def test_3d_grouped_forms_reject_e5m2(kernel, a_dtype, b_dtype, scaled):
    """The 3d x 3d and 3d x 2d grouped forms take e4m3 only: e5m2 raises, with or without scales
    (the 3d x 3d form's dense route must not take it and drop the scales)."""
    a = torch.randn(2, 32, 64).to(a_dtype)
    kw = dict(scale_a=torch.ones(2, 32), scale_b=torch.ones(2, 48)) if scaled else {}
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        cutegemm.grouped_gemm(a, torch.randn(2, 48, 64).to(b_dtype).transpose(-2, -1), **kw)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        cutegemm.grouped_gemm(a, torch.randn(64, 96).to(b_dtype), offs=torch.tensor([48, 96], dtype=torch.int32))
    assert kernel.calls == 0


def test_rules():
    base = dict(arch="sm_90a", a_dtype="e5m2", b_dtype="e4m3", out_dtype="bf16", a_major="k", b_major="k",
                tile_m=128, tile_n=128)  # fmt: skip
    assert FP8_DTYPES == ("e4m3", "e5m2")
    assert not config_errors(GemmConfig(**base))
    assert not config_errors(GemmConfig(**{**base, "b_dtype": "e5m2"}, fast_accum=True))
    assert not config_errors(GemmConfig(**base, form=Form.FLAT, split_k=2, raster="n", group=1))
    for bad, match in [(dict(form=Form.GROUPED), "dense form only"), (dict(b_dtype="bf16"), "both FP8"),
                       (dict(a_major="m"), "K-major"), (dict(fp8_blockwise=True, cluster_m=2), "e4m3 A and B"),
                       (dict(swap_ab=True, form=Form.GROUPED), "e4m3")]:  # fmt: skip
        errs = config_errors(GemmConfig(**{**base, **bad}))
        assert any(match in e for e in errs), (bad, errs)
