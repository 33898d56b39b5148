//! llama.cpp architectures → moekit MoE blocks.
//!
//! The supported `general.architecture` values are the GGUF names of the
//! family table ([`crate::load::family`]); each has an `ArchRule` here: how
//! llama.cpp's graph for it calls `build_moe_ffn` (gating function,
//! renormalisation, scale, selection bias) and which shared expert it adds
//! (a unit test in `family.rs` checks every table name has one). The rules
//! below are read from llama.cpp's `src/models/<arch>.cpp` and
//! `build_moe_ffn` (`src/llama-graph.cpp`):
//!
//! | arch | gating | renormalise top-k | scale | bias | shared expert |
//! |---|---|---|---|---|---|
//! | `llama` (Mixtral), `mixtral` | softmax | yes | – | – | – |
//! | `granitemoe` | softmax | yes | – | – | plain if `expert_shared_feed_forward_length` > 0 |
//! | `qwen3moe` | softmax | yes | – | – | – |
//! | `gpt-oss` | softmax over the chosen k | – | – | – | – (router and expert biases, clamped SwiGLU) |
//! | `qwen3next`, `qwen35moe` | softmax | yes | – | – | sigmoid-gated |
//! | `qwen2moe` | softmax | no | – | – | sigmoid-gated |
//! | `olmoe` | softmax | no | – | – | – |
//! | `deepseek2` | key, default softmax | key, default no | key | optional | plain |
//! | `glm4moe` | key, default sigmoid | key, default no | key | required | plain if `expert_shared_count` > 0 |
//! | `minimax-m2` | key, required | yes | – | required | – |
//! | `dots1` | key, required | key, default no | key | optional | plain |
//! | `bailingmoe2` | key, required | key, default no | key | optional | plain |
//! | `bailingmoe` | softmax | key, default no | key | – | plain |
//! | `gemma4` | softmax | yes | × `ffn_down_exps.scale[e]` | – | – (router and expert norms, GEGLU) |
//! | `llama4` | sigmoid of the chosen logit | no | – | – | plain (weight before the FFN) |
//! | `ernie4_5-moe` | softmax | yes | – | optional | plain if `expert_shared_feed_forward_length` > 0 |
//! | `hunyuan-moe` | softmax | yes | – | – | plain |
//!
//! "key" means `<arch>.expert_gating_func` (1 softmax, 2 sigmoid; "required":
//! llama.cpp has no default and aborts without it, moekit names the key),
//! `<arch>.expert_weights_norm` and `<arch>.expert_weights_scale` (absent or 0
//! means 1, as llama.cpp skips a scale of 0 or 1). For every arch,
//! `<arch>.expert_group_count` > 1 turns on llama.cpp's group-limited selection.
//!
//! Mapping to [`RouterKind`] (exact unless noted):
//! * softmax + renormalise → `TopKSoftmax` for llama (top-k then softmax over
//!   the k is the same function), `SoftmaxTopK { norm_topk_prob: true }` for
//!   the Qwens; softmax without renormalising → `SoftmaxTopK { false }`.
//!   llama.cpp clamps the renormalising sum to ≥ 6.1e-5; a sum of the top-k
//!   softmax probabilities is ≥ 1/E, so the clamp never acts.
//! * deepseek2 / glm4moe → `Grouped { scoring, bias, n_group, topk_group,
//!   dropped_groups: GroupMask::NegInf, norm, scale }`. llama.cpp masks the
//!   experts of the groups it drops with −∞ (`ggml_fill(.., -INFINITY)` in
//!   `build_moe_ffn`): they are never chosen. mlx-lm (and so the safetensors
//!   loader, [`GroupMask::Zero`]) sets their keys to 0, which lets them beat
//!   kept experts whose biased score `sigmoid(l) + bias` is negative; with
//!   negative `exp_probs_b` biases the two pick different experts, and this
//!   loader follows llama.cpp (test: `fixtures/gguf/deepseek2_v3_negbias`).
//!   Divergences from llama.cpp, which moekit handles so:
//!   - groups with softmax gating: llama.cpp ranks groups by the sum of their
//!     two best scores, moekit's `Grouped(Softmax)` by the best one → **error**;
//!   - renormalising with k = 1: llama.cpp gives weight 1, moekit the score →
//!     **error**;
//!   - llama.cpp clamps the renormalising sum of sigmoid scores to ≥ 6.1e-5
//!     (only matters when all k chosen sigmoids are below ~3e-5) — accepted.
//! * Other gating functions (softmax_weight, sqrt_softplus) → error.

