//! `moekit._moekit`: the native half of the `moekit` Python package.
//!
//! The Python half (`python/moekit/__init__.py`) adapts frameworks: it
//! allocates outputs with the caller's framework (so PyTorch's allocator
//! and CUDA graphs see them), picks the caller's current CUDA stream, and
//! converts results back. This half views every tensor through DLPack
//! without a copy ([`dlpack`]), runs moekit on the given stream
//! (`moekit::cuda::with_stream`) with the GIL released, and raises
//! `moekit.MoekitError` (a `ValueError`) with moekit's message on any error.
//!
//! * [`layer`]: `open(path)` → `Checkpoint` → `moe_layer(i, device, dtype)`
//!   → `Layer.forward(x, out, stream)`.
//! * [`ops`]: `route`, `fused_experts` (vLLM's argument convention),
//!   `quantize`, and `Experts`, a holder of `[E, N, K]` weights in any
//!   moekit format.

use pyo3::prelude::*;

pub mod dlpack;
pub mod layer;
pub mod ops;

pyo3::create_exception!(
    _moekit,
    MoekitError,
    pyo3::exceptions::PyValueError,
    "An error moekit reported: the message names the op or file, the argument, what was expected and what was got."
);

/// moekit's error as a Python exception.
pub(crate) fn err(e: moekit::Error) -> PyErr {
    MoekitError::new_err(e.to_string())
}

/// NumPy's name of a moekit dtype.
pub(crate) fn dtype_name(d: moekit::DType) -> &'static str {
    match d {
        moekit::DType::F32 => "float32",
        moekit::DType::F16 => "float16",
        moekit::DType::Bf16 => "bfloat16",
        moekit::DType::U8 => "uint8",
        moekit::DType::U32 => "uint32",
        moekit::DType::I32 => "int32",
    }
}

/// A moekit dtype from a name (`float32`/`f32`, `float16`/`f16`/`half`,
/// `bfloat16`/`bf16`).
pub(crate) fn parse_dtype(what: &str, s: &str) -> PyResult<moekit::DType> {
    match s.trim_start_matches("torch.").to_ascii_lowercase().as_str() {
        "float32" | "f32" | "float" => Ok(moekit::DType::F32),
        "float16" | "f16" | "half" => Ok(moekit::DType::F16),
        "bfloat16" | "bf16" => Ok(moekit::DType::Bf16),
        other => Err(MoekitError::new_err(format!(
            "{what}: dtype {other:?} (expected float32, float16 or bfloat16)"
        ))),
    }
}

/// A moekit device from `cpu`, `cuda` or `cuda:N`.
pub(crate) fn parse_device(what: &str, s: &str) -> PyResult<moekit::Device> {
    moekit::Device::parse(s).map_err(|e| MoekitError::new_err(format!("{what}: {e}")))
}

/// Runs `f` with moekit's work for `device` on `stream` (a raw CUDA stream
/// handle of the caller's framework), or on moekit's own stream.
pub(crate) fn on_stream<R>(
    device: moekit::Device,
    stream: Option<usize>,
    f: impl FnOnce() -> moekit::Result<R>,
) -> moekit::Result<R> {
    match (device, stream) {
        (moekit::Device::Cuda(n), Some(s)) => {
            let dev = moekit::cuda::device(n)?;
            // SAFETY: `s` is the current stream of the caller's framework on
            // device n (the Python wrapper passes
            // `torch.cuda.current_stream(device).cuda_stream` or CuPy's), a
            // stream of the primary context that outlives the call; memory
            // allocated inside is freed inside or belongs to an output the
            // caller keeps on that stream.
            unsafe { moekit::cuda::with_stream(&dev, s as _, f) }
        }
        _ => f(),
    }
}

/// The streams of a call on `device`: `(run, ready)`. With the caller's
/// `stream` (its framework's current stream), moekit runs there and imports
/// need no synchronization (`ready` None: the producer's pending work is
/// already ordered before moekit's on that stream). Without, moekit runs on
/// its own stream and producers make their tensors ready for it. CPU: none.
pub(crate) fn streams(
    device: moekit::Device,
    stream: Option<usize>,
) -> PyResult<(Option<usize>, Option<usize>)> {
    match (device, stream) {
        (moekit::Device::Cpu, _) => Ok((None, None)),
        (_, Some(s)) => Ok((Some(s), None)),
        (moekit::Device::Cuda(n), None) => {
            let dev = moekit::cuda::device(n).map_err(err)?;
            let own = Some(dev.stream().cu_stream() as usize);
            Ok((own, own))
        }
    }
}

/// Whether CUDA can be used here, and why not: `(n_devices, None)` or
/// `(0, reason)`.
#[pyfunction]
fn cuda_available() -> (usize, Option<String>) {
    match moekit::cuda::available() {
        Ok(n) => (n, None),
        Err(e) => (0, Some(e.to_string())),
    }
}

/// Waits for moekit's own stream on CUDA device `device` and raises if a
/// kernel reported a data error (an expert id out of range, …) since the
/// last check.
#[pyfunction]
fn _check_cuda_errors(device: usize) -> PyResult<()> {
    let dev = moekit::cuda::device(device).map_err(err)?;
    dev.check_errors().map_err(err)
}

#[pymodule]
fn _moekit(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("MoekitError", m.py().get_type::<MoekitError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<dlpack::Array>()?;
    m.add_class::<layer::Checkpoint>()?;
    m.add_class::<layer::Layer>()?;
    m.add_class::<ops::Experts>()?;
    m.add_function(wrap_pyfunction!(layer::open, m)?)?;
    m.add_function(wrap_pyfunction!(ops::route, m)?)?;
    m.add_function(wrap_pyfunction!(ops::fused_experts, m)?)?;
    m.add_function(wrap_pyfunction!(ops::quantize, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_available, m)?)?;
    m.add_function(wrap_pyfunction!(_check_cuda_errors, m)?)?;
    Ok(())
}
