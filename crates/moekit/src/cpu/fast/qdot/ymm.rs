//! The 256-bit kernels of the [`Avx2`](super::x86::Avx2) and
//! [`AvxVnni`](super::x86::AvxVnni) levels, one body per format, generic
//! over the byte multiply-add ([`Dot`]).
//!
//! Q4_0 takes a run of 4 blocks as two pairs: the nibble bytes of a pair
//! side by side, split into low nibbles (the first 16 weights of both
//! blocks) and high nibbles (the last 16), against the interleaved
//! activation codes ([`half_offsets`](super::half_offsets)); so lanes 0..4
//! of a vector are lanes 0..4 (or 4..8) of the pair's first block and lanes
//! 4..8 those of its second, and the accumulators hold `A[b % 4]` in
//! halves. Q8_0 takes one block per vector (lanes in order), Q4_K one
//! 32-byte chunk of two groups per two vectors. Blocks after a row's last
//! whole run of 4 take the portable lane functions. The arithmetic is the
//! module doc's of [`super`], bit for bit.
//!
//! # Safety
//!
//! As in [`super::x86`] ("the level was detected"); rows are read through
//! [`chunk`] where [`Rows::new`] checked their lengths once.

// Functions are passed on wrapped in `#[inline(always)]` closures: a
// function item passed as a value may stay out of line, compiled without the
// level's features (its intrinsics then become calls).
#![allow(clippy::redundant_closure)]

use super::portable::{q4_0_lanes, q8_0_lanes, Lanes};
use super::x86::{
    acc_of, f16_pair, fma_lanes, group_scale, k4_mins, k4_scales16, load256, load_x16, nibbles,
    prefetch_at, prefetch_distance, prefetch_span, q4_0_pair, scales, splat, splat2x4, to_array,
    zero, Dot,
};
use super::{
    add_block_scaled, add_offset, chunk, each_row, finish, in_runs, offsets, Acc, QRow, Rows, Run,
    RUN,
};
use crate::format::ggml::GgmlType;
use std::arch::x86_64::*;

/// The run of `R` activation rows for weights of type `t` at level `D`.
pub(super) fn run_for<D: Dot, const R: usize>(t: GgmlType) -> Option<Run<R>> {
    match t {
        GgmlType::Q4_0 => Some(run_q4_0::<D, R>),
        GgmlType::Q8_0 => Some(run_q8_0::<D, R>),
        GgmlType::Q4_K => Some(run_q4_k::<D, R>),
        _ => super::blocks_x86::run_for::<D, R>(t),
    }
}

// This file's kernels as Runs inside their level (`level_run!`, qdot/mod.rs).
level_run!(run_q4_0 [D: Dot, const R: usize], D, q4_0::<D, R>);
level_run!(run_q8_0 [D: Dot, const R: usize], D, q8_0::<D, R>);
level_run!(run_q4_k [D: Dot, const R: usize], D, q4_k::<D, R>);

/// Adds the blocks after the last whole run of 4 (`b ≥ 4·runs`) of a row
/// of `BS`-byte blocks with the portable lanes (and their offset terms),
/// then finishes the dot.
#[inline(always)]
pub(super) fn tail_finish<const BS: usize>(
    mut acc: Acc,
    mut off: [f32; RUN],
    row: &[u8],
    st: &[f32],
    a: &QRow,
    nb: usize,
    lanes: impl Fn(&[u8], &QRow, usize, usize) -> Option<Lanes>,
) -> Option<f32> {
    for b in nb / RUN * RUN..nb {
        let s = *st.get(b)?;
        let (l, m) = lanes(row.get(b * BS..)?, a, nb, b)?;
        add_block_scaled(&mut acc, b, s, &m, l);
        if let Some(&bo) = a.boff.get(b) {
            add_offset(&mut off, b, s, bo);
        }
    }
    Some(finish(&acc, offsets(&off)))
}

