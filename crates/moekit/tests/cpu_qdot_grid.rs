//! The integer dot kernels of the GGUF grid and ternary types
//! (`cpu::fast::qdot::grid`): IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
//! IQ1_S, IQ1_M, TQ1_0 and TQ2_0.
//!
//! - every level this CPU supports equals the portable kernels bit for bit
//!   (groups of 1..6 activation rows, rows of 1..11 super-blocks: whole
//!   runs of 4 and tails, a run from a later row), so a result depends
//!   neither on the level nor on the batch;
//! - the quantized path is within NMSE 1e-4 of the f32 path (f64 dots of
//!   the rows decoded by the format's own dequantizer, which
//!   `ggml_oracle.rs` checks against gguf-py, with the unquantized
//!   activations), 3e-4 with 1% outliers, at the portable level and at this
//!   CPU's: this checks each type's grid lookups, signs and scales;
//! - blocks of the largest codes, scales and all signs negative against
//!   activations that take the largest lane shifts (the 16-bit products'
//!   worst case) stay within that bound and equal at every level;
//! - the MoE-block fixture in these types (gate IQ2_XXS, up IQ3_S, down
//!   IQ1_M, shared expert TQ2_0) within NMSE 1e-4 of its reference and of
//!   the f32 path;
//! - zero and non-finite activations, results independent of the batch and
//!   the thread count, and errors (never panics) for bad arguments.

mod common_util;
mod qdot_util;
use common_util::{fixture, nmse, rng};
use moekit::cpu::{simd_level, with_act_mode, ActMode, SimdLevel};
use moekit::format::ggml::random_blocks;
use moekit::format::{storage_shapes, GgmlType};
use moekit::npy::NpyArray;
use moekit::ops::gather_mm::{gather_mm_on, RowExperts};
use moekit::testing::cpu_fast::{kind_of_rows, qdot_rows, QRow};
use moekit::testing::decoder;
use moekit::{Backend, DType, QuantWeights, Tensor, WeightFormat};
use qdot_util::{
    activations, bits, check_bad_arguments, check_levels, check_zero_and_non_finite, levels,
};
use rand::Rng;

/// The types of this file.
const TYPES: [GgmlType; 9] = [
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
];

const NMSE_Q8: f64 = 1e-4;
const NMSE_Q8_OUTLIERS: f64 = 3e-4;

fn weights(t: GgmlType, e: usize, n: usize, k: usize, seed: u64) -> QuantWeights {
    qdot_util::weights(WeightFormat::Ggml(t), e, n, k, seed)
}

/// [`TYPES`] as weight formats.
fn formats() -> Vec<WeightFormat> {
    TYPES.into_iter().map(WeightFormat::Ggml).collect()
}

#[test]
fn every_level_equals_the_portable_kernels_bit_for_bit() {
    eprintln!("levels: {:?}", levels());
    for t in TYPES {
        // 1, 3, 5, 8 and 11 super-blocks: whole runs of 4 and tails.
        for k in [256, 768, 1280, 2048, 2816] {
            let (e, n) = (2, 9);
            let w = weights(t, e, n, k, k as u64);
            let dec = decoder(&w).unwrap();
            let kind = kind_of_rows(&dec).unwrap_or_else(|| panic!("{t}: no integer kernels"));
            let xs: Vec<Vec<f32>> = (0..6)
                .map(|i| activations(k, 7 * i + k as u64, 0.01))
                .collect();
            let qs: Vec<QRow> = xs.iter().map(|x| QRow::new(x, kind).unwrap()).collect();
            check_levels(&format!("{t} K={k}"), &w, n, &qs);
        }
    }
}

/// NMSE of the quantized path (at `level`) against f64 dots of the decoded
/// rows of `w` (expert 0, `n` rows) with the unquantized activations `xs`.
fn nmse_vs_f64(w: &QuantWeights, n: usize, xs: &[Vec<f32>], level: SimdLevel) -> f64 {
    let dec = decoder(w).unwrap();
    let kind = kind_of_rows(&dec).unwrap();
    let (mut got, mut want) = (Vec::new(), Vec::new());
    let mut row = vec![0f32; dec.cols()];
    for x in xs {
        let q = QRow::new(x, kind).unwrap();
        let mut out = vec![0f32; n];
        let mut scratch = Vec::new();
        qdot_rows(level, &dec, 0, 0, n, &[&q], &mut scratch, &mut out).unwrap();
        got.extend_from_slice(&out);
        for i in 0..n {
            dec.decode(0, i, &mut row).unwrap();
            let d: f64 = row.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum();
            want.push(d as f32);
        }
    }
    nmse(&got, &want)
}

