//! The [`Avx512Vnni`] level's kernels on 512-bit vectors.
//!
//! Q4_0 takes a run of 4 blocks at once: their nibble bytes side by side,
//! split into low nibbles (the first 16 weights of each block) and high
//! nibbles (the last 16), against the interleaved activation codes
//! ([`half_offsets`](super::half_offsets)); lanes `4k..4k + 4` of the two
//! vectors are lanes 0..4 and 4..8 of block `k` of the run, and the two
//! accumulators hold `A[0..4]` in those lanes. Q8_0 takes two blocks per
//! vector (`A[b % 4]` in its halves); Q4_K's kernel is in
//! [`super::avx512_k`]. Blocks after a row's last whole run of 4 take the portable
//! lane functions. The arithmetic is the module doc's of [`super`], bit for
//! bit.
//!
//! # Safety
//!
//! As in [`super::x86`]: the intrinsics need AVX-512 F/BW/VL, AVX512-VNNI,
//! AVX2, FMA and F16C, the kernels run only inside `Avx512Vnni::enter`, and
//! `qdot_rows` runs the level only if `SimdLevel::is_supported` detected
//! those features ("the level was detected" below); rows are read through
//! [`chunk`] where [`Rows::new`] checked their lengths once.

// Functions are passed on wrapped in `#[inline(always)]` closures: a
// function item passed as a value may stay out of line, compiled without the
// level's features (its intrinsics then become calls).
#![allow(clippy::redundant_closure)]

use super::portable::{q4_0_lanes, q8_0_lanes};
use super::x86::{prefetch_distance, prefetch_span, Avx512Vnni, Dot};
use super::ymm::{tail_finish, to_array4};
use super::{chunk, each_row, Acc, QRow, Rows, Run, RUN};
use crate::format::ggml::GgmlType;
use std::arch::x86_64::*;

/// The run of `R` activation rows for weights of type `t`.
pub(super) fn run_for<const R: usize>(t: GgmlType) -> Option<Run<R>> {
    match t {
        GgmlType::Q4_0 => Some(run_q4_0::<R>),
        GgmlType::Q8_0 => Some(run_q8_0::<R>),
        GgmlType::Q4_K => Some(super::avx512_k::run_q4_k::<R>),
        GgmlType::Q3_K => Some(super::avx512_k::run_q3_k::<R>),
        // The other formats: their 256-bit kernels in EVEX forms.
        _ => super::blocks_x86::run_for::<super::x86::Avx512Vnni, R>(t),
    }
}

// This file's kernels as Runs inside their level (`level_run!`, qdot/mod.rs).
level_run!(run_q4_0 [const R: usize], Avx512Vnni, q4_0::<R>);
level_run!(run_q8_0 [const R: usize], Avx512Vnni, q8_0::<R>);

/// 64 bytes, or 16 lanes of 32 bits, or 32 of 16.
#[inline(always)]
pub(super) fn load512<T: Copy, const N: usize>(v: &[T; N]) -> __m512i {
    const { assert!(std::mem::size_of::<T>() * N == 64) };
    // SAFETY: `v` is 64 readable bytes (the assertion), unaligned loads are
    // allowed; the level was detected.
    unsafe { _mm512_loadu_si512(v.as_ptr().cast()) }
}

/// Lanes as an array.
#[inline(always)]
pub(super) fn to_array16(v: __m512) -> [f32; 16] {
    let mut a = [0f32; 16];
    // SAFETY: `a` is 16 writable f32; the level was detected.
    unsafe { _mm512_storeu_ps(a.as_mut_ptr(), v) };
    a
}

/// `fma(s, f32(l), acc)` lane by lane.
#[inline(always)]
pub(super) fn fma16(acc: __m512, s: __m512, l: __m512i) -> __m512 {
    // SAFETY: no memory is accessed; the level was detected.
    unsafe { _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(l), acc) }
}

/// `s·m` lane by lane: the lanes' scale products (rounded once, as the
/// portable `s * m[j]`).
#[inline(always)]
pub(super) fn pow_mul(s: __m512, p: &[f32; 16]) -> __m512 {
    // SAFETY: `p` is 64 readable bytes; the level was detected.
    unsafe { _mm512_mul_ps(s, _mm512_loadu_ps(p.as_ptr())) }
}

