//! The integer dot kernels of the formats added after Q4_0, Q8_0, Q4_K and
//! MLX affine4 (`cpu::fast::qdot::blocks`): Q4_1, Q5_0, Q5_1, Q2_K, Q3_K,
//! Q5_K, Q6_K and MLX affine of 2, 3, 5, 6 and 8 bits:
//!
//! - every level this CPU supports equals the portable kernels bit for bit
//!   (groups of 1..6 activation rows, tails after the last run of 4
//!   blocks, a run from a later row), so a result does not depend on the
//!   level nor on the batch;
//! - the quantized path is within NMSE 1e-4 of the f32 path (f64 dots of
//!   the rows decoded by the format's own dequantizer with the unquantized
//!   activations), 3e-4 with 1% outliers: this is what checks each
//!   format's code unpacking and scale algebra;
//! - zero and non-finite activations.

mod common_util;
use common_util::{nmse, rng};
use moekit::cpu::{simd_level, SimdLevel};
use moekit::format::random::random_weights;
use moekit::format::{AffineParams, GgmlType};
use moekit::testing::cpu_fast::{kind_of_rows, qdot_rows, QRow};
use moekit::testing::decoder;
use moekit::{DType, QuantWeights, WeightFormat};
use rand::Rng;

/// The GGUF types of this file.
const GGUF: [GgmlType; 7] = [
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// The MLX affine widths of this file.
const AFFINE_BITS: [u32; 5] = [2, 3, 5, 6, 8];

const NMSE_Q8: f64 = 1e-4;
const NMSE_Q8_OUTLIERS: f64 = 3e-4;

/// Every format of this file with a scale dtype (GGUF: f16).
fn formats() -> Vec<(WeightFormat, DType)> {
    let mut f: Vec<_> = GGUF
        .iter()
        .map(|&t| (WeightFormat::Ggml(t), DType::F16))
        .collect();
    for bits in AFFINE_BITS {
        for (gs, sdt) in [(32, DType::F32), (64, DType::Bf16), (128, DType::F16)] {
            let p = AffineParams {
                bits,
                group_size: gs,
            };
            f.push((WeightFormat::Affine(p), sdt));
        }
    }
    f
}

/// The format's block of values (32 or 256).
fn block_of(f: WeightFormat) -> usize {
    match f {
        WeightFormat::Ggml(t) => t.block_size(),
        WeightFormat::Affine(p) => p.group_size,
        _ => unreachable!(),
    }
}

/// Activations with a nonzero mean (uniform in [−0.7, 1.3)), a fraction
/// `outliers` of them 20 times larger.
fn activations(k: usize, seed: u64, outliers: f32) -> Vec<f32> {
    let mut r = rng(seed);
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

fn weights(f: WeightFormat, e: usize, n: usize, k: usize, sdt: DType, seed: u64) -> QuantWeights {
    random_weights(f, e, n, k, sdt, seed, &|| {}).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn every_level_equals_the_portable_kernels_bit_for_bit() {
    let levels: Vec<SimdLevel> = SimdLevel::ALL
        .into_iter()
        .filter(|l| l.is_supported())
        .collect();
    eprintln!("levels: {levels:?}");
    for (f, sdt) in formats() {
        // Whole runs of 4 blocks, and tails of 1..3 blocks (32-value ones).
        for k in [256, 768, 800, 2048, 2080, 2816] {
            if k % block_of(f) != 0 {
                continue;
            }
            let (e, n) = (2, 9);
            let w = weights(f, e, n, k, sdt, k as u64);
            let dec = decoder(&w).unwrap();
            let kind = kind_of_rows(&dec).unwrap_or_else(|| panic!("{f}: no integer kernels"));
            let xs: Vec<Vec<f32>> = (0..6)
                .map(|i| activations(k, 7 * i + k as u64, 0.01))
                .collect();
            let qs: Vec<QRow> = xs.iter().map(|x| QRow::new(x, kind).unwrap()).collect();
            for ex in 0..e {
                // The portable kernels, one activation row at a time.
                let mut want = vec![0f32; qs.len() * n];
                for (q, want) in qs.iter().zip(want.chunks_exact_mut(n)) {
                    let mut s = Vec::new();
                    qdot_rows(SimdLevel::Portable, &dec, ex, 0, n, &[q], &mut s, want).unwrap();
                }
                assert!(want.iter().all(|v| v.is_finite()), "{f} K={k}");
                for &level in &levels {
                    for rows in 1..=qs.len() {
                        let acts: Vec<&QRow> = qs[..rows].iter().collect();
                        let mut out = vec![f32::NAN; rows * n];
                        let mut s = Vec::new();
                        qdot_rows(level, &dec, ex, 0, n, &acts, &mut s, &mut out).unwrap();
                        assert_eq!(
                            bits(&out),
                            bits(&want[..rows * n]),
                            "{f} ({sdt}) K={k} expert {ex} {level} with {rows} rows"
                        );
                    }
                    let mut out = vec![0f32; n - 2];
                    let mut s = Vec::new();
                    qdot_rows(level, &dec, ex, 2, n - 2, &[&qs[0]], &mut s, &mut out).unwrap();
                    assert_eq!(
                        bits(&out),
                        bits(&want[2..n]),
                        "{f} K={k} {level}: from row 2"
                    );
                }
            }
        }
    }
}

/// NMSE of the quantized path (at this CPU's level) against f64 dots of the
/// decoded rows with the unquantized activations, over 512 rows of K = 768
/// and 2048.
fn q8_nmse(f: WeightFormat, sdt: DType, outliers: f32) -> f64 {
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for (si, k) in [768usize, 2048].into_iter().enumerate() {
        let n = 64;
        let w = weights(f, 1, n, k, sdt, si as u64);
        let dec = decoder(&w).unwrap();
        let kind = kind_of_rows(&dec).unwrap();
        let mut row = vec![0f32; k];
        for s in 0..4 {
            let x = activations(k, 100 * si as u64 + s, outliers);
            let q = QRow::new(&x, kind).unwrap();
            let mut out = vec![0f32; n];
            let mut scratch = Vec::new();
            qdot_rows(simd_level(), &dec, 0, 0, n, &[&q], &mut scratch, &mut out).unwrap();
            got.extend_from_slice(&out);
            for i in 0..n {
                dec.decode(0, i, &mut row).unwrap();
                let d: f64 = row.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
                want.push(d as f32);
            }
        }
    }
    nmse(&got, &want)
}

#[test]
fn q8_path_is_within_nmse_1e4_of_f32() {
    for (f, sdt) in formats() {
        let e = q8_nmse(f, sdt, 0.0);
        let eo = q8_nmse(f, sdt, 0.01);
        eprintln!("{f} ({sdt}): q8 vs f32 NMSE {e:.2e} (1% outliers: {eo:.2e})");
        assert!(e <= NMSE_Q8, "{f} ({sdt}): NMSE {e:e} > {NMSE_Q8:e}");
        assert!(
            eo <= NMSE_Q8_OUTLIERS,
            "{f} ({sdt}): NMSE {eo:e} with outliers"
        );
    }
}

#[test]
fn zero_and_non_finite_activations() {
    for (f, sdt) in formats() {
        let (k, n) = (512, 3);
        let w = weights(f, 1, n, k, sdt, 5);
        let dec = decoder(&w).unwrap();
        let kind = kind_of_rows(&dec).unwrap();
        let zero = QRow::new(&vec![0f32; k], kind).unwrap();
        let mut x = activations(k, 9, 0.0);
        x[300] = f32::INFINITY;
        let inf = QRow::new(&x, kind).unwrap();
        for level in SimdLevel::ALL.into_iter().filter(|l| l.is_supported()) {
            let mut out = vec![f32::NAN; 2 * n];
            let mut s = Vec::new();
            qdot_rows(level, &dec, 0, 0, n, &[&zero, &inf], &mut s, &mut out).unwrap();
            assert!(out[..n].iter().all(|&v| v == 0.0), "{f} {level}: {out:?}");
            assert!(out[n..].iter().all(|v| v.is_nan()), "{f} {level}: {out:?}");
        }
    }
}
