//! The 256-bit kernels of the formats of [`super::blocks`] and of MLX
//! affine rows of 2, 3, 5, 6 and 8 bits, generic over the level's byte
//! multiply-add ([`Dot`]: AVX2, AVX-VNNI, and AVX512-VNNI's EVEX forms on
//! 256-bit vectors; the affine rows at AVX512-VNNI take
//! [`super::affine_zmm`]). Each format only unpacks its codes into a vector
//! ([`Block32X86`], [`SuperBlockX86`], [`affine_codes`]); the dots, scales
//! and accumulators are shared:
//!
//! - 32-weight blocks (and affine blocks of 32): Q8_0's kernel,
//!   [`Dot::dot_i8`] of the centred codes with the activation codes in
//!   value order, times the lanes' scales; blocks after a row's last whole
//!   run of 4 take the portable lanes.
//! - K-quant super-blocks: Q4_K's, per chunk of 32 codes `vpmaddubsw(u,
//!   y)` (centred codes: `vpmaddubsw(|q|, sign(y, q))`) times the pairs'
//!   `2^shift`, then [`Dot::dpwssd`] with the per-16 scales; the mins as
//!   one `vpmaddwd` of the 16 mins with the activations' 16-bit sums of 16.
//!
//! # Safety
//!
//! As in [`super::x86`] ("the level was detected"); rows are read through
//! [`chunk`] where [`Rows::new`] checked their lengths once.

// Functions are passed on wrapped in `#[inline(always)]` closures: a
// function item passed as a value may stay out of line, compiled without the
// level's features (its intrinsics then become calls).
#![allow(clippy::redundant_closure)]

use super::affine::{drive, tail_codes, Scale, ScaleType};
use super::blocks::{
    bytes32, lanes32, row_scales, Block32, SuperBlock, Q2_K, Q3_K, Q4_1, Q5_0, Q5_1, Q5_K, Q6_K,
};
use super::x86::{
    self, acc_of, fma_lanes, load256, load_x16, prefetch_at, prefetch_distance, splat, Avx2,
    AvxVnni, Dot,
};
use super::ymm::scale_lanes;
use super::{
    add_block_scaled, add_offset, chunk, each_row, finish, in_runs, offsets, Acc, QRow, Rows, Run,
    RUN,
};
use crate::cpu::SimdLevel;
use crate::error::Result;
use crate::format::ggml::GgmlType;
use crate::format::RowDecoder;
use half::{bf16, f16};
use std::arch::x86_64::*;

/// A [`Block32`] type's codes in a vector.
pub(super) trait Block32X86: Block32 {
    /// The centred codes `u − c` of a block of `BS` bytes, as signed bytes.
    fn codes_ymm(blk: &[u8]) -> Option<__m256i>;
}

/// A [`SuperBlock`] type's codes in a vector.
pub(super) trait SuperBlockX86: SuperBlock {
    /// The unsigned codes of chunk `c < 8` (values `32c..32c + 32`).
    fn chunk_ymm(blk: &[u8], c: usize) -> Option<__m256i>;
}

/// The codes of 16 nibble bytes: low nibbles (values 0..16) in the low
/// half, high nibbles in the high half.
#[inline(always)]
fn nibbles16(qs: &[u8]) -> Option<__m256i> {
    let qs: &[u8; 16] = qs.get(..16)?.try_into().ok()?;
    // SAFETY: `qs` is 16 readable bytes; the level was detected.
    Some(unsafe {
        let q = _mm_loadu_si128(qs.as_ptr().cast());
        let m4 = _mm_set1_epi8(15);
        let lo = _mm_and_si128(q, m4);
        let hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
        _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1)
    })
}

/// Bit `i` of `qh` as bit 4 of byte `i` (ggml's `bytes_from_bits_32`).
#[inline(always)]
fn high_bits(qh: u32) -> __m256i {
    // SAFETY: no memory is accessed; the level was detected.
    unsafe {
        let t = _mm256_set1_epi32(qh as i32);
        let shuf = _mm256_setr_epi64x(
            0,
            0x0101_0101_0101_0101,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
        );
        let b = _mm256_shuffle_epi8(t, shuf);
        let b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
        let set = _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
        _mm256_and_si256(set, _mm256_set1_epi8(16))
    }
}

