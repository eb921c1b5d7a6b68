"""cutegemm: GEMM kernels for NVIDIA Hopper (sm_90a, run-verified on H200) and Blackwell
(sm_100a, compile-verified), written with CuTe DSL.

Public API: ``gemm``, ``gemm_ref``, ``grouped_gemm``, ``grouped_gemm_ref``, ``quantize``,
``dequantize``, ``GemmConfig``, ``GemmProblem``, ``can_implement``, ``EpilogueSpec``;
``cutegemm.nn.GroupedExperts``; torch custom ops (torch.compile, autograd) are registered by
``import cutegemm.ops``: ``torch.ops.cutegemm.gemm`` / ``grouped_gemm`` / ``quantize`` /
``gemm_quantized``.
"""

from .api import dequantize, gemm, gemm_ref, grouped_gemm, grouped_gemm_ref, quantize
from .config import EpilogueSpec, GemmConfig, GemmProblem, can_implement

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
    "quantize",
    "dequantize",
]
