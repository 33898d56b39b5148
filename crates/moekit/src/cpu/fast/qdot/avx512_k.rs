//! The [`Avx512Vnni`] level's Q4_K and Q3_K kernels on 512-bit vectors,
//! with VBMI doing the unpacking (Q4_K):
//!
//! - the 8 scales and 8 mins of a super-block from its 12 packed bytes in
//!   one 128-bit vector (`vpermb`, two `vpmultishiftqb`, a mask and a
//!   ternary OR: [`k4_scales_mins_vbmi`]) instead of scalar word
//!   operations;
//! - a 32-byte chunk's two groups of nibbles (group `2c` in the low 256
//!   bits, `2c + 1` in the high) by one broadcast load and one
//!   `vpmultishiftqb` (the high half's bytes shifted by 4) and a mask;
//! - each group's scale picked straight from the scale bytes by `vpshufb`
//!   (a zero high byte: the 16-bit lanes of `vpdpwssd`).
//!
//! The integers are those of the other levels (`vpmaddubsw(q, y)` times the
//! pairs' `2^shift`, then `vpdpwssd` with the group scales; the mins'
//! `Σ m_g·Σy_g` by one `vpmaddwd`), exact, and the float part is the
//! module doc's of [`super`], so the results are the same bits. Two
//! steps run in registers rather than per lane in memory: the mins terms
//! of a run of 4 super-blocks go into the offsets `O[0..4]` as one vector
//! (4 `fma`s of one rounding each, [`add_mins`]), and [`finish_regs`]
//! sums the accumulators in `finish`'s order. Q3_K (centred codes, per-16
//! scales, no mins) follows the same scheme ([`q3_k`]).
//!
//! # Safety
//!
//! As in [`super::avx512`] ("the level was detected"); rows are read
//! through [`chunk`] where [`Rows::new`] checked their lengths once.

// Functions are passed on wrapped in `#[inline(always)]` closures: a
// function item passed as a value may stay out of line, compiled without the
// level's features (its intrinsics then become calls).
#![allow(clippy::redundant_closure)]

use super::avx512::load512;
use super::x86::{
    f16_pair, fma_lanes, load256, prefetch_distance, prefetch_span, splat, zero, Avx512Vnni, Dot,
};
use super::{chunk, each_row, in_runs, offsets, QRow, Rows, RUN};
use std::arch::x86_64::*;

// This file's kernels as Runs inside their level (`level_run!`, qdot/mod.rs).
level_run!(pub(super) run_q4_k [const R: usize], Avx512Vnni, q4_k::<R>);
level_run!(pub(super) run_q3_k [const R: usize], Avx512Vnni, q3_k::<R>);

/// [`finish`](super::finish) of the accumulators in registers:
/// `((A0 + A1) + (A2 + A3))` lane by lane, the lanes summed
/// `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`, minus `off` (the
/// same additions, without the accumulators' trip through memory).
#[inline(always)]
fn finish_regs(a: [__m256; RUN], off: f32) -> f32 {
    // SAFETY: no memory is accessed; the level was detected.
    unsafe {
        let l = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
        let h = _mm_add_ps(_mm256_castps256_ps128(l), _mm256_extractf128_ps::<1>(l));
        let q = _mm_add_ps(h, _mm_movehl_ps(h, h));
        _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps::<1>(q, q))) - off
    }
}

/// `vpermb` indices: of the bytes `a = 0..4`, `b = 4..8`, `c = 8..12` of a
/// Q4_K super-block's scales, the words `[a, c]` and `[b, c]`.
const SM_PERM: [u8; 16] = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11];
/// `vpmultishiftqb` bit offsets of the scales' and mins' low bits: `a_k`,
/// `c_k` (low nibble) in the first word, `b_k`, `c_k >> 4` in the second.
const SM_LO: [u8; 16] = [0, 8, 16, 24, 32, 40, 48, 56, 0, 8, 16, 24, 36, 44, 52, 60];
/// The masks of [`SM_LO`]'s bytes: 6 bits, then 4.
const SM_LO_MASK: [u8; 16] = [
    63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15,
];
/// `vpmultishiftqb` bit offsets putting bits 6, 7 of `a_k` (`b_k`) at bits
/// 4, 5 of bytes `4 + k` (the others masked off).
const SM_HI: [u8; 16] = [0, 0, 0, 0, 2, 10, 18, 26, 0, 0, 0, 0, 2, 10, 18, 26];
/// The masks of [`SM_HI`]'s bytes.
const SM_HI_MASK: [u8; 16] = [0, 0, 0, 0, 48, 48, 48, 48, 0, 0, 0, 0, 48, 48, 48, 48];

