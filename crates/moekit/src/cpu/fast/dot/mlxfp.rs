//! Fused dot kernels of MLX's microscaled rows (mxfp4, nvfp4, mxfp8):
//! `Σ_g scale_g·Σ_{k∈g} value(code_k)·x_k`.
//!
//! The codes are packed as MLX's 4- and 8-bit affine codes (LSB first), so
//! the rows run the byte-wise affine loop ([`group_step`]): 8 bytes at a
//! time are widened to 8 lanes, the codes of a byte split into separate
//! vectors and `x` read in the matching order ([`XSums::permuted`]). Only
//! the code values differ ([`CodeValues`]): e2m1 codes through a 16-entry
//! table ([`U8Ops::lookup16`], MLX's `FP4_LUT`), e4m3 bytes converted
//! exactly in the lanes ([`U8Ops::e4m3`]). The scale byte of a group (e8m0,
//! or e4m3 for nvfp4) is widened once per group; there is no bias term.
//! Even and odd groups accumulate separately (as the affine kernels).
//!
//! Numerics: the scale multiplies a group's sum once, where decode-then-dot
//! multiplies each weight, so the results differ in the last bits; with a
//! non-finite scale (e8m0 byte 255, ∞) a group whose products sum to a
//! finite value gives ±∞ where decode-then-dot gives NaN (∞·0 per weight).

use super::affine::{group_step, CodeValues};
use super::simd::{F8Ops, Simd, U8Ops};
use super::{run, RowKernel, Run, XSums};
use crate::format::mlxfp::{e4m3_to_f32, e8m0_to_f32, FP4_LUT};
use crate::format::{MlxFpMode, RawRow};
use std::marker::PhantomData;

/// The kernel run of rows of `mode`.
pub(super) fn run_for<V: Simd>(mode: MlxFpMode) -> Run {
    match mode {
        MlxFpMode::Mxfp4 => run::<FpRow<4, 32, Mxfp4>, V>,
        MlxFpMode::Nvfp4 => run::<FpRow<4, 16, Nvfp4>, V>,
        MlxFpMode::Mxfp8 => run::<FpRow<8, 32, Mxfp8>, V>,
    }
}

/// One mode: its code values ([`CodeValues`]) and scale bytes.
trait FpMode: CodeValues {
    /// The mode.
    const MODE: MlxFpMode;
    /// The value of a scale byte.
    fn scale(s: u8) -> f32;
}

/// e2m1 codes, e8m0 scales.
struct Mxfp4;
/// e2m1 codes, e4m3 scales.
struct Nvfp4;
/// e4m3 codes, e8m0 scales.
struct Mxfp8;

/// e2m1 values: a table lookup of the low 4 bits of each lane.
#[inline(always)]
fn e2m1<V: Simd>(code: V::U8) -> V::F8 {
    code.lookup16(&FP4_LUT)
}

impl CodeValues for Mxfp4 {
    #[inline(always)]
    fn values<V: Simd>(code: V::U8) -> V::F8 {
        e2m1::<V>(code)
    }
}

impl FpMode for Mxfp4 {
    const MODE: MlxFpMode = MlxFpMode::Mxfp4;
    #[inline(always)]
    fn scale(s: u8) -> f32 {
        e8m0_to_f32(s)
    }
}

impl CodeValues for Nvfp4 {
    #[inline(always)]
    fn values<V: Simd>(code: V::U8) -> V::F8 {
        e2m1::<V>(code)
    }
}

impl FpMode for Nvfp4 {
    const MODE: MlxFpMode = MlxFpMode::Nvfp4;
    #[inline(always)]
    fn scale(s: u8) -> f32 {
        e4m3_to_f32(s)
    }
}

impl CodeValues for Mxfp8 {
    #[inline(always)]
    fn values<V: Simd>(code: V::U8) -> V::F8 {
        code.e4m3()
    }
}

