//! The [`Avx512Vnni`] level's kernel of MLX affine rows of 2, 3, 5, 6 and 8
//! bits ([`super::affine`]'s "other widths"): two blocks of 32 codes per
//! 512-bit vector, their codes unpacked by VBMI.
//!
//! A pair of blocks is `8·BITS` contiguous bytes (`BITS` bytes per 8
//! codes, LSB first): a masked load, `vpermb` copies each 8 codes' bytes
//! into a 64-bit word of their own, `vpmultishiftqb` moves code `k` of the
//! word to byte `k` (bit offset `BITS·k`), a mask keeps its bits, and
//! adding `128 − 2^(BITS−1)` gives the centred code offset by 128 (8 bits:
//! the bytes as stored), as the 256-bit kernels' [`Dot::dot_i8`] makes it.
//! Then `vpdpbusd` with the activation codes from the lanes' biases
//! (`−128·Σy`), the lanes' scales times the blocks' group scales (rounded
//! once), and `fma` into `A[b % 4]` (blocks `4g + 2p`, `4g + 2p + 1` in the
//! halves of accumulator `p`): the module doc's arithmetic of [`super`],
//! the same bits as the other levels. Blocks after a row's last whole run
//! of 4 take the portable lanes. The weight bytes are prefetched
//! ([`prefetch_at`]).
//!
//! # Safety
//!
//! As in [`super::avx512`] ("the level was detected"); rows are read
//! through [`chunk`] where [`Rows::new`] and [`drive`] checked their
//! lengths once.

// Functions are passed on wrapped in `#[inline(always)]` closures: a
// function item passed as a value may stay out of line, compiled without the
// level's features (its intrinsics then become calls).
#![allow(clippy::redundant_closure)]

use super::affine::{drive, tail_codes, Scale, ScaleType};
use super::avx512::{fma16, load512, pow_mul, spread_x8, to_array16};
use super::x86::{prefetch_at, prefetch_distance, Avx512Vnni, Dot};
use super::{chunk, Acc, QRow, Rows, Run, RUN};
use crate::error::Result;
use crate::format::RowDecoder;
use half::{bf16, f16};
use std::arch::x86_64::*;

/// The run of `R` activation rows for affine rows of `bits` bits (2, 3, 5,
/// 6 or 8) with scales of dtype `s`.
pub(super) fn run_for<const R: usize>(bits: u32, s: ScaleType) -> Option<Run<R>> {
    macro_rules! by_bits {
        ($s:ty) => {
            match bits {
                2 => Some(run_zmm::<$s, 2, R>),
                3 => Some(run_zmm::<$s, 3, R>),
                5 => Some(run_zmm::<$s, 5, R>),
                6 => Some(run_zmm::<$s, 6, R>),
                8 => Some(run_zmm::<$s, 8, R>),
                _ => None,
            }
        };
    }
    match s {
        ScaleType::F32 => by_bits!(f32),
        ScaleType::F16 => by_bits!(f16),
        ScaleType::Bf16 => by_bits!(bf16),
    }
}

/// The 512-bit run of `BITS`-bit affine rows.
#[allow(clippy::too_many_arguments)] // a Run
fn run_zmm<S: Scale, const BITS: u32, const R: usize>(
    dec: &RowDecoder<'_>,
    e: usize,
    n0: usize,
    n: usize,
    acts: &[&QRow; R],
    scratch: &mut [f32],
    out: &mut [f32],
    stride: usize,
) -> Result<()> {
    Avx512Vnni::enter(
        #[inline(always)]
        move || {
            drive::<S, BITS, R>(
                dec,
                e,
                n0,
                n,
                acts,
                scratch,
                out,
                stride,
                #[inline(always)]
                |row, st, rows, acts, nb| lanes_zmm::<BITS, R>(row, st, rows, acts, nb),
            )
        },
    )
}

/// `vpermb` indices: byte `8i + k` of the result is byte `BITS·i + k` of
/// a pair of blocks (code `8i + k`'s bits start in that word).
const fn word_perm(bits: usize) -> [u8; 64] {
    let mut m = [0u8; 64];
    let mut o = 0;
    while o < 64 {
        let src = bits * (o / 8) + o % 8;
        m[o] = if src < 64 { src } else { 63 } as u8;
        o += 1;
    }
    m
}

/// `vpmultishiftqb` bit offsets: byte `k` of each word from bit `BITS·k`.
const fn word_shift(bits: usize) -> [u8; 64] {
    let mut m = [0u8; 64];
    let mut o = 0;
    while o < 64 {
        m[o] = (bits * (o % 8)) as u8;
        o += 1;
    }
    m
}

