//! End-to-end tests of the `moekit` binary on the committed fixture
//! checkpoints (GGUF written by gguf-py's GGUFWriter; safetensors written by
//! mlx-lm's own save functions) against their reference outputs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// f32 math on both sides (reference in float64): NMSE ≤ 1e-8, with the CPU
/// path's f32 activations (`MOEKIT_CPU_ACT=f32`).
const NMSE_BOUND: f64 = 1e-8;
/// The default CPU activations (8-bit blocks and integer kernels for the
/// formats that have them): NMSE ≤ 1e-4.
const NMSE_BOUND_Q8: f64 = 1e-4;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn moekit(args: &[&str]) -> Output {
    moekit_with(args, None)
}

/// `moekit args` with `MOEKIT_CPU_ACT=act` (unset for `None`).
fn moekit_with(args: &[&str], act: Option<&str>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_moekit"));
    c.args(args).env_remove("MOEKIT_CPU_ACT");
    if let Some(act) = act {
        c.env("MOEKIT_CPU_ACT", act);
    }
    c.output().expect("run moekit")
}

fn npy_f32(p: &Path) -> Vec<f32> {
    moekit::npy::NpyArray::read(p).unwrap().to_f32().unwrap()
}

fn nmse(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|&y| (y as f64).powi(2)).sum();
    num / den
}

/// Runs a fixture with the f32 activations (NMSE ≤ [`NMSE_BOUND`]) and the
/// default ones (≤ [`NMSE_BOUND_Q8`]); the f32 run's NMSE.
fn run_case(model: &Path, layer: usize, x: &Path, want: &Path, tag: &str) -> f64 {
    run_case_act(model, layer, x, want, tag, None);
    run_case_act(model, layer, x, want, tag, Some("f32"))
}

fn run_case_act(
    model: &Path,
    layer: usize,
    x: &Path,
    want: &Path,
    tag: &str,
    act: Option<&str>,
) -> f64 {
    let out = std::env::temp_dir().join(format!(
        "moekit-cli-{}-{}-{}.npy",
        std::process::id(),
        tag.replace('/', "_"),
        act.unwrap_or("default")
    ));
    let o = moekit_with(
        &[
            "run",
            "--model",
            model.to_str().unwrap(),
            "--layer",
            &layer.to_string(),
            "--input",
            x.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
            "--device",
            "cpu",
        ],
        act,
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{tag}: {}\n{stdout}",
        String::from_utf8_lossy(&o.stderr)
    );
    for key in [
        "architecture",
        "formats",
        "experts",
        "tokens",
        "device       cpu",
        "time",
    ] {
        assert!(stdout.contains(key), "{tag}: output lacks {key}:\n{stdout}");
    }
    let e = nmse(&npy_f32(&out), &npy_f32(want));
    let _ = std::fs::remove_file(out);
    let (act, bound) = act.map_or(("default", NMSE_BOUND_Q8), |a| (a, NMSE_BOUND));
    println!("{tag:<32} layer {layer} ({act} activations): NMSE {e:.2e}");
    assert!(
        e <= bound,
        "{tag} ({act} activations): NMSE {e:e} > {bound:e}"
    );
    e
}

#[test]
fn run_matches_every_gguf_fixture() {
    let dir = root().join("fixtures/gguf");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        let Some(stem) = name.strip_suffix(".npy") else {
            continue;
        };
        let Some((model, layer)) = stem.rsplit_once("_out_") else {
            continue;
        };
        let layer: usize = layer.parse().unwrap();
        run_case(
            &dir.join(format!("{model}.gguf")),
            layer,
            &dir.join(format!("{model}_x.npy")),
            &dir.join(&name),
            &format!("gguf/{model}"),
        );
        n += 1;
    }
    assert!(n >= 10, "expected ≥ 10 GGUF reference outputs, found {n}");
}

#[test]
fn run_matches_every_safetensors_fixture() {
    let dir = root().join("fixtures/st");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let case = entry.unwrap().path();
        if !case.join("meta.json").exists() {
            continue;
        }
        let meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(case.join("meta.json")).unwrap())
                .unwrap();
        let layer = meta["layer"].as_u64().unwrap() as usize;
        let tag = format!("st/{}", case.file_name().unwrap().to_string_lossy());
        run_case(
            &case,
            layer,
            &case.join("x.npy"),
            &case.join("out.npy"),
            &tag,
        );
        n += 1;
    }
    assert!(n >= 10, "expected ≥ 10 safetensors cases, found {n}");
}

