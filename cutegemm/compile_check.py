"""`python -m cutegemm compile-check`: compile every kernel variant of the support matrix for each
arch with fake tensors (no GPU needed) and check the SASS for the intended instructions and for
no local-memory spills."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from .blockscaled import dequant
from .blockscaled import quantizer as quantize_kernels
from .blockscaled.weight_only import kernel as weight_only
from .config import ELEMENT_BITS, FP8_DTYPES, GemmConfig
from .epilogue import combine as combine_kernels
from .epilogue import dispatch as dispatch_kernels
from .epilogue import gated_grads as gated_kernels
from .epilogue import routed_grads as routed_kernels
from .epilogue import zero_tail as zero_tail_kernels
from .gemm.launch import build_dense, build_grouped
from .runtime.sass import compile_to_sass, count_markers
from .variants import all_variants

# SASS markers: required (count > 0) and forbidden (count == 0).
SPILLS = {"LDL": r"\bLDL(\.|\s)", "STL": r"\bSTL(\.|\s)"}
REQUIRED = {
    "sm_90a": {"HGMMA": r"\bHGMMA\.", "UTMALDG": r"\bUTMALDG", "UTMASTG": r"\bUTMASTG", "USETMAXREG": r"USETMAXREG"},
    "sm_100a": {"UTCHMMA": r"\bUTCHMMA", "LDTM": r"\bLDTM", "UTMALDG": r"\bUTMALDG", "UTMASTG": r"\bUTMASTG"},
}
# Block-scaled (sm_100a): the block-scaled MMA of the element kind (UTCQMMA: kind::mxf8f6f4,
# UTCOMMA: kind::mxf4 / mxf4nvf4) and the scale-factor copy SMEM -> TMEM (tcgen05.cp = UTCCP).
BLOCKSCALED_MMA = {"e4m3": "UTCQMMA", "e2m1": "UTCOMMA"}


# Dynamic schedulers: the atomic tile counter and the st.async broadcast into the ring ("dynamic";
# STAS only with a multi-CTA cluster: a 1-CTA cluster writes its ring slot with a plain st.shared),
# clusterlaunchcontrol.try_cancel (SELFCAST for 1-CTA clusters, BROADCAST = multicast) ("clc").
SCHEDULER_MARKERS = {
    "static": {},
    "dynamic": {"ATOMG.ADD": r"\bATOMG\S*ADD", "STAS": r"\bSTAS\b"},
    "clc": {"UGETNEXTWORKID": r"\bUGETNEXTWORKID"},
}
CLUSTER_ONLY_MARKERS = {"dynamic": ("STAS",)}


def scheduler_markers(cfg: GemmConfig) -> dict[str, str]:
    markers = dict(SCHEDULER_MARKERS[cfg.scheduler])
    if cfg.cluster_m * cfg.cluster_n == 1:
        for name in CLUSTER_ONLY_MARKERS.get(cfg.scheduler, ()):
            del markers[name]
    return markers


def required_markers(cfg: GemmConfig) -> dict[str, str]:
    listed = {"UTMACCTL.IV": r"\bUTMACCTL\.IV"} if cfg.listed else {}  # the groups' descriptors: acquire fences
    fp8_out = {}
    if cfg.out_dtype in FP8_DTYPES and not cfg.epilogue.quant:  # an FP8 output: the saturating conversion
        t = cfg.out_dtype.upper()
        fp8_out = {f"F2FP.SATFINITE.{t}": rf"\bF2FP\.SATFINITE\.{t}\.F32"}
    return {**_mma_markers(cfg), **scheduler_markers(cfg), **listed, **fp8_out}


def forbidden_markers(cfg: GemmConfig) -> dict[str, str]:
    """No local-memory spills; no st.async in a 1-CTA-cluster "dynamic" kernel (the ring is then
    filled with st.shared: st.async to shared::cluster needs a cluster of >= 2 CTAs)."""
    forbidden = dict(SPILLS)
    if cfg.cluster_m * cfg.cluster_n == 1:
        for name in CLUSTER_ONLY_MARKERS.get(cfg.scheduler, ()):
            forbidden[name] = SCHEDULER_MARKERS[cfg.scheduler][name]
    return forbidden


def _mma_markers(cfg: GemmConfig) -> dict[str, str]:
    if not cfg.blockscaled:
        required = dict(REQUIRED[cfg.arch])
        if cfg.arch == "sm_90a" and cfg.fp8:  # FP8 WGMMA (e4m3 / e5m2)
            del required["HGMMA"]
            required["QGMMA"] = rf"\bQGMMA\.\S+\.{cfg.a_dtype.upper()}\.{cfg.b_dtype.upper()}\b"  # A's, B's type
        mma = "UTCHMMA"
        if cfg.arch == "sm_100a" and cfg.fp8:  # FP8 UMMA: kind::f8f6f4
            del required["UTCHMMA"]
            required["UTCQMMA"] = r"\bUTCQMMA"
            mma = "UTCQMMA"
        if cfg.arch == "sm_100a" and cfg.two_cta:
            required[f"{mma}.2CTA"] = rf"\b{mma}\S*2CTA"
        if cfg.swap_ab:  # one WGMMA width per 16 tokens: the narrowest and the widest at least
            for n in (16, cfg.tile_n):
                required[f"GMMA.64x{n}"] = rf"\b[HQ]GMMA\.64x{n}x"
        if cfg.gathers and cfg.arch == "sm_90a":  # rows by cp.async, tracked by the stage barrier
            required["LDGSTS"] = r"\bLDGSTS\.E\.BYPASS\.128"
            required["ARRIVES.LDGSTSBAR"] = r"\bARRIVES\.LDGSTSBAR"
        elif cfg.gather_a:  # sm_100a: A's rows by the TMA unit's gather4 mode
            required["UTMALDG.GATHER4"] = r"\bUTMALDG\.2D\.GATHER4"
        if cfg.split_cluster:  # partial sums by st.async into range 0's shared memory
            required["STAS"] = r"\bSTAS\b"
        elif cfg.split_k > 1:  # a unit counts in on its tile's counter, GPU scope
            required["ATOMG.ADD.GPU"] = r"\bATOMG\.E\.ADD\.STRONG\.GPU"
        return required
    mma = BLOCKSCALED_MMA["e4m3" if cfg.a_dtype != cfg.b_dtype else cfg.a_dtype]  # mixed: kind::mxf8f6f4
    required = {mma: rf"\b{mma}", "UTCCP": r"\bUTCCP", **{k: v for k, v in REQUIRED[cfg.arch].items() if k != "UTCHMMA"}}
    if cfg.two_cta:
        required[f"{mma}.2CTA"] = rf"\b{mma}\S*2CTA"
    return required


@dataclass
class CheckResult:
    name: str
    ok: bool
    markers: dict
    seconds: float
    error: str = ""

    def line(self) -> str:
        status = "PASS" if self.ok else "FAIL"
        found = " ".join(f"{k}={v}" for k, v in self.markers.items())
        tail = f"  ({self.error})" if self.error else ""
        return f"{status} {self.name:<80} {found} [{self.seconds:.1f}s]{tail}"


def wgmma_serialized(cfg: GemmConfig, sass: str) -> bool:
    """ptxas serializes every WGMMA of a kernel (warning C7520) when it cannot prove a branch
    around them warpgroup-uniform: then each HGMMA / QGMMA carries its own gsb0 wait. In our
    sm_90a mainloops only the last WGMMA of a K tile's batch does (the MXFP8 emulation and
    promote_k 32 commit each 32-wide K block alone, so they are not checked)."""
    if cfg.arch != "sm_90a" or cfg.fp8_mx or cfg.promote_k == 32:
        return False
    gmma = re.findall(r"[HQ]GMMA\.[^\n]*", sass)
    return bool(gmma) and all("gsb0" in g for g in gmma)


def stage_k(cfg: GemmConfig) -> int:
    """K elements of one stage: sm_90a 128 bytes of A; sm_100a four MMA instructions, each
    16 (f16 kinds), 32 (kind::f8f6f4, mixed pairs included) or 64 (kind::mxf4 / mxf4nvf4) deep."""
    a_bits, b_bits = ELEMENT_BITS[cfg.a_dtype], ELEMENT_BITS[cfg.b_dtype]
    if cfg.arch == "sm_90a":
        return 1024 // a_bits
    return 4 * (16 if a_bits == 16 else 64 if a_bits == b_bits == 4 else 32)


def stage_data_bytes(cfg: GemmConfig) -> int:
    """The A and B bytes one stage's TMA copies deliver to its full barrier, from the config alone:
    elements times the operands' real widths (a 4-bit operand is read as 4 bits even where shared
    memory holds it a byte per element). sm_100a with 2-CTA: the pair's bytes (they land on the
    leader CTA's barrier); sm_90a: A's box rows (``a_rows``; none with ``gather_a``, whose A
    arrives by cp.async) and the tile's B columns. sm_100a ``gather_a``: the tile's rows, by the
    gather4 loads on the same barrier."""
    k = stage_k(cfg)
    a_bits, b_bits = ELEMENT_BITS[cfg.a_dtype], ELEMENT_BITS[cfg.b_dtype]
    rows = (cfg.a_rows or cfg.tile_m) if cfg.arch == "sm_90a" else cfg.tile_m
    rows = 0 if cfg.gather_a and cfg.arch == "sm_90a" else rows
    cols = 0 if cfg.gather_b else cfg.tile_n  # gather_b: B's K rows by cp.async
    return (rows * k * a_bits + cols * k * b_bits) // 8


def stage_tx_errors(cfg: GemmConfig, kernel) -> list[str]:
    """The transaction-byte rule: the bytes a kernel arms its stage barrier with equal the bytes
    its TMA copies deliver (``stage_data_bytes`` plus the scale factors loaded on the same
    barrier). A mismatch never completes the barrier (a hang) or completes it early (a race).
    Swap AB arms per tile (its token chunks): not covered here."""
    armed = getattr(kernel, "tma_bytes", None)
    if armed is None or cfg.swap_ab:
        return []
    data = stage_data_bytes(cfg)
    if cfg.arch == "sm_90a":
        extra = 0
        if cfg.fp8_mx:
            extra = kernel.mx.mx_stage_bytes()
        elif cfg.fp8_blockwise:
            extra = kernel.blockwise.sfa_rows() * 4 + (cfg.tile_n * 4 if cfg.sfb_cols else 0)  # sfb_cols: B's too
    else:
        extra = (2 if cfg.two_cta else 1) * getattr(kernel, "tx_sf_bytes", 0)
    if armed != data + extra:
        return [f"stage barrier armed with {armed} B, the TMA copies deliver {data + extra} B "
                f"({data} of A and B at their element widths + {extra} of scales)"]
    return []


def tmem_errors(cfg: GemmConfig, kernel) -> list[str]:
    """The TMEM rule of the sm_100a kernels, from the config alone: the accumulators (tile_n fp32
    columns per CTA per buffer) and the scale factors (32-row groups x 4 K blocks of SFA and of
    SFB, whose tile is rounded up to 128 columns) fit in the allocation; there are two accumulator
    buffers (side by side, or overlapping behind a one-stage pipeline whose epilogue releases the
    stage only after it has read every shared column), so a tile's epilogue overlaps the next
    tile's mainloop."""
    plan = getattr(kernel, "tmem", None)
    if cfg.arch != "sm_100a" or not cfg.blockscaled or plan is None:
        return []
    acc = cfg.tile_n
    sf = ((cfg.tile_m // (2 if cfg.two_cta else 1)) // 32 + -(-cfg.tile_n // 128) * 128 // 32) * 4
    err = []
    if plan.alloc_cols > 512 or plan.stage_cols + acc + sf > plan.alloc_cols:
        err.append(f"TMEM: {plan.stage_cols} + {acc} accumulator + {sf} scale columns > {plan.alloc_cols} allocated")
    if kernel.num_acc_tmem_cols != plan.stage_cols + acc:
        err.append(f"TMEM: scale factors start at column {kernel.num_acc_tmem_cols}, not {plan.stage_cols + acc}")
    if plan.buffers != 2 or plan.stage_cols <= 0:
        err.append("TMEM: one accumulator buffer (the mainloop waits for every epilogue)")
    if plan.acc_stage == 1 and plan.overlap_cols != acc - plan.stage_cols:
        err.append(f"TMEM: buffers share {acc - plan.stage_cols} columns, the plan says {plan.overlap_cols}")
    return err


def check_config(cfg: GemmConfig) -> CheckResult:
    t0 = time.time()
    try:
        kernel, args = (build_grouped if cfg.grouped else build_dense)(cfg)
        sass = compile_to_sass(kernel, args, cfg.arch)
    except Exception as exc:  # report every variant, then fail at the end
        return CheckResult(cfg.name, False, {}, time.time() - t0, f"{type(exc).__name__}: {exc}"[:300])
    req = count_markers(sass, required_markers(cfg))
    bad = count_markers(sass, forbidden_markers(cfg))
    missing = [k for k, v in req.items() if v == 0]
    spilled = [k for k, v in bad.items() if v and k in SPILLS]
    unwanted = [k for k, v in bad.items() if v and k not in SPILLS]
    err = ""
    if missing:
        err += f"missing {missing} "
    if spilled:
        err += f"local-memory spills {spilled} "
    if unwanted:
        err += f"forbidden {unwanted} "
    for problem in (*stage_tx_errors(cfg, kernel), *tmem_errors(cfg, kernel)):
        err += problem + " "
    if wgmma_serialized(cfg, sass):
        err += "serialized WGMMA (every HGMMA/QGMMA waits for itself: ptxas C7520)"
    return CheckResult(cfg.name, not err, {**req, **bad}, time.time() - t0, err.strip())


def family_results(archs, all_configs, check_variant) -> list[CheckResult]:
    """Every variant of a kernel family: ``all_configs(arch)`` lists them, ``check_variant(cfg)``
    compiles one and checks its SASS."""
    out = []
    for cfg in (c for arch in archs for c in all_configs(arch)):
        t0 = time.time()
        ok, markers, err = check_variant(cfg)
        res = CheckResult(cfg.name, ok, markers, time.time() - t0, err)
        print(res.line(), flush=True)
        out.append(res)
    return out


def quantize_results(archs) -> list[CheckResult]:
    """The block-scaled quantize kernels (cutegemm.blockscaled.quantizer), every variant."""
    return family_results(archs, quantize_kernels.all_configs, quantize_kernels.check_variant)


def dequant_results(archs) -> list[CheckResult]:
    """The block-scaled -> bf16 dequantize kernels (cutegemm.blockscaled.dequant), every variant."""
    return family_results(archs, dequant.all_configs, dequant.check_variant)


def gated_results(archs) -> list[CheckResult]:
    """The MoE layer's elementwise swiglu forward / backward kernels (cutegemm.epilogue.gated_grads)."""
    return family_results(archs, gated_kernels.all_configs, gated_kernels.check_variant)


def routed_results(archs) -> list[CheckResult]:
    """The routed MoE backward's one-pass swiglu / routing-weight kernel (cutegemm.epilogue.routed_grads)."""
    return family_results(archs, routed_kernels.all_configs, routed_kernels.check_variant)


def combine_results(archs) -> list[CheckResult]:
    """The MoE layer's one-pass row combines (cutegemm.epilogue.combine), every variant."""
    return family_results(archs, combine_kernels.all_configs, combine_kernels.check_variant)


def dispatch_results(archs) -> list[CheckResult]:
    """The MoE layer's one-launch dispatch sort (cutegemm.epilogue.dispatch), every variant."""
    return family_results(archs, dispatch_kernels.all_configs, dispatch_kernels.check_variant)


def zero_tail_results(archs) -> list[CheckResult]:
    """The packed grouped backward's tail-zeroing kernel (cutegemm.epilogue.zero_tail)."""
    return family_results(archs, zero_tail_kernels.all_configs, zero_tail_kernels.check_variant)


def fp4_weight_results(archs) -> list[CheckResult]:
    """The FP4-weight (W4A16) kernels (cutegemm.blockscaled.weight_only.kernel), every variant."""
    return family_results(archs, weight_only.all_configs, weight_only.check_variant)


def main(archs) -> int:
    results = []
    for cfg in all_variants(archs):
        res = check_config(cfg)
        print(res.line(), flush=True)
        results.append(res)
    results += quantize_results(archs)
    results += dequant_results(archs)
    results += gated_results(archs)
    results += routed_results(archs)
    results += combine_results(archs)
    results += dispatch_results(archs)
    results += zero_tail_results(archs)
    results += fp4_weight_results(archs)
    failed = [r for r in results if not r.ok]
    print(f"compile-check: {len(results) - len(failed)}/{len(results)} variants passed for {', '.join(archs)}")
    return 1 if failed else 0
