//! `config.json` → the MoE configuration of a checkpoint, per `model_type`.
//!
//! Field names and defaults follow mlx-lm's `models/<arch>.py` (`ModelArgs`
//! and the decoder layer's choice of MoE vs dense MLP). Where mlx-lm ignores a
//! Hugging Face key that changes the math (`norm_topk_prob` for Qwen2-MoE and
//! DeepSeek-V2, `decoder_sparse_step` / `mlp_only_layers` for Qwen2-MoE), the
//! key is honoured with the Hugging Face default, which is what mlx-lm does
//! whenever the key is absent or has that default (every published config).
//!
//! The `model_type`s accepted are those of the family table
//! ([`crate::load::family`]).

pub(crate) use super::fields::*;
use super::quant::QuantConfig;
use crate::error::{Error, Result};
use crate::ops::ffn::GluAct;
use crate::ops::route::{RouterKind, Scoring, MAX_EXPERTS, MAX_TOP_K};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Upper bound on hidden / intermediate sizes and on the layer count: far
/// above any real model, low enough that products of them cannot overflow.
pub(crate) const MAX_DIM: usize = 1 << 20;
pub(crate) const MAX_LAYERS: usize = 1 << 16;

/// The shared (always-on) expert of a family.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SharedSpec {
    /// Its intermediate size.
    pub intermediate: usize,
    /// Module name under the block: `shared_expert` or `shared_experts`.
    pub prefix: &'static str,
    /// Whether a `shared_expert_gate` [1, H] scales it by a sigmoid.
    pub gated: bool,
}

/// Where a family's MoE tensors are, as module paths (mlx-lm and Hugging
/// Face names; `layout.rs` reads them). Block `N`'s MoE module is
/// `{layers}.N.{block}` for the first of `layers` under which a router
/// exists.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Names {
    /// Prefixes of the decoder blocks, tried in order.
    pub layers: &'static [&'static str],
    /// Router module under the MoE module, tried in order (mlx-lm's name
    /// first where it differs from Hugging Face's).
    pub router: &'static [&'static str],
    /// Selection-bias tensor under the MoE module.
    pub bias: &'static str,
    /// mlx-lm's stacked experts module under the MoE module (`switch_mlp`).
    pub stacked: &'static str,
    /// Hugging Face experts stored fused: tensors gate+up `[E, 2I, H]`
    /// (gate rows first) and down `[E, H, I]`, unquantized.
    pub fused: Option<(&'static str, &'static str)>,
    /// Hugging Face experts stored transposed: gate+up `[E, H, 2I]` (gate
    /// columns first) and down `[E, I, H]`, unquantized (Llama-4).
    /// The bool: gate and up columns interleaved (gpt-oss) rather than halves.
    pub transposed: Option<(&'static str, &'static str, bool)>,
}

impl Names {
    const DEFAULT: Names = Names {
        layers: &["model.layers"],
        router: &["gate"],
        bias: "gate.e_score_correction_bias",
        stacked: "switch_mlp",
        fused: None,
        transposed: None,
    };

    /// Block `layer`'s MoE module path: under the first prefix of `layers`
    /// whose router (any of `router`) exists, else under the first prefix.
    pub fn moe_module(&self, layer: usize, block: &str, has: &dyn Fn(&str) -> bool) -> String {
        // An empty block: the MoE modules sit in the decoder layer (Gemma-4).
        let module = |prefix: &str| match block {
            "" => format!("{prefix}.{layer}"),
            b => format!("{prefix}.{layer}.{b}"),
        };
        self.layers
            .iter()
            .map(|p| module(p))
            .find(|m| self.router.iter().any(|r| has(&format!("{m}.{r}.weight"))))
            .unwrap_or_else(|| module(self.layers.first().copied().unwrap_or("model.layers")))
    }

    /// The router module under `module`: the first of `router` that exists,
    /// else the first.
    pub fn router_module(&self, module: &str, has: &dyn Fn(&str) -> bool) -> String {
        let name = |r: &str| format!("{module}.{r}");
        self.router
            .iter()
            .map(|r| name(r))
            .find(|m| has(&format!("{m}.weight")))
            .unwrap_or_else(|| name(self.router.first().copied().unwrap_or("gate")))
    }
}

