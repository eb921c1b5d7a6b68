"""Bad-input suite on a GPU: every public function given wrong dtypes, devices, shapes, strides,
misaligned pointers, views it cannot take, offs of the wrong dtype / length / device, and empty
problems (M = 0, E = 0, K = 0). Each case must give the right result or a clear ValueError /
TypeError: never a crash, a hang or a silent wrong result.

Table-driven: a :class:`Case` names a family (which public function, which reference twin), a
builder that makes the arguments on the GPU at test time, and the expectation: an exception type
(plus a message pattern) or "ok". "ok" results are written into NaN-poisoned outputs where the
function takes ``out`` and compared with the family's reference twin (fp64 math; our error within
2x torch's own same-precision error, see tests/gemm_check.py); nothing outside the output may be
written. Then offs *contents* (negative, decreasing, past the end) on the graph-safe packed path:
no fault, every row outside the clamped groups untouched, check_offs=True raises ValueError.

Few distinct kernels (~12 compiles): "ok" shapes are small and share tiles and epilogues.
The CPU half is tests/test_bad_inputs_cpu.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest
import torch

import cutegemm
import cutegemm.ops  # noqa: F401  (registers torch.ops.cutegemm)
from cutegemm.blockscaled import dequantize_ref, quantize_ref
from cutegemm.config import Form, GemmConfig
from cutegemm.epilogue import epilogue_ref
from cutegemm.nn import GroupedExperts
from cutegemm.schedulers.grouped import expert_rows

from ..gemm_check import assert_outside_untouched, assert_within_torch_error

pytestmark = pytest.mark.gpu

BF, F16, F32 = torch.bfloat16, torch.float16, torch.float32
OP = torch.ops.cutegemm
EPI_KEYS = ("alpha", "beta", "c", "bias", "activation", "gate_layout")


# ---------------------------------------------------------------------------------------------- builders
def g(*shape, dtype=BF, scale=1.0):
    """Random data on the GPU (never zeros)."""
    return torch.randn(*shape, device="cuda").mul_(scale).to(dtype)


def colmajor(rows, cols, dtype=BF):
    return g(cols, rows, dtype=dtype).t()


def misaligned(*shape, dtype=BF):
    """A contiguous view whose data pointer is one element past a 16-byte boundary."""
    n = 1
    for s in shape:
        n *= s
    return g(n + 1, dtype=dtype)[1:].view(*shape)


def offs_of(*counts, device="cuda", dtype=torch.int32):
    return torch.tensor(counts, dtype=torch.int64).cumsum(0).to(dtype=dtype, device=device)


def arch():
    return "sm_90a" if torch.cuda.get_device_capability()[0] == 9 else "sm_100a"


def other_arch():
    return "sm_100a" if arch() == "sm_90a" else "sm_90a"


def cfg(**kw):
    return replace(GemmConfig(arch=arch(), a_major="k", b_major="n"), **kw)


@dataclass(frozen=True)
class Case:
    """``build()`` -> (args, kwargs) for the family's function; ``expect`` an exception type (or a
    tuple), message ``match``; or "ok": the result is checked against the family's reference."""

    id: str
    family: str
    build: Callable
    expect: type[BaseException] | tuple | str = "ok"
    match: str | None = None
    marks: tuple = ()


FAMILIES = {
    "gemm": lambda *a, **k: cutegemm.gemm(*a, **k),
    "grouped": lambda *a, **k: cutegemm.grouped_gemm(*a, **k),
    "op_gemm": lambda *a, **k: OP.gemm(*a, **k),
    "op_grouped": lambda *a, **k: OP.grouped_gemm(*a, **k),
    "experts": lambda x, offs, e=2, h=64, i=32, **k: GroupedExperts(e, h, i, device="cuda", **k)(x, offs),
    "quantize": lambda *a, **k: cutegemm.quantize(*a, **k),
}


# ---------------------------------------------------------------------------------------------- references
def _snapshot(v):
    if isinstance(v, torch.Tensor):
        return v.clone()
    if isinstance(v, (list, tuple)):
        return type(v)(_snapshot(x) for x in v)
    return v


def check_dense(out, a, b, kw):
    if out.numel() == 0:
        return
    ops = {k: kw[k] for k in EPI_KEYS if k in kw}
    d = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in ops.items()}
    ref = cutegemm.gemm_ref(a.double(), b.double(), out_dtype=torch.float64, compute_dtype=torch.float64, **d)
    same = epilogue_ref(torch.matmul(a, b).float(), **ops).to(out.dtype)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert_within_torch_error(out, same, ref, what="gemm")


def check_packed(out, a, b, offs, alpha=1.0):
    """Rows of every (valid) expert against the reference; rows at or past offs[-1] are
    unspecified (the poison check of the runner covers them)."""
    end = int(offs[-1]) if offs.numel() else 0
    if end == 0 or out.shape[1] == 0:
        return
    ref = cutegemm.grouped_gemm_ref(a, b, offs=offs, alpha=alpha, compute_dtype=torch.float64)
    bounds = [0, *offs.tolist()]
    same = torch.cat(
        [
            (a[s:t] @ b[e]).float() * alpha
            for e, (s, t) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
        ]
    )
    assert_within_torch_error(out[:end], same.to(out.dtype), ref[:end], what="grouped")


