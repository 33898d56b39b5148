//! Routing: router logits `[T, E]` → top-k expert ids and weights. (STUB — the types are the contract.)

use crate::device::Backend;
use crate::error::{unsupported, Result};
use crate::tensor::Tensor;

/// How scores are made from logits (DeepSeek-style grouped routers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scoring {
    /// softmax over all experts.
    Softmax,
    /// element-wise sigmoid.
    Sigmoid,
}

/// The routing rule of a model family.
#[derive(Debug, Clone, PartialEq)]
pub enum RouterKind {
    /// softmax over all experts, top-k; with `norm_topk_prob` the k weights are
    /// renormalised to sum 1 (Qwen3-MoE), else raw probabilities (Qwen3-Next, Qwen2-MoE).
    SoftmaxTopK {
        /// renormalise the chosen k.
        norm_topk_prob: bool,
    },
    /// top-k over the raw logits, softmax over the chosen k (Mixtral, gpt-oss).
    TopKSoftmax,
    /// Gemma-4: softmax over all, top-k, renormalise, × `per_expert_scale[e]`.
    Gemma4 {
        /// one scale per expert.
        per_expert_scale: Vec<f32>,
    },
    /// DeepSeek-V2/V3 (and GLM-4-MoE): scores from `scoring`; selection on
    /// scores + `bias` (V3 `e_score_correction_bias`), limited to `topk_group`
    /// of `n_group` groups; weights from the unbiased scores, optionally
    /// renormalised, × `routed_scaling_factor`.
    Grouped {
        /// softmax (V2) or sigmoid (V3).
        scoring: Scoring,
        /// selection-only bias, one per expert.
        bias: Option<Vec<f32>>,
        /// number of expert groups (1 = no grouping).
        n_group: usize,
        /// groups kept per token.
        topk_group: usize,
        /// renormalise the chosen k.
        norm_topk_prob: bool,
        /// final multiplier of the weights.
        routed_scaling_factor: f32,
    },
}

/// A router: rule, number of experts and top-k.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterConfig {
    /// The rule.
    pub kind: RouterKind,
    /// E (≤ 1024).
    pub n_experts: usize,
    /// k (≤ 32, ≤ E).
    pub top_k: usize,
}

/// The result of routing `T` tokens.
#[derive(Debug, Clone)]
pub struct Routing {
    /// `u32 [T, k]` chosen expert ids.
    pub ids: Tensor,
    /// `f32 [T, k]` their weights.
    pub weights: Tensor,
}

/// Routes `logits` (`[T, E]`, float) with the backend of its device.
pub fn route(_logits: &Tensor, _cfg: &RouterConfig) -> Result<Routing> {
    Err(unsupported("route", "not implemented yet"))
}

/// Routes with an explicit backend.
pub fn route_on(_backend: Backend, _logits: &Tensor, _cfg: &RouterConfig) -> Result<Routing> {
    Err(unsupported("route", "not implemented yet"))
}
