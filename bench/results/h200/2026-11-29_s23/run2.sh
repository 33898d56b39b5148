#!/usr/bin/env bash
# Second call: (a) is tc_ra::every_format_matches_cpu's NaN (run1) already in
# HEAD's test binary? (b) the cursor plus MLX 4-bit scale pairs made where a
# unit is decoded (no wait on the loads at the end of the span that issued
# them) vs HEAD, alternated, qwen3 and Mixtral.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; for f in gpu-bundle/xz/*.xz; do xz -dc "$f" > /tmp/bin/$(basename "$f" .xz); done; chmod +x /tmp/bin/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
N=/tmp/bin/moekit; B=/tmp/bin/moekit.base; T=/tmp/bin/moekit-gpu-tests; TB=/tmp/bin/moekit-gpu-tests.base; export MOEKIT_CACHE_DIR=/tmp/kc
save() { tar czf "$out/res.tgz" -C $res .; }
summ() { grep -E "^test .* (ok|FAILED)$|test result|panicked at|^  left|^ right|differ|not finite|tc_ra check" "$1" | tail -12; }
b() { local bin=$1; shift; timeout 150 $bin bench --device cuda --dtype bf16 --min-time 0.05 "$@"; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s/%s (%s) | ", $1, $2, $9*1000, $13*1000, $12}'; echo; }
timeout 150 $TB --test-threads=1 tc_ra::every_format > $res/tests_base.txt 2>&1; echo "base tests ($(( $(date +%s) - t0 )) s):"; summ $res/tests_base.txt
timeout 150 $T --test-threads=1 tc_ra::every_format > $res/tests_new.txt 2>&1; echo "new tests ($(( $(date +%s) - t0 )) s):"; summ $res/tests_new.txt
save
Q="--preset qwen3-30b-a3b --format affine4,q4_k --tokens 64,512,4096"
for r in 1 2; do
  b $B $Q > $res/q_base_r$r.txt 2>&1; echo "base r$r: $(row $res/q_base_r$r.txt)"
  b $N $Q --json $res/q_new_r$r.json > $res/q_new_r$r.txt 2>&1; echo "new  r$r: $(row $res/q_new_r$r.txt)"
  save
done
M="--preset mixtral-8x7b --format affine4 --tokens 64,512"
b $B $M > $res/m_base.txt 2>&1; echo "mixtral base: $(row $res/m_base.txt)"
b $N $M --json $res/m_new.json > $res/m_new.txt 2>&1; echo "mixtral new : $(row $res/m_new.txt)"
save; echo "all $(( $(date +%s) - t0 )) s"
