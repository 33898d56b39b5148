//! mlx-lm quantization settings and how one module's format is resolved.
//!
//! `config.json` carries `"quantization": {"group_size": 64, "bits": 4,
//! "mode": "affine", "<module path>": {...} | false, ...}` (mlx-lm's
//! `quantize_model` also copies it to `quantization_config`). A module path
//! such as `model.layers.3.mlp.gate` maps to a dict of `to_quantized` params
//! (missing keys take mlx's affine defaults: group 64, 4 bits) or to `false`
//! (left unquantized) or `true` (the top-level params).
//!
//! Resolution follows mlx-lm's `load_model` (`class_predicate`): a module named
//! in the map uses its entry; any other module is quantized iff
//! `<path>.scales` exists, with group size and bits inferred from the shapes
//! (`group_size = in / scales.shape[-1]`, `bits = weight.shape[-1] · 32 / in`,
//! mlx-lm's `infer_quant_config`). Modes: `affine`, and MLX's microscaled
//! `mxfp4`, `nvfp4` (a stacked expert module's `global_scale` is read by
//! `layout.rs` as the experts' output scale) and `mxfp8`, whose bits and
//! group size must be the mode's (4/32, 4/16, 8/32).
//!
//! Hugging Face FP8 block-scaled checkpoints (DeepSeek-V3 / R1, Kimi-K2,
//! MiniMax-M2, Qwen3 `-FP8`) instead carry `"quantization_config":
//! {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
//! "weight_block_size": [128, 128]}` ([`Fp8Config`]): a module is FP8 iff
//! its `<path>.weight_scale_inv` exists (the router and norms stay bf16 /
//! f32: DeepSeek-V3 stores `gate.weight` unquantized, MiniMax-M2 lists it in
//! `modules_to_not_convert`). `fmt` must be e4m3 (`"e4m3"` or
//! `"float8_e4m3fn"`), `activation_scheme` `"dynamic"` when present (moekit
//! multiplies the dequantized weights with the activations as they are,
//! as mlx-lm and transformers' dequantizing path do; the reference CUDA
//! kernels' dynamic fp8 activation quantization is not reproduced),
//! `weight_block_size` two positive integers whose second is a multiple of
//! 32.

use super::config::Fields;
use crate::error::{unsupported, Error, Result};
use crate::format::{AffineParams, MlxFpMode, WeightFormat};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::path::Path;

/// Quantization parameters of a module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Params {
    /// Bits per weight.
    pub bits: u32,
    /// Weights per group.
    pub group_size: usize,
    /// mlx mode (`affine`, `mxfp4`, ...).
    pub mode: String,
}

/// `quantization_config` of an FP8 block-scaled checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fp8Config {
    /// `weight_block_size`: rows and columns of a scale block.
    pub block: (usize, usize),
}

/// The checkpoint `fmt` names of e4m3fn.
const FP8_FMTS: [&str; 2] = ["e4m3", "float8_e4m3fn"];

impl Fp8Config {
    fn parse(f: &Fields<'_>, key: &str) -> Result<Fp8Config> {
        let k = |name: &str| format!("{key}.{name}");
        if let Some(fmt) = f.str_opt("fmt")? {
            if !FP8_FMTS.contains(&fmt) {
                return Err(f.bad(
                    &k("fmt"),
                    "\"e4m3\" or \"float8_e4m3fn\"",
                    format!("{fmt:?}"),
                ));
            }
        }
        if let Some(a) = f.str_opt("activation_scheme")? {
            if a != "dynamic" {
                return Err(f.bad(
                    &k("activation_scheme"),
                    "\"dynamic\" (static activation scales are not supported)",
                    format!("{a:?}"),
                ));
            }
        }
        let want = "[block_n, block_k]: two positive integers, block_k a multiple of 32 (DeepSeek-V3: [128, 128])";
        let bk = k("weight_block_size");
        let Some(v) = f.obj.get("weight_block_size").filter(|v| !v.is_null()) else {
            return Err(f.bad(
                &bk,
                want,
                "no value (per-tensor fp8 scales are not supported)",
            ));
        };
        let dims: Option<Vec<usize>> = v.as_array().map(|a| {
            a.iter()
                .map(|x| {
                    x.as_u64()
                        .and_then(|n| usize::try_from(n).ok())
                        .unwrap_or(0)
                })
                .collect()
        });
        match dims.as_deref() {
            Some(&[bn, bkk])
                if bn > 0 && bkk > 0 && bkk % 32 == 0 && bn <= 1 << 20 && bkk <= 1 << 20 =>
            {
                Ok(Fp8Config { block: (bn, bkk) })
            }
            _ => Err(f.bad(&bk, want, v)),
        }
    }
}

