//! The fused dequantize-and-dot kernels of the fast CPU path
//! (`cpu::fast::dot::dot_row`) against an independent oracle: the row
//! dequantized by `RowDecoder::decode` and dotted with `x` in f64.
//!
//! Every format of `WeightFormat::all()` (affine with f32, f16 and bf16
//! scales), K ∈ {256, 2048, 2880} where K is a whole number of blocks/groups.
//! Formats with a fused kernel are called with an empty scratch row, which
//! the decode-then-dot fallback rejects, so the test also proves the fused
//! kernel ran.

mod common_util;
use common_util::{nmse, rng};
use moekit::cpu::{simd_level, SimdLevel};
use moekit::format::random::random_weights;
use moekit::format::GgmlType;
use moekit::testing::cpu_fast::{dot_row, dot_rows, dot_rows_at, XSums};
use moekit::testing::decoder;
use moekit::{DType, QuantWeights, WeightFormat};
use rand::Rng;

/// f32 accumulation (in a different order and with the per-block offsets
/// applied through block sums of x) vs an f64 dot of the decoded row:
/// NMSE over all rows ≤ 1e-10.
const NMSE_FUSED_VS_F64: f64 = 1e-10;

/// Every format and the scale dtypes to test it with.
fn cases() -> Vec<(WeightFormat, DType)> {
    let mut v = Vec::new();
    for f in WeightFormat::all() {
        match f {
            WeightFormat::Affine(_) => {
                v.extend([DType::F16, DType::F32, DType::Bf16].map(|d| (f, d)));
            }
            _ => v.push((f, DType::F16)),
        }
    }
    v
}

/// Formats with a fused kernel: all but mlx-native u8 codes and the GGUF
/// grid and ternary types (IQ1–IQ3, TQ*), whose rows are decoded, then
/// dotted.
fn has_fused_kernel(f: WeightFormat) -> bool {
    !matches!(
        f,
        WeightFormat::AffineU8 { .. }
            | WeightFormat::Ggml(
                GgmlType::IQ2_XXS
                    | GgmlType::IQ2_XS
                    | GgmlType::IQ2_S
                    | GgmlType::IQ3_XXS
                    | GgmlType::IQ3_S
                    | GgmlType::IQ1_S
                    | GgmlType::IQ1_M
                    | GgmlType::TQ1_0
                    | GgmlType::TQ2_0
            )
    )
}

/// NMSE of the fused dots of every row of random `[2, 24, k]` weights, at
/// the process's level (`None`) or the given one.
fn check(f: WeightFormat, sdt: DType, k: usize, seed: u64, level: Option<SimdLevel>) -> f64 {
    let (e, n) = (2, 24);
    let w = random_weights(f, e, n, k, sdt, seed, &|| {}).unwrap();
    let dec = decoder(&w).unwrap();
    let mut r = rng(seed ^ 0x5eed);
    // Activations with a nonzero mean, so per-block offsets matter.
    let x: Vec<f32> = (0..k).map(|_| r.random::<f32>() * 2.0 - 0.7).collect();
    let xs = XSums::new(&x);
    let mut row = vec![0f32; k];
    let mut full = vec![0f32; k];
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for ex in 0..e {
        for i in 0..n {
            dec.decode(ex, i, &mut row).unwrap();
            want.push(
                row.iter()
                    .zip(&x)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum::<f64>() as f32,
            );
            let scratch: &mut [f32] = if has_fused_kernel(f) {
                &mut []
            } else {
                &mut full
            };
            let v = match level {
                None => dot_row(&dec, ex, i, &x, &xs, scratch),
                Some(l) => {
                    let mut o = [0f32];
                    dot_rows_at(l, &dec, ex, i, &x, &xs, scratch, &mut o).map(|()| o[0])
                }
            };
            got.push(v.unwrap_or_else(|err| panic!("{f} ({sdt}) K={k}: no fused kernel? {err}")));
        }
        // The run form gives the same values (same kernel, same order).
        let mut run = vec![0f32; n - 3];
        let l = level.unwrap_or_else(simd_level);
        dot_rows_at(l, &dec, ex, 3, &x, &xs, &mut full, &mut run).unwrap();
        assert_eq!(
            run,
            got[ex * n + 3..(ex + 1) * n],
            "{f} ({sdt}) K={k}: dot_rows"
        );
    }
    let err = nmse(&got, &want);
    assert!(
        err <= NMSE_FUSED_VS_F64,
        "{f} ({sdt} scales) K={k} ({level:?}): NMSE {err:e} > {NMSE_FUSED_VS_F64:e}"
    );
    err
}

