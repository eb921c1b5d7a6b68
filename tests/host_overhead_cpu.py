"""Host cost of the warm (cached-plan) fast paths of ``gemm`` / ``grouped_gemm`` on the CPU (bf16
and FP8 operands, every grouped form, low-precision weights) and of ``quantize``.

No GPU: the slow path runs on CPU tensors with the CUDA-only pieces replaced (operand device
check, device query, kernel compile -> a no-op Python callable), so a second call with the same
signature takes the real fast path (key, plan lookup, checks, kernel views, output allocation,
argument assembly) and only the TVM-FFI call itself is missing. Used by
tests/test_fast_path_cpu.py and, for numbers::

    python -m tests.host_overhead_cpu [calls]      # from the repository root
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

import torch


class NoOpKernel:
    """Stands in for a compiled kernel: counts calls and keeps the last arguments."""

    def __init__(self):
        self.calls = 0
        self.args = None

    def __call__(self, *args):
        self.calls += 1
        self.args = args


class _FakeCache:
    def __init__(self, kernel):
        self.kernel = kernel

    def get(self, cfg):
        return self.kernel


def _check_operand_cpu(name, t, dims=(2, 3), written=False):
    from cutegemm.gemm.launch import check_tensor

    check_tensor(name, t, dims, written)  # check_operand but the device


def _is_initialized():
    return _INITIALIZED and not torch.cuda._is_in_bad_fork()


def _lazy_init():
    if _is_initialized() or hasattr(_TLS, "is_initializing"):
        return


def _emulated_current_device():
    """torch.cuda.current_device() of an initialized process (its Python steps), returning None."""
    _lazy_init()
    return type(None)()


_INITIALIZED = True
_TLS = threading.local()


@contextlib.contextmanager
def cpu_fast_path(kernel: NoOpKernel | None = None):
    """Patches the dense and grouped APIs so that CPU tensors run every host step with ``kernel``
    (a fresh :class:`NoOpKernel` by default) as the compiled kernel; yields the kernel. Plans made
    inside are dropped on exit."""
    from cutegemm.gemm import dense
    from cutegemm.grouped import batched, gather, k_grouped
    from cutegemm.grouped import packed as grouped

    kernel = kernel or NoOpKernel()
    saved = []

    def patch(mod, name, value):
        if hasattr(mod, name) or name.startswith("_"):
            saved.append((mod, name, getattr(mod, name, None), hasattr(mod, name)))
            setattr(mod, name, value)

    fake_cache = _FakeCache(kernel)
    patch(dense, "check_operand", _check_operand_cpu)
    patch(grouped, "check_operand", _check_operand_cpu)
    patch(dense, "device_info", lambda index: ("sm_90a", 132))
    patch(grouped, "device_info", lambda index: ("sm_90a", 132))
    patch(batched, "device_info", lambda index: ("sm_90a", 132))  # the 3d x 2d form's M-major store
    patch(dense, "DENSE_CACHE", fake_cache)
    patch(grouped, "GROUPED_CACHE", fake_cache)
    patch(k_grouped, "check_operand", _check_operand_cpu)  # the K-grouped kernel's host path
    patch(k_grouped, "device_info", lambda index: ("sm_90a", 132))
    patch(k_grouped, "DENSE_CACHE", fake_cache)
    patch(k_grouped, "_KG_PLANS", {})
    patch(k_grouped, "_KG_GATHER", {})  # the gathering K-grouped route
    patch(k_grouped, "on_cuda", lambda t: True)
    patch(gather, "on_cuda", lambda t: True)  # the gathered-row kernel route
    patch(gather, "device_info", lambda index: ("sm_90a", 132))
    patch(gather, "max_clusters_for", lambda cfg, device, num_sms=None: num_sms or 132)
    patch(gather, "GROUPED_CACHE", fake_cache)
    patch(gather, "PLANS", {})
    patch(gather, "current_device", type(None))
    # The "current CUDA device" is None, the index of a CPU tensor's device, with the real cost:
    # NoneType() is a C call returning None like torch._C._cuda_getDevice, and
    # torch.cuda.current_device keeps its Python lazy-init checks.
    if hasattr(dense, "current_device"):
        patch(dense, "current_device", type(None))
    if hasattr(grouped, "current_device"):
        patch(grouped, "current_device", type(None))
    old_cur = torch.cuda.current_device
    torch.cuda.current_device = _emulated_current_device
    dense.PLANS.clear()
    getattr(dense, "PLAIN_PLANS", {}).clear()
    grouped.PLANS.clear()
    try:
        yield kernel
    finally:
        torch.cuda.current_device = old_cur
        for mod, name, value, existed in reversed(saved):
            if existed:
                setattr(mod, name, value)
            else:
                delattr(mod, name)
        dense.PLANS.clear()
        getattr(dense, "PLAIN_PLANS", {}).clear()
        grouped.PLANS.clear()


@contextlib.contextmanager
def cpu_list_path(kernel: NoOpKernel | None = None):
    """Patches the list form (``grouped_gemm([a...], [b...])``) so that CPU tensors run its host
    steps (plan, table, views) with ``kernel`` (a fresh :class:`NoOpKernel` by default) as the
    compiled kernel: the tensors claim CUDA device 0 and the table's device copy stays on the
    CPU. Yields the kernel; plans made inside are dropped on exit."""
    from cutegemm.grouped import list_form

    kernel = kernel or NoOpKernel()
    on_cuda = dict(is_cuda=property(lambda t: True), get_device=lambda t: 0)
    cuda = dict(is_current_stream_capturing=lambda: False, current_device=lambda: 0)
    values = dict(device_info=lambda index: ("sm_90a", 132), DENSE_CACHE=_FakeCache(kernel), PLANS={})
    with _patched(torch.Tensor, on_cuda, _nothing), _patched(torch.cuda, cuda, _nothing), \
            _patched(list_form, values, _nothing):  # fmt: skip
        yield kernel


def _nothing():
    pass


def tensor_meta(t):
    """What a kernel argument tensor is: (shape, strides, data pointer, dtype); None stays None."""
    return None if t is None else (tuple(t.shape), t.stride(), t.data_ptr(), t.dtype)


def counting_calls(monkeypatch, module, name: str) -> list:
    """Replaces ``module.name`` (for the test, through pytest's monkeypatch) by a wrapper that
    appends to the returned list on every call, then calls the original."""
    calls = []
    real = getattr(module, name)

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls


def kernel_args(kernel: NoOpKernel) -> list:
    """The no-op kernel's last arguments with every tensor as its :func:`tensor_meta`."""
    return [tensor_meta(a) if isinstance(a, torch.Tensor) else a for a in kernel.args]


class _Stream:
    cuda_stream = 0


@contextlib.contextmanager
def cpu_weight_path(kernel: NoOpKernel | None = None):
    """As :func:`cpu_fast_path`, for the low-precision-weight GEMM
    (``cutegemm.blockscaled.weight_only.launch``): CPU tensors, an sm_90a device with 132 SMs,
    ``kernel`` as every compiled kernel. Its plans are dropped on exit."""
    from cutegemm.blockscaled.weight_only import launch
    from cutegemm.gemm import launch as split_launch  # the split-K buffers: keyed by (device, stream_of)

    kernel = kernel or NoOpKernel()
    names = ("kernel_cache", "weight_arch", "_sm_count", "check_devices", "current_device", "stream_of")
    saved = {name: getattr(launch, name) for name in names}
    saved_stream_of = split_launch.stream_of
    cache = _FakeCache(kernel)
    launch.kernel_cache = lambda: cache
    launch.weight_arch = lambda index: "sm_90a"
    launch._sm_count = lambda index: 132
    launch.check_devices = lambda x, qw, offs: None
    launch.current_device = type(None)  # a CPU tensor's device index
    launch.stream_of = split_launch.stream_of = lambda device: _Stream.cuda_stream
    old_stream, old_cur = torch.cuda.current_stream, torch.cuda.current_device
    torch.cuda.current_stream = lambda index=None: _Stream
    torch.cuda.current_device = _emulated_current_device
    launch._PLANS.clear()
    try:
        yield kernel
    finally:
        torch.cuda.current_stream, torch.cuda.current_device = old_stream, old_cur
        for name, value in saved.items():
            setattr(launch, name, value)
        split_launch.stream_of = saved_stream_of
        launch._PLANS.clear()


def _check_x_cpu(x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"x: expected dtype float32, bfloat16 or float16, got {x.dtype}")
    if x.dim() not in (2, 3) or x.numel() == 0:
        raise ValueError(f"x: expected a non-empty (rows, K) or (L, rows, K) tensor, got {tuple(x.shape)}")


@contextlib.contextmanager
def cpu_quantize_path(kernel: NoOpKernel | None = None):
    """As :func:`cpu_fast_path`, for ``quantize`` (``cutegemm.blockscaled.quantize_launch``): CPU
    tensors (the CUDA check replaced by the same checks without it), an sm_90a device, ``kernel``
    as every compiled quantize / amax kernel. Its plans are dropped on entry and exit."""
    from cutegemm.blockscaled import quantize_launch as ql

    kernel = kernel or NoOpKernel()
    cache = _FakeCache(kernel)
    plans = getattr(ql, "_PLANS", {})

    def clear():
        ql._plan.cache_clear()
        plans.clear()

    with _patched(ql, dict(_check_x=_check_x_cpu, arch_of=lambda index: "sm_90a", kernel_cache=lambda: cache), clear):
        yield kernel


@contextlib.contextmanager
def _patched(module, values: dict, clear):
    """``module``'s (or a class's) attributes set to ``values`` inside, restored after (an inherited
    one deleted again), ``clear()`` on entry and exit."""
    saved = {name: vars(module).get(name, _INHERITED) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    clear()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is _INHERITED:
                delattr(module, name)
            else:
                setattr(module, name, value)
        clear()


_INHERITED = object()


def _check_dequant_operand_cpu(q, what: str = "q") -> None:
    """dequant.check_dequant_operand without its CUDA rule."""
    from cutegemm.blockscaled import dequant

    dequant.check_elements(q, what)
    d = q.data
    if not d.is_contiguous() or d.data_ptr() % 16:
        raise ValueError(f"{what}: the elements must be contiguous and 16-byte aligned")
    if q.shape[-1] % dequant.CHUNK:
        raise ValueError(f"{what}: K must be a multiple of {dequant.CHUNK}, got {q.shape[-1]}")
    if q.shape.numel() > dequant.MAX_ELEMENTS:
        raise ValueError(f"{what}: at most {dequant.MAX_ELEMENTS} elements per call, got {q.shape.numel()}")


@contextlib.contextmanager
def cpu_dequant_path(kernel: NoOpKernel | None = None):
    """As :func:`cpu_fast_path`, for ``dequantize`` (``cutegemm.blockscaled.dequant``): CPU
    elements the kernel takes (its rules but the CUDA one), an sm_90a device, ``kernel`` as every
    compiled dequantize kernel. Its plans are dropped on entry and exit."""
    from cutegemm.blockscaled import dequant

    kernel = kernel or NoOpKernel()
    cache = _FakeCache(kernel)

    def clear():
        dequant._launch_plan.cache_clear()
        dequant._WARM.clear()

    values = dict(check_dequant_operand=_check_dequant_operand_cpu, kernel_takes=dequant.dequantizable,
                  arch_of=lambda index: "sm_90a", _cache=lambda: cache)  # fmt: skip
    with _patched(dequant, values, clear):
        yield kernel


@contextlib.contextmanager
def cpu_blockscaled_path(kernel: NoOpKernel | None = None):
    """As :func:`cpu_fast_path`, for the block-scaled GEMM of two BlockScaledTensors on sm_90a
    (``cutegemm.blockscaled.gemm`` -> ``mx_sm90``): CPU operands (the CUDA rule of its checks
    left out), an sm_90a device, ``kernel`` as every compiled kernel of the routes below it (the
    dequantize kernel of :func:`cpu_dequant_path`, the weight GEMM of :func:`cpu_weight_path`)."""
    from cutegemm.blockscaled import gemm as bgemm
    from cutegemm.blockscaled import mx_sm90

    kernel = kernel or NoOpKernel()
    values = dict(_check=lambda qa, qb, out_dtype: bgemm.check_operands(qa, qb, out_dtype),
                  capability=lambda index: (9, 0))  # fmt: skip
    with cpu_dequant_path(kernel), cpu_weight_path(kernel), _patched(bgemm, values, mx_sm90._RING.clear):
        yield kernel


@contextlib.contextmanager
def cuda_functions_on_cpu(*names: str):
    """Points the no-gradient path of each ``torch.ops.cutegemm`` op in ``names`` (CPU tensors)
    at the op's CUDA function (``cutegemm.ops.NO_GRAD_FUNCTIONS``) instead of its CPU body, so
    that, inside the context managers above, ``torch.ops.cutegemm.<name>`` runs the host work
    of a CUDA call: dispatcher, our Autograd kernel, the CUDA function and the warm path below it.
    Yields False (and changes nothing) where torch lacks the private names that path needs."""
    from cutegemm import ops

    fns = ops.NO_GRAD_FUNCTIONS
    saved = {name: fns[name][0] for name in names if name in fns}
    for name in saved:
        fns[name][0] = fns[name][1]
    try:
        yield len(saved) == len(names)
    finally:
        for name, cpu_fn in saved.items():
            fns[name][0] = cpu_fn


def _time(fn, calls: int, rounds: int = 25) -> float:
    """µs per call: the fastest of ``rounds`` rounds of ``calls / rounds`` calls (CPU time), so
    that other processes on the machine disturb it little."""
    for _ in range(50):
        fn()
    per = max(calls // rounds, 100)
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(per):
            fn()
        best = min(best, (time.process_time() - t0) / per * 1e6)
    return best


def measure(calls: int = 20000) -> dict:
    """µs per warm call (best of 25 rounds of ``calls / 25``) of the fast paths with a no-op kernel,
    beside torch.empty of the output (the allocation every path pays) for scale."""
    import cutegemm
    from cutegemm import ops

    bf = torch.bfloat16
    a, b = torch.randn(128, 128, dtype=bf), torch.randn(128, 128, dtype=bf)
    bias = torch.randn(128, dtype=bf)
    x = torch.randn(256, 128, dtype=bf)
    w = torch.randn(4, 128, 128, dtype=bf).transpose(1, 2)
    offs = torch.tensor([64, 128, 192, 256], dtype=torch.int32)
    res = {}
    with cpu_fast_path() as k:
        res["gemm(a, b)"] = _time(lambda: cutegemm.gemm(a, b), calls)
        res["gemm(a, b, bias, alpha, act)"] = _time(
            lambda: cutegemm.gemm(a, b, bias=bias, alpha=0.5, activation="silu"), calls
        )
        res["grouped_gemm(x, w, offs)"] = _time(lambda: cutegemm.grouped_gemm(x, w, offs=offs), calls)
        assert k.calls > 3 * calls
        # the other grouped forms and FP8 row-wise (their warm paths)
        xt, dy = torch.randn(256, 128, dtype=bf).t(), torch.randn(256, 128, dtype=bf)
        a3, b3, b2 = torch.randn(4, 64, 128, dtype=bf), w, torch.randn(512, 128, dtype=bf).t()
        noffs = torch.tensor([128, 256, 384, 512], dtype=torch.int32)
        res["grouped_gemm 2d x 2d (K-grouped)"] = _time(lambda: cutegemm.grouped_gemm(xt, dy, offs=offs), calls)
        res["grouped_gemm 3d x 3d"] = _time(lambda: cutegemm.grouped_gemm(a3, b3), calls)
        res["grouped_gemm 3d x 2d"] = _time(lambda: cutegemm.grouped_gemm(a3, b2, offs=noffs), calls)
        gidx = torch.arange(256, dtype=torch.int32) % 128
        res["grouped_gemm(x, w, offs, gather_index)"] = _time(
            lambda: cutegemm.grouped_gemm(x, w, offs=offs, gather_index=gidx), calls
        )
        e4m3 = torch.float8_e4m3fn
        a8, b8, x8, w8 = a.to(e4m3), b.t().contiguous().t().to(e4m3), x.to(e4m3), w.to(e4m3)
        sa, sb, gsa, gsb = torch.rand(128, 1), torch.rand(1, 128), torch.rand(256), torch.rand(4, 128)
        res["gemm FP8 row-wise"] = _time(lambda: cutegemm.gemm(a8, b8, scale_a=sa, scale_b=sb), calls)
        res["grouped_gemm FP8 row-wise"] = _time(
            lambda: cutegemm.grouped_gemm(x8, w8, offs=offs, scale_a=gsa, scale_b=gsb), calls
        )
        # DeepSeek block scales in torch's layouts: scale_a (M, K/128) M-major, the weights'
        # (N/128, K/128) scales as (K/128, N/128) views
        a8k, b8k = torch.randn(128, 256).to(e4m3), torch.randn(256, 256).to(e4m3).t()
        x8k, w8k = torch.randn(256, 256).to(e4m3), torch.randn(4, 256, 256).to(e4m3).transpose(1, 2)
        bsa, bsb = torch.rand(2, 128).t(), torch.rand(2, 2).t()
        gbsa, gbsb = torch.rand(2, 256).t(), torch.rand(4, 2, 2).transpose(1, 2)
        res["gemm FP8 block scales"] = _time(lambda: cutegemm.gemm(a8k, b8k, scale_a=bsa, scale_b=bsb), calls)
        res["grouped_gemm FP8 block scales"] = _time(
            lambda: cutegemm.grouped_gemm(x8k, w8k, offs=offs, scale_a=gbsa, scale_b=gbsb), calls
        )
    xs, ws = [torch.randn(64, 128, dtype=bf) for _ in range(4)], [torch.randn(128, 128, dtype=bf) for _ in range(4)]
    with cpu_list_path() as k:
        res["grouped_gemm list (4 groups)"] = _time(lambda: cutegemm.grouped_gemm(xs, ws), calls)
        assert k.calls >= calls
    from cutegemm.blockscaled import quantize_ref

    x16 = torch.randn(16, 512, dtype=bf)
    xg = torch.randn(64, 512, dtype=bf)
    with cpu_weight_path() as k:
        for fmt in ("nvfp4", "mxfp4", "mxfp8"):
            qw = quantize_ref(torch.randn(1024, 512), fmt)
            qe = quantize_ref(torch.randn(4, 1024, 512), fmt)
            res[f"gemm(x, {fmt} w)"] = _time(lambda qw=qw: cutegemm.gemm(x16, qw), calls)
            res[f"grouped_gemm(x, {fmt} w, offs)"] = _time(
                lambda qe=qe: cutegemm.grouped_gemm(xg, qe, offs=offs), calls
            )
        # decode: one token, a weight of at least as many 128-row tiles as SMs (no split grid)
        x1, qbig = torch.randn(1, 512, dtype=bf), quantize_ref(torch.randn(16896, 512), "nvfp4")
        res["gemm(x 1x512, nvfp4 w 16896x512)"] = _time(lambda: cutegemm.gemm(x1, qbig), calls)
        res["gemm(x, nvfp4 w, out_dtype, alpha)"] = _time(
            lambda: cutegemm.gemm(x16, qbig, out_dtype=torch.float16, alpha=0.5), calls
        )
        assert k.calls > 8 * calls
    xq, xs = torch.randn(128, 1024, dtype=bf), torch.randn(16, 1024, dtype=bf)
    with cpu_quantize_path() as k:
        res["quantize(x 128x1024, mxfp8)"] = _time(lambda: cutegemm.quantize(xq, "mxfp8"), calls)
        res["quantize(x 16x1024, mxfp8)"] = _time(lambda: cutegemm.quantize(xs, "mxfp8"), calls)
        res["quantize(x 128x1024, nvfp4, gs)"] = _time(lambda: cutegemm.quantize(xq, "nvfp4", global_scale=0.5), calls)
        assert k.calls > 3 * calls
    qd = quantize_ref(torch.randn(128, 1024), "mxfp8")
    with cpu_dequant_path() as k:
        res["dequantize(q 128x1024 mxfp8, bf16)"] = _time(lambda: cutegemm.dequantize(qd, bf), calls)
        res["dequantize(q 128x1024 mxfp8, fp32)"] = _time(lambda: cutegemm.dequantize(qd), calls)
        assert k.calls > 2 * calls
    qa, qb = quantize_ref(torch.randn(16, 512), "mxfp8"), quantize_ref(torch.randn(1024, 512), "mxfp8")
    with cpu_blockscaled_path() as k:
        res["gemm(mxfp8 qa 16x512, mxfp8 qb) sm_90a"] = _time(lambda: cutegemm.gemm(qa, qb), calls)
        res["gemm(mxfp8 qa, qb, out_dtype fp32) sm_90a"] = _time(
            lambda: cutegemm.gemm(qa, qb, out_dtype=torch.float32), calls
        )
        assert k.calls > 2 * calls  # two launches per call: A's dequantize, the weight GEMM
    # torch.ops.cutegemm (no gradient needed) over the CUDA functions, with the warm paths above
    op = torch.ops.cutegemm
    with cpu_fast_path(), cuda_functions_on_cpu("gemm", "grouped_gemm") as routed:
        if routed:
            res["torch.ops.cutegemm.gemm(a, b)"] = _time(lambda: op.gemm(a, b), calls)
            res["ops.gemm(a, b, bias, alpha, act)"] = _time(
                lambda: op.gemm(a, b, bias, alpha=0.5, activation="silu"), calls
            )
            res["ops.grouped_gemm(x, w, offs)"] = _time(lambda: op.grouped_gemm(x, w, offs), calls)
    with cpu_quantize_path(), cuda_functions_on_cpu("quantize") as routed:
        if routed:
            res["ops.quantize(x 128x1024, mxfp8)"] = _time(lambda: ops.quantize(xq, "mxfp8"), calls)
    res["torch.empty(128, 128)"] = _time(lambda: torch.empty(128, 128, dtype=bf), calls)
    # torch.ops.cutegemm (no gradient needed): the dispatcher's and the op's Python layers over the
    # registered function, on 1x1 CPU operands (the CPU twin's work is small beside them)
    a1, b1, w1, o1 = torch.randn(1, 1), torch.randn(1, 1), torch.randn(1, 1, 1), torch.ones(1, dtype=torch.int32)
    res["ops.gemm over body, 1x1"] = _time(lambda: torch.ops.cutegemm.gemm(a1, b1), calls) - _time(
        lambda: ops.gemm._init_fn(a1, b1), calls
    )
    res["ops.grouped_gemm over body, 1x1"] = _time(
        lambda: torch.ops.cutegemm.grouped_gemm(a1, w1, o1), calls
    ) - _time(lambda: ops.grouped_gemm._init_fn(a1, w1, o1), calls)
    return res


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    for name, us in measure(n).items():
        print(f"{name:32s} {us:6.2f} µs")
