//! The register-operand tensor-core GEMM (`cuda::ops::tc_ra`, sm_90a)
//! against the CPU reference.
//!
//! * `permute_into` in both span orders against a host permutation by
//!   `SpanOrder::logical`.
//! * Every format of `WeightFormat::all()` × f16/bf16 activations × {plain,
//!   SwiGLU fused and separate, SwiGLU with its output permuted in either
//!   span order (a down projection of this or the other order)}, rows
//!   gathered through an expert sort (the x rows permuted once).
//! * Every tile row count (16/32/64/128/256, the last at each N it runs;
//!   64- and 128-row tiles of fewer rows at their narrower N, every format),
//!   ragged N (not a multiple of the 128/64-column tile), experts with no
//!   rows, all rows on one expert,
//!   E = 512 with k = 10, M = 0; K not a multiple of 128 is refused.
//! * Bit-identical reruns, and a token's row equal alone and in a batch.
//! * Outputs are poisoned with NaN, so a missed element fails.
//!
//! The MoE block takes this kernel on sm_90a (`tc::block_*` run it there).

use crate::common::*;
use moekit::format::random::random_weights;
use moekit::format::{AffineParams, GgmlType};
use moekit::ops::act::{gather_swiglu_on, GateUp};
use moekit::ops::gather_mm::{gather_mm_on, RowExperts};
use moekit::ops::permute::permute_on;
use moekit::ops::sort::ExpertSort;

use moekit::testing::cuda::tc_gemm::TcRows;
use moekit::testing::cuda::tc_ra::{
    matmul_into, max_tile, permute_into, span_order, swiglu_into, tile_rows, SpanOrder, SPAN,
};
use moekit::{Backend, DType, QuantWeights, Tensor, WeightFormat};

fn weights(f: WeightFormat, e: usize, n: usize, k: usize, seed: u64) -> QuantWeights {
    random_weights(f, e, n, k, DType::F16, seed, &|| {}).unwrap()
}

fn to_gpu(w: &QuantWeights) -> QuantWeights {
    w.to_device(gpu()).unwrap()
}

/// The smallest K ≥ `target` that is whole spans and whole blocks of `f`.
fn span_k(f: WeightFormat, target: usize) -> usize {
    let g = f.k_granularity().max(SPAN);
    target.div_ceil(g) * g
}

/// Host permutation of each row's spans (what `permute_into` computes).
fn host_permute(v: &[f32], k: usize, order: SpanOrder) -> Vec<f32> {
    let mut out = vec![0f32; v.len()];
    for (r, row) in v.chunks(k).enumerate() {
        for (c, &x) in row.iter().enumerate() {
            let s0 = c / SPAN * SPAN;
            out[r * k + s0 + order.logical(c % SPAN)] = x;
        }
    }
    out
}

