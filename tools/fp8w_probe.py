"""MXFP8 (e4m3) weights on the FP4-weight ring (``Fp4WeightConfig(fmt="mxfp8")``), H200: a quick
correctness smoke, then decode-to-prefill timings. Per case, one process, same operands, write
flush, best of ROUNDS interleaved L2-cold medians of 30, µs:

- ``base``: cuBLAS ``x @ w16.T`` / ``torch._grouped_mm`` on the weight dequantized beforehand;
- ``ring``: ``gemm_fp4_weight(x, qw)`` with the policy's ring config for the rows;
- ``ring <shape>``: other ring shapes;
- ``mx``: ``cutegemm.gemm(qa, qw)`` / ``grouped_gemm`` with MXFP8 activations as the library routes it;
- ``scaled_mm``: ``torch._scaled_mm`` row-wise FP8 (another recipe; the same weight bytes);
- ``read``: torch reading the weight bytes once.

    python tools/fp8w_probe.py [ROUNDS] [--smoke] [--list] [--policy] [--policy-list]
"""

import sys
from dataclasses import replace

import torch
from probe_common import quantized_moe, report_vs_base

import cutegemm
from cutegemm.benchmarks import Timer, _moe_counts
from cutegemm.blockscaled import fp4_weight_api as api
from cutegemm.blockscaled.dequant import dequantize_checked
from cutegemm.gemm.api import gemm
from cutegemm.grouped.api import grouped_gemm

DENSE = [(m, 28672, 4096) for m in (1, 16, 32, 64, 128, 256, 512)] + [(m, 8192, 8192) for m in (1, 16, 64)]
GROUPED = ((32, 16), (32, 64), (32, 256))  # (E, mean tokens per expert); N 4096, K 7168


def wg(cfg, n_tiles, ring, split=None):
    """The WGMMA consumers (sm_90a) for ``cfg``'s call."""
    split = (not cfg.grouped) if split is None else split
    return replace(cfg, n_tiles=n_tiles, ring=ring, ring_k=4, warps_n=8, warps_k=1, row_tiles=1, wgmma=True,
                   producer_pairs=False, split=split)  # fmt: skip


def mma(cfg, **kw):
    """The mma.sync consumers for ``cfg``'s call."""
    base = dict(ring=4, ring_k=2, warps_n=8, warps_k=1, row_tiles=1, wgmma=False, producer_wg=False)
    return replace(cfg, **{**base, **kw})


def shapes(cfg, rows):
    """Other configs beside the policy's for ``rows`` (per expert when grouped)."""
    out = {}
    if rows <= 32:
        out["w4x2"] = mma(cfg, warps_n=4, warps_k=2, row_tiles=2, n_tiles=cfg.n_tiles)
        out["wg t32"] = wg(cfg, 4, 4)
        if not cfg.grouped:
            out["split"] = replace(cfg, split=True)
    else:
        out["mma t32"] = mma(cfg, n_tiles=4, split=not cfg.grouped)
        out["wg t64 r2"] = wg(cfg, 8, 2)
        if rows >= 128:
            out["wg t128 r2"] = wg(cfg, 16, 2)
        if not cfg.grouped:
            out["wg t64 nosplit"] = wg(cfg, 8, 3, split=False)
    return out


