//! `ops::norm` against numpy float64 (fixtures from `scripts/fixtures/norm.py`,
//! formulas from mlx-native's fused-norm Metal kernels), fast vs reference,
//! and argument rejection.
//!
//! Thresholds (NMSE = Σ(a-b)² / Σb²): against the f64 oracle ≤ 1e-10 for f32
//! activations, ≤ 1e-4 for f16/bf16 (output rounding); fast vs reference
//! ≤ 1e-12 for f32 and ≤ 1e-5 for f16/bf16 (an output may round the other way).

use moekit::npy::{NpyArray, NpyDType};
use moekit::ops::norm::*;
use moekit::{Backend, DType, Tensor};
use rand::{Rng, SeedableRng};
use serde_json::Value;
use std::path::PathBuf;

const BACKENDS: [Backend; 2] = [Backend::CpuReference, Backend::CpuFast];

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/norm")
}

fn nmse(got: &[f64], want: &[f64]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(a, b)| (a - b).powi(2)).sum();
    let den: f64 = want.iter().map(|b| b.powi(2)).sum();
    num / den
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_f32_vec()
        .expect("float tensor")
        .into_iter()
        .map(f64::from)
        .collect()
}

fn read_f64(path: PathBuf) -> Vec<f64> {
    let a = NpyArray::read(&path).expect("npy");
    assert_eq!(a.dtype, NpyDType::F64, "{path:?}");
    a.data
        .chunks_exact(8)
        .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect()
}

struct Case {
    name: String,
    dtype: DType,
    eps: f32,
    t: std::collections::HashMap<&'static str, Tensor>,
}

impl Case {
    fn get(&self, key: &str) -> &Tensor {
        &self.t[key]
    }
    fn want(&self, out: &str) -> Vec<f64> {
        read_f64(dir().join(format!("{}_out_{out}.npy", self.name)))
    }
}

fn cases() -> Vec<Case> {
    let meta: Value = serde_json::from_str(
        &std::fs::read_to_string(dir().join("cases.json")).expect("cases.json"),
    )
    .expect("json");
    let keys = [
        "residual",
        "input",
        "expert_outputs",
        "weight",
        "weight2",
        "scalar1",
        "scalarv",
        "moe_weights",
    ];
    meta.as_array()
        .expect("list")
        .iter()
        .map(|c| {
            let name = c["name"].as_str().expect("name").to_string();
            let t = keys
                .iter()
                .map(|&k| {
                    (
                        k,
                        NpyArray::read(dir().join(format!("{name}_{k}.npy")))
                            .expect("npy")
                            .to_tensor()
                            .expect("tensor"),
                    )
                })
                .collect();
            Case {
                dtype: DType::parse(c["dtype"].as_str().expect("dtype")).expect("dtype"),
                eps: c["eps"].as_f64().expect("eps") as f32,
                name,
                t,
            }
        })
        .collect()
}

