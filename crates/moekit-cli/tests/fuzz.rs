//! Mutation fuzz test of the `moekit` binary: every fixture checkpoint (GGUF
//! files, safetensors directories with their `config.json` and
//! `model.safetensors.index.json`) and input `.npy` is mutated by a seeded,
//! deterministic mutator (`fuzz/mutate.rs`), and `moekit inspect` and
//! `moekit run` are run on the result as subprocesses. A case fails on a
//! panic (exit 101 or "panicked" in stderr), an abort or signal, a hang (no
//! exit within the timeout), an exit code other than 0 and 1, or an error
//! that is not one `moekit: error: ...` line.
//!
//! CI runs 2,000 cases (about 4,000 processes). Longer local runs:
//!
//! ```text
//! MOEKIT_FUZZ_ITERS=100000 MOEKIT_FUZZ_SEED=7 cargo test -p moekit-cli --test fuzz -- --nocapture
//! ```
//!
//! Other knobs: `MOEKIT_FUZZ_CASE=<iter>` replays one case,
//! `MOEKIT_FUZZ_THREADS`, `MOEKIT_FUZZ_TIMEOUT_MS` (default 5000). A failing
//! case's inputs are kept under `target/fuzz-failures/seed-<s>-iter-<i>/` and
//! the report prints the command that reproduces it.

#[path = "fuzz/mutate.rs"]
mod mutate;

use mutate::Rng;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const DEFAULT_SEED: u64 = 0x6d6f_656b_6974;
const DEFAULT_ITERS: u64 = 2000;
/// Address-space limit of each `moekit` process.
const MEM_LIMIT_KB: u64 = 4 << 20;

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

fn root() -> PathBuf {
    let r = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    r.canonicalize().unwrap_or(r)
}

/// What a case starts from.
#[derive(Clone, Debug)]
enum Seed {
    /// A `.gguf` file.
    Gguf(PathBuf),
    /// A safetensors directory.
    St(PathBuf),
    /// An input `.npy` and the model it feeds (with its MoE layer, if fixed).
    Npy {
        x: PathBuf,
        model: PathBuf,
        layer: Option<usize>,
    },
}