/// [`nmse_vs_f64`] over 64 rows of K = 768 and 2048, 4 activation rows each.
fn q8_nmse(t: GgmlType, level: SimdLevel, outliers: f32) -> f64 {
    let (mut got, mut want) = (0f64, 0f64);
    for (si, k) in [768usize, 2048].into_iter().enumerate() {
        let w = weights(t, 1, 64, k, si as u64);
        let xs: Vec<Vec<f32>> = (0..4)
            .map(|s| activations(k, 100 * si as u64 + s, outliers))
            .collect();
        // Equal weight to both lengths: the mean of the two.
        got += nmse_vs_f64(&w, 64, &xs, level);
        want += 1.0;
    }
    got / want
}

#[test]
fn q8_path_is_within_nmse_1e4_of_f32() {
    for t in TYPES {
        for level in [SimdLevel::Portable, simd_level()] {
            let e = q8_nmse(t, level, 0.0);
            let eo = q8_nmse(t, level, 0.01);
            eprintln!("{t} {level}: q8 vs f32 NMSE {e:.2e} (1% outliers: {eo:.2e})");
            assert!(e <= NMSE_Q8, "{t} {level}: NMSE {e:e} > {NMSE_Q8:e}");
            assert!(eo <= NMSE_Q8_OUTLIERS, "{t} {level}: NMSE {eo:e}");
        }
    }
}

/// Random valid blocks of `t` with every code byte set: the largest grid
/// indices, scales and sign indices (all signs negative), TQ2_0's code 3;
/// the f16 scale kept.
fn extreme_weights(t: GgmlType, n: usize, k: usize, seed: u64) -> QuantWeights {
    let f = WeightFormat::Ggml(t);
    let nb = n * k / 256;
    let mut bytes = random_blocks(t, nb, seed);
    let bs = t.type_size();
    for blk in bytes.chunks_exact_mut(bs) {
        let keep = match t {
            GgmlType::TQ1_0 => 52..54,
            GgmlType::TQ2_0 => 64..66,
            GgmlType::IQ1_M => 56..56,
            _ => 0..2,
        };
        for (i, b) in blk.iter_mut().enumerate() {
            if !keep.contains(&i) {
                // IQ1_M: its scale words' top nibbles hold d.
                *b = match (t, i) {
                    (GgmlType::IQ1_M, 49 | 51 | 53 | 55) => *b | 0x0F,
                    _ => 0xFF,
                };
            }
        }
    }
    let (_, shape, _) = storage_shapes(f, 1, n, k).unwrap();
    let data = Tensor::from_slice(&bytes, &shape).unwrap();
    QuantWeights::new(f, 1, n, k, data, None, None).unwrap()
}

/// Activations whose lanes take every shift up to the largest: blocks with
/// one value of 127 and lanes of magnitudes 127·2⁻ˢ (with noise).
fn shifted_activations(k: usize, seed: u64) -> Vec<f32> {
    let mut r = rng(seed);
    (0..k)
        .map(|i| {
            if i % 256 == 0 {
                return 127.0;
            }
            let s = (i / 4) % 6;
            let sign = if r.random::<bool>() { -1.0 } else { 1.0 };
            sign * 127.0 / (1 << s) as f32 * (0.5 + 0.5 * r.random::<f32>())
        })
        .collect()
}

#[test]
fn largest_codes_and_shifts_stay_exact() {
    for t in TYPES {
        let (n, k) = (8, 1280);
        let w = extreme_weights(t, n, k, 11);
        let xs: Vec<Vec<f32>> = (0..4).map(|s| shifted_activations(k, 30 + s)).collect();
        let kind = kind_of_rows(&decoder(&w).unwrap()).unwrap();
        let qs: Vec<QRow> = xs.iter().map(|x| QRow::new(x, kind).unwrap()).collect();
        assert!(qs[0].shifts().contains(&4), "{t}: no lane of shift 4");
        check_levels(&format!("{t} (largest codes)"), &w, n, &qs);
        for level in levels() {
            let e = nmse_vs_f64(&w, n, &xs, level);
            eprintln!("{t} {level}: largest codes NMSE {e:.2e}");
            assert!(e <= NMSE_Q8, "{t} {level}: largest codes, NMSE {e:e}");
        }
    }
}

