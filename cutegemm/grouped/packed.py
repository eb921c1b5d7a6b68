"""Public grouped GEMM (``torch._grouped_mm`` semantics for the packed MoE form).

Forms:
- packed MoE: ``grouped_gemm(a, b, offs=offs)``: a (total_M, K), b (E, K, N) (e.g.
  ``w.transpose(1, 2)`` of an (E, N, K) weight), offs int32 (E,) on the GPU, cumulative END row
  of each expert. Any layouts torch accepts: a row-major a and a b with a unit-stride mode and
  16-byte aligned strides are read in place; others are staged (a row-major copy of a, b with its
  leading dimension padded), and an ``out`` the TMA store cannot write (any N, any view) is
  computed into an aligned scratch that starts as a copy of out and is copied back (without
  ``out``, an odd N is returned compact). Staged calls are not cached (the warm path is for the
  aligned ones). One kernel launch; the tile -> (expert, m-tile, n-tile)
  map is computed on the device from offs, so there is no host sync and the call can be captured
  in a CUDA graph and replayed with new offs contents. Rows at or past ``offs[-1]`` are not
  written. offs contents are not checked on this path (that would need a sync): bad offsets are
  clamped into [0, total_M] (expert e's rows are [offs[e-1], max(offs[e], offs[e-1])), so with
  decreasing offsets two experts' rows can overlap; the results are then unspecified) and the
  kernel stays memory-safe; ``check_offs=True`` validates them with a sync and raises ValueError.

  Epilogues (packed form, one kernel, the dense formulas of :mod:`cutegemm.epilogue.ops` per
  expert): ``bias`` (E, N) per expert and GEMM column (or (N,) shared by every expert),
  ``activation`` (any of config.ACTIVATIONS) or gated (config.GATED; b's columns interleaved
  gate, up; ``gate_layout="halves"`` copies b per call), ``alpha``; a quantized ``out_dtype``
  ("mxfp8" / "mxfp4" / "nvfp4", with ``out_global_scale`` for NVFP4) returns a
  BlockScaledTensor of the packed (total_M, N') output, scales in the 128x4 swizzled layout over
  the packed rows (= ``quantize_ref`` of the bf16/fp32 result; rows past offs[-1] get no data
  and no scales); a user epilogue ``epilogue=f, epilogue_args=(v, ...)``: ``row`` is the packed
  row (so a per-token vector of total_M entries lines up), ``col`` the column (column vectors
  are shared by every expert). FP8 (sm_90a; sm_100a compiled only): a, b ``torch.float8_e4m3fn`` (b read K-major, e.g.
  ``w.transpose(1, 2)`` of an (E, N, K) weight, else copied), ``scale_a`` (total_M,) per token
  row or one value, ``scale_b`` (E, N) per expert and column, (E,) per expert, or one value —
  ``torch._scaled_grouped_mm``'s row-wise recipe; promoted accumulation (``fast_accum=True``:
  tensor-core accumulation). DeepSeek-style block scaling (sm_90a): ``scale_a`` (total_M,
  ceil(K/128)) per 1x128 block of a token row and a 3-D ``scale_b`` (E, ceil(K/128),
  ceil(N/128)) per 128x128 block of each expert's weight (the ``.transpose(1, 2)`` of an (E, N/128,
  K/128) weight-scale tensor), any layout (scale_a M-major, torch's, is TMA-loaded in place,
  others are copied per call; see ``gemm.fp8_args``), applied as each 128-wide K tile is promoted;
  composes with bias / activations / quantized outputs (not with gate_layout="halves"). bf16 /
  fp16: ``scale_a`` alone, an fp32 per-row output scale (e.g. a MoE layer's routing weights on
  the down projection), applied as FP8's is, before bias and activation.
  beta * C is not supported in the grouped form.

  Kernels (sm_90a): with up to 1024 mean rows per expert, bf16 / fp16 and an epilogue of alpha,
  bias, elementwise or gated activations, the policy runs the "swap AB" kernel
  (``GemmConfig.swap_ab``: C^T = B^T A^T, each expert's tokens as the WGMMA's N, split evenly over
  ceil(tokens / tile_n) tiles, one WGMMA width per 16 tokens and token loads in 32-row TMA chunks,
  so the last tile of a ragged expert costs only its real tokens; gate / up pairs meet by a lane
  shuffle; ``gemm.sm90.swap``), and so does FP8 row-wise with ``fast_accum=True``; otherwise
  (quantized, user epilogues, promoted or block-scaled FP8, decode-sized or larger experts) the
  kernel whose tiles run along the packed rows.
  Both sum each element over K in the same order: on the H200 their outputs were bitwise equal.
- K-grouped (weight gradient): ``grouped_gemm(a, b, offs=offs)`` with a (M, total_K), b (total_K, N)
  -> (E, M, N), offs splitting K (an expert with an empty slice gets zeros). sm_90a, bf16 / fp16:
  one launch of the K-grouped kernel (``GemmConfig.kgrouped``: tile (m, n, expert) reads the
  expert's K range from offs on the device, TMA boxes start at the range's first column rounded
  down to 16 bytes, and the consumers zero the columns outside the range in the first and last
  K tiles' stages): no host sync, CUDA-graph capturable. Elsewhere one dense GEMM per expert, reading offs on the host (not capturable).
  Bad offs are clamped as in the packed form (``schedulers.grouped.expert_rows``).
- list: ``grouped_gemm([a0, a1, ...], [b0, b1, ...])`` -> list, arbitrary per-group M, N, K, one
  dtype; epilogue: alpha, an elementwise ``activation`` (relu / gelu / gelu_tanh / silu), out_dtype. sm_90a and sm_100a (compile-verified), bf16 / fp16: one launch of the list-form kernel (``GemmConfig.listed``) after a
  small prep kernel that writes each group's TMA descriptors (A, B, C) on the device from a group
  table the host builds from the tensors' metadata (no sync; outputs are views of one buffer).
  Elsewhere, and for operands TMA cannot read in place, groups whose operands are stored with
  different majors, output rows that are not 16-byte multiples, or a call made while a CUDA graph
  is being captured (the table is copied from the host per call): one dense GEMM per group (no
  sync; graph-capturable when shapes are fixed).

- 3-D forms of torch._grouped_mm (a of shape (G, M, K)): 3d x 3d (batched, no offs) and 3d x 2d
  (offs splitting b's N), rewritten onto the dense batched GEMM or this packed form:
  :mod:`cutegemm.grouped.batched`.

This module holds the public entry and the packed form (the reference twin: :mod:`cutegemm.grouped.reference`); the K-grouped, 3-D
and list forms' host paths are :mod:`cutegemm.grouped.k_grouped`, :mod:`cutegemm.grouped.batched`
and :mod:`cutegemm.grouped.list_form`.
"""

