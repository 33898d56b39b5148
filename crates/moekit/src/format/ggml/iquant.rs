//! The GGUF i-quants with grids: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
//! IQ1_S and IQ1_M (super-blocks of 256), laid out exactly as llama.cpp's
//! `ggml-common.h`, with its grids ([`super::iq_grids`]).
//!
//! A grid entry holds 8 (u64) or 4 (u32) weights' magnitudes, one byte each;
//! signs come from sign bytes (IQ2_S, IQ3_S) or from 7-bit indices into
//! `ksigns_iq2xs` (the eighth bit is the parity of the seven). IQ1 grids hold
//! −1, 0, 1, shifted by ±1/8 per 8 weights.
//!
//! Dequantization follows gguf-py's `gguf.quants` (and ggml's
//! `dequantize_row_iq*`) operation for operation, so results are
//! bit-identical in f32: the group scale is rounded exactly where gguf-py
//! rounds it (e.g. IQ2_XXS `(d·(0.5 + ls))·0.25`), then each weight is one
//! product `scale·grid` (IQ1: `scale·(grid ± 1/8)`) with its sign.

use super::blocks::{random_scale, Block, QK_K};
use super::iq_grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
};
use super::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;
use rand::rngs::StdRng;

/// `block_iq2_xxs`: per 32 weights two little-endian u32: four grid indices
/// (bytes) and four 7-bit sign indices plus a 4-bit scale (top bits).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIQ2_XXS {
    /// Super-block scale.
    pub d: f16,
    /// 8 bytes per 32 weights (ggml: `uint16_t qs[32]`).
    pub qs: [u8; QK_K / 4],
}

/// `block_iq2_xs`: per 8 weights a little-endian u16 (9-bit grid index, 7-bit
/// sign index); 4-bit scales per 16 weights.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIQ2_XS {
    /// Super-block scale.
    pub d: f16,
    /// 32 u16 (ggml: `uint16_t qs[32]`).
    pub qs: [u8; QK_K / 4],
    /// Scale of weights 32g..32g+16 (low nibble) and 32g+16..32g+32 (high).
    pub scales: [u8; QK_K / 32],
}

/// `block_iq2_s`: per 8 weights a grid index (8 bits + 2 in `qh`) and a sign
/// byte; 4-bit scales per 16 weights.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIQ2_S {
    /// Super-block scale.
    pub d: f16,
    /// 32 grid indices (low 8 bits), then 32 sign bytes.
    pub qs: [u8; QK_K / 4],
    /// Bits 8–9 of grid index `i`: bits `2(i % 4)` of byte `i / 4`.
    pub qh: [u8; QK_K / 32],
    /// As IQ2_XS.
    pub scales: [u8; QK_K / 32],
}

/// `block_iq3_xxs`: per 4 weights a grid index; per 32 weights a
/// little-endian u32 of four 7-bit sign indices and a 4-bit scale.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIQ3_XXS {
    /// Super-block scale.
    pub d: f16,
    /// 64 grid indices, then 8 u32 scales-and-signs.
    pub qs: [u8; 3 * QK_K / 8],
}

/// `block_iq3_s`: per 4 weights a grid index (8 bits + 1 in `qh`), one sign
/// bit per weight, 4-bit scales per 32 weights (`d·(1 + 2s)`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIQ3_S {
    /// Super-block scale.
    pub d: f16,
    /// Grid indices, low 8 bits.
    pub qs: [u8; QK_K / 4],
    /// Bit 8 of grid index `i`: bit `i % 8` of byte `i / 8`.
    pub qh: [u8; QK_K / 32],
    /// Sign of weight `w`: bit `w % 8` of byte `w / 8`.
    pub signs: [u8; QK_K / 8],
    /// Scale of weights 32g..: nibble `g % 2` of byte `g / 2`.
    pub scales: [u8; QK_K / 64],
}

/// `block_iq1_s`: per 8 weights an 11-bit grid index; per 32 a little-endian
/// u16 with four index high parts (3 bits each), a 3-bit scale and the sign
/// of the ±1/8 shift.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIQ1_S {
    /// Super-block scale.
    pub d: f16,
    /// Grid indices, low 8 bits.
    pub qs: [u8; QK_K / 8],
    /// 8 u16 (ggml: `uint16_t qh[8]`).
    pub qh: [u8; QK_K / 16],
}