/// Every epilogue of a case with one backend: (output name, tensor).
fn run_all(c: &Case, b: Backend) -> Vec<(&'static str, Tensor)> {
    let (res, inp, w, eps) = (c.get("residual"), c.get("input"), c.get("weight"), c.eps);
    let rn = residual_norm_on(
        b,
        &ResidualNormParams {
            residual: res,
            input: inp,
            weight: w,
            eps,
            write_sum: true,
        },
    )
    .expect("residual_norm");
    let no_sum = residual_norm_on(
        b,
        &ResidualNormParams {
            residual: res,
            input: inp,
            weight: w,
            eps,
            write_sum: false,
        },
    )
    .expect("rn");
    assert!(no_sum.sum.is_none());
    let sp = |s: &'static str| ScalarNormParams {
        residual: res,
        input: inp,
        weight: w,
        scalar: c.get(s),
        eps,
    };
    let moe = MoeWsumNormAddParams {
        expert_outputs: c.get("expert_outputs"),
        weights: c.get("moe_weights"),
        residual: res,
        norm_weight: w,
        eps,
    };
    let dnorm = MoeWsumDnormAddParams {
        expert_outputs: c.get("expert_outputs"),
        weights: c.get("moe_weights"),
        residual: res,
        res_norm_weight: c.get("weight2"),
        moe_norm_weight: w,
        eps,
    };
    vec![
        (
            "rms_norm",
            rms_norm_on(
                b,
                &RmsNormParams {
                    x: inp,
                    weight: w,
                    eps,
                },
            )
            .expect("rms_norm"),
        ),
        (
            "norm_add",
            norm_add_on(
                b,
                &NormAddParams {
                    residual: res,
                    input: inp,
                    weight: w,
                    eps,
                },
            )
            .expect("norm_add"),
        ),
        ("residual_norm", rn.normed),
        ("residual_norm_sum", rn.sum.expect("sum")),
        (
            "residual_norm_scalar1",
            residual_norm_scalar_on(b, &sp("scalar1")).expect("rns"),
        ),
        (
            "residual_norm_scalarv",
            residual_norm_scalar_on(b, &sp("scalarv")).expect("rns"),
        ),
        (
            "norm_add_scalar1",
            norm_add_scalar_on(b, &sp("scalar1")).expect("nas"),
        ),
        (
            "norm_add_scalarv",
            norm_add_scalar_on(b, &sp("scalarv")).expect("nas"),
        ),
        (
            "moe_wsum_norm_add",
            moe_wsum_norm_add_on(b, &moe).expect("moe"),
        ),
        (
            "moe_wsum_dnorm_add",
            moe_wsum_dnorm_add_on(b, &dnorm).expect("dnorm"),
        ),
    ]
}

#[test]
fn matches_numpy_f64() {
    let cases = cases();
    assert_eq!(cases.len(), 4);
    for c in &cases {
        let tol = if c.dtype == DType::F32 { 1e-10 } else { 1e-4 };
        for b in BACKENDS {
            for (name, got) in run_all(c, b) {
                assert_eq!(got.dtype(), c.dtype, "{name}: output dtype");
                assert_eq!(got.shape(), c.get("input").shape(), "{name}: output shape");
                let e = nmse(&values(&got), &c.want(name));
                println!("{:10} {b:?} {name:22} NMSE {e:.2e}", c.name);
                assert!(e <= tol, "{} {b:?} {name}: NMSE {e:e} > {tol:e}", c.name);
            }
        }
    }
}

#[test]
fn fast_matches_reference_on_fixtures() {
    for c in &cases() {
        let tol = if c.dtype == DType::F32 { 1e-12 } else { 1e-5 };
        for ((name, a), (_, b)) in run_all(c, Backend::CpuReference)
            .into_iter()
            .zip(run_all(c, Backend::CpuFast))
        {
            let e = nmse(&values(&b), &values(&a));
            assert!(
                e <= tol,
                "{} {name}: fast vs reference NMSE {e:e} > {tol:e}",
                c.name
            );
        }
    }
}

fn random(rng: &mut impl Rng, shape: &[usize], dtype: DType) -> Tensor {
    let n = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect();
    Tensor::from_f32(&v, shape, dtype).expect("tensor")
}