/// `v − c` byte by byte.
#[inline(always)]
fn centre(v: __m256i, c: u8) -> __m256i {
    // SAFETY: no memory is accessed; the level was detected.
    unsafe { _mm256_sub_epi8(v, _mm256_set1_epi8(c as i8)) }
}

/// `a | b`.
#[inline(always)]
fn or(a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: no memory is accessed; the level was detected.
    unsafe { _mm256_or_si256(a, b) }
}

/// The `u32` at byte `at` of `b`.
#[inline(always)]
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

impl Block32X86 for Q4_1 {
    #[inline(always)]
    fn codes_ymm(blk: &[u8]) -> Option<__m256i> {
        Some(centre(nibbles16(blk.get(4..)?)?, Self::CENTRE))
    }
}

impl Block32X86 for Q5_0 {
    #[inline(always)]
    fn codes_ymm(blk: &[u8]) -> Option<__m256i> {
        let u = or(nibbles16(blk.get(6..)?)?, high_bits(u32_at(blk, 2)?));
        Some(centre(u, Self::CENTRE))
    }
}

impl Block32X86 for Q5_1 {
    #[inline(always)]
    fn codes_ymm(blk: &[u8]) -> Option<__m256i> {
        let u = or(nibbles16(blk.get(8..)?)?, high_bits(u32_at(blk, 4)?));
        Some(centre(u, Self::CENTRE))
    }
}

/// `(v >> n) & mask` of each byte (16-bit shifts: bits from the next byte
/// are masked off).
#[inline(always)]
fn shr_mask(v: __m256i, n: usize, mask: u8) -> __m256i {
    // SAFETY: no memory is accessed; the level was detected.
    unsafe {
        let v = _mm256_srl_epi16(v, _mm_cvtsi32_si128(n as i32));
        _mm256_and_si256(v, _mm256_set1_epi8(mask as i8))
    }
}

/// `v << n` of each byte whose bits above `8 − n` are clear.
#[inline(always)]
fn shl_bytes(v: __m256i, n: usize) -> __m256i {
    // SAFETY: no memory is accessed; the level was detected.
    unsafe { _mm256_sll_epi16(v, _mm_cvtsi32_si128(n as i32)) }
}

/// 32 bytes of `b` from `at` in a vector.
#[inline(always)]
fn load_at(b: &[u8], at: usize) -> Option<__m256i> {
    Some(load256(bytes32(b, at)?))
}

impl SuperBlockX86 for Q2_K {
    #[inline(always)]
    fn chunk_ymm(blk: &[u8], c: usize) -> Option<__m256i> {
        Some(shr_mask(load_at(blk, 16 + 32 * (c / 4))?, 2 * (c % 4), 3))
    }
}

impl SuperBlockX86 for Q3_K {
    #[inline(always)]
    fn chunk_ymm(blk: &[u8], c: usize) -> Option<__m256i> {
        let lo = shr_mask(load_at(blk, 32 + 32 * (c / 4))?, 2 * (c % 4), 3);
        let hi = shr_mask(load_at(blk, 0)?, c, 1);
        Some(or(lo, shl_bytes(hi, 2)))
    }
}

impl SuperBlockX86 for Q5_K {
    #[inline(always)]
    fn chunk_ymm(blk: &[u8], c: usize) -> Option<__m256i> {
        let lo = shr_mask(load_at(blk, 48 + 32 * (c / 2))?, 4 * (c % 2), 15);
        let hi = shr_mask(load_at(blk, 16)?, c, 1);
        Some(or(lo, shl_bytes(hi, 4)))
    }
}

impl SuperBlockX86 for Q6_K {
    #[inline(always)]
    fn chunk_ymm(blk: &[u8], c: usize) -> Option<__m256i> {
        let (n, s) = (c / 4, c % 4);
        let lo = shr_mask(load_at(blk, 64 * n + 32 * (s % 2))?, 4 * (s / 2), 15);
        let hi = shr_mask(load_at(blk, 128 + 32 * n)?, 2 * s, 3);
        Some(or(lo, shl_bytes(hi, 4)))
    }
}

