#!/usr/bin/env bash
# One bounded H200 round: unpack the staged DSL (and a precompiled kernel cache if carried), then
# run the named steps, each under its own timeout, logging to $OUT. Every compile is appended to
# $OUT/compiled.log (replay it on a CPU machine with tools/precompile.py for the next round).
#   bash tools/round.sh STEP[:SECONDS] ...        (default limit: 120 s per step)
# Steps:
#   pre            compile every sm_90a compile-check variant first, 16 jobs (tools/precompile.py)
#   test-NAME      python -m pytest tests/{cpu,gpu}/test_NAME.py   (e.g. test-gemm_gpu, test-grouped_gpu)
#   tests          python -m pytest tests                 (every test file)
#   bench-FAMILY   python -m cutegemm bench FAMILY --reps 20 (dense, grouped, quantize, fp4w, sweep)
#   overhead       host time per warm call vs torch
#   stress         tools/stress.py (STRESS_CASES, STRESS_SEED, STRESS_FAMILIES)
#   sanitize       tools/sanitize.sh (SANITIZE_TOOLS, SANITIZE_ONLY)
#   py             any script: PY="tools/x.py --args" bash tools/round.sh py:600
set -uo pipefail
T0=$(date +%s)
. "$(dirname "$0")/gpu_env.sh"
export CUTEGEMM_COMPILE_LOG=$O/compiled.log
echo "setup $(( $(date +%s) - T0 ))s; cached kernels: $(find $CUTEGEMM_CACHE_DIR -name '*.o' 2>/dev/null | wc -l)"
PT="python -m pytest -q -p no:cacheprovider -x --hypothesis-show-statistics"
for spec in "$@"; do
  step=${spec%%:*}; lim=${spec#*:}; [ "$lim" = "$spec" ] && lim=120
  t=$(date +%s)
  case "$step" in
    py) cmd="python ${PY:?set PY to a script and its arguments}" ;;
    pre) cmd="python tools/precompile.py --variants --jobs 16" ;;
    test-*) cmd="$PT $(ls tests/*/test_${step#test-}.py)" ;;
    tests) cmd="$PT tests" ;;
    bench-*) cmd="python -m cutegemm bench ${step#bench-} --reps 20 --out $O/${step#bench-}" ;;
    overhead) cmd="python -m cutegemm bench host" ;;
    stress) cmd="python tools/stress.py --cases ${STRESS_CASES:-1000} --seed ${STRESS_SEED:-0} ${STRESS_FAMILIES:+--families $STRESS_FAMILIES} --time-limit $((lim - 15))" ;;
    sanitize) cmd="bash tools/sanitize.sh ${SANITIZE_TOOLS:-}" ;;
    *) echo "unknown step $step"; continue ;;
  esac
  echo "=== $step (limit ${lim}s)"
  timeout "$lim" bash -c "$cmd" > "$O/$step.log" 2>&1; rc=$?
  grep -E "passed|failed|FAILED|Error|error:|TFLOP|MHz|GB/s|x faster|ms \||host|stress:|sanitizer:|µs|us/call" "$O/$step.log" | grep -v "^E  " | tail -25
  echo "--- $step rc=$rc $(( $(date +%s) - t ))s (total $(( $(date +%s) - T0 ))s)"
done