impl FpMode for Mxfp8 {
    const MODE: MlxFpMode = MlxFpMode::Mxfp8;
    #[inline(always)]
    fn scale(s: u8) -> f32 {
        e8m0_to_f32(s)
    }
}

/// Rows of mode `M`: `BITS`-bit codes in groups of `GS` (the mode's).
struct FpRow<const BITS: usize, const GS: usize, M>(PhantomData<M>);

impl<const BITS: usize, const GS: usize, M: FpMode> RowKernel for FpRow<BITS, GS, M> {
    #[inline(always)]
    fn dot<V: Simd>(raw: &RawRow<'_>, x: &[f32], xs: &XSums) -> Option<f32> {
        let RawRow::MlxFp {
            mode,
            words,
            scales,
        } = *raw
        else {
            return None;
        };
        let ours = mode == M::MODE && mode.bits() as usize == BITS && mode.group_size() == GS;
        if !ours {
            return None;
        }
        V::enter(
            #[inline(always)]
            || fp_row::<BITS, GS, M, V>(words, scales, x, xs),
        )
    }
}

/// The dot of one row (out of line, in [`Simd::enter`]); `None` if the
/// lengths disagree.
#[inline(always)]
fn fp_row<const BITS: usize, const GS: usize, M: FpMode, V: Simd>(
    words: &[u32],
    scales: &[u8],
    x: &[f32],
    xs: &XSums,
) -> Option<f32> {
    let groups = scales.len();
    let xp = if BITS == 8 { x } else { xs.permuted(8 / BITS) };
    let ok =
        words.len() == groups * GS / 32 * BITS && x.len() == groups * GS && xp.len() == x.len();
    if !ok {
        return None;
    }
    let bytes: &[u8] = bytemuck::cast_slice(words);
    let bpg = GS * BITS / 8;
    let mut acc = [V::F8::zero(); 2];
    let groups = bytes.chunks_exact(bpg).zip(xp.chunks_exact(GS)).zip(scales);
    for (g, ((gb, gx), &s)) in groups.enumerate() {
        group_step::<BITS, M, V>(&mut acc, g, gb, gx, M::scale(s));
    }
    Some(acc[0].add(acc[1]).sum())
}

#[cfg(test)]
mod tests {
    use super::super::simd::{F8Ops, Portable, Simd, U8Ops};
    use crate::format::mlxfp::{e4m3_to_f32, FP4_LUT};

    /// Every byte through [`U8Ops::e4m3`] and [`U8Ops::lookup16`] of the
    /// e2m1 table at level `V`: the scalar decoders' values, bit for bit
    /// (any NaN for the NaN codes).
    fn lanes_decode_exactly<V: Simd>() {
        for c in 0..32u8 {
            let b: [u8; 8] = std::array::from_fn(|i| 8 * c + i as u8);
            let (e4, e2) = V::enter(|| {
                let v = <V::U8 as U8Ops>::bytes(&b);
                (v.e4m3().to_array(), v.and(15).lookup16(&FP4_LUT).to_array())
            });
            for ((&b, g4), g2) in b.iter().zip(e4).zip(e2) {
                let w4 = e4m3_to_f32(b);
                let same = g4.to_bits() == w4.to_bits() || (g4.is_nan() && w4.is_nan());
                assert!(same, "e4m3 {b:#04x}: {g4:e} vs {w4:e}");
                let w2 = FP4_LUT[usize::from(b & 15)];
                assert_eq!(g2.to_bits(), w2.to_bits(), "e2m1 {b:#04x}");
            }
        }
    }

    #[test]
    fn portable_lanes_decode_exactly() {
        lanes_decode_exactly::<Portable>();
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_lanes_decode_exactly() {
        if crate::cpu::SimdLevel::Avx2.is_supported() {
            lanes_decode_exactly::<super::super::simd::Avx2>();
        } else {
            eprintln!("AVX2 not supported by this CPU, skipped");
        }
    }
}
