//! Fused dot kernels of MLX packed affine rows: `Σ_g s_g·Σ q·x + b_g·Σx`.
//!
//! Monomorphized over the code width, the group size and the scale dtype, so
//! the group loop has a constant trip count and reads its scale without a
//! dtype match. Codes of 2, 4 and 8 bits never straddle a byte: those rows
//! widen 8 bytes at a time and split the codes of each byte into separate
//! vectors, reading `x` in the matching order ([`bytes_row`]). Otherwise, per
//! group, the codes of each 32-weight pack (`BITS` words)
//! are widened into 32 lanes and multiplied by `x` into a group accumulator,
//! which is scaled into the row accumulator once per group; scales are
//! widened 8 groups at a time. The bias term `Σ_g b_g·Σx_g` is a separate
//! 8-lane dot with the group sums of `x` ([`XSums`]).

use super::simd::{F8Ops, Simd, U8Ops};
use super::{arr, fold_fma, lanes_sum, run, Acc, RowKernel, Run, Widen, XSums, A, L};
use crate::format::{AffineParams, RawRow};
use std::marker::PhantomData;

/// The kernel run of affine rows with parameters `p` and scales in `S`
/// (`None`: unsupported bits or group size).
pub(super) fn run_for<S: Widen, V: Simd>(p: AffineParams) -> Option<Run> {
    match p.bits {
        2 => by_group::<2, S, V>(p.group_size),
        3 => by_group::<3, S, V>(p.group_size),
        4 => by_group::<4, S, V>(p.group_size),
        5 => by_group::<5, S, V>(p.group_size),
        6 => by_group::<6, S, V>(p.group_size),
        8 => by_group::<8, S, V>(p.group_size),
        _ => None,
    }
}

fn by_group<const BITS: usize, S: Widen, V: Simd>(group_size: usize) -> Option<Run> {
    match group_size {
        32 => Some(run::<AffineRow<BITS, 32, S>, V>),
        64 => Some(run::<AffineRow<BITS, 64, S>, V>),
        128 => Some(run::<AffineRow<BITS, 128, S>, V>),
        _ => None,
    }
}

/// Affine rows of `BITS`-bit codes in groups of `GS` with scales in `S`.
struct AffineRow<const BITS: usize, const GS: usize, S>(PhantomData<S>);

impl<const BITS: usize, const GS: usize, S: Widen> RowKernel for AffineRow<BITS, GS, S> {
    #[inline(always)]
    fn dot<V: Simd>(raw: &RawRow<'_>, x: &[f32], xs: &XSums) -> Option<f32> {
        let RawRow::Affine {
            params,
            words,
            scales,
            biases,
        } = *raw
        else {
            return None;
        };
        if params.bits as usize != BITS || params.group_size != GS {
            return None;
        }
        let (scales, biases) = (S::scale_row(scales)?, S::scale_row(biases)?);
        if 8 % BITS == 0 {
            return V::enter(
                #[inline(always)]
                || bytes_row::<BITS, GS, S, V>(words, scales, biases, x, xs),
            );
        }
        dot_row::<BITS, GS, S, V>(Row {
            words,
            scales,
            biases,
            x,
            xs,
        })
    }
}

/// One stored row and its activations.
struct Row<'a, S> {
    words: &'a [u32],
    scales: &'a [S],
    biases: &'a [S],
    x: &'a [f32],
    xs: &'a XSums,
}

/// Word index and bit shift where code `j` (of a 32-code pack) starts, and the
/// next word (for codes that straddle two words; the last word otherwise).
const fn code_pos(bits: usize, j: usize) -> (usize, usize, u32) {
    let bit = j * bits;
    let w = bit / 32;
    let next = if w + 1 < bits { w + 1 } else { w };
    (w, next, (bit % 32) as u32)
}

