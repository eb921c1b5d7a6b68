"""Benchmarks of the scaled and quantized families (FP8 row-wise and block-scaled, MXFP8, FP4 x
FP4, FP4 weights, quantized-output epilogues): ours vs torch in one process, same inputs, with the
L2-cold timer and the table rows of :mod:`cutegemm.bench.core` (dense, grouped bf16, K-grouped
and list forms live there)."""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F

from ..api import dequantize, gemm, gemm_ref, grouped_gemm, grouped_gemm_ref, quantize
from ..blockscaled import mx_sm90
from ..blockscaled.reference import dequantize_ref, e8m0_to_float, quantize_ref
from ..blockscaled.weight_only import launch as weight_only
from ..config import GemmProblem, can_implement
from ..grouped.packed import PLANS
from ..policy import policy_for
from ..runtime.device import device_info
from ..runtime.timer import Timer
from .core import Row, dense_inputs, format_row, moe_counts


def bench_grouped_fp8(shapes=((32, 512, 4096, 7168),), reps=20, configs=None):
    """FP8 row-wise grouped GEMM (scale_a per token row, scale_b per expert and column) vs
    ``torch._scaled_grouped_mm`` (same inputs, same run); our policy config and ``configs``
    overrides (dicts) beside it. Promoted configs are compared with torch's default
    (``use_fast_accum=False``), ``fast_accum`` configs with ``use_fast_accum=True``."""
    timer = Timer()
    rows = []
    for e, tok, n, k in shapes:
        counts = moe_counts(e, tok)
        total = sum(counts)
        torch.manual_seed(0)
        a = torch.randn(total, k, device="cuda").to(torch.float8_e4m3fn)
        w = torch.randn(e, n, k, device="cuda").to(torch.float8_e4m3fn)
        b = w.transpose(1, 2)
        sa = torch.rand(total, device="cuda") * 0.1 + 0.01
        sb = torch.rand(e, n, device="cuda") * 0.1 + 0.01
        offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
        flops = 2.0 * total * n * k

        def run_torch(a=a, b=b, sa=sa, sb=sb, offs=offs, fast=False):
            return torch._scaled_grouped_mm(a, b, sa, sb, offs=offs, out_dtype=torch.bfloat16, use_fast_accum=fast)

        def ours(cfg=None, fast=False, a=a, b=b, sa=sa, sb=sb, offs=offs):
            return grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb, config=cfg, fast_accum=fast)

        torch_t = {}
        for fast in (False, True):
            try:
                torch_t[fast] = timer(lambda fast=fast: run_torch(fast=fast), reps)
                print(f"torch._scaled_grouped_mm use_fast_accum={fast}: {flops / torch_t[fast] / 1e9:.1f} TFLOP/s",
                      flush=True)  # fmt: skip
            except Exception as exc:
                print(f"torch._scaled_grouped_mm (use_fast_accum={fast}) unavailable: {type(exc).__name__}: "
                      f"{str(exc)[:200]}", flush=True)  # fmt: skip
                torch_t[fast] = float("nan")
        out = ours()

        # this call's plan: the policy's (config None) for these operands, not a block-scaled
        # plan of the same shapes another benchmark of this process may have cached
        base = next(p.config for key, p in PLANS.items()
                    if key[0] == a.shape and key[2] == b.shape and key[4] == a.dtype and key[-1] is None
                    and not p.config.fp8_blockwise)  # fmt: skip
        ref = None
        try:
            ref = run_torch()
        except Exception:
            pass
        for cfg in [None] + [replace(base, **c) for c in (configs or [])]:
            try:
                fast = cfg is not None and cfg.fast_accum
                o = ours(cfg, fast)
                t = timer(lambda cfg=cfg, fast=fast: ours(cfg, fast), reps)
            except Exception as exc:
                print(f"   {(cfg or base).name}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                continue
            diff = float("nan") if ref is None else (o.float() - ref.float()).abs().max().item()
            tt = torch_t[fast]  # the same accumulation mode
            row = Row(f"FP8 rowwise E{e}x{tok}tok N{n} K{k}{' fast_accum' if fast else ''}", t, tt, flops / t / 1e9,
                      flops / tt / 1e9, tt / t, (cfg or base).name, diff, 0.0)  # fmt: skip
            rows.append(row)
            print(format_row(row) + " (err = max |ours - torch|)", flush=True)
        del out
    return rows


def bench_epilogue_quant(m=8192, n_out=4096, k=8192, reps=20):
    """Issue-3 benchmark: ``gemm + swiglu + MXFP8 output`` (B has 2 x n_out interleaved gate/up
    columns) against (a) our plain bf16 GEMM of the same shape, (b) cuBLAS of the same shape, and
    (c) the torch chain ``matmul -> silu(gate) * up -> quantize_ref``. Prints and returns rows."""
    timer = Timer()
    a, b = dense_inputs(m, 2 * n_out, k, torch.bfloat16)
    flops = 2.0 * m * 2 * n_out * k

    def torch_chain():
        y = torch.matmul(a, b)
        h = torch.nn.functional.silu(y[:, 0::2].float()) * y[:, 1::2].float()
        return quantize_ref(h, "mxfp8")

    cases = {
        "ours swiglu+mxfp8": lambda: gemm(a, b, activation="swiglu", out_dtype="mxfp8"),
        "ours plain bf16": lambda: gemm(a, b),
        "ours swiglu bf16": lambda: gemm(a, b, activation="swiglu"),
        "torch.matmul bf16": lambda: torch.matmul(a, b),
        "torch chain (matmul, silu*up, quantize_ref)": torch_chain,
    }
    times = {name: timer(f, reps) for name, f in cases.items()}
    base = times["ours plain bf16"]
    rows = []
    for name, t in times.items():
        line = f"{name:>45} | {t:8.4f} ms | {flops / t / 1e9:7.1f} TFLOP/s | {t / base:5.3f}x our plain GEMM time"
        print(line, flush=True)
        rows.append({"case": name, "ms": t, "tflops": flops / t / 1e9, "vs_plain": t / base})
    chain = times["torch chain (matmul, silu*up, quantize_ref)"] / times["ours swiglu+mxfp8"]
    print(f"fused swiglu+mxfp8 is {chain:.2f}x faster than the torch chain; "
          f"{times['ours swiglu+mxfp8'] / base:.3f}x our plain bf16 GEMM", flush=True)  # fmt: skip
    return rows


FP8_SHAPES = [(8192, 8192, 8192), (16384, 7168, 2048), (4096, 4096, 4096), (128, 7168, 2048)]


def bench_fp8(shapes=FP8_SHAPES, reps=20, configs=None):
    """FP8 e4m3 with row-wise fp32 scales vs ``torch._scaled_mm`` (row-wise), same inputs, same
    run. Promoted configs (accurate) are compared with torch's default, ``fast_accum`` configs with
    torch's ``use_fast_accum=True``. ``configs``: GemmConfig overrides (dicts) timed beside the
    policy's choice."""

    timer = Timer()
    arch, sms = device_info(torch.cuda.current_device())
    rows = []
    for m, n, k in shapes:
        torch.manual_seed(0)
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
        sa = torch.rand(m, 1, device="cuda") + 0.5
        sb = torch.rand(1, n, device="cuda") + 0.5
        ref = (a.double() @ b.double()) * sa.double() * sb.double()
        flops = 2.0 * m * n * k
        torch_t, torch_err = {}, {}
        for fast in (False, True):

            def run_torch(a=a, b=b, sa=sa, sb=sb, fast=fast):
                return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast)

            torch_err[fast] = (run_torch().double() - ref).abs().max().item()
            torch_t[fast] = timer(run_torch, reps)
            print(f"{m}x{n}x{k}: torch._scaled_mm fast_accum={fast}: {flops / torch_t[fast] / 1e9:.1f} TFLOP/s, "
                  f"max err {torch_err[fast]:.3g}", flush=True)  # fmt: skip
        default = policy_for(arch, sms).choose_dense(GemmProblem(m, n, k, 1, "e4m3", "e4m3", "bf16", "k", "k"))
        for cfg, name, t, err in _fp8_candidates(timer, reps, a, b, sa, sb, ref, default, configs):
            fast = bool(cfg is not None and cfg.fast_accum)
            tt = torch_t[fast]
            row = Row(f"{m}x{n}x{k}", t, tt, flops / t / 1e9, flops / tt / 1e9, tt / t, name, err, torch_err[fast])
            rows.append(row)
            print(format_row(row), flush=True)
    return rows


