//! Builds an MoE block from your own tensors and runs it on the CPU.
//!
//! ```text
//! cargo run --release -p moekit --example own_tensors
//! ```
//!
//! Random f32 expert weights are quantized with moekit's quantizers: the
//! gate and up projections to MLX affine 4-bit (group size 64, bf16 scales
//! and biases, bit-identical to `mx.quantize`), the down projection to GGUF
//! Q8_0 (byte-identical to gguf-py). The router stays dense f32. The block
//! runs on the fast CPU path and on the CPU reference (the oracle); the
//! example prints token 0's routing, the output shape and how far the two
//! paths differ: with f32 activations (`cpu::with_act_mode`; the same
//! maths but for the summation order: max |difference| ≤ 1e-3·max |y|) and
//! by default (both formats' integer kernels with activations quantized to
//! 8-bit blocks: NMSE ≤ 1e-4).

use half::bf16;
use moekit::cpu::{self, ActMode};
use moekit::format::{affine, ggml, storage_shapes, AffineParams, GgmlType};
use moekit::moe::{MoeBlockParts, SharedExpert};
use moekit::ops::act::GateUp;
use moekit::ops::route::{RouterConfig, RouterKind};
use moekit::{Backend, DType, MoeBlock, QuantWeights, Tensor, WeightFormat};

/// Experts, experts per token, hidden size, expert intermediate size, tokens.
const E: usize = 8;
const K: usize = 2;
const H: usize = 256;
const I: usize = 128;
const T: usize = 4;

/// Deterministic values in [-amp, amp] (a small xorshift generator).
fn random(n: usize, seed: u64, amp: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            amp * ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0)
        })
        .collect()
}

/// `[E, N, K]` f32 weights (row-major, one `[N, K]` matrix per expert) as
/// MLX affine 4-bit with group size 64.
fn affine4(w: &[f32], n_experts: usize, rows: usize, cols: usize) -> moekit::Result<QuantWeights> {
    let format = WeightFormat::Affine(AffineParams {
        bits: 4,
        group_size: 64,
    });
    // Rows are quantized independently, so all experts go in one call.
    let q = affine::quantize::<bf16>(w, n_experts * rows, cols, 4, 64)?;
    // The shapes QuantWeights expects: data [E, N, K/8] u32, scales and
    // biases [E, N, K/64].
    let (_dtype, shape, sshape) = storage_shapes(format, n_experts, rows, cols)?;
    let sshape = sshape.unwrap_or_default();
    QuantWeights::new(
        format,
        n_experts,
        rows,
        cols,
        Tensor::from_slice(&q.packed, &shape)?,
        Some(Tensor::from_slice(&q.scales, &sshape)?),
        Some(Tensor::from_slice(&q.biases, &sshape)?),
    )
}