/// The run of `R` activation rows for weights of type `t` of
/// [`super::blocks`]' families at level `D`.
pub(super) fn run_for<D: Dot, const R: usize>(t: GgmlType) -> Option<Run<R>> {
    Some(match t {
        GgmlType::Q4_1 => run32::<Q4_1, D, R>,
        GgmlType::Q5_0 => run32::<Q5_0, D, R>,
        GgmlType::Q5_1 => run32::<Q5_1, D, R>,
        GgmlType::Q2_K => run256::<Q2_K, D, R>,
        GgmlType::Q3_K => run256::<Q3_K, D, R>,
        GgmlType::Q5_K => run256::<Q5_K, D, R>,
        GgmlType::Q6_K => run256::<Q6_K, D, R>,
        _ => return None,
    })
}

// This file's kernels as Runs inside their level (`level_run!`, qdot/mod.rs).
level_run!(run32 [B: Block32X86, D: Dot, const R: usize], D, blocks32::<B, D, R>);
level_run!(run256 [B: SuperBlockX86, D: Dot, const R: usize], D, super_blocks::<B, D, R>);

/// The f16 at byte `at` (0 or 2) of blocks `b0..b0 + 8` of `B`'s blocks of
/// `row` (zeros past its end), widened by F16C ([`x86::widen8_f16c`] with
/// the block size as a constant).
#[inline(always)]
fn widen8_f16c<B: Block32>(row: &[u8], b0: usize, at: usize) -> [f32; 8] {
    macro_rules! by_size {
        ($($bs:literal),*) => {
            match (B::BS, at) {
                $(($bs, 0) => x86::widen8_f16c::<$bs, 0>(row, b0),
                ($bs, _) => x86::widen8_f16c::<$bs, 2>(row, b0),)*
                _ => [0.0; 8],
            }
        };
    }
    by_size!(20, 22, 24)
}

/// `acc[k] = fma(s·m, f32(dot_i8(w, y)), acc[k])` of block `b` against the
/// `R` rows: the 32-value blocks' step, with the block's scale product of
/// row `t` from `sb(t)`.
#[inline(always)]
fn block_step<D: Dot, const R: usize>(
    acc: &mut [[__m256; RUN]; R],
    k: usize,
    w: __m256i,
    rows: &Rows<'_, R>,
    b: usize,
    sb: impl Fn(usize) -> f32,
) {
    for (t, acc) in acc.iter_mut().enumerate() {
        // SAFETY: b < nb, and `rows` holds nb blocks (the callers' checks).
        let (y, c, m) = unsafe {
            (
                chunk(rows.y[t], 32 * b),
                chunk(rows.bias[t], 8 * b),
                chunk(rows.lscale[t], 8 * b),
            )
        };
        let l = D::dot_i8(w, load256(y), c);
        if let Some(a) = acc.get_mut(k) {
            *a = fma_lanes(*a, scale_lanes(splat(sb(t)), m), l);
        }
    }
}