from __future__ import annotations

from dataclasses import replace
from numbers import Real
from types import SimpleNamespace

import torch

from ..config import QUANT_FORMATS, QUANT_OUT_DTYPES, TMA_ALIGN_BYTES, GemmConfig, GemmProblem, can_implement
from ..epilogue import ACTIVATIONS, GATED, EpilogueSpec, interleave_gate_up
from ..epilogue.user import register
from ..gemm.args import KernelArgs, scaled_tail
from ..gemm.dense import warm_scale_view
from ..gemm.fp8_scales import fp8_grouped_block_scales, not_e4m3, scale_vector
from ..gemm.grouped_parts import GROUPED_MAX_GROUPS
from ..gemm.launch import (
    EPI_TORCH_DTYPES,
    GROUPED_CACHE,
    INPUT_TO_NAME,
    NAME_TO_TORCH,
    TORCH_FP8,
    TORCH_TO_NAME,
    aligned_operand,
    c_major_of,
    check_activation,
    check_config,
    check_offs_values,
    check_operand,
    current_device,
    epilogue_vectors,
    global_scale,
    interleave_b,
    kernel_view,
    memo_view,
    new_workspace,
    packed_m_major,
    padded_rows,
    quant_outputs,
    quant_result,
    rowmajor_operand,
    stores_m_major,
    tma_storable,
    unit_mode,
)
from ..policy import policy_for
from ..runtime.device import device_info, max_clusters_for
from ..tuning import tuned_config
from .batched import Transposed3d2d, batched_dense, grouped_3d, transposed_operands
from .k_grouped import grouped_k, grouped_k_fp8, kgrouped_warm
from .list_form import grouped_list
from .reference import grouped_gemm_ref

PLANS: dict = {}


class _GroupedPlan:
    __slots__ = ("fn", "views", "max_clusters", "config", "workspace", "device", "device_index", "out_dims",
                 "out_dtype", "b_memo", "quant", "out_shape", "swap", "tail", "sb_memo", "scaled_tail", "sfb")  # fmt: skip

    def launch(self, a, b, out, offs, alpha, bias=None, extra=None, block=(None, None)):
        """extra: (quantized-output scale bytes, NVFP4 global scale, v0..v3) or None; block: FP8
        block scales (scale_a (total_M, KB), scale_b's (NB, KB, E) view) or (None, None)."""
        (sa, ta), (sb, tb), (sc, tc) = self.views
        av, bv = a.as_strided(sa, ta), memo_view(self, b, sb, tb)
        if self.swap:  # config.swap_ab: the kernel computes C^T = B^T A^T (C's view is (N, total_M, 1))
            av, bv = bv, av
        if extra is None and block[0] is None:  # the common MoE call: LEADING fields, then the plan's tail
            self.fn(av, bv, out.as_strided(sc, tc), None, bias, alpha, 0.0, self.max_clusters, offs, *self.tail)
            return
        out_scales, out_gs, v0, v1, v2, v3 = extra or _NO_EXTRA
        self.fn(*KernelArgs(
            av, bv, out.as_strided(sc, tc), bias=bias, alpha=alpha, max_clusters=self.max_clusters, offs=offs,
            sfa=block[0], sfb=block[1], out_scales=out_scales, out_global_scale=out_gs, v0=v0, v1=v1, v2=v2, v3=v3,
            workspace=self.workspace,
        ))  # fmt: skip

    def launch_scaled(self, a, b, out, offs, alpha, v0, v1):
        """The warm FP8 row-wise call (scale_a, scale_b, no other epilogue input): what
        :meth:`launch` passes for it, v0 / v1 the kernel's 1-D views of the scales."""
        (sa, ta), (sb, tb), (sc, tc) = self.views
        av, bv = a.as_strided(sa, ta), memo_view(self, b, sb, tb)
        if self.swap:
            av, bv = bv, av
        # LEADING fields, then the tail with v0 / v1 (gemm.args)
        pre, post, _ = self.scaled_tail
        self.fn(av, bv, out.as_strided(sc, tc), None, None, alpha, 0.0, self.max_clusters, offs, *pre, v0, v1, *post)

    def new_output(self):
        """(the tensor the kernel writes, quantized-output scale bytes or None)."""
        if self.quant is None:
            return torch.empty(*self.out_dims, dtype=self.out_dtype, device=self.device), None
        return quant_outputs(self.quant, self.out_shape, self.device)


