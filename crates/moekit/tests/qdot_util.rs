// Shared helpers of the CPU integer-kernel tests (`cpu_qdot_codebook.rs`,
// `cpu_qdot_grid.rs`; included with `mod qdot_util;` beside `common_util`).
#![allow(dead_code)]

use moekit::cpu::SimdLevel;
use moekit::format::random::random_weights;
use moekit::format::GgmlType;
use moekit::testing::cpu_fast::{kind_of, kind_of_rows, qdot_rows, QRow};
use moekit::testing::decoder;
use moekit::{DType, QuantWeights, WeightFormat};
use rand::{Rng, SeedableRng};

/// Activations with a nonzero mean (uniform in [−0.7, 1.3)), a fraction
/// `outliers` of them 20 times larger.
pub fn activations(k: usize, seed: u64, outliers: f32) -> Vec<f32> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..k)
        .map(|_| {
            let v = r.random::<f32>() * 2.0 - 0.7;
            if r.random::<f32>() < outliers {
                v * 20.0
            } else {
                v
            }
        })
        .collect()
}

/// Random `[e, n, k]` weights of `f` (f16 scales where it has any).
pub fn weights(f: WeightFormat, e: usize, n: usize, k: usize, seed: u64) -> QuantWeights {
    random_weights(f, e, n, k, DType::F16, seed, &|| {}).unwrap()
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// The SIMD levels this CPU runs.
pub fn levels() -> Vec<SimdLevel> {
    SimdLevel::ALL
        .into_iter()
        .filter(|l| l.is_supported())
        .collect()
}

/// Every level against the portable kernels, one activation row at a time,
/// then 1..=`qs.len()` rows at once and a run from row 2, bit for bit,
/// for every expert of `w` (`n` rows).
pub fn check_levels(name: &str, w: &QuantWeights, n: usize, qs: &[QRow]) {
    let dec = decoder(w).unwrap();
    for ex in 0..w.n_experts() {
        let mut want = vec![0f32; qs.len() * n];
        for (q, want) in qs.iter().zip(want.chunks_exact_mut(n)) {
            let mut s = Vec::new();
            qdot_rows(SimdLevel::Portable, &dec, ex, 0, n, &[q], &mut s, want).unwrap();
        }
        assert!(want.iter().all(|v| v.is_finite()), "{name}");
        for level in levels() {
            for rows in 1..=qs.len() {
                let acts: Vec<&QRow> = qs[..rows].iter().collect();
                let mut out = vec![f32::NAN; rows * n];
                let mut s = Vec::new();
                qdot_rows(level, &dec, ex, 0, n, &acts, &mut s, &mut out).unwrap();
                assert_eq!(
                    bits(&out),
                    bits(&want[..rows * n]),
                    "{name} expert {ex} {level} with {rows} rows"
                );
            }
            let mut out = vec![0f32; n - 2];
            let mut s = Vec::new();
            qdot_rows(level, &dec, ex, 2, n - 2, &[&qs[0]], &mut s, &mut out).unwrap();
            assert_eq!(bits(&out), bits(&want[2..n]), "{name} {level}: row 2");
        }
    }
}

/// At every level: zero activations give zeros, an infinite one NaN.
pub fn check_zero_and_non_finite(formats: &[WeightFormat]) {
    for &f in formats {
        let (k, n) = (512, 3);
        let w = weights(f, 1, n, k, 5);
        let dec = decoder(&w).unwrap();
        let kind = kind_of_rows(&dec).unwrap();
        let zero = QRow::new(&vec![0f32; k], kind).unwrap();
        let mut x = activations(k, 9, 0.0);
        x[300] = f32::INFINITY;
        let inf = QRow::new(&x, kind).unwrap();
        for level in levels() {
            let mut out = vec![f32::NAN; 2 * n];
            let mut s = Vec::new();
            qdot_rows(level, &dec, 0, 0, n, &[&zero, &inf], &mut s, &mut out).unwrap();
            assert!(out[..n].iter().all(|&v| v == 0.0), "{f} {level}: {out:?}");
            assert!(out[n..].iter().all(|v| v.is_nan()), "{f} {level}: {out:?}");
        }
    }
}

/// At every level: activations quantized for another format or of another
/// length, an expert, rows or output out of range are errors, not panics.
pub fn check_bad_arguments(formats: &[WeightFormat]) {
    let (k, n) = (512, 4);
    for &f in formats {
        let w = weights(f, 2, n, k, 1);
        let dec = decoder(&w).unwrap();
        let kind = kind_of_rows(&dec).unwrap();
        let x = activations(k, 2, 0.0);
        let good = QRow::new(&x, kind).unwrap();
        // Quantized for another format (Q4_K's kind), or another length.
        let other = QRow::new(&x, kind_of(GgmlType::Q4_K).unwrap()).unwrap();
        let short = QRow::new(&x[..k - 256], kind).unwrap();
        for level in levels() {
            let mut out = vec![0f32; n];
            let mut s = Vec::new();
            let mut run = |e: usize, n0: usize, nn: usize, a: &QRow, out: &mut [f32]| {
                qdot_rows(level, &dec, e, n0, nn, &[a], &mut s, out)
            };
            assert!(run(0, 0, n, &other, &mut out).is_err(), "{f} {level}: kind");
            assert!(run(0, 0, n, &short, &mut out).is_err(), "{f} {level}: len");
            assert!(
                run(2, 0, n, &good, &mut out).is_err(),
                "{f} {level}: expert"
            );
            assert!(run(0, 1, n, &good, &mut out).is_err(), "{f} {level}: rows");
            let short_out = run(0, 0, n, &good, &mut out[..2]);
            assert!(short_out.is_err(), "{f} {level}: out");
            assert!(run(0, 0, n, &good, &mut out).is_ok(), "{f} {level}");
        }
    }
}
