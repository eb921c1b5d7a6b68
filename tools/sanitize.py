"""One small case of every sm_90a kernel variant family, each checked against its reference twin:
the program that tools/sanitize.sh runs under ``compute-sanitizer --tool memcheck / racecheck /
synccheck``. Run it once without the sanitizer first (the script does) so every kernel is in the
disk cache (``$CUTEGEMM_CACHE_DIR``): compiling inside the sanitized process would be very slow.

    python tools/sanitize.py [--list] [--only REGEX]

Inputs are made on the CPU and copied over, references are computed on the CPU, so the sanitized
process launches few kernels besides ours. Shapes are tiny but ragged: several tiles, partial M /
N / K tiles, clusters that overhang the problem. Families: dense cooperative and pingpong tiles,
2x1 / 1x2 clusters, every epilogue op (alpha, beta*C, bias, relu, gelu, gelu_tanh, silu, gated
swiglu / geglu), fp16 / fp32 out, column-major A / B, batched; grouped packed (each policy tile)
with empty experts, partial tiles, rows past offs[-1], and bad (clamped) offs; K-grouped; list;
and ``cutegemm.quantize`` when it exists. Prints ``sanitize.py: cases=N kernels=K failures=F``
(K: distinct compiled kernels used); exits 1 on a failed check.
"""

from __future__ import annotations

import argparse
import re
import sys
import traceback
from dataclasses import replace

import refcheck  # noqa: F401  (puts the repo root on sys.path)
import torch

import cutegemm
from cutegemm.blockscaled.quantizer import kernel_cache as quantize_kernels
from cutegemm.blockscaled.weight_only.kernel import kernel_cache as fp4_weight_kernels
from cutegemm.config import Form, GemmConfig
from cutegemm.epilogue import EpilogueSpec
from cutegemm.epilogue.combine import kernel_cache as combine_kernels
from cutegemm.epilogue.dispatch import kernel_cache as dispatch_kernels
from cutegemm.epilogue.gated_grads import kernel_cache as gated_kernels
from cutegemm.epilogue.routed_grads import kernel_cache as routed_kernels
from cutegemm.epilogue.zero_tail import kernel_cache as zero_tail_kernels
from cutegemm.gemm.launch import DENSE_CACHE, GROUPED_CACHE

BF, F16, F32 = torch.bfloat16, torch.float16, torch.float32
_GEN = torch.Generator().manual_seed(0)


def cpu(*shape, dtype=BF):
    return torch.randn(*shape, generator=_GEN).to(dtype)


def to_gpu(t):
    return None if t is None else t.cuda()


def colmajor(rows, cols, dtype=BF):
    return cpu(cols, rows, dtype=dtype).t()


def cfg(**kw):
    return replace(GemmConfig(arch="sm_90a", a_major="k", b_major="n"), **kw)


# ---------------------------------------------------------------------------------------------- dense
def dense_case(a, b, tile: dict, out_dtype=BF, batch_out=None, **ops):
    """gemm(a, b, **ops) on the GPU into a poisoned out with a forced tile; checked on the CPU."""
    gated = ops.get("activation") in ("swiglu", "geglu")
    n_out = b.shape[-1] // 2 if gated else b.shape[-1]
    shape = (*torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], n_out)
    config = cfg(
        a_dtype={BF: "bf16", F16: "fp16"}[a.dtype],
        b_dtype={BF: "bf16", F16: "fp16"}[b.dtype],
        out_dtype={BF: "bf16", F16: "fp16", F32: "fp32"}[out_dtype],
        a_major="k" if a.stride(-1) == 1 else "m",
        b_major="n" if b.stride(-1) == 1 else "k",
        **tile,
    )
    buf, out = refcheck.poisoned(shape, out_dtype, "cpu")
    buf = buf.cuda()
    out = buf[..., : shape[-2], : shape[-1]]
    gpu_ops = {k: (to_gpu(v) if isinstance(v, torch.Tensor) else v) for k, v in ops.items()}
    cutegemm.gemm(to_gpu(a), to_gpu(b), out=out, config=config, **gpu_ops)
    torch.cuda.synchronize()
    host = buf.cpu()
    refcheck.assert_pad_untouched(host, shape[-2], shape[-1], "dense")
    refcheck.check_dense(host[..., : shape[-2], : shape[-1]], a, b, what="dense", **ops)


M, N, K = 200, 264, 136  # 2 M-tiles (partial), 2 N-tiles of 256 / 3 of 128 (partial), 3 K-blocks (partial)


