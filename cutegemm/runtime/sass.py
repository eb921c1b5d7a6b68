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


def check_sass(build: tuple, arch: str, required: dict[str, str], forbidden: dict[str, str],
               extra=None) -> tuple[bool, dict, str]:  # fmt: skip
    """Compile ``build`` = (kernel, fake args) for ``arch`` (no GPU needed) and check its SASS:
    every ``required`` marker present, no ``forbidden`` one (local-memory spills), and
    ``extra(sass)`` (a list of problems) empty. Returns (ok, marker counts, error)."""
    try:
        sass = compile_to_sass(*build, arch)
    except Exception as exc:  # reported per variant by compile-check
        return False, {}, f"{type(exc).__name__}: {exc}"[:300]
    found = count_markers(sass, required | forbidden)
    missing = [k for k in required if found[k] == 0]
    spilled = [k for k in forbidden if found[k]]
    err = (f"missing {missing} " if missing else "") + (f"local-memory spills {spilled}" if spilled else "")
    problems = extra(sass) if extra is not None else []
    if problems:
        err += f" {len(problems)} problems, e.g. {problems[0]}"
    return not err, found, err.strip()


_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
_NO_DEST = ("ST", "STS", "STG", "STL", "RED", "BAR", "HGMMA", "WARPGROUP", "BRA", "SYNCS", "MEMBAR", "FENCE", "EXIT")


def _written_registers(text: str) -> set[int]:
    """General registers an instruction writes (its first operand; .64 / .128 / wide forms: 2 / 4)."""
    parts = re.sub(r"^@!?U?P\w+\s+", "", text).split(None, 1)
    if len(parts) < 2 or parts[0].split(".")[0] in _NO_DEST:
        return set()
    m = re.fullmatch(r"R(\d+)", parts[1].split(",")[0].strip())
    if not m:
        return set()
    op = parts[0]
    width = 4 if ".128" in op else 2 if (".64" in op or op.startswith("CS2R") or ".WIDE" in op) else 1
    return {int(m.group(1)) + i for i in range(width)}


def wgmma_register_a_hazards(sass: str) -> list[str]:
    """Loops whose last commit group of register-A WGMMAs (``HGMMA ... Rd, Ra, gdesc``) is still in
    flight at the back edge (no ``WARPGROUP.DEPBAR.LE gsb0, 0x0`` after it): every instruction from
    the loop head up to the first ``DEPBAR`` (the wait that retires that group) must leave the
    group's A registers alone. ptxas keeps an in-flight WGMMA's registers apart from later writes
    only within straight-line code, so this is the hazard a loop trip of one group would have."""
    ins = [(int(m.group(1), 16), m.group(2).strip()) for m in _SASS_LINE.finditer(sass)]
    at = {a: i for i, (a, _) in enumerate(ins)}
    problems = []
    for i, (a, text) in enumerate(ins):
        bm = re.search(r"\bBRA(?:\.\w+)*\s+0x([0-9a-f]+)", text)
        if not bm or int(bm.group(1), 16) >= a or int(bm.group(1), 16) not in at:
            continue
        body = ins[at[int(bm.group(1), 16)] : i + 1]
        rs = [k for k, (_, x) in enumerate(body) if re.match(r"HGMMA\S*\s+R\d+,\s+R\d+,", x)]
        ends = [k for k in rs if "gsb0" in body[k][1]]
        if not ends or any("DEPBAR.LE gsb0, 0x0" in x for _, x in body[ends[-1] + 1 :]):
            continue
        first = ends[-2] if len(ends) > 1 else -1
        a_regs = set()
        for k in rs:
            if first < k <= ends[-1]:
                r = int(re.match(r"HGMMA\S*\s+R\d+,\s+R(\d+),", body[k][1]).group(1))
                a_regs |= set(range(r, r + 4))
        for addr, x in body:
            if "DEPBAR.LE gsb0" in x:
                break
            hit = _written_registers(x) & a_regs
            if hit:
                problems.append(f"{addr:#x}: {x} writes R{min(hit)}, an A register in flight across the loop's back edge")
    return problems