#[test]
fn zero_and_non_finite_activations() {
    check_zero_and_non_finite(&formats());
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    check_bad_arguments(&formats());
}

fn ids(m: usize, e: usize, seed: u64) -> Vec<u32> {
    let mut r = rng(seed);
    (0..m)
        .map(|i| {
            if i % 4 == 1 {
                1
            } else {
                r.random_range(0..e as u32)
            }
        })
        .collect()
}

#[test]
fn results_do_not_depend_on_the_batch_nor_the_thread_count() {
    let (e, n, k, m) = (5, 40, 512, 23);
    for t in TYPES {
        let w = weights(t, e, n, k, 3);
        let xv = activations(m * k, 6, 0.0);
        let x = Tensor::from_f32(&xv, &[m, k], DType::F32).unwrap();
        let id = ids(m, e, 7);
        let idt = Tensor::from_slice(&id, &[m]).unwrap();
        let run = |threads: usize, mode: ActMode, x: &Tensor, idt: &Tensor| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                with_act_mode(mode, || {
                    gather_mm_on(Backend::CpuFast, x, &w, RowExperts::PerRow(idt))
                })
            })
            .unwrap()
            .to_f32_vec()
            .unwrap()
        };
        let all = run(1, ActMode::Q8, &x, &idt);
        for threads in [2, 3] {
            let again = run(threads, ActMode::Q8, &x, &idt);
            assert_eq!(bits(&again), bits(&all), "{t}: {threads} thr");
        }
        for r in [0, 1, 5, m - 1] {
            let xr = Tensor::from_f32(&xv[r * k..(r + 1) * k], &[1, k], DType::F32).unwrap();
            let ir = Tensor::from_slice(&id[r..r + 1], &[1]).unwrap();
            let one = run(2, ActMode::Q8, &xr, &ir);
            assert_eq!(bits(&one), bits(&all[r * n..(r + 1) * n]), "{t}: token {r}");
        }
        // The q8 path ran (the f32 path rounds differently), and is the
        // default.
        let f32_all = run(2, ActMode::F32, &x, &idt);
        assert_ne!(bits(&f32_all), bits(&all), "{t}: the q8 path ran");
        assert!(nmse(&all, &f32_all) <= NMSE_Q8, "{t}");
        let auto = run(2, ActMode::Auto, &x, &idt);
        assert_eq!(bits(&auto), bits(&all), "{t}: the default is the q8 path");
    }
}

#[test]
fn moe_block_fixture_on_the_q8_path() {
    let name = "qwen2moe_iq2_iq3_iq1";
    let ck = moekit::open(&fixture(&format!("gguf/{name}.gguf"))).unwrap();
    let x = NpyArray::read(fixture(&format!("gguf/{name}_x.npy")))
        .and_then(|a| a.to_tensor())
        .unwrap();
    let want = NpyArray::read(fixture(&format!("gguf/{name}_out_0.npy")))
        .and_then(|a| a.to_f32())
        .unwrap();
    let block = ck.moe_block(0, &|_, _| {}).unwrap();
    let run = |mode| {
        with_act_mode(mode, || block.forward_on(Backend::CpuFast, &x))
            .unwrap()
            .out
            .to_f32_vec()
            .unwrap()
    };
    let (f32p, q8, auto) = (run(ActMode::F32), run(ActMode::Q8), run(ActMode::Auto));
    let (e_ref, e_f32) = (nmse(&q8, &want), nmse(&q8, &f32p));
    eprintln!("{name}: q8 vs reference NMSE {e_ref:.2e}, vs f32 path {e_f32:.2e}");
    assert!(e_ref <= NMSE_Q8, "{name}: NMSE {e_ref:e} vs reference");
    assert!(e_f32 <= NMSE_Q8, "{name}: NMSE {e_f32:e} vs the f32 path");
    assert_ne!(bits(&q8), bits(&f32p), "{name}: the q8 path ran");
    assert_eq!(bits(&auto), bits(&q8), "{name}: the default is the q8 path");
}
