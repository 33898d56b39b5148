//! Fused dot kernel of FP8 block-scaled rows (`fp8-b<block_k>`):
//! `Σ_g scale_g·Σ_{k∈g} e4m3(code_k)·x_k`.
//!
//! One e4m3fn byte per weight, so the rows run the byte-wise affine loop
//! ([`group_step`] with 8-bit codes, `x` in its own order): 8 bytes at a
//! time widened to 8 lanes and converted exactly in the lanes
//! ([`U8Ops::e4m3`], the conversion of MLX's mxfp8 kernel), the group's f32
//! scale applied once per group (32, 64 or 128 weights), even and odd
//! groups in separate accumulators; there is no bias term.
//!
//! Numerics: the scale multiplies a group's sum once, where decode-then-dot
//! multiplies each weight, so the results differ in the last bits.

use super::affine::{group_step, CodeValues};
use super::simd::{F8Ops, Simd, U8Ops};
use super::{run, RowKernel, Run, XSums};
use crate::format::RawRow;

/// The kernel run of rows with `block_k`-column groups (the decode
/// fallback for a block size without a kernel).
pub(super) fn run_for<V: Simd>(block_k: usize) -> Option<Run> {
    Some(match block_k {
        32 => run::<Fp8Row<32>, V>,
        64 => run::<Fp8Row<64>, V>,
        128 => run::<Fp8Row<128>, V>,
        _ => return None,
    })
}

/// e4m3fn codes: converted in the lanes.
struct E4m3;

impl CodeValues for E4m3 {
    #[inline(always)]
    fn values<V: Simd>(code: V::U8) -> V::F8 {
        code.e4m3()
    }
}

/// Rows with `GS` columns per scale.
struct Fp8Row<const GS: usize>;

impl<const GS: usize> RowKernel for Fp8Row<GS> {
    #[inline(always)]
    fn dot<V: Simd>(raw: &RawRow<'_>, x: &[f32], _: &XSums) -> Option<f32> {
        let RawRow::Fp8Block {
            block_k,
            codes,
            scales,
        } = *raw
        else {
            return None;
        };
        if block_k != GS {
            return None;
        }
        V::enter(
            #[inline(always)]
            || fp8_row::<GS, V>(codes, scales, x),
        )
    }
}

/// The dot of one row (out of line, in [`Simd::enter`]); `None` if the
/// lengths disagree.
#[inline(always)]
fn fp8_row<const GS: usize, V: Simd>(codes: &[u8], scales: &[f32], x: &[f32]) -> Option<f32> {
    if codes.len() != scales.len() * GS || x.len() != codes.len() {
        return None;
    }
    let mut acc = [V::F8::zero(); 2];
    let groups = codes.chunks_exact(GS).zip(x.chunks_exact(GS)).zip(scales);
    for (g, ((gb, gx), &s)) in groups.enumerate() {
        group_step::<8, E4m3, V>(&mut acc, g, gb, gx, s);
    }
    Some(acc[0].add(acc[1]).sum())
}
