#!/usr/bin/env bash
# K-grouped debug cases, one process each (tools/kg_debug.py), then memcheck on a failing one.
for c in "40 72 64,64" "40 72 3,61" "40 72 8,56" "40 72 3,125" "40 72 128,3" "40 72 3" "40 72 61,3" "40 72 64,3"; do
  echo "## $c"; timeout 60 python tools/kg_debug.py $c 2>&1 | grep -E "OK|FAIL" | head -2
done
echo "## PAD=3 40 72 3,0,45,16"; PAD=3 timeout 60 python tools/kg_debug.py 40 72 3,0,45,16 2>&1 | grep -E "OK|FAIL"
echo "## PAD=64 40 72 3,61"; PAD=64 timeout 60 python tools/kg_debug.py 40 72 3,61 2>&1 | grep -E "OK|FAIL"
echo "## memcheck 40 72 3,61"; timeout 120 compute-sanitizer --tool memcheck --print-limit 3 python tools/kg_debug.py 40 72 3,61 2>&1 | grep -v "^=========     by thread\|^=========         Host\|^=========     Host" | head -40
