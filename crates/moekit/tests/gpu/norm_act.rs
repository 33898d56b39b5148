//! Norm epilogues on the GPU vs the CPU reference (f64), on fresh random
//! inputs: each of the seven epilogues × activation dtype × norm-weight dtype
//! (the scalar's / residual norm weight's dtype rotating through all three) ×
//! rows ∈ {1, 7, 333, 4096} × dim ∈ {64, 1000, 1003, 2048, 2880} (4096 rows
//! only with dims 64 and 1003, to bound the CPU reference's time) plus dims
//! 13001 and 16384 (longer than the shared-memory staging limit) at 1 and 7
//! rows; k ∈ {1, 8} for the MoE epilogues, scalar `[1]` and `[dim]`, with and
//! without the `residual + input` output of `residual_norm`.
//!
//! Outputs (and the sum output) are preallocated and poisoned with NaN.
//! Thresholds: NMSE ≤ 1e-10 for f32 outputs, `common::bound` for f16 / bf16
//! (the kernel's f32 result and the reference's f64 result may round to
//! neighbouring values); the sum output is bit-exact (one rounded addition
//! on both sides).

use crate::common::*;
use moekit::ops::norm::*;
use moekit::testing::cuda::norm::{epilogue_into, EpilogueOperands, STAGED_MAX_DIM};
use moekit::{Backend, DType, Device, Result, Tensor};

/// Large enough that a kernel ignoring or misplacing eps fails the f32 bound.
const EPS: f32 = 1e-2;
const ACT: [DType; 3] = [DType::F32, DType::F16, DType::Bf16];
const NORM_W: [DType; 3] = [DType::F32, DType::Bf16, DType::F16];
const DIMS: [usize; 5] = [64, 1000, 1003, 2048, 2880];
const ROWS: [usize; 4] = [1, 7, 333, 4096];
/// Beyond [`STAGED_MAX_DIM`]: v is recomputed in the second pass.
const LONG_DIMS: [usize; 2] = [13_001, 16_384];

/// NMSE bound of an output of `dtype`.
fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-10,
        d => bound(d),
    }
}

/// (rows, dim) of the sweep.
fn shapes() -> Vec<(usize, usize)> {
    assert!(LONG_DIMS.iter().all(|&d| d > STAGED_MAX_DIM));
    let mut v = Vec::new();
    for rows in ROWS {
        for dim in DIMS {
            if rows < 4096 || dim == 64 || dim == 1003 {
                v.push((rows, dim));
            }
        }
    }
    for rows in [1, 7] {
        v.extend(LONG_DIMS.iter().map(|&d| (rows, d)));
    }
    v
}

/// One epilogue's operands (on the CPU or the GPU).
#[derive(Clone)]
struct Case {
    op: Epilogue,
    input: Tensor,
    moe_weights: Option<Tensor>,
    residual: Option<Tensor>,
    weight: Tensor,
    residual_weight: Option<Tensor>,
    scalar: Option<Tensor>,
    write_sum: bool,
}

fn is_moe(op: Epilogue) -> bool {
    matches!(op, Epilogue::MoeWsumNormAdd | Epilogue::MoeWsumDnormAdd)
}

fn has_scalar(op: Epilogue) -> bool {
    matches!(op, Epilogue::ResidualNormScalar | Epilogue::NormAddScalar)
}

/// The activation operands of a case: input, MoE weights, residual.
struct Acts {
    input: Tensor,
    moe_weights: Option<Tensor>,
    residual: Option<Tensor>,
}

impl Acts {
    fn new(op: Epilogue, act: DType, rows: usize, dim: usize, k: usize, seed: u64) -> Acts {
        let moe = is_moe(op);
        let shape: Vec<usize> = if moe {
            vec![rows, k, dim]
        } else {
            vec![rows, dim]
        };
        Acts {
            input: random(&shape, act, seed),
            moe_weights: moe.then(|| random(&[rows, k], DType::F32, seed + 1)),
            residual: (op != Epilogue::RmsNorm).then(|| random(&[rows, dim], act, seed + 2)),
        }
    }
}

impl Case {
    /// Norm weights of `w`; the scalar (`[scalar_len]`) or residual norm
    /// weight of `extra`.
    fn new(
        op: Epilogue,
        a: &Acts,
        w: DType,
        extra: DType,
        scalar_len: usize,
        write_sum: bool,
        seed: u64,
    ) -> Case {
        let dim = *a.input.shape().last().unwrap();
        Case {
            op,
            input: a.input.clone(),
            moe_weights: a.moe_weights.clone(),
            residual: a.residual.clone(),
            weight: random(&[dim], w, seed + 3),
            residual_weight: (op == Epilogue::MoeWsumDnormAdd)
                .then(|| random(&[dim], extra, seed + 4)),
            scalar: has_scalar(op).then(|| random(&[scalar_len], extra, seed + 5)),
            write_sum,
        }
    }

