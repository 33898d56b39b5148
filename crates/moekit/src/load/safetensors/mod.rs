//! Safetensors checkpoint directories: `config.json` plus `model.safetensors`,
//! or shards listed by `model.safetensors.index.json` (`weight_map`), or (as
//! mlx-lm globs them) every `model*.safetensors` in the directory.
//!
//! Two layouts of the MoE weights are read (`layout.rs` lists the names):
//!
//! * **mlx-lm** (`mlx_lm.convert`): experts stacked per projection
//!   (`...switch_mlp.gate_proj.weight` `[E, I, H]`), usually affine-quantized
//!   (`u32` packed weight + `scales` + `biases`); per-module settings in
//!   `config.json` → `quantization`.
//! * **Hugging Face**: one tensor per expert (`...experts.7.up_proj.weight`),
//!   bf16/f16/f32, or FP8 e4m3 with 128×128 block scales
//!   (`...weight_scale_inv`, `quantization_config.quant_method` `"fp8"`:
//!   DeepSeek-V3 / R1, Kimi-K2), whose scales are expanded per row.
//!
//! ## Memory
//!
//! Every file is memory-mapped when the checkpoint is opened; only the JSON
//! headers are read then. [`Checkpoint::moe_block`] touches the tensors of the
//! one layer it builds and nothing else. Tensors used as they are (stacked
//! experts, routers, shared experts) are zero-copy views of the map — except
//! where the file places a tensor at an offset misaligned for its dtype
//! (`mx.save_safetensors` does not pad its header, so `u32`/`f32` tensors of
//! mlx-written files are often 2-byte aligned only): such a tensor is copied.
//! The Hugging Face per-expert layout is always copied, into one stacked
//! `[E, rows, cols]` buffer per projection: that is `3 · E · I · H` elements of
//! the checkpoint dtype per layer (e.g. 128 experts × 3 × 768 × 2048 × 2 bytes
//! ≈ 1.2 GB for one Qwen3-30B-A3B layer in bf16), held as long as the block.
//!
//! The mapping assumes the files are not modified while the checkpoint is open.

mod config;
mod config_view;
mod fields;
mod fp8;
mod hf_experts;
mod layout;
mod quant;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::load::{Checkpoint, MoeSummary, TensorEntry};
use crate::moe::MoeBlock;
use crate::tensor::{Bytes, Tensor};
use ::safetensors::{Dtype, SafeTensors};
use config::ModelConfig;
use memmap2::Mmap;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const INDEX: &str = "model.safetensors.index.json";
const SINGLE: &str = "model.safetensors";

/// One memory-mapped `.safetensors` file.
#[derive(Debug)]
struct Shard {
    path: PathBuf,
    map: Arc<Mmap>,
}

/// Where one tensor lives.
#[derive(Debug, Clone)]
struct TensorRef {
    /// Index into `files`.
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Absolute byte range in the file.
    range: Range<usize>,
}

/// A safetensors checkpoint directory, memory-mapped.
#[derive(Debug)]
pub struct SafetensorsCheckpoint {
    dir: PathBuf,
    /// The file that names the tensors (index or single file), for errors.
    listing: PathBuf,
    cfg: ModelConfig,
    summary: MoeSummary,
    files: Vec<Shard>,
    table: BTreeMap<String, TensorRef>,
}

/// Whether `path` looks like a safetensors checkpoint directory: a directory
/// with `config.json` and `model.safetensors` or its index.
pub fn is_safetensors_dir(path: &Path) -> bool {
    path.is_dir()
        && path.join("config.json").is_file()
        && (path.join(SINGLE).is_file() || path.join(INDEX).is_file())
}

