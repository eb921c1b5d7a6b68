"""Benchmark of ``cutegemm.quantize``: GB/s of bytes read + written, against a torch copy ceiling
(``y.copy_(x)`` of the same input, same run) and against ``quantize_ref`` on the GPU (the torch
baseline). Timed with :class:`cutegemm.bench.core.Timer` (L2-cold, median of CUDA events)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..blockscaled.formats import get_format
from ..blockscaled.layout import swizzled_shape
from ..blockscaled.quantize_launch import quantize
from ..blockscaled.reference import quantize_ref
from .core import Timer

QUANT_SHAPES = [(16384, 7168), (4096, 7168), (8192, 4096), (128, 7168)]
# "nvfp4+gs": NVFP4 with a given global scale (no amax pass); plain "nvfp4" computes the default
# global scale first (one more read of x by the finite-amax kernel, not counted in the bytes).
QUANT_FORMATS = ("mxfp8", "mxfp4", "nvfp4", "nvfp4+gs")


@dataclass
class QuantRow:
    case: str
    ours_ms: float
    torch_ms: float  # quantize_ref on the GPU
    copy_ms: float  # y.copy_(x): the bandwidth ceiling
    ours_gbs: float  # (bytes read + written) / time
    copy_gbs: float  # 2 * x.nbytes / copy time
    frac_of_copy: float  # ours_gbs / copy_gbs
    ratio: float  # torch_ms / ours_ms
    identical: bool  # byte-identical to quantize_ref


def quant_bytes(x: torch.Tensor, fmt: str) -> int:
    """Bytes the kernel must move: the input, the elements, the swizzled scales."""
    f = get_format(fmt)
    rows, k = x.shape[-2], x.shape[-1]
    batch = x.numel() // (rows * k)
    rp, cp = swizzled_shape(rows, -(-k // f.block_size))
    return x.nbytes + x.numel() // f.elems_per_byte + batch * rp * cp


def bench_quantize(shapes=QUANT_SHAPES, formats=QUANT_FORMATS, dtype=torch.bfloat16, reps=30, ref_reps=5):
    """One row per (shape, format). ``ref_reps``: reps of the slow torch reference."""
    timer = Timer()
    rows = []
    for shape in shapes:
        torch.manual_seed(0)
        x = torch.randn(shape, device="cuda", dtype=torch.float32).to(dtype)
        y = torch.empty_like(x)
        t_copy = timer(lambda x=x, y=y: y.copy_(x), reps)
        for case in formats:
            fmt = case.split("+")[0]
            gs = quantize_ref(x[:1], fmt).global_scale if case.endswith("+gs") else None
            q, ref = quantize(x, fmt, global_scale=gs), quantize_ref(x, fmt, global_scale=gs)
            same = torch.equal(q.data.view(torch.uint8), ref.data.view(torch.uint8)) and torch.equal(
                q.scales.view(torch.uint8), ref.scales.view(torch.uint8)
            )
            t_ours = timer(lambda x=x, fmt=fmt, gs=gs: quantize(x, fmt, global_scale=gs), reps)
            t_ref = timer(
                lambda x=x, fmt=fmt, gs=gs: quantize_ref(x, fmt, global_scale=gs), ref_reps, warmup=1
            )
            gbs = quant_bytes(x, fmt) / t_ours / 1e6
            copy_gbs = 2 * x.nbytes / t_copy / 1e6
            row = QuantRow(
                f"{case} {'x'.join(map(str, shape))} {str(dtype).split('.')[-1]}",
                t_ours, t_ref, t_copy, gbs, copy_gbs, gbs / copy_gbs, t_ref / t_ours, same,
            )  # fmt: skip
            rows.append(row)
            print(format_quant_row(row), flush=True)
    return rows


def format_quant_row(r: QuantRow) -> str:
    return (
        f"{r.case:>28} | ours {r.ours_gbs:7.0f} GB/s ({r.ours_ms:8.4f} ms) = {100 * r.frac_of_copy:5.1f}% of copy "
        f"({r.copy_gbs:.0f} GB/s) | quantize_ref {r.torch_ms:8.4f} ms | {r.ratio:6.1f}x torch | "
        f"{'identical' if r.identical else 'MISMATCH'}"
    )


def quant_markdown_table(rows: list[QuantRow], title: str) -> str:
    lines = [
        f"### {title}",
        "",
        "| case | ours GB/s | % of copy | ours ms | quantize_ref ms | ×torch | identical |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.case} | {r.ours_gbs:.0f} | {100 * r.frac_of_copy:.1f}% | {r.ours_ms:.4f} | {r.torch_ms:.4f} "
            f"| {r.ratio:.1f} | {r.identical} |"
        )
    return "\n".join(lines)


def write_quant_results(rows: list[QuantRow], outdir) -> Path:
    """``<outdir>/quantize_<gpu>.json`` and ``.md`` (no plot: GB/s rows, not TFLOP/s)."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name()
    meta = {"family": "quantize", "gpu": gpu, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M"),
            "rows": [asdict(r) for r in rows]}  # fmt: skip
    path = outdir / f"quantize_{gpu.replace(' ', '_')}.json"
    path.write_text(json.dumps(meta, indent=1))
    path.with_suffix(".md").write_text(
        quant_markdown_table(rows, f"quantize on {gpu} ({meta['date']})") + "\n"
    )
    return path
