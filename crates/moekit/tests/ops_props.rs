//! Property tests: every fast CPU op equals the reference on random inputs,
//! over every weight format, ragged shapes (M, N not multiples of any tile),
//! experts with zero tokens, and all tokens on one expert; plus rejections.

mod common_util;
use common_util::{nmse, random_tensor, rng};
use moekit::cpu::{with_act_mode, ActMode};
use moekit::format::random::random_weights;
use moekit::ops::act::{gather_swiglu_on, swiglu_on, GateUp};
use moekit::ops::gather_mm::{gather_mm_on, qmm_on, segments, GatherMmArgs, RowExperts};
use moekit::ops::permute::{permute_on, unpermute_on};
use moekit::ops::sort::expert_sort_on;
use moekit::testing::cpu_fast::{gather_mm_act, gather_mm_with, kind_of_rows, Strategy};
use moekit::testing::decoder;
use moekit::{Backend, DType, QuantWeights, Tensor, WeightFormat};
use rand::Rng;

/// Fast path vs f64 reference; both accumulate the same products, so the
/// only difference is f32 vs f64 summation: NMSE ≤ 1e-9. The fast path runs
/// with f32 activations (`ActMode::F32`) for this bound.
const NMSE_FAST_VS_REF: f64 = 1e-9;
/// The fast path with activations quantized to 8-bit blocks (the default
/// for weight formats with integer kernels) vs the f64 reference.
const NMSE_Q8_VS_REF: f64 = 1e-4;
/// With f16/bf16 activations the fast and reference paths round the same f32
/// results to the output dtype; rounding of nearly-equal values: NMSE ≤ 1e-4.
const NMSE_HALF_OUT: f64 = 1e-4;

fn weights(f: WeightFormat, e: usize, n: usize, k: usize, seed: u64) -> QuantWeights {
    random_weights(f, e, n, k, DType::F16, seed, &|| {}).unwrap()
}

/// Row→expert layouts to test: (name, per-row ids).
fn layouts(m: usize, e: usize, seed: u64) -> Vec<(&'static str, Vec<u32>)> {
    let mut r = rng(seed);
    let mut random: Vec<u32> = (0..m).map(|_| r.random_range(1..e as u32)).collect(); // expert 0 empty
    random.sort();
    vec![
        ("random, expert 0 empty", random),
        ("all on last expert", vec![e as u32 - 1; m]),
    ]
}

fn offsets_of(ids: &[u32], e: usize) -> Tensor {
    let mut o = vec![0u32; e + 1];
    for &i in ids {
        o[i as usize + 1] += 1;
    }
    for j in 0..e {
        o[j + 1] += o[j];
    }
    Tensor::from_slice(&o, &[e + 1]).unwrap()
}

fn check_close(what: &str, fast: &Tensor, refr: &Tensor, bound: f64) {
    assert_eq!(fast.shape(), refr.shape(), "{what}: shape");
    let e = nmse(&fast.to_f32_vec().unwrap(), &refr.to_f32_vec().unwrap());
    assert!(e <= bound, "{what}: NMSE {e:e} > {bound:e}");
}

