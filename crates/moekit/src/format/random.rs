//! Random but valid weights of any format, for benchmarks and property tests.
//!
//! Values are O(0.01–0.1), like trained LLM weights; every expert is drawn
//! from its own seeded stream so generation runs in parallel and is
//! reproducible.

use super::{storage_shapes, QuantWeights, WeightFormat};
use crate::dtype::{DType, Float};
use crate::error::Result;
use crate::format::{fp8, ggml, mlxfp};
use crate::tensor::{Bytes, Tensor};
use half::{bf16, f16};
use rand::{Rng, RngCore, SeedableRng};
use rayon::prelude::*;

fn rng_for(seed: u64, stream: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

fn fill_floats<T: Float>(out: &mut [u8], rng: &mut impl Rng, amp: f32, offset: f32) {
    for c in out.chunks_exact_mut(std::mem::size_of::<T>()) {
        let v = T::from_f32(offset + amp * (rng.random::<f32>() * 2.0 - 1.0));
        c.copy_from_slice(bytemuck::bytes_of(&v));
    }
}

fn fill_float_dtype(dtype: DType, out: &mut [u8], rng: &mut impl Rng, amp: f32, offset: f32) {
    match dtype {
        DType::F16 => fill_floats::<f16>(out, rng, amp, offset),
        DType::Bf16 => fill_floats::<bf16>(out, rng, amp, offset),
        _ => fill_floats::<f32>(out, rng, amp, offset),
    }
}

/// Random `[E, rows, cols]` weights in `format`; affine scales/biases in
/// `scale_dtype` (MLX fp scales are always `u8`). `on_expert` is called once per finished expert (progress).
pub fn random_weights(
    format: WeightFormat,
    n_experts: usize,
    rows: usize,
    cols: usize,
    scale_dtype: DType,
    seed: u64,
    on_expert: &(dyn Fn() + Sync),
) -> Result<QuantWeights> {
    let (dtype, shape, sshape) = storage_shapes(format, n_experts, rows, cols)?;
    let scale_dtype = match format {
        WeightFormat::AffineU8 { .. } | WeightFormat::Fp8Block { .. } => DType::F32,
        WeightFormat::MlxFp(_) => DType::U8,
        _ => scale_dtype,
    };
    let per_expert = shape.iter().product::<usize>() / n_experts.max(1) * dtype.size();
    let per_expert_s = sshape.as_ref().map_or(0, |s| {
        s.iter().product::<usize>() / n_experts.max(1) * scale_dtype.size()
    });
    let mut data = Bytes::zeroed(per_expert * n_experts);
    let mut scales = Bytes::zeroed(per_expert_s * n_experts);
    let mut biases = Bytes::zeroed(per_expert_s * n_experts);
    let levels = |bits: u32| ((1u32 << bits) - 1) as f32;
    fn split(b: &mut Bytes, n: usize) -> Vec<&mut [u8]> {
        match n {
            0 => Vec::new(),
            n => b.make_mut().chunks_mut(n).collect(),
        }
    }
    let mut s_parts = split(&mut scales, per_expert_s);
    let mut b_parts = split(&mut biases, per_expert_s);
    s_parts.resize_with(n_experts, Default::default);
    b_parts.resize_with(n_experts, Default::default);
    data.make_mut()
        .par_chunks_mut(per_expert.max(1))
        .zip(s_parts.par_iter_mut())
        .zip(b_parts.par_iter_mut())
        .enumerate()
        .for_each(|(e, ((d, s), b))| {
            let mut rng = rng_for(seed, e as u64);
            match format {
                WeightFormat::Dense(dt) => fill_float_dtype(dt, d, &mut rng, 0.05, 0.0),
                WeightFormat::Affine(p) => {
                    rng.fill_bytes(d);
                    let l = levels(p.bits);
                    fill_float_dtype(scale_dtype, s, &mut rng, 0.02 / l, 0.04 / l);
                    fill_float_dtype(scale_dtype, b, &mut rng, 0.005, -0.02);
                }
                WeightFormat::AffineU8 { .. } => {
                    rng.fill_bytes(d);
                    fill_float_dtype(DType::F32, s, &mut rng, 0.02 / 255.0, 0.04 / 255.0);
                    fill_float_dtype(DType::F32, b, &mut rng, 0.005, -0.02);
                }
                WeightFormat::MlxFp(m) => mlxfp::fill_random(m, d, s, &mut rng),
                WeightFormat::Fp8Block { .. } => fp8::fill_random(d, s, &mut rng),
                WeightFormat::Ggml(t) => {
                    let blocks = ggml::random_blocks(t, d.len() / t.type_size(), rng.next_u64());
                    d.copy_from_slice(&blocks);
                }
            }
            on_expert();
        });
    let data = Tensor::from_bytes(dtype, &shape, data)?;
    let aux = |b: Bytes| -> Result<Option<Tensor>> {
        sshape
            .as_ref()
            .map(|s| Tensor::from_bytes(scale_dtype, s, b))
            .transpose()
    };
    let (scales, biases) = (aux(scales)?, aux(biases)?);
    let biases = biases.filter(|_| format.has_biases());
    QuantWeights::new(format, n_experts, rows, cols, data, scales, biases)
}
