//! What the x86 kernels share: the levels' byte multiply-adds ([`Dot`]:
//! AVX2's `vpmaddubsw` + `vpmaddwd` ([`Avx2`]), or `vpdpbusd`/`vpdpwssd` in
//! their AVX-VNNI ([`AvxVnni`]) or AVX512-VNNI ([`Avx512Vnni`]) forms), the
//! compiled contexts they run in, and 256-bit helpers: loads, the weight
//! scales' widening (F16C), the K-quants' group scales, and the float
//! accumulation `A = fma(s, f32(L), A)` of the module doc of [`super`].
//!
//! # Safety
//!
//! The intrinsics need the features of their level ([`Dot::enter`]). The
//! kernels of a level run only inside its `enter`, and
//! [`qdot_rows`](super::qdot_rows) runs a level only if
//! `SimdLevel::is_supported` detected its features at run time: that is
//! what the `SAFETY` comments below mean by "the level was detected".
//! Memory is read only through references to fixed-size arrays (and, where
//! a length was checked once for a whole row, [`chunk`]).

// Functions are passed on wrapped in `#[inline(always)]` closures: a
// function item passed as a value may stay out of line, compiled without the
// level's features (its intrinsics then become calls).
#![allow(clippy::redundant_closure)]

use super::{block_scales, chunk, Acc, RUN};
use crate::cpu::fast::dot::k4_scales_mins;
pub(super) use crate::cpu::prefetch_distance;
use std::arch::x86_64::*;

/// Prefetches (to L1) the cache lines at every 64 bytes of the `len`
/// bytes from byte `at` of `v`, shifted `d` bytes on ([`prefetch_distance`],
/// read once per kernel call; 0: nothing): called once per block or run a
/// kernel reads, it asks for the row's bytes `d` bytes before they are
/// read (the next row's where the run ends a row; past the last row, lines
/// nobody reads). Runs that follow one another in memory leave no gap of
/// more than 64 bytes between the addresses, so every line of the stream is
/// asked for. At T = 1 the hardware prefetchers alone leave a core short
/// of the memory's rate (see [`PREFETCH_DEFAULT`](crate::cpu::PREFETCH_DEFAULT)).
/// A hint: the addresses are only computed (wrapping arithmetic), and
/// `prefetcht0` never faults.
#[inline(always)]
pub(super) fn prefetch_at<T>(v: &[T], at: usize, len: usize, d: usize) {
    if d == 0 {
        return;
    }
    let p = v.as_ptr().cast::<i8>().wrapping_add(at + d);
    let mut o = 0;
    while o < len {
        // SAFETY: `prefetcht0` reads nothing architecturally and never
        // faults (SSE, present on every x86-64).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(o)) };
        o += 64;
    }
}

/// [`prefetch_at`] of all of `v`.
#[inline(always)]
pub(super) fn prefetch_span<T, const N: usize>(v: &[T; N], d: usize) {
    prefetch_at(v, 0, std::mem::size_of::<T>() * N, d);
}

/// How a level multiplies and adds bytes, and the compiled context its
/// kernels run in.
pub(super) trait Dot: Copy + 'static {
    /// Runs `f` in a function compiled with the level's features (pass
    /// `#[inline(always)]` closures; see `dot::simd::Simd::enter`).
    fn enter<T>(f: impl FnOnce() -> T) -> T;
    /// `acc[j] + Σ_{k<4} u[4j+k]·s[4j+k]` of unsigned `u ≤ 128` and signed
    /// `s ≥ −127` (so AVX2's 16-bit pair sums cannot saturate).
    fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
    /// `acc[j] + p[2j]·q[2j] + p[2j+1]·q[2j+1]` of 16-bit lanes.
    fn dpwssd(acc: __m256i, p: __m256i, q: __m256i) -> __m256i;
    /// `Σ_{k<4} w[4j+k]·y[4j+k]` of signed bytes, `y ≥ −127`; `bias` holds
    /// `−128·Σ_{k<4} y[4j+k]` (for levels that offset `w` to unsigned).
    fn dot_i8(w: __m256i, y: __m256i, bias: &[i32; 8]) -> __m256i;
}

/// AVX2: `vpmaddubsw` + `vpmaddwd`.
#[derive(Clone, Copy)]
pub(super) struct Avx2;

/// AVX-VNNI: VEX `vpdpbusd`, `vpdpwssd`.
#[derive(Clone, Copy)]
pub(super) struct AvxVnni;

/// AVX512-VNNI (+F/BW/VL/VBMI): EVEX `vpdpbusd`, `vpdpwssd`.
#[derive(Clone, Copy)]
pub(super) struct Avx512Vnni;