use super::block::{layout, need, weights};
use super::file::{GgufFile, TensorInfo};
use crate::error::{Error, Result};
use crate::ops::ffn::{ExpertBiases, ExpertFfn, ExpertInput, ExpertScales, GluAct, InputNorm};
use crate::ops::route::{GroupMask, RouterConfig, RouterKind, Scoring};

/// Whether this module has a rule for `arch` (for the family table's test).
#[cfg(test)]
pub(crate) fn has_rule(arch: &str) -> bool {
    ArchRule::rule(arch).is_some()
}

/// A hyper-parameter fixed by the architecture or read from a key.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Param<T> {
    Fixed(T),
    /// Read from the key; the value is the default when it is absent.
    Key(T),
    /// Read from the key, which must be present (llama.cpp has no default).
    Required,
}

/// Which router rule the architecture's softmax routing maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    TopKSoftmax,
    SoftmaxTopK,
    Grouped,
    /// Gemma-4's rule with `ffn_down_exps.scale` as the per-expert scale.
    Gemma4,
}

/// Whether and how a selection bias `blk.N.exp_probs_b.bias` is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    No,
    Optional,
    Required,
}

/// Which shared expert the architecture adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SharedRule {
    None,
    /// Always present, output × sigmoid(x · `ffn_gate_inp_shexp`).
    Gated,
    /// Always present, ungated.
    Plain,
    /// Present (ungated) iff `<arch>.expert_shared_count` > 0.
    PlainIfCount,
    /// Present (ungated) iff `<arch>.expert_shared_feed_forward_length` > 0.
    PlainIfLength,
}

/// How one architecture's MoE layer is built (see the module docs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ArchRule {
    gating: Param<Scoring>,
    norm: Param<bool>,
    scale_key: bool,
    style: Style,
    bias: Need,
    shared: SharedRule,
    /// The experts' activation (`LLM_FFN_SWIGLU_OAI_MOE` for gpt-oss).
    glu: GluAct,
    /// Whether the router and expert projections carry `.bias` tensors
    /// (llama.cpp's biased `build_moe_ffn` overload: gpt-oss).
    linear_bias: bool,
    /// What the router and the experts read.
    input: InputRule,
}

/// The router's and the experts' inputs (see `ops::input`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InputRule {
    /// Both read the layer's normed input.
    Plain,
    /// gemma4.cpp: the router reads `rms_norm(x) · n_embd^-½ ·
    /// ffn_gate_inp.scale`, the experts `pre_ffw_norm_2(x)`; each chosen
    /// expert's output × `ffn_down_exps.scale[e]`.
    Gemma4,
    /// `weight_before_ffn` (llama4.cpp): the weight scales the input.
    WeightBefore,
}

impl ArchRule {
    /// The rule of a `general.architecture` value; `None` unless the
    /// architecture is in the family table ([`crate::load::family`]) and
    /// has a rule here.
    pub(crate) fn of(arch: &str) -> Option<ArchRule> {
        crate::load::family::by_gguf_arch(arch)?;
        ArchRule::rule(arch)
    }

    /// Whether the router and expert projections carry `.bias` tensors.
    pub(crate) fn linear_bias(&self) -> bool {
        self.linear_bias
    }