def check_kgrouped(out, a, b, offs, alpha=1.0):
    ref = cutegemm.grouped_gemm_ref(a, b, offs=offs, alpha=alpha, compute_dtype=torch.float64)
    bounds = [0, *offs.tolist()]
    same = (
        torch.stack(
            [(a[:, s:t] @ b[s:t]).float() * alpha for s, t in zip(bounds[:-1], bounds[1:], strict=True)]
        )
        if bounds[1:]
        else ref
    )
    assert out.shape == ref.shape
    if out.numel():
        assert_within_torch_error(out, same.to(out.dtype), ref, what="k-grouped")


def check_ok(case: Case, args, kw, result):
    """The family's reference check of an "ok" result (args/kw are snapshots taken before the call)."""
    f = case.family
    if f in ("gemm", "op_gemm"):
        a, b = args[:2]
        if f == "op_gemm" and len(args) > 2:
            kw = {**kw, "bias": args[2]}
        check_dense(result, a, b, {k: v for k, v in kw.items() if k != "out"})
    elif f in ("grouped", "op_grouped"):
        a, b = args[:2]
        offs = kw.get("offs", args[2] if len(args) > 2 else None)
        alpha = kw.get("alpha", 1.0)
        if isinstance(a, (list, tuple)):
            assert isinstance(result, list) and len(result) == len(a)
            for o, x, w in zip(result, a, b, strict=True):
                check_dense(o, x, w, {"alpha": alpha})
        elif b.dim() == 3:
            assert result.shape == (a.shape[0], b.shape[2])
            check_packed(result, a, b, offs, alpha)
        else:
            check_kgrouped(result, a, b, offs, alpha)
    elif f == "quantize":
        x = args[0]
        ref = quantize_ref(x, args[1], **kw)
        for name in ("data", "scales"):
            ours, theirs = getattr(result, name), getattr(ref, name)
            assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, name
            assert torch.equal(ours.view(torch.uint8), theirs.view(torch.uint8)), (
                f"{name} differs from quantize_ref"
            )
        torch.testing.assert_close(
            dequantize_ref(result), dequantize_ref(ref), rtol=0, atol=0, equal_nan=True
        )
    else:
        raise AssertionError(f"no reference for family {f}")