/// Q4_0: per pair of blocks, `vpdpbusd(0, q, y)` of the low and of the
/// high nibbles, shifted; the `−8` as the blocks' offset terms.
#[inline(always)]
fn q4_0<D: Dot, const R: usize>(
    bytes: &[u8],
    row_len: usize,
    acts: &[&QRow; R],
    s: &mut [f32],
    out: &mut [f32],
    stride: usize,
) -> Option<()> {
    const BS: usize = 18;
    let nb = row_len / BS;
    let rows = Rows::new(acts, nb, false)?;
    let pf = prefetch_distance();
    each_row::<R>(
        bytes,
        row_len,
        out,
        stride,
        #[inline(always)]
        |row, out| {
            let st = scales::<R, BS, 0>(row, &rows.d, s)?;
            // acc[t][p][h]: pair p of the run, lanes 4h..4h + 4 of its blocks;
            // off[t]: the offset terms O[0..4].
            let mut acc = [[[zero(); 2]; 2]; R];
            // SAFETY: no memory is accessed; the level was detected.
            let mut off = [unsafe { _mm_setzero_ps() }; R];
            for (g, run) in row.chunks_exact(RUN * BS).enumerate() {
                prefetch_at(run, 0, RUN * BS, pf);
                for (p, two) in run.chunks_exact(2 * BS).enumerate() {
                    let (b0, b1) = two.split_at(BS);
                    let (lo, hi) = nibbles(q4_0_pair(b0.try_into().ok()?, b1.try_into().ok()?));
                    // Stored first halves of blocks 4g + 2p, 4g + 2p + 1.
                    let at = 128 * g + 32 * p;
                    for (t, acc) in acc.iter_mut().enumerate() {
                        // SAFETY: g < nb/4, and `rows` holds nb blocks, `st`
                        // R·nb scales.
                        let (y0, y1, m0, m1, s2) = unsafe {
                            (
                                chunk(rows.y[t], at),
                                chunk(rows.y[t], at + 64),
                                chunk(rows.lscale[t], at / 4),
                                chunk(rows.lscale[t], at / 4 + 16),
                                chunk(st, t * nb + 4 * g + 2 * p),
                            )
                        };
                        let sv = splat2x4(s2);
                        // SAFETY: no memory is accessed; the level was detected.
                        let z = unsafe { _mm256_setzero_si256() };
                        let l0 = D::dpbusd(z, lo, load256(y0));
                        let l1 = D::dpbusd(z, hi, load256(y1));
                        acc[p][0] = fma_lanes(acc[p][0], scale_lanes(sv, m0), l0);
                        acc[p][1] = fma_lanes(acc[p][1], scale_lanes(sv, m1), l1);
                    }
                }
                for (t, off) in off.iter_mut().enumerate() {
                    // SAFETY: 4g + 4 ≤ nb; `st` holds R·nb scales and `rows`
                    // nb offsets; the level was detected.
                    unsafe {
                        let s4 = chunk::<f32, 4>(st, t * nb + 4 * g);
                        let o4 = chunk::<f32, 4>(rows.boff[t], 4 * g);
                        *off = _mm_fmadd_ps(
                            _mm_loadu_ps(s4.as_ptr()),
                            _mm_loadu_ps(o4.as_ptr()),
                            *off,
                        );
                    }
                }
            }
            for (t, ((o, acc), off)) in out.iter_mut().zip(acc).zip(off).enumerate() {
                // A[2p + k][4h + i] is lane 4k + i of acc[p][h].
                let mut a: Acc = [[0f32; 8]; RUN];
                for (p, halves) in acc.iter().enumerate() {
                    for (h, v) in halves.iter().enumerate() {
                        let v = to_array(*v);
                        for (k, v4) in v.chunks_exact(4).enumerate() {
                            a[2 * p + k][4 * h..4 * h + 4].copy_from_slice(v4);
                        }
                    }
                }
                let st = st.get(t * nb..(t + 1) * nb)?;
                *o = tail_finish::<BS>(
                    a,
                    to_array4(off),
                    row,
                    st,
                    acts.get(t)?,
                    nb,
                    #[inline(always)]
                    |r, a, n, b| q4_0_lanes(r, a, n, b),
                )?;
            }
            Some(())
        },
    )
}

/// `s·m` lane by lane: the lanes' scale products (rounded once, as the
/// portable `s * m[j]`).
#[inline(always)]
pub(super) fn scale_lanes(s: __m256, m: &[f32; 8]) -> __m256 {
    // SAFETY: `m` is 32 readable bytes; the level was detected.
    unsafe { _mm256_mul_ps(s, _mm256_loadu_ps(m.as_ptr())) }
}

/// Lanes as an array.
#[inline(always)]
pub(super) fn to_array4(v: __m128) -> [f32; RUN] {
    let mut a = [0f32; RUN];
    // SAFETY: `a` is 4 writable f32; the level was detected.
    unsafe { _mm_storeu_ps(a.as_mut_ptr(), v) };
    a
}

/// Q8_0: [`Dot::dot_i8`] per block and row, shifted.
#[inline(always)]
fn q8_0<D: Dot, const R: usize>(
    bytes: &[u8],
    row_len: usize,
    acts: &[&QRow; R],
    s: &mut [f32],
    out: &mut [f32],
    stride: usize,
) -> Option<()> {
    const BS: usize = 34;
    let nb = row_len / BS;
    let rows = Rows::new(acts, nb, true)?;
    let pf = prefetch_distance();
    each_row::<R>(
        bytes,
        row_len,
        out,
        stride,
        #[inline(always)]
        |row, out| {
            let st = scales::<R, BS, 0>(row, &rows.d, s)?;
            let mut acc = [[zero(); RUN]; R];
            for (g, run) in row.chunks_exact(RUN * BS).enumerate() {
                prefetch_at(run, 0, RUN * BS, pf);
                for (k, blk) in run.chunks_exact(BS).enumerate() {
                    let blk: &[u8; BS] = blk.try_into().ok()?;
                    // SAFETY: bytes 2..34 of the block.
                    let w = load256(unsafe { chunk::<u8, 32>(blk, 2) });
                    let b = RUN * g + k;
                    for (t, acc) in acc.iter_mut().enumerate() {
                        // SAFETY: b < nb, and `rows` holds nb blocks, `st`
                        // R·nb scales.
                        let (y, c, m, sb) = unsafe {
                            (
                                chunk(rows.y[t], 32 * b),
                                chunk(rows.bias[t], 8 * b),
                                chunk(rows.lscale[t], 8 * b),
                                *st.get_unchecked(t * nb + b),
                            )
                        };
                        let l = D::dot_i8(w, load256(y), c);
                        acc[k] = fma_lanes(acc[k], scale_lanes(splat(sb), m), l);
                    }
                }
            }
            for (t, (o, acc)) in out.iter_mut().zip(acc).enumerate() {
                let st = st.get(t * nb..(t + 1) * nb)?;
                *o = tail_finish::<BS>(
                    acc_of(acc),
                    [0f32; RUN],
                    row,
                    st,
                    acts.get(t)?,
                    nb,
                    #[inline(always)]
                    |r, a, n, b| q8_0_lanes(r, a, n, b),
                )?;
            }
            Some(())
        },
    )
}

