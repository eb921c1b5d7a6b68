#!/usr/bin/env bash
# The 2026-12-01 fourth session's last H200 round: precompile (16 jobs), the dense GPU suites side
# by side, the decode policy probe (write flush, then one round with the clean flush), the dense
# benchmark, DeepSeek block scales at 96 / 128 rows, compute-sanitizer on the decode cases.
set -uo pipefail
: "${OUT:?}"
. "$(dirname "$0")/gpu_env.sh"
O=$OUT/r7; mkdir -p "$O"; T=$(date +%s)
cat bench/2026-12-01d/round3_tests_probe/compiled_*.log bench/2026-12-01d/round4_split/cfgs.log > /tmp/all_cfgs.log
python tools/precompile.py /tmp/all_cfgs.log --jobs 16 > "$O/pre.log" 2>&1
echo "pre $(grep -c ^ok "$O/pre.log") ok, $(grep -c FAIL "$O/pre.log") fail, $(( $(date +%s) - T ))s"
OUT=$O/t PY_LIM=240 PY="tools/decode_policy_probe.py 2 --before pow2" bash tools/par_tests.sh 300 tests/test_decode_gpu.py \
  tests/test_gemm_gpu.py tests/test_epilogue_gpu.py tests/test_fp8_gpu.py tests/test_quant_epilogue_gpu.py \
  tests/test_bad_inputs_gpu.py tests/test_out_views_gpu.py tests/test_fp8_blockwise_gpu.py > "$O/par.txt" 2>&1
cat "$O/par.txt"; grep "us |" "$O/t/py.log"
timeout 120 python tools/decode_policy_probe.py 1 --before pow2 --clean > "$O/probe_clean.log" 2>&1
timeout 150 python -m cutegemm bench dense --reps 30 --out "$O/bd" > "$O/bench_dense.log" 2>&1
grep -E "TFLOP|geomean|x " "$O/bench_dense.log" | tail -8
timeout 100 python -c "from cutegemm.benchmarks_scaled import bench_fp8_blockwise as f; f(shapes=[(96, 28672, 4096), (128, 28672, 4096)], configs=[dict(tile_n=64)])" > "$O/bw.log" 2>&1
grep TFLOP "$O/bw.log"
OUT=$O/s SANITIZE_ONLY='decode|split' bash tools/sanitize.sh memcheck racecheck synccheck 2>&1 | grep sanitizer:
echo "total $(( $(date +%s) - T ))s"
cd "$O" && tar czf all.tgz t s bd && rm -rf t s bd
