//! The integer dot kernels of quantized activations (`cpu::fast::qdot`):
//!
//! - every level this CPU supports (portable, AVX2, AVX-VNNI, AVX512-VNNI)
//!   equals, bit for bit, a scalar reference of the same quantized maths
//!   written here from the module's definition (integer lanes of 4 codes,
//!   `A[b % 2] += (w_scale·d_x)·f32(lanes)`, fixed final sum);
//! - the quantized path is within NMSE 1e-4 of the f32 path (f64 dots of
//!   the decoded rows with the unquantized activations);
//! - the activation quantizer's codes and scales, and rejections.

mod common_util;
use common_util::{nmse, rng};
use half::f16;
use moekit::cpu::{simd_level, SimdLevel};
use moekit::format::random::random_weights;
use moekit::format::{AffineParams, GgmlType};
use moekit::testing::cpu_fast::{kind_of, kind_of_affine, kind_of_rows, qdot_rows, QRow};
use moekit::testing::{decoder, RawRow};
use moekit::{DType, WeightFormat};
use rand::Rng;

/// The formats with integer kernels.
const TYPES: [GgmlType; 3] = [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K];

/// The quantized path vs the f32 one (llama.cpp's test-backend-ops bound
/// for `mul_mat_id`), on rows without outliers.
const NMSE_Q8: f64 = 1e-4;
/// With 1% of the activations 20 times larger (an outlier sets its block's
/// scale, coarsening the other codes of the block; measured ~1.2e-4).
const NMSE_Q8_OUTLIERS: f64 = 3e-4;

