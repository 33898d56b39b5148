//! Unit tests of `config.rs`.

use super::*;

fn parse(text: &str) -> Result<ModelConfig> {
    ModelConfig::parse(text, Path::new("config.json"))
}

#[test]
fn qwen3_layers_and_defaults() {
    let c = parse(
        r#"{"model_type":"qwen3_moe","hidden_size":64,"num_hidden_layers":6,"num_experts":8,
           "num_experts_per_tok":2,"moe_intermediate_size":32,"decoder_sparse_step":2,"mlp_only_layers":[3]}"#,
    )
    .unwrap();
    assert_eq!(c.moe_layers, vec![1, 5]);
    assert_eq!(
        c.router,
        RouterKind::SoftmaxTopK {
            norm_topk_prob: false
        }
    );
    assert!(c.shared.is_none());
}

#[test]
fn qwen3_next_normalizes_top_k_by_default() {
    // transformers' Qwen3NextConfig: norm_topk_prob defaults to True.
    let text = |norm: &str| {
        format!(
            r#"{{"model_type":"qwen3_next","hidden_size":64,"num_hidden_layers":2,"num_experts":16,
               "num_experts_per_tok":4,"moe_intermediate_size":32,"shared_expert_intermediate_size":32{norm}}}"#
        )
    };
    let norm_of = |c: ModelConfig| match c.router {
        RouterKind::SoftmaxTopK { norm_topk_prob } => norm_topk_prob,
        r => panic!("{r:?}"),
    };
    assert!(norm_of(parse(&text("")).unwrap()));
    assert!(!norm_of(
        parse(&text(r#","norm_topk_prob":false"#)).unwrap()
    ));
}

#[test]
fn nested_text_config_is_read_and_named_in_errors() {
    let c = parse(
        r#"{"model_type":"kimi_k25","quantization":{"group_size":64,"bits":4},
           "text_config":{"model_type":"kimi_k2","hidden_size":64,"num_hidden_layers":3,
           "n_routed_experts":8,"num_experts_per_tok":2,"moe_intermediate_size":16,
           "first_k_dense_replace":1,"n_shared_experts":1,"routed_scaling_factor":2.827}}"#,
    )
    .unwrap();
    assert_eq!((c.model_type.as_str(), c.hidden), ("kimi_k25", 64));
    assert_eq!(c.moe_layers, vec![1, 2]);
    assert!(c.needs_bias);
    assert_eq!(c.names.layers, &["language_model.model.layers"]);
    // Qwen3.5: every block is MoE, renormalised by default, gated shared
    // expert; mlx-lm also takes the flat form.
    for text in [
        r#"{"model_type":"qwen3_5_moe","text_config":{"hidden_size":64,"num_hidden_layers":2,
           "num_experts":8,"num_experts_per_tok":2,"moe_intermediate_size":16,
           "shared_expert_intermediate_size":16,"decoder_sparse_step":2}}"#,
        r#"{"model_type":"qwen3_5_moe","hidden_size":64,"num_hidden_layers":2,
           "num_experts":8,"num_experts_per_tok":2,"moe_intermediate_size":16,
           "shared_expert_intermediate_size":16}"#,
    ] {
        let c = parse(text).unwrap();
        assert_eq!(c.moe_layers, vec![0, 1]);
        assert_eq!(
            c.router,
            RouterKind::SoftmaxTopK {
                norm_topk_prob: true
            }
        );
        assert!(c.shared.as_ref().is_some_and(|s| s.gated));
    }
    let e = parse(r#"{"model_type":"kimi_k25","text_config":{"hidden_size":64}}"#)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("missing key `text_config.num_hidden_layers`"),
        "{e}"
    );
    let e = parse(r#"{"model_type":"kimi_k25","text_config":[1]}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("key `text_config`: expected an object"), "{e}");
    let e = parse(r#"{"model_type":"kimi_k25","hidden_size":64}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing key `text_config`"), "{e}");
}

#[test]
fn every_family_table_model_type_has_a_rule() {
    // One config holding every family's size keys; each model_type of
    // the family table must parse (no "no rule" / unsupported error),
    // grouped routers with the safetensors loader's mask.
    for mt in crate::load::family::model_types() {
        let sizes = r#""hidden_size":64,"num_hidden_layers":2,"num_experts":8,
               "num_local_experts":8,"n_routed_experts":8,"num_experts_per_tok":2,
               "moe_intermediate_size":16,"intermediate_size":16,"shared_expert_intermediate_size":16,
               "n_group":2,"topk_group":1,"score_function":"sigmoid","enable_moe_block":true,
               "top_k_experts":2,"moe_num_experts":8,"moe_k":2,"moe_topk":2"#;
        // Llama-4 routes top-1 only.
        let sizes = if mt == "llama4" {
            sizes.replace(r#""num_experts_per_tok":2"#, r#""num_experts_per_tok":1"#)
        } else {
            sizes.to_string()
        };
        let text = match mt {
            // The language model's settings nested under text_config.
            "qwen3_5_moe" | "kimi_k25" | "gemma4" | "llama4" => {
                format!(r#"{{"model_type":"{mt}","text_config":{{{sizes}}}}}"#)
            }
            _ => format!(r#"{{"model_type":"{mt}",{sizes}}}"#),
        };
        let c = parse(&text).unwrap_or_else(|e| panic!("{mt}: {e}"));
        assert_eq!(c.n_experts, 8, "{mt}");
        if let RouterKind::Grouped { dropped_groups, .. } = c.router {
            assert_eq!(dropped_groups, crate::ops::route::GroupMask::Zero, "{mt}");
        }
    }
    let e = parse(r#"{"model_type":"llama","hidden_size":64,"num_hidden_layers":2}"#)
        .unwrap_err()
        .to_string();
    let list = crate::load::family::model_types().join(", ");
    assert!(
        e.contains("`model_type` = \"llama\" is not supported")
            && e.contains(&format!("(supported: {list})"))
            && e.contains("config.json"),
        "{e}"
    );
}

#[test]
fn deepseek_v3_defaults_and_v2_greedy() {
    let c = parse(
        r#"{"model_type":"deepseek_v3","hidden_size":64,"num_hidden_layers":3,"n_routed_experts":8,
           "moe_intermediate_size":16,"first_k_dense_replace":1,"n_shared_experts":2}"#,
    )
    .unwrap();
    assert_eq!(c.top_k, 1);
    assert_eq!(c.moe_layers, vec![1, 2]);
    assert!(c.needs_bias);
    assert_eq!(
        c.shared,
        Some(SharedSpec {
            intermediate: 32,
            prefix: "shared_experts",
            gated: false
        })
    );
    match c.router {
        RouterKind::Grouped {
            scoring,
            norm_topk_prob,
            n_group,
            ..
        } => {
            assert_eq!(
                (scoring, norm_topk_prob, n_group),
                (Scoring::Sigmoid, true, 1)
            );
        }
        ref r => panic!("{r:?}"),
    }
    let v2 = parse(
        r#"{"model_type":"deepseek_v2","hidden_size":64,"num_hidden_layers":2,"n_routed_experts":8,
           "num_experts_per_tok":2,"n_group":4,"topk_group":1,"topk_method":"greedy"}"#,
    )
    .unwrap();
    assert!(matches!(
        v2.router,
        RouterKind::Grouped {
            n_group: 1,
            scoring: Scoring::Softmax,
            ..
        }
    ));
    // No routed experts: a dense model.
    let dense =
        parse(r#"{"model_type":"deepseek_v2","hidden_size":64,"num_hidden_layers":2}"#).unwrap();
    assert!(dense.moe_layers.is_empty());
}

#[test]
fn errors_name_the_key() {
    let e = parse(r#"{"model_type":"llama","hidden_size":64,"num_hidden_layers":2}"#).unwrap_err();
    assert!(e.to_string().contains("llama"), "{e}");
    let e = parse(
        r#"{"model_type":"qwen3_moe","hidden_size":64,"num_hidden_layers":2,"num_experts":8}"#,
    )
    .unwrap_err();
    assert!(e.to_string().contains("num_experts_per_tok"), "{e}");
    let e =
        parse(r#"{"model_type":"mixtral","hidden_size":-4,"num_hidden_layers":2}"#).unwrap_err();
    assert!(e.to_string().contains("hidden_size"), "{e}");
    let e = parse(r#"{"model_type":"mixtral","hidden_size":64,"num_hidden_layers":2,"num_experts_per_tok":9}"#).unwrap_err();
    assert!(
        e.to_string()
            .contains("`num_experts_per_tok`: expected 1..=`num_local_experts` = 8, got 9"),
        "{e}"
    );
    let e = parse(
        r#"{"model_type":"deepseek_v3","hidden_size":64,"num_hidden_layers":2,"n_routed_experts":8,"topk_method":"greedy"}"#,
    )
    .unwrap_err();
    assert!(e.to_string().contains("topk_method"), "{e}");
}

#[test]
fn round_two_layer_rules_and_refusals() {
    // Llama-4: MoE every interleave_moe_layer_step-th block; k must be 1.
    let l4 = |k: usize| {
        format!(
            r#"{{"model_type":"llama4","text_config":{{"hidden_size":64,"num_hidden_layers":4,
               "num_local_experts":4,"num_experts_per_tok":{k},"intermediate_size":16,
               "interleave_moe_layer_step":2}}}}"#
        )
    };
    let c = parse(&l4(1)).unwrap();
    assert_eq!(c.moe_layers, vec![1, 3]);
    assert!(c.weight_before && c.shared.is_some());
    let e = parse(&l4(2)).unwrap_err().to_string();
    assert!(
        e.contains("text_config.num_experts_per_tok") && e.contains("top-1"),
        "{e}"
    );
    // ERNIE-4.5: (l + 1) % interval == 0 within [start, end] (lists: min / max).
    let c = parse(
        r#"{"model_type":"ernie4_5_moe","hidden_size":64,"num_hidden_layers":8,"moe_num_experts":8,
           "moe_k":2,"moe_intermediate_size":16,"moe_layer_start_index":[2,3],
           "moe_layer_end_index":[5,6],"moe_layer_interval":2,"moe_num_shared_experts":2}"#,
    )
    .unwrap();
    assert_eq!(c.moe_layers, vec![3, 5]);
    assert_eq!(c.shared.as_ref().map(|s| s.intermediate), Some(32));
    assert!(c.bias_if_present && !c.needs_bias);
    // Hunyuan: per-layer lists give each block its sizes; a list of the
    // wrong length is refused, naming the key.
    let hy = |topk: &str| {
        format!(
            r#"{{"model_type":"hunyuan","hidden_size":64,"num_hidden_layers":2,"num_experts":8,
               "intermediate_size":32,"moe_topk":{topk},"moe_intermediate_size":[16,8],
               "use_mixed_mlp_moe":true,"num_shared_expert":[1,2]}}"#
        )
    };
    let c = parse(&hy("[3,2]")).unwrap();
    assert_eq!((c.top_k, c.intermediate), (3, 16));
    let l1 = c.at_layer(1);
    assert_eq!((l1.top_k, l1.intermediate), (2, 8));
    assert_eq!(l1.shared.as_ref().map(|s| s.intermediate), Some(64));
    assert_eq!(
        c.at_layer(0).shared.as_ref().map(|s| s.intermediate),
        Some(32)
    );
    let e = parse(&hy("[3,2,1]")).unwrap_err().to_string();
    assert!(
        e.contains("moe_topk") && e.contains("one value per layer"),
        "{e}"
    );
    let e = parse(&hy("[3,9]")).unwrap_err().to_string();
    assert!(e.contains("num_experts_per_tok") || e.contains("9"), "{e}");
    // Gemma-4 without enable_moe_block has no MoE layer.
    let c = parse(
        r#"{"model_type":"gemma4_text","hidden_size":64,"num_hidden_layers":2,"num_experts":8}"#,
    )
    .unwrap();
    assert!(c.moe_layers.is_empty());
}