    fn to_device(&self, d: Device) -> Case {
        let mv = |t: &Option<Tensor>| t.as_ref().map(|t| t.to_device(d).unwrap());
        Case {
            op: self.op,
            input: self.input.to_device(d).unwrap(),
            moe_weights: mv(&self.moe_weights),
            residual: mv(&self.residual),
            weight: self.weight.to_device(d).unwrap(),
            residual_weight: mv(&self.residual_weight),
            scalar: mv(&self.scalar),
            write_sum: self.write_sum,
        }
    }

    fn rows_dim(&self) -> (usize, usize) {
        let s = self.input.shape();
        (s[0], s[s.len() - 1])
    }

    fn operands(&self) -> EpilogueOperands<'_> {
        EpilogueOperands {
            op: self.op,
            input: &self.input,
            moe_weights: self.moe_weights.as_ref(),
            residual: self.residual.as_ref(),
            weight: &self.weight,
            residual_weight: self.residual_weight.as_ref(),
            scalar: self.scalar.as_ref(),
            eps: EPS,
        }
    }

    /// The op's front end with `backend`, or the plain form (backend of the
    /// input's device) for `None`.
    fn front(&self, backend: Option<Backend>) -> Result<(Tensor, Option<Tensor>)> {
        fn call<P, R>(
            b: Option<Backend>,
            p: &P,
            on: fn(Backend, &P) -> Result<R>,
            plain: fn(&P) -> Result<R>,
        ) -> Result<R> {
            match b {
                Some(b) => on(b, p),
                None => plain(p),
            }
        }
        let (input, weight) = (&self.input, &self.weight);
        let residual = || self.residual.as_ref().unwrap();
        let single = |t: Result<Tensor>| t.map(|t| (t, None));
        match self.op {
            Epilogue::RmsNorm => single(call(
                backend,
                &RmsNormParams {
                    x: input,
                    weight,
                    eps: EPS,
                },
                rms_norm_on,
                rms_norm,
            )),
            Epilogue::NormAdd => {
                let p = NormAddParams {
                    residual: residual(),
                    input,
                    weight,
                    eps: EPS,
                };
                single(call(backend, &p, norm_add_on, norm_add))
            }
            Epilogue::ResidualNorm => {
                let p = ResidualNormParams {
                    residual: residual(),
                    input,
                    weight,
                    eps: EPS,
                    write_sum: self.write_sum,
                };
                call(backend, &p, residual_norm_on, residual_norm).map(|o| (o.normed, o.sum))
            }
            Epilogue::ResidualNormScalar | Epilogue::NormAddScalar => {
                let scalar = self.scalar.as_ref().unwrap();
                let p = ScalarNormParams {
                    residual: residual(),
                    input,
                    weight,
                    scalar,
                    eps: EPS,
                };
                single(match self.op {
                    Epilogue::ResidualNormScalar => {
                        call(backend, &p, residual_norm_scalar_on, residual_norm_scalar)
                    }
                    _ => call(backend, &p, norm_add_scalar_on, norm_add_scalar),
                })
            }
            Epilogue::MoeWsumNormAdd => {
                let p = MoeWsumNormAddParams {
                    expert_outputs: input,
                    weights: self.moe_weights.as_ref().unwrap(),
                    residual: residual(),
                    norm_weight: weight,
                    eps: EPS,
                };
                single(call(backend, &p, moe_wsum_norm_add_on, moe_wsum_norm_add))
            }
            Epilogue::MoeWsumDnormAdd => {
                let p = MoeWsumDnormAddParams {
                    expert_outputs: input,
                    weights: self.moe_weights.as_ref().unwrap(),
                    residual: residual(),
                    res_norm_weight: self.residual_weight.as_ref().unwrap(),
                    moe_norm_weight: weight,
                    eps: EPS,
                };
                single(call(backend, &p, moe_wsum_dnorm_add_on, moe_wsum_dnorm_add))
            }
        }
    }

    /// Runs the kernel on `self` (on the GPU) into NaN-poisoned outputs.
    fn run_gpu(&self) -> (Tensor, Option<Tensor>) {
        let (rows, dim) = self.rows_dim();
        let dt = self.input.dtype();
        let out = poisoned(&[rows, dim], dt);
        let sum = self.write_sum.then(|| poisoned(&[rows, dim], dt));
        epilogue_into(&self.operands(), &out, sum.as_ref()).unwrap();
        (out, sum)
    }

    /// Checks the GPU against the CPU reference; returns the NMSE.
    fn check(&self, what: &str) -> f64 {
        let (want, want_sum) = self.front(Some(Backend::CpuReference)).unwrap();
        let (got, got_sum) = self.to_device(gpu()).run_gpu();
        let dt = self.input.dtype();
        let e = nmse(&host_f32(&got), &want.to_f32_vec().unwrap());
        assert!(e <= tol(dt), "{what}: NMSE {e:e} > {:e}", tol(dt));
        match (got_sum, want_sum) {
            (Some(g), Some(w)) => {
                let g = g.to_device(Device::Cpu).unwrap();
                assert_eq!(g.bytes().unwrap(), w.bytes().unwrap(), "{what}: sum output");
            }
            (None, None) => {}
            _ => panic!("{what}: sum output present on one side only"),
        }
        e
    }
}

