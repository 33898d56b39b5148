//! `config.json` reading helpers: typed access to its keys ([`Fields`],
//! errors naming the key), which blocks are MoE ([`LayerRule`]) and the
//! router / shared-expert settings several families share.

use super::config::{SharedSpec, MAX_DIM, MAX_LAYERS};
use crate::error::{Error, Result};
use crate::ops::route::{RouterKind, Scoring, MAX_EXPERTS};
use serde_json::{Map, Value};
use std::path::Path;

/// Typed access to a JSON object, with errors naming config.json and the key.
pub(crate) struct Fields<'a> {
    pub path: &'a Path,
    pub obj: &'a Map<String, Value>,
}

impl Fields<'_> {
    pub fn bad(&self, key: &str, expected: &str, got: impl std::fmt::Display) -> Error {
        Error::BadFile {
            path: self.path.to_path_buf(),
            msg: format!("key `{key}`: expected {expected}, got {got}"),
        }
    }

    pub(crate) fn get(&self, key: &str) -> Option<&Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    /// An integer in `0..=max`, if present (null counts as absent).
    pub fn usize_opt(&self, key: &str, max: usize) -> Result<Option<usize>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        match v.as_u64() {
            Some(n) if n as u128 <= max as u128 => Ok(Some(n as usize)),
            _ => Err(self.bad(key, &format!("an integer in 0..={max}"), v)),
        }
    }

    pub fn usize_req(&self, key: &str, max: usize) -> Result<usize> {
        self.usize_opt(key, max)?.ok_or_else(|| self.missing(key))
    }

    pub fn usize_or(&self, key: &str, max: usize, default: usize) -> Result<usize> {
        Ok(self.usize_opt(key, max)?.unwrap_or(default))
    }

    pub fn missing(&self, key: &str) -> Error {
        Error::BadFile {
            path: self.path.to_path_buf(),
            msg: format!("missing key `{key}`"),
        }
    }

    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.bad(key, "true or false", v)),
        }
    }

    pub(crate) fn f32_or(&self, key: &str, default: f32) -> Result<f32> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && x.abs() <= f32::MAX as f64 => Ok(x as f32),
                _ => Err(self.bad(key, "a finite number", v)),
            },
        }
    }

    pub fn str_opt(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.bad(key, "a string", v)),
        }
    }

    pub(crate) fn layer_list(&self, key: &str) -> Result<Vec<usize>> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_u64()
                        .map(|n| n as usize)
                        .ok_or_else(|| self.bad(key, "a list of layer indices", v))
                })
                .collect(),
            Some(v) => Err(self.bad(key, "a list of layer indices", v)),
        }
    }

    /// An integer in `0..=max` or a list of them (mlx-lm's
    /// `_int_or_list`: per layer), if present; a list has one value per
    /// block (`n_layers`).
    pub(crate) fn usize_or_list(
        &self,
        key: &str,
        max: usize,
        n_layers: usize,
    ) -> Result<Option<Vec<usize>>> {
        let one = |v: &Value| match v.as_u64() {
            Some(n) if n as u128 <= max as u128 => Ok(n as usize),
            _ => Err(self.bad(
                key,
                &format!("an integer in 0..={max} or a list of them"),
                v,
            )),
        };
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => {
                if a.len() != n_layers {
                    return Err(self.bad(
                        key,
                        &format!("one value per layer (num_hidden_layers = {n_layers})"),
                        format!("{} values", a.len()),
                    ));
                }
                a.iter().map(one).collect::<Result<Vec<_>>>().map(Some)
            }
            Some(v) => Ok(Some(vec![one(v)?; n_layers])),
        }
    }

    /// An integer in `0..=max`, or the least (`min`) / largest of a list
    /// (ERNIE's `moe_layer_start_index` / `_end_index`, as mlx-lm reads them).
    pub(crate) fn usize_or_list_bound(
        &self,
        key: &str,
        max: usize,
        least: bool,
    ) -> Result<Option<usize>> {
        match self.get(key) {
            Some(Value::Array(a)) => {
                let v = a
                    .iter()
                    .map(|v| match v.as_u64() {
                        Some(n) if n as u128 <= max as u128 => Ok(n as usize),
                        _ => Err(self.bad(key, &format!("integers in 0..={max}"), v)),
                    })
                    .collect::<Result<Vec<_>>>()?;
                let b = if least {
                    v.iter().min()
                } else {
                    v.iter().max()
                };
                b.copied()
                    .map(Some)
                    .ok_or_else(|| self.bad(key, "a non-empty list", "[]"))
            }
            _ => self.usize_opt(key, max),
        }
    }
}