# ---------------------------------------------------------------------------------------------- the table
def _gemm_errors():
    E = "gemm"
    sq = lambda: g(64, 64)  # noqa: E731
    return [
        Case("a-fp32", E, lambda: ((g(64, 64, dtype=F32), sq()), {}), TypeError, "a.dtype"),
        Case("a-int8", E, lambda: ((sq().to(torch.int8), sq().to(torch.int8)), {}), TypeError, "a.dtype"),
        Case("a-fp8-b-bf16", E, lambda: ((sq().to(torch.float8_e4m3fn), sq()), {}), TypeError, "b.dtype"),
        Case("fp8-scale-bf16", E, lambda: ((sq().to(torch.float8_e4m3fn), sq().to(torch.float8_e4m3fn)),
                                           {"scale_a": torch.ones(1, device="cuda", dtype=torch.bfloat16)}),
             TypeError, "float32"),  # fmt: skip
        Case("bf16-with-scale", E, lambda: ((sq(), sq()), {"scale_a": torch.ones(1, device="cuda")}), ValueError, "float8"),
        Case("b-dtype-mismatch", E, lambda: ((sq(), g(64, 64, dtype=F16)), {}), TypeError, "b.dtype"),
        Case("out-dtype-int", E, lambda: ((sq(), sq()), {"out_dtype": torch.int32}), TypeError, "out_dtype"),
        Case(
            "out-dtype-f64", E, lambda: ((sq(), sq()), {"out_dtype": torch.float64}), TypeError, "out_dtype"
        ),
        Case("out-dtype-str", E, lambda: ((sq(), sq()), {"out_dtype": "mxfp7"}), ValueError, "out_dtype"),
        Case(
            "nvfp4-out-no-global-scale",
            E,
            lambda: ((sq(), sq()), {"out_dtype": "nvfp4"}),
            ValueError,
            "out_global_scale",
        ),
        Case(
            "mxfp8-out-global-scale",
            E,
            lambda: ((sq(), sq()), {"out_dtype": "mxfp8", "out_global_scale": 1.0}),
            ValueError,
            "NVFP4",
        ),
        Case(
            "out-quant-with-out",
            E,
            lambda: ((sq(), sq()), {"out_dtype": "mxfp8", "out": g(64, 64)}),
            ValueError,
            "out= is not supported",
        ),
        Case("b-cpu", E, lambda: ((sq(), sq().cpu()), {}), ValueError, "b must be a CUDA tensor"),
        Case("a-cpu", E, lambda: ((sq().cpu(), sq()), {}), ValueError, "a must be a CUDA tensor"),
        Case("a-list", E, lambda: (([[1.0]], sq()), {}), TypeError, "a must be a torch.Tensor"),
        Case("b-none", E, lambda: ((sq(), None), {}), TypeError, "b must be a torch.Tensor"),
        Case("a-1d", E, lambda: ((g(64), sq()), {}), ValueError, "dims"),
        Case("a-4d", E, lambda: ((g(1, 2, 64, 64), sq()), {}), ValueError, "dims"),
        Case("k-mismatch", E, lambda: ((g(64, 64), g(32, 64)), {}), ValueError, "do not match"),
        Case("batch-mismatch", E, lambda: ((g(2, 64, 64), g(3, 64, 64)), {}), ValueError, "batch sizes"),
        Case("out-shape", E, lambda: ((sq(), sq()), {"out": g(64, 32)}), ValueError, "out must have shape"),
        Case(
            "out-dtype-vs-out",
            E,
            lambda: ((sq(), sq()), {"out": g(64, 64), "out_dtype": F32}),
            TypeError,
            "out.dtype",
        ),
        Case("out-colmajor", E, lambda: ((sq(), sq()), {"out": colmajor(64, 64)})),  # staged: scratch + copy
        Case("out-misaligned", E, lambda: ((sq(), sq()), {"out": misaligned(64, 64)})),  # staged
        Case("out-cpu", E, lambda: ((sq(), sq()), {"out": g(64, 64).cpu()}), ValueError, "CUDA"),
        Case("out-list", E, lambda: ((sq(), sq()), {"out": [0.0]}), TypeError, "out must be a torch.Tensor"),
        Case("lda-unaligned", E, lambda: ((g(64, 60), g(60, 64)), {})),  # staged: an aligned copy of a
        Case("ldb-unaligned", E, lambda: ((sq(), g(64, 60)), {})),  # staged, and the odd N out padded
        Case("colmajor-a-unaligned", E, lambda: ((colmajor(60, 64), sq()), {})),  # staged
        Case(
            "gated-odd-n",
            E,
            lambda: ((sq(), g(64, 72)[:, :65]), {"activation": "swiglu"}),
            ValueError,
            "even",
        ),
        Case("beta-no-c", E, lambda: ((sq(), sq()), {"beta": 1.0}), ValueError, "needs the residual"),
        Case(
            "beta-gated",
            E,
            lambda: ((sq(), sq()), {"beta": 1.0, "c": g(64, 32), "activation": "geglu"}),
            ValueError,
            "gated",
        ),
        Case("c-shape", E, lambda: ((sq(), sq()), {"beta": 1.0, "c": g(64, 32)}), ValueError, "c must have"),
        Case("c-int", E, lambda: ((sq(), sq()), {"beta": 1.0, "c": sq().int()}), TypeError, "c.dtype"),
        Case("c-cpu", E, lambda: ((sq(), sq()), {"beta": 1.0, "c": sq().cpu()}), ValueError, "CUDA"),
        Case(
            "c-list",
            E,
            lambda: ((sq(), sq()), {"beta": 1.0, "c": [1.0]}),
            TypeError,
            "c must be a torch.Tensor",
        ),
        Case("bias-shape", E, lambda: ((sq(), sq()), {"bias": g(32)}), ValueError, "bias must have shape"),
        Case("bias-2d", E, lambda: ((sq(), sq()), {"bias": g(1, 64)}), ValueError, "bias must have shape"),
        Case("bias-int", E, lambda: ((sq(), sq()), {"bias": g(64).int()}), TypeError, "bias.dtype"),
        Case("bias-cpu", E, lambda: ((sq(), sq()), {"bias": g(64).cpu()}), ValueError, "bias must be on"),
        Case(
            "bias-list",
            E,
            lambda: ((sq(), sq()), {"bias": [0.0] * 64}),
            TypeError,
            "bias must be a torch.Tensor",
        ),
        Case(
            "activation-unknown", E, lambda: ((sq(), sq()), {"activation": "tanh"}), ValueError, "activation"
        ),
        Case(
            "gate-layout-unknown", E, lambda: ((sq(), sq()), {"gate_layout": "x"}), ValueError, "gate_layout"
        ),
        Case("config-bad-tile", E, lambda: ((sq(), sq()), {"config": cfg(tile_m=96)}), ValueError, "tile_m"),
        Case(
            "config-wrong-major",
            E,
            lambda: ((sq(), sq()), {"config": cfg(b_major="k")}),
            ValueError,
            "b_major",
        ),
        Case(
            "config-wrong-dtype",
            E,
            lambda: ((sq(), sq()), {"config": cfg(out_dtype="fp32")}),
            ValueError,
            "out_dtype",
        ),
        Case(
            "config-other-arch",
            E,
            lambda: ((sq(), sq()), {"config": cfg(arch=other_arch())}),
            ValueError,
            "arch",
        ),
        Case(
            "config-grouped", E, lambda: ((sq(), sq()), {"config": cfg(form=Form.GROUPED)}), ValueError, "grouped"
        ),
        # flat configs (2-D launches) take the caller's 2-D tensors only
        Case("config-flat-batched", E, lambda: ((g(3, 64, 64), sq()), {"config": cfg(form=Form.FLAT)}), ValueError, "flat"),
        Case("config-flat-strided-out", E, lambda: ((sq(), sq()), {"config": cfg(form=Form.FLAT), "out": g(64, 80)[:, :64]})),
        Case("config-flat-2d", E, lambda: ((sq(), sq()), {"config": cfg(form=Form.FLAT)})),
        Case(
            "config-wrong-epilogue",
            E,
            lambda: ((sq(), sq()), {"config": cfg(epilogue=cutegemm.EpilogueSpec(bias=True))}),
            ValueError,
            "epilogue",
        ),
        Case(
            "devices-differ",
            E,
            lambda: ((sq(), g(64, 64).to("cuda:1")), {}),
            ValueError,
            "device",
            marks=(pytest.mark.multigpu,),
        ),
    ]


