"""Stress run: random cases across every family against the reference twins, plus determinism.

    python tools/stress.py --cases 1000 --seed 0 [--time-limit 220] [--families dense,grouped,kgrouped,list]

Families (drawn round-robin, then a random variant and random shapes / values per case):
- dense: a fixed menu of kernel variants (tile / cluster / cooperative or pingpong, majors, in and
  out dtypes, each epilogue op: alpha, beta*C, bias, relu, gelu, gelu_tanh, silu, swiglu, geglu),
  each forced through ``config=`` so the run compiles ~14 dense kernels, not one per shape; random
  M, N, K (partial tiles), batches (3-D, broadcast 2-D weight), alpha / beta / c / bias values;
- grouped: the packed MoE form with random offs (empty experts, rows past offs[-1]) on the three
  grouped tiles of the sm_90a policy, bf16 / fp16 / fp32 out, b as (E, K, N) or a transposed view;
- kgrouped: the K-grouped (weight-gradient) form, random splits including empty and misaligned ones;
- list: the list form, random per-group M, N, K (zeros included);
- fp4w: FP4 weights (NVFP4 / MXFP4) x bf16 activations, dense (half of them on the split grid)
  and the packed grouped form, random M / N / K (K a multiple of 32), empty experts, rows past
  offs[-1]; the reference is the bf16 matmul with the dequantized weights (exact in bf16).
- decode: dense calls of 1..128 rows through the policy (no forced config), so A's short TMA
  box (a_rows), the 64-row tiles and split K run as users get them: bf16 with a random epilogue
  (alpha, bias, an activation) or FP8 e4m3 row-wise; M from a small menu (one kernel per box
  size), random N and K (up to 8192, so split K is taken);
- swap: the packed grouped form through the swapped kernel (``swap_ab``: tokens on the MMA's N
  side), forced 128x192 / 128x128 / 128x256 tiles, and the grouped policy at few tokens per expert.
Outputs go into NaN-poisoned buffers; the check is the project's (tools/refcheck.py): error within
2x torch's own same-precision error vs an fp64 reference, nothing written outside the output, for
the packed form nothing at or past offs[-1]. Determinism: the first two cases of every variant
and ~5% of the rest run a second time into a fresh poisoned buffer and must be bitwise equal.

Prints per-family counts and ``stress: cases=N failures=F``; exits 1 on any failure. Needs an
sm_90 GPU (sm_100: the dense/grouped tiles are remapped to sm_100a defaults). The wall-time cap
stops drawing new cases (printed) so a slow machine still reports.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field, replace

FAMILIES = ("dense", "grouped", "kgrouped", "list", "fp4w", "fp8bw", "decode", "swap")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=1000, help="number of random cases (default 1000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-limit", type=float, default=220.0, help="stop drawing cases after this many s")
    p.add_argument("--families", default=",".join(FAMILIES), help=f"comma list from {FAMILIES}")
    p.add_argument("--max-failures", type=int, default=20, help="stop after this many failures")
    p.add_argument(
        "--dry-run", action="store_true", help="CPU, reference twins instead of kernels (tests the harness)"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="print every failure's traceback")
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------- variants
@dataclass(frozen=True)
class DenseVariant:
    name: str
    in_dtype: str = "bf16"
    out_dtype: str = "bf16"
    a_row: bool = True  # A row-major (K-major) or column-major (M-major)
    b_row: bool = True  # B row-major (N-major) or column-major (K-major, weight.t())
    alpha: bool = False
    beta: str = ""  # c dtype, "" = no beta*C
    bias: str = ""  # bias dtype, "" = no bias
    activation: str | None = None
    tile: dict = field(default_factory=dict)


DENSE = [
    DenseVariant("plain-kn-128x256-c2x1", tile=dict(tile_m=128, tile_n=256, cluster_m=2, raster="n")),
    DenseVariant("plain-kk-128x128", b_row=False, tile=dict(tile_m=128, tile_n=128)),
    DenseVariant("plain-mn-64x128", a_row=False, tile=dict(tile_m=64, tile_n=128, raster="n", group=1)),
    DenseVariant("fp32out-mk-pp128x128", out_dtype="fp32", a_row=False, b_row=False,
                 tile=dict(tile_m=128, tile_n=128, pingpong=True)),
    DenseVariant("fp16-alpha-kn-128x64-c1x2", in_dtype="fp16", out_dtype="fp16", alpha=True,
                 tile=dict(tile_m=128, tile_n=64, cluster_n=2)),
    DenseVariant("beta-bf16c-kk-128x128-c2x1", b_row=False, alpha=True, beta="bf16",
                 tile=dict(tile_m=128, tile_n=128, cluster_m=2)),
    DenseVariant("beta-fp32c-fp32out-kn-128x192", out_dtype="fp32", beta="fp32", tile=dict(tile_m=128, tile_n=192)),
    DenseVariant("bias-relu-kk-pp128x64", b_row=False, bias="bf16", activation="relu",
                 tile=dict(tile_m=128, tile_n=64, pingpong=True, raster="n", group=1)),
    DenseVariant("gelu-kk-128x256", b_row=False, activation="gelu", tile=dict(tile_m=128, tile_n=256)),
    DenseVariant("bias32-gelu_tanh-fp16out-kn-128x128", out_dtype="fp16", bias="fp32", activation="gelu_tanh",
                 tile=dict(tile_m=128, tile_n=128)),
    DenseVariant("silu-fp32out-mk-64x256-c1x2", out_dtype="fp32", a_row=False, b_row=False, activation="silu",
                 tile=dict(tile_m=64, tile_n=256, cluster_n=2)),
    DenseVariant("swiglu-kk-pp64x256-c1x2", b_row=False, activation="swiglu",
                 tile=dict(tile_m=64, tile_n=256, cluster_n=2, pingpong=True)),
    DenseVariant("geglu-bias-kn-128x128-c2x1", bias="fp32", alpha=True, activation="geglu",
                 tile=dict(tile_m=128, tile_n=128, cluster_m=2)),
    DenseVariant("fp16-beta-fp16c-kk-pp128x128", in_dtype="fp16", out_dtype="fp16", b_row=False, beta="fp16",
                 tile=dict(tile_m=128, tile_n=128, pingpong=True)),
]  # fmt: skip


@dataclass(frozen=True)
class GroupedVariant:
    name: str
    in_dtype: str = "bf16"
    out_dtype: str = "bf16"
    b_row: bool = True  # b (E, K, N) or (E, N, K).transpose(1, 2)
    alpha: bool = False
    tile: dict = field(default_factory=dict)


GT64 = dict(tile_m=64, tile_n=128, cluster_n=2)
GT128PP = dict(tile_m=128, tile_n=128, pingpong=True, cluster_n=2)
GT256 = dict(tile_m=128, tile_n=256, cluster_n=2)
GROUPED = [
    GroupedVariant("g-64x128-c1x2-kn", tile=GT64),
    GroupedVariant("g-64x128-c1x2-kk-fp16-alpha", in_dtype="fp16", out_dtype="fp16", b_row=False, alpha=True, tile=GT64),
    GroupedVariant("g-pp128x128-c1x2-kk", b_row=False, tile=GT128PP),
    GroupedVariant("g-pp128x128-c1x2-kn-alpha-fp32out", out_dtype="fp32", alpha=True, tile=GT128PP),
    GroupedVariant("g-128x256-c1x2-kk", b_row=False, tile=GT256),
    # tile orders inside an expert other than m fastest: bands of m-tiles along N / n-tiles along M
    GroupedVariant("g-128x128-c2x1-kk-band2", b_row=False, tile=dict(tile_m=128, tile_n=128, cluster_m=2, raster="n", group=2)),
    GroupedVariant("g-64x128-c1x2-kn-dyn-nband3", tile=dict(GT64, scheduler="dynamic", raster="m", group=3)),
]  # fmt: skip


# decode: (name, dtype, M choices, epilogue ops); M is one of the menu's values, N and K random
DECODE = [
    ("d-bf16", "bf16", (1, 16, 40), {}),
    ("d-bf16-bias-gelu", "bf16", (8, 72, 128), dict(bias=True, activation="gelu")),
    ("d-bf16-alpha-silu", "bf16", (33, 96), dict(alpha=True, activation="silu")),
    ("d-fp8-rowwise", "e4m3", (1, 16, 96, 128), {}),
]
SWAP = [
    ("s-128x192", dict(tile_m=128, tile_n=192, cluster_m=2, scheduler="dynamic")),
    ("s-128x128", dict(tile_m=128, tile_n=128, cluster_m=1)),
    ("s-128x256-alpha", dict(tile_m=128, tile_n=256, cluster_m=2, scheduler="dynamic")),
    ("s-policy", None),
]


# ---------------------------------------------------------------------------------------------- runner
class Runner:
    """One method per family: draws a case, runs it, checks it; returns (key, run, first, what)
    where ``run()`` repeats the call and returns what the determinism check compares (the whole
    poisoned buffer, or the list of outputs) and ``first`` is that from the checked run."""

    def __init__(self, seed: int, dry_run: bool = False):
        import refcheck
        import torch

        import cutegemm
        from cutegemm.config import GemmConfig
        from cutegemm.epilogue import EpilogueSpec

        if not dry_run and not torch.cuda.is_available():
            raise SystemExit(
                "stress: needs a CUDA GPU (sm_90 / sm_100); --dry-run tests the harness on the CPU"
            )
        self.torch, self.rc, self.Spec, self.Config = torch, refcheck, EpilogueSpec, GemmConfig
        self.rng = random.Random(seed)
        self.dry = dry_run
        self.dev = "cpu" if dry_run else "cuda"
        self.gen = torch.Generator(device=self.dev).manual_seed(seed)
        self.gemm, self.grouped_gemm = (
            _emulated(torch, cutegemm) if dry_run else (cutegemm.gemm, cutegemm.grouped_gemm)
        )
        self.dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
        major = 9 if dry_run else torch.cuda.get_device_capability()[0]
        if major not in (9, 10):
            raise SystemExit(f"stress: needs an sm_90 or sm_100 GPU, found sm_{major}x")
        self.arch = "sm_90a" if major == 9 else "sm_100a"
        self.det_seen: Counter = Counter()
        from cutegemm.blockscaled import quantize_ref
        from cutegemm.blockscaled.reference import dequantize_ref
        from cutegemm.blockscaled.weight_only import launch as fp4_weight_api

        self.fp4_api, self.dequantize_ref = fp4_weight_api, dequantize_ref
        self.quantize = quantize_ref if dry_run else cutegemm.quantize
        self.fp4_gemm = _emulated_fp4(fp4_weight_api) if dry_run else fp4_weight_api.gemm_fp4_weight

    # -- helpers
    def poisoned_run(self, shape, dtype, call, what):
        """(run, buf, out): ``run()`` calls ``call(out)`` with ``out`` a view of a fresh NaN-poisoned
        buffer and returns the buffer; it has run once here, and nothing outside ``out`` was
        written (out: the first ``shape[-2:]`` rows / columns of buf)."""

        def run():
            buf, out = self.rc.poisoned(shape, dtype, self.dev)
            call(out)
            return buf

        buf = run()
        self.sync()
        self.rc.assert_pad_untouched(buf, shape[-2], shape[-1], what)
        return run, buf, buf[..., : shape[-2], : shape[-1]]

    def sync(self):
        if not self.dry:
            self.torch.cuda.synchronize()

    def randn(self, *shape, dtype, scale=1.0):
        t = self.torch
        return t.randn(*shape, device=self.dev, generator=self.gen).mul_(scale).to(dtype)

    def operand(self, rows, cols, dtype, row_major, batch=None):
        shape = (rows, cols) if batch is None else (batch, rows, cols)
        if row_major:
            return self.randn(*shape, dtype=dtype)
        return self.randn(*shape[:-2], cols, rows, dtype=dtype).mT

    def tile(self, tile: dict) -> dict:
        if self.arch == "sm_90a":
            return tile
        return dict(tile_m=128, tile_n=128, cluster_m=1, cluster_n=1)  # sm_100a: one safe 1-CTA tile

    def want_det(self, variant) -> bool:
        self.det_seen[variant.name] += 1
        return self.det_seen[variant.name] <= 2 or self.rng.random() < 0.05

    def pick(self, choices):
        return self.rng.choice(choices)

    # -- families
    def dense(self):
        v: DenseVariant = self.pick(DENSE)
        rng, dt = self.rng, self.dt
        gated = v.activation in ("swiglu", "geglu")
        m = rng.randint(1, 700)
        if not v.a_row:
            m = 8 * max(1, m // 8)
        n_out = 8 * rng.randint(1, 96)
        n = 2 * n_out if gated else n_out
        k = 8 * rng.randint(1, 128)
        batch = rng.choice([None, None, None, 1, 3])
        b_batch = batch if batch is None or rng.random() < 0.6 else None  # 2-D weight broadcast over a batch
        a = self.operand(m, k, dt[v.in_dtype], v.a_row, batch)
        b = self.operand(k, n, dt[v.in_dtype], v.b_row, b_batch)
        out_shape = (m, n_out) if batch is None else (batch, m, n_out)
        ops = {}
        if v.alpha:
            ops["alpha"] = round(rng.uniform(0.25, 2.0) * rng.choice([-1, 1]), 3)
        if v.beta:
            ops["beta"] = round(rng.uniform(-1.5, 1.5), 3) or 0.5
            ops["c"] = self.randn(*out_shape, dtype=dt[v.beta])
        if v.bias:
            ops["bias"] = self.randn(n, dtype=dt[v.bias])
        if v.activation:
            ops["activation"] = v.activation
        cfg = replace(
            self.Config(arch=self.arch, a_dtype=v.in_dtype, b_dtype=v.in_dtype, out_dtype=v.out_dtype,
                        a_major="k" if v.a_row else "m", b_major="n" if v.b_row else "k"),
            **self.tile(v.tile),
        )  # fmt: skip

        def call(out):
            res = self.gemm(a, b, out=out, config=cfg, **ops)
            assert res.data_ptr() == out.data_ptr(), "out= was not used"

        what = f"dense {v.name} a{tuple(a.shape)} b{tuple(b.shape)} ops={sorted(ops)}"
        run, buf, out = self.poisoned_run(out_shape, dt[v.out_dtype], call, what)
        self.rc.check_dense(out, a, b, what=what, **ops)
        return v, run, buf, what

    def grouped(self):
        v: GroupedVariant = self.pick(GROUPED)
        rng, dt, torch = self.rng, self.dt, self.torch
        E = rng.choice([1, 2, 4, 8, 16, 32])
        mean = rng.choice([4, 32, 128, 400])
        counts = [0 if rng.random() < 0.2 else rng.randint(1, 2 * mean) for _ in range(E)]
        pad = rng.choice([0, 0, 3, 100])
        total = sum(counts) + pad
        n = 8 * rng.randint(1, 64)
        k = 8 * rng.randint(1, 96)
        a = self.randn(total, k, dtype=dt[v.in_dtype])
        b = self.operand(k, n, dt[v.in_dtype], v.b_row, batch=E)
        offs_list = list(_cumsum(counts))
        offs = torch.tensor(offs_list, dtype=torch.int32, device=self.dev)
        alpha = round(rng.uniform(0.25, 2.0) * rng.choice([-1, 1]), 3) if v.alpha else 1.0
        cfg = replace(
            self.Config(arch=self.arch, a_dtype=v.in_dtype, b_dtype=v.in_dtype, out_dtype=v.out_dtype,
                        a_major="k", b_major="n" if v.b_row else "k", form="grouped", raster="m", group=1,
                        epilogue=self.Spec(alpha=v.alpha)),
            **self.tile(v.tile),
        )  # fmt: skip

        what = f"grouped {v.name} counts={counts} pad={pad} n={n} k={k} alpha={alpha}"
        run, buf, out = self.poisoned_run(
            (total, n), dt[v.out_dtype], lambda out: self.grouped_gemm(a, b, offs=offs, out=out, alpha=alpha, config=cfg), what
        )
        self.rc.check_packed(out, a, b, offs_list, alpha=alpha, what=what)
        return v, run, buf, what

    def kgrouped(self):
        rng, torch = self.rng, self.torch
        E = rng.choice([1, 2, 3, 5, 8])
        counts = [0 if rng.random() < 0.2 else rng.randint(1, 200) for _ in range(E)]
        counts[-1] += -sum(counts) % 8  # a's row stride (total K) must be 16-byte aligned
        m, n = rng.randint(1, 300), 8 * rng.randint(1, 48)
        a = self.randn(m, sum(counts), dtype=torch.bfloat16)
        b = self.randn(sum(counts), n, dtype=torch.bfloat16)
        offs_list = list(_cumsum(counts))
        offs = torch.tensor(offs_list, dtype=torch.int32, device=self.dev)

        what = f"kgrouped counts={counts} m={m} n={n}"
        run, buf, out = self.poisoned_run(
            (E, m, n), torch.bfloat16, lambda out: self.grouped_gemm(a, b, offs=offs, out=out), what
        )
        self.rc.check_kgrouped(out, a, b, offs_list, what=what)
        return _KEY_KGROUPED, run, buf, what

    def list_form(self):
        rng, torch = self.rng, self.torch
        groups = rng.randint(1, 4)
        shapes = [(rng.choice([0, rng.randint(1, 300)]), 8 * rng.randint(0, 64), 8 * rng.randint(1, 48))
                  for _ in range(groups)]  # fmt: skip
        xs = [self.randn(mm, kk, dtype=torch.bfloat16) for mm, kk, _ in shapes]
        ws = [self.randn(kk, nn, dtype=torch.bfloat16) for _, kk, nn in shapes]

        def run():
            return self.grouped_gemm(xs, ws)

        what = f"list shapes={shapes}"
        outs = run()
        self.sync()
        assert len(outs) == groups, what
        for o, x, w in zip(outs, xs, ws, strict=True):
            self.rc.check_dense(o, x, w, what=what)
        return _KEY_LIST, run, outs, what

    def fp4w(self):
        rng, torch = self.rng, self.torch
        fmt = rng.choice(["nvfp4", "mxfp4"])
        grouped = rng.random() < 0.5
        split = not grouped and rng.random() < 0.5
        n, k = rng.randint(1, 600), 32 * rng.randint(1, 80)
        if grouped:
            E = rng.choice([1, 3, 8, 16])
            counts = [0 if rng.random() < 0.25 else rng.randint(1, 40) for _ in range(E)]
            total = sum(counts) + rng.choice([0, 0, 5])
            offs_list = list(_cumsum(counts))
            offs = torch.tensor(offs_list, dtype=torch.int32, device=self.dev)
        else:
            E, total, offs_list, offs = 1, rng.randint(1, 80), None, None
        qw = self.quantize(self.randn(*((E, n, k) if grouped else (n, k)), dtype=torch.bfloat16), fmt)
        wd = self.dequantize_ref(qw)  # fp32: NVFP4's global scale does not fit bf16 exactly
        x = self.randn(total, k, dtype=torch.bfloat16)
        cfg = self.fp4_api.pick_config(max(total, 1), fmt, torch.bfloat16, self.arch, grouped, E)
        if split:
            cfg = replace(cfg, split=True)

        what = f"fp4w {cfg.name} total={total} n={n} k={k} counts={offs_list}"
        run, buf, out = self.poisoned_run(
            (total, n), torch.bfloat16, lambda out: self.fp4_gemm(x, qw, offs=offs, out=out, config=cfg), what
        )
        self.rc.check_fp4w(out, x, wd, offs_list, what=what)
        return _Key(f"fp4w-{cfg.name}"), run, buf, what

    def fp8bw(self):
        """FP8 e4m3 with DeepSeek block scales (sm_90a), dense or packed grouped, scales over
        4 decades: the policy's tile or a forced one (128x192 over two B scale blocks, pingpong
        64x64, 128x128 with warpgroup turns)."""
        rng, torch = self.rng, self.torch
        f8 = torch.float8_e4m3fn
        grouped = rng.random() < 0.4
        n, k = 16 * rng.randint(1, 64), 16 * rng.randint(1, 64)
        kb, nb = -(-k // 128), -(-n // 128)
        tiles = [None, dict(tile_m=128, tile_n=192, wg_order=True), dict(tile_m=128, tile_n=128, wg_order=True)]
        if not grouped:
            tiles.append(dict(tile_m=64, tile_n=64, pingpong=True))
        # (one K block and one N block: per-row x per-tensor scales, the row-wise kernel's; a
        # forced block-scaled config is refused there)
        tile = rng.choice(tiles) if kb * nb > 1 else None

        def scales(*shape):
            return 10.0 ** (torch.rand(*shape, device=self.dev, generator=self.gen) * 4 - 2)

        if grouped:
            E = rng.choice([1, 3, 8])
            counts = [0 if rng.random() < 0.2 else rng.randint(1, 300) for _ in range(E)]
            total = sum(counts) + rng.choice([0, 5])
            offs_list = list(_cumsum(counts))
            offs = torch.tensor(offs_list, dtype=torch.int32, device=self.dev)
            a = self.randn(total, k, dtype=torch.float32, scale=3).to(f8)
            b = self.randn(E, n, k, dtype=torch.float32, scale=3).to(f8).transpose(1, 2)
            sa, sb = scales(total, kb), scales(E, nb, kb).transpose(1, 2)
            out_shape = (total, n)
        else:
            m = rng.randint(1, 700)
            offs_list = offs = None
            a = self.randn(m, k, dtype=torch.float32, scale=3).to(f8)
            b = self.randn(n, k, dtype=torch.float32, scale=3).to(f8).t()
            sa, sb = scales(m, kb), scales(kb, nb)
            out_shape = (m, n)
        if rng.random() < 0.5:  # torch's M-major scale_a: TMA-loaded in place when rows % 4 == 0
            sa = sa.t().contiguous().t()
        cfg = None
        if tile is not None:
            cfg = self.Config(arch=self.arch, a_dtype="e4m3", b_dtype="e4m3", a_major="k", b_major="k",
                              fp8_blockwise=True, form="grouped" if grouped else "dense", raster="m" if grouped else "n",
                              group=1 if grouped else 8, **tile)  # fmt: skip

        def call(out):
            if grouped:
                return self.grouped_gemm(a, b, offs=offs, out=out, scale_a=sa, scale_b=sb, config=cfg)
            return self.gemm(a, b, out=out, scale_a=sa, scale_b=sb, config=cfg)

        what = f"fp8bw {'grouped' if grouped else 'dense'} tile={tile} a{tuple(a.shape)} n={n} k={k} counts={offs_list}"
        run, buf, out = self.poisoned_run(out_shape, torch.bfloat16, call, what)
        self.rc.check_fp8_blockwise(out, a, b, sa, sb, offs_list, what=what)
        return _Key(f"fp8bw-{'g' if grouped else 'd'}-{tile}"), run, buf, what

    def decode(self):
        """Dense 1..128-row calls through the policy (box, 64-row tiles, split K)."""
        rng, torch = self.rng, self.torch
        name, dtype, ms, opts = self.pick(DECODE)
        m = rng.choice(ms)
        n = 8 * rng.randint(8, 640)
        k = 8 * rng.randint(8, 1024)
        if dtype == "e4m3":
            k = 16 * (k // 16)  # a 1-byte A's rows: 16-byte aligned for TMA (else a clear ValueError)
            f8 = torch.float8_e4m3fn
            a = self.randn(m, k, dtype=torch.float32, scale=3).to(f8)
            b = self.randn(n, k, dtype=torch.float32, scale=3).to(f8).t()
            sa = torch.rand(m, 1, device=self.dev, generator=self.gen) + 0.5
            sb = torch.rand(1, n, device=self.dev, generator=self.gen) + 0.5
            what = f"decode {name} m={m} n={n} k={k}"
            run, buf, out = self.poisoned_run(
                (m, n), torch.bfloat16, lambda out: self.gemm(a, b, out=out, scale_a=sa, scale_b=sb), what
            )
            self.rc.check_fp8_blockwise(out, a, b, sa, sb, None, what=what)
            return _Key(f"{name}-m{m}"), run, buf, what
        a = self.randn(m, k, dtype=torch.bfloat16)
        b = self.randn(n, k, dtype=torch.bfloat16).t()  # weights (N, K), as nn.Linear stores them
        ops = {}
        if opts.get("alpha"):
            ops["alpha"] = round(rng.uniform(0.25, 2.0) * rng.choice([-1, 1]), 3)
        if opts.get("bias"):
            ops["bias"] = self.randn(n, dtype=torch.bfloat16)
        if opts.get("activation"):
            ops["activation"] = opts["activation"]

        def call(out):
            res = self.gemm(a, b, out=out, **ops)
            assert res.data_ptr() == out.data_ptr(), "out= was not used"

        what = f"decode {name} m={m} n={n} k={k} ops={sorted(ops)}"
        run, buf, out = self.poisoned_run((m, n), torch.bfloat16, call, what)
        self.rc.check_dense(out, a, b, what=what, **ops)
        return _Key(f"{name}-m{m}"), run, buf, what

    def swap(self):
        """The packed grouped form through the swapped kernel (forced tiles or the policy's)."""
        rng, torch = self.rng, self.torch
        name, tile = self.pick(SWAP)
        E = rng.choice([1, 3, 8, 32])
        mean = rng.choice([8, 32, 100, 300])
        counts = [0 if rng.random() < 0.2 else rng.randint(1, 2 * mean) for _ in range(E)]
        pad = rng.choice([0, 0, 7])
        total = sum(counts) + pad
        n = 64 * rng.randint(1, 48)
        k = 64 * rng.randint(1, 64)
        a = self.randn(total, k, dtype=torch.bfloat16)
        b = self.operand(k, n, torch.bfloat16, rng.random() < 0.5, batch=E)
        offs_list = list(_cumsum(counts))
        offs = torch.tensor(offs_list, dtype=torch.int32, device=self.dev)
        alpha = round(rng.uniform(0.25, 2.0) * rng.choice([-1, 1]), 3) if "alpha" in name else 1.0
        cfg = None
        if tile is not None and self.arch == "sm_90a":
            b_major = "n" if b.stride(-1) == 1 else "k"
            cfg = self.Config(arch=self.arch, a_major="k", b_major=b_major, form="grouped", swap_ab=True, raster="m",
                              group=1, epilogue=self.Spec(alpha=alpha != 1.0), **tile)  # fmt: skip

        what = f"swap {name} counts={counts} pad={pad} n={n} k={k} alpha={alpha}"
        run, buf, out = self.poisoned_run(
            (total, n), torch.bfloat16, lambda out: self.grouped_gemm(a, b, offs=offs, out=out, alpha=alpha, config=cfg), what
        )
        self.rc.check_packed(out, a, b, offs_list, alpha=alpha, what=what)
        return _Key(name), run, buf, what

    def determinism(self, run, first) -> bool:
        """Second run, bitwise comparison with the first (poison included)."""
        second = run()
        self.sync()
        if isinstance(first, list):
            return all(self.rc.bitwise_equal(x, y) for x, y in zip(first, second, strict=True))
        return self.rc.bitwise_equal(first, second)


def _emulated(torch, cg):
    """--dry-run: the reference twins in place of the kernels (CPU), to test this harness."""

    def gemm(a, b, *, out, config=None, **ops):
        return out.copy_(cg.gemm_ref(a, b, out_dtype=out.dtype, **ops))

    def grouped_gemm(a, b, *, offs=None, out=None, alpha=1.0, config=None, **ops):
        if isinstance(a, list):
            return cg.grouped_gemm_ref(a, b, alpha=alpha)
        ref = cg.grouped_gemm_ref(a, b, offs=offs, alpha=alpha, out_dtype=out.dtype, **ops)
        if b.dim() == 2:
            return out.copy_(ref)
        end = int(offs[-1]) if offs.numel() else 0
        out[:end] = ref[:end]
        return out

    return gemm, grouped_gemm


def _emulated_fp4(api):
    """--dry-run: the FP4-weight reference twin in place of the kernel (rows past offs[-1] kept)."""

    def gemm_fp4_weight(x, qw, *, offs=None, out=None, config=None):
        ref = api.gemm_fp4_weight_ref(x, qw, offs=offs, out_dtype=out.dtype)
        end = out.shape[0] if offs is None else (int(offs[-1]) if offs.numel() else 0)
        out[:end] = ref[:end]
        return out

    return gemm_fp4_weight


@dataclass(frozen=True)
class _Key:
    name: str


_KEY_KGROUPED, _KEY_LIST = _Key("kgrouped"), _Key("list")


def _cumsum(counts):
    s = 0
    for c in counts:
        s += c
        yield s


def main(argv=None) -> int:
    args = parse_args(argv)
    families = [f for f in args.families.split(",") if f]
    bad = set(families) - set(FAMILIES)
    if bad:
        raise SystemExit(f"unknown families {sorted(bad)}; choose from {FAMILIES}")
    runner = Runner(args.seed, dry_run=args.dry_run)
    fns = {
        "dense": runner.dense,
        "grouped": runner.grouped,
        "kgrouped": runner.kgrouped,
        "list": runner.list_form,
        "fp4w": runner.fp4w,
        "fp8bw": runner.fp8bw,
        "decode": runner.decode,
        "swap": runner.swap,
    }
    counts, fails, det_checked, det_fail = Counter(), Counter(), 0, 0
    t0 = time.time()
    done = 0
    for i in range(args.cases):
        if time.time() - t0 > args.time_limit:
            print(
                f"stress: note: wall-time limit {args.time_limit:.0f} s reached after {done} of {args.cases} cases"
            )
            break
        fam = families[i % len(families)]
        counts[fam] += 1
        done += 1
        try:
            key, run, first, what = fns[fam]()
            if runner.want_det(key):
                det_checked += 1
                if not runner.determinism(run, first):
                    det_fail += 1
                    fails[fam] += 1
                    print(f"stress: NOT DETERMINISTIC: {what}")
        except Exception as exc:  # noqa: BLE001 - every failure is reported, then the run goes on
            fails[fam] += 1
            print(f"stress: FAIL case {i} ({fam}): {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
            if args.verbose:
                traceback.print_exc()
            if sum(fails.values()) >= args.max_failures:
                print(f"stress: stopping after {args.max_failures} failures")
                break
    elapsed = time.time() - t0
    for fam in families:
        print(f"stress: {fam:9s} cases={counts[fam]} failures={fails[fam]}")
    print(
        f"stress: determinism checked={det_checked} mismatches={det_fail} (variants: {len(runner.det_seen)})"
    )
    total_fail = sum(fails.values())
    print(f"stress: cases={done} failures={total_fail} seconds={elapsed:.0f}")
    return 1 if total_fail else 0


if __name__ == "__main__":
    sys.exit(main())
