//! The 256-bit kernels of the grid and ternary types of [`super::grid`],
//! generic over the level's multiply-add ([`Dot`]: AVX2, AVX-VNNI, and
//! AVX512-VNNI's EVEX forms on 256-bit vectors). Each type only decodes a
//! chunk of 32 weights into two vectors ([`GridX86::chunk_ymm`]): the
//! magnitudes `|q|` (grid bytes looked up from the indices with scalar
//! loads) and the signs as bytes ±1 (IQ2_XXS, IQ2_XS, IQ3_XXS: 8 bytes per
//! 7-bit sign index from [`SIGNS7`], derived from `ksigns_iq2xs`; IQ2_S,
//! IQ3_S: their sign bits spread by a byte shuffle, [`sign_bits`]; IQ1_*
//! and TQ*: `q` itself). Per chunk and activation row, `vpmaddubsw(|q|,
//! sign(y, q))` gives the pair sums `q·y` (16 bits: `|q| ≤ 62`), and
//! [`Dot::dpwssd`] adds them times the 16-bit multipliers `2^s·sc` (the
//! activations' pair multipliers times the group scales, ≤ 496) to the
//! lanes: the integers of the portable kernel, so the results are the same
//! bit for bit.
//!
//! # Safety
//!
//! As in [`super::x86`] ("the level was detected"); rows are read through
//! [`chunk`] where [`Rows::new`] checked their lengths once.

// Functions are passed on wrapped in `#[inline(always)]` closures: a
// function item passed as a value may stay out of line, compiled without the
// level's features (its intrinsics then become calls).
#![allow(clippy::redundant_closure)]

use super::blocks_x86::PAIR_SHUF;
use super::grid::{
    le16, le32, Grid, IQ1_M, IQ1_S, IQ2_S, IQ2_XS, IQ2_XXS, IQ3_S, IQ3_XXS, TQ1_0, TQ2_0,
};
use super::x86::{
    acc_of, fma_lanes, load256, load_x16, prefetch_at, prefetch_distance, splat, zero, Avx2,
    Avx512Vnni, AvxVnni, Dot,
};
use super::{chunk, each_row, finish, run_rows, QRow, Rows, Run, RUN};
use crate::cpu::SimdLevel;
use crate::error::Result;
use crate::format::ggml::iq_grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
};
use crate::format::ggml::GgmlType;
use crate::format::RowDecoder;
use std::arch::x86_64::*;

/// A [`Grid`] type's chunks in vectors.
pub(super) trait GridX86: Grid {
    /// Chunk `c < 8` (values `32c..32c + 32`) of a super-block of `BS`
    /// bytes: `(m, s)` with `m` unsigned bytes ≤ 62 and `s` signed bytes
    /// such that `m·sign(y, s) = q·y` for every byte `y`.
    fn chunk_ymm(blk: &[u8], c: usize) -> Option<(__m256i, __m256i)>;
}

/// `ksigns_iq2xs` spread to bytes: byte `k` of entry `i` is −1 where bit `k`
/// of `ksigns_iq2xs[i]` is set, else 1.
const SIGNS7: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        let s = KSIGNS_IQ2XS[i];
        let mut k = 0;
        while k < 8 {
            let b: u64 = if (s >> k) & 1 != 0 { 0xFF } else { 0x01 };
            t[i] |= b << (8 * k);
            k += 1;
        }
        i += 1;
    }
    t
};

/// The sign bytes of 7-bit sign index `v & 127`.
#[inline(always)]
fn signs7(v: u32) -> u64 {
    SIGNS7[(v & 127) as usize]
}

/// A grid entry (indices are masked below the grid's length: 0 never
/// happens).
#[inline(always)]
fn entry<T: Copy + Default>(g: &[T], i: u32) -> T {
    g.get(i as usize).copied().unwrap_or_default()
}