fn f16_at(b: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

/// ggml's `get_scale_min_k4`, all 8 groups.
fn scale_min_k4(q: &[u8]) -> [(i32, i32); 8] {
    std::array::from_fn(|j| {
        let (sc, m) = if j < 4 {
            (q[j] & 63, q[j + 4] & 63)
        } else {
            (
                (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
                (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
            )
        };
        (i32::from(sc), i32::from(m))
    })
}

/// Where weight `i` of 32-value block `b` (of `nb`) has its activation code:
/// for Q4_0 (interleaved) in each whole run of 4 blocks the first halves
/// of the 4 blocks, then the second halves; else in order.
fn code_at(t: GgmlType, nb: usize, b: usize, i: usize) -> usize {
    if t == GgmlType::Q4_0 && b < nb / 4 * 4 {
        128 * (b / 4) + 64 * (i / 16) + 16 * (b % 4) + i % 16
    } else {
        32 * b + i
    }
}

/// The offset term of a 32-value block whose codes are at `pos(i)`:
/// `8·Σ_k m_k·Σ(codes of lane k)`, its 8 lanes in stored order (with `pos`
/// giving the stored lanes in that order).
fn block_offset(a: &QRow, pos: &dyn Fn(usize) -> usize) -> f32 {
    let (y, m) = (a.codes(), a.lane_scales());
    let mut sum = 0f32;
    for j in 0..8 {
        let csum: i32 = (0..4).map(|k| i32::from(y[pos(4 * j + k)])).sum();
        sum += m[pos(4 * j) / 4] * csum as f32;
    }
    8.0 * sum
}

/// The scalar definition: lanes `L[j] = Σ_{k<4} w·y` over weights `4j..4j+4`
/// of each 32; 32-value blocks (Q4_0, Q8_0): `A[b % 4][j] = fma(s_b·m_j,
/// f32(L[j]), A[b % 4][j])` with `m_j` the lane's scale; Q4_K: the lanes
/// shifted by their shift, times the group scales, `A[b % 4][j] = fma(s_b,
/// f32(L[j]), A[b % 4][j])`. Then `Σ_j ((A0 + A1) + (A2 + A3))` in a fixed
/// tree, minus the offset terms (Q4_0: `O[b % 4] = fma(s_b, 8·Σ m·Σy,
/// O[b % 4])`; Q4_K: the mins, `O[b % 4] = fma(dmin_b·d_b, Σ m·Σy,
/// O[b % 4])`; summed `(O0 + O1) + (O2 + O3)`).
fn reference(t: GgmlType, row: &[u8], a: &QRow) -> f32 {
    let (y, dx, sh, ms) = (a.codes(), a.scales(), a.shifts(), a.lane_scales());
    let mut acc = [[0f32; 8]; 4];
    let mut offs = [0f32; 4];
    let bs = t.type_size();
    let nb = row.len() / bs;
    // Integer lanes of 32 weights whose codes are at `pos(i)`.
    let lanes = |w: &[i32], pos: &dyn Fn(usize) -> usize| -> [i32; 8] {
        std::array::from_fn(|j| {
            (0..4)
                .map(|k| w[4 * j + k] * y[pos(4 * j + k)] as i32)
                .sum()
        })
    };
    // The lanes' scales of a 32-value block.
    let scales =
        |pos: &dyn Fn(usize) -> usize| -> [f32; 8] { std::array::from_fn(|j| ms[pos(4 * j) / 4]) };
    for (b, blk) in row.chunks_exact(bs).enumerate() {
        let pos = |i: usize| code_at(t, nb, b, i);
        let (l, s, m) = match t {
            GgmlType::Q4_0 => {
                // Codes 0..16; the −8 as the block's offset term.
                let w: Vec<i32> = (0..32)
                    .map(|i| {
                        let q = blk[2 + i % 16];
                        i32::from(if i < 16 { q & 15 } else { q >> 4 })
                    })
                    .collect();
                let s = f16_at(blk) * dx[b];
                offs[b % 4] = s.mul_add(block_offset(a, &pos), offs[b % 4]);
                (lanes(&w, &pos), s, scales(&pos))
            }
            GgmlType::Q8_0 => {
                let w: Vec<i32> = (0..32).map(|i| i32::from(blk[2 + i] as i8)).collect();
                (lanes(&w, &pos), f16_at(blk) * dx[b], scales(&pos))
            }
            GgmlType::Q4_K => {
                let sm = scale_min_k4(&blk[4..16]);
                let mut l = [0i32; 8];
                let mut summ = 0i32;
                for (g, &(sc, m)) in sm.iter().enumerate() {
                    let w: Vec<i32> = (0..32)
                        .map(|i| i32::from((blk[16 + 32 * (g / 2) + i] >> (4 * (g % 2))) & 15))
                        .collect();
                    let at = 256 * b + 32 * g;
                    let lg = lanes(&w, &|i| at + i);
                    for (j, (l, lg)) in l.iter_mut().zip(lg).enumerate() {
                        *l += sc * (lg << sh[at / 4 + j]);
                    }
                    summ += m
                        * (0..32)
                            .map(|i| i32::from(y[at + i]) << sh[(at + i) / 4])
                            .sum::<i32>();
                }
                offs[b % 4] = (f16_at(&blk[2..]) * dx[b]).mul_add(summ as f32, offs[b % 4]);
                (l, f16_at(blk) * dx[b], [1.0; 8])
            }
            _ => unreachable!(),
        };
        for ((a, l), m) in acc[b % 4].iter_mut().zip(l).zip(m) {
            *a = (s * m).mul_add(l as f32, *a);
        }
    }
    let l: Vec<f32> = (0..8)
        .map(|j| (acc[0][j] + acc[1][j]) + (acc[2][j] + acc[3][j]))
        .collect();
    let off = (offs[0] + offs[1]) + (offs[2] + offs[3]);
    (((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))) - off
}

/// Activations with a nonzero mean (uniform in [−0.7, 1.3)), a fraction
/// `outliers` of them 20 times larger.
fn activations_with(k: usize, seed: u64, outliers: f32) -> Vec<f32> {
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

/// [`activations_with`] 1% outliers.
fn activations(k: usize, seed: u64) -> Vec<f32> {
    activations_with(k, seed, 0.01)
}

fn supported_levels() -> Vec<SimdLevel> {
    SimdLevel::ALL
        .into_iter()
        .filter(|l| l.is_supported())
        .collect()
}

#[test]
fn every_level_equals_the_scalar_reference_bit_for_bit() {
    let levels = supported_levels();
    eprintln!("levels: {levels:?}");
    for t in TYPES {
        let kind = kind_of(t).unwrap();
        for k in [256, 768, 800, 2048, 2080, 2816] {
            if k % t.block_size() != 0 {
                continue;
            }
            let (e, n) = (2, 9);
            let w = random_weights(WeightFormat::Ggml(t), e, n, k, DType::F16, k as u64, &|| {})
                .unwrap();
            let dec = decoder(&w).unwrap();
            // 6 rows: a group of 4, then one of 2.
            let xs: Vec<Vec<f32>> = (0..6).map(|i| activations(k, 7 * i + k as u64)).collect();
            let qs: Vec<QRow> = xs.iter().map(|x| QRow::new(x, kind).unwrap()).collect();
            for ex in 0..e {
                let mut want = vec![0f32; qs.len() * n];
                for (ti, q) in qs.iter().enumerate() {
                    for i in 0..n {
                        let RawRow::Ggml(_, bytes) = dec.raw_row(ex, i).unwrap() else {
                            panic!()
                        };
                        want[ti * n + i] = reference(t, bytes, q);
                    }
                }
                for &level in &levels {
                    for rows in 1..=qs.len() {
                        let acts: Vec<&QRow> = qs[..rows].iter().collect();
                        let mut out = vec![f32::NAN; rows * n];
                        let mut scratch = Vec::new();
                        qdot_rows(level, &dec, ex, 0, n, &acts, &mut scratch, &mut out).unwrap();
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&out),
                            bits(&want[..rows * n]),
                            "{t} K={k} expert {ex} {level} with {rows} rows"
                        );
                    }
                    // A run from a later row.
                    let acts = [&qs[0]];
                    let mut out = vec![0f32; n - 2];
                    let mut scratch = Vec::new();
                    qdot_rows(level, &dec, ex, 2, n - 2, &acts, &mut scratch, &mut out).unwrap();
                    assert_eq!(out, want[2..n], "{t} K={k} {level}: run from row 2");
                }
            }
        }
    }
}

/// NMSE of the quantized path against f64 dots of the decoded rows with the
/// unquantized activations, over 512 rows of K = 768 and 2048.
fn q8_nmse(t: GgmlType, outliers: f32) -> f64 {
    {
        let kind = kind_of(t).unwrap();
        let (mut got, mut want) = (Vec::new(), Vec::new());
        for (si, k) in [768usize, 2048].into_iter().enumerate() {
            let n = 64;
            let w = random_weights(
                WeightFormat::Ggml(t),
                1,
                n,
                k,
                DType::F16,
                si as u64,
                &|| {},
            )
            .unwrap();
            let dec = decoder(&w).unwrap();
            let mut row = vec![0f32; k];
            for s in 0..4 {
                let x = activations_with(k, 100 * si as u64 + s, outliers);
                let q = QRow::new(&x, kind).unwrap();
                let mut out = vec![0f32; n];
                qdot_rows(
                    simd_level(),
                    &dec,
                    0,
                    0,
                    n,
                    &[&q],
                    &mut Vec::new(),
                    &mut out,
                )
                .unwrap();
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
}

#[test]
fn q8_path_is_within_nmse_1e4_of_f32_for_every_format() {
    for t in TYPES {
        let e = q8_nmse(t, 0.0);
        let eo = q8_nmse(t, 0.01);
        eprintln!("{t}: q8 vs f32 NMSE {e:.2e} (1% outliers: {eo:.2e})");
        assert!(e <= NMSE_Q8, "{t}: NMSE {e:e} > {NMSE_Q8:e}");
        assert!(eo <= NMSE_Q8_OUTLIERS, "{t}: NMSE {eo:e} with outliers");
    }
}

#[test]
fn quantized_rows_round_to_the_nearest_code() {
    for t in TYPES {
        let kind = kind_of(t).unwrap();
        let bs = kind.block();
        let mut x = activations(2 * bs, 5);
        x[bs..].fill(0.0); // an all-zero block
        x[4..8].iter_mut().for_each(|v| *v *= 0.01); // a lane of small values
        let q = QRow::new(&x, kind).unwrap();
        assert_eq!(q.scales().len(), 2);
        assert!(q.codes()[bs..].iter().all(|&c| c == 0));
        assert!(q.codes()[..bs].iter().any(|&c| c.abs() == 127));
        // Two blocks: Q4_0's runs of 4 are not reached, codes in order.
        if bs == 32 {
            // Each lane: its own scale a/127, codes round(x·127/a).
            assert_eq!(q.scales(), &[1.0, 1.0]);
            assert!(q.shifts().is_empty());
            for (l, xl) in x.chunks(4).enumerate() {
                let a = xl.iter().fold(0f32, |m, v| m.max(v.abs()));
                let m = q.lane_scales()[l];
                assert_eq!(m, a / 127.0, "{t}: lane {l}");
                for (i, &v) in xl.iter().enumerate() {
                    let c = q.codes()[4 * l + i];
                    assert!(c > -128, "{t}: code {c}");
                    assert!((v - m * c as f32).abs() <= m * 0.5001, "{t}: {v} -> {c}");
                }
            }
        } else {
            let d = q.scales()[0];
            let amax = x[..bs].iter().fold(0f32, |m, v| m.max(v.abs()));
            assert_eq!(d, amax / 1016.0, "{t}: amax/(127·8)");
            assert_eq!(q.scales()[1], 0.0);
            for (l, xl) in x[..bs].chunks(4).enumerate() {
                let s = q.shifts()[l];
                let a = xl.iter().fold(0f32, |m, v| m.max(v.abs()));
                // The smallest shift whose codes still fit: a·2^(3−s) ≤ amax.
                assert!(
                    s <= 3 && a * (8 >> s) as f32 <= amax,
                    "{t}: lane {l} shift {s}"
                );
                if s > 0 {
                    assert!(
                        a * (16 >> s) as f32 > amax,
                        "{t}: lane {l}: shift {s} not minimal"
                    );
                }
                for (i, &v) in xl.iter().enumerate() {
                    let c = q.codes()[4 * l + i];
                    assert!(c > -128, "{t}: code {c}");
                    let step = d * (1 << s) as f32;
                    assert!(
                        (v - step * c as f32).abs() <= step * 0.5001,
                        "{t}: {v} -> {c} << {s}"
                    );
                }
            }
            assert_eq!(
                q.shifts()[1],
                0,
                "{t}: the small lane gets the finest steps"
            );
            let sums: Vec<i32> = (0..2 * bs / 16)
                .map(|r| {
                    (16 * r..16 * r + 16)
                        .map(|i| (q.codes()[i] as i32) << q.shifts()[i / 4])
                        .sum()
                })
                .collect();
            assert_eq!(q.sums16(), sums.as_slice());
        }
        assert!(nmse(&q.dequantize(), &x) < 1e-4, "{t}: dequantized row");
        // A non-finite value makes its block's scale NaN.
        x[3] = f32::INFINITY;
        let q = QRow::new(&x, kind).unwrap();
        assert!(q.scales()[0].is_nan() && !q.scales()[1].is_nan());
        // A length that is not whole blocks is an error.
        assert!(QRow::new(&x[..bs - 1], kind).is_err());
    }
    // Q4_0's codes are interleaved in runs of 4 blocks: the same codes as
    // Q8_0's (same blocks, same rounding), reordered.
    let x = activations(32 * 9, 8);
    let (q4, q8) = (
        QRow::new(&x, kind_of(GgmlType::Q4_0).unwrap()).unwrap(),
        QRow::new(&x, kind_of(GgmlType::Q8_0).unwrap()).unwrap(),
    );
    assert!(q4.kind().interleaved() && !q8.kind().interleaved());
    assert_eq!(q4.dequantize(), q8.dequantize());
    for b in 0..9 {
        for i in 0..32 {
            let at = code_at(GgmlType::Q4_0, 9, b, i);
            assert_eq!(
                q4.codes()[at],
                q8.codes()[32 * b + i],
                "block {b} weight {i}"
            );
            assert_eq!(q4.lane_scales()[at / 4], q8.lane_scales()[(32 * b + i) / 4]);
        }
    }
    assert_ne!(q4.codes(), q8.codes());
}

#[test]
fn qdot_rows_rejects_bad_arguments() {
    let w = random_weights(
        WeightFormat::Ggml(GgmlType::Q4_K),
        2,
        3,
        256,
        DType::F16,
        1,
        &|| {},
    )
    .unwrap();
    let dec = decoder(&w).unwrap();
    let x = vec![0.5f32; 256];
    let q = QRow::new(&x, kind_of(GgmlType::Q4_K).unwrap()).unwrap();
    let other = QRow::new(&x, kind_of(GgmlType::Q4_0).unwrap()).unwrap();
    let short = QRow::new(&x[..128], kind_of(GgmlType::Q4_K).unwrap());
    assert!(short.is_err(), "128 values are not a 256-block row");
    let l = simd_level();
    let mut s = Vec::new();
    let mut out = [0f32; 2];
    assert!(qdot_rows(l, &dec, 0, 0, 2, &[&q], &mut s, &mut out).is_ok());
    assert!(
        qdot_rows(l, &dec, 0, 2, 2, &[&q], &mut s, &mut out).is_err(),
        "past the rows"
    );
    assert!(
        qdot_rows(l, &dec, 2, 0, 2, &[&q], &mut s, &mut out).is_err(),
        "no expert 2"
    );
    assert!(
        qdot_rows(l, &dec, 0, 0, 2, &[&other], &mut s, &mut out).is_err(),
        "wrong kind"
    );
    assert!(
        qdot_rows(l, &dec, 0, 0, 1, &[&q], &mut s, &mut out).is_err(),
        "out length"
    );
    for level in SimdLevel::ALL.into_iter().filter(|l| !l.is_supported()) {
        assert!(qdot_rows(level, &dec, 0, 0, 2, &[&q], &mut s, &mut out).is_err());
    }
    // Formats without integer kernels.
    let f = random_weights(
        WeightFormat::Ggml(GgmlType::Q6_K),
        1,
        1,
        256,
        DType::F16,
        1,
        &|| {},
    )
    .unwrap();
    assert!(qdot_rows(
        l,
        &decoder(&f).unwrap(),
        0,
        0,
        1,
        &[&q],
        &mut s,
        &mut out[..1]
    )
    .is_err());
}

/// Which integer kernels run on this machine: the best level the CPU
/// supports (unless `MOEKIT_CPU_LEVEL` caps it).
#[test]
fn dispatch_picks_the_best_integer_level() {
    let level = simd_level();
    eprintln!("integer dot kernels: {level}");
    if std::env::var_os(moekit::cpu::LEVEL_ENV).is_none() {
        assert_eq!(level, SimdLevel::detect());
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            assert_eq!(level, SimdLevel::Avx512Vnni);
        }
    }
}

/// Single-thread throughput of the integer kernels against the f32 fused
/// dots on a decode-sized working set (not a test; run with `cargo test
/// --release --test cpu_qdot -- --ignored --nocapture`; formats from
/// `QDOT_BENCH_FORMATS`, row length from `QDOT_BENCH_K`, rows per expert
/// from `QDOT_BENCH_ROWS` (e.g. 128: a working set in L2), activation rows
/// per call from `QDOT_BENCH_T`, levels from `QDOT_BENCH_LEVELS`, experts
/// from `QDOT_BENCH_E`: e.g. 32 for weights beyond the L3 cache). Best of
/// interleaved rounds.
#[test]
#[ignore]
fn bench_qdot_rows() {
    use moekit::testing::cpu_fast::{dot_rows, XSums};
    let env = |k: &str, d: usize| std::env::var(k).map_or(d, |v| v.parse().unwrap());
    let names = std::env::var("QDOT_BENCH_FORMATS").unwrap_or_else(|_| "q4_0,q8_0,q4_k".into());
    let k = env("QDOT_BENCH_K", 2048);
    let n = env("QDOT_BENCH_ROWS", 2304 * 2048 / k);
    let tn = env("QDOT_BENCH_T", 1);
    let e = env("QDOT_BENCH_E", 8);
    let xs: Vec<Vec<f32>> = (0..tn).map(|t| activations(k, t as u64)).collect();
    let sums: Vec<XSums> = xs.iter().map(|x| XSums::new(x)).collect();
    let levels: Vec<SimdLevel> = match std::env::var("QDOT_BENCH_LEVELS") {
        Ok(v) => v.split(',').filter_map(SimdLevel::parse).collect(),
        Err(_) => supported_levels(),
    };
    for name in names.split(',') {
        let f = WeightFormat::parse(name).unwrap();
        let w = random_weights(f, e, n, k, DType::F16, 3, &|| {}).unwrap();
        let dec = decoder(&w).unwrap();
        let kind = kind_of_rows(&dec).expect("a format with integer kernels");
        let qs: Vec<QRow> = xs.iter().map(|x| QRow::new(x, kind).unwrap()).collect();
        let acts: Vec<&QRow> = qs.iter().collect();
        // Case 0: f32 fused dots; then each level's integer kernels.
        let mut best = vec![f64::MAX; levels.len() + 1];
        let mut out = vec![0f32; tn * 128];
        let mut scratch = vec![0f32; k];
        let mut qs_scratch = Vec::new();
        for _ in 0..env("QDOT_BENCH_ROUNDS", 20) {
            for (ci, b) in best.iter_mut().enumerate() {
                let t0 = std::time::Instant::now();
                for ex in 0..e {
                    for c in 0..n / 128 {
                        if ci == 0 {
                            for (ti, x) in xs.iter().enumerate() {
                                let o = &mut out[ti * 128..(ti + 1) * 128];
                                dot_rows(&dec, ex, 128 * c, x, &sums[ti], &mut scratch, o).unwrap();
                            }
                        } else {
                            let l = levels[ci - 1];
                            qdot_rows(l, &dec, ex, 128 * c, 128, &acts, &mut qs_scratch, &mut out)
                                .unwrap();
                        }
                    }
                }
                *b = b.min(t0.elapsed().as_secs_f64());
            }
        }
        let bytes = (w.bytes_per_expert() * e) as f64;
        let mut line = format!(
            "{name:<6} K={k} T={tn}: f32 {:6.2} GB/s",
            bytes / best[0] / 1e9
        );
        for (l, b) in levels.iter().zip(&best[1..]) {
            line += &format!("  {l} {:6.2} GB/s", bytes / b / 1e9);
        }
        println!("{line}");
    }
}

/// The scalar definition for MLX 4-bit affine rows: block `b`'s codes from
/// bytes `16b..16b + 16` (byte `k`: codes `2k`, `2k + 1`), lanes over the
/// activations' even (lanes 0..4) and odd (4..8) values, `A[b % 4][j] =
/// fma(s_g·d_b·m_j, f32(L[j]), A[b % 4][j])` with `m_j` the lane's scale,
/// the blocks' `O[b % 4] = fma(s_g·d_b, 8·Σ m·Σy, O[b % 4])`; the biases'
/// `P[g % 4] = fma(8·s_g + b_g, Σx_g, P[g % 4])` with `Σx_g` the group's
/// block sums in order; `tree(A) − (ΣO − ΣP)`.
fn affine_reference(raw: RawRow<'_>, a: &QRow) -> f32 {
    let RawRow::Affine {
        params,
        words,
        scales,
        biases,
    } = raw
    else {
        panic!("not affine")
    };
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let (y, dx, ms) = (a.codes(), a.scales(), a.lane_scales());
    let nb = bytes.len() / 16;
    let bpg = params.group_size / 32;
    // Stored position of value i of block b: half i % 2, position i / 2.
    let pos = |b: usize, i: usize| -> usize {
        let (h, p) = (i % 2, i / 2);
        if b < nb / 4 * 4 {
            128 * (b / 4) + 64 * h + 16 * (b % 4) + p
        } else {
            32 * b + 16 * h + p
        }
    };
    let mut acc = [[0f32; 8]; 4];
    let mut offs = [0f32; 4];
    for b in 0..nb {
        let code = |i: usize| -> i32 {
            let byte = bytes[16 * b + i / 2];
            i32::from(if i.is_multiple_of(2) {
                byte & 15
            } else {
                byte >> 4
            })
        };
        let s = scales.get(b / bpg) * dx[b];
        // Stored lane j: values of parity j / 4, positions 4(j % 4)..+4.
        let value = |j: usize, k: usize| 2 * (4 * (j % 4) + k) + j / 4;
        let stored = |i: usize| pos(b, value(i / 4, i % 4));
        offs[b % 4] = s.mul_add(block_offset(a, &stored), offs[b % 4]);
        for (j, acc) in acc[b % 4].iter_mut().enumerate() {
            let l: i32 = (0..4)
                .map(|k| code(value(j, k)) * i32::from(y[pos(b, value(j, k))]))
                .sum();
            let m = ms[pos(b, value(j, 0)) / 4];
            *acc = (s * m).mul_add(l as f32, *acc);
        }
    }
    let mut bias = [0f32; 4];
    for (g, xs) in a.block_sums().chunks(bpg).enumerate() {
        let gx: f32 = xs.iter().sum();
        let c = 8.0 * scales.get(g) + biases.get(g);
        bias[g % 4] = c.mul_add(gx, bias[g % 4]);
    }
    let l: Vec<f32> = (0..8)
        .map(|j| (acc[0][j] + acc[1][j]) + (acc[2][j] + acc[3][j]))
        .collect();
    let off =
        ((offs[0] + offs[1]) + (offs[2] + offs[3])) - ((bias[0] + bias[1]) + (bias[2] + bias[3]));
    (((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))) - off
}

#[test]
fn affine4_every_level_equals_the_scalar_reference_bit_for_bit() {
    let levels = supported_levels();
    for gs in [32, 64, 128] {
        let kind = kind_of_affine(AffineParams {
            bits: 4,
            group_size: gs,
        })
        .unwrap();
        assert!(kind.paired() && kind.interleaved());
        for sdt in [DType::F16, DType::Bf16, DType::F32] {
            for k in [256, 640, 800, 1088, 2048] {
                if k % gs != 0 {
                    continue;
                }
                let (e, n) = (2, 7);
                let f = WeightFormat::Affine(AffineParams {
                    bits: 4,
                    group_size: gs,
                });
                let w = random_weights(f, e, n, k, sdt, k as u64 + gs as u64, &|| {}).unwrap();
                let dec = decoder(&w).unwrap();
                let xs: Vec<Vec<f32>> = (0..5).map(|i| activations(k, 3 * i + k as u64)).collect();
                let qs: Vec<QRow> = xs.iter().map(|x| QRow::new(x, kind).unwrap()).collect();
                for ex in 0..e {
                    let mut want = vec![0f32; qs.len() * n];
                    for (ti, q) in qs.iter().enumerate() {
                        for i in 0..n {
                            want[ti * n + i] = affine_reference(dec.raw_row(ex, i).unwrap(), q);
                        }
                    }
                    for &level in &levels {
                        let acts: Vec<&QRow> = qs.iter().collect();
                        let mut out = vec![f32::NAN; qs.len() * n];
                        qdot_rows(level, &dec, ex, 0, n, &acts, &mut Vec::new(), &mut out).unwrap();
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&out),
                            bits(&want),
                            "affine4-g{gs} ({sdt}) K={k} expert {ex} {level}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn affine4_q8_path_is_within_nmse_1e4_of_f32() {
    for (gs, sdt) in [
        (64, DType::F16),
        (64, DType::Bf16),
        (32, DType::F16),
        (128, DType::F32),
    ] {
        let p = AffineParams {
            bits: 4,
            group_size: gs,
        };
        let kind = kind_of_affine(p).unwrap();
        for outliers in [0.0, 0.01] {
            let (mut got, mut want) = (Vec::new(), Vec::new());
            for (si, k) in [768usize, 2048].into_iter().enumerate() {
                let n = 64;
                let w = random_weights(WeightFormat::Affine(p), 1, n, k, sdt, si as u64, &|| {})
                    .unwrap();
                let dec = decoder(&w).unwrap();
                let mut row = vec![0f32; k];
                for s in 0..4 {
                    let x = activations_with(k, 100 * si as u64 + s, outliers);
                    let q = QRow::new(&x, kind).unwrap();
                    let mut out = vec![0f32; n];
                    qdot_rows(
                        simd_level(),
                        &dec,
                        0,
                        0,
                        n,
                        &[&q],
                        &mut Vec::new(),
                        &mut out,
                    )
                    .unwrap();
                    got.extend_from_slice(&out);
                    for i in 0..n {
                        dec.decode(0, i, &mut row).unwrap();
                        let d: f64 = row.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
                        want.push(d as f32);
                    }
                }
            }
            let e = nmse(&got, &want);
            eprintln!("affine4-g{gs} ({sdt}, {outliers} outliers): q8 vs f32 NMSE {e:.2e}");
            let bound = if outliers > 0.0 {
                NMSE_Q8_OUTLIERS
            } else {
                NMSE_Q8
            };
            assert!(e <= bound, "affine4-g{gs} {sdt}: NMSE {e:e}");
        }
    }
}
