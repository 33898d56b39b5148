//! DLPack in and out: a tensor of any framework that speaks DLPack (NumPy,
//! PyTorch, CuPy, JAX) viewed as a moekit [`Tensor`] without a copy, and a
//! moekit tensor handed back the same way ([`Array`]).

use crate::err;
use dlpark::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
};
use dlpark::metadata::Dynamic;
use dlpark::python::consumer::stream;
use dlpark::python::{
    export_dlpack, from_dlpack, DlpackExporter, DlpackStream, ExportRequest, ImportedDlpack,
};
use dlpark::{DlpackFlags, Managed, ManagedTensorBase};
use moekit::{Bytes, DType, Device, Tensor};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

/// The imported managed tensor: its deleter runs when the last moekit view
/// of the memory is dropped.
struct Owner(#[allow(dead_code)] ImportedDlpack);
// SAFETY: a DLPack deleter may be called from any thread (the DLPack
// contract; NumPy's takes the GIL itself), and moekit only reads the
// descriptor's memory through its own views.
unsafe impl Send for Owner {}
// SAFETY: as above; the owner is never accessed, only dropped.
unsafe impl Sync for Owner {}

/// How the producer readies an imported CUDA tensor (`__dlpack__(stream=...)`).
enum Consumer {
    /// Order its pending writes before this stream (moekit's own).
    Sync(usize),
    /// Nothing to do: moekit runs on the producer's current stream (-1).
    NoSync,
}

// SAFETY: `Sync`'s handle is moekit's own stream of the tensor's device,
// live for the whole process; `NoSync` names no stream.
unsafe impl DlpackStream for Consumer {
    fn as_python_arg(&self, _py: Python<'_>, _device: DLDevice) -> PyResult<stream::StreamArg> {
        Ok(match self {
            Consumer::Sync(s) => stream::cuda(*s as *mut std::ffi::c_void),
            Consumer::NoSync => stream::no_sync(),
        })
    }
}

/// What an argument's elements may be.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Any supported element type, as it is (weight storage).
    Raw,
    /// f32, f16 or bf16 activations.
    Float,
    /// Expert ids: int32 or uint32 (as moekit's u32; negative ids become
    /// out of range and are refused).
    Ids,
    /// f32 only (routing weights).
    F32,
}

fn dtype_of(d: DLDataType) -> Option<DType> {
    if d.lanes != 1 {
        return None;
    }
    match (d.code, d.bits) {
        (DLDataTypeCode::FLOAT, 32) => Some(DType::F32),
        (DLDataTypeCode::FLOAT, 16) => Some(DType::F16),
        (DLDataTypeCode::BFLOAT, 16) => Some(DType::Bf16),
        (DLDataTypeCode::UINT, 32) => Some(DType::U32),
        (DLDataTypeCode::INT, 32) => Some(DType::I32),
        (DLDataTypeCode::UINT, 8) => Some(DType::U8),
        _ => None,
    }
}

fn dl_dtype(d: DType) -> DLDataType {
    let (code, bits) = match d {
        DType::F32 => (DLDataTypeCode::FLOAT, 32),
        DType::F16 => (DLDataTypeCode::FLOAT, 16),
        DType::Bf16 => (DLDataTypeCode::BFLOAT, 16),
        DType::U8 => (DLDataTypeCode::UINT, 8),
        DType::U32 => (DLDataTypeCode::UINT, 32),
        DType::I32 => (DLDataTypeCode::INT, 32),
    };
    DLDataType::scalar(code, bits)
}

fn describe(d: DLDataType) -> String {
    let name = match d.code {
        DLDataTypeCode::FLOAT => "float",
        DLDataTypeCode::BFLOAT => "bfloat",
        DLDataTypeCode::INT => "int",
        DLDataTypeCode::UINT => "uint",
        _ => "type code ",
    };
    if d.lanes == 1 {
        format!("{name}{}", d.bits)
    } else {
        format!("{name}{}x{}", d.bits, d.lanes)
    }
}

/// The moekit device of a DLPack device, or a Python error naming `what`.
fn device_of(what: &str, d: DLDevice) -> PyResult<Device> {
    match d.device_type {
        DLDeviceType::CPU => Ok(Device::Cpu),
        DLDeviceType::CUDA => Ok(Device::Cuda(d.device_id.max(0) as usize)),
        t => Err(PyValueError::new_err(format!(
            "{what}: a tensor on DLPack device type {} (only CPU and CUDA memory are supported)",
            t.0
        ))),
    }
}

