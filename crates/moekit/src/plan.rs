//! Which implementation runs an MoE block: the one place the choice is
//! made, as MLX's `supports_*`/launch pairs do. [`plan`] asks every path
//! whether it takes the block and input, keeps the reason of each refusal,
//! and picks by the measured crossover ([`decode_max_tokens`]); a forced
//! [`MoePath`] that is refused is an error carrying that reason.

use crate::device::Backend;
use crate::dtype::DType;
use crate::error::{invalid, Result};
use crate::format::WeightFormat;
use crate::ops::parts::MoeBlockParts;
use crate::tensor::Tensor;

/// Which implementation of the block runs (what a caller may ask for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoePath {
    /// The planner's choice.
    Auto,
    /// Op by op: route, sort, permute, grouped matmuls on CUDA cores or the
    /// CPU, combine.
    General,
    /// The three-launch fused CUDA decode path (`cuda::ops::decode`).
    Decode,
    /// Expert GEMMs on tensor cores (`cuda::ops::tc_moe`).
    TensorCore,
}

/// The planner's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The path that runs (never [`MoePath::Auto`]).
    pub path: MoePath,
    /// Each path that was not taken because it refused, with the reason.
    pub refused: Vec<(MoePath, String)>,
}

/// Largest token count for which the fused decode path is chosen over the
/// tensor-core path when both take the block: the measured crossover (H100,
/// qwen3-30b-a3b, CUDA-graph medians, `moekit bench --path decode|tc`).
///
/// With 16-bit activations the decode path runs its expert matrices on
/// tensor cores; decode vs tensor-core path, ms (2026-11-24, third session,
/// the router on tensor cores at every T: bench/results/h100/tc/2026-11-24.md):
/// * affine4-g64: T = 32 0.271 vs 0.292, T = 48 0.334 vs 0.315;
/// * q4_k: T = 32 0.287 vs 0.325, T = 48 0.354 vs 0.349;
/// * q8_0: T = 32 0.384 vs 0.406, T = 48 0.461 vs 0.437;
/// * affine8-g64: T = 32 0.328 vs 0.365;
/// * bf16: T = 8 0.222 vs 0.227, T = 12 0.291 vs 0.281, T = 16 0.346 vs
///   0.330;
///
/// → quantized codes (4-bit and 8-bit alike) decode up to 32 tokens, dense
/// weights up to 8.
///
/// `tc_ra`: the tensor-core path runs this format's experts on the
/// register-operand kernel (sm_90a, `cuda::ops::tc_ra::max_tile`), which
/// moved the crossover down for two formats; decode vs tensor-core path, ms
/// (H200, 2026-11-28, `bench/results/h200/tc_ra_2026-11-28/cross_*.txt`):
/// * affine4-g64: T = 16 0.157 vs 0.167, T = 24 0.194 vs 0.196, T = 32
///   0.224 vs 0.213 → up to 24;
/// * q4_k: T = 16 0.176 vs 0.182, T = 24 0.219 vs 0.214 → up to 16;
/// * q4_0 (T = 32 0.269 vs 0.277) and q8_0 (0.341 vs 0.381) still decode
///   through 32.
///
/// With f32 activations it keeps its CUDA-core kernels, whose crossover
/// was (bench/results/h100/tc/crossover_*.json): affine4-g64 T = 8 0.238 vs
/// 0.242 ms, T = 16 0.440 vs 0.322 → affine up to 8; q4_k T = 4 0.152 vs
/// 0.163, T = 8 0.301 vs 0.239 → GGUF up to 4; bf16 T = 2 0.157 vs 0.125 →
/// dense at 1 token only.
pub fn decode_max_tokens(expert_format: WeightFormat, activations: DType, tc_ra: bool) -> usize {
    if matches!(activations, DType::Bf16 | DType::F16) {
        return match expert_format {
            WeightFormat::Affine(p) if tc_ra && p.bits == 4 => 24,
            WeightFormat::Ggml(crate::format::GgmlType::Q4_K) if tc_ra => 16,
            WeightFormat::Dense(_) => 8,
            WeightFormat::Affine(_)
            | WeightFormat::AffineU8 { .. }
            | WeightFormat::Ggml(_)
            | WeightFormat::MlxFp(_)
            | WeightFormat::Fp8Block { .. } => 32,
        };
    }
    match expert_format {
        // MLX fp and FP8 blocks: not measured; taken as affine (32-weight
        // packs, one scale per group).
        WeightFormat::Affine(_)
        | WeightFormat::AffineU8 { .. }
        | WeightFormat::MlxFp(_)
        | WeightFormat::Fp8Block { .. } => 8,
        WeightFormat::Dense(_) => 1,
        WeightFormat::Ggml(_) => 4,
    }
}

