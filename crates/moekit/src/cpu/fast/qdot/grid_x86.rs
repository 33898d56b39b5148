//! The 256-bit kernels of the grid and ternary types of [`super::grid`],
//! generic over the level's multiply-add ([`Dot`]: AVX2, AVX-VNNI, and
//! AVX512-VNNI's EVEX forms on 256-bit vectors). Each type only decodes a
//! chunk of 32 weights into two vectors ([`GridX86::chunk_ymm`]) and its
//! super-block's 16 group scales into two ([`GridX86::scales_ymm`]): the
//! magnitudes `|q|` are grid bytes, looked up with scalar loads (IQ2_XXS,
//! IQ2_XS, IQ2_S, IQ1_S, IQ1_M: four 8-byte entries a chunk, measured faster
//! than AVX2 gathers of 4 on Zen 4 — IQ2_S 22.0 → 18.2, IQ1_S 25.4 → 21.3,
//! IQ1_M 27.8 → 23.1 ns a super-block in cache) or AVX2 gathers (IQ3_XXS,
//! IQ3_S: 8 entries of 4 bytes, 20% faster than scalar loads); the signs
//! are bytes ±1: the 7-bit `ksigns_iq2xs` indices of IQ2_XXS, IQ2_XS,
//! IQ3_XXS spread to their bytes with the eighth sign their parity
//! ([`signs7_at`], no table; for IQ2_XS a 128-entry table,
//! [`signs7_table`]), the sign bits of IQ2_S, IQ3_S spread by a byte
//! shuffle ([`sign_bits`]),
//! IQ1_* and TQ* `q` itself. Per chunk and activation row, `vpmaddubsw(|q|,
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
use super::{chunk, each_row, finish, QRow, Rows, Run, RUN};
use crate::cpu::SimdLevel;
use crate::format::ggml::iq_grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID,
};
use crate::format::ggml::GgmlType;
use std::arch::x86_64::*;

/// A [`Grid`] type's chunks in vectors.
pub(super) trait GridX86: Grid {
    /// Chunk `c < 8` (values `32c..32c + 32`) of a super-block of `BS`
    /// bytes: `(m, s)` with `m` unsigned bytes ≤ 62 and `s` signed bytes
    /// such that `m·sign(y, s) = q·y` for every byte `y`.
    fn chunk_ymm(blk: &[u8], c: usize) -> Option<(__m256i, __m256i)>;
    /// The 16 group scales as [`scales16`] has them.
    #[inline(always)]
    fn scales_ymm(blk: &[u8]) -> Option<(__m256i, __m256i)> {
        Some(scales16(&Self::scales(blk)?))
    }
}

/// The 16 group scales of the types with one scale per 32 from the 8
/// scales' `ls` (32-bit lanes, in the order `order[c]` is lane of chunk
/// `c`): `2·ls + 1` as [`scales16`] has them.
#[inline(always)]
fn per32_ymm(ls: __m256i, order: [i32; 8]) -> (__m256i, __m256i) {
    // SAFETY: no memory is accessed; the level was detected.
    unsafe {
        let s = _mm256_add_epi32(_mm256_add_epi32(ls, ls), _mm256_set1_epi32(1));
        let o = |a: usize| {
            let (w, x, y, z) = (order[a], order[a + 1], order[a + 2], order[a + 3]);
            let v = _mm256_permutevar8x32_epi32(s, _mm256_setr_epi32(w, x, y, z, w, x, y, z));
            // Each 32-bit lane's value in both of its 16-bit halves.
            _mm256_or_si256(v, _mm256_slli_epi32::<16>(v))
        };
        (o(0), o(4))
    }
}

/// The 16 nibble scales (per 16) of IQ2_XS and IQ2_S, 8 bytes at `at`, as
/// [`scales16`] has them.
#[inline(always)]
fn nibbles16_ymm(blk: &[u8], at: usize) -> Option<(__m256i, __m256i)> {
    let b: &[u8; 8] = blk.get(at..at + 8)?.try_into().ok()?;
    // SAFETY: `b` is 8 readable bytes; the level was detected.
    Some(unsafe {
        let v = _mm_loadl_epi64(b.as_ptr().cast());
        let m = _mm_set1_epi8(15);
        let n = _mm_unpacklo_epi8(
            _mm_and_si128(v, m),
            _mm_and_si128(_mm_srli_epi16::<4>(v), m),
        );
        let s = _mm256_cvtepu8_epi16(n);
        let s = _mm256_add_epi16(_mm256_add_epi16(s, s), _mm256_set1_epi16(1));
        (
            _mm256_permute4x64_epi64::<0b01_00_01_00>(s),
            _mm256_permute4x64_epi64::<0b11_10_11_10>(s),
        )
    })
}

