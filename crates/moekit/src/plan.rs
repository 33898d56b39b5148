//! Which implementation runs an MoE block: the one place the choice is
//! made, as MLX's `supports_*`/launch pairs do. [`plan`] asks every path
//! whether it takes the block and input, keeps the reason of each refusal,
//! and picks by the measured crossover ([`decode_max_tokens`]); a forced
//! [`MoePath`] that is refused is an error carrying that reason.

use crate::device::Backend;
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
/// qwen3-30b-a3b, bf16 activations, CUDA-graph medians, `moekit bench --path
/// decode|tc`, bench/results/h100/tc/crossover_*.json), decode vs tensor cores:
/// * affine4-g64: T = 4 0.122 vs 0.164 ms, T = 8 0.238 vs 0.242, T = 16 0.440
///   vs 0.322 → decode up to 8;
/// * q4_k: T = 4 0.152 vs 0.163, T = 8 0.301 vs 0.239; q8_0: T = 4 0.163 vs
///   0.199, T = 8 0.347 vs 0.294 → GGUF blocks decode up to 4;
/// * bf16: T = 1 0.095 vs 0.099, T = 2 0.157 vs 0.125 → dense weights decode
///   at 1 token only (crossover_low_*.json: affine4, q4_k, q8_0 decode still
///   win at T = 1..3).
pub fn decode_max_tokens(expert_format: WeightFormat) -> usize {
    match expert_format {
        WeightFormat::Affine(_) | WeightFormat::AffineU8 { .. } => 8,
        WeightFormat::Dense(_) => 1,
        WeightFormat::Ggml(_) => 4,
    }
}

/// Why the decode path refuses `x`, if it does.
fn decode_refusal(p: &MoeBlockParts, x: &Tensor) -> Option<String> {
    if crate::cuda::ops::decode::supports(p, x) {
        return None;
    }
    Some(format!(
        "needs x on CUDA with 1..={} tokens (got {:?} on {}) and one format for every expert weight",
        crate::cuda::ops::decode::MAX_TOKENS,
        x.shape(),
        x.device()
    ))
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
            (None, None) if t <= decode_max_tokens(parts.down.format()) => MoePath::Decode,
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
