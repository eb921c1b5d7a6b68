"""The kernel disk cache's fingerprint: the modules it leaves out (``HOST_ONLY``: editing them keeps
the cached kernels) exist, and none of them holds device code (a kernel edited in such a module
would be served stale from the cache)."""

import re

from cutegemm.runtime.cache import _PKG_ROOT, HOST_ONLY, source_fingerprint


def test_host_only_modules_exist_and_hold_no_device_code():
    for rel in sorted(HOST_ONLY):
        path = _PKG_ROOT / rel
        assert path.is_file(), f"HOST_ONLY names {rel}, which does not exist"
        text = path.read_text()
        assert not re.search(r"@cute\.(kernel|jit)\b|@cutlass\.(kernel|jit)\b", text), f"{rel} holds device code"


def test_fingerprint_covers_the_kernel_modules():
    kernels = [p.relative_to(_PKG_ROOT).as_posix() for p in _PKG_ROOT.rglob("*.py") if "@cute.kernel" in p.read_text()]
    assert kernels and not set(kernels) & HOST_ONLY
    assert len(source_fingerprint()) == 20
