//! The x86 lanes of 4-bit MLX affine rows ([`super::affine`]): a row's
//! codes are 16 contiguous bytes per block of 32 (no scales between), so
//! the 256-bit kernels split a pair of blocks (32 bytes) and the 512-bit
//! kernels a run of 4 (64 bytes) into low nibbles (the blocks' even codes)
//! and high nibbles (odd codes), against the activations' interleaved even
//! and odd halves; `vpdpbusd(0, q, y)`, the lanes' scales, the offsets
//! and the accumulators as Q4_0's. Blocks after the last whole
//! run of 4 take the portable lanes.
//!
//! # Safety
//!
//! As in [`super::x86`] ("the level was detected"); rows are read through
//! [`chunk`] where [`Rows::new`] checked their lengths once.

// Functions are passed on wrapped in `#[inline(always)]` closures: a
// function item passed as a value may stay out of line, compiled without the
// level's features (its intrinsics then become calls).
#![allow(clippy::redundant_closure)]

use super::affine::{drive, tail_blocks, Scale, ScaleType};
use super::x86::{
    fma_lanes, load256, nibbles, prefetch_at, prefetch_distance, prefetch_span, splat2x4, to_array,
    zero, Avx2, Avx512Vnni, AvxVnni, Dot,
};
use super::ymm::{scale_lanes, to_array4};
use super::{chunk, Acc, QRow, Rows, Run, RUN};
use crate::cpu::SimdLevel;
use crate::error::Result;
use crate::format::RowDecoder;
use half::{bf16, f16};
use std::arch::x86_64::*;

/// The run of `R` activation rows for affine rows of `bits` bits with
/// scales of dtype `s` at an x86 `level`.
pub(super) fn run_for<const R: usize>(level: SimdLevel, bits: u32, s: ScaleType) -> Option<Run<R>> {
    if bits != 4 {
        if level == SimdLevel::Avx512Vnni {
            return super::affine_zmm::run_for::<R>(bits, s);
        }
        return super::blocks_x86::affine_run_for::<R>(level, bits, s);
    }
    macro_rules! by_scale {
        ($run:ident $(, $d:ty)?) => {
            match s {
                ScaleType::F32 => Some($run::<$($d,)? f32, R>),
                ScaleType::F16 => Some($run::<$($d,)? f16, R>),
                ScaleType::Bf16 => Some($run::<$($d,)? bf16, R>),
            }
        };
    }
    match level {
        SimdLevel::Avx2 => by_scale!(run_ymm, Avx2),
        SimdLevel::AvxVnni => by_scale!(run_ymm, AvxVnni),
        SimdLevel::Avx512Vnni => by_scale!(run_zmm),
        _ => None,
    }
}

/// The 256-bit run at level `D`.
#[allow(clippy::too_many_arguments)] // a Run
fn run_ymm<D: Dot, S: Scale, const R: usize>(
    dec: &RowDecoder<'_>,
    e: usize,
    n0: usize,
    n: usize,
    acts: &[&QRow; R],
    scratch: &mut [f32],
    out: &mut [f32],
    stride: usize,
) -> Result<()> {
    D::enter(
        #[inline(always)]
        move || {
            drive::<S, 4, R>(
                dec,
                e,
                n0,
                n,
                acts,
                scratch,
                out,
                stride,
                #[inline(always)]
                |row, st, rows, acts, nb| lanes_ymm::<D, R>(row, st, rows, acts, nb),
            )
        },
    )
}

