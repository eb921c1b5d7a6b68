"""quack's fused-linear test cases (Dao-AILab/quack tests/test_linear.py, tests/test_linear_varlen_m.py),
rewritten for ``cutegemm.gemm`` / ``cutegemm.grouped_gemm`` (forward values; quack's backward,
pre-activation outputs and its own config knobs are not ours). quack's tolerance: the max error
against an fp32 reference is below twice torch's own bf16 error plus a small constant
(``_within_2x``). On the CPU variant torch's bf16 product is emulated as the fp32 product rounded
to bf16 (what a GPU bf16 GEMM returns, up to the summation order), and only the smallest of the
source's shapes run (time). See tests/conformance/helpers.py for the cuda / cpu variants."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import cutegemm

from .helpers import DEVICES, run

pytestmark = pytest.mark.source("Dao-AILab/quack tests/test_linear.py")
VARLEN = pytest.mark.source("Dao-AILab/quack tests/test_linear_varlen_m.py")

BF = torch.bfloat16


def _within_2x(out, ref, pt, atol):
    err, pt_err = (out.float() - ref).abs().max().item(), (pt.float() - ref).abs().max().item()
    assert err < 2 * pt_err + atol, f"max error {err:.4g} vs torch's {pt_err:.4g}"


def _mm_lowp(device, a, b):
    """torch's same-precision product: its bf16 GEMM on the GPU; on the CPU the fp32 product
    rounded to bf16."""
    if device == "cuda":
        return torch.matmul(a, b)
    return torch.matmul(a.float(), b.float()).to(a.dtype)


def _cpu_small(device, *big):
    if device == "cpu" and any(big):
        pytest.skip("cpu variant: the source's smallest shapes only (time)")


# Dao-AILab/quack tests/test_linear.py::test_linear
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("in_features", [736, 4096])
@pytest.mark.parametrize("out_features", [1504, 2048])
@pytest.mark.parametrize("has_bias", [False, True])
def test_linear(device, has_bias, out_features, in_features):
    _cpu_small(device, in_features != 736, out_features != 1504)
    torch.manual_seed(0)
    x = torch.randn(1920, in_features, device=device, dtype=BF)[::2]  # non-contiguous, as the source
    w = torch.randn(out_features, in_features, device=device, dtype=BF) / math.sqrt(in_features)
    bias = torch.randn(out_features, device=device) if has_bias else None
    out = run(device, cutegemm.gemm, x, w.t(), bias=bias)
    ref = F.linear(x.float(), w.float(), bias)
    pt = _mm_lowp(device, x, w.t())
    pt = pt if bias is None else (pt + bias.to(BF))
    _within_2x(out, ref, pt, 1e-6)


# Dao-AILab/quack tests/test_linear.py::test_gemm (quack's swap_ab config is its own: the policy picks ours)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k,n", [(736, 1504), (736, 2048), (1024, 1504), (1024, 2048)])
@pytest.mark.parametrize("a_major", ["k", "m"])
@pytest.mark.parametrize("b_major", ["k", "n"])
@pytest.mark.parametrize("out_major", ["m", "n"])
def test_gemm(device, k, n, a_major, b_major, out_major):
    _cpu_small(device, (k, n) != (736, 1504))
    torch.manual_seed(0)
    m = 960
    a = torch.randn(m, k, device=device, dtype=BF)
    a = a.T.contiguous().T if a_major == "m" else a
    b = torch.randn(k, n, device=device, dtype=BF) / math.sqrt(k)
    b = b.T.contiguous().T if b_major == "k" else b
    out = torch.empty(m, n, device=device, dtype=BF)
    out = out.T.contiguous().T if out_major == "m" else out
    assert run(device, cutegemm.gemm, a, b, out=out) is out
    _within_2x(out, a.float() @ b.float(), _mm_lowp(device, a, b), 1e-5)


ACT = {"relu": ("relu", F.relu), "gelu_tanh_approx": ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh")),
       "relu_sq": ("relu_sq", lambda t: F.relu(t).square()), "tanh": ("tanh", torch.tanh)}


# Dao-AILab/quack tests/test_linear.py::test_linear_act (store_preact=False: the post-activation)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("in_features", [736, 4096])
@pytest.mark.parametrize("out_features", [1504, 2048])
@pytest.mark.parametrize("has_bias", [False, True])
@pytest.mark.parametrize("activation", ["relu", "relu_sq", "gelu_tanh_approx"])
def test_linear_act(device, activation, has_bias, out_features, in_features):
    _cpu_small(device, in_features != 736, out_features != 1504)
    torch.manual_seed(0)
    ours_name, act = ACT[activation]
    x = torch.randn(1920, in_features, device=device, dtype=BF)[::2]
    w = torch.randn(out_features, in_features, device=device, dtype=BF) / math.sqrt(in_features)
    bias = torch.randn(out_features, device=device) if has_bias else None
    postact = run(device, cutegemm.gemm, x, w.t(), bias=bias, activation=ours_name)
    ref = act(F.linear(x.float(), w.float(), bias))
    pre_pt = _mm_lowp(device, x, w.t()).float()
    pt = act(pre_pt if bias is None else pre_pt + bias).to(BF)
    _within_2x(postact, ref, pt, 1e-6)


# Dao-AILab/quack tests/test_linear.py::test_linear_act / ::test_gemm_act_alpha (the outputs and alpha form
# cutegemm does not have)
@pytest.mark.unsupported
@pytest.mark.parametrize("kwargs,error,match", [
    ({"activation": "relu", "store_preact": True}, TypeError, "store_preact"),
    ({"activation": "relu", "alpha": torch.tensor(0.5)}, TypeError, "alpha and beta must be Python numbers"),
], ids=["store_preact", "tensor-alpha"])  # fmt: skip
def test_linear_act_not_supported(kwargs, error, match):
    x = torch.randn(64, 32, dtype=BF)
    w = torch.randn(64, 32, dtype=BF)
    with pytest.raises(error, match=match):
        run("cpu", cutegemm.gemm, x, w.t(), **kwargs)


# Dao-AILab/quack tests/test_linear.py::test_gemm_gated (activation="geglu"): quack's GeGLU is the tanh
# approximation of GELU, which cutegemm names "geglu_tanh"; cutegemm's "geglu" is the erf GELU (torch's
# default). The check shows which is which
def test_gemm_gated_geglu_names():
    torch.manual_seed(0)
    x, w = torch.randn(64, 32), torch.randn(32, 64)
    pre = x @ w
    erf = cutegemm.gemm_ref(x, w, activation="geglu", out_dtype=torch.float32)
    tanh = cutegemm.gemm_ref(x, w, activation="geglu_tanh", out_dtype=torch.float32)
    torch.testing.assert_close(erf, F.gelu(pre[:, 0::2]) * pre[:, 1::2])
    torch.testing.assert_close(tanh, F.gelu(pre[:, 0::2], approximate="tanh") * pre[:, 1::2])
    assert not torch.allclose(erf, tanh, atol=1e-6, rtol=0)


# Dao-AILab/quack tests/test_linear.py::test_gemm_act_alpha (float alpha; tensor alpha: above)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("has_bias", [False, True])
def test_gemm_act_alpha(device, has_bias, activation):
    torch.manual_seed(0)
    m, k, n = 512, 1024, 1504
    a = torch.randn(m, k, device=device, dtype=BF)
    b = (torch.randn(n, k, device=device, dtype=BF) / math.sqrt(k)).T
    bias = torch.randn(n, device=device) if has_bias else None
    lowp = _mm_lowp(device, a, b).float()
    act = ACT[activation][1]
    for alpha in (0.7371, 0.25):  # the second: a warm plan with another alpha of the same mode
        post = run(device, cutegemm.gemm, a, b, bias=bias, activation=activation, alpha=alpha)
        pre_ref = alpha * (a.float() @ b.float()) + (0 if bias is None else bias)
        pre_pt = alpha * lowp + (0 if bias is None else bias)
        _within_2x(post, act(pre_ref), act(pre_pt).to(BF), 1e-6)
    neutral = run(device, cutegemm.gemm, a, b, bias=bias, activation=activation, alpha=1.0)
    plain = run(device, cutegemm.gemm, a, b, bias=bias, activation=activation)
    assert torch.equal(neutral, plain)


def _add_check(device, a, b, c_og, out, alpha, beta, atol):
    ref = alpha * (a.float() @ b.float()) + beta * c_og.float()
    pt = alpha * _mm_lowp(device, a, b) + beta * c_og  # torch in bf16, as the source's reference
    _within_2x(out, ref, pt, atol)


# Dao-AILab/quack tests/test_linear.py::test_gemm_add_inplace (is_concat_layout_out=False: concat layouts are
# quack's)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [960, 1920])
@pytest.mark.parametrize("k,n", [(736, 1504), (736, 2048), (1024, 1504), (1024, 2048)])
def test_gemm_add_inplace(device, m, k, n):
    _cpu_small(device, m != 960, (k, n) != (736, 1504))
    torch.manual_seed(0)
    a = torch.randn(m, k, device=device, dtype=BF)
    b = torch.randn(k, n, device=device, dtype=BF) / math.sqrt(k)
    c = torch.randn(m, n, device=device, dtype=BF)
    c_og = c.clone()
    assert run(device, cutegemm.gemm, a, b, out=c, c=c, beta=1.0) is c
    _add_check(device, a, b, c_og, c, 1.0, 1.0, 1e-5)


# Dao-AILab/quack tests/test_linear.py::test_gemm_add_inplace_alpha_beta (float alpha / beta; tensor ones:
# test_linear_act_not_supported)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m,k,n", [(480, 256, 512), (960, 768, 1024)])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0, 1.5])
@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0])
def test_gemm_add_inplace_alpha_beta(device, alpha, beta, m, k, n):
    _cpu_small(device, m != 480)
    torch.manual_seed(42)
    a = torch.randn(m, k, device=device, dtype=BF)
    b = torch.randn(k, n, device=device, dtype=BF) / math.sqrt(k)
    c = torch.randn(m, n, device=device, dtype=BF)
    c_og = c.clone()
    run(device, cutegemm.gemm, a, b, out=c, c=c, alpha=alpha, beta=beta)
    _add_check(device, a, b, c_og, c, alpha, beta, 1e-4)


# Dao-AILab/quack tests/test_linear.py::test_gemm_add_out_reuses_c_storage (alpha as a float)
@pytest.mark.parametrize("device", DEVICES)
def test_gemm_add_out_reuses_c_storage(device):
    torch.manual_seed(123)
    m, k, n = 960, 736, 1504
    a = torch.randn(m, k, device=device, dtype=BF)
    b = torch.randn(k, n, device=device, dtype=BF)
    c = torch.randn(m, n, device=device, dtype=BF)
    c_og = c.clone()
    out = run(device, cutegemm.gemm, a, b, c=c, out=c, alpha=0.5, beta=1.0)
    assert out is c
    _add_check(device, a, b, c_og, c, 0.5, 1.0, 1e-5)


def _swiglu_oai(gate, up):
    """gpt-oss's clamped form (its model code: alpha 1.702, limit 7), which cutegemm's swiglu_oai
    computes; quack's swiglu_oai has no clamp (the same function where |gate|, |up| < 7)."""
    g = gate.clamp(max=7.0)
    return g * torch.sigmoid(1.702 * g) * (up.clamp(-7.0, 7.0) + 1)


