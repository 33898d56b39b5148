//! GGUF tensors → the weights of one MoE block: shape checks, zero-copy
//! [`QuantWeights`] views, stacking of legacy per-expert tensors, and
//! assembly of the [`MoeBlock`] (routing and shared-expert rules come from
//! [`super::arch`]).

use super::arch::{bad, router_config, shared_tensors, unsupported, ArchRule};
use super::file::{GgufFile, TensorInfo};
use crate::error::{Error, Result};
use crate::format::{GgmlType, QuantWeights, WeightFormat};
use crate::moe::{MoeBlock, MoeBlockParts, SharedExpert};
use crate::ops::act::GateUp;
use crate::tensor::{Bytes, Tensor};
use crate::DType;

/// The tensor `name`, or an error naming it and the block that needs it.
pub(crate) fn need<'a>(file: &'a GgufFile, name: &str, layer: usize) -> Result<&'a TensorInfo> {
    file.tensor(name).ok_or_else(|| {
        bad(
            file,
            format!("missing tensor `{name}` (needed by the MoE layer of block {layer})"),
        )
    })
}

/// `ne` padded with 1s to 3 dims; `None` if a dimension past the third is not 1.
fn ne3(t: &TensorInfo) -> Option<[usize; 3]> {
    let mut d = [1usize; 3];
    for (i, &n) in t.ne.iter().enumerate() {
        match d.get_mut(i) {
            Some(slot) => *slot = n,
            None if n == 1 => {}
            None => return None,
        }
    }
    Some(d)
}

fn check_dims(file: &GgufFile, t: &TensorInfo, want: [usize; 3]) -> Result<()> {
    if ne3(t) == Some(want) {
        Ok(())
    } else {
        Err(bad(
            file,
            format!(
                "tensor `{}`: ne {:?}, want {:?} (innermost first)",
                t.name, t.ne, want
            ),
        ))
    }
}

fn format_of(file: &GgufFile, t: &TensorInfo) -> Result<WeightFormat> {
    t.ty.weight_format().ok_or_else(|| {
        let names: Vec<&str> = GgmlType::ALL.iter().map(|g| g.name()).collect();
        unsupported(
            file,
            format!(
                "tensor `{}` has type {} (ggml type {}), which moekit cannot run (supported: f32, f16, bf16, {})",
                t.name,
                t.ty.name,
                t.ty.id,
                names.join(", ")
            ),
        )
    })
}

/// Wraps `bytes` holding `[E, rows, cols]` of `format` as [`QuantWeights`].
fn wrap(
    file: &GgufFile,
    name: &str,
    format: WeightFormat,
    dims: [usize; 3],
    bytes: Bytes,
) -> Result<QuantWeights> {
    let [e, rows, cols] = dims;
    let context = |err: Error| bad(file, format!("tensor `{name}`: {err}"));
    let (dtype, inner) = match format {
        WeightFormat::Dense(d) => (d, cols),
        WeightFormat::Ggml(g) => (DType::U8, cols / g.block_size() * g.type_size()),
        other => {
            return Err(unsupported(
                file,
                format!("tensor `{name}`: format {other}"),
            ))
        }
    };
    let data = Tensor::from_bytes(dtype, &[e, rows, inner], bytes).map_err(context)?;
    QuantWeights::new(format, e, rows, cols, data, None, None).map_err(context)
}

/// The tensor `t` as `[e, rows, cols]` weights (`ne = [cols, rows, e]`), zero-copy.
pub(crate) fn weights(
    file: &GgufFile,
    t: &TensorInfo,
    e: usize,
    rows: usize,
    cols: usize,
) -> Result<QuantWeights> {
    check_dims(file, t, [cols, rows, e])?;
    let format = format_of(file, t)?;
    wrap(
        file,
        &t.name,
        format,
        [e, rows, cols],
        file.tensor_bytes(t)?,
    )
}

