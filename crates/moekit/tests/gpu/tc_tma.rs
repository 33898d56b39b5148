//! The warp-specialized TMA GEMM (`cuda::ops::tc_tma`, sm_90a) against the
//! CPU reference and the staged kernel.
//!
//! * bf16 and f16 weights and activations (by TMA) × {plain, SwiGLU fused
//!   and separate}, rows gathered through an expert sort (plain) or sorted
//!   (SwiGLU's input as the down GEMM takes it).
//! * Quantized weights of every decoder family (fast and generic decoders,
//!   K-quant super-blocks, 34-byte Q8_0 blocks, dense f16 weights under bf16
//!   activations), decoded by the producer threads, the same way.
//! * Both tile row counts (64, 128) on full and ragged tiles (128-row
//!   tiles of at most 64 rows, where one consumer warpgroup idles); N not a
//!   multiple of the 256- or 128-column tile; K a multiple of 64 but not of
//!   128; experts with no rows; all rows on one expert; E = 512 with k = 10;
//!   M = 0. K off the 64-column step is refused with its reason.
//! * gpt-oss's activation with biases and scales: `expert_scale.rs`.
//! * Bit-identical to the staged kernel (the same k16 steps in the same
//!   order), bit-identical reruns, and a token's row equal alone and in a
//!   batch.
//! * Bad offsets and out-of-range gathered slots are reported, not followed.
//! * Outputs are poisoned with NaN, so a missed element fails.

use crate::common::*;
use moekit::format::random::random_weights;
use moekit::format::{AffineParams, GgmlType};
use moekit::ops::act::{gather_swiglu_on, GateUp};
use moekit::ops::gather_mm::{gather_mm_on, RowExperts};
use moekit::ops::permute::permute_on;
use moekit::ops::sort::ExpertSort;
use moekit::testing::cuda::tc_gemm::{self, TcRows};
use moekit::testing::cuda::tc_tma::{glu_into, matmul_into, supports, tile_rows};
use moekit::{Backend, DType, QuantWeights, Tensor, WeightFormat};

fn weights(dt: DType, e: usize, n: usize, k: usize, seed: u64) -> QuantWeights {
    weights_of(WeightFormat::Dense(dt), dt, e, n, k, seed)
}

/// Weights of format `f` (affine scales of the activation type `dt`).
fn weights_of(f: WeightFormat, dt: DType, e: usize, n: usize, k: usize, seed: u64) -> QuantWeights {
    let sd = if matches!(f, WeightFormat::Affine(_)) {
        dt
    } else {
        DType::F16
    };
    random_weights(f, e, n, k, sd, seed, &|| {}).unwrap()
}

fn to_gpu(w: &QuantWeights) -> QuantWeights {
    w.to_device(gpu()).unwrap()
}

/// Whether the test device runs tc_tma (sm_90a); else the refusal is
/// checked and the caller returns.
fn on_hopper() -> bool {
    let w = to_gpu(&weights(DType::Bf16, 1, 8, 64, 1));
    let arch = moekit::cuda::device(0).unwrap().arch();
    match supports(DType::Bf16, &w, arch) {
        Ok(()) => true,
        Err(why) => {
            assert!(why.contains("sm_90a"), "{why}");
            eprintln!("tc_tma: not on this device ({why})");
            false
        }
    }
}

/// Plain (gathered rows) and SwiGLU (sorted rows) GEMMs of `t` tokens × `k`
/// slots over `e` experts, N = `n`, K = `kk`, against the CPU reference and
/// the staged kernel, dense weights of `dt`.
#[allow(clippy::too_many_arguments)]
fn check(dt: DType, t: usize, k: usize, e: usize, sort: &ExpertSort, n: usize, kk: usize) {
    check_of(WeightFormat::Dense(dt), dt, t, k, e, sort, n, kk);
}