/// Four 8-byte entries, the first in the low bytes.
#[inline(always)]
fn set4(e: [u64; 4]) -> __m256i {
    // SAFETY: no memory is accessed; the level was detected.
    unsafe { _mm256_set_epi64x(e[3] as i64, e[2] as i64, e[1] as i64, e[0] as i64) }
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

/// The 4-byte entries of `grid` at the 8 indices `i` (32-bit lanes), by an
/// AVX2 gather.
///
/// # Safety
/// Every index is below `grid.len()`; the level was detected.
#[inline(always)]
unsafe fn gather8(grid: &[u32], i: __m256i) -> __m256i {
    // SAFETY: the entries read are in `grid` (the caller's contract).
    unsafe { _mm256_i32gather_epi32::<4>(grid.as_ptr().cast(), i) }
}

/// `(v >> shifts[l]) & mask` in each of 4 32-bit lanes, `v` in all.
#[inline(always)]
fn fields4(v: u32, shifts: [i32; 4], mask: i32) -> __m128i {
    // SAFETY: no memory is accessed; the level was detected.
    unsafe {
        let s = _mm_setr_epi32(shifts[0], shifts[1], shifts[2], shifts[3]);
        _mm_and_si128(
            _mm_srlv_epi32(_mm_set1_epi32(v as i32), s),
            _mm_set1_epi32(mask),
        )
    }
}

/// The sign bytes of the four 7-bit sign indices at bits 0, 7, 14 and 21
/// of `aux` (`ksigns_iq2xs` without its table: byte `k` is −1 where bit
/// `k` of the signs is set, else 1): index `l` shifted to the low byte of 64-bit
/// lane `l` and spread to its 8 bytes, bit 7 replaced by the parity of
/// bits 0..7 (two 16-entry nibble-parity lookups), then each byte's bit
/// `k` tested.
#[inline(always)]
fn signs4_simd(aux: u32) -> __m256i {
    signs7_at(u64::from(aux), [0, 7, 14, 21])
}

/// The sign bytes of the four 7-bit sign indices at bits `at[l]` of `v`
/// ([`signs4_simd`]).
#[inline(always)]
fn signs7_at(v: u64, at: [i64; 4]) -> __m256i {
    /// 0x80 where a nibble's parity is odd.
    const PARITY: [u8; 32] = {
        let mut t = [0u8; 32];
        let mut i = 0;
        while i < 32 {
            t[i] = if (i % 16).count_ones() % 2 == 1 {
                0x80
            } else {
                0
            };
            i += 1;
        }
        t
    };
    // SAFETY: no memory is accessed but the table; the level was detected.
    unsafe {
        let v = _mm256_srlv_epi64(
            _mm256_set1_epi64x(v as i64),
            _mm256_setr_epi64x(at[0], at[1], at[2], at[3]),
        );
        let spread = _mm256_setr_epi64x(0, 0x0808_0808_0808_0808, 0, 0x0808_0808_0808_0808);
        let b = _mm256_shuffle_epi8(v, spread);
        let par = load256(&PARITY);
        let lo = _mm256_shuffle_epi8(par, _mm256_and_si256(b, _mm256_set1_epi8(0x0F)));
        let hi4 = _mm256_and_si256(_mm256_srli_epi16::<4>(b), _mm256_set1_epi8(0x07));
        let p = _mm256_xor_si256(lo, _mm256_shuffle_epi8(par, hi4));
        let s = _mm256_or_si256(_mm256_and_si256(b, _mm256_set1_epi8(0x7F)), p);
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(s, bit), bit);
        _mm256_or_si256(set, _mm256_set1_epi8(1))
    }
}

/// Sign bytes of each 7-bit `ksigns_iq2xs` index: byte `k` is −1 (0xFF)
/// where bit `k` of the index with its parity as bit 7 is set, else 1.
const SIGN_BYTES: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut i = 0usize;
    while i < 128 {
        let s = i | ((i.count_ones() as usize % 2) << 7);
        let mut b = 0u64;
        let mut k = 0;
        while k < 8 {
            let byte: u64 = if (s >> k) & 1 == 1 { 0xFF } else { 0x01 };
            b |= byte << (8 * k);
            k += 1;
        }
        t[i] = b;
        i += 1;
    }
    t
};

