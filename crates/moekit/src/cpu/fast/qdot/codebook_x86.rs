//! The x86 kernels of the codebook formats ([`super::codebook`]): the
//! nibbles of a run of blocks are looked up into their signed values with a
//! byte shuffle (`vpshufb` of the 16-entry table broadcast to each 128-bit
//! lane), then dotted as Q8_0's signed codes against the interleaved
//! activation codes.
//!
//! - AVX2 / AVX-VNNI ([`Dot`] on 256-bit vectors): a run of 4 blocks as two
//!   pairs, as Q4_0's 256-bit kernel (the 16 code bytes of the pair's
//!   blocks side by side, low nibbles against the first halves, high
//!   nibbles against the second), [`Dot::dot_i8`] of the signed values
//!   with the lane biases.
//! - AVX512-VNNI: a run of 4 blocks per 512-bit vector (the code bytes
//!   picked by `vpermt2b` from two loads for the GGUF blocks, one load for
//!   the contiguous ones), the table holding `kv + 128` so `vpdpbusd`
//!   takes the values as unsigned bytes, started from the lane biases
//!   `−128·Σy`.
//!
//! Blocks after a row's last whole run of 4 take the portable lanes; the
//! arithmetic is the portable kernel's, bit for bit.
//!
//! # Safety
//!
//! As in [`super::x86`] ("the level was detected"). Rows are read through
//! [`chunk`] where [`drive`] checked that each weight row has
//! `Codebook::row_len(nb)` bytes and [`Rows::new`] the activation rows'
//! lengths: for a block `b < nb` the 16 code bytes at `qs_at(b)` lie in the
//! row, for the blocked formats the `4·BS` bytes of a whole run, for the
//! contiguous ones the 64 bytes from `qs_at(4g)` (IQ4_XS: a run is half a
//! super-block's codes; MLX: 16 bytes a block).

// Functions are passed on wrapped in `#[inline(always)]` closures: a
// function item passed as a value may stay out of line, compiled without the
// level's features (its intrinsics then become calls).
#![allow(clippy::redundant_closure)]

use super::avx512::{fma16, load512, pow_mul, spread_x4, to_array16};
use super::codebook::{drive, tail, CbRow, Codebook};
use super::x86::{
    fma_lanes, load256, nibbles, prefetch_at, prefetch_distance, splat2x4, to_array, widen8_f16c,
    zero, Avx2, Avx512Vnni, AvxVnni, Dot,
};
use super::ymm::scale_lanes;
use super::{chunk, Acc, QRow, Rows, Run, RUN};
use crate::cpu::SimdLevel;
use crate::error::Result;
use crate::format::RowDecoder;
use std::arch::x86_64::*;

/// The run of `R` activation rows for weights of format `B` at an x86
/// `level`.
pub(super) fn run_for<B: Codebook, const R: usize>(level: SimdLevel) -> Option<Run<R>> {
    match level {
        SimdLevel::Avx2 => Some(run_ymm::<B, Avx2, R>),
        SimdLevel::AvxVnni => Some(run_ymm::<B, AvxVnni, R>),
        // The 512-bit kernel: bit for bit the portable one on an AVX512-VNNI
        // Xeon (`cargo test --test cpu_qdot_codebook`, 2026-11-28) and
        // 10–20% faster than the 256-bit kernel in EVEX forms there (qwen3
        // T = 1, 2 threads, all five formats); `MOEKIT_CPU_CODEBOOK_ZMM=0`
        // takes the 256-bit one.
        SimdLevel::Avx512Vnni if zmm_on() => Some(run_zmm::<B, R>),
        SimdLevel::Avx512Vnni => Some(run_ymm::<B, Avx512Vnni, R>),
        _ => None,
    }
}

/// Whether the 512-bit kernel runs at the AVX512-VNNI level: unless
/// `MOEKIT_CPU_CODEBOOK_ZMM=0` (read once).
fn zmm_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MOEKIT_CPU_CODEBOOK_ZMM").map_or(true, |v| v != "0"))
}

/// The weight scales of groups `g0..g0 + 8`: F16C for the f16 scales of
/// 18-byte blocks (exact, as the portable widening but for NaN payloads),
/// else the format's own.
#[inline(always)]
fn scales8<B: Codebook>(row: CbRow<'_>, g0: usize) -> [f32; 8] {
    if B::F16_BLOCKS {
        widen8_f16c::<18, 0>(row.sc, g0)
    } else {
        B::scales8(row, g0)
    }
}