/// `block_iq1_m`: per 8 weights an 11-bit grid index and its own shift
/// sign; 3-bit scales per 16 weights; the f16 super-block scale is split
/// over the top nibbles of the four u16 scale words.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIQ1_M {
    /// Grid indices, low 8 bits.
    pub qs: [u8; QK_K / 8],
    /// Nibble `i % 2` of byte `i / 2`: bits 8–10 of index `i`, shift sign.
    pub qh: [u8; QK_K / 16],
    /// 4 u16: 3-bit scales at bits 0, 3, 6, 9; bits 12–15 a nibble of d.
    pub scales: [u8; QK_K / 32],
}

const _: () = assert!(std::mem::size_of::<BlockIQ2_XXS>() == 66);
const _: () = assert!(std::mem::size_of::<BlockIQ2_XS>() == 74);
const _: () = assert!(std::mem::size_of::<BlockIQ2_S>() == 82);
const _: () = assert!(std::mem::size_of::<BlockIQ3_XXS>() == 98);
const _: () = assert!(std::mem::size_of::<BlockIQ3_S>() == 110);
const _: () = assert!(std::mem::size_of::<BlockIQ1_S>() == 50);
const _: () = assert!(std::mem::size_of::<BlockIQ1_M>() == 56);

/// `ksigns_iq2xs[k]`: the 7 sign bits of `k` and their parity as bit 7.
#[inline(always)]
pub(crate) fn ksigns(k: u32) -> u8 {
    KSIGNS_IQ2XS[(k & 0x7F) as usize]
}

/// Little-endian u32 / u16 at byte `at` of `b` (0 past the end).
#[inline(always)]
fn le32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}
#[inline(always)]
fn le16(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 2)
        .and_then(|s| s.try_into().ok())
        .map_or(0, |a| u32::from(u16::from_le_bytes(a)))
}

/// `out[j] = ±(scale·byte j of entry)` for the entry's bytes, sign bit j of
/// `signs` set = negative.
/// The sign flip is an XOR of the sign bit (exact, no branch).
#[inline(always)]
fn signed_entry(entry: u64, signs: u8, scale: f32, out: &mut [f32]) {
    let bytes = entry.to_le_bytes();
    for (j, (o, &b)) in out.iter_mut().zip(&bytes).enumerate() {
        let v = scale * f32::from(b);
        let flip = u32::from((signs >> j) & 1) << 31;
        *o = f32::from_bits(v.to_bits() ^ flip);
    }
}

/// `out[j] = scale·(grid byte j (int8) + delta)`: the IQ1 weights.
#[inline(always)]
fn iq1_entry(entry: u64, delta: f32, scale: f32, out: &mut [f32]) {
    for (o, &b) in out.iter_mut().zip(&entry.to_le_bytes()) {
        *o = scale * (f32::from(b as i8) + delta);
    }
}

/// The ±1/8 shift of the IQ1 grids: negative when `bit` is set.
#[inline(always)]
fn iq1_delta(bit: bool) -> f32 {
    if bit {
        -0.125
    } else {
        0.125
    }
}

/// `(d·(0.5 + s))·m`: the IQ2 (m = ¼) and IQ3_XXS (m = ½) group scales.
#[inline(always)]
fn half_step(d: f32, s: u32, m: f32) -> f32 {
    d * (0.5 + s as f32) * m
}

/// The entry of a grid (0 for an index past it: never, indices are masked).
#[inline(always)]
fn grid<T: Copy + Default>(g: &[T], i: u32) -> T {
    g.get(i as usize).copied().unwrap_or_default()
}

impl Block for BlockIQ2_XXS {
    const TYPE: GgmlType = GgmlType::IQ2_XXS;
    fn dequantize(&self, out: &mut [f32]) {
        if out.len() != QK_K {
            return;
        }
        let d = self.d.to_f32();
        for (o32, q8) in out.chunks_exact_mut(32).zip(self.qs.chunks_exact(8)) {
            let (idx, aux) = (le32(q8, 0), le32(q8, 4));
            let db = half_step(d, aux >> 28, 0.25);
            for (l, o8) in o32.chunks_exact_mut(8).enumerate() {
                let e = grid(&IQ2XXS_GRID, (idx >> (8 * l)) & 0xFF);
                signed_entry(e, ksigns(aux >> (7 * l)), db, o8);
            }
        }
    }
    fn randomize_scales(&mut self, rng: &mut StdRng) {
        self.d = random_scale(rng, 3.875 * 43.0, true);
    }
}

