//! Fused dot kernels of the 32-weight GGUF blocks (Q4_0, Q4_1, Q5_0, Q5_1,
//! Q8_0, and the table-coded IQ4_NL and MXFP4), and of NVFP4's 64-weight
//! blocks of four 16-weight groups ([`nvfp4_dot`]).
//!
//! A row is viewed as `&[Block]` (the blocks are 2-aligned `Pod` structs; an
//! unaligned row falls back to decode-then-dot). Each block widens its scale
//! (and min) with one F16C conversion from memory ([`Simd::f16_pair`]) and
//! its 32 codes 8 bytes at a time ([`U8Ops::bytes`]), adds `d·q·x` to its
//! accumulators ([`block_fma`]; even and odd blocks use separate ones) and
//! `m·Σx` (with `m = d·OFFSET` for the types without a min) to the offset,
//! from the block sums of `x`.

use super::simd::{whole, F8Ops, Simd, U8Ops};
use super::{arr, XSums, L};
use crate::format::ggml::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0};
use crate::format::ggml::nonlinear::{
    e8m0_to_f32_half, ue4m3_to_f32_half, BlockIQ4_NL, BlockMXFP4, BlockNVFP4, KVALUES_IQ4NL,
    KVALUES_MXFP4,
};
use bytemuck::Pod;

/// A 32-weight block: weight `i` is `d·(q_i + OFFSET)`, or `d·q_i + m` for
/// the types with a min.
pub(super) trait Block32: Pod {
    /// Code offset of the types without a min.
    const OFFSET: f32;
    /// Whether the block stores a min `m`.
    const HAS_MIN: bool;
    /// The scale and, for the types with a min, the min (else unused):
    /// every block starts with `d` and, if it has one, `m` (f16 each).
    /// (Widening them in integer registers instead measured the same for
    /// Q4_0 and a third slower for Q4_1.)
    #[inline(always)]
    fn dm<V: Simd>(&self) -> (f32, f32) {
        let b: &[u8] = bytemuck::bytes_of(self);
        b.get(..8).and_then(arr).map_or((0.0, 0.0), V::f16_pair)
    }
    /// The 32 codes widened (without `OFFSET`), weights `8i..8i+8` in
    /// vector `i`.
    fn codes<V: Simd>(&self) -> [V::F8; 4];
}

/// Dot of a row of `B` blocks with `x`; `None` if the row is not 2-aligned
/// or the lengths disagree. Runs out of line, in [`Simd::enter`].
#[inline(always)]
pub(super) fn dot_blocks<B: Block32, V: Simd>(bytes: &[u8], x: &[f32], xs: &XSums) -> Option<f32> {
    V::enter(
        #[inline(always)]
        || blocks_dot::<B, V>(bytes, x, xs),
    )
}

/// [`dot_blocks`]' body.
#[inline(always)]
fn blocks_dot<B: Block32, V: Simd>(bytes: &[u8], x: &[f32], xs: &XSums) -> Option<f32> {
    let blocks: &[B] = bytemuck::try_cast_slice(bytes).ok()?;
    let sums = xs.of(32);
    if x.len() != blocks.len() * L || sums.len() != blocks.len() {
        return None;
    }
    // One accumulator per block of a pair: each block's scaled sum waits
    // only on the previous block of the same parity.
    let mut acc = [V::F8::zero(); 2];
    // Σ_b m_b·Σx_b, or Σ_b d_b·Σx_b (times OFFSET at the end).
    let mut off = [0f32; 2];
    let pairs = blocks.chunks_exact(2);
    let tail = pairs.remainder();
    let xp = x.chunks_exact(2 * L);
    let sp = sums.chunks_exact(2);
    for ((b2, x2), s2) in pairs.zip(xp).zip(sp) {
        for (i, ((b, xb), &s)) in b2.iter().zip(x2.chunks_exact(L)).zip(s2).enumerate() {
            if let (Some(acc), Some(off), Some(xb)) = (acc.get_mut(i), off.get_mut(i), arr(xb)) {
                block_fma::<B, V>(b, xb, s, acc, off);
            }
        }
    }
    if let (Some(b), Some(xb), Some(&s)) = (tail.first(), x.rchunks_exact(L).next(), sums.last()) {
        block_fma::<B, V>(b, arr(xb)?, s, &mut acc[0], &mut off[0]);
    }
    let lanes = acc[0].add(acc[1]);
    let off = off[0] + off[1];
    let off = if B::HAS_MIN { off } else { B::OFFSET * off };
    Some(lanes.sum() + off)
}

