"""Fill the kernel disk cache ($CUTEGEMM_CACHE_DIR) on a machine without a GPU, so a GPU session
skips compiling (kernels compile for sm_90a / sm_100a without a GPU; the cache key is the source
fingerprint + config, see cutegemm/runtime/cache.py).

    python tools/precompile.py [LOG ...] [--variants] [--jobs 2]

LOG files hold one GemmConfig / Fp4WeightConfig repr per line, as written by a run with CUTEGEMM_COMPILE_LOG=LOG;
--variants adds every sm_90a compile-check variant. Configs that need a user epilogue defined in
another process are skipped."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _configs(logs, variants):
    from cutegemm.blockscaled.weight_only.kernel import Fp4WeightConfig
    from cutegemm.config import Form, GemmConfig  # noqa: F401
    from cutegemm.epilogue import EpilogueSpec  # noqa: F401  (eval namespace)

    out = []
    for log in logs:
        for line in Path(log).read_text().splitlines():
            line = line.strip()
            if line.startswith("GemmConfig("):
                out.append(eval(line, {"GemmConfig": GemmConfig, "EpilogueSpec": EpilogueSpec, "Form": Form}))  # noqa: S307
            elif line.startswith("Fp4WeightConfig("):
                out.append(eval(line, {"Fp4WeightConfig": Fp4WeightConfig}))  # noqa: S307
    if variants:
        from cutegemm.compile_check import all_variants

        out += all_variants(["sm_90a"])
    seen, uniq = set(), []
    for cfg in out:
        if cfg not in seen and getattr(getattr(cfg, "epilogue", None), "user", None) is None:
            seen.add(cfg)
            uniq.append(cfg)
    return uniq


def _compile(cfg):
    from cutegemm.blockscaled.weight_only import kernel as fp4_weight
    from cutegemm.gemm.launch import DENSE_CACHE, GROUPED_CACHE

    t = time.time()
    try:
        if isinstance(cfg, fp4_weight.Fp4WeightConfig):
            fp4_weight.kernel_cache().get(cfg)
        else:
            (GROUPED_CACHE if cfg.grouped else DENSE_CACHE).get(cfg)
        return f"ok   {time.time() - t:5.1f}s {cfg.name}"
    except Exception as exc:
        return f"FAIL {cfg.name}: {type(exc).__name__}: {str(exc)[:200]}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("logs", nargs="*")
    p.add_argument("--variants", action="store_true")
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args(argv)
    cfgs = _configs(args.logs, args.variants)
    print(f"precompiling {len(cfgs)} configs with {args.jobs} processes", flush=True)
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        for line in pool.imap_unordered(_compile, cfgs):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
