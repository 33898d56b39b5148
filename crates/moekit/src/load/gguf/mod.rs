//! GGUF checkpoints (as llama.cpp writes them): the container parser
//! ([`GgufFile`]) and the MoE layers of its architectures ([`GgufCheckpoint`]).
//!
//! ## Why our own parser
//!
//! We evaluated the crates.io GGUF readers (latest versions per `cargo info`):
//! `gguf` 0.1.2 (nom-based, unmaintained, hands out metadata but no zero-copy
//! tensor views), `gguf-rs` 0.1.8 (anyhow, log, byteorder, clap, comfy-table
//! and simple_logger as non-optional library dependencies), `ggus` 0.5.1
//! (maintained and zero-copy, but its metadata accessors `unwrap()` — e.g.
//! `read_integer` panics on a `u64` value above `isize::MAX` — and it pulls in
//! regex, indexmap and its own quant crate), `gguf-rs-lib` 0.3.3 (13 k lines,
//! needs Rust 1.87 > our MSRV 1.85) and candle's `gguf_file` (careful, but only
//! as part of all of `candle-core`). None combines v2+v3 with light
//! dependencies, offsets without reading data (we memory-map) and no panics or
//! count-sized allocations on hostile input, and the format is small: so
//! [`file`](mod@file) is our own ~600 lines (a third of them docs and the type table), bounds-checking every count against the
//! bytes that remain, and is fuzz-tested (`tests/gguf_load.rs`).
//!
//! ## What loads
//!
//! [`GgufCheckpoint`] maps the file, reads `general.architecture` (one of
//! [`crate::load::family::gguf_archs`]) and finds the MoE blocks: every block `N` with a
//! router `blk.N.ffn_gate_inp.weight` (`ne = [H, E]`). Routed experts are
//! merged `blk.N.ffn_{gate,up,down}_exps.weight` (`ne = [K, N, E]`, `ne[0]` the
//! row length), fused `blk.N.ffn_gate_up_exps.weight` (gate rows first, as
//! llama.cpp splits it), or legacy per-expert Mixtral
//! `blk.N.ffn_{gate,up,down}.E.weight` (stacked into one view when a
//! projection's E tensors lie back to back in the file; otherwise, e.g. when
//! a converter interleaved gate/down/up expert by expert, that projection is
//! copied, and all of its `E·N·K` weights become resident heap memory).
//! Shared experts `blk.N.ffn_{gate,up,down}_shexp.weight` (with
//! `blk.N.ffn_gate_inp_shexp.weight` for the gated ones) and the DeepSeek-V3
//! selection bias `blk.N.exp_probs_b.bias` are read per architecture; routing
//! follows llama.cpp's `build_moe_ffn` (the table and its few documented
//! divergences are in [`arch`]). All other weights are zero-copy views of the
//! map, in f32, f16, bf16 or a GGML block type; other types (NVFP4, Q8_K, …) are
//! an error naming the tensor and type.

pub mod arch;
mod block;
pub mod file;
mod keys;
pub mod value;

pub use file::{GgufFile, SharedBytes, TensorInfo, TensorType};
pub use value::{Array, Value};

use crate::error::{invalid, unsupported, Result};
use crate::load::{Checkpoint, MoeSummary, TensorEntry};
use crate::moe::MoeBlock;
use crate::ops::route::RouterConfig;
use arch::{bad, key_usize, ArchRule};
use std::path::Path;

/// A GGUF file with MoE layers, memory-mapped.
#[derive(Debug)]
pub struct GgufCheckpoint {
    file: GgufFile,
    arch: String,
    rule: ArchRule,
    summary: MoeSummary,
}

impl GgufCheckpoint {
    /// Memory-maps and parses `path`; errors for an unsupported architecture.
    pub fn open(path: &Path) -> Result<GgufCheckpoint> {
        GgufCheckpoint::from_file(GgufFile::open(path)?)
    }

    /// Parses GGUF bytes held in memory (`path` names them in errors).
    pub fn parse(data: SharedBytes, path: &Path) -> Result<GgufCheckpoint> {
        GgufCheckpoint::from_file(GgufFile::parse(data, path)?)
    }

