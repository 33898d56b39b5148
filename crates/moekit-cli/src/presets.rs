//! Model shapes for synthetic benchmarks. Each preset of a loader family is
//! listed under that family in `moekit::load::family::FAMILIES` (a test
//! keeps the two in step).

use moekit::ops::ffn::GluAct;
use moekit::ops::route::{RouterKind, Scoring};

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
    /// The experts' activation; a block with [`GluAct::SwiGluOai`] also gets
    /// random biases on its router and expert projections (gpt-oss).
    pub glu: GluAct,
    /// What the router and the experts read.
    pub inputs: Inputs,
}

/// The router's and the experts' inputs of a preset (`moekit::ops::input`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inputs {
    /// Both read x.
    Plain,
    /// Gemma-4: an RMS norm before the router and another before the experts.
    Gemma4,
    /// Llama-4: the routing weight scales the experts' input.
    WeightBefore,
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
            glu: GluAct::SwiGlu,
            inputs: Inputs::Plain,
        },
        Preset {
            name: "mixtral-8x7b",
            n_experts: 8,
            top_k: 2,
            hidden: 4096,
            intermediate: 14336,
            shared: (0, false),
            router: RouterKind::TopKSoftmax,
            glu: GluAct::SwiGlu,
            inputs: Inputs::Plain,
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
                // n_group = 1 drops no group, so the mask never acts; the
                // safetensors loader's, as for DeepSeek-V2-Lite's config.json.
                dropped_groups: moekit::load::family::SAFETENSORS_DROPPED_GROUPS,
                norm_topk_prob: false,
                routed_scaling_factor: 1.0,
            },
            glu: GluAct::SwiGlu,
            inputs: Inputs::Plain,
        },
        Preset {
            name: "gpt-oss-20b",
            n_experts: 32,
            top_k: 4,
            hidden: 2880,
            intermediate: 2880,
            shared: (0, false),
            router: RouterKind::TopKSoftmax,
            glu: GluAct::GPT_OSS,
            inputs: Inputs::Plain,
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
            glu: GluAct::SwiGlu,
            inputs: Inputs::Plain,
        },
        Preset {
            // Gemma 4 26B-A4B (config.json as published: hidden_size 2816,
            // 128 experts, top_k_experts 8, moe_intermediate_size 704; the
            // parallel dense MLP is not part of the MoE block).
            name: "gemma4-26b-a4b",
            n_experts: 128,
            top_k: 8,
            hidden: 2816,
            intermediate: 704,
            shared: (0, false),
            router: RouterKind::Gemma4 {
                per_expert_scale: vec![1.0; 128],
            },
            glu: GluAct::GeluTanh,
            inputs: Inputs::Gemma4,
        },
        Preset {
            // Llama-4-Scout-17B-16E: hidden 5120, 16 experts, top-1, expert
            // and shared-expert intermediate 8192.
            name: "llama4-scout",
            n_experts: 16,
            top_k: 1,
            hidden: 5120,
            intermediate: 8192,
            shared: (8192, false),
            router: sigmoid(false),
            glu: GluAct::SwiGlu,
            inputs: Inputs::WeightBefore,
        },
        Preset {
            // ERNIE-4.5-21B-A3B: hidden 2560, 64 experts, moe_k 6,
            // moe_intermediate_size 1536, 2 shared experts (3072 rows).
            name: "ernie-4.5-21b-a3b",
            n_experts: 64,
            top_k: 6,
            hidden: 2560,
            intermediate: 1536,
            shared: (3072, false),
            router: RouterKind::SoftmaxTopK {
                norm_topk_prob: true,
            },
            glu: GluAct::SwiGlu,
            inputs: Inputs::Plain,
        },
        Preset {
            // Hunyuan-A13B: hidden 4096, 64 experts, moe_topk 8,
            // moe_intermediate_size 3072, one shared MLP of 3072.
            name: "hunyuan-a13b",
            n_experts: 64,
            top_k: 8,
            hidden: 4096,
            intermediate: 3072,
            shared: (3072, false),
            router: RouterKind::SoftmaxTopK {
                norm_topk_prob: false,
            },
            glu: GluAct::SwiGlu,
            inputs: Inputs::Plain,
        },
    ]
}

/// Sigmoid scores, top-k, no groups, no bias, × 1.
fn sigmoid(norm_topk_prob: bool) -> RouterKind {
    RouterKind::Grouped {
        scoring: Scoring::Sigmoid,
        bias: None,
        n_group: 1,
        topk_group: 1,
        dropped_groups: moekit::ops::route::GroupMask::NegInf,
        norm_topk_prob,
        routed_scaling_factor: 1.0,
    }
}

pub fn find(name: &str) -> Option<Preset> {
    all().into_iter().find(|p| p.name == name)
}

pub fn names() -> String {
    all().iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use moekit::load::family::FAMILIES;

    /// Presets without a loader family.
    const NO_FAMILY: [&str; 0] = [];

    #[test]
    fn qwen3_next_preset_matches_its_config() {
        // Qwen/Qwen3-Next-80B-A3B-Instruct config.json: num_experts 512,
        // num_experts_per_tok 10, hidden_size 2048, moe_intermediate_size 512,
        // shared_expert_intermediate_size 512 (sigmoid-gated shared expert),
        // norm_topk_prob true (also transformers' Qwen3NextConfig default;
        // issue 13: the preset had it false).
        let p = super::find("qwen3-next-80b").unwrap();
        assert_eq!(
            (p.n_experts, p.top_k, p.hidden, p.intermediate, p.shared),
            (512, 10, 2048, 512, (512, true))
        );
        assert_eq!(
            p.router,
            moekit::ops::route::RouterKind::SoftmaxTopK {
                norm_topk_prob: true
            }
        );
    }

    #[test]
    fn presets_and_the_family_table_agree() {
        for p in super::all() {
            let fams: Vec<&str> = FAMILIES
                .iter()
                .filter(|f| f.presets.contains(&p.name))
                .map(|f| f.name)
                .collect();
            let want = if NO_FAMILY.contains(&p.name) { 0 } else { 1 };
            assert_eq!(fams.len(), want, "preset {}: families {fams:?}", p.name);
        }
        for f in FAMILIES {
            for name in f.presets {
                assert!(super::find(name).is_some(), "{}: no preset {name}", f.name);
            }
        }
    }
}