def _dense_cases():
    a, b, bk = cpu(M, K), cpu(K, N), colmajor(K, N)
    b2, bk2 = cpu(K, 2 * 136), colmajor(K, 2 * 136)  # gated: 136 output columns (16-byte rows)
    c = {
        "coop-128x256-plain": lambda: dense_case(a, b, dict(tile_m=128, tile_n=256)),
        "coop-128x128-c2x1-alpha-beta": lambda: dense_case(
            a, bk, dict(tile_m=128, tile_n=128, cluster_m=2), alpha=0.5, beta=-1.25, c=cpu(M, N)
        ),
        "coop-128x64-c1x2-bias-relu": lambda: dense_case(
            a, bk, dict(tile_m=128, tile_n=64, cluster_n=2, raster="n", group=1), bias=cpu(N, dtype=F32),
            activation="relu",
        ),
        "coop-128x192-gelu-fp32out": lambda: dense_case(a, b, dict(tile_m=128, tile_n=192), F32, activation="gelu"),
        "coop-64x128-gelu_tanh-colmajor-a": lambda: dense_case(
            colmajor(M, K), b, dict(tile_m=64, tile_n=128), activation="gelu_tanh"
        ),
        "pp-128x128-silu-fp16": lambda: dense_case(
            cpu(M, K, dtype=F16), cpu(K, N, dtype=F16), dict(tile_m=128, tile_n=128, pingpong=True), F16,
            activation="silu",
        ),
        "pp-64x256-c1x2-swiglu": lambda: dense_case(
            a, bk2, dict(tile_m=64, tile_n=256, cluster_n=2, pingpong=True), activation="swiglu"
        ),
        "pp-128x64-geglu-bias": lambda: dense_case(
            a, b2, dict(tile_m=128, tile_n=64, pingpong=True, raster="n", group=1), bias=cpu(2 * 136),
            activation="geglu",
        ),
        "coop-128x128-c2x1-batched-beta-fp32c": lambda: dense_case(
            cpu(3, 72, K), cpu(3, K, N), dict(tile_m=128, tile_n=128, cluster_m=2, raster="n", group=3), F32,
            beta=0.75, c=cpu(3, 72, N, dtype=F32),
        ),
        # decode-sized M: A's 16-row box (rows 16..63 of every stage zeroed once), split K
        "decode-a_rows16-bias-gelu": lambda: dense_case(
            cpu(13, K), bk, dict(tile_m=64, tile_n=64, raster="n", group=1, a_rows=16),
            bias=cpu(N, dtype=F32), activation="gelu",
        ),
        "split-k4-64x128-beta": lambda: dense_case(
            cpu(70, 1000), colmajor(1000, N), dict(tile_m=64, tile_n=128, raster="n", group=1, split_k=4),
            beta=0.5, c=cpu(70, N),
        ),
        "split-k2-128x64-a_rows32": lambda: dense_case(
            cpu(20, 1000), colmajor(1000, N), dict(tile_m=128, tile_n=64, raster="n", group=1, split_k=2, a_rows=32),
        ),
        # a box of 3 / 6 swizzle atoms (48 / 96 rows): M between the powers of two
        "decode-a_rows48-bias": lambda: dense_case(
            cpu(41, K), bk, dict(tile_m=64, tile_n=64, raster="n", group=1, a_rows=48), bias=cpu(N, dtype=F32),
        ),
        "split-k4-128x64-a_rows96": lambda: dense_case(
            cpu(90, 1000), colmajor(1000, N), dict(tile_m=128, tile_n=64, raster="n", group=1, split_k=4, a_rows=96),
        ),
        # split K through distributed shared memory (st.async into range 0's slots, its mbarrier)
        "splitc-k2-128x64-a_rows32": lambda: dense_case(
            cpu(20, 1000), colmajor(1000, N),
            dict(tile_m=128, tile_n=64, raster="n", group=1, split_k=2, a_rows=32, split_cluster=True),
        ),
        "splitc-k8-64x64-beta": lambda: dense_case(
            cpu(70, 1000), colmajor(1000, N), dict(tile_m=64, tile_n=64, raster="n", group=1, split_k=8, split_cluster=True),
            beta=0.5, c=cpu(70, N),
        ),
        # the wave model's tiles: 192 rows (three consumer warpgroups), 64x96 1x2, 128x96 2x1
        "tall-192x192-bias-silu": lambda: dense_case(
            cpu(430, K), bk, dict(tile_m=192, tile_n=192), bias=cpu(N), activation="silu",
        ),
        "tall-192x128-c1x2-swiglu": lambda: dense_case(
            cpu(430, K), bk2, dict(tile_m=192, tile_n=128, cluster_n=2), activation="swiglu",
        ),
        "short-64x96-c1x2-beta": lambda: dense_case(
            a, bk, dict(tile_m=64, tile_n=96, cluster_n=2, raster="n", group=1), beta=0.5, c=cpu(M, N),
        ),
        "coop-128x96-c2x1": lambda: dense_case(cpu(300, K), bk, dict(tile_m=128, tile_n=96, cluster_m=2)),
    }  # fmt: skip
    return c


# ---------------------------------------------------------------------------------------------- grouped
def grouped_case(counts, n, k, tile: dict, b_row=True, alpha=1.0, pad=5, bad_offs=None, out_dtype=BF):
    """Packed grouped GEMM into a poisoned out; valid counts or explicit bad offs (clamped)."""
    offs = bad_offs if bad_offs is not None else list(refcheck_cumsum(counts))
    E = len(offs)
    total = (sum(counts) if bad_offs is None else 0) + pad
    a = cpu(total, k)
    b = cpu(E, k, n) if b_row else cpu(E, n, k).transpose(1, 2)
    config = cfg(
        form=Form.GROUPED, b_major="n" if b_row else "k", out_dtype={BF: "bf16", F32: "fp32"}[out_dtype],
        raster="m", group=1, epilogue=EpilogueSpec(alpha=alpha != 1.0), **tile,
    )  # fmt: skip
    buf = refcheck.poisoned((total, n), out_dtype, "cpu")[0].cuda()
    out = buf[:total, :n]
    offs_t = torch.tensor(offs, dtype=torch.int32).cuda()
    cutegemm.grouped_gemm(a.cuda(), b.cuda(), offs=offs_t, out=out, alpha=alpha, config=config)
    torch.cuda.synchronize()
    host = buf.cpu()
    refcheck.assert_pad_untouched(host, total, n, "grouped")
    if bad_offs is None:
        refcheck.check_packed(host[:total, :n], a, b, offs, alpha=alpha, what="grouped")
    else:
        refcheck.check_clamped(host[:total, :n], offs, what="grouped bad offs")