    /// The `.scale` tensors the architecture reads (`ffn_gate_inp.scale`,
    /// `ffn_down_exps.scale`: gemma4).
    pub(crate) fn scale_tensors(&self) -> &'static [&'static str] {
        match self.input {
            InputRule::Gemma4 => &["ffn_gate_inp", "ffn_down_exps"],
            _ => &[],
        }
    }

    /// How llama.cpp builds `arch`'s MoE layer (the module docs' table).
    fn rule(arch: &str) -> Option<ArchRule> {
        use Param::{Fixed, Key};
        let softmax = |norm: bool, style: Style, shared: SharedRule| ArchRule {
            gating: Fixed(Scoring::Softmax),
            norm: Fixed(norm),
            scale_key: false,
            style,
            bias: Need::No,
            shared,
            glu: GluAct::SwiGlu,
            linear_bias: false,
            input: InputRule::Plain,
        };
        Some(match arch {
            // bailingmoe.cpp (Ling v1): softmax, norm_w and w_scale from their
            // keys (defaults off), an ungated shared expert of
            // n_ff_exp · expert_shared_count.
            "bailingmoe" => ArchRule {
                norm: Key(false),
                scale_key: true,
                ..softmax(false, Style::Grouped, SharedRule::Plain)
            },
            // hunyuan-moe.cpp: softmax, norm_w, no scale, an ungated shared expert.
            "hunyuan-moe" => softmax(true, Style::SoftmaxTopK, SharedRule::Plain),
            // ernie4-5-moe.cpp: softmax, norm_w, optional exp_probs_b (the
            // selection only), a plain shared expert iff n_ff_shexp > 0.
            "ernie4_5-moe" => ArchRule {
                bias: Need::Optional,
                ..softmax(true, Style::Grouped, SharedRule::PlainIfLength)
            },
            // llama4.cpp: sigmoid of the chosen logit (top-k on the logits),
            // no norm, weight_before_ffn, an ungated shared expert.
            "llama4" => ArchRule {
                gating: Fixed(Scoring::Sigmoid),
                input: InputRule::WeightBefore,
                ..softmax(false, Style::Grouped, SharedRule::Plain)
            },
            // gemma4.cpp: softmax → top-k → renormalise, × ffn_down_exps.scale,
            // GEGLU (tanh GELU); the router's and the experts' own norms.
            "gemma4" => ArchRule {
                glu: GluAct::GeluTanh,
                input: InputRule::Gemma4,
                ..softmax(true, Style::Gemma4, SharedRule::None)
            },
            "llama" | "mixtral" => softmax(true, Style::TopKSoftmax, SharedRule::None),
            // granite.cpp (GRANITE_MOE): softmax, norm; Granite-MoE-Shared's
            // plain shared expert iff n_ff_shexp > 0.
            "granitemoe" => softmax(true, Style::TopKSoftmax, SharedRule::PlainIfLength),
            "qwen3moe" => softmax(true, Style::SoftmaxTopK, SharedRule::None),
            // openai-moe.cpp: SOFTMAX_WEIGHT gating (top-k on the logits,
            // softmax over the chosen k), LLM_FFN_SWIGLU_OAI_MOE (α 1.702,
            // limit 7), biases on the router and every expert projection.
            "gpt-oss" => ArchRule {
                glu: GluAct::GPT_OSS,
                linear_bias: true,
                ..softmax(true, Style::TopKSoftmax, SharedRule::None)
            },
            "qwen3next" | "qwen35moe" => softmax(true, Style::SoftmaxTopK, SharedRule::Gated),
            "qwen2moe" => softmax(false, Style::SoftmaxTopK, SharedRule::Gated),
            "olmoe" => softmax(false, Style::SoftmaxTopK, SharedRule::None),
            "deepseek2" => ArchRule {
                gating: Key(Scoring::Softmax),
                norm: Key(false),
                scale_key: true,
                style: Style::Grouped,
                bias: Need::Optional,
                shared: SharedRule::Plain,
                glu: GluAct::SwiGlu,
                linear_bias: false,
                input: InputRule::Plain,
            },
            // minimax-m2.cpp: gating from the key (no default), norm, no
            // scale, exp_probs_b required, no shared expert.
            "minimax-m2" => ArchRule {
                gating: Param::Required,
                norm: Fixed(true),
                scale_key: false,
                style: Style::Grouped,
                bias: Need::Required,
                shared: SharedRule::None,
                glu: GluAct::SwiGlu,
                linear_bias: false,
                input: InputRule::Plain,
            },
            // dots1.cpp and bailingmoe2.cpp (Ling 2.0): gating from the key
            // (no default), norm and scale from keys, optional exp_probs_b,
            // plain shared expert (leading dense blocks from their key).
            "dots1" | "bailingmoe2" => ArchRule {
                gating: Param::Required,
                norm: Key(false),
                scale_key: true,
                style: Style::Grouped,
                bias: Need::Optional,
                shared: SharedRule::Plain,
                glu: GluAct::SwiGlu,
                linear_bias: false,
                input: InputRule::Plain,
            },
            "glm4moe" => ArchRule {
                gating: Key(Scoring::Sigmoid),
                norm: Key(false),
                scale_key: true,
                style: Style::Grouped,
                bias: Need::Required,
                shared: SharedRule::PlainIfCount,
                glu: GluAct::SwiGlu,
                linear_bias: false,
                input: InputRule::Plain,
            },
            _ => return None,
        })
    }
}