/// [`signs7_at`]'s bytes by four lookups of [`SIGN_BYTES`]: faster for
/// IQ2_XS, whose indices sit in the same 64-bit word as its grid indices
/// (in cache, Zen 4, ns a super-block: 25.6 → 21.4), slower for IQ2_XXS and
/// IQ3_XXS (21.4 → 23.3, 30.4 → 35.0), which keep the vector form.
#[inline(always)]
fn signs7_table(v: u64, at: [u32; 4]) -> __m256i {
    let s = |l: usize| SIGN_BYTES[((v >> at[l]) & 127) as usize];
    set4([s(0), s(1), s(2), s(3)])
}

/// 8 bytes of `b` from `at`, zero-extended to 32-bit lanes.
#[inline(always)]
fn bytes8(b: &[u8], at: usize) -> Option<__m256i> {
    let v: &[u8; 8] = b.get(at..at + 8)?.try_into().ok()?;
    // SAFETY: `v` is 8 readable bytes; the level was detected.
    Some(unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(v.as_ptr().cast())) })
}

impl GridX86 for IQ2_XXS {
    #[inline(always)]
    fn scales_ymm(blk: &[u8]) -> Option<(__m256i, __m256i)> {
        let (a, b) = (load_at(blk, 2)?, load_at(blk, 34)?);
        // SAFETY: no memory is accessed; the level was detected.
        let ls = unsafe {
            // The top 4 bits of each 8 bytes: chunks 0..4 of `a`, 4..8 of
            // `b`, interleaved.
            let (a, b) = (_mm256_srli_epi64::<60>(a), _mm256_srli_epi64::<60>(b));
            _mm256_or_si256(a, _mm256_slli_epi64::<32>(b))
        };
        Some(per32_ymm(ls, [0, 2, 4, 6, 1, 3, 5, 7]))
    }
    #[inline(always)]
    fn chunk_ymm(blk: &[u8], c: usize) -> Option<(__m256i, __m256i)> {
        let q: &[u8; 8] = blk.get(2 + 8 * c..10 + 8 * c)?.try_into().ok()?;
        let aux = u32::from_le_bytes([q[4], q[5], q[6], q[7]]);
        // Scalar loads: faster than a gather of 4 entries.
        let g = |l: usize| IQ2XXS_GRID[usize::from(q[l])];
        Some((set4([g(0), g(1), g(2), g(3)]), signs4_simd(aux)))
    }
}

impl GridX86 for IQ2_XS {
    #[inline(always)]
    fn scales_ymm(blk: &[u8]) -> Option<(__m256i, __m256i)> {
        nibbles16_ymm(blk, 66)
    }
    #[inline(always)]
    fn chunk_ymm(blk: &[u8], c: usize) -> Option<(__m256i, __m256i)> {
        let q: &[u8; 8] = blk.get(2 + 8 * c..10 + 8 * c)?.try_into().ok()?;
        let v = u64::from_le_bytes(*q);
        // Scalar loads: faster than a gather of 4 entries.
        let g = |l: usize| IQ2XS_GRID[((v >> (16 * l)) & 511) as usize];
        Some((
            set4([g(0), g(1), g(2), g(3)]),
            signs7_table(v, [9, 25, 41, 57]),
        ))
    }
}

impl GridX86 for IQ2_S {
    #[inline(always)]
    fn scales_ymm(blk: &[u8]) -> Option<(__m256i, __m256i)> {
        nibbles16_ymm(blk, 74)
    }
    #[inline(always)]
    fn chunk_ymm(blk: &[u8], c: usize) -> Option<(__m256i, __m256i)> {
        let q: &[u8; 4] = blk.get(2 + 4 * c..6 + 4 * c)?.try_into().ok()?;
        let h = usize::from(*blk.get(66 + c)?);
        // Scalar loads (indices of 8 + 2 bits, below the grid's 1024 entries).
        let g = |l: usize| IQ2S_GRID[usize::from(q[l]) | (((h >> (2 * l)) & 3) << 8)];
        Some((
            set4([g(0), g(1), g(2), g(3)]),
            sign_bits(le32(blk, 34 + 4 * c)?),
        ))
    }
}

