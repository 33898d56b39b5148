//! The fused kernels of the GGUF types: the 32-weight blocks in
//! [`legacy`](super::legacy), the K-quants in [`kquant`](super::kquant).
//! IQ4_NL and MXFP4 are 32-weight blocks with table-coded weights, IQ4_XS
//! a K-quant-like super-block, NVFP4 64-weight blocks of four table-coded
//! groups of 16 ([`legacy::nvfp4_dot`]); the grid and ternary types
//! (IQ1–IQ3, TQ*) have no fused f32 kernel: on the f32 path their rows are
//! decoded, then dotted ([`Decode`]); by default they take the integer
//! kernels (`cpu::fast::qdot::grid`).

use super::{kquant, legacy, run, Decode, RowKernel, Run, Simd, XSums};
use crate::format::ggml::blocks::{
    Block, BlockQ2_K, BlockQ3_K, BlockQ4_0, BlockQ4_1, BlockQ4_K, BlockQ5_0, BlockQ5_1, BlockQ5_K,
    BlockQ6_K, BlockQ8_0,
};
use crate::format::ggml::nonlinear::{BlockIQ4_NL, BlockIQ4_XS, BlockMXFP4};
use crate::format::ggml::GgmlType;
use crate::format::RawRow;
use std::marker::PhantomData;

/// The kernel run of rows of `t` blocks.
pub(super) fn run_for<V: Simd>(t: GgmlType) -> Run {
    match t {
        GgmlType::Q4_0 => run::<Legacy<BlockQ4_0>, V>,
        GgmlType::Q4_1 => run::<Legacy<BlockQ4_1>, V>,
        GgmlType::Q5_0 => run::<Legacy<BlockQ5_0>, V>,
        GgmlType::Q5_1 => run::<Legacy<BlockQ5_1>, V>,
        GgmlType::Q8_0 => run::<Legacy<BlockQ8_0>, V>,
        GgmlType::Q2_K => run::<KQuant<BlockQ2_K>, V>,
        GgmlType::Q3_K => run::<KQuant<BlockQ3_K>, V>,
        GgmlType::Q4_K => run::<KQuant<BlockQ4_K>, V>,
        GgmlType::Q5_K => run::<KQuant<BlockQ5_K>, V>,
        GgmlType::Q6_K => run::<KQuant<BlockQ6_K>, V>,
        GgmlType::IQ4_NL => run::<Legacy<BlockIQ4_NL>, V>,
        GgmlType::MXFP4 => run::<Legacy<BlockMXFP4>, V>,
        GgmlType::IQ4_XS => run::<KQuant<BlockIQ4_XS>, V>,
        GgmlType::IQ2_XXS
        | GgmlType::IQ2_XS
        | GgmlType::IQ2_S
        | GgmlType::IQ3_XXS
        | GgmlType::IQ3_S
        | GgmlType::IQ1_S
        | GgmlType::IQ1_M
        | GgmlType::TQ1_0
        | GgmlType::TQ2_0 => run::<Decode, V>,
        GgmlType::NVFP4 => run::<Nvfp4, V>,
    }
}

/// The bytes of a row of `B` blocks.
#[inline(always)]
fn bytes_of<'a, B: Block>(raw: &RawRow<'a>) -> Option<&'a [u8]> {
    match *raw {
        RawRow::Ggml(t, bytes) if t == B::TYPE => Some(bytes),
        _ => None,
    }
}

/// Rows of 32-weight blocks `B`.
struct Legacy<B>(PhantomData<B>);

impl<B: legacy::Block32 + Block> RowKernel for Legacy<B> {
    #[inline(always)]
    fn dot<V: Simd>(raw: &RawRow<'_>, x: &[f32], xs: &XSums) -> Option<f32> {
        legacy::dot_blocks::<B, V>(bytes_of::<B>(raw)?, x, xs)
    }
}

/// Rows of K-quant super-blocks `B`.
struct KQuant<B>(PhantomData<B>);

impl<B: kquant::SuperBlock + Block> RowKernel for KQuant<B> {
    #[inline(always)]
    fn dot<V: Simd>(raw: &RawRow<'_>, x: &[f32], xs: &XSums) -> Option<f32> {
        kquant::dot_blocks::<B, V>(bytes_of::<B>(raw)?, x, xs)
    }
}

/// Rows of NVFP4 blocks.
struct Nvfp4;

impl RowKernel for Nvfp4 {
    #[inline(always)]
    fn dot<V: Simd>(raw: &RawRow<'_>, x: &[f32], _: &XSums) -> Option<f32> {
        match *raw {
            RawRow::Ggml(GgmlType::NVFP4, bytes) => legacy::nvfp4_dot::<V>(bytes, x),
            _ => None,
        }
    }
}