    /// Wraps a parsed file: reads the architecture and summarises its MoE layers.
    pub fn from_file(file: GgufFile) -> Result<GgufCheckpoint> {
        let arch = match file.get("general.architecture") {
            Some(v) => v
                .as_str()
                .ok_or_else(|| {
                    bad(
                        &file,
                        format!(
                            "`general.architecture` is {} {v:?}, want a string",
                            v.type_name()
                        ),
                    )
                })?
                .to_string(),
            None => return Err(bad(&file, "missing key `general.architecture`")),
        };
        let rule = ArchRule::of(&arch).ok_or_else(|| {
            unsupported(
                "gguf",
                format!(
                    "{}: `general.architecture` `{arch}` is not supported (supported: {})",
                    file.path().display(),
                    crate::load::family::gguf_archs().join(", ")
                ),
            )
        })?;
        let n_layers = key_usize(&file, &arch, "block_count", 0)?
            .ok_or_else(|| bad(&file, format!("missing key `{arch}.block_count`")))?;
        // Every MoE block has a router (found from the tensor list, so a hostile
        // block_count costs nothing).
        let mut moe_layers: Vec<usize> = file
            .tensors()
            .iter()
            .filter_map(|t| {
                let l = t
                    .name
                    .strip_prefix("blk.")?
                    .strip_suffix(".ffn_gate_inp.weight")?
                    .parse::<usize>()
                    .ok()?;
                (l < n_layers && t.name == format!("blk.{l}.ffn_gate_inp.weight")).then_some(l)
            })
            .collect();
        moe_layers.sort_unstable();
        let first = moe_layers.first().copied();
        if let Some(l) = first {
            keys::check(&file, &arch, &rule, l)?;
        }
        let cfg = first
            .map(|l| arch::router_config(&file, &arch, &rule, l))
            .transpose()?;
        let hidden = match key_usize(&file, &arch, "embedding_length", 0)? {
            Some(h) => h,
            None => first
                .and_then(|l| file.tensor(&format!("blk.{l}.ffn_gate_inp.weight")))
                .and_then(|t| t.ne.first().copied())
                .unwrap_or(0),
        };
        let intermediate = match first {
            Some(l) => block::intermediate(&file, l)?,
            None => key_usize(&file, &arch, "expert_feed_forward_length", 0)?.unwrap_or(0),
        };
        let shared = first
            .map(|l| arch::describe_shared(&file, &arch, &rule, l))
            .transpose()?
            .flatten();
        let summary = MoeSummary {
            arch: arch.clone(),
            n_layers,
            n_experts: cfg.as_ref().map_or(0, |c| c.n_experts),
            top_k: cfg.as_ref().map_or(0, |c| c.top_k),
            hidden,
            intermediate,
            router: cfg.as_ref().map_or_else(
                || "none (no MoE layer)".to_string(),
                |c| arch::describe(&c.kind, c.top_k),
            ),
            shared,
            moe_layers,
        };
        Ok(GgufCheckpoint {
            file,
            arch,
            rule,
            summary,
        })
    }

    /// The parsed container.
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// The router configuration of MoE block `layer`.
    pub fn router_config(&self, layer: usize) -> Result<RouterConfig> {
        self.check_layer(layer)?;
        arch::router_config(&self.file, &self.arch, &self.rule, layer)
    }

    fn check_layer(&self, layer: usize) -> Result<()> {
        const OP: &str = "moe_block";
        let s = &self.summary;
        let path = self.file.path().display();
        if layer >= s.n_layers {
            return Err(invalid(
                OP,
                "layer",
                format!("a block index < {} (block_count of {path})", s.n_layers),
                layer,
            ));
        }
        if !s.moe_layers.contains(&layer) {
            let lead =
                key_usize(&self.file, &self.arch, "leading_dense_block_count", 0)?.unwrap_or(0);
            let why = if layer < lead {
                format!(
                    ": a leading dense block ({}.leading_dense_block_count = {lead})",
                    self.arch
                )
            } else {
                String::new()
            };
            return Err(invalid(
                OP,
                "layer",
                format!("a block with an MoE layer in {path} ({:?})", s.moe_layers),
                format!("block {layer}, which has no `blk.{layer}.ffn_gate_inp.weight`{why}"),
            ));
        }
        Ok(())
    }
}

impl Checkpoint for GgufCheckpoint {
    fn file_format(&self) -> &'static str {
        "gguf"
    }

    fn summary(&self) -> &MoeSummary {
        &self.summary
    }

    fn tensors(&self) -> Vec<TensorEntry> {
        self.file
            .tensors()
            .iter()
            .map(|t| TensorEntry {
                name: t.name.clone(),
                format: t.ty.name.to_string(),
                shape: t.shape(),
                bytes: t.nbytes,
            })
            .collect()
    }

    fn moe_block(&self, layer: usize, progress: &dyn Fn(usize, usize)) -> Result<MoeBlock> {
        self.check_layer(layer)?;
        keys::check(&self.file, &self.arch, &self.rule, layer)?;
        block::build_block(&self.file, &self.arch, &self.rule, layer, progress)
    }
}