/// The quantization section of a config.
#[derive(Debug, Clone, Default)]
pub(crate) struct QuantConfig {
    /// FP8 block scales (`quant_method: "fp8"`); then nothing else is set.
    pub fp8: Option<Fp8Config>,
    /// `quant_method: "mxfp4"` (OpenAI's gpt-oss checkpoints): the experts as
    /// `*_blocks` / `*_scales` (the layout reads them), every other module
    /// unquantized; then nothing else is set.
    pub hf_mxfp4: bool,
    /// Top-level params, if the section has them.
    pub default: Option<Params>,
    /// Per-module entries; `None` means `false` (unquantized).
    pub overrides: HashMap<String, Option<Params>>,
}

const TOP_KEYS: [&str; 4] = ["group_size", "bits", "mode", "quant_method"];

fn params(f: &Fields<'_>, fallback: (u32, usize)) -> Result<Params> {
    let bits = f.usize_or("bits", 64, fallback.0 as usize)? as u32;
    let group_size = f.usize_or("group_size", 1 << 20, fallback.1)?;
    let mode = f.str_opt("mode")?.unwrap_or("affine").to_string();
    Ok(Params {
        bits,
        group_size,
        mode,
    })
}

impl QuantConfig {
    /// Reads `quantization` (or, without it, `quantization_config`).
    pub fn parse(f: &Fields<'_>) -> Result<QuantConfig> {
        let (key, section) = match (f.obj.get("quantization"), f.obj.get("quantization_config")) {
            (Some(q), _) if !q.is_null() => ("quantization", q),
            (_, Some(q)) if !q.is_null() => ("quantization_config", q),
            _ => return Ok(QuantConfig::default()),
        };
        let Value::Object(obj) = section else {
            return Err(f.bad(key, "an object", section));
        };
        let sf = Fields { path: f.path, obj };
        if let Some(m) = obj.get("quant_method") {
            if m.as_str() == Some("fp8") {
                return Ok(QuantConfig {
                    fp8: Some(Fp8Config::parse(&sf, key)?),
                    ..QuantConfig::default()
                });
            }
            if m.as_str() == Some("mxfp4") {
                return Ok(QuantConfig {
                    hf_mxfp4: true,
                    ..QuantConfig::default()
                });
            }
            return Err(unsupported(
                "safetensors",
                format!(
                    "{}: {key}.quant_method = {m} (supported: \"fp8\" with block scales, \"mxfp4\" (gpt-oss experts as *_blocks / *_scales), or mlx quantization without a quant_method)",
                    f.path.display()
                ),
            ));
        }
        let default = if obj.contains_key("bits") || obj.contains_key("group_size") {
            Some(params(&sf, (4, 64))?)
        } else {
            None
        };
        let mut overrides = HashMap::new();
        for (name, v) in obj.iter().filter(|(k, _)| !TOP_KEYS.contains(&k.as_str())) {
            let entry = match v {
                Value::Bool(false) => None,
                Value::Bool(true) => match &default {
                    Some(d) => Some(d.clone()),
                    None => {
                        return Err(f.bad(
                            &format!("{key}.{name}"),
                            "false or params (no top-level bits/group_size)",
                            v,
                        ))
                    }
                },
                Value::Object(m) => Some(module_params(f, key, name, m)?),
                // Other scalars (e.g. metadata numbers) are not module entries.
                _ => continue,
            };
            overrides.insert(name.clone(), entry);
        }
        Ok(QuantConfig {
            fp8: None,
            hf_mxfp4: false,
            default,
            overrides,
        })
    }

