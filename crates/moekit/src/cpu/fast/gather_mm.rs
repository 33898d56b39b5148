//! Fast grouped matmul on the CPU.
//!
//! Work is split into (expert segment, block of output rows) items run by
//! rayon. Each item dequantizes its block of weight rows once into an L2-sized
//! f32 buffer, then dots every activation row of the segment against it, so a
//! weight byte is read once per call however many tokens use the expert.
//! [`project`] is generic over the number of weight sources `P` so the fused
//! gate+up+SwiGLU reuses the same engine with `P = 2`.
//!
//! Weights with integer dot kernels ([`qdot`](super::qdot)) take the
//! quantized-activation path instead ([`act_choice`] decides, once per
//! call): every activation row is quantized once, and each item dots its
//! block of weight rows with the segment's rows 4 at a time, reading a
//! weight row once per 4 rows. All segments, whatever their size, take
//! it, so a token's result does not depend on the rest of the batch.

use super::dot::{dot_rows, XSums};
use super::qdot::{kind_of_rows, qdot_rows, QKind, QRow};
use crate::cpu::{act_mode, simd_level, ActMode};
use crate::error::{invalid, Result};
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

/// Which activations a projection's dots use, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActChoice {
    /// Quantized activations and integer kernels (else f32).
    pub q8: bool,
    /// Why.
    pub reason: &'static str,
}

/// The one place that decides between the f32 and the quantized-activation
/// path of a projection: q8 where the mode allows it ([`ActMode::Q8`], and
/// [`ActMode::Auto`] where every source's kind is
/// [`by_default`](QKind::by_default)), the strategy fuses dots, and every
/// source's format has integer kernels (`kinds`, from [`kind_of_rows`]).
pub fn act_choice(strategy: Strategy, mode: ActMode, kinds: &[Option<QKind>]) -> ActChoice {
    let (q8, reason) = if mode == ActMode::F32 {
        (false, "f32 activations requested")
    } else if strategy == Strategy::DecodeOnce {
        (false, "DecodeOnce dots dequantized f32 rows")
    } else if kinds.iter().any(Option::is_none) {
        (false, "no integer kernels for the weight format")
    } else if mode == ActMode::Auto && kinds.iter().flatten().any(|k| !k.by_default()) {
        (false, "f32 kernels faster for the weight format")
    } else {
        (true, "integer kernels for the weight format")
    };
    ActChoice { q8, reason }
}

/// Computes `out[r, n] = combine([dot(x[r], W_p[e(r), off_p + n]) for p])`
/// for every row `r` of every segment and `n < n_out`. Rows of `x` that no
/// segment names are left zero. Activations per [`act_choice`] with this
/// thread's [`act_mode`].
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
    project_with(
        strategy,
        act_mode(),
        x,
        m,
        segments,
        sources,
        n_out,
        combine,
    )
}