/// A malformed-file error naming the file.
pub(crate) fn bad(file: &GgufFile, msg: impl Into<String>) -> Error {
    Error::BadFile {
        path: file.path().to_path_buf(),
        msg: msg.into(),
    }
}

/// An unsupported-content error naming the file.
pub(crate) fn unsupported(file: &GgufFile, what: impl std::fmt::Display) -> Error {
    crate::error::unsupported("gguf", format!("{}: {what}", file.path().display()))
}

/// `<arch>.<suffix>` as an unsigned integer; for a per-layer array, element `layer`.
pub(crate) fn key_u64(
    file: &GgufFile,
    arch: &str,
    suffix: &str,
    layer: usize,
) -> Result<Option<u64>> {
    let key = format!("{arch}.{suffix}");
    let Some(v) = file.get(&key) else {
        return Ok(None);
    };
    let item = match v.as_array() {
        Some(a) => a.get(layer).ok_or_else(|| {
            bad(
                file,
                format!(
                    "`{key}` has {} entries, no entry for block {layer}",
                    a.len()
                ),
            )
        })?,
        None => v.clone(),
    };
    item.as_u64().map(Some).ok_or_else(|| {
        bad(
            file,
            format!(
                "`{key}` is {} {item:?}: want an unsigned integer",
                item.type_name()
            ),
        )
    })
}

/// `<arch>.<suffix>` as a usize (see [`key_u64`]).
pub(crate) fn key_usize(
    file: &GgufFile,
    arch: &str,
    suffix: &str,
    layer: usize,
) -> Result<Option<usize>> {
    key_u64(file, arch, suffix, layer)?
        .map(|v| {
            usize::try_from(v)
                .map_err(|_| bad(file, format!("`{arch}.{suffix}` = {v} is too large")))
        })
        .transpose()
}

fn key_bool(file: &GgufFile, key: &str) -> Result<Option<bool>> {
    file.get(key)
        .map(|v| {
            v.as_bool().ok_or_else(|| {
                bad(
                    file,
                    format!("`{key}` is {} {v:?}: want a bool", v.type_name()),
                )
            })
        })
        .transpose()
}

fn key_f64(file: &GgufFile, key: &str) -> Result<Option<f64>> {
    file.get(key)
        .map(|v| {
            v.as_f64().ok_or_else(|| {
                bad(
                    file,
                    format!("`{key}` is {} {v:?}: want a number", v.type_name()),
                )
            })
        })
        .transpose()
}