_NO_EXTRA = (None,) * 6
_ROWWISE = object()  # marks the FP8 row-wise calls' own plan keys in PLANS


def _cache_scaled(skey, plan, a, epi: _Epi, scale_a, scale_b) -> None:
    """Files ``plan`` (cached under the call's full key) under the FP8 call's own key ``skey`` when
    the warm path passes the kernel what this call passed: row-wise, the scales' 1-D views made the
    way the warm path makes them (scale_a: ``warm_scale_view``, scale_b: a unit-stride view from
    its start); block scales, scale_a itself and a view of scale_b (``plan.sfb``: its size and
    stride). Never where this call copied a scale."""
    if skey is None or a.dtype != torch.float8_e4m3fn or plan.quant is not None:
        return
    sfa, sfb = epi.block
    if sfa is not None:
        if sfa is not scale_a or sfb.data_ptr() != scale_b.data_ptr():
            return
        plan.sfb = (sfb.shape, sfb.stride())
    else:
        v0, v1 = epi.vectors
        if v0 is None or v1 is None or v1.stride() != (1,) or v1.data_ptr() != scale_b.data_ptr():
            return
        w0 = warm_scale_view(scale_a)
        if (v0.shape, v0.stride(), v0.data_ptr()) != (w0.shape, w0.stride(), w0.data_ptr()):
            return
        plan.scaled_tail = scaled_tail(plan.tail, v1.shape)
    plan.sb_memo = plan.sb_memo or SimpleNamespace(b_memo=None)  # memo_view's holder
    PLANS[skey] = plan


def _per_expert(name: str, t, E: int, n: int, device, dtypes=EPI_TORCH_DTYPES) -> torch.Tensor:
    """A per-(expert, column) vector given as (E, n), (n,) (shared by every expert), (E,) / (E, 1)
    (one value per expert) or one element, as the kernel reads it: flat contiguous (E * n,)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name}.dtype must be one of {dtypes}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}")
    if t.shape == (E, n):
        v = t
    elif t.shape == (n,) or t.numel() == 1:
        v = t.reshape(1, -1).expand(E, n)
    elif t.shape in ((E,), (E, 1)):
        v = t.reshape(E, 1).expand(E, n)
    else:
        raise ValueError(f"{name} must have shape ({E}, {n}) (per expert and column), ({n},) or ({E},), got {tuple(t.shape)}")
    v = v.contiguous()
    return (v.clone() if v.data_ptr() % TMA_ALIGN_BYTES else v).view(-1)


class _Epi:
    """The packed form's epilogue inputs of one call, as the kernel takes them."""

    __slots__ = ("bias", "vectors", "quant", "gs", "activation", "user", "fp8", "block")

    def __init__(self):
        self.bias = self.gs = self.activation = self.user = self.quant = None
        self.vectors = ()
        self.fp8 = False
        self.block = (None, None)  # FP8 block scaling: (scale_a, scale_b's kernel view)

    def spec(self, alpha):
        gated = self.activation in GATED
        return EpilogueSpec(
            alpha=alpha != 1.0,
            bias=self.bias is not None,
            bias_dtype=TORCH_TO_NAME[self.bias.dtype] if self.bias is not None else "fp32",
            activation=None if gated else self.activation,
            gated=self.activation if gated else None,
            quant=self.quant,
            user=self.user,
            user_args=tuple(TORCH_TO_NAME[v.dtype] for v in self.vectors) if self.user is not None else (),
            scale_a=self.user is None and len(self.vectors) == 2 and self.vectors[0] is not None,
            scale_b=self.user is None and len(self.vectors) == 2 and self.vectors[1] is not None,
        )

    def _finish(self, out_global_scale, device):
        if self.quant is not None or out_global_scale is not None:
            self.gs = global_scale(self.quant, out_global_scale, device)
        return self

    def extra(self, scales):
        if scales is None and self.gs is None and not self.vectors:
            return None
        return (scales, self.gs, *(*self.vectors, None, None, None, None)[:4])