/// One block: `acc += d·q·x`, `off += m·Σx` (`d·Σx` for the types without
/// a min). The products are summed in one chain and scaled once: the
/// kernel is bound by the two vector pipes that multiply and convert.
#[inline(always)]
fn block_fma<B: Block32, V: Simd>(b: &B, x: &[f32; L], s: f32, acc: &mut V::F8, off: &mut f32) {
    let (d, m) = b.dm::<V>();
    let p = whole(b.codes::<V>(), x);
    *acc = V::F8::splat(d).fma(p, *acc);
    let m = if B::HAS_MIN { m } else { d };
    *off = V::fma(m, s, *off);
}

/// Codes of a 32-weight block from 16 nibble bytes (low nibbles are weights
/// 0..16, high nibbles 16..32), bit 4 of weight j from bit j of `qh`.
#[inline(always)]
fn nibble_codes<V: Simd>(qs: &[u8; 16], qh: Option<u32>) -> [V::F8; 4] {
    let half = |i: usize| {
        qs.get(8 * i..8 * i + 8)
            .and_then(arr)
            .map_or(V::U8::splat(0), V::U8::bytes)
    };
    let (v0, v1) = (half(0), half(1));
    let mut q = [v0.and(15), v1.and(15), v0.shr(4), v1.shr(4)];
    if let Some(qh) = qh {
        for (i, q) in q.iter_mut().enumerate() {
            // Bits 8i..8i+8 of qh to bit 4 of lanes 0..8.
            let h = V::U8::splat(((qh >> (8 * i)) & 0xff) << 4)
                .shr_by_lane()
                .and(16);
            *q = q.or(h);
        }
    }
    q.map(V::U8::to_f32)
}

impl Block32 for BlockQ4_0 {
    const OFFSET: f32 = -8.0;
    const HAS_MIN: bool = false;
    #[inline(always)]
    fn codes<V: Simd>(&self) -> [V::F8; 4] {
        nibble_codes::<V>(&self.qs, None)
    }
}

impl Block32 for BlockQ4_1 {
    const OFFSET: f32 = 0.0;
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn codes<V: Simd>(&self) -> [V::F8; 4] {
        nibble_codes::<V>(&self.qs, None)
    }
}

impl Block32 for BlockQ5_0 {
    const OFFSET: f32 = -16.0;
    const HAS_MIN: bool = false;
    #[inline(always)]
    fn codes<V: Simd>(&self) -> [V::F8; 4] {
        nibble_codes::<V>(&self.qs, Some(u32::from_le_bytes(self.qh)))
    }
}

impl Block32 for BlockQ5_1 {
    const OFFSET: f32 = 0.0;
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn codes<V: Simd>(&self) -> [V::F8; 4] {
        nibble_codes::<V>(&self.qs, Some(u32::from_le_bytes(self.qh)))
    }
}

impl Block32 for BlockQ8_0 {
    const OFFSET: f32 = 0.0;
    const HAS_MIN: bool = false;
    #[inline(always)]
    fn codes<V: Simd>(&self) -> [V::F8; 4] {
        std::array::from_fn(|i| {
            let b = self.qs.get(8 * i..8 * i + 8).and_then(arr);
            b.map_or(V::F8::zero(), |b| V::U8::signed_bytes(b).to_f32())
        })
    }
}

/// A 16-entry code table as f32 (exact: the entries are small integers).
const fn table_f32(t: &[i8; 16]) -> [f32; 16] {
    let mut out = [0f32; 16];
    let mut i = 0;
    while i < 16 {
        out[i] = t[i] as f32;
        i += 1;
    }
    out
}

/// `kvalues_iq4nl` as f32.
pub(super) const IQ4NL_F32: [f32; 16] = table_f32(&KVALUES_IQ4NL);
/// `kvalues_mxfp4` as f32.
const MXFP4_F32: [f32; 16] = table_f32(&KVALUES_MXFP4);

