#!/usr/bin/env bash
# compute-sanitizer over one small case of every sm_90a kernel family (tools/sanitize.py).
#   bash tools/sanitize.sh [memcheck] [racecheck] [synccheck]    (default: all three)
# 1. a warm pass without the sanitizer: compiles every kernel into $CUTEGEMM_CACHE_DIR and checks
#    the results (compiling inside a sanitized process would take far longer);
# 2. one sanitized process per tool. Prints "sanitizer: <tool> kernels=<n> errors=<e>" per tool;
#    exits non-zero on any sanitizer error or failed check. Logs: $OUT (or ./results)/sanitize_*.log.
# PYTORCH_NO_CUDA_MEMORY_CACHING=1: every tensor is its own cudaMalloc, so memcheck sees an
# out-of-bounds access past a tensor (the caching allocator would hide it inside its pool).
# Extra sanitizer flags: SANITIZE_ARGS (e.g. "--kernel-name kns=SUBSTRING": only kernels whose mangled name holds it).
# Host API errors are not reported (--report-api-errors no): the DSL's HardwareInfo (our
# runtime/device.resident_clusters) probes the driver with cuGetProcAddress_v2, which returns
# CUDA_ERROR_INVALID_VALUE ~5 times per process; memcheck counted those as errors (34 per run on the H200),
# none of them a device memory access.
# Time limits (s): SANITIZE_WARM_TIMEOUT (default 180), SANITIZE_TIMEOUT per tool (default 130):
# the defaults keep the three tools inside one 10-minute command.
set -uo pipefail
[ -d /tmp/site/nvidia_cutlass_dsl ] || { mkdir -p /tmp/site && tar -C /tmp/site -xJf .dsl/cutlass-dsl-4.8.1-cp312.tar.xz; }  # once per machine
export PYTHONPATH=/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/site:$PWD PYTHONUNBUFFERED=1
export CUTEGEMM_CACHE_DIR=${CUTEGEMM_CACHE_DIR:-/tmp/cutegemm-cache}
OUTDIR=${OUT:-results}
mkdir -p "$OUTDIR"
TOOLS=${*:-memcheck racecheck synccheck}

start=$(date +%s)
ONLY=(--only "${SANITIZE_ONLY:-}")  # SANITIZE_ONLY=regex: only the matching cases
if ! timeout "${SANITIZE_WARM_TIMEOUT:-180}" python tools/sanitize.py "${ONLY[@]}" > "$OUTDIR/sanitize_warm.log" 2>&1; then
  tail -30 "$OUTDIR/sanitize_warm.log"
  echo "sanitizer: warm pass (no sanitizer) failed: see $OUTDIR/sanitize_warm.log"
  exit 1
fi
echo "sanitizer: warm pass $(tail -1 "$OUTDIR/sanitize_warm.log") in $(( $(date +%s) - start )) s"

status=0
for tool in $TOOLS; do
  log="$OUTDIR/sanitize_$tool.log"
  t0=$(date +%s)
  # shellcheck disable=SC2086
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "${SANITIZE_TIMEOUT:-130}" compute-sanitizer --tool "$tool" --error-exitcode 99 \
    --print-limit 50 --report-api-errors no ${SANITIZE_ARGS:-} python tools/sanitize.py "${ONLY[@]}" > "$log" 2>&1
  rc=$?
  errors=$(grep -oE "ERROR SUMMARY: [0-9]+" "$log" | tail -1 | grep -oE "[0-9]+$")
  # racecheck prints "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)" instead
  [ -z "$errors" ] && errors=$(grep -oE "RACECHECK SUMMARY: [0-9]+ hazards displayed \([0-9]+ errors" "$log" | tail -1 | grep -oE "\([0-9]+" | tr -d "(")
  kernels=$(grep -oE "kernels=[0-9]+" "$log" | tail -1 | cut -d= -f2)
  failures=$(grep -oE "failures=[0-9]+" "$log" | tail -1 | cut -d= -f2)
  echo "sanitizer: $tool kernels=${kernels:-?} errors=${errors:-?} (checks failed: ${failures:-?}, rc=$rc, $(( $(date +%s) - t0 )) s, log $log)"
  if [ "$rc" -ne 0 ] || [ "${errors:-x}" != "0" ] || [ "${failures:-x}" != "0" ]; then
    status=1
    grep -E "^========= (Invalid|Race|Barrier|Error|ERROR|Warning|Program hit|  )" "$log" | head -40
    [ "$rc" -eq 124 ] && echo "sanitizer: $tool timed out (${SANITIZE_TIMEOUT:-130} s)"
  fi
done
exit $status