/// [`Block32`] rows: [`block_step`] per block, the blocks after the last
/// whole run of 4 with the portable lanes, the scale products and min terms
/// of [`row_scales`].
#[inline(always)]
fn blocks32<B: Block32X86, D: Dot, const R: usize>(
    bytes: &[u8],
    row_len: usize,
    acts: &[&QRow; R],
    s: &mut [f32],
    out: &mut [f32],
    stride: usize,
) -> Option<()> {
    let nb = row_len / B::BS;
    let rows = Rows::new(acts, nb, true)?;
    let pf = prefetch_distance();
    each_row::<R>(
        bytes,
        row_len,
        out,
        stride,
        #[inline(always)]
        |row, out| {
            let (st, p) = row_scales::<B, R>(
                row,
                acts,
                &rows.d,
                s,
                #[inline(always)]
                |r, b0, at| widen8_f16c::<B>(r, b0, at),
            )?;
            let mut acc = [[super::x86::zero(); RUN]; R];
            for (g, run) in row.chunks_exact(RUN * B::BS).enumerate() {
                prefetch_at(run, 0, RUN * B::BS, pf);
                for (k, blk) in run.chunks_exact(B::BS).enumerate() {
                    let b = RUN * g + k;
                    // SAFETY: b < nb and `st` holds R·nb scales.
                    let sb = |t: usize| unsafe { *st.get_unchecked(t * nb + b) };
                    block_step::<D, R>(&mut acc, k, B::codes_ymm(blk)?, &rows, b, sb);
                }
            }
            for (t, ((o, acc), p)) in out.iter_mut().zip(acc).zip(p).enumerate() {
                let (st, a) = (st.get(t * nb..(t + 1) * nb)?, acts.get(t)?);
                let mut acc = acc_of(acc);
                for b in nb / RUN * RUN..nb {
                    let (l, m) = lanes32::<B>(row.get(b * B::BS..)?, a, nb, b)?;
                    add_block_scaled(&mut acc, b, *st.get(b)?, &m, l);
                }
                *o = finish(&acc, -p);
            }
            Some(())
        },
    )
}

/// `vpshufb` patterns: 16-bit lane `2c` of each 128-bit half in every lane
/// of the low half, lane `2c + 1` in the high half.
pub(super) const PAIR_SHUF: [[u8; 32]; 4] = {
    let mut m = [[0u8; 32]; 4];
    let mut c = 0;
    while c < 4 {
        let mut i = 0;
        while i < 16 {
            let g = if i < 8 { 2 * c } else { 2 * c + 1 };
            m[c][2 * i] = (2 * g) as u8;
            m[c][2 * i + 1] = (2 * g + 1) as u8;
            i += 1;
        }
        c += 1;
    }
    m
};

/// `Σ_h a_h·b_h` of 16 16-bit values: one `vpmaddwd`, then the 8 products
/// summed (exact integers).
#[inline(always)]
fn dot16(a: &[i16; 16], b: &[i16; 16]) -> i32 {
    // SAFETY: `a`, `b` are 32 readable bytes each; the level was detected.
    unsafe {
        let p = _mm256_madd_epi16(load_x16(a), load_x16(b));
        let p = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
        let p = _mm_add_epi32(p, _mm_shuffle_epi32::<0b01_00_11_10>(p));
        let p = _mm_add_epi32(p, _mm_shuffle_epi32::<0b10_11_00_01>(p));
        _mm_cvtsi128_si32(p)
    }
}

