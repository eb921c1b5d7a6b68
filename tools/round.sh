#!/usr/bin/env bash
# One bounded H200 round: unpack the staged DSL (and a precompiled kernel cache if carried), then
# run the named steps, each under its own timeout, logging to $OUT. Every compile is appended to
# $OUT/compiled.log (replay it here with tools/precompile.py for the next round).
#   bash tools/round.sh STEP[:SECONDS] ...
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
    # any script, without a new step per experiment: PY="tools/x.py --args" bash tools/round.sh py:600
    py) cmd="python ${PY:?set PY to a script and its arguments}" ;;
    pre) cmd="python tools/round_configs.py > $O/cfgs.log && python tools/precompile.py $O/cfgs.log --variants --jobs 16" ;;
    quant) cmd="$PT tests/test_quant_epilogue_gpu.py" ;;
    fp8) cmd="$PT tests/test_fp8_gpu.py" ;;
    quantize) cmd="$PT tests/test_quantize_gpu.py" ;;
    ops) cmd="$PT tests/test_ops_gpu.py tests/test_tuning_gpu.py" ;;
    bad) cmd="$PT tests/test_bad_inputs_gpu.py" ;;
    sched) cmd="$PT tests/test_scheduler_gpu.py" ;;
    dense) cmd="$PT tests/test_gemm_gpu.py tests/test_epilogue_gpu.py" ;;
    grouped) cmd="$PT tests/test_grouped_gpu.py" ;;
    gepi) cmd="$PT tests/test_grouped_epilogue_gpu.py" ;;
    blockwise) cmd="$PT tests/test_fp8_blockwise_gpu.py" ;;
    gblockwise) cmd="$PT tests/test_fp8_blockwise_gpu.py -k grouped" ;;
    gbad) cmd="$PT tests/test_bad_inputs_gpu.py -k grouped" ;;
    list_tests) cmd="$PT tests/test_grouped_list_gpu.py tests/test_grouped_gpu.py -k 'list'" ;;
    bench_list) cmd="python -c 'from cutegemm.benchmarks import bench_grouped_list as f; f()'" ;;
    bench_list_cfg) cmd="python -c 'from cutegemm.benchmarks import bench_grouped_list as f; f(configs=[dict(scheduler=\"static\"), dict(tile_n=128, pingpong=True, scheduler=\"static\"), dict(tile_m=128, tile_n=192), dict(tile_m=64, tile_n=256, pingpong=True, scheduler=\"static\"), dict(raster=\"m\", group=8)])'" ;;
    list_host) cmd="python tools/list_host.py" ;;
    list_host2) cmd="python tools/list_host.py --breakdown" ;;
    bw_layout) cmd="python tools/bw_layout.py" ;;
    bench_bw_small_cfg) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_fp8_blockwise as f; f(shapes=[(16, 7168, 2048), (128, 7168, 2048), (512, 7168, 2048), (2048, 7168, 2048)], configs=[dict(tile_m=128, tile_n=192, cluster_m=2, wg_order=True, raster=\"n\", group=8), dict(tile_m=128, tile_n=128, cluster_m=1, cluster_n=1, wg_order=True), dict(tile_m=64, tile_n=128, pingpong=True, cluster_m=1, wg_order=False, raster=\"n\", group=8), dict(tile_m=128, tile_n=128, cluster_m=2, wg_order=True, scheduler=\"dynamic\"), dict(tile_m=128, tile_n=64, cluster_m=1, wg_order=True, raster=\"n\", group=1), dict(tile_m=64, tile_n=64, pingpong=True, cluster_m=1, wg_order=False, raster=\"n\", group=1)])'" ;;
    bench_bw_small) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_fp8_blockwise as f, bench_grouped_fp8_blockwise as g; f(shapes=[(16, 7168, 2048), (128, 7168, 2048), (512, 7168, 2048), (2048, 7168, 2048)]); g(shapes=((32, 16, 4096, 7168), (128, 128, 1536, 2048)))'" ;;
    bench_bw_cfg) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_fp8_blockwise as f; W = dict(tile_m=128, tile_n=192, cluster_m=2, wg_order=True); N = dict(tile_m=128, tile_n=128, cluster_m=2, wg_order=True); f(shapes=[(8192, 8192, 8192), (16384, 7168, 2048), (4096, 4096, 4096)], configs=[dict(W, epi_stages=2), dict(W, cluster_m=1), dict(W, raster=\"m\"), dict(W, group=16), dict(N, epi_stages=2), dict(N, cluster_m=1, cluster_n=2), dict(W, cluster_m=1, cluster_n=2, epi_stages=2)])'" ;;
    bench_bw_final) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_fp8_blockwise as f, bench_grouped_fp8_blockwise as g, bench_grouped_fp8 as h; f(shapes=[(8192, 8192, 8192), (16384, 7168, 2048), (4096, 4096, 4096)]); g(); h(shapes=((32, 512, 4096, 7168),))'" ;;
    sanitize_list) cmd="SANITIZE_ONLY='^list' bash tools/sanitize.sh memcheck racecheck synccheck" ;;
    stress_list) cmd="python tools/stress.py --cases 300 --seed 5 --families list --time-limit $((lim - 15))" ;;
    sanitize_kg) cmd="SANITIZE_ONLY='^kgrouped' bash tools/sanitize.sh memcheck racecheck synccheck" ;;
    sanitize_grouped) cmd="SANITIZE_ONLY='^grouped|^fp8-' bash tools/sanitize.sh memcheck racecheck synccheck" ;;
    fp4w) cmd="$PT tests/test_fp4_weight_gpu.py tests/test_fp4_weight_cpu.py" ;;
    mx) cmd="$PT tests/test_blockscaled_sm90_gpu.py tests/test_blockscaled_sm90_cpu.py" ;;
    bench_mx) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_mxfp8 as f; f()'" ;;
    bench_fp4x4) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_fp4x4_hopper as f; f()'" ;;
    dq_probe) cmd="python tools/dequant_probe.py" ;;
    dq_tests) cmd="$PT tests/test_dequant_gpu.py tests/test_dequant_cpu.py" ;;
    bench_fp4w) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_fp4_weight as f; f(configs=[dict(ring=0, row_tiles=1, stages=4, warps_n=2, warps_k=4), dict(ring=0, row_tiles=1, stages=0, warps_n=1, warps_k=4, l2_prefetch=256)])'" ;;
    ncu_fp4w) cmd="ncu --clock-control none -k regex:Fp4WeightKernel -c 2 --import-source no --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy --section InstructionStats --section SourceCounters python tools/fp4w_profile.py 'n_tiles=2' 'n_tiles=2, row_tiles=2, warps_k=2'" ;;
    small_m) cmd="python tools/small_m_probe.py 3 --set ${SET:-tiles}" ;;
    ncu_small_m) cmd="PROFILE=1 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats --section SchedulerStats --section Occupancy python tools/small_m_probe.py --set ${SET:-tiles}" ;;
    fp8_small) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_fp8 as f; f(shapes=[(16, 7168, 2048), (64, 7168, 2048), (128, 7168, 2048), (16, 4096, 7168)], configs=[dict(tile_m=64, tile_n=128, cluster_m=1, raster=\"n\", group=1), dict(tile_m=64, tile_n=64, cluster_m=1, raster=\"n\", group=1), dict(tile_m=64, tile_n=64, pingpong=True, cluster_m=1, raster=\"n\", group=1)])'" ;;
    fp8_small2) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_fp8 as f; f(shapes=[(1, 7168, 2048), (32, 7168, 2048), (16, 28672, 4096), (64, 28672, 4096), (96, 7168, 2048)], configs=[dict(tile_m=64, tile_n=128, cluster_m=1, raster=\"n\", group=1), dict(tile_m=64, tile_n=64, cluster_m=1, raster=\"n\", group=1)])'" ;;
    bw_small2) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_fp8_blockwise as f; f(shapes=[(16, 7168, 2048), (64, 7168, 2048), (16, 4096, 7168), (16, 28672, 4096)], configs=[dict(tile_m=64, tile_n=64, pingpong=False, cluster_m=1, cluster_n=1, raster=\"n\", group=1), dict(tile_m=64, tile_n=128, pingpong=False, cluster_m=1, cluster_n=1, raster=\"n\", group=1), dict(tile_m=64, tile_n=128, pingpong=True, cluster_m=1, cluster_n=1, raster=\"n\", group=1)])'" ;;
    pad) cmd="python tools/pad_probe.py 3" ;;
    band) cmd="python tools/tile_ab.py 3 --set band" ;;
    gsweep) cmd="python tools/grouped_sweep.py" ;;
    gsweep2) cmd="python tools/grouped_sweep.py --set cluster_m" ;;
    gsweep3) cmd="python tools/grouped_sweep.py --set skip" ;;
    bench_gfp8) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_grouped_fp8 as f; f(configs=[dict(cluster_m=2, cluster_n=1), dict(tile_m=128, tile_n=128, pingpong=True, fast_accum=True), dict(tile_n=256, cluster_m=2, cluster_n=1, fast_accum=True), dict(tile_n=256, fast_accum=True)])'" ;;
    bench_fp8e) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_fp8 as f; f(shapes=[(8192, 8192, 8192), (16384, 7168, 2048), (4096, 4096, 4096)], configs=[dict(epi_stages=4), dict(tile_n=128, pingpong=True, fast_accum=True), dict(tile_n=128, pingpong=True, fast_accum=True, epi_stages=4)])'" ;;
    bench_gfp8_dyn) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_grouped_fp8 as f; f(configs=[dict(scheduler=\"dynamic\"), dict(scheduler=\"dynamic\", epi_stages=2), dict(tile_n=256, fast_accum=True, scheduler=\"dynamic\"), dict(tile_n=256, fast_accum=True)])'" ;;
    bench_gfp8e) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_grouped_fp8 as f; f(configs=[dict(epi_stages=4), dict(tile_m=128, tile_n=128, pingpong=True, fast_accum=True), dict(tile_m=64, tile_n=256, pingpong=True, fast_accum=True), dict(tile_m=64, tile_n=128, pingpong=True)])'" ;;
    fp4smoke) cmd="python tools/fp4_smoke.py" ;;
    fp4ring) cmd="$PT tests/test_fp4_weight_gpu.py -k 'ring or other_pipelines'" ;;
    bench_fp4ring) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_fp4_weight as f; R = dict(stages=0, l2_prefetch=0); f(configs=[dict(R, ring=4, ring_k=2, warps_n=8, warps_k=1, row_tiles=1), dict(R, ring=6, ring_k=2, warps_n=8, warps_k=1, row_tiles=1), dict(R, ring=3, ring_k=4, warps_n=8, warps_k=1, row_tiles=1), dict(R, ring=4, ring_k=2, warps_n=4, warps_k=2, row_tiles=2), dict(R, ring=4, ring_k=2, warps_n=4, warps_k=1, row_tiles=1), dict(R, ring=8, ring_k=2, warps_n=4, warps_k=1, row_tiles=1), dict(R, ring=2, ring_k=4, warps_n=8, warps_k=1, row_tiles=1)])'" ;;
    bench_fp4w16) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_fp4_weight as f; f(dense=[(16, 28672, 4096)], fmts=(\"nvfp4\",), configs=[dict(warps_n=8, warps_k=2, row_tiles=1), dict(warps_n=4, warps_k=4, row_tiles=2, ring=3, ring_k=4), dict(warps_n=8, warps_k=1, row_tiles=1)])'" ;;
    ncu_ring) cmd="ncu --clock-control none -k regex:Fp4WeightKernel -c 3 --import-source no --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --section InstructionStats python tools/fp4w_profile.py 'n_tiles=2, row_tiles=2, warps_n=4, warps_k=2, stages=0, ring=4, ring_k=2' 'n_tiles=2, row_tiles=2, warps_n=4, warps_k=2, stages=0, ring=4, ring_k=2, split=True' 'n_tiles=2, row_tiles=2, warps_n=4, warps_k=2, stages=0, ring=3, ring_k=2, split=True'" ;;
    fp4parts) cmd="python tools/fp4w_parts.py 'split=True'" ;;
    fp4split) cmd="$PT tests/test_fp4_weight_gpu.py -k 'split or views or decode'" ;;
    fp4q2) cmd="$PT tests/test_fp4_weight_gpu.py -k 'ring or views or decode or graph or split or alpha'" ;;
    fp4quick) cmd="$PT tests/test_fp4_weight_gpu.py -k 'ring or views or decode or fp8 or graph or alpha'" ;;
    ncu_mem) cmd="ncu --clock-control none -k regex:Fp4WeightKernel -c 2 --import-source no --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --metrics dram__bytes_read.sum,lts__t_bytes.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_hit_rate.pct,smsp__inst_executed.sum,smsp__cycles_active.avg,sm__cycles_elapsed.max,sm__cycles_active.min,sm__cycles_active.max python tools/fp4w_profile.py 'n_tiles=2, row_tiles=2, warps_n=4, warps_k=2, stages=0, ring=4, ring_k=2' 'n_tiles=2, row_tiles=2, warps_n=4, warps_k=2, stages=0, ring=4, ring_k=2, split=True'" ;;
    ncu_mix) cmd="ncu --clock-control none -k regex:Fp4WeightKernel -c 1 --import-source no --section InstructionStats --section WarpStateStats --section SourceCounters --print-details all python tools/fp4w_profile.py 'n_tiles=2, row_tiles=2, warps_n=4, warps_k=2, stages=0, ring=4, ring_k=2'" ;;
    bench_fp4pair) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_fp4_weight as f; f(configs=[dict(producer_pairs=False)])'" ;;
    bench_fp4w_policy) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_fp4_weight as f; f()'" ;;
    bench_gbw) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_grouped_fp8_blockwise as f; f(configs=[dict(wg_order=True), dict(tile_m=128, tile_n=128, cluster_n=1), dict(scheduler=\"dynamic\"), dict(scheduler=\"dynamic\", wg_order=True), dict(cluster_m=2, cluster_n=1)])'" ;;
    bench_wgo) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_fp8, bench_grouped_fp8, bench_fp8_blockwise; bench_fp8(shapes=[(8192, 8192, 8192), (16384, 7168, 2048)], configs=[dict(wg_order=True)]); bench_grouped_fp8(configs=[dict(wg_order=True), dict(tile_n=128, wg_order=True)]); bench_fp8_blockwise(configs=[dict(wg_order=True)])'" ;;
    ncu_main) cmd="ncu --clock-control none --profile-from-start off --import-source no --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats --metrics lts__t_bytes.sum.per_second,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__cycles_active.avg,sm__cycles_elapsed.avg.per_second python tools/prof_mainloop.py" ;;
    clocks) cmd="python tools/clock_probe.py --seconds 3" ;;
    bsgrouped) cmd="$PT tests/test_blockscaled_grouped_gpu.py tests/test_fp4_weight_gpu.py -k 'hopper or grouped'" ;;
    bench_gmx) cmd="python tools/bench_grouped_mx.py" ;;
    bench_gfp8p) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_grouped_fp8 as f; f(shapes=((32, 512, 4096, 7168), (32, 512, 7168, 2048)), configs=[dict(tile_m=128, tile_n=128, pingpong=True, fast_accum=True)])'" ;;
    bench_gbwp) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_grouped_fp8_blockwise as f; f(configs=[])'" ;;
    # A/B against an older package copied to ab_old/cutegemm (untracked; travels with the tree):
    # old, new, old, new in one call, so both see the same machine state. The old run must start
    # in ab_old/: `python -c` and `python -m` put the working directory first on sys.path.
    ab_fp4w) cmd="for i in 1 2; do for v in old new; do echo \"## \$v \$i\"; if [ \$v = old ]; then PP=/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/site:$PWD/ab_old; D=$PWD/ab_old; else PP=\$PYTHONPATH; D=$PWD; fi; cd \$D; PYTHONPATH=\$PP python -c 'from cutegemm.benchmarks import bench_fp4_weight as f; f(dense=((1, 28672, 4096), (16, 28672, 4096)))' | grep -E 'x|µs|us'; python -c 'import cutegemm, os; print(os.path.dirname(cutegemm.__file__))'; done; done; cd $PWD" ;;
    ab_grouped) cmd="for i in 1 2; do for v in old new; do echo \"## \$v \$i\"; if [ \$v = old ]; then PP=/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/site:$PWD/ab_old; D=$PWD/ab_old; else PP=\$PYTHONPATH; D=$PWD; fi; cd \$D; PYTHONPATH=\$PP python -m cutegemm bench grouped --reps 20 --out /tmp/ab_\$v\$i | grep -E 'TFLOP|static'; done; done; cd $PWD" ;;
    ab_gfp8) cmd="for i in 1 2; do for v in old new; do echo \"## \$v \$i\"; if [ \$v = old ]; then PP=/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/site:$PWD/ab_old; D=$PWD/ab_old; else PP=\$PYTHONPATH; D=$PWD; fi; cd \$D; PYTHONPATH=\$PP python -c 'from cutegemm.benchmarks import bench_grouped_fp8 as f, bench_grouped_fp8_blockwise as g; f(shapes=((32, 512, 4096, 7168), (32, 512, 7168, 2048)), configs=[dict(scheduler=\"dynamic\")]); g(configs=[])' | grep -E 'TFLOP'; done; done; cd $PWD" ;;
    ab_skip) cmd="for v in old new; do echo \"## \$v\"; if [ \$v = old ]; then PP=/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/site:$PWD/ab_old; else PP=\$PYTHONPATH; fi; PYTHONPATH=\$PP python tools/skip_probe.py; done" ;;
    ncu_skip) cmd="for v in old new; do echo \"## \$v\"; if [ \$v = old ]; then PP=/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/site:$PWD/ab_old; else PP=\$PYTHONPATH; fi; PROFILE=1 PYTHONPATH=\$PP ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum,sm__ops_path_tensor_src_bf16_dst_fp32.sum,sm__cycles_elapsed.avg.per_second,sm__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum.per_second python tools/skip_probe.py; done" ;;
    bench_kgpp) cmd="python -c 'from cutegemm.benchmarks import bench_grouped_k as f; f(loops=False, configs=[dict(tile_n=128, pingpong=True), dict(tile_n=128, pingpong=True, cluster_m=1, cluster_n=2), dict(tile_n=128, pingpong=True, cluster_m=1), dict(scheduler=\"dynamic\")])'" ;;
    stress_kg) cmd="python tools/stress.py --cases 300 --seed 3 --families kgrouped --time-limit $((lim - 15))" ;;
    bench_gfp8pp) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_grouped_fp8 as f; f(shapes=((32, 512, 4096, 7168), (32, 512, 7168, 2048)), configs=[dict(tile_m=64, tile_n=192, pingpong=True), dict(tile_m=64, tile_n=192, pingpong=True, cluster_n=1), dict(tile_m=64, tile_n=128, pingpong=True), dict(tile_m=64, tile_n=192, pingpong=True, fast_accum=True)])'" ;;
    bench_kg) cmd="python -c 'from cutegemm.benchmarks import bench_grouped_k as f; f(configs=[dict(tile_m=128, tile_n=256, pingpong=False), dict(tile_m=128, tile_n=128, pingpong=True), dict(tile_m=64, tile_n=256, pingpong=True)])'" ;;
    kgtests) cmd="$PT tests/test_grouped_gpu.py -k 'k_grouped'" ;;
    kgbad) cmd="$PT tests/test_bad_inputs_gpu.py -k 'k_grouped or kg'" ;;
    opsg) cmd="$PT tests/test_ops_gpu.py" ;;
    kgdebug) cmd="bash tools/kg_debug.sh" ;;
    tile_ab) cmd="python tools/tile_ab.py 3" ;;
    tile_small) cmd="python tools/tile_ab.py 3 --set small" ;;
    ncu_large) cmd="PROFILE=1 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,lts__t_sector_hit_rate.pct,sm__cycles_active.min,sm__cycles_active.max python tools/tile_ab.py 1 --set large" ;;
    ncu_small) cmd="PROFILE=1 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,lts__t_bytes.sum.per_second,lts__t_sector_hit_rate.pct,sm__cycles_active.min,sm__cycles_active.max python tools/tile_ab.py 1 --set small" ;;
    bw192) cmd="$PT tests/test_fp8_blockwise_gpu.py" ;;
    bench_bw192) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_fp8_blockwise as f, bench_grouped_fp8_blockwise as g; T = dict(tile_m=128, tile_n=192); f(shapes=[(8192, 8192, 8192), (16384, 7168, 2048), (4096, 4096, 4096)], configs=[dict(T, cluster_m=2, raster=\"n\", group=8), dict(T, cluster_m=2, raster=\"n\", group=8, wg_order=True), dict(T, cluster_m=1, cluster_n=2, raster=\"n\", group=8, wg_order=True)]); g(configs=[dict(T, cluster_n=2), dict(T, cluster_n=2, wg_order=True), dict(T, cluster_n=2, wg_order=True, scheduler=\"dynamic\")])'" ;;
    ab_bw) cmd="for i in 1 2; do for v in old new; do echo \"## \$v \$i\"; if [ \$v = old ]; then PP=/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/site:$PWD/ab_old; D=$PWD/ab_old; else PP=\$PYTHONPATH; D=$PWD; fi; cd \$D; PYTHONPATH=\$PP python -c 'from cutegemm.benchmarks_scaled import bench_fp8_blockwise as f, bench_grouped_fp8_blockwise as g; T = dict(tile_m=128, tile_n=192); f(shapes=[(8192, 8192, 8192), (16384, 7168, 2048)], configs=[dict(T, cluster_m=2, raster=\"n\", group=8, wg_order=False), dict(T, cluster_m=2, raster=\"n\", group=8, wg_order=True)]); g(configs=[dict(T, cluster_n=2, wg_order=False), dict(T, cluster_n=2, wg_order=True)])' | grep -E 'TFLOP'; python -c 'import cutegemm, os; print(os.path.dirname(cutegemm.__file__))'; done; done; cd $PWD" ;;
    tile_ab2) cmd="python tools/tile_ab.py 3 --set cluster" ;;
    bench_blockwise) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_fp8_blockwise as f; f(configs=[dict(cluster_m=1, cluster_n=2), dict(tile_n=64)])'" ;;
    sanitize_fp8) cmd="SANITIZE_ONLY='^fp8-' bash tools/sanitize.sh memcheck racecheck synccheck" ;;
    sanitize_fp4w) cmd="SANITIZE_ONLY='fp4w' bash tools/sanitize.sh memcheck racecheck synccheck" ;;
    memcheck_new) cmd="SANITIZE_ONLY='dynamic|grouped-epilogue' bash tools/sanitize.sh memcheck racecheck" ;;
    bench_epi) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_epilogue_quant as f; f()'" ;;
    bench_fp8) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_fp8 as f; f(shapes=[(8192, 8192, 8192), (16384, 7168, 2048), (4096, 4096, 4096)], configs=[dict(tile_n=128, pingpong=True, fast_accum=True), dict(tile_n=256, fast_accum=True), dict(tile_n=256, fast_accum=True, cluster_m=1, cluster_n=2)])'" ;;
    bench_dense) cmd="python -m cutegemm bench dense --reps 20 --out $O" ;;
    bench_grouped) cmd="python -m cutegemm bench grouped --reps 20 --out $O" ;;
    bench_quantize) cmd="python -m cutegemm bench quantize --reps 20 --out $O" ;;
    overhead) cmd="python -c 'from cutegemm.benchmarks import host_overhead; host_overhead()'; python tools/overhead_breakdown.py" ;;
    stress) cmd="python tools/stress.py --cases 1000 --seed ${STRESS_SEED:-0} --time-limit $((lim - 15))" ;;
    sanitize) cmd="bash tools/sanitize.sh" ;;
    sanitize_decode) cmd="SANITIZE_ONLY='decode' bash tools/sanitize.sh memcheck racecheck synccheck" ;;
    stress_fp4w) cmd="python tools/stress.py --cases 400 --seed 1 --families fp4w --time-limit $((lim - 15))" ;;
    stress_fp8bw) cmd="python tools/stress.py --cases 300 --seed 7 --families fp8bw --time-limit $((lim - 15))" ;;
    ncu_fp8) cmd="ncu --clock-control none --profile-from-start off --import-source no --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --section InstructionStats --metrics sm__cycles_elapsed.avg.per_second,lts__t_bytes.sum,dram__bytes_read.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum python tools/prof_fp8.py" ;;
    bench_fp8_dense) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_fp8 as f, bench_fp8_blockwise as g; f(shapes=[(8192, 8192, 8192), (16384, 7168, 2048)]); g(shapes=[(8192, 8192, 8192), (16384, 7168, 2048)])'" ;;
    bw_sb) cmd="python tools/bw_sb_layout.py" ;;
    ncu_bw_src) cmd="ncu --clock-control none --profile-from-start off -k regex:kernel_cutlass -c 1 --import-source no --section WarpStateStats --section SourceCounters --section SpeedOfLight --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,sm__cycles_elapsed.avg.per_second -o /tmp/bw_src python tools/prof_fp8.py && ncu -i /tmp/bw_src.ncu-rep --page source --print-source sass --csv > $O/bw_source.csv; ncu -i /tmp/bw_src.ncu-rep --page details" ;;
    ab_bw2) cmd="for i in 1 2; do for v in old new; do echo \"## \$v \$i\"; if [ \$v = old ]; then PP=/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/site:$PWD/ab_old; else PP=\$PYTHONPATH; fi; PYTHONPATH=\$PP python tools/ab_bw2.py; done; done" ;;
    bench_bw_cfg2) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_fp8_blockwise as f, bench_grouped_fp8_blockwise as g; W = dict(tile_m=128, tile_n=192, cluster_m=2, cluster_n=1, wg_order=True); N = dict(W, tile_n=128); f(shapes=[(8192, 8192, 8192), (16384, 7168, 2048), (4096, 4096, 4096), (2048, 7168, 2048), (512, 7168, 2048)], configs=[W, dict(W, wg_order=False), dict(W, cluster_m=1), dict(W, cluster_m=1, cluster_n=2), N, dict(N, wg_order=False), dict(W, scheduler=\"dynamic\")]); G = dict(tile_m=128, tile_n=192, cluster_m=1, cluster_n=2, wg_order=True); g(configs=[G, dict(G, wg_order=False), dict(G, scheduler=\"dynamic\"), dict(G, tile_n=128), dict(G, cluster_n=1, cluster_m=2)])'" ;;
    fp8_epi) cmd="python tools/fp8_epi_probe.py" ;;
    ab_fp8rw) cmd="for i in 1 2; do for v in old new; do echo \"## \$v \$i\"; if [ \$v = old ]; then PP=/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/site:$PWD/ab_old; D=$PWD/ab_old; else PP=\$PYTHONPATH; D=$PWD; fi; cd \$D; PYTHONPATH=\$PP python -c 'import runpy, os, sys, cutegemm; print(os.path.dirname(cutegemm.__file__)); sys.path.append(\"$PWD/tools\"); runpy.run_path(\"$PWD/tools/fp8_epi_probe.py\")'; done; done; cd $PWD" ;;
    bench_gfp8_cfg2) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_grouped_fp8 as f; f(shapes=((32, 512, 4096, 7168), (32, 512, 7168, 2048)), configs=[dict(scheduler=\"dynamic\"), dict(wg_order=True), dict(cluster_m=2, cluster_n=1), dict(tile_n=128), dict(tile_m=64, tile_n=192, pingpong=True), dict(tile_n=256, fast_accum=True)])'" ;;
    bench_fp8_final) cmd="python -c 'from cutegemm.benchmarks_scaled import bench_fp8 as f, bench_grouped_fp8 as g, bench_grouped_fp8_blockwise as h; f(shapes=[(8192, 8192, 8192), (16384, 7168, 2048)]); g(shapes=((32, 512, 4096, 7168), (32, 512, 7168, 2048))); h()'" ;;
    bias_epi) cmd="python tools/bias_epi_probe.py" ;;
    epi_tests) cmd="$PT tests/test_epilogue_gpu.py" ;;
    *) echo "unknown step $step"; continue ;;
  esac
  echo "=== $step (limit ${lim}s)"
  timeout "$lim" bash -c "$cmd" > "$O/$step.log" 2>&1; rc=$?
  grep -E "passed|failed|FAILED|Error|error:|TFLOP|MHz|GB/s|x faster|ms \||host|stress:|sanitizer:|µs|us/call" "$O/$step.log" | grep -v "^E  " | tail -25
  echo "--- $step rc=$rc $(( $(date +%s) - t ))s (total $(( $(date +%s) - T0 ))s)"
done
