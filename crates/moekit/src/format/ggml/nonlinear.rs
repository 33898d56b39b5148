//! The GGUF blocks with 4-bit codes into a non-linear table: IQ4_NL and
//! IQ4_XS (`kvalues_iq4nl`), MXFP4 (e2m1 values doubled, with an e8m0
//! block scale) and NVFP4 (the same values with an unsigned e4m3 scale per
//! 16), laid out exactly as llama.cpp's `ggml-common.h`.
//!
//! Dequantization follows `dequantize_row_iq4_nl`, `dequantize_row_iq4_xs`,
//! `dequantize_row_mxfp4` and `dequantize_row_nvfp4` of ggml-quants.c (and
//! gguf-py's `gguf.quants`): one f32 product of the block (or sub-block)
//! scale and the table value, so results are bit-identical in f32. In every
//! group of `2n` weights (32; NVFP4: 16), weight `j < n` is the low nibble
//! of byte `j` of the group's `n` code bytes, weight `j + n` its high nibble.

use super::blocks::{random_scale, Block, QK_K};
use super::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;
use rand::rngs::StdRng;
use rand::Rng;

/// `kvalues_iq4nl`: the 16 values of an IQ4_NL / IQ4_XS code.
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// `kvalues_mxfp4`: the 16 e2m1 (FP4) values, doubled so they are integers
/// (the e8m0 scale is halved to match, [`e8m0_to_f32_half`]).
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `block_iq4_nl`: 32 weights `d·kvalues_iq4nl[q]`, q 4-bit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIQ4_NL {
    /// Scale.
    pub d: f16,
    /// Nibbles (low: weights 0..16, high: 16..32).
    pub qs: [u8; 16],
}

/// `block_iq4_xs`: 8 groups of 32 weights `d·(ls − 32)·kvalues_iq4nl[q]`,
/// with 6-bit group scales `ls` split into low nibbles and high bit pairs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIQ4_XS {
    /// Super-block scale.
    pub d: f16,
    /// Bits 4–5 of group `g`'s scale: bits `2g`, `2g + 1` (little-endian u16).
    pub scales_h: [u8; 2],
    /// Bits 0–3 of group `g`'s scale: nibble `g % 2` of byte `g / 2`.
    pub scales_l: [u8; QK_K / 64],
    /// Nibbles: 16 bytes a group, as in IQ4_NL.
    pub qs: [u8; QK_K / 2],
}

/// `block_mxfp4`: 32 weights `2^(e − 128)·kvalues_mxfp4[q]` (OCP MX FP4,
/// block of 32, e8m0 scale `2^(e − 127)`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockMXFP4 {
    /// e8m0 exponent.
    pub e: u8,
    /// Nibbles (low: weights 0..16, high: 16..32).
    pub qs: [u8; 16],
}

/// `block_nvfp4`: 64 weights in 4 groups of 16, group `s` weights
/// `ue4m3(d[s])/2 · kvalues_mxfp4[q]` ([`ue4m3_to_f32_half`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockNVFP4 {
    /// Unsigned e4m3 scale of each 16-weight group.
    pub d: [u8; 4],
    /// Nibbles: 8 bytes a group (low: weights 0..8, high: 8..16).
    pub qs: [u8; 32],
}

const _: () = assert!(std::mem::size_of::<BlockIQ4_NL>() == 18);
const _: () = assert!(std::mem::size_of::<BlockNVFP4>() == 36);
const _: () = assert!(GgmlType::NVFP4.type_size() == 36 && GgmlType::NVFP4.block_size() == 64);
const _: () = assert!(std::mem::size_of::<BlockIQ4_XS>() == 136);
const _: () = assert!(std::mem::size_of::<BlockMXFP4>() == 17);
const _: () = assert!(GgmlType::IQ4_NL.type_size() == 18 && GgmlType::IQ4_XS.type_size() == 136);
const _: () = assert!(GgmlType::MXFP4.type_size() == 17);

/// Half the e8m0 scale `2^(e − 127)`, i.e. `2^(e − 128)`, exact for every
/// byte (`ggml_e8m0_to_fp32_half`; e < 2 gives f32 subnormals).
#[inline(always)]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (u32::from(e) - 1) << 23
    };
    f32::from_bits(bits)
}

/// Half of llama.cpp's unsigned e4m3 scale (`ggml_ue4m3_to_fp32`, which
/// includes the halving that matches the doubled `kvalues_mxfp4`): bits 3–6
/// the exponent (bias 7), bits 0–2 the mantissa, bit 7 ignored; 0 and 0x7F
/// are zero; exponent 0 is subnormal (`m·2^−9`). Exact for every byte.
#[inline(always)]
pub fn ue4m3_to_f32_half(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let (e, m) = (u32::from((x >> 3) & 0x0F), u32::from(x & 7));
    if e == 0 {
        // m·2⁻⁹, halved: exact.
        m as f32 * (1.0 / 1024.0)
    } else {
        // (1 + m/8)·2^(e − 7), halved: exponent e − 8, 3 mantissa bits.
        f32::from_bits(((e + 119) << 23) | (m << 20))
    }
}

/// A group of `2n` weights from its `n` code bytes: `out[j] = d·table[low
/// nibble of byte j]`, `out[j + n] = d·table[its high nibble]`.
#[inline(always)]
fn table_group(qs: &[u8], d: f32, table: &[i8; 16], out: &mut [f32]) {
    let (lo, hi) = out.split_at_mut(out.len() / 2);
    let value = |q: u8| f32::from(table[usize::from(q & 0x0F)]);
    for ((&q, l), h) in qs.iter().zip(lo).zip(hi) {
        *l = d * value(q);
        *h = d * value(q >> 4);
    }
}