fn seeds() -> Vec<Seed> {
    let fx = root().join("fixtures");
    let mut out = Vec::new();
    let mut names: Vec<PathBuf> = std::fs::read_dir(fx.join("gguf"))
        .expect("fixtures/gguf")
        .map(|e| e.expect("dir entry").path())
        .collect();
    names.sort();
    for p in &names {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if let Some(stem) = name.strip_suffix(".gguf") {
            out.push(Seed::Gguf(p.clone()));
            let x = fx.join("gguf").join(format!("{stem}_x.npy"));
            if x.is_file() {
                out.push(Seed::Npy {
                    x,
                    model: p.clone(),
                    layer: None,
                });
            }
        }
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(fx.join("st"))
        .expect("fixtures/st")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    for d in dirs {
        out.push(Seed::St(d.clone()));
        let meta: serde_json::Value = serde_json::from_slice(
            &std::fs::read(d.join("meta.json")).expect("meta.json of an st fixture"),
        )
        .expect("meta.json is JSON");
        out.push(Seed::Npy {
            x: d.join("x.npy"),
            model: d.clone(),
            layer: meta["layer"].as_u64().map(|l| l as usize),
        });
    }
    out
}

/// A mutated input written under `dir`, and the commands to run on it.
struct Built {
    desc: String,
    commands: Vec<Vec<String>>,
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn model_commands(model: &Path, r: &mut Rng) -> Vec<Vec<String>> {
    let mut run = vec![
        "run".to_string(),
        "--model".into(),
        s(model),
        "--tokens".into(),
        "2".into(),
        "--device".into(),
        "cpu".into(),
    ];
    if r.chance(25) {
        run.extend(["--layer".into(), r.below(3).to_string()]);
    }
    if r.chance(20) {
        run.extend(["--dtype".into(), r.pick(&["f16", "bf16"]).to_string()]);
    }
    vec![vec!["inspect".into(), s(model)], run]
}

/// Applies 1–3 mutations of the kind that fits `name` to `b`.
fn mutate_file(r: &mut Rng, name: &str, b: &mut Vec<u8>) -> String {
    let n = 1 + usize::from(r.chance(30)) + usize::from(r.chance(10));
    let mut what = Vec::new();
    for _ in 0..n {
        let structured = r.chance(75);
        let d = if !structured {
            None
        } else if name.ends_with(".gguf") {
            let fields = mutate::gguf_fields(b);
            mutate::field(r, b, &fields, "gguf")
        } else if name.ends_with(".safetensors") {
            mutate::safetensors(r, b)
        } else if name.ends_with(".json") {
            serde_json::from_slice::<serde_json::Value>(b)
                .ok()
                .map(|mut v| {
                    let d = mutate::json_value(r, &mut v, "JSON");
                    *b = serde_json::to_vec_pretty(&v).unwrap_or_default();
                    d
                })
        } else if name.ends_with(".npy") {
            mutate::npy(r, b)
        } else {
            None
        };
        what.push(d.unwrap_or_else(|| mutate::bytes(r, b)));
    }
    format!("{name}: {}", what.join("; "))
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn build(seed: &Seed, r: &mut Rng, dir: &Path) -> Built {
    std::fs::create_dir_all(dir).expect("case dir");
    match seed {
        Seed::Gguf(p) => {
            let mut b = read(p);
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            let name = name.unwrap_or_default();
            let desc = mutate_file(r, &name, &mut b);
            let out = dir.join(&name);
            std::fs::write(&out, &b).expect("write case");
            Built {
                desc,
                commands: model_commands(&out, r),
            }
        }
        Seed::St(d) => {
            let mut files: Vec<String> = std::fs::read_dir(d)
                .expect("st fixture")
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.ends_with(".safetensors") || n.ends_with(".json"))
                .filter(|n| n != "meta.json")
                .collect();
            files.sort();
            let target = r.pick(&files).clone();
            let out = dir.join("ckpt");
            std::fs::create_dir_all(&out).expect("case ckpt dir");
            let mut desc = String::new();
            for f in &files {
                if *f == target {
                    let mut b = read(&d.join(f));
                    desc = mutate_file(r, f, &mut b);
                    std::fs::write(out.join(f), &b).expect("write case");
                } else {
                    link_or_copy(&d.join(f), &out.join(f));
                }
            }
            Built {
                desc: format!(
                    "{}/{desc}",
                    d.file_name().unwrap_or_default().to_string_lossy()
                ),
                commands: model_commands(&out, r),
            }
        }
        Seed::Npy { x, model, layer } => {
            let mut b = read(x);
            let desc = mutate_file(r, "x.npy", &mut b);
            let out = dir.join("x.npy");
            std::fs::write(&out, &b).expect("write case");
            let mut run = vec![
                "run".to_string(),
                "--model".into(),
                s(model),
                "--input".into(),
                s(&out),
                "--device".into(),
                "cpu".into(),
            ];
            if let Some(l) = layer {
                run.extend(["--layer".into(), l.to_string()]);
            }
            Built {
                desc: format!("input for {}: {desc}", s(model)),
                commands: vec![run],
            }
        }
    }
}

fn link_or_copy(from: &Path, to: &Path) {
    #[cfg(unix)]
    if let Ok(abs) = from.canonicalize() {
        if std::os::unix::fs::symlink(abs, to).is_ok() {
            return;
        }
    }
    std::fs::copy(from, to).expect("copy fixture file");
}

/// How one process ended.
enum Outcome {
    /// Exit 0.
    Ok,
    /// Exit 1 with one error line (kept for the optional sample).
    Error(String),
    Fail(String),
}

fn run_one(args: &[String], dir: &Path, timeout: Duration) -> Outcome {
    let err_path = dir.join("stderr.txt");
    let err = std::fs::File::create(&err_path).expect("stderr file");
    // Under a 4 GiB address-space limit, so an allocation sized by a corrupt
    // header fails (an abort, which fails the case) instead of succeeding.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v {} 2>/dev/null; exec \"$0\" \"$@\"",
            MEM_LIMIT_KB
        ))
        .arg(env!("CARGO_BIN_EXE_moekit"))
        .args(args)
        .env("RAYON_NUM_THREADS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .expect("spawn moekit");
    let t0 = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if t0.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Outcome::Fail(format!("hang: no exit within {timeout:?} (killed)"));
            }
            Ok(None) => std::thread::sleep(Duration::from_micros(500)),
            Err(e) => return Outcome::Fail(format!("wait failed: {e}")),
        }
    };
    let stderr =
        String::from_utf8_lossy(&std::fs::read(&err_path).unwrap_or_default()).into_owned();
    let tail: String = stderr
        .chars()
        .rev()
        .take(2000)
        .collect::<String>()
        .chars()
        .rev()
        .collect();
    let Some(code) = status.code() else {
        return Outcome::Fail(format!("killed by a signal ({status}); stderr: {tail}"));
    };
    if code == 101 || stderr.contains("panicked") {
        return Outcome::Fail(format!("panic (exit {code}); stderr: {tail}"));
    }
    match code {
        0 => Outcome::Ok,
        1 => {
            let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
            let at = lines.iter().position(|l| l.starts_with("moekit: error: "));
            match at {
                Some(i) if i + 1 == lines.len() => Outcome::Error(lines[i].to_string()),
                Some(_) => Outcome::Fail(format!("error message is not one line: {tail}")),
                None => Outcome::Fail(format!("exit 1 without `moekit: error:`: {tail}")),
            }
        }
        c => Outcome::Fail(format!("exit code {c}; stderr: {tail}")),
    }
}

