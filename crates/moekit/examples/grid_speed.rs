//! Throwaway: ns per super-block of the integer kernels, in cache, 1 thread.
use moekit::cpu::SimdLevel;
use moekit::format::random::random_weights;
use moekit::format::GgmlType;
use moekit::testing::cpu_fast::{kind_of_rows, qdot_rows, QRow};
use moekit::testing::decoder;
use moekit::{DType, WeightFormat};
use std::time::Instant;

fn main() {
    let names: Vec<String> = std::env::args().skip(1).collect();
    let level = std::env::var("LEVEL")
        .ok()
        .and_then(|l| SimdLevel::ALL.into_iter().find(|x| format!("{x}") == l))
        .unwrap_or(moekit::cpu::simd_level());
    let (n, k) = (768usize, 2048usize);
    for name in names {
        let t = GgmlType::parse(&name).unwrap();
        let w = random_weights(WeightFormat::Ggml(t), 1, n, k, DType::F16, 1, &|| {}).unwrap();
        let dec = decoder(&w).unwrap();
        let kind = kind_of_rows(&dec).unwrap();
        let x: Vec<f32> = (0..k)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let q = QRow::new(&x, kind).unwrap();
        let mut out = vec![0f32; n];
        let mut s = Vec::new();
        let mut best = f64::MAX;
        for _ in 0..300 {
            let t0 = Instant::now();
            qdot_rows(level, &dec, 0, 0, n, &[&q], &mut s, &mut out).unwrap();
            best = best.min(t0.elapsed().as_secs_f64());
        }
        let sb = (n * k / 256) as f64;
        println!(
            "{name:8} {level}: {:.2} ns/superblock ({:.1} us/call, {:.2} GB/s)",
            best * 1e9 / sb,
            best * 1e6,
            (n * k / 256 * t.type_size()) as f64 / best / 1e9
        );
    }
}
