//! The f32 dot kernels of e4m3 rows (`fp8-b<block_k>` and MLX's mxfp8) on
//! 512-bit vectors at the AVX512-VNNI level (its AVX-512 F/BW/VL/VBMI), the
//! same bits as the AVX2 kernels ([`super::fp8`], [`super::mlxfp`]).
//!
//! The codes are converted exactly by table: an e4m3 value is a bf16
//! ([`BF16`]), so a code's f32 bits are the table's 16 bits `<< 16`. A
//! 512-bit vector of 16 f32 lanes takes its codes by one zero-masked
//! `vpermb` into bytes 2 and 3 of each lane (bytes 0, 1 zero: code 0's
//! entry is +0), two `vpermi2b` look up the bf16's low and high bytes of
//! the 7-bit magnitude (128 entries in two registers each), a byte blend
//! keeps the low byte in byte 2 and the high in byte 3, and the code's
//! sign bit is or'ed into bit 31. Five instructions per 16 weights, where
//! the AVX2 lanes compute the value in ~12 per 8.
//!
//! The arithmetic is the other levels', lane for lane: their two 8-lane
//! vectors are the halves of one 512-bit vector.
//! - Groups of more than 32 (`fp8-b64`, `fp8-b128`): the AVX2 kernel's two
//!   chains take its 8-lane vectors alternately, so 16 consecutive weights
//!   are one step of both (chain 0 in the low half, 1 in the high); the
//!   chains' sum, the group scale's `fma` into `acc[g % 2]` and the final
//!   sum are its 256-bit operations.
//! - Groups of 32 (mxfp8, `fp8-b32`): one chain per group, so two groups
//!   run side by side (group `2h` in the low half, `2h + 1` in the high:
//!   `acc[0]` and `acc[1]`), the codes and activations of step `k` being
//!   values `8k..8k + 8` of each; a last odd group runs alone.
//!
//! The rows' bytes are prefetched [`prefetch_distance`] bytes ahead, as
//! the integer kernels do.
//!
//! # Safety
//!
//! The intrinsics need AVX2, FMA and AVX-512 F/BW/VL/VBMI: the kernels run
//! only inside [`with_avx512`], and [`run_for`] is asked for them only at
//! the AVX512-VNNI level, which `dot_rows_at` runs only if
//! `SimdLevel::is_supported` detected those features ("the level was
//! detected" below).

// Functions are passed on wrapped in `#[inline(always)]` closures: a
// function item passed as a value may stay out of line, compiled without the
// level's features (its intrinsics then become calls).
#![allow(clippy::redundant_closure)]

use super::{run_for as run_for_level, Avx2, Run, XSums};
use crate::cpu::prefetch_distance;
use crate::error::Result;
use crate::format::mlxfp::e8m0_to_f32;
use crate::format::{MlxFpMode, RawRow, RowDecoder};
use std::arch::x86_64::*;

/// The bf16 bits of the e4m3fn value of each 7-bit magnitude (exact; 0x7F
/// is NaN), built in integers: `e ≥ 1`: `2^(e−7)·(1 + m/8)`; `e = 0`:
/// `m·2⁻⁹`.
const BF16: [u16; 128] = {
    let mut t = [0u16; 128];
    let mut c = 0;
    while c < 128 {
        let (e, m) = (c >> 3, (c & 7) as u32);
        let f32_bits: u32 = if c == 0x7F {
            0x7FC0_0000
        } else if e >= 1 {
            ((e as u32 + 120) << 23) | (m << 20)
        } else if m == 0 {
            0
        } else {
            // m·2⁻⁹ normalized: the top set bit of m is the implicit 1.
            let top = 31 - m.leading_zeros(); // 0..=2
            let exp = 127 - 9 + top;
            let frac = (m ^ (1 << top)) << (23 - top);
            (exp << 23) | frac
        };
        t[c] = (f32_bits >> 16) as u16;
        c += 1;
    }
    t
};

/// The low (`[0]`, `[1]`: magnitudes 0..64, 64..128) and high (`[2]`,
/// `[3]`) bytes of [`BF16`].
const BF16_BYTES: [[u8; 64]; 4] = {
    let mut t = [[0u8; 64]; 4];
    let mut c = 0;
    while c < 128 {
        t[c / 64][c % 64] = (BF16[c] & 0xFF) as u8;
        t[2 + c / 64][c % 64] = (BF16[c] >> 8) as u8;
        c += 1;
    }
    t
};