/// A row's lane accumulators, a pair of blocks per 256-bit vector.
#[inline(always)]
fn lanes_ymm<D: Dot, const R: usize>(
    row: &[u8],
    st: &[f32],
    rows: &Rows<'_, R>,
    acts: &[&QRow; R],
    nb: usize,
) -> Option<[(Acc, [f32; RUN]); R]> {
    if row.len() != 16 * nb || st.len() < nb {
        return None;
    }
    // acc[t][p][h]: pair p of the run, lanes 4h..4h + 4 of its blocks;
    // off[t]: the offsets O[0..4].
    let mut acc = [[[zero(); 2]; 2]; R];
    // SAFETY: no memory is accessed; the level was detected.
    let mut off = [unsafe { _mm_setzero_ps() }; R];
    let pf = prefetch_distance();
    for (g, run) in row.chunks_exact(64).enumerate() {
        prefetch_at(run, 0, 64, pf);
        for (p, two) in run.chunks_exact(32).enumerate() {
            let (lo, hi) = nibbles(load256(two.try_into().ok()?));
            // Stored even halves of blocks 4g + 2p, 4g + 2p + 1.
            let at = 128 * g + 32 * p;
            for (t, acc) in acc.iter_mut().enumerate() {
                // SAFETY: g < nb/4, and `rows` holds nb blocks, `st` nb scales.
                let (y0, y1, m0, m1, s2) = unsafe {
                    (
                        chunk(rows.y[t], at),
                        chunk(rows.y[t], at + 64),
                        chunk(rows.lscale[t], at / 4),
                        chunk(rows.lscale[t], at / 4 + 16),
                        chunk(st, 4 * g + 2 * p),
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
            *off = offsets4(*off, st, rows, t, nb, g);
        }
    }
    let mut accs = [([[0f32; 8]; RUN], [0f32; RUN]); R];
    for (t, ((a, acc), off)) in accs.iter_mut().zip(acc).zip(off).enumerate() {
        // A[2p + k][4h + i] is lane 4k + i of acc[p][h].
        for (p, halves) in acc.iter().enumerate() {
            for (h, v) in halves.iter().enumerate() {
                for (k, v4) in to_array(*v).chunks_exact(4).enumerate() {
                    a.0[2 * p + k][4 * h..4 * h + 4].copy_from_slice(v4);
                }
            }
        }
        a.1 = to_array4(off);
        let st = st.get(..nb)?;
        tail_blocks(a, row, st, acts.get(t)?, nb, nb / RUN * RUN)?;
    }
    Some(accs)
}

/// `O[0..4] + s[4g..4g + 4]·boff[4g..4g + 4]` (fused) of activation row `t`:
/// the offsets of run `g`.
#[inline(always)]
fn offsets4<const R: usize>(
    off: __m128,
    st: &[f32],
    rows: &Rows<'_, R>,
    t: usize,
    _nb: usize,
    g: usize,
) -> __m128 {
    // SAFETY: 4g + 4 ≤ nb; `st` holds nb scales and `rows` nb offsets
    // (checked by the callers); the level was detected.
    unsafe {
        let s4 = chunk::<f32, 4>(st, 4 * g);
        let o4 = chunk::<f32, 4>(rows.boff[t], 4 * g);
        _mm_fmadd_ps(_mm_loadu_ps(s4.as_ptr()), _mm_loadu_ps(o4.as_ptr()), off)
    }
}

/// The 512-bit run.
#[allow(clippy::too_many_arguments)] // a Run
fn run_zmm<S: Scale, const R: usize>(
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
            drive::<S, 4, R>(
                dec,
                e,
                n0,
                n,
                acts,
                scratch,
                out,
                stride,
                #[inline(always)]
                |row, st, rows, acts, nb| lanes_zmm::<R>(row, st, rows, acts, nb),
            )
        },
    )
}

/// A row's lane accumulators, a run of 4 blocks per 512-bit vector.
#[inline(always)]
fn lanes_zmm<const R: usize>(
    row: &[u8],
    st: &[f32],
    rows: &Rows<'_, R>,
    acts: &[&QRow; R],
    nb: usize,
) -> Option<[(Acc, [f32; RUN]); R]> {
    if row.len() != 16 * nb || st.len() < nb {
        return None;
    }
    // SAFETY: no memory is accessed; the level was detected.
    let (z, zo) = unsafe { (_mm512_setzero_ps(), _mm_setzero_ps()) };
    let mut acc = [[z; 2]; R];
    let mut off = [zo; R];
    let pf = prefetch_distance();
    for (g, run) in row.chunks_exact(64).enumerate() {
        let run: &[u8; 64] = run.try_into().ok()?;
        prefetch_span(run, pf);
        // SAFETY: `run` is 64 readable bytes; the level was detected.
        let (lo, hi) = unsafe {
            let x = _mm512_loadu_si512(run.as_ptr().cast());
            let m4 = _mm512_set1_epi8(15);
            (
                _mm512_and_si512(x, m4),
                _mm512_and_si512(_mm512_srli_epi16(x, 4), m4),
            )
        };
        for (t, acc) in acc.iter_mut().enumerate() {
            // SAFETY: g < nb/4, and `rows` holds nb blocks, `st` nb scales;
            // the level was detected.
            unsafe {
                let y0 = chunk::<i8, 64>(rows.y[t], 128 * g);
                let y1 = chunk::<i8, 64>(rows.y[t], 128 * g + 64);
                let p0 = chunk::<f32, 16>(rows.lscale[t], 32 * g);
                let p1 = chunk::<f32, 16>(rows.lscale[t], 32 * g + 16);
                let s4 = chunk::<f32, 4>(st, 4 * g);
                let idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
                let sv =
                    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_loadu_ps(s4.as_ptr())));
                let zi = _mm512_setzero_si512();
                let l0 = _mm512_dpbusd_epi32(zi, lo, _mm512_loadu_si512(y0.as_ptr().cast()));
                let l1 = _mm512_dpbusd_epi32(zi, hi, _mm512_loadu_si512(y1.as_ptr().cast()));
                // The lanes' scale products s·m.
                let f0 = _mm512_mul_ps(sv, _mm512_loadu_ps(p0.as_ptr()));
                let f1 = _mm512_mul_ps(sv, _mm512_loadu_ps(p1.as_ptr()));
                acc[0] = _mm512_fmadd_ps(f0, _mm512_cvtepi32_ps(l0), acc[0]);
                acc[1] = _mm512_fmadd_ps(f1, _mm512_cvtepi32_ps(l1), acc[1]);
            }
        }
        for (t, off) in off.iter_mut().enumerate() {
            *off = offsets4(*off, st, rows, t, nb, g);
        }
    }
    let mut accs = [([[0f32; 8]; RUN], [0f32; RUN]); R];
    for (t, ((a, acc), off)) in accs.iter_mut().zip(acc).zip(off).enumerate() {
        // A[k][4h + i] is lane 4k + i of acc[h].
        for (h, v) in acc.iter().enumerate() {
            let mut l = [0f32; 16];
            // SAFETY: `l` is 16 writable f32; the level was detected.
            unsafe { _mm512_storeu_ps(l.as_mut_ptr(), *v) };
            for (k, v4) in l.chunks_exact(4).enumerate() {
                a.0[k][4 * h..4 * h + 4].copy_from_slice(v4);
            }
        }
        a.1 = to_array4(off);
        let st = st.get(..nb)?;
        tail_blocks(a, row, st, acts.get(t)?, nb, nb / RUN * RUN)?;
    }
    Some(accs)
}
