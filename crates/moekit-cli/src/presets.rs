//! Model shapes for synthetic benchmarks.

use moekit::ops::route::{GroupMask, RouterKind, Scoring};

/// An MoE layer shape and routing rule.
#[derive(Debug, Clone)]
pub struct Preset {
    pub name: &'static str,
    pub n_experts: usize,
    pub top_k: usize,
    pub hidden: usize,
    pub intermediate: usize,
    /// Shared-expert intermediate size (0 = none) and whether it is sigmoid-gated.
    pub shared: (usize, bool),
    pub router: RouterKind,
}

pub fn all() -> Vec<Preset> {
    vec![
        Preset {
            name: "qwen3-30b-a3b",
            n_experts: 128,
            top_k: 8,
            hidden: 2048,
            intermediate: 768,
            shared: (0, false),
            router: RouterKind::SoftmaxTopK {
                norm_topk_prob: true,
            },
        },
        Preset {
            name: "mixtral-8x7b",
            n_experts: 8,
            top_k: 2,
            hidden: 4096,
            intermediate: 14336,
            shared: (0, false),
            router: RouterKind::TopKSoftmax,
        },
        Preset {
            name: "deepseek-v2-lite",
            n_experts: 64,
            top_k: 6,
            hidden: 2048,
            intermediate: 1408,
            shared: (2 * 1408, false),
            router: RouterKind::Grouped {
                scoring: Scoring::Softmax,
                bias: None,
                n_group: 1,
                topk_group: 1,
                dropped_groups: GroupMask::Zero,
                norm_topk_prob: false,
                routed_scaling_factor: 1.0,
            },
        },
        Preset {
            name: "gpt-oss-20b",
            n_experts: 32,
            top_k: 4,
            hidden: 2880,
            intermediate: 2880,
            shared: (0, false),
            router: RouterKind::TopKSoftmax,
        },
        Preset {
            name: "qwen3-next-80b",
            n_experts: 512,
            top_k: 10,
            hidden: 2048,
            intermediate: 512,
            shared: (512, true),
            // Qwen3-Next-80B-A3B's config.json (and transformers' default).
            router: RouterKind::SoftmaxTopK {
                norm_topk_prob: true,
            },
        },
    ]
}

pub fn find(name: &str) -> Option<Preset> {
    all().into_iter().find(|p| p.name == name)
}

pub fn names() -> String {
    all().iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
}