/// 16 bytes.
#[inline(always)]
fn load128(v: &[u8; 16]) -> __m128i {
    // SAFETY: `v` is 16 readable bytes, unaligned loads are allowed; the
    // level was detected.
    unsafe { _mm_loadu_si128(v.as_ptr().cast()) }
}

/// The 8 scales (bytes 0..8) and 8 mins (bytes 8..16) of a Q4_K / Q5_K
/// super-block (ggml's `get_scale_min_k4`, as
/// [`k4_scales_mins`](crate::cpu::fast::dot::k4_scales_mins)): `sc_k = a_k &
/// 63`, `sc_{4+k} = (c_k & 15) | (a_k >> 6) << 4`, `m_k = b_k & 63`,
/// `m_{4+k} = (c_k >> 4) | (b_k >> 6) << 4`.
#[inline(always)]
fn k4_scales_mins_vbmi(blk: &[u8; 144]) -> __m128i {
    // SAFETY: bytes 4..20 of a 144-byte block; no other memory but the
    // constants' is accessed; the level was detected.
    unsafe {
        let q = load128(chunk::<u8, 16>(blk, 4));
        let w = _mm_permutexvar_epi8(load128(&SM_PERM), q);
        let lo = _mm_multishift_epi64_epi8(load128(&SM_LO), w);
        let hi = _mm_multishift_epi64_epi8(load128(&SM_HI), w);
        let hi = _mm_and_si128(hi, load128(&SM_HI_MASK));
        // (lo & mask) | hi.
        _mm_ternarylogic_epi32::<0xEA>(lo, load128(&SM_LO_MASK), hi)
    }
}

/// `vpshufb` patterns: byte `2c` (a group's scale) as the 16-bit lanes of
/// the low 256 bits, byte `2c + 1` as those of the high 256 bits.
const SCALE_PICK: [[u8; 64]; 4] = {
    let mut m = [[0x80u8; 64]; 4];
    let mut c = 0;
    while c < 4 {
        let mut i = 0;
        while i < 32 {
            m[c][2 * i] = if i < 16 { 2 * c } else { 2 * c + 1 } as u8;
            i += 1;
        }
        c += 1;
    }
    m
};

/// `vpmultishiftqb` bit offsets: the bytes of each word (low 256 bits),
/// the bytes shifted by 4 (high 256 bits): with a mask of 15, the low and
/// the high nibbles of a broadcast chunk.
const NIBBLE_SHIFT: [u8; 64] = {
    let mut m = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        m[i] = (8 * (i % 8) + if i < 32 { 0 } else { 4 }) as u8;
        i += 1;
    }
    m
};

/// The products of the 8 mins (16-bit lanes) and the 8 sums of 32 codes,
/// in pairs (`vpmaddwd`): their sum is the block's `Σ_g m_g·Σy_g`.
#[inline(always)]
fn mins_madd(m16: __m128i, gsum: &[i16; 8]) -> __m128i {
    // SAFETY: `gsum` is 16 readable bytes; the level was detected.
    unsafe { _mm_madd_epi16(m16, _mm_loadu_si128(gsum.as_ptr().cast())) }
}

/// `O[k] = fma(s_m[k], f32(Σ pm[k]), O[k])` for the first `lanes` blocks
/// `k` of a run (the others unchanged): the blocks' mins terms, each the
/// one rounding of the portable `add_offset`; the 4 sums by 3 `vphaddd`
/// (exact integers).
#[inline(always)]
fn add_mins(off: __m128, pm: &[__m128i; RUN], sm: &[f32; RUN], lanes: u8) -> __m128 {
    // SAFETY: `sm` is 16 readable bytes; the level was detected.
    unsafe {
        let m = _mm_hadd_epi32(_mm_hadd_epi32(pm[0], pm[1]), _mm_hadd_epi32(pm[2], pm[3]));
        let s = _mm_loadu_ps(sm.as_ptr());
        _mm_mask3_fmadd_ps(s, _mm_cvtepi32_ps(m), off, (1u8 << lanes) - 1)
    }
}

