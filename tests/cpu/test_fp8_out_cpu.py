"""FP8 outputs (``out_dtype=torch.float8_e4m3fn / float8_e5m2``, torch._scaled_mm's FP8
``out_dtype``), on the CPU: the rules (FP8 operands, the dense kernel of either arch, no gated /
preact / user / block-scaled epilogue), the policy's pick for every layer shape of the sweep is a valid
config, the host path builds a config with the output's type and allocates an FP8 output (rows
padded where N is not a multiple of 16), and the reference twin saturates as the kernel's
``cvt.satfinite`` (finite overflow and infinities to +-max, NaN kept). The GPU half is
tests/gpu/test_fp8_out_gpu.py; the conversion's SASS is checked by the compile check."""

from dataclasses import replace

import pytest
import torch

import cutegemm
from cutegemm.bench.layers import LAYERS, M_VALUES
from cutegemm.config import Form, GemmConfig, GemmProblem, config_errors
from cutegemm.epilogue import EpilogueSpec
from cutegemm.gemm import dense
from cutegemm.policy import policy_for

from ..emulated_kernel import emulated_kernels
from ..host_overhead_cpu import cpu_fast_path

E4, E5, BF = torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16
NAMES = {E4: "e4m3", E5: "e5m2"}
SCALED = EpilogueSpec(scale_a=True, scale_b=True)


@pytest.fixture
def kernel():
    with cpu_fast_path() as k:
        yield k


def _configs():
    """Records the configs the fake kernel cache is asked for (the fixture's cache)."""
    seen, get = [], dense.DENSE_CACHE.get
    dense.DENSE_CACHE.get = lambda cfg: (seen.append(cfg), get(cfg))[1]
    return seen


def _cfg(**kw):
    base = dict(arch="sm_90a", a_dtype="e4m3", b_dtype="e4m3", out_dtype="e4m3", a_major="k", b_major="k",
                tile_m=128, tile_n=128, epilogue=SCALED)  # fmt: skip
    return GemmConfig(**{**base, **kw})


@pytest.mark.parametrize("out", ["e4m3", "e5m2"])
def test_rules_accept_the_dense_fp8_kernel(out):
    for cfg in (_cfg(out_dtype=out), _cfg(out_dtype=out, form=Form.FLAT, tile_m=64, split_k=2),
                _cfg(out_dtype=out, a_dtype="e5m2", cluster_n=2,
                     epilogue=replace(SCALED, bias=True, bias_dtype="bf16", activation="gelu")),
                _cfg(out_dtype=out, arch="sm_100a"), _cfg(out_dtype=out, arch="sm_100a", tile_m=256, tile_n=256,
                                                           two_cta=True, cluster_m=2)):  # fmt: skip
        assert config_errors(cfg) == [], cfg.name


@pytest.mark.parametrize(
    "kw",
    [dict(a_dtype="bf16", b_dtype="bf16", epilogue=EpilogueSpec()), dict(form=Form.GROUPED),
     dict(epilogue=replace(SCALED, gated="swiglu")), dict(epilogue=replace(SCALED, gated="swiglu", preact=True)),
     dict(fp8_blockwise=True, epilogue=EpilogueSpec())],
)  # fmt: skip
def test_rules_refuse_other_kernels(kw):
    errs = config_errors(_cfg(**kw))
    assert any("an FP8 output" in e for e in errs), errs


@pytest.mark.parametrize("out", ["e4m3", "e5m2"])
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_policy_picks_valid_configs_for_every_sweep_shape(out, arch):
    pol = policy_for(arch, 132 if arch == "sm_90a" else 148)
    for _, _, n, k in LAYERS:
        for m in M_VALUES:
            for epi in (SCALED, EpilogueSpec(scale_a=True), replace(SCALED, bias=True, bias_dtype="bf16", activation="relu")):
                cfg = pol.choose_dense(GemmProblem(m, n, k, 1, "e4m3", "e4m3", out, "k", "k"), epilogue=epi)
                assert cfg.out_dtype == out and config_errors(cfg) == [], (m, n, k, cfg.name, config_errors(cfg))


@pytest.mark.parametrize("out_dtype", [E4, E5])
@pytest.mark.parametrize("m,n,k", [(1, 576, 7168), (64, 2048, 2048), (100, 1536, 7168), (1024, 4096, 4096), (33, 40, 96)])
def test_host_path_builds_an_fp8_output(kernel, out_dtype, m, n, k):
    a, b = torch.randn(m, k).to(E4), torch.randn(n, k).to(E4).t()
    seen = _configs()
    out = cutegemm.gemm(a, b, scale_a=torch.rand(()), scale_b=torch.rand(()), out_dtype=out_dtype)
    assert out.shape == (m, n) and out.dtype == out_dtype
    cfg = seen[-1]
    assert cfg.out_dtype == NAMES[out_dtype] and config_errors(cfg) == []
    written = kernel.args[2]  # what the kernel stores into (a view of out, or of a scratch with padded rows)
    assert written.dtype == out_dtype