/// The `config.json` keys the sizes come from (for messages).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SizeKeys {
    /// Routed experts E (`num_experts`, `n_routed_experts`, ...).
    pub experts: &'static str,
    /// Expert intermediate size I.
    pub intermediate: &'static str,
    /// Shared expert intermediate size.
    pub shared: &'static str,
}

/// Everything the loader needs from `config.json`.
#[derive(Debug, Clone)]
pub(crate) struct ModelConfig {
    /// `model_type`.
    pub model_type: String,
    /// Transformer blocks.
    pub n_layers: usize,
    /// Hidden size H.
    pub hidden: usize,
    /// Routed experts E (0 when the model has no MoE layer).
    pub n_experts: usize,
    /// Experts per token k.
    pub top_k: usize,
    /// Expert intermediate size I.
    pub intermediate: usize,
    /// Blocks with an MoE layer, ascending.
    pub moe_layers: Vec<usize>,
    /// Why the other blocks are dense, for error messages.
    pub dense_rule: String,
    /// Routing rule; a `Grouped` bias is filled from the checkpoint.
    pub router: RouterKind,
    /// Whether the router has an `e_score_correction_bias` tensor.
    pub needs_bias: bool,
    /// Shared expert, if any.
    pub shared: Option<SharedSpec>,
    /// Module under `model.layers.N`: `mlp` or `block_sparse_moe` (Mixtral).
    pub block: &'static str,
    /// The family's tensor names.
    pub names: Names,
    /// Quantization settings.
    pub quant: QuantConfig,
    /// Where E, I and the shared I come from.
    pub keys: SizeKeys,
    /// The experts' gated activation.
    pub glu: GluAct,
    /// Whether the router and the experts' projections have biases
    /// (`{router}.bias`, `{stacked}.{gate,up,down}_proj.bias`: gpt-oss).
    pub linear_bias: bool,
    /// Gemma-4: the router reads `rms_norm(x, router.scale · H^-½)`, its
    /// weights × `router.per_expert_scale`, and the experts read
    /// `pre_feedforward_layernorm_2(x)`; the norms' eps (`rms_norm_eps`).
    pub gemma4_eps: Option<f32>,
    /// Llama-4: the routing weight scales the experts' input.
    pub weight_before: bool,
    /// The selection bias is read where the tensor exists (ERNIE-4.5's
    /// `moe_statics.e_score_correction_bias`, as transformers; mlx-lm's
    /// sanitize drops it, so its conversions have none).
    pub bias_if_present: bool,
    /// Hunyuan: per block `(top_k, I, shared I)` from list-valued keys
    /// (empty: the values above hold for every block).
    pub per_layer: Vec<(usize, usize, usize)>,
}