/// Opens the checkpoint directory `dir` (see [`SafetensorsCheckpoint::open`]).
pub fn open(dir: &Path) -> Result<SafetensorsCheckpoint> {
    SafetensorsCheckpoint::open(dir)
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn bad_file(path: &Path, msg: impl Into<String>) -> Error {
    Error::BadFile {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// moekit's dtype for a safetensors dtype, if it has one.
fn dtype_of(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::Bf16,
        Dtype::U8 => DType::U8,
        Dtype::U32 => DType::U32,
        Dtype::I32 => DType::I32,
        // FP8 e4m3fn codes as bytes (`fp8.rs` checks the stored dtype).
        Dtype::F8_E4M3 => DType::U8,
        _ => return None,
    })
}

/// Maps `path` and reads its header into `table`.
fn map_shard(
    path: &Path,
    index: usize,
    table: &mut BTreeMap<String, TensorRef>,
    only: Option<&dyn Fn(&str) -> bool>,
) -> Result<Shard> {
    let file = std::fs::File::open(path).map_err(io(path))?;
    // SAFETY: the map is read-only and private to this process; the
    // checkpoint's contract (module docs) is that the files are not modified
    // or truncated while it is open, which is what makes the views sound.
    let map = unsafe { Mmap::map(&file) }.map_err(io(path))?;
    let (n, meta) = SafeTensors::read_metadata(&map[..])
        .map_err(|e| bad_file(path, format!("not a valid safetensors file: {e}")))?;
    let base = n
        .checked_add(8)
        .ok_or_else(|| bad_file(path, "header length overflows"))?;
    for (name, info) in meta.tensors() {
        if only.is_some_and(|keep| !keep(&name)) {
            continue;
        }
        let (s, e) = info.data_offsets;
        let range = match (base.checked_add(s), base.checked_add(e)) {
            (Some(a), Some(b)) if a <= b && b <= map.len() => a..b,
            _ => {
                return Err(bad_file(
                    path,
                    format!("tensor `{name}`: data offsets {s}..{e} outside the file"),
                ))
            }
        };
        let r = TensorRef {
            file: index,
            dtype: info.dtype,
            shape: info.shape.clone(),
            range,
        };
        if table.insert(name.clone(), r).is_some() {
            return Err(bad_file(
                path,
                format!("tensor `{name}` is also stored in another file"),
            ));
        }
    }
    Ok(Shard {
        path: path.to_path_buf(),
        map: Arc::new(map),
    })
}

/// Reads the index: tensor name → shard file name (a plain file name in `dir`).
fn read_index(path: &Path) -> Result<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad_file(path, format!("not valid JSON: {e}")))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad_file(path, "missing object `weight_map`"))?;
    let mut out = BTreeMap::new();
    for (name, file) in map {
        let f = file.as_str().ok_or_else(|| {
            bad_file(
                path,
                format!("weight_map[`{name}`]: expected a file name, got {file}"),
            )
        })?;
        let plain = Path::new(f)
            .file_name()
            .is_some_and(|n| n == std::ffi::OsStr::new(f))
            && f != "."
            && f != "..";
        if !plain {
            return Err(bad_file(
                path,
                format!("weight_map[`{name}`]: {f:?} is not a file name inside the directory"),
            ));
        }
        out.insert(name.clone(), f.to_string());
    }
    Ok(out)
}