#[test]
fn gather_mm_fast_equals_reference_for_every_format() {
    let (e, n, k, m) = (4, 37, 256, 13);
    for (fi, f) in WeightFormat::all().into_iter().enumerate() {
        let w = weights(f, e, n, k, fi as u64);
        for (li, (name, ids)) in layouts(m, e, fi as u64).into_iter().enumerate() {
            let x = random_tensor(&[m, k], DType::F32, 100 + li as u64);
            let idt = Tensor::from_slice(&ids, &[m]).unwrap();
            let off = offsets_of(&ids, e);
            let refr =
                gather_mm_on(Backend::CpuReference, &x, &w, RowExperts::PerRow(&idt)).unwrap();
            for rows in [RowExperts::PerRow(&idt), RowExperts::Sorted(&off)] {
                let fast = with_act_mode(ActMode::F32, || {
                    gather_mm_on(Backend::CpuFast, &x, &w, rows)
                })
                .unwrap();
                check_close(
                    &format!("gather_mm {f} {name}"),
                    &fast,
                    &refr,
                    NMSE_FAST_VS_REF,
                );
                // The default: quantized activations where the format has
                // integer kernels, else the same f32 path.
                let q8 = gather_mm_on(Backend::CpuFast, &x, &w, rows).unwrap();
                let q8_path = kind_of_rows(&decoder(&w).unwrap()).is_some();
                let bound = if q8_path {
                    NMSE_Q8_VS_REF
                } else {
                    assert_eq!(q8.bytes().unwrap(), fast.bytes().unwrap(), "{f}: f32 path");
                    NMSE_FAST_VS_REF
                };
                check_close(&format!("gather_mm {f} {name} default"), &q8, &refr, bound);
            }
            // Force each fast-path strategy on every format.
            let xv = x.to_f32_vec().unwrap();
            let segs = segments("test", RowExperts::PerRow(&idt), m, e).unwrap();
            let args = GatherMmArgs {
                x: &xv,
                m,
                w: &w,
                segments: &segs,
            };
            let rv = refr.to_f32_vec().unwrap();
            for st in [Strategy::FusedDot, Strategy::DecodeOnce] {
                let got = with_act_mode(ActMode::F32, || gather_mm_with(&args, st)).unwrap();
                let err = nmse(&got, &rv);
                assert!(
                    err <= NMSE_FAST_VS_REF,
                    "gather_mm {f} {name} {st:?}: NMSE {err:e}"
                );
                let got = gather_mm_act(&args, st, ActMode::Q8).unwrap();
                let err = nmse(&got, &rv);
                assert!(
                    err <= NMSE_Q8_VS_REF,
                    "gather_mm {f} {name} {st:?} q8: NMSE {err:e}"
                );
            }
        }
    }
}

#[test]
fn gather_mm_half_activations_and_unsorted_ids() {
    let (e, n, k, m) = (3, 65, 128, 9);
    let w = weights(WeightFormat::parse("affine4-g32").unwrap(), e, n, k, 7);
    let ids: Vec<u32> = vec![2, 0, 2, 1, 1, 0, 2, 2, 0]; // not sorted: PerRow handles any order
    let idt = Tensor::from_slice(&ids, &[m]).unwrap();
    for dt in [DType::F16, DType::Bf16] {
        let x = random_tensor(&[m, k], dt, 3);
        let refr = gather_mm_on(Backend::CpuReference, &x, &w, RowExperts::PerRow(&idt)).unwrap();
        let fast = gather_mm_on(Backend::CpuFast, &x, &w, RowExperts::PerRow(&idt)).unwrap();
        assert_eq!(fast.dtype(), dt);
        check_close(&format!("gather_mm {dt}"), &fast, &refr, NMSE_HALF_OUT);
    }
}

#[test]
fn fused_swiglu_equals_reference_separate_and_fused_layouts() {
    let (e, i, h, m) = (5, 24, 256, 11);
    for f in ["q4_0", "q4_k", "affine3-g64", "bf16"] {
        let f = WeightFormat::parse(f).unwrap();
        let sep = GateUp::separate(weights(f, e, i, h, 1), weights(f, e, i, h, 2)).unwrap();
        let fused = GateUp::fused(weights(f, e, 2 * i, h, 3)).unwrap();
        let (_, ids) = layouts(m, e, 9).remove(0);
        let off = offsets_of(&ids, e);
        let x = random_tensor(&[m, h], DType::F32, 4);
        for (name, gu) in [("separate", &sep), ("fused", &fused)] {
            let refr =
                gather_swiglu_on(Backend::CpuReference, &x, gu, RowExperts::Sorted(&off)).unwrap();
            let fast = with_act_mode(ActMode::F32, || {
                gather_swiglu_on(Backend::CpuFast, &x, gu, RowExperts::Sorted(&off))
            })
            .unwrap();
            check_close(
                &format!("gather_swiglu {f} {name}"),
                &fast,
                &refr,
                NMSE_FAST_VS_REF,
            );
            let q8 = with_act_mode(ActMode::Q8, || {
                gather_swiglu_on(Backend::CpuFast, &x, gu, RowExperts::Sorted(&off))
            })
            .unwrap();
            check_close(
                &format!("gather_swiglu {f} {name} q8"),
                &q8,
                &refr,
                NMSE_Q8_VS_REF,
            );
        }
        // The fused op equals swiglu(gather_mm(gate), gather_mm(up)).
        if let GateUp::Separate { gate, up } = &sep {
            let g =
                gather_mm_on(Backend::CpuReference, &x, gate, RowExperts::Sorted(&off)).unwrap();
            let u = gather_mm_on(Backend::CpuReference, &x, up, RowExperts::Sorted(&off)).unwrap();
            let composed = swiglu_on(Backend::CpuReference, &g, &u).unwrap();
            let fast = with_act_mode(ActMode::F32, || {
                gather_swiglu_on(Backend::CpuFast, &x, &sep, RowExperts::Sorted(&off))
            })
            .unwrap();
            check_close(
                &format!("gather_swiglu vs composed {f}"),
                &fast,
                &composed,
                NMSE_FAST_VS_REF,
            );
        }
    }
}

