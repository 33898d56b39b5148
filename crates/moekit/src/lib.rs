//! # moekit
//!
//! Runs the Mixture-of-Experts (MoE) layers of quantized LLMs.
//!
//! moekit is for people who build or check an LLM inference engine: it loads
//! the MoE layer of one transformer block from a GGUF file or a safetensors
//! directory (or from your own tensors), runs it on the CPU or a CUDA GPU,
//! and lets you compare, benchmark and profile that one layer. It is not an
//! inference engine: no attention, no KV cache, no tokenizer.
//!
//! ## The public API
//!
//! * Main path: [`open`] → [`Checkpoint`] → [`Checkpoint::moe_block`] →
//!   [`MoeBlock`] → [`MoeBlock::to_device`] → [`MoeBlock::forward`].
//! * Choosing the implementation: [`MoePath`] with
//!   [`MoeBlock::forward_with`]; [`plan::plan`] says which path runs and why
//!   the others refused. [`Backend`] picks the CPU oracle, the fast CPU path
//!   or CUDA.
//! * CPU numerics: for GGUF and MLX affine experts (all but Q4_1 and
//!   affine 2- and 8-bit, whose f32 kernels measured faster) the fast CPU
//!   path quantizes each activation row once per call to 8-bit blocks and
//!   runs integer dot kernels (deterministic, batch-invariant, NMSE ≤ 1e-4
//!   against f32 activations; the router keeps f32 activations);
//!   [`cpu::with_act_mode`] or the environment variable
//!   `MOEKIT_CPU_ACT=f32` ([`cpu::ACT_ENV`]) keep f32 activations,
//!   `MOEKIT_CPU_ACT=q8` takes the integer kernels for every format. The kernels' instruction set (portable, AVX2, AVX-VNNI,
//!   AVX512-VNNI) is detected at run time ([`cpu::simd_level`]) and capped
//!   by `MOEKIT_CPU_LEVEL`; the x86 kernels prefetch their weight rows
//!   [`cpu::prefetch_distance`] bytes ahead (`MOEKIT_CPU_PREFETCH`, 0: off).
//! * Core types: [`Tensor`], [`DType`], [`Device`], [`Error`].
//! * Building blocks from your own tensors: [`format`](mod@format) ([`WeightFormat`],
//!   [`QuantWeights`], the MLX affine quantizer [`format::affine::quantize`]
//!   and GGUF [`format::ggml::quantize_row`]), [`moe::MoeBlockParts`],
//!   [`ops::route::RouterConfig`], [`ops::act::GateUp`].
//! * The ops an engine builder calls one by one ([`ops`]): routing, expert
//!   sort, permute / unpermute, grouped (quantized) matmul, SwiGLU, norm
//!   epilogues; each validates its arguments and has a `*_on(backend, ..)`
//!   form.
//! * Loaders' own types ([`load::gguf`], [`load::safetensors`]; the table of
//!   supported model families, [`load::family`]), `.npy` input and output
//!   ([`npy`]), and CUDA specifics ([`cuda`]: device, CUDA graphs, timing).
//! * Interop (the Python binding, `crates/moekit-py`, is built on it):
//!   [`cuda::with_stream`] runs moekit on a caller's CUDA stream,
//!   [`cuda::CudaBytes::from_borrowed`] and [`Bytes::external`] view memory
//!   another library owns, [`MoeBlock::forward_into`] writes in place, and
//!   [`moe::routed_experts`] runs the experts for a routing computed
//!   elsewhere (vLLM's `fused_experts`).
//!
//! ## Architecture (read top to bottom)
//!
//! 1. **Core types** — [`DType`], [`Tensor`] (contiguous, owned or a zero-copy
//!    view of mapped memory), [`Device`], [`Error`].
//! 2. **Formats** ([`format`](mod@format)) — block layouts and (de)quantization of MLX
//!    affine and GGUF weights; [`format::QuantWeights`] holds `[E, N, K]`
//!    expert weights in any format.
//! 3. **Ops** ([`ops`]) — the front end: each op validates every argument and
//!    dispatches to a [`Backend`]. Ops: routing, expert sort, permute /
//!    unpermute, grouped quantized matmul, SwiGLU, norm epilogues.
//! 4. **Backends** (crate-private) — `cpu::reference` (simple, obviously
//!    right: the oracle) and `cpu::fast` (rayon, cache blocking); `cuda`:
//!    cudarc + NVRTC (the `kernels/*.cu` templates compiled per instance at
//!    first use, cached on disk), one typed wrapper per kernel in
//!    `cuda::ops`, including the fused decode path and the tensor-core
//!    grouped GEMM (`wgmma` on sm_90a, `mma.sync` elsewhere; on sm_90a,
//!    where measured faster, a variant that decodes the weights straight
//!    into `wgmma`'s register operand, chosen in `cuda::ops::tc_moe`).
//! 5. **MoE block** ([`moe`]) — route → sort → grouped gate/up + SwiGLU →
//!    grouped down → weighted combine (+ shared expert); [`plan`] chooses the
//!    path (general, fused decode, tensor cores) in one place and keeps each
//!    refused path's reason.
//! 6. **Loaders** ([`load`]) — MLX / Hugging Face safetensors and GGUF files
//!    to MoE blocks.
//! 7. **CLI** — the `moekit` binary in the `moekit-cli` crate.
//!
//! The examples in `crates/moekit/examples/` show the same from end to end:
//! `run_layer` (a layer of a file), `own_tensors` (a block from your own
//! weights) and `cuda_graph` (capture a forward in a CUDA graph, replay it).
//!
//! ## Running a layer
//!
//! Open a checkpoint, build one layer's [`MoeBlock`] (on the CPU; move it with
//! [`MoeBlock::to_device`]), and run it on that layer's input rows
//! (`[T, hidden]`, after the attention block and its norm):
//!
//! ```
//! use moekit::{open, Checkpoint, DType, Tensor};
//! # fn main() -> moekit::Result<()> {
//! # let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/gguf/qwen3moe_f32.gguf");
//! let ckpt = open(&path)?;
//! let layer = ckpt.summary().moe_layers[0];
//! let block = ckpt.moe_block(layer, &|_done, _total| {})?;
//! let h = block.hidden();
//! let x = Tensor::from_f32(&vec![0.25; 3 * h], &[3, h], DType::F32)?;
//! let y = block.forward(&x)?;
//! assert_eq!(y.shape(), &[3, h]);
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]
// No panics in library code: unwrap/expect only in tests.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

// The CPU backends: crate-private but for the SIMD level (see `cuda::ops` for the allow).
#[allow(rustdoc::private_intra_doc_links)]
pub mod cpu;
pub mod cuda;
pub mod device;
pub mod dtype;
pub mod error;
pub mod format;
pub mod load;
pub mod moe;
pub mod npy;
pub mod ops;
pub mod plan;
pub mod tensor;
#[doc(hidden)]
pub mod testing;

pub use device::{Backend, Device};
pub use dtype::{DType, Element, Float};
pub use error::{Error, Result};
pub use format::{QuantWeights, WeightFormat};
pub use load::{open, Checkpoint};
pub use moe::{MoeBlock, MoePath};
pub use tensor::{Bytes, Tensor};