/// Four 8-byte entries, the first in the low bytes.
#[inline(always)]
fn set4(e: [u64; 4]) -> __m256i {
    // SAFETY: no memory is accessed; the level was detected.
    unsafe { _mm256_set_epi64x(e[3] as i64, e[2] as i64, e[1] as i64, e[0] as i64) }
}

/// Eight 4-byte entries, the first in the low bytes.
#[inline(always)]
fn set8(e: [u32; 8]) -> __m256i {
    let p = |k: usize| u64::from(e[2 * k]) | (u64::from(e[2 * k + 1]) << 32);
    set4([p(0), p(1), p(2), p(3)])
}

/// Bits `0..32` of `bits` as bytes: −1 where set, else 1.
#[inline(always)]
fn sign_bits(bits: u32) -> __m256i {
    // SAFETY: no memory is accessed; the level was detected.
    unsafe {
        let v = _mm256_set1_epi32(bits as i32);
        // Byte k of the result from byte k / 8 of `bits`.
        let shuf = _mm256_setr_epi64x(
            0,
            0x0101_0101_0101_0101,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, shuf), bit), bit);
        _mm256_or_si256(set, _mm256_set1_epi8(1))
    }
}

/// `(|q|, q)`: signed weights `q` as their magnitudes and their own signs.
#[inline(always)]
fn signed(q: __m256i) -> (__m256i, __m256i) {
    // SAFETY: no memory is accessed; the level was detected.
    unsafe { (_mm256_abs_epi8(q), q) }
}

/// `(|q|, q)` of IQ1 weights `q = 8·g + delta`, `g` the grid bytes (−1, 0,
/// 1) and `delta` the bytes ±1.
#[inline(always)]
fn iq1_q(g: __m256i, delta: __m256i) -> (__m256i, __m256i) {
    // SAFETY: no memory is accessed; the level was detected.
    signed(unsafe { _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), g), delta) })
}

/// `(1, q)`: ternary weights `q ∈ {−1, 0, 1}` as their own signs.
#[inline(always)]
fn ternary(q: __m256i) -> (__m256i, __m256i) {
    // SAFETY: no memory is accessed; the level was detected.
    unsafe { (_mm256_set1_epi8(1), q) }
}

impl GridX86 for IQ2_XXS {
    #[inline(always)]
    fn chunk_ymm(blk: &[u8], c: usize) -> Option<(__m256i, __m256i)> {
        let q: &[u8; 8] = blk.get(2 + 8 * c..10 + 8 * c)?.try_into().ok()?;
        let aux = u32::from_le_bytes([q[4], q[5], q[6], q[7]]);
        let g = |l: usize| IQ2XXS_GRID[usize::from(q[l])];
        let s = |l: usize| signs7(aux >> (7 * l));
        Some((
            set4([g(0), g(1), g(2), g(3)]),
            set4([s(0), s(1), s(2), s(3)]),
        ))
    }
}

impl GridX86 for IQ2_XS {
    #[inline(always)]
    fn chunk_ymm(blk: &[u8], c: usize) -> Option<(__m256i, __m256i)> {
        let q: &[u8; 8] = blk.get(2 + 8 * c..10 + 8 * c)?.try_into().ok()?;
        let v = |l: usize| u32::from(u16::from_le_bytes([q[2 * l], q[2 * l + 1]]));
        let g = |l: usize| entry(&IQ2XS_GRID, v(l) & 511);
        let s = |l: usize| signs7(v(l) >> 9);
        Some((
            set4([g(0), g(1), g(2), g(3)]),
            set4([s(0), s(1), s(2), s(3)]),
        ))
    }
}

impl GridX86 for IQ2_S {
    #[inline(always)]
    fn chunk_ymm(blk: &[u8], c: usize) -> Option<(__m256i, __m256i)> {
        let q: &[u8; 4] = blk.get(2 + 4 * c..6 + 4 * c)?.try_into().ok()?;
        let qh = u32::from(*blk.get(66 + c)?);
        let g = |l: usize| entry(&IQ2S_GRID, u32::from(q[l]) | (((qh >> (2 * l)) & 3) << 8));
        let signs = le32(blk, 34 + 4 * c)?;
        Some((set4([g(0), g(1), g(2), g(3)]), sign_bits(signs)))
    }
}