def _fp8_candidates(timer, reps, a, b, sa, sb, ref, default, configs):
    """[(config or None, name, ms, max err)] of ``gemm(a, b, scale_a=sa, scale_b=sb)`` with the
    policy's config (None) and each override of ``default`` in ``configs`` (dicts); a candidate
    that is not implementable or fails is reported and left out."""
    out = []
    for cfg in [None] + [replace(default, **c) for c in (configs or [])]:
        if cfg is not None and not can_implement(cfg)[0]:
            print(f"   {cfg.name}: skipped ({can_implement(cfg)[1]})", flush=True)
            continue
        try:
            o = gemm(a, b, scale_a=sa, scale_b=sb, config=cfg)
            err = (o.double() - ref).abs().max().item()
            t = timer(lambda cfg=cfg: gemm(a, b, scale_a=sa, scale_b=sb, config=cfg), reps)
        except Exception as exc:  # a candidate that fails is reported, not fatal
            print(f"   {(cfg or default).name}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        out.append((cfg, (cfg or default).name + ("" if cfg is not None else " (policy)"), t, err))
    return out


def bench_fp8_blockwise(shapes=((8192, 8192, 8192),), reps=20, configs=None):
    """DeepSeek-style FP8 block scaling (1x128 scales of A, 128x128 of B) vs torch in one run,
    same inputs: torch's blockwise ``torch._scaled_mm`` (cuBLAS; the same recipe) when this torch
    runs it on this GPU, else (reported as such) torch._scaled_mm row-wise; plain bf16 cuBLAS
    (torch.matmul) is printed beside. ``configs``: GemmConfig overrides (dicts, e.g.
    ``dict(tile_n=64)``) timed beside the policy's choice. Returns Rows (torch_ms: the blockwise
    baseline when available)."""

    timer = Timer()
    arch, sms = device_info(torch.cuda.current_device())
    rows = []
    for m, n, k in shapes:
        torch.manual_seed(0)
        kb, nb = -(-k // 128), -(-n // 128)
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
        sa = torch.rand(m, kb, device="cuda") + 0.5  # (M, K/128)
        sb = torch.rand(kb, nb, device="cuda") + 0.5  # (K/128, N/128)
        ref = gemm_ref(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float64, compute_dtype=torch.float64)
        flops = 2.0 * m * n * k
        case = f"{m}x{n}x{k} blockwise"

        def torch_blockwise(a=a, b=b, sa=sa.t().contiguous().t(), sb=sb.t().contiguous().t()):
            return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)

        try:
            base_err = (torch_blockwise().double() - ref).abs().max().item()
            base_t, base_name = timer(torch_blockwise, reps), "torch blockwise _scaled_mm"
        except (RuntimeError, NotImplementedError, ValueError, TypeError) as exc:
            print(f"{case}: torch blockwise _scaled_mm unavailable ({type(exc).__name__}: {str(exc)[:200]})")
            ra, rb = torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5

            def torch_rowwise(a=a, b=b, ra=ra, rb=rb):
                return torch._scaled_mm(a, b, scale_a=ra, scale_b=rb, out_dtype=torch.bfloat16)

            base_err = float("nan")  # a different recipe: its error is not comparable
            base_t, base_name = timer(torch_rowwise, reps), "torch row-wise _scaled_mm (other recipe)"
        print(f"{case}: {base_name}: {flops / base_t / 1e9:.1f} TFLOP/s, max err {base_err:.3g}", flush=True)
        a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)
        t16 = timer(lambda a16=a16, b16=b16: torch.matmul(a16, b16), reps)
        print(f"{case}: torch.matmul bf16 (cuBLAS): {flops / t16 / 1e9:.1f} TFLOP/s", flush=True)
        del a16, b16
        p = GemmProblem(m, n, k, 1, "e4m3", "e4m3", "bf16", "k", "k")
        default = policy_for(arch, sms).choose_dense(p, fp8_blockwise=True)
        # ours gets torch's layouts too (M-major scale_a, column-major scale_b): no copies
        sa_m, sb_m = sa.t().contiguous().t(), sb.t().contiguous().t()
        for _, name, t, err in _fp8_candidates(timer, reps, a, b, sa_m, sb_m, ref, default, configs):
            row = Row(case, t, base_t, flops / t / 1e9, flops / base_t / 1e9, base_t / t, name, err, base_err)
            rows.append(row)
            print(format_row(row) + f" | vs bf16 cuBLAS {t16 / t:.3f}x", flush=True)
    return rows