/// The 256-bit run at level `D`.
#[allow(clippy::too_many_arguments)] // a Run
fn run_ymm<B: Codebook, D: Dot, const R: usize>(
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
            drive::<B, R>(
                dec,
                e,
                n0,
                n,
                acts,
                scratch,
                out,
                stride,
                #[inline(always)]
                |row, g0| scales8::<B>(row, g0),
                #[inline(always)]
                |row, st, rows, nb| body_ymm::<B, D, R>(row, st, rows, acts, nb),
            )
        },
    )
}

/// The 512-bit run.
#[allow(clippy::too_many_arguments)] // a Run
fn run_zmm<B: Codebook, const R: usize>(
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
            drive::<B, R>(
                dec,
                e,
                n0,
                n,
                acts,
                scratch,
                out,
                stride,
                #[inline(always)]
                |row, g0| scales8::<B>(row, g0),
                #[inline(always)]
                |row, st, rows, nb| body_zmm::<B, R>(row, st, rows, acts, nb),
            )
        },
    )
}

/// The table of `B` in each 128-bit lane of a 256-bit vector, plus `add`
/// (wrapping).
#[inline(always)]
fn table128<B: Codebook>(add: u8) -> __m128i {
    let t: [u8; 16] = B::TABLE.map(|v| (v as u8).wrapping_add(add));
    // SAFETY: `t` is 16 readable bytes; the level was detected.
    unsafe { _mm_loadu_si128(t.as_ptr().cast()) }
}

/// The 16 code bytes of blocks `b0` (low half) and `b0 + 1` (high half).
#[inline(always)]
fn qs_pair<B: Codebook>(qs: &[u8], b0: usize) -> __m256i {
    // SAFETY: b0 + 1 < nb: the code bytes of both blocks lie in the row
    // (module doc); the level was detected.
    unsafe {
        if B::CONTIGUOUS {
            load256(chunk::<u8, 32>(qs, B::qs_at(b0)))
        } else {
            let lo = chunk::<u8, 16>(qs, B::qs_at(b0));
            let hi = chunk::<u8, 16>(qs, B::qs_at(b0 + 1));
            _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128(lo.as_ptr().cast())),
                _mm_loadu_si128(hi.as_ptr().cast()),
                1,
            )
        }
    }
}

/// The lanes' scale products of the pair of blocks `b0`, `b0 + 1` of one
/// activation row (group products from `st[base..]`): lanes 0..4 block
/// `b0`'s, 4..8 block `b0 + 1`'s, the lanes of either half.
#[inline(always)]
fn pair_scales<B: Codebook>(st: &[f32], base: usize, b0: usize) -> __m256 {
    // SAFETY: b0 + 1 < nb, and `st` holds R·GROUPS·nb products from
    // `base` = t·GROUPS·nb; the level was detected.
    unsafe {
        if B::GROUPS == 1 {
            splat2x4(chunk::<f32, 2>(st, base + b0))
        } else {
            let v = _mm_loadu_ps(chunk::<f32, 4>(st, base + 2 * b0).as_ptr());
            let idx = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
            _mm256_permutevar8x32_ps(_mm256_castps128_ps256(v), idx)
        }
    }
}

