//! Fused dot kernels of the 32-weight GGUF blocks (Q4_0, Q4_1, Q5_0, Q5_1,
//! Q8_0).
//!
//! A row is viewed as `&[Block]` (the blocks are 2-aligned `Pod` structs; an
//! unaligned row falls back to decode-then-dot). Each block widens its scale
//! ([`f16_to_f32`]: a predictable branch for the normal f16 scales of these
//! types) and its 32 codes, adds `d·q·x` to the accumulator
//! ([`scaled_fma`]) and `m·Σx` (with `m = d·OFFSET` for the types without a
//! min) to the offset, from the block sums of `x`. (Widening the scales of
//! a run of blocks first, a register at a time, was faster on long rows but
//! cost more than it saved on rows of K = 768.)

use super::{arr, f16_to_f32, fma, lanes_sum, scaled_fma, XSums, A, L};
use crate::format::ggml::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0};
use bytemuck::Pod;
use half::f16;

/// A 32-weight block: weight `i` is `d·(q_i + OFFSET)`, or `d·q_i + m` for
/// the types with a min.
pub(super) trait Block32: Pod {
    /// Code offset of the types without a min.
    const OFFSET: f32;
    /// Whether the block stores a min `m`.
    const HAS_MIN: bool;
    /// The scale.
    fn d(&self) -> f16;
    /// The min (zero for the types without one).
    fn m(&self) -> f16;
    /// The 32 codes, widened (without `OFFSET`).
    fn codes(&self) -> [f32; L];
}

/// Dot of a row of `B` blocks with `x`; `None` if the row is not 2-aligned
/// or the lengths disagree.
#[inline(never)]
pub(super) fn dot_blocks<B: Block32>(bytes: &[u8], x: &[f32], xs: &XSums) -> Option<f32> {
    let blocks: &[B] = bytemuck::try_cast_slice(bytes).ok()?;
    let sums = xs.of(32);
    if x.len() != blocks.len() * L || sums.len() != blocks.len() {
        return None;
    }
    let mut acc = [0f32; A];
    // Σ_b m_b·Σx_b, or Σ_b d_b·Σx_b (times OFFSET at the end).
    let mut off = 0f32;
    for ((b, xb), &s) in blocks.iter().zip(x.chunks_exact(L)).zip(sums) {
        let d = f16_to_f32(b.d(), false);
        if let Some(xb) = arr(xb) {
            scaled_fma(&mut acc, d, d, &b.codes(), xb);
        }
        let m = if B::HAS_MIN {
            f16_to_f32(b.m(), false)
        } else {
            d
        };
        off = fma(m, s, off);
    }
    let off = if B::HAS_MIN { off } else { B::OFFSET * off };
    Some(lanes_sum(acc) + off)
}

/// `1 << j` for lane j: the Q5 high-bit test as a per-lane constant mask
/// (a compare per register, no per-lane shifts of the result).
const LANE_BITS: [u32; 16] = {
    let mut b = [0u32; 16];
    let mut j = 0;
    while j < 16 {
        b[j] = 1 << j;
        j += 1;
    }
    b
};

/// Codes of a 32-weight block from 16 nibble bytes (low nibbles are weights
/// 0..16, high nibbles 16..32), bit 4 of weight j from bit j of `qh`.
///
/// Works in 32-bit lanes: `b·0x1001` holds the byte at bit 0 and at bit 12,
/// so the low nibble is `& 15` and the high one `>> 16`, from one widening
/// load and one multiply per 8 bytes (the plain `b & 15`, `b >> 4` are
/// narrowed to byte operations, which cost a shuffle more per 8 codes).
#[inline(always)]
fn nibble_codes(qs: &[u8; 16], qh: u32) -> [f32; L] {
    let mut q = [0f32; L];
    let (qh_lo, qh_hi) = (qh, qh >> 16);
    for ((j, &b), &bit) in qs.iter().enumerate().zip(&LANE_BITS) {
        let v = u32::from(b) * 0x1001;
        let h0 = if qh_lo & bit != 0 { 0x10 } else { 0 };
        let h1 = if qh_hi & bit != 0 { 0x10 } else { 0 };
        q[j] = ((v & 0x0F) | h0) as f32;
        q[16 + j] = ((v >> 16) | h1) as f32;
    }
    q
}

impl Block32 for BlockQ4_0 {
    const OFFSET: f32 = -8.0;
    const HAS_MIN: bool = false;
    #[inline(always)]
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    fn m(&self) -> f16 {
        f16::ZERO
    }
    #[inline(always)]
    fn codes(&self) -> [f32; L] {
        nibble_codes(&self.qs, 0)
    }
}

impl Block32 for BlockQ4_1 {
    const OFFSET: f32 = 0.0;
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    fn m(&self) -> f16 {
        self.m
    }
    #[inline(always)]
    fn codes(&self) -> [f32; L] {
        nibble_codes(&self.qs, 0)
    }
}

impl Block32 for BlockQ5_0 {
    const OFFSET: f32 = -16.0;
    const HAS_MIN: bool = false;
    #[inline(always)]
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    fn m(&self) -> f16 {
        f16::ZERO
    }
    #[inline(always)]
    fn codes(&self) -> [f32; L] {
        nibble_codes(&self.qs, u32::from_le_bytes(self.qh))
    }
}

impl Block32 for BlockQ5_1 {
    const OFFSET: f32 = 0.0;
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    fn m(&self) -> f16 {
        self.m
    }
    #[inline(always)]
    fn codes(&self) -> [f32; L] {
        nibble_codes(&self.qs, u32::from_le_bytes(self.qh))
    }
}

impl Block32 for BlockQ8_0 {
    const OFFSET: f32 = 0.0;
    const HAS_MIN: bool = false;
    #[inline(always)]
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    fn m(&self) -> f16 {
        f16::ZERO
    }
    #[inline(always)]
    fn codes(&self) -> [f32; L] {
        let mut q = [0f32; L];
        for (q, &c) in q.iter_mut().zip(&self.qs) {
            *q = f32::from(c);
        }
        q
    }
}
