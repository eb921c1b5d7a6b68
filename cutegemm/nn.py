"""torch modules built on the grouped GEMM."""

from __future__ import annotations

import torch
from torch import nn

from .api.face import grouped_gemm, grouped_gemm_ref
from .blockscaled.quantize_launch import quantize
from .epilogue import epilogue_ref
from .moe import grouped_experts


class GroupedExperts(nn.Module):
    """The expert MLPs of an MoE layer: per expert ``down(silu(x @ W_gate) * (x @ W_up))``.

    Routing is given, not computed: ``x`` holds the tokens sorted by expert (total_tokens, hidden)
    and ``offs`` (int32, on x's device) the cumulative end row of each expert, as produced by a
    router's sort. Weights are stored as (E, out, in) like ``nn.Linear`` and used as transposed
    views (no copies). ``w_gate_up`` interleaves its output rows: row 2j is gate j, row 2j + 1 is
    up j (``cutegemm.epilogue.interleave_gate_up(w, dim=1)`` converts a [gate | up] stack).

    Runs :func:`cutegemm.moe.grouped_experts`: without a gradient (``torch.no_grad()``,
    inference) the SwiGLU is fused into the first grouped GEMM's epilogue (two launches); with one
    it trains: the pre-activations (T, 2I) are saved and the backward runs four grouped GEMMs
    (packed for the input gradients, K-grouped for the weight gradients). No host sync either
    way. CUDA tensors run the kernels, CPU tensors the reference twins (fp32 math).
    """

    def __init__(self, num_experts: int, hidden: int, intermediate: int, *, dtype=torch.bfloat16, device=None):
        super().__init__()
        self.num_experts, self.hidden, self.intermediate = num_experts, hidden, intermediate
        # gate and up interleaved: rows 2j gate j, 2j + 1 up j.
        self.w_gate_up = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden, dtype=dtype, device=device))
        self.w_down = nn.Parameter(torch.empty(num_experts, hidden, intermediate, dtype=dtype, device=device))
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.normal_(self.w_gate_up, std=self.hidden**-0.5)
        nn.init.normal_(self.w_down, std=self.intermediate**-0.5)

    def forward(self, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return grouped_experts(x, self.w_gate_up.transpose(1, 2), self.w_down.transpose(1, 2), offs)

    def forward_ref(self, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        """Plain-torch twin (fp32 math, host loop over experts)."""
        out = torch.zeros(x.shape[0], self.hidden, dtype=torch.float32, device=x.device)
        prev = 0
        for e, end in enumerate(offs.tolist()):
            xe = x[prev:end].float()
            gu = xe @ self.w_gate_up[e].float().t()
            act = torch.nn.functional.silu(gu[:, 0::2]) * gu[:, 1::2]
            out[prev:end] = act @ self.w_down[e].float().t()
            prev = end
        return out.to(x.dtype)

    def quantized(self, fmt: str = "nvfp4") -> QuantizedGroupedExperts:
        """The same experts with FP4 weights (``"nvfp4"`` or ``"mxfp4"``) for decode: see
        :class:`QuantizedGroupedExperts`."""
        return QuantizedGroupedExperts(self, fmt)


class QuantizedGroupedExperts(nn.Module):
    """Inference twin of :class:`GroupedExperts` with FP4 (NVFP4 / MXFP4) weights: both grouped
    GEMMs run the FP4-weight kernel (``cutegemm.blockscaled.weight_only.kernel``: weights dequantized in
    registers, never in memory; built for decode, i.e. few tokens per expert), the SwiGLU runs in
    torch between them (the FP4 kernel has no fused epilogue). Same routing inputs, no host sync.
    Weights are quantized once with ``cutegemm.quantize`` (per-tensor NVFP4 global scale from the
    weight's amax)."""

    def __init__(self, experts: GroupedExperts, fmt: str = "nvfp4"):
        super().__init__()
        self.fmt, self.hidden = fmt, experts.hidden
        with torch.no_grad():
            self.q_gate_up = quantize(experts.w_gate_up.detach().to(torch.bfloat16), fmt)
            self.q_down = quantize(experts.w_down.detach().to(torch.bfloat16), fmt)

    def forward(self, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        gu = grouped_gemm(x, self.q_gate_up, offs=offs)  # (T, 2I), gate/up interleaved
        return grouped_gemm(_swiglu(gu, x.dtype), self.q_down, offs=offs)

    def forward_ref(self, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        """Plain-torch twin on the dequantized weights (fp32 math, bf16 between the GEMMs like
        the kernel path)."""
        gu = grouped_gemm_ref(x, self.q_gate_up, offs=offs, out_dtype=x.dtype)
        return grouped_gemm_ref(_swiglu(gu, x.dtype), self.q_down, offs=offs, out_dtype=x.dtype)


def _swiglu(gu: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """silu(gate) * up of interleaved gate/up columns, in fp32, cast to ``dtype``."""
    return epilogue_ref(gu.float(), activation="swiglu").to(dtype)