def bench_grouped_fp8_blockwise(shapes=((32, 512, 4096, 7168), (32, 512, 7168, 2048)), reps=20, configs=None):
    """Grouped DeepSeek FP8 block scaling (scale_a (total_M, K/128), scale_b (E, K/128, N/128)) on
    MoE shapes (E, mean tokens, N, K), same operands, same run, against what torch offers: a loop
    of torch's blockwise ``torch._scaled_mm`` over the experts (the same recipe; one launch per
    expert, host-synced counts), ``torch._scaled_grouped_mm`` row-wise (one launch, a coarser
    recipe: per-token x per-(expert, column) scales) and ``torch._grouped_mm`` bf16. ``configs``:
    GemmConfig override dicts timed beside the policy's choice. Returns Rows (torch_ms: the loop
    of blockwise _scaled_mm when this torch runs it, else the row-wise grouped call)."""
    timer = Timer()
    return [row for shape in shapes for row in _bench_gbw_shape(timer, *shape, reps, configs)]


def _bench_gbw_shape(timer, e, tok, n, k, reps, configs):
    rows = []
    counts = moe_counts(e, tok)
    total = sum(counts)
    kb, nb = -(-k // 128), -(-n // 128)
    torch.manual_seed(0)
    a = torch.randn(total, k, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(e, n, k, device="cuda").to(torch.float8_e4m3fn)
    b = w.transpose(1, 2)
    sa = torch.rand(total, kb, device="cuda") + 0.5
    sb = (torch.rand(e, nb, kb, device="cuda") + 0.5).transpose(1, 2)  # the weight's scales, (E, KB, NB)
    offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    bounds = [0, *offs.tolist()]
    flops = 2.0 * total * n * k
    case = f"E{e}x{tok}tok N{n} K{k} blockwise"
    ref = grouped_gemm_ref(a, b, offs=offs, scale_a=sa, scale_b=sb, out_dtype=torch.float64)
    # torch's blockwise layouts, per expert: M-major scale_a of the expert's rows, .t() of (NB, KB)
    sa_m = [sa[bounds[i] : bounds[i + 1]].t().contiguous().t() for i in range(e)]
    sb_m = [sb[i].t().contiguous().t() for i in range(e)]

    def torch_loop():
        out = torch.empty(total, n, device="cuda", dtype=torch.bfloat16)
        for i in range(e):
            s, t = bounds[i], bounds[i + 1]
            if t > s:
                out[s:t] = torch._scaled_mm(a[s:t], b[i], scale_a=sa_m[i], scale_b=sb_m[i], out_dtype=torch.bfloat16)
        return out

    base_t, base_err, base_name = float("nan"), float("nan"), "none"
    try:
        base_err = (torch_loop().double() - ref).abs().max().item()
        base_t, base_name = timer(torch_loop, reps), "loop of torch blockwise _scaled_mm"
        print(f"{case}: {base_name}: {flops / base_t / 1e9:.1f} TFLOP/s, max err {base_err:.3g}", flush=True)
    except (RuntimeError, NotImplementedError, ValueError, TypeError) as exc:
        print(f"{case}: torch blockwise _scaled_mm unavailable ({type(exc).__name__}: {str(exc)[:200]})")
    ra, rb = torch.rand(total, device="cuda") + 0.5, torch.rand(e, n, device="cuda") + 0.5
    try:
        t_rw = timer(lambda: torch._scaled_grouped_mm(a, b, ra, rb, offs=offs, out_dtype=torch.bfloat16), reps)
        print(f"{case}: torch._scaled_grouped_mm row-wise (other recipe): {flops / t_rw / 1e9:.1f} TFLOP/s", flush=True)
        if base_t != base_t:
            base_t, base_name = t_rw, "torch._scaled_grouped_mm row-wise (other recipe)"
    except (RuntimeError, NotImplementedError, ValueError, TypeError) as exc:
        print(f"{case}: torch._scaled_grouped_mm unavailable ({type(exc).__name__}: {str(exc)[:200]})")
    a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)
    t16 = timer(lambda a16=a16, b16=b16: torch._grouped_mm(a16, b16, offs=offs), reps)
    print(f"{case}: torch._grouped_mm bf16: {flops / t16 / 1e9:.1f} TFLOP/s", flush=True)
    sa = sa.t().contiguous().t()  # ours: M-major scale_a (torch's layout, TMA-loaded in place)
    out = grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb)

    base = next(p.config for key, p in PLANS.items() if key[0] == a.shape and key[2] == b.shape and p.config.fp8_blockwise)
    for cfg in [None] + [replace(base, **c) for c in (configs or [])]:
        try:
            o = grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb, config=cfg)
            t = timer(lambda cfg=cfg: grouped_gemm(a, b, offs=offs, scale_a=sa, scale_b=sb, config=cfg), reps)
        except Exception as exc:
            print(f"   {(cfg or base).name}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        err = (o.double() - ref).abs().max().item()
        row = Row(case, t, base_t, flops / t / 1e9, flops / base_t / 1e9, base_t / t, (cfg or base).name, err, base_err)
        rows.append(row)
        print(format_row(row) + f" | vs bf16 _grouped_mm {t16 / t:.3f}x", flush=True)
    del out
    return rows


MXFP8_SHAPES = [(8192, 8192, 8192), (16384, 7168, 2048), (4096, 4096, 4096), (256, 8192, 8192), (64, 8192, 8192),
                (16, 8192, 8192)]  # fmt: skip


def bench_mxfp8(shapes=MXFP8_SHAPES, reps=20, configs=()):
    """MXFP8 x MXFP8 on sm_90a (``blockscaled.sm90_mx``) vs what a Hopper user has, same run, same
    operands: (1) cuBLAS bf16 on the dequantized operands (exact in bf16; the issue's ">= 1.0x
    cuBLAS bf16"), (2) dequantize-then-cuBLAS (bf16 scale multiply of the e4m3 elements in torch,
    then torch.matmul: the path without an MX kernel; the scales are decoded to bf16 once, outside
    the timing), (3) torch._scaled_mm row-wise FP8 (another recipe, for scale). Ours: the policy
    (``gemm(qa, qb)``), then both of its paths forced: the emulation (mx_config) and
    dequantize-first (one bf16 dequantize pass per operand + the bf16 GEMM), then ``configs``
    (dicts of GemmConfig overrides of mx_config). Returns Rows (torch_ms: dequantize-then-cuBLAS)."""
    timer = Timer()
    return [row for m, n, k in shapes for row in _bench_mxfp8_shape(timer, m, n, k, reps, configs)]


def _bench_mxfp8_shape(timer, m, n, k, reps, configs):
    torch.manual_seed(0)
    qa = quantize(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), "mxfp8")
    qb = quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), "mxfp8")
    a16, b16 = dequantize_ref(qa).to(torch.bfloat16), dequantize_ref(qb).to(torch.bfloat16)
    ref = a16.double() @ b16.double().T
    flops = 2.0 * m * n * k
    case = f"mxfp8 {m}x{n}x{k}"
    t16 = timer(lambda: a16 @ b16.T, reps)
    err16 = ((a16 @ b16.T).double() - ref).abs().max().item()
    sa16 = e8m0_to_float(qa.plain_scales()).to(torch.bfloat16).unsqueeze(-1)
    sb16 = e8m0_to_float(qb.plain_scales()).to(torch.bfloat16).unsqueeze(-1)

    def dq_then_cublas():
        a = (qa.data.view(m, k // 32, 32).to(torch.bfloat16) * sa16).view(m, k)
        b = (qb.data.view(n, k // 32, 32).to(torch.bfloat16) * sb16).view(n, k)
        return a @ b.T

    t_dq = timer(dq_then_cublas, reps)
    ones_a = torch.ones(m, 1, device="cuda")
    ones_b = torch.ones(1, n, device="cuda")
    t_rw = timer(
        lambda: torch._scaled_mm(qa.data, qb.data.T, scale_a=ones_a, scale_b=ones_b, out_dtype=torch.bfloat16),
        reps,
    )
    print(
        f"{case}: cuBLAS bf16 {flops / t16 / 1e9:.1f} TFLOP/s (max err {err16:.3g}); dequantize+cuBLAS "
        f"{flops / t_dq / 1e9:.1f}; torch._scaled_mm row-wise FP8 (other recipe) {flops / t_rw / 1e9:.1f}",
        flush=True,
    )

    rows = []
    default = mx_sm90.mx_config(m, n)
    policy = "dequantize-first" if mx_sm90.dequantize_first(m, n, qa, qb) else "emulation"
    if mx_sm90.ring_first(qa, qb):
        policy = "A dequantized + the MXFP8-weight GEMM"
    candidates = [(f"policy ({policy})", lambda: gemm(qa, qb)), (default.name + " (emulation)", lambda: gemm(qa, qb, config=default)),
                  ("dequantize-first", lambda: mx_sm90.dequantized_gemm(qa, qb, torch.bfloat16, 1.0, None, None))]  # fmt: skip
    candidates += [(c.name, lambda c=c: gemm(qa, qb, config=c)) for c in (replace(default, **o) for o in configs)]
    for name, fn in candidates:
        try:
            out = fn()
            err = (out.double() - ref).abs().max().item()
            t = timer(fn, reps)
        except Exception as exc:  # a candidate that does not compile / fit is reported, not fatal
            print(f"{case}: {name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            continue
        row = Row(case, t, t_dq, flops / t / 1e9, flops / t_dq / 1e9, t_dq / t, name, err, err16)
        rows.append(row)
        print(format_row(row) + f" | vs cuBLAS bf16 {t16 / t:.3f}x | vs row-wise FP8 {t_rw / t:.3f}x", flush=True)
    return rows


def bench_fp4x4_hopper(shapes=((8192, 8192, 8192), (16, 8192, 8192)), fmts=("nvfp4", "mxfp4"), reps=20):
    """FP4 x FP4 on sm_90a (dequantize-first: one bf16 dequantize pass per operand + our bf16 GEMM)
    vs the torch path on the same operands, same run: ``dequantize_ref`` (torch ops) of both to
    bf16, then torch.matmul; and cuBLAS bf16 on operands dequantized beforehand."""
    timer = Timer()
    for fmt in fmts:
        for m, n, k in shapes:
            torch.manual_seed(0)
            kw = {"global_scale": 0.37} if fmt == "nvfp4" else {}
            qa = quantize(torch.randn(m, k, device="cuda"), fmt, **kw)
            qb = quantize(torch.randn(n, k, device="cuda"), fmt, **kw)
            a16, b16 = dequantize_ref(qa).to(torch.bfloat16), dequantize_ref(qb).to(torch.bfloat16)
            flops = 2.0 * m * n * k
            t_ours = timer(lambda qa=qa, qb=qb: gemm(qa, qb), reps)
            t_torch = timer(lambda qa=qa, qb=qb: dequantize_ref(qa).to(torch.bfloat16) @ dequantize_ref(qb).to(torch.bfloat16).T, reps)
            t16 = timer(lambda a16=a16, b16=b16: a16 @ b16.T, reps)
            same = torch.equal(gemm(qa, qb), gemm(a16, b16.T))
            print(f"{fmt} x {fmt} {m}x{n}x{k}: ours {flops / t_ours / 1e9:.1f} TFLOP/s ({t_ours:.4f} ms) | "
                  f"dequantize_ref + torch.matmul {t_torch:.4f} ms ({t_torch / t_ours:.2f}x) | cuBLAS bf16 on "
                  f"pre-dequantized operands {flops / t16 / 1e9:.1f} ({t16 / t_ours:.2f}x) | equal to our bf16 GEMM "
                  f"of the dequantized operands: {same}", flush=True)  # fmt: skip


FP4W_DENSE = [(1, 28672, 4096), (16, 28672, 4096), (64, 28672, 4096), (128, 28672, 4096), (256, 28672, 4096),
              (512, 28672, 4096), (1024, 28672, 4096), (2048, 28672, 4096)]
FP4W_GROUPED = [(32, 16, 4096, 7168), (32, 64, 4096, 7168), (32, 256, 4096, 7168), (32, 512, 4096, 7168)]


def bench_fp4_weight(reps=30, dense=FP4W_DENSE, grouped=FP4W_GROUPED, fmts=("nvfp4", "mxfp4", "mxfp8"), configs=()):
    """FP4 / MXFP8 weights x bf16 activations vs the bf16 baselines a Hopper user has, same run,
    same (dequantized) weights: cuBLAS ``x @ w.T`` / ``torch._grouped_mm``, and dequantize-then-
    cuBLAS. ``configs``: dicts of Fp4WeightConfig overrides timed beside the default."""
    timer = Timer()
    idx = torch.cuda.current_device()
    arch = weight_only.weight_arch(idx)
    rows = []
    cases = [("dense", None, m, n, k) for m, n, k in dense] + [("grouped", e, t, n, k) for e, t, n, k in grouped]
    for fmt in fmts:
        for kind, e, m, n, k in cases:
            torch.manual_seed(0)
            if kind == "dense":
                w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
                offs, total, experts = None, m, 1
            else:
                counts = moe_counts(e, m)
                total, experts = sum(counts), e
                w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16)
                offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
            qw = quantize(w, fmt)
            del w
            wd = dequantize(qw).to(torch.bfloat16)  # exact: e2m1 / e4m3 * scale fits bf16
            x = torch.randn(total, k, device="cuda", dtype=torch.bfloat16)
            if offs is None:
                ref = x.double() @ wd.double().T
                base = lambda x=x, wd=wd: torch.matmul(x, wd.T)  # noqa: E731
                deq = lambda x=x, qw=qw: torch.matmul(x, dequantize(qw).to(torch.bfloat16).T)  # noqa: E731
                base_name = "cuBLAS bf16"
            else:
                bounds = list(zip([0, *offs.tolist()[:-1]], offs.tolist(), strict=True))
                ref = torch.cat([x[s:t].double() @ wd[i].double().T for i, (s, t) in enumerate(bounds)])
                wt = wd.transpose(1, 2)
                base = lambda x=x, wt=wt, offs=offs: torch._grouped_mm(x, wt, offs=offs)  # noqa: E731
                deq = lambda x=x, qw=qw, offs=offs: torch._grouped_mm(  # noqa: E731
                    x, dequantize(qw).to(torch.bfloat16).transpose(1, 2), offs=offs
                )
                base_name = "torch._grouped_mm bf16"
            terr = (base().double() - ref).abs().max().item()
            t_base = timer(base, reps)
            t_deq = timer(deq, max(5, reps // 3))
            qbytes = qw.data.numel() * qw.data.element_size() + qw.scales.numel()
            default = weight_only.policy_config(total, n, fmt, torch.bfloat16, arch, offs is not None, experts, False, idx)
            routed = weight_only.dequantize_first(total, experts, offs is not None, False, qw)
            for overrides in [{}, *configs]:
                try:
                    cfg = replace(default, **overrides)
                    # the default: the library's own choice (the kernel, or for prefill sizes the
                    # dequantize-first path); the overrides force a kernel config
                    forced = cfg if overrides else None
                    fn = lambda x=x, qw=qw, offs=offs, c=forced: weight_only.gemm_fp4_weight(x, qw, offs=offs, config=c)  # noqa: E731
                    err = (fn().double() - ref).abs().max().item()
                    t = timer(fn, reps)
                except Exception as exc:  # a candidate that does not fit or fails is reported, not fatal
                    print(f"   {overrides}: FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    continue
                flops = 2.0 * total * n * k
                case = f"{fmt} {kind} M={total}{f' E={e}' if e else ''} N={n} K={k}"
                name = "dequantize + bf16 GEMM" if routed and not overrides else cfg.name
                row = Row(case, t, t_base, flops / t / 1e9, flops / t_base / 1e9, t_base / t, name, err, terr)
                rows.append(row)
                print(format_row(row) + f" | baseline {base_name} | ours reads {qbytes / t / 1e6:.0f} GB/s of {fmt} weights"
                      f" | cutegemm.dequantize (torch ops, unoptimized) + {base_name} {t_deq:.4f} ms", flush=True)  # fmt: skip
            del qw, wd, x, ref
    return rows


FP8_BLOCKS_SHAPES = ((16, 7168, 2048), (512, 4096, 7168), (4096, 7168, 2048), (8192, 8192, 8192))


def bench_fp8_blocks(shapes=FP8_BLOCKS_SHAPES, reps=20):
    """torch._scaled_mm's 1x128 x 1x128 and 128x128 x 1x128 FP8 block recipes
    (``blockscaled.fp8_blocks``) against torch._scaled_mm with the same operands and scales in
    torch's layouts, one run, L2 flushed by the timer; torch's result error and ours against the
    fp64 block-dequantized product. Where this torch does not run a recipe, torch.matmul on the
    bf16 upcast operands is the baseline (named as such). Returns Rows."""
    timer = Timer()
    rows = []
    for m, n, k in shapes:
        for lhs in (1, 128):
            torch.manual_seed(0)
            kb, mb = -(-k // 128), -(-m // 128)
            a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
            b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
            sb = (torch.rand(n, kb, device="cuda") + 0.5).t().contiguous().t()  # (N, K/128), N-major
            if lhs == 1:
                sa = (torch.rand(m, kb, device="cuda") + 0.5).t().contiguous().t()  # (M, K/128), M-major
            else:
                sa = (torch.rand(mb, -(-kb // 4) * 4, device="cuda") + 0.5).t()  # (L4, M/128)
            case = f"{m}x{n}x{k} {'1x128' if lhs == 1 else '128x128'} x 1x128"
            ref = gemm_ref(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float64, compute_dtype=torch.float64)
            flops = 2.0 * m * n * k

            block, scaling = getattr(F, "scaled_mm", None), getattr(F, "ScalingType", None)
            if block is not None and scaling is not None:  # F.scaled_mm names the recipes (torch._scaled_mm may refuse them)
                recipe_a = scaling.BlockWise1x128 if lhs == 1 else scaling.BlockWise128x128

                def torch_fn(a=a, b=b, sa=sa, sb=sb, recipe_a=recipe_a, block=block, recipe_b=scaling.BlockWise1x128):
                    return block(a, b, sa, recipe_a, sb, recipe_b, output_dtype=torch.bfloat16)

                base_name = "F.scaled_mm"
            else:

                def torch_fn(a=a, b=b, sa=sa, sb=sb):
                    return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)

                base_name = "torch._scaled_mm"
            try:
                base_err = (torch_fn().double() - ref).abs().max().item()
            except (RuntimeError, NotImplementedError, ValueError, TypeError) as exc:
                print(f"{case}: {base_name} unavailable ({type(exc).__name__}: {str(exc)[:160]})")
                a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)

                def torch_fn(a16=a16, b16=b16):
                    return torch.matmul(a16, b16)

                base_err, base_name = float("nan"), "torch.matmul bf16 (no scales)"
            base_t = timer(torch_fn, reps)
            ours_err = (gemm(a, b, scale_a=sa, scale_b=sb).double() - ref).abs().max().item()
            t = timer(lambda a=a, b=b, sa=sa, sb=sb: gemm(a, b, scale_a=sa, scale_b=sb), reps)
            row = Row(case, t, base_t, flops / t / 1e9, flops / base_t / 1e9, base_t / t, "fp8_blocks (per-column B scales)",
                      ours_err, base_err)  # fmt: skip
            rows.append(row)
            print(format_row(row) + f" | baseline: {base_name}", flush=True)
    return rows