#[test]
fn fast_matches_reference_on_random_inputs() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for (rows, dim, k) in [(37, 1000, 8), (130, 64, 2), (1, 1, 1), (0, 16, 4)] {
        for dtype in [DType::F32, DType::F16, DType::Bf16] {
            let res = random(&mut rng, &[rows, dim], dtype);
            let inp = random(&mut rng, &[rows, dim], dtype);
            let w = random(&mut rng, &[dim], DType::F32);
            let w2 = random(&mut rng, &[dim], DType::Bf16);
            let sc = random(&mut rng, &[dim], DType::F16);
            let y = random(&mut rng, &[rows, k, dim], dtype);
            let wt = random(&mut rng, &[rows, k], DType::F32);
            let eps = 1e-6;
            let run = |b: Backend| -> Vec<Tensor> {
                let rn = residual_norm_on(
                    b,
                    &ResidualNormParams {
                        residual: &res,
                        input: &inp,
                        weight: &w,
                        eps,
                        write_sum: true,
                    },
                )
                .expect("rn");
                let sp = ScalarNormParams {
                    residual: &res,
                    input: &inp,
                    weight: &w,
                    scalar: &sc,
                    eps,
                };
                vec![
                    rms_norm_on(
                        b,
                        &RmsNormParams {
                            x: &inp,
                            weight: &w,
                            eps,
                        },
                    )
                    .expect("rms"),
                    norm_add_on(
                        b,
                        &NormAddParams {
                            residual: &res,
                            input: &inp,
                            weight: &w,
                            eps,
                        },
                    )
                    .expect("na"),
                    rn.normed,
                    rn.sum.expect("sum"),
                    residual_norm_scalar_on(b, &sp).expect("rns"),
                    norm_add_scalar_on(b, &sp).expect("nas"),
                    moe_wsum_norm_add_on(
                        b,
                        &MoeWsumNormAddParams {
                            expert_outputs: &y,
                            weights: &wt,
                            residual: &res,
                            norm_weight: &w,
                            eps,
                        },
                    )
                    .expect("m"),
                    moe_wsum_dnorm_add_on(
                        b,
                        &MoeWsumDnormAddParams {
                            expert_outputs: &y,
                            weights: &wt,
                            residual: &res,
                            res_norm_weight: &w2,
                            moe_norm_weight: &w,
                            eps,
                        },
                    )
                    .expect("d"),
                ]
            };
            let tol = if dtype == DType::F32 { 1e-12 } else { 1e-5 };
            for (i, (a, b)) in run(Backend::CpuReference)
                .iter()
                .zip(run(Backend::CpuFast))
                .enumerate()
            {
                assert_eq!(a.shape(), &[rows, dim]);
                if rows > 0 {
                    let e = nmse(&values(&b), &values(a));
                    assert!(
                        e <= tol,
                        "op {i} [{rows}, {dim}] k={k} {dtype}: NMSE {e:e} > {tol:e}"
                    );
                }
            }
            // The sum output is residual + input rounded once: identical in both backends.
            assert_eq!(
                run(Backend::CpuReference)[3].bytes().expect("b"),
                run(Backend::CpuFast)[3].bytes().expect("b")
            );
        }
    }
}

#[test]
fn plain_forms_use_the_device_backend() {
    let x = Tensor::from_f32(&[3.0, 4.0], &[1, 2], DType::F32).expect("t");
    let w = Tensor::from_f32(&[1.0, 2.0], &[2], DType::F32).expect("t");
    // rms = sqrt((9 + 16) / 2) = 5 / √2 → n(x) = [3, 4]·√2/5.
    let out = rms_norm(&RmsNormParams {
        x: &x,
        weight: &w,
        eps: 0.0,
    })
    .expect("rms")
    .to_f32_vec()
    .expect("v");
    let s = std::f32::consts::SQRT_2 / 5.0;
    assert!(
        (out[0] - 3.0 * s).abs() < 1e-6 && (out[1] - 8.0 * s).abs() < 1e-6,
        "{out:?}"
    );
}

fn expect_err(r: moekit::Result<Tensor>, op: &str, arg: &str) {
    let err = r.expect_err("must be rejected").to_string();
    assert!(
        err.starts_with(&format!("{op}: argument `{arg}`"))
            && err.contains("expected")
            && err.contains("got"),
        "{arg}: {err}"
    );
}