def _plan_packed(a, b, offs, out, out_dtype, alpha, config, epi_in: _Epi, fast_accum=False):
    blockwise = epi_in.block[0] is not None
    E, K, N = b.shape
    total_m = a.shape[0]
    if a.stride(1) != 1 and K > 1:
        raise ValueError("a must be row-major (stride 1 along K) for the packed grouped form")
    b_unit = unit_mode(b, 1 if a.dtype in TORCH_FP8 else 2)  # (FP8 reads B K-major: K where N is 1)
    if b_unit is None:
        raise ValueError("b must have a contiguous K or N dim (e.g. (E, K, N) or (E, N, K).transpose(1, 2))")
    # An out the caller gave M-major (grouped_gemm checked stores_m_major): config.c_major "m"
    c_major = c_major_of(out)
    views = (
        kernel_view(a.unsqueeze(0), 2, (1, 2, 0), "a"),
        kernel_view(b, b_unit, (2, 1, 0), "b"),
        kernel_view(out.unsqueeze(0), 2 if c_major == "n" else 1, (1, 2, 0), "out"),
    )
    arch, num_sms = device_info(a.device.index)
    quant = epi_in.quant
    out_name = QUANT_OUT_DTYPES[quant] if quant is not None else TORCH_TO_NAME[out_dtype]
    problem = GemmProblem(
        total_m, N, K, 1, INPUT_TO_NAME[a.dtype], INPUT_TO_NAME[b.dtype], out_name, "k", "n" if b_unit == 2 else "k"
    )
    epi = epi_in.spec(alpha)
    extra = {"fast_accum": True} if fast_accum else {}
    if blockwise:
        extra["fp8_blockwise"] = True
    if c_major == "m":
        extra["c_major"] = "m"
    if config is None:  # opt-in autotuning (cutegemm.tuning); None when off: the policy's default

        config = tuned_config(arch, problem, epi, "grouped", runner=grouped_runner, num_groups=E, num_sms=num_sms)
        ok = config is not None and (config.fast_accum, config.fp8_blockwise, config.c_major) == (fast_accum, blockwise, c_major)
        config = config if ok else None
    elif config.epilogue != epi and config.epilogue in (EpilogueSpec(), replace(epi, alpha=False)):
        config = replace(config, epilogue=epi)  # a forced tile: the call's arguments give the epilogue
    elif config.epilogue not in (epi, replace(epi, alpha=True)):  # an alpha kernel serves alpha == 1
        raise ValueError(f"config.epilogue {config.epilogue} does not match the call's epilogue {epi}")
    if config is not None and config.c_major != c_major:
        config = replace(config, c_major=c_major)  # the out's layout gives C's major
    if config is not None and (config.arch != arch or not config.grouped):
        raise ValueError(f"config {config.name} cannot run the grouped form on this GPU (arch {arch}; needs form=Form.GROUPED and that arch)")
    cfg = config if config is not None else policy_for(arch, num_sms).choose_grouped(problem, E, epilogue=epi, **extra)
    if cfg.fp8_blockwise != blockwise:
        raise ValueError(f"config {cfg.name}: fp8_blockwise={cfg.fp8_blockwise} but the call's scales are "
                         f"{'1x128 / 128x128 block scales' if blockwise else 'not block scales'}")  # fmt: skip
    ok, why = can_implement(cfg, problem)
    if not ok:
        raise ValueError(f"cannot run {cfg.name}: {why}")
    plan = _GroupedPlan()
    try:
        plan.fn = GROUPED_CACHE.get(cfg)
    except Exception as exc:
        if epi.user is None:
            raise
        raise ValueError(f"the user epilogue could not be traced into the kernel: {type(exc).__name__}: {exc}") from exc
    plan.swap = cfg.swap_ab
    if cfg.swap_ab:  # the output as the kernel's (N, total_M, 1) C^T
        views = (*views[:2], kernel_view(out.unsqueeze(0), 2, (2, 1, 0), "out"))
    plan.views = views
    plan.max_clusters = max_clusters_for(cfg, a.device, num_sms)
    plan.workspace = new_workspace(cfg, a.device)
    plan.tail = KernelArgs(None, None, None, workspace=plan.workspace).tail()
    plan.config = cfg
    plan.quant, plan.sfb, plan.sb_memo = quant, None, None  # sfb, sb_memo: the FP8 warm plan's (_cache_scaled)
    return plan