/// The 32 table values of 16 nibble bytes (low nibbles are weights 0..16,
/// high nibbles 16..32), looked up 8 lanes at a time ([`U8Ops::lookup16`]).
/// (Written out: an array `map` with a closure was left out of line in the
/// IQ4_XS kernel, its intrinsics compiled as calls, 60× slower.)
#[inline(always)]
pub(super) fn table_codes<V: Simd>(qs: &[u8; 16], table: &[f32; 16]) -> [V::F8; 4] {
    let (b0, b1) = qs.split_at(8);
    let v0 = arr(b0).map_or(V::U8::splat(0), V::U8::bytes);
    let v1 = arr(b1).map_or(V::U8::splat(0), V::U8::bytes);
    [
        v0.and(15).lookup16(table),
        v1.and(15).lookup16(table),
        v0.shr(4).lookup16(table),
        v1.shr(4).lookup16(table),
    ]
}

impl Block32 for BlockIQ4_NL {
    const OFFSET: f32 = 0.0;
    const HAS_MIN: bool = false;
    #[inline(always)]
    fn codes<V: Simd>(&self) -> [V::F8; 4] {
        table_codes::<V>(&self.qs, &IQ4NL_F32)
    }
}

impl Block32 for BlockMXFP4 {
    const OFFSET: f32 = 0.0;
    const HAS_MIN: bool = false;
    /// The e8m0 scale halved (the table holds the e2m1 values doubled).
    #[inline(always)]
    fn dm<V: Simd>(&self) -> (f32, f32) {
        (e8m0_to_f32_half(self.e), 0.0)
    }
    #[inline(always)]
    fn codes<V: Simd>(&self) -> [V::F8; 4] {
        table_codes::<V>(&self.qs, &MXFP4_F32)
    }
}

/// Dot of a row of GGUF NVFP4 blocks with `x`; `None` if the lengths
/// disagree. Each 16-weight group `g` (8 code bytes: low nibbles weights
/// 0..8, high nibbles 8..16) looks its e2m1 values up in the doubled table
/// ([`table_codes`], two groups at a time) and adds `d_g·Σ q·x` (its
/// unsigned e4m3 scale halved, [`ue4m3_to_f32_half`]) to one of two
/// accumulators (even and odd groups). Runs out of line, in
/// [`Simd::enter`].
#[inline(always)]
pub(super) fn nvfp4_dot<V: Simd>(bytes: &[u8], x: &[f32]) -> Option<f32> {
    V::enter(
        #[inline(always)]
        || nvfp4_blocks::<V>(bytes, x),
    )
}

/// [`nvfp4_dot`]'s body.
#[inline(always)]
fn nvfp4_blocks<V: Simd>(bytes: &[u8], x: &[f32]) -> Option<f32> {
    let blocks: &[BlockNVFP4] = bytemuck::try_cast_slice(bytes).ok()?;
    if x.len() != 64 * blocks.len() {
        return None;
    }
    let mut acc = [V::F8::zero(); 2];
    let xv = |x: &[f32], i: usize| {
        x.get(8 * i..8 * i + 8)
            .and_then(arr)
            .map_or(V::F8::zero(), V::F8::load)
    };
    for (b, xb) in blocks.iter().zip(x.chunks_exact(64)) {
        for h in 0..2 {
            // Groups 2h (bytes 16h..16h + 8) and 2h + 1: the values of
            // their low nibbles in c[0], c[1], of their high nibbles in
            // c[2], c[3].
            let qs: &[u8; 16] = b.qs.get(16 * h..16 * h + 16).and_then(arr)?;
            let c = table_codes::<V>(qs, &MXFP4_F32);
            let x32 = xb.get(32 * h..32 * h + 32)?;
            for (k, acc) in acc.iter_mut().enumerate() {
                let d = ue4m3_to_f32_half(b.d[2 * h + k]);
                let p = c[k].mul(xv(x32, 2 * k));
                let p = c[k + 2].fma(xv(x32, 2 * k + 1), p);
                *acc = V::F8::splat(d).fma(p, *acc);
            }
        }
    }
    Some(acc[0].add(acc[1]).sum())
}