/// The per-block scale products of `BS`-byte blocks with the f16 weight
/// scale at byte `AT` (as [`block_scales`](super::block_scales) computes
/// them): 16 blocks at a time, the scales gathered (`vpgatherdd` of the 4
/// bytes at each, truncated to 16 bits), widened (F16C, exact) and
/// multiplied by 16 activation scales. Uses and returns `scratch[..R·nb]`.
#[inline(always)]
fn scales16<'s, const R: usize, const BS: usize, const AT: usize>(
    row: &[u8],
    ds: &[&[f32]; R],
    scratch: &'s mut [f32],
) -> Option<&'s [f32]> {
    let nb = row.len() / BS;
    // Each gathered load reads bytes AT..AT + 4 of a block.
    const { assert!(AT + 4 <= BS) };
    if nb == 0 || ds.iter().any(|d| d.len() != nb) {
        return None;
    }
    let s = scratch.get_mut(..R * nb)?;
    for c in 0..nb.div_ceil(16) {
        let n16 = (nb - 16 * c).min(16);
        let mask: __mmask16 = if n16 == 16 { !0 } else { (1 << n16) - 1 };
        // SAFETY: lane i reads 4 bytes at (16c + i)·BS + AT < row.len() − 3
        // for every lane in `mask` (16c + i < nb); the stores and loads of
        // `s` and `ds` are masked the same, within R·nb and nb; the level
        // was detected.
        unsafe {
            let base = row.as_ptr().add(16 * c * BS + AT);
            let off = _mm512_mullo_epi32(
                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                _mm512_set1_epi32(BS as i32),
            );
            let h =
                _mm512_mask_i32gather_epi32::<1>(_mm512_setzero_si512(), mask, off, base.cast());
            let w = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
            for (t, d) in ds.iter().enumerate() {
                let dv = _mm512_maskz_loadu_ps(mask, d.as_ptr().add(16 * c));
                let st = s.as_mut_ptr().add(t * nb + 16 * c);
                _mm512_mask_storeu_ps(st, mask, _mm512_mul_ps(w, dv));
            }
        }
    }
    Some(s)
}

/// `vpermt2b` indices gathering the nibble bytes of a run of 4 Q4_0 blocks
/// (bytes `2 + 18k..18 + 18k`) from its bytes `0..64` (indices 0..64) and
/// `8..72` (64..128), side by side.
const Q4_0_QS: [u8; 64] = {
    let mut m = [0u8; 64];
    let mut o = 0;
    while o < 64 {
        let src = 2 + 18 * (o / 16) + o % 16;
        m[o] = if src < 64 { src } else { 64 + src - 8 } as u8;
        o += 1;
    }
    m
};

/// `vpermb` indices gathering the f16 scales of a run of 4 Q4_0 blocks
/// (bytes `18k..18k + 2`) into bytes `0..8`.
const Q4_0_D: [u8; 64] = {
    let mut m = [0u8; 64];
    let mut k = 0;
    while k < 4 {
        m[2 * k] = (18 * k) as u8;
        m[2 * k + 1] = (18 * k + 1) as u8;
        k += 1;
    }
    m
};