/// Lanes as an array.
#[inline(always)]
fn to_array4(v: __m128) -> [f32; RUN] {
    let mut a = [0f32; RUN];
    // SAFETY: `a` is 16 writable bytes; the level was detected.
    unsafe { _mm_storeu_ps(a.as_mut_ptr(), v) };
    a
}

/// The loop invariants of [`q4_k`]: [`SCALE_PICK`]'s and [`NIBBLE_SHIFT`]'s
/// vectors and the prefetch distance.
struct K4Ctx {
    pats: [__m512i; 4],
    nib: __m512i,
    pf: usize,
}

/// [`q4_k`]'s state of a weight row and `R` activation rows: the
/// accumulators `A[0..4]`, per block of the run its mins' products and
/// `dmin·d_x`, and the offsets.
struct K4State<const R: usize> {
    acc: [[__m256; RUN]; R],
    pm: [[__m128i; RUN]; R],
    sm4: [[f32; RUN]; R],
    /// The offsets `O[0..4]` in the lanes of one vector.
    off: [__m128; R],
}

/// Block `b` of a Q4_K row, the `i`-th of its run, into `A[i]` (and its
/// mins' products into slot `i`). Called with `i` a constant of the
/// unrolled runs, so the state stays in registers.
#[inline(always)]
fn k4_block<const R: usize>(
    ctx: &K4Ctx,
    rows: &Rows<'_, R>,
    b: usize,
    i: usize,
    blk: &[u8; 144],
    st: &mut K4State<R>,
) -> Option<()> {
    prefetch_span(blk, ctx.pf);
    let sm = k4_scales_mins_vbmi(blk);
    let (d, dmin) = f16_pair(blk);
    // SAFETY: no memory is accessed; the level was detected.
    let (sc_all, m16, m4, mut li) = unsafe {
        (
            _mm512_broadcast_i32x4(sm),
            _mm_unpackhi_epi8(sm, _mm_setzero_si128()),
            _mm512_set1_epi8(15),
            [_mm512_setzero_si512(); R],
        )
    };
    for (c, pat) in ctx.pats.iter().enumerate() {
        // SAFETY: 16 + 32·4 = 144 bytes; the level was detected.
        let (q, sc) = unsafe {
            let q = chunk::<u8, 32>(blk, 16 + 32 * c);
            let q = _mm512_broadcast_i64x4(_mm256_loadu_si256(q.as_ptr().cast()));
            let q = _mm512_multishift_epi64_epi8(ctx.nib, q);
            (_mm512_and_si512(q, m4), _mm512_shuffle_epi8(sc_all, *pat))
        };
        for ((l, y), p2) in li.iter_mut().zip(rows.y).zip(rows.pow2) {
            let at = 256 * b + 64 * c;
            // SAFETY: b < nb, and `rows` holds nb blocks.
            let (y, p2) = unsafe { (chunk::<i8, 64>(y, at), chunk::<i16, 32>(p2, at / 2)) };
            // The pair sums (≤ 2·15·127) times 2^shift (≤ 8) fit 16 bits.
            // SAFETY: no memory is accessed; the level was detected.
            unsafe {
                let p = _mm512_maddubs_epi16(q, load512(y));
                let p = _mm512_mullo_epi16(p, load512(p2));
                *l = _mm512_dpwssd_epi32(*l, p, sc);
            }
        }
    }
    let rows_of = st.acc.iter_mut().zip(&mut st.pm).zip(&mut st.sm4).zip(li);
    for (t, (((acc, pm), sm4), l)) in rows_of.enumerate() {
        // SAFETY: b < nb, and `rows` holds nb blocks and scales.
        let (dx, gsum) = unsafe { (*rows.d[t].get_unchecked(b), chunk(rows.gsum[t], 8 * b)) };
        // The scale products as `block_scales` rounds them.
        let (s_d, s_m) = (d * dx, dmin * dx);
        // SAFETY: no memory is accessed; the level was detected.
        let l =
            unsafe { _mm256_add_epi32(_mm512_castsi512_si256(l), _mm512_extracti64x4_epi64(l, 1)) };
        let a = acc.get_mut(i)?;
        *a = fma_lanes(*a, splat(s_d), l);
        *pm.get_mut(i)? = mins_madd(m16, gsum);
        *sm4.get_mut(i)? = s_m;
    }
    Some(())
}

