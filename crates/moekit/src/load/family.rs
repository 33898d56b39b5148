//! The model families the loaders know, in one table: per family its GGUF
//! `general.architecture` name(s), its Hugging Face / mlx-lm `model_type`(s)
//! and the CLI bench presets of its shape; plus the choice each loader makes
//! where llama.cpp and mlx-lm differ (the grouped router's mask of dropped
//! groups, [`GroupMask`]).
//!
//! This table is the one list of supported names: the GGUF loader accepts
//! exactly the architectures listed here ([`gguf_archs`]), the safetensors
//! loader exactly the `model_type`s ([`model_types`]), and their errors for
//! any other name list these. Each loader then builds the family's router
//! and shared expert from its own reference (llama.cpp's `build_moe_ffn` for
//! GGUF, mlx-lm's model code for safetensors: see `load/gguf/arch.rs` and
//! `load/safetensors/config.rs`). Tests check that both loaders have a rule
//! for every entry, that the README's family table names the same families,
//! architectures and types in the same order, and (in `moekit-cli`) that
//! every bench preset belongs to exactly one family here.

use crate::ops::route::GroupMask;

/// One model family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Family {
    /// Human-readable name (as the README's table).
    pub name: &'static str,
    /// GGUF `general.architecture` values (llama.cpp's names).
    pub gguf_archs: &'static [&'static str],
    /// `config.json` `model_type` values (Hugging Face / mlx-lm).
    pub model_types: &'static [&'static str],
    /// `moekit bench --preset` names with this family's routing rule.
    pub presets: &'static [&'static str],
}

/// Every family the loaders support.
pub const FAMILIES: [Family; 19] = [
    Family {
        name: "Qwen3-MoE",
        gguf_archs: &["qwen3moe"],
        model_types: &["qwen3_moe"],
        presets: &["qwen3-30b-a3b"],
    },
    Family {
        name: "Qwen2-MoE",
        gguf_archs: &["qwen2moe"],
        model_types: &["qwen2_moe"],
        presets: &[],
    },
    Family {
        name: "Qwen3-Next",
        gguf_archs: &["qwen3next"],
        model_types: &["qwen3_next"],
        presets: &["qwen3-next-80b"],
    },
    Family {
        name: "Mixtral",
        gguf_archs: &["llama", "mixtral"],
        model_types: &["mixtral"],
        presets: &["mixtral-8x7b"],
    },
    Family {
        name: "OLMoE",
        gguf_archs: &["olmoe"],
        model_types: &["olmoe"],
        presets: &[],
    },
    Family {
        name: "DeepSeek-V2",
        gguf_archs: &["deepseek2"],
        model_types: &["deepseek_v2"],
        presets: &["deepseek-v2-lite"],
    },
    Family {
        name: "DeepSeek-V3",
        // llama.cpp runs V2 and V3 as one architecture.
        gguf_archs: &["deepseek2"],
        model_types: &["deepseek_v3"],
        presets: &[],
    },
    Family {
        name: "GLM-4-MoE",
        gguf_archs: &["glm4moe"],
        model_types: &["glm4_moe"],
        presets: &[],
    },
    Family {
        name: "Qwen3.5-MoE",
        gguf_archs: &["qwen35moe"],
        model_types: &["qwen3_5_moe"],
        presets: &[],
    },
    Family {
        name: "Kimi-K2",
        // llama.cpp converts Kimi-K2 to its DeepSeek-V3 architecture.
        gguf_archs: &["deepseek2"],
        model_types: &["kimi_k2", "kimi_k25"],
        presets: &[],
    },
    Family {
        name: "MiniMax-M2",
        gguf_archs: &["minimax-m2"],
        model_types: &["minimax_m2"],
        presets: &[],
    },
    Family {
        name: "Granite-MoE",
        // granitemoeshared converts to granitemoe with a shared expert.
        gguf_archs: &["granitemoe"],
        model_types: &["granitemoe"],
        presets: &[],
    },
    Family {
        name: "dots.llm1",
        gguf_archs: &["dots1"],
        model_types: &["dots1"],
        presets: &[],
    },
    Family {
        name: "gpt-oss",
        gguf_archs: &["gpt-oss"],
        model_types: &["gpt_oss"],
        presets: &["gpt-oss-20b"],
    },
    Family {
        name: "Bailing-MoE",
        // llama.cpp's Ling 2.0 architecture and its v1 (Ling-lite / -plus).
        gguf_archs: &["bailingmoe2", "bailingmoe"],
        model_types: &["bailing_moe"],
        presets: &[],
    },
    Family {
        name: "Gemma-4",
        gguf_archs: &["gemma4"],
        model_types: &["gemma4", "gemma4_text"],
        presets: &["gemma4-26b-a4b"],
    },
    Family {
        name: "Llama-4",
        gguf_archs: &["llama4"],
        model_types: &["llama4"],
        presets: &["llama4-scout"],
    },
    Family {
        name: "ERNIE-4.5-MoE",
        gguf_archs: &["ernie4_5-moe"],
        model_types: &["ernie4_5_moe"],
        presets: &["ernie-4.5-21b-a3b"],
    },
    Family {
        name: "Hunyuan-MoE",
        gguf_archs: &["hunyuan-moe"],
        model_types: &["hunyuan"],
        presets: &["hunyuan-a13b"],
    },
];