/// [`SuperBlock`] rows (see the module doc).
#[inline(always)]
fn super_blocks<B: SuperBlockX86, D: Dot, const R: usize>(
    bytes: &[u8],
    row_len: usize,
    acts: &[&QRow; R],
    _: &mut [f32],
    out: &mut [f32],
    stride: usize,
) -> Option<()> {
    let nb = row_len / B::BS;
    let rows = Rows::new(acts, nb, false)?;
    let pf = prefetch_distance();
    each_row::<R>(
        bytes,
        row_len,
        out,
        stride,
        #[inline(always)]
        |row, out| {
            let mut st = ([[super::x86::zero(); RUN]; R], [[0f32; RUN]; R]);
            in_runs(
                row,
                B::BS,
                &mut st,
                #[inline(always)]
                |(acc, off), b, i, blk| {
                    prefetch_at(blk, 0, B::BS, pf);
                    let meta = B::meta(blk)?;
                    // SAFETY: `meta.sc` is 32 readable bytes; the level was
                    // detected.
                    let (sc_lo, sc_hi) = unsafe {
                        let p = meta.sc.as_ptr();
                        (
                            _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast())),
                            _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(8).cast())),
                        )
                    };
                    // One integer accumulator per row: a chain of 8
                    // `vpdpwssd` (two chains and their sum measured slower:
                    // the compiler split the first of each into
                    // `vpmaddwd` + `vpaddd`).
                    // SAFETY: no memory is accessed; the level was detected.
                    let mut li = [unsafe { _mm256_setzero_si256() }; R];
                    for c in 0..8 {
                        let u = B::chunk_ymm(blk, c)?;
                        // Centred codes: signed.
                        let u = if B::CENTRE == 0 {
                            u
                        } else {
                            centre(u, B::CENTRE)
                        };
                        let half = if c < 4 { sc_lo } else { sc_hi };
                        // SAFETY: no memory is accessed but the pattern; the
                        // level was detected.
                        let s16 = unsafe { _mm256_shuffle_epi8(half, load256(&PAIR_SHUF[c % 4])) };
                        let at = 256 * b + 32 * c;
                        for (l, (y, p2)) in li.iter_mut().zip(rows.y.iter().zip(rows.pow2)) {
                            // SAFETY: b < nb, and `rows` holds nb blocks; the
                            // pair sums times 2^shift fit 16 bits (the kind's
                            // largest shift); the level was detected.
                            let p = unsafe {
                                let y = load256(chunk(y, at));
                                let pairs = if B::CENTRE == 0 {
                                    _mm256_maddubs_epi16(u, y)
                                } else {
                                    _mm256_maddubs_epi16(_mm256_abs_epi8(u), _mm256_sign_epi8(y, u))
                                };
                                _mm256_mullo_epi16(pairs, load_x16(chunk(p2, at / 2)))
                            };
                            *l = D::dpwssd(*l, p, s16);
                        }
                    }
                    for (t, ((acc, off), l)) in
                        acc.iter_mut().zip(off.iter_mut()).zip(li).enumerate()
                    {
                        // SAFETY: b < nb, and `rows` holds nb blocks and scales.
                        let (dx, hs) =
                            unsafe { (*rows.d[t].get_unchecked(b), chunk(rows.hsum[t], 16 * b)) };
                        let a = acc.get_mut(i)?;
                        *a = fma_lanes(*a, splat(meta.d * dx), l);
                        if B::CENTRE == 0 {
                            add_offset(off, i, meta.f * dx, dot16(&meta.om, hs) as f32);
                        }
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

/// `vpshufb` pattern of 8 codes of `bits` bits (`bits` bytes, LSB-first):
/// 16-bit lane `j` gets the bytes holding bits `bits·j..bits·(j + 1)`.
const fn code_shuf(bits: usize) -> [u8; 16] {
    let mut m = [0x80u8; 16];
    let mut j = 0;
    while j < 8 {
        let at = bits * j / 8;
        m[2 * j] = at as u8;
        if at + 1 < bits {
            m[2 * j + 1] = (at + 1) as u8;
        }
        j += 1;
    }
    m
}

/// 16-bit multipliers that shift code `j` of [`code_shuf`] to the top bits.
const fn code_mul(bits: usize) -> [i16; 8] {
    let mut m = [0i16; 8];
    let mut j = 0;
    while j < 8 {
        m[j] = 1 << (16 - bits - (bits * j) % 8);
        j += 1;
    }
    m
}

/// The centred codes of block `b` of a row of `BITS`-bit MLX codes (not
/// 4): 8 bits as bytes `q ^ 0x80`; 2, 3, 5, 6 bits per 8 codes (`BITS`
/// bytes, one 128-bit half): each code's two bytes into a 16-bit lane
/// ([`code_shuf`]), shifted to the top ([`code_mul`]) and down, packed to
/// bytes.
#[inline(always)]
pub(super) fn affine_codes<const BITS: u32>(row: &[u8], b: usize) -> Option<__m256i> {
    if BITS == 8 {
        let v = load_at(row, 32 * b)?;
        // SAFETY: no memory is accessed; the level was detected.
        return Some(unsafe { _mm256_xor_si256(v, _mm256_set1_epi8(i8::MIN)) });
    }
    let bits = BITS as usize;
    let at = 4 * bits * b;
    // The loads read 16 bytes from each 8 codes' first byte: from the row
    // where it has them, else from a copy of the block.
    let mut buf = [0u8; 48];
    let p = match row.get(at..at + 3 * bits + 16) {
        Some(v) => v.as_ptr(),
        None => {
            buf.get_mut(..4 * bits)?
                .copy_from_slice(row.get(at..at + 4 * bits)?);
            buf.as_ptr()
        }
    };
    let shuf = const { code_shuf(BITS as usize) };
    let mul = const { code_mul(BITS as usize) };
    // SAFETY: `p` has 3·BITS + 16 readable bytes (the row's, or `buf`'s
    // 48 ≥ 3·6 + 16); the patterns are 16 readable bytes; the level was
    // detected.
    Some(unsafe {
        let half = |at: usize| _mm_loadu_si128(p.add(at).cast());
        let pat = _mm256_broadcastsi128_si256(_mm_loadu_si128(shuf.as_ptr().cast()));
        let m = _mm256_broadcastsi128_si256(_mm_loadu_si128(mul.as_ptr().cast()));
        let sh = _mm_cvtsi32_si128(16 - BITS as i32);
        let codes16 = |lo: usize, hi: usize| {
            let v = _mm256_set_m128i(half(hi), half(lo));
            _mm256_srl_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(v, pat), m), sh)
        };
        let (a, c) = (codes16(0, bits), codes16(2 * bits, 3 * bits));
        // Packed: codes 0..8, 16..24, 8..16, 24..32.
        let v = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi16(a, c));
        _mm256_sub_epi8(v, _mm256_set1_epi8(1 << (BITS - 1)))
    })
}