/// The 32 codes of one pack of `BITS` words, widened to f32.
#[inline(always)]
fn codes<const BITS: usize>(w: &[u32; BITS]) -> [f32; L] {
    let mask = (1u32 << BITS) - 1;
    let mut q = [0f32; L];
    if BITS == 8 {
        // Whole bytes: one widening load per 8 codes.
        let bytes: &[u8] = bytemuck::cast_slice(w);
        for (q, &b) in q.iter_mut().zip(bytes) {
            *q = f32::from(b);
        }
    } else if 32 % BITS == 0 {
        // Codes never straddle a word: one variable shift per lane.
        for (j, q) in q.iter_mut().enumerate() {
            let (i, _, sh) = code_pos(BITS, j);
            *q = ((w[i] >> sh) & mask) as f32;
        }
    } else {
        // Low bits from word i, the rest from the next word shifted up by
        // `32 − sh` (done as `<< 1 << (31 − sh)`, so it stays below 32 and is
        // masked away when the code fits in word i).
        for (j, q) in q.iter_mut().enumerate() {
            let (i, n, sh) = code_pos(BITS, j);
            let v = (w[i] >> sh) | ((w[n] << 1) << (31 - sh));
            *q = (v & mask) as f32;
        }
    }
    q
}

/// `Σ_g s_g·Σ_{k∈g} q_k·x_k + b_g·Σ_{k∈g} x_k` over the row (out of line,
/// in [`Simd::enter`]).
#[inline(always)]
fn dot_row<const BITS: usize, const GS: usize, S: Widen, V: Simd>(r: Row<'_, S>) -> Option<f32> {
    V::enter(
        #[inline(always)]
        || row_dot::<BITS, GS, S, V>(r),
    )
}

/// [`dot_row`]'s body.
#[inline(always)]
fn row_dot<const BITS: usize, const GS: usize, S: Widen, V: Simd>(r: Row<'_, S>) -> Option<f32> {
    let groups = r.scales.len();
    let xsum = r.xs.of(GS);
    let ok = r.biases.len() == groups
        && r.words.len() == groups * GS / 32 * BITS
        && r.x.len() == groups * GS
        && xsum.len() == groups;
    if !ok {
        return None;
    }
    let (acc, off) = V::enter(
        #[inline(always)]
        || groups_dot::<BITS, GS, S, V>(r.words, r.x, r.scales, r.biases, xsum),
    );
    Some(lanes_sum(acc) + off)
}

/// The groups of a row: `(lanes of Σ_g s_g·Σ q·x, Σ_g b_g·Σx_g)`.
///
/// Its own function with plain loops (no early exits) and the accumulator
/// returned by value: with early exits in the loop, LLVM kept the
/// accumulator in memory inside the hot loop. Runs of 8 groups widen their
/// 8 scales with one F16C conversion (codes below 8 bits); the bias term is
/// a separate 8-lane dot ([`bias_dot`]); the remaining groups widen their
/// own scale. Called in [`Simd::enter`] (out of line).
#[inline(always)]
fn groups_dot<const BITS: usize, const GS: usize, S: Widen, V: Simd>(
    words: &[u32],
    x: &[f32],
    scales: &[S],
    biases: &[S],
    xsum: &[f32],
) -> (Acc, f32) {
    let wpg = GS / 32 * BITS;
    let mut acc: Acc = [0f32; A];
    // Measured: 8-bit codes ran slower in 8-group runs (LLVM's schedule of
    // the unrolled run spilled); they widen each group's scale instead.
    let n_runs = if BITS < 8 { scales.len() / 8 } else { 0 };
    let runs = words
        .chunks_exact(8 * wpg)
        .zip(x.chunks_exact(8 * GS))
        .zip(scales.chunks_exact(8))
        .take(n_runs);
    let tail = runs.len() * 8;
    for ((w8, x8), s8) in runs {
        let mut sf = [0f32; 8];
        S::widen_into::<V>(s8, &mut sf);
        for ((gw, gx), &s) in w8.chunks_exact(wpg).zip(x8.chunks_exact(GS)).zip(&sf) {
            group_fma::<BITS, V>(&mut acc, gw, gx, s);
        }
    }
    let rest = words
        .chunks_exact(wpg)
        .zip(x.chunks_exact(GS))
        .zip(scales)
        .skip(tail);
    for ((gw, gx), s) in rest {
        group_fma::<BITS, V>(&mut acc, gw, gx, s.widen());
    }
    (acc, bias_dot::<S, V>(biases, xsum))
}

