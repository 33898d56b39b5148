#!/bin/bash
set -u
export MOEKIT_CACHE_DIR=/tmp/mk; mkdir -p $MOEKIT_CACHE_DIR $OUT
t0=$(date +%s)
[ -f /tmp/mk/.new2 ] || { gpu-bundle/new/warm_cache '' > /tmp/warm.log 2>&1; tail -1 /tmp/warm.log; touch /tmp/mk/.new2; }
echo "warm: $(( $(date +%s) - t0 )) s"
python3 -m pip install -q --no-deps --no-index gpu-bundle/new/wheels/*.whl 2>&1 | grep -v WARNING | tail -3
python3 -m pip install -q --no-index --find-links gpu-bundle/new/pywheels pytest 2>&1 | tail -1
python3 -c "import torch, moekit; print('torch', torch.__version__)"
MOEKIT_CLI=gpu-bundle/new/moekit timeout 300 python3 -m pytest -q -p no:cacheprovider crates/moekit-py/tests/test_cuda.py > $OUT/test_cuda.txt 2>&1; echo "rc $?"
tail -5 $OUT/test_cuda.txt
echo "total: $(( $(date +%s) - t0 )) s"
