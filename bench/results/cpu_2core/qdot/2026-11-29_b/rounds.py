#!/usr/bin/env python3
"""Alternating rounds of `moekit bench` for two (or more) binaries, each
run only when the machine is quiet, with the other processes' CPU share
recorded per run.

    rounds.py OUT ROUNDS NAME=BIN [NAME=BIN ...]

Env: FORMATS, TOKENS [1,8], THREADS [2], MIN_TIME [0.4], QUIET_PCT [10]
(busy % of all CPUs over 2 s, other processes, below which a run starts),
QUIET_WAIT [600] (s to wait for it), BUSY_PCT [10] (a run during which
other processes took more is redone), RETRIES [3].
Writes OUT/<name>_t<threads>_r<round>.json and OUT/runs.txt.
"""
import json, os, resource, subprocess, sys, time

def jiffies():
    with open("/proc/stat") as f:
        v = list(map(int, f.readline().split()[1:9]))
    return sum(v), v[3] + v[4]

def busy(dt=2.0):
    t0, i0 = jiffies(); time.sleep(dt); t1, i1 = jiffies()
    return 100.0 * ((t1 - t0) - (i1 - i0)) / max(t1 - t0, 1)

def main():
    out, rounds, bins = sys.argv[1], int(sys.argv[2]), [a.split("=", 1) for a in sys.argv[3:]]
    os.makedirs(out, exist_ok=True)
    env = os.environ
    formats = env.get("FORMATS", "q4_k,q3_k,affine3-g64,affine2-g64,affine5-g64,affine6-g64,mlx-mxfp8,fp8-b128")
    tokens, min_time = env.get("TOKENS", "1,8"), env.get("MIN_TIME", "0.4")
    threads = env.get("THREADS", "2").split()
    quiet, wait = float(env.get("QUIET_PCT", 10)), float(env.get("QUIET_WAIT", 600))
    busy_pct, retries = float(env.get("BUSY_PCT", 10)), int(env.get("RETRIES", 3))
    hz, ncpu = os.sysconf("SC_CLK_TCK"), os.cpu_count()
    log = open(os.path.join(out, "runs.txt"), "a")
    for r in range(rounds):
        for th in threads:
            for name, binp in bins:
                for attempt in range(retries + 1):
                    t0 = time.time(); b = busy()
                    while b >= quiet and time.time() - t0 < wait:
                        time.sleep(3); b = busy()
                    js = os.path.join(out, f"{name}_t{th}_r{r}.json")
                    cmd = [binp, "bench", "--device", "cpu", "--preset", "qwen3-30b-a3b",
                           "--format", formats, "--tokens", tokens, "--min-time", min_time, "--json", js]
                    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    (j0, i0), w0 = jiffies(), time.time()
                    p = subprocess.run(cmd, env=dict(env, RAYON_NUM_THREADS=th), capture_output=True, text=True)
                    (j1, i1), w1 = jiffies(), time.time()
                    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    own = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
                    total_busy = ((j1 - j0) - (i1 - i0)) / hz
                    other = max(total_busy - own, 0.0) / ((w1 - w0) * ncpu) * 100
                    line = (f"{time.strftime('%H:%M:%S', time.gmtime())} round {r} {name} threads {th} "
                            f"busy-before {b:.0f}% other-during {other:.1f}% rc {p.returncode} attempt {attempt}")
                    print(line, flush=True); log.write(line + "\n"); log.flush()
                    with open(os.path.join(out, f"{name}_t{th}_r{r}.txt"), "w") as f:
                        f.write(line + "\n" + p.stdout + p.stderr)
                    if p.returncode == 0:
                        with open(js) as f:
                            d = json.load(f)
                        d["other_pct"] = other; d["busy_before_pct"] = b
                        with open(js, "w") as f:
                            json.dump(d, f)
                    if other <= busy_pct:
                        break

if __name__ == "__main__":
    main()
