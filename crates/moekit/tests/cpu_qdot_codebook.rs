//! The integer dot kernels of the 4-bit codebook formats
//! (`cpu::fast::qdot::codebook`): GGUF IQ4_NL, IQ4_XS, MXFP4 and MLX's
//! mxfp4 and nvfp4 modes.
//!
//! - every level this CPU supports equals the portable kernels bit for bit
//!   (groups of 1..6 activation rows, tails after the last run of 4
//!   blocks, a run from a later row);
//! - the quantized path is within NMSE 1e-4 of the f32 path (f64 dots of
//!   the rows decoded by the format's own dequantizer, which the oracles
//!   check bit for bit against gguf-py and MLX), 3e-4 with 1% outliers;
//!   this checks each format's tables, nibble order and scales;
//! - the MoE-block fixtures in these formats: the quantized path within
//!   NMSE 1e-4 of the references and of the f32 path;
//! - zero and non-finite activations, results independent of the batch and
//!   the thread count, and errors (never panics) for bad arguments.

mod common_util;
mod qdot_util;
use common_util::{fixture, nmse, rng};
use moekit::cpu::{simd_level, with_act_mode, ActMode, SimdLevel};
use moekit::format::{GgmlType, MlxFpMode};
use moekit::load::Checkpoint;
use moekit::npy::NpyArray;
use moekit::ops::gather_mm::{gather_mm_on, RowExperts};
use moekit::testing::cpu_fast::{kind_of, kind_of_rows, qdot_rows, QRow};
use moekit::testing::decoder;
use moekit::{Backend, DType, Tensor, WeightFormat};
use qdot_util::{
    activations, bits, check_bad_arguments, check_levels, check_zero_and_non_finite, levels,
    weights,
};
use rand::Rng;

/// The formats of this file.
const FORMATS: [WeightFormat; 5] = [
    WeightFormat::Ggml(GgmlType::IQ4_NL),
    WeightFormat::Ggml(GgmlType::IQ4_XS),
    WeightFormat::Ggml(GgmlType::MXFP4),
    WeightFormat::MlxFp(MlxFpMode::Mxfp4),
    WeightFormat::MlxFp(MlxFpMode::Nvfp4),
];

const NMSE_Q8: f64 = 1e-4;
const NMSE_Q8_OUTLIERS: f64 = 3e-4;

/// The row lengths a format allows (IQ4_XS: whole super-blocks of 256).
fn fits(f: WeightFormat, k: usize) -> bool {
    match f {
        WeightFormat::Ggml(t) => k.is_multiple_of(t.block_size()),
        _ => k.is_multiple_of(32),
    }
}

#[test]
fn every_level_equals_the_portable_kernels_bit_for_bit() {
    eprintln!("levels: {:?}", levels());
    for f in FORMATS {
        // Whole runs of 4 blocks, and tails of 1..3 blocks.
        for k in [256, 768, 800, 2048, 2080, 2816, 1536 + 96] {
            if !fits(f, k) {
                continue;
            }
            let (e, n) = (2, 9);
            let w = weights(f, e, n, k, k as u64);
            let dec = decoder(&w).unwrap();
            let kind = kind_of_rows(&dec).unwrap_or_else(|| panic!("{f}: no integer kernels"));
            let xs: Vec<Vec<f32>> = (0..6)
                .map(|i| activations(k, 7 * i + k as u64, 0.01))
                .collect();
            let qs: Vec<QRow> = xs.iter().map(|x| QRow::new(x, kind).unwrap()).collect();
            check_levels(&format!("{f} K={k}"), &w, n, &qs);
        }
    }
}