#[test]
fn permute_unpermute_fast_equals_reference_exactly() {
    for (t, k, e, h) in [(1, 1, 1, 8), (7, 3, 5, 33), (64, 8, 128, 16)] {
        let mut r = rng(t as u64);
        let ids: Vec<u32> = (0..t * k).map(|_| r.random_range(0..e as u32)).collect();
        let idt = Tensor::from_slice(&ids, &[t, k]).unwrap();
        let sr = expert_sort_on(Backend::CpuReference, &idt, e).unwrap();
        let sf = expert_sort_on(Backend::CpuFast, &idt, e).unwrap();
        assert_eq!(
            sr.sorted.as_slice::<u32>().unwrap(),
            sf.sorted.as_slice::<u32>().unwrap()
        );
        assert_eq!(
            sr.offsets.as_slice::<u32>().unwrap(),
            sf.offsets.as_slice::<u32>().unwrap()
        );
        for dt in [DType::F32, DType::Bf16] {
            let x = random_tensor(&[t, h], dt, 5);
            let pr = permute_on(Backend::CpuReference, &x, &sr).unwrap();
            let pf = permute_on(Backend::CpuFast, &x, &sf).unwrap();
            assert_eq!(pr.bytes().unwrap(), pf.bytes().unwrap());
            // Row p of the permuted tensor is token sorted[p] / k of x.
            let (xs, ps) = (x.to_f32_vec().unwrap(), pf.to_f32_vec().unwrap());
            for (p, &s) in sf.sorted.as_slice::<u32>().unwrap().iter().enumerate() {
                let tok = s as usize / k;
                assert_eq!(&ps[p * h..(p + 1) * h], &xs[tok * h..(tok + 1) * h]);
            }
            let w = random_tensor(&[t, k], DType::F32, 6);
            let ur = unpermute_on(Backend::CpuReference, &pf, &sr, &w).unwrap();
            let uf = unpermute_on(Backend::CpuFast, &pf, &sf, &w).unwrap();
            assert_eq!(
                ur.bytes().unwrap(),
                uf.bytes().unwrap(),
                "unpermute is bit-identical"
            );
            // unpermute(permute(x)) with weights summing to 1 returns x.
            let ones = Tensor::from_f32(&vec![1.0 / k as f32; t * k], &[t, k], DType::F32).unwrap();
            let back = unpermute_on(
                Backend::CpuFast,
                &pf.to_dtype(DType::F32).unwrap(),
                &sf,
                &ones,
            )
            .unwrap();
            let e = nmse(&back.to_f32_vec().unwrap(), &xs);
            assert!(e < 1e-12, "roundtrip NMSE {e}");
        }
    }
}

