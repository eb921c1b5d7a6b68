"""Compile once per config; keep compiled kernels in memory and on disk.

Disk cache: ``$CUTEGEMM_CACHE_DIR`` (default ``~/.cache/cutegemm``) / <fingerprint> / <config hash>.o
where the fingerprint hashes every source file of the package plus the DSL and TVM-FFI versions,
so a code change never loads a stale kernel. Objects are exported through TVM-FFI
(``export_to_c``) and reloaded with ``cute.runtime.load_module`` (~ms instead of seconds of JIT).
Writes go to a temp file and are renamed into place, so a killed process never leaves a broken
object behind; an object that fails to load is deleted and recompiled.
"""

from __future__ import annotations

import functools
import hashlib
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import cutlass
import cutlass.cute as cute
import tvm_ffi

EXPORT_NAME = "cutegemm_kernel"
_PKG_ROOT = Path(__file__).resolve().parent.parent


# Host-only modules: they pick, validate and launch kernels but never change generated code, so
# editing them keeps the disk cache (build_dense / build_grouped in the two api modules only
# construct the kernel object from the config).
HOST_ONLY = frozenset({
    "__init__.py", "__main__.py", "compile_check.py", "nn.py", "ops.py", "parallel.py", "quant_ops.py",
    "tuning.py", "policy.py", "small_m.py", "variants.py", "moe.py", "api/__init__.py", "api/face.py",
    "gemm/dense.py", "grouped/packed.py", "grouped/__init__.py", "grouped/k_grouped.py", "grouped/list_form.py",
    "grouped/batched.py", "grouped/gather.py",
    "blockscaled/reference.py", "blockscaled/__init__.py", "blockscaled/weight_only/launch.py",
    "blockscaled/quantize_launch.py", "blockscaled/fp8_blocks.py", "blockscaled/mx_sm90.py",
    "epilogue/reference.py", "runtime/sass.py", "runtime/device.py",
    "integrations/__init__.py", "integrations/transformers.py",
}) | {f"bench/{name}" for name in ("__init__.py", "core.py", "host.py", "layers.py", "moe.py", "quantize.py",
                                   "scaled.py", "tune.py")}  # fmt: skip


@functools.cache
def source_fingerprint() -> str:
    """Hash of every source file that shapes generated code (all but HOST_ONLY) + DSL versions."""
    h = hashlib.sha256()
    for path in sorted(_PKG_ROOT.rglob("*.py")):
        rel = path.relative_to(_PKG_ROOT).as_posix()
        if rel in HOST_ONLY:
            continue
        h.update(rel.encode())
        h.update(path.read_bytes())

    h.update(f"cutlass-dsl={cutlass.__version__};tvm_ffi={tvm_ffi.__version__}".encode())
    return h.hexdigest()[:20]


def cache_dir() -> Path:
    root = os.environ.get("CUTEGEMM_CACHE_DIR") or Path.home() / ".cache" / "cutegemm"
    return Path(root) / source_fingerprint()


# The compile target of each kernel arch. Blackwell kernels are built for the sm_100 family
# (``sm_100f``: tcgen05, TMEM, 2-CTA MMA, CLC and the block-scaled MMA are family features), so
# one cubin loads on every compute capability 10.x (B200 / GB200 10.0, B300 / GB300 10.3);
# an ``sm_100a`` cubin loads on 10.0 only.
COMPILE_TARGETS = {"sm_90a": "sm_90a", "sm_100a": "sm_100f"}


def compile_options(arch: str) -> str:
    return f"--gpu-arch {COMPILE_TARGETS[arch]} --enable-tvm-ffi"


class KernelCache:
    """Maps a frozen config to a callable compiled kernel. ``build(config)`` returns
    ``(kernel_object, fake_args)`` for ``cute.compile``."""

    def __init__(self, build: Callable, use_disk: bool = True):
        self._build = build
        self._mem: dict = {}
        self.use_disk = use_disk and os.environ.get("CUTEGEMM_DISABLE_DISK_CACHE") != "1"
        self.stats = {"memory": 0, "disk": 0, "compiled": 0}

    def __contains__(self, config) -> bool:
        return config in self._mem

    def get(self, config):
        fn = self._mem.get(config)
        if fn is not None:
            self.stats["memory"] += 1
            return fn
        fn = self._load_or_compile(config)
        self._mem[config] = fn
        return fn

    def compile(self, config):
        """Compile without touching any cache (compile-check, tests)."""
        kernel, args = self._build(config)
        return cute.compile(kernel, *args, options=compile_options(config.arch))

    def _path(self, config) -> Path:
        key = hashlib.sha256(repr(config).encode()).hexdigest()[:24]
        return cache_dir() / f"{key}.o"

    def _load_or_compile(self, config):
        if self.use_disk:
            path = self._path(config)
            if path.exists():
                try:
                    fn = cute.runtime.load_module(str(path), enable_tvm_ffi=True)[EXPORT_NAME]
                    self.stats["disk"] += 1
                    return fn
                except Exception as exc:  # a truncated/corrupt object is a miss, not an error
                    warnings.warn(f"cutegemm: dropping unreadable cached kernel {path}: {exc}", stacklevel=3)
                    path.unlink(missing_ok=True)
        fn = self.compile(config)
        self.stats["compiled"] += 1
        log = os.environ.get("CUTEGEMM_COMPILE_LOG")
        if log:  # tools/precompile.py replays this list into a disk cache on another machine
            with open(log, "a") as f:
                f.write(repr(config) + "\n")
        if self.use_disk:
            path = self._path(config)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".o.tmp{os.getpid()}")
                fn.export_to_c(object_file_path=str(tmp), function_name=EXPORT_NAME)
                os.replace(tmp, path)
            except Exception as exc:
                warnings.warn(f"cutegemm: could not write kernel cache {path}: {exc}", stacklevel=3)
        return fn