/// Calls `f` compiled with AVX2, FMA and F16C.
///
/// # Safety
/// The CPU must have them.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline(never)]
unsafe fn with_avx2<T>(f: impl FnOnce() -> T) -> T {
    f()
}

/// Calls `f` compiled with AVX2, FMA, F16C and AVX-VNNI.
///
/// # Safety
/// The CPU must have them.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[inline(never)]
unsafe fn with_avx_vnni<T>(f: impl FnOnce() -> T) -> T {
    f()
}

/// Calls `f` compiled with AVX2, FMA, F16C, AVX-512 F/BW/VL/VBMI and
/// AVX512-VNNI.
///
/// # Safety
/// The CPU must have them.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni")]
#[inline(never)]
unsafe fn with_avx512_vnni<T>(f: impl FnOnce() -> T) -> T {
    f()
}

/// `Σ_{k<2}` of the 16-bit pair products, the AVX2 way.
#[inline(always)]
fn maddubs_pairs(u: __m256i, s: __m256i) -> __m256i {
    // SAFETY: no memory is accessed; the level was detected (module doc).
    unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)) }
}

impl Dot for Avx2 {
    #[inline(always)]
    fn enter<T>(f: impl FnOnce() -> T) -> T {
        // SAFETY: the level was detected (module doc).
        unsafe { with_avx2(f) }
    }
    #[inline(always)]
    fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: as in `maddubs_pairs`.
        unsafe { _mm256_add_epi32(acc, maddubs_pairs(u, s)) }
    }
    #[inline(always)]
    fn dpwssd(acc: __m256i, p: __m256i, q: __m256i) -> __m256i {
        // SAFETY: as in `maddubs_pairs`.
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(p, q)) }
    }
    #[inline(always)]
    fn dot_i8(w: __m256i, y: __m256i, _: &[i32; 8]) -> __m256i {
        // |w|·sign(y, w) = w·y, with |w| ≤ 128 unsigned and |y| ≤ 127.
        // SAFETY: as in `maddubs_pairs`.
        unsafe { maddubs_pairs(_mm256_abs_epi8(w), _mm256_sign_epi8(y, w)) }
    }
}

impl Dot for AvxVnni {
    #[inline(always)]
    fn enter<T>(f: impl FnOnce() -> T) -> T {
        // SAFETY: the level was detected (module doc).
        unsafe { with_avx_vnni(f) }
    }
    #[inline(always)]
    fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: as in `maddubs_pairs`.
        unsafe { _mm256_dpbusd_avx_epi32(acc, u, s) }
    }
    #[inline(always)]
    fn dpwssd(acc: __m256i, p: __m256i, q: __m256i) -> __m256i {
        // SAFETY: as in `maddubs_pairs`.
        unsafe { _mm256_dpwssd_avx_epi32(acc, p, q) }
    }
    #[inline(always)]
    fn dot_i8(w: __m256i, y: __m256i, bias: &[i32; 8]) -> __m256i {
        // (w + 128)·y − 128·y.
        // SAFETY: `bias` is 32 readable bytes; as in `maddubs_pairs`.
        unsafe {
            let u = _mm256_xor_si256(w, _mm256_set1_epi8(i8::MIN));
            _mm256_dpbusd_avx_epi32(_mm256_loadu_si256(bias.as_ptr().cast()), u, y)
        }
    }
}

impl Dot for Avx512Vnni {
    #[inline(always)]
    fn enter<T>(f: impl FnOnce() -> T) -> T {
        // SAFETY: the level was detected (module doc).
        unsafe { with_avx512_vnni(f) }
    }
    #[inline(always)]
    fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: as in `maddubs_pairs`.
        unsafe { _mm256_dpbusd_epi32(acc, u, s) }
    }
    #[inline(always)]
    fn dpwssd(acc: __m256i, p: __m256i, q: __m256i) -> __m256i {
        // SAFETY: as in `maddubs_pairs`.
        unsafe { _mm256_dpwssd_epi32(acc, p, q) }
    }
    #[inline(always)]
    fn dot_i8(w: __m256i, y: __m256i, bias: &[i32; 8]) -> __m256i {
        // SAFETY: `bias` is 32 readable bytes; as in `maddubs_pairs`.
        unsafe {
            let u = _mm256_xor_si256(w, _mm256_set1_epi8(i8::MIN));
            _mm256_dpbusd_epi32(_mm256_loadu_si256(bias.as_ptr().cast()), u, y)
        }
    }
}