#[test]
fn inspect_lists_every_fixture() {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(root().join("fixtures/gguf"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "gguf") && !p.ends_with("metadata_types.gguf")
        })
        .collect();
    paths.extend(
        std::fs::read_dir(root().join("fixtures/st"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.join("config.json").exists()),
    );
    assert!(paths.len() >= 20);
    for p in paths {
        let o = moekit(&["inspect", p.to_str().unwrap()]);
        let s = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{}: {}",
            p.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            s.contains("architecture") && s.contains("tensors") && s.contains("experts"),
            "{s}"
        );
    }
}

/// Byte offset of the ggml type id in the GGUF tensor info of `name`.
fn type_id_offset(bytes: &[u8], name: &str) -> usize {
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend_from_slice(name.as_bytes());
    let at = bytes
        .windows(key.len())
        .position(|w| w == key.as_slice())
        .expect("tensor info");
    let dims_at = at + key.len();
    let n_dims = u32::from_le_bytes(bytes[dims_at..dims_at + 4].try_into().unwrap()) as usize;
    dims_at + 4 + 8 * n_dims
}

#[test]
fn inspect_says_whether_the_moe_layers_run_and_names_what_stops_them() {
    let iq = root().join("fixtures/gguf/qwen3moe_iq4_mxfp4.gguf");
    let o = moekit(&["inspect", iq.to_str().unwrap()]);
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(s.contains("runnable     yes (every MoE layer: 1)"), "{s}");
    for ty in ["iq4_nl", "iq4_xs", "mxfp4"] {
        assert!(s.contains(&format!(" {ty} ")), "{ty}: {s}");
    }

    // q8_0 bytes relabelled q1_0 (not supported yet; fewer bytes, so the
    // file stays valid), or nvfp4 (supported: the layer runs).
    // The `runnable` line and the per-layer lines under it.
    let inspect_relabelled = |file: &str, tensor: &str, id: u32| {
        let mut b = std::fs::read(root().join("fixtures/gguf").join(file)).unwrap();
        let at = type_id_offset(&b, tensor);
        assert_eq!(b[at..at + 4], 8u32.to_le_bytes(), "q8_0");
        b[at..at + 4].copy_from_slice(&id.to_le_bytes());
        let p = std::env::temp_dir().join(format!("moekit-cli-{id}-{}.gguf", std::process::id()));
        std::fs::write(&p, &b).unwrap();
        let o = moekit(&["inspect", p.to_str().unwrap()]);
        let _ = std::fs::remove_file(&p);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let s = String::from_utf8_lossy(&o.stdout).into_owned();
        s.lines()
            .skip_while(|l| !l.starts_with("runnable"))
            .take_while(|l| !l.starts_with("tensors"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let lines = inspect_relabelled("glm4moe_q8_0.gguf", "blk.1.ffn_up_exps.weight", 41);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].contains("no (1 of 1 MoE layers)"), "{lines:?}");
    assert!(
        lines[1].starts_with("  block 1 ")
            && lines[1].contains(" no: ")
            && lines[1].contains("blk.1.ffn_up_exps.weight")
            && lines[1].contains("q1_0"),
        "{lines:?}"
    );
    let lines = inspect_relabelled("glm4moe_q8_0.gguf", "blk.1.ffn_up_exps.weight", 40);
    assert_eq!(
        lines,
        ["runnable     yes (every MoE layer: 1)"],
        "{lines:?}"
    );
    // Two MoE layers, the first stopped by one expert's tensor: a line each.
    let lines = inspect_relabelled("mixtral_per_expert.gguf", "blk.0.ffn_up.1.weight", 41);
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines[0].contains("no (1 of 2 MoE layers)"), "{lines:?}");
    assert!(
        lines[1].starts_with("  block 0 ")
            && lines[1].contains("blk.0.ffn_up.1.weight")
            && lines[1].contains("q1_0"),
        "{lines:?}"
    );
    assert!(
        lines[2].starts_with("  block 1 ") && lines[2].ends_with(" yes"),
        "{lines:?}"
    );

    // Per-expert ffn_{gate,up,down}_exps.scale tensors (NVFP4 GGUFs): runnable.
    let sc = root().join("fixtures/gguf/qwen2moe_nvfp4_scales.gguf");
    let o = moekit(&["inspect", sc.to_str().unwrap()]);
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(s.contains("runnable     yes (every MoE layer: 1)"), "{s}");
    assert!(s.contains("blk.0.ffn_gate_exps.scale"), "{s}");
}

