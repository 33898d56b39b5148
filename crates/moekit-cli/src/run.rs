//! `moekit run` (one MoE layer of a real checkpoint on an input) and
//! `moekit inspect` (what a checkpoint holds).

use indicatif::{ProgressBar, ProgressStyle};
use moekit::load::{self, Checkpoint};
use moekit::npy::{NpyArray, NpyDType};
use moekit::{DType, Device, Tensor, WeightFormat};
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::time::Instant;

type AnyErr = Box<dyn std::error::Error>;

/// Arguments of `moekit run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// A `.gguf` file or a safetensors directory (mlx-lm or Hugging Face layout).
    #[arg(long)]
    pub model: PathBuf,
    /// Transformer block whose MoE layer runs (default: the first MoE layer).
    #[arg(long)]
    pub layer: Option<usize>,
    /// Input `.npy` (float32 or float16, C order, [T, hidden]); default: random rows.
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// Write the layer's output here as float32 `.npy` [T, hidden].
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Number of random input rows (not with --input).
    #[arg(long, default_value_t = 4, conflicts_with = "input")]
    pub tokens: usize,
    /// Seed of the random input (not with --input).
    #[arg(long, default_value_t = 0, conflicts_with = "input")]
    pub seed: u64,
    /// auto (CUDA when available), cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Activation dtype the layer runs in: f32, f16 or bf16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Warn instead of failing (exit 1) when output values are NaN or ±inf.
    #[arg(long)]
    pub allow_non_finite: bool,
}

/// `auto` → CUDA device 0 when usable, else the CPU.
pub fn pick_device(name: &str) -> Result<Device, AnyErr> {
    Ok(match name {
        "auto" => match moekit::cuda::available() {
            Ok(_) => Device::Cuda(0),
            Err(_) => Device::Cpu,
        },
        other => Device::parse(other)?,
    })
}

fn read_input(path: &PathBuf, hidden: usize) -> Result<Vec<f32>, AnyErr> {
    let a = NpyArray::read(path)?;
    let where_ = path.display();
    if !matches!(a.dtype, NpyDType::F32 | NpyDType::F16) {
        return Err(format!(
            "{where_}: input must be float32 or float16, got {:?}",
            a.dtype
        )
        .into());
    }
    if a.shape.len() != 2 || a.shape[1] != hidden || a.shape[0] == 0 {
        return Err(format!(
            "{where_}: input must have shape [T, {hidden}] with T > 0, got {:?}",
            a.shape
        )
        .into());
    }
    let v = a.to_f32()?;
    if let Some(i) = v.iter().position(|x| !x.is_finite()) {
        return Err(format!(
            "{where_}: input element {i} (row {}, column {}) is not finite",
            i / hidden,
            i % hidden
        )
        .into());
    }
    Ok(v)
}

fn formats_of(block: &moekit::moe::MoeBlock) -> String {
    use moekit::ops::act::GateUp;
    let p = block.parts();
    let gu: Vec<WeightFormat> = match &p.gate_up {
        GateUp::Separate { gate, up } => vec![gate.format(), up.format()],
        GateUp::Fused(w) => vec![w.format()],
    };
    let mut names: Vec<String> = gu
        .iter()
        .chain(std::iter::once(&p.down.format()))
        .map(|f| f.to_string())
        .collect();
    names.dedup();
    format!(
        "experts {} (router {})",
        names.join("/"),
        p.router_weight.format()
    )
}

/// Most values of a random input (`--tokens` × hidden): 2^30 f32 (4 GiB).
pub(crate) const MAX_INPUT_VALUES: usize = 1 << 30;

/// Fails now, before any work, if `path` (named by `flag`) cannot be created:
/// its directory must exist.
pub(crate) fn check_out_path(flag: &str, path: &std::path::Path) -> Result<(), AnyErr> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    if path.is_dir() {
        return Err(format!("{flag} {}: is a directory", path.display()).into());
    }
    if !dir.is_dir() {
        return Err(format!(
            "{flag} {}: directory {} does not exist",
            path.display(),
            dir.display()
        )
        .into());
    }
    Ok(())
}

