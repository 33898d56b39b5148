//! GGUF (GGML) block quantization: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32 weights a
//! block) and the K-quants Q2_K … Q6_K (256 weights a super-block).
//!
//! * [`GgmlType`] names a type: block size, bytes per block, GGML type id.
//! * `blocks` (crate-private) holds the `#[repr(C)]` block structs, byte-for-byte llama.cpp's
//!   `ggml-common.h`, and their dequantizers.
//! * [`dequantize_row`] decodes a row of whole blocks, bit-identical in f32 to
//!   gguf-py's `gguf.quants.dequantize` (and so to ggml's `dequantize_row_*`).
//! * [`quantize_row`] is the reference quantizer of the 32-weight types,
//!   byte-identical to `gguf.quants.quantize` (the K-types are not supported).
//! * [`random_blocks`] makes valid random blocks for benchmarks and tests.
//!
//! Internally every public function dispatches once on the type
//! (`with_block`) to code generic over the block struct.

pub(crate) mod blocks;
mod quantize;

use crate::error::{ensure, unsupported, Result};
use blocks::{
    Block, BlockQ2_K, BlockQ3_K, BlockQ4_0, BlockQ4_1, BlockQ4_K, BlockQ5_0, BlockQ5_1, BlockQ5_K,
    BlockQ6_K, BlockQ8_0,
};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use std::fmt;

/// GGML block types moekit supports.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// 32 weights, f16 d, 4-bit.
    Q4_0,
    /// 32 weights, f16 d and m, 4-bit.
    Q4_1,
    /// 32 weights, f16 d, 5-bit.
    Q5_0,
    /// 32 weights, f16 d and m, 5-bit.
    Q5_1,
    /// 32 weights, f16 d, 8-bit.
    Q8_0,
    /// K-quant super-block of 256, 2-bit.
    Q2_K,
    /// K-quant super-block of 256, 3-bit.
    Q3_K,
    /// K-quant super-block of 256, 4-bit.
    Q4_K,
    /// K-quant super-block of 256, 5-bit.
    Q5_K,
    /// K-quant super-block of 256, 6-bit.
    Q6_K,
}

impl GgmlType {
    /// Every supported type.
    pub const ALL: [GgmlType; 10] = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];
    /// Weights per block.
    pub const fn block_size(self) -> usize {
        match self {
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => {
                32
            }
            _ => blocks::QK_K,
        }
    }
    /// Bytes per block.
    pub const fn type_size(self) -> usize {
        match self {
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q2_K => 84,
            GgmlType::Q3_K => 110,
            GgmlType::Q4_K => 144,
            GgmlType::Q5_K => 176,
            GgmlType::Q6_K => 210,
        }
    }
    /// Lower-case name (`q4_0`, `q4_k`).
    pub const fn name(self) -> &'static str {
        match self {
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q4_1 => "q4_1",
            GgmlType::Q5_0 => "q5_0",
            GgmlType::Q5_1 => "q5_1",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q2_K => "q2_k",
            GgmlType::Q3_K => "q3_k",
            GgmlType::Q4_K => "q4_k",
            GgmlType::Q5_K => "q5_k",
            GgmlType::Q6_K => "q6_k",
        }
    }
    /// Parses a name (case-insensitive).
    pub fn parse(s: &str) -> Option<GgmlType> {
        GgmlType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
    }
    /// The `enum ggml_type` value (`ggml.h`), as stored in GGUF tensor infos.
    pub const fn ggml_type_id(self) -> u32 {
        match self {
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
        }
    }
    /// The type of a `ggml_type` value; `None` for types moekit does not support
    /// (F32, F16, Q8_1, IQ*, …).
    pub fn from_ggml_type_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.ggml_type_id() == id)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Code generic over the block struct, run by [`with_block`].
trait WithBlock {
    type Output;
    fn run<B: Block>(self) -> Self::Output;
}

/// The one place that maps a [`GgmlType`] to its block struct.
fn with_block<F: WithBlock>(ty: GgmlType, f: F) -> F::Output {
    match ty {
        GgmlType::Q4_0 => f.run::<BlockQ4_0>(),
        GgmlType::Q4_1 => f.run::<BlockQ4_1>(),
        GgmlType::Q5_0 => f.run::<BlockQ5_0>(),
        GgmlType::Q5_1 => f.run::<BlockQ5_1>(),
        GgmlType::Q8_0 => f.run::<BlockQ8_0>(),
        GgmlType::Q2_K => f.run::<BlockQ2_K>(),
        GgmlType::Q3_K => f.run::<BlockQ3_K>(),
        GgmlType::Q4_K => f.run::<BlockQ4_K>(),
        GgmlType::Q5_K => f.run::<BlockQ5_K>(),
        GgmlType::Q6_K => f.run::<BlockQ6_K>(),
    }
}