def _gemm_ok():
    E = "gemm"

    def strided_view():  # no unit stride at all: copied
        return (g(64, 256)[:, ::2], g(128, 72)), {}

    def aliased_c():  # c is out itself (documented as allowed)
        o = g(96, 72)
        return (g(96, 64), g(64, 72)), {"out": o, "c": o, "beta": 0.5}

    return [
        Case("misaligned-a", E, lambda: ((misaligned(96, 64), g(64, 72)), {})),
        Case("misaligned-b", E, lambda: ((g(96, 64), misaligned(64, 72)), {})),
        Case("misaligned-colmajor-a", E, lambda: ((misaligned(64, 96).t(), g(64, 72)), {})),
        Case("no-unit-stride-a", E, strided_view),
        Case("batched-a-not-foldable", E, lambda: ((g(40, 3, 64).transpose(0, 1), g(64, 72)), {})),
        Case("expanded-b", E, lambda: ((g(3, 40, 64), g(64, 72).expand(3, 64, 72)), {})),
        Case("broadcast-a", E, lambda: ((g(40, 64), g(2, 64, 72)), {})),
        Case("tiny-1x8x8", E, lambda: ((g(1, 8), g(8, 8)), {})),
        Case("M0", E, lambda: ((g(0, 64), g(64, 72)), {})),
        Case("N0", E, lambda: ((g(96, 64), g(64, 0)), {})),
        Case("K0", E, lambda: ((g(96, 0), g(0, 72)), {})),
        Case("L0", E, lambda: ((g(0, 96, 64), g(0, 64, 72)), {})),
        Case(
            "K0-epilogue",
            E,
            lambda: (
                (g(96, 0), g(0, 72)),
                {"bias": g(72), "beta": 2.0, "c": g(96, 72), "activation": "relu", "alpha": 3.0},
            ),
        ),
        Case("misaligned-c", E, lambda: ((g(96, 64), g(64, 72)), {"beta": 1.0, "c": misaligned(96, 72)})),
        Case("colmajor-c", E, lambda: ((g(96, 64), g(64, 72)), {"beta": 1.0, "c": colmajor(96, 72)})),
        Case("c-is-out", E, aliased_c),
        Case("misaligned-bias", E, lambda: ((g(96, 64), g(64, 72)), {"bias": misaligned(72, dtype=F32)})),
        Case("strided-bias", E, lambda: ((g(96, 64), g(64, 72)), {"bias": g(144, dtype=F32)[::2]})),
        Case(
            "halves-gated",
            E,
            lambda: ((g(96, 64), g(64, 144)), {"activation": "swiglu", "gate_layout": "halves"}),
        ),
        Case("out-fp32", E, lambda: ((g(96, 64), g(64, 72)), {"out_dtype": F32})),
    ]