/// Stacks the legacy per-expert tensors `blk.L.ffn_<proj>.<e>.weight`
/// (`ne = [cols, rows]` each) into `[e, rows, cols]` weights.
///
/// Zero-copy when the E tensors lie back to back in the file in expert order;
/// otherwise (e.g. the experts' gate/up/down interleaved) they are copied into
/// one owned buffer: this costs `E · rows · cols · bytes-per-weight` of heap,
/// i.e. the projection's whole expert weights become resident.
fn stacked(
    file: &GgufFile,
    layer: usize,
    proj: &str,
    e: usize,
    rows: usize,
    cols: usize,
) -> Result<QuantWeights> {
    let infos = (0..e)
        .map(|x| need(file, &format!("blk.{layer}.ffn_{proj}.{x}.weight"), layer))
        .collect::<Result<Vec<_>>>()?;
    let Some(&first) = infos.first() else {
        return Err(bad(file, format!("block {layer}: no experts")));
    };
    let format = format_of(file, first)?;
    for t in &infos {
        check_dims(file, t, [cols, rows, 1])?;
        if t.ty != first.ty {
            return Err(bad(
                file,
                format!(
                    "tensor `{}` has type {}, `{}` has {}: experts must share a type",
                    t.name, t.ty.name, first.name, first.ty.name
                ),
            ));
        }
    }
    let per = first.nbytes;
    let total = per
        .checked_mul(e)
        .ok_or_else(|| bad(file, "expert sizes overflow"))?;
    let adjacent = infos
        .iter()
        .enumerate()
        .all(|(x, t)| Some(t.start) == x.checked_mul(per).and_then(|o| o.checked_add(first.start)));
    let bytes = if adjacent {
        file.bytes(first.start..first.start.saturating_add(total))?
    } else {
        // Copying needs disjoint ranges, so the copy is never larger than the
        // file (hostile tensor infos could alias one range many times).
        let mut starts: Vec<usize> = infos.iter().map(|t| t.start).collect();
        starts.sort_unstable();
        if starts.windows(2).any(|w| w[1] < w[0].saturating_add(per)) {
            return Err(bad(
                file,
                format!("block {layer}: the per-expert `ffn_{proj}` tensors overlap in the file"),
            ));
        }
        let mut b = Bytes::zeroed(total);
        let dst = b.make_mut();
        for (chunk, t) in dst.chunks_mut(per.max(1)).zip(&infos) {
            let src = file
                .as_bytes()
                .get(t.start..t.start.saturating_add(per))
                .ok_or_else(|| bad(file, format!("tensor `{}` out of bounds", t.name)))?;
            if src.len() != chunk.len() {
                return Err(bad(file, format!("tensor `{}`: size mismatch", t.name)));
            }
            chunk.copy_from_slice(src);
        }
        b
    };
    wrap(
        file,
        &format!("blk.{layer}.ffn_{proj}.*.weight"),
        format,
        [e, rows, cols],
        bytes,
    )
}

/// Rejects per-layer expert tensors moekit would otherwise silently ignore:
/// biases or scales beside the router and expert weights that the block
/// does not read (`blk.L.ffn_up_exps.bias` outside gpt-oss,
/// `blk.L.ffn_gate_up_exps.scale`, `blk.L.ffn_down_exps_s.weight`, …).
/// Every architecture reads `ffn_{gate,up,down}_exps.scale`
/// ([`super::arch::EXPERT_SCALES`]).
fn check_extras(file: &GgufFile, fam: &ArchRule, layer: usize) -> Result<()> {
    let prefix = format!("blk.{layer}.");
    const STEMS: [&str; 5] = [
        "ffn_gate_inp",
        "ffn_gate_exps",
        "ffn_up_exps",
        "ffn_down_exps",
        "ffn_gate_up_exps",
    ];
    for t in file.tensors() {
        let Some(rest) = t.name.strip_prefix(&prefix) else {
            continue;
        };
        let extra = STEMS.iter().any(|stem| {
            rest.strip_prefix(stem).is_some_and(|tail| {
                let known = tail == ".weight"
                    || (fam.linear_bias() && tail == ".bias")
                    || (tail == ".scale"
                        && (fam.scale_tensors().contains(stem)
                            || super::arch::EXPERT_SCALES.contains(stem)));
                (tail.starts_with('.') && !known) || tail.starts_with("_s.")
            })
        });
        if extra {
            return Err(unsupported(
                file,
                format!(
                    "tensor `{}` (expert/router biases or scales) is not supported",
                    t.name
                ),
            ));
        }
    }
    Ok(())
}