/// The codes of blocks `b`, `b + 1` of a row of `BITS`-bit codes, centred
/// and offset by 128 (`q − 2^(BITS−1) + 128`, unsigned bytes), in value
/// order; `perm`, `shift` from [`word_perm`], [`word_shift`].
///
/// # Safety
/// `row` holds at least `4·BITS·(b + 2)` bytes.
#[inline(always)]
unsafe fn pair_codes<const BITS: u32>(
    row: &[u8],
    b: usize,
    perm: __m512i,
    shift: __m512i,
) -> __m512i {
    let bs = 4 * BITS as usize;
    debug_assert!(bs * (b + 2) <= row.len());
    // SAFETY: the masked load reads bytes bs·b..bs·(b + 2) of `row` (the
    // caller's contract; masked-off bytes are not read); the level was
    // detected.
    unsafe {
        let p = row.as_ptr().add(bs * b);
        if BITS == 8 {
            // q − 128 + 128: the bytes as they are.
            return _mm512_loadu_si512(p.cast());
        }
        let mask: __mmask64 = u64::MAX >> (64 - 2 * bs);
        let v = _mm512_maskz_loadu_epi8(mask, p.cast());
        let w = _mm512_permutexvar_epi8(perm, v);
        let q = _mm512_multishift_epi64_epi8(shift, w);
        let q = _mm512_and_si512(q, _mm512_set1_epi8(((1u32 << BITS) - 1) as i8));
        _mm512_add_epi8(
            q,
            _mm512_set1_epi8((128 - (1u32 << (BITS - 1))) as u8 as i8),
        )
    }
}

/// A row's lane accumulators: per run of 4 blocks, two pairs of blocks.
#[inline(always)]
fn lanes_zmm<const BITS: u32, const R: usize>(
    row: &[u8],
    st: &[f32],
    rows: &Rows<'_, R>,
    acts: &[&QRow; R],
    nb: usize,
) -> Option<[(Acc, [f32; RUN]); R]> {
    let bs = 4 * BITS as usize;
    if row.len() != bs * nb || st.len() < nb {
        return None;
    }
    let perm = load512(&const { word_perm(BITS as usize) });
    let shift = load512(&const { word_shift(BITS as usize) });
    let pf = prefetch_distance();
    // SAFETY: no memory is accessed; the level was detected.
    let z = unsafe { _mm512_setzero_ps() };
    // acc[t][p]: blocks 4g + 2p (low half), 4g + 2p + 1 (high half).
    let mut acc = [[z; 2]; R];
    for g in 0..nb / RUN {
        prefetch_at(row, RUN * bs * g, RUN * bs, pf);
        // SAFETY: 4g + 4 ≤ nb ≤ st.len(); the level was detected.
        let sv = unsafe { spread_x8(_mm_loadu_ps(chunk::<f32, 4>(st, RUN * g).as_ptr())) };
        for (p, sv) in sv.into_iter().enumerate() {
            let b = RUN * g + 2 * p;
            // SAFETY: b + 2 ≤ nb, so the row holds bs·(b + 2) bytes.
            let u = unsafe { pair_codes::<BITS>(row, b, perm, shift) };
            for (t, acc) in acc.iter_mut().enumerate() {
                // SAFETY: b + 1 < nb, and `rows` holds nb blocks.
                let (y, c, h) = unsafe {
                    (
                        chunk::<i8, 64>(rows.y[t], 32 * b),
                        chunk::<i32, 16>(rows.bias[t], 8 * b),
                        chunk::<f32, 16>(rows.lscale[t], 8 * b),
                    )
                };
                // SAFETY: no memory is accessed; the level was detected.
                let l = unsafe { _mm512_dpbusd_epi32(load512(c), u, load512(y)) };
                acc[p] = fma16(acc[p], pow_mul(sv, h), l);
            }
        }
    }
    let mut accs = [([[0f32; 8]; RUN], [0f32; RUN]); R];
    for (t, (a, acc)) in accs.iter_mut().zip(acc).enumerate() {
        // A[2p + k] is half k of acc[p].
        for (p, v) in acc.iter().enumerate() {
            for (k, v8) in to_array16(*v).chunks_exact(8).enumerate() {
                a.0.get_mut(2 * p + k)?.copy_from_slice(v8);
            }
        }
        tail_codes::<BITS>(
            &mut a.0,
            row,
            st.get(..nb)?,
            acts.get(t)?,
            nb,
            nb / RUN * RUN,
        )?;
    }
    Some(accs)
}