/// The routing rule of block `layer` (`bias` is its selection bias, if any).
pub(crate) fn router_kind(
    file: &GgufFile,
    arch: &str,
    fam: &ArchRule,
    layer: usize,
    top_k: usize,
    bias: Option<Vec<f32>>,
) -> Result<RouterKind> {
    let scoring = match fam.gating {
        Param::Fixed(s) => s,
        Param::Key(_) | Param::Required => match key_u64(file, arch, "expert_gating_func", layer)? {
            None | Some(0) => match fam.gating {
                Param::Key(default) => default,
                _ => {
                    return Err(bad(
                        file,
                        format!("missing key `{arch}.expert_gating_func` (1 softmax or 2 sigmoid; llama.cpp has no default for {arch})"),
                    ))
                }
            },
            Some(1) => Scoring::Softmax,
            Some(2) => Scoring::Sigmoid,
            Some(v) => {
                return Err(unsupported(
                    file,
                    format!("`{arch}.expert_gating_func` = {v} (only 1 softmax and 2 sigmoid)"),
                ))
            }
        },
    };
    let norm_key = format!("{arch}.expert_weights_norm");
    let norm = match fam.norm {
        Param::Fixed(b) => b,
        Param::Key(default) => key_bool(file, &norm_key)?.unwrap_or(default),
        Param::Required => key_bool(file, &norm_key)?
            .ok_or_else(|| bad(file, format!("missing key `{norm_key}`")))?,
    };
    let scale = match fam.scale_key {
        true => key_f64(file, &format!("{arch}.expert_weights_scale"))?
            .filter(|&s| s != 0.0)
            .unwrap_or(1.0) as f32,
        false => 1.0,
    };
    let n_group = key_usize(file, arch, "expert_group_count", layer)?.unwrap_or(0);
    let topk_group = key_usize(file, arch, "expert_group_used_count", layer)?.unwrap_or(0);
    if n_group > 1 {
        if scoring == Scoring::Softmax {
            return Err(unsupported(
                file,
                format!("softmax gating with {n_group} expert groups (llama.cpp ranks groups by their top-2 sum, moekit's softmax Grouped router by their maximum)"),
            ));
        }
        if topk_group == 0 {
            return Err(bad(file, format!("`{arch}.expert_group_count` = {n_group} but `{arch}.expert_group_used_count` is absent or 0")));
        }
    }
    let style = if n_group > 1 {
        Style::Grouped
    } else {
        fam.style
    };
    Ok(match style {
        Style::Gemma4 => {
            let (e, _, _, _) = layout(file, layer)?;
            let name = format!("blk.{layer}.ffn_down_exps.scale");
            RouterKind::Gemma4 {
                per_expert_scale: match file.tensor(&name) {
                    Some(t) => vector(file, t, e)?,
                    None => vec![1.0; e],
                },
            }
        }
        Style::TopKSoftmax if norm => RouterKind::TopKSoftmax,
        Style::TopKSoftmax | Style::SoftmaxTopK => RouterKind::SoftmaxTopK {
            norm_topk_prob: norm,
        },
        Style::Grouped => {
            if norm && top_k == 1 {
                return Err(unsupported(file, "renormalised grouped routing with top-k = 1 (llama.cpp's weight is 1, moekit's the score)"));
            }
            RouterKind::Grouped {
                scoring,
                bias,
                n_group: n_group.max(1),
                topk_group: if n_group > 1 { topk_group } else { 1 },
                // llama.cpp's masking (build_moe_ffn): see the module docs.
                dropped_groups: crate::load::family::GGUF_DROPPED_GROUPS,
                norm_topk_prob: norm,
                routed_scaling_factor: scale,
            }
        }
    })
}

/// Human-readable routing rule for `moekit inspect`.
pub(crate) fn describe(kind: &RouterKind, k: usize) -> String {
    match kind {
        RouterKind::SoftmaxTopK { norm_topk_prob } => {
            format!(
                "softmax → top-{k}{}",
                if *norm_topk_prob {
                    " → renormalise"
                } else {
                    ""
                }
            )
        }
        RouterKind::TopKSoftmax => format!("top-{k} → softmax over the {k}"),
        RouterKind::Gemma4 { .. } => {
            format!("gemma4 (softmax → top-{k} → renormalise × per-expert scale)")
        }
        RouterKind::Grouped {
            scoring,
            bias,
            n_group,
            topk_group,
            dropped_groups,
            norm_topk_prob,
            routed_scaling_factor,
        } => {
            let mut s = match scoring {
                Scoring::Softmax => "softmax".to_string(),
                Scoring::Sigmoid => "sigmoid".to_string(),
            };
            if bias.is_some() {
                s += " + selection bias";
            }
            if *n_group > 1 {
                s += &format!(" → best {topk_group} of {n_group} groups");
                if topk_group < n_group {
                    s += &format!(
                        " (dropped groups' keys {}{})",
                        dropped_groups.label(),
                        match dropped_groups {
                            GroupMask::NegInf => ", as llama.cpp",
                            GroupMask::Zero => ", as mlx-lm",
                        }
                    );
                }
            }
            s += &format!(" → top-{k}");
            if *norm_topk_prob {
                s += " → renormalise";
            }
            if *routed_scaling_factor != 1.0 {
                s += &format!(" → × {routed_scaling_factor}");
            }
            s
        }
    }
}