/// The sweep of one epilogue; prints the largest NMSE per activation dtype.
fn sweep(op: Epilogue) {
    let ks: &[usize] = if is_moe(op) { &[1, 8] } else { &[0] };
    let sums: &[bool] = if op == Epilogue::ResidualNorm {
        &[false, true]
    } else {
        &[false]
    };
    let mut worst = [0f64; 3];
    let mut cases = 0;
    for (rows, dim) in shapes() {
        for &k in ks {
            for (ai, &act) in ACT.iter().enumerate() {
                let seed = (rows * 100_003 + dim * 17 + k * 5 + ai) as u64;
                let acts = Acts::new(op, act, rows, dim, k, seed);
                for (wi, &w) in NORM_W.iter().enumerate() {
                    // Rotate the extra operand's dtype so every pairing occurs.
                    let extra = NORM_W[(wi + ai + rows + dim) % 3];
                    let lens: &[usize] = if has_scalar(op) { &[1, dim] } else { &[1] };
                    for &len in lens {
                        for &write_sum in sums {
                            let case = Case::new(
                                op,
                                &acts,
                                w,
                                extra,
                                len,
                                write_sum,
                                seed + 10 * wi as u64,
                            );
                            let what = format!(
                                "{op:?} rows={rows} dim={dim} k={k} act={act} w={w} extra={extra} scalar_len={len} sum={write_sum}"
                            );
                            worst[ai] = worst[ai].max(case.check(&what));
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    println!(
        "{op:?}: {cases} cases; max NMSE f32 {:.2e}, f16 {:.2e}, bf16 {:.2e}",
        worst[0], worst[1], worst[2]
    );
}

#[test]
fn rms_norm_matches_cpu() {
    sweep(Epilogue::RmsNorm);
}

#[test]
fn norm_add_matches_cpu() {
    sweep(Epilogue::NormAdd);
}

#[test]
fn residual_norm_matches_cpu() {
    sweep(Epilogue::ResidualNorm);
}

#[test]
fn residual_norm_scalar_matches_cpu() {
    sweep(Epilogue::ResidualNormScalar);
}

#[test]
fn norm_add_scalar_matches_cpu() {
    sweep(Epilogue::NormAddScalar);
}

#[test]
fn moe_wsum_norm_add_matches_cpu() {
    sweep(Epilogue::MoeWsumNormAdd);
}

#[test]
fn moe_wsum_dnorm_add_matches_cpu() {
    sweep(Epilogue::MoeWsumDnormAdd);
}

const ALL: [Epilogue; 7] = [
    Epilogue::RmsNorm,
    Epilogue::NormAdd,
    Epilogue::ResidualNorm,
    Epilogue::ResidualNormScalar,
    Epilogue::NormAddScalar,
    Epilogue::MoeWsumNormAdd,
    Epilogue::MoeWsumDnormAdd,
];

fn bytes(t: &Tensor) -> Vec<u8> {
    t.to_device(Device::Cpu).unwrap().bytes().unwrap().to_vec()
}

/// The front ends (`*_on(Backend::Cuda)` and the plain form on GPU tensors)
/// run the same kernel: bit-identical to `epilogue_into`, and repeatable.
#[test]
fn front_ends_dispatch_to_cuda_deterministically() {
    for op in ALL {
        for (rows, dim) in [(7, 1003), (333, 2880)] {
            let acts = Acts::new(op, DType::Bf16, rows, dim, 8, 7);
            let case = Case::new(
                op,
                &acts,
                DType::F32,
                DType::Bf16,
                dim,
                op == Epilogue::ResidualNorm,
                7,
            );
            let g = case.to_device(gpu());
            let (out, sum) = g.run_gpu();
            for backend in [Some(Backend::Cuda), None] {
                let (o, s) = g.front(backend).unwrap();
                assert_eq!(o.device(), gpu(), "{op:?}: output stays on the GPU");
                assert_eq!(bytes(&o), bytes(&out), "{op:?} {backend:?}: output");
                assert_eq!(
                    s.map(|s| bytes(&s)),
                    sum.as_ref().map(bytes),
                    "{op:?} {backend:?}: sum"
                );
            }
        }
    }
}

/// A `[1]` scalar broadcasts exactly like a `[dim]` scalar of equal values.
#[test]
fn broadcast_scalar_equals_per_element() {
    for op in [Epilogue::ResidualNormScalar, Epilogue::NormAddScalar] {
        for act in ACT {
            let (rows, dim) = (7, 2880);
            let acts = Acts::new(op, act, rows, dim, 0, 11);
            let mut case = Case::new(op, &acts, DType::Bf16, DType::F32, 1, false, 11);
            let one = case.to_device(gpu()).run_gpu().0;
            let s = case.scalar.as_ref().unwrap().to_f32_vec().unwrap()[0];
            case.scalar = Some(Tensor::from_f32(&vec![s; dim], &[dim], DType::F32).unwrap());
            let many = case.to_device(gpu()).run_gpu().0;
            assert_eq!(bytes(&one), bytes(&many), "{op:?} {act}");
        }
    }
}

/// Zero rows launch nothing and return empty outputs.
#[test]
fn zero_rows() {
    for op in ALL {
        let acts = Acts::new(op, DType::F16, 0, 64, 8, 1);
        let case = Case::new(
            op,
            &acts,
            DType::F32,
            DType::F32,
            64,
            op == Epilogue::ResidualNorm,
            1,
        )
        .to_device(gpu());
        let (o, s) = case.front(Some(Backend::Cuda)).unwrap();
        assert_eq!(o.shape(), &[0, 64]);
        assert_eq!(
            s.map(|s| s.shape().to_vec()),
            (op == Epilogue::ResidualNorm).then(|| vec![0, 64])
        );
    }
}

/// Argument errors are reported, never launched: operands on the CPU or on
/// different devices, a sum output for an epilogue without one, bad shapes.
#[test]
fn bad_operands_are_rejected() {
    let acts = Acts::new(Epilogue::NormAddScalar, DType::Bf16, 4, 64, 0, 3);
    let cpu = Case::new(
        Epilogue::NormAddScalar,
        &acts,
        DType::F32,
        DType::F32,
        64,
        false,
        3,
    );
    let g = cpu.to_device(gpu());
    let out = poisoned(&[4, 64], DType::Bf16);
    assert!(
        cpu.front(Some(Backend::Cuda)).is_err(),
        "CPU tensors with the CUDA backend"
    );
    let mixed = Case {
        weight: cpu.weight.clone(),
        ..g.clone()
    };
    assert!(
        epilogue_into(&mixed.operands(), &out, None).is_err(),
        "weight on the CPU"
    );
    let sum = poisoned(&[4, 64], DType::Bf16);
    assert!(
        epilogue_into(&g.operands(), &out, Some(&sum)).is_err(),
        "sum for NormAddScalar"
    );
    let short = Case {
        scalar: Some(random(&[3], DType::F32, 1).to_device(gpu()).unwrap()),
        ..g.clone()
    };
    assert!(
        epilogue_into(&short.operands(), &out, None).is_err(),
        "scalar of 3 values"
    );
    let missing = Case {
        residual: None,
        ..g.clone()
    };
    assert!(
        epilogue_into(&missing.operands(), &out, None).is_err(),
        "no residual"
    );
    let wrong_out = poisoned(&[4, 64], DType::F32);
    assert!(
        epilogue_into(&g.operands(), &wrong_out, None).is_err(),
        "f32 out for bf16 input"
    );
    // The good call still works afterwards (nothing was launched or reported).
    epilogue_into(&g.operands(), &out, None).unwrap();
    let e = nmse(
        &host_f32(&out),
        &cpu.front(Some(Backend::CpuReference))
            .unwrap()
            .0
            .to_f32_vec()
            .unwrap(),
    );
    assert!(e <= tol(DType::Bf16), "NMSE {e:e}");
}