/// Plain and SwiGLU GEMMs of `t` tokens × `k` slots over `e` experts, N
/// output columns, K = `kk`, against the CPU reference.
#[allow(clippy::too_many_arguments)]
fn check(
    f: WeightFormat,
    dt: DType,
    t: usize,
    k: usize,
    e: usize,
    sort: &ExpertSort,
    n: usize,
    kk: usize,
) {
    let what = format!("{f} {dt} T={t} k={k} E={e} N={n} K={kk}");
    // Shown with a failure (a NaN panics inside nmse).
    eprintln!("tc_ra check: {what}");
    let x = random(&[t, kk], dt, t as u64 + 1);
    let xs = permute_on(Backend::CpuReference, &x, sort).unwrap();
    let m = t * k;
    let x_gpu = x.to_device(gpu()).unwrap();
    let xp = poisoned(&[t, kk], dt);
    let order = span_order(f);
    permute_into(&x_gpu, order, &xp).unwrap();
    let off = sort.offsets.to_device(gpu()).unwrap();
    let sorted = sort.sorted.to_device(gpu()).unwrap();
    let rows = TcRows::Gathered {
        offsets: &off,
        sorted: &sorted,
        top_k: k,
    };
    let cpu_rows = RowExperts::Sorted(&sort.offsets);
    let b = bound(dt);
    let bm = tile_rows(m, e, n.div_ceil(128), f);
    // Plain.
    let w = weights(f, e, n, kk, 3);
    let want = gather_mm_on(Backend::CpuReference, &xs, &w, cpu_rows).unwrap();
    let out = poisoned(&[m, n], dt);
    matmul_into(&xp, &to_gpu(&w), rows, &out).unwrap();
    let got = host_f32(&out);
    let err = nmse(&got, &want.to_f32_vec().unwrap());
    assert!(err <= b, "tc_ra {what} (BM {bm}): NMSE {err:e} > {b:e}");
    let again = poisoned(&[m, n], dt);
    matmul_into(&xp, &to_gpu(&w), rows, &again).unwrap();
    assert_eq!(host_f32(&again), got, "tc_ra {what}: reruns differ");
    // SwiGLU: fused and separate layouts, plain output; output permuted in
    // either order (I a multiple of the span).
    let i = n.div_ceil(2).max(8);
    let perms = [
        (true, None),
        (false, None),
        (true, Some(SpanOrder::Pairs)),
        (true, Some(SpanOrder::Nibbles)),
        (true, Some(SpanOrder::Alternate)),
    ];
    for (fused, perm) in perms {
        let i = if perm.is_some() {
            i.div_ceil(SPAN) * SPAN
        } else {
            i
        };
        let gu = if fused {
            GateUp::fused(weights(f, e, 2 * i, kk, 5)).unwrap()
        } else {
            GateUp::separate(weights(f, e, i, kk, 6), weights(f, e, i, kk, 7)).unwrap()
        };
        let gu_gpu = match &gu {
            GateUp::Fused(w) => GateUp::fused(to_gpu(w)).unwrap(),
            GateUp::Separate { gate, up } => GateUp::separate(to_gpu(gate), to_gpu(up)).unwrap(),
        };
        let want = gather_swiglu_on(Backend::CpuReference, &xs, &gu, cpu_rows).unwrap();
        let mut want = want.to_f32_vec().unwrap();
        if let Some(o) = perm {
            want = host_permute(&want, i, o);
        }
        eprintln!("tc_ra check: swiglu fused={fused} perm={perm:?}");
        let out = poisoned(&[m, i], dt);
        swiglu_into(&xp, &gu_gpu, rows, &out, perm).unwrap();
        let err = nmse(&host_f32(&out), &want);
        assert!(
            err <= b,
            "tc_ra_swiglu {what} fused={fused} perm={perm:?}: NMSE {err:e} > {b:e}"
        );
    }
    moekit::cuda::device(0).unwrap().check_errors().unwrap();
}

#[test]
fn permute_matches_the_host_order() {
    for order in SpanOrder::ALL {
        for dt in [DType::Bf16, DType::F16] {
            let x = random(&[7, 384], dt, 3);
            let out = poisoned(&[7, 384], dt);
            permute_into(&x.to_device(gpu()).unwrap(), order, &out).unwrap();
            let want = host_permute(&x.to_f32_vec().unwrap(), 384, order);
            assert_eq!(host_f32(&out), want, "{order:?} {dt}");
        }
    }
    let x = random(&[2, 200], DType::Bf16, 3).to_device(gpu()).unwrap();
    let out = poisoned(&[2, 200], DType::Bf16);
    let e = permute_into(&x, SpanOrder::Pairs, &out)
        .unwrap_err()
        .to_string();
    assert!(e.contains("multiple of 128"), "{e}");
}

#[test]
fn every_format_matches_cpu() {
    // Every format tc_ra runs (at 16-row tiles: T = 37, k = 4, E = 16); the
    // others are refused.
    for f in WeightFormat::all() {
        if max_tile(f) < 16 {
            let w = to_gpu(&weights(f, 1, 16, 256, 1));
            let x = random(&[4, 256], DType::Bf16, 1).to_device(gpu()).unwrap();
            let out = poisoned(&[4, 16], DType::Bf16);
            let e = matmul_into(&x, &w, TcRows::Single, &out)
                .unwrap_err()
                .to_string();
            assert!(e.contains("staged kernel measured faster"), "{f}: {e}");
            continue;
        }
        let kk = span_k(f, 256);
        for dt in [DType::Bf16, DType::F16] {
            let sort = sort_of(37, 4, 16, &[0, 7, 15], false, 11);
            check(f, dt, 37, 4, 16, &sort, 200, kk);
        }
        // Few experts, longer rows (K = 512): 16-row tiles of 14 rows.
        let sort = sort_of(7, 2, 4, &[1], false, 7);
        check(f, DType::Bf16, 7, 2, 4, &sort, 200, 2 * kk);
    }
}