#[test]
fn bad_input_gives_clear_errors_and_nonzero_exit() {
    let g = root().join("fixtures/gguf/deepseek2_v3.gguf");
    let gs = g.to_str().unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["run".into(), "--model".into(), "/nonexistent.gguf".into()],
            "/nonexistent.gguf",
        ),
        // Errors speak in the flags' words, not the library's type names.
        (
            vec!["bench".into(), "--format".into(), "foo".into()],
            "--format foo: expected",
        ),
        (
            vec![
                "run".into(),
                "--model".into(),
                gs.into(),
                "--layer".into(),
                "0".into(),
            ],
            "--layer 0: expected a block with an MoE layer",
        ),
        // Output paths are checked before the work.
        (
            vec![
                "run".into(),
                "--model".into(),
                gs.into(),
                "--output".into(),
                "/nonexistent-dir/out.npy".into(),
            ],
            "directory /nonexistent-dir does not exist",
        ),
        (
            vec![
                "bench".into(),
                "--device".into(),
                "cpu".into(),
                "--json".into(),
                "/nonexistent-dir/b.json".into(),
            ],
            "--json /nonexistent-dir/b.json",
        ),
        // --tokens means random rows: not with --input.
        (
            vec![
                "run".into(),
                "--model".into(),
                gs.into(),
                "--input".into(),
                "x.npy".into(),
                "--tokens".into(),
                "3".into(),
            ],
            "--tokens",
        ),
        // Token counts whose input cannot be allocated: an error, not an abort.
        (
            vec![
                "run".into(),
                "--model".into(),
                gs.into(),
                "--tokens".into(),
                "100000000000".into(),
            ],
            "--tokens 100000000000",
        ),
        (
            vec![
                "bench".into(),
                "--device".into(),
                "cpu".into(),
                "--tokens".into(),
                "1000000000".into(),
            ],
            "--tokens 1000000000",
        ),
        (
            vec![
                "run".into(),
                "--model".into(),
                gs.into(),
                "--layer".into(),
                "0".into(),
            ],
            "leading dense block",
        ),
        (
            vec![
                "run".into(),
                "--model".into(),
                gs.into(),
                "--layer".into(),
                "9".into(),
            ],
            "layer",
        ),
        (
            vec![
                "run".into(),
                "--model".into(),
                root().join("Cargo.toml").to_string_lossy().into(),
            ],
            "not a GGUF file",
        ),
        (
            vec![
                "inspect".into(),
                root().join("fixtures").to_string_lossy().into(),
            ],
            "config.json",
        ),
    ];
    for (args, needle) in cases {
        let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let o = moekit(&a);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{a:?} should fail");
        assert!(
            err.contains(needle),
            "{a:?}: stderr lacks {needle:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{a:?} panicked: {err}");
    }
    // Wrong input width.
    let narrow = std::env::temp_dir().join(format!("moekit-narrow-{}.npy", std::process::id()));
    moekit::npy::NpyArray::from_f32(&[0.5f32; 400], &[4, 100])
        .write(&narrow)
        .unwrap();
    let o = moekit(&["run", "--model", gs, "--input", narrow.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("shape [T, 256]"),
        "{err}"
    );
    let _ = std::fs::remove_file(narrow);
    // Non-finite input.
    let bad = std::env::temp_dir().join(format!("moekit-nan-{}.npy", std::process::id()));
    let mut v = vec![0.5f32; 4 * 256];
    v[300] = f32::NAN;
    moekit::npy::NpyArray::from_f32(&v, &[4, 256])
        .write(&bad)
        .unwrap();
    let o = moekit(&["run", "--model", gs, "--input", bad.to_str().unwrap()]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("not finite"));
    let _ = std::fs::remove_file(bad);
}