/// [`check`] with weights of format `f`.
#[allow(clippy::too_many_arguments)]
fn check_of(
    f: WeightFormat,
    dt: DType,
    t: usize,
    k: usize,
    e: usize,
    sort: &ExpertSort,
    n: usize,
    kk: usize,
) {
    let weights = |_: DType, e, n, k, seed| weights_of(f, dt, e, n, k, seed);
    let what = format!("{f} x {dt} T={t} k={k} E={e} N={n} K={kk}");
    eprintln!("tc_tma check: {what}");
    let m = t * k;
    let x = random(&[t, kk], dt, t as u64 + 1);
    let xs = permute_on(Backend::CpuReference, &x, sort).unwrap();
    let x_gpu = x.to_device(gpu()).unwrap();
    let off = sort.offsets.to_device(gpu()).unwrap();
    let sorted = sort.sorted.to_device(gpu()).unwrap();
    let gathered = TcRows::Gathered {
        offsets: &off,
        sorted: &sorted,
        top_k: k,
    };
    let cpu_rows = RowExperts::Sorted(&sort.offsets);
    let b = bound(dt);
    let bm = tile_rows(m, e, n.div_ceil(256));
    // Plain, gathered rows.
    let w = weights(dt, e, n, kk, 3);
    let wg = to_gpu(&w);
    let want = gather_mm_on(Backend::CpuReference, &xs, &w, cpu_rows).unwrap();
    let out = poisoned(&[m, n], dt);
    matmul_into(&x_gpu, &wg, gathered, &out).unwrap();
    let got = host_f32(&out);
    let err = nmse(&got, &want.to_f32_vec().unwrap());
    assert!(err <= b, "tc_tma {what} (BM {bm}): NMSE {err:e} > {b:e}");
    let again = poisoned(&[m, n], dt);
    matmul_into(&x_gpu, &wg, gathered, &again).unwrap();
    assert_eq!(host_f32(&again), got, "tc_tma {what}: reruns differ");
    let staged = poisoned(&[m, n], dt);
    tc_gemm::matmul_into(&x_gpu, &wg, gathered, &staged).unwrap();
    assert_eq!(
        host_f32(&staged),
        got,
        "tc_tma {what}: differs from the staged kernel"
    );
    // SwiGLU on sorted rows (x permuted on the host), fused and separate.
    let xs_gpu = xs.to_device(gpu()).unwrap();
    let sorted_rows = TcRows::Sorted(&off);
    let i = n.div_ceil(2).max(8);
    for fused in [true, false] {
        let gu = if fused {
            GateUp::fused(weights(dt, e, 2 * i, kk, 5)).unwrap()
        } else {
            GateUp::separate(weights(dt, e, i, kk, 6), weights(dt, e, i, kk, 7)).unwrap()
        };
        let gu_gpu = match &gu {
            GateUp::Fused(w) => GateUp::fused(to_gpu(w)).unwrap(),
            GateUp::Separate { gate, up } => GateUp::separate(to_gpu(gate), to_gpu(up)).unwrap(),
        };
        let want = gather_swiglu_on(Backend::CpuReference, &xs, &gu, cpu_rows).unwrap();
        let ffn = moekit::ops::ffn::ExpertFfn::default();
        let out = poisoned(&[m, i], dt);
        glu_into(&xs_gpu, &gu_gpu, sorted_rows, &ffn, &out).unwrap();
        let got = host_f32(&out);
        let err = nmse(&got, &want.to_f32_vec().unwrap());
        assert!(
            err <= b,
            "tc_tma_swiglu {what} fused={fused}: NMSE {err:e} > {b:e}"
        );
        let staged = poisoned(&[m, i], dt);
        tc_gemm::swiglu_into(&xs_gpu, &gu_gpu, sorted_rows, &staged).unwrap();
        assert_eq!(
            host_f32(&staged),
            got,
            "tc_tma_swiglu {what} fused={fused}: differs from the staged kernel"
        );
    }
    moekit::cuda::device(0).unwrap().check_errors().unwrap();
}