/// `acc += s·Σ q·x` over one group (packs of 32 codes in `BITS` words).
#[inline(always)]
fn group_fma<const BITS: usize, V: Simd>(acc: &mut Acc, words: &[u32], x: &[f32], s: f32) {
    let mut t = [0f32; A];
    for (w, xp) in words.chunks_exact(BITS).zip(x.chunks_exact(L)) {
        if let (Some(w), Some(xp)) = (arr(w), arr(xp)) {
            fold_fma::<V>(&mut t, &codes::<BITS>(w), xp);
        }
    }
    for j in 0..A {
        acc[j] = V::fma(s, t[j], acc[j]);
    }
}

/// `Σ_g b_g·xsum_g`, 8 groups at a time (one F16C conversion per 8 biases).
#[inline(always)]
fn bias_dot<S: Widen, V: Simd>(biases: &[S], xsum: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (b8, x8) = (biases.chunks_exact(8), xsum.chunks_exact(8));
    let tail: f32 = b8
        .remainder()
        .iter()
        .zip(x8.remainder())
        .fold(0.0, |a, (b, &x)| V::fma(b.widen(), x, a));
    for (b, x) in b8.zip(x8) {
        let mut bf = [0f32; 8];
        S::widen_into::<V>(b, &mut bf);
        for j in 0..8 {
            acc[j] = V::fma(bf[j], x[j], acc[j]);
        }
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// [`dot_row`] for codes that never straddle a byte (2, 4, 8 bits): 8 bytes
/// at a time are widened to 8 lanes and code `t` of each byte is split off
/// into vector `t`, so the lanes hold every `c`-th weight (`c = 8 / BITS`);
/// `x` is read in the matching order ([`XSums::permuted`]). Called in
/// [`Simd::enter`] (out of line).
#[inline(always)]
fn bytes_row<const BITS: usize, const GS: usize, S: Widen, V: Simd>(
    words: &[u32],
    scales: &[S],
    biases: &[S],
    x: &[f32],
    xs: &XSums,
) -> Option<f32> {
    let groups = scales.len();
    let xsum = xs.of(GS);
    let xp = if BITS == 8 { x } else { xs.permuted(8 / BITS) };
    let ok = biases.len() == groups
        && words.len() == groups * GS / 32 * BITS
        && x.len() == groups * GS
        && xp.len() == x.len()
        && xsum.len() == groups;
    if !ok {
        return None;
    }
    let bytes: &[u8] = bytemuck::cast_slice(words);
    let bpg = GS * BITS / 8;
    // One accumulator for even groups, one for odd: each group's products
    // are summed in one chain and scaled once (the kernel is bound by the
    // two vector pipes that multiply and convert).
    let mut acc = [V::F8::zero(); 2];
    // Runs of 8 groups widen their scales with one F16C conversion; the
    // remaining groups widen their own.
    let runs = bytes
        .chunks_exact(8 * bpg)
        .zip(xp.chunks_exact(8 * GS))
        .zip(scales.chunks_exact(8));
    let done = runs.len() * 8;
    for ((b8, x8), s8) in runs {
        let mut sf = [0f32; 8];
        S::widen_into::<V>(s8, &mut sf);
        let groups = b8.chunks_exact(bpg).zip(x8.chunks_exact(GS)).zip(sf);
        for (g, ((gb, gx), s)) in groups.enumerate() {
            group_step::<BITS, Int, V>(&mut acc, g, gb, gx, s);
        }
    }
    let rest = bytes
        .chunks_exact(bpg)
        .zip(xp.chunks_exact(GS))
        .zip(scales)
        .skip(done);
    for (g, ((gb, gx), s)) in rest.enumerate() {
        group_step::<BITS, Int, V>(&mut acc, g, gb, gx, s.widen());
    }
    Some(acc[0].add(acc[1]).sum() + bias_dot::<S, V>(biases, xsum))
}

/// How the byte-wise kernels turn the codes of 8 lanes (`BITS` wide; the
/// first code of a byte may carry the byte's higher codes above it) into
/// the values that are multiplied by `x`, before the group scale.
pub(super) trait CodeValues {
    /// The values of the codes in the lanes of `code`.
    fn values<V: Simd>(code: V::U8) -> V::F8;
}

/// Affine codes: the integer itself.
struct Int;

impl CodeValues for Int {
    #[inline(always)]
    fn values<V: Simd>(code: V::U8) -> V::F8 {
        code.to_f32()
    }
}

/// `acc[g % 2] += s·Σ q·x` over group `g`, `q` the [`CodeValues`] `C` of
/// the codes. (A function, not a closure: a closure called twice was not
/// inlined, and out of [`Simd::enter`] its intrinsics became calls.)
#[inline(always)]
pub(super) fn group_step<const BITS: usize, C: CodeValues, V: Simd>(
    acc: &mut [V::F8; 2],
    g: usize,
    gb: &[u8],
    gx: &[f32],
    s: f32,
) {
    let p = group_products::<BITS, C, V>(gb, gx);
    if let Some(a) = acc.get_mut(g & 1) {
        *a = V::F8::splat(s).fma(p, *a);
    }
}

/// `Σ q·x` over one group, by lane: in one chain for groups of 32, else
/// in two (alternate vectors) summed at the end, so a long group's chain
/// does not hold the following group's work in the scheduler. The two
/// chains take 16 bytes (an even number of vectors) per step, so which
/// chain a vector joins is known at compile time: chosen at run time, the
/// chains lived in memory and every multiply-add waited on the previous
/// one's store (fp8-b128 rows ran at ~1 GB/s a core).
#[inline(always)]
fn group_products<const BITS: usize, C: CodeValues, V: Simd>(bytes: &[u8], x: &[f32]) -> V::F8 {
    let c = 8 / BITS;
    if x.len() > 32 {
        // (n, o): the chain the next vector joins, the other; every step
        // has 2c vectors, so each starts with chain 0.
        let (b16, x16) = (bytes.chunks_exact(16), x.chunks_exact(16 * c));
        let (br, xr) = (b16.remainder(), x16.remainder());
        let (mut n, mut o) = (V::F8::zero(), V::F8::zero());
        for (b, xu) in b16.zip(x16) {
            let (b0, b1) = b.split_at(8);
            let (x0, x1) = xu.split_at(8 * c);
            let (n1, o1) = code_chunk::<BITS, true, C, V>(b0, x0, n, o);
            (n, o) = code_chunk::<BITS, true, C, V>(b1, x1, n1, o1);
        }
        // (Group bytes not a multiple of 16: none of the callers' formats.)
        for (b, xu) in br.chunks_exact(8).zip(xr.chunks_exact(8 * c)) {
            (n, o) = code_chunk::<BITS, true, C, V>(b, xu, n, o);
        }
        // The chains summed (either order: the sum is the same).
        n.add(o)
    } else {
        let mut p = V::F8::zero();
        for (b, xu) in bytes.chunks_exact(8).zip(x.chunks_exact(8 * c)) {
            (p, _) = code_chunk::<BITS, false, C, V>(b, xu, p, p);
        }
        p
    }
}

/// The `c = 8/BITS` code vectors of the 8 bytes `b` times `x`, into the
/// chains `(n, o)` — alternately, vector 0 into `n`, if `ALT`, else all
/// into `n`. Returns the chains as `(the one the next vector joins, the
/// other)`.
#[inline(always)]
fn code_chunk<const BITS: usize, const ALT: bool, C: CodeValues, V: Simd>(
    b: &[u8],
    xu: &[f32],
    n: V::F8,
    o: V::F8,
) -> (V::F8, V::F8) {
    let c = 8 / BITS;
    let mask = (1u32 << BITS) - 1;
    let v = arr(b).map_or(V::U8::splat(0), V::U8::bytes);
    let (mut cur, mut next) = (n, o);
    for (t, xt) in xu.chunks_exact(8).enumerate() {
        // The last code of a byte needs no mask, the first no shift.
        let code = match t {
            0 if c == 1 => v,
            0 => v.and(mask),
            _ if t + 1 == c => v.shr((BITS * t) as u32),
            _ => v.shr((BITS * t) as u32).and(mask),
        };
        let xv = arr(xt).map_or(V::F8::zero(), V::F8::load);
        cur = C::values::<V>(code).fma(xv, cur);
        if ALT {
            std::mem::swap(&mut cur, &mut next);
        }
    }
    (cur, next)
}