struct Failure {
    iter: u64,
    desc: String,
    command: String,
    why: String,
    kept: PathBuf,
}

#[test]
fn mutated_fixtures_never_crash_or_hang() {
    let seed = env_u64("MOEKIT_FUZZ_SEED").unwrap_or(DEFAULT_SEED);
    let (first, iters) = match env_u64("MOEKIT_FUZZ_CASE") {
        Some(i) => (i, 1),
        None => (0, env_u64("MOEKIT_FUZZ_ITERS").unwrap_or(DEFAULT_ITERS)),
    };
    let timeout = Duration::from_millis(env_u64("MOEKIT_FUZZ_TIMEOUT_MS").unwrap_or(5000));
    let threads = env_u64("MOEKIT_FUZZ_THREADS").map_or_else(
        || {
            std::thread::available_parallelism()
                .map_or(2, |n| n.get())
                .clamp(2, 16)
        },
        |n| n.max(1) as usize,
    );
    let seeds = seeds();
    assert!(
        seeds.len() >= 30,
        "found only {} fixture seeds",
        seeds.len()
    );
    let work = std::env::temp_dir().join(format!("moekit-fuzz-{}", std::process::id()));
    let keep = root().join("target/fuzz-failures");
    let next = AtomicU64::new(first);
    let processes = AtomicUsize::new(0);
    let exit0 = AtomicUsize::new(0);
    let verbose = std::env::var_os("MOEKIT_FUZZ_VERBOSE").is_some();
    let failures: Mutex<Vec<Failure>> = Mutex::new(Vec::new());
    let t0 = Instant::now();
    std::thread::scope(|sc| {
        for _ in 0..threads {
            sc.spawn(|| loop {
                let iter = next.fetch_add(1, Ordering::Relaxed);
                if iter >= first + iters {
                    break;
                }
                let mut r = Rng::for_case(seed, iter);
                let s = &seeds[(r.next() % seeds.len() as u64) as usize];
                let dir = work.join(format!("case-{iter}"));
                let built = build(s, &mut r, &dir);
                let mut failed = false;
                for cmd in &built.commands {
                    processes.fetch_add(1, Ordering::Relaxed);
                    let why = match run_one(cmd, &dir, timeout) {
                        Outcome::Ok => {
                            exit0.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        Outcome::Error(line) => {
                            if verbose {
                                println!("iter {iter}: {} → {line}", built.desc);
                            }
                            continue;
                        }
                        Outcome::Fail(why) => why,
                    };
                    {
                        let kept = keep.join(format!("seed-{seed}-iter-{iter}"));
                        let _ = std::fs::remove_dir_all(&kept);
                        let _ = std::fs::create_dir_all(&keep);
                        if std::fs::rename(&dir, &kept).is_err() {
                            let _ = copy_dir(&dir, &kept);
                        }
                        let command =
                            format!("moekit {}", cmd.join(" ")).replace(&s_of(&dir), &s_of(&kept));
                        failures.lock().expect("lock").push(Failure {
                            iter,
                            desc: built.desc.clone(),
                            command,
                            why,
                            kept,
                        });
                        failed = true;
                        break;
                    }
                }
                if !failed {
                    let _ = std::fs::remove_dir_all(&dir);
                }
            });
        }
    });
    let _ = std::fs::remove_dir_all(&work);
    let secs = t0.elapsed().as_secs_f64();
    let n = processes.load(Ordering::Relaxed);
    println!(
        "fuzz: seed {seed:#x}, {iters} cases, {n} processes ({} exited 0, the rest with an error) in {secs:.1} s ({:.0} cases/s) on {threads} threads",
        exit0.load(Ordering::Relaxed),
        iters as f64 / secs
    );
    let mut f = failures.into_inner().expect("lock");
    f.sort_by_key(|x| x.iter);
    if !f.is_empty() {
        let mut msg = format!(
            "{} of {iters} fuzz cases failed (seed {seed:#x}):\n",
            f.len()
        );
        for x in f.iter().take(20) {
            msg += &format!(
                "\n* iter {} — {}\n  mutation: {}\n  reproduce: {}\n  (or MOEKIT_FUZZ_SEED={seed} MOEKIT_FUZZ_CASE={} cargo test -p moekit-cli --test fuzz)\n  kept in {}\n",
                x.iter,
                x.why,
                x.desc,
                x.command,
                x.iter,
                x.kept.display()
            );
        }
        panic!("{msg}");
    }
}

fn s_of(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let dst = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &dst)?;
        } else {
            std::fs::copy(e.path(), dst)?;
        }
    }
    Ok(())
}