    /// The format of module `path` (`<path>.weight` has last dim `w_last`,
    /// logical input size `cols`); `scales_last` is the last dim of
    /// `<path>.scales` if that tensor exists; `dense` the weight's dtype
    /// format for an unquantized module. `file` names errors.
    pub fn resolve(
        &self,
        path: &str,
        cols: usize,
        w_last: usize,
        scales_last: Option<usize>,
        dense: WeightFormat,
        file: &Path,
    ) -> Result<WeightFormat> {
        let bad = |msg: String| Error::BadFile {
            path: file.to_path_buf(),
            msg,
        };
        let p = match (self.overrides.get(path), scales_last) {
            (Some(None), None) | (None, None) => return Ok(dense),
            (Some(None), Some(_)) => {
                return Err(bad(format!("the quantization config says `{path}`: false, but tensor `{path}.scales` exists")))
            }
            (Some(Some(p)), Some(_)) => p.clone(),
            (Some(Some(p)), None) => {
                return Err(bad(format!(
                    "the quantization config gives `{path}` {} bits, group {}, but tensor `{path}.scales` is missing",
                    p.bits, p.group_size
                )))
            }
            (None, Some(s)) => {
                let group_size = if s > 0 && cols.is_multiple_of(s) { cols / s } else { 0 };
                let bits = if cols > 0 && (w_last * 32).is_multiple_of(cols) { (w_last * 32 / cols) as u32 } else { 0 };
                if group_size == 0 || bits == 0 {
                    return Err(bad(format!(
                        "tensor `{path}.weight` (last dim {w_last}) and `{path}.scales` (last dim {s}) do not fit any affine quantization of {cols} input columns"
                    )));
                }
                let mode = self.default.as_ref().map_or("affine", |d| d.mode.as_str()).to_string();
                Params { bits, group_size, mode }
            }
        };
        let f = if p.mode == "affine" {
            WeightFormat::Affine(AffineParams {
                bits: p.bits,
                group_size: p.group_size,
            })
        } else if let Some(m) = MlxFpMode::from_mlx_name(&p.mode) {
            m.check("moe_block", p.bits, p.group_size)
                .map_err(|e| bad(format!("`{path}` (mode {}): {e}", p.mode)))?;
            WeightFormat::MlxFp(m)
        } else {
            return Err(unsupported(
                "moe_block",
                format!(
                    "{}: `{path}` uses quantization mode {:?} (affine, mxfp4, nvfp4 or mxfp8)",
                    file.display(),
                    p.mode
                ),
            ));
        };
        f.validate("moe_block")
            .map_err(|e| bad(format!("`{path}`: {e}")))?;
        Ok(f)
    }
}

