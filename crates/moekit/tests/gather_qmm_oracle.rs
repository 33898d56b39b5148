//! The grouped quantized matmul against `mx.gather_qmm` (MLX 0.32, CPU), on
//! weights quantized by `mx.quantize` (fixtures/affine/gqmm_*; see its README).

mod common_util;
use common_util::{fixture, nmse};
use moekit::cpu::{with_act_mode, ActMode};
use moekit::format::AffineParams;
use moekit::npy::NpyArray;
use moekit::ops::gather_mm::{gather_mm_on, RowExperts};
use moekit::{Backend, QuantWeights, Tensor, WeightFormat};

/// MLX accumulates in f32 in its own order; ours differs only in summation
/// order: NMSE ≤ 1e-10 (measured values are printed), with the fast CPU
/// path's f32 activations (`ActMode::F32`).
const NMSE_BOUND: f64 = 1e-10;
/// With its default activations (8-bit blocks where the format has integer
/// kernels).
const NMSE_Q8: f64 = 1e-4;

fn load(name: &str) -> Tensor {
    NpyArray::read(fixture(&format!("affine/{name}.npy")))
        .unwrap()
        .to_tensor()
        .unwrap()
}

#[test]
fn gather_mm_matches_mx_gather_qmm() {
    for (bits, gs) in [(4, 64), (4, 32), (8, 64), (8, 32), (3, 64), (3, 32)] {
        let p = format!("gqmm_b{bits}_g{gs}");
        let (x, wq, ids, out) = (
            load(&format!("{p}_x")),
            load(&format!("{p}_wq")),
            load(&format!("{p}_ids")),
            load(&format!("{p}_out")),
        );
        let (e, n) = (wq.shape()[0], wq.shape()[1]);
        let k = x.shape()[1];
        let f = WeightFormat::Affine(AffineParams {
            bits,
            group_size: gs,
        });
        let w = QuantWeights::new(
            f,
            e,
            n,
            k,
            wq,
            Some(load(&format!("{p}_scales"))),
            Some(load(&format!("{p}_biases"))),
        )
        .unwrap();
        let want = out.to_f32_vec().unwrap();
        for b in [Backend::CpuReference, Backend::CpuFast] {
            let got = with_act_mode(ActMode::F32, || {
                gather_mm_on(b, &x, &w, RowExperts::PerRow(&ids))
            })
            .unwrap();
            let e = nmse(&got.to_f32_vec().unwrap(), &want);
            println!("{p} {b:?}: NMSE {e:.3e}");
            assert!(e <= NMSE_BOUND, "{p} {b:?}: NMSE {e:e} > {NMSE_BOUND:e}");
        }
        // The default activations (8-bit blocks for the 4-bit formats).
        let got = gather_mm_on(Backend::CpuFast, &x, &w, RowExperts::PerRow(&ids)).unwrap();
        let e = nmse(&got.to_f32_vec().unwrap(), &want);
        println!("{p} CpuFast (default activations): NMSE {e:.3e}");
        assert!(
            e <= NMSE_Q8,
            "{p} default activations: NMSE {e:e} > {NMSE_Q8:e}"
        );
    }
}