def smoke():
    """Kernel vs the fp32 reference on awkward shapes (K tails, rows past N, NaN weights, big and
    tiny scales, empty experts); raises on a mismatch."""
    torch.manual_seed(1)
    for m, n, k in ((1, 128, 64), (5, 200, 48), (16, 384, 4096 + 16), (33, 130, 272), (64, 256, 1024), (200, 512, 512)):
        w = torch.randn(n, k, device="cuda") * torch.exp2(torch.randint(-20, 20, (n, 1), device="cuda").float())
        qw = cutegemm.quantize(w.to(torch.bfloat16), "mxfp8")
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        cfg = api.pick_config(m, "mxfp8", torch.float32, "sm_90a", False)
        got = api.gemm_fp4_weight(x, qw, out_dtype=torch.float32, config=cfg)
        ref = api.gemm_fp4_weight_ref(x, qw, out_dtype=torch.float32)
        err = ((got - ref).abs() / (ref.abs() + 1e-30 + ref.abs().amax(1, keepdim=True) * 1e-3)).max().item()
        print(f"smoke dense {m}x{n}x{k} {cfg.name}: max rel err {err:.3g}", flush=True)
        assert err < 1e-3, err
    # NaN weights: every output of the row is NaN, others finite
    w = torch.randn(256, 512, device="cuda")
    qw = cutegemm.quantize(w.to(torch.bfloat16), "mxfp8")
    qw.data.view(torch.uint8)[7, 300] = 0x7F
    qw.data.view(torch.uint8)[130, 5] = 0xFF
    x = torch.randn(9, 512, device="cuda", dtype=torch.bfloat16)
    got = api.gemm_fp4_weight(x, qw, out_dtype=torch.float32)
    nan_cols = torch.isnan(got).all(0).nonzero().flatten().tolist()
    print("smoke NaN columns", nan_cols, "other NaN", torch.isnan(got).sum().item() - 18, flush=True)
    assert nan_cols == [7, 130] and torch.isnan(got).sum().item() == 18
    # grouped, empty experts
    counts = [0, 5, 0, 40, 1, 0]
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    w = torch.randn(len(counts), 300, 256, device="cuda")
    qw = cutegemm.quantize(w.to(torch.bfloat16), "mxfp8")
    x = torch.randn(sum(counts) + 3, 256, device="cuda", dtype=torch.bfloat16)
    out = torch.full((x.shape[0], 300), float("nan"), device="cuda")
    api.gemm_fp4_weight(x, qw, offs=offs, out=out, out_dtype=torch.float32)
    ref = api.gemm_fp4_weight_ref(x, qw, offs=offs, out_dtype=torch.float32)
    t = sum(counts)
    err = (out[:t] - ref[:t]).abs().max().item() / ref[:t].abs().max().item()
    print(f"smoke grouped: rel err {err:.3g}, rows past offs still NaN: {torch.isnan(out[t:]).all().item()}", flush=True)
    assert err < 1e-3 and torch.isnan(out[t:]).all()


def main(rounds: int):
    timer = Timer()
    torch.manual_seed(0)
    for m, n, k in DENSE:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        qw = cutegemm.quantize(w, "mxfp8")
        w16 = dequantize_checked(qw)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        qa = cutegemm.quantize(x, "mxfp8")
        x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        sa, sb = torch.ones(m, 1, device="cuda"), torch.ones(1, n, device="cuda")
        cfg = api.pick_config(m, "mxfp8", torch.bfloat16, "sm_90a", False)
        runs = {
            "base": lambda x=x, w16=w16: x @ w16.T,
            "ring": lambda x=x, qw=qw, c=cfg: api.gemm_fp4_weight(x, qw, config=c),
            "mx": lambda qa=qa, qw=qw: cutegemm.gemm(qa, qw),
            "scaled_mm": lambda x8=x8, w8=w8, sa=sa, sb=sb: torch._scaled_mm(x8, w8.t(), sa, sb, out_dtype=torch.bfloat16),
            "read": lambda d=qw.data.view(torch.float32): d.sum(),
        }
        for name, c in shapes(cfg, m).items():
            runs[name] = lambda x=x, qw=qw, c=c: api.gemm_fp4_weight(x, qw, config=c)
        if m >= 128:
            runs["dq"] = lambda x=x, qw=qw: gemm(x, dequantize_checked(qw).mT)
        report(f"mxfp8 dense {m}x{n}x{k} ({cfg.name})", runs, timer, rounds, 2.0 * m * n * k)
    for e, tok in GROUPED:
        n, k = 4096, 7168
        counts, offs, qw, w16, x = quantized_moe(e, tok, n, k, "mxfp8")
        qa = cutegemm.quantize(x, "mxfp8")
        cfg = api.pick_config(sum(counts), "mxfp8", torch.bfloat16, "sm_90a", True, e)
        runs = {
            "base": lambda x=x, w16=w16, offs=offs: torch._grouped_mm(x, w16.transpose(1, 2), offs=offs),
            "ring": lambda x=x, qw=qw, offs=offs, c=cfg: api.gemm_fp4_weight(x, qw, offs=offs, config=c),
            "mx": lambda qa=qa, qw=qw, offs=offs: cutegemm.grouped_gemm(qa, qw, offs=offs),
            "read": lambda d=qw.data.view(torch.float32): d.sum(),
        }
        for name, c in shapes(cfg, tok).items():
            runs[name] = lambda x=x, qw=qw, offs=offs, c=c: api.gemm_fp4_weight(x, qw, offs=offs, config=c)
        if tok >= 128:
            runs["dq"] = lambda x=x, qw=qw, offs=offs: grouped_gemm(x, dequantize_checked(qw).transpose(1, 2), offs=offs)
        report(f"mxfp8 grouped E{e} x ~{tok} N{n} K{k} ({cfg.name})", runs, timer, rounds, 2.0 * sum(counts) * n * k)
        del w16