fn module_params(f: &Fields<'_>, key: &str, name: &str, m: &Map<String, Value>) -> Result<Params> {
    params(
        &Fields {
            path: f.path,
            obj: m,
        },
        (4, 64),
    )
    .map_err(|e| match e {
        Error::BadFile { path, msg } => Error::BadFile {
            path,
            msg: format!("{key}.{name}: {msg}"),
        },
        other => other,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    fn cfg(text: &str) -> Result<QuantConfig> {
        let v: Value = serde_json::from_str(text).unwrap();
        QuantConfig::parse(&Fields {
            path: Path::new("config.json"),
            obj: v.as_object().unwrap(),
        })
    }

    const DENSE: WeightFormat = WeightFormat::Dense(DType::Bf16);
    fn aff(bits: u32, group_size: usize) -> WeightFormat {
        WeightFormat::Affine(AffineParams { bits, group_size })
    }

    #[test]
    fn overrides_false_true_and_inference() {
        let q = cfg(
            r#"{"quantization":{"group_size":64,"bits":4,"mode":"affine",
            "a.gate":{"group_size":64,"bits":8},"a.off":false,"a.on":true}}"#,
        )
        .unwrap();
        let f = Path::new("m.safetensors");
        assert_eq!(
            q.resolve("a.gate", 64, 16, Some(1), DENSE, f).unwrap(),
            aff(8, 64)
        );
        assert_eq!(
            q.resolve("a.on", 64, 8, Some(1), DENSE, f).unwrap(),
            aff(4, 64)
        );
        assert_eq!(q.resolve("a.off", 64, 64, None, DENSE, f).unwrap(), DENSE);
        assert!(q.resolve("a.off", 64, 8, Some(1), DENSE, f).is_err());
        assert!(q.resolve("a.gate", 64, 64, None, DENSE, f).is_err());
        // Not named: inferred from shapes (mlx-lm's infer_quant_config).
        assert_eq!(
            q.resolve("b", 128, 12, Some(4), DENSE, f).unwrap(),
            aff(3, 32)
        );
        assert_eq!(q.resolve("b", 128, 128, None, DENSE, f).unwrap(), DENSE);
        assert!(q.resolve("b", 100, 7, Some(3), DENSE, f).is_err());
    }

    #[test]
    fn other_methods_and_modes_are_unsupported() {
        assert!(cfg(r#"{"quantization_config":{"quant_method":"gptq"}}"#).is_err());
        let q = cfg(r#"{"quantization":{"group_size":32,"bits":4,"mode":"mxint4"}}"#).unwrap();
        let e = q
            .resolve("x", 64, 8, Some(2), DENSE, Path::new("f"))
            .unwrap_err();
        assert!(e.to_string().contains("mxint4"), "{e}");
        assert!(cfg(r#"{"quantization_config":{"group_size":64,"bits":4}}"#)
            .unwrap()
            .default
            .is_some());
        assert!(cfg(r#"{}"#).unwrap().default.is_none());
    }

    #[test]
    fn mlx_fp_modes_resolve_with_their_own_bits_and_group() {
        let f = Path::new("f");
        for (mode, bits, g, m) in [
            ("mxfp4", 4, 32, MlxFpMode::Mxfp4),
            ("nvfp4", 4, 16, MlxFpMode::Nvfp4),
            ("mxfp8", 8, 32, MlxFpMode::Mxfp8),
        ] {
            let text =
                format!(r#"{{"quantization":{{"group_size":{g},"bits":{bits},"mode":"{mode}"}}}}"#);
            let q = cfg(&text).unwrap();
            let w_last = 64 * bits as usize / 32;
            assert_eq!(
                q.resolve("x", 64, w_last, Some(64 / g), DENSE, f).unwrap(),
                WeightFormat::MlxFp(m)
            );
            // An override with the wrong group size for the mode names both.
            let text = format!(
                r#"{{"quantization":{{"group_size":{g},"bits":{bits},"mode":"{mode}","y":{{"group_size":64,"bits":{bits},"mode":"{mode}"}}}}}}"#
            );
            let e = cfg(&text)
                .unwrap()
                .resolve("y", 128, 128 * bits as usize / 32, Some(2), DENSE, f)
                .unwrap_err()
                .to_string();
            assert!(e.contains("group_size") && e.contains(mode), "{e}");
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod fp8_tests {
    use super::*;

    fn cfg(text: &str) -> Result<QuantConfig> {
        let v: Value = serde_json::from_str(text).unwrap();
        QuantConfig::parse(&Fields {
            path: Path::new("config.json"),
            obj: v.as_object().unwrap(),
        })
    }

    #[test]
    fn fp8_configs_parse_and_errors_name_the_key() {
        let ds = r#"{"quantization_config":{"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}}"#;
        assert_eq!(cfg(ds).unwrap().fp8, Some(Fp8Config { block: (128, 128) }));
        let mm = r#"{"quantization_config":{"quant_method":"fp8","fmt":"float8_e4m3fn","activation_scheme":"dynamic","weight_block_size":[128,128],"modules_to_not_convert":["gate","e_score_correction_bias","lm_head"]}}"#;
        let q = cfg(mm).unwrap();
        assert_eq!(q.fp8, Some(Fp8Config { block: (128, 128) }));
        assert!(q.overrides.is_empty() && q.default.is_none());
        for (text, key, want) in [
            (
                r#""fmt":"e5m2","weight_block_size":[128,128]"#,
                "quantization_config.fmt",
                "e4m3",
            ),
            (
                r#""activation_scheme":"static","weight_block_size":[128,128]"#,
                "quantization_config.activation_scheme",
                "dynamic",
            ),
            (
                r#""weight_block_size":[128,100]"#,
                "quantization_config.weight_block_size",
                "multiple of 32",
            ),
            (
                r#""weight_block_size":[128]"#,
                "quantization_config.weight_block_size",
                "[block_n, block_k]",
            ),
            (
                r#""weight_block_size":[0,128]"#,
                "quantization_config.weight_block_size",
                "positive",
            ),
            (
                r#""fmt":"e4m3""#,
                "quantization_config.weight_block_size",
                "per-tensor",
            ),
        ] {
            let t = format!(r#"{{"quantization_config":{{"quant_method":"fp8",{text}}}}}"#);
            let e = cfg(&t).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(want), "{t}: {e}");
        }
        let e = cfg(r#"{"quantization_config":{"quant_method":"awq"}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("awq") && e.contains("fp8"), "{e}");
    }
}
