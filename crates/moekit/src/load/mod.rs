//! Checkpoint loading: the MoE layers of GGUF files (as llama.cpp writes them)
//! and safetensors directories (mlx-lm quantized, Hugging Face unquantized).
//!
//! Files are memory-mapped; tensors are zero-copy [`Bytes::Shared`](crate::Bytes)
//! views, so only the bytes of the layer that runs are ever touched.
//!
//! [`open`] detects the format and returns a [`Checkpoint`].

pub mod family;
pub mod gguf;
pub mod safetensors;

use crate::error::Result;
use crate::moe::MoeBlock;
use std::path::Path;

/// One tensor of a checkpoint, as `moekit inspect` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    /// Name in the file.
    pub name: String,
    /// Storage format (`q4_k`, `bf16`, `u32`, ...).
    pub format: String,
    /// Logical shape, outermost first (row-major, as numpy would show it).
    pub shape: Vec<usize>,
    /// Bytes in the file.
    pub bytes: usize,
}

/// MoE configuration of a checkpoint, as `moekit inspect` prints it.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeSummary {
    /// Architecture (`qwen3moe`, `deepseek2`, `qwen3_moe`, ...).
    pub arch: String,
    /// Transformer blocks.
    pub n_layers: usize,
    /// Blocks that have an MoE layer.
    pub moe_layers: Vec<usize>,
    /// Routed experts E.
    pub n_experts: usize,
    /// Experts per token k.
    pub top_k: usize,
    /// Hidden size H.
    pub hidden: usize,
    /// Expert intermediate size I.
    pub intermediate: usize,
    /// Routing rule, human readable.
    pub router: String,
    /// Shared expert description, if any.
    pub shared: Option<String>,
}

/// A loaded (memory-mapped) checkpoint.
pub trait Checkpoint {
    /// The file format, `gguf` or `safetensors`.
    fn file_format(&self) -> &'static str;
    /// MoE configuration.
    fn summary(&self) -> &MoeSummary;
    /// Every tensor in the checkpoint.
    fn tensors(&self) -> Vec<TensorEntry>;
    /// Builds the MoE block of transformer block `layer`; a clear error if
    /// the block does not exist or has no MoE layer. `progress(done, total)`
    /// is called as expert tensors are prepared.
    fn moe_block(&self, layer: usize, progress: &dyn Fn(usize, usize)) -> Result<MoeBlock>;
}

/// Opens a `.gguf` file or a safetensors directory, detecting which: a
/// directory is read as safetensors (`config.json` + weights), a file whose
/// first bytes are the GGUF magic as GGUF.
pub fn open(path: &Path) -> Result<Box<dyn Checkpoint>> {
    let bad = |msg: &str| crate::Error::BadFile {
        path: path.to_path_buf(),
        msg: msg.to_string(),
    };
    let meta = std::fs::metadata(path).map_err(|source| crate::Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if meta.is_dir() {
        if !safetensors::is_safetensors_dir(path) {
            return Err(bad("a directory must hold config.json and model.safetensors (or model.safetensors.index.json)"));
        }
        return Ok(Box::new(safetensors::open(path)?));
    }
    if !meta.is_file() {
        // Opening a FIFO would block until a writer appears; devices and
        // sockets cannot be mapped.
        return Err(bad(
            "not a regular file (a pipe, socket or device): want a .gguf file or a safetensors directory",
        ));
    }
    let mut magic = [0u8; 4];
    let n = std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read(&mut f, &mut magic))
        .map_err(|source| crate::Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
    if n == 4 && &magic == b"GGUF" {
        return Ok(Box::new(gguf::GgufCheckpoint::open(path)?));
    }
    Err(bad(
        "not a GGUF file (no GGUF magic) and not a safetensors directory",
    ))
}