/// The same as GGUF Q8_0 blocks (32 weights, one f16 scale each).
fn q8_0(w: &[f32], n_experts: usize, rows: usize, cols: usize) -> moekit::Result<QuantWeights> {
    let ty = GgmlType::Q8_0;
    let row_bytes = cols / ty.block_size() * ty.type_size();
    let mut bytes = vec![0u8; n_experts * rows * row_bytes];
    for (src, dst) in w.chunks_exact(cols).zip(bytes.chunks_exact_mut(row_bytes)) {
        ggml::quantize_row(ty, src, dst)?;
    }
    let format = WeightFormat::Ggml(ty);
    let (_dtype, shape, _) = storage_shapes(format, n_experts, rows, cols)?;
    let data = Tensor::from_slice(&bytes, &shape)?;
    QuantWeights::new(format, n_experts, rows, cols, data, None, None)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let router = RouterConfig {
        kind: RouterKind::SoftmaxTopK {
            norm_topk_prob: true,
        },
        n_experts: E,
        top_k: K,
    };
    let dense = |w: Vec<f32>, n: usize, rows: usize, cols: usize| {
        QuantWeights::new(
            WeightFormat::Dense(DType::F32),
            n,
            rows,
            cols,
            Tensor::from_f32(&w, &[n, rows, cols], DType::F32)?,
            None,
            None,
        )
    };
    let block = MoeBlock::new(MoeBlockParts {
        router,
        // Router [1, E, H]: logits = x · Wᵀ.
        router_weight: dense(random(E * H, 1, 0.1), 1, E, H)?,
        // Gate and up [E, I, H], down [E, H, I].
        gate_up: GateUp::separate(
            affine4(&random(E * I * H, 2, 0.05), E, I, H)?,
            affine4(&random(E * I * H, 3, 0.05), E, I, H)?,
        )?,
        down: q8_0(&random(E * H * I, 4, 0.05), E, H, I)?,
        // Optional always-on expert (Qwen2-MoE, DeepSeek); none here.
        shared: None::<SharedExpert>,
        ffn: Default::default(),
    })?;
    let p = block.parts();
    println!(
        "block: E = {E}, k = {K}, H = {H}, I = {I}; gate/up {}, down {}, router {}",
        match &p.gate_up {
            GateUp::Separate { gate, .. } => gate.format(),
            GateUp::Fused(w) => w.format(),
        },
        p.down.format(),
        p.router_weight.format()
    );

    let x = Tensor::from_f32(&random(T * H, 5, 1.0), &[T, H], DType::F32)?;
    let fast = block.forward_on(Backend::CpuFast, &x)?;
    let oracle = block.forward_on(Backend::CpuReference, &x)?;

    let ids = fast.routing.ids.as_slice::<u32>()?;
    let weights = fast.routing.weights.as_slice::<f32>()?;
    println!(
        "token 0 -> experts {:?} with weights {:?}",
        &ids[..K],
        &weights[..K]
    );
    let oracle = oracle.out.to_f32_vec()?;
    println!("output {:?} {}", fast.out.shape(), fast.out.dtype());
    // The fast path with f32 activations: the same maths as the reference
    // but for the summation order (max |difference| ≤ 1e-3·max |y|).
    let fast_f32 = cpu::with_act_mode(ActMode::F32, || block.forward_on(Backend::CpuFast, &x))?;
    let (diff, scale) = max_diff(&fast_f32.out.to_f32_vec()?, &oracle);
    println!("f32 activations: max |fast - reference| = {diff:.3e} (max |y| = {scale:.3e})");
    if !diff.is_finite() || diff > 1e-3 * scale.max(1e-6) {
        return Err(format!("the fast CPU path differs from the reference by {diff}").into());
    }
    // The default: activations quantized to 8-bit blocks for the integer
    // kernels of both formats, within the stated bound (NMSE ≤ 1e-4).
    let a = fast.out.to_f32_vec()?;
    let (diff, _) = max_diff(&a, &oracle);
    let nmse = nmse(&a, &oracle);
    println!("8-bit activations: max |fast - reference| = {diff:.3e}, NMSE {nmse:.2e}");
    if !nmse.is_finite() || nmse > 1e-4 {
        return Err(format!("the fast CPU path differs from the reference: NMSE {nmse:e}").into());
    }
    Ok(())
}

/// The largest `|a − b|` and the largest `|b|`.
fn max_diff(a: &[f32], b: &[f32]) -> (f32, f32) {
    let diff = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    (diff, b.iter().map(|y| y.abs()).fold(0f32, f32::max))
}

/// Normalized mean squared error of `a` against `b`, as llama.cpp's
/// test-backend-ops.
fn nmse(a: &[f32], b: &[f32]) -> f64 {
    let (num, den) = a.iter().zip(b).fold((0f64, 0f64), |(n, d), (&x, &y)| {
        let (x, y) = (f64::from(x), f64::from(y));
        (n + (x - y) * (x - y), d + y * y)
    });
    num / den.max(f64::MIN_POSITIVE)
}
