#!/usr/bin/env bash
# Fifth call: tc_tma with the quad-transposed 16-byte epilogue stores (the
# idle-warpgroup skip of run4 reverted). Tests (tc_tma::, and the block tests
# with MOEKIT_TC_TMA=all so every dense block runs it), sanitizers, A/B
# against the staged kernel, then the bf16 table of every preset beside
# torch._grouped_mm (graph) in the same call.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; for b in moekit gt; do xz -dc gpu-bundle/xz/$b.xz > /tmp/bin/$b; done; chmod +x /tmp/bin/*
N=/tmp/bin/moekit; export MOEKIT_CACHE_DIR=/tmp/kc
save() { tar czf "$out/res.tgz" -C $res .; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s (%s) | ", $1, $2, $9*1000, $12}'; echo; }
timeout 150 /tmp/bin/gt --test-threads=1 tc_tma:: > $res/tests.txt 2>&1; echo "tests rc=$? $(grep -E "test result|panicked|FAILED|failed" $res/tests.txt | head -8 | tr '\n' '|') ($(( $(date +%s) - t0 )) s)"; save
grep -q "test result: ok" $res/tests.txt || { echo stop; exit 0; }
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 3 /tmp/bin/gt --test-threads=1 tc_tma::sanitizer_sweep tc_tma::bad_offsets > $res/san_$tool.txt 2>&1
  echo "$tool rc=$? $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" $res/san_$tool.txt | tr '\n' '|') ($(( $(date +%s) - t0 )) s)"; save
done
MOEKIT_TC_TMA=all timeout 200 /tmp/bin/gt --test-threads=1 tc::block moe:: expert_scale::scaled_blocks > $res/tests_all.txt 2>&1; echo "block tests (TMA=all) rc=$? $(grep -E "test result|panicked|FAILED|failed" $res/tests_all.txt | head -8 | tr '\n' '|') ($(( $(date +%s) - t0 )) s)"; save
for r in 1 2; do
  for mode in 0 1; do
    for pre in qwen3-30b-a3b mixtral-8x7b deepseek-v2-lite; do
      MOEKIT_TC_TMA=$mode timeout 60 $N bench --device cuda --dtype bf16 --min-time 0.05 --preset $pre --format bf16 --tokens 512,4096 > $res/b_${pre}_${mode}_$r.txt 2>&1
      echo "r$r tma=$mode $pre: $(row $res/b_${pre}_${mode}_$r.txt) ($(( $(date +%s) - t0 )) s)"; save
    done
  done
done
for pre in qwen3-30b-a3b mixtral-8x7b deepseek-v2-lite gpt-oss-20b qwen3-next-80b; do
  timeout 90 $N bench --device cuda --dtype bf16 --min-time 0.05 --preset $pre --format bf16 --tokens 16,64,512,4096 --json $res/t_$pre.json > $res/t_$pre.txt 2>&1
  timeout 60 python3 bench/peers/torch_moe.py --preset $pre --tokens 16,64,512,4096 --impl grouped_mm --modes graph > $res/torch_$pre.txt 2>&1
  echo "$pre: $(row $res/t_$pre.txt) torch: $(grep -E "grouped_mm" $res/torch_$pre.txt | tr -s ' ' | head -4 | tr '\n' '|') ($(( $(date +%s) - t0 )) s)"; save
done
echo "all $(( $(date +%s) - t0 )) s"