/// `vpermb` indices of step `s` of a 64-byte run of codes: code `16s + i`
/// into bytes 2, 3 of lane `i` (two chains: consecutive weights).
const CHAIN_IDX: [[u8; 64]; 4] = {
    let mut t = [[0u8; 64]; 4];
    let mut s = 0;
    while s < 4 {
        let mut b = 0;
        while b < 64 {
            t[s][b] = (16 * s + b / 4) as u8;
            b += 1;
        }
        s += 1;
    }
    t
};

/// `vpermb` indices of step `k` of two groups of 32 codes: codes `8k + i`
/// (group `2h`, lanes `i < 8`) and `32 + 8k + i` (group `2h + 1`, lanes
/// `8 + i`) into bytes 2, 3.
const PAIR_IDX: [[u8; 64]; 4] = {
    let mut t = [[0u8; 64]; 4];
    let mut k = 0;
    while k < 4 {
        let mut b = 0;
        while b < 64 {
            let i = b / 4;
            t[k][b] = if i < 8 { 8 * k + i } else { 32 + 8 * k + i - 8 } as u8;
            b += 1;
        }
        k += 1;
    }
    t
};

/// Bytes 2 and 3 of every 32-bit lane.
const BYTES23: __mmask64 = 0xCCCC_CCCC_CCCC_CCCC;
/// Byte 3 of every 32-bit lane.
const BYTE3: __mmask64 = 0x8888_8888_8888_8888;

/// The run of rows like `raw` at this level, if it is an e4m3 format with
/// a kernel here.
pub(super) fn run_for(raw: &RawRow<'_>) -> Option<Run> {
    match *raw {
        RawRow::Fp8Block { block_k: 32, .. } => Some(run::<32, false>),
        RawRow::Fp8Block { block_k: 64, .. } => Some(run::<64, false>),
        RawRow::Fp8Block { block_k: 128, .. } => Some(run::<128, false>),
        RawRow::MlxFp {
            mode: MlxFpMode::Mxfp8,
            ..
        } if MlxFpMode::Mxfp8.group_size() == 32 => Some(run::<32, true>),
        _ => None,
    }
}

/// Calls `f` compiled with AVX2, FMA and AVX-512 F/BW/VL/VBMI.
///
/// # Safety
/// The CPU must have them.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512vbmi")]
#[inline(never)]
unsafe fn with_avx512<T>(f: impl FnOnce() -> T) -> T {
    f()
}

/// A run of rows of groups of `GS` (`MLX`: MLX mxfp8, e8m0 scale bytes;
/// else `fp8-b<GS>`, f32 scales): the arguments of [`Run`]. A row this
/// kernel cannot take goes to the AVX2 kernels.
fn run<const GS: usize, const MLX: bool>(
    dec: &RowDecoder<'_>,
    e: usize,
    n0: usize,
    x: &[f32],
    xs: &XSums,
    scratch: &mut [f32],
    out: &mut [f32],
) -> Result<()> {
    // SAFETY: only at the level that detected the features (module doc).
    unsafe {
        with_avx512(
            #[inline(always)]
            move || {
                let tables = BF16_BYTES.each_ref().map(|t| load512(t));
                let pf = prefetch_distance();
                for (n, o) in (n0..).zip(out.iter_mut()) {
                    let raw = dec.raw_row(e, n)?;
                    let v = match raw {
                        RawRow::Fp8Block {
                            block_k,
                            codes,
                            scales,
                        } if !MLX && block_k == GS => row::<GS>(
                            codes,
                            x,
                            &tables,
                            pf,
                            (scales.len(), |g| scales.get(g).copied()),
                        ),
                        RawRow::MlxFp {
                            mode: MlxFpMode::Mxfp8,
                            words,
                            scales,
                        } if MLX => row::<GS>(
                            bytemuck::cast_slice(words),
                            x,
                            &tables,
                            pf,
                            (scales.len(), |g| scales.get(g).map(|&s| e8m0_to_f32(s))),
                        ),
                        _ => None,
                    };
                    match v {
                        Some(v) => *o = v,
                        None => run_for_level::<Avx2>(&raw)(
                            dec,
                            e,
                            n,
                            x,
                            xs,
                            scratch,
                            std::slice::from_mut(o),
                        )?,
                    }
                }
                Ok(())
            },
        )
    }
}

