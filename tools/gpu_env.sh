# Sourced by the H200 round scripts (round.sh, par_tests.sh): unpack the staged DSL, set the
# environment, unpack a carried kernel cache (.kcache.tar.xz), make the log folder $O (= $OUT or
# ./results) and record the GPU there.
[ -d /tmp/site/nvidia_cutlass_dsl ] || { mkdir -p /tmp/site && tar -C /tmp/site -xJf .dsl/cutlass-dsl-4.8.1-cp312.tar.xz; }  # once per machine
for w in .dsl/*.whl; do [ -f "$w" ] && python -m zipfile -e "$w" /tmp/site; done  # pure-Python extras (SonicMoE)
export PYTHONPATH=/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/site:$PWD PYTHONUNBUFFERED=1
export CUTEGEMM_CACHE_DIR=${CUTEGEMM_CACHE_DIR:-$PWD/.kcache}  # ignored by git: kept between calls on a warm machine
O=${OUT:-results}; mkdir -p "$O"
if [ -f .kcache.tar.xz ]; then mkdir -p $CUTEGEMM_CACHE_DIR && tar -C $CUTEGEMM_CACHE_DIR -xJf .kcache.tar.xz; fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee "$O/gpu.txt"