impl Block for BlockIQ2_XS {
    const TYPE: GgmlType = GgmlType::IQ2_XS;
    fn dequantize(&self, out: &mut [f32]) {
        if out.len() != QK_K {
            return;
        }
        let d = self.d.to_f32();
        for (i, o8) in out.chunks_exact_mut(8).enumerate() {
            let q = le16(&self.qs, 2 * i);
            let sc = self
                .scales
                .get(i / 4)
                .map_or(0, |&s| (s >> (4 * (i / 2 % 2))) & 0x0F);
            let db = half_step(d, u32::from(sc), 0.25);
            signed_entry(grid(&IQ2XS_GRID, q & 511), ksigns(q >> 9), db, o8);
        }
    }
    fn randomize_scales(&mut self, rng: &mut StdRng) {
        self.d = random_scale(rng, 3.875 * 43.0, true);
    }
}

impl Block for BlockIQ2_S {
    const TYPE: GgmlType = GgmlType::IQ2_S;
    fn dequantize(&self, out: &mut [f32]) {
        if out.len() != QK_K {
            return;
        }
        let d = self.d.to_f32();
        let (idx, signs) = self.qs.split_at(QK_K / 8);
        for (i, o8) in out.chunks_exact_mut(8).enumerate() {
            let high = self.qh.get(i / 4).map_or(0, |&h| (h >> (2 * (i % 4))) & 3);
            let q = u32::from(idx.get(i).copied().unwrap_or(0)) | (u32::from(high) << 8);
            let sc = self
                .scales
                .get(i / 4)
                .map_or(0, |&s| (s >> (4 * (i / 2 % 2))) & 0x0F);
            let db = half_step(d, u32::from(sc), 0.25);
            let s = signs.get(i).copied().unwrap_or(0);
            signed_entry(grid(&IQ2S_GRID, q), s, db, o8);
        }
    }
    fn randomize_scales(&mut self, rng: &mut StdRng) {
        self.d = random_scale(rng, 3.875 * 43.0, true);
    }
}

impl Block for BlockIQ3_XXS {
    const TYPE: GgmlType = GgmlType::IQ3_XXS;
    fn dequantize(&self, out: &mut [f32]) {
        if out.len() != QK_K {
            return;
        }
        let d = self.d.to_f32();
        let (idx, aux) = self.qs.split_at(QK_K / 4);
        for (g, (o32, i8s)) in out
            .chunks_exact_mut(32)
            .zip(idx.chunks_exact(8))
            .enumerate()
        {
            let a = le32(aux, 4 * g);
            let db = half_step(d, a >> 28, 0.5);
            for (l, (o8, pair)) in o32.chunks_exact_mut(8).zip(i8s.chunks_exact(2)).enumerate() {
                let e = pair.iter().rev().fold(0u64, |acc, &i| {
                    (acc << 32) | u64::from(grid(&IQ3XXS_GRID, u32::from(i)))
                });
                signed_entry(e, ksigns(a >> (7 * l)), db, o8);
            }
        }
    }
    fn randomize_scales(&mut self, rng: &mut StdRng) {
        self.d = random_scale(rng, 7.75 * 62.0, true);
    }
}

impl Block for BlockIQ3_S {
    const TYPE: GgmlType = GgmlType::IQ3_S;
    fn dequantize(&self, out: &mut [f32]) {
        if out.len() != QK_K {
            return;
        }
        let d = self.d.to_f32();
        for (i, o8) in out.chunks_exact_mut(8).enumerate() {
            let g = i / 4;
            let sc = self
                .scales
                .get(g / 2)
                .map_or(0, |&s| (s >> (4 * (g % 2))) & 0x0F);
            let db = d * f32::from(1 + 2 * sc);
            let qh = self.qh.get(g).copied().unwrap_or(0);
            let e = (0..2).rev().fold(0u64, |acc, h| {
                let k = 2 * i + h; // grid index k: weights 4k..4k+4
                let q = u32::from(self.qs.get(k).copied().unwrap_or(0))
                    | (u32::from((qh >> (k % 8)) & 1) << 8);
                (acc << 32) | u64::from(grid(&IQ3S_GRID, q))
            });
            signed_entry(e, self.signs.get(i).copied().unwrap_or(0), db, o8);
        }
    }
    fn randomize_scales(&mut self, rng: &mut StdRng) {
        self.d = random_scale(rng, 31.0 * 15.0, true);
    }
}

