//! Tensor names → [`MoeBlock`].
//!
//! Under `P = model.layers.N.mlp` (`model.layers.N.block_sparse_moe` for
//! Mixtral), every weight `[out, in]` (`nn.Linear` orientation):
//!
//! | part | mlx-lm | Hugging Face |
//! |---|---|---|
//! | router `[E, H]` | `P.gate.{weight[,scales,biases]}` | `P.gate.weight` |
//! | selection bias `[E]` (DeepSeek-V3, GLM-4-MoE) | `P.gate.e_score_correction_bias` | same |
//! | experts gate / up `[E, I, H]`, down `[E, H, I]` | `P.switch_mlp.{gate,up,down}_proj.{weight[,scales,biases]}` | `P.experts.{e}.{gate,up,down}_proj.weight` (Mixtral `w1`, `w3`, `w2`), stacked here |
//! | shared expert | `P.shared_expert.{gate,up,down}_proj` (Qwen) / `P.shared_experts.*` (DeepSeek, GLM) | same |
//! | shared gate `[1, H]` | `P.shared_expert_gate` | same |
//!
//! Family differences (`config::Names`, set per `model_type` in `config.rs`):
//! the block prefix (`language_model.model.layers` for Kimi-K2.5 and
//! mlx-lm's Qwen3.5, `model.language_model.layers` for Hugging Face's
//! Qwen3.5), the router module, the selection bias's name, the stacked
//! experts module, and Hugging Face experts stored fused (Qwen3.5,
//! Gemma-4 `experts.gate_up_proj` `[E, 2I, H]`, gate rows first, +
//! `experts.down_proj`) or transposed (Llama-4 `experts.gate_up_proj`
//! `[E, H, 2I]`, gate columns first; gpt-oss the same with gate and up
//! columns interleaved; `experts.down_proj` `[E, I, H]`): `hf_experts.rs`.
//! Gemma-4's MoE modules sit in the decoder layer itself (`router`,
//! `experts`, `pre_feedforward_layernorm_2`).
//!
//! A module is quantized (MLX affine: `.scales` and `.biases`; mxfp4 / nvfp4 /
//! mxfp8: `.scales` only) when the config or a `.scales` tensor says so
//! (see `quant`); a Hugging Face module is FP8 block-scaled when its
//! `.weight_scale_inv` exists (see `fp8`); every shape is checked against the
//! sizes in `config.json`. mlx-lm's stacked nvfp4 experts may carry a
//! per-expert `.global_scale` `[E]` (`quantize_model(..., global_scale=True)`),
//! read as the experts' output scale (`expert_scale`); anywhere else one is
//! refused.

use super::config::ModelConfig;
use super::fp8::{self, Fp8Part};
use super::hf_experts::{fused_dense, mxfp4_blocks, transposed_dense, Columns};
use super::SafetensorsCheckpoint;
use crate::dtype::DType;
use crate::error::{invalid, unsupported, Result};
use crate::format::{storage_shapes, QuantWeights, WeightFormat};
use crate::moe::{MoeBlock, MoeBlockParts, SharedExpert};
use crate::ops::act::GateUp;
use crate::ops::ffn::{ExpertBiases, ExpertFfn, ExpertInput, ExpertScales, InputNorm};
use crate::ops::route::{RouterConfig, RouterKind};
use crate::tensor::{Bytes, Tensor};
use std::cell::Cell;

const OP: &str = "moe_block";