def _grouped_errors():
    E = "grouped"
    a, b = (lambda: g(64, 32)), (lambda: g(4, 32, 64))
    o4 = lambda **k: offs_of(16, 16, 16, 16, **k)  # noqa: E731
    return [
        Case("offs-int64", E, lambda: ((a(), b()), {"offs": o4(dtype=torch.int64)}), TypeError, "int32"),
        Case("offs-2d", E, lambda: ((a(), b()), {"offs": o4().view(4, 1)}), TypeError, "1-D"),
        Case("offs-list", E, lambda: ((a(), b()), {"offs": [16, 32, 48, 64]}), TypeError, "int32"),
        Case("offs-none", E, lambda: ((a(), b()), {}), ValueError, "offs is required"),
        Case("offs-cpu", E, lambda: ((a(), b()), {"offs": o4(device="cpu")}), ValueError, "on cuda"),
        Case("offs-short", E, lambda: ((a(), b()), {"offs": offs_of(16, 16, 32)}), ValueError, "entries"),
        Case(
            "offs-long", E, lambda: ((a(), b()), {"offs": offs_of(16, 16, 16, 16, 0)}), ValueError, "entries"
        ),
        Case("a-fp32", E, lambda: ((g(64, 32, dtype=F32), b()), {"offs": o4()}), TypeError, "bf16"),
        Case("b-dtype", E, lambda: ((a(), g(4, 32, 64, dtype=F16)), {"offs": o4()}), TypeError, "bf16"),
        Case("a-cpu", E, lambda: ((a().cpu(), b()), {"offs": o4()}), ValueError, "CUDA"),
        Case("b-cpu", E, lambda: ((a(), b().cpu()), {"offs": o4()}), ValueError, "CUDA"),
        Case("a-3d-b-3d-offs", E, lambda: ((g(4, 16, 32), b()), {"offs": o4()}), ValueError, "no offs"),
        Case("a-3d-b-3d-groups", E, lambda: ((g(3, 16, 32), b()), {}), ValueError, "do not match"),
        Case("a-3d-b-2d-no-offs", E, lambda: ((g(4, 16, 32), g(32, 64)), {}), ValueError, "needs offs"),
        Case("b-4d", E, lambda: ((a(), g(1, 4, 32, 64)), {"offs": o4()}), ValueError, "dims"),
        Case("k-mismatch", E, lambda: ((g(64, 40), b()), {"offs": o4()}), ValueError, "disagree on K"),
        Case("n-unaligned", E, lambda: ((a(), g(4, 32, 60)), {"offs": o4()})),
        Case(
            "too-many-experts",
            E,
            lambda: ((g(8, 16), g(1025, 16, 16)), {"offs": offs_of(*[0] * 1025)}),
            ValueError,
            "at most",
        ),
        # layouts TMA cannot address: staged (aligned copies, an aligned scratch for out), not rejected
        Case("a-colmajor", E, lambda: ((colmajor(64, 32), b()), {"offs": o4()})),
        Case("a-misaligned", E, lambda: ((misaligned(64, 32), b()), {"offs": o4()})),
        Case("b-misaligned", E, lambda: ((a(), misaligned(4, 32, 64)), {"offs": o4()})),
        Case("b-no-unit-stride", E, lambda: ((a(), g(4, 64, 64)[:, :, ::2].transpose(1, 2)), {"offs": o4()})),
        Case("lda-unaligned", E, lambda: ((g(64, 36), g(4, 36, 64)), {"offs": o4()})),
        Case(
            "out-shape", E, lambda: ((a(), b()), {"offs": o4(), "out": g(64, 32)}), ValueError, "out must be"
        ),
        Case("out-colmajor", E, lambda: ((a(), b()), {"offs": o4(), "out": colmajor(64, 64)})),
        Case("out-misaligned", E, lambda: ((a(), b()), {"offs": o4(), "out": misaligned(64, 64)})),
        Case(
            "out-list",
            E,
            lambda: ((a(), b()), {"offs": o4(), "out": [0.0]}),
            TypeError,
            "out must be a torch",
        ),
        Case(
            "out-dtype-int",
            E,
            lambda: ((a(), b()), {"offs": o4(), "out_dtype": torch.int32}),
            TypeError,
            "out_dtype",
        ),
        Case("config-dense", E, lambda: ((a(), b()), {"offs": o4(), "config": cfg()}), ValueError, "grouped"),
        Case(
            "config-other-arch",
            E,
            lambda: ((a(), b()), {"offs": o4(), "config": cfg(arch=other_arch(), form=Form.GROUPED)}),
            ValueError,
            "arch",
        ),
        Case(
            "check-offs-decreasing",
            E,
            lambda: ((a(), b()), {"offs": offs_of(16, 16, -8, 16), "check_offs": True}),
            ValueError,
            "non-decreasing",
        ),
        Case(
            "check-offs-negative",
            E,
            lambda: ((a(), b()), {"offs": offs_of(-1, 1, 16, 16), "check_offs": True}),
            ValueError,
            "non-decreasing",
        ),
        Case(
            "check-offs-past-end",
            E,
            lambda: ((a(), b()), {"offs": offs_of(16, 16, 16, 17), "check_offs": True}),
            ValueError,
            "exceeds",
        ),
        # K-grouped (b 2-D) and list forms
        Case(
            "kg-k-mismatch",
            E,
            lambda: ((g(32, 64), g(48, 40)), {"offs": offs_of(32, 32)}),
            ValueError,
            "disagree",
        ),
        Case(
            "kg-out-shape",
            E,
            lambda: ((g(32, 64), g(64, 40)), {"offs": offs_of(32, 32), "out": g(2, 32, 48)}),
            ValueError,
            "out must be",
        ),
        Case(
            "kg-out-list",
            E,
            lambda: ((g(32, 64), g(64, 40)), {"offs": offs_of(32, 32), "out": [0.0]}),
            TypeError,
            "out must be a torch",
        ),
        Case(
            "kg-offs-cpu",
            E,
            lambda: ((g(32, 64), g(64, 40)), {"offs": offs_of(32, 32, device="cpu")}),
            ValueError,
            "on cuda",
        ),
        Case(
            "kg-check-offs-decreasing",
            E,
            lambda: ((g(32, 64), g(64, 40)), {"offs": offs_of(40, -8, 32), "check_offs": True}),
            ValueError,
            "non-decreasing",
        ),
        Case(
            "kg-check-offs-past-end",
            E,
            lambda: ((g(32, 64), g(64, 40)), {"offs": offs_of(40, 32), "check_offs": True}),
            ValueError,
            "exceeds",
        ),
        Case("list-uneven", E, lambda: (([g(8, 16)], [g(16, 8), g(16, 8)]), {}), ValueError, "equal length"),
        Case(
            "list-mixed-dtype",
            E,
            lambda: (([g(8, 16), g(8, 16, dtype=F16)], [g(16, 8), g(16, 8, dtype=F16)]), {}),
            TypeError,
            "dtype",
        ),
        Case(
            "list-with-offs", E, lambda: (([g(8, 16)], [g(16, 8)]), {"offs": offs_of(8)}), ValueError, "offs"
        ),
        Case("list-cpu-member", E, lambda: (([g(8, 16)], [g(16, 8).cpu()]), {}), ValueError, "CUDA"),
        Case("list-bad-member-shape", E, lambda: (([g(8, 16)], [g(24, 8)]), {}), ValueError, "do not match"),
    ]