/// The shared-expert tensors of block `layer`: (gate, up, down, optional sigmoid gate).
pub(crate) type SharedTensors<'a> = (
    &'a TensorInfo,
    &'a TensorInfo,
    &'a TensorInfo,
    Option<&'a TensorInfo>,
);

pub(crate) fn shared_tensors<'a>(
    file: &'a GgufFile,
    arch: &str,
    fam: &ArchRule,
    layer: usize,
) -> Result<Option<SharedTensors<'a>>> {
    let present = match fam.shared {
        SharedRule::None => false,
        SharedRule::Gated | SharedRule::Plain => true,
        SharedRule::PlainIfCount => {
            key_usize(file, arch, "expert_shared_count", layer)?.unwrap_or(0) > 0
        }
        SharedRule::PlainIfLength => {
            key_usize(file, arch, "expert_shared_feed_forward_length", layer)?.unwrap_or(0) > 0
        }
    };
    if !present {
        return Ok(None);
    }
    let p = |s: &str| format!("blk.{layer}.{s}");
    let gate = need(file, &p("ffn_gate_shexp.weight"), layer)?;
    let up = need(file, &p("ffn_up_shexp.weight"), layer)?;
    let down = need(file, &p("ffn_down_shexp.weight"), layer)?;
    let sgate = match fam.shared {
        SharedRule::Gated => Some(need(file, &p("ffn_gate_inp_shexp.weight"), layer)?),
        _ => None,
    };
    Ok(Some((gate, up, down, sgate)))
}

/// Describes block `layer`'s shared expert, if any (for the summary).
pub(crate) fn describe_shared(
    file: &GgufFile,
    arch: &str,
    fam: &ArchRule,
    layer: usize,
) -> Result<Option<String>> {
    Ok(
        shared_tensors(file, arch, fam, layer)?.map(|(gate, _, _, sgate)| {
            let is = gate.ne.get(1).copied().unwrap_or(0);
            format!(
                "1 shared expert, I = {is}{}",
                if sgate.is_some() {
                    ", sigmoid-gated"
                } else {
                    ""
                }
            )
        }),
    )
}

/// The per-expert output scales llama.cpp reads for every architecture
/// (`llama-model.cpp`: `ffn_{gate,up,down}_exps.scale`, `{n_expert}`, not
/// required), multiplied into each selected expert's matmul output by
/// `build_lora_mm_id` (see [`crate::ops::ffn`]).
pub(crate) const EXPERT_SCALES: [&str; 3] = ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"];

/// Block `layer`'s experts' activation, biases and scales:
/// `blk.N.ffn_gate_inp.bias` `[E]` and `ffn_{gate,up,down}_exps.bias`
/// (`[E, I]`, `[E, I]`, `[E, H]`) where the architecture has them, and
/// `ffn_{gate,up,down}_exps.scale` `[E]` where the file has them (any float
/// GGML type, read as f32). Gemma-4's `ffn_down_exps.scale` is its router
/// rule's per-expert scale ([`router_kind`]), not an expert scale.
pub(crate) fn expert_ffn(
    file: &GgufFile,
    arch: &str,
    fam: &ArchRule,
    layer: usize,
) -> Result<ExpertFfn> {
    let mut ffn = ExpertFfn {
        act: fam.glu,
        bias: ExpertBiases::default(),
        scale: ExpertScales::default(),
        input: expert_input(file, arch, fam, layer)?,
    };
    let (e, h, i, _) = layout(file, layer)?;
    let scale = |stem: &str| -> Result<Option<crate::Tensor>> {
        if fam.scale_tensors().contains(&stem) {
            return Ok(None);
        }
        match file.tensor(&format!("blk.{layer}.{stem}.scale")) {
            Some(t) => {
                let v = vector(file, t, e)?;
                Ok(Some(crate::Tensor::from_f32(&v, &[e], crate::DType::F32)?))
            }
            None => Ok(None),
        }
    };
    let [g, u, d] = EXPERT_SCALES;
    ffn.scale = ExpertScales {
        gate: scale(g)?,
        up: scale(u)?,
        down: scale(d)?,
    };
    if !fam.linear_bias {
        return Ok(ffn);
    }
    let read = |stem: &str, rows: usize, cols: usize| -> Result<Option<crate::Tensor>> {
        let t = need(file, &format!("blk.{layer}.{stem}.bias"), layer)?;
        let v = weights(file, t, 1, rows, cols)?.dequantize_expert(0)?;
        let shape: &[usize] = if rows == 1 { &[cols] } else { &[rows, cols] };
        Ok(Some(crate::Tensor::from_f32(&v, shape, crate::DType::F32)?))
    };
    ffn.bias = ExpertBiases {
        router: read("ffn_gate_inp", 1, e)?,
        gate: read("ffn_gate_exps", e, i)?,
        up: read("ffn_up_exps", e, i)?,
        down: read("ffn_down_exps", e, h)?,
    };
    Ok(ffn)
}

