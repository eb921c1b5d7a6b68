"""Compile a kernel for an arch with no GPU, keep its cubin, and read the SASS with cuobjdump."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import cutlass.cute as cute

from .cache import compile_options


def find_cuobjdump() -> str:
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import nvidia.cu13 as cu13  # nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm wheels

        cand = Path(next(iter(cu13.__path__))) / "bin" / "cuobjdump"
        if cand.exists():
            return str(cand)
    except ImportError:
        pass
    raise RuntimeError("cuobjdump not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm")


def compile_to_sass(kernel, args, arch: str) -> str:
    """Compile ``kernel(*args)`` for ``arch`` and return the SASS text of its cubin."""
    with tempfile.TemporaryDirectory(prefix="cutegemm-sass-") as tmp:
        cute.compile(kernel, *args, options=f"{compile_options(arch)} --keep-cubin --dump-dir {tmp}")
        cubins = sorted(Path(tmp).glob("*.cubin"), key=os.path.getmtime)
        if not cubins:
            raise RuntimeError(f"no cubin written for {arch}")
        exe = find_cuobjdump()
        env = dict(os.environ, PATH=f"{Path(exe).parent}:{os.environ.get('PATH', '')}")  # nvdisasm beside it
        res = subprocess.run([exe, "--dump-sass", str(cubins[-1])], capture_output=True, text=True, env=env)
        if res.returncode:
            raise RuntimeError(f"cuobjdump failed: {res.stderr.strip()}")
        return res.stdout


def count_markers(sass: str, patterns: dict[str, str]) -> dict[str, int]:
    return {name: len(re.findall(pat, sass)) for name, pat in patterns.items()}


def check_sass(build: tuple, arch: str, required: dict[str, str], forbidden: dict[str, str]) -> tuple[bool, dict, str]:
    """Compile ``build`` = (kernel, fake args) for ``arch`` (no GPU needed) and check its SASS:
    every ``required`` marker present, no ``forbidden`` one (local-memory spills).
    Returns (ok, marker counts, error)."""
    try:
        sass = compile_to_sass(*build, arch)
    except Exception as exc:  # reported per variant by compile-check
        return False, {}, f"{type(exc).__name__}: {exc}"[:300]
    found = count_markers(sass, required | forbidden)
    missing = [k for k in required if found[k] == 0]
    spilled = [k for k in forbidden if found[k]]
    err = (f"missing {missing} " if missing else "") + (f"local-memory spills {spilled}" if spilled else "")
    return not err, found, err.strip()