#[test]
fn matches_cpu_and_the_staged_kernel() {
    if !on_hopper() {
        return;
    }
    for dt in [DType::Bf16, DType::F16] {
        // E = 8, k = 2: about 2T/8 rows an expert → 64-row tiles (T = 100),
        // 128-row tiles (T = 600), several tiles an expert (T = 1500).
        for t in [100, 600, 1500] {
            let sort = sort_of(t, 2, 8, &[3], false, t as u64);
            check(dt, t, 2, 8, &sort, 264, 384);
        }
    }
    // Experts whose last 128-row tile has at most 64 rows (129, 64, 300, 1
    // rows: the second consumer warpgroup idles there) beside full ones.
    let sort = sort_of_counts(&[200, 129, 64, 0, 300, 1], 8);
    check(DType::Bf16, 694, 1, 6, &sort, 264, 256);
    // All rows on one expert; K = 192 (three steps); N = 300.
    let sort = sort_of(300, 2, 8, &[], true, 2);
    check(DType::Bf16, 300, 2, 8, &sort, 300, 192);
    // E = 512, k = 10, N = 128 (one column block of gate/up).
    let sort = sort_of(64, 10, 512, &[], false, 3);
    check(DType::Bf16, 64, 10, 512, &sort, 72, 256);
    // M = 0.
    let sort = sort_of(0, 2, 8, &[], false, 4);
    check(DType::Bf16, 0, 2, 8, &sort, 64, 256);
}

#[test]
fn refuses_what_it_cannot_run() {
    if !on_hopper() {
        return;
    }
    let x = random(&[4, 96], DType::Bf16, 1).to_device(gpu()).unwrap();
    let out = poisoned(&[4, 16], DType::Bf16);
    let w = to_gpu(&weights(DType::Bf16, 1, 16, 96, 1));
    let e = matmul_into(&x, &w, TcRows::Single, &out)
        .unwrap_err()
        .to_string();
    assert!(e.contains("K = 96"), "{e}");
    let xf = random(&[4, 128], DType::F32, 1).to_device(gpu()).unwrap();
    let w = to_gpu(&weights(DType::Bf16, 1, 16, 128, 1));
    let out = poisoned(&[4, 16], DType::F32);
    let e = matmul_into(&xf, &w, TcRows::Single, &out)
        .unwrap_err()
        .to_string();
    assert!(e.contains("activations"), "{e}");
}

/// Quantized weights, decoded by the producer threads: a format of each
/// decoder family (MLX affine 4- and 8-bit, Q4_K and Q6_K super-blocks,
/// Q8_0's 34-byte and Q4_0's 18-byte blocks, IQ2_XXS's generic decoder,
/// dense f16 under bf16 activations) on 64- and 128-row tiles.
#[test]
fn quantized_formats_match_cpu_and_the_staged_kernel() {
    if !on_hopper() {
        return;
    }
    let affine = |bits, group_size| WeightFormat::Affine(AffineParams { bits, group_size });
    let g = WeightFormat::Ggml;
    let formats = [
        affine(4, 64),
        affine(8, 64),
        g(GgmlType::Q4_K),
        g(GgmlType::Q6_K),
        g(GgmlType::Q8_0),
        g(GgmlType::Q4_0),
        g(GgmlType::IQ2_XXS),
        WeightFormat::Dense(DType::F16),
    ];
    for f in formats {
        // 64-row tiles (T = 100), 128-row tiles with several an expert
        // (T = 1500); N = 264: a ragged last column block.
        for t in [100, 1500] {
            let sort = sort_of(t, 2, 8, &[3], false, t as u64);
            check_of(f, DType::Bf16, t, 2, 8, &sort, 264, 512);
        }
    }
    for f in [affine(4, 64), g(GgmlType::Q4_K)] {
        let sort = sort_of(600, 2, 8, &[3], false, 600);
        check_of(f, DType::F16, 600, 2, 8, &sort, 264, 512);
    }
}

/// Bad offsets and a gathered slot past T·k are reported and not followed
/// (run under compute-sanitizer memcheck too).
#[test]
fn bad_offsets_are_reported_not_followed() {
    if !on_hopper() {
        return;
    }
    let w = to_gpu(&weights(DType::Bf16, 4, 64, 128, 1));
    check_bad_rows(&|x, rows, out| matmul_into(x, &w, rows, out).unwrap());
}