/// Prefetches (to L1) the lines of `codes[at..at + len]` shifted `d` bytes
/// on (0: nothing), as the integer kernels do (`qdot`'s `prefetch_at`): a
/// hint, the addresses only computed.
#[inline(always)]
fn prefetch_at(codes: &[u8], at: usize, len: usize, d: usize) {
    if d == 0 {
        return;
    }
    let p = codes.as_ptr().cast::<i8>().wrapping_add(at + d);
    let mut o = 0;
    while o < len {
        // SAFETY: `prefetcht0` reads nothing architecturally and never
        // faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(o)) };
        o += 64;
    }
}

/// 64 bytes.
#[inline(always)]
fn load512(v: &[u8; 64]) -> __m512i {
    // SAFETY: `v` is 64 readable bytes, unaligned loads are allowed; the
    // level was detected.
    unsafe { _mm512_loadu_si512(v.as_ptr().cast()) }
}

/// The f32 values of the codes that `idx` (a [`CHAIN_IDX`] or [`PAIR_IDX`]
/// pattern) picks from the 64 bytes `v`, one per 32-bit lane.
#[inline(always)]
fn values(v: __m512i, idx: __m512i, t: &[__m512i; 4]) -> __m512 {
    // SAFETY: no memory is accessed; the level was detected.
    unsafe {
        let c = _mm512_maskz_permutexvar_epi8(BYTES23, idx, v);
        let lo = _mm512_permutex2var_epi8(t[0], c, t[1]);
        let hi = _mm512_permutex2var_epi8(t[2], c, t[3]);
        let m = _mm512_mask_blend_epi8(BYTE3, lo, hi);
        // m | (c & 0x8000_0000): the sign.
        let s = _mm512_ternarylogic_epi32::<0xF8>(m, c, _mm512_set1_epi32(i32::MIN));
        _mm512_castsi512_ps(s)
    }
}

/// `[a | b]`: two 8-lane halves into one vector.
#[inline(always)]
fn halves(lo: __m256, hi: __m256) -> __m512 {
    // SAFETY: no memory is accessed; the level was detected.
    unsafe {
        let lo = _mm512_castpd256_pd512(_mm256_castps_pd(lo));
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(lo, _mm256_castps_pd(hi)))
    }
}

/// 8 f32 from `x` at `at` (`at + 8 ≤ x.len()`, checked by the caller).
///
/// # Safety
/// `at + 8 ≤ x.len()`.
#[inline(always)]
unsafe fn load8(x: &[f32], at: usize) -> __m256 {
    debug_assert!(at + 8 <= x.len());
    // SAFETY: the caller's contract; the level was detected.
    unsafe { _mm256_loadu_ps(x.as_ptr().add(at)) }
}

