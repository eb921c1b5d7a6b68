"""The layer check: prints each module's floor and fails on an import that runs up a floor, an
import circle, an import inside a function (optional dependencies excepted), a private name taken
from another module, or a library file over the line limit.

    python tools/layers.py            # report; exit status 1 on any violation
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PKG = "cutegemm"
ROOT = Path(__file__).resolve().parent.parent / PKG
MAX_LINES = 700
# Floors, bottom to top (longest prefix wins). An import may only go to a lower floor, or to the
# same floor without closing a circle.
FLOORS = {
    "cutegemm.config": 0,
    "cutegemm.runtime": 1,
    "cutegemm.policy": 1,
    "cutegemm.small_m": 1,
    "cutegemm.tuning": 1,
    "cutegemm.schedulers": 2,
    "cutegemm.epilogue": 2,
    "cutegemm.blockscaled.formats": 2,
    "cutegemm.blockscaled.layout": 2,
    "cutegemm.blockscaled.reference": 2,
    "cutegemm.gemm": 3,
    "cutegemm.grouped": 4,
    "cutegemm.blockscaled": 5,
    "cutegemm.api": 6,
    "cutegemm.ops": 7,
    "cutegemm.quant_ops": 7,
    "cutegemm.nn": 7,
    "cutegemm.moe": 7,
    "cutegemm.integrations": 7,
    "cutegemm.parallel": 7,
    "cutegemm.compile_check": 7,
    "cutegemm.variants": 7,
    "cutegemm.bench": 8,
    "cutegemm.__main__": 9,
    "cutegemm": 9,
}
FLOOR_NAMES = ["config", "runtime / policy / tuning", "schedulers / epilogue / block formats", "gemm",
               "grouped", "blockscaled", "api", "ops / quant_ops / moe / nn / parallel / integrations / compile_check",
               "bench", "__main__ / cutegemm"]
# Optional dependencies: imported where used, so that the library works without them (sonicmoe: a
# benchmark's competitor; cutegemm.integrations.transformers imports transformers).
OPTIONAL = ("matplotlib", "tqdm", "transformers", "nvidia.cu13", "torch.distributed", "sonicmoe",
            "cutegemm.integrations.transformers")


def module_files() -> dict[str, Path]:
    mods = {}
    for p in sorted(ROOT.rglob("*.py")):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def floor_of(mod: str) -> int:
    best = max((k for k in FLOORS if mod == k or mod.startswith(k + ".")), key=len)
    return FLOORS[best]


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    parts = mod.split(".") if is_pkg else mod.split(".")[:-1]
    if node.level > 1:
        parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def scan(mods: dict[str, Path]):
    """(edges {module: {target: line}}, function-level imports, private-name imports)."""
    edges: dict[str, dict[str, int]] = {m: {} for m in mods}
    in_function, private = [], []
    for mod, path in mods.items():
        tree = ast.parse(path.read_text())
        is_pkg = path.name == "__init__.py"

        def visit(node, in_fn, mod=mod, is_pkg=is_pkg):
            for child in ast.iter_child_nodes(node):
                fn = in_fn or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, ast.ImportFrom):
                    base = _resolve(mod, is_pkg, child)
                    names = [(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base, a.name) for a in child.names]
                elif isinstance(child, ast.Import):
                    base = ""
                    names = [(a.name, None) for a in child.names]
                else:
                    visit(child, fn)
                    continue
                for target, name in names:
                    if fn and not target.startswith(OPTIONAL):
                        in_function.append((mod, child.lineno, target))
                    if target.startswith(PKG) and target in mods and target != mod:
                        edges[mod].setdefault(target, child.lineno)
                        if name and target == base and name.startswith("_") and not name.startswith("__"):
                            private.append((mod, child.lineno, f"{target}.{name}"))

        visit(tree, False)
    return edges, in_function, private


def circles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            strong(v)
    return out


def main() -> int:
    mods = module_files()
    edges, in_function, private = scan(mods)
    upward = [(m, line, t) for m, ts in edges.items() for t, line in ts.items() if floor_of(t) > floor_of(m)]
    loops = circles(edges)
    lines = {m: len(p.read_text().splitlines()) for m, p in mods.items()}
    too_long = [(m, n) for m, n in lines.items() if n > MAX_LINES]
    print("import floors (bottom to top):")
    for f, name in enumerate(FLOOR_NAMES):
        members = [m for m in mods if floor_of(m) == f]
        print(f"  {f} {name}: {', '.join(m.removeprefix(PKG + '.') for m in members)}")
    for label, items in (("upward imports", upward), ("imports inside functions", in_function),
                         ("private names taken from another module", private)):
        print(f"{label}: {len(items)}")
        for m, line, t in items:
            print(f"  {mods[m].relative_to(ROOT.parent)}:{line} -> {t}")
    print(f"import circles: {len(loops)}")
    for comp in loops:
        print("  " + " <-> ".join(comp))
    largest = max(lines, key=lines.get)
    print(f"largest file: {mods[largest].relative_to(ROOT.parent)} ({lines[largest]} lines; limit {MAX_LINES})")
    for m, n in too_long:
        print(f"  over the limit: {mods[m].relative_to(ROOT.parent)} ({n} lines)")
    bad = len(upward) + len(in_function) + len(private) + len(loops) + len(too_long)
    print("layer check:", "PASS" if not bad else f"FAIL ({bad} problems)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
