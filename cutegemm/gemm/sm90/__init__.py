"""gemm/sm90"""
