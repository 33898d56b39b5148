#!/usr/bin/env bash
# Second call: as run1 (whose tc_tma:: ran past its 150 s, in the JIT of
# the quantized test's instances, or hung), with a kernel cache compiled
# off the device (warm_cache) and the quantized tests one by one.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; for b in moekit gt; do xz -dc gpu-bundle/xz/$b.xz > /tmp/bin/$b; done; chmod +x /tmp/bin/*
export MOEKIT_CACHE_DIR=/tmp/kc; mkdir -p /tmp/kc; tar xJf gpu-bundle/xz/kcache.tar.xz -C /tmp/kc
ls /usr/local/cuda/lib64/libnvrtc.so.* 2>/dev/null | head -3
N=/tmp/bin/moekit
save() { tar czf "$out/res.tgz" -C $res .; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s (%s) | ", $1, $2, $9*1000, $12}'; echo; }
t() { timeout "$1" /tmp/bin/gt --test-threads=1 --nocapture "${@:2}" > $res/$2.txt 2>&1; echo "$2 rc=$? $(grep -E "test result|panicked" $res/$2.txt | head -6 | tr '\n' '|') ($(( $(date +%s) - t0 )) s)"; save; }
t 60 tc_tma::sanitizer_sweep
grep -q "test result: ok" $res/tc_tma::sanitizer_sweep.txt || { tail -5 $res/tc_tma::sanitizer_sweep.txt; echo stop; exit 0; }
t 150 tc_tma::quantized
grep -q "test result: ok" $res/tc_tma::quantized.txt || { grep -E "panicked|NMSE|differs|check:" $res/tc_tma::quantized.txt | tail -8; echo stop; exit 0; }
t 90 expert_scale::glu_epilogues
b() { # name mode preset format tokens
  MOEKIT_TC_TMA=$2 timeout 60 $N bench --device cuda --dtype bf16 --min-time 0.05 --preset $3 --format $4 --tokens $5 > $res/b_$1_$2.txt 2>&1
  echo "tma=$2 $3: $(row $res/b_$1_$2.txt) ($(( $(date +%s) - t0 )) s)"; save
}
for mode in 0 1; do
  b q3 $mode qwen3-30b-a3b affine4-g64,q4_k,q8_0,q4_0,q6_k 4096
  b go $mode gpt-oss-20b bf16,affine4-g64 4096
  b ds $mode deepseek-v2-lite affine4-g64 4096
done
b q3s all qwen3-30b-a3b affine4-g64,q4_k,q8_0 512
b q3s 0 qwen3-30b-a3b affine4-g64,q4_k,q8_0 512
b mx 1 mixtral-8x7b affine4-g64,q4_k 4096
b mx 0 mixtral-8x7b affine4-g64,q4_k 4096
echo "all $(( $(date +%s) - t0 )) s"
