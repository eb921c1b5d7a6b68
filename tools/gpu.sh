#!/usr/bin/env bash
# One round on the H200 machine: unpack the staged DSL, then run what is asked.
#   bash tools/gpu.sh smoke|test|bench|sweep|moe|tiles|overhead   (results land in $OUT or ./results)
#   moe: MOE_ARGS="--shapes qwen3 --impls cutegemm,sonicmoe" picks shapes / implementations
set -uo pipefail
mkdir -p /tmp/site && tar -C /tmp/site -xJf .dsl/cutlass-dsl-4.8.1-cp312.tar.xz
for w in .dsl/*.whl; do [ -f "$w" ] && python -m zipfile -e "$w" /tmp/site; done  # pure-Python extras (SonicMoE)
export PYTHONPATH=/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/site:$PWD PYTHONUNBUFFERED=1
export CUTEGEMM_CACHE_DIR=${CUTEGEMM_CACHE_DIR:-/tmp/cutegemm-cache}
OUTDIR=${OUT:-results}
mkdir -p "$OUTDIR"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
for step in "$@"; do
  case "$step" in
    smoke) python -c "
import torch, cutegemm
a=torch.randn(1000,328,device='cuda',dtype=torch.bfloat16); b=torch.randn(328,1032,device='cuda',dtype=torch.bfloat16)
o=cutegemm.gemm(a,b); r=a.double()@b.double(); print('smoke max err', (o.double()-r).abs().max().item(), 'torch', ((a@b).double()-r).abs().max().item())" ;;
    test) python -m pytest tests -q -p no:cacheprovider --hypothesis-show-statistics 2>&1 | grep -E 'passing|passed|failed|FAILED|Error|error' | tail -40 ;;
    bench) python -m cutegemm bench dense --out "$OUTDIR" ;;
    sweep) python -m cutegemm bench sweep --out "$OUTDIR" ;;
    moe) python -m cutegemm bench moe --out "$OUTDIR" ${MOE_ARGS:-} ;;
    tiles) python -m cutegemm bench tiles ;;
    overhead) python -m cutegemm bench host ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