impl ModelConfig {
    /// Parses `config.json` text.
    pub fn parse(text: &str, path: &Path) -> Result<ModelConfig> {
        let bad = |msg: String| Error::BadFile {
            path: path.to_path_buf(),
            msg,
        };
        let root: Value =
            serde_json::from_str(text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let obj = root
            .as_object()
            .ok_or_else(|| bad("expected a JSON object".into()))?;
        let f = Fields { path, obj };
        let model_type = f
            .str_opt("model_type")?
            .ok_or_else(|| f.missing("model_type"))?
            .to_string();
        let mt = model_type.as_str();
        // The family table is the list of supported types; the match below
        // has a rule for each (unit test every_family_table_model_type_has_a_rule).
        if crate::load::family::by_model_type(mt).is_none() {
            return Err(crate::error::unsupported(
                "safetensors",
                format!(
                    "{}: key `model_type` = {mt:?} is not supported (supported: {})",
                    path.display(),
                    crate::load::family::model_types().join(", ")
                ),
            ));
        }
        // Quantization is at the top level even where the language model's
        // settings are nested (mlx-lm's `save_config`).
        let quant = QuantConfig::parse(&f)?;
        // Multimodal wrappers: the language model's config under
        // `text_config` (mlx-lm's qwen3_5_moe also takes a flat config).
        let text = match (mt, f.obj.get("text_config").filter(|v| !v.is_null())) {
            ("qwen3_5_moe" | "kimi_k25" | "gemma4" | "llama4", Some(Value::Object(tc))) => Some(tc),
            ("qwen3_5_moe", None) => None,
            ("kimi_k25" | "gemma4" | "llama4", None) => return Err(f.missing("text_config")),
            ("qwen3_5_moe" | "kimi_k25" | "gemma4" | "llama4", Some(v)) => {
                return Err(f.bad("text_config", "an object (the language model's config)", v))
            }
            _ => None,
        };
        match text {
            Some(obj) => ModelConfig::parse_text(&Fields { path, obj }, model_type, quant)
                .map_err(|e| in_text_config(e, path)),
            None => ModelConfig::parse_text(&f, model_type, quant),
        }
    }

    /// The language model's settings of a `model_type` (from `f`, the root
    /// object or its `text_config`).
    fn parse_text(f: &Fields<'_>, model_type: String, quant: QuantConfig) -> Result<ModelConfig> {
        let path = f.path;
        let mt = model_type.as_str();
        let hidden = f.usize_req("hidden_size", MAX_DIM)?;
        let n_layers = f.usize_req("num_hidden_layers", MAX_LAYERS)?;

        let mut shared = None;
        let mut needs_bias = false;
        let mut block = "mlp";
        let mut names = Names::DEFAULT;
        let mut glu = GluAct::SwiGlu;
        let mut linear_bias = false;
        let mut gemma4_eps = None;
        let mut weight_before = false;
        let mut bias_if_present = false;
        let mut per_layer = Vec::new();
        let mut keys = SizeKeys {
            experts: "num_experts",
            intermediate: "moe_intermediate_size",
            shared: "shared_expert_intermediate_size",
        };
        let (n_experts, top_k, intermediate, router, rule) = match mt {
            "qwen3_moe" | "qwen2_moe" | "qwen3_next" | "qwen3_5_moe" | "olmoe" => {
                let e = f.usize_req("num_experts", MAX_EXPERTS)?;
                let k = f.usize_req("num_experts_per_tok", MAX_TOP_K)?;
                let i_key = if mt == "olmoe" {
                    "intermediate_size"
                } else {
                    "moe_intermediate_size"
                };
                let i = f.usize_req(i_key, MAX_DIM)?;
                keys.intermediate = i_key;
                // Absent key: transformers' defaults (Qwen3NextConfig True, the
                // others False). mlx-lm's qwen3_next defaults to False, but
                // Qwen3-Next checkpoints (and mlx-lm's conversions of them, which
                // keep the key) say true.
                // (Qwen3.5: mlx-lm's and transformers' default is True too.)
                let norm_default = matches!(mt, "qwen3_next" | "qwen3_5_moe");
                let router = RouterKind::SoftmaxTopK {
                    norm_topk_prob: f.bool_or("norm_topk_prob", norm_default)?,
                };
                if matches!(mt, "qwen2_moe" | "qwen3_next" | "qwen3_5_moe") {
                    let s = f.usize_req("shared_expert_intermediate_size", MAX_DIM)?;
                    if s > 0 {
                        shared = Some(SharedSpec {
                            intermediate: s,
                            prefix: "shared_expert",
                            gated: true,
                        });
                    }
                }
                if mt == "olmoe" && f.bool_or("mlp_bias", false)? {
                    return Err(crate::error::unsupported(
                        "safetensors",
                        "olmoe with mlp_bias = true (expert biases)",
                    ));
                }
                let rule = match mt {
                    // Qwen3.5 (mlx-lm `qwen3_5`, transformers): every block
                    // is MoE when num_experts > 0; no decoder_sparse_step.
                    "olmoe" | "qwen3_5_moe" => LayerRule::All,
                    _ => qwen_rule(f)?,
                };
                if mt == "qwen3_5_moe" {
                    // mlx-lm's sanitize: `language_model.model.layers`; the
                    // Hugging Face files: `model.language_model.layers`.
                    names.layers = &["language_model.model.layers", "model.language_model.layers"];
                    // The Hugging Face files' fused experts (mlx-lm's sanitize splits them).
                    names.fused = Some(("experts.gate_up_proj", "experts.down_proj"));
                }
                (e, k, i, router, rule)
            }
            "gpt_oss" => {
                // mlx-lm `gpt_oss` (MLPBlock): router with bias; top-k on the
                // logits, softmax over the chosen k (`precise`); SwitchGLU with
                // biases and SwigluOAI (α 1.702, limit 7: mlx-lm's constants;
                // transformers reads the limit from `swiglu_limit`); every
                // block is MoE. Its sanitize splits the Hugging Face fused,
                // interleaved gate_up into `experts.{gate,up}_proj`.
                names.router = &["router"];
                names.stacked = "experts";
                // transformers' GptOssExperts (unquantized): gate_up_proj
                // [E, H, 2I] with gate and up columns interleaved, down_proj
                // [E, I, H], biases as OpenAI's.
                names.transposed = Some(("experts.gate_up_proj", "experts.down_proj", true));
                keys.experts = "num_local_experts";
                keys.intermediate = "intermediate_size";
                let e = f.usize_req("num_local_experts", MAX_EXPERTS)?;
                let k = f.usize_or("num_experts_per_tok", MAX_TOP_K, 4)?;
                let i = f.usize_req("intermediate_size", MAX_DIM)?;
                let limit = f.f32_or("swiglu_limit", 7.0)?;
                if limit != 7.0 {
                    // mlx-lm hard-codes 7.0: no oracle for another limit.
                    return Err(crate::error::unsupported(
                        "safetensors",
                        format!(
                            "{}: {mt} with swiglu_limit = {limit} (mlx-lm's SwigluOAI uses 7.0)",
                            path.display()
                        ),
                    ));
                }
                glu = GluAct::GPT_OSS;
                linear_bias = true;
                (e, k, i, RouterKind::TopKSoftmax, LayerRule::All)
            }
            "gemma4" | "gemma4_text" => {
                // mlx-lm `gemma4_text` (DecoderLayer with enable_moe_block):
                // Router = rms_norm(h, scale · H^-½) → proj → top-k logits →
                // softmax over the k → × per_expert_scale; Experts =
                // SwitchGLU(GeGLU: gelu_approx(gate) · up) on
                // pre_feedforward_layernorm_2(h). Every block has the MoE
                // when enable_moe_block. mlx-lm's sanitize splits the Hugging
                // Face `experts.gate_up_proj` [E, 2I, H] (gate rows first).
                block = "";
                names.router = &["router.proj"];
                names.stacked = "experts.switch_glu";
                names.fused = Some(("experts.gate_up_proj", "experts.down_proj"));
                if mt == "gemma4" {
                    names.layers = &["language_model.model.layers", "model.language_model.layers"];
                }
                keys.experts = "num_experts";
                keys.intermediate = "moe_intermediate_size";
                let moe = f.bool_or("enable_moe_block", false)?;
                let e = if moe {
                    f.usize_req("num_experts", MAX_EXPERTS)?
                } else {
                    0
                };
                let k = if moe {
                    f.usize_req("top_k_experts", MAX_TOP_K)?
                } else {
                    0
                };
                let i = if moe {
                    f.usize_req("moe_intermediate_size", MAX_DIM)?
                } else {
                    0
                };
                glu = GluAct::GeluTanh;
                gemma4_eps = Some(f.f32_or("rms_norm_eps", 1e-6)?);
                let router = RouterKind::Gemma4 {
                    per_expert_scale: Vec::new(),
                };
                let rule = if moe {
                    LayerRule::All
                } else {
                    LayerRule::FirstDense {
                        first_dense: usize::MAX,
                        freq: 1,
                    }
                };
                (e, k, i, router, rule)
            }
            "llama4" => {
                // mlx-lm `llama4` (MoE): router logits → top-k (k must be 1:
                // mlx-lm asserts it) → sigmoid; the experts run on x · score
                // (score rounded to x's dtype); plus a plain shared_expert
                // of intermediate_size. MoE where layer %
                // interleave_moe_layer_step == step − 1. The Hugging Face
                // files store experts.gate_up_proj [E, H, 2I] and
                // experts.down_proj [E, I, H] (transposed; mlx-lm's sanitize
                // splits and transposes them).
                block = "feed_forward";
                names.layers = &["language_model.model.layers"];
                names.router = &["router"];
                names.stacked = "experts";
                names.transposed = Some(("experts.gate_up_proj", "experts.down_proj", false));
                keys.experts = "num_local_experts";
                keys.intermediate = "intermediate_size";
                keys.shared = "intermediate_size";
                let e = f.usize_req("num_local_experts", MAX_EXPERTS)?;
                let k = f.usize_req("num_experts_per_tok", MAX_TOP_K)?;
                let i = f.usize_req("intermediate_size", MAX_DIM)?;
                if k != 1 {
                    return Err(f.bad(
                        "num_experts_per_tok",
                        "1 (mlx-lm's llama4 and llama.cpp route top-1; the routing weight scales the expert's input)",
                        k,
                    ));
                }
                let step = f.usize_or("interleave_moe_layer_step", MAX_LAYERS, 1)?;
                if step == 0 {
                    return Err(f.bad("interleave_moe_layer_step", "an integer >= 1", 0));
                }
                weight_before = true;
                shared = Some(SharedSpec {
                    intermediate: i,
                    prefix: "shared_expert",
                    gated: false,
                });
                let router = ungrouped(Scoring::Sigmoid, false);
                (e, k, i, router, LayerRule::Interleaved { step })
            }
            "ernie4_5_moe" => {
                // mlx-lm `ernie4_5_moe` (Ernie4_5_MoeMLP): softmax (or
                // sigmoid, `moe_gate_act`) scores in f32 → top-k → divided
                // by max(their sum, 1e-12); a plain shared_experts of
                // moe_num_shared_experts × moe_intermediate_size; MoE where
                // (layer + 1) % moe_layer_interval == 0 within
                // [moe_layer_start_index, moe_layer_end_index]. The Hugging
                // Face files carry `moe_statics.e_score_correction_bias`,
                // which transformers (and llama.cpp) add to the scores for
                // the selection only; mlx-lm's sanitize drops it. It is used
                // where present.
                keys.experts = "moe_num_experts";
                keys.shared = "moe_num_shared_experts × moe_intermediate_size";
                names.bias = "moe_statics.e_score_correction_bias";
                let e = f.usize_req("moe_num_experts", MAX_EXPERTS)?;
                let k = f.usize_or("moe_k", MAX_TOP_K, 1)?;
                let i = match f.usize_or("moe_intermediate_size", MAX_DIM, 0)? {
                    0 => {
                        keys.intermediate = "intermediate_size";
                        f.usize_req("intermediate_size", MAX_DIM)?
                    }
                    i => i,
                };
                refuse_use_bias(f, mt)?;
                let scoring = scoring_key(f, "moe_gate_act")?;
                bias_if_present = true;
                if let Some(n) = f
                    .usize_opt("moe_num_shared_experts", 1024)?
                    .filter(|&n| n > 0)
                {
                    shared = Some(shared_experts(f, "moe_num_shared_experts", n, i)?);
                }
                let start = f
                    .usize_or_list_bound("moe_layer_start_index", MAX_LAYERS, true)?
                    .unwrap_or(0);
                let end = f
                    .usize_or_list_bound("moe_layer_end_index", MAX_LAYERS, false)?
                    .unwrap_or(n_layers.saturating_sub(1));
                let interval = f.usize_or("moe_layer_interval", MAX_LAYERS, 1)?;
                if interval == 0 {
                    return Err(f.bad("moe_layer_interval", "an integer >= 1", 0));
                }
                let router = ungrouped(scoring, true);
                (
                    e,
                    k,
                    i,
                    router,
                    LayerRule::Interval {
                        start,
                        end,
                        interval,
                    },
                )
            }
            "hunyuan" => {
                // mlx-lm `hunyuan` (MoeBlock): softmax (precise) → top-k,
                // not renormalised; a plain shared_mlp of intermediate_size
                // × num_shared_expert when use_mixed_mlp_moe; moe_topk,
                // num_shared_expert and moe_intermediate_size may be lists
                // (one value per block); every block is MoE when
                // num_experts > 1. Router `gate.wg`.
                names.router = &["gate.wg"];
                keys.experts = "num_experts";
                keys.intermediate = "moe_intermediate_size";
                keys.shared = "intermediate_size × num_shared_expert";
                let e = f.usize_req("num_experts", MAX_EXPERTS)?;
                let dense_i = f.usize_req("intermediate_size", MAX_DIM)?;
                let ks = f
                    .usize_or_list("moe_topk", MAX_TOP_K, n_layers)?
                    .ok_or_else(|| f.missing("moe_topk"))?;
                let is = match f.usize_or_list("moe_intermediate_size", MAX_DIM, n_layers)? {
                    Some(v) => v,
                    None => {
                        keys.intermediate = "intermediate_size";
                        vec![dense_i; n_layers]
                    }
                };
                let mixed = f.bool_or("use_mixed_mlp_moe", false)?;
                let ns = match f.usize_or_list("num_shared_expert", 1024, n_layers)? {
                    Some(v) if mixed => v,
                    None if mixed => return Err(f.missing("num_shared_expert")),
                    _ => vec![0; n_layers],
                };
                let mut sis = Vec::with_capacity(n_layers);
                for &n in &ns {
                    sis.push(
                        dense_i
                            .checked_mul(n)
                            .filter(|&s| s <= MAX_DIM)
                            .ok_or_else(|| {
                                f.bad(
                                    "num_shared_expert",
                                    "intermediate_size · num_shared_expert ≤ 2^20",
                                    n,
                                )
                            })?,
                    );
                }
                per_layer = (0..n_layers).map(|l| (ks[l], is[l], sis[l])).collect();
                let (k, i, si) = per_layer.first().copied().unwrap_or((0, 0, 0));
                if si > 0 {
                    shared = Some(SharedSpec {
                        intermediate: si,
                        prefix: "shared_mlp",
                        gated: false,
                    });
                }
                let router = RouterKind::SoftmaxTopK {
                    norm_topk_prob: false,
                };
                let rule = if e > 1 {
                    LayerRule::All
                } else {
                    LayerRule::FirstDense {
                        first_dense: usize::MAX,
                        freq: 1,
                    }
                };
                (if e > 1 { e } else { 0 }, k, i, router, rule)
            }
            "mixtral" => {
                block = "block_sparse_moe";
                keys.experts = "num_local_experts";
                keys.intermediate = "intermediate_size";
                let e = f.usize_or("num_local_experts", MAX_EXPERTS, 8)?;
                let k = f.usize_or("num_experts_per_tok", MAX_TOP_K, 2)?;
                let i = f.usize_or("intermediate_size", MAX_DIM, 14336)?;
                (e, k, i, RouterKind::TopKSoftmax, LayerRule::All)
            }
            "dots1" => {
                // mlx-lm `dots1` (Dots1MoE, group_expert_select): sigmoid +
                // e_score_correction_bias, group-limited (n_group, topk_group;
                // dropped groups' keys 0.0), renormalised iff norm_topk_prob
                // and k > 1, × routed_scaling_factor; scoring_func is not
                // read. MoE where layer >= first_k_dense_replace. mlx-lm
                // stacks the experts under `experts` (not `switch_mlp`).
                names.stacked = "experts";
                keys.experts = "n_routed_experts";
                keys.shared = "n_shared_experts × moe_intermediate_size";
                let e = f.usize_req("n_routed_experts", MAX_EXPERTS)?;
                let k = f.usize_req("num_experts_per_tok", MAX_TOP_K)?;
                let i = f.usize_req("moe_intermediate_size", MAX_DIM)?;
                needs_bias = true;
                let router = grouped(f, Scoring::Sigmoid, true, false)?;
                if let Some(n) = f.usize_opt("n_shared_experts", 1024)?.filter(|&n| n > 0) {
                    shared = Some(shared_experts(f, "n_shared_experts", n, i)?);
                }
                (e, k, i, router, deepseek_rule(f, false)?)
            }
            "bailing_moe" => {
                // mlx-lm `bailing_moe` (BailingMoeSparseMoeBlock,
                // group_expert_select): scores softmax or sigmoid
                // (`score_function`) + `gate.expert_bias` if
                // `moe_router_enable_expert_bias`; `n_group` > 1 keeps the
                // `topk_group` groups with the best top-2 sums (dropped
                // groups' keys 0.0); weights the unbiased scores,
                // renormalised iff norm_topk_prob and k > 1 (+1e-20),
                // × routed_scaling_factor; a plain shared expert of
                // `num_shared_experts` × (moe_shared_expert_intermediate_size
                // or moe_intermediate_size); MoE where layer >=
                // first_k_dense_replace. Router `gate.gate_proj` (mlx-lm's
                // sanitize renames the Hugging Face `gate`).
                names.router = &["gate.gate_proj", "gate"];
                names.bias = "gate.expert_bias";
                keys.shared = "num_shared_experts × moe_intermediate_size";
                let e = f.usize_req("num_experts", MAX_EXPERTS)?;
                let k = f.usize_req("num_experts_per_tok", MAX_TOP_K)?;
                let i = f.usize_req("moe_intermediate_size", MAX_DIM)?;
                refuse_use_bias(f, mt)?;
                let scoring = scoring_key(f, "score_function")?;
                let router = grouped(f, scoring, true, false)?;
                if let RouterKind::Grouped { n_group, .. } = router {
                    if scoring == Scoring::Softmax && n_group > 1 {
                        // moekit's softmax Grouped router ranks groups by their best score.
                        return Err(crate::error::unsupported(
                            "safetensors",
                            format!("{}: {mt} with softmax scores and n_group = {n_group} (groups ranked by their top-2 sum)", path.display()),
                        ));
                    }
                }
                needs_bias = f.bool_or("moe_router_enable_expert_bias", false)?;
                let n = f.usize_or("num_shared_experts", 1024, 0)?;
                if n > 0 && f.bool_or("moe_router_enable_shared_expert", true)? {
                    let per = f
                        .usize_opt("moe_shared_expert_intermediate_size", MAX_DIM)?
                        .filter(|&s| s > 0)
                        .unwrap_or(i);
                    shared = Some(shared_experts(f, "num_shared_experts", n, per)?);
                }
                (e, k, i, router, deepseek_rule(f, false)?)
            }
            "granitemoe" => {
                // mlx-lm `granitemoe` (GraniteMoeMoE): top-k logits, softmax
                // over the k; router `router.layer`; every block is MoE. The
                // Hugging Face files fuse gate+up (`input_linear`, gate rows
                // first) and name down `output_linear`.
                block = "block_sparse_moe";
                names.router = &["router.layer"];
                names.fused = Some(("input_linear.weight", "output_linear.weight"));
                keys.experts = "num_local_experts";
                keys.intermediate = "intermediate_size";
                let e = f.usize_req("num_local_experts", MAX_EXPERTS)?;
                let k = f.usize_req("num_experts_per_tok", MAX_TOP_K)?;
                let i = f.usize_req("intermediate_size", MAX_DIM)?;
                (e, k, i, RouterKind::TopKSoftmax, LayerRule::All)
            }
            "minimax_m2" => {
                // mlx-lm `minimax` (MiniMaxSparseMoeBlock): sigmoid scores,
                // selection on scores + e_score_correction_bias, weights the
                // chosen scores / (their sum + 1e-20); every block is MoE.
                block = "block_sparse_moe";
                names.bias = "e_score_correction_bias";
                keys.experts = "num_local_experts";
                keys.intermediate = "intermediate_size";
                let e = f.usize_req("num_local_experts", MAX_EXPERTS)?;
                let k = f.usize_req("num_experts_per_tok", MAX_TOP_K)?;
                let i = f.usize_req("intermediate_size", MAX_DIM)?;
                expect_str(f, "scoring_func", &["sigmoid"], mt)?;
                if let Some(s) = f
                    .usize_opt("shared_intermediate_size", MAX_DIM)?
                    .filter(|&s| s > 0)
                {
                    // mlx-lm ignores the key; no MiniMax-M2 checkpoint sets it.
                    return Err(crate::error::unsupported(
                        "safetensors",
                        format!("{}: {mt} with shared_intermediate_size = {s} (a shared expert mlx-lm does not build)", path.display()),
                    ));
                }
                if k == 1 {
                    // mlx-lm renormalises one weight to 1; Grouped keeps the score.
                    return Err(crate::error::unsupported(
                        "safetensors",
                        format!("{}: {mt} with num_experts_per_tok = 1 (mlx-lm's weight is 1, moekit's rule keeps the score)", path.display()),
                    ));
                }
                needs_bias = true;
                let router = ungrouped(Scoring::Sigmoid, true);
                (e, k, i, router, LayerRule::All)
            }
            "deepseek_v2" | "deepseek_v3" | "kimi_k2" | "kimi_k25" | "glm4_moe" => {
                if mt == "kimi_k25" {
                    // mlx-lm's kimi_k25 and the Hugging Face files.
                    names.layers = &["language_model.model.layers"];
                }
                // Kimi-K2 is DeepSeek-V3 (mlx-lm maps kimi_k2 to deepseek_v3).
                let v3 = matches!(mt, "deepseek_v3" | "kimi_k2" | "kimi_k25");
                let e = f.usize_opt("n_routed_experts", MAX_EXPERTS)?;
                keys.experts = "n_routed_experts";
                keys.shared = "n_shared_experts × moe_intermediate_size";
                let v2 = mt == "deepseek_v2";
                let k = match f.usize_opt("num_experts_per_tok", MAX_TOP_K)? {
                    Some(k) => k,
                    None if e.is_none() => 0,
                    None if v3 => 1,
                    None => return Err(f.missing("num_experts_per_tok")),
                };
                let i = f.usize_or("moe_intermediate_size", MAX_DIM, 1407)?;
                let router = if v2 {
                    expect_str(f, "scoring_func", &["softmax"], mt)?;
                    let m = expect_str(
                        f,
                        "topk_method",
                        &["gready", "greedy", "group_limited_greedy"],
                        mt,
                    )?;
                    grouped(f, Scoring::Softmax, m == "group_limited_greedy", false)?
                } else {
                    expect_str(f, "scoring_func", &["sigmoid"], mt)?;
                    expect_str(f, "topk_method", &["noaux_tc"], mt)?;
                    needs_bias = true;
                    grouped(f, Scoring::Sigmoid, true, true)?
                };
                if let Some(n) = f.usize_opt("n_shared_experts", 1024)?.filter(|&n| n > 0) {
                    shared = Some(shared_experts(f, "n_shared_experts", n, i)?);
                }
                let rule = deepseek_rule(f, mt != "glm4_moe")?;
                match e {
                    Some(e) => (e, k, i, router, rule),
                    // No routed experts: every block is dense.
                    None => (
                        0,
                        k,
                        i,
                        router,
                        LayerRule::FirstDense {
                            first_dense: usize::MAX,
                            freq: 1,
                        },
                    ),
                }
            }
            // A family-table model_type without a rule here (a unit test
            // keeps this unreachable).
            other => {
                return Err(crate::error::unsupported(
                    "safetensors",
                    format!(
                        "{}: model_type {other:?} has no rule in this loader",
                        path.display()
                    ),
                ))
            }
        };
        let moe_layers: Vec<usize> = if n_experts == 0 {
            Vec::new()
        } else {
            (0..n_layers).filter(|&l| rule.is_moe(l)).collect()
        };
        let cfg = ModelConfig {
            model_type,
            n_layers,
            hidden,
            n_experts,
            top_k,
            intermediate,
            moe_layers,
            dense_rule: if n_experts == 0 {
                "the config has no routed experts".into()
            } else {
                rule.describe()
            },
            router,
            needs_bias,
            shared,
            block,
            names,
            quant,
            keys,
            glu,
            linear_bias,
            gemma4_eps,
            weight_before,
            bias_if_present,
            per_layer,
        };
        if !cfg.moe_layers.is_empty() {
            for &l in &cfg.moe_layers {
                cfg.at_layer(l).check(f)?;
                if cfg.per_layer.is_empty() {
                    break;
                }
            }
        }
        Ok(cfg)
    }
}

/// Reads and parses `dir/config.json`.
pub(crate) fn read(dir: &Path) -> Result<(PathBuf, ModelConfig)> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
        path: path.clone(),
        source,
    })?;
    let cfg = ModelConfig::parse(&text, &path)?;
    Ok((path, cfg))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "config_tests.rs"]
mod tests;
