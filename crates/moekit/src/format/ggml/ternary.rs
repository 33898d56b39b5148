//! The GGUF ternary blocks TQ1_0 (5 trits a byte) and TQ2_0 (2 bits a
//! trit), super-blocks of 256 weights `d·t`, t ∈ {−1, 0, 1}, laid out exactly
//! as llama.cpp's `ggml-common.h`; dequantization as `dequantize_row_tq*`
//! and gguf-py (one f32 product a weight, bit-identical).

use super::blocks::{random_scale, Block, QK_K};
use super::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;
use rand::rngs::StdRng;

/// `block_tq1_0`: trit `n` of byte `b` is `((b·3ⁿ mod 256)·3) >> 8`, minus 1.
/// Weights 32n + m: trit n of `qs[m]` (m < 32); 160 + 16n + m: trit n of
/// `qs[32 + m]`; 240 + 4n + m: trit n of `qh[m]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockTQ1_0 {
    /// Five trits a byte.
    pub qs: [u8; (QK_K - 4 * QK_K / 64) / 5],
    /// Four trits a byte.
    pub qh: [u8; QK_K / 64],
    /// Scale.
    pub d: f16,
}

/// `block_tq2_0`: weight `128j + 32s + m` is `(qs[32j + m] >> 2s) & 3`, minus 1.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockTQ2_0 {
    /// Four 2-bit codes a byte.
    pub qs: [u8; QK_K / 4],
    /// Scale.
    pub d: f16,
}

const _: () = assert!(std::mem::size_of::<BlockTQ1_0>() == 54);
const _: () = assert!(std::mem::size_of::<BlockTQ2_0>() == 66);

/// Trit `n` (0..5) of a TQ1_0 byte, as −1, 0 or 1.
#[inline(always)]
pub(crate) fn trit(b: u8, n: u32) -> i8 {
    let q = b.wrapping_mul(3u8.wrapping_pow(n));
    ((u16::from(q) * 3) >> 8) as i8 - 1
}

/// `out[32n + m] = d·trit(bytes[m], n)` for the `out.len() / bytes.len()` trits.
#[inline(always)]
fn trits(bytes: &[u8], d: f32, out: &mut [f32]) {
    for (n, o) in (0u32..).zip(out.chunks_exact_mut(bytes.len().max(1))) {
        for (y, &b) in o.iter_mut().zip(bytes) {
            *y = d * f32::from(trit(b, n));
        }
    }
}

impl Block for BlockTQ1_0 {
    const TYPE: GgmlType = GgmlType::TQ1_0;
    fn dequantize(&self, out: &mut [f32]) {
        if out.len() != QK_K {
            return;
        }
        let d = self.d.to_f32();
        let (five, rest) = out.split_at_mut(160);
        let (five_b, four) = rest.split_at_mut(80);
        let (qs0, qs1) = self.qs.split_at(32);
        trits(qs0, d, five);
        trits(qs1, d, five_b);
        trits(&self.qh, d, four);
    }
    fn randomize_scales(&mut self, rng: &mut StdRng) {
        self.d = random_scale(rng, 1.0, true);
    }
}

impl Block for BlockTQ2_0 {
    const TYPE: GgmlType = GgmlType::TQ2_0;
    fn dequantize(&self, out: &mut [f32]) {
        if out.len() != QK_K {
            return;
        }
        let d = self.d.to_f32();
        for (o128, q32) in out.chunks_exact_mut(128).zip(self.qs.chunks_exact(32)) {
            for (s, o32) in (0u32..).zip(o128.chunks_exact_mut(32)) {
                for (y, &q) in o32.iter_mut().zip(q32) {
                    *y = d * f32::from(((q >> (2 * s)) & 3) as i8 - 1);
                }
            }
        }
    }
    fn randomize_scales(&mut self, rng: &mut StdRng) {
        self.d = random_scale(rng, 1.0, true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_trits_of_a_byte_round_trip() {
        // ggml packs t0..t4 (each 0..2) as ⌈(Σ tᵢ·3^(4−i))·256 / 243⌉.
        for v in 0..243u16 {
            let b = (v * 256).div_ceil(243) as u8;
            let digits: Vec<i8> = (0..5)
                .map(|n| ((v / 3u16.pow(4 - n)) % 3) as i8 - 1)
                .collect();
            let got: Vec<i8> = (0..5).map(|n| trit(b, n)).collect();
            assert_eq!(got, digits, "{v}");
        }
    }
}