impl GridX86 for IQ3_XXS {
    #[inline(always)]
    fn chunk_ymm(blk: &[u8], c: usize) -> Option<(__m256i, __m256i)> {
        let q: &[u8; 8] = blk.get(2 + 8 * c..10 + 8 * c)?.try_into().ok()?;
        let aux = le32(blk, 66 + 4 * c)?;
        let g = |k: usize| IQ3XXS_GRID[usize::from(q[k])];
        let s = |l: usize| signs7(aux >> (7 * l));
        let m = set8([g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7)]);
        Some((m, set4([s(0), s(1), s(2), s(3)])))
    }
}

impl GridX86 for IQ3_S {
    #[inline(always)]
    fn chunk_ymm(blk: &[u8], c: usize) -> Option<(__m256i, __m256i)> {
        let q: &[u8; 8] = blk.get(2 + 8 * c..10 + 8 * c)?.try_into().ok()?;
        let qh = u32::from(*blk.get(66 + c)?);
        let g = |k: usize| entry(&IQ3S_GRID, u32::from(q[k]) | (((qh >> k) & 1) << 8));
        let m = set8([g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7)]);
        Some((m, sign_bits(le32(blk, 74 + 4 * c)?)))
    }
}

impl GridX86 for IQ1_S {
    #[inline(always)]
    fn chunk_ymm(blk: &[u8], c: usize) -> Option<(__m256i, __m256i)> {
        let q: &[u8; 4] = blk.get(2 + 4 * c..6 + 4 * c)?.try_into().ok()?;
        let qh = le16(blk, 34 + 2 * c)?;
        let g = |l: usize| entry(&IQ1S_GRID, u32::from(q[l]) | (((qh >> (3 * l)) & 7) << 8));
        let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
        // SAFETY: no memory is accessed; the level was detected.
        let delta = unsafe { _mm256_set1_epi8(delta) };
        Some(iq1_q(set4([g(0), g(1), g(2), g(3)]), delta))
    }
}

impl GridX86 for IQ1_M {
    #[inline(always)]
    fn chunk_ymm(blk: &[u8], c: usize) -> Option<(__m256i, __m256i)> {
        let q: &[u8; 4] = blk.get(4 * c..4 * c + 4)?.try_into().ok()?;
        let qh = le16(blk, 32 + 2 * c)?;
        let nib = |l: usize| (qh >> (4 * l)) & 15;
        let g = |l: usize| entry(&IQ1S_GRID, u32::from(q[l]) | ((nib(l) & 7) << 8));
        let d = |l: usize| {
            if nib(l) & 8 != 0 {
                u64::MAX
            } else {
                0x0101_0101_0101_0101
            }
        };
        let grid = set4([g(0), g(1), g(2), g(3)]);
        Some(iq1_q(grid, set4([d(0), d(1), d(2), d(3)])))
    }
}

/// 32 bytes of `b` from `at` in a vector.
#[inline(always)]
fn load_at(b: &[u8], at: usize) -> Option<__m256i> {
    Some(load256(b.get(at..at + 32)?.try_into().ok()?))
}

impl GridX86 for TQ2_0 {
    #[inline(always)]
    fn chunk_ymm(blk: &[u8], c: usize) -> Option<(__m256i, __m256i)> {
        let v = load_at(blk, 32 * (c / 4))?;
        // SAFETY: no memory is accessed; the level was detected.
        let q = unsafe {
            let v = _mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * (c % 4) as i32));
            let u = _mm256_and_si256(v, _mm256_set1_epi8(3));
            _mm256_sub_epi8(u, _mm256_set1_epi8(1))
        };
        // Code 3 (never written by ggml) is q = 2, as the decoder has it.
        Some(signed(q))
    }
}

