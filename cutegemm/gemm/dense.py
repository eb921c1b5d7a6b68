"""Public dense GEMM: ``gemm`` (our kernels) and ``gemm_ref`` (plain torch twin)."""

from __future__ import annotations

from dataclasses import replace
from numbers import Real
from types import SimpleNamespace

import torch

from ..config import (
    QUANT_FORMATS,
    QUANT_OUT_DTYPES,
    TMA_ALIGN_BYTES,
    Form,
    GemmConfig,
    GemmProblem,
    can_implement,
    config_errors,
)
from ..epilogue import GATE_LAYOUTS, GATED, EpilogueSpec, interleave_gate_up
from ..epilogue.user import register
from ..policy import policy_for
from ..runtime.device import device_info, max_clusters_for, resident_clusters  # noqa: F401 (re-exported)
from ..tuning import tuned_config
from .args import KernelArgs, scaled_tail
from .fp8_scales import (
    check_fp8_out,
    fold_scale_result,
    fp8_block_scales,
    fp8_scales,
    not_fp8,
    warm_scale_view,
)
from .launch import (
    DENSE_CACHE,
    DENSE_INPUT_TO_NAME,
    EPI_TORCH_DTYPES,
    NAME_TO_TORCH,
    OUT_TO_NAME,
    TORCH_FP8,
    TORCH_TO_NAME,
    aligned_operand,
    check_activation,
    check_config,
    check_operand,
    copy_unaligned_out,
    current_device,
    degenerate_result,
    dense_workspace,
    epilogue_vectors,
    follow_stream,
    global_scale,
    interleave_b,
    kernel_view,
    memo_view,
    padded_rows,
    quant_outputs,
    quant_result,
    rowmajor_operand,
    tma_storable,
    unit_mode,
    views_are_flat,
)
from .reference import gemm_ref


class _Plan:
    """Everything one (shapes, strides, dtypes, device, options) signature needs to launch."""

    __slots__ = ("fn", "views", "c_view", "has_bias", "flat", "out_shape", "out_dtype", "max_clusters", "config", "direct",
                 "quant", "n_vectors", "workspace", "ws_stream", "block_scales",
                 "device", "device_index", "out_dims", "b_memo", "tail", "sb_memo", "scaled_tail", "sfb")  # fmt: skip

    def launch(self, sources, alpha, beta, epi_extra=(None, None)):
        """sources: (a, b, out, c, bias), the tensors the views apply to; epi_extra: (quantized
        output scale bytes, NVFP4 global scale, *user epilogue vectors) (``gemm.args.KernelArgs``)."""
        if self.ws_stream is not None:  # split K: its workspace must be the launch stream's
            follow_stream(self)
        cv = self.c_view
        if self.flat:  # the caller's own 2-D tensors (see GemmConfig.flat)
            a, b, o = sources[0], sources[1], sources[2]
        else:
            (sa, ta), (sb, tb), (sc, tc) = self.views
            a, b, o = sources[0].as_strided(sa, ta), memo_view(self, sources[1], sb, tb), sources[2].as_strided(sc, tc)
        c = None if cv is None else sources[3].as_strided(*cv)
        bias = sources[4] if self.has_bias else None
        if len(epi_extra) == 2 and epi_extra[0] is None and epi_extra[1] is None:  # no per-call tail inputs
            # LEADING fields, then the plan's tail (gemm.args)
            self.fn(a, b, o, c, bias, alpha, beta, self.max_clusters, None, *self.tail)
            return
        vecs = _NO_VECTORS if len(epi_extra) == 2 else (*epi_extra[2:], None, None, None, None)[:4]
        sfa = sfb = None
        if self.block_scales:  # FP8 block scaling: the scales go to the kernel's mSFA / mSFB
            sfa, sfb, vecs = epi_extra[2], epi_extra[3], _NO_VECTORS
        v0, v1, v2, v3 = vecs
        self.fn(*KernelArgs(
            a, b, o, c=c, bias=bias, alpha=alpha, beta=beta, max_clusters=self.max_clusters,
            sfa=sfa, sfb=sfb, out_scales=epi_extra[0], out_global_scale=epi_extra[1], v0=v0, v1=v1, v2=v2, v3=v3,
            workspace=self.workspace,
        ))  # fmt: skip

    def launch_scaled(self, a, b, o, v0, v1):
        """The warm FP8 row-wise call: :meth:`launch`'s arguments, v0 / v1 the scales' 1-D views."""
        if self.ws_stream is not None:  # split K: its workspace must be the launch stream's
            follow_stream(self)
        if not self.flat:
            (sa, ta), (sb, tb), (sc, tc) = self.views
            a, b, o = a.as_strided(sa, ta), memo_view(self, b, sb, tb), o.as_strided(sc, tc)
        # LEADING fields, then the plan's tail with v0 / v1 (gemm.args)
        self.fn(a, b, o, None, None, 1.0, 0.0, self.max_clusters, None, *self.scaled_tail[0], v0, v1, *self.scaled_tail[1])

    def new_output(self, device=None):
        """A fresh output on the plan's device: the tensor the kernel writes and, when quantized,
        the zeroed scale bytes (``*out_dims``: plain ints parse faster than a torch.Size)."""
        if self.quant is None:
            return torch.empty(*self.out_dims, dtype=self.out_dtype, device=self.device), None
        return quant_outputs(self.quant, self.out_shape, self.device)

    def bind(self, device: torch.device):
        """Records what the fast path needs: the device and the output dims as plain ints."""
        self.device = device
        self.device_index = device.index
        self.out_dims = tuple(int(d) for d in self.out_shape)
        return self