/// NMSE of the quantized path (at `level`) against f64 dots of the decoded
/// rows with the unquantized activations, over 512 rows of K = 768 and
/// 2048.
fn q8_nmse(f: WeightFormat, level: SimdLevel, outliers: f32) -> f64 {
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for (si, k) in [768usize, 2048].into_iter().enumerate() {
        let n = 64;
        let w = weights(f, 1, n, k, si as u64);
        let dec = decoder(&w).unwrap();
        let kind = kind_of_rows(&dec).unwrap();
        let mut row = vec![0f32; k];
        for s in 0..4 {
            let x = activations(k, 100 * si as u64 + s, outliers);
            let q = QRow::new(&x, kind).unwrap();
            let mut out = vec![0f32; n];
            let mut scratch = Vec::new();
            qdot_rows(level, &dec, 0, 0, n, &[&q], &mut scratch, &mut out).unwrap();
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
    for f in FORMATS {
        for level in [SimdLevel::Portable, simd_level()] {
            let e = q8_nmse(f, level, 0.0);
            let eo = q8_nmse(f, level, 0.01);
            eprintln!("{f} {level}: q8 vs f32 NMSE {e:.2e} (1% outliers: {eo:.2e})");
            assert!(e <= NMSE_Q8, "{f} {level}: NMSE {e:e} > {NMSE_Q8:e}");
            assert!(eo <= NMSE_Q8_OUTLIERS, "{f} {level}: NMSE {eo:e}");
        }
    }
}

#[test]
fn zero_and_non_finite_activations() {
    check_zero_and_non_finite(&FORMATS);
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    check_bad_arguments(&FORMATS);
    let (k, n) = (512, 4);
    // MLX mxfp8 has no integer kernels: an error, not a panic.
    let w = weights(WeightFormat::MlxFp(MlxFpMode::Mxfp8), 1, n, k, 1);
    let dec = decoder(&w).unwrap();
    assert!(kind_of_rows(&dec).is_none());
    let q = QRow::new(&activations(k, 3, 0.0), kind_of(GgmlType::Q8_0).unwrap()).unwrap();
    let mut out = vec![0f32; n];
    let r = qdot_rows(
        SimdLevel::Portable,
        &dec,
        0,
        0,
        n,
        &[&q],
        &mut Vec::new(),
        &mut out,
    );
    assert!(r.is_err());
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
    for f in FORMATS {
        let w = weights(f, e, n, k, 3);
        let xv = activations(m * k, 6, 0.0);
        let x = Tensor::from_f32(&xv, &[m, k], DType::F32).unwrap();
        let id = ids(m, e, 7);
        let idt = Tensor::from_slice(&id, &[m]).unwrap();
        let run = |threads: usize, x: &Tensor, idt: &Tensor| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                with_act_mode(ActMode::Q8, || {
                    gather_mm_on(Backend::CpuFast, x, &w, RowExperts::PerRow(idt))
                })
            })
            .unwrap()
            .to_f32_vec()
            .unwrap()
        };
        let all = run(1, &x, &idt);
        for threads in [2, 3] {
            assert_eq!(
                bits(&run(threads, &x, &idt)),
                bits(&all),
                "{f}: {threads} thr"
            );
        }
        for r in [0, 1, 5, m - 1] {
            let xr = Tensor::from_f32(&xv[r * k..(r + 1) * k], &[1, k], DType::F32).unwrap();
            let ir = Tensor::from_slice(&id[r..r + 1], &[1]).unwrap();
            let one = run(2, &xr, &ir);
            assert_eq!(bits(&one), bits(&all[r * n..(r + 1) * n]), "{f}: token {r}");
        }
        // The q8 path ran (the f32 path rounds differently).
        let f32_all = with_act_mode(ActMode::F32, || {
            gather_mm_on(Backend::CpuFast, &x, &w, RowExperts::PerRow(&idt))
        })
        .unwrap()
        .to_f32_vec()
        .unwrap();
        assert_ne!(bits(&f32_all), bits(&all), "{f}: the q8 path ran");
        assert!(nmse(&all, &f32_all) <= NMSE_Q8, "{f}");
    }
}

/// A fixture's MoE block on its input: the quantized path (forced and by
/// default) within NMSE 1e-4 of the reference and of the f32 path, and
/// different from the f32 path (it ran).
fn check_fixture(name: &str, ck: &dyn Checkpoint, layer: usize, x: &Tensor, want: &[f32]) {
    let block = ck.moe_block(layer, &|_, _| {}).unwrap();
    let run = |mode| {
        with_act_mode(mode, || block.forward_on(Backend::CpuFast, x))
            .unwrap()
            .out
            .to_f32_vec()
            .unwrap()
    };
    let (f32p, q8, auto) = (run(ActMode::F32), run(ActMode::Q8), run(ActMode::Auto));
    let (e_ref, e_f32) = (nmse(&q8, want), nmse(&q8, &f32p));
    eprintln!("{name}: q8 vs reference NMSE {e_ref:.2e}, vs f32 path {e_f32:.2e}");
    assert!(e_ref <= NMSE_Q8, "{name}: NMSE {e_ref:e} vs reference");
    assert!(e_f32 <= NMSE_Q8, "{name}: NMSE {e_f32:e} vs the f32 path");
    assert_ne!(bits(&q8), bits(&f32p), "{name}: the q8 path ran");
    assert_eq!(
        bits(&auto),
        bits(&q8),
        "{name}: the default takes the q8 path"
    );
}

#[test]
fn moe_block_fixtures_on_the_q8_path() {
    let name = "qwen3moe_iq4_mxfp4";
    let ck = moekit::open(&fixture(&format!("gguf/{name}.gguf"))).unwrap();
    let x = NpyArray::read(fixture(&format!("gguf/{name}_x.npy")))
        .and_then(|a| a.to_tensor())
        .unwrap();
    let want = NpyArray::read(fixture(&format!("gguf/{name}_out_0.npy")))
        .and_then(|a| a.to_f32())
        .unwrap();
    check_fixture(name, ck.as_ref(), 0, &x, &want);
    for name in ["qwen3_moe_mlx_mxfp4", "mixtral_mlx_nvfp4"] {
        let dir = fixture(&format!("st/{name}"));
        let meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
        let layer = meta["layer"].as_u64().unwrap() as usize;
        let ck = moekit::open(&dir).unwrap();
        let x = NpyArray::read(dir.join("x.npy"))
            .and_then(|a| a.to_tensor())
            .unwrap();
        let want = NpyArray::read(dir.join("out.npy"))
            .and_then(|a| a.to_f32())
            .unwrap();
        check_fixture(name, ck.as_ref(), layer, &x, &want);
    }
}