/// Checks `n_values` is a whole number of blocks and `n_bytes` their size.
fn check_lengths(
    op: &'static str,
    ty: GgmlType,
    values_arg: &'static str,
    n_values: usize,
    bytes_arg: &'static str,
    n_bytes: usize,
) -> Result<()> {
    let bs = ty.block_size();
    ensure(
        n_values.is_multiple_of(bs),
        op,
        values_arg,
        format!("a length that is a multiple of {bs} (the {ty} block size)"),
        n_values,
    )?;
    let n_blocks = n_values / bs;
    let want = n_blocks * ty.type_size();
    ensure(
        n_bytes == want,
        op,
        bytes_arg,
        format!("{want} bytes ({n_blocks} blocks of {ty} for {n_values} values)"),
        n_bytes,
    )
}

struct Dequantize<'a> {
    bytes: &'a [u8],
    out: &'a mut [f32],
}

impl WithBlock for Dequantize<'_> {
    type Output = ();
    fn run<B: Block>(self) {
        let outs = self.out.chunks_exact_mut(B::TYPE.block_size());
        match bytemuck::try_cast_slice::<u8, B>(self.bytes) {
            Ok(blocks) => blocks.iter().zip(outs).for_each(|(b, o)| b.dequantize(o)),
            // Not 2-aligned: copy each block out first.
            Err(_) => self
                .bytes
                .chunks_exact(std::mem::size_of::<B>())
                .zip(outs)
                .for_each(|(c, o)| {
                    if let Ok(b) = bytemuck::try_pod_read_unaligned::<B>(c) {
                        b.dequantize(o);
                    }
                }),
        }
    }
}

/// Dequantizes one row of whole blocks: `bytes.len() == out.len()/block_size·type_size`.
///
/// Bit-identical in f32 to `gguf.quants.dequantize` and ggml's
/// `dequantize_row_*`. `bytes` need not be aligned.
pub fn dequantize_row(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    check_lengths(
        "ggml_dequantize_row",
        ty,
        "out",
        out.len(),
        "bytes",
        bytes.len(),
    )?;
    with_block(ty, Dequantize { bytes, out });
    Ok(())
}

struct Quantize<'a> {
    src: &'a [f32],
    out: &'a mut [u8],
}

impl WithBlock for Quantize<'_> {
    type Output = bool;
    fn run<B: Block>(self) -> bool {
        if !B::QUANTIZE {
            return false;
        }
        let chunks = self
            .src
            .chunks_exact(B::TYPE.block_size())
            .zip(self.out.chunks_exact_mut(std::mem::size_of::<B>()));
        for (x, o) in chunks {
            for (d, s) in o.iter_mut().zip(bytemuck::bytes_of(&B::quantize(x))) {
                *d = *s;
            }
        }
        true
    }
}

/// Quantizes one row (`src.len()` a multiple of the block size) into
/// `out.len() == src.len()/block_size·type_size` bytes.
///
/// Byte-identical to `gguf.quants.quantize` (llama.cpp's
/// `quantize_row_*_ref`) for finite input. Only Q4_0, Q4_1, Q5_0, Q5_1 and
/// Q8_0; the K-types return [`crate::Error::Unsupported`].
pub fn quantize_row(ty: GgmlType, src: &[f32], out: &mut [u8]) -> Result<()> {
    const OP: &str = "ggml_quantize_row";
    check_lengths(OP, ty, "src", src.len(), "out", out.len())?;
    if with_block(ty, Quantize { src, out }) {
        Ok(())
    } else {
        Err(unsupported(
            OP,
            format!("quantizing to {ty} (only q4_0, q4_1, q5_0, q5_1, q8_0)"),
        ))
    }
}

struct RandomBlocks {
    n_blocks: usize,
    seed: u64,
}

impl WithBlock for RandomBlocks {
    type Output = Vec<u8>;
    fn run<B: Block>(self) -> Vec<u8> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let mut blocks = vec![B::zeroed(); self.n_blocks];
        rng.fill_bytes(bytemuck::cast_slice_mut(&mut blocks));
        for b in &mut blocks {
            b.randomize_scales(&mut rng);
        }
        bytemuck::cast_slice(&blocks).to_vec()
    }
}

