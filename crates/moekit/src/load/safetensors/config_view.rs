//! A parsed `config.json`'s per-block view, validation and descriptions
//! (the parsing is `config.rs`).

use super::config::{ModelConfig, SharedSpec};
use super::fields::Fields;
use crate::error::{Error, Result};
use crate::ops::route::{RouterConfig, RouterKind, Scoring};

impl ModelConfig {
    /// The configuration of block `layer`: the per-block sizes where the
    /// config lists them (Hunyuan), else `self`.
    pub fn at_layer(&self, layer: usize) -> std::borrow::Cow<'_, ModelConfig> {
        match self.per_layer.get(layer) {
            Some(&(k, i, si))
                if (k, i, si)
                    != (
                        self.top_k,
                        self.intermediate,
                        self.shared.as_ref().map_or(0, |s| s.intermediate),
                    ) =>
            {
                let mut c = self.clone();
                c.top_k = k;
                c.intermediate = i;
                c.shared = (si > 0).then(|| SharedSpec {
                    intermediate: si,
                    prefix: self.shared.as_ref().map_or("shared_mlp", |s| s.prefix),
                    gated: false,
                });
                std::borrow::Cow::Owned(c)
            }
            _ => std::borrow::Cow::Borrowed(self),
        }
    }

    /// Validates the sizes and the router of a model that has MoE layers.
    pub(super) fn check(&self, f: &Fields<'_>) -> Result<()> {
        for (key, v) in [
            ("hidden_size", self.hidden),
            ("expert intermediate size", self.intermediate),
        ] {
            if v == 0 {
                return Err(f.bad(key, "a positive integer", 0));
            }
        }
        if self.top_k == 0 || self.top_k > self.n_experts {
            return Err(f.bad(
                "num_experts_per_tok",
                &format!("1..=`{}` = {}", self.keys.experts, self.n_experts),
                self.top_k,
            ));
        }
        // Bias length is checked when the tensor is loaded; validate the rest
        // with a placeholder of the right length.
        let mut kind = self.router.clone();
        match &mut kind {
            RouterKind::Grouped { bias, .. } if self.needs_bias => {
                *bias = Some(vec![0.0; self.n_experts]);
            }
            RouterKind::Gemma4 { per_expert_scale } => {
                *per_expert_scale = vec![1.0; self.n_experts]
            }
            _ => {}
        }
        RouterConfig {
            kind,
            n_experts: self.n_experts,
            top_k: self.top_k,
        }
        .validate()
        .map_err(|e| Error::BadFile {
            path: f.path.to_path_buf(),
            msg: format!("routing settings: {e}"),
        })
    }

    /// The router, human readable.
    pub fn router_text(&self) -> String {
        match &self.router {
            RouterKind::SoftmaxTopK { norm_topk_prob } => {
                format!("softmax over {} experts → top-{}{}", self.n_experts, self.top_k, if *norm_topk_prob { ", renormalised" } else { "" })
            }
            RouterKind::TopKSoftmax => format!("top-{} logits → softmax over the chosen", self.top_k),
            RouterKind::Gemma4 { .. } => format!(
                "rms_norm(x, router.scale · H^-½) → top-{} logits → softmax over the chosen × per_expert_scale; experts on pre_feedforward_layernorm_2(x)",
                self.top_k
            ),
            RouterKind::Grouped { scoring, n_group, topk_group, dropped_groups, norm_topk_prob, routed_scaling_factor, .. } => format!(
                "{} scores{} → top-{} in the best {topk_group} of {n_group} groups{}{} × {routed_scaling_factor}",
                match scoring {
                    Scoring::Softmax => "softmax",
                    Scoring::Sigmoid => "sigmoid",
                },
                if self.needs_bias {
                    " + e_score_correction_bias"
                } else if self.bias_if_present {
                    " (+ the selection bias where the checkpoint has one)"
                } else {
                    ""
                },
                self.top_k,
                if *n_group > 1 && topk_group < n_group {
                    format!(" (dropped groups' keys {}, as mlx-lm)", dropped_groups.label())
                } else {
                    String::new()
                },
                if *norm_topk_prob { ", renormalised" } else { "" },
            ),
        }
    }

    /// The shared expert, human readable.
    pub fn shared_text(&self) -> Option<String> {
        self.shared.as_ref().map(|s| {
            format!(
                "{} (intermediate {}){}",
                s.prefix,
                s.intermediate,
                if s.gated {
                    ", sigmoid-gated by shared_expert_gate"
                } else {
                    ""
                }
            )
        })
    }
}