/// Which blocks are MoE.
pub(crate) enum LayerRule {
    /// Every block.
    All,
    /// Qwen: `l ∉ mlp_only_layers && (l + 1) % decoder_sparse_step == 0`.
    Sparse { step: usize, mlp_only: Vec<usize> },
    /// DeepSeek / GLM: `l ≥ first_k_dense_replace && l % moe_layer_freq == 0`.
    FirstDense { first_dense: usize, freq: usize },
    /// Llama-4: `l % interleave_moe_layer_step == step − 1`.
    Interleaved { step: usize },
    /// ERNIE-4.5: `(l + 1) % moe_layer_interval == 0 && start ≤ l ≤ end`.
    Interval {
        start: usize,
        end: usize,
        interval: usize,
    },
}

impl LayerRule {
    pub(crate) fn is_moe(&self, l: usize) -> bool {
        match self {
            LayerRule::All => true,
            LayerRule::Sparse { step, mlp_only } => {
                !mlp_only.contains(&l) && (l + 1).is_multiple_of(*step)
            }
            LayerRule::FirstDense { first_dense, freq } => {
                l >= *first_dense && l.is_multiple_of(*freq)
            }
            LayerRule::Interleaved { step } => l % step == step - 1,
            LayerRule::Interval {
                start,
                end,
                interval,
            } => (l + 1).is_multiple_of(*interval) && (*start..=*end).contains(&l),
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            LayerRule::All => "every block is MoE".into(),
            LayerRule::Sparse { step, mlp_only } => {
                format!("MoE where (layer + 1) % decoder_sparse_step ({step}) == 0 and layer not in mlp_only_layers {mlp_only:?}")
            }
            LayerRule::FirstDense { first_dense, freq } => {
                format!("MoE where layer >= first_k_dense_replace ({first_dense}) and layer % moe_layer_freq ({freq}) == 0")
            }
            LayerRule::Interleaved { step } => {
                format!("MoE where layer % interleave_moe_layer_step ({step}) == {}", step - 1)
            }
            LayerRule::Interval { start, end, interval } => format!(
                "MoE where (layer + 1) % moe_layer_interval ({interval}) == 0 and {start} <= layer <= {end} (moe_layer_start_index, moe_layer_end_index)"
            ),
        }
    }
}

pub(crate) fn qwen_rule(f: &Fields<'_>) -> Result<LayerRule> {
    let step = f.usize_or("decoder_sparse_step", MAX_LAYERS, 1)?;
    if step == 0 {
        return Err(f.bad("decoder_sparse_step", "an integer >= 1", 0));
    }
    Ok(LayerRule::Sparse {
        step,
        mlp_only: f.layer_list("mlp_only_layers")?,
    })
}

pub(crate) fn deepseek_rule(f: &Fields<'_>, with_freq: bool) -> Result<LayerRule> {
    let first_dense = f.usize_or("first_k_dense_replace", MAX_LAYERS, 0)?;
    let freq = if with_freq {
        f.usize_or("moe_layer_freq", MAX_LAYERS, 1)?
    } else {
        1
    };
    if freq == 0 {
        return Err(f.bad("moe_layer_freq", "an integer >= 1", 0));
    }
    Ok(LayerRule::FirstDense { first_dense, freq })
}