#[test]
fn qmm_matches_gather_with_one_expert() {
    let w = weights(WeightFormat::parse("q8_0").unwrap(), 1, 19, 64, 3);
    let x = random_tensor(&[5, 64], DType::F32, 8);
    let a = with_act_mode(ActMode::F32, || qmm_on(Backend::CpuFast, &x, &w)).unwrap();
    let b = qmm_on(Backend::CpuReference, &x, &w).unwrap();
    check_close("qmm", &a, &b, NMSE_FAST_VS_REF);
    let q8 = qmm_on(Backend::CpuFast, &x, &w).unwrap();
    check_close("qmm q8", &q8, &b, NMSE_Q8_VS_REF);
    let w2 = weights(WeightFormat::parse("q8_0").unwrap(), 2, 19, 64, 3);
    assert!(qmm_on(Backend::CpuFast, &x, &w2).is_err());
}

#[test]
fn rejections_name_op_argument_expected_and_got() {
    let w = weights(WeightFormat::parse("q4_0").unwrap(), 4, 8, 64, 1);
    let x = random_tensor(&[3, 64], DType::F32, 1);
    let msg = |r: moekit::Result<Tensor>| r.unwrap_err().to_string();
    // Out-of-range expert id: an error, never an out-of-bounds access.
    let bad = Tensor::from_slice(&[0u32, 4, 1], &[3]).unwrap();
    let m = msg(gather_mm_on(
        Backend::CpuFast,
        &x,
        &w,
        RowExperts::PerRow(&bad),
    ));
    assert!(
        m.contains("gather_mm") && m.contains("ids") && m.contains("id 4 at row 1"),
        "{m}"
    );
    // Offsets that do not end at M, or decrease.
    for o in [[0u32, 1, 2, 2, 2], [0, 2, 1, 3, 3], [1, 1, 2, 3, 3]] {
        let off = Tensor::from_slice(&o, &[5]).unwrap();
        let m = msg(gather_mm_on(
            Backend::CpuFast,
            &x,
            &w,
            RowExperts::Sorted(&off),
        ));
        assert!(m.contains("offsets") && m.contains("non-decreasing"), "{m}");
    }
    let off = Tensor::from_slice(&[0u32, 3, 3, 3], &[4]).unwrap();
    assert!(msg(gather_mm_on(
        Backend::CpuFast,
        &x,
        &w,
        RowExperts::Sorted(&off)
    ))
    .contains("E + 1"));
    // K mismatch, wrong dtype, wrong rank.
    let x2 = random_tensor(&[3, 32], DType::F32, 1);
    let ok = Tensor::from_slice(&[0u32, 1, 2], &[3]).unwrap();
    assert!(msg(gather_mm_on(
        Backend::CpuFast,
        &x2,
        &w,
        RowExperts::PerRow(&ok)
    ))
    .contains("K of the weights"));
    let xi = Tensor::from_slice(&[0u32; 192], &[3, 64]).unwrap();
    assert!(msg(gather_mm_on(
        Backend::CpuFast,
        &xi,
        &w,
        RowExperts::PerRow(&ok)
    ))
    .contains("dtype"));
    let ids_f = Tensor::from_slice(&[0f32; 3], &[3]).unwrap();
    assert!(msg(gather_mm_on(
        Backend::CpuFast,
        &x,
        &w,
        RowExperts::PerRow(&ids_f)
    ))
    .contains("dtype u32"));
    // Weights whose K is not a multiple of the block size / group size.
    let e = random_weights(
        WeightFormat::parse("q4_k").unwrap(),
        1,
        4,
        128,
        DType::F16,
        0,
        &|| {},
    )
    .unwrap_err();
    assert!(e.to_string().contains("multiple of 256"), "{e}");
    assert!(WeightFormat::parse("affine7").is_err());
    assert!(WeightFormat::parse("affine4-g48").is_err());
    // GateUp shapes must agree.
    let g = weights(WeightFormat::Dense(DType::F32), 2, 8, 64, 1);
    let u = weights(WeightFormat::Dense(DType::F32), 2, 9, 64, 1);
    assert!(GateUp::separate(g, u).is_err());
    // QuantWeights::new checks data size and scales presence.
    let d = Tensor::zeros(DType::U32, &[2, 8, 7]);
    assert!(QuantWeights::new(
        WeightFormat::parse("affine4").unwrap(),
        2,
        8,
        64,
        d,
        None,
        None
    )
    .is_err());
}