def _grouped_ok():
    E = "grouped"
    return [
        Case("E0", E, lambda: ((g(40, 32), g(0, 32, 64)), {"offs": offs_of()})),
        Case(
            "E0-check-offs", E, lambda: ((g(40, 32), g(0, 32, 64)), {"offs": offs_of(), "check_offs": True})
        ),
        Case("T0", E, lambda: ((g(0, 32), g(3, 32, 64)), {"offs": offs_of(0, 0, 0)})),
        Case("N0", E, lambda: ((g(40, 32), g(3, 32, 0)), {"offs": offs_of(10, 0, 30)})),
        Case("K0", E, lambda: ((g(40, 0), g(3, 0, 64)), {"offs": offs_of(10, 0, 30)})),
        Case("all-experts-empty", E, lambda: ((g(40, 32), g(3, 32, 64)), {"offs": offs_of(0, 0, 0)})),
        Case(
            "empty-expert-partial-tiles",
            E,
            lambda: ((g(150, 64), g(4, 64, 72)), {"offs": offs_of(33, 0, 70, 40)}),
        ),
        Case("rows-past-end", E, lambda: ((g(150, 64), g(4, 64, 72)), {"offs": offs_of(33, 0, 70, 20)})),
        Case(
            "b-transposed-view",
            E,
            lambda: (
                (g(150, 64), g(4, 72, 64).transpose(1, 2)),
                {"offs": offs_of(33, 0, 70, 40), "check_offs": True},
            ),
        ),
        Case(
            "kg-empty-slices", E, lambda: ((g(40, 64), g(64, 72)), {"offs": offs_of(3, 0, 45, 16)})
        ),  # misaligned slices
        Case("kg-E0", E, lambda: ((g(40, 64), g(64, 72)), {"offs": offs_of()})),
        Case("kg-M0", E, lambda: ((g(0, 64), g(64, 72)), {"offs": offs_of(30, 34)})),
        Case("kg-K0", E, lambda: ((g(40, 0), g(0, 72)), {"offs": offs_of(0, 0)})),
        Case("list-empty", E, lambda: (([], []), {})),
        Case(
            "list-mixed-shapes",
            E,
            lambda: (
                ([g(5, 64), g(0, 8), g(130, 8), g(7, 0)], [g(64, 24), g(8, 16), g(8, 40), g(0, 16)]),
                {"alpha": 0.5},
            ),
        ),
    ]


def _op_cases():
    G, P = "op_gemm", "op_grouped"
    return [
        Case(
            "op-a-fp32", G, lambda: ((g(64, 64, dtype=F32), g(64, 64, dtype=F32)), {}), TypeError, "a.dtype"
        ),
        Case(
            "op-b-cpu",
            G,
            lambda: ((g(64, 64), g(64, 64).cpu()), {}),
            (ValueError, RuntimeError),
            "CUDA|device",
        ),
        Case("op-lda-unaligned", G, lambda: ((g(64, 60), g(60, 64)), {})),  # staged
        Case(
            "op-bias-silu", G, lambda: ((g(96, 64), g(64, 72), g(72)), {"activation": "silu", "alpha": 0.5})
        ),
        Case("op-M0", G, lambda: ((g(0, 64), g(64, 72)), {})),
        Case(
            "op-grouped-offs-cpu",
            P,
            lambda: ((g(64, 32), g(4, 32, 64), offs_of(16, 16, 16, 16, device="cpu")), {}),
            (ValueError, RuntimeError),
            "cuda|device",
        ),
        Case(
            "op-grouped-offs-int64",
            P,
            lambda: ((g(64, 32), g(4, 32, 64), offs_of(16, 16, 16, 16, dtype=torch.int64)), {}),
            TypeError,
            "int32",
        ),
        Case("op-grouped-packed", P, lambda: ((g(150, 64), g(4, 64, 72), offs_of(33, 0, 70, 47)), {})),
        Case("op-grouped-E0", P, lambda: ((g(40, 32), g(0, 32, 64), offs_of()), {})),
    ]


def _experts_cases():
    X = "experts"
    return [
        Case("experts-x-fp32", X, lambda: ((g(8, 64, dtype=F32), offs_of(4, 4)), {}), TypeError, "bf16"),
        Case("experts-x-cpu", X, lambda: ((g(8, 64).cpu(), offs_of(4, 4)), {}), ValueError, "CUDA"),
        Case("experts-offs-len", X, lambda: ((g(8, 64), offs_of(8)), {}), ValueError, "entries"),
        Case(
            "experts-offs-int64",
            X,
            lambda: ((g(8, 64), offs_of(4, 4, dtype=torch.int64)), {}),
            TypeError,
            "int32",
        ),
        Case("experts-hidden", X, lambda: ((g(8, 48), offs_of(4, 4)), {}), ValueError, "disagree on K"),
    ]


