//! # moekit
//!
//! Runs the Mixture-of-Experts (MoE) layers of quantized LLMs.
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
//! 4. **Backends** — [`cpu`]: `cpu::reference` (simple, obviously right: the
//!    oracle) and `cpu::fast` (rayon, cache blocking); [`cuda`]: cudarc +
//!    NVRTC (the `kernels/*.cu` templates compiled per instance at first use,
//!    cached on disk), one typed wrapper per kernel in `cuda::ops`, including
//!    the fused decode path and the tensor-core grouped GEMM (`wgmma` on
//!    sm_90a, `mma.sync` elsewhere).
//! 5. **MoE block** ([`moe`]) — route → sort → grouped gate/up + SwiGLU →
//!    grouped down → weighted combine (+ shared expert); [`plan`] chooses the
//!    path (general, fused decode, tensor cores) in one place and keeps each
//!    refused path's reason.
//! 6. **Loaders** ([`load`]) — MLX / Hugging Face safetensors and GGUF files
//!    to MoE blocks.
//! 7. **CLI** — the `moekit` binary in the `moekit-cli` crate.

#![deny(missing_docs)]
// No panics in library code: unwrap/expect only in tests.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

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

pub use device::{Backend, Device};
pub use dtype::{DType, Element, Float};
pub use error::{Error, Result};
pub use format::{QuantWeights, WeightFormat};
pub use tensor::{Bytes, Tensor};