/// The 6-bit scale of group `g` of an IQ4_XS block, minus 32.
#[inline(always)]
pub(crate) fn iq4xs_scale(b: &BlockIQ4_XS, g: usize) -> i32 {
    let high = (u16::from_le_bytes(b.scales_h) >> (2 * g)) & 3;
    let low = b
        .scales_l
        .get(g / 2)
        .map_or(0, |&s| (s >> (4 * (g % 2))) & 0x0F);
    (i32::from(low) | (i32::from(high) << 4)) - 32
}

impl Block for BlockIQ4_NL {
    const TYPE: GgmlType = GgmlType::IQ4_NL;
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        if out.len() == 32 {
            table_group(&self.qs, self.d.to_f32(), &KVALUES_IQ4NL, out);
        }
    }
    fn randomize_scales(&mut self, rng: &mut StdRng) {
        self.d = random_scale(rng, 127.0, true);
    }
}

impl Block for BlockIQ4_XS {
    const TYPE: GgmlType = GgmlType::IQ4_XS;
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        if out.len() != QK_K {
            return;
        }
        let d = self.d.to_f32();
        for (g, (o32, q16)) in out
            .chunks_exact_mut(32)
            .zip(self.qs.chunks_exact(16))
            .enumerate()
        {
            let dl = d * iq4xs_scale(self, g) as f32;
            table_group(q16, dl, &KVALUES_IQ4NL, o32);
        }
    }
    fn randomize_scales(&mut self, rng: &mut StdRng) {
        self.d = random_scale(rng, 32.0 * 127.0, true);
    }
}

impl Block for BlockNVFP4 {
    const TYPE: GgmlType = GgmlType::NVFP4;
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        if out.len() != 64 {
            return;
        }
        for ((o16, q8), &d) in out
            .chunks_exact_mut(16)
            .zip(self.qs.chunks_exact(8))
            .zip(&self.d)
        {
            table_group(q8, ue4m3_to_f32_half(d), &KVALUES_MXFP4, o16);
        }
    }
    fn randomize_scales(&mut self, rng: &mut StdRng) {
        // Exponent 1: 12·d in [0.09, 0.18], weights O(0.01–0.1).
        for d in &mut self.d {
            *d = rng.random_range(0x08..=0x0F);
        }
    }
}

impl Block for BlockMXFP4 {
    const TYPE: GgmlType = GgmlType::MXFP4;
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        if out.len() == 32 {
            table_group(&self.qs, e8m0_to_f32_half(self.e), &KVALUES_MXFP4, out);
        }
    }
    fn randomize_scales(&mut self, rng: &mut StdRng) {
        // 12·2^(e − 128) in [0.012, 0.094]: weights O(0.01–0.1) like the others.
        self.e = rng.random_range(118..=121);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_half_is_two_to_the_e_minus_128() {
        for e in 0..=255u8 {
            let want = (f64::from(e) - 128.0).exp2();
            assert_eq!(f64::from(e8m0_to_f32_half(e)), want, "{e}");
        }
    }

    #[test]
    fn ue4m3_half_matches_ggml_for_every_byte() {
        // ggml_ue4m3_to_fp32 in f64: 0 and 0x7F zero, bit 7 ignored.
        for x in 0..=255u8 {
            let (e, m) = (i32::from((x >> 3) & 15), f64::from(x & 7));
            let raw = if e == 0 {
                m * 2f64.powi(-9)
            } else {
                (1.0 + m / 8.0) * 2f64.powi(e - 7)
            };
            let want = if x == 0 || x == 0x7F { 0.0 } else { raw / 2.0 };
            assert_eq!(f64::from(ue4m3_to_f32_half(x)), want, "{x:#x}");
        }
        assert_eq!(ue4m3_to_f32_half(0x38), 0.5);
        assert_eq!(ue4m3_to_f32_half(0x80), 0.0);
        assert_eq!(ue4m3_to_f32_half(0xFF), 240.0);
    }

    #[test]
    fn nvfp4_groups_take_their_own_scale_and_nibbles() {
        let mut b = BlockNVFP4::zeroed();
        b.d = [0x38, 0x40, 0x00, 0x30]; // 0.5, 1, 0, 0.25
        b.qs[0] = 0x71; // group 0: weight 0 code 1, weight 8 code 7
        b.qs[8] = 0xF9; // group 1: weight 16 code 9 (−1), weight 24 code 15 (−12)
        b.qs[31] = 0x26; // group 3: weight 55 code 6 (8), weight 63 code 2 (2)
        let mut out = [f32::NAN; 64];
        b.dequantize(&mut out);
        assert_eq!((out[0], out[8]), (0.5, 6.0));
        assert_eq!((out[16], out[24]), (-1.0, -12.0));
        assert_eq!((out[55], out[63]), (2.0, 0.5));
        assert!(out[32..48].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn iq4xs_scales_unpack_six_bits() {
        let mut b = BlockIQ4_XS::zeroed();
        // Group 3: low nibble 0xA (byte 1, high), high bits 0b10 (bits 6–7).
        b.scales_l[1] = 0xA0;
        b.scales_h = (0b10u16 << 6).to_le_bytes();
        assert_eq!(iq4xs_scale(&b, 3), 0x2A - 32);
        assert_eq!(iq4xs_scale(&b, 2), -32);
        b.scales_l = [0xFF; 4];
        b.scales_h = [0xFF; 2];
        assert!((0..8).all(|g| iq4xs_scale(&b, g) == 31));
    }
}
