#!/usr/bin/env bash
# Twenty-second session, first call: every kernel of the crate as a
# programmatic dependent launch (pdl_entry) — MOEKIT_PDL=0 (every launch in
# plain stream order, as before for all but the decode path) vs on,
# alternated; then the GPU tests the change touches.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; for f in gpu-bundle/xz/*.xz; do xz -dc "$f" > /tmp/bin/$(basename "$f" .xz); done; chmod +x /tmp/bin/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
N=/tmp/bin/moekit; export MOEKIT_CACHE_DIR=/tmp/kc
save() { tar czf "$out/res.tgz" -C $res .; }
b() { local pdl=$1; shift; MOEKIT_PDL=$pdl timeout 200 $N bench --device cuda --dtype bf16 --min-time 0.05 "$@"; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s/%s (%s) %s| ", $1, $2, $9*1000, $13*1000, $12, $11}'; echo; }
Q="--preset qwen3-30b-a3b --format affine4,q4_k,bf16 --tokens 1,16,64,512,4096"
for r in 1 2; do
  b 0 $Q --json $res/q_off_r$r.json > $res/q_off_r$r.txt 2>&1; echo "off r$r: $(row $res/q_off_r$r.txt)"
  b 1 $Q --json $res/q_on_r$r.json > $res/q_on_r$r.txt 2>&1; echo "on  r$r: $(row $res/q_on_r$r.txt)"
  echo "($(( $(date +%s) - t0 )) s)"; save
done
for p in mixtral-8x7b qwen3-next-80b; do
  b 0 --preset $p --format affine4 --tokens 64,512 > $res/${p}_off.txt 2>&1
  b 1 --preset $p --format affine4 --tokens 64,512 --json $res/${p}_on.json > $res/${p}_on.txt 2>&1
  echo "$p off: $(row $res/${p}_off.txt) on: $(row $res/${p}_on.txt)"
done
echo "($(( $(date +%s) - t0 )) s)"; save
T=/tmp/bin/moekit-gpu-tests
summ() { grep -E "^test .* FAILED$|test result|panicked at|^  left|^ right|NMSE|differ|not finite" "$1" | head -20; }
timeout 240 $T --test-threads=1 moe:: permute:: route_sort:: tc::block_is_deterministic tc_ra::batch_invariant tc_ra::permute norm_act::norm > $res/tests_a.txt 2>&1; echo "tests a ($(( $(date +%s) - t0 )) s):"; summ $res/tests_a.txt; save
echo "all $(( $(date +%s) - t0 )) s"