def test_an_fp8_out_tensor_gives_the_output_type(kernel):
    a, b = torch.randn(32, 64).to(E4), torch.randn(48, 64).to(E4).t()
    out = torch.empty(32, 48, dtype=E5)
    seen = _configs()
    res = cutegemm.gemm(a, b, scale_a=torch.rand(()), scale_b=torch.rand(()), out=out)
    assert res is out and seen[-1].out_dtype == "e5m2"


@pytest.mark.parametrize("out_dtype", [E4, E5])
def test_reference_twin_saturates(out_dtype):
    top = torch.finfo(out_dtype).max
    a = torch.tensor([[1.0], [-1.0], [0.5], [float("nan")]]).to(E4)
    b = torch.tensor([[448.0, 1.0]]).to(E4)
    for scale in (1e3, float("inf")):
        ref = cutegemm.gemm_ref(a, b, scale_a=torch.tensor(scale), scale_b=torch.tensor(1.0), out_dtype=out_dtype)
        assert ref.dtype == out_dtype
        r = ref.float()
        assert r[0, 0] == top and r[1, 0] == -top and r[3].isnan().all()
    small = cutegemm.gemm_ref(a[:3], b, scale_a=torch.tensor(1.0), scale_b=torch.tensor(0.25), out_dtype=out_dtype)
    exact = (a[:3].float() @ b.float()) * 0.25
    assert torch.equal(small.float(), exact.to(out_dtype).float())


def test_errors(kernel):
    x = torch.randn(16, 32, dtype=BF)
    for fn in (cutegemm.gemm, cutegemm.gemm_ref):
        with pytest.raises(TypeError, match="needs FP8 operands"):
            fn(x, x.t(), out_dtype=E4)
    a = torch.randn(16, 32).to(E4)
    with pytest.raises(TypeError, match="out_dtype"):
        cutegemm.gemm(a, a.t(), scale_a=torch.rand(()), scale_b=torch.rand(()), out_dtype=torch.int8)
    with pytest.raises(ValueError, match="e4m3"):  # block scales: bf16 / fp32 outputs (torch's blockwise recipe)
        cutegemm.gemm(torch.randn(128, 256).to(E4), torch.randn(256, 128).to(E4).t().contiguous().t(),
                      scale_a=torch.ones(128, 2), scale_b=torch.ones(2, 1), out_dtype=E4)  # fmt: skip


def test_scale_result_folds_into_scale_b_and_bias():
    """torch's D scale: ``sr * (acc * sa * sb + bias)``, through the host path (the emulated kernel)
    and the reference twin, against float64."""
    a, b = torch.randn(32, 64).to(E4), torch.randn(48, 64).to(E4).t()
    sa, sb, sr = torch.rand(32, 1) + 0.5, torch.tensor(1.5), torch.tensor(0.25)
    bias = torch.randn(48, dtype=BF) * 4
    exact = ((a.double() @ b.double()) * sa.double() * 1.5 + bias.double()) * 0.25
    twin = cutegemm.gemm_ref(a, b, scale_a=sa, scale_b=sb, bias=bias, out_dtype=E4, scale_result=sr)
    with emulated_kernels():
        ours = cutegemm.gemm(a, b, scale_a=sa, scale_b=sb, bias=bias, out_dtype=E4, scale_result=sr)
        no_sb = cutegemm.gemm(a, b, scale_a=sa, out_dtype=E5, scale_result=sr)
    assert torch.equal(ours.view(torch.uint8), twin.view(torch.uint8))
    assert torch.equal(ours.float(), exact.float().to(E4).float())
    assert torch.equal(no_sb.float(), ((a.double() @ b.double()) * sa.double() * 0.25).float().to(E5).float())
    assert sb.item() == 1.5 and bias.dtype == BF  # the caller's tensors are not changed


@pytest.mark.parametrize(
    "kw,err,match",
    [(dict(out_dtype=BF), ValueError, "FP8 output"), (dict(activation="relu"), ValueError, "activation"),
     (dict(scale_result=torch.ones(2)), ValueError, "one element"),
     (dict(scale_result=torch.tensor(1.0, dtype=torch.float64)), TypeError, "float32")],
)  # fmt: skip
def test_scale_result_errors(kernel, kw, err, match):
    a = torch.randn(16, 32).to(E4)
    kw = {"out_dtype": E4, "scale_result": torch.tensor(0.5), **kw}
    for fn in (cutegemm.gemm, cutegemm.gemm_ref):
        with pytest.raises(err, match=match):
            fn(a, a.t(), scale_a=torch.rand(()), scale_b=torch.rand(()), **kw)