/// The run of `R` activation rows for affine rows of `bits` bits (not 4)
/// with scales of dtype `s` at the AVX2 and AVX-VNNI levels (AVX512-VNNI:
/// [`super::affine_zmm`]).
pub(super) fn affine_run_for<const R: usize>(
    level: SimdLevel,
    bits: u32,
    s: ScaleType,
) -> Option<Run<R>> {
    macro_rules! by_bits {
        ($d:ty, $s:ty) => {
            match bits {
                2 => Some(run_affine::<$d, $s, 2, R>),
                3 => Some(run_affine::<$d, $s, 3, R>),
                5 => Some(run_affine::<$d, $s, 5, R>),
                6 => Some(run_affine::<$d, $s, 6, R>),
                8 => Some(run_affine::<$d, $s, 8, R>),
                _ => None,
            }
        };
    }
    macro_rules! by_scale {
        ($d:ty) => {
            match s {
                ScaleType::F32 => by_bits!($d, f32),
                ScaleType::F16 => by_bits!($d, f16),
                ScaleType::Bf16 => by_bits!($d, bf16),
            }
        };
    }
    match level {
        SimdLevel::Avx2 => by_scale!(Avx2),
        SimdLevel::AvxVnni => by_scale!(AvxVnni),
        _ => None,
    }
}

/// The 256-bit run of `BITS`-bit affine rows at level `D`.
#[allow(clippy::too_many_arguments)] // a Run
fn run_affine<D: Dot, S: Scale, const BITS: u32, const R: usize>(
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
                |row, st, rows, acts, nb| affine_lanes::<D, BITS, R>(row, st, rows, acts, nb),
            )
        },
    )
}

/// A row's lane accumulators: [`block_step`] per block of 32 codes.
#[inline(always)]
fn affine_lanes<D: Dot, const BITS: u32, const R: usize>(
    row: &[u8],
    st: &[f32],
    rows: &Rows<'_, R>,
    acts: &[&QRow; R],
    nb: usize,
) -> Option<[(Acc, [f32; RUN]); R]> {
    if row.len() != 4 * BITS as usize * nb || st.len() < nb {
        return None;
    }
    let mut acc = [[super::x86::zero(); RUN]; R];
    let (bs, pf) = (4 * BITS as usize, prefetch_distance());
    for g in 0..nb / RUN {
        prefetch_at(row, RUN * bs * g, RUN * bs, pf);
        for k in 0..RUN {
            let b = RUN * g + k;
            // SAFETY: b < nb ≤ st.len().
            let sb = unsafe { *st.get_unchecked(b) };
            block_step::<D, R>(&mut acc, k, affine_codes::<BITS>(row, b)?, rows, b, |_| sb);
        }
    }
    let mut accs = [([[0f32; 8]; RUN], [0f32; RUN]); R];
    for (t, (a, acc)) in accs.iter_mut().zip(acc).enumerate() {
        a.0 = acc_of(acc);
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