/// Q4_0: per run of 4 blocks, `vpdpbusd(0, q, y)` of the low and of the
/// high nibbles, scaled by the lanes' powers of two; the `−8` as the
/// blocks' offset terms. The run's 72 bytes are read as two
/// overlapping 64-byte vectors; byte permutes (VBMI) pick the nibble bytes
/// and the 4 scales, which are widened and multiplied by the activation
/// scales in the loop.
#[inline(always)]
fn q4_0<const R: usize>(
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
    let (qs_idx, d_idx) = (load512(&Q4_0_QS), load512(&Q4_0_D));
    let pf = prefetch_distance();
    each_row::<R>(
        bytes,
        row_len,
        out,
        stride,
        #[inline(always)]
        |row, out| {
            // SAFETY: no memory is accessed; the level was detected.
            let (z, zo) = unsafe { (_mm512_setzero_ps(), _mm_setzero_ps()) };
            let mut acc = [[z; 2]; R];
            // The offset terms O[0..4].
            let mut off = [zo; R];
            for (g, run) in row.chunks_exact(RUN * BS).enumerate() {
                let run: &[u8; RUN * BS] = run.try_into().ok()?;
                prefetch_span(run, pf);
                // SAFETY: bytes 0..64 and 8..72 of the 72-byte run; the level
                // was detected.
                let (lo, hi, w) = unsafe {
                    let a = load512(chunk::<u8, 64>(run, 0));
                    let b = load512(chunk::<u8, 64>(run, 8));
                    let x = _mm512_permutex2var_epi8(a, qs_idx, b);
                    let d = _mm512_permutexvar_epi8(d_idx, a);
                    let m4 = _mm512_set1_epi8(15);
                    (
                        _mm512_and_si512(x, m4),
                        _mm512_and_si512(_mm512_srli_epi16(x, 4), m4),
                        _mm_cvtph_ps(_mm512_castsi512_si128(d)),
                    )
                };
                for (t, (acc, off)) in acc.iter_mut().zip(&mut off).enumerate() {
                    // SAFETY: g < nb/4, and `rows` holds nb blocks, scales
                    // and offsets.
                    let (y0, y1, h0, h1, dx, bo) = unsafe {
                        (
                            chunk::<i8, 64>(rows.y[t], 128 * g),
                            chunk::<i8, 64>(rows.y[t], 128 * g + 64),
                            chunk::<f32, 16>(rows.lscale[t], 32 * g),
                            chunk::<f32, 16>(rows.lscale[t], 32 * g + 16),
                            chunk::<f32, 4>(rows.d[t], 4 * g),
                            chunk::<f32, 4>(rows.boff[t], 4 * g),
                        )
                    };
                    // SAFETY: `dx`, `bo` are 16 readable bytes; the level was
                    // detected.
                    let (sv, l0, l1) = unsafe {
                        let s4 = _mm_mul_ps(w, _mm_loadu_ps(dx.as_ptr()));
                        *off = _mm_fmadd_ps(s4, _mm_loadu_ps(bo.as_ptr()), *off);
                        let z = _mm512_setzero_si512();
                        (
                            spread_x4(s4),
                            _mm512_dpbusd_epi32(z, lo, load512(y0)),
                            _mm512_dpbusd_epi32(z, hi, load512(y1)),
                        )
                    };
                    acc[0] = fma16(acc[0], pow_mul(sv, h0), l0);
                    acc[1] = fma16(acc[1], pow_mul(sv, h1), l1);
                }
            }
            let tail = nb / RUN * RUN < nb;
            let st = if tail {
                scales16::<R, BS, 0>(row, &rows.d, s)?
            } else {
                &[]
            };
            for (t, ((o, acc), off)) in out.iter_mut().zip(acc).zip(off).enumerate() {
                // A[k][4h + i] is lane 4k + i of acc[h].
                let mut a: Acc = [[0f32; 8]; RUN];
                for (h, v) in acc.iter().enumerate() {
                    for (k, v4) in to_array16(*v).chunks_exact(4).enumerate() {
                        a[k][4 * h..4 * h + 4].copy_from_slice(v4);
                    }
                }
                let st = if tail {
                    st.get(t * nb..(t + 1) * nb)?
                } else {
                    &[]
                };
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

/// `[s0 ×4, s1 ×4, s2 ×4, s3 ×4]`.
#[inline(always)]
pub(super) fn spread_x4(s: __m128) -> __m512 {
    // SAFETY: no memory is accessed; the level was detected.
    unsafe {
        let idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
        _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(s))
    }
}

/// `vpermt2b` indices gathering the codes of blocks 0, 1 of a run of 4 Q8_0
/// blocks (bytes `2 + 34k..34 + 34k`) from its bytes `0..64` (indices
/// 0..64) and `64..128` (64..128), and those of blocks 2, 3 from its bytes
/// `64..128` and `72..136`.
const Q8_0_QS: [[u8; 64]; 2] = {
    let mut m = [[0u8; 64]; 2];
    let mut o = 0;
    while o < 64 {
        // Blocks 0, 1: sources 0..128, split at 64.
        m[0][o] = (2 + 34 * (o / 32) + o % 32) as u8;
        // Blocks 2, 3: first vector from byte 64, second from byte 72.
        let src = 2 + 34 * (2 + o / 32) + o % 32;
        m[1][o] = if src < 128 { src - 64 } else { 64 + src - 72 } as u8;
        o += 1;
    }
    m
};

/// `vpermt2b` indices gathering the f16 scales of a run of 4 Q8_0 blocks
/// (bytes `34k..34k + 2`) from its bytes `0..64` and `64..128` into bytes
/// `0..8`.
const Q8_0_D: [u8; 64] = {
    let mut m = [0u8; 64];
    let mut k = 0;
    while k < 4 {
        m[2 * k] = (34 * k) as u8;
        m[2 * k + 1] = (34 * k + 1) as u8;
        k += 1;
    }
    m
};

/// `[s0 ×8, s1 ×8]`, `[s2 ×8, s3 ×8]`.
#[inline(always)]
pub(super) fn spread_x8(s: __m128) -> [__m512; 2] {
    // SAFETY: no memory is accessed; the level was detected.
    unsafe {
        let s = _mm512_castps128_ps512(s);
        let i01 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        let i23 = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
        [_mm512_permutexvar_ps(i01, s), _mm512_permutexvar_ps(i23, s)]
    }
}

/// Q8_0: per pair of blocks, `vpdpbusd(−128·Σy, w + 128, y)`, shifted; a
/// run of 4 blocks (136 bytes) read as three 64-byte vectors, the codes and
/// scales picked by byte permutes (VBMI).
#[inline(always)]
fn q8_0<const R: usize>(
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
    let qs_idx = [load512(&Q8_0_QS[0]), load512(&Q8_0_QS[1])];
    let d_idx = load512(&Q8_0_D);
    let pf = prefetch_distance();
    each_row::<R>(
        bytes,
        row_len,
        out,
        stride,
        #[inline(always)]
        |row, out| {
            // SAFETY: no memory is accessed; the level was detected.
            let z = unsafe { _mm512_setzero_ps() };
            // acc[t][p]: blocks 4g + 2p (low half), 4g + 2p + 1 (high half).
            let mut acc = [[z; 2]; R];
            for (g, run) in row.chunks_exact(RUN * BS).enumerate() {
                let run: &[u8; RUN * BS] = run.try_into().ok()?;
                prefetch_span(run, pf);
                // SAFETY: bytes 0..64, 64..128 and 72..136 of the 136-byte
                // run; the level was detected.
                let (u, w) = unsafe {
                    let a = load512(chunk::<u8, 64>(run, 0));
                    let b = load512(chunk::<u8, 64>(run, 64));
                    let c = load512(chunk::<u8, 64>(run, 72));
                    let m = _mm512_set1_epi8(i8::MIN);
                    let u01 = _mm512_permutex2var_epi8(a, qs_idx[0], b);
                    let u23 = _mm512_permutex2var_epi8(b, qs_idx[1], c);
                    let d = _mm512_permutex2var_epi8(a, d_idx, b);
                    (
                        [_mm512_xor_si512(u01, m), _mm512_xor_si512(u23, m)],
                        _mm_cvtph_ps(_mm512_castsi512_si128(d)),
                    )
                };
                for (t, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: 4g + 4 ≤ nb, and `rows` holds nb blocks and
                    // scales; `dx` is 16 readable bytes; the level was
                    // detected.
                    let sv = unsafe {
                        let dx = chunk::<f32, 4>(rows.d[t], 4 * g);
                        let s4 = _mm_mul_ps(w, _mm_loadu_ps(dx.as_ptr()));
                        spread_x8(s4)
                    };
                    for (p, (acc, sv)) in acc.iter_mut().zip(sv).enumerate() {
                        let b = RUN * g + 2 * p;
                        // SAFETY: b + 1 < nb, and `rows` holds nb blocks.
                        let (y, c, h) = unsafe {
                            (
                                chunk::<i8, 64>(rows.y[t], 32 * b),
                                chunk::<i32, 16>(rows.bias[t], 8 * b),
                                chunk::<f32, 16>(rows.lscale[t], 8 * b),
                            )
                        };
                        // SAFETY: no memory is accessed; the level was detected.
                        let l = unsafe { _mm512_dpbusd_epi32(load512(c), u[p], load512(y)) };
                        *acc = fma16(*acc, pow_mul(sv, h), l);
                    }
                }
            }
            let tail = nb / RUN * RUN < nb;
            let st = if tail {
                scales16::<R, BS, 0>(row, &rows.d, s)?
            } else {
                &[]
            };
            for (t, (o, acc)) in out.iter_mut().zip(acc).enumerate() {
                // A[2p + k] is half k of acc[p].
                let mut a: Acc = [[0f32; 8]; RUN];
                for (p, v) in acc.iter().enumerate() {
                    for (k, v8) in to_array16(*v).chunks_exact(8).enumerate() {
                        a[2 * p + k].copy_from_slice(v8);
                    }
                }
                let st = if tail {
                    st.get(t * nb..(t + 1) * nb)?
                } else {
                    &[]
                };
                *o = tail_finish::<BS>(
                    a,
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