/// TQ1_0's multipliers `3ⁿ` of chunk `c`'s bytes, as 16-bit lanes (the two
/// bytes of a lane share theirs): chunks 0..5 trit `c` of bytes 0..32;
/// chunks 5, 6 trits `2(c − 5)`, `+ 1` of bytes 32..48; chunk 7 trit 4 of
/// bytes 32..48 and trits 0..4 of bytes 48..52 (4 bytes each).
const TQ1_MUL: [[i16; 16]; 8] = {
    let mut m = [[0i16; 16]; 8];
    let mut c = 0;
    while c < 8 {
        let mut i = 0;
        while i < 16 {
            let n = match c {
                0..5 => c,
                5 | 6 => 2 * (c - 5) + i / 8,
                _ => {
                    if i < 8 {
                        4
                    } else {
                        (i - 8) / 2
                    }
                }
            };
            m[c][i] = 3i16.pow(n as u32);
            i += 1;
        }
        c += 1;
    }
    m
};

impl GridX86 for TQ1_0 {
    #[inline(always)]
    fn chunk_ymm(blk: &[u8], c: usize) -> Option<(__m256i, __m256i)> {
        let b: &[u8; 54] = blk.get(..54)?.try_into().ok()?;
        // SAFETY: the loads read bytes 0..32 and 32..48 of `b`; the pattern
        // is 32 readable bytes; the level was detected.
        let q = unsafe {
            let x = if c < 5 {
                _mm256_loadu_si256(b.as_ptr().cast())
            } else {
                let mid = _mm_loadu_si128(b.as_ptr().add(32).cast());
                let hi = if c < 7 {
                    mid
                } else {
                    _mm_set1_epi32(i32::from_le_bytes([b[48], b[49], b[50], b[51]]))
                };
                _mm256_set_m128i(hi, mid)
            };
            let m = load_x16(&TQ1_MUL[c & 7]);
            // The bytes times 3ⁿ mod 256: even bytes in the low halves of
            // the 16-bit products, odd bytes in the high halves.
            let lo = _mm256_and_si256(_mm256_mullo_epi16(x, m), _mm256_set1_epi16(0xFF));
            let odd = _mm256_and_si256(x, _mm256_set1_epi16(0xFF00_u16 as i16));
            let p = _mm256_or_si256(lo, _mm256_mullo_epi16(odd, m));
            // Trit (3p) >> 8, minus 1: −1 + [p ≥ 86] + [p ≥ 171].
            let ge = |t: i8| _mm256_cmpeq_epi8(_mm256_max_epu8(p, _mm256_set1_epi8(t)), p);
            let q = _mm256_sub_epi8(_mm256_set1_epi8(-1), ge(86));
            _mm256_sub_epi8(q, ge(171u8 as i8))
        };
        Some(ternary(q))
    }
}

/// The run of `R` activation rows for weights of type `t` of
/// [`super::grid`] at an x86 `level` (AVX512-VNNI with its 256-bit forms).
pub(super) fn run_for<const R: usize>(level: SimdLevel, t: GgmlType) -> Option<Run<R>> {
    macro_rules! by_type {
        ($d:ty) => {
            match t {
                GgmlType::IQ2_XXS => Some(run::<IQ2_XXS, $d, R>),
                GgmlType::IQ2_XS => Some(run::<IQ2_XS, $d, R>),
                GgmlType::IQ2_S => Some(run::<IQ2_S, $d, R>),
                GgmlType::IQ3_XXS => Some(run::<IQ3_XXS, $d, R>),
                GgmlType::IQ3_S => Some(run::<IQ3_S, $d, R>),
                GgmlType::IQ1_S => Some(run::<IQ1_S, $d, R>),
                GgmlType::IQ1_M => Some(run::<IQ1_M, $d, R>),
                GgmlType::TQ1_0 => Some(run::<TQ1_0, $d, R>),
                GgmlType::TQ2_0 => Some(run::<TQ2_0, $d, R>),
                _ => None,
            }
        };
    }
    match level {
        SimdLevel::Avx2 => by_type!(Avx2),
        SimdLevel::AvxVnni => by_type!(AvxVnni),
        SimdLevel::Avx512Vnni => by_type!(Avx512Vnni),
        _ => None,
    }
}