def _quantize_cases():
    if getattr(cutegemm, "quantize", None) is None:
        return []
    Q = "quantize"
    return [
        Case("q-cpu", Q, lambda: ((g(4, 64).cpu(), "mxfp8"), {}), ValueError, "CUDA"),
        Case("q-int", Q, lambda: ((g(4, 64).int(), "mxfp8"), {}), TypeError, "dtype"),
        Case("q-list", Q, lambda: (([[1.0]], "mxfp8"), {}), TypeError, "torch.Tensor"),
        Case("q-1d", Q, lambda: ((g(64), "mxfp8"), {}), ValueError, "rows, K"),
        Case("q-empty", Q, lambda: ((g(0, 64), "mxfp8"), {}), ValueError, "non-empty"),
        Case("q-fmt-unknown", Q, lambda: ((g(4, 64), "mxfp7"), {}), ValueError, "mxfp7"),
        Case("q-fmt-int", Q, lambda: ((g(4, 64), 8), {}), TypeError, "fmt"),
        Case("q-fp4-odd-k", Q, lambda: ((g(4, 33), "nvfp4"), {}), ValueError, "even"),
        Case(
            "q-gs-on-mx", Q, lambda: ((g(4, 64), "mxfp8"), {"global_scale": 1.0}), ValueError, "global_scale"
        ),
        Case(
            "q-gs-negative", Q, lambda: ((g(4, 64), "nvfp4"), {"global_scale": -2.0}), ValueError, "positive"
        ),
        Case("q-misaligned", Q, lambda: ((misaligned(130, 64), "mxfp8"), {})),
        Case("q-colmajor", Q, lambda: ((colmajor(130, 64), "mxfp8"), {})),
        Case("q-k-tail", Q, lambda: ((g(130, 40), "mxfp8"), {})),
        Case("q-3d-nvfp4", Q, lambda: ((g(2, 33, 64), "nvfp4"), {})),
    ]


CASES = [
    *_gemm_errors(), *_gemm_ok(), *_grouped_errors(), *_grouped_ok(), *_op_cases(), *_experts_cases(),
    *_quantize_cases(),
]  # fmt: skip


def _poison(case: Case, args, kw):
    """For "ok" calls that take ``out``: a NaN buffer larger than the output (returns (buf, out) or None)."""
    if "out" in kw or case.family not in ("gemm", "grouped"):
        return None
    a, b = args[:2]
    if isinstance(a, (list, tuple)) or not isinstance(a, torch.Tensor):
        return None
    dtype = kw.get("out_dtype") or a.dtype
    if case.family == "gemm":
        n = b.shape[-1] // 2 if kw.get("activation") in ("swiglu", "geglu") else b.shape[-1]
        shape = (*torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], n)
    elif b.dim() == 3:
        shape = (a.shape[0], b.shape[2])
    else:
        shape = (kw["offs"].numel(), a.shape[0], b.shape[1])
    *batch, m, n = shape
    buf = torch.full((*batch, m + 3, n + 8), float("nan"), dtype=dtype, device="cuda")
    return buf, buf[..., :m, :n]


@pytest.mark.parametrize("case", [pytest.param(c, id=f"{c.family}-{c.id}", marks=c.marks) for c in CASES])
def test_case(case: Case):
    torch.manual_seed(0)
    fn = FAMILIES[case.family]
    args, kw = case.build()
    if case.expect != "ok":
        with pytest.raises(case.expect, match=case.match):
            fn(*args, **kw)
        torch.cuda.synchronize()  # no asynchronous fault left behind
        return
    poison = _poison(case, args, kw)
    if poison is not None:
        kw = {**kw, "out": poison[1]}
    # Snapshots before the call (c may be out itself).
    snap_args, snap_kw = _snapshot(args), {k: _snapshot(v) for k, v in kw.items() if k != "out"}
    result = fn(*args, **kw)
    torch.cuda.synchronize()
    if poison is not None:
        buf, out = poison
        assert result.data_ptr() == out.data_ptr() or result.numel() == 0
        assert_outside_untouched(buf, out.shape[-2], out.shape[-1])
        if case.family == "gemm":
            assert not torch.isnan(out).any(), "an output element was not written"
        elif args[1].dim() == 3 and args[1].shape[1] > 0:  # packed, K > 0: rows past offs[-1] untouched
            end = int(kw["offs"][-1]) if kw["offs"].numel() else 0
            assert torch.isnan(out[end:]).all(), "a row at or past offs[-1] was written"
    check_ok(case, snap_args, snap_kw, result)


def test_case_table_counts():
    ids = [f"{c.family}-{c.id}" for c in CASES]
    assert len(set(ids)) == len(ids)
    assert sum(c.expect == "ok" for c in CASES) >= 30 and sum(c.expect != "ok" for c in CASES) >= 90


# ---------------------------------------------------------------------------------------------- offs contents
BAD_OFFS = {
    "negative-first": [-5, 60, 60, 90],
    "negative-middle": [40, -3, 100, 150],
    "decreasing": [50, 30, 40, 120],
    "past-the-end": [60, 100, 500, 10_000],
    "all-past-the-end": [1000, 1000, 1000, 1000],
    "int-min-max": [-(2**31), 2**31 - 1, 0, 7],
    "mixed": [150, -3, 100, 10_000],
}


