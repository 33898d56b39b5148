//! The parts an MoE block is made of: plain data shared by the block
//! (`moe.rs`), the planner (`plan.rs`) and the fused CUDA paths, which take
//! parts rather than the block so that kernels never import the block.

use crate::format::QuantWeights;
use crate::ops::act::GateUp;
use crate::ops::ffn::ExpertFfn;
use crate::ops::route::RouterConfig;

/// A shared (always-on) expert, as in Qwen2-MoE, Qwen3-Next and DeepSeek.
#[derive(Debug, Clone)]
pub struct SharedExpert {
    /// Gate and up weights, one expert: `[1, Is, H]`.
    pub gate_up: GateUp,
    /// Down weights `[1, H, Is]`.
    pub down: QuantWeights,
    /// Optional sigmoid gate `[1, 1, H]`: output × sigmoid(x · g).
    pub gate: Option<QuantWeights>,
}

/// Everything an MoE block is made of.
#[derive(Debug, Clone)]
pub struct MoeBlockParts {
    /// Routing rule, E and k.
    pub router: RouterConfig,
    /// Router weights, one matrix `[1, E, H]`.
    pub router_weight: QuantWeights,
    /// Routed experts' gate and up weights `[E, I, H]`.
    pub gate_up: GateUp,
    /// Routed experts' down weights `[E, H, I]`.
    pub down: QuantWeights,
    /// Optional shared expert.
    pub shared: Option<SharedExpert>,
    /// The routed experts' activation and biases
    /// ([`ExpertFfn::default`]: SwiGLU, no biases).
    pub ffn: ExpertFfn,
}

impl MoeBlockParts {
    /// Hidden size H.
    pub fn hidden(&self) -> usize {
        self.gate_up.hidden()
    }
}