# quack's gated activations (its gated_to_pytorch_fn_map) and cutegemm's names for them; quack's "geglu"
# is the tanh GELU (cutegemm: "geglu_tanh"; cutegemm's "geglu" is the erf GELU, torch's default)
GATED_ACT = {"swiglu": ("swiglu", lambda g, u: F.silu(g) * u), "reglu": ("reglu", lambda g, u: F.relu(g) * u),
             "glu": ("glu", lambda g, u: torch.sigmoid(g) * u),
             "geglu": ("geglu_tanh", lambda g, u: F.gelu(g, approximate="tanh") * u),
             "swiglu_oai": ("swiglu_oai", _swiglu_oai)}  # fmt: skip


# Dao-AILab/quack tests/test_linear.py::test_gemm_gated (gate / up interleaved as quack stores them;
# store_preact and concat layouts are quack's)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("in_features", [736, 4096])
@pytest.mark.parametrize("out_features", [1504, 2048])
@pytest.mark.parametrize("bias_dtype", [None, torch.float32, BF])
@pytest.mark.parametrize("activation", list(GATED_ACT))
def test_gemm_gated(device, activation, bias_dtype, out_features, in_features):
    _cpu_small(device, in_features != 736, out_features != 1504)
    if device == "cuda" and activation != "swiglu" and (in_features, out_features) != (736, 1504):
        pytest.skip("the other gated activations at the source's smallest shape only (compile time)")
    ours_name, gate_act = GATED_ACT[activation]
    torch.manual_seed(0)
    x = torch.randn(1920, in_features, device=device, dtype=BF)[::2]
    w = torch.randn(2 * out_features, in_features, device=device, dtype=BF) / math.sqrt(in_features)
    bias = torch.randn(2 * out_features, device=device, dtype=bias_dtype) if bias_dtype is not None else None
    postact = run(device, cutegemm.gemm, x, w.T, bias=bias, activation=ours_name)
    assert postact.shape == (x.shape[0], out_features)

    def gated(pre):
        return gate_act(pre[..., ::2], pre[..., 1::2])

    pre_ref = x.float() @ w.float().T + (0 if bias is None else bias.float())
    pre_pt = _mm_lowp(device, x, w.T)
    pre_pt = pre_pt if bias is None else pre_pt + bias
    _within_2x(postact, gated(pre_ref), gated(pre_pt).to(BF), 1e-6)