/// The run of a [`GridX86`] type at level `D`, inside `D::enter`.
#[allow(clippy::too_many_arguments)] // a Run
fn run<G: GridX86, D: Dot, const R: usize>(
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
            run_rows(
                dec,
                e,
                n0,
                n,
                acts,
                scratch,
                out,
                stride,
                #[inline(always)]
                |b, l, a, s, o, st| rows::<G, D, R>(b, l, a, s, o, st),
            )
        },
    )
}

/// The 16 group scales of a super-block as two vectors of 16-bit lanes:
/// groups 0..8 in both 128-bit halves, groups 8..16 in both halves.
#[inline(always)]
fn scales16(sc: &[i16; 16]) -> (__m256i, __m256i) {
    // SAFETY: `sc` is 32 readable bytes; the level was detected.
    unsafe {
        let p = sc.as_ptr();
        (
            _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast())),
            _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(8).cast())),
        )
    }
}

/// Rows of [`GridX86`] super-blocks (see the module doc).
#[inline(always)]
fn rows<G: GridX86, D: Dot, const R: usize>(
    bytes: &[u8],
    row_len: usize,
    acts: &[&QRow; R],
    _: &mut [f32],
    out: &mut [f32],
    stride: usize,
) -> Option<()> {
    let nb = row_len / G::BS;
    let rows = Rows::new(acts, nb, false)?;
    let pf = prefetch_distance();
    each_row::<R>(
        bytes,
        row_len,
        out,
        stride,
        #[inline(always)]
        |row, out| {
            let mut acc = [[zero(); RUN]; R];
            for (b, blk) in row.chunks_exact(G::BS).enumerate() {
                prefetch_at(blk, 0, G::BS, pf);
                let (sc_lo, sc_hi) = scales16(&G::scales(blk)?);
                // Two integer accumulators per row (alternate chunks).
                // SAFETY: no memory is accessed; the level was detected.
                let mut li = [[unsafe { _mm256_setzero_si256() }; 2]; R];
                for c in 0..8 {
                    let (m, s) = G::chunk_ymm(blk, c)?;
                    let half = if c < 4 { sc_lo } else { sc_hi };
                    // SAFETY: no memory is accessed but the pattern; the
                    // level was detected.
                    let s16 = unsafe { _mm256_shuffle_epi8(half, load256(&PAIR_SHUF[c % 4])) };
                    let at = 256 * b + 32 * c;
                    for (l, (y, p2)) in li.iter_mut().zip(rows.y.iter().zip(rows.pow2)) {
                        // SAFETY: b < nb, and `rows` holds nb blocks; the
                        // pair sums (≤ 2·62·127) and multipliers (≤ 16·31)
                        // fit 16 bits; the level was detected.
                        let (p, k) = unsafe {
                            let y = load256(chunk(y, at));
                            let p = _mm256_maddubs_epi16(m, _mm256_sign_epi8(y, s));
                            (p, _mm256_mullo_epi16(load_x16(chunk(p2, at / 2)), s16))
                        };
                        l[c & 1] = D::dpwssd(l[c & 1], p, k);
                    }
                }
                let d = G::d(blk)?;
                for (t, (acc, l)) in acc.iter_mut().zip(li).enumerate() {
                    // SAFETY: b < nb, and `rows` holds nb scales.
                    let dx = unsafe { *rows.d[t].get_unchecked(b) };
                    // SAFETY: no memory is accessed; the level was detected.
                    let l = unsafe { _mm256_add_epi32(l[0], l[1]) };
                    let a = acc.get_mut(b % RUN)?;
                    *a = fma_lanes(*a, splat(d * dx), l);
                }
            }
            for (o, acc) in out.iter_mut().zip(acc) {
                *o = finish(&acc_of(acc), 0.0);
            }
            Some(())
        },
    )
}