/// Q4_K: per 32-byte chunk (groups `2c` low, `2c + 1` high 256 bits),
/// `vpmaddubsw(q, y)` times the pairs' `2^shift`, then `vpdpwssd` with the
/// group scales into the super-block's lanes (one chain of 4 `vpdpwssd`,
/// its halves summed at the end: the same integers); the float part on 256
/// bits. Runs of 4 super-blocks are unrolled ([`k4_block`] with constant
/// slots), so the accumulators, the mins' products and `dmin·d_x` stay in
/// registers (indexed by `b % 4` at run time they lived on the stack: in
/// cache, 8.15 → 7.3 ns a super-block on a Zen 4 core, with the one chain).
#[inline(always)]
fn q4_k<const R: usize>(
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
    let ctx = K4Ctx {
        pats: SCALE_PICK.each_ref().map(|p| load512(p)),
        nib: load512(&NIBBLE_SHIFT),
        pf: prefetch_distance(),
    };
    each_row::<R>(
        bytes,
        row_len,
        out,
        stride,
        #[inline(always)]
        |row, out| {
            // The offsets O[0..4] in the lanes of one vector; per run of 4
            // blocks, each block's `vpmaddwd` of its mins and sums and its
            // `dmin·d_x`, added when the run (or the row) ends.
            // SAFETY: no memory is accessed; the level was detected.
            let (off, pm) = unsafe { ([_mm_setzero_ps(); R], [[_mm_setzero_si128(); RUN]; R]) };
            let mut st = K4State {
                acc: [[zero(); RUN]; R],
                pm,
                sm4: [[0f32; RUN]; R],
                off,
            };
            in_runs(
                row,
                BS,
                &mut st,
                #[inline(always)]
                |st, b, i, blk| k4_block(&ctx, &rows, b, i, blk.try_into().ok()?, st),
                #[inline(always)]
                |st, n| {
                    for ((off, pm), sm4) in st.off.iter_mut().zip(&st.pm).zip(&st.sm4) {
                        *off = add_mins(*off, pm, sm4, n as u8);
                    }
                    Some(())
                },
            )?;
            for ((o, acc), off) in out.iter_mut().zip(st.acc).zip(st.off) {
                *o = finish_regs(acc, offsets(&to_array4(off)));
            }
            Some(())
        },
    )
}

/// `vpermb` indices: of Q3_K's 12 scale bytes `a = 0..4`, `b = 4..8`,
/// `c = 8..12`, the words `[a, b]`, `[a, b]` (low 128 bits) and `[c, c]`,
/// `[c, c]` (high 128 bits).
const S3_PERM: [u8; 32] = [
    0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11, 8, 9,
    10, 11,
];
/// `vpmultishiftqb` bit offsets: the scales' low nibbles (`a_k`, `b_k`,
/// then `a_k >> 4`, `b_k >> 4`) from `[a, b]`, and their bits 4, 5
/// (`c_k`'s bits `0, 1`, `2, 3`, `4, 5`, `6, 7`, at bits 4, 5) from
/// `[c, c]`.
const S3_SHIFT: [u8; 32] = [
    0, 8, 16, 24, 32, 40, 48, 56, 4, 12, 20, 28, 36, 44, 52, 60, 60, 4, 12, 20, 30, 38, 46, 54, 0,
    8, 16, 24, 34, 42, 50, 58,
];

/// Q3_K's 16 scales (6 bits, minus 32) as 16-bit lanes, from its 12 packed
/// bytes (as [`q3k_scales`](super::blocks::q3k_scales)): `sc_j` has the
/// low nibble of byte `j` (`j < 8`) or the high nibble of byte `j − 8`, and
/// bits 4, 5 from bits `2(j/4)`, `2(j/4) + 1` of byte `8 + j % 4`.
#[inline(always)]
fn q3k_scales_vbmi(blk: &[u8; 110]) -> __m256i {
    // SAFETY: the masked load reads bytes 96..108 of the 110-byte block;
    // the constants are 32 readable bytes; the level was detected.
    unsafe {
        let q = _mm256_maskz_loadu_epi8(0xfff, blk.as_ptr().add(96).cast());
        let w = _mm256_permutexvar_epi8(load256(&S3_PERM), q);
        let v = _mm256_multishift_epi64_epi8(load256(&S3_SHIFT), w);
        // Low nibbles from the low 128 bits, bits 4, 5 from the high.
        let lo = _mm256_castsi256_si128(v);
        let hi = _mm256_extracti128_si256::<1>(v);
        let sc = _mm_ternarylogic_epi32::<0xEA>(
            lo,
            _mm_set1_epi8(15),
            _mm_and_si128(hi, _mm_set1_epi8(48)),
        );
        _mm256_cvtepi8_epi16(_mm_sub_epi8(sc, _mm_set1_epi8(32)))
    }
}