/// Writes a qwen3moe GGUF v3 of `layers` MoE layers with Q8_0 experts
/// (E × [I, H] gate/up, E × [H, I] down) and an f32 router. Every data byte
/// is written (no sparse holes, which would not count towards RSS if read):
/// a pattern of valid Q8_0 blocks / finite f32 values.
fn write_big_gguf(path: &Path, layers: usize, e: u64, h: u64, i: u64) -> u64 {
    fn s(b: &mut Vec<u8>, x: &str) {
        b.extend((x.len() as u64).to_le_bytes());
        b.extend(x.as_bytes());
    }
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    let q8 = |k: u64, n: u64| k / 32 * 34 * n * e;
    let per_layer = [
        ("ffn_gate_inp", 0u32, vec![h, e], h * e * 4),
        ("ffn_gate_exps", 8, vec![h, i, e], q8(h, i)),
        ("ffn_up_exps", 8, vec![h, i, e], q8(h, i)),
        ("ffn_down_exps", 8, vec![i, h, e], q8(i, h)),
    ];
    b.extend(((layers * 4) as u64).to_le_bytes());
    let kv: [(&str, u32); 5] = [
        ("qwen3moe.block_count", layers as u32),
        ("qwen3moe.embedding_length", h as u32),
        ("qwen3moe.expert_count", e as u32),
        ("qwen3moe.expert_used_count", 2),
        ("qwen3moe.expert_feed_forward_length", i as u32),
    ];
    b.extend(((kv.len() + 1) as u64).to_le_bytes());
    s(&mut b, "general.architecture");
    b.extend(8u32.to_le_bytes());
    s(&mut b, "qwen3moe");
    for (k, v) in kv {
        s(&mut b, k);
        b.extend(4u32.to_le_bytes());
        b.extend(v.to_le_bytes());
    }
    let mut off = 0u64;
    for l in 0..layers {
        for (name, ty, ne, bytes) in &per_layer {
            s(&mut b, &format!("blk.{l}.{name}.weight"));
            b.extend((ne.len() as u32).to_le_bytes());
            for d in ne {
                b.extend(d.to_le_bytes());
            }
            b.extend(ty.to_le_bytes());
            b.extend(off.to_le_bytes());
            off += bytes.div_ceil(32) * 32;
        }
    }
    while !b.len().is_multiple_of(32) {
        b.push(0);
    }
    let f = std::fs::File::create(path).unwrap();
    let mut w = std::io::BufWriter::new(f);
    std::io::Write::write_all(&mut w, &b).unwrap();
    // 0x2C00 as f16 is 0.0625: a valid scale and a finite f32 bit pattern alike.
    let chunk: Vec<u8> = (0..1 << 20)
        .map(|j| if j % 2 == 0 { 0x00 } else { 0x2C })
        .collect();
    let mut left = off as usize;
    while left > 0 {
        let n = left.min(chunk.len());
        std::io::Write::write_all(&mut w, &chunk[..n]).unwrap();
        left -= n;
    }
    std::io::Write::flush(&mut w).unwrap();
    per_layer.iter().map(|p| p.3).sum()
}

#[test]
fn loading_one_layer_touches_only_that_layer() {
    let path = std::env::temp_dir().join(format!("moekit-rss-{}.gguf", std::process::id()));
    let layer_bytes = write_big_gguf(&path, 10, 8, 1024, 1024);
    let o = moekit(&[
        "run",
        "--model",
        path.to_str().unwrap(),
        "--layer",
        "7",
        "--tokens",
        "64",
        "--device",
        "cpu",
    ]);
    let _ = std::fs::remove_file(&path);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let kb: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("memory       peak RSS "))
        .and_then(|r| r.trim_end_matches(" kB").parse().ok())
        .expect("peak RSS line");
    let limit_kb = 2 * layer_bytes / 1024 + 64 * 1024;
    println!(
        "layer {:.1} MB, file {:.1} MB, peak RSS {:.1} MB (limit {:.1} MB)",
        layer_bytes as f64 / 1e6,
        10.0 * layer_bytes as f64 / 1e6,
        kb as f64 / 1e3,
        limit_kb as f64 / 1e3
    );
    assert!(
        kb < limit_kb,
        "peak RSS {kb} kB ≥ 2 × layer + 64 MiB = {limit_kb} kB"
    );
}