def _fast_key(a, b, offs, out, out_dtype, alpha, config, epilogue_inputs, bias=None, activation=None, epilogue=None,
              epilogue_args=(), scale_a=None, scale_b=None, fast_accum=False, gate_layout="interleaved"):  # fmt: skip
    """The plan key of a packed call: every property the checks below read, so a cached plan
    implies they all pass (but data-pointer alignment). Positions 0 / 2 / 4 / -1 (a.shape,
    b.shape, a.dtype, config) are read by benchmarks and tests. None when the inputs are not tensors."""
    try:
        key = (
            a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.device, b.device,
            offs.shape, offs.dtype, offs.device, out_dtype,
            None if out is None else (out.shape, out.stride(), out.dtype, out.device),
            alpha != 1.0,
        )  # fmt: skip
        if epilogue_inputs:
            key += (
                None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.device),
                activation, gate_layout, epilogue,
                tuple((v.shape, v.stride(), v.dtype, v.device) for v in epilogue_args),
                None if scale_a is None else (scale_a.shape, scale_a.stride(), scale_a.device),
                None if scale_b is None else (scale_b.shape, scale_b.stride(), scale_b.device),
                fast_accum,
            )  # fmt: skip
        return (*key, config)
    except (AttributeError, TypeError):
        return None


def _prepare_epilogue(a, b, E, N, total_m, out_dtype, bias, activation, epilogue, epilogue_args,
                      out_global_scale, scale_a, scale_b) -> _Epi:  # fmt: skip
    """Checks the packed form's epilogue arguments and converts them to the kernel's inputs
    (N: the GEMM's columns, gated included)."""
    e = _Epi()
    e.activation = activation
    e.quant = out_dtype if isinstance(out_dtype, str) else None
    if bias is not None:
        e.bias = _per_expert("bias", bias, E, N, a.device)
    if epilogue is not None:
        if bias is not None or activation is not None:
            raise ValueError("a user epilogue replaces bias and activation: apply them inside it")
        e.user = register(epilogue)
        e.vectors = epilogue_vectors(epilogue_args, a.device)
    elif epilogue_args:
        raise ValueError("epilogue_args given without an epilogue function")
    if a.dtype == torch.float8_e4m3fn:
        if epilogue is not None:
            raise ValueError("a user epilogue cannot be combined with FP8 inputs yet")
        e.fp8 = True
        block = fp8_grouped_block_scales(a, b, scale_a, scale_b)
        if block is not None:
            e.block, e.vectors = block, (None, None)
            return e._finish(out_global_scale, a.device)
        e.vectors = (
            None if scale_a is None else scale_vector("scale_a", scale_a, total_m, a.device, "row of a"),
            None if scale_b is None else _per_expert("scale_b", scale_b, E, N, a.device, (torch.float32,)),
        )
    elif scale_b is not None:
        raise ValueError(f"{not_e4m3(a)}; 16-bit operands take scale_a only (an fp32 per-row output scale)")
    elif scale_a is not None:  # 16-bit: an fp32 per-row output scale (e.g. a MoE layer's routing weights)
        e.vectors = (scale_vector("scale_a", scale_a, total_m, a.device, "row of a"), None)
    return e._finish(out_global_scale, a.device)


