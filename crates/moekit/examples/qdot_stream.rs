//! GB/s of the integer kernels streaming weights from memory: `THREADS`
//! threads (default 2) each dot one activation row with whole experts of
//! qwen3-30b-a3b's gate shape (768 × 2048), walking 64 experts (more than
//! the L3) so every weight byte comes from DRAM. The kernels' own streaming
//! rate, to compare with the MoE block's (`moekit bench --device cpu`).
//!
//! `cargo run --release -p moekit --example qdot_stream -- q4_0 q4_k q8_0`
use moekit::cpu::SimdLevel;
use moekit::format::random::random_weights;
use moekit::format::GgmlType;
use moekit::testing::cpu_fast::{kind_of_rows, qdot_rows, QRow};
use moekit::testing::decoder;
use moekit::{DType, WeightFormat};
use std::time::Instant;

/// The environment variable `name` as a number, else `default`.
fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(default)
}

fn main() {
    let names: Vec<String> = std::env::args().skip(1).collect();
    // LEVEL (a `SimdLevel` name), THREADS, ROWS (per kernel call), EXPERTS.
    let level = std::env::var("LEVEL")
        .ok()
        .and_then(|l| SimdLevel::parse(l.trim()))
        .unwrap_or_else(moekit::cpu::simd_level);
    let threads = env_usize("THREADS", 2);
    let rows = env_usize("ROWS", 768);
    let e = env_usize("EXPERTS", 64);
    let (n, k) = (768usize, 2048usize);
    for name in names {
        let Some(t) = GgmlType::parse(&name) else {
            eprintln!("unknown type {name}");
            continue;
        };
        let w = match random_weights(WeightFormat::Ggml(t), e, n, k, DType::F16, 1, &|| {}) {
            Ok(w) => w,
            Err(err) => {
                eprintln!("{name}: {err}");
                continue;
            }
        };
        let Ok(dec) = decoder(&w) else { continue };
        let Some(kind) = kind_of_rows(&dec) else {
            eprintln!("{name}: no integer kernels");
            continue;
        };
        let x: Vec<f32> = (0..k)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let Ok(q) = QRow::new(&x, kind) else { continue };
        let row_bytes = k / t.block_size() * t.type_size();
        let mut times = Vec::new();
        for _ in 0..15 {
            let t0 = Instant::now();
            std::thread::scope(|s| {
                for th in 0..threads {
                    let (dec, q) = (&dec, &q);
                    s.spawn(move || {
                        let mut out = vec![0f32; rows];
                        let mut sc = Vec::new();
                        for ex in (th..e).step_by(threads) {
                            for n0 in (0..n).step_by(rows) {
                                let nn = rows.min(n - n0);
                                let o = &mut out[..nn];
                                let _ = qdot_rows(level, dec, ex, n0, nn, &[q], &mut sc, o);
                            }
                        }
                    });
                }
            });
            times.push(t0.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let med = times[times.len() / 2];
        let bytes = (e * n * row_bytes) as f64;
        println!(
            "{name:8} {level} {threads} thr, {rows}-row calls: {:.2} GB/s (median of 15 passes over {:.0} MB, {:.2} ms)",
            bytes / med / 1e9,
            bytes / 1e6,
            med * 1e3
        );
    }
}