/// Every case and K at `level` (`None`: the process's); the worst NMSE.
fn check_all(level: Option<SimdLevel>) {
    for (ci, (f, sdt)) in cases().into_iter().enumerate() {
        let mut worst = 0f64;
        for k in [256, 2048, 2880] {
            if k % f.k_granularity() != 0 {
                continue;
            }
            worst = worst.max(check(f, sdt, k, 1000 * ci as u64 + k as u64, level));
        }
        eprintln!("{f:<14} {sdt:<5} {level:?} max NMSE {worst:.2e}");
    }
}

#[test]
fn fused_dot_matches_decoded_f64_dot_for_every_format() {
    check_all(None);
}

/// The kernels of every level this CPU supports (the detected one and the
/// portable fallback, forced through `dot_rows_at`) meet the same tolerance.
#[test]
fn every_supported_level_matches_decoded_f64_dot() {
    for level in SimdLevel::ALL {
        if level.is_supported() {
            check_all(Some(level));
        } else {
            eprintln!("{level}: not supported by this CPU, skipped");
        }
    }
}

/// MLX's fp modes (fused since the e2m1/e4m3 kernels) at lengths of one to
/// a few dozen groups, odd counts and tails of fewer than 8 groups
/// included, at every supported level (the portable fallback forced too).
#[test]
fn mlx_fp_modes_at_ragged_lengths() {
    for (i, name) in ["mlx-mxfp4", "mlx-nvfp4", "mlx-mxfp8"]
        .into_iter()
        .enumerate()
    {
        let f = WeightFormat::parse(name).unwrap();
        assert!(has_fused_kernel(f), "{f}");
        for level in SimdLevel::ALL.into_iter().filter(|l| l.is_supported()) {
            let mut worst = 0f64;
            for k in [32, 64, 96, 160, 224, 288, 544, 1056] {
                worst = worst.max(check(
                    f,
                    DType::F16,
                    k,
                    100 * i as u64 + k as u64,
                    Some(level),
                ));
            }
            eprintln!("{f:<14} {level} ragged K max NMSE {worst:.2e}");
        }
    }
}

/// Which kernels the dispatch picked on this machine; on an x86-64 CPU with
/// AVX2, FMA and F16C (and no `MOEKIT_CPU_LEVEL`), a level with AVX2 (the
/// f32 kernels run their AVX2 code at every such level).
#[test]
fn dispatch_picks_the_best_supported_level() {
    let level = simd_level();
    eprintln!(
        "cpu kernels: {level} (detected best: {})",
        SimdLevel::detect()
    );
    assert!(level.is_supported());
    if std::env::var_os(moekit::cpu::LEVEL_ENV).is_none() {
        assert_eq!(level, SimdLevel::detect());
    }
    #[cfg(target_arch = "x86_64")]
    if std::env::var_os(moekit::cpu::LEVEL_ENV).is_none()
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
    {
        assert!(level.has_avx2(), "{level}");
    }
    // An unsupported level is an error, not a crash.
    for l in SimdLevel::ALL.into_iter().filter(|l| !l.is_supported()) {
        let w = random_weights(
            WeightFormat::parse("q4_0").unwrap(),
            1,
            1,
            32,
            DType::F16,
            1,
            &|| {},
        )
        .unwrap();
        let x = vec![1f32; 32];
        let r = dot_rows_at(
            l,
            &decoder(&w).unwrap(),
            0,
            0,
            &x,
            &XSums::new(&x),
            &mut [],
            &mut [0.0],
        );
        assert!(r.is_err(), "{l}");
    }
}

