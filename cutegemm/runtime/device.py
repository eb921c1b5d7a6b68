"""Device facts the host side of every kernel family needs: the arch a kernel is built for and
the SM count (``device_info``), and how many clusters of a config's size a persistent grid can
hold at once (``resident_clusters`` / ``max_clusters_for``). Host only (no kernel source)."""

from __future__ import annotations

import functools

import torch
from cutlass.utils import HardwareInfo

# Compute capability -> the kernel arch that serves it (its compile target: runtime.cache).
# Hopper 9.0 runs sm_90a kernels; every 10.x (B200 / GB200 10.0, B300 / GB300 10.3) runs the
# sm_100 family's kernels (built as sm_100f). Other GPUs (sm_110, sm_120, older) are not served.
CAPABILITY_ARCHS = {(9, 0): "sm_90a"}
FAMILY_ARCHS = {10: "sm_100a"}  # every 10.x: the sm_100 family's kernels


def arch_for_capability(major: int, minor: int) -> str:
    """The kernel arch for a GPU of compute capability ``major.minor`` (ValueError if none)."""
    arch = CAPABILITY_ARCHS.get((major, minor)) or FAMILY_ARCHS.get(major)
    if arch is None:
        raise ValueError(
            f"cutegemm runs on sm_90 (Hopper) and sm_100-family (Blackwell: B200, GB200, B300, GB300) GPUs; "
            f"this GPU is sm_{major}{minor}"
        )
    return arch


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what torch's generated code calls


def current_stream_id(index: int) -> int:
    """The handle of device ``index``'s current CUDA stream, without making a Stream object
    (``torch.cuda.current_stream(index).cuda_stream`` costs about a microsecond more per call)."""
    if _RAW_STREAM is not None:
        return _RAW_STREAM(index)
    return torch.cuda.current_stream(index).cuda_stream


def eager_cuda(t: torch.Tensor) -> bool:
    """Whether ``t`` is a plain CUDA tensor seen outside any tracing: not while Dynamo traces
    (``torch.compiler.is_compiling``), not a tensor subclass but nn.Parameter (AOTAutograd's fake and functional
    tensors trace a compiled backward without Dynamo), not under a torch dispatch mode (make_fx's
    proxy mode). Only then may a Python path launch a kernel on it directly (data pointers and
    all); anything else must go through the opaque custom ops."""
    return (t.is_cuda and type(t) in _PLAIN and not torch.compiler.is_compiling()
            and torch._C._len_torch_dispatch_stack() == 0)  # fmt: skip


_PLAIN = (torch.Tensor, torch.nn.Parameter)  # no __torch_dispatch__ of their own


@functools.cache
def capability(index: int) -> tuple[int, int]:
    """torch.cuda.get_device_capability(index), asked once per device."""
    return torch.cuda.get_device_capability(index)


@functools.cache
def device_info(index: int) -> tuple[str, int]:
    major, minor = capability(index)
    return arch_for_capability(major, minor), torch.cuda.get_device_properties(index).multi_processor_count


_RESIDENT: dict = {}


def resident_clusters(index: int, cluster_size: int, num_sms: int | None = None) -> int:
    """How many clusters of ``cluster_size`` CTAs (one per SM, as a persistent kernel's shared
    memory allows) device ``index`` runs at once: the size of a persistent grid. Not always
    SMs // size: clusters may not span GPCs, and on the H200 (132 SMs) 30 clusters of 4 fit, not
    33 (bench/RESULTS.md). A larger grid leaves the extra clusters waiting for
    others to exit, so a static schedule's tiles for them run after everything else. Queried
    from the driver's occupancy calculator once per (device, size) and kept, a failed query's
    answer too (SMs // size: an older driver must not retry the query's compile on every call);
    during a CUDA-graph capture SMs // size without asking or keeping it. ``num_sms``: the
    device's SM count when the caller has it (``device_info``)."""
    if num_sms is None:
        num_sms = torch.cuda.get_device_properties(index).multi_processor_count
    if cluster_size <= 1:
        return num_sms
    bound = max(1, num_sms // cluster_size)
    key = (index, cluster_size)
    if key not in _RESIDENT:
        try:
            if torch.cuda.is_current_stream_capturing():
                return bound  # the query loads a module: not while a graph is being captured

            with torch.cuda.device(index):
                torch.empty(1, device=torch.device("cuda", index))  # the driver query needs the context
                _RESIDENT[key] = HardwareInfo(device_id=index).get_max_active_clusters(cluster_size)
        except Exception:  # a performance question only: the arithmetic bound, kept
            _RESIDENT[key] = bound
    return max(1, min(_RESIDENT[key], bound))


def max_clusters_for(cfg, device, num_sms: int | None = None) -> int:
    """The persistent grid's cluster count for ``cfg`` on ``device`` (a torch.device or index;
    ``num_sms`` as the caller's ``device_info`` gave it, if it has it)."""
    index = device if isinstance(device, int) else device.index
    index = torch.cuda.current_device() if index is None else index
    return resident_clusters(index, cfg.cluster_m * cfg.cluster_n, num_sms)