POLICY_DENSE = [(1, 8192, 8192), (16, 8192, 8192), (64, 8192, 8192), (128, 28672, 4096), (300, 28672, 4096),
                (400, 28672, 4096)]  # fmt: skip


def policy_check(rounds: int):
    """The committed policy (no config) on the shapes its rules came from, and FP4 weights with
    few weight tiles: their policy (one CTA per tile) vs the split grid."""
    timer = Timer()
    torch.manual_seed(0)
    for m, n, k in POLICY_DENSE:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        qw = cutegemm.quantize(w, "mxfp8")
        w16 = dequantize_checked(qw)
        qa = cutegemm.quantize(x, "mxfp8")
        runs = {
            "base": lambda x=x, w16=w16: x @ w16.T,
            "policy": lambda x=x, qw=qw: cutegemm.gemm(x, qw),
            "mx": lambda qa=qa, qw=qw: cutegemm.gemm(qa, qw),
            "read": lambda d=qw.data.view(torch.float32): d.sum(),
        }
        if n == 8192 and m <= 16:
            for fmt in ("nvfp4", "mxfp4"):
                q4 = cutegemm.quantize(w, fmt)
                c4 = api.pick_config(m, fmt, torch.bfloat16, "sm_90a", False)
                runs[f"{fmt}"] = lambda x=x, q=q4, c=c4: api.gemm_fp4_weight(x, q, config=c)
                runs[f"{fmt} split"] = lambda x=x, q=q4, c=replace(c4, split=True): api.gemm_fp4_weight(x, q, config=c)
                wg4 = replace(c4, n_tiles=4, ring=4, ring_k=2, warps_n=8, warps_k=1, row_tiles=1, wgmma=True,
                              producer_pairs=False, split=True)  # fmt: skip
                runs[f"{fmt} wg t32 split"] = lambda x=x, q=q4, c=wg4: api.gemm_fp4_weight(x, q, config=c)
        report(f"policy mxfp8 dense {m}x{n}x{k}", runs, timer, rounds, 2.0 * m * n * k)


def fp4_few_configs():
    """FP4 weights with few weight tiles (N=K=8192) at 17..32 rows: the policy (sm_90a: WGMMA, 32
    tokens, split) against the same without split and the mma.sync split grid."""
    out = {}
    for fmt in ("nvfp4", "mxfp4"):
        for m in (24, 32):
            pol = api.pick_config(m, fmt, torch.bfloat16, "sm_90a", False, 1, few_tiles=True)
            out[(fmt, m)] = {"policy": pol, "wg nosplit": replace(pol, split=False),
                             "mma split": api.pick_config(m, fmt, torch.bfloat16, "sm_100a", False, 1, few_tiles=True)}
    for cs in out.values():
        cs["mma split"] = replace(cs["mma split"], arch="sm_90a")
    return out


def fp4_few(rounds: int):
    timer = Timer()
    torch.manual_seed(0)
    w = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for (fmt, m), cs in fp4_few_configs().items():
        qw = cutegemm.quantize(w, fmt)
        w16 = dequantize_checked(qw)
        x = torch.randn(m, 8192, device="cuda", dtype=torch.bfloat16)
        runs = {"base": lambda x=x, w16=w16: x @ w16.T}
        for name, c in cs.items():
            runs[name] = lambda x=x, qw=qw, c=c: api.gemm_fp4_weight(x, qw, config=c)
        report(f"{fmt} dense {m}x8192x8192 (few tiles)", runs, timer, rounds, 2.0 * m * 8192 * 8192)