def grouped_gemm(a, b, *, offs=None, out=None, out_dtype=None, alpha: float = 1.0, bias=None,
                 activation: str | None = None, gate_layout: str = "interleaved", epilogue=None,
                 epilogue_args=(), out_global_scale=None, scale_a=None, scale_b=None,
                 fast_accum: bool = False, config=None, check_offs: bool = False):  # fmt: skip
    """See the module docstring for the three forms; the epilogue arguments (packed form only)
    are described there too."""
    skey = None
    if (
        scale_b is not None and scale_a is not None and out is None and bias is None and activation is None
        and epilogue is None and not epilogue_args and out_global_scale is None and gate_layout == "interleaved"
        and (fast_accum is False or fast_accum is True) and (out_dtype is None or out_dtype.__class__ is torch.dtype)
    ):  # fmt: skip
        # FP8 row-wise or block scales, no other epilogue input: a key of its
        # own that fixes every property the checks read (shapes, strides, dtypes, devices), so a
        # plan implies they pass but data-pointer alignment (a misaligned scale is copied: cold).
        try:
            skey = (a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.device, b.device,
                    offs.shape, offs.dtype, offs.device, out_dtype, alpha != 1.0, _ROWWISE,
                    scale_a.shape, scale_a.stride(), scale_a.dtype, scale_a.device,
                    scale_b.shape, scale_b.stride(), scale_b.dtype, scale_b.device, fast_accum, config)  # fmt: skip
            plan = PLANS.get(skey)
        except (AttributeError, TypeError):
            skey = plan = None
        if (
            plan is not None
            and current_device() == plan.device_index
            and not (a.data_ptr() % 16 or b.data_ptr() % 16 or scale_a.data_ptr() % 16 or scale_b.data_ptr() % 16)
        ):
            if check_offs:
                check_offs_values(offs, a.shape[0])
            out = torch.empty(*plan.out_dims, dtype=plan.out_dtype, device=plan.device)
            sfb = plan.sfb
            if sfb is not None:  # block scales: scale_a in place, scale_b's kernel view memoized
                plan.launch(a, b, out, offs, float(alpha), None, None, (scale_a, memo_view(plan.sb_memo, scale_b, *sfb)))
                return out
            # scale_b (the weight's) as a view memoized per object, scale_a (new per call) viewed
            sb = memo_view(plan.sb_memo, scale_b, plan.scaled_tail[2], (1,))
            sa = scale_a if scale_a.dim() == 1 else scale_a.view(-1)  # warm_scale_view, inline
            plan.launch_scaled(a, b, out, offs, float(alpha), sa, sb)
            return out
    # Anything beyond a plain-dtype output: the general fast path (a quantized output, too, needs
    # its scale bytes and its BlockScaledTensor result; gate_layout and epilogue_args are checked
    # there).
    epilogue_inputs = (bias is not None or activation is not None or epilogue is not None or scale_a is not None
                       or scale_b is not None or fast_accum or isinstance(out_dtype, str)
                       or out_global_scale is not None or gate_layout != "interleaved" or bool(epilogue_args))  # fmt: skip
    key = None if offs is None else _fast_key(a, b, offs, out, out_dtype, alpha, config, epilogue_inputs, bias,
                                              activation, epilogue, epilogue_args, scale_a, scale_b, fast_accum,
                                              gate_layout)  # fmt: skip
    plan = PLANS.get(key) if key is not None else None
    if plan is not None and not (
        current_device() == plan.device_index
        and not (a.data_ptr() % 16 or b.data_ptr() % 16 or (out is not None and out.data_ptr() % 16))
    ):
        plan = None  # the slow path (other device: a plan of its own; misaligned: the error)
    if plan is not None:
        if plan.__class__ is not _GroupedPlan:  # the K-grouped or 3d x 2d form's warm call
            return plan.run(a, b, out, offs, alpha, check_offs)
        if check_offs:
            check_offs_values(offs, a.shape[0])
        if not epilogue_inputs:  # the common MoE call
            if out is None:
                out = torch.empty(*plan.out_dims, dtype=plan.out_dtype, device=plan.device)
            plan.launch(a, b, out, offs, float(alpha))
            return out
    elif isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        if activation is not None and activation not in ACTIVATIONS:
            raise ValueError(f"the list form takes activation None or one of {ACTIVATIONS} (no gated ones), got {activation!r}")
        _no_epilogue("the list form", bias, None, epilogue, out_global_scale, scale_a, scale_b, out_dtype)
        if (out is not None or config is not None or check_offs or epilogue_args or gate_layout != "interleaved"
                or fast_accum):  # fmt: skip
            given = {"out": out is not None, "config": config is not None, "check_offs": check_offs,
                     "epilogue_args": epilogue_args, "gate_layout": gate_layout != "interleaved", "fast_accum": fast_accum}  # fmt: skip
            raise ValueError(f"the list form takes out_dtype, alpha and activation only (it returns new outputs), got "
                             f"{[k for k, v in given.items() if v]}")  # fmt: skip
        return grouped_list(a, b, offs=offs, out_dtype=out_dtype, alpha=alpha, activation=activation)
    elif isinstance(a, torch.Tensor) and a.dim() == 3:  # torch._grouped_mm's 3d x 3d and 3d x 2d forms
        check_config(config)
        if offs is None and not epilogue_inputs and config is None and a.dtype not in TORCH_FP8:
            return batched_dense(a, b, out, out_dtype, alpha)  # grouped_3d's route for these options
        res = grouped_3d(a, b, offs, grouped_gemm, out=out, out_dtype=out_dtype, alpha=alpha, bias=bias,
                         activation=activation, gate_layout=gate_layout, epilogue=epilogue,
                         epilogue_args=epilogue_args, out_global_scale=out_global_scale, scale_a=scale_a,
                         scale_b=scale_b, fast_accum=fast_accum, config=config, check_offs=check_offs)  # fmt: skip
        if key is not None and not epilogue_inputs and out is None and b.dim() == 2:  # 3d x 2d: a warm plan
            bt, at, dtype = transposed_operands(a, b, out_dtype)
            inner = PLANS.get(_fast_key(bt, at, offs, res.t(), dtype, alpha, config, False))  # stored M-major
            inner = inner or PLANS.get(_fast_key(bt, at, offs, None, dtype, alpha, config, False))
            if inner.__class__ is _GroupedPlan:
                PLANS[key] = Transposed3d2d(inner)
        return res
    fp8 = getattr(a, "dtype", None) == torch.float8_e4m3fn
    if plan is None:
        check_config(config)
        if isinstance(alpha, torch.Tensor):
            raise TypeError("alpha must be a Python number, not a tensor (reading its value is a host sync): "
                            "pass float(alpha)")
        if not isinstance(alpha, Real):
            raise TypeError(f"alpha must be a real number, got {type(alpha).__name__}")
        check_operand("a", a, dims=(2,))
        check_operand("b", b, dims=(2, 3))
        if offs is None:
            raise ValueError("offs is required for tensor inputs (int32 cumulative end offsets, on the GPU)")
        if not isinstance(offs, torch.Tensor) or offs.dtype != torch.int32 or offs.dim() != 1:
            raise TypeError("offs must be a 1-D torch.int32 tensor")
        if offs.device != a.device:
            raise ValueError(f"offs must be on {a.device} (no host sync on this path), got {offs.device}")
        if a.dtype not in (torch.bfloat16, torch.float16, torch.float8_e4m3fn) or b.dtype != a.dtype:
            raise TypeError(f"a and b must both be bf16, fp16 or float8_e4m3fn, got {a.dtype} and {b.dtype}")
        if b.device != a.device:
            raise ValueError(f"b must be on {a.device}, got {b.device}")
    if out_dtype is None:
        out_dtype = out.dtype if isinstance(out, torch.Tensor) else torch.bfloat16 if fp8 else a.dtype
    quant = out_dtype if isinstance(out_dtype, str) else None
    if plan is None:
        if quant is not None:
            if quant not in QUANT_FORMATS:
                raise ValueError(f"a quantized out_dtype must be one of {QUANT_FORMATS}, got {quant!r}")
            if out is not None:
                raise ValueError(f"out= is not supported with a quantized output ({quant})")
        elif out_dtype not in TORCH_TO_NAME:
            raise TypeError(f"out_dtype must be bf16, fp16, fp32 or one of mxfp8 / mxfp4 / nvfp4, got {out_dtype}")
        if activation is not None or gate_layout != "interleaved":
            check_activation(activation, gate_layout)
        if b.dim() == 2:
            _no_epilogue("the K-grouped form", bias, activation, epilogue, out_global_scale, None, None, out_dtype)
            if fp8:
                return grouped_k_fp8(a, b, offs, out, out_dtype, alpha, check_offs, scale_a, scale_b, fast_accum)
            if scale_a is not None or scale_b is not None:
                raise not_e4m3(a)
            res = grouped_k(a, b, offs, out, out_dtype, alpha, check_offs, config)
            warm = None if key is None or epilogue_inputs else kgrouped_warm(a, b, out, res, alpha, config)
            if warm is not None:
                PLANS[key] = warm
            return res
        E, K, N = b.shape
        if a.shape[1] != K:
            raise ValueError(f"a (total_M, K={a.shape[1]}) and b (E, K={K}, N) disagree on K")
        if offs.numel() != E:
            raise ValueError(f"offs has {offs.numel()} entries but b has {E} experts")
        if E > GROUPED_MAX_GROUPS:
            raise ValueError(f"at most {GROUPED_MAX_GROUPS} experts are supported (the kernel's tile table), got {E}")
    E, K, N = b.shape
    total_m = a.shape[0]
    b_call = b
    user_out_given = out is not None
    gated = activation in GATED
    if gated and gate_layout == "halves":
        if isinstance(scale_b, torch.Tensor) and scale_b.dim() == 3:
            raise ValueError("FP8 block scaling with gate_layout='halves': interleaving b's columns would split its "
                             "128-column scale blocks; store the weight (and its scales) interleaved instead")  # fmt: skip
        if N % 2 == 0:
            b = interleave_b(b)  # a copy per call: store the weight interleaved instead
            if isinstance(bias, torch.Tensor) and bias.shape[-1] == N:
                bias = interleave_gate_up(bias, dim=-1)
    epi_in = _prepare_epilogue(a, b, E, N, total_m, out_dtype, bias, activation, epilogue, epilogue_args,
                               out_global_scale, scale_a, scale_b)  # fmt: skip
    n_out = N // 2 if gated else N
    if plan is not None:
        scales = None
        if out is None:
            out, scales = plan.new_output()
        plan.launch(a, b, out, offs, float(alpha), epi_in.bias, epi_in.extra(scales), epi_in.block)
        _cache_scaled(skey, plan, a, epi_in, scale_a, scale_b)  # another FP8 row-wise signature's plan
        return out if quant is None else quant_result(quant, plan.out_shape, out, scales, epi_in.gs)
    if gated and N % 2:
        raise ValueError(f"a gated activation needs b with an even number of columns (gate, up), got {N}")
    if quant is not None and n_out % 32:
        raise ValueError(f"a quantized output needs a multiple of 32 columns, got {n_out}")
    scales = None
    if quant is not None:
        out, scales = quant_outputs(quant, (total_m, n_out), a.device)
    elif out is None:
        out = torch.empty(total_m, n_out, dtype=out_dtype, device=a.device)
    else:
        check_operand("out", out, dims=(2,), written=True)
        if out.shape != (total_m, n_out) or out.dtype != out_dtype or out.device != a.device:
            raise ValueError(f"out must be a ({total_m}, {n_out}) {out_dtype} tensor on {a.device}")
    if check_offs:
        check_offs_values(offs, total_m)

    def result():
        return out if quant is None else quant_result(quant, (total_m, n_out), out, scales, epi_in.gs)

    if E == 0 or total_m == 0 or n_out == 0:
        return result()
    if K == 0:  # the epilogue of a zero product; rows at or past offs[-1] keep their values (no sync)
        if bias is None and activation is None and epilogue is None and quant is None:
            ref = torch.zeros((), dtype=out.dtype, device=out.device)
        else:
            ref = grouped_gemm_ref(a, b, offs=offs, out_dtype=out_dtype, alpha=alpha, bias=bias, activation=activation,
                                   epilogue=epilogue, epilogue_args=epilogue_args, out_global_scale=out_global_scale)  # fmt: skip
            if quant is not None:
                return ref
        rows = torch.arange(total_m, device=out.device).unsqueeze(1) < offs[-1].to(out.device)
        return out.copy_(torch.where(rows, ref, out))
    # The staging route (layouts TMA cannot address, as torch accepts them): a row-major copy of a
    # (its rows padded to 16 bytes), b with its leading dimension padded (FP8: K-major), and an
    # out the TMA store cannot write computed into a padded scratch that starts as a copy of out
    # (rows past offs[-1] keep their values) and is copied back. Such calls are not cached.
    a_call, out_call = a, out
    a = rowmajor_operand(a)
    if fp8 and b.stride(1) != 1 and K > 1:
        b = padded_rows((E, N, K), b.dtype, b.device).copy_(b.mT).mT  # FP8 WGMMA reads B K-major
    b = aligned_operand(b, 1 if fp8 else 2)
    # An M-major out (e.g. the 3d x 2d form's transposed result) is stored M-major in place where
    # the kernel can (config.c_major "m"); else a row-major scratch and a copy.
    m_major = (packed_m_major() and user_out_given and not gated and not (config is not None and config.swap_ab)
               and stores_m_major(out, device_info(a.device.index)[0]))  # fmt: skip
    if quant is None and not tma_storable(out) and not m_major:
        out = padded_rows(out.shape, out.dtype, out.device)
        if user_out_given:
            out.copy_(out_call)
    plan = _plan_packed(a, b, offs, out, out_dtype, alpha, config, epi_in, fast_accum)
    plan.device, plan.device_index = a.device, a.device.index
    plan.out_dims, plan.out_dtype, plan.out_shape = (total_m, n_out), out_dtype, (total_m, n_out)
    # Cacheable when the kernel reads the call's own tensors and writes its out (no staging, no
    # interleave / K-major copy).
    if key is not None and b is b_call and a is a_call and out is out_call:
        PLANS[key] = plan
        _cache_scaled(skey, plan, a, epi_in, scale_a, scale_b)
    if a.device.index == current_device():
        plan.launch(a, b, out, offs, float(alpha), epi_in.bias, epi_in.extra(scales), epi_in.block)
    else:
        with torch.cuda.device(a.device):
            plan.launch(a, b, out, offs, float(alpha), epi_in.bias, epi_in.extra(scales), epi_in.block)
    if out is not out_call:
        if not user_out_given:
            return out.contiguous()  # an odd N's padded scratch: a compact result
        out_call.copy_(out)
        out = out_call
    return result()