/// A row's lane accumulators at a 256-bit level.
#[inline(always)]
fn body_ymm<B: Codebook, D: Dot, const R: usize>(
    row: CbRow<'_>,
    st: &[f32],
    rows: &Rows<'_, R>,
    acts: &[&QRow; R],
    nb: usize,
) -> Option<[Acc; R]> {
    let ng = B::GROUPS * nb;
    if st.len() < R * ng {
        return None;
    }
    // SAFETY: no memory is accessed; the level was detected.
    let tbl = unsafe { _mm256_broadcastsi128_si256(table128::<B>(0)) };
    // acc[t][p][h]: pair p of the run, lanes 4h..4h + 4 of its blocks.
    let mut acc = [[[zero(); 2]; 2]; R];
    let pf = prefetch_distance();
    for g in 0..nb / RUN {
        prefetch_at(row.qs, B::qs_at(RUN * g), B::qs_at(RUN) - B::qs_at(0), pf);
        for p in 0..2 {
            let b0 = RUN * g + 2 * p;
            let (lo, hi) = nibbles(qs_pair::<B>(row.qs, b0));
            // SAFETY: no memory is accessed; the level was detected.
            let (wlo, whi) =
                unsafe { (_mm256_shuffle_epi8(tbl, lo), _mm256_shuffle_epi8(tbl, hi)) };
            // Stored first halves of blocks b0, b0 + 1.
            let at = 128 * g + 32 * p;
            for (t, acc) in acc.iter_mut().enumerate() {
                // SAFETY: 4g + 4 ≤ nb, and `rows` holds nb blocks.
                let (y0, y1, c0, c1, m0, m1) = unsafe {
                    (
                        chunk(rows.y[t], at),
                        chunk(rows.y[t], at + 64),
                        chunk(rows.bias[t], at / 4),
                        chunk(rows.bias[t], at / 4 + 16),
                        chunk(rows.lscale[t], at / 4),
                        chunk(rows.lscale[t], at / 4 + 16),
                    )
                };
                let sv = pair_scales::<B>(st, t * ng, b0);
                let l0 = D::dot_i8(wlo, load256(y0), c0);
                let l1 = D::dot_i8(whi, load256(y1), c1);
                acc[p][0] = fma_lanes(acc[p][0], scale_lanes(sv, m0), l0);
                acc[p][1] = fma_lanes(acc[p][1], scale_lanes(sv, m1), l1);
            }
        }
    }
    let mut accs = [[[0f32; 8]; RUN]; R];
    for (t, (a, acc)) in accs.iter_mut().zip(acc).enumerate() {
        // A[2p + k][4h + i] is lane 4k + i of acc[p][h].
        for (p, halves) in acc.iter().enumerate() {
            for (h, v) in halves.iter().enumerate() {
                for (k, v4) in to_array(*v).chunks_exact(4).enumerate() {
                    a[2 * p + k][4 * h..4 * h + 4].copy_from_slice(v4);
                }
            }
        }
        let st = st.get(t * ng..(t + 1) * ng)?;
        tail::<B>(a, row, st, acts.get(t)?, nb, nb / RUN * RUN)?;
    }
    Some(accs)
}

/// `vpermt2b` indices gathering the code bytes of a run of 4 blocks of
/// `bs` bytes (codes from byte `hdr` of each) from the run's bytes
/// `0..64` (indices 0..64) and `4·bs − 64..4·bs` (64..128), side by side;
/// zeros where the sizes do not allow it (`4·bs < 64` or `hdr + 16 > bs`).
const fn blocked_index(bs: usize, hdr: usize) -> [u8; 64] {
    let mut m = [0u8; 64];
    if 4 * bs < 64 || hdr + 16 > bs {
        return m;
    }
    let mut o = 0;
    while o < 64 {
        let src = hdr + bs * (o / 16) + o % 16;
        m[o] = if src < 64 {
            src
        } else {
            64 + src - (4 * bs - 64)
        } as u8;
        o += 1;
    }
    m
}

/// The 64 code bytes of run `g` (blocks `4g..4g + 4`, 16 each).
#[inline(always)]
fn qs_run<B: Codebook>(qs: &[u8], g: usize, idx: __m512i) -> __m512i {
    // SAFETY: 4g + 4 ≤ nb: the run's bytes lie in the row (module doc); the
    // level was detected.
    unsafe {
        if B::CONTIGUOUS {
            load512(chunk::<u8, 64>(qs, B::qs_at(RUN * g)))
        } else {
            let base = RUN * g * B::BS;
            let a = load512(chunk::<u8, 64>(qs, base));
            let b = load512(chunk::<u8, 64>(qs, base + RUN * B::BS - 64));
            _mm512_permutex2var_epi8(a, idx, b)
        }
    }
}

/// The lanes' scale products of run `g` of one activation row (group
/// products from `st[base..]`): lanes `4k..4k + 4` block `4g + k`'s, the
/// lanes of either half.
#[inline(always)]
fn run_scales<B: Codebook>(st: &[f32], base: usize, g: usize) -> __m512 {
    // SAFETY: 4g + 4 ≤ nb, and `st` holds R·GROUPS·nb products from
    // `base` = t·GROUPS·nb; the level was detected.
    unsafe {
        if B::GROUPS == 1 {
            spread_x4(_mm_loadu_ps(chunk::<f32, 4>(st, base + 4 * g).as_ptr()))
        } else {
            let v = _mm256_loadu_ps(chunk::<f32, 8>(st, base + 8 * g).as_ptr());
            let idx = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
            _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(v))
        }
    }
}