def refcheck_cumsum(counts):
    s = 0
    for c in counts:
        s += c
        yield s


T64 = dict(tile_m=64, tile_n=128, cluster_n=2)
T128PP = dict(tile_m=128, tile_n=128, pingpong=True, cluster_n=2)
T256 = dict(tile_m=128, tile_n=256, cluster_n=2)
SWAP256 = dict(swap_ab=True, tile_m=128, tile_n=256, cluster_m=2, scheduler="dynamic")
SWAP160 = dict(swap_ab=True, tile_m=128, tile_n=160, scheduler="dynamic")


def _grouped_cases():
    return {
        "grouped-64x128-c1x2-decode": lambda: grouped_case([0, 37, 5, 0, 64, 1], 136, 72, T64, alpha=0.5),
        "grouped-pp128x128-c1x2-ragged": lambda: grouped_case(
            [130, 0, 257, 3], 264, 136, T128PP, b_row=False
        ),
        "grouped-128x256-c1x2-fp32out": lambda: grouped_case([300, 0, 129], 264, 136, T256, out_dtype=F32),
        "grouped-64x128-bad-offs": lambda: grouped_case(
            [], 136, 72, T64, alpha=0.5, pad=200, bad_offs=[150, -3, 100, 10_000, -(2**31), 7]
        ),
        "grouped-all-empty": lambda: grouped_case([0, 0, 0], 136, 72, T64, alpha=0.5),
        # swap AB (tokens along the WGMMA's N): the policy's tiles, chunks skipped past the tokens
        "grouped-swap-256-c2x1": lambda: grouped_case([130, 0, 1, 257, 33], 264, 136, SWAP256, b_row=False, alpha=0.5),
        "grouped-swap-160-c1x1-bn": lambda: grouped_case([17, 300, 0, 64, 65], 264, 136, SWAP160),
        "grouped-epilogue-bias-swiglu": lambda: grouped_epilogue_case([130, 0, 257, 3], 256, 136),
        "grouped-epilogue-nvfp4": lambda: grouped_epilogue_case([70, 0, 133, 64], 256, 128, fmt="nvfp4"),
        "grouped-epilogue-mxfp4-swiglu": lambda: grouped_epilogue_case([1, 200, 0, 9], 128, 64, fmt="mxfp4"),
    }