/// The mask of dropped groups the GGUF loader gives grouped routers:
/// llama.cpp's (`build_moe_ffn` fills them with −∞).
pub const GGUF_DROPPED_GROUPS: GroupMask = GroupMask::NegInf;

/// The mask of dropped groups the safetensors loader gives grouped routers:
/// mlx-lm's (`group_expert_select` puts 0.0).
pub const SAFETENSORS_DROPPED_GROUPS: GroupMask = GroupMask::Zero;

/// The family of a GGUF architecture name.
pub fn by_gguf_arch(arch: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.gguf_archs.contains(&arch))
}

/// The family of a `config.json` `model_type`.
pub fn by_model_type(model_type: &str) -> Option<&'static Family> {
    FAMILIES
        .iter()
        .find(|f| f.model_types.contains(&model_type))
}

/// Every GGUF architecture name, each once, in table order.
pub fn gguf_archs() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = Vec::new();
    for a in FAMILIES.iter().flat_map(|f| f.gguf_archs.iter().copied()) {
        if !v.contains(&a) {
            v.push(a);
        }
    }
    v
}

/// Every `model_type`, in table order.
pub fn model_types() -> Vec<&'static str> {
    FAMILIES
        .iter()
        .flat_map(|f| f.model_types.iter().copied())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_where_they_must_be() {
        let mt = model_types();
        for (i, a) in mt.iter().enumerate() {
            assert!(!mt[i + 1..].contains(a), "model_type {a} twice");
        }
        let presets: Vec<_> = FAMILIES.iter().flat_map(|f| f.presets.iter()).collect();
        for (i, p) in presets.iter().enumerate() {
            assert!(!presets[i + 1..].contains(p), "preset {p} in two families");
        }
        assert_eq!(
            by_gguf_arch("deepseek2").map(|f| f.name),
            Some("DeepSeek-V2")
        );
        assert_eq!(
            by_model_type("deepseek_v3").map(|f| f.name),
            Some("DeepSeek-V3")
        );
        assert_eq!(by_gguf_arch("gpt-oss").map(|f| f.name), Some("gpt-oss"));
        assert!(by_gguf_arch("gpt_oss").is_none() && by_model_type("llama").is_none());
    }

    #[test]
    fn the_gguf_loader_has_a_rule_for_every_arch() {
        for a in gguf_archs() {
            assert!(
                crate::load::gguf::arch::has_rule(a),
                "no GGUF rule for arch {a}"
            );
        }
        // (The safetensors loader's counterpart is
        // load::safetensors::config's every_family_table_model_type_has_a_rule.)
    }

    #[test]
    fn the_readme_table_names_the_same_families() {
        let readme = include_str!("../../../../README.md");
        let table = readme
            .split("## Supported model families")
            .nth(1)
            .and_then(|s| s.split("\n\n").nth(1))
            .expect("README: the table under ## Supported model families");
        let mut rows = Vec::new();
        for line in table.lines().skip(2) {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            // | family | GGUF arch | model_type | routing | shared |
            let ticked = |c: &str| -> Vec<String> {
                c.split('`')
                    .skip(1)
                    .step_by(2)
                    .map(str::to_string)
                    .collect()
            };
            rows.push((cells[1].to_string(), ticked(cells[2]), ticked(cells[3])));
        }
        assert_eq!(rows.len(), FAMILIES.len(), "README rows vs FAMILIES");
        for (f, (name, archs, types)) in FAMILIES.iter().zip(&rows) {
            assert!(
                name.starts_with(f.name),
                "README row {name:?} vs {}",
                f.name
            );
            assert_eq!(
                archs,
                &f.gguf_archs.to_vec(),
                "{}: README GGUF column",
                f.name
            );
            assert_eq!(
                types,
                &f.model_types.to_vec(),
                "{}: README model_type column",
                f.name
            );
        }
    }
}