/// 32 bytes.
#[inline(always)]
pub(super) fn load256<T: Copy>(v: &[T; 32]) -> __m256i {
    const { assert!(std::mem::size_of::<T>() == 1) };
    // SAFETY: `v` is 32 readable bytes (the assertion), unaligned loads are
    // allowed; the level was detected (module doc).
    unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
}

/// 16 lanes of 16 bits.
#[inline(always)]
pub(super) fn load_x16(v: &[i16; 16]) -> __m256i {
    // SAFETY: `v` is 32 readable bytes, unaligned loads are allowed; the
    // level was detected (module doc).
    unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
}

/// Lanes as an array.
#[inline(always)]
pub(super) fn to_array(v: __m256) -> [f32; 8] {
    let mut a = [0f32; 8];
    // SAFETY: `a` is 8 writable f32, unaligned stores are allowed; the level
    // was detected (module doc).
    unsafe { _mm256_storeu_ps(a.as_mut_ptr(), v) };
    a
}

/// `fma(s, f32(l), acc)` lane by lane: one rounding, as the portable
/// `f32::mul_add`.
#[inline(always)]
pub(super) fn fma_lanes(acc: __m256, s: __m256, l: __m256i) -> __m256 {
    // SAFETY: no memory is accessed; the level was detected (module doc).
    unsafe { _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(l), acc) }
}

/// All lanes `s`.
#[inline(always)]
pub(super) fn splat(s: f32) -> __m256 {
    // SAFETY: no memory is accessed; the level was detected (module doc).
    unsafe { _mm256_set1_ps(s) }
}

/// `[s[0] ×4, s[1] ×4]`.
#[inline(always)]
pub(super) fn splat2x4(s: &[f32; 2]) -> __m256 {
    // SAFETY: `s` is 8 readable bytes; the level was detected (module doc).
    unsafe {
        let v = _mm256_castps128_ps256(_mm_castpd_ps(_mm_load_sd(s.as_ptr().cast())));
        _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1))
    }
}

/// All lanes zero.
#[inline(always)]
pub(super) fn zero() -> __m256 {
    // SAFETY: no memory is accessed; the level was detected (module doc).
    unsafe { _mm256_setzero_ps() }
}

/// The accumulators `A[b % 4]` of 4 vectors, one per block of a run.
#[inline(always)]
pub(super) fn acc_of(v: [__m256; RUN]) -> Acc {
    // A loop, not `map(to_array)`: a function item passed on may stay out
    // of line, compiled without the level's features.
    let mut a: Acc = [[0f32; 8]; RUN];
    for (a, v) in a.iter_mut().zip(v) {
        *a = to_array(v);
    }
    a
}

/// The codes of the nibble bytes `qs` (16 or 32 bytes in a 256-bit vector)
/// split: low nibbles, high nibbles.
#[inline(always)]
pub(super) fn nibbles(qs: __m256i) -> (__m256i, __m256i) {
    // SAFETY: no memory is accessed; the level was detected (module doc).
    unsafe {
        let m4 = _mm256_set1_epi8(15);
        (
            _mm256_and_si256(qs, m4),
            _mm256_and_si256(_mm256_srli_epi16(qs, 4), m4),
        )
    }
}

/// The 16 nibble bytes of two Q4_0 blocks (18 bytes each: f16 `d`, then
/// the nibbles) side by side.
#[inline(always)]
pub(super) fn q4_0_pair(b0: &[u8; 18], b1: &[u8; 18]) -> __m256i {
    // SAFETY: bytes 2..18 of each block; the level was detected.
    unsafe {
        let (q0, q1): (&[u8; 16], &[u8; 16]) = (chunk(b0, 2), chunk(b1, 2));
        let lo = _mm_loadu_si128(q0.as_ptr().cast());
        let hi = _mm_loadu_si128(q1.as_ptr().cast());
        _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1)
    }
}