/// `vpermw` indices: 16-bit lane `i` of a chunk pair's vector (values
/// `32c + 16q..` in quarter `q = i / 8`) takes scale `2c + q`.
const S3_PICK: [[u16; 32]; 4] = {
    let mut m = [[0u16; 32]; 4];
    let mut p = 0;
    while p < 4 {
        let mut i = 0;
        while i < 32 {
            m[p][i] = (4 * p + i / 8) as u16;
            i += 1;
        }
        p += 1;
    }
    m
};

/// `vpmultishiftqb` bit offsets picking, per chunk pair `p` (chunks `2p`,
/// `2p + 1`), the 2-bit codes of the pair's 32 bytes of `qs` (shifts
/// `2(c % 4)` of the low and high 256 bits) and the high bit `c` of `hmask`
/// at bit 2 (offset `c − 2`, rotated within the word).
const Q3_SHIFT: [[[u8; 64]; 2]; 4] = {
    let mut m = [[[0u8; 64]; 2]; 4];
    let mut p = 0;
    while p < 4 {
        let mut i = 0;
        while i < 64 {
            let c = 2 * p + i / 32;
            m[p][0][i] = (8 * (i % 8) + 2 * (c % 4)) as u8;
            m[p][1][i] = ((8 * (i % 8) + 64 + c - 2) % 64) as u8;
            i += 1;
        }
        p += 1;
    }
    m
};