/// `n_blocks` random valid blocks of `ty` (deterministic in `seed`): random
/// code bytes, finite f16 scales sized so the weights are O(0.01–0.1).
pub fn random_blocks(ty: GgmlType, n_blocks: usize, seed: u64) -> Vec<u8> {
    with_block(ty, RandomBlocks { n_blocks, seed })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct SizeOf;
    impl WithBlock for SizeOf {
        type Output = (GgmlType, usize, usize);
        fn run<B: Block>(self) -> (GgmlType, usize, usize) {
            (B::TYPE, std::mem::size_of::<B>(), std::mem::align_of::<B>())
        }
    }

    #[test]
    fn block_structs_match_type_sizes() {
        for ty in GgmlType::ALL {
            let (t, size, align) = with_block(ty, SizeOf);
            assert_eq!(t, ty);
            assert_eq!(size, ty.type_size(), "{ty}");
            assert_eq!(align, 2, "{ty}");
        }
    }

    #[test]
    fn type_ids_round_trip() {
        let ids: Vec<u32> = GgmlType::ALL.iter().map(|t| t.ggml_type_id()).collect();
        assert_eq!(ids, [2, 3, 6, 7, 8, 10, 11, 12, 13, 14]);
        for ty in GgmlType::ALL {
            assert_eq!(GgmlType::from_ggml_type_id(ty.ggml_type_id()), Some(ty));
            assert_eq!(GgmlType::parse(&ty.name().to_uppercase()), Some(ty));
        }
        for id in [0, 1, 4, 5, 9, 15, 16, 30, u32::MAX] {
            assert_eq!(GgmlType::from_ggml_type_id(id), None, "{id}");
        }
    }

    #[test]
    fn random_blocks_dequantize_to_small_finite_values() -> Result<()> {
        for ty in GgmlType::ALL {
            let n = 64;
            let bytes = random_blocks(ty, n, 1);
            assert_eq!(bytes.len(), n * ty.type_size());
            assert_eq!(bytes, random_blocks(ty, n, 1), "{ty}: deterministic");
            assert_ne!(bytes, random_blocks(ty, n, 2), "{ty}: seed matters");
            let mut out = vec![f32::NAN; n * ty.block_size()];
            dequantize_row(ty, &bytes, &mut out)?;
            assert!(out.iter().all(|v| v.is_finite()), "{ty}");
            let max = out.iter().fold(0f32, |m, v| m.max(v.abs()));
            let rms = (out.iter().map(|v| v * v).sum::<f32>() / out.len() as f32).sqrt();
            assert!((0.005..=0.25).contains(&max), "{ty}: max |w| = {max}");
            assert!(rms >= 1e-3, "{ty}: rms = {rms}");
        }
        Ok(())
    }

    #[test]
    fn unaligned_bytes_decode_like_aligned() -> Result<()> {
        for ty in GgmlType::ALL {
            let bytes = random_blocks(ty, 3, 9);
            let mut shifted = vec![0u8; bytes.len() + 1];
            shifted[1..].copy_from_slice(&bytes);
            let (mut a, mut b) = (
                vec![0f32; 3 * ty.block_size()],
                vec![1f32; 3 * ty.block_size()],
            );
            dequantize_row(ty, &bytes, &mut a)?;
            dequantize_row(ty, &shifted[1..], &mut b)?;
            assert_eq!(a, b, "{ty}");
        }
        Ok(())
    }

    #[test]
    fn quantize_round_trip_nmse() -> Result<()> {
        // NMSE bound per type for N(0,1) data, well above the expected
        // quantization noise (q4 ≈ 1e-2, q5 ≈ 3e-3, q8 ≈ 5e-5), far below 1.
        let bounds = [
            (GgmlType::Q4_0, 2e-2),
            (GgmlType::Q4_1, 2e-2),
            (GgmlType::Q5_0, 5e-3),
            (GgmlType::Q5_1, 5e-3),
            (GgmlType::Q8_0, 1e-4),
        ];
        let mut rng = StdRng::seed_from_u64(3);
        let x: Vec<f32> = (0..32 * 64)
            .map(|_| {
                let (u, v): (f32, f32) = (rand::Rng::random(&mut rng), rand::Rng::random(&mut rng));
                (-2.0 * (1.0 - u).ln()).sqrt() * (std::f32::consts::TAU * v).cos()
            })
            .collect();
        for (ty, bound) in bounds {
            let mut q = vec![0u8; x.len() / 32 * ty.type_size()];
            quantize_row(ty, &x, &mut q)?;
            let mut y = vec![0f32; x.len()];
            dequantize_row(ty, &q, &mut y)?;
            let err: f32 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum();
            let nmse = err / x.iter().map(|a| a * a).sum::<f32>();
            assert!(nmse < bound, "{ty}: nmse {nmse}");
            assert!(nmse > 0.0, "{ty}: lossy");
        }
        Ok(())
    }

    #[test]
    fn k_types_cannot_be_quantized() {
        for ty in [
            GgmlType::Q2_K,
            GgmlType::Q3_K,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ] {
            let mut out = vec![0u8; ty.type_size()];
            let r = quantize_row(ty, &[0.0; 256], &mut out);
            assert!(
                matches!(r, Err(crate::Error::Unsupported { .. })),
                "{ty}: {r:?}"
            );
        }
    }
}
