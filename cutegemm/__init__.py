"""cutegemm: GEMM kernels for NVIDIA Hopper (sm_90a, run-verified on H200) and Blackwell
(sm_100a, compile-verified), written with CuTe DSL.

Public API: ``gemm``, ``gemm_ref``, ``grouped_gemm``, ``grouped_gemm_ref``, ``GemmConfig``,
``can_implement``; ``cutegemm.nn.GroupedExperts``; torch custom ops (torch.compile, autograd):
``torch.ops.cutegemm.gemm`` / ``torch.ops.cutegemm.grouped_gemm`` (``cutegemm.ops``).
"""

from . import ops  # registers torch.ops.cutegemm.{gemm, grouped_gemm}; no device queries
from .blockscaled.quantize import dequantize, quantize
from .config import GemmConfig, GemmProblem, can_implement
from .epilogue import EpilogueSpec
from .gemm.dense import gemm, gemm_ref
from .grouped import grouped_gemm, grouped_gemm_ref

__version__ = "0.1.0"
__all__ = [
    "gemm",
    "gemm_ref",
    "grouped_gemm",
    "grouped_gemm_ref",
    "GemmConfig",
    "GemmProblem",
    "can_implement",
    "EpilogueSpec",
    "ops",
    "quantize",
    "dequantize",
]