/// Runs one MoE layer.
pub fn run(a: &RunArgs) -> Result<(), AnyErr> {
    if let Some(out) = &a.output {
        check_out_path("--output", out)?;
    }
    let dtype = DType::parse(&a.dtype)
        .filter(|d| d.is_float())
        .ok_or_else(|| format!("--dtype must be f32, f16 or bf16, got {:?}", a.dtype))?;
    let device = pick_device(&a.device)?;
    let ckpt = load::open(&a.model)?;
    let s = ckpt.summary().clone();
    let layer = match a.layer {
        Some(l) => l,
        None => *s
            .moe_layers
            .first()
            .ok_or_else(|| format!("{}: no MoE layer found", a.model.display()))?,
    };
    let bar = ProgressBar::hidden();
    let t0 = Instant::now();
    let block = ckpt
        .moe_block(layer, &|done, total| {
            if total > 16 && bar.is_hidden() {
                bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
                bar.set_length(total as u64);
                if let Ok(st) =
                    ProgressStyle::with_template("loading layer [{bar:30}] {pos}/{len} tensors")
                {
                    bar.set_style(st);
                }
            }
            bar.set_position(done as u64);
        })
        .map_err(|e| -> AnyErr {
            match e {
                // The user chose the layer: say so in the flag's words.
                moekit::Error::Invalid {
                    arg: "layer",
                    expected,
                    got,
                    ..
                } => format!("--layer {layer}: expected {expected}, got {got}").into(),
                e => e.into(),
            }
        })?;
    bar.finish_and_clear();
    let block = block.to_device(device)?;
    let load_s = t0.elapsed().as_secs_f64();
    // The block's own width (from its weights), not the file's metadata claim.
    let hidden = block.hidden();
    if hidden == 0 {
        return Err(format!("{}: layer {layer} has hidden size 0", a.model.display()).into());
    }
    let xv = match &a.input {
        Some(p) => read_input(p, hidden)?,
        None => {
            if a.tokens == 0 {
                return Err("--tokens must be > 0".into());
            }
            let n = a
                .tokens
                .checked_mul(hidden)
                .filter(|&n| n <= MAX_INPUT_VALUES)
                .ok_or_else(|| {
                    format!(
                        "--tokens {} × hidden {hidden}: at most {MAX_INPUT_VALUES} input values",
                        a.tokens
                    )
                })?;
            let mut r = rand::rngs::StdRng::seed_from_u64(a.seed);
            (0..n).map(|_| r.random::<f32>() * 2.0 - 1.0).collect()
        }
    };
    let t = xv.len() / hidden;
    let x = Tensor::from_f32(&xv, &[t, hidden], dtype)?.to_device(device)?;
    let t1 = Instant::now();
    let y = block.forward(&x)?.to_device(Device::Cpu)?;
    let run_s = t1.elapsed().as_secs_f64();
    println!(
        "model        {} ({})",
        a.model.display(),
        ckpt.file_format()
    );
    println!("architecture {}", s.arch);
    println!(
        "{}",
        layer_line(layer, a.layer.is_none(), s.n_layers, &s.moe_layers)
    );
    println!("formats      {}", formats_of(&block));
    println!(
        "experts      {} (top-{}), hidden {}, intermediate {}",
        s.n_experts, s.top_k, s.hidden, s.intermediate
    );
    println!("router       {}", s.router);
    if let Some(sh) = &s.shared {
        println!("shared       {sh}");
    }
    println!("tokens       {t} ({dtype})");
    println!("device       {device}");
    println!(
        "time         load {:.1} ms, forward {:.3} ms",
        load_s * 1e3,
        run_s * 1e3
    );
    if let Some(kb) = peak_rss_kb() {
        println!("memory       peak RSS {kb} kB");
    }
    let yv = y.to_f32_vec()?;
    println!("output       {}", output_summary(&yv, t, hidden));
    if let Some(out) = &a.output {
        NpyArray::from_f32(&yv, &[t, hidden]).write(out)?;
        println!("written to   {}", out.display());
    }
    let bad = yv.iter().filter(|v| !v.is_finite()).count();
    if bad > 0 {
        let msg = format!(
            "{bad} of {} output values are not finite (NaN or ±inf): check the layer's weights",
            yv.len()
        );
        if !a.allow_non_finite {
            return Err(format!("{msg} (--allow-non-finite makes this a warning)").into());
        }
        eprintln!("moekit: warning: {msg}");
    }
    Ok(())
}

/// The `layer` line of `run`: which block ran and whether it was the default.
fn layer_line(layer: usize, default: bool, n_layers: usize, moe: &[usize]) -> String {
    let how = if default {
        format!(
            "the first of {} MoE layers, by default; --layer picks another",
            moe.len()
        )
    } else {
        format!("{} MoE layers", moe.len())
    };
    format!("layer        {layer} of {n_layers} blocks ({how})")
}

