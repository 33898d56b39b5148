//! Parallel permute / unpermute: rayon over output rows, whole-row copies.

use crate::ops::permute::{PermuteArgs, UnpermuteArgs};
use rayon::prelude::*;

/// Copies token rows into sorted order.
pub fn permute(a: &PermuteArgs<'_>, out: &mut [u8]) {
    let rb = a.row_bytes;
    if rb == 0 {
        return;
    }
    out.par_chunks_mut(rb)
        .zip(a.sorted.par_iter())
        .for_each(|(dst, &s)| {
            let t = s as usize / a.top_k;
            dst.copy_from_slice(&a.x[t * rb..(t + 1) * rb]);
        });
}

/// Weighted sum of each token's k expert rows (same summation order as the reference).
pub fn unpermute(a: &UnpermuteArgs<'_>, out: &mut [f32]) {
    let (h, k) = (a.hidden, a.top_k);
    if h == 0 {
        return;
    }
    out.par_chunks_mut(h).enumerate().for_each(|(t, dst)| {
        dst.fill(0.0);
        for j in 0..k {
            let p = a.inverse[t * k + j] as usize;
            let w = a.weights[t * k + j];
            for (d, &v) in dst.iter_mut().zip(&a.y[p * h..(p + 1) * h]) {
                *d += w * v;
            }
        }
    });
}
