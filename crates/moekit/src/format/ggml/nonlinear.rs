//! The GGUF blocks with 4-bit codes into a non-linear table: IQ4_NL and
//! IQ4_XS (`kvalues_iq4nl`) and MXFP4 (e2m1 values doubled, with an e8m0
//! block scale), laid out exactly as llama.cpp's `ggml-common.h`.
//!
//! Dequantization follows `dequantize_row_iq4_nl`, `dequantize_row_iq4_xs`
//! and `dequantize_row_mxfp4` of ggml-quants.c (and gguf-py's
//! `gguf.quants`): one f32 product of the block (or sub-block) scale and the
//! table value, so results are bit-identical in f32. In every block, weight
//! `j < 16` of a 32-weight group is the low nibble of byte `j` of the
//! group's 16 code bytes, weight `j + 16` its high nibble.

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

const _: () = assert!(std::mem::size_of::<BlockIQ4_NL>() == 18);
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

/// A 32-weight group from its 16 code bytes: `out[j] = d·table[low nibble]`,
/// `out[j + 16] = d·table[high nibble]`.
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