/// Q4_K: per group of 32, `vpmaddubsw(q, y)` times the pairs' `2^shift`,
/// then [`Dot::dpwssd`] with the group scale into the super-block's lanes;
/// the mins from the sums of y.
#[inline(always)]
fn q4_k<D: Dot, const R: usize>(
    bytes: &[u8],
    row_len: usize,
    acts: &[&QRow; R],
    _: &mut [f32],
    out: &mut [f32],
    stride: usize,
) -> Option<()> {
    const BS: usize = 144;
    let nb = row_len / BS;
    let rows = Rows::new(acts, nb, false)?;
    let pf = prefetch_distance();
    each_row::<R>(
        bytes,
        row_len,
        out,
        stride,
        #[inline(always)]
        |row, out| {
            let mut st = ([[zero(); RUN]; R], [[0f32; RUN]; R]);
            in_runs(
                row,
                BS,
                &mut st,
                #[inline(always)]
                |(acc, off), b, i, blk| {
                    let blk: &[u8; BS] = blk.try_into().ok()?;
                    prefetch_span(blk, pf);
                    let (sc16, m) = k4_scales16(blk);
                    let (d, dmin) = f16_pair(blk);
                    // Two integer accumulators (low and high nibbles) per row:
                    // two chains (exact; summed at the end).
                    // SAFETY: no memory is accessed; the level was detected.
                    let mut li = [[unsafe { _mm256_setzero_si256() }; 2]; R];
                    for c in 0..4 {
                        // SAFETY: 16 + 32·4 = 144 bytes.
                        let (lo, hi) = nibbles(load256(unsafe { chunk(blk, 16 + 32 * c) }));
                        let (s_lo, s_hi) = (group_scale(sc16, 2 * c), group_scale(sc16, 2 * c + 1));
                        for ((l, y), p2) in li.iter_mut().zip(rows.y).zip(rows.pow2) {
                            let at = 256 * b + 64 * c;
                            // SAFETY: b < nb, and `rows` holds nb blocks.
                            let (y0, y1, p0, p1) = unsafe {
                                (
                                    chunk(y, at),
                                    chunk(y, at + 32),
                                    chunk(p2, at / 2),
                                    chunk(p2, at / 2 + 16),
                                )
                            };
                            // The pair sums (≤ 2·15·127) times 2^shift (≤ 8) fit
                            // 16 bits.
                            // SAFETY: no memory is accessed; the level was
                            // detected.
                            let (p_lo, p_hi) = unsafe {
                                (
                                    _mm256_mullo_epi16(
                                        _mm256_maddubs_epi16(lo, load256(y0)),
                                        load_x16(p0),
                                    ),
                                    _mm256_mullo_epi16(
                                        _mm256_maddubs_epi16(hi, load256(y1)),
                                        load_x16(p1),
                                    ),
                                )
                            };
                            l[0] = D::dpwssd(l[0], p_lo, s_lo);
                            l[1] = D::dpwssd(l[1], p_hi, s_hi);
                        }
                    }
                    for (t, ((acc, off), l)) in
                        acc.iter_mut().zip(off.iter_mut()).zip(li).enumerate()
                    {
                        // SAFETY: b < nb, and `rows` holds nb blocks and scales.
                        let (dx, gsum) =
                            unsafe { (*rows.d[t].get_unchecked(b), chunk(rows.gsum[t], 8 * b)) };
                        // The scale products as `block_scales` rounds them.
                        let (s_d, s_m) = (d * dx, dmin * dx);
                        // SAFETY: no memory is accessed; the level was detected.
                        let l = unsafe { _mm256_add_epi32(l[0], l[1]) };
                        let a = acc.get_mut(i)?;
                        *a = fma_lanes(*a, splat(s_d), l);
                        add_offset(off, i, s_m, k4_mins(&m, gsum) as f32);
                    }
                    Some(())
                },
                |_, _| Some(()),
            )?;
            let (acc, off) = st;
            for ((o, acc), off) in out.iter_mut().zip(acc).zip(off) {
                *o = finish(&acc_of(acc), offsets(&off));
            }
            Some(())
        },
    )
}