PLANS: dict = {}
PLAIN_PLANS: dict = {}  # plans of gemm(a, b) with every option at its default, and of FP8 row-wise calls
_NO_VECTORS = (None, None, None, None)


def _check_args(a, b, out, out_dtype, gated: bool = False):
    check_operand("a", a)
    check_operand("b", b)
    if a.dtype not in DENSE_INPUT_TO_NAME:
        raise TypeError(f"a.dtype must be torch.bfloat16, torch.float16, torch.float8_e4m3fn or torch.float8_e5m2, got {a.dtype}")
    if b.dtype != a.dtype and not (a.dtype in TORCH_FP8 and b.dtype in TORCH_FP8):
        raise TypeError(f"b.dtype ({b.dtype}) must equal a.dtype ({a.dtype}) (FP8: e4m3 / e5m2 in any pair)")
    if a.device != b.device:
        raise ValueError(f"a and b must be on the same device, got {a.device} and {b.device}")
    if isinstance(out_dtype, str):
        if out_dtype not in QUANT_FORMATS:
            raise ValueError(f"a quantized out_dtype must be one of {QUANT_FORMATS}, got {out_dtype!r}")
        if out is not None:
            raise ValueError(f"out= is not supported with a quantized output ({out_dtype})")
    elif out_dtype in TORCH_FP8:
        check_fp8_out(a.dtype, out_dtype)
    elif out_dtype not in TORCH_TO_NAME:
        raise TypeError(f"out_dtype must be torch.bfloat16, torch.float16, torch.float32, one of {QUANT_FORMATS} or, "
                        f"with FP8 operands, torch.float8_e4m3fn / float8_e5m2; got {out_dtype}")  # fmt: skip
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"a and b shapes do not match for a @ b: {tuple(a.shape)} @ {tuple(b.shape)}")
    if a.dim() == 3 and b.dim() == 3 and a.shape[0] != b.shape[0]:
        raise ValueError(f"batch sizes differ: a has {a.shape[0]}, b has {b.shape[0]}")
    n_out = b.shape[-1]
    if gated:
        if n_out % 2:
            raise ValueError(f"a gated activation needs b with an even number of columns (gate, up), got {n_out}")
        n_out //= 2
    res_shape = torch.Size([*torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], n_out])
    if out is not None:
        check_operand("out", out, written=True)
        if out.shape != res_shape:
            raise ValueError(f"out must have shape {tuple(res_shape)}, got {tuple(out.shape)}")
        if out.dtype != out_dtype:
            raise TypeError(f"out.dtype ({out.dtype}) differs from out_dtype ({out_dtype})")
        if out.device != a.device:
            raise ValueError(f"out must be on {a.device}, got {out.device}")
    return res_shape


