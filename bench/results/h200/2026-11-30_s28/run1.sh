#!/usr/bin/env bash
# The grouped GEMMs' tile order: MOEKIT_TC_ORDER=0 (a row tile's column
# blocks side by side, as before) vs 1 (an expert's row tiles side by side
# for each column block: the default now), same binary, alternated; ncu
# DRAM bytes of Mixtral's bf16 GEMMs in both orders; the GEMM GPU tests in
# the new order; torch._grouped_mm at T = 4096 in the same call.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; for b in moekit gt; do xz -dc gpu-bundle/xz/$b.xz > /tmp/bin/$b; done; chmod +x /tmp/bin/*
N=/tmp/bin/moekit; export MOEKIT_CACHE_DIR=/tmp/kc; mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/xz/kcache.tar.xz -C $MOEKIT_CACHE_DIR
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
save() { tar czf "$out/res.tgz" -C $res .; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s (%s) | ", $1, $2, $9*1000, $12}'; echo; }
b() { timeout 120 $N bench --device cuda --dtype bf16 --min-time 0.05 "$@"; }
for r in 1 2; do
  for o in 0 1; do
    MOEKIT_TC_ORDER=$o b --preset mixtral-8x7b --format bf16,affine4,q4_k --tokens 4096 > $res/mx_o${o}_r$r.txt 2>&1
    echo "r$r order=$o mixtral: $(row $res/mx_o${o}_r$r.txt) ($(( $(date +%s) - t0 )) s)"
    MOEKIT_TC_ORDER=$o b --preset qwen3-30b-a3b --format bf16,affine4,q4_k --tokens 512,4096 > $res/q_o${o}_r$r.txt 2>&1
    echo "r$r order=$o qwen3: $(row $res/q_o${o}_r$r.txt) ($(( $(date +%s) - t0 )) s)"
    for pre in gpt-oss-20b deepseek-v2-lite; do
      MOEKIT_TC_ORDER=$o b --preset $pre --format bf16,affine4 --tokens 4096 > $res/${pre}_o${o}_r$r.txt 2>&1
      echo "r$r order=$o $pre: $(row $res/${pre}_o${o}_r$r.txt) ($(( $(date +%s) - t0 )) s)"
    done
    save
  done
done
for pre in mixtral-8x7b gpt-oss-20b; do
  timeout 90 python3 bench/peers/torch_moe.py --preset $pre --tokens 4096 --impl grouped_mm --modes graph > $res/torch_$pre.txt 2>&1
  echo "torch $pre: $(grep -E "grouped_mm" $res/torch_$pre.txt | tr -s ' ' | head -2 | tr '\n' '|')"
done
save
# DRAM bytes a GEMM kernel (ncu, one replay's kernels), both orders.
for o in 0 1; do
  MOEKIT_TC_ORDER=$o timeout 150 ncu --graph-profiling node --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sectors.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
    -k regex:tc_ --csv $N bench --device cuda --dtype bf16 --min-time 0 --preset mixtral-8x7b --format bf16 --tokens 4096 > $res/ncu_o$o.csv 2>&1
  echo "ncu order=$o: $(grep -c tc_ $res/ncu_o$o.csv) rows ($(( $(date +%s) - t0 )) s)"
  python3 - $res/ncu_o$o.csv <<'PY'
import csv,sys,collections
rows=[r for r in csv.reader(open(sys.argv[1])) if len(r)>=15 and r[0].isdigit()]
agg=collections.OrderedDict()
for r in rows:
    k=r[4][:60]; agg.setdefault(k,collections.defaultdict(list))[r[12]].append(r[14])
for k,m in agg.items():
    print(' ', k, {n.split('.')[0][-25:]: v[len(v)//2] for n,v in m.items()})
PY
  save
done
summ() { grep -E "^test .* FAILED$|test result|panicked at" "$1" | head -12; }
timeout 240 /tmp/bin/gt --test-threads=1 tc_tma:: tc_ra:: tc:: > $res/tests.txt 2>&1; echo "tests rc=$? ($(( $(date +%s) - t0 )) s)"; summ $res/tests.txt; save
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 3 /tmp/bin/gt --test-threads=1 tc_tma::sanitizer_sweep > $res/san_memcheck.txt 2>&1
echo "memcheck rc=$? $(grep -E "ERROR SUMMARY|test result" $res/san_memcheck.txt | tr '\n' '|')"
save
echo "all $(( $(date +%s) - t0 )) s"
