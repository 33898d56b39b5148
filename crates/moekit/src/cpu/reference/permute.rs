//! Reference permute / unpermute: one element at a time.

use crate::ops::permute::{PermuteArgs, UnpermuteArgs};

/// Copies token rows into sorted order.
pub fn permute(a: &PermuteArgs<'_>, out: &mut [u8]) {
    let rb = a.row_bytes;
    for (p, &s) in a.sorted.iter().enumerate() {
        let t = s as usize / a.top_k;
        for i in 0..rb {
            out[p * rb + i] = a.x[t * rb + i];
        }
    }
}

/// Weighted sum of each token's k expert rows.
pub fn unpermute(a: &UnpermuteArgs<'_>, out: &mut [f32]) {
    let (h, k) = (a.hidden, a.top_k);
    for t in 0..out.len() / h.max(1) {
        for c in 0..h {
            let mut acc = 0f32;
            for j in 0..k {
                let p = a.inverse[t * k + j] as usize;
                acc += a.weights[t * k + j] * a.y[p * h + c];
            }
            out[t * h + c] = acc;
        }
    }
}
