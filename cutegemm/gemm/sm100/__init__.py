"""gemm/sm100"""