/// The f16 at byte `AT` of blocks `b0..b0 + 8` of `BS` bytes of `row`
/// (zeros past its end), widened: packed into two words in general
/// registers, moved to a vector and converted by F16C (exact, as the
/// portable `f16_to_f32` but for NaN payloads, which F16C quiets).
#[inline(always)]
pub(super) fn widen8_f16c<const BS: usize, const AT: usize>(row: &[u8], b0: usize) -> [f32; 8] {
    /// 4 f16 from blocks `i..i + 4`.
    #[inline(always)]
    fn word<const BS: usize, const AT: usize>(c: &[u8], i: usize) -> u64 {
        let mut v = 0u64;
        for k in 0..4 {
            let at = (i + k) * BS + AT;
            if let Some(h) = c.get(at..at + 2) {
                v |= u64::from(u16::from_le_bytes([h[0], h[1]])) << (16 * k);
            }
        }
        v
    }
    let mut v = [0f32; 8];
    // 8 whole blocks: one bounds check (the slice's length is a constant).
    let (lo, hi) = match row.get(b0 * BS..).and_then(|r| r.get(..8 * BS)) {
        Some(r) => {
            let h = |k: usize| u64::from(u16::from_le_bytes([r[k * BS + AT], r[k * BS + AT + 1]]));
            (
                h(0) | h(1) << 16 | h(2) << 32 | h(3) << 48,
                h(4) | h(5) << 16 | h(6) << 32 | h(7) << 48,
            )
        }
        None => (word::<BS, AT>(row, b0), word::<BS, AT>(row, b0 + 4)),
    };
    // SAFETY: `v` is 8 writable f32; the level was detected (module doc).
    unsafe {
        let x = _mm_set_epi64x(hi as i64, lo as i64);
        _mm256_storeu_ps(v.as_mut_ptr(), _mm256_cvtph_ps(x));
    }
    v
}

/// The per-block scale products of `BS`-byte blocks with the f16 at `AT`
/// ([`block_scales`] with [`widen8_f16c`]).
#[inline(always)]
pub(super) fn scales<'s, const R: usize, const BS: usize, const AT: usize>(
    row: &[u8],
    ds: &[&[f32]; R],
    scratch: &'s mut [f32],
) -> Option<&'s [f32]> {
    block_scales(
        row,
        BS,
        ds,
        scratch,
        #[inline(always)]
        |r, b0| widen8_f16c::<BS, AT>(r, b0),
    )
}

/// `vpshufb` patterns that broadcast 16-bit lane `g` of each 128-bit half.
pub(super) const SCALE_SHUF: [[u8; 32]; 8] = {
    let mut m = [[0u8; 32]; 8];
    let mut g = 0;
    while g < 8 {
        let mut i = 0;
        while i < 16 {
            m[g][2 * i] = (2 * g) as u8;
            m[g][2 * i + 1] = (2 * g + 1) as u8;
            i += 1;
        }
        g += 1;
    }
    m
};

/// 16-bit lane `g` of each half of `sc16`, in every lane.
#[inline(always)]
pub(super) fn group_scale(sc16: __m256i, g: usize) -> __m256i {
    // SAFETY: no memory is accessed but the pattern; the level was detected
    // (module doc).
    unsafe { _mm256_shuffle_epi8(sc16, load256(&SCALE_SHUF[g & 7])) }
}

/// The 8 group scales of a Q4_K / Q5_K super-block as 16-bit lanes, in
/// both 128-bit halves, and the 8 mins.
#[inline(always)]
pub(super) fn k4_scales16(blk: &[u8; 144]) -> (__m256i, [u8; 8]) {
    // SAFETY: bytes 4..16 of a 144-byte block.
    let (sc, m) = k4_scales_mins(unsafe { chunk(blk, 4) });
    // SAFETY: no memory is accessed; the level was detected (module doc).
    let sc16 = unsafe {
        _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(
            u64::from_le_bytes(sc) as i64
        )))
    };
    (sc16, m)
}

/// The f16 values at bytes 0..2 and 2..4 of a K-quant super-block (`d`,
/// `dmin`), widened by F16C (exact).
#[inline(always)]
pub(super) fn f16_pair<const BS: usize>(blk: &[u8; BS]) -> (f32, f32) {
    const { assert!(BS >= 4) };
    let v = u32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]);
    // SAFETY: no memory is accessed; the level was detected (module doc).
    unsafe {
        let x = _mm_cvtph_ps(_mm_cvtsi32_si128(v as i32));
        (_mm_cvtss_f32(x), _mm_cvtss_f32(_mm_movehdup_ps(x)))
    }
}

/// `Σ_g m_g·Σy_g` of a super-block's 8 mins and the 8 sums of 32 codes:
/// one `vpmaddwd`, then the 4 products summed (exact integers).
#[inline(always)]
pub(super) fn k4_mins(m: &[u8; 8], gsum: &[i16; 8]) -> i32 {
    // SAFETY: `gsum` is 16 readable bytes; the level was detected (module
    // doc).
    unsafe {
        let m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(u64::from_le_bytes(*m) as i64));
        let p = _mm_madd_epi16(m16, _mm_loadu_si128(gsum.as_ptr().cast()));
        let p = _mm_add_epi32(p, _mm_shuffle_epi32::<0b01_00_11_10>(p));
        let p = _mm_add_epi32(p, _mm_shuffle_epi32::<0b10_11_00_01>(p));
        _mm_cvtsi128_si32(p)
    }
}