def grouped_epilogue_case(counts, n, k, fmt=None):
    """Packed grouped GEMM with a per-expert bias and swiglu (bf16 output, NaN-poisoned rows past
    offs[-1] checked untouched) or a quantized output (scales of rows past the expert's end must
    not be written: the swizzled scale buffer is compared with the reference's)."""
    from cutegemm import grouped_gemm_ref

    E, total = len(counts), sum(counts)
    a = cpu(total + 7, k).cuda()
    b = cpu(E * k, n).reshape(E, k, n).cuda()
    offs = torch.tensor(list(refcheck_cumsum(counts)), dtype=torch.int32).cuda()
    bias = cpu(E, n).cuda()
    if fmt is None:
        out = torch.full((total + 7, n // 2), float("nan"), dtype=BF, device="cuda")
        cutegemm.grouped_gemm(a, b, offs=offs, out=out, bias=bias, activation="swiglu")
        torch.cuda.synchronize()
        ref = grouped_gemm_ref(a, b, offs=offs, bias=bias, activation="swiglu", compute_dtype=torch.float64)
        assert torch.isnan(out[total:]).all(), "grouped epilogue: rows past offs[-1] written"
        err = (out[:total].double() - ref[:total]).abs().max().item()
        assert err <= 0.02 * (ref[:total].abs().max().item() + 1), f"grouped epilogue: max error {err:.4g}"
        return
    gs = 0.05 if fmt == "nvfp4" else None
    kw = dict(activation="swiglu") if fmt == "mxfp4" else dict(bias=bias)
    q = cutegemm.grouped_gemm(a[:total], b, offs=offs, out_dtype=fmt, out_global_scale=gs, **kw)
    torch.cuda.synchronize()
    ref = grouped_gemm_ref(a[:total], b, offs=offs, out_dtype=fmt, out_global_scale=gs, **kw)
    same = (q.scales.view(torch.uint8) == ref.scales.view(torch.uint8)).float().mean().item()
    assert same >= 0.99, f"grouped quantized {fmt}: only {same:.4f} of scale bytes equal"


def kgrouped_case(a_col_major=False, m=96, n=136, config=None):
    """The K-grouped kernel (sm_90a): empty slices and slices that start off a 16-byte boundary
    (the kernel's TMA boxes start at the rounded-down column, the extra columns zeroed); a row-
    or column-major a (the weight gradient's x.t()); ``config``: a forced one (pingpong: at
    1024 x 1024 every CTA's warpgroups take several turns, skipping by each tile's K count)."""
    counts = [40, 0, 3, 85, 8]
    a = cpu(sum(counts), m).t() if a_col_major else cpu(m, sum(counts))  # (m, K), column- or row-major
    b = cpu(sum(counts), n)
    offs = list(refcheck_cumsum(counts))
    buf = refcheck.poisoned((len(counts), m, n), BF, "cpu")[0].cuda()
    out = buf[..., :m, :n]
    cutegemm.grouped_gemm(a.cuda(), b.cuda(), offs=torch.tensor(offs, dtype=torch.int32).cuda(), out=out, config=config)
    torch.cuda.synchronize()
    host = buf.cpu()
    refcheck.assert_pad_untouched(host, m, n, "k-grouped")
    refcheck.check_kgrouped(host[..., :m, :n], a, b, offs, what="k-grouped")


def list_case():
    shapes = [(5, 64, 24), (130, 8, 512), (0, 64, 16), (64, 256, 8), (7, 0, 16)]
    xs = [cpu(m, k) for m, k, _ in shapes]
    ws = [cpu(k, n) for _, k, n in shapes]
    outs = cutegemm.grouped_gemm([x.cuda() for x in xs], [w.cuda() for w in ws])
    torch.cuda.synchronize()
    for o, x, w in zip(outs, xs, ws, strict=True):
        refcheck.check_dense(o.cpu(), x, w, what="list")


def _quantize_cases():
    q = getattr(cutegemm, "quantize", None)
    if q is None:
        return {}
    from cutegemm.blockscaled import quantize_ref

    def case(fmt, x):
        ours = q(x.cuda(), fmt)
        torch.cuda.synchronize()
        ref = quantize_ref(x.cuda(), fmt)  # byte-identical on the same device (its contract)
        for name in ("data", "scales"):
            o, r = getattr(ours, name), getattr(ref, name)
            assert o.shape == r.shape and torch.equal(o.view(torch.uint8), r.view(torch.uint8)), (
                f"quantize {fmt} {name}"
            )

    x = cpu(130, 96)
    return {
        "quantize-mxfp8": lambda: case("mxfp8", x),
        "quantize-mxfp4-ktail": lambda: case("mxfp4", cpu(130, 40)),
        "quantize-nvfp4-fp32": lambda: case("nvfp4", x.float()),
    }


def _gated_cases():
    """The elementwise swiglu kernel (cutegemm.epilogue.gated_grads): a row count whose chunks do
    not fill the last CTA, both layouts, against ops.gated_grads' torch formulas (within a step)."""
    from cutegemm import ops
    from cutegemm.epilogue.gated_grads import gated_grads_cuda

    def case(layout):
        z, dh = (cpu(37, 48) * 3).cuda(), cpu(37, 24).cuda()
        h, dz = gated_grads_cuda(dh, z, layout)
        torch.cuda.synchronize()
        saved, ops.FUSED_GATED = ops.FUSED_GATED, False
        try:
            h_ref, dz_ref = ops.gated_grads("swiglu", dh, z, layout)
        finally:
            ops.FUSED_GATED = saved
        for o, r in ((h, h_ref), (dz, dz_ref)):
            assert torch.allclose(o.float(), r.float(), rtol=2**-6, atol=1e-6), f"gated {layout}"

    return {f"gated-swiglu-{lay}": (lambda lay=lay: case(lay)) for lay in ("interleaved", "halves")}


def _routed_tail_cases():
    """The routed backward's one-pass kernel (cutegemm.epilogue.routed_grads; rows not filling the
    last CTA, a row length not filling a lane's steps) against ops' torch formulas, and the tail
    zeroing kernel (cutegemm.epilogue.zero_tail) on an output with rows past offs[-1]."""
    from cutegemm import ops
    from cutegemm.epilogue.routed_grads import routed_grads_cuda
    from cutegemm.epilogue.zero_tail import zero_tail_cuda

    def routed(layout):
        z, dh, w = (cpu(37, 48) * 3).cuda(), cpu(37, 24).cuda(), torch.rand(37).cuda()
        wh, dz, dots = routed_grads_cuda(dh, z, w, layout)
        torch.cuda.synchronize()
        for o, r in zip((wh, dz, dots), ops._routed_grads_torch("swiglu", dh, z, w, layout), strict=True):
            assert torch.allclose(o.float(), r.float(), rtol=2**-6, atol=1e-5), f"routed {layout}"

    def tail():
        src = cpu(301, 40)
        out = src.cuda()
        zero_tail_cuda(out, torch.tensor([7, 250], dtype=torch.int32).cuda())
        torch.cuda.synchronize()
        assert (out[250:] == 0).all() and torch.equal(out[:250].cpu(), src[:250]), "zero tail"

    return {"routed-swiglu-interleaved": lambda: routed("interleaved"), "routed-swiglu-halves": lambda: routed("halves"),
            "zero-tail": tail}  # fmt: skip


def _kgather_cases():
    """The gathering K-grouped kernel (cutegemm.grouped.k_grouped.grouped_k_gather, sm_90a): a
    gathered operand with more tokens than the index reads, positions past offs[-1], an empty
    expert and M / N not filling a tile, against the K-grouped kernel on the gathered copy."""
    from cutegemm.grouped.k_grouped import grouped_k, grouped_k_gather

    def case(gather):
        rows = torch.randint(0, 37, (90,), dtype=torch.int32).cuda()
        offs = torch.tensor([20, 20, 61, 83], dtype=torch.int32).cuda()
        toks, other = cpu(41, 72).cuda(), cpu(90, 40).cuda()
        a, b = (toks, other) if gather == "a" else (other.mT, toks)
        out = grouped_k_gather(a, b, offs, rows, gather, torch.float32)
        torch.cuda.synchronize()
        g = toks.index_select(0, rows.long())
        ref = grouped_k(g.mT, b, offs, None, torch.float32, 1.0, False) if gather == "a" else grouped_k(a, g, offs, None, torch.float32, 1.0, False)
        assert torch.allclose(out, ref, rtol=1e-4, atol=1e-3), f"kgather {gather}"

    return {"kgather-a": lambda: case("a"), "kgather-b": lambda: case("b")}


def _combine_cases():
    """The one-pass row combines (cutegemm.epilogue.combine): weighted, summed and with the dot,
    source rows gathered from a larger tensor, against ops' torch formulas (fp32 sums)."""
    from cutegemm import ops
    from cutegemm.epilogue.combine import combine_rows_cuda

    def case(weighted, dot):
        src, k = cpu(37, 48).cuda(), 1 if dot else 3
        idx = torch.randint(0, 37, (13 * k,), dtype=torch.int32).cuda()
        w = torch.rand(13 * k).cuda() if weighted else None
        other = cpu(13, 48).cuda() if dot else None
        out, dots = combine_rows_cuda(src, idx, w, k, other)
        torch.cuda.synchronize()
        ref, ref_dots = ops._combine_rows_torch(src, idx, w, k, other)
        assert torch.allclose(out.float(), ref.float(), rtol=2**-7, atol=1e-6), "combine"
        if dot:
            assert torch.allclose(dots, ref_dots, rtol=1e-4, atol=1e-4), "combine dot"

    def ragged():
        src, idx = cpu(37, 48).cuda(), torch.randint(0, 37, (29,), dtype=torch.int32).cuda()
        ptr = torch.tensor([0, 3, 3, 10, 29], dtype=torch.int32).cuda()
        out, _ = combine_rows_cuda(src, idx, None, 1, ptr=ptr)
        torch.cuda.synchronize()
        assert torch.allclose(out.float(), ops._sum_rows_torch(src, idx, ptr).float(), rtol=2**-7, atol=1e-6)

    return {"combine-weighted": lambda: case(True, False), "combine-sum": lambda: case(False, False),
            "combine-dot": lambda: case(True, True), "combine-ragged": ragged}  # fmt: skip


def _dispatch_cases():
    """The one-launch dispatch sort (cutegemm.epilogue.dispatch): ids with sentinels outside
    [0, E), int64 and int32, against its torch twin (exact)."""
    from cutegemm.epilogue.dispatch import dispatch_cuda, dispatch_ref

    def case(dtype):
        ids = torch.randint(-2, 19, (77,), dtype=dtype).cuda()
        out = dispatch_cuda(ids, 7, 17)
        torch.cuda.synchronize()
        for o, r in zip(out, dispatch_ref(ids, 7, 17), strict=True):
            assert torch.equal(o, r), "dispatch"

    return {"dispatch-int64": lambda: case(torch.int64), "dispatch-int32": lambda: case(torch.int32)}


def _optional_cases() -> dict:
    """Kernel families that exist only in some versions of the package (guarded): the dynamic
    (atomic tile counter) scheduler and the quantized-output (MXFP8) epilogue."""
    from cutegemm.config import can_implement

    out = {}
    a, b = cpu(M, K), cpu(K, N)
    try:
        dyn = cfg(tile_m=128, tile_n=128, scheduler="dynamic")
        if can_implement(dyn)[0]:
            out["coop-128x128-dynamic-scheduler"] = lambda: dense_case(
                a, b, dict(tile_m=128, tile_n=128, scheduler="dynamic"), alpha=0.5
            )
    except (TypeError, ValueError):
        pass
    try:
        qcfg = cfg(tile_m=128, tile_n=128, out_dtype="e4m3", epilogue=EpilogueSpec(quant="mxfp8"))
        if can_implement(qcfg)[0]:
            out["coop-quantized-out-mxfp8"] = lambda: quant_out_case(a, b[:, :256])  # N: a multiple of 32
            # decode-sized M: the policy's 64-row tiles (64x64 here: few tiles), FP4 output
            out["decode-quantized-out-mxfp4"] = lambda: quant_out_case(a[:20], b[:, :96], "mxfp4")
    except (TypeError, ValueError, KeyError):
        pass
    return out


def quant_out_case(a, b, fmt="mxfp8"):
    """gemm(out_dtype=fmt) (policy tile): dequantized result close to the fp64 product (the
    exact rules are tested in tests/gpu/test_quant_epilogue_gpu.py; this case is for the sanitizer)."""
    from cutegemm.blockscaled import dequantize_ref

    q = cutegemm.gemm(a.cuda(), b.cuda(), out_dtype=fmt)
    torch.cuda.synchronize()
    got = dequantize_ref(q).cpu().double()
    ref = a.double() @ b.double()
    assert got.shape == ref.shape and torch.isfinite(got).all(), "quantized output: shape / NaN"
    err = (got - ref).abs().max().item()
    tol = 0.2 if fmt == "mxfp8" else 0.4  # e2m1 steps of 1/6 of a block's max, its scale a power of 2
    assert err <= tol * ref.abs().max().item(), f"quantized output: max error {err:.4g}"


def _fp4_weight_cases():
    """FP4 weights x bf16 (cutegemm.blockscaled.weight_only.kernel): dense and grouped, every pipeline
    (TMA ring, its split grid, the WGMMA consumers, register prefetch, cp.async ring), ragged N and a K tail chunk, poisoned outputs with a
    guard row; rows past offs[-1] must stay poisoned."""
    import contextlib
    from unittest import mock

    from cutegemm.blockscaled import quantize_ref
    from cutegemm.blockscaled.weight_only import launch as fp4_api
    from cutegemm.blockscaled.weight_only.launch import gemm_fp4_weight, gemm_fp4_weight_ref, pick_config

    def case(fmt, grouped, shape):
        n, k = 200, shape.get("_k", 32 * 13)  # 3 full 128-K chunks + a 32-wide tail
        e = 3 if grouped else 1
        w = cpu(e, n, k) if grouped else cpu(n, k)
        qw = quantize_ref(w, fmt)
        counts = [9, 0, 30] if grouped else [shape.get("_rows", 21)]
        sms = shape.get("_sms")  # a faked SM count (the persistent grids' CTAs then take several units)
        shape = {key: v for key, v in shape.items() if key not in ("_rows", "_sms", "_k")}
        x = cpu(sum(counts) + 2, k)  # 2 rows past offs[-1] (grouped) / a guard (dense: sliced)
        offs = torch.tensor(counts).cumsum(0).to(torch.int32) if grouped else None
        rows = x.shape[0] if grouped else counts[0]
        # the mma.sync consumers' policy config (sm_100a's; sm_90a's takes the WGMMA ones here)
        cfg = replace(pick_config(rows, fmt, BF, "sm_100a", grouped, e), arch="sm_90a", **shape)
        buf = torch.full((x.shape[0] + 1, n), float("nan"), dtype=BF).cuda()
        out = buf[:rows]
        qg = type(qw)(qw.data.cuda(), qw.scales.cuda(), qw.fmt, qw.shape,
                      None if qw.global_scale is None else qw.global_scale.cuda(), qw.scales_swizzled)  # fmt: skip
        with mock.patch.object(fp4_api, "_sm_count", lambda index: sms) if sms else contextlib.nullcontext():
            gemm_fp4_weight(x[:rows].cuda(), qg, offs=to_gpu(offs), out=out, config=cfg)
        torch.cuda.synchronize()
        host = buf.cpu()
        end = sum(counts) if grouped else rows
        assert torch.isnan(host[end:]).all(), "fp4 weight: a row past the end was written"
        ref = gemm_fp4_weight_ref(x[:rows], qw, offs=offs, out_dtype=F32)[:end]
        got = host[:end].float()
        assert not torch.isnan(got).any(), "fp4 weight: unwritten outputs"
        err = (got - ref).abs().max().item()
        assert err <= 0.02 * ref.abs().max().item() + 1e-3, f"fp4 weight: max error {err:.4g}"

    out = {}
    for fmt in ("nvfp4", "mxfp4", "mxfp8"):
        for grouped in (False, True):
            pipelines = (
                ("tma", {}),  # the policy's TMA / bulk-copy ring
                # the WGMMA consumers, 16 tokens per pass: two passes, a K tail inside a stage
                ("wgmma", dict(wgmma=True, producer_pairs=False, ring=4, ring_k=4 if fmt == "mxfp8" else 2, row_tiles=1,
                               warps_n=8, warps_k=1, n_tiles=2, split=False)),  # fmt: skip
            )
            # 128 K per stage (two stages per loop trip, an odd tail), the producer warpgroup's registers
            pipelines += (("wgmma128k", {**pipelines[1][1], "ring": 3, "ring_k": 2 if fmt == "mxfp8" else 1,
                                         "producer_wg": True}),)  # fmt: skip
            # commit groups of 4 k16 steps; FP4: 256 tokens per pass (groups of 4 by default)
            pipelines += (("wgmma-g4", {**pipelines[2][1], "wg_steps": 4}),)
            if fmt != "mxfp8":
                pipelines += (("wgmma256t", {**pipelines[2][1], "n_tiles": 32}),)
            # 256 tokens per pass, outputs staged through shared memory (MXFP8: 64-K stages)
            mx8 = dict(ring=5, ring_k=1) if fmt == "mxfp8" else {}
            pipelines += (("wgmma256ss", {**pipelines[2][1], "n_tiles": 32, "staged_store": True, **mx8}),)
            pipelines += (("wgmma64ss", {**pipelines[1][1], "n_tiles": 8, "ring": 3, "staged_store": True}),)
            if not grouped:  # a CTA per (weight tile, 256-token pass): three passes, the last partial
                pipelines += (("wgmma256pc", {**pipelines[-2][1], "pass_ctas": 1, "_rows": 600}),
                              ("wgmma256pp", {**pipelines[-2][1], "pass_ctas": 2, "_rows": 600, "_sms": 4}))  # fmt: skip
                # the tail of the persistent grid cut 4 ways (6 units on 5 CTAs, 32 / 64 K stages each)
                pipelines += (("wgmma256ts", {**pipelines[-1][1], "tail_split": True, "_sms": 5, "_k": 4096}),)
            if fmt != "mxfp8":  # the per-thread pipelines (FP4 only)
                pipelines += (("regs", dict(ring=0, stages=0, row_tiles=1, warps_n=1, warps_k=2)),
                              ("cpasync", dict(ring=0, stages=4, row_tiles=1, warps_n=2, warps_k=4)))  # fmt: skip
            if not grouped:  # the split grid: segments cut between CTAs, several token passes
                pipelines += (("split", dict(split=True, n_tiles=1)),
                              ("wgmma-split", {**pipelines[1][1], "split": True}),
                              ("wgmma128k-split", {**pipelines[2][1], "split": True}))  # fmt: skip
            for name, shape in pipelines:
                g = "grouped" if grouped else "dense"
                out[f"fp4w-{fmt}-{g}-{name}"] = lambda f=fmt, gr=grouped, sh=shape: case(f, gr, sh)
    return out


def _fp8_cases():
    """FP8 e4m3 on sm_90a: row-wise promoted (128x192), DeepSeek block scales dense (the policy's
    wg_order tile: the warpgroups take turns through named barriers; and the 192-wide tile over
    two scale blocks of B, N's last tile with the second block clamped) and grouped (policy:
    wg_order 128x192 c1x2; empty experts, rows past offs[-1] poisoned), grouped row-wise (policy:
    128x192 c1x2 with the dynamic scheduler)."""
    from cutegemm import grouped_gemm, grouped_gemm_ref

    F8 = torch.float8_e4m3fn

    def dense(kind, config=None, m=300):
        n, k = 392, 640
        a, w = (cpu(m, k) * 2).to(F8), (cpu(n, k) * 2).to(F8)
        if kind == "rowwise":
            sa, sb = cpu(m, 1, dtype=F32).abs() + 0.1, cpu(1, n, dtype=F32).abs() + 0.1
        else:
            sa, sb = cpu(m, 5, dtype=F32).abs() + 0.1, cpu(5, 4, dtype=F32).abs() + 0.1
        buf = torch.full((m + 2, n), float("nan"), dtype=BF).cuda()
        cutegemm.gemm(a.cuda(), w.cuda().t(), scale_a=sa.cuda(), scale_b=sb.cuda(), out=buf[:m], config=config)
        torch.cuda.synchronize()
        host = buf.cpu()
        assert torch.isnan(host[m:]).all(), "fp8: a row past the output was written"
        ref = cutegemm.gemm_ref(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=F32)
        err = (host[:m].float() - ref).abs().max().item()
        assert err <= 0.02 * ref.abs().max().item(), f"fp8 {kind}: max error {err:.4g}"

    def grouped(kind="blockwise", fast=False, config=None):
        counts, n, k = [100, 0, 170, 9], 384, 512
        total = sum(counts) + 3
        a, w = (cpu(total, k) * 2).to(F8), (cpu(len(counts), n, k) * 2).to(F8)
        sa, sb = cpu(total, 4, dtype=F32).abs() + 0.1, cpu(len(counts), 4, 3, dtype=F32).abs() + 0.1
        if kind == "rowwise":  # policy: 128x192 with the dynamic scheduler, scales before the epilogue
            sa, sb = cpu(total, dtype=F32).abs() + 0.1, cpu(len(counts), n, dtype=F32).abs() + 0.1
        offs = torch.tensor(counts).cumsum(0).to(torch.int32)
        buf = torch.full((total, n), float("nan"), dtype=BF).cuda()
        grouped_gemm(a.cuda(), w.cuda().transpose(1, 2), offs=offs.cuda(), scale_a=sa.cuda(), scale_b=sb.cuda(), out=buf,
                     fast_accum=fast, config=config)  # fmt: skip
        torch.cuda.synchronize()
        host, end = buf.cpu(), sum(counts)
        assert torch.isnan(host[end:]).all(), f"grouped fp8 {kind}: a row past offs[-1] was written"
        ref = grouped_gemm_ref(a, w.transpose(1, 2), offs=offs, scale_a=sa, scale_b=sb, out_dtype=F32)[:end]
        err = (host[:end].float() - ref).abs().max().item()
        assert err <= 0.02 * ref.abs().max().item(), f"grouped fp8 {kind}: max error {err:.4g}"

    def fp8_out(out_dtype, config=None, m=300, k=640):
        """An FP8 output (saturated, stored by coordinate) into rows of a NaN-poisoned buffer."""
        n = 392
        a, w = (cpu(m, k) * 2).to(F8), (cpu(n, k) * 2).to(F8)
        sa, sb = cpu(m, 1, dtype=F32).abs() * 0.1 + 0.01, cpu(1, n, dtype=F32).abs() + 0.1
        buf = torch.full((m + 2, n), float("nan")).to(out_dtype).cuda()
        cutegemm.gemm(a.cuda(), w.cuda().t(), scale_a=sa.cuda(), scale_b=sb.cuda(), out=buf[:m], config=config)
        torch.cuda.synchronize()
        host = buf.cpu().float()
        assert torch.isnan(host[m:]).all(), "fp8 out: a row past the output was written"
        ref = cutegemm.gemm_ref(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype).float()
        acc_bound = 2.0**-12 * (a.float().abs() @ w.float().abs().t()) * sa * sb  # the FP8 accumulator's error
        bad = ((host[:m] - ref).abs() > 0.26 * ref.abs() + 1e-3 + acc_bound).sum().item()  # one step of e5m2: 25%
        assert bad == 0, f"fp8 out {out_dtype}: {bad} elements off the reference"

    return {
        "fp8-out-e4m3": lambda: fp8_out(F8),
        "fp8-out-e5m2-decode": lambda: fp8_out(torch.float8_e5m2, m=40, k=4096),  # the policy's decode pick
        "fp8-out-e4m3-split": lambda: fp8_out(F8, m=40, k=4096, config=GemmConfig(
            arch="sm_90a", a_dtype="e4m3", b_dtype="e4m3", out_dtype="e4m3", a_major="k", b_major="k", tile_m=64,
            tile_n=128, raster="n", group=1, form=Form.FLAT, split_k=2, epilogue=EpilogueSpec(scale_a=True, scale_b=True))),
        # the e4m3 decode rule's 1x4 cluster (small_m.QUAD_FP8): 4 N tiles, the last a partial one
        "fp8-out-e4m3-quad": lambda: fp8_out(F8, m=16, k=5120, config=GemmConfig(
            arch="sm_90a", a_dtype="e4m3", b_dtype="e4m3", out_dtype="e4m3", a_major="k", b_major="k", tile_m=64,
            tile_n=128, cluster_n=4, raster="m", group=1, epilogue=EpilogueSpec(scale_a=True, scale_b=True))),
        "fp8-rowwise-promoted": lambda: dense("rowwise"),
        "fp8-blockwise-wg-order": lambda: dense("blockwise"),
        "fp8-blockwise-192-wide": lambda: dense("blockwise", GemmConfig(
            arch="sm_90a", a_dtype="e4m3", b_dtype="e4m3", a_major="k", b_major="k", fp8_blockwise=True,
            tile_m=128, tile_n=192, cluster_m=2, wg_order=True)),
        # decode-sized M: the policy's one-warpgroup 64x64 tiles
        "fp8-rowwise-decode": lambda: dense("rowwise", m=40),
        "fp8-blockwise-decode": lambda: dense("blockwise", m=40),  # A's box of 48 rows
        "fp8-blockwise-decode-96": lambda: dense("blockwise", m=96),  # 96 rows of a 128-row tile
        "fp8-grouped-blockwise-wg-order": grouped,
        "fp8-grouped-rowwise-dynamic": lambda: grouped("rowwise"),
        # fast accumulation: the policy's swapped 128x192 c2x1; promoted swapped (a config only)
        "fp8-grouped-rowwise-fast-swap": lambda: grouped("rowwise", fast=True),
        "fp8-grouped-rowwise-swap-promoted": lambda: grouped("rowwise", config=GemmConfig(
            arch="sm_90a", a_dtype="e4m3", b_dtype="e4m3", b_major="k", form=Form.GROUPED, swap_ab=True, tile_m=128,
            tile_n=192, cluster_m=2, scheduler="dynamic", raster="m", group=1,
            epilogue=EpilogueSpec(scale_a=True, scale_b=True))),
    }


def all_cases() -> dict:
    return {
        **_dense_cases(),
        **_optional_cases(),
        **_grouped_cases(),
        "kgrouped": kgrouped_case,
        "kgrouped-col-major-a": lambda: kgrouped_case(a_col_major=True),
        "kgrouped-pingpong": lambda: kgrouped_case(
            a_col_major=True, m=1024, n=1024,
            config=cutegemm.GemmConfig(arch="sm_90a", form=Form.KGROUPED, a_major="m", tile_m=128, tile_n=128, pingpong=True,
                                       cluster_m=2)),
        "list": list_case,
        **_quantize_cases(),
        **_gated_cases(),
        **_combine_cases(),
        **_routed_tail_cases(),
        **_kgather_cases(),
        **_dispatch_cases(),
        **_fp4_weight_cases(),
        **_fp8_cases(),
    }


def _kernel_count() -> int:
    caches = (DENSE_CACHE, GROUPED_CACHE, quantize_kernels(), fp4_weight_kernels(), gated_kernels(), combine_kernels(),
              dispatch_kernels(), routed_kernels(), zero_tail_kernels())
    return sum(len(c._mem) for c in caches)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--list", action="store_true", help="print the case names and exit")
    p.add_argument("--only", default="", help="run the cases whose name matches this regex")
    args = p.parse_args(argv)
    cases = {k: v for k, v in all_cases().items() if re.search(args.only, k)}
    if args.list:
        print("\n".join(cases))
        return 0
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("sanitize.py: needs an sm_90 (Hopper) GPU: the cases are sm_90a kernels", file=sys.stderr)
        return 2
    failures = 0
    for name, fn in cases.items():
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - report every case, then fail
            failures += 1
            print(f"sanitize.py: FAIL {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
            traceback.print_exc()
    print(f"sanitize.py: cases={len(cases)} kernels={_kernel_count()} failures={failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
