//! `moekit bench`: whole-MoE-block timings on synthetic weights of real model
//! shapes, against the machine's memory read bandwidth measured in the same run.

use crate::presets::{self, Inputs, Preset};
use indicatif::{ProgressBar, ProgressStyle};
use moekit::format::random::random_weights;
use moekit::moe::MoePath;
use moekit::moe::{MoeBlock, MoeBlockParts, SharedExpert};
use moekit::ops::act::GateUp;
use moekit::ops::ffn::{ExpertBiases, ExpertFfn, ExpertInput, GluAct, InputNorm};
use moekit::ops::route::RouterConfig;
use moekit::{Backend, DType, Device, Tensor, WeightFormat};
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use serde::Serialize;
use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `moekit bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Model preset (qwen3-30b-a3b, mixtral-8x7b, deepseek-v2-lite, gpt-oss-20b, qwen3-next-80b, gemma4-26b-a4b, llama4-scout, ernie-4.5-21b-a3b, hunyuan-a13b).
    #[arg(long, default_value = "qwen3-30b-a3b")]
    pub preset: String,
    /// Expert weight formats, comma separated (q4_0, q8_0, q4_k, iq4_xs, mxfp4, affine4, affine8-g32, mlx-mxfp4, mlx-nvfp4, mlx-mxfp8, fp8-b128, bf16, ...), or `all`.
    #[arg(long, default_value = "q4_0", value_delimiter = ',')]
    pub format: Vec<String>,
    /// Token counts T per MoE call, comma separated.
    #[arg(long, default_value = "1,32", value_delimiter = ',')]
    pub tokens: Vec<usize>,
    /// Device: auto (CUDA when available), cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Activation dtype: f32, f16 or bf16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Seed of the synthetic weights and inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Which implementation runs the block: auto (the planner's choice),
    /// general, decode or tc (tensor cores).
    #[arg(long, default_value = "auto")]
    pub path: String,
    /// Minimum measuring time per case, in seconds (at least 5 repeats).
    #[arg(long, default_value_t = 1.0)]
    pub min_time: f64,
}

#[derive(Serialize)]
struct CaseResult {
    format: String,
    tokens: usize,
    median_ms: f64,
    repeats: usize,
    weight_bytes: usize,
    gb_per_s: f64,
    pct_of_read_bw: f64,
    gflop_per_s: f64,
    /// The path that ran (auto: the planner's choice).
    path: String,
    /// weight_bytes / read bandwidth measured in the same run.
    floor_bytes_ms: f64,
    /// FLOPs / bf16 GEMM rate measured in the same run (CUDA only).
    floor_flops_ms: Option<f64>,
    /// max(floor_bytes_ms, floor_flops_ms): the time at the roofline.
    floor_ms: f64,
    /// median_ms / floor_ms.
    x_floor: f64,
    /// CUDA only: the block replayed as a captured CUDA graph.
    graph_ms: Option<f64>,
    graph_pct_of_read_bw: Option<f64>,
    graph_x_floor: Option<f64>,
    /// CUDA only: per block, from [`B2B`] graph replays enqueued back to back
    /// between two events (the host's launch latency hidden behind the GPU's
    /// work, as inside an engine's captured step); `graph_ms` times each
    /// replay alone and so includes it.
    graph_b2b_ms: Option<f64>,
    graph_b2b_x_floor: Option<f64>,
    /// CUDA only: kernel launches per block.
    launches: Option<u64>,
}

#[derive(Serialize)]
struct Report {
    preset: String,
    device: String,
    dtype: String,
    threads: usize,
    /// CPU only: the vector-kernel level picked at run time (`avx512vnni`,
    /// `avxvnni`, `avx2`, `portable`).
    cpu_simd_level: Option<String>,
    /// CPU only: the activation mode of the fused dots (`auto`: 8-bit
    /// blocks and integer kernels where the format has them; `f32`; `q8`),
    /// from `MOEKIT_CPU_ACT`.
    cpu_act_mode: Option<String>,
    read_bw_gb_per_s: f64,
    /// CUDA only, for context: cuBLAS dense bf16 GEMM rate (n = 8192, f32
    /// accumulation) measured in the same run; null on CPU or if it could not be measured.
    bf16_gemm_tflops: Option<f64>,
    cases: Vec<CaseResult>,
}

type AnyErr = Box<dyn std::error::Error>;

/// Distinct inputs each case cycles through (see the loop in [`run`]).
const INPUTS: usize = 16;

/// Graph replays per back-to-back timing (`graph_b2b_ms`).
const B2B: usize = 2 * INPUTS;

/// Median of the timings of `f` in seconds: warm-up, then ≥ 5 runs and ≥ `min_time`.
fn time_median(
    min_time: f64,
    mut f: impl FnMut() -> Result<(), AnyErr>,
) -> Result<(f64, usize), AnyErr> {
    f()?;
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 5 || (start.elapsed().as_secs_f64() < min_time && times.len() < 1000) {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2], times.len()))
}

/// Read bandwidth of host memory in GB/s: a parallel sum over a 1 GiB
/// buffer, median of 7. (Four interleaved streams per task measured the same
/// on the 2-core dev machine, so the simple form stays.)
fn measure_read_bandwidth() -> Result<f64, AnyErr> {
    let words = vec![1u64; (1usize << 30) / 8];
    let (t, _) = time_median(0.0, || {
        let s: u64 = words
            .par_chunks(1 << 16)
            .map(|c| {
                let mut acc = [0u64; 8];
                for w in c.chunks_exact(8) {
                    for i in 0..8 {
                        acc[i] = acc[i].wrapping_add(w[i]);
                    }
                }
                acc.iter().fold(0u64, |a, &b| a.wrapping_add(b))
            })
            .sum();
        black_box(s);
        Ok(())
    })?;
    Ok((words.len() * 8) as f64 / t / 1e9)
}

fn build_block(
    p: &Preset,
    format: WeightFormat,
    seed: u64,
    bar: &ProgressBar,
) -> moekit::Result<MoeBlock> {
    let (e, h, i) = (p.n_experts, p.hidden, p.intermediate);
    let tick = || bar.inc(1);
    let rw = |f, n_exp, rows, cols, s| {
        random_weights(
            f,
            n_exp,
            rows,
            cols,
            DType::F16,
            seed.wrapping_add(s),
            &tick,
        )
    };
    let router_weight = rw(WeightFormat::Dense(DType::F32), 1, e, h, 1)?;
    let gate_up = GateUp::separate(rw(format, e, i, h, 2)?, rw(format, e, i, h, 3)?)?;
    let down = rw(format, e, h, i, 4)?;
    let shared = match p.shared {
        (0, _) => None,
        (si, gated) => Some(SharedExpert {
            gate_up: GateUp::separate(rw(format, 1, si, h, 5)?, rw(format, 1, si, h, 6)?)?,
            down: rw(format, 1, h, si, 7)?,
            gate: if gated {
                Some(rw(WeightFormat::Dense(DType::F32), 1, 1, h, 8)?)
            } else {
                None
            },
        }),
    };
    let router = RouterConfig {
        kind: p.router.clone(),
        n_experts: e,
        top_k: p.top_k,
    };
    let mut ffn = match p.glu {
        act @ (GluAct::SwiGlu | GluAct::GeluTanh) => ExpertFfn {
            act,
            ..Default::default()
        },
        act => {
            // gpt-oss: biases on the router and every expert projection.
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed.wrapping_add(9));
            let mut bias = |shape: &[usize], std: f32| {
                let v: Vec<f32> = (0..shape.iter().product::<usize>())
                    .map(|_| std * (rng.random::<f32>() * 2.0 - 1.0))
                    .collect();
                Tensor::from_f32(&v, shape, DType::F32).map(Some)
            };
            ExpertFfn {
                act,
                bias: ExpertBiases {
                    router: bias(&[e], 0.5)?,
                    gate: bias(&[e, i], 1.0)?,
                    up: bias(&[e, i], 1.0)?,
                    down: bias(&[e, h], 0.1)?,
                },
                scale: Default::default(),
                input: Default::default(),
            }
        }
    };
    ffn.input = match p.inputs {
        Inputs::Plain => ExpertInput::default(),
        Inputs::WeightBefore => ExpertInput {
            weight_before: true,
            ..Default::default()
        },
        Inputs::Gemma4 => {
            let ones = vec![1.0; h];
            ExpertInput {
                router_norm: Some(InputNorm::new(&ones, 1e-6)?),
                expert_norm: Some(InputNorm::new(&ones, 1e-6)?),
                weight_before: false,
            }
        }
    };
    MoeBlock::new(MoeBlockParts {
        router,
        router_weight,
        gate_up,
        down,
        shared,
        ffn,
    })
}

fn parse_formats(names: &[String]) -> Result<Vec<WeightFormat>, AnyErr> {
    if names.iter().any(|n| n == "all") {
        return Ok(WeightFormat::all());
    }
    names
        .iter()
        .map(|n| {
            WeightFormat::parse(n).map_err(|e| -> AnyErr {
                match e {
                    moekit::Error::Invalid { expected, .. } => {
                        format!("--format {n}: expected {expected} or all").into()
                    }
                    e => e.into(),
                }
            })
        })
        .collect()
}

/// Runs the benchmark and prints the table.
pub fn run(a: &BenchArgs) -> Result<(), AnyErr> {
    if let Some(path) = &a.json {
        crate::run::check_out_path("--json", path)?;
    }
    let preset = presets::find(&a.preset)
        .ok_or_else(|| format!("unknown preset {:?}; known: {}", a.preset, presets::names()))?;
    let device = crate::run::pick_device(&a.device)?;
    let backend = Backend::for_device(device)?;
    let dtype = DType::parse(&a.dtype)
        .filter(|d| d.is_float())
        .ok_or_else(|| format!("--dtype must be f32, f16 or bf16, got {:?}", a.dtype))?;
    let formats = parse_formats(&a.format)?;
    let path = match a.path.as_str() {
        "auto" => MoePath::Auto,
        "general" => MoePath::General,
        "decode" => MoePath::Decode,
        "tc" => MoePath::TensorCore,
        p => return Err(format!("--path must be auto, general, decode or tc, got {p:?}").into()),
    };
    if a.tokens.is_empty() || a.tokens.contains(&0) {
        return Err("--tokens needs positive token counts, e.g. 1,32,512".into());
    }
    let max = crate::run::MAX_INPUT_VALUES;
    if let Some(t) = a
        .tokens
        .iter()
        .find(|&&t| t.checked_mul(preset.hidden).is_none_or(|n| n > max))
    {
        return Err(format!(
            "--tokens {t} × hidden {} of {}: at most {max} input values",
            preset.hidden, preset.name
        )
        .into());
    }
    let threads = rayon::current_num_threads();
    let cuda = match device {
        Device::Cuda(n) => Some(moekit::cuda::device(n)?),
        Device::Cpu => None,
    };
    let bw = match &cuda {
        Some(dev) => {
            eprintln!("measuring {} read bandwidth...", dev.name());
            moekit::cuda::bench::read_bandwidth(dev, 2 << 30)?
        }
        None => {
            eprintln!("measuring host read bandwidth ({threads} threads)...");
            measure_read_bandwidth()?
        }
    };
    let gemm_tflops = cuda.as_ref().and_then(|dev| {
        let n = moekit::cuda::bench::GEMM_N;
        eprintln!("measuring {} bf16 GEMM rate (cuBLAS, n={n})...", dev.name());
        moekit::cuda::bench::bf16_gemm_tflops(dev, n)
            .map_err(|e| eprintln!("warning: bf16 GEMM rate not measured: {e}"))
            .ok()
    });
    let gemm_note = gemm_tflops.map_or(String::new(), |r| format!(", bf16 GEMM {r:.1} TFLOP/s"));
    let cpu_level = cuda.is_none().then(|| moekit::cpu::simd_level().name());
    let dev_name = cuda.as_ref().map_or(
        format!(
            "{device} ({threads} threads, {} kernels, {} CPU activations)",
            moekit::cpu::simd_level(),
            moekit::cpu::act_mode()
        ),
        |d| format!("{device} ({})", d.name()),
    );
    println!(
        "preset {} (E={} k={} H={} I={}), device {dev_name}, activations {dtype}, read bandwidth {bw:.1} GB/s{gemm_note}",
        preset.name, preset.n_experts, preset.top_k, preset.hidden, preset.intermediate
    );
    println!(
        "{:<14} {:>6} {:>10} {:>12} {:>9} {:>7} {:>9} {:>7} {:>9} {:>6}% {:>8} {:>7} {:>8} {:>7} path",
        "format",
        "T",
        "median ms",
        "weight MB",
        "GB/s",
        "% bw",
        "GFLOP/s",
        "x floor",
        "graph ms",
        "bw g",
        "launches",
        "g x flr",
        "b2b ms",
        "b x flr"
    );
    let mut cases = Vec::new();
    for format in formats {
        let n_mats = 3 * preset.n_experts as u64 + if preset.shared.0 > 0 { 3 } else { 0 } + 2;
        let bar = ProgressBar::new(n_mats).with_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} expert matrices")
                .map_err(|e| e.to_string())?,
        );
        bar.set_message(format!("generating {format} weights"));
        let block = match build_block(&preset, format, a.seed, &bar) {
            Ok(b) => b.to_device(device)?,
            // e.g. a K-quant (K a multiple of 256) on a preset with I = 1408.
            Err(moekit::Error::Invalid {
                arg, expected, got, ..
            }) => {
                bar.finish_and_clear();
                println!(
                    "{:<14} skipped: {arg} must be {expected}, this preset has {got}",
                    format.to_string()
                );
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        bar.finish_and_clear();
        for &t in &a.tokens {
            // INPUTS different inputs, used in turn: successive calls pick
            // different experts, as successive decode steps do, so weights are
            // read from memory rather than from a cache that still holds the
            // previous call's experts.
            let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed ^ t as u64);
            let mut xs = Vec::with_capacity(INPUTS);
            let mut bytes = 0usize;
            for _ in 0..INPUTS {
                let xv: Vec<f32> = (0..t * preset.hidden)
                    .map(|_| rng.random::<f32>() * 2.0 - 1.0)
                    .collect();
                let x = Tensor::from_f32(&xv, &[t, preset.hidden], dtype)?.to_device(device)?;
                let trace = block.forward_with(backend, path, &x)?;
                bytes += block.weight_bytes_touched(&trace.routing)?;
                xs.push(x);
            }
            let bytes = bytes / INPUTS;
            let next = std::cell::Cell::new(0usize);
            let x_next = || {
                let i = next.get();
                next.set(i + 1);
                &xs[i % INPUTS]
            };
            let (secs, repeats) = match &cuda {
                Some(dev) => {
                    let reps = 5 * INPUTS;
                    let ms = moekit::cuda::bench::time_ms(dev, reps, || {
                        block.forward_with(backend, path, x_next()).map(drop)
                    })?;
                    (ms * 1e-3, reps)
                }
                None => time_median(a.min_time, || {
                    black_box(block.forward_with(backend, path, x_next())?);
                    Ok(())
                })?,
            };
            let (graph_ms, graph_b2b_ms, launches) = match &cuda {
                Some(dev) => {
                    let mut outs = Vec::with_capacity(INPUTS);
                    let mut launches = 0;
                    for x in &xs {
                        let mut out = Tensor::zeros_on(dtype, &[t, preset.hidden], device)?;
                        let step = |out: &mut Tensor| -> moekit::Result<()> {
                            out.copy_from(&block.forward_with(backend, path, x)?.out)
                        };
                        let before = moekit::cuda::launch_count();
                        step(&mut out)?;
                        launches = moekit::cuda::launch_count() - before;
                        dev.synchronize()?;
                        let graph = moekit::cuda::graph::capture(dev, || step(&mut out))?;
                        outs.push((graph, out));
                    }
                    let g = std::cell::Cell::new(0usize);
                    let ms = moekit::cuda::bench::time_ms(dev, 10 * INPUTS, || {
                        let i = g.get();
                        g.set(i + 1);
                        outs[i % INPUTS].0.replay()
                    })?;
                    // MOEKIT_TRACE builds: the decode path's timeline of the
                    // last single replay, then of the last back-to-back one.
                    if let Some(tr) = dev.decode_trace()? {
                        eprintln!("{} {format} T={t} single replay\n{tr}", preset.name);
                    }
                    let b2b = moekit::cuda::bench::time_ms(dev, 10, || {
                        for i in 0..B2B {
                            outs[i % INPUTS].0.replay()?;
                        }
                        Ok(())
                    })? / B2B as f64;
                    if let Some(tr) = dev.decode_trace()? {
                        eprintln!("{} {format} T={t} back to back\n{tr}", preset.name);
                    }
                    (Some(ms), Some(b2b), Some(launches))
                }
                None => (None, None, None),
            };
            let floor_bytes_ms = bytes as f64 / (bw * 1e9) * 1e3;
            let floor_flops_ms = gemm_tflops.map(|r| block.flops(t) as f64 / (r * 1e12) * 1e3);
            let floor_ms = floor_bytes_ms.max(floor_flops_ms.unwrap_or(0.0));
            let ran = moekit::plan::plan(block.parts(), backend, &xs[0], path)?.path;
            let gbs = bytes as f64 / secs / 1e9;
            let r = CaseResult {
                format: format.to_string(),
                tokens: t,
                median_ms: secs * 1e3,
                repeats,
                path: format!("{ran:?}"),
                weight_bytes: bytes,
                gb_per_s: gbs,
                pct_of_read_bw: 100.0 * gbs / bw,
                gflop_per_s: block.flops(t) as f64 / secs / 1e9,
                floor_bytes_ms,
                floor_flops_ms,
                floor_ms,
                x_floor: secs * 1e3 / floor_ms,
                graph_ms,
                graph_pct_of_read_bw: graph_ms
                    .map(|g| 100.0 * (bytes as f64 / (g * 1e-3) / 1e9) / bw),
                graph_x_floor: graph_ms.map(|g| g / floor_ms),
                graph_b2b_ms,
                graph_b2b_x_floor: graph_b2b_ms.map(|g| g / floor_ms),
                launches,
            };
            let opt = |v: Option<f64>, w: usize, p: usize| {
                v.map_or(format!("{:>w$}", "-"), |v| format!("{v:>w$.p$}"))
            };
            println!(
                "{:<14} {:>6} {:>10.3} {:>12.1} {:>9.2} {:>6.1}% {:>9.2} {:>7.1} {} {} {:>8} {:>7} {} {} {}",
                r.format,
                t,
                r.median_ms,
                bytes as f64 / 1e6,
                r.gb_per_s,
                r.pct_of_read_bw,
                r.gflop_per_s,
                r.x_floor,
                opt(r.graph_ms, 9, 4),
                opt(r.graph_pct_of_read_bw, 6, 1),
                r.launches.map_or("-".to_string(), |l| l.to_string()),
                opt(r.graph_x_floor, 7, 2),
                opt(r.graph_b2b_ms, 8, 4),
                opt(r.graph_b2b_x_floor, 7, 2),
                r.path
            );
            cases.push(r);
        }
    }
    if let Some(path) = &a.json {
        let report = Report {
            preset: preset.name.to_string(),
            device: dev_name.clone(),
            dtype: dtype.to_string(),
            threads,
            cpu_simd_level: cpu_level.map(str::to_string),
            cpu_act_mode: cuda.is_none().then(|| moekit::cpu::act_mode().to_string()),
            read_bw_gb_per_s: bw,
            bf16_gemm_tflops: gemm_tflops,
            cases,
        };
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}
