//! MLX affine quantization vs `mx.quantize` / `mx.dequantize` / `mx.gather_qmm`
//! (fixtures from `scripts/fixtures/affine.py`, see `fixtures/affine/README.md`).
//!
//! Thresholds: quantize is bit-exact (codes, scales, biases, including the
//! sign of zero); `dequantize_row` with f32 scales is bit-exact. With f16/bf16
//! scales MLX dequantizes in that dtype (two roundings), we return the exact
//! f32 `s·q + b`: checked exactly against `round(round(s·q) + b)` and by NMSE
//! (f16 < 1e-6, bf16 < 1e-4). gather_qmm fixtures vs our dequantize + f64
//! dot: NMSE < 1e-10.

use half::{bf16, f16};
use moekit::format::affine::{
    dequantize_row, dequantize_u8_row, pack_codes, quantize, random_quantized, unpack_codes,
    SUPPORTED_BITS, SUPPORTED_GROUP_SIZES,
};
use moekit::npy::NpyArray;
use moekit::{Error, Float};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ROWS: usize = 3;
const COLS: usize = 256;

fn load(name: &str) -> NpyArray {
    let path = format!(
        "{}/../../fixtures/affine/{name}.npy",
        env!("CARGO_MANIFEST_DIR")
    );
    NpyArray::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A scale dtype under test: its fixture name and how its arrays are stored.
trait TestFloat: Float + std::fmt::Debug {
    const NAME: &'static str;
    fn read(a: &NpyArray) -> Vec<f32> {
        a.to_f32().expect("float array")
    }
}
impl TestFloat for f32 {
    const NAME: &'static str = "f32";
}
impl TestFloat for f16 {
    const NAME: &'static str = "f16";
}
impl TestFloat for bf16 {
    const NAME: &'static str = "bf16";
    fn read(a: &NpyArray) -> Vec<f32> {
        a.bf16_bits_to_f32().expect("bf16 bits")
    }
}

fn bits_of<S: Float>(v: &[S]) -> Vec<u32> {
    v.iter().map(|x| x.to_f32().to_bits()).collect()
}

fn f32_bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn nmse(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
        .sum();
    let den: f64 = b.iter().map(|&y| f64::from(y).powi(2)).sum();
    num / den
}

fn round_to<S: Float>(x: f32) -> f32 {
    S::from_f32(x).to_f32()
}

fn dequantize_matrix<S: Float>(
    bits: u32,
    gs: usize,
    rows: usize,
    cols: usize,
    q: &moekit::format::affine::AffineQuantized<S>,
) -> Vec<f32> {
    let (wpr, gpr) = (cols * bits as usize / 32, cols / gs);
    let mut out = vec![0f32; rows * cols];
    for (r, o) in out.chunks_exact_mut(cols).enumerate() {
        dequantize_row(
            bits,
            gs,
            &q.packed[r * wpr..(r + 1) * wpr],
            &q.scales[r * gpr..(r + 1) * gpr],
            &q.biases[r * gpr..(r + 1) * gpr],
            o,
        )
        .expect("dequantize_row");
    }
    out
}

fn check_quantize<S: TestFloat>() {
    for bits in SUPPORTED_BITS {
        for gs in SUPPORTED_GROUP_SIZES {
            let pre = format!("q_b{bits}_g{gs}");
            let dt = S::NAME;
            let w = S::read(&load(&format!("{pre}_w_{dt}")));
            let want_q = load(&format!("{pre}_{dt}_wq")).to_u32().expect("u32");
            let want_s = S::read(&load(&format!("{pre}_{dt}_scales")));
            let want_b = S::read(&load(&format!("{pre}_{dt}_biases")));
            let ctx = format!("bits {bits} group {gs} {dt}");

            let got = quantize::<S>(&w, ROWS, COLS, bits, gs).expect("quantize");
            assert_eq!(got.packed.len(), ROWS * COLS * bits as usize / 32, "{ctx}");
            assert_eq!(got.packed, want_q, "{ctx}: packed codes");
            assert_eq!(bits_of(&got.scales), f32_bits(&want_s), "{ctx}: scales");
            assert_eq!(bits_of(&got.biases), f32_bits(&want_b), "{ctx}: biases");

            // The f32 original rounds to the same S input, hence the same result.
            let w32 = load(&format!("{pre}_w_f32")).to_f32().expect("f32");
            let got32 = quantize::<S>(&w32, ROWS, COLS, bits, gs).expect("quantize");
            assert_eq!(got32.packed, got.packed, "{ctx}: from the f32 original");
            assert_eq!(
                bits_of(&got32.scales),
                bits_of(&got.scales),
                "{ctx}: f32 original"
            );
            assert_eq!(
                bits_of(&got32.biases),
                bits_of(&got.biases),
                "{ctx}: f32 original"
            );
        }
    }
}

#[test]
fn quantize_f32_bit_exact() {
    check_quantize::<f32>();
}

#[test]
fn quantize_f16_bit_exact() {
    check_quantize::<f16>();
}

#[test]
fn quantize_bf16_bit_exact() {
    check_quantize::<bf16>();
}

fn check_dequantize<S: TestFloat>() -> f64 {
    let mut worst = 0f64;
    for bits in SUPPORTED_BITS {
        for gs in SUPPORTED_GROUP_SIZES {
            let pre = format!("q_b{bits}_g{gs}");
            let dt = S::NAME;
            let ctx = format!("bits {bits} group {gs} {dt}");
            let packed = load(&format!("{pre}_{dt}_wq")).to_u32().expect("u32");
            let scales: Vec<S> = S::read(&load(&format!("{pre}_{dt}_scales")))
                .into_iter()
                .map(S::from_f32)
                .collect();
            let biases: Vec<S> = S::read(&load(&format!("{pre}_{dt}_biases")))
                .into_iter()
                .map(S::from_f32)
                .collect();
            let mlx = S::read(&load(&format!("{pre}_{dt}_deq")));
            let q = moekit::format::affine::AffineQuantized {
                packed,
                scales,
                biases,
            };
            let ours = dequantize_matrix(bits, gs, ROWS, COLS, &q);

            // Independent decode: unpack_codes + the formula in MLX's dtype.
            let codes = unpack_codes(bits, &q.packed).expect("unpack");
            assert_eq!(codes.len(), ROWS * COLS);
            for (k, (&o, &m)) in ours.iter().zip(&mlx).enumerate() {
                let g = k / gs;
                let (s, b) = (q.scales[g].to_f32(), q.biases[g].to_f32());
                let exact = f32::from(codes[k]) * s + b;
                assert_eq!(o.to_bits(), exact.to_bits(), "{ctx}: k {k} vs s*q+b");
                let in_dtype = round_to::<S>(round_to::<S>(f32::from(codes[k]) * s) + b);
                assert_eq!(m.to_bits(), in_dtype.to_bits(), "{ctx}: k {k}: MLX formula");
            }
            let e = nmse(&ours, &mlx);
            worst = worst.max(e);
        }
    }
    worst
}

#[test]
fn dequantize_f32_bit_exact() {
    assert_eq!(check_dequantize::<f32>(), 0.0);
}

#[test]
fn dequantize_f16_nmse() {
    let e = check_dequantize::<f16>();
    println!("dequantize f16 scales: worst NMSE vs mx.dequantize {e:.3e}");
    assert!(e < 1e-6, "NMSE {e}");
}

#[test]
fn dequantize_bf16_nmse() {
    let e = check_dequantize::<bf16>();
    println!("dequantize bf16 scales: worst NMSE vs mx.dequantize {e:.3e}");
    assert!(e < 1e-4, "NMSE {e}");
}

/// mlx-native's unpacked layout decodes to exactly MLX's f32 dequantize.
#[test]
fn dequantize_u8_matches_mlx() {
    for bits in SUPPORTED_BITS {
        for gs in SUPPORTED_GROUP_SIZES {
            let pre = format!("q_b{bits}_g{gs}_f32");
            let codes = unpack_codes(bits, &load(&format!("{pre}_wq")).to_u32().expect("u32"))
                .expect("unpack");
            let s = load(&format!("{pre}_scales")).to_f32().expect("f32");
            let b = load(&format!("{pre}_biases")).to_f32().expect("f32");
            let mlx = load(&format!("{pre}_deq")).to_f32().expect("f32");
            let gpr = COLS / gs;
            let mut out = vec![0f32; COLS];
            for r in 0..ROWS {
                let g = r * gpr..(r + 1) * gpr;
                dequantize_u8_row(
                    gs,
                    &codes[r * COLS..(r + 1) * COLS],
                    &s[g.clone()],
                    &b[g],
                    &mut out,
                )
                .expect("dequantize_u8_row");
                assert_eq!(
                    f32_bits(&out),
                    f32_bits(&mlx[r * COLS..(r + 1) * COLS]),
                    "bits {bits} group {gs} row {r}"
                );
            }
        }
    }
}

/// gather_qmm fixtures are consistent with our dequantize + a float64 dot
/// (checks the fixtures and dequantize_row on [E, N, K] data).
#[test]
fn gather_qmm_fixtures_consistent() {
    for bits in [4u32, 8, 3] {
        for gs in [64usize, 32] {
            let pre = format!("gqmm_b{bits}_g{gs}");
            let (e, n, k, m) = (4usize, 48usize, 256usize, 10usize);
            let x = load(&format!("{pre}_x")).to_f32().expect("f32");
            let wq = load(&format!("{pre}_wq"));
            assert_eq!(wq.shape, vec![e, n, k * bits as usize / 32]);
            let q = moekit::format::affine::AffineQuantized {
                packed: wq.to_u32().expect("u32"),
                scales: load(&format!("{pre}_scales")).to_f32().expect("f32"),
                biases: load(&format!("{pre}_biases")).to_f32().expect("f32"),
            };
            let ids = load(&format!("{pre}_ids")).to_u32().expect("u32");
            let want = load(&format!("{pre}_out"));
            assert_eq!(want.shape, vec![m, n]);
            let want = want.to_f32().expect("f32");
            assert!(!ids.contains(&1) && ids.contains(&0), "expert 1 unused");
            let w = dequantize_matrix(bits, gs, e * n, k, &q);
            let mut got = vec![0f32; m * n];
            for (row, o) in got.chunks_exact_mut(n).enumerate() {
                let ex = ids[row] as usize;
                let xr = &x[row * k..(row + 1) * k];
                for (j, o) in o.iter_mut().enumerate() {
                    let wr = &w[(ex * n + j) * k..(ex * n + j + 1) * k];
                    let d: f64 = xr
                        .iter()
                        .zip(wr)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum();
                    *o = d as f32;
                }
            }
            let err = nmse(&got, &want);
            assert!(err < 1e-10, "{pre}: NMSE {err}");
        }
    }
}

/// The fast decoder agrees with unpack_codes on random data of every shape,
/// and pack/unpack round-trip.
#[test]
fn roundtrip_random() {
    let mut rng = StdRng::seed_from_u64(42);
    for bits in SUPPORTED_BITS {
        let codes: Vec<u8> = (0..32 * 37)
            .map(|_| rng.random_range(0..(1u32 << bits)) as u8)
            .collect();
        let packed = pack_codes(bits, &codes).expect("pack");
        assert_eq!(packed.len(), 37 * bits as usize);
        assert_eq!(
            unpack_codes(bits, &packed).expect("unpack"),
            codes,
            "bits {bits}"
        );
        for gs in SUPPORTED_GROUP_SIZES {
            let (rows, cols) = (5, 3 * 128);
            let rq = random_quantized::<f16>(rows, cols, bits, gs, 7).expect("random");
            assert_eq!(
                rq,
                random_quantized::<f16>(rows, cols, bits, gs, 7).expect("random")
            );
            let deq = dequantize_matrix(bits, gs, rows, cols, &rq);
            let codes = unpack_codes(bits, &rq.packed).expect("unpack");
            for (i, (&d, &c)) in deq.iter().zip(&codes).enumerate() {
                let g = i / gs;
                let want = f32::from(c) * rq.scales[g].to_f32() + rq.biases[g].to_f32();
                assert_eq!(d.to_bits(), want.to_bits(), "bits {bits} gs {gs} i {i}");
            }
            let amax = deq.iter().fold(0f32, |a, &x| a.max(x.abs()));
            assert!(
                amax > 0.005 && amax < 0.12,
                "random weights O(0.01-0.1): max {amax}"
            );

            // quantize -> dequantize of random normal data: every weight within
            // one step of its group's grid, and NMSE shrinking with bits.
            let w: Vec<f32> = (0..rows * cols)
                .map(|_| {
                    let u: f32 = rng.random_range(-1.0..1.0);
                    let v: f32 = rng.random_range(-1.0..1.0);
                    0.05 * (u + v)
                })
                .collect();
            let q = quantize::<f32>(&w, rows, cols, bits, gs).expect("quantize");
            let deq = dequantize_matrix(bits, gs, rows, cols, &q);
            for (i, (&a, &b)) in w.iter().zip(&deq).enumerate() {
                let s = q.scales[i / gs].abs();
                assert!(
                    (a - b).abs() <= s * 1.0001,
                    "bits {bits} gs {gs} i {i}: {a} vs {b}, scale {s}"
                );
            }
            let e = nmse(&deq, &w);
            // Uniform error of a step s ≈ range/(2^bits − 1): NMSE ≈ s²/12 / var(w),
            // about 1/(2^bits − 1)² for this triangular data.
            let bound = 2.0 / f64::from((1u32 << bits) - 1).powi(2);
            println!("bits {bits} gs {gs}: roundtrip NMSE {e:.3e} (bound {bound:.1e})");
            assert!(
                e < bound,
                "bits {bits} gs {gs}: roundtrip NMSE {e} >= {bound}"
            );
        }
    }
}

fn is_invalid<T: std::fmt::Debug>(r: moekit::Result<T>, want_arg: &str) {
    match r {
        Err(Error::Invalid { arg, .. }) => assert_eq!(arg, want_arg),
        other => panic!("expected Invalid({want_arg}), got {other:?}"),
    }
}

#[test]
fn rejects_bad_arguments() {
    let w = vec![0.5f32; 2 * 128];
    for bits in [0u32, 1, 7, 9, 16] {
        is_invalid(quantize::<f32>(&w, 2, 128, bits, 64), "bits");
        is_invalid(random_quantized::<f32>(2, 128, bits, 64, 0), "bits");
        is_invalid(pack_codes(bits, &[0u8; 32]), "bits");
        is_invalid(unpack_codes(bits, &[0u32; 8]), "bits");
        let mut out = vec![0f32; 128];
        is_invalid(
            dequantize_row::<f32>(bits, 64, &[0; 64], &[1.0; 2], &[0.0; 2], &mut out),
            "bits",
        );
    }
    for gs in [0usize, 16, 48, 256] {
        is_invalid(quantize::<f32>(&w, 2, 128, 4, gs), "group_size");
        let mut out = vec![0f32; 128];
        is_invalid(
            dequantize_row::<f32>(4, gs, &[0; 16], &[1.0; 2], &[0.0; 2], &mut out),
            "group_size",
        );
    }
    // Shapes.
    is_invalid(quantize::<f32>(&w, 2, 96, 4, 64), "cols");
    is_invalid(quantize::<f32>(&w, 4, 128, 4, 64), "w");
    is_invalid(quantize::<f32>(&w[1..], 2, 128, 4, 64), "w");
    let mut out = vec![0f32; 128];
    is_invalid(
        dequantize_row::<f32>(4, 64, &[0; 15], &[1.0; 2], &[0.0; 2], &mut out),
        "packed",
    );
    is_invalid(
        dequantize_row::<f32>(3, 64, &[0; 13], &[1.0; 2], &[0.0; 2], &mut out),
        "packed",
    );
    is_invalid(
        dequantize_row::<f32>(4, 64, &[0; 16], &[1.0; 3], &[0.0; 2], &mut out),
        "scales",
    );
    is_invalid(
        dequantize_row::<f32>(4, 64, &[0; 16], &[1.0; 2], &[0.0; 1], &mut out),
        "biases",
    );
    let mut odd = vec![0f32; 100];
    is_invalid(
        dequantize_row::<f32>(4, 64, &[0; 16], &[1.0; 2], &[0.0; 2], &mut odd),
        "out",
    );
    assert!(dequantize_row::<f32>(4, 64, &[0; 16], &[1.0; 2], &[0.0; 2], &mut out).is_ok());
    // u8 layout.
    let codes = vec![3u8; 128];
    is_invalid(
        dequantize_u8_row(0, &codes, &[1.0; 2], &[0.0; 2], &mut out),
        "group_size",
    );
    is_invalid(
        dequantize_u8_row(64, &codes[1..], &[1.0; 2], &[0.0; 2], &mut out),
        "codes",
    );
    is_invalid(
        dequantize_u8_row(64, &codes, &[1.0; 1], &[0.0; 2], &mut out),
        "scales",
    );
    is_invalid(
        dequantize_u8_row(64, &codes, &[1.0; 2], &[0.0; 3], &mut out),
        "biases",
    );
    is_invalid(
        dequantize_u8_row(64, &codes[..100], &[1.0; 2], &[0.0; 2], &mut odd),
        "out",
    );
    dequantize_u8_row(64, &codes, &[2.0, 1.0], &[0.5, -1.0], &mut out).expect("ok");
    assert_eq!((out[0], out[64]), (6.5, 2.0));
    // Codes.
    is_invalid(pack_codes(4, &[0u8; 31]), "codes");
    is_invalid(pack_codes(3, &[8u8; 32]), "codes");
    is_invalid(unpack_codes(3, &[0u32; 4]), "packed");
}