#[test]
fn dot_row_rejects_bad_rows() {
    let w = random_weights(
        WeightFormat::Ggml(moekit::format::GgmlType::Q4_K),
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
    let xs = XSums::new(&x);
    assert!(
        dot_row(&dec, 0, 3, &x, &xs, &mut []).is_err(),
        "row out of range"
    );
    assert!(
        dot_row(&dec, 2, 0, &x, &xs, &mut []).is_err(),
        "expert out of range"
    );
    // A wrong-length x has no fused kernel; the fallback rejects the scratch.
    assert!(dot_row(&dec, 0, 0, &x[..128], &xs, &mut []).is_err());
    // A run past the last row.
    let mut out = [0f32; 2];
    assert!(dot_rows(&dec, 0, 2, &x, &xs, &mut [], &mut out).is_err());
    assert!(dot_rows(&dec, 0, 1, &x, &xs, &mut [], &mut out).is_ok());
}

/// Single-thread kernel throughput on a decode-sized working set (not a
/// test; run with `cargo test --release --test cpu_dot -- --ignored --nocapture`,
/// formats from `DOT_BENCH_FORMATS`, row length from `DOT_BENCH_K`, rows per
/// expert from `DOT_BENCH_ROWS` (e.g. 128 for a working set in L2: kernel
/// throughput without DRAM), and `DOT_BENCH_SINGLE=1` to call `dot_row` per
/// row instead of `dot_rows`).
/// Formats are timed in interleaved rounds and the best round is kept, so a
/// busy machine skews them alike.
#[test]
#[ignore]
fn bench_dot_row() {
    let names = std::env::var("DOT_BENCH_FORMATS").unwrap_or_else(|_| {
        "q4_0,q4_1,q5_0,q5_1,q8_0,q2_k,q3_k,q4_k,q5_k,q6_k,iq4_nl,iq4_xs,mxfp4,iq2_xxs,iq3_s,\
         iq1_m,tq2_0,mlx-mxfp4,mlx-nvfp4,mlx-mxfp8,affine2,affine3,affine4,affine4-g32,\
         affine4-g128,affine5,affine6,affine8,affine8-g32,affine8-g128,f16,bf16,f32"
            .into()
    });
    // Default: the weights of one qwen3-30b-a3b decode step (8 experts of
    // 3 · 768 rows of K = 2048); DOT_BENCH_K = 768 for the down projection.
    let k: usize = std::env::var("DOT_BENCH_K").map_or(2048, |v| v.parse().unwrap());
    let n = std::env::var("DOT_BENCH_ROWS").map_or(2304 * 2048 / k, |v| v.parse().unwrap());
    let e = 8;
    let x: Vec<f32> = (0..k).map(|i| (i as f32 * 0.37).sin()).collect();
    let xs = XSums::new(&x);
    let cases: Vec<(&str, QuantWeights)> = names
        .split(',')
        .map(|name| {
            let f = WeightFormat::parse(name).unwrap();
            (
                name,
                random_weights(f, e, n, k, DType::F16, 3, &|| {}).unwrap(),
            )
        })
        .collect();
    let single = std::env::var("DOT_BENCH_SINGLE").is_ok();
    let mut best = vec![f64::MAX; cases.len()];
    let mut scratch = vec![0f32; k];
    let mut out = vec![0f32; n];
    let mut sink = 0f32;
    for _ in 0..30 {
        for ((_, w), best) in cases.iter().zip(&mut best) {
            let dec = decoder(w).unwrap();
            let t = std::time::Instant::now();
            // Runs of 128 rows, as the decode path calls it.
            for ex in 0..e {
                for (c, o) in out.chunks_mut(128).enumerate() {
                    if single {
                        for (i, o) in o.iter_mut().enumerate() {
                            *o = dot_row(&dec, ex, 128 * c + i, &x, &xs, &mut scratch).unwrap();
                        }
                    } else {
                        dot_rows(&dec, ex, 128 * c, &x, &xs, &mut scratch, o).unwrap();
                    }
                }
                sink += out[0];
            }
            *best = best.min(t.elapsed().as_secs_f64());
        }
    }
    for ((name, w), best) in cases.iter().zip(best) {
        let bytes = (w.bytes_per_expert() * e) as f64;
        println!(
            "{name:<14} {:>7.2} GB/s {:>7.2} Gw/s  ({:.2} ms)",
            bytes / best / 1e9,
            (e * n * k) as f64 / best / 1e9,
            best * 1e3,
        );
    }
    assert!(sink.is_finite());
}