/// A token's output alone equals its row in a batch of 300 on one expert
/// (128-row tiles against one 64-row tile).
#[test]
fn batch_invariant() {
    if !on_hopper() {
        return;
    }
    let (kk, n) = (512, 320);
    let w = to_gpu(&weights(DType::Bf16, 1, n, kk, 9));
    let x = random(&[300, kk], DType::Bf16, 9);
    let run = |x: &Tensor| {
        let t = x.shape()[0];
        let ids = Tensor::from_slice(&vec![0u32; t], &[t, 1]).unwrap();
        let sort = moekit::ops::sort::expert_sort_on(Backend::CpuReference, &ids, 1).unwrap();
        let off = sort.offsets.to_device(gpu()).unwrap();
        let xg = x.to_device(gpu()).unwrap();
        let out = poisoned(&[t, n], DType::Bf16);
        matmul_into(&xg, &w, TcRows::Sorted(&off), &out).unwrap();
        host_f32(&out)
    };
    check_alone_equals_batch(&x, n, &run);
}

/// A reduced sweep for compute-sanitizer (memcheck, racecheck): plain and
/// SwiGLU, both tiles, ragged N and tiles, an empty expert.
#[test]
fn sanitizer_sweep() {
    if !on_hopper() {
        return;
    }
    let sort = sort_of(150, 2, 4, &[1], false, 5);
    check(DType::Bf16, 150, 2, 4, &sort, 264, 128);
    let sort = sort_of(20, 2, 4, &[], false, 6);
    check(DType::Bf16, 20, 2, 4, &sort, 72, 128);
    // Decoded weights: the fast affine decoder and Q8_0's unaligned blocks.
    let affine4 = WeightFormat::Affine(AffineParams {
        bits: 4,
        group_size: 64,
    });
    for f in [affine4, WeightFormat::Ggml(GgmlType::Q8_0)] {
        let sort = sort_of(150, 2, 4, &[1], false, 7);
        check_of(f, DType::Bf16, 150, 2, 4, &sort, 264, 128);
    }
}

/// The grouped GEMMs' tile order (`force_by_row`: a row tile's column
/// blocks side by side, or an expert's row tiles side by side for each
/// column block) changes only which tiles run together: tc_tma, the staged
/// kernel and tc_ra give the same bits in both orders, on experts of
/// several row tiles and several column blocks, one of them empty.
#[test]
fn tile_orders_give_the_same_bits() {
    use moekit::testing::cuda::tc_ra;
    let (t, k, e, n, kk) = (1500, 2, 8, 600, 256);
    let sort = sort_of(t, k, e, &[3], false, 11);
    let m = t * k;
    let x = random(&[t, kk], DType::Bf16, 12).to_device(gpu()).unwrap();
    let off = sort.offsets.to_device(gpu()).unwrap();
    let sorted = sort.sorted.to_device(gpu()).unwrap();
    let rows = TcRows::Gathered {
        offsets: &off,
        sorted: &sorted,
        top_k: k,
    };
    let dense = to_gpu(&weights(DType::Bf16, e, n, kk, 13));
    let a4 = WeightFormat::Affine(AffineParams {
        bits: 4,
        group_size: 64,
    });
    let quant = to_gpu(&weights_of(a4, DType::Bf16, e, n, kk, 14));
    let xp = poisoned(&[t, kk], DType::Bf16);
    tc_ra::permute_into(&x, tc_ra::span_order(a4), &xp).unwrap();
    let hopper = on_hopper();
    let run = |by_row: bool| {
        tc_gemm::force_by_row(Some(by_row));
        let mut outs = Vec::new();
        let out = poisoned(&[m, n], DType::Bf16);
        tc_gemm::matmul_into(&x, &dense, rows, &out).unwrap();
        outs.push(("staged", host_f32(&out)));
        if hopper {
            let out = poisoned(&[m, n], DType::Bf16);
            matmul_into(&x, &dense, rows, &out).unwrap();
            outs.push(("tc_tma", host_f32(&out)));
            let out = poisoned(&[m, n], DType::Bf16);
            tc_ra::matmul_into(&xp, &quant, rows, &out).unwrap();
            outs.push(("tc_ra", host_f32(&out)));
        }
        tc_gemm::force_by_row(None);
        outs
    };
    let (by_row, by_expert) = (run(true), run(false));
    for ((what, a), (_, b)) in by_row.iter().zip(&by_expert) {
        assert!(
            a.iter().all(|v| v.is_finite()),
            "{what}: an output not written"
        );
        assert_eq!(a, b, "{what}: the tile orders differ");
    }
    moekit::cuda::device(0).unwrap().check_errors().unwrap();
}