/// Why the decode path refuses `x`, if it does.
fn decode_refusal(p: &MoeBlockParts, x: &Tensor) -> Option<String> {
    crate::cuda::ops::decode::supports(p, x).err()
}

/// Chooses the path for `parts` on `x` with `backend`; `forced` other than
/// [`MoePath::Auto`] is taken if it applies, else an error with the reason.
pub fn plan(parts: &MoeBlockParts, backend: Backend, x: &Tensor, forced: MoePath) -> Result<Plan> {
    const OP: &str = "forward";
    let mut refused = Vec::new();
    let cuda = backend == Backend::Cuda;
    let decode = if cuda {
        decode_refusal(parts, x)
    } else {
        Some(format!(
            "{backend:?} backend (the decode path is CUDA only)"
        ))
    };
    let tc = if cuda {
        crate::cuda::ops::tc_moe::supports(parts, x).err()
    } else {
        Some(format!(
            "{backend:?} backend (the tensor-core path is CUDA only)"
        ))
    };
    let pick = |path: MoePath, why: &Option<String>| -> Result<()> {
        match why {
            Some(w) => Err(invalid(
                OP,
                "path",
                format!("a block and input {path:?} takes"),
                w,
            )),
            None => Ok(()),
        }
    };
    let t = x.shape().first().copied().unwrap_or(0);
    let path = match forced {
        MoePath::General => MoePath::General,
        MoePath::Decode => {
            pick(MoePath::Decode, &decode)?;
            MoePath::Decode
        }
        MoePath::TensorCore => {
            pick(MoePath::TensorCore, &tc)?;
            MoePath::TensorCore
        }
        MoePath::Auto => match (&decode, &tc) {
            (None, None)
                if t <= decode_max_tokens(
                    parts.down.format(),
                    x.dtype(),
                    crate::cuda::ops::tc_moe::ra_format(parts.down.format(), x),
                ) =>
            {
                MoePath::Decode
            }
            (_, None) => MoePath::TensorCore,
            (None, Some(_)) => MoePath::Decode,
            (Some(_), Some(_)) => MoePath::General,
        },
    };
    for (p, why) in [(MoePath::Decode, decode), (MoePath::TensorCore, tc)] {
        if let Some(w) = why {
            refused.push((p, w));
        }
    }
    Ok(Plan { path, refused })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ggml::GgmlType;
    use crate::format::AffineParams;

    #[test]
    fn decode_crossover_follows_the_measurements() {
        let a4 = WeightFormat::Affine(AffineParams {
            bits: 4,
            group_size: 64,
        });
        let a8 = WeightFormat::Affine(AffineParams {
            bits: 8,
            group_size: 64,
        });
        for dt in [DType::Bf16, DType::F16] {
            assert_eq!(decode_max_tokens(a4, dt, false), 32);
            assert_eq!(decode_max_tokens(a8, dt, false), 32);
            assert_eq!(
                decode_max_tokens(WeightFormat::Ggml(GgmlType::Q8_0), dt, false),
                32
            );
            assert_eq!(
                decode_max_tokens(WeightFormat::Ggml(GgmlType::Q4_K), dt, false),
                32
            );
            assert_eq!(
                decode_max_tokens(WeightFormat::Dense(DType::Bf16), dt, false),
                8
            );
            // With tc_ra on the tensor-core path (sm_90a).
            assert_eq!(decode_max_tokens(a4, dt, true), 24);
            assert_eq!(
                decode_max_tokens(WeightFormat::Ggml(GgmlType::Q4_K), dt, true),
                16
            );
            assert_eq!(
                decode_max_tokens(WeightFormat::Ggml(GgmlType::Q8_0), dt, true),
                32
            );
        }
        assert_eq!(decode_max_tokens(a4, DType::F32, false), 8);
        assert_eq!(
            decode_max_tokens(WeightFormat::Ggml(GgmlType::Q4_K), DType::F32, false),
            4
        );
        assert_eq!(
            decode_max_tokens(WeightFormat::Dense(DType::Bf16), DType::F32, false),
            1
        );
    }
}