/// How the routed experts are stored.
enum Experts {
    /// mlx-lm `switch_mlp`: one `[E, ..]` tensor per projection.
    Stacked,
    /// Hugging Face fused: gate+up `[E, 2I, H]` and down `[E, H, I]` modules.
    Fused(&'static str, &'static str),
    /// Hugging Face: one tensor per expert; names of gate, up, down.
    PerExpert([&'static str; 3]),
    /// Hugging Face transposed: gate+up `[E, H, 2I]` (gate and up columns
    /// as halves, Llama-4, or interleaved, gpt-oss), down `[E, I, H]`.
    Transposed(&'static str, &'static str, bool),
    /// OpenAI's gpt-oss (`quant_method: mxfp4`): `{stacked}.gate_up_proj`
    /// (gate and up rows interleaved) and `{stacked}.down_proj`, each as
    /// `_blocks` / `_scales` (/ `_bias`).
    Mxfp4Blocks,
}

/// One linear module's tensors, resolved and shape-checked.
pub(super) struct Part {
    pub format: WeightFormat,
    /// weight, scales, biases tensor names (scales/biases for affine only;
    /// FP8: weight and `weight_scale_inv`).
    pub names: Vec<String>,
    /// Storage dtype and per-module shape of each of `names` (FP8: of the
    /// scales as expanded, not as stored).
    pub specs: Vec<(DType, Vec<usize>)>,
    /// FP8 block scales: how to expand them.
    pub fp8: Option<Fp8Part>,
    /// nvfp4's per-expert tensor scale `{module}.global_scale` (`[E]`,
    /// mlx-lm's `QuantizedSwitchLinear`), if the module has one.
    pub global_scale: Option<String>,
}

/// Resolves module `module` (`rows × cols`, with a leading expert axis of
/// `lead` if given) and checks every tensor's dtype and shape.
fn part(
    ck: &SafetensorsCheckpoint,
    module: &str,
    lead: Option<usize>,
    rows: usize,
    cols: usize,
    keys: &Keys,
) -> Result<Part> {
    let wname = format!("{module}.weight");
    if let Some(p) = fp8::part(ck, module, lead.is_some(), rows, cols, keys)? {
        return Ok(p);
    }
    // (A family whose router and experts have biases reads them itself:
    // `linear_biases`.)
    if !ck.cfg.linear_bias && ck.get(&format!("{module}.bias")).is_some() {
        return Err(unsupported(
            OP,
            format!(
                "{}: `{module}.bias` (linear layers with a bias)",
                ck.file_of(&wname).display()
            ),
        ));
    }
    let (wd, wshape) = ck.info(&wname)?;
    let sname = format!("{module}.scales");
    let scales_last = ck.get(&sname).map(|r| r.shape.last().copied().unwrap_or(0));
    let w_last = wshape.last().copied().unwrap_or(0);
    let format = ck.cfg.quant.resolve(
        module,
        cols,
        w_last,
        scales_last,
        WeightFormat::Dense(wd),
        ck.file_of(&wname),
    )?;
    let n = lead.unwrap_or(1);
    let (dt, dshape, sshape) =
        storage_shapes(format, n, rows, cols).map_err(|e| ck.bad(&wname, e))?;
    // Without an expert axis the file holds a plain `[rows, ..]` matrix.
    let strip = |s: Vec<usize>| {
        if lead.is_none() {
            s.get(1..).unwrap_or_default().to_vec()
        } else {
            s
        }
    };
    let mut names = vec![wname];
    let mut specs = vec![(dt, strip(dshape))];
    let gname = format!("{module}.global_scale");
    let global_scale = match (ck.get(&gname).is_some(), lead, format) {
        (false, ..) => None,
        (true, Some(_), WeightFormat::MlxFp(crate::format::MlxFpMode::Nvfp4)) => Some(gname),
        (true, lead, format) => {
            let why = if lead.is_none() {
                "only stacked expert projections (mlx-lm's QuantizedSwitchLinear) take one"
            } else {
                "a global scale needs nvfp4 weights (mlx-lm's _quantize_experts refuses other modes)"
            };
            return Err(unsupported(
                OP,
                format!(
                    "{}: `{gname}` beside {format} weights: {why}",
                    ck.file_of(&gname).display()
                ),
            ));
        }
    };
    if let Some(s) = sshape.map(strip) {
        let (sd, _) = ck.info(&sname)?;
        let mut aux = vec![sname];
        if format.has_biases() {
            aux.push(format!("{module}.biases"));
        }
        for name in aux {
            specs.push((sd, s.clone()));
            names.push(name);
        }
    }
    for (name, (dtype, shape)) in names.iter().zip(&specs) {
        let (d, got) = ck.info(name)?;
        if got != shape.as_slice() || d != *dtype {
            let experts = match lead {
                Some(e) => format!("experts `{}` = {e}, ", ck.cfg.keys.experts),
                None => String::new(),
            };
            return Err(ck.bad(
                name,
                format!(
                    "{d} {got:?}, expected {dtype} {shape:?} ({format}; {experts}rows {} = {rows}, columns {} = {cols} in {})",
                    keys.rows,
                    keys.cols,
                    ck.dir.join("config.json").display()
                ),
            ));
        }
    }
    Ok(Part {
        format,
        names,
        specs,
        fp8: None,
        global_scale,
    })
}

/// The per-expert output scale of stacked expert module `p`, from its
/// nvfp4 `global_scale` `gs` (`[E]` f32): `gs[e] / (448 · 6)` in f32, the
/// factor MLX's nvfp4 kernels compute (`inv_scale_enc = *global_scale /
/// (F8E4M3_MAX * F4E2M1_MAX)` in `fp_quantized.h`) and multiply into each
/// group scale (matmul) or into the dot product (matvec) — the same
/// product as scaling the matmul's output ([`crate::ops::ffn`]).
fn expert_scale(ck: &SafetensorsCheckpoint, p: &Part) -> Result<Option<Tensor>> {
    let Some(name) = &p.global_scale else {
        return Ok(None);
    };
    let e = ck.cfg.n_experts;
    let (d, shape) = ck.info(name)?;
    if d != DType::F32 || shape != [e] {
        return Err(ck.bad(
            name,
            format!(
                "{d} {shape:?}, expected f32 [{e}] (`{}` = {e} in config.json)",
                ck.cfg.keys.experts
            ),
        ));
    }
    const ENCODE_MAX: f32 = 448.0 * 6.0; // e4m3 max × e2m1 max
    let v: Vec<f32> = ck
        .load(name)?
        .to_f32_vec()?
        .into_iter()
        .map(|g| g / ENCODE_MAX)
        .collect();
    Tensor::from_f32(&v, &[e], DType::F32).map(Some)
}

/// The `config.json` keys a module's rows and columns come from.
pub(super) struct Keys {
    pub rows: String,
    pub cols: String,
}

fn keys(rows: &str, cols: &str) -> Keys {
    Keys {
        rows: format!("`{rows}`"),
        cols: format!("`{cols}`"),
    }
}

/// A `QuantWeights` over the part's tensors (zero-copy where aligned).
fn weights(
    ck: &SafetensorsCheckpoint,
    p: &Part,
    n: usize,
    rows: usize,
    cols: usize,
) -> Result<QuantWeights> {
    let mut t = p
        .names
        .iter()
        .enumerate()
        .map(|(i, name)| match (&p.fp8, i) {
            (Some(f), 1) => fp8::scales_tensor(ck, name, f),
            _ => ck.load(name),
        })
        .collect::<Result<Vec<Tensor>>>()?
        .into_iter();
    let data = t
        .next()
        .ok_or_else(|| invalid(OP, "part", "a weight tensor", "none"))?;
    let (scales, biases) = (t.next(), t.next());
    QuantWeights::new(p.format, n, rows, cols, data, scales, biases)
        .map_err(|e| ck.bad(&p.names[0], e))
}

/// One tensor per expert, stacked into an owned `[E, ..]` copy.
fn stack(ck: &SafetensorsCheckpoint, parts: &[Part], slot: usize) -> Result<Tensor> {
    let first = parts
        .first()
        .ok_or_else(|| invalid(OP, "experts", "at least one", 0))?;
    let (dtype, shape) = first
        .specs
        .get(slot)
        .ok_or_else(|| invalid(OP, "slot", "a tensor slot", slot))?;
    let per = shape.iter().product::<usize>() * dtype.size();
    let mut buf = Bytes::zeroed(per * parts.len());
    for (dst, p) in buf.make_mut().chunks_exact_mut(per.max(1)).zip(parts) {
        let name = p
            .names
            .get(slot)
            .ok_or_else(|| invalid(OP, "slot", "a tensor slot", slot))?;
        let expanded;
        let src = match (&p.fp8, slot) {
            (Some(f), 1) => {
                expanded = fp8::scales(ck, name, f)?;
                bytemuck::cast_slice::<f32, u8>(&expanded)
            }
            _ => ck.raw(name)?,
        };
        if src.len() != dst.len() {
            return Err(ck.bad(name, format!("{} bytes, expected {}", src.len(), dst.len())));
        }
        dst.copy_from_slice(src);
    }
    let mut full = vec![parts.len()];
    full.extend_from_slice(shape);
    Tensor::from_bytes(*dtype, &full, buf)
}

/// Routed experts of one projection in the Hugging Face layout.
#[allow(clippy::too_many_arguments)]
fn per_expert(
    ck: &SafetensorsCheckpoint,
    prefix: &str,
    name: &str,
    rows: usize,
    cols: usize,
    k: &Keys,
    tick: &dyn Fn(),
) -> Result<QuantWeights> {
    let e = ck.cfg.n_experts;
    let key = ck.cfg.keys.experts;
    let beyond = format!("{prefix}.experts.{e}.{name}.weight");
    if ck.get(&beyond).is_some() {
        return Err(ck.bad(
            &beyond,
            format!(
                "present, but `{key}` = {e} in {} (experts 0..{e})",
                ck.dir.join("config.json").display()
            ),
        ));
    }
    let mut parts = Vec::with_capacity(e);
    for j in 0..e {
        let module = format!("{prefix}.experts.{j}.{name}");
        if ck.get(&format!("{module}.weight")).is_none() {
            return Err(ck.missing(
                &format!("{module}.weight"),
                &format!("`{key}` = {e} in config.json"),
            ));
        }
        let p = part(ck, &module, None, rows, cols, k)?;
        if let Some(first) = parts.first() {
            let f: &Part = first;
            if p.format != f.format || p.specs != f.specs {
                return Err(ck.bad(
                    &p.names[0],
                    format!("stored as {}, but expert 0 as {}", p.format, f.format),
                ));
            }
        }
        parts.push(p);
        tick();
    }
    let first = parts
        .first()
        .ok_or_else(|| invalid(OP, "n_experts", "> 0", 0))?;
    let data = stack(ck, &parts, 0)?;
    let slot = |i: usize| -> Result<Option<Tensor>> {
        (first.names.len() > i)
            .then(|| stack(ck, &parts, i))
            .transpose()
    };
    let aux = (slot(1)?, slot(2)?);
    QuantWeights::new(first.format, e, rows, cols, data, aux.0, aux.1)
        .map_err(|err| ck.bad(&first.names[0], err))
}

fn detect(ck: &SafetensorsCheckpoint, prefix: &str) -> Result<Experts> {
    let names = &ck.cfg.names;
    let stacked = format!("{prefix}.{}.gate_proj.weight", names.stacked);
    if ck.get(&stacked).is_some() {
        return Ok(Experts::Stacked);
    }
    let blocks = format!("{prefix}.{}.gate_up_proj_blocks", names.stacked);
    if ck.cfg.quant.hf_mxfp4 && ck.get(&blocks).is_some() {
        return Ok(Experts::Mxfp4Blocks);
    }
    if let Some((gate_up, down)) = names.fused {
        if ck.get(&format!("{prefix}.{gate_up}")).is_some() {
            return Ok(Experts::Fused(gate_up, down));
        }
    }
    if let Some((gate_up, down, interleaved)) = names.transposed {
        if ck.get(&format!("{prefix}.{gate_up}")).is_some() {
            return Ok(Experts::Transposed(gate_up, down, interleaved));
        }
    }
    for names in [["gate_proj", "up_proj", "down_proj"], ["w1", "w3", "w2"]] {
        if ck
            .get(&format!("{prefix}.experts.0.{}.weight", names[0]))
            .is_some()
        {
            return Ok(Experts::PerExpert(names));
        }
    }
    Err(ck.missing(
        &stacked,
        &format!(
            "mlx-lm layout; the Hugging Face `{prefix}.experts.0.gate_proj.weight` is absent too"
        ),
    ))
}

/// A linear layer's `bias` tensor `name` (float `shape`) as an f32 tensor;
/// `what` names the config keys of its shape for the message.
fn linear_bias(
    ck: &SafetensorsCheckpoint,
    name: &str,
    shape: &[usize],
    what: &str,
) -> Result<Tensor> {
    let (d, got) = ck.info(name)?;
    if !d.is_float() || got != shape {
        return Err(ck.bad(
            name,
            format!("{d} {got:?}, expected a float {shape:?} ({what} in config.json)"),
        ));
    }
    let v = ck.load(name)?.to_f32_vec()?;
    Tensor::from_f32(&v, shape, crate::DType::F32)
}

/// The biases of the router (`{router}.bias`) and of the stacked experts'
/// projections (`{module}.{stacked}.{gate,up,down}_proj.bias`, or OpenAI's
/// names in its layout `experts`), gpt-oss's.
fn linear_biases(
    ck: &SafetensorsCheckpoint,
    module: &str,
    router: &str,
    experts: &Experts,
) -> Result<ExpertBiases> {
    let c = &ck.cfg;
    let (e, h, i) = (c.n_experts, c.hidden, c.intermediate);
    let (ke, ki) = (c.keys.experts, c.keys.intermediate);
    let ei = [e, i];
    let ei_keys = format!("`{ke}`, `{ki}`");
    let eh_keys = format!("`{ke}`, `hidden_size`");
    let router = Some(linear_bias(
        ck,
        &format!("{router}.bias"),
        &[e],
        &format!("`{ke}`"),
    )?);
    if let Experts::Mxfp4Blocks | Experts::Transposed(..) = experts {
        // OpenAI's names; gate and up interleaved as their weights' rows
        // (or columns, in the unquantized transposed layout).
        let experts = format!("{module}.{}", c.names.stacked);
        let gu_keys = format!("`{ke}`, 2 × `{ki}`");
        let gu = linear_bias(
            ck,
            &format!("{experts}.gate_up_proj_bias"),
            &[e, 2 * i],
            &gu_keys,
        )?
        .to_f32_vec()?;
        let half = |which: usize| -> Result<Option<Tensor>> {
            let v: Vec<f32> = gu.iter().skip(which).step_by(2).copied().collect();
            Tensor::from_f32(&v, &ei, DType::F32).map(Some)
        };
        let down = format!("{experts}.down_proj_bias");
        return Ok(ExpertBiases {
            router,
            gate: half(0)?,
            up: half(1)?,
            down: Some(linear_bias(ck, &down, &[e, h], &eh_keys)?),
        });
    }
    let proj = |name: &str| format!("{module}.{}.{name}.bias", c.names.stacked);
    Ok(ExpertBiases {
        router,
        gate: Some(linear_bias(ck, &proj("gate_proj"), &ei, &ei_keys)?),
        up: Some(linear_bias(ck, &proj("up_proj"), &ei, &ei_keys)?),
        down: Some(linear_bias(ck, &proj("down_proj"), &[e, h], &eh_keys)?),
    })
}

/// The router's `e_score_correction_bias` as f32.
fn bias(ck: &SafetensorsCheckpoint, prefix: &str, e: usize) -> Result<Vec<f32>> {
    let name = format!("{prefix}.{}", ck.cfg.names.bias);
    vector(ck, &name, e, ck.cfg.keys.experts)
}

/// A float vector `name` of `n` values (`[n]`, or `[1, n]` as ERNIE's
/// bias) as f32; `key` names the config key of `n`.
fn vector(ck: &SafetensorsCheckpoint, name: &str, n: usize, key: &str) -> Result<Vec<f32>> {
    let (d, shape) = ck.info(name)?;
    if !d.is_float() || (shape != [n] && shape != [1, n]) {
        return Err(ck.bad(
            name,
            format!("{d} {shape:?}, expected a float [{n}] (`{key}` = {n} in config.json)"),
        ));
    }
    ck.load(name)?.to_f32_vec()
}

/// Gemma-4's router norm (`router.scale` · H^-½, rounded to the tensor's
/// dtype as mlx-lm's product is), its per-expert scale and the experts'
/// `pre_feedforward_layernorm_2`, under the decoder layer `p`.
fn gemma4_parts(ck: &SafetensorsCheckpoint, p: &str, eps: f32) -> Result<(ExpertInput, Vec<f32>)> {
    let (e, h) = (ck.cfg.n_experts, ck.cfg.hidden);
    let scale_name = format!("{p}.router.scale");
    let (d, _) = ck.info(&scale_name)?;
    let root = (h as f64).powf(-0.5) as f32;
    let scaled: Vec<f32> = vector(ck, &scale_name, h, "hidden_size")?
        .into_iter()
        .map(|s| s * root)
        .collect();
    let rounded = Tensor::from_f32(&scaled, &[h], d)?.to_f32_vec()?;
    let pre2 = vector(
        ck,
        &format!("{p}.pre_feedforward_layernorm_2.weight"),
        h,
        "hidden_size",
    )?;
    let per_expert = vector(
        ck,
        &format!("{p}.router.per_expert_scale"),
        e,
        ck.cfg.keys.experts,
    )?;
    Ok((
        ExpertInput {
            router_norm: Some(InputNorm::new(&rounded, eps)?),
            expert_norm: Some(InputNorm::new(&pre2, eps)?),
            weight_before: false,
        },
        per_expert,
    ))
}

fn check_layer(c: &ModelConfig, layer: usize) -> Result<()> {
    if layer >= c.n_layers {
        return Err(invalid(
            OP,
            "layer",
            format!("a block index < num_hidden_layers = {}", c.n_layers),
            layer,
        ));
    }
    if !c.moe_layers.contains(&layer) {
        let list = if c.moe_layers.len() > 16 {
            format!(
                "{:?} … ({} layers)",
                &c.moe_layers[..16],
                c.moe_layers.len()
            )
        } else {
            format!("{:?}", c.moe_layers)
        };
        return Err(invalid(
            OP,
            "layer",
            format!(
                "an MoE layer of this {} checkpoint (MoE layers: {list})",
                c.model_type
            ),
            format!("{layer}, a dense block ({})", c.dense_rule),
        ));
    }
    Ok(())
}

/// Builds the MoE block of `layer`.
pub(super) fn build(
    ck: &SafetensorsCheckpoint,
    layer: usize,
    progress: &dyn Fn(usize, usize),
) -> Result<MoeBlock> {
    check_layer(&ck.cfg, layer)?;
    // The block's own sizes where the config lists them per layer (Hunyuan).
    let c = &*ck.cfg.at_layer(layer);
    let p = c
        .names
        .moe_module(layer, c.block, &|n: &str| ck.get(n).is_some());
    let (e, h, i) = (c.n_experts, c.hidden, c.intermediate);
    let experts = detect(ck, &p)?;
    let shared_parts = c.shared.as_ref().map_or(0, |s| 3 + usize::from(s.gated));
    let expert_parts = match experts {
        Experts::Stacked => 3,
        Experts::Fused(..) | Experts::Mxfp4Blocks | Experts::Transposed(..) => 2,
        Experts::PerExpert(_) => 3 * e,
    };
    let total = 1 + expert_parts + shared_parts;
    let done = Cell::new(0);
    let tick = || {
        done.set(done.get() + 1);
        progress(done.get(), total);
    };

    let ks = &c.keys;
    let router_keys = keys(ks.experts, "hidden_size");
    let router_module = c.names.router_module(&p, &|n: &str| ck.get(n).is_some());
    let router_part = part(ck, &router_module, None, e, h, &router_keys)?;
    let router_weight = weights(ck, &router_part, 1, e, h)?;
    let mut kind = c.router.clone();
    if let RouterKind::Grouped { bias: b, .. } = &mut kind {
        let present = || ck.get(&format!("{p}.{}", c.names.bias)).is_some();
        if c.needs_bias || (c.bias_if_present && present()) {
            *b = Some(bias(ck, &p, e)?);
        }
    }
    let mut input = ExpertInput {
        weight_before: c.weight_before,
        ..Default::default()
    };
    if let Some(eps) = c.gemma4_eps {
        let (inp, scale) = gemma4_parts(ck, &p, eps)?;
        input = inp;
        kind = RouterKind::Gemma4 {
            per_expert_scale: scale,
        };
    }
    tick();
    let dims = [(i, h), (i, h), (h, i)];
    let ih = keys(ks.intermediate, "hidden_size");
    let hi = keys("hidden_size", ks.intermediate);
    let dim_keys = [&ih, &ih, &hi];
    // nvfp4's per-expert global scales of the stacked experts (mlx-lm).
    let mut scale = ExpertScales::default();
    let (gate_up, down) = match experts {
        Experts::Stacked => {
            let mut w = Vec::with_capacity(3);
            let mut s = Vec::with_capacity(3);
            let names = ["gate_proj", "up_proj", "down_proj"];
            for ((name, (rows, cols)), k) in names.iter().zip(dims).zip(dim_keys) {
                let module = format!("{p}.{}.{name}", c.names.stacked);
                let part = part(ck, &module, Some(e), rows, cols, k)?;
                w.push(weights(ck, &part, e, rows, cols)?);
                s.push(expert_scale(ck, &part)?);
                tick();
            }
            let [gate, up, down] = to3(w)?;
            if let [g, u, d] = &mut s[..] {
                scale = ExpertScales {
                    gate: g.take(),
                    up: u.take(),
                    down: d.take(),
                };
            }
            (GateUp::separate(gate, up)?, down)
        }
        Experts::Fused(gu, dn) => {
            let gu_keys = Keys {
                rows: format!("2 × `{}`", ks.intermediate),
                cols: "`hidden_size`".into(),
            };
            let w = fused_dense(ck, &format!("{p}.{gu}"), [e, 2 * i, h], &gu_keys)?;
            tick();
            let d = fused_dense(ck, &format!("{p}.{dn}"), [e, h, i], &hi)?;
            tick();
            (GateUp::fused(w)?, d)
        }
        Experts::Transposed(gu, dn, interleaved) => {
            let split = if interleaved {
                Columns::Interleaved
            } else {
                Columns::Halves
            };
            let [gate, up] = to_n(transposed_dense(
                ck,
                &format!("{p}.{gu}"),
                [e, h, 2 * i],
                split,
            )?)?;
            tick();
            let [down] = to_n(transposed_dense(
                ck,
                &format!("{p}.{dn}"),
                [e, i, h],
                Columns::Whole,
            )?)?;
            tick();
            (GateUp::separate(gate, up)?, down)
        }
        Experts::Mxfp4Blocks => {
            let experts = format!("{p}.{}", c.names.stacked);
            let gu = format!("{experts}.gate_up_proj");
            let [gate, up] = to_n(mxfp4_blocks(ck, &gu, [e, 2 * i, h], true)?)?;
            tick();
            let dn = format!("{experts}.down_proj");
            let [down] = to_n(mxfp4_blocks(ck, &dn, [e, h, i], false)?)?;
            tick();
            (GateUp::separate(gate, up)?, down)
        }
        Experts::PerExpert(names) => {
            let mut w = Vec::with_capacity(3);
            for ((name, (rows, cols)), k) in names.iter().zip(dims).zip(dim_keys) {
                w.push(per_expert(ck, &p, name, rows, cols, k, &tick)?);
            }
            let [gate, up, down] = to3(w)?;
            (GateUp::separate(gate, up)?, down)
        }
    };
    let shared = match &c.shared {
        None => None,
        Some(s) => {
            let si = s.intermediate;
            let mut w = Vec::with_capacity(3);
            let sih = keys(ks.shared, "hidden_size");
            let hsi = keys("hidden_size", ks.shared);
            let names = ["gate_proj", "up_proj", "down_proj"];
            let shapes = [(si, h), (si, h), (h, si)];
            for ((name, (rows, cols)), k) in names.iter().zip(shapes).zip([&sih, &sih, &hsi]) {
                let module = format!("{p}.{}.{name}", s.prefix);
                w.push(weights(
                    ck,
                    &part(ck, &module, None, rows, cols, k)?,
                    1,
                    rows,
                    cols,
                )?);
                tick();
            }
            let [sg, su, sd] = to3(w)?;
            let gate = if s.gated {
                let g = weights(
                    ck,
                    &part(
                        ck,
                        &format!("{p}.shared_expert_gate"),
                        None,
                        1,
                        h,
                        &Keys {
                            rows: "1".into(),
                            cols: "`hidden_size`".into(),
                        },
                    )?,
                    1,
                    1,
                    h,
                )?;
                tick();
                Some(g)
            } else {
                None
            };
            Some(SharedExpert {
                gate_up: GateUp::separate(sg, su)?,
                down: sd,
                gate,
            })
        }
    };
    let ffn = ExpertFfn {
        act: c.glu,
        bias: if c.linear_bias {
            if !matches!(
                experts,
                Experts::Stacked | Experts::Mxfp4Blocks | Experts::Transposed(..)
            ) {
                return Err(ck.missing(
                    &format!("{p}.{}.gate_proj.weight", c.names.stacked),
                    "mlx-lm's layout, or OpenAI's *_blocks with quant_method mxfp4: the layouts read with expert biases",
                ));
            }
            linear_biases(ck, &p, &router_module, &experts)?
        } else {
            ExpertBiases::default()
        },
        scale,
        input,
    };
    MoeBlock::new(MoeBlockParts {
        router: RouterConfig {
            kind,
            n_experts: e,
            top_k: c.top_k,
        },
        router_weight,
        gate_up,
        down,
        shared,
        ffn,
    })
}

fn to_n<const N: usize>(v: Vec<QuantWeights>) -> Result<[QuantWeights; N]> {
    let n = v.len();
    v.try_into().map_err(|_| invalid(OP, "projections", N, n))
}

fn to3(v: Vec<QuantWeights>) -> Result<[QuantWeights; 3]> {
    let n = v.len();
    v.try_into().map_err(|_| invalid(OP, "projections", 3, n))
}