def t128_configs():
    """Dense MXFP8 weights from 97 rows: WGMMA 128 tokens per pass with and without the split grid
    (with it the split finish spills registers), 64 tokens split."""
    out = {}
    for m, n in ((128, 28672), (256, 28672), (128, 8192), (256, 8192)):
        c = api.pick_config(m, "mxfp8", torch.bfloat16, "sm_90a", False, 1)
        out[(m, n)] = {"t128 split": replace(c, n_tiles=16, ring=2, split=True),
                       "t128 nosplit": replace(c, n_tiles=16, ring=2, split=False),
                       "t64 split": replace(c, n_tiles=8, ring=3, split=True)}
    return out


def t128(rounds: int):
    timer = Timer()
    torch.manual_seed(0)
    for (m, n), cs in t128_configs().items():
        k = 4096 if n == 28672 else 8192
        qw = cutegemm.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), "mxfp8")
        w16 = dequantize_checked(qw)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        runs = {"base": lambda x=x, w16=w16: x @ w16.T}
        for name, c in cs.items():
            runs[name] = lambda x=x, qw=qw, c=c: api.gemm_fp4_weight(x, qw, config=c)
        report(f"mxfp8 dense {m}x{n}x{k}", runs, timer, rounds, 2.0 * m * n * k)


def policy_configs():
    out = []
    for m, n, _k in POLICY_DENSE:
        if n == 8192 and m <= 16:
            for fmt in ("nvfp4", "mxfp4"):
                c4 = api.pick_config(m, fmt, torch.bfloat16, "sm_90a", False)
                out += [c4, replace(c4, split=True), replace(c4, n_tiles=4, ring=4, ring_k=2, warps_n=8, warps_k=1,
                                                            row_tiles=1, wgmma=True, producer_pairs=False, split=True)]  # fmt: skip
        out.append(api.pick_config(m, "mxfp8", torch.bfloat16, "sm_90a", False, few_tiles=n == 8192))
    return out


def report(tag, runs, timer, rounds, flops):
    report_vs_base(tag, runs, timer, rounds, flops, unchecked=("base", "read", "scaled_mm"))


if __name__ == "__main__":
    if "--list" in sys.argv:
        for m, _n, _k in DENSE:
            cfg = api.pick_config(m, "mxfp8", torch.bfloat16, "sm_90a", False)
            for c in (cfg, *shapes(cfg, m).values()):
                print(repr(c))
        for e, tok in GROUPED:
            cfg = api.pick_config(sum(_moe_counts(e, tok)), "mxfp8", torch.bfloat16, "sm_90a", True, e)
            for c in (cfg, *shapes(cfg, tok).values()):
                print(repr(c))
        from cutegemm.epilogue import EpilogueSpec
        from cutegemm.gemm.config import GemmProblem
        from cutegemm.gemm.policy import policy_for

        pol = policy_for("sm_90a", 132)  # the bf16 GEMMs of the dq runs and the dequantize-first routes
        for m, n, k in DENSE:
            print(repr(pol.choose_dense(GemmProblem(m, n, k, 1, "bf16", "bf16", "bf16", "k", "k"))))
        for e, tok in GROUPED:
            p = GemmProblem(sum(_moe_counts(e, tok)), 4096, 7168, 1, "bf16", "bf16", "bf16", "k", "k")
            print(repr(pol.choose_grouped(p, e, epilogue=EpilogueSpec())))
        for m in (1, 5, 9, 16, 33, 64, 200):
            print(repr(api.pick_config(m, "mxfp8", torch.float32, "sm_90a", False)))
            print(repr(api.pick_config(m, "mxfp8", torch.bfloat16, "sm_90a", False)))
        print(repr(api.pick_config(49, "mxfp8", torch.float32, "sm_90a", True, 6)))
    elif "--policy-list" in sys.argv:
        for c in policy_configs():
            print(repr(c))
        for cs in fp4_few_configs().values():
            for c in cs.values():
                print(repr(c))
    elif "--t128-list" in sys.argv:
        for cs in t128_configs().values():
            for c in cs.values():
                print(repr(c))
    elif "--t128" in sys.argv:
        t128(int(sys.argv[1]) if sys.argv[1].isdigit() else 2)
    elif "--fp4-few" in sys.argv:
        fp4_few(int(sys.argv[1]) if sys.argv[1].isdigit() else 2)
    elif "--policy" in sys.argv:
        policy_check(int(sys.argv[1]) if sys.argv[1].isdigit() else 2)
    elif "--smoke" in sys.argv:
        smoke()
    else:
        if "--no-smoke" not in sys.argv:
            smoke()
        main(int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 2)