impl GridX86 for IQ3_XXS {
    #[inline(always)]
    fn scales_ymm(blk: &[u8]) -> Option<(__m256i, __m256i)> {
        let v = load_at(blk, 66)?;
        // SAFETY: no memory is accessed; the level was detected.
        let ls = unsafe { _mm256_srli_epi32::<28>(v) };
        Some(per32_ymm(ls, [0, 1, 2, 3, 4, 5, 6, 7]))
    }
    #[inline(always)]
    fn chunk_ymm(blk: &[u8], c: usize) -> Option<(__m256i, __m256i)> {
        let i = bytes8(blk, 2 + 8 * c)?;
        // SAFETY: the indices are bytes, below the grid's 256 entries; the
        // level was detected.
        let m = unsafe { gather8(&IQ3XXS_GRID, i) };
        Some((m, signs4_simd(le32(blk, 66 + 4 * c)?)))
    }
}

impl GridX86 for IQ3_S {
    #[inline(always)]
    fn scales_ymm(blk: &[u8]) -> Option<(__m256i, __m256i)> {
        let v = le32(blk, 106)?;
        // SAFETY: no memory is accessed; the level was detected.
        let ls = unsafe {
            let k = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
            let v = _mm256_srlv_epi32(_mm256_set1_epi32(v as i32), k);
            _mm256_and_si256(v, _mm256_set1_epi32(15))
        };
        Some(per32_ymm(ls, [0, 1, 2, 3, 4, 5, 6, 7]))
    }
    #[inline(always)]
    fn chunk_ymm(blk: &[u8], c: usize) -> Option<(__m256i, __m256i)> {
        let lo = bytes8(blk, 2 + 8 * c)?;
        let qh = i32::from(*blk.get(66 + c)?);
        // SAFETY: the indices (8 + 1 bits) are below the grid's 512
        // entries; the level was detected.
        let m = unsafe {
            let k = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let h = _mm256_and_si256(
                _mm256_srlv_epi32(_mm256_set1_epi32(qh), k),
                _mm256_set1_epi32(1),
            );
            gather8(&IQ3S_GRID, _mm256_or_si256(lo, _mm256_slli_epi32::<8>(h)))
        };
        Some((m, sign_bits(le32(blk, 74 + 4 * c)?)))
    }
}

impl GridX86 for IQ1_S {
    #[inline(always)]
    fn scales_ymm(blk: &[u8]) -> Option<(__m256i, __m256i)> {
        let q: &[u8; 16] = blk.get(34..50)?.try_into().ok()?;
        // SAFETY: `q` is 16 readable bytes; the level was detected.
        let ls = unsafe {
            let v = _mm256_cvtepu16_epi32(_mm_loadu_si128(q.as_ptr().cast()));
            _mm256_and_si256(_mm256_srli_epi32::<12>(v), _mm256_set1_epi32(7))
        };
        Some(per32_ymm(ls, [0, 1, 2, 3, 4, 5, 6, 7]))
    }
    #[inline(always)]
    fn chunk_ymm(blk: &[u8], c: usize) -> Option<(__m256i, __m256i)> {
        let q: &[u8; 4] = blk.get(2 + 4 * c..6 + 4 * c)?.try_into().ok()?;
        let qh = le16(blk, 34 + 2 * c)?;
        let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
        // Scalar loads (indices of 8 + 3 bits, below the grid's 2048 entries).
        let g = |l: usize| IQ1S_GRID[usize::from(q[l]) | ((qh as usize >> (3 * l)) & 7) << 8];
        // SAFETY: no memory is accessed; the level was detected.
        let delta = unsafe { _mm256_set1_epi8(delta) };
        Some(iq1_q(set4([g(0), g(1), g(2), g(3)]), delta))
    }
}

