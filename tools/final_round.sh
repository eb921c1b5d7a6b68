#!/usr/bin/env bash
# One full H200 round, every step bounded and logged to $OUT: grouped tests, dense benchmark,
# grouped benchmark, host overhead, then the whole GPU test suite.
set -uo pipefail
mkdir -p /tmp/site && tar -C /tmp/site -xJf .dsl/cutlass-dsl-4.8.1-cp312.tar.xz
export PYTHONPATH=/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/site:$PWD PYTHONUNBUFFERED=1 CUTEGEMM_CACHE_DIR=/tmp/cutegemm-cache
O=${OUT:-results}; mkdir -p "$O"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee "$O/gpu.txt"
git log -1 --format=%H >> "$O/gpu.txt" 2>/dev/null || true
timeout 170 python -m pytest tests/test_grouped_gpu.py -q -p no:cacheprovider --hypothesis-show-statistics > "$O/test_grouped.log" 2>&1
grep -E "passing|passed|failed|FAILED|Error" "$O/test_grouped.log" | tail -15
timeout 100 python -m cutegemm bench dense --reps 30 --out "$O" > "$O/bench_dense.log" 2>&1; grep -v Warn "$O/bench_dense.log" | tail -14
timeout 100 python -m cutegemm bench grouped --reps 30 --out "$O" > "$O/bench_grouped.log" 2>&1; grep -v Warn "$O/bench_grouped.log" | tail -14
timeout 30 python -c "from cutegemm.benchmarks import host_overhead; host_overhead()" 2>&1 | grep host
timeout 200 python -m pytest tests/test_gemm_gpu.py tests/test_epilogue_gpu.py -q -p no:cacheprovider --hypothesis-show-statistics > "$O/test_dense.log" 2>&1
grep -E "passing|passed|failed|FAILED|Error" "$O/test_dense.log" | tail -15