/// Views `obj` (anything with `__dlpack__`) as a moekit tensor of `kind`,
/// without a copy. `cuda_stream`: for a CUDA tensor, the stream the producer
/// must make it ready on (moekit's own stream); None: no synchronization,
/// because moekit runs on the producer's current stream (see
/// [`crate::streams`]).
pub fn import(
    obj: &Bound<'_, PyAny>,
    what: &str,
    kind: Kind,
    cuda_stream: Option<usize>,
) -> PyResult<Tensor> {
    if !obj.hasattr("__dlpack__")? {
        return Err(PyTypeError::new_err(format!(
            "{what}: expected a tensor that supports DLPack (NumPy, PyTorch, CuPy, JAX), got {}",
            obj.get_type().name()?
        )));
    }
    let dev = dlpark::python::dlpack_device(obj.as_borrowed())?;
    let is_cuda = dev.device_type == DLDeviceType::CUDA;
    let arg = match (is_cuda, cuda_stream) {
        (true, Some(s)) => Some(Consumer::Sync(s)),
        (true, None) => Some(Consumer::NoSync),
        (false, _) => None,
    };
    let imported = from_dlpack(
        obj.as_borrowed(),
        arg.as_ref().map(|a| a as &dyn DlpackStream),
        None,
    )?;
    let r = imported
        .validate()
        .map_err(|e| PyValueError::new_err(format!("{what}: an invalid DLPack tensor ({e})")))?;
    let device = device_of(what, r.device())?;
    let dl = r.dtype();
    let dtype = dtype_of(dl).ok_or_else(|| {
        PyTypeError::new_err(format!(
            "{what}: element type {} is not supported (expected {})",
            describe(dl),
            expected(kind)
        ))
    })?;
    let dtype = match (kind, dtype) {
        (Kind::Float, DType::F32 | DType::F16 | DType::Bf16) => dtype,
        (Kind::F32, DType::F32) => dtype,
        (Kind::Ids, DType::U32 | DType::I32) => DType::U32,
        (Kind::Raw, d) => d,
        _ => {
            return Err(PyTypeError::new_err(format!(
                "{what}: element type {} (expected {})",
                describe(dl),
                expected(kind)
            )))
        }
    };
    let compact = r
        .is_compact()
        .map_err(|e| PyValueError::new_err(format!("{what}: an invalid DLPack layout ({e})")))?;
    if !compact {
        return Err(PyValueError::new_err(format!(
            "{what}: a non-contiguous tensor (strides {:?} for shape {:?}); pass a contiguous one \
             (e.g. .contiguous() / np.ascontiguousarray)",
            r.strides().unwrap_or(&[]),
            r.shape()
        )));
    }
    let shape: Vec<usize> = r.shape().iter().map(|&s| s.max(0) as usize).collect();
    let nbytes = shape
        .iter()
        .try_fold(dtype.size(), |n, &d| n.checked_mul(d))
        .ok_or_else(|| PyValueError::new_err(format!("{what}: shape {shape:?} overflows")))?;
    if what == "out" && imported.flags().contains(DlpackFlags::READ_ONLY) {
        return Err(PyValueError::new_err(
            "out: a read-only tensor (moekit writes the output into it)",
        ));
    }
    let base = r.data_ptr() as usize + r.byte_offset() as usize;
    let align = dtype.size().max(if is_cuda { 16 } else { 1 });
    if nbytes > 0 && !base.is_multiple_of(align) {
        return Err(PyValueError::new_err(format!(
            "{what}: data at address {base:#x} is not {align}-byte aligned (moekit's kernels load \
             it in 16-byte pieces); pass a tensor that starts at an aligned address, e.g. a copy"
        )));
    }
    let owner: Box<dyn std::any::Any + Send + Sync> = Box::new(Owner(imported));
    match device {
        Device::Cpu => {
            // SAFETY: the DLPack contract: `nbytes` bytes at `base` stay valid
            // while the managed tensor (kept in `owner`) lives.
            let bytes = unsafe { Bytes::external(base as *mut u8, nbytes, owner) };
            Tensor::from_bytes(dtype, &shape, bytes).map_err(err)
        }
        Device::Cuda(n) => {
            let dev = moekit::cuda::device(n).map_err(err)?;
            // SAFETY: as above, device memory of device n, which the runtime
            // and moekit share through the primary context.
            let bytes =
                unsafe { moekit::cuda::CudaBytes::from_borrowed(&dev, base as u64, nbytes, owner) };
            Tensor::from_cuda_bytes(dtype, &shape, bytes).map_err(err)
        }
    }
}

/// [`import`] of any supported element type, on the producer's own stream.
pub fn import_raw(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Tensor> {
    let d = device_hint(obj)?;
    import(obj, what, Kind::Raw, crate::streams(d, None)?.1)
}

/// The device `obj` says its data is on (`__dlpack_device__`), before import.
pub fn device_hint(obj: &Bound<'_, PyAny>) -> PyResult<Device> {
    if !obj.hasattr("__dlpack_device__")? {
        return Ok(Device::Cpu);
    }
    let d = dlpark::python::dlpack_device(obj.as_borrowed())?;
    device_of("tensor", d)
}

fn expected(kind: Kind) -> &'static str {
    match kind {
        Kind::Raw => "float32, float16, bfloat16, uint8, int32 or uint32",
        Kind::Float => "float32, float16 or bfloat16",
        Kind::Ids => "int32 or uint32",
        Kind::F32 => "float32",
    }
}