def _check_epilogue_args(a, b, res_shape, beta, c, bias, activation):
    """Validates beta/c/bias against the problem (activation and gate_layout already checked)."""
    gated = activation in GATED
    if beta != 0.0:
        if gated:
            raise ValueError(f"beta * c cannot be combined with the gated activation {activation!r}")
        if c is None:
            raise ValueError(f"beta={beta} needs the residual tensor c")
    if c is not None:
        check_operand("c", c)
        if c.dtype not in EPI_TORCH_DTYPES:
            raise TypeError(f"c.dtype must be torch.bfloat16, torch.float16 or torch.float32, got {c.dtype}")
        if c.shape != res_shape:
            raise ValueError(f"c must have the output's shape {tuple(res_shape)}, got {tuple(c.shape)}")
        if c.device != a.device:
            raise ValueError(f"c must be on {a.device}, got {c.device}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"bias must be a torch.Tensor, got {type(bias).__name__}")
        if bias.device != a.device:
            raise ValueError(f"bias must be on {a.device}, got {bias.device}")
        if bias.dtype not in EPI_TORCH_DTYPES:
            raise TypeError(f"bias.dtype must be torch.bfloat16, torch.float16 or torch.float32, got {bias.dtype}")
        n = b.shape[-1]
        if bias.shape != (n,):
            what = f"one value per GEMM column, gate and up: ({n},) = 2 x {n // 2}" if gated else f"({n},)"
            raise ValueError(f"bias must have shape {what}, got {tuple(bias.shape)}")


def _plan(
    a, b, out, out_dtype, alpha, config, beta=0.0, c=None, bias=None, activation=None, user=None, vectors=(),
    fast_accum=False,
):
    """The slow path: validate, pick and compile the kernel, compute the kernel views.
    Returns (plan, sources, scales): sources (a, b, out, c, bias) are the tensors the views apply
    to (copies where needed; ``out`` is the data tensor of a quantized output, ``scales`` its
    scale bytes, else None). ``b`` and ``bias`` of a gated activation are interleaved already."""
    gated = activation in GATED
    quant = out_dtype if isinstance(out_dtype, str) else None
    res_shape = _check_args(a, b, out, out_dtype, gated)
    _check_epilogue_args(a, b, res_shape, beta, c, bias, activation)
    if user is not None and (beta != 0.0 or bias is not None or activation is not None):
        raise ValueError("a user epilogue replaces beta * c, bias and activation: apply them inside it")
    if beta == 0.0:
        c = None  # not read (cuBLAS semantics)
    scales = None
    if quant is not None:
        if res_shape[-1] % 32:
            raise ValueError(f"a quantized output needs a multiple of 32 columns, got {res_shape[-1]}")
        out, scales = quant_outputs(quant, res_shape, a.device)
    elif out is None:
        out = torch.empty(res_shape, dtype=out_dtype, device=a.device)
        if out.numel() and not tma_storable(out):  # rows not a multiple of 16 bytes: padded scratch
            out = padded_rows(res_shape, out_dtype, a.device)
    elif out.numel() and not tma_storable(out):
        # Any other layout of the caller's out (a column offset into a larger buffer, rows not a
        # multiple of 16 bytes, column-major, odd strides): the kernel writes an aligned scratch
        # with padded rows and gemm copies the result into out (copy_unaligned_out).
        out = padded_rows(out.shape, out.dtype, out.device)
    if out.numel() == 0 or a.shape[-1] == 0:
        return None, (a, b, out, c, bias), scales
    # Bring everything to (L, rows, cols).
    if a.dim() == 3 and b.dim() == 2 and quant is None:
        # One weight for every batch: fold the batch into M when the layouts allow it.
        try:
            a3 = a.view(1, a.shape[0] * a.shape[1], a.shape[2])
            o3 = out.view(1, a3.shape[1], out.shape[-1])
            b3 = b.unsqueeze(0)
            r3 = None if c is None else c.reshape(1, a3.shape[1], c.shape[-1])  # a copy if c cannot fold
        except RuntimeError:
            a3, b3, o3, r3 = a, b.expand(a.shape[0], *b.shape), out, c
    else:
        a3 = a.unsqueeze(0) if a.dim() == 2 and b.dim() == 2 else a.expand(*res_shape[:-2], *a.shape[-2:])
        b3 = b.unsqueeze(0) if b.dim() == 2 and a.dim() == 2 else b.expand(*res_shape[:-2], *b.shape[-2:])
        o3 = out.unsqueeze(0) if out.dim() == 2 else out
        r3 = None if c is None else (c.unsqueeze(0) if c.dim() == 2 else c)
    a3s, b3s = aligned_operand(a3), aligned_operand(b3)
    fp8 = a.dtype in TORCH_FP8
    # FP8 block scaling: vectors = (scale_a (M, KB), scale_b (NB, KB)) from fp8_block_scales
    blockwise = fp8 and len(vectors) == 2 and vectors[0] is not None and vectors[0].dim() == 2
    if fp8 and unit_mode(a3s) != 2:  # FP8 WGMMA reads K-major operands only: copy (rows padded to 16 bytes)
        a3s = rowmajor_operand(a3s)
    b_prefer = 1 if fp8 else 2  # (a size-1 N or K: either mode; FP8 takes K)
    if fp8 and unit_mode(b3s, b_prefer) != 1:
        b3s = rowmajor_operand(b3s.mT).mT
    r3s = None if r3 is None else rowmajor_operand(r3)
    bias_s = None
    if bias is not None:
        bias_s = bias if bias.stride(0) == 1 and bias.data_ptr() % TMA_ALIGN_BYTES == 0 else bias.clone()
    L, M, K = a3s.shape
    N = b3s.shape[2]  # GEMM columns (gated: 2 x the output's)
    a_unit, b_unit = unit_mode(a3s), unit_mode(b3s, b_prefer)
    a_major = "k" if a_unit == 2 else "m"
    b_major = "n" if b_unit == 2 else "k"
    # Kernel views: A (M, K, L), B (N, K, L), C (M, N, L).
    views = (
        kernel_view(a3s, a_unit, (1, 2, 0), "a"),
        kernel_view(b3s, b_unit, (2, 1, 0), "b"),
        kernel_view(o3, 2, (1, 2, 0), "out"),
    )
    arch, num_sms = device_info(
        a.device.index if a.device.index is not None else torch.cuda.current_device()
    )
    out_name = QUANT_OUT_DTYPES[quant] if quant is not None else OUT_TO_NAME[out_dtype]
    problem = GemmProblem(
        M, N, K, L, DENSE_INPUT_TO_NAME[a.dtype], DENSE_INPUT_TO_NAME[b.dtype], out_name, a_major, b_major
    )
    epi = EpilogueSpec(
        alpha=alpha != 1.0,
        beta=r3s is not None,
        c_dtype=TORCH_TO_NAME[r3s.dtype] if r3s is not None else "fp32",
        bias=bias_s is not None,
        bias_dtype=TORCH_TO_NAME[bias_s.dtype] if bias_s is not None else "fp32",
        activation=None if gated else activation,
        gated=activation if gated else None,
        quant=quant,
        user=user,
        user_args=tuple(TORCH_TO_NAME[v.dtype] for v in vectors) if user is not None else (),
        scale_a=fp8 and not blockwise and vectors[0] is not None,
        scale_b=fp8 and not blockwise and vectors[1] is not None,
    )
    if config is not None and (config.arch != arch or config.grouped):
        raise ValueError(f"config {config.name} cannot run dense on {arch} (arch or grouped mismatch)")
    if config is None:
        cfg = tuned_config(arch, problem, epi, "dense", runner=dense_runner, num_sms=num_sms)
        extra = {"fast_accum": True} if fast_accum else {}
        if blockwise:
            extra["fp8_blockwise"] = True
        cfg = cfg if cfg is not None and cfg.fast_accum == fast_accum and cfg.fp8_blockwise == blockwise else None
        cfg = cfg or policy_for(arch, num_sms).choose_dense(problem, epilogue=epi, **extra)
    elif config.epilogue == EpilogueSpec():
        cfg = replace(config, epilogue=epi)  # a forced tile: the call's arguments give the epilogue
    elif config.epilogue in (epi, replace(epi, alpha=True)):
        cfg = config  # an alpha kernel also serves alpha == 1
    else:
        raise ValueError(f"config.epilogue {config.epilogue} does not match the call's epilogue {epi}")
    if cfg.fp8_blockwise != blockwise:
        raise ValueError(
            f"config {cfg.name}: fp8_blockwise={cfg.fp8_blockwise} but the call's scales are "
            f"{'1x128 / 128x128 block scales' if blockwise else 'not block scales'}"
            + ("" if blockwise else " (block scales of one K block and one N block are per-row x per-tensor "
               "scales, run by the row-wise kernel: pass config=None or a row-wise config)")
        )
    ok, why = can_implement(cfg, problem)
    if not ok:
        raise ValueError(f"cannot run {cfg.name}: {why}")
    # Cacheable when the views apply to the caller's own tensors (no copies were needed).
    direct = (
        a3s.data_ptr() == a.data_ptr() and b3s.data_ptr() == b.data_ptr()
        and a3s.stride() == a3.stride() and b3s.stride() == b3.stride()
        and (r3s is None or (r3s is r3 and r3.data_ptr() == c.data_ptr()))
        and bias_s is bias
    )  # fmt: skip
    flat_ok = direct and views_are_flat(a, b, out, views)
    if config is None and flat_ok and not config_errors(replace(cfg, form=Form.FLAT)):
        cfg = replace(cfg, form=Form.FLAT)  # the caller's 2-D tensors go to the kernel as they are
    elif cfg.flat and not flat_ok:
        raise ValueError(
            f"config {cfg.name} is a flat (2-D) launch: it takes 2-D a, b and out that the kernel can "
            "read as they are (no batch, no copies); pass a config with form=Form.DENSE for these operands"
        )
    plan = _Plan()
    plan.flat = cfg.flat
    if user is None:
        plan.fn = DENSE_CACHE.get(cfg)
    else:
        try:
            plan.fn = DENSE_CACHE.get(cfg)
        except Exception as exc:
            raise ValueError(f"the user epilogue could not be traced into the kernel: {type(exc).__name__}: {exc}") from exc
    plan.quant, plan.sfb, plan.sb_memo, plan.scaled_tail = quant, None, None, None  # the FP8 warm plan's (_cache_scaled)
    plan.block_scales = blockwise
    plan.n_vectors = len(vectors)
    plan.views = views
    plan.c_view = None if r3s is None else kernel_view(r3s, 2, (1, 2, 0), "c")
    plan.has_bias = bias_s is not None
    plan.out_shape = res_shape
    plan.out_dtype = out_dtype
    plan.max_clusters = max_clusters_for(cfg, a.device, num_sms)
    plan.workspace, plan.ws_stream = dense_workspace(cfg, a.device, problem, plan.max_clusters)
    plan.tail = KernelArgs(None, None, None, workspace=plan.workspace).tail()
    plan.config = cfg
    plan.direct = direct
    if plan.direct:
        return plan, (a, b, out, c, bias), scales
    return plan, (a3s, b3s, out, r3s, bias_s), scales


def gemm(
    a,
    b,
    *,
    out=None,
    out_dtype=None,
    alpha: float = 1.0,
    beta: float = 0.0,
    c=None,
    bias=None,
    activation: str | None = None,
    gate_layout: str = "interleaved",
    config: GemmConfig | None = None,
    epilogue=None,
    epilogue_args=(),
    out_global_scale=None,
    scale_a=None,
    scale_b=None,
    fast_accum: bool = False,
    scale_result=None,
):
    """``out = act(alpha * (a @ b) + beta * c + bias)`` with fp32 accumulation and an fp32
    epilogue, fused into the GEMM.

    a: (M, K) or (L, M, K); b: (K, N) or (L, K, N) (a 2-D operand is shared by every batch);
    any views torch accepts (row- or column-major with 16-byte aligned strides are read in place;
    others, e.g. slices with odd strides or offsets, stepped or expanded views, are copied into
    such a layout first); bf16 or fp16, a.dtype == b.dtype. out_dtype: torch.bfloat16 / float16 /
    float32 (default: ``out.dtype`` where ``out`` is given, else a.dtype). ``out``: optional
    output of the result shape, any strides with no two elements at one address (one the TMA
    store cannot write is computed into a scratch and copied in). ``config``: force a kernel
    configuration (must pass can_implement); its ``epilogue`` is taken from the call's arguments
    when left at the default.

    Epilogue (all in fp32, in this order; see ``cutegemm.epilogue.ops``):
    - ``alpha``: scales a @ b.
    - ``beta``, ``c``: adds ``beta * c``; c has the output's shape (batch included), dtype bf16 /
      fp16 / fp32, any strides (a row-major view with 16-byte aligned strides is read in place,
      anything else is copied first). ``beta == 0`` never reads c. c may be ``out`` itself.
    - ``bias``: (N,) bf16 / fp16 / fp32, added to every row.
    - ``activation``: None, "relu", "gelu" (erf), "gelu_tanh", "silu", "relu_sq", "tanh",
      "sigmoid": applied last; or gated act(gate) * up, "swiglu" (silu), "geglu" (erf gelu),
      "geglu_tanh", "reglu" (relu), "glu" (sigmoid), or gpt-oss's clamped "swiglu_oai"
      (``g * sigmoid(1.702 g) * (u + 1)``, g = min(gate, 7), u = clamp(up, -7, 7)): b has
      2 * N' columns, out has N'.
      ``gate_layout="interleaved"`` (default): b's columns alternate gate, up, gate, up, ...;
      ``"halves"``: b = [gate | up]; the kernel reads interleaved columns, so "halves" costs a
      copy of b (and of bias) on every call: convert the weight once with
      ``cutegemm.epilogue.interleave_gate_up`` instead. For gated activations ``bias`` has 2 * N'
      entries, one per pre-activation column, in b's column order; ``beta * c`` is not
      supported with them.

    Quantized output: ``out_dtype="mxfp8"`` (e4m3 + e8m0 per 32 columns), ``"mxfp4"`` or
    ``"nvfp4"`` (e2m1 + e4m3 per 16 columns; needs ``out_global_scale``, a positive fp32 scalar
    or one-element tensor) returns a :class:`cutegemm.blockscaled.BlockScaledTensor` with 128x4
    swizzled scales, quantized by the kernel from the fp32 epilogue values (any epilogue above,
    gated included); equal to ``quantize_ref(gemm_ref(..., out_dtype=torch.float32), fmt)`` up
    to the accumulation order. The output must have a multiple of 32 columns; sm_90a only so far.

    User epilogue: ``epilogue=f, epilogue_args=(v0, ...)`` with ``f(acc, row, col, *vectors)``
    (see :mod:`cutegemm.epilogue.user`): traced into the kernel, replacing beta / bias /
    activation (alpha still scales acc first).

    FP8 (sm_90a; sm_100a compiled only): a, b ``float8_e4m3fn`` / ``float8_e5m2`` (any pair; block scales: e4m3)
    with fp32 ``scale_a`` (one per row of a: shape (M,) or (M, 1), or one element: per tensor) and ``scale_b``
    (per column of b: (N,) or (1, N), or one element), as ``torch._scaled_mm``: ``out = (a @ b) * scale_a *
    scale_b`` then the epilogue above. Both operands are read K-major (a row-major, b column-major, e.g.
    ``w.t()`` of an (N, K) weight); other layouts are copied first. Scales may be omitted (1).
    ``out_dtype=torch.float8_e4m3fn / float8_e5m2`` (per-tensor or row-wise scales, not gated): the
    fp32 epilogue values saturated to the type's finite range (NaN kept) and rounded once to
    nearest-even, as ``torch._scaled_mm(..., out_dtype=float8)``.
    ``scale_result`` (one fp32 element, FP8 outputs, no activation): multiplies the epilogue's result
    before the conversion, torch's D scale; folded into ``scale_b`` (and ``bias``) by a small kernel.
    sm_90a promotes the WGMMA partial sums into fp32 every 128 K (torch._scaled_mm's default);
    ``fast_accum=True`` keeps them in the tensor core (faster, error grows with K, as torch's
    ``use_fast_accum=True``). sm_100a has no promotion step (``fast_accum`` changes nothing).

    FP8 block scaling (DeepSeek-V3, sm_90a): a (M, K), b (K, N) e4m3 (2-D; b typically ``w.t()``
    of an (N, K) weight) with fp32 ``scale_a`` of shape (M, ceil(K/128)) (one per row per
    128-wide K block) and ``scale_b`` of shape (ceil(K/128), ceil(N/128)) (one per 128x128 block
    of b), the shapes of ``torch._scaled_mm``'s 1x128 x 128x128 blockwise recipe, so the same
    tensors serve both: ``out = sum_kb (a[:, kb] @ b[kb, :]) * scale_a[:, kb] * scale_b[kb, n // 128]``
    in fp32, then the epilogue and the cast. Scales of an (N, K) weight stored as
    (ceil(N/128), ceil(K/128)) go in as ``.t()`` (like ``b = w.t()``). Any layout is accepted;
    torch's are read in place (scale_a M-major, scale_b column-major; others are copied per call
    into such buffers: ``gemm.fp8_args``). K need not be a multiple of 128 (the last block is
    partial) but must be a multiple of 16 (TMA). The scales multiply each 128-wide K tile's
    partial sum as it is promoted into the fp32 accumulator (no ``fast_accum``); one K block and
    one N block are per-row x per-tensor scales (the row-wise path, the same product). torch's
    1x128 x 1x128 / 128x128 x 1x128 recipes: ``cutegemm.gemm`` routes them (``blockscaled.fp8_blocks``).

    Per-call cost: the first call for a (shapes, strides, dtypes, device, options) signature
    validates, picks the config and compiles (or loads it from the disk cache); later calls only
    check data-pointer alignment and launch (FP8 row-wise: and view the scales).
    """
    if scale_result is not None:  # torch's D scale of an FP8 output: into scale_b and bias (no sync)
        scale_b, bias = fold_scale_result(scale_result, a, out, out_dtype, scale_b, bias, activation, beta, epilogue)
    # gemm(a, b) with every option at its default, and the FP8 row-wise call (scales, out_dtype,
    # fast_accum): a small key each. ``(x == v) is True``: a tensor alpha goes to the TypeError.
    bare = (out is None and bias is None and activation is None and config is None and epilogue is None and not epilogue_args
            and out_global_scale is None and (alpha == 1.0) is True and (beta == 0.0) is True and gate_layout == "interleaved")  # fmt: skip
    plain = bare and out_dtype is None and scale_a is None and scale_b is None and not fast_accum
    skey = None
    if plain:
        try:
            pkey = (a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.device, b.device)
            plan = PLAIN_PLANS.get(pkey)
        except AttributeError:
            pkey = plan = None
        if plan is not None and current_device() == plan.device_index and not (a.data_ptr() % 16 or b.data_ptr() % 16):
            out = torch.empty(*plan.out_dims, dtype=plan.out_dtype, device=plan.device)
            if plan.flat and plan.ws_stream is None:  # (split K: launch checks its workspace's stream)
                # LEADING fields, then the plan's tail (gemm.args)
                plan.fn(a, b, out, None, None, 1.0, 0.0, plan.max_clusters, None, *plan.tail)
            else:
                plan.launch((a, b, out, None, None), 1.0, 0.0)
            return out
    elif bare and scale_b is not None and scale_a is not None and (fast_accum is False or fast_accum is True) and (
            out_dtype is None or out_dtype.__class__ is torch.dtype):  # fmt: skip
        # FP8 row-wise / block scales: the key fixes all the scale checks read but alignment
        try:
            skey = (a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.device, b.device, scale_a.shape,
                    scale_a.stride(), scale_a.dtype, scale_a.device, scale_b.shape, scale_b.stride(), scale_b.dtype,
                    scale_b.device, out_dtype, fast_accum)  # fmt: skip
            plan = PLAIN_PLANS.get(skey)
        except AttributeError:
            skey = plan = None
        if plan is not None and current_device() == plan.device_index and not (
                a.data_ptr() % 16 or b.data_ptr() % 16 or scale_a.data_ptr() % 16 or scale_b.data_ptr() % 16):  # fmt: skip
            out = torch.empty(*plan.out_dims, dtype=plan.out_dtype, device=plan.device)
            sfb = plan.sfb
            if sfb is not None:  # block scales: scale_a in place, scale_b's kernel view memoized
                plan.launch((a, b, out, None, None), 1.0, 0.0, (None, None, scale_a, memo_view(plan.sb_memo, scale_b, *sfb)))
                return out
            # scale_b (the weight's) viewed once per object (memo), scale_a (new per call) viewed
            sb = scale_b if scale_b.dim() == 1 else memo_view(plan.sb_memo, scale_b, plan.scaled_tail[2], (1,))
            plan.launch_scaled(a, b, out, scale_a if scale_a.dim() == 1 else scale_a.view(-1), sb)
            return out
    if out_dtype is None:
        if isinstance(out, torch.Tensor):
            out_dtype = out.dtype
        else:
            out_dtype = getattr(a, "dtype", None)
            out_dtype = torch.bfloat16 if out_dtype in TORCH_FP8 else out_dtype  # FP8 inputs: bf16 by default
    if activation is not None:
        check_activation(activation, gate_layout)
        if gate_layout == "halves" and activation in GATED:
            check_operand("b", b)
            _check_args(a, b, out, out_dtype, gated=True)  # shape errors name the caller's b
            b = interleave_b(b)
            if isinstance(bias, torch.Tensor) and bias.shape == (b.shape[-1],):
                bias = interleave_gate_up(bias)
    elif gate_layout not in GATE_LAYOUTS:
        check_activation(activation, gate_layout)
    has_beta = beta != 0.0
    quant = out_dtype if isinstance(out_dtype, str) else None
    user = vectors = gs = None
    if epilogue is not None:
        user = register(epilogue)
        vectors = epilogue_vectors(epilogue_args, getattr(a, "device", None))
    elif epilogue_args:
        raise ValueError("epilogue_args given without an epilogue function")
    if getattr(a, "dtype", None) in TORCH_FP8:
        if epilogue is not None:
            raise ValueError("a user epilogue cannot be combined with FP8 inputs yet")
        vectors = fp8_block_scales(a, b, scale_a, scale_b) or fp8_scales(a, b, scale_a, scale_b)
    elif scale_a is not None or scale_b is not None:
        raise not_fp8(a)
    if quant is not None or out_global_scale is not None:
        gs = global_scale(quant, out_global_scale, getattr(a, "device", None))
    try:
        key = (
            a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.device, out_dtype,
            None if out is None else (out.shape, out.stride(), out.dtype, out.device),
            alpha != 1.0, config, activation, fast_accum,
            (c.shape, c.stride(), c.dtype, c.device) if has_beta and c is not None else has_beta,
            None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.device),
            user, None if vectors is None else tuple(None if v is None else (v.shape, v.dtype) for v in vectors),
            b.device,
        )  # fmt: skip
    except AttributeError:
        key = None  # not tensors: the slow path raises the right TypeError
    plan = PLANS.get(key) if key is not None else None
    # Fast path: the key fixes every checked property but data-pointer alignment (and the plan's
    # device is a's, so one int compare checks the current device).
    if (
        plan is not None
        and current_device() == plan.device_index
        and not (a.data_ptr() % 16 or b.data_ptr() % 16 or (out is not None and out.data_ptr() % 16))
        and not (has_beta and c.data_ptr() % 16)
        and not (bias is not None and bias.data_ptr() % 16)
    ):
        scales = None
        if out is None:
            out, scales = plan.new_output()
        epi_extra = (scales, gs, *vectors) if vectors else (scales, gs)
        plan.launch((a, b, out, c, bias), float(alpha), float(beta), epi_extra)
        _cache_scaled(skey, plan, a, vectors, scale_a, scale_b)  # another FP8 row-wise signature's plan
        return out if quant is None else quant_result(quant, plan.out_shape, out, scales, gs)
    if isinstance(alpha, torch.Tensor) or isinstance(beta, torch.Tensor):
        raise TypeError("alpha and beta must be Python numbers, not tensors (reading a tensor's value is a host "
                        "sync): pass float(t)")
    if not (isinstance(alpha, Real) and isinstance(beta, Real)):
        raise TypeError(f"alpha and beta must be real numbers, got {type(alpha).__name__} and {type(beta).__name__}")
    check_config(config)
    plan, sources, scales = _plan(
        a, b, out, out_dtype, alpha, config, beta, c, bias, activation, user, vectors or (), fast_accum
    )
    user_out, out = out, sources[2]
    if plan is None:  # empty output or K == 0: computed in torch into the caller's out itself (c may be out)
        out = user_out if user_out is not None and quant is None else out
        res = degenerate_result(out, b, quant, scales, gs, alpha, beta, c, bias, activation, epilogue, vectors)
        return res.contiguous() if user_out is None and quant is None else res  # an odd N's padded scratch
    # Cached only when the kernel writes the caller's out or a fresh compact one (no scratch copy).
    if plan.direct and key is not None and (out is user_out or (user_out is None and out.is_contiguous())):
        PLANS[key] = plan.bind(a.device)
        if plain and pkey is not None and a.dtype in (torch.bfloat16, torch.float16) and not plan.quant:
            PLAIN_PLANS[pkey] = plan
        _cache_scaled(skey, plan, a, vectors, scale_a, scale_b)
    epi_extra = (scales, gs, *(vectors or ()))
    if a.device.index == current_device():
        plan.launch(sources, float(alpha), float(beta), epi_extra)
    else:
        with torch.cuda.device(a.device):
            plan.launch(sources, float(alpha), float(beta), epi_extra)
    if quant is not None:
        return quant_result(quant, plan.out_shape, out, scales, gs)
    if user_out is None and not out.is_contiguous():
        return out.contiguous()  # the padded scratch of an odd N: a compact result, as torch returns
    return copy_unaligned_out(user_out, out)