#[test]
fn every_tile_size_and_edge_layouts() {
    let q4k = WeightFormat::Ggml(GgmlType::Q4_K);
    let a4 = WeightFormat::Affine(AffineParams {
        bits: 4,
        group_size: 64,
    });
    // E = 8, k = 2: rows per expert 2T/8 → tiles 16, 32, 64, 128 and 256
    // (T = 1100: experts of about 275 rows, a 256-row tile at N = 256 and
    // one of a few rows at N = 32; T = 1500: 375 rows, N = 256 and 128).
    for t in [5, 100, 200, 333, 1100, 1500] {
        let sort = sort_of(t, 2, 8, &[3], false, t as u64);
        check(q4k, DType::Bf16, t, 2, 8, &sort, 264, 512);
        check(a4, DType::Bf16, t, 2, 8, &sort, 136, 384);
    }
    let sort = sort_of(300, 2, 8, &[], true, 2);
    check(q4k, DType::Bf16, 300, 2, 8, &sort, 128, 256);
    let sort = sort_of(64, 10, 512, &[], false, 3);
    check(a4, DType::Bf16, 64, 10, 512, &sort, 72, 256);
    let sort = sort_of(0, 2, 8, &[], false, 4);
    check(q4k, DType::Bf16, 0, 2, 8, &sort, 64, 256);
}

/// Tiles narrower than their instance (`RaWidths`): 64-row tiles of 3 to
/// 64 rows, on both sides of 16 and 32 (wgmma N = 64, 32, 16), and 128-row
/// tiles of 2 to 128 rows, on both sides of 32 and 64 (N = 128, 64, 32), for
/// every format tc_ra runs at those tiles.
#[test]
fn narrow_tiles_every_format() {
    let c64 = [60, 30, 14, 3, 64, 33, 17, 0, 16, 32];
    let c128 = [120, 65, 30, 130, 100, 128, 64, 33, 0, 32];
    for (counts, bm) in [(&c64, 64), (&c128, 128)] {
        let t: usize = counts.iter().sum();
        let sort = sort_of_counts(counts, bm as u64);
        for f in WeightFormat::all() {
            if max_tile(f) < bm {
                continue;
            }
            assert_eq!(
                tile_rows(t, counts.len(), 1, f),
                bm,
                "{f}: the tile this test means"
            );
            let kk = span_k(f, 256);
            check(f, DType::Bf16, t, 1, counts.len(), &sort, 136, kk);
        }
    }
}

#[test]
fn refuses_k_off_the_span() {
    let f = WeightFormat::Affine(AffineParams {
        bits: 4,
        group_size: 64,
    });
    let w = to_gpu(&weights(f, 1, 16, 192, 1));
    let x = random(&[4, 192], DType::Bf16, 1).to_device(gpu()).unwrap();
    let out = poisoned(&[4, 16], DType::Bf16);
    let e = matmul_into(&x, &w, TcRows::Single, &out)
        .unwrap_err()
        .to_string();
    assert!(e.contains("K = 192"), "{e}");
}

/// A token's output alone equals its row in a batch of 300 (rows on the
/// same expert, different tiles and tile sizes).
#[test]
fn batch_invariant() {
    let f = WeightFormat::Ggml(GgmlType::Q4_K);
    let (kk, n) = (512, 256);
    let w = to_gpu(&weights(f, 1, n, kk, 9));
    let x = random(&[300, kk], DType::Bf16, 9);
    let run = |x: &Tensor| {
        let t = x.shape()[0];
        let xg = x.to_device(gpu()).unwrap();
        let xp = poisoned(&[t, kk], DType::Bf16);
        permute_into(&xg, span_order(f), &xp).unwrap();
        let out = poisoned(&[t, n], DType::Bf16);
        matmul_into(&xp, &w, TcRows::Single, &out).unwrap();
        host_f32(&out)
    };
    check_alone_equals_batch(&x, n, &run);
}

/// A reduced sweep for compute-sanitizer (memcheck, racecheck): packed
/// 4-bit, K-quant super-block and byte decoders; plain, SwiGLU and permuted
/// SwiGLU epilogues; tiles of 16, 64 and 128 rows (two blocks an SM below
/// 128); ragged N; the permutation kernel — on small shapes.
#[test]
fn sanitizer_sweep() {
    let fmts = [
        WeightFormat::Ggml(GgmlType::Q4_K),
        WeightFormat::Ggml(GgmlType::Q8_0),
        WeightFormat::Affine(AffineParams {
            bits: 4,
            group_size: 64,
        }),
    ];
    for f in fmts {
        // E = 2, k = 2: tiles of 16, 64, 128 and 256 rows (at N = 256 and
        // 128), where tc_ra runs f.
        for t in [3, 40, 150, 340] {
            if tile_rows(2 * t, 2, 1, f) > max_tile(f) {
                continue;
            }
            let sort = sort_of(t, 2, 2, &[], false, 7);
            check(f, DType::Bf16, t, 2, 2, &sort, 72, 256);
        }
    }
}
