//! MLX's microscaled modes (mxfp4, nvfp4, mxfp8) against MLX 0.32 on the CPU
//! (fixtures/mlxfp, written by scripts/fixtures/mlxfp.py): dequantization
//! bit for bit (`mx.dequantize(..., dtype=float32)`) on crafted rows holding
//! every code and every scale byte and on `mx.quantize` outputs, quantization
//! byte for byte against `mx.quantize` (random and edge-case inputs), and the
//! grouped matmul against `mx.gather_qmm`. The mlx-lm checkpoints of these
//! modes are in tests/st_load.rs.

mod common_util;
use common_util::{fixture, nmse};
use moekit::cpu::{with_act_mode, ActMode};
use moekit::format::{mlxfp, random::random_weights, storage_shapes, MlxFpMode};
use moekit::npy::NpyArray;
use moekit::ops::gather_mm::{gather_mm_on, RowExperts};
use moekit::{Backend, DType, QuantWeights, Tensor, WeightFormat};

/// MLX accumulates in f32 in its own order; ours differs only in summation
/// order (f64 in the reference): NMSE ≤ 1e-10.
const NMSE_BOUND: f64 = 1e-10;

fn load(name: &str) -> Tensor {
    NpyArray::read(fixture(&format!("mlxfp/{name}.npy")))
        .unwrap()
        .to_tensor()
        .unwrap()
}

fn weights(mode: MlxFpMode, w: Tensor, s: Tensor, k: usize) -> QuantWeights {
    let (e, n) = match w.shape() {
        [e, n, _] => (*e, *n),
        [n, _] => (1, *n),
        other => panic!("weight shape {other:?}"),
    };
    QuantWeights::new(WeightFormat::MlxFp(mode), e, n, k, w, Some(s), None).unwrap()
}

/// Equal bits, or NaN on both sides (MLX's NaN of 0·∞ has the sign bit of
/// the x86 default NaN; only NaN-ness is MLX's definition).
fn assert_same_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    let bad: Vec<_> = got
        .iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| g.to_bits() != w.to_bits() && !(g.is_nan() && w.is_nan()))
        .take(5)
        .collect();
    assert!(bad.is_empty(), "{what}: (index, (got, want)) {bad:?}");
}

#[test]
fn dequantization_is_bit_exact_with_mx_dequantize() {
    for mode in MlxFpMode::ALL {
        for case in ["all", "q"] {
            let p = format!("{mode}_{case}");
            let deq = load(&format!("{p}_deq"));
            let k = deq.shape()[1];
            let w = weights(
                mode,
                load(&format!("{p}_w")),
                load(&format!("{p}_scales")),
                k,
            );
            let got = w.dequantize_expert(0).unwrap();
            assert_same_bits(&got, &deq.to_f32_vec().unwrap(), &p);
            if case == "all" {
                // The crafted rows hold every scale byte: ∞ and NaN included.
                assert!(got.iter().any(|v| v.is_nan()), "{p}: no NaN");
            } else {
                // Quantized from x: close to it.
                let x = load(&format!("{p}_x")).to_f32_vec().unwrap();
                let e = nmse(&got, &x);
                assert!(e < 0.05, "{p}: NMSE {e} vs the quantized weights");
            }
        }
    }
}

#[test]
fn quantize_is_byte_exact_with_mx_quantize() {
    for mode in MlxFpMode::ALL {
        // `q`: random weights; `qe`: edge cases (zeros, subnormals, ±∞, NaN,
        // f32 max, scale boundaries, e2m1/e4m3 ties, every magnitude).
        for case in ["q", "qe"] {
            let p = format!("{mode}_{case}");
            let x = load(&format!("{p}_x"));
            let (rows, cols) = (x.shape()[0], x.shape()[1]);
            let got = mlxfp::quantize(mode, &x.to_f32_vec().unwrap(), rows, cols).unwrap();
            let (w, s) = (load(&format!("{p}_w")), load(&format!("{p}_scales")));
            assert_eq!(w.shape(), [rows, cols * mode.bits() as usize / 32], "{p}");
            assert_eq!(got.packed, w.as_slice::<u32>().unwrap(), "{p}: codes");
            assert_eq!(got.scales, s.as_slice::<u8>().unwrap(), "{p}: scales");
            if case == "qe" && mode != MlxFpMode::Nvfp4 {
                // The edge cases reach the zero group (127), the NaN/∞ group
                // (128) and the wrapped bytes of subnormal groups.
                for b in [127u8, 128] {
                    assert!(got.scales.contains(&b), "{p}: no scale byte {b}");
                }
                assert!(got.scales.iter().any(|&b| b >= 234), "{p}: no wrapped byte");
            }
        }
    }
}