def _cache_scaled(skey, plan, a, vectors, scale_a, scale_b) -> None:
    """Files the bound ``plan`` under the FP8 key ``skey`` if the warm path passes what this call
    did (block scales: scale_a itself and a view of scale_b, ``plan.sfb`` its size and stride)."""
    v0, v1 = (*vectors, None, None)[:2] if vectors else (None, None)
    if skey is None or a.dtype not in TORCH_FP8 or plan.quant or v0 is None or v1 is None:
        return
    if plan.block_scales:
        if v0 is not scale_a or v1.data_ptr() != scale_b.data_ptr():
            return
        plan.sfb = (v1.shape, v1.stride())
    else:
        pairs = ((v0, warm_scale_view(scale_a)), (v1, warm_scale_view(scale_b)))  # the same views, no copy
        if v1.stride() != (1,) or any((x.shape, x.stride(), x.data_ptr()) != (y.shape, y.stride(), y.data_ptr()) for x, y in pairs):
            return
        plan.scaled_tail = scaled_tail(plan.tail, v1.shape)
    plan.sb_memo = plan.sb_memo or SimpleNamespace(b_memo=None)  # memo_view's holder
    PLAIN_PLANS[skey] = plan


def dense_runner(p: GemmProblem, epi: EpilogueSpec, num_groups: int = 1):
    """The autotuner's runner (``tuning.tune``): (run(cfg) -> out, reference) on random inputs of the problem's shapes, majors, epilogue."""
    dt = NAME_TO_TORCH[p.a_dtype]
    out_dtype = NAME_TO_TORCH[p.out_dtype]
    gen = torch.Generator(device="cuda").manual_seed(0)
    lead = (p.l,) if p.l > 1 else ()
    a = torch.randn(*lead, p.m, p.k, device="cuda", dtype=dt, generator=gen)
    if p.a_major == "m":
        a = a.mT.contiguous().mT
    b = torch.randn(*lead, p.k, p.n, device="cuda", dtype=dt, generator=gen) * p.k**-0.5
    if p.b_major == "k":
        b = b.mT.contiguous().mT
    n_out = p.n // 2 if epi.gated else p.n
    kw = dict(alpha=0.5 if epi.alpha else 1.0, activation=epi.gated or epi.activation, out_dtype=out_dtype)
    if epi.bias:
        kw["bias"] = torch.randn(p.n, device="cuda", generator=gen).to(NAME_TO_TORCH[epi.bias_dtype])
    if epi.beta:
        c = torch.randn(*lead, p.m, n_out, device="cuda", generator=gen).to(NAME_TO_TORCH[epi.c_dtype])
        kw.update(beta=0.5, c=c)
    ref = gemm_ref(a, b, **kw)

    def run(cfg: GemmConfig):
        return gemm(a, b, config=cfg, **kw)

    return run, ref


__all__ = ["gemm", "gemm_ref", "dense_runner", "warm_scale_view"]