impl SafetensorsCheckpoint {
    /// Opens a checkpoint directory: parses `config.json` (the MoE settings of
    /// its `model_type`), maps every weight file and reads their headers.
    pub fn open(dir: &Path) -> Result<SafetensorsCheckpoint> {
        let meta = std::fs::metadata(dir).map_err(io(dir))?;
        if !meta.is_dir() {
            return Err(bad_file(
                dir,
                "expected a checkpoint directory (config.json + *.safetensors)",
            ));
        }
        let (_, cfg) = config::read(dir)?;
        let mut table = BTreeMap::new();
        let mut files = Vec::new();
        let index_path = dir.join(INDEX);
        let listing = if index_path.is_file() {
            let wmap = read_index(&index_path)?;
            let names: std::collections::BTreeSet<&String> = wmap.values().collect();
            for (i, f) in names.into_iter().enumerate() {
                let keep = |t: &str| wmap.get(t).is_some_and(|g| g == f);
                files.push(map_shard(&dir.join(f), i, &mut table, Some(&keep))?);
            }
            if let Some(t) = wmap.keys().find(|t| !table.contains_key(*t)) {
                let f = wmap.get(t).map_or("", |f| f.as_str());
                return Err(bad_file(
                    &index_path,
                    format!("weight_map puts tensor `{t}` in {f}, which has no such tensor"),
                ));
            }
            index_path
        } else {
            let mut found = Vec::new();
            for entry in std::fs::read_dir(dir).map_err(io(dir))? {
                let name = entry
                    .map_err(io(dir))?
                    .file_name()
                    .to_string_lossy()
                    .into_owned();
                if name.starts_with("model") && name.ends_with(".safetensors") {
                    found.push(name);
                }
            }
            found.sort();
            if found.is_empty() {
                return Err(bad_file(
                    dir,
                    format!("no {SINGLE}, {INDEX} or model*.safetensors"),
                ));
            }
            for (i, f) in found.iter().enumerate() {
                files.push(map_shard(&dir.join(f), i, &mut table, None)?);
            }
            if found.len() == 1 {
                dir.join(&found[0])
            } else {
                dir.to_path_buf()
            }
        };
        let summary = MoeSummary {
            arch: cfg.model_type.clone(),
            n_layers: cfg.n_layers,
            moe_layers: cfg.moe_layers.clone(),
            n_experts: cfg.n_experts,
            top_k: cfg.top_k,
            hidden: cfg.hidden,
            intermediate: cfg.intermediate,
            router: format!(
                "{}{}{}",
                cfg.router_text(),
                if cfg.weight_before {
                    " (the weight scales the expert's input)"
                } else {
                    ""
                },
                if cfg.per_layer.is_empty() {
                    ""
                } else {
                    " (k and sizes per block from list-valued keys; block 0's shown)"
                }
            ),
            shared: cfg.shared_text(),
        };
        Ok(SafetensorsCheckpoint {
            dir: dir.to_path_buf(),
            listing,
            cfg,
            summary,
            files,
            table,
        })
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn get(&self, name: &str) -> Option<&TensorRef> {
        self.table.get(name)
    }

    /// The file holding tensor `name` (the listing file if there is none).
    fn file_of(&self, name: &str) -> &Path {
        self.get(name)
            .and_then(|r| self.files.get(r.file))
            .map_or(self.listing.as_path(), |s| s.path.as_path())
    }

    /// A `BadFile` error about tensor `name`, naming its file.
    fn bad(&self, name: &str, msg: impl std::fmt::Display) -> Error {
        bad_file(self.file_of(name), format!("tensor `{name}`: {msg}"))
    }

    /// The error for a tensor the layout needs but no file has.
    fn missing(&self, name: &str, why: &str) -> Error {
        bad_file(&self.listing, format!("missing tensor `{name}` ({why})"))
    }

    /// moekit dtype and shape of tensor `name`.
    fn info(&self, name: &str) -> Result<(DType, &[usize])> {
        let r = self
            .get(name)
            .ok_or_else(|| self.missing(name, "needed by this layer"))?;
        let d = dtype_of(r.dtype).ok_or_else(|| {
            crate::error::unsupported(
                "moe_block",
                format!(
                    "{}: tensor `{name}` has dtype {}",
                    self.file_of(name).display(),
                    r.dtype
                ),
            )
        })?;
        Ok((d, &r.shape))
    }

    /// The raw bytes of tensor `name` (a slice of the map).
    fn raw(&self, name: &str) -> Result<&[u8]> {
        let r = self
            .get(name)
            .ok_or_else(|| self.missing(name, "needed by this layer"))?;
        let shard = self
            .files
            .get(r.file)
            .ok_or_else(|| self.bad(name, "unknown file"))?;
        shard
            .map
            .get(r.range.clone())
            .ok_or_else(|| self.bad(name, "data outside the file"))
    }

    /// Tensor `name` as stored: a zero-copy view of the map when its offset is
    /// aligned for its dtype, else an aligned copy.
    fn load(&self, name: &str) -> Result<Tensor> {
        let (dtype, shape) = self.info(name)?;
        let r = self
            .get(name)
            .ok_or_else(|| self.missing(name, "needed by this layer"))?;
        let shard = self
            .files
            .get(r.file)
            .ok_or_else(|| self.bad(name, "unknown file"))?;
        let bytes = if r.range.start % dtype.size() == 0 {
            Bytes::shared(shard.map.clone(), r.range.clone())?
        } else {
            Bytes::copy_from(self.raw(name)?)
        };
        Tensor::from_bytes(dtype, shape, bytes).map_err(|e| self.bad(name, e))
    }
}

impl Checkpoint for SafetensorsCheckpoint {
    fn file_format(&self) -> &'static str {
        "safetensors"
    }

    fn summary(&self) -> &MoeSummary {
        &self.summary
    }

    fn tensors(&self) -> Vec<TensorEntry> {
        self.table
            .iter()
            .map(|(name, r)| TensorEntry {
                name: name.clone(),
                format: match (r.dtype, self.cfg.quant.fp8) {
                    (Dtype::F8_E4M3, Some(f)) => format!("fp8-{}x{}", f.block.0, f.block.1),
                    (d, _) => d.to_string().to_ascii_lowercase(),
                },
                shape: r.shape.clone(),
                bytes: r.range.len(),
            })
            .collect()
    }

    fn moe_block(&self, layer: usize, progress: &dyn Fn(usize, usize)) -> Result<MoeBlock> {
        layout::build(self, layer, progress)
    }
}
