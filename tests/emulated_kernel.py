"""A CPU stand-in for the compiled GEMM kernels that computes what they compute, from the views
and arguments the host path hands them (``cutegemm.gemm.args.KernelArgs``).

With :func:`emulated_kernels` every public call on CPU tensors runs its whole host path (checks,
routing, staging copies, kernel views, scratch outputs, the copies back) and the "kernel" does
the math in fp32: the packed grouped form (and its swap-AB variant) per expert from offs, the
K-grouped form per K slice, the dense (batched or flat) GEMM; FP8 block scales (grouped form); the
epilogue of alpha, FP8 row / column scales and block scales, beta * C, bias and (gated)
activations; FP8 outputs saturated. What it does not model (quantized and user epilogues) raises NotImplementedError. So a
CPU test can check that a layout torch accepts reaches the kernel as views of the right values,
and that the result lands in the right elements of ``out`` (and nowhere else), without a GPU. Kernel numerics are the GPU tests'.
"""

from __future__ import annotations

import contextlib

import torch

from cutegemm.epilogue import epilogue_ref
from cutegemm.gemm.args import KernelArgs
from cutegemm.gemm.fp8_scales import TORCH_FP8, fp8_saturated
from cutegemm.gemm.sm100.gather import INDEX_PAD
from cutegemm.schedulers.grouped import expert_rows

from .host_overhead_cpu import cpu_fast_path