impl GridX86 for IQ1_M {
    #[inline(always)]
    fn chunk_ymm(blk: &[u8], c: usize) -> Option<(__m256i, __m256i)> {
        let q: &[u8; 4] = blk.get(4 * c..4 + 4 * c)?.try_into().ok()?;
        let qh = le16(blk, 32 + 2 * c)?;
        let neg = fields4(qh, [3, 7, 11, 15], 1);
        // Scalar loads (indices of 8 + 3 bits, below the grid's 2048 entries).
        let g = |l: usize| IQ1S_GRID[usize::from(q[l]) | ((qh as usize >> (4 * l)) & 7) << 8];
        // SAFETY: no memory is accessed; the level was detected.
        let delta = unsafe {
            // Each entry's shift sign: all bytes −1 (0 − 1) or 1.
            let n = _mm256_sub_epi64(_mm256_setzero_si256(), _mm256_cvtepu32_epi64(neg));
            _mm256_or_si256(n, _mm256_set1_epi8(1))
        };
        Some(iq1_q(set4([g(0), g(1), g(2), g(3)]), delta))
    }
}

/// 32 bytes of `b` from `at` in a vector.
#[inline(always)]
fn load_at(b: &[u8], at: usize) -> Option<__m256i> {
    Some(load256(b.get(at..at + 32)?.try_into().ok()?))
}

impl GridX86 for TQ2_0 {
    #[inline(always)]
    fn scales_ymm(_: &[u8]) -> Option<(__m256i, __m256i)> {
        // SAFETY: no memory is accessed; the level was detected.
        let one = unsafe { _mm256_set1_epi16(1) };
        Some((one, one))
    }
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
    fn scales_ymm(_: &[u8]) -> Option<(__m256i, __m256i)> {
        // SAFETY: no memory is accessed; the level was detected.
        let one = unsafe { _mm256_set1_epi16(1) };
        Some((one, one))
    }
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

// The run of a [`GridX86`] type at level `D`, inside `D::enter`.
level_run!(run [G: GridX86, D: Dot, const R: usize], D, rows::<G, D, R>);

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

/// Chunk `c` of super-block `b` (bytes `blk`, group scales `sc_lo`,
/// `sc_hi` as [`scales16`]) against the `R` rows: `l[t] += vpmaddwd(
/// vpmaddubsw(|q|, sign(y, q)), 2^s·sc)`.
#[inline(always)]
fn chunk_step<G: GridX86, D: Dot, const R: usize>(
    l: &mut [__m256i; R],
    blk: &[u8],
    c: usize,
    sc_lo: __m256i,
    sc_hi: __m256i,
    rows: &Rows<'_, R>,
    b: usize,
) -> Option<()> {
    let (m, s) = G::chunk_ymm(blk, c)?;
    let half = if c < 4 { sc_lo } else { sc_hi };
    // SAFETY: no memory is accessed but the pattern; the level was detected.
    let s16 = unsafe { _mm256_shuffle_epi8(half, load256(&PAIR_SHUF[c % 4])) };
    let at = 256 * b + 32 * c;
    for (l, (y, p2)) in l.iter_mut().zip(rows.y.iter().zip(rows.pow2)) {
        // SAFETY: b < nb, and `rows` holds nb blocks; the pair sums
        // (≤ 2·62·127) and multipliers (≤ 16·31) fit 16 bits; the level was
        // detected.
        let (p, k) = unsafe {
            let y = load256(chunk(y, at));
            let p = _mm256_maddubs_epi16(m, _mm256_sign_epi8(y, s));
            (p, _mm256_mullo_epi16(load_x16(chunk(p2, at / 2)), s16))
        };
        *l = D::dpwssd(*l, p, k);
    }
    Some(())
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
                let (sc_lo, sc_hi) = G::scales_ymm(blk)?;
                // Two integer accumulators per row (even and odd chunks),
                // in registers: the chunks in pairs, unrolled.
                // SAFETY: no memory is accessed; the level was detected.
                let z = unsafe { _mm256_setzero_si256() };
                let (mut even, mut odd) = ([z; R], [z; R]);
                for cp in 0..4 {
                    chunk_step::<G, D, R>(&mut even, blk, 2 * cp, sc_lo, sc_hi, &rows, b)?;
                    chunk_step::<G, D, R>(&mut odd, blk, 2 * cp + 1, sc_lo, sc_hi, &rows, b)?;
                }
                let d = G::d(blk)?;
                for (t, (acc, (e, o))) in acc.iter_mut().zip(even.into_iter().zip(odd)).enumerate()
                {
                    // SAFETY: b < nb, and `rows` holds nb scales.
                    let dx = unsafe { *rows.d[t].get_unchecked(b) };
                    // SAFETY: no memory is accessed; the level was detected.
                    let l = unsafe { _mm256_add_epi32(e, o) };
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
