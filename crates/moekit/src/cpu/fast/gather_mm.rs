//! Fast grouped matmul on the CPU.
//!
//! Work is split into (expert segment, block of output rows) items run by
//! rayon. Each item dequantizes its block of weight rows once into an L2-sized
//! f32 buffer, then dots every activation row of the segment against it, so a
//! weight byte is read once per call however many tokens use the expert.
//! [`project`] is generic over the number of weight sources `P` so the fused
//! gate+up+SwiGLU reuses the same engine with `P = 2`.

use super::dot::{dot_rows, XSums};
use crate::error::Result;
use crate::format::RowDecoder;
use crate::ops::gather_mm::{GatherMmArgs, Segment};
use rayon::prelude::*;

/// Dot product with a fixed summation order (16 lanes, then lanes summed in
/// order, then the tail), written so LLVM vectorizes it.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 16;
    let mut acc = [0f32; L];
    let (ca, cb) = (a.chunks_exact(L), b.chunks_exact(L));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..L {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = 0f32;
    for v in acc {
        s += v;
    }
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// How [`project`] computes its work items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Dequantize each weight row once into an L2-sized buffer, then dot it
    /// with every activation row of the segment (prefill: many rows/expert).
    DecodeOnce,
    /// Dot each activation row straight from the packed weights, widening
    /// codes in registers (decode: few rows/expert).
    FusedDot,
    /// `FusedDot` for segments of at most [`FUSED_MAX_ROWS`] rows, else `DecodeOnce`.
    Auto,
}

/// Largest segment [`Strategy::Auto`] runs with [`Strategy::FusedDot`].
pub const FUSED_MAX_ROWS: usize = 4;

impl Strategy {
    fn fused_for(self, rows: usize) -> bool {
        match self {
            Strategy::DecodeOnce => false,
            Strategy::FusedDot => true,
            Strategy::Auto => rows <= FUSED_MAX_ROWS,
        }
    }
}

/// One weight source of a projection: expert rows `row_offset..row_offset+N`.
#[derive(Clone, Copy)]
pub struct Source<'a> {
    /// Decoder of the weights.
    pub dec: RowDecoder<'a>,
    /// First row of the source inside each expert's matrix.
    pub row_offset: usize,
}

/// Computes `out[r, n] = combine([dot(x[r], W_p[e(r), off_p + n]) for p])`
/// for every row `r` of every segment and `n < n_out`. Rows of `x` that no
/// segment names are left zero.
pub fn project<const P: usize, F>(
    strategy: Strategy,
    x: &[f32],
    m: usize,
    segments: &[Segment],
    sources: [Source<'_>; P],
    n_out: usize,
    combine: F,
) -> Result<Vec<f32>>
where
    F: Fn([f32; P]) -> f32 + Sync,
{
    let k = sources.first().map_or(0, |s| s.dec.cols());
    let any_fused = segments.iter().any(|s| strategy.fused_for(s.rows.len()));
    let sums: Vec<XSums> = match (any_fused, k) {
        (true, 1..) => x.chunks_exact(k).map(XSums::new).collect(),
        _ => Vec::new(),
    };
    let threads = rayon::current_num_threads().max(1);
    // Enough items to balance the threads; a block's decoded rows stay ≤ 256 KiB.
    // Fused items decode nothing, so only balance bounds them: larger items,
    // less scheduling per weight byte at decode. A fused item dots its
    // block of weight rows once per activation row, so with several rows
    // per segment the block stays small enough to be re-read from cache.
    let all_fused = segments.iter().all(|s| strategy.fused_for(s.rows.len()));
    let one_row = segments.iter().all(|s| s.rows.len() <= 1);
    let (max_rows, by_cache) = match (all_fused, one_row) {
        (true, true) => (256, usize::MAX),
        (true, false) => (64, usize::MAX),
        (false, _) => (64, (65536 / (k * P).max(1)).max(4)),
    };
    let by_balance = (n_out * segments.len())
        .div_ceil(threads * 8)
        .clamp(4, max_rows);
    let nb = by_balance.min(by_cache).min(n_out.max(1));
    let items: Vec<(usize, usize)> = (0..segments.len())
        .flat_map(|s| (0..n_out).step_by(nb).map(move |n0| (s, n0)))
        .collect();
    let blocks = items
        .par_iter()
        .map_init(Vec::<f32>::new, |buf, &(s, n0)| -> Result<Vec<f32>> {
            let seg = &segments[s];
            let nbh = nb.min(n_out - n0);
            if strategy.fused_for(seg.rows.len()) {
                // buf: the decode fallback's row, then the P·nbh dots.
                buf.resize(k + P * nbh, 0.0);
                let (scratch, vals) = buf.split_at_mut(k);
                let mut local = vec![0f32; seg.rows.len() * nbh];
                for (&r, lr) in seg.rows.iter().zip(local.chunks_exact_mut(nbh)) {
                    let r = r as usize;
                    let xr = &x[r * k..(r + 1) * k];
                    for (src, vp) in sources.iter().zip(vals.chunks_exact_mut(nbh)) {
                        let n = src.row_offset + n0;
                        dot_rows(&src.dec, seg.expert, n, xr, &sums[r], scratch, vp)?;
                    }
                    for (i, o) in lr.iter_mut().enumerate() {
                        let mut v = [0f32; P];
                        for (p, vp) in v.iter_mut().enumerate() {
                            *vp = vals[p * nbh + i];
                        }
                        *o = combine(v);
                    }
                }
                return Ok(local);
            }
            buf.resize(P * nbh * k, 0.0);
            for i in 0..nbh {
                for (p, src) in sources.iter().enumerate() {
                    let at = (i * P + p) * k;
                    src.dec
                        .decode(seg.expert, src.row_offset + n0 + i, &mut buf[at..at + k])?;
                }
            }
            let mut local = vec![0f32; seg.rows.len() * nbh];
            for (ri, &r) in seg.rows.iter().enumerate() {
                let xr = &x[r as usize * k..(r as usize + 1) * k];
                for i in 0..nbh {
                    let mut v = [0f32; P];
                    for (p, vp) in v.iter_mut().enumerate() {
                        let at = (i * P + p) * k;
                        *vp = dot(&buf[at..at + k], xr);
                    }
                    local[ri * nbh + i] = combine(v);
                }
            }
            Ok(local)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut out = vec![0f32; m * n_out];
    for (&(s, n0), local) in items.iter().zip(&blocks) {
        let nbh = nb.min(n_out - n0);
        for (ri, &r) in segments[s].rows.iter().enumerate() {
            let o = r as usize * n_out + n0;
            out[o..o + nbh].copy_from_slice(&local[ri * nbh..(ri + 1) * nbh]);
        }
    }
    Ok(out)
}

/// `[M, N]` result of a validated grouped matmul ([`Strategy::Auto`]).
pub fn gather_mm(a: &GatherMmArgs<'_>) -> Result<Vec<f32>> {
    gather_mm_with(a, Strategy::Auto)
}

/// [`gather_mm`] with an explicit strategy (tests force each path).
pub fn gather_mm_with(a: &GatherMmArgs<'_>, strategy: Strategy) -> Result<Vec<f32>> {
    let src = Source {
        dec: a.w.decoder()?,
        row_offset: 0,
    };
    project(strategy, a.x, a.m, a.segments, [src], a.w.rows(), |[v]| v)
}