#[test]
fn rejects_invalid_arguments() {
    let f = |shape: &[usize], dtype: DType| Tensor::zeros(dtype, shape);
    let (x, r, w) = (
        f(&[4, 8], DType::F32),
        f(&[4, 8], DType::F32),
        f(&[8], DType::Bf16),
    );
    let (y, wt) = (f(&[4, 2, 8], DType::F32), f(&[4, 2], DType::F32));
    let rms = |x: &Tensor, w: &Tensor, eps: f32| rms_norm(&RmsNormParams { x, weight: w, eps });
    assert!(rms(&x, &w, 1e-6).is_ok());
    for b in BACKENDS {
        // eps not finite or negative.
        for eps in [f32::NAN, f32::INFINITY, -1e-6] {
            expect_err(
                rms_norm_on(
                    b,
                    &RmsNormParams {
                        x: &x,
                        weight: &w,
                        eps,
                    },
                ),
                "rms_norm",
                "eps",
            );
        }
    }
    // Wrong dtype / rank / shape of the activations and weights.
    expect_err(rms(&f(&[4, 8], DType::U32), &w, 1e-6), "rms_norm", "x");
    expect_err(rms(&f(&[32], DType::F32), &w, 1e-6), "rms_norm", "x");
    expect_err(
        rms(&f(&[4, 0], DType::F32), &f(&[0], DType::F32), 1e-6),
        "rms_norm",
        "x",
    );
    expect_err(rms(&x, &f(&[7], DType::F32), 1e-6), "rms_norm", "weight");
    expect_err(rms(&x, &f(&[8], DType::U8), 1e-6), "rms_norm", "weight");
    expect_err(rms(&x, &f(&[1, 8], DType::F32), 1e-6), "rms_norm", "weight");
    let na = |residual: &Tensor, input: &Tensor| {
        norm_add(&NormAddParams {
            residual,
            input,
            weight: &w,
            eps: 1e-6,
        })
    };
    expect_err(na(&f(&[4, 8], DType::Bf16), &x), "norm_add", "residual");
    expect_err(na(&f(&[3, 8], DType::F32), &x), "norm_add", "residual");
    let rn = residual_norm(&ResidualNormParams {
        residual: &r,
        input: &f(&[4, 9], DType::F32),
        weight: &w,
        eps: 1e-6,
        write_sum: true,
    });
    assert!(rn
        .expect_err("shape")
        .to_string()
        .starts_with("residual_norm: argument `residual`"));
    // Scalar of the wrong length / dtype.
    for (s, ok) in [
        (f(&[1], DType::F16), true),
        (f(&[8], DType::F32), true),
        (f(&[2], DType::F32), false),
        (f(&[9], DType::F32), false),
        (f(&[1, 8], DType::F32), false),
        (f(&[1], DType::I32), false),
    ] {
        let p = ScalarNormParams {
            residual: &r,
            input: &x,
            weight: &w,
            scalar: &s,
            eps: 1e-6,
        };
        if ok {
            assert!(residual_norm_scalar(&p).is_ok() && norm_add_scalar(&p).is_ok());
        } else {
            expect_err(residual_norm_scalar(&p), "residual_norm_scalar", "scalar");
            expect_err(norm_add_scalar(&p), "norm_add_scalar", "scalar");
        }
    }
    // MoE operands.
    let moe = |y: &Tensor, wt: &Tensor, res: &Tensor| {
        moe_wsum_norm_add(&MoeWsumNormAddParams {
            expert_outputs: y,
            weights: wt,
            residual: res,
            norm_weight: &w,
            eps: 1e-6,
        })
    };
    assert!(moe(&y, &wt, &r).is_ok());
    expect_err(moe(&x, &wt, &r), "moe_wsum_norm_add", "expert_outputs");
    expect_err(
        moe(&y, &f(&[4, 3], DType::F32), &r),
        "moe_wsum_norm_add",
        "weights",
    );
    expect_err(
        moe(&y, &f(&[4, 2], DType::Bf16), &r),
        "moe_wsum_norm_add",
        "weights",
    );
    expect_err(
        moe(&y, &wt, &f(&[4, 8], DType::F16)),
        "moe_wsum_norm_add",
        "residual",
    );
    expect_err(
        moe(&y, &wt, &f(&[5, 8], DType::F32)),
        "moe_wsum_norm_add",
        "residual",
    );
    let dn = |rw: &Tensor, mw: &Tensor| {
        moe_wsum_dnorm_add(&MoeWsumDnormAddParams {
            expert_outputs: &y,
            weights: &wt,
            residual: &r,
            res_norm_weight: rw,
            moe_norm_weight: mw,
            eps: 1e-6,
        })
    };
    assert!(dn(&w, &w).is_ok());
    expect_err(
        dn(&f(&[4], DType::F32), &w),
        "moe_wsum_dnorm_add",
        "res_norm_weight",
    );
    expect_err(
        dn(&w, &f(&[16], DType::F32)),
        "moe_wsum_dnorm_add",
        "moe_norm_weight",
    );
}