class EmulatedKernel:
    """The compiled kernel of one config, in torch on the CPU (see the module docstring)."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1
        k = KernelArgs(*args)
        cfg, epi = self.cfg, self.cfg.epilogue
        blockwise = k.sfa is not None or k.sfb is not None
        if epi.quant or epi.user is not None:
            raise NotImplementedError(f"the emulated kernel does not model {cfg.name}")
        f32 = torch.float32
        alpha = float(k.alpha)
        bias = None if k.bias is None else k.bias.to(f32)
        act = epi.gated or epi.activation

        def finish(acc, cols_bias, sa, sb, c=None, activation=act):
            """The epilogue of acc (rows, N): row scales sa, column scales sb, bias cols_bias,
            beta * c (dense), the activation (None: the values before it, epilogue.preact)."""
            if sa is not None:
                acc = acc * sa.to(f32).reshape(-1, 1)
            if sb is not None:
                acc = acc * sb.to(f32).reshape(1, -1)
            beta = float(k.beta) if epi.beta else 0.0
            return epilogue_ref(acc, alpha=alpha, beta=beta, c=c, bias=cols_bias, activation=activation)

        def vec(v, lo, hi):
            """Rows lo:hi of a per-row vector, or its one per-tensor value."""
            if v is None:
                return None
            return v[:1].expand(hi - lo) if v.numel() == 1 else v[lo:hi]

        if cfg.flat:  # the caller's 2-D tensors: a (M, K), b (K, N), out (M, N)
            a3, b3, o3 = k.a.unsqueeze(-1), k.b.t().unsqueeze(-1), k.out.unsqueeze(-1)
        else:
            a3, b3, o3 = k.a, k.b, k.out
        if (cfg.kgrouped or cfg.grouped and not cfg.swap_ab) and o3.shape[0] > 1 and o3.shape[1] > 1:
            # C's unit-stride mode is the config's (c_major)
            assert (o3.stride(0) == 1) == (cfg.c_major == "m") and (o3.stride(1) == 1) == (cfg.c_major == "n")
        if cfg.kgrouped:  # A (M, K, 1), B (N, K, 1), C (M, N, E); offs split K
            if cfg.gathers:  # K position p reads token a_index[p] of A (gather_a) or B (gather_b), clamped
                idx = k.a_index.long()
                if cfg.gather_a:
                    a3 = a3[:, idx.clamp(0, a3.shape[1] - 1)]
                else:
                    b3 = b3[:, idx.clamp(0, b3.shape[1] - 1)]
            total_k = a3.shape[1]
            for e, (s, t) in enumerate(expert_rows(k.offs.tolist(), total_k)):
                acc = a3[:, s:t, 0].to(f32) @ b3[:, s:t, 0].to(f32).t()
                o3[:, :, e] = finish(acc, None, None, None).to(o3.dtype)
            return
        if cfg.grouped:
            swap = cfg.swap_ab  # A = weights (N, K, E), B = tokens (total_M, K, 1), C = (N, total_M, 1)
            tokens, weights = (b3, a3) if swap else (a3, b3)
            if k.a_index is not None:  # config.gather_a: packed row r reads row a_index[r] of A
                assert cfg.gather_a
                idx = k.a_index.long()
                rows = tokens[idx.clamp(0, tokens.shape[0] - 1)]  # sm_90a: clamped into A
                if cfg.arch == "sm_100a":  # TMA gather4: zeros out of A's bounds; reads INDEX_PAD past the index
                    pad = k.a_index.storage_offset() + k.a_index.shape[0] + INDEX_PAD
                    assert k.a_index.untyped_storage().nbytes() >= 4 * pad, "the index has no padding"
                    after = torch.empty(0, dtype=torch.int32).set_(k.a_index.untyped_storage())[pad - INDEX_PAD : pad]
                    assert not after.any(), "the index's padding is not zeros"
                    rows = torch.where(((idx >= 0) & (idx < tokens.shape[0]))[:, None, None], rows, 0)
                tokens = rows
            total_m, n = tokens.shape[0], weights.shape[0]
            for e, (s, t) in enumerate(expert_rows(k.offs.tolist(), total_m)):
                if t <= s:
                    continue
                if blockwise:  # FP8 block scales: sfa (total_M, KB) per row, sfb (NB, KB, E) per 128x128 block
                    acc = _block_scaled(tokens[s:t, :, 0], weights[:, :, e], k.sfa[s:t], k.sfb[:, :, e])
                else:
                    acc = tokens[s:t, :, 0].to(f32) @ weights[:, :, e].to(f32).t()
                sb = None if k.v1 is None else (k.v1[:1] if k.v1.numel() == 1 else k.v1[e * n:(e + 1) * n])
                be = None if bias is None else bias[e * n:(e + 1) * n]
                y = finish(acc, be, vec(k.v0, s, t), sb).to(o3.dtype)
                if epi.preact:  # the values before the gate (all GEMM columns), beside the gated output
                    assert k.preact is not None and not swap
                    k.preact[s:t, :, 0] = finish(acc, be, vec(k.v0, s, t), sb, activation=None).to(k.preact.dtype)
                if swap:
                    o3[:, s:t, 0] = y.t()
                else:
                    o3[s:t, :, 0] = y
            return
        # dense: A (M, K, L), B (N, K, L), C (M, N, L)
        c3 = None if k.c is None else (k.c.unsqueeze(-1) if k.c.dim() == 2 else k.c)
        for l in range(o3.shape[2]):
            if blockwise:  # FP8 block scales (2-D): sfa (M, KB), sfb (NB, KB)
                assert o3.shape[2] == 1
                acc = _block_scaled(a3[:, :, 0], b3[:, :, 0], k.sfa, k.sfb)
            else:
                acc = a3[:, :, l].to(f32) @ b3[:, :, l].to(f32).t()
            c = None if c3 is None else c3[:, :, l].to(f32)
            y = finish(acc, bias, vec(k.v0, 0, acc.shape[0]), k.v1, c)
            o3[:, :, l] = fp8_saturated(y, o3.dtype) if o3.dtype in TORCH_FP8 else y.to(o3.dtype)


def _block_scaled(a, w, sfa, sfb, block=128):
    """sum over 128-wide K blocks j of (a[:, j] @ w[:, j]^T) * sfa[:, j] * sfb[N block, j] (fp32)."""
    acc = torch.zeros(a.shape[0], w.shape[0], dtype=torch.float32, device=a.device)
    for j in range(-(-a.shape[1] // block)):
        cols = slice(j * block, (j + 1) * block)
        part = a[:, cols].float() @ w[:, cols].float().t()
        acc += part * sfa[:, j : j + 1].float() * sfb[:, j].float().repeat_interleave(block)[: w.shape[0]]
    return acc


class _ConfigCache:
    """A kernel cache whose ``get(config)`` builds an :class:`EmulatedKernel`; ``kernels`` lists them."""

    def __init__(self):
        self.kernels = []

    def get(self, cfg):
        kernel = EmulatedKernel(cfg)
        self.kernels.append(kernel)
        return kernel


@contextlib.contextmanager
def emulated_kernels():
    """CPU tensors through every host path of gemm / grouped_gemm (the CUDA-only pieces replaced as
    in ``tests.host_overhead_cpu.cpu_fast_path``), the compiled kernels replaced by
    :class:`EmulatedKernel`; yields the cache (its ``kernels``: one per plan built)."""
    import cutegemm.grouped.k_grouped as k_grouped
    from cutegemm.gemm import dense
    from cutegemm.grouped import gather, packed

    cache = _ConfigCache()
    with cpu_fast_path():
        saved = [(mod, name, getattr(mod, name))
                 for mod, name in ((dense, "DENSE_CACHE"), (packed, "GROUPED_CACHE"), (k_grouped, "DENSE_CACHE"),
                                   (gather, "GROUPED_CACHE"))]  # fmt: skip
        dense.DENSE_CACHE = packed.GROUPED_CACHE = k_grouped.DENSE_CACHE = gather.GROUPED_CACHE = cache
        try:
            yield cache
        finally:
            for mod, name, value in reversed(saved):
                setattr(mod, name, value)


__all__ = ["EmulatedKernel", "emulated_kernels"]