#[test]
fn gather_mm_matches_mx_gather_qmm() {
    for mode in MlxFpMode::ALL {
        let p = format!("{mode}_gqmm");
        let (x, ids, out) = (
            load(&format!("{p}_x")),
            load(&format!("{p}_ids")),
            load(&format!("{p}_out")),
        );
        let k = x.shape()[1];
        let w = weights(
            mode,
            load(&format!("{p}_w")),
            load(&format!("{p}_scales")),
            k,
        );
        let want = out.to_f32_vec().unwrap();
        for b in [Backend::CpuReference, Backend::CpuFast] {
            // f32 activations: the fast path's default for mxfp4 and nvfp4
            // is the integer one (8-bit activations, NMSE ≤ 1e-4, below).
            let got = with_act_mode(ActMode::F32, || {
                gather_mm_on(b, &x, &w, RowExperts::PerRow(&ids))
            })
            .unwrap();
            let e = nmse(&got.to_f32_vec().unwrap(), &want);
            println!("{p} {b:?}: NMSE {e:.3e}");
            assert!(e <= NMSE_BOUND, "{p} {b:?}: NMSE {e:e} > {NMSE_BOUND:e}");
        }
        let got = gather_mm_on(Backend::CpuFast, &x, &w, RowExperts::PerRow(&ids)).unwrap();
        let e = nmse(&got.to_f32_vec().unwrap(), &want);
        println!("{p} CpuFast (default activations): NMSE {e:.3e}");
        assert!(e <= 1e-4, "{p} CpuFast default: NMSE {e:e} > 1e-4");
    }
}

#[test]
fn names_shapes_and_argument_errors() {
    for (name, mode) in [
        ("mlx-mxfp4", MlxFpMode::Mxfp4),
        ("mlx-nvfp4", MlxFpMode::Nvfp4),
        ("MLX-MXFP8", MlxFpMode::Mxfp8),
    ] {
        let f = WeightFormat::parse(name).unwrap();
        assert_eq!(f, WeightFormat::MlxFp(mode));
        assert_eq!(f.to_string(), name.to_ascii_lowercase());
        assert!(WeightFormat::all().contains(&f));
        assert!(!f.has_biases());
    }
    // Plain `mxfp4` stays GGUF's.
    assert!(matches!(
        WeightFormat::parse("mxfp4").unwrap(),
        WeightFormat::Ggml(_)
    ));
    assert!(WeightFormat::parse("mlx-mxint4").is_err());

    let f = WeightFormat::MlxFp(MlxFpMode::Nvfp4);
    let (dt, shape, sshape) = storage_shapes(f, 2, 3, 64).unwrap();
    assert_eq!(
        (dt, shape, sshape),
        (DType::U32, vec![2, 3, 8], Some(vec![2, 3, 4]))
    );
    let e = storage_shapes(f, 2, 3, 48).unwrap_err().to_string();
    assert!(e.contains("cols (K)") && e.contains("32"), "{e}");

    let data = || Tensor::from_slice(&[0u32; 48], &[2, 3, 8]).unwrap();
    let scales = || Tensor::from_slice(&[0x38u8; 24], &[2, 3, 4]).unwrap();
    let new = |s: Option<Tensor>, b: Option<Tensor>| {
        QuantWeights::new(f, 2, 3, 64, data(), s, b).map(|_| ())
    };
    assert!(new(Some(scales()), None).is_ok());
    let e = new(None, None).unwrap_err().to_string();
    assert!(e.contains("scales"), "{e}");
    let e = new(Some(scales()), Some(scales())).unwrap_err().to_string();
    assert!(e.contains("biases") && e.contains("none"), "{e}");
    let f32_scales = Tensor::from_f32(&[1.0; 24], &[2, 3, 4], DType::F32).unwrap();
    let e = new(Some(f32_scales), None).unwrap_err().to_string();
    assert!(e.contains("scales") && e.contains("u8"), "{e}");
    let short = Tensor::from_slice(&[0x38u8; 12], &[2, 3, 2]).unwrap();
    let e = new(Some(short), None).unwrap_err().to_string();
    assert!(e.contains("scales") && e.contains("[2, 3, 4]"), "{e}");
}

#[test]
fn random_weights_are_finite_and_small() {
    for mode in MlxFpMode::ALL {
        let f = WeightFormat::MlxFp(mode);
        let w = random_weights(f, 2, 16, 128, DType::F16, 5, &|| {}).unwrap();
        assert!(w.biases().is_none());
        for e in 0..2 {
            let v = w.dequantize_expert(e).unwrap();
            let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
            assert!(v.iter().all(|x| x.is_finite()), "{f}");
            assert!(max > 0.01 && max < 0.5, "{f}: max |w| {max}");
        }
    }
}