/// Q3_K: per pair of 32-value chunks (chunk `2p` in the low, `2p + 1` in
/// the high 256 bits), the codes `u − 4` unpacked by `vpmultishiftqb`,
/// `vpmaddubsw(|q|, ±y)` times the pairs' `2^shift`, then `vpdpwssd` with
/// the per-16 scales into the super-block's lanes (two chains; the halves
/// summed at its end: the same integers as the 256-bit kernel's).
#[inline(always)]
fn q3_k<const R: usize>(
    bytes: &[u8],
    row_len: usize,
    acts: &[&QRow; R],
    _: &mut [f32],
    out: &mut [f32],
    stride: usize,
) -> Option<()> {
    const BS: usize = 110;
    let nb = row_len / BS;
    let rows = Rows::new(acts, nb, false)?;
    let picks = S3_PICK.each_ref().map(|p| load512(p));
    let shifts = Q3_SHIFT
        .each_ref()
        .map(|p| [load512(&p[0]), load512(&p[1])]);
    let pf = prefetch_distance();
    each_row::<R>(
        bytes,
        row_len,
        out,
        stride,
        #[inline(always)]
        |row, out| {
            let mut acc = [[zero(); RUN]; R];
            in_runs(
                row,
                BS,
                &mut acc,
                #[inline(always)]
                |acc, b, i, blk| {
                    let blk: &[u8; BS] = blk.try_into().ok()?;
                    prefetch_span(blk, pf);
                    let sc = q3k_scales_vbmi(blk);
                    // SAFETY: bytes 108..110 of the block, no other memory; the
                    // level was detected.
                    let (d, sc, mut li) = unsafe {
                        let h = u16::from_le_bytes([blk[108], blk[109]]);
                        let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))));
                        (
                            d,
                            _mm512_castsi256_si512(sc),
                            [[_mm512_setzero_si512(); 2]; R],
                        )
                    };
                    for (p, (pick, sh)) in picks.iter().zip(&shifts).enumerate() {
                        // SAFETY: bytes 0..32 and 32 + 32·(p/2)..+32 of the block;
                        // the level was detected.
                        let (q, neg, s16) = unsafe {
                            let hm = chunk::<u8, 32>(blk, 0);
                            let qs = chunk::<u8, 32>(blk, 32 + 32 * (p / 2));
                            let hm = _mm512_broadcast_i64x4(_mm256_loadu_si256(hm.as_ptr().cast()));
                            let qs = _mm512_broadcast_i64x4(_mm256_loadu_si256(qs.as_ptr().cast()));
                            let lo = _mm512_multishift_epi64_epi8(sh[0], qs);
                            let hi = _mm512_multishift_epi64_epi8(sh[1], hm);
                            let hi = _mm512_and_si512(hi, _mm512_set1_epi8(4));
                            let u = _mm512_ternarylogic_epi32::<0xEA>(lo, _mm512_set1_epi8(3), hi);
                            let q = _mm512_sub_epi8(u, _mm512_set1_epi8(4));
                            (
                                _mm512_abs_epi8(q),
                                _mm512_movepi8_mask(q),
                                _mm512_permutexvar_epi16(*pick, sc),
                            )
                        };
                        for ((l, y), p2) in li.iter_mut().zip(rows.y).zip(rows.pow2) {
                            let at = 256 * b + 64 * p;
                            // SAFETY: b < nb, and `rows` holds nb blocks.
                            let (y, p2) =
                                unsafe { (chunk::<i8, 64>(y, at), chunk::<i16, 32>(p2, at / 2)) };
                            // |q|·(±y): the pair sums (≤ 2·4·127) times 2^shift
                            // (≤ 16) fit 16 bits.
                            // SAFETY: no memory is accessed; the level was detected.
                            unsafe {
                                let y = load512(y);
                                let y = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
                                let pr = _mm512_maddubs_epi16(q, y);
                                let pr = _mm512_mullo_epi16(pr, load512(p2));
                                l[p & 1] = _mm512_dpwssd_epi32(l[p & 1], pr, s16);
                            }
                        }
                    }
                    for (t, (acc, l)) in acc.iter_mut().zip(li).enumerate() {
                        // SAFETY: b < nb, and `rows` holds nb scales.
                        let dx = unsafe { *rows.d[t].get_unchecked(b) };
                        // SAFETY: no memory is accessed; the level was detected.
                        let l = unsafe {
                            let l = _mm512_add_epi32(l[0], l[1]);
                            _mm256_add_epi32(
                                _mm512_castsi512_si256(l),
                                _mm512_extracti64x4_epi64(l, 1),
                            )
                        };
                        let a = acc.get_mut(i)?;
                        *a = fma_lanes(*a, splat(d * dx), l);
                    }
                    Some(())
                },
                |_, _| Some(()),
            )?;
            for (o, acc) in out.iter_mut().zip(acc) {
                *o = finish_regs(acc, offsets(&[0f32; RUN]));
            }
            Some(())
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::fast::dot::k4_scales_mins;
    use crate::cpu::SimdLevel;
    use rand::{Rng, SeedableRng};

    /// The VBMI unpacking of the scales and mins is ggml's, on random bytes.
    #[test]
    fn scales_mins_vbmi_match_scalar() {
        if !SimdLevel::Avx512Vnni.is_supported() {
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for _ in 0..2000 {
            let mut blk = [0u8; 144];
            rng.fill(&mut blk[..]);
            let q: &[u8; 12] = blk[4..16].try_into().unwrap();
            let (sc, m) = k4_scales_mins(q);
            let got = Avx512Vnni::enter(
                #[inline(always)]
                || {
                    let mut v = [0u8; 16];
                    // SAFETY: `v` is 16 writable bytes; the level was
                    // detected above.
                    unsafe {
                        _mm_storeu_si128(v.as_mut_ptr().cast(), k4_scales_mins_vbmi(&blk));
                    }
                    v
                },
            );
            assert_eq!(&got[..8], &sc[..], "{q:?}");
            assert_eq!(&got[8..], &m[..], "{q:?}");
        }
    }

    /// The VBMI unpacking of Q3_K's scales is ggml's, on random bytes.
    #[test]
    fn q3k_scales_vbmi_match_scalar() {
        if !SimdLevel::Avx512Vnni.is_supported() {
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(6);
        for _ in 0..2000 {
            let mut blk = [0u8; 110];
            rng.fill(&mut blk[..]);
            let want = super::super::blocks::q3k_scales(blk[96..108].try_into().unwrap());
            let got = Avx512Vnni::enter(
                #[inline(always)]
                || {
                    let mut v = [0i16; 16];
                    // SAFETY: `v` is 32 writable bytes; the level was
                    // detected above.
                    unsafe {
                        _mm256_storeu_si256(v.as_mut_ptr().cast(), q3k_scales_vbmi(&blk));
                    }
                    v
                },
            );
            assert_eq!(got, want, "{:?}", &blk[96..108]);
        }
    }
}
