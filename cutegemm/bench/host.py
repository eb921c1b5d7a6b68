"""``python -m cutegemm bench host``: host time per warm call of every public path, next to
torch's nearest equivalent, timed in the same process on the same GPU.

Problems are tiny (the kernels take less time than the host work), so back-to-back calls measure
what a call costs the host: ``calls`` calls per timing, every function timed in turn, ``rounds``
times, the fastest round kept (drift hits all alike). A case whose setup fails (a torch without
that op, a GPU without that kernel) prints its reason instead of a number. Without a GPU there is
nothing to time: the command says so and returns 0 (the CPU emulation of the warm paths is
``python -m tests.host_overhead_cpu`` in a checkout)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .. import ops, quant_ops  # noqa: F401  (register torch.ops.cutegemm)
from ..api import dequantize, gemm, grouped_gemm, quantize

BF = torch.bfloat16
E4M3 = torch.float8_e4m3fn


def _r(*shape, dtype=BF):
    return torch.randn(*shape, device="cuda").to(dtype)


def _i32(values):
    return torch.tensor(values, dtype=torch.int32, device="cuda")


def _dense():
    a, b, bias = _r(128, 128), _r(128, 128), _r(128)
    return [
        ("gemm(a, b) bf16 128^3", lambda: gemm(a, b), "torch.matmul", lambda: torch.matmul(a, b)),
        ("gemm bias + silu", lambda: gemm(a, b, bias=bias, activation="silu"),
         "silu(torch.addmm)", lambda: F.silu(torch.addmm(bias, a, b))),
    ]  # fmt: skip


def _grouped():
    x, w, offs = _r(256, 128), _r(4, 128, 128).transpose(1, 2), _i32([64, 128, 192, 256])
    xt, dy, koffs = _r(256, 128).t(), _r(256, 128), _i32([64, 128, 192, 256])
    a3, b3 = _r(4, 64, 128), _r(4, 128, 128).transpose(1, 2)
    b2, noffs = _r(512, 128).t(), _i32([128, 256, 384, 512])
    xs, ws = [_r(64, 128) for _ in range(4)], [_r(128, 128) for _ in range(4)]
    gm = torch._grouped_mm
    return [
        ("grouped 2d x 3d (packed)", lambda: grouped_gemm(x, w, offs=offs), "torch._grouped_mm",
         lambda: gm(x, w, offs=offs)),
        ("grouped 2d x 2d (K-grouped)", lambda: grouped_gemm(xt, dy, offs=koffs), "torch._grouped_mm",
         lambda: gm(xt, dy, offs=koffs)),
        ("grouped 3d x 3d", lambda: grouped_gemm(a3, b3), "torch._grouped_mm", lambda: gm(a3, b3)),
        ("grouped 3d x 2d", lambda: grouped_gemm(a3, b2, offs=noffs), "torch._grouped_mm",
         lambda: gm(a3, b2, offs=noffs)),
        ("grouped list (4 groups)", lambda: grouped_gemm(xs, ws), "[torch.matmul ...]",
         lambda: [torch.matmul(p, q) for p, q in zip(xs, ws, strict=True)]),
    ]  # fmt: skip


def _fp8():
    a8, b8 = _r(128, 256, dtype=E4M3), _r(256, 256, dtype=E4M3).t()
    sa, sb = torch.rand(128, 1, device="cuda"), torch.rand(1, 256, device="cuda")
    sa_blk = torch.rand(2, 128, device="cuda").t()  # (M, K/128), M-major: torch's layout
    # (K/128 padded to 4, N/128), K-major: torch's 128x128 layout (cutegemm never reads the padding)
    sb_blk = F.pad(torch.rand(2, 2, device="cuda"), (0, 2)).t()
    x8, w8 = _r(256, 256, dtype=E4M3), _r(4, 256, 256, dtype=E4M3).transpose(1, 2)
    gsa, gsb, offs = torch.rand(256, device="cuda"), torch.rand(4, 256, device="cuda"), _i32([64, 128, 192, 256])
    cases = [
        ("FP8 row-wise dense", lambda: gemm(a8, b8, scale_a=sa, scale_b=sb), "torch._scaled_mm row-wise",
         lambda: torch._scaled_mm(a8, b8, sa, sb, out_dtype=BF)),
        ("FP8 row-wise grouped", lambda: grouped_gemm(x8, w8, offs=offs, scale_a=gsa, scale_b=gsb),
         "torch._scaled_grouped_mm", lambda: torch._scaled_grouped_mm(x8, w8, gsa, gsb, offs=offs, out_dtype=BF)),
    ]  # fmt: skip
    sb_vec = torch.rand(2, 256, device="cuda").t()  # (N, K/128), N-major: torch's 1x128 layout of b
    # (torch._scaled_mm itself refuses the 1x128 x 1x128 recipe on some builds: F.scaled_mm names it)
    for name, sbw, b_scaling in (("1x128 x 128x128", sb_blk, "BlockWise128x128"), ("1x128 x 1x128", sb_vec, "BlockWise1x128")):
        cases.append((f"FP8 block-wise dense ({name})", lambda sbw=sbw: gemm(a8, b8, scale_a=sa_blk, scale_b=sbw),
                      "F.scaled_mm block-wise", _torch_block_wise(a8, b8, sa_blk, sbw, b_scaling)))  # fmt: skip
    return cases


def _torch_block_wise(a8, b8, sa, sb, b_scaling: str):
    """``F.scaled_mm`` with 1x128 scales of a and ``b_scaling`` ones of b, or None (a torch
    without it)."""
    block, scaling = getattr(F, "scaled_mm", None), getattr(F, "ScalingType", None)
    if block is None or scaling is None:
        return None
    return lambda: block(a8, b8, sa, scaling.BlockWise1x128, sb, getattr(scaling, b_scaling), output_dtype=BF)


def _torch_mx_quantize(x):
    """MXFP8 (e4m3, 32-element blocks, OCP scale) as a torch user writes it without a kernel: block
    amax, a power-of-two scale, the scaled cast and the e8m0 bytes (plain scales, not swizzled)."""
    blocks = x.float().unflatten(-1, (-1, 32))
    e = torch.floor(torch.log2(blocks.abs().amax(-1, keepdim=True))).sub_(8).clamp_(-127, 127)
    data = (blocks / torch.exp2(e)).clamp_(-448.0, 448.0).to(E4M3).flatten(-2)
    return data, (e + 127).to(torch.uint8).view(torch.float8_e8m0fnu).squeeze(-1)


def _torch_mx_dequantize(data, scales, dtype):
    """The inverse in torch ops: elements times 2**(byte - 127) per block, cast to ``dtype``."""
    e = scales.view(torch.uint8).float().sub_(127).unsqueeze(-1)
    return (data.float().unflatten(-1, (-1, 32)) * torch.exp2(e)).flatten(-2).to(dtype)


def _quantized():
    x16, xg, offs = _r(16, 1024), _r(64, 1024), _i32([16, 32, 48, 64])
    w, we = _r(1024, 1024), _r(4, 1024, 1024)
    cases = []
    for fmt in ("nvfp4", "mxfp4", "mxfp8"):
        qw, qe = quantize(w, fmt), quantize(we, fmt)
        cases.append((f"{fmt} weight dense (16 rows)", lambda qw=qw: gemm(x16, qw), "torch.matmul bf16",
                      lambda: torch.matmul(x16, w.t())))  # fmt: skip
        cases.append((f"{fmt} weight grouped (4 x 16 rows)", lambda qe=qe: grouped_gemm(xg, qe, offs=offs),
                      "torch._grouped_mm bf16", lambda: torch._grouped_mm(xg, we.transpose(1, 2), offs=offs)))  # fmt: skip
    qa, qb = quantize(_r(128, 256), "mxfp8"), quantize(_r(256, 256), "mxfp8")
    a, b = _r(128, 256), _r(256, 256)
    xq = _r(128, 1024)
    q = quantize(xq, "mxfp8")
    plain = q.plain_scales()
    cases += [
        ("block-scaled MXFP8 x MXFP8", lambda: gemm(qa, qb), "torch.matmul bf16", lambda: torch.matmul(a, b.t())),
        ("quantize MXFP8 (128 x 1024)", lambda: quantize(xq, "mxfp8"), "x.to(float8_e4m3fn)", lambda: xq.to(E4M3)),
        ("dequantize MXFP8 -> bf16", lambda: dequantize(q, BF), "x8.to(bfloat16)", lambda: q.data.to(BF)),
        ("dequantize MXFP8 -> fp32", lambda: dequantize(q), "x8.to(float32)", lambda: q.data.float()),
        # the same calls against the recipe in torch ops (scales and all), not one cast
        ("quantize MXFP8 (128 x 1024)", lambda: quantize(xq, "mxfp8"), "MX recipe in torch ops",
         lambda: _torch_mx_quantize(xq)),
        ("dequantize MXFP8 -> bf16", lambda: dequantize(q, BF), "MX recipe in torch ops",
         lambda: _torch_mx_dequantize(q.data, plain, BF)),
    ]  # fmt: skip
    return cases


def _ops():
    op = torch.ops.cutegemm
    a, b = _r(128, 128), _r(128, 128)
    x, w, offs = _r(256, 128), _r(4, 128, 128).transpose(1, 2), _i32([64, 128, 192, 256])
    xq = _r(128, 1024)
    return [
        ("torch.ops.cutegemm.gemm", lambda: op.gemm(a, b), "torch.matmul", lambda: torch.matmul(a, b)),
        ("torch.ops.cutegemm.grouped_gemm", lambda: op.grouped_gemm(x, w, offs), "torch._grouped_mm",
         lambda: torch._grouped_mm(x, w, offs=offs)),
        ("torch.ops.cutegemm.quantize mxfp8", lambda: op.quantize(xq, "mxfp8"), "x.to(float8_e4m3fn)",
         lambda: xq.to(E4M3)),
    ]  # fmt: skip


GROUPS: list[tuple[str, Callable]] = [
    ("dense", _dense), ("grouped", _grouped), ("FP8", _fp8), ("quantized", _quantized), ("torch ops", _ops),
]  # fmt: skip


def _best_us(fns: dict, calls: int, rounds: int) -> dict:
    res = {name: float("inf") for name in fns}
    for fn in fns.values():
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            res[name] = min(res[name], (t1 - t0) / calls * 1e6)
    return res


def host_table(calls: int = 1000, rounds: int = 5) -> list[tuple]:
    """Rows (path, ours µs or None, torch's nearest, its µs or None, note) for every case."""
    rows = []
    for group, build in GROUPS:
        try:
            cases = build()
        except Exception as exc:  # a whole group unavailable on this GPU / torch
            rows.append((group, None, "", None, f"setup failed: {type(exc).__name__}: {exc}"))
            continue
        for name, ours, tname, tfn in cases:
            fns, notes = {}, []
            for key, fn in (("ours", ours), ("torch", tfn)):
                if fn is None:
                    notes.append(f"{key}: not in this torch")
                    continue
                try:
                    fn()
                    torch.cuda.synchronize()
                    fns[key] = fn
                except Exception as exc:
                    notes.append(f"{key}: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}")
            us = _best_us(fns, calls, rounds) if fns else {}
            rows.append((name, us.get("ours"), tname, us.get("torch"), "; ".join(notes)))
    return rows


def format_table(rows, calls: int, rounds: int) -> str:
    def num(v):
        return f"{v:8.1f}" if v is not None else "     n/a"

    out = [f"host time per warm call (µs), best of {rounds} x {calls} calls on {torch.cuda.get_device_name()}",
           f"{'path':40s} {'ours':>8s}  {'torch nearest':28s} {'torch':>8s}  ours/torch"]  # fmt: skip
    for name, ours, tname, theirs, note in rows:
        ratio = f"{ours / theirs:9.2f}x" if ours is not None and theirs else ""
        line = f"{name:40s} {num(ours)}  {tname:28s} {num(theirs)}  {ratio}"
        out.append(line + (f"  ({note})" if note else ""))
    return "\n".join(out)


def main(calls: int = 1000, rounds: int = 5) -> int:
    if not torch.cuda.is_available():
        print("bench host times warm calls on a CUDA GPU next to torch's; there is none here, so nothing was "
              "timed. The CPU emulation of the warm paths: python -m tests.host_overhead_cpu (in a checkout).")  # fmt: skip
        return 0
    print(format_table(host_table(calls, rounds), calls, rounds))
    return 0


__all__ = ["format_table", "host_table", "main"]