/// A named pipe as the model is refused at once (opening it would block until
/// a writer appears), and a layer whose weights are NaN makes `run` fail
/// after writing its output, not exit 0.
#[test]
fn pipes_and_non_finite_outputs_are_errors() {
    let dir = std::env::temp_dir().join(format!("moekit-cli-special-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("model.gguf");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let o = moekit(&["run", "--model", fifo.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("not a regular file"),
        "{err}"
    );

    // NaN in every expert's down projection of an f32 fixture.
    let src = root().join("fixtures/gguf/qwen3moe_f32.gguf");
    let mut bytes = std::fs::read(&src).unwrap();
    let file = moekit::load::gguf::GgufFile::open(&src).unwrap();
    let t = file
        .tensors()
        .iter()
        .find(|t| t.name.ends_with("ffn_down_exps.weight"))
        .expect("a down projection");
    for w in bytes[t.start..t.start + t.nbytes].chunks_exact_mut(4) {
        w.copy_from_slice(&f32::NAN.to_le_bytes());
    }
    let bad = dir.join("nan.gguf");
    std::fs::write(&bad, &bytes).unwrap();
    let out = dir.join("out.npy");
    let o = moekit(&[
        "run",
        "--model",
        bad.to_str().unwrap(),
        "--device",
        "cpu",
        "--output",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("not finite"), "{err}");
    assert!(err.contains("--allow-non-finite"), "{err}");
    assert!(out.exists(), "the output is still written");
    // --allow-non-finite: a warning and exit 0; the summary counts them.
    let o = moekit(&[
        "run",
        "--model",
        bad.to_str().unwrap(),
        "--device",
        "cpu",
        "--allow-non-finite",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("moekit: warning:") && err.contains("not finite"),
        "{err}"
    );
    assert!(
        stdout.contains("not finite, left out of mean and RMS"),
        "{stdout}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The numbers after `name ` on the `output` line of `run`.
fn summary_field(stdout: &str, name: &str) -> String {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("output "))
        .unwrap_or_else(|| panic!("no output line:\n{stdout}"));
    let rest = &line[line.find(&format!("{name} ")).expect(name) + name.len() + 1..];
    rest.split([',', ' ']).next().unwrap().to_string()
}

/// Without `--output`, `run` prints the output's shape, mean, RMS and an
/// FNV-1a checksum; they are those of the array `--output` writes.
#[test]
fn run_prints_an_output_summary() {
    let fx = root().join("fixtures/gguf");
    let args = |extra: &[&str]| {
        let mut v = vec![
            "run".to_string(),
            "--model".into(),
            fx.join("qwen3moe_f32.gguf").to_str().unwrap().into(),
            "--input".into(),
            fx.join("qwen3moe_f32_x.npy").to_str().unwrap().into(),
            "--device".into(),
            "cpu".into(),
        ];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let run = |v: Vec<String>| {
        let v: Vec<&str> = v.iter().map(String::as_str).collect();
        let o = moekit(&v);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let plain = run(args(&[]));
    assert!(plain.contains("output       [4, 256] mean "), "{plain}");
    let out = std::env::temp_dir().join(format!("moekit-cli-sum-{}.npy", std::process::id()));
    let written = run(args(&["--output", out.to_str().unwrap()]));
    let y = npy_f32(&out);
    let _ = std::fs::remove_file(&out);
    let n = y.len() as f64;
    let mean = y.iter().map(|&v| v as f64).sum::<f64>() / n;
    let rms = (y.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / n).sqrt();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in y.iter().flat_map(|v| v.to_le_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    for stdout in [&plain, &written] {
        let m: f64 = summary_field(stdout, "mean").parse().unwrap();
        let r: f64 = summary_field(stdout, "RMS").parse().unwrap();
        assert!((m - mean).abs() <= 1e-6 * rms, "mean {m} vs {mean}");
        assert!((r - rms).abs() <= 1e-6 * rms, "RMS {r} vs {rms}");
        assert_eq!(summary_field(stdout, "checksum"), format!("{h:016x}"));
    }
}

/// `run` without `--layer` runs the first MoE layer and says so; the
/// all-MoE safetensors fixtures' `out.npy` is of layer 1 (`meta.json`), so
/// it matches with `--layer 1` only.
#[test]
fn run_states_the_layer_it_ran() {
    let d = root().join("fixtures/st/mixtral_hf");
    let out = std::env::temp_dir().join(format!("moekit-cli-layer-{}.npy", std::process::id()));
    let mut nmses = Vec::new();
    for layer in [None, Some("1")] {
        let mut v = vec![
            "run",
            "--model",
            d.to_str().unwrap(),
            "--input",
            "",
            "--output",
            out.to_str().unwrap(),
            "--device",
            "cpu",
        ];
        let x = d.join("x.npy");
        v[4] = x.to_str().unwrap();
        if let Some(l) = layer {
            v.extend(["--layer", l]);
        }
        let o = moekit(&v);
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let want = match layer {
            None => "layer        0 of 2 blocks (the first of 2 MoE layers, by default; --layer picks another)",
            Some(_) => "layer        1 of 2 blocks (2 MoE layers)",
        };
        assert!(stdout.contains(want), "{stdout}");
        nmses.push(nmse(&npy_f32(&out), &npy_f32(&d.join("out.npy"))));
    }
    let _ = std::fs::remove_file(&out);
    assert!(
        nmses[0] > 1e-3,
        "layer 0 should differ from the layer-1 reference"
    );
    assert!(nmses[1] <= NMSE_BOUND, "layer 1: NMSE {}", nmses[1]);
}