impl Block for BlockIQ1_S {
    const TYPE: GgmlType = GgmlType::IQ1_S;
    fn dequantize(&self, out: &mut [f32]) {
        if out.len() != QK_K {
            return;
        }
        let d = self.d.to_f32();
        for (g, o32) in out.chunks_exact_mut(32).enumerate() {
            let qh = le16(&self.qh, 2 * g);
            let dl = d * ((2 * ((qh >> 12) & 7) + 1) as f32);
            let delta = iq1_delta(qh & 0x8000 != 0);
            for (l, o8) in o32.chunks_exact_mut(8).enumerate() {
                let q = u32::from(self.qs.get(4 * g + l).copied().unwrap_or(0))
                    | (((qh >> (3 * l)) & 7) << 8);
                iq1_entry(grid(&IQ1S_GRID, q), delta, dl, o8);
            }
        }
    }
    fn randomize_scales(&mut self, rng: &mut StdRng) {
        self.d = random_scale(rng, 15.0 * 1.125, true);
    }
}

impl BlockIQ1_M {
    /// The f16 super-block scale, from the top nibbles of the scale words.
    pub fn d(&self) -> f16 {
        let w = |k: usize| le16(&self.scales, 2 * k);
        let bits = (w(0) >> 12) | ((w(1) >> 8) & 0x00F0) | ((w(2) >> 4) & 0x0F00) | (w(3) & 0xF000);
        f16::from_bits(bits as u16)
    }
}

impl Block for BlockIQ1_M {
    const TYPE: GgmlType = GgmlType::IQ1_M;
    fn dequantize(&self, out: &mut [f32]) {
        if out.len() != QK_K {
            return;
        }
        let d = self.d().to_f32();
        for (m, o16) in out.chunks_exact_mut(16).enumerate() {
            let s = (le16(&self.scales, 2 * (m / 4)) >> (3 * (m % 4))) & 7;
            let dl = d * ((2 * s + 1) as f32);
            for (h, o8) in o16.chunks_exact_mut(8).enumerate() {
                let i = 2 * m + h; // grid index i: weights 8i..8i+8
                let nib = self
                    .qh
                    .get(i / 2)
                    .map_or(0, |&b| (b >> (4 * (i % 2))) & 0x0F);
                let q = u32::from(self.qs.get(i).copied().unwrap_or(0)) | (u32::from(nib & 7) << 8);
                iq1_entry(grid(&IQ1S_GRID, q), iq1_delta(nib & 8 != 0), dl, o8);
            }
        }
    }
    fn randomize_scales(&mut self, rng: &mut StdRng) {
        let d = random_scale(rng, 15.0 * 1.125, true).to_bits();
        for (k, w) in self.scales.chunks_exact_mut(2).enumerate() {
            let nib = (d >> (4 * k)) & 0x0F;
            let v = (u16::from_le_bytes([w[0], w[1]]) & 0x0FFF) | (nib << 12);
            w.copy_from_slice(&v.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn ksigns_is_seven_bits_and_their_parity() {
        for k in 0..128u32 {
            let want = k | ((k.count_ones() & 1) << 7);
            assert_eq!(u32::from(ksigns(k)), want, "{k}");
        }
    }

    #[test]
    fn iq1m_scale_round_trips_through_the_scale_words() {
        let mut rng = StdRng::seed_from_u64(4);
        let mut b = BlockIQ1_M::zeroed();
        rng.fill(&mut b.scales[..]);
        let low: Vec<u16> = b
            .scales
            .chunks_exact(2)
            .map(|w| u16::from_le_bytes([w[0], w[1]]) & 0x0FFF)
            .collect();
        b.randomize_scales(&mut rng);
        let d = b.d();
        assert!(d.to_f32().is_finite() && d.to_f32() != 0.0);
        let after: Vec<u16> = b
            .scales
            .chunks_exact(2)
            .map(|w| u16::from_le_bytes([w[0], w[1]]) & 0x0FFF)
            .collect();
        assert_eq!(low, after, "the 3-bit scales are kept");
    }
}
