#!/usr/bin/env bash
# GPU test files side by side on the H200 (compiles are CPU-bound: 16 cores), each under its own
# timeout and log in $OUT, then an optional timed script alone (PY, as in round.sh):
#   OUT=... PY="tools/x.py" bash tools/par_tests.sh SECS tests/gpu/test_a_gpu.py tests/gpu/test_b_gpu.py ...
# Correctness only: nothing timed runs while the tests share the GPU.
set -uo pipefail
T0=$(date +%s)
. "$(dirname "$0")/gpu_env.sh"
lim=$1; shift
for f in "$@"; do
  n=$(basename "$f" .py)
  CUTEGEMM_COMPILE_LOG=$O/compiled_$n.log timeout "$lim" python -m pytest -q -p no:cacheprovider --hypothesis-show-statistics "$f" > "$O/$n.log" 2>&1 &
done
wait
for f in "$@"; do
  n=$(basename "$f" .py)
  echo "== $n: $(grep -E '^[0-9]+ (passed|failed)|passed|failed' "$O/$n.log" | tail -1)"
  grep -E "^FAILED|^ERROR" "$O/$n.log" | head -5
done
echo "tests $(( $(date +%s) - T0 ))s"
if [ -n "${PY:-}" ]; then
  CUTEGEMM_COMPILE_LOG=$O/compiled_py.log timeout "${PY_LIM:-300}" python $PY > "$O/py.log" 2>&1; echo "py rc=$? $(( $(date +%s) - T0 ))s"
fi
