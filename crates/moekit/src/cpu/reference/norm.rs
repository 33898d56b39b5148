//! Norm epilogues, obviously right: one row at a time in f64, each formula
//! written out as in [`crate::ops::norm`].

use crate::dtype::Float;
use crate::error::Result;
use crate::ops::norm::{Epilogue, EpilogueArgs};

/// Computes `a.op` for every row into `out` (and `sum_out` for
/// [`Epilogue::ResidualNorm`] with `write_sum`).
pub fn epilogue<T: Float>(
    a: &EpilogueArgs<'_, T>,
    out: &mut [T],
    mut sum_out: Option<&mut [T]>,
) -> Result<()> {
    a.check(out.len(), sum_out.as_ref().map(|s| s.len()))?;
    let (dim, k) = (a.dim, a.top_k);
    let f = |x: &T| x.to_f32() as f64;
    let w: Vec<f64> = a.weight.iter().map(|&x| x as f64).collect();
    let rw: Vec<f64> = a.residual_weight.iter().map(|&x| x as f64).collect();
    let scalar = |i: usize| -> f64 {
        match a.scalar {
            [s] => *s as f64,
            s => s.get(i).map_or(0.0, |&x| x as f64),
        }
    };
    for r in 0..a.rows {
        let row = r * dim..(r + 1) * dim;
        let res: Vec<f64> = a
            .residual
            .get(row.clone())
            .unwrap_or(&[])
            .iter()
            .map(f)
            .collect();
        let v: Vec<f64> = match a.op {
            Epilogue::RmsNorm | Epilogue::NormAdd | Epilogue::NormAddScalar => {
                a.input[row.clone()].iter().map(f).collect()
            }
            Epilogue::ResidualNorm | Epilogue::ResidualNormScalar => a.input[row.clone()]
                .iter()
                .zip(&res)
                .map(|(x, &r)| r + f(x))
                .collect(),
            Epilogue::MoeWsumNormAdd | Epilogue::MoeWsumDnormAdd => (0..dim)
                .map(|i| {
                    (0..k)
                        .map(|j| {
                            a.moe_weights[r * k + j] as f64 * f(&a.input[(r * k + j) * dim + i])
                        })
                        .sum()
                })
                .collect(),
        };
        let inv = rsqrt_mean_sq(&v, a.eps);
        let inv_res = if a.op == Epilogue::MoeWsumDnormAdd {
            rsqrt_mean_sq(&res, a.eps)
        } else {
            0.0
        };
        let o: Vec<f64> = (0..dim)
            .map(|i| {
                let n = v[i] * inv * w[i];
                match a.op {
                    Epilogue::RmsNorm | Epilogue::ResidualNorm => n,
                    Epilogue::NormAdd | Epilogue::MoeWsumNormAdd => res[i] + n,
                    Epilogue::ResidualNormScalar => n * scalar(i),
                    Epilogue::NormAddScalar => (res[i] + n) * scalar(i),
                    Epilogue::MoeWsumDnormAdd => res[i] * inv_res * rw[i] + n,
                }
            })
            .collect();
        for (d, &x) in out[row.clone()].iter_mut().zip(&o) {
            *d = T::from_f32(x as f32);
        }
        if let Some(s) = sum_out.as_deref_mut() {
            for (d, &x) in s[row].iter_mut().zip(&v) {
                *d = T::from_f32(x as f32);
            }
        }
    }
    Ok(())
}

/// `1 / sqrt(mean(v²) + eps)`.
fn rsqrt_mean_sq(v: &[f64], eps: f32) -> f64 {
    let ms = v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64;
    1.0 / (ms + eps as f64).sqrt()
}
