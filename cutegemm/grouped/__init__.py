"""Grouped / MoE GEMM forms over the gemm kernels: packed (offs, the device-side tile map),
K-grouped (offs split K: weight gradients) and list (arbitrary groups). The public entry points are
``cutegemm.grouped_gemm`` / ``grouped_gemm_ref`` (``cutegemm.dense.face``)."""