/// The dot of one row of `GS`-code groups with group scales `scale(g)`;
/// `None` if the lengths disagree.
#[inline(always)]
fn row<const GS: usize>(
    codes: &[u8],
    x: &[f32],
    t: &[__m512i; 4],
    pf: usize,
    (nscales, scale): (usize, impl Fn(usize) -> Option<f32>),
) -> Option<f32> {
    let ng = codes.len() / GS;
    if codes.len() != x.len() || codes.len() != nscales * GS || ng == 0 {
        return None;
    }
    // SAFETY: no memory is accessed; the level was detected.
    let z = unsafe { _mm256_setzero_ps() };
    let mut acc = [z; 2];
    if GS > 32 {
        for g in 0..ng {
            let at = GS * g;
            prefetch_at(codes, at, GS, pf);
            // SAFETY: no memory is accessed; the level was detected.
            let mut ch = unsafe { _mm512_setzero_ps() };
            for r in 0..GS / 64 {
                // SAFETY: at + 64r + 64 ≤ GS·(g + 1) ≤ codes.len() = x.len().
                let v = unsafe { _mm512_loadu_si512(codes.as_ptr().add(at + 64 * r).cast()) };
                for (s, idx) in CHAIN_IDX.iter().enumerate() {
                    let w = values(v, load512(idx), t);
                    let o = at + 64 * r + 16 * s;
                    // SAFETY: o + 16 ≤ x.len(); the level was detected.
                    ch = unsafe { _mm512_fmadd_ps(w, _mm512_loadu_ps(x.as_ptr().add(o)), ch) };
                }
            }
            // SAFETY: no memory is accessed; the level was detected.
            let p = unsafe {
                _mm256_add_ps(
                    _mm512_castps512_ps256(ch),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(ch))),
                )
            };
            let a = acc.get_mut(g & 1)?;
            // SAFETY: no memory is accessed; the level was detected.
            *a = unsafe { _mm256_fmadd_ps(_mm256_set1_ps(scale(g)?), p, *a) };
        }
    } else {
        let mut a2 = halves(acc[0], acc[1]);
        for h in 0..ng / 2 {
            let at = 64 * h;
            prefetch_at(codes, at, 64, pf);
            // SAFETY: at + 64 ≤ codes.len().
            let v = unsafe { _mm512_loadu_si512(codes.as_ptr().add(at).cast()) };
            // SAFETY: no memory is accessed; the level was detected.
            let mut ch = unsafe { _mm512_setzero_ps() };
            for (k, idx) in PAIR_IDX.iter().enumerate() {
                let w = values(v, load512(idx), t);
                // SAFETY: at + 32 + 8k + 8 ≤ x.len().
                let xv = unsafe { halves(load8(x, at + 8 * k), load8(x, at + 32 + 8 * k)) };
                // SAFETY: no memory is accessed; the level was detected.
                ch = unsafe { _mm512_fmadd_ps(w, xv, ch) };
            }
            let (s0, s1) = (scale(2 * h)?, scale(2 * h + 1)?);
            // SAFETY: no memory is accessed; the level was detected.
            a2 = unsafe { _mm512_fmadd_ps(halves(_mm256_set1_ps(s0), _mm256_set1_ps(s1)), ch, a2) };
        }
        // SAFETY: no memory is accessed; the level was detected.
        acc = unsafe {
            [
                _mm512_castps512_ps256(a2),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a2))),
            ]
        };
        if ng % 2 == 1 {
            let at = GS * (ng - 1);
            // The last group alone: its 32 codes in the low 32 bytes.
            // SAFETY: the masked load reads bytes at..at + 32 of `codes`;
            // the level was detected.
            let v = unsafe {
                _mm512_maskz_loadu_epi8(u64::from(u32::MAX), codes.as_ptr().add(at).cast())
            };
            // SAFETY: no memory is accessed; the level was detected.
            let mut ch = unsafe { _mm256_setzero_ps() };
            for (k, idx) in PAIR_IDX.iter().enumerate() {
                let w = values(v, load512(idx), t);
                // SAFETY: at + 8k + 8 ≤ x.len(); the level was detected.
                ch =
                    unsafe { _mm256_fmadd_ps(_mm512_castps512_ps256(w), load8(x, at + 8 * k), ch) };
            }
            // ng − 1 is even: acc[0].
            // SAFETY: no memory is accessed; the level was detected.
            acc[0] = unsafe { _mm256_fmadd_ps(_mm256_set1_ps(scale(ng - 1)?), ch, acc[0]) };
        }
    }
    // The AVX2 level's `acc[0].add(acc[1]).sum()`.
    // SAFETY: no memory is accessed; the level was detected.
    Some(unsafe {
        let a = _mm256_add_ps(acc[0], acc[1]);
        let h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
        let q = _mm_add_ps(h, _mm_movehl_ps(h, h));
        _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps::<1>(q, q)))
    })
}

#[cfg(test)]
mod tests {
    use super::BF16;
    use crate::format::mlxfp::e4m3_to_f32;

    /// The table is `e4m3_to_f32`'s values, bit for bit (NaN: a NaN).
    #[test]
    fn bf16_table_is_exact() {
        for c in 0..=255u8 {
            let got = f32::from_bits(
                (u32::from(BF16[usize::from(c & 0x7F)]) << 16) | (u32::from(c & 0x80) << 24),
            );
            let want = e4m3_to_f32(c);
            let same = got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan());
            assert!(same, "{c:#04x}: {got:e} vs {want:e}");
        }
    }
}