def _varlen_inputs(device, groups, k, n, b_major, seq=(8192 - 1024, 8192 + 1024)):
    seq_lens = torch.randint(*seq, (groups,), device=device)
    cu = torch.cat([torch.zeros(1, dtype=torch.int32, device=device), seq_lens.cumsum(0).to(torch.int32)])
    a = torch.randn(int(cu[-1]), k, device=device, dtype=BF)
    b = torch.randn(groups, k, n, device=device, dtype=BF) / math.sqrt(k)
    if b_major == "k":
        b = b.permute(0, 2, 1).contiguous().permute(0, 2, 1)
    return a, b, cu


def _varlen_ref(a, b, cu, alpha, bias, lowp):
    rows = []
    for g in range(b.shape[0]):
        s, e = int(cu[g]), int(cu[g + 1])
        y = (lowp(a[s:e], b[g]) if lowp else a[s:e].float() @ b[g].float()).float() * alpha
        rows.append(y if bias is None else y + bias[g])
    return torch.cat(rows)


# Dao-AILab/quack tests/test_linear_varlen_m.py::test_gemm_varlen_m: quack's varlen_m is the packed grouped form
# (cu_seqlens_m = [0, *offs]); gather_A (generate_A_with_gather: A has twice the rows, A_idx a random int32
# selection) is cutegemm's gather_index; tensor alpha is quack's (below); dynamic_scheduler is its config
@VARLEN
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pre_allocate_out", [False, True])
@pytest.mark.parametrize("gather_a", [False, True])
@pytest.mark.parametrize("has_bias", [False, True])
@pytest.mark.parametrize("alpha", [1.0, 1.7])
@pytest.mark.parametrize("b_major", ["k", "n"])
@pytest.mark.parametrize("n", [1504, 2048, 4096])
@pytest.mark.parametrize("k", [736, 1024, 8192])
@pytest.mark.parametrize("groups", [3, 5])
def test_gemm_varlen_m(device, groups, k, n, b_major, alpha, has_bias, gather_a, pre_allocate_out):
    # cpu: the smallest shapes, and K = 1024 too (a multiple of 64: the gather kernel's route)
    _cpu_small(device, groups != 3, k not in (736, 1024), n != 1504)
    torch.manual_seed(0)
    seq = (8192 - 1024, 8192 + 1024) if device == "cuda" else (96, 320)  # cpu: the rows of the tma-gather case
    a, b, cu = _varlen_inputs(device, groups, k, n, b_major, seq)
    total, opts = a.shape[0], {}
    if gather_a:
        src = torch.randn(2 * total, k, device=device, dtype=BF)
        opts["gather_index"] = torch.randperm(2 * total, device=device, dtype=torch.int32)[:total]
        a = src[opts["gather_index"].long()]  # what the reference multiplies
    bias = torch.randn(groups, n, device=device) if has_bias else None
    out_buf = torch.empty(total, n, device=device, dtype=BF) if pre_allocate_out else None
    out = run(device, cutegemm.grouped_gemm, src if gather_a else a, b, offs=cu[1:], out=out_buf, bias=bias, alpha=alpha,
              **opts)  # fmt: skip
    if pre_allocate_out:
        assert out is out_buf
    assert out.shape == (total, n)
    ref = _varlen_ref(a, b, cu, alpha, bias, None)
    pt = _varlen_ref(a, b, cu, alpha, bias, lambda x, w: _mm_lowp(device, x, w)).to(BF)
    _within_2x(out, ref, pt, 1e-5)


# Dao-AILab/quack tests/test_linear_varlen_m.py::test_gemm_add_varlen_m / ::test_gemm_add_inplace_varlen_m /
# ::test_gemm_act_varlen_m (beta * C in the grouped form); quack's A_idx keyword (cutegemm: gather_index)
@VARLEN
@pytest.mark.unsupported
@pytest.mark.parametrize("kwargs,match", [({"A_idx": torch.arange(8, dtype=torch.int32)}, "A_idx"),
                                          ({"c": torch.zeros(8, 16, dtype=BF), "beta": 1.0}, "argument .c.")],
                         ids=["A_idx-keyword", "beta-C"])  # fmt: skip
def test_gemm_varlen_m_not_supported(kwargs, match):
    a, b = torch.randn(8, 32, dtype=BF), torch.randn(2, 32, 16, dtype=BF)
    with pytest.raises(TypeError, match=match):
        run("cpu", cutegemm.grouped_gemm, a, b, offs=torch.tensor([3, 8], dtype=torch.int32), **kwargs)
