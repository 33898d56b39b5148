//! A crate that depends on moekit like a user's would (built outside the
//! repository, so without its `.cargo/config.toml`): times one CPU MoE layer
//! of Qwen3-30B-A3B's shape (E = 128, k = 8, H = 2048, I = 768) at T = 1 for
//! a few weight formats, as `moekit bench --device cpu --tokens 1` does
//! (16 inputs used in turn, median of ≥ 5 runs and ≥ 1 s).
//! Built and run by `scripts/dependent-crate.sh`.

use moekit::format::random::random_weights;
use moekit::moe::MoeBlockParts;
use moekit::ops::act::GateUp;
use moekit::ops::route::{RouterConfig, RouterKind};
use moekit::{Backend, DType, Device, MoeBlock, MoePath, Tensor, WeightFormat};
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::time::Instant;

const E: usize = 128;
const TOP_K: usize = 8;
const H: usize = 2048;
const I: usize = 768;
const INPUTS: usize = 16;

/// The vector-kernel level moekit picked (the crate before runtime dispatch
/// had none: built with `--cfg moekit_before`).
#[cfg(not(moekit_before))]
fn level() -> String {
    moekit::cpu::simd_level().to_string()
}

#[cfg(moekit_before)]
fn level() -> String {
    "compile-time target features".to_string()
}

fn block(format: WeightFormat) -> moekit::Result<MoeBlock> {
    let rw = |f, n, rows, cols, seed| random_weights(f, n, rows, cols, DType::F16, seed, &|| {});
    MoeBlock::new(MoeBlockParts {
        router: RouterConfig {
            kind: RouterKind::SoftmaxTopK {
                norm_topk_prob: true,
            },
            n_experts: E,
            top_k: TOP_K,
        },
        router_weight: rw(WeightFormat::Dense(DType::F32), 1, E, H, 1)?,
        gate_up: GateUp::separate(rw(format, E, I, H, 2)?, rw(format, E, I, H, 3)?)?,
        down: rw(format, E, H, I, 4)?,
        shared: None,
        ffn: Default::default(),
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let formats = std::env::args().nth(1).unwrap_or("q4_0,q8_0,q4_k,affine4-g64".into());
    let backend = Backend::for_device(Device::Cpu)?;
    println!("cpu kernels: {}", level());
    for name in formats.split(',') {
        let b = block(WeightFormat::parse(name)?)?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let xs = (0..INPUTS)
            .map(|_| {
                let v: Vec<f32> = (0..H).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect();
                Tensor::from_f32(&v, &[1, H], DType::F32)
            })
            .collect::<moekit::Result<Vec<_>>>()?;
        let run = |i: usize| b.forward_with(backend, MoePath::Auto, &xs[i % INPUTS]);
        run(0)?;
        let (mut times, start) = (Vec::new(), Instant::now());
        while times.len() < 5 || (start.elapsed().as_secs_f64() < 1.0 && times.len() < 1000) {
            let t = Instant::now();
            black_box(run(times.len())?);
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        println!("{name:<14} T=1 median {:.3} ms ({} runs)", times[times.len() / 2], times.len());
    }
    Ok(())
}
