#!/usr/bin/env bash
# The final tree: gpt-oss-20b's gate/up on tc_tma by default (its GLU
# epilogue), beside torch._grouped_mm in the same call; the GLU block tests.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; for b in moekit gt; do xz -dc gpu-bundle/xz/$b.xz > /tmp/bin/$b; done; chmod +x /tmp/bin/*
export MOEKIT_CACHE_DIR=/tmp/kc; mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/xz/kcache.tar.xz -C $MOEKIT_CACHE_DIR
save() { tar czf "$out/res.tgz" -C $res .; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s (%s) | ", $1, $2, $9*1000, $12}'; echo; }
summ() { grep -E "^test .* FAILED$|test result|panicked at" "$1" | head -12; }
for r in 1 2; do
  timeout 60 /tmp/bin/moekit bench --device cuda --dtype bf16 --min-time 0.05 --preset gpt-oss-20b --format bf16 --tokens 512,4096 --json $res/go_$r.json > $res/go_$r.txt 2>&1
  echo "r$r gpt-oss: $(row $res/go_$r.txt) ($(( $(date +%s) - t0 )) s)"
done
timeout 60 python3 bench/peers/torch_moe.py --preset gpt-oss-20b --tokens 512,4096 --impl grouped_mm --modes graph > $res/torch_go.txt 2>&1
echo "torch gpt-oss: $(grep -E "grouped_mm graph" $res/torch_go.txt | tr -s ' ' | tr '\n' '|')"; save
timeout 150 /tmp/bin/gt --test-threads=1 expert_scale:: > $res/tests_es.txt 2>&1; echo "expert_scale:: rc=$? ($(( $(date +%s) - t0 )) s)"; summ $res/tests_es.txt
save; echo "all $(( $(date +%s) - t0 )) s"