/// [`project`] with an explicit activation mode.
#[allow(clippy::too_many_arguments)] // project's arguments and the mode
pub fn project_with<const P: usize, F>(
    strategy: Strategy,
    mode: ActMode,
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
    let kinds = sources.map(|s| kind_of_rows(&s.dec));
    if act_choice(strategy, mode, &kinds).q8 {
        return project_q8(x, m, segments, sources, kinds, n_out, combine);
    }
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

const OP: &str = "project";

/// Rows of a segment dotted together by the integer kernels (each weight
/// row is read once per group).
const Q8_GROUP: usize = 4;

/// [`project`] on the quantized-activation path: each row of `x` quantized
/// once per distinct kind of the sources, then every segment's rows dotted
/// [`Q8_GROUP`] at a time with each block of weight rows.
fn project_q8<const P: usize, F>(
    x: &[f32],
    m: usize,
    segments: &[Segment],
    sources: [Source<'_>; P],
    kinds: [Option<QKind>; P],
    n_out: usize,
    combine: F,
) -> Result<Vec<f32>>
where
    F: Fn([f32; P]) -> f32 + Sync,
{
    let k = sources.first().map_or(0, |s| s.dec.cols());
    let level = simd_level();
    // One set of quantized rows per distinct kind; source p uses set which[p].
    let mut distinct: Vec<QKind> = Vec::new();
    let mut which = [0usize; P];
    for (w, kd) in which.iter_mut().zip(kinds) {
        let kd = kd.ok_or_else(|| invalid(OP, "sources", "integer kernels", "another format"))?;
        *w = match distinct.iter().position(|&d| d == kd) {
            Some(i) => i,
            None => {
                distinct.push(kd);
                distinct.len() - 1
            }
        };
    }
    let rows: Vec<Vec<QRow>> = distinct
        .iter()
        .map(|&kd| {
            x.par_chunks_exact(k.max(1))
                .take(m)
                .map(|xr| QRow::new(xr, kd))
                .collect::<Result<Vec<_>>>()
        })
        .collect::<Result<_>>()?;
    let threads = rayon::current_num_threads().max(1);
    let one_row = segments.iter().all(|s| s.rows.len() <= 1);
    let max_rows = if one_row { 256 } else { 64 };
    let by_balance = (n_out * segments.len())
        .div_ceil(threads * 8)
        .clamp(4, max_rows);
    let nb = by_balance.min(n_out.max(1));
    let items: Vec<(usize, usize)> = (0..segments.len())
        .flat_map(|s| (0..n_out).step_by(nb).map(move |n0| (s, n0)))
        .collect();
    let blocks = items
        .par_iter()
        .map_init(
            || (Vec::<f32>::new(), Vec::<f32>::new()),
            |(scratch, vals), &(s, n0)| -> Result<Vec<f32>> {
                let seg = &segments[s];
                let nbh = nb.min(n_out - n0);
                let mut local = vec![0f32; seg.rows.len() * nbh];
                for (rg, lg) in seg
                    .rows
                    .chunks(Q8_GROUP)
                    .zip(local.chunks_mut(Q8_GROUP * nbh))
                {
                    let g = rg.len();
                    vals.resize(P * g * nbh, 0.0);
                    for ((src, &w), vp) in sources
                        .iter()
                        .zip(&which)
                        .zip(vals.chunks_exact_mut(g * nbh))
                    {
                        let set = rows.get(w).map_or(&[][..], Vec::as_slice);
                        let row = |r: u32| {
                            set.get(r as usize)
                                .ok_or_else(|| invalid(OP, "segments", format!("rows < {m}"), r))
                        };
                        let first = row(rg.first().copied().unwrap_or(0))?;
                        let mut acts = [first; Q8_GROUP];
                        for (a, &r) in acts.iter_mut().zip(rg) {
                            *a = row(r)?;
                        }
                        let n = src.row_offset + n0;
                        qdot_rows(level, &src.dec, seg.expert, n, nbh, &acts[..g], scratch, vp)?;
                    }
                    for (ri, lr) in lg.chunks_exact_mut(nbh).enumerate() {
                        for (i, o) in lr.iter_mut().enumerate() {
                            let mut v = [0f32; P];
                            for (p, vp) in v.iter_mut().enumerate() {
                                *vp = vals[(p * g + ri) * nbh + i];
                            }
                            *o = combine(v);
                        }
                    }
                }
                Ok(local)
            },
        )
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
    gather_mm_act(a, strategy, act_mode())
}

/// [`gather_mm`] with an explicit strategy and activation mode.
pub fn gather_mm_act(a: &GatherMmArgs<'_>, strategy: Strategy, mode: ActMode) -> Result<Vec<f32>> {
    let src = Source {
        dec: a.w.decoder()?,
        row_offset: 0,
    };
    let rows = a.w.rows();
    project_with(strategy, mode, a.x, a.m, a.segments, [src], rows, |[v]| v)
}