/// Expert ids (`u32`, every id < 1024) as `int32`, the type engines use
/// (vLLM's `topk_ids`): the same bits, no copy.
pub fn ids_as_i32(t: Tensor) -> moekit::Result<Tensor> {
    let shape = t.shape().to_vec();
    match t.storage() {
        moekit::tensor::Storage::Cpu(b) => Tensor::from_bytes(DType::I32, &shape, b.clone()),
        moekit::tensor::Storage::Cuda(c) => Tensor::from_cuda_bytes(DType::I32, &shape, c.clone()),
    }
}

/// A moekit tensor handed to Python: any framework takes it through DLPack
/// (`torch.from_dlpack(a)`, `np.from_dlpack(a)`, `jax.dlpack.from_dlpack(a)`);
/// NumPy also through `np.asarray(a)` for CPU tensors.
#[pyclass(module = "moekit._moekit", frozen)]
pub struct Array {
    /// Shared with every DLPack export (no copy).
    pub(crate) t: std::sync::Arc<Tensor>,
    /// The CUDA stream the tensor was produced on (synchronized before an
    /// export to another stream).
    pub(crate) stream: Option<usize>,
}

impl Array {
    /// Hands `t` to Python; `stream`: the CUDA stream it was produced on.
    pub fn new(t: Tensor, stream: Option<usize>) -> Array {
        Array {
            t: std::sync::Arc::new(t),
            stream,
        }
    }

    fn data_ptr(&self) -> PyResult<*mut std::ffi::c_void> {
        Ok(match self.t.device() {
            Device::Cpu => self.t.bytes().map_err(err)?.as_ptr() as *mut _,
            Device::Cuda(_) => self.t.cuda_bytes().map_err(err)?.ptr() as *mut _,
        })
    }

    fn export<M: ManagedTensorBase>(&self) -> PyResult<Managed<M>> {
        let shape: Vec<i64> = self.t.shape().iter().map(|&s| s as i64).collect();
        let mut init = Dynamic::compact(shape)
            .initialize_as::<M>(self.t.clone())
            .map_err(|e| PyValueError::new_err(format!("DLPack export: {e}")))?;
        init.set_data(self.data_ptr()?);
        init.set_dtype(dl_dtype(self.t.dtype()));
        init.set_device(self.dl_device());
        // SAFETY: data and metadata stay valid while the managed tensor's
        // context (a reference to this very tensor, owning its memory) lives.
        Ok(unsafe { init.finish() })
    }

    fn dl_device(&self) -> DLDevice {
        match self.t.device() {
            Device::Cpu => DLDevice::CPU,
            Device::Cuda(n) => DLDevice::cuda(n as i32),
        }
    }
}

impl DlpackExporter for Array {
    fn device(&self) -> DLDevice {
        self.dl_device()
    }
    fn flags(&self) -> DlpackFlags {
        DlpackFlags::empty()
    }
    fn prepare_export(&self, _py: Python<'_>, _request: &ExportRequest<'_>) -> PyResult<()> {
        if let (Device::Cuda(n), Some(s)) = (self.t.device(), self.stream) {
            let dev = moekit::cuda::device(n).map_err(err)?;
            // SAFETY: `s` is the caller's stream the tensor was produced on
            // (moekit::cuda::with_stream's contract, held by `Layer.__call__`).
            unsafe { moekit::cuda::with_stream(&dev, s as _, || dev.synchronize()) }
                .map_err(err)?;
        }
        Ok(())
    }
    fn export_legacy(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensor>> {
        self.export()
    }
    fn export_versioned(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensorVersioned>> {
        self.export()
    }
}

#[pymethods]
impl Array {
    /// DLPack export (the Python array API protocol).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(u32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let req = ExportRequest::parse(stream.as_ref(), max_version, dl_device, copy)?;
        export_dlpack(self, py, req)
    }

    /// `(device type, device id)`: (1, 0) for the CPU, (2, n) for CUDA device n.
    fn __dlpack_device__(&self) -> (u32, i32) {
        let d = self.dl_device();
        (d.device_type.0, d.device_id)
    }

    /// The shape.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.t.shape().to_vec()
    }

    /// The element type's name (`float32`, `bfloat16`, …).
    #[getter]
    fn dtype(&self) -> String {
        crate::dtype_name(self.t.dtype()).to_string()
    }

    /// `cpu` or `cuda:N`.
    #[getter]
    fn device(&self) -> String {
        self.t.device().to_string()
    }

    fn __repr__(&self) -> String {
        format!(
            "moekit.Array(shape={:?}, dtype={}, device={})",
            self.t.shape(),
            self.dtype(),
            self.t.device()
        )
    }
}
