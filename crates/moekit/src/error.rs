//! The one error type of the crate.
//!
//! Every public function returns [`Result`]. Argument errors name the op, the
//! argument, what was expected and what was got, so a caller can tell at once
//! which of their tensors is wrong.

use std::fmt::Display;
use std::path::PathBuf;

/// Errors returned by every fallible moekit function.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument of an op has the wrong dtype, shape, size or value.
    #[error("{op}: argument `{arg}`: expected {expected}, got {got}")]
    Invalid {
        /// The op that rejected the argument (e.g. `gather_mm`).
        op: &'static str,
        /// The argument's name.
        arg: &'static str,
        /// What the op expected.
        expected: String,
        /// What it got.
        got: String,
    },
    /// A combination the op does not implement (yet), e.g. a format on a device.
    #[error("{op}: unsupported: {what}")]
    Unsupported {
        /// The op.
        op: &'static str,
        /// What is not supported.
        what: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A file was read but its contents are malformed.
    #[error("{path}: {msg}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it (names the tensor or key where there is one).
        msg: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver error in {op}: {source}")]
    Cuda {
        /// What moekit was doing.
        op: &'static str,
        /// The driver's error.
        #[source]
        source: cudarc::driver::DriverError,
    },
    /// A cuBLAS call failed.
    #[error("cuBLAS error in {op}: {source}")]
    Cublas {
        /// What moekit was doing (e.g. `cublasGemmEx (bf16_gemm_tflops)`).
        op: &'static str,
        /// cuBLAS's status.
        #[source]
        source: cudarc::cublas::result::CublasError,
    },
    /// NVRTC rejected a kernel; `log` is NVRTC's formatted log.
    #[error("NVRTC could not compile kernel `{kernel}` for {arch}:\n{log}")]
    Compile {
        /// The kernel (template name expression).
        kernel: String,
        /// Target architecture (`sm_90a`).
        arch: String,
        /// The compiler log.
        log: String,
    },
    /// A kernel found a data-dependent argument error (e.g. an expert id out
    /// of range); the offending items were skipped, never accessed.
    #[error("cuda:{device}: a kernel reported invalid input: {what}")]
    DeviceReported {
        /// Device ordinal.
        device: usize,
        /// What was wrong.
        what: String,
    },
    /// CUDA (the driver library, NVRTC or a GPU) is not available here.
    #[error("CUDA is not available: {0}")]
    NoCuda(String),
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Builds an [`Error::Invalid`].
pub(crate) fn invalid(
    op: &'static str,
    arg: &'static str,
    expected: impl Display,
    got: impl Display,
) -> Error {
    Error::Invalid {
        op,
        arg,
        expected: expected.to_string(),
        got: got.to_string(),
    }
}

/// Returns `Err(invalid(..))` unless `cond` holds.
pub(crate) fn ensure(
    cond: bool,
    op: &'static str,
    arg: &'static str,
    expected: impl Display,
    got: impl Display,
) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(invalid(op, arg, expected, got))
    }
}

/// Builds an [`Error::Unsupported`].
pub(crate) fn unsupported(op: &'static str, what: impl Display) -> Error {
    Error::Unsupported {
        op,
        what: what.to_string(),
    }
}

/// Wraps a cuBLAS error with the op it came from.
pub(crate) fn cublas_err(
    op: &'static str,
) -> impl FnOnce(cudarc::cublas::result::CublasError) -> Error {
    move |source| Error::Cublas { op, source }
}

/// Wraps a driver error with the op it came from.
pub(crate) fn cuda_err(op: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Error {
    move |source| Error::Cuda { op, source }
}
