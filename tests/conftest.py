import os

import pytest

# Every GPU test module declares `pytestmark = gpu_only` (or sm100_only); nothing queries the GPU
# at import time: the check runs when pytest evaluates the marker.
os.environ.setdefault("CUTEGEMM_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".cache", "kernels"))


def _cuda_capability_major():
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability()[0]


def _cuda_device_count():
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config, items):
    major = _cuda_capability_major()
    devices = _cuda_device_count() if any(item.get_closest_marker("multigpu") for item in items) else 0
    for item in items:
        if item.get_closest_marker("gpu") and major not in (9, 10):
            item.add_marker(pytest.mark.skip(reason="needs an sm_90 or sm_100 CUDA GPU"))
        if item.get_closest_marker("sm100") and major != 10:
            item.add_marker(pytest.mark.skip(reason="needs an sm_100 (Blackwell) GPU"))
        if item.get_closest_marker("multigpu") and devices < 2:
            item.add_marker(pytest.mark.skip(reason="needs 2 or more CUDA GPUs (NCCL)"))