@pytest.mark.parametrize("offs_list", list(BAD_OFFS.values()), ids=list(BAD_OFFS))
def test_bad_offs_contents_packed_clamped(offs_list):
    """Graph-safe path (no check): the kernel clamps each expert into the valid rows
    (``cutegemm.schedulers.grouped.expert_rows``). No fault; rows of exactly one clamped expert equal
    that expert's product; rows shared by two clamped experts hold one of the two products (per
    element, the experts race); rows of no expert, and the padding, stay NaN. check_offs=True raises."""
    torch.manual_seed(0)
    total, K, N, E = 200, 64, 72, len(offs_list)
    a, b = g(total, K), g(E, K, N)
    offs = torch.tensor(offs_list, dtype=torch.int32, device="cuda")
    buf = torch.full((total + 7, N + 8), float("nan"), dtype=BF, device="cuda")
    out = buf[:total, :N]
    cutegemm.grouped_gemm(a, b, offs=offs, out=out)
    torch.cuda.synchronize()
    assert torch.isnan(buf[total:]).all() and torch.isnan(buf[:, N:]).all(), "written outside out"
    owners: list[list[int]] = [[] for _ in range(total)]
    for e, (s, t) in enumerate(expert_rows(offs_list, total)):
        for row in range(s, t):
            owners[row].append(e)
    prods = [(a.double() @ b[e].double()) for e in range(E)]
    for row, own in enumerate(owners):
        if not own:
            assert torch.isnan(out[row]).all(), f"row {row} belongs to no expert but was written"
            continue
        cands = torch.stack([prods[e][row] for e in own])  # (n_owners, N)
        tol = 2e-2 * cands.abs().max().item() + 1e-2
        err = (out[row].double().unsqueeze(0) - cands).abs().min(dim=0).values
        assert err.max().item() <= tol, f"row {row} (experts {own}): error {err.max().item():.4g}"
    with pytest.raises(ValueError, match="non-decreasing|exceeds"):
        cutegemm.grouped_gemm(a, b, offs=offs, out=out, check_offs=True)


@pytest.mark.parametrize("offs_list", [[40, -8, 64], [3, 1, 2], [30, 9999], [-1, -1]], ids=str)
def test_bad_offs_contents_k_grouped_clamped(offs_list):
    """K-grouped form (the sm_90a kernel, or the per-expert loop elsewhere): expert e's slice is
    clamped as the packed form's rows are (``expert_rows``: [clamp(offs[e-1]), max(clamp(offs[e]),
    start)] in [0, K]); an empty slice gives zeros; check_offs=True raises."""
    from cutegemm.schedulers.grouped import expert_rows

    torch.manual_seed(0)
    M, K, N = 40, 64, 72
    a, b = g(M, K), g(K, N)
    offs = torch.tensor(offs_list, dtype=torch.int32, device="cuda")
    out = cutegemm.grouped_gemm(a, b, offs=offs)
    torch.cuda.synchronize()
    for e, (start, end) in enumerate(expert_rows(offs_list, K)):
        ref = a[:, start:end].double() @ b[start:end].double()
        torch.testing.assert_close(out[e].double(), ref, atol=0.05 + 0.01 * ref.abs().max().item(), rtol=0.02)
    with pytest.raises(ValueError, match="non-decreasing|exceeds"):
        cutegemm.grouped_gemm(a, b, offs=offs, check_offs=True)


def test_bad_offs_under_cuda_graph_replay():
    """Bad offs written into a captured graph's offs buffer between replays: memory-safe, rows of
    no expert untouched."""
    torch.manual_seed(0)
    total, K, N, E = 256, 64, 128, 4
    a, b = g(total, K), g(E, K, N)
    offs = offs_of(64, 64, 64, 64)
    buf = torch.full((total + 5, N), float("nan"), dtype=BF, device="cuda")
    out = buf[:total]
    cutegemm.grouped_gemm(a, b, offs=offs, out=out)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        cutegemm.grouped_gemm(a, b, offs=offs, out=out)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            cutegemm.grouped_gemm(a, b, offs=offs, out=out)
    for bad in ([10, 5, -1, 20], [-7, 300, 300, 300], [0, 0, 0, 2**31 - 1]):
        buf.fill_(float("nan"))
        offs.copy_(torch.tensor(bad, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        covered = torch.zeros(total, dtype=torch.bool)
        for s, t in expert_rows(bad, total):
            covered[s:t] = True
        assert torch.isnan(buf[total:]).all()
        assert torch.isnan(out[~covered.cuda()]).all(), f"offs {bad}: a row of no expert was written"
        assert not torch.isnan(out[covered.cuda()]).any(), f"offs {bad}: a row of an expert was not written"


def test_experts_module_empty_expert_matches_reference():
    torch.manual_seed(0)
    moe = GroupedExperts(3, 64, 32, device="cuda")
    x, offs = g(50, 64), offs_of(20, 0, 30)
    y = moe(x, offs)
    torch.testing.assert_close(y.float(), moe.forward_ref(x, offs).float(), atol=0.05, rtol=0.05)