/// How block `layer`'s routed experts are stored.
pub(crate) enum Layout<'a> {
    Fused(&'a TensorInfo),
    Separate(&'a TensorInfo),
    PerExpert,
}

/// Dimensions of block `layer`'s MoE layer: (E, H, I) and the layout.
pub(crate) fn layout<'a>(
    file: &'a GgufFile,
    layer: usize,
) -> Result<(usize, usize, usize, Layout<'a>)> {
    let p = |s: &str| format!("blk.{layer}.{s}");
    let router = need(file, &p("ffn_gate_inp.weight"), layer)?;
    let [h, e, one] = ne3(router).unwrap_or([0; 3]);
    if h == 0 || e == 0 || one != 1 {
        return Err(bad(
            file,
            format!(
                "tensor `{}`: ne {:?}, want [H, E] with H, E > 0",
                router.name, router.ne
            ),
        ));
    }
    let (lay, i) = if let Some(t) = file.tensor(&p("ffn_gate_up_exps.weight")) {
        let i2 = t.ne.get(1).copied().unwrap_or(0);
        if i2 % 2 != 0 {
            return Err(bad(
                file,
                format!("tensor `{}`: ne[1] = {i2} is not even (2·I)", t.name),
            ));
        }
        (Layout::Fused(t), i2 / 2)
    } else if let Some(t) = file.tensor(&p("ffn_gate_exps.weight")) {
        (Layout::Separate(t), t.ne.get(1).copied().unwrap_or(0))
    } else if let Some(t) = file.tensor(&p("ffn_gate.0.weight")) {
        (Layout::PerExpert, t.ne.get(1).copied().unwrap_or(0))
    } else {
        return Err(bad(
            file,
            format!("missing tensor `{}` (nor `{}` or per-expert `{}`) for the MoE layer of block {layer}", p("ffn_gate_exps.weight"), p("ffn_gate_up_exps.weight"), p("ffn_gate.0.weight")),
        ));
    };
    if i == 0 {
        return Err(bad(
            file,
            format!("block {layer}: expert intermediate size is 0"),
        ));
    }
    Ok((e, h, i, lay))
}

/// The expert intermediate size I of block `layer` (from its tensors).
pub(crate) fn intermediate(file: &GgufFile, layer: usize) -> Result<usize> {
    layout(file, layer).map(|(_, _, i, _)| i)
}

/// Builds block `layer`'s MoE layer; `progress(done, total)` after each weight.
pub(crate) fn build_block(
    file: &GgufFile,
    arch: &str,
    fam: &ArchRule,
    layer: usize,
    progress: &dyn Fn(usize, usize),
) -> Result<MoeBlock> {
    check_extras(file, fam, layer)?;
    let (e, h, i, lay) = layout(file, layer)?;
    // The size keys were checked against these tensors (`keys::check`).
    let router = router_config(file, arch, fam, layer)?;
    let shared = shared_tensors(file, arch, fam, layer)?;
    let expert_weights = if matches!(lay, Layout::Fused(_)) {
        2
    } else {
        3
    };
    let shared_weights = shared.map_or(0, |s| 3 + usize::from(s.3.is_some()));
    let total = 1 + expert_weights + shared_weights;
    let done = std::cell::Cell::new(0usize);
    let step = |w: QuantWeights| {
        done.set(done.get() + 1);
        progress(done.get(), total);
        w
    };
    let p = |s: &str| format!("blk.{layer}.{s}");
    let router_weight = step(weights(
        file,
        need(file, &p("ffn_gate_inp.weight"), layer)?,
        1,
        e,
        h,
    )?);
    let gate_up_err = |err: Error| bad(file, format!("block {layer}: {err}"));
    let (gate_up, down) = match lay {
        Layout::Fused(t) => {
            let gu = GateUp::fused(step(weights(file, t, e, 2 * i, h)?)).map_err(gate_up_err)?;
            (
                gu,
                step(weights(
                    file,
                    need(file, &p("ffn_down_exps.weight"), layer)?,
                    e,
                    h,
                    i,
                )?),
            )
        }
        Layout::Separate(t) => {
            let gate = step(weights(file, t, e, i, h)?);
            let up = step(weights(
                file,
                need(file, &p("ffn_up_exps.weight"), layer)?,
                e,
                i,
                h,
            )?);
            let down = step(weights(
                file,
                need(file, &p("ffn_down_exps.weight"), layer)?,
                e,
                h,
                i,
            )?);
            (GateUp::separate(gate, up).map_err(gate_up_err)?, down)
        }
        Layout::PerExpert => {
            let gate = step(stacked(file, layer, "gate", e, i, h)?);
            let up = step(stacked(file, layer, "up", e, i, h)?);
            let down = step(stacked(file, layer, "down", e, h, i)?);
            (GateUp::separate(gate, up).map_err(gate_up_err)?, down)
        }
    };
    let shared = match shared {
        None => None,
        Some((g, u, d, sg)) => {
            let is = g.ne.get(1).copied().unwrap_or(0);
            let gate = step(weights(file, g, 1, is, h)?);
            let up = step(weights(file, u, 1, is, h)?);
            let down = step(weights(file, d, 1, h, is)?);
            let gate_w = sg.map(|t| weights(file, t, 1, 1, h)).transpose()?.map(step);
            Some(SharedExpert {
                gate_up: GateUp::separate(gate, up).map_err(gate_up_err)?,
                down,
                gate: gate_w,
            })
        }
    };
    MoeBlock::new(MoeBlockParts {
        router,
        router_weight,
        gate_up,
        down,
        shared,
        ffn: super::arch::expert_ffn(file, arch, fam, layer)?,
    })
    .map_err(gate_up_err)
}
