// Shared helpers of the integration tests (included with `mod common_util;`).
#![allow(dead_code)]

use moekit::{DType, Tensor};
use rand::{Rng, SeedableRng};

/// ggml test-backend-ops' normalized mean squared error: Σ(a-b)² / Σb².
pub fn nmse(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    let (mut num, mut den) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        assert!(x.is_finite(), "non-finite value {x}");
        num += (x as f64 - y as f64).powi(2);
        den += (y as f64).powi(2);
    }
    if den == 0.0 {
        num
    } else {
        num / den
    }
}

pub fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

pub fn random_tensor(shape: &[usize], dtype: DType, seed: u64) -> Tensor {
    let mut r = rng(seed);
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| r.random::<f32>() * 2.0 - 1.0).collect();
    Tensor::from_f32(&v, shape, dtype).unwrap()
}

pub fn fixture(path: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(path)
}