/// A plain (ungated) `shared_experts` module of `n` experts (config key
/// `n_key`) of `per` intermediate rows each, fused as one of `n · per`.
pub(crate) fn shared_experts(
    f: &Fields<'_>,
    n_key: &str,
    n: usize,
    per: usize,
) -> Result<SharedSpec> {
    let s = per
        .checked_mul(n)
        .filter(|&s| s <= MAX_DIM)
        .ok_or_else(|| {
            f.bad(
                n_key,
                &format!("{n_key} · the shared expert's intermediate size {per} ≤ 2^20"),
                n,
            )
        })?;
    Ok(SharedSpec {
        intermediate: s,
        prefix: "shared_experts",
        gated: false,
    })
}

/// Grouped (DeepSeek-style) router settings.
pub(crate) fn grouped(
    f: &Fields<'_>,
    scoring: Scoring,
    group_limited: bool,
    norm_default: bool,
) -> Result<RouterKind> {
    let (n_group, topk_group) = if group_limited {
        (
            f.usize_or("n_group", MAX_EXPERTS, 1)?,
            f.usize_or("topk_group", MAX_EXPERTS, 1)?,
        )
    } else {
        (1, 1)
    };
    Ok(RouterKind::Grouped {
        scoring,
        bias: None,
        n_group,
        topk_group,
        // mlx-lm's masking (the oracle of this loader): see GroupMask.
        dropped_groups: crate::load::family::SAFETENSORS_DROPPED_GROUPS,
        norm_topk_prob: f.bool_or("norm_topk_prob", norm_default)?,
        routed_scaling_factor: f.f32_or("routed_scaling_factor", 1.0)?,
    })
}

/// Checks an optional string key against the one value this loader supports.
pub(crate) fn expect_str(
    f: &Fields<'_>,
    key: &str,
    allowed: &[&str],
    model_type: &str,
) -> Result<String> {
    let v = f.str_opt(key)?.unwrap_or(allowed[0]);
    if allowed.contains(&v) {
        Ok(v.to_string())
    } else {
        Err(crate::error::unsupported(
            "safetensors",
            format!("{model_type}: {key} = {v:?} (supported: {allowed:?})"),
        ))
    }
}

/// Names the keys of an error about `text_config`'s fields as
/// `text_config.KEY`.
pub(crate) fn in_text_config(e: Error, path: &Path) -> Error {
    match e {
        Error::BadFile { path: p, msg } if p == path => Error::BadFile {
            path: p,
            msg: msg.replacen("key `", "key `text_config.", 1),
        },
        other => other,
    }
}

/// Refuses `use_bias = true` (expert biases no reference of the family reads).
pub(crate) fn refuse_use_bias(f: &Fields<'_>, model_type: &str) -> Result<()> {
    if f.bool_or("use_bias", false)? {
        return Err(crate::error::unsupported(
            "safetensors",
            format!(
                "{}: {model_type} with use_bias = true (expert biases)",
                f.path.display()
            ),
        ));
    }
    Ok(())
}

/// The router's score function from `key`: "softmax" (the default) or "sigmoid".
pub(crate) fn scoring_key(f: &Fields<'_>, key: &str) -> Result<Scoring> {
    match f.str_opt(key)?.unwrap_or("softmax") {
        "softmax" => Ok(Scoring::Softmax),
        "sigmoid" => Ok(Scoring::Sigmoid),
        other => Err(f.bad(key, "\"softmax\" or \"sigmoid\"", other)),
    }
}

/// Scores, top-k over them (no groups, no bias until the checkpoint's is
/// read), optionally renormalised, × 1: Llama-4, ERNIE-4.5, MiniMax-M2.
pub(crate) fn ungrouped(scoring: Scoring, norm_topk_prob: bool) -> RouterKind {
    RouterKind::Grouped {
        scoring,
        bias: None,
        n_group: 1,
        topk_group: 1,
        // mlx-lm's masking (moot without groups).
        dropped_groups: crate::load::family::SAFETENSORS_DROPPED_GROUPS,
        norm_topk_prob,
        routed_scaling_factor: 1.0,
    }
}