/// `[T, H]`, mean, RMS (over the finite values) and an FNV-1a 64-bit
/// checksum of the values' little-endian f32 bytes, to compare runs without
/// writing `--output`.
fn output_summary(y: &[f32], t: usize, hidden: usize) -> String {
    let mut sum = 0f64;
    let mut sq = 0f64;
    let mut n = 0usize;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in y {
        for b in v.to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        if v.is_finite() {
            sum += f64::from(*v);
            sq += f64::from(*v) * f64::from(*v);
            n += 1;
        }
    }
    let d = n.max(1) as f64;
    let bad = y.len() - n;
    let note = if bad > 0 {
        format!(" ({bad} not finite, left out of mean and RMS)")
    } else {
        String::new()
    };
    format!(
        "[{t}, {hidden}] mean {:.6e}, RMS {:.6e}, checksum {h:016x} (FNV-1a of the f32 bytes){note}",
        sum / d,
        (sq / d).sqrt()
    )
}

/// Peak resident set size of this process (Linux `VmHWM`).
fn peak_rss_kb() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Arguments of `moekit inspect`.
#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// A `.gguf` file or a safetensors directory.
    pub path: PathBuf,
}

/// Whether each MoE layer of a GGUF file loads (so `moekit run` can run
/// it): `yes (every MoE layer: N)`, or `no (K of N MoE layers)` followed
/// by a line per MoE layer — each layer that does not load with its error,
/// which names the tensor and its type when a weight type is what stops it,
/// and runs of consecutive layers that do as one line. GGUF layers are views
/// of the mapped file, so loading each one is cheap (legacy per-expert
/// tensors interleaved in the file are the exception: they are copied, one
/// projection at a time). Safetensors layers are not built here: Hugging
/// Face per-expert tensors are stacked by copying, which for a large
/// checkpoint reads all of it.
fn runnable(ckpt: &dyn Checkpoint) -> String {
    if ckpt.file_format() != "gguf" {
        return "not checked for safetensors (`moekit run` loads one layer)".into();
    }
    let layers = &ckpt.summary().moe_layers;
    let results: Vec<(usize, Option<String>)> = layers
        .iter()
        .map(|&l| {
            (
                l,
                ckpt.moe_block(l, &|_, _| {}).err().map(|e| e.to_string()),
            )
        })
        .collect();
    let failed = results.iter().filter(|(_, e)| e.is_some()).count();
    if failed == 0 {
        return format!("yes (every MoE layer: {})", layers.len());
    }
    let mut out = format!("no ({failed} of {} MoE layers)", layers.len());
    let mut i = 0;
    while i < results.len() {
        let (first, err) = &results[i];
        if let Some(e) = err {
            out += &format!("\n  block {first:<10} no: {e}");
            i += 1;
            continue;
        }
        // A run of layers that load.
        let mut j = i;
        while j + 1 < results.len() && results[j + 1].1.is_none() {
            j += 1;
        }
        let span = if j == i {
            first.to_string()
        } else {
            format!("{first}-{}", results[j].0)
        };
        out += &format!("\n  block {span:<10} yes");
        i = j + 1;
    }
    out
}

/// Prints what a checkpoint holds.
pub fn inspect(a: &InspectArgs) -> Result<(), AnyErr> {
    use std::io::Write;
    let ckpt: Box<dyn Checkpoint> = load::open(&a.path)?;
    let s = ckpt.summary();
    let mut o = std::io::stdout().lock();
    let r = (|| -> std::io::Result<()> {
        writeln!(
            o,
            "file         {} ({})",
            a.path.display(),
            ckpt.file_format()
        )?;
        writeln!(o, "architecture {}", s.arch)?;
        writeln!(o, "blocks       {} (MoE: {:?})", s.n_layers, s.moe_layers)?;
        writeln!(
            o,
            "experts      {} (top-{}), hidden {}, intermediate {}",
            s.n_experts, s.top_k, s.hidden, s.intermediate
        )?;
        writeln!(o, "router       {}", s.router)?;
        writeln!(o, "shared       {}", s.shared.as_deref().unwrap_or("none"))?;
        writeln!(o, "runnable     {}", runnable(&*ckpt))?;
        let tensors = ckpt.tensors();
        let total: usize = tensors.iter().map(|t| t.bytes).sum();
        writeln!(
            o,
            "tensors      {} ({:.1} MB)",
            tensors.len(),
            total as f64 / 1e6
        )?;
        for t in tensors {
            writeln!(
                o,
                "  {:<60} {:<8} {:<20} {:>12}",
                t.name,
                t.format,
                format!("{:?}", t.shape),
                t.bytes
            )?;
        }
        Ok(())
    })();
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}
