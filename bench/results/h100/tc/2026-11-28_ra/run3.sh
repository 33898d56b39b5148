#!/usr/bin/env bash
out=$1; shift
mkdir -p $out
export MOEKIT_CACHE_DIR=/tmp/moekit-kernels
mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/kcache.tar.xz -C $MOEKIT_CACHE_DIR
( bash gpu-bundle/run.sh tc_ra:: tc::block_is 2>&1 | grep -E "^test |test result|panicked|NMSE" ;
  SANITIZE=1 bash gpu-bundle/run.sh tc_ra::sanitizer_sweep 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result|== compute" ) > $out/tests.txt 2>&1
cat $out/tests.txt
F=q4_0,q6_k,affine8,affine3,iq4_xs,affine2,q5_k,q3_k,mxfp4,fp8-b128,q8_0,affine4,q4_k
for v in 0 all; do
  MOEKIT_TC_RA=$v gpu-bundle/moekit bench --device cuda --dtype bf16 --preset qwen3-30b-a3b --format $F --tokens 16,64,512,4096 --path tc --min-time 0.05 > $out/bench_$v.txt 2>&1
done
python3 - $out <<'PY'
import sys,collections
d=collections.defaultdict(dict)
for v in ("0","all"):
    for l in open(sys.argv[1]+'/bench_%s.txt'%v):
        w=l.split()
        if len(w)>12 and w[1].isdigit():
            d[(w[0],int(w[1]))][v]=(float(w[8]),w[-1])
print("format T staged_graph_ms ra_graph_ms ratio")
for k in sorted(d):
    a=d[k].get("0",(0,''))[0]; b=d[k].get("all",(0,''))[0]
    print(k[0],k[1],a,b,"%.3f"%(b/a if a else 0))
PY
for p in decode tc; do
  gpu-bundle/moekit bench --device cuda --dtype bf16 --preset qwen3-30b-a3b --format affine4,q4_k,q4_0,q6_k,q8_0 --tokens 8,12,16,24,32 --path $p --min-time 0.05 > $out/cross_$p.txt 2>&1
done
paste <(grep -E "^[a-z0-9_-]+ +[0-9]+ " $out/cross_decode.txt | awk '{print $1,$2,$9}') <(grep -E "^[a-z0-9_-]+ +[0-9]+ " $out/cross_tc.txt | awk '{print $9}')
