//! Norm epilogues, fast: rayon over blocks of rows, one f32 scratch row per
//! block, sums of squares in 8 independent f32 lanes (vectorisable).

use crate::dtype::Float;
use crate::error::Result;
use crate::ops::norm::{Epilogue, EpilogueArgs};
use rayon::prelude::*;

/// Elements per rayon task (whole rows, at least one).
const ELEMS_PER_TASK: usize = 1 << 14;

/// Computes `a.op` for every row into `out` (and `sum_out` for
/// [`Epilogue::ResidualNorm`] with `write_sum`).
pub fn epilogue<T: Float>(
    a: &EpilogueArgs<'_, T>,
    out: &mut [T],
    sum_out: Option<&mut [T]>,
) -> Result<()> {
    a.check(out.len(), sum_out.as_ref().map(|s| s.len()))?;
    let rows_per_task = (ELEMS_PER_TASK / a.dim).max(1);
    let chunk = rows_per_task * a.dim;
    match sum_out {
        Some(sum) => out
            .par_chunks_mut(chunk)
            .zip(sum.par_chunks_mut(chunk))
            .enumerate()
            .for_each(|(c, (o, s))| block(a, c * rows_per_task, o, Some(s))),
        None => out
            .par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(c, o)| block(a, c * rows_per_task, o, None)),
    }
    Ok(())
}

/// Rows `first..` of the output block `out` (and of `sum`).
fn block<T: Float>(
    a: &EpilogueArgs<'_, T>,
    first: usize,
    out: &mut [T],
    mut sum: Option<&mut [T]>,
) {
    let (dim, k) = (a.dim, a.top_k);
    let mut v = vec![0f32; dim];
    let sc = |i: usize| match a.scalar {
        [s] => *s,
        s => s.get(i).copied().unwrap_or(0.0),
    };
    for (i, o) in out.chunks_exact_mut(dim).enumerate() {
        let r = first + i;
        let res = a.residual.get(r * dim..(r + 1) * dim).unwrap_or(&[]);
        match a.op {
            Epilogue::RmsNorm | Epilogue::NormAdd | Epilogue::NormAddScalar => {
                let x = a.input.get(r * dim..(r + 1) * dim).unwrap_or(&[]);
                v.iter_mut().zip(x).for_each(|(d, x)| *d = x.to_f32());
            }
            Epilogue::ResidualNorm | Epilogue::ResidualNormScalar => {
                let x = a.input.get(r * dim..(r + 1) * dim).unwrap_or(&[]);
                v.iter_mut()
                    .zip(x)
                    .zip(res)
                    .for_each(|((d, x), r)| *d = r.to_f32() + x.to_f32());
            }
            Epilogue::MoeWsumNormAdd | Epilogue::MoeWsumDnormAdd => {
                v.fill(0.0);
                let ys = a.input.get(r * k * dim..(r + 1) * k * dim).unwrap_or(&[]);
                let ws = a.moe_weights.get(r * k..(r + 1) * k).unwrap_or(&[]);
                for (y, &w) in ys.chunks_exact(dim).zip(ws) {
                    v.iter_mut().zip(y).for_each(|(d, y)| *d += y.to_f32() * w);
                }
            }
        }
        let inv = rsqrt_mean_sq(&v, a.eps);
        let n = v.iter().zip(a.weight).map(|(&v, &w)| v * inv * w);
        match a.op {
            Epilogue::RmsNorm | Epilogue::ResidualNorm => {
                o.iter_mut().zip(n).for_each(|(o, n)| *o = T::from_f32(n))
            }
            Epilogue::NormAdd | Epilogue::MoeWsumNormAdd => {
                o.iter_mut()
                    .zip(n)
                    .zip(res)
                    .for_each(|((o, n), r)| *o = T::from_f32(r.to_f32() + n));
            }
            Epilogue::ResidualNormScalar => {
                o.iter_mut()
                    .zip(n)
                    .enumerate()
                    .for_each(|(i, (o, n))| *o = T::from_f32(n * sc(i)));
            }
            Epilogue::NormAddScalar => o
                .iter_mut()
                .zip(n)
                .zip(res)
                .enumerate()
                .for_each(|(i, ((o, n), r))| *o = T::from_f32((r.to_f32() + n) * sc(i))),
            Epilogue::MoeWsumDnormAdd => {
                let inv_r = rsqrt_mean_sq(res, a.eps);
                o.iter_mut()
                    .zip(n)
                    .zip(res.iter().zip(a.residual_weight))
                    .for_each(|((o, n), (r, &rw))| *o = T::from_f32(r.to_f32() * inv_r * rw + n));
            }
        }
        if let Some(s) = sum
            .as_deref_mut()
            .and_then(|s| s.get_mut(i * dim..(i + 1) * dim))
        {
            s.iter_mut().zip(&v).for_each(|(d, &x)| *d = T::from_f32(x));
        }
    }
}

/// `1 / sqrt(mean(x²) + eps)` in f32, over 8 lanes.
fn rsqrt_mean_sq<T: Float>(x: &[T], eps: f32) -> f32 {
    let mut lanes = [0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        lanes.iter_mut().zip(c).for_each(|(l, v)| {
            let v = v.to_f32();
            *l += v * v;
        });
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(0f32, |s, v| s + v.to_f32() * v.to_f32());
    let ss = lanes.iter().fold(tail, |s, &l| s + l);
    1.0 / (ss / x.len() as f32 + eps).sqrt()
}