/// A row's lane accumulators at the AVX512-VNNI level.
#[inline(always)]
fn body_zmm<B: Codebook, const R: usize>(
    row: CbRow<'_>,
    st: &[f32],
    rows: &Rows<'_, R>,
    acts: &[&QRow; R],
    nb: usize,
) -> Option<[Acc; R]> {
    let ng = B::GROUPS * nb;
    if st.len() < R * ng {
        return None;
    }
    let idx_bytes = const { blocked_index(B::BS, B::HDR) };
    // SAFETY: `idx_bytes` is 64 readable bytes; the level was detected.
    let (tbl, idx, m4, z) = unsafe {
        (
            _mm512_broadcast_i32x4(table128::<B>(128)),
            load512(&idx_bytes),
            _mm512_set1_epi8(15),
            _mm512_setzero_ps(),
        )
    };
    // acc[t][h]: lanes 4k + i are lanes 4h + i of block k of the run.
    let mut acc = [[z; 2]; R];
    let pf = prefetch_distance();
    for g in 0..nb / RUN {
        prefetch_at(row.qs, B::qs_at(RUN * g), B::qs_at(RUN) - B::qs_at(0), pf);
        let q = qs_run::<B>(row.qs, g, idx);
        // The values plus 128, unsigned.
        // SAFETY: no memory is accessed; the level was detected.
        let (ulo, uhi) = unsafe {
            let lo = _mm512_and_si512(q, m4);
            let hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
            (_mm512_shuffle_epi8(tbl, lo), _mm512_shuffle_epi8(tbl, hi))
        };
        for (t, acc) in acc.iter_mut().enumerate() {
            // SAFETY: 4g + 4 ≤ nb, and `rows` holds nb blocks.
            let (y0, y1, c0, c1, h0, h1) = unsafe {
                (
                    chunk::<i8, 64>(rows.y[t], 128 * g),
                    chunk::<i8, 64>(rows.y[t], 128 * g + 64),
                    chunk::<i32, 16>(rows.bias[t], 32 * g),
                    chunk::<i32, 16>(rows.bias[t], 32 * g + 16),
                    chunk::<f32, 16>(rows.lscale[t], 32 * g),
                    chunk::<f32, 16>(rows.lscale[t], 32 * g + 16),
                )
            };
            let sv = run_scales::<B>(st, t * ng, g);
            // (kv + 128)·y − 128·Σy, exact.
            // SAFETY: no memory is accessed; the level was detected.
            let (l0, l1) = unsafe {
                (
                    _mm512_dpbusd_epi32(load512(c0), ulo, load512(y0)),
                    _mm512_dpbusd_epi32(load512(c1), uhi, load512(y1)),
                )
            };
            acc[0] = fma16(acc[0], pow_mul(sv, h0), l0);
            acc[1] = fma16(acc[1], pow_mul(sv, h1), l1);
        }
    }
    let mut accs = [[[0f32; 8]; RUN]; R];
    for (t, (a, acc)) in accs.iter_mut().zip(acc).enumerate() {
        // A[k][4h + i] is lane 4k + i of acc[h].
        for (h, v) in acc.iter().enumerate() {
            for (k, v4) in to_array16(*v).chunks_exact(4).enumerate() {
                a[k][4 * h..4 * h + 4].copy_from_slice(v4);
            }
        }
        let st = st.get(t * ng..(t + 1) * ng)?;
        tail::<B>(a, row, st, acts.get(t)?, nb, nb / RUN * RUN)?;
    }
    Some(accs)
}

#[cfg(test)]
mod tests {
    use super::super::codebook::{Codebook, Iq4Nl, Mxfp4};
    use super::blocked_index;

    /// `vpermt2b` of [`blocked_index`] emulated on a run's bytes (the
    /// 512-bit kernel runs only on AVX512-VNNI machines): byte `16k + i`
    /// is byte `i` of block `k`'s codes.
    fn picks_the_codes<B: Codebook>() {
        let run: Vec<u8> = (0..4 * B::BS).map(|i| i as u8).collect();
        let idx = blocked_index(B::BS, B::HDR);
        let (a, b) = (&run[..64], &run[4 * B::BS - 64..]);
        for (o, &j) in idx.iter().enumerate() {
            let j = usize::from(j);
            let got = if j < 64 { a[j] } else { b[j - 64] };
            assert_eq!(usize::from(got), B::qs_at(o / 16) + o % 16, "byte {o}");
        }
    }

    #[test]
    fn blocked_index_picks_the_code_bytes() {
        picks_the_codes::<Iq4Nl>();
        picks_the_codes::<Mxfp4>();
        assert_eq!(blocked_index(0, 0), [0; 64]);
    }
}