/// A float vector tensor of `n` values as f32.
fn vector(file: &GgufFile, t: &TensorInfo, n: usize) -> Result<Vec<f32>> {
    weights(file, t, 1, 1, n)?.dequantize_expert(0)
}

/// Block `layer`'s inputs of the router and the experts (see `InputRule`).
fn expert_input(file: &GgufFile, arch: &str, fam: &ArchRule, layer: usize) -> Result<ExpertInput> {
    Ok(match fam.input {
        InputRule::Plain => ExpertInput::default(),
        InputRule::WeightBefore => ExpertInput {
            weight_before: true,
            ..Default::default()
        },
        InputRule::Gemma4 => {
            let (_, h, _, _) = layout(file, layer)?;
            let key = format!("{arch}.attention.layer_norm_rms_epsilon");
            let eps = key_f64(file, &key)?.unwrap_or(1e-6) as f32;
            if !(eps.is_finite() && eps >= 0.0) {
                return Err(bad(
                    file,
                    format!("`{key}` = {eps}: want a finite number ≥ 0"),
                ));
            }
            let norm = |stem: &str, scale: f32| -> Result<InputNorm> {
                let name = format!("blk.{layer}.{stem}");
                let v: Vec<f32> = vector(file, need(file, &name, layer)?, h)?
                    .into_iter()
                    .map(|w| w * scale)
                    .collect();
                InputNorm::new(&v, eps)
            };
            ExpertInput {
                router_norm: Some(norm("ffn_gate_inp.scale", 1.0 / (h as f32).sqrt())?),
                expert_norm: Some(norm("pre_ffw_norm_2.weight", 1.0)?),
                weight_before: false,
            }
        }
    })
}

/// The router configuration of block `layer`.
pub(crate) fn router_config(
    file: &GgufFile,
    arch: &str,
    fam: &ArchRule,
    layer: usize,
) -> Result<RouterConfig> {
    let (e, _, _, _) = layout(file, layer)?;
    let top_k = key_usize(file, arch, "expert_used_count", layer)?
        .ok_or_else(|| bad(file, format!("missing key `{arch}.expert_used_count`")))?;
    let bias = match fam.bias {
        Need::No => None,
        Need::Optional | Need::Required => {
            match file.tensor(&format!("blk.{layer}.exp_probs_b.bias")) {
                Some(t) => Some(vector(file, t, e)?),
                None if fam.bias == Need::Required => {
                    return Err(bad(
                        file,
                        format!("missing tensor `blk.{layer}.exp_probs_b.bias` (needed by {arch})"),
                    ))
                }
                None => None,
            }
        }
    };
    let kind = router_kind(file, arch, fam, layer, top_k, bias)?;
    let cfg = RouterConfig {
        kind,
        n_experts: e,
        top_k,
    };
    cfg.validate()
        .map_err(|err| bad(file, format!("block {layer}: {err}")))?;
    Ok(cfg)
}
