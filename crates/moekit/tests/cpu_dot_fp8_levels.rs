//! The f32 dot kernels of the e4m3 formats (`fp8-b32/64/128`, MLX mxfp8)
//! give the same bits at every x86 level (the AVX512-VNNI level runs
//! 512-bit kernels of its own, `cpu::fast::dot::fp8_zmm`; the AVX-VNNI
//! level runs the AVX2 kernels): each level forced through `dot_rows_at`
//! against the AVX2 one, at row lengths with an odd number of groups,
//! activations with outliers, rows from a later start. (The portable f32
//! kernels round `a·b + c` twice unless built with FMA: they meet
//! `tests/cpu_dot.rs`' tolerance, not these bits.)

mod common_util;
use common_util::rng;
use moekit::cpu::SimdLevel;
use moekit::format::random::random_weights;
use moekit::testing::cpu_fast::{dot_rows_at, XSums};
use moekit::testing::{decoder, RowDecoder};
use moekit::{DType, WeightFormat};
use rand::Rng;

/// The dots of rows `n0..n` of expert `ex` at `level`, as bits.
#[allow(clippy::too_many_arguments)]
fn dots(
    level: SimdLevel,
    dec: &RowDecoder<'_>,
    ex: usize,
    n0: usize,
    n: usize,
    x: &[f32],
    xs: &XSums,
) -> Vec<u32> {
    let mut out = vec![f32::NAN; n - n0];
    let mut scratch = vec![0f32; x.len()];
    dot_rows_at(level, dec, ex, n0, x, xs, &mut scratch, &mut out).unwrap();
    out.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn e4m3_rows_are_the_same_bits_at_every_level() {
    if !SimdLevel::Avx2.is_supported() {
        eprintln!("no AVX2: nothing to compare");
        return;
    }
    let levels: Vec<SimdLevel> = SimdLevel::ALL
        .into_iter()
        .filter(|&l| l.is_supported() && l != SimdLevel::Portable)
        .collect();
    eprintln!("levels: {levels:?}");
    for (fi, name) in ["fp8-b32", "fp8-b64", "fp8-b128", "mlx-mxfp8"]
        .into_iter()
        .enumerate()
    {
        let f = WeightFormat::parse(name).unwrap();
        let gs = if fi == 3 { 32 } else { 32 << fi };
        for k in [128, 160, 384, 768, 2048, 2176] {
            if k % gs != 0 {
                continue;
            }
            let (e, n) = (2, 11);
            let seed = 31 * fi as u64 + k as u64;
            let w = random_weights(f, e, n, k, DType::F16, seed, &|| {}).unwrap();
            let dec = decoder(&w).unwrap();
            let mut r = rng(seed ^ 0xf8);
            // A heavy tail: a few large values among small ones.
            let x: Vec<f32> = (0..k)
                .map(|i| {
                    let v = r.random::<f32>() * 2.0 - 0.8;
                    if i % 97 == 5 {
                        v * 300.0
                    } else {
                        v
                    }
                })
                .collect();
            let xs = XSums::new(&x);
            for ex in 0..e {
                let want = dots(SimdLevel::Avx2, &dec, ex, 0, n, &x, &xs);
                for &l in &levels {
                    assert_eq!(
                        dots(l, &dec, ex, 0, n, &x, &xs),
                        want,
                        "{name} K={k} expert {ex} {l}"
                    );
                    assert_eq!(
                        dots(l, &dec, ex, 3, n, &x, &xs),
                        want[3..],
                        "{name} K={k} expert {ex} {l}: from row 3"
                    );
                }
            }
        }
    }
}