def _no_epilogue(form, bias, activation, epilogue, out_global_scale, scale_a, scale_b, out_dtype):
    if any(x is not None for x in (bias, activation, epilogue, out_global_scale, scale_a, scale_b)) or isinstance(out_dtype, str):
        more = " (the list form also takes relu / gelu / gelu_tanh / silu)" if form == "the list form" else ""
        raise ValueError(f"{form} takes alpha only{more}: bias, activations, user epilogues, FP8 scales and quantized "
                         "outputs are for the packed (offs) form")  # fmt: skip


def grouped_counts(total_m: int, num_groups: int) -> list[int]:
    """Uneven (multinomial, fixed seed) rows per expert summing to total_m, like a router's."""
    gen = torch.Generator().manual_seed(0)
    idx = torch.multinomial(torch.ones(num_groups), total_m, replacement=True, generator=gen)
    return idx.bincount(minlength=num_groups).tolist()


def grouped_runner(p: GemmProblem, epi: EpilogueSpec, num_groups: int):
    """The autotuner's runner (``tuning.tune``) for the packed form: uneven expert sizes."""
    dt, out_dtype = NAME_TO_TORCH[p.a_dtype], NAME_TO_TORCH[p.out_dtype]
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(p.m, p.k, device="cuda", dtype=dt, generator=gen)
    b = torch.randn(num_groups, p.k, p.n, device="cuda", dtype=dt, generator=gen) * p.k**-0.5
    b = b.mT.contiguous().mT if p.b_major == "k" else b
    offs = torch.tensor(grouped_counts(p.m, num_groups), device="cuda").cumsum(0).to(torch.int32)
    bias = torch.randn(num_groups, p.n, device="cuda", generator=gen).to(NAME_TO_TORCH[epi.bias_dtype])  # per expert
    kw = dict(alpha=0.5 if epi.alpha else 1.0, out_dtype=out_dtype, activation=epi.gated or epi.activation,
              bias=bias if epi.bias else None)  # fmt: skip
    ref = grouped_gemm_ref(a, b, offs=offs, **kw)

    def run(cfg: GemmConfig):
        return grouped_gemm(a, b, offs=offs, config=cfg, **kw)

    return run, ref
