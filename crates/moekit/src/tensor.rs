//! A minimal contiguous tensor: dtype + shape + storage.
//!
//! Storage is either owned (8-byte aligned) or a borrowed view of shared
//! memory such as a memory-mapped checkpoint ([`Bytes::shared`]), so weights
//! are used in place without a copy.

use crate::device::Device;
use crate::dtype::{DType, Element, Float};
use crate::error::{ensure, invalid, Result};
use half::{bf16, f16};
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

/// Raw bytes of a tensor on the host.
pub enum Bytes {
    /// Owned, 8-byte aligned (backed by `u64` words).
    Owned {
        /// Backing words.
        words: Vec<u64>,
        /// Length in bytes (≤ 8 · words.len()).
        len: usize,
    },
    /// A byte range of shared memory (an mmap, a loaded file).
    Shared {
        /// The memory.
        data: Arc<dyn AsRef<[u8]> + Send + Sync>,
        /// The range viewed.
        range: Range<usize>,
    },
    /// Memory another library owns (a NumPy array, a DLPack import), read
    /// and written in place. A clone is a read-only [`Bytes::Shared`] view
    /// of it (copied on its first write), so only this value writes.
    External(Arc<External>),
}

/// Host memory another library owns; see [`Bytes::external`].
pub struct External {
    ptr: *mut u8,
    len: usize,
    _owner: Box<dyn std::any::Any + Send + Sync>,
}

// SAFETY: `Bytes::external`'s contract: the memory stays valid while the
// owner lives and only moekit accesses it meanwhile; the owner is Send + Sync.
unsafe impl Send for External {}
// SAFETY: as above; shared access is read-only (`Bytes::make_mut` needs
// `&mut Bytes`, and clones are read-only views).
unsafe impl Sync for External {}

impl AsRef<[u8]> for External {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `Bytes::external`'s contract: `len` valid bytes at `ptr`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Owned host buffers from this size on ask for transparent huge pages.
pub const HUGE_PAGES_MIN: usize = 4 << 20;

/// Environment variable: `0` turns [`advise_huge_pages`] off (read once).
pub const HUGE_PAGES_ENV: &str = "MOEKIT_HUGE_PAGES";

/// Asks the kernel (`madvise(MADV_HUGEPAGE)`) to back the whole 2 MiB pages
/// inside `buf` with transparent huge pages, where the system's THP mode is
/// `madvise` (the mode `always` needs no advice; `never` ignores it). The
/// CPU kernels stream expert weights: with 4 KiB pages a core misses the
/// TLB every 4 KiB of a row walk. On a 2-core Zen 4 VM (THP mode
/// `madvise`, qwen3-30b-a3b on synthetic weights, 2 threads, 4 alternating
/// rounds) the advice took Q4_0 T = 1 / 8 from 0.89 / 7.54 to 0.80 / 6.77
/// ms, Q4_K from 0.93 / 7.02 to 0.81 / 6.57, Q8_0 T = 8 9.9 → 9.4. A hint:
/// an error (an old kernel, THP off) changes nothing, and the memory stays
/// valid either way. Weights mapped from a file (a GGUF or safetensors
/// checkpoint, used in place) stay on the page cache's 4 KiB pages.
/// [`HUGE_PAGES_ENV`] turns the advice off.
pub fn advise_huge_pages(buf: &[u8]) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let on = *ON.get_or_init(|| std::env::var(HUGE_PAGES_ENV).map_or(true, |v| v.trim() != "0"));
    if !on {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = (buf.as_ptr() as usize).next_multiple_of(HUGE);
        let end = (buf.as_ptr() as usize + buf.len()) / HUGE * HUGE;
        if end > start {
            // SAFETY: `start..end` lies inside `buf` (rounded inwards to
            // whole 2 MiB pages), memory this process maps; MADV_HUGEPAGE
            // only changes how the kernel backs it, not its contents or
            // validity.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = buf;
}

impl Clone for Bytes {
    fn clone(&self) -> Bytes {
        match self {
            // A large copy asks for huge pages too (`Bytes::zeroed`).
            Bytes::Owned { len, .. } if *len >= HUGE_PAGES_MIN => Bytes::copy_from(self.as_slice()),
            Bytes::Owned { words, len } => Bytes::Owned {
                words: words.clone(),
                len: *len,
            },
            Bytes::Shared { data, range } => Bytes::Shared {
                data: data.clone(),
                range: range.clone(),
            },
            Bytes::External(e) => Bytes::Shared {
                range: 0..e.len,
                data: e.clone(),
            },
        }
    }
}

impl Bytes {
    /// `len` zero bytes, owned. On Linux, a buffer of at least
    /// [`HUGE_PAGES_MIN`] bytes is advised to transparent huge pages before
    /// its first write (see [`advise_huge_pages`]).
    pub fn zeroed(len: usize) -> Bytes {
        let words = vec![0u64; len.div_ceil(8)];
        if len >= HUGE_PAGES_MIN {
            advise_huge_pages(bytemuck::cast_slice(&words));
        }
        Bytes::Owned { words, len }
    }

    /// A copy of `src`, owned and aligned.
    pub fn copy_from(src: &[u8]) -> Bytes {
        let mut b = Bytes::zeroed(src.len());
        b.as_mut_slice_unchecked().copy_from_slice(src);
        b
    }

    /// A view of `range` inside shared memory; errors if out of bounds.
    pub fn shared(data: Arc<dyn AsRef<[u8]> + Send + Sync>, range: Range<usize>) -> Result<Bytes> {
        let total = (*data).as_ref().len();
        ensure(
            range.start <= range.end && range.end <= total,
            "shared",
            "range",
            format!("a range inside 0..{total}"),
            format!("{range:?}"),
        )?;
        Ok(Bytes::Shared { data, range })
    }

    /// `len` bytes at `ptr` that another library owns (a NumPy array's
    /// buffer, a DLPack import), used in place: moekit reads them, and
    /// writes them where this value is written ([`Tensor::copy_from`],
    /// [`MoeBlock::forward_into`](crate::MoeBlock::forward_into)). `owner`
    /// is dropped, and so may release the memory, with the last view.
    ///
    /// # Safety
    ///
    /// `ptr .. ptr + len` must be valid for reads and writes (readable only
    /// if this value is never written) while `owner` lives, and nothing else
    /// may access it while moekit uses it.
    pub unsafe fn external(
        ptr: *mut u8,
        len: usize,
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> Bytes {
        Bytes::External(Arc::new(External {
            ptr,
            len,
            _owner: owner,
        }))
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Owned { words, len } => &bytemuck::cast_slice::<u64, u8>(words)[..*len],
            Bytes::Shared { data, range } => &(**data).as_ref()[range.clone()],
            Bytes::External(e) => (**e).as_ref(),
        }
    }

    fn as_mut_slice_unchecked(&mut self) -> &mut [u8] {
        match self {
            Bytes::Owned { words, len } => &mut bytemuck::cast_slice_mut::<u64, u8>(words)[..*len],
            Bytes::Shared { .. } => &mut [],
            Bytes::External(e) if e.len > 0 => {
                // SAFETY: `Bytes::external`'s contract (valid for writes while the
                // owner lives); this value is the only writer (clones are
                // read-only Shared views) and `&mut self` is exclusive.
                unsafe { std::slice::from_raw_parts_mut(e.ptr, e.len) }
            }
            Bytes::External(_) => &mut [],
        }
    }

    /// Mutable bytes; shared views are first copied into owned storage.
    pub fn make_mut(&mut self) -> &mut [u8] {
        if let Bytes::Shared { .. } = self {
            *self = Bytes::copy_from(self.as_slice());
        }
        self.as_mut_slice_unchecked()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bytes::Owned { len, .. } => write!(f, "Bytes::Owned({len} B)"),
            Bytes::Shared { range, .. } => write!(f, "Bytes::Shared({range:?})"),
            Bytes::External(e) => write!(f, "Bytes::External({} B)", e.len),
        }
    }
}

/// Where a tensor's bytes live.
#[derive(Debug, Clone)]
pub enum Storage {
    /// Host memory.
    Cpu(Bytes),
    /// CUDA device memory.
    Cuda(crate::cuda::CudaBytes),
}

/// A contiguous, row-major tensor.
#[derive(Debug, Clone)]
pub struct Tensor {
    dtype: DType,
    shape: Vec<usize>,
    storage: Storage,
}

fn numel_of(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn shape_str(shape: &[usize]) -> String {
    format!("{shape:?}")
}

impl Tensor {
    /// Wraps bytes as a tensor; the byte length must match dtype × shape.
    pub fn from_bytes(dtype: DType, shape: &[usize], bytes: Bytes) -> Result<Tensor> {
        let need = numel_of(shape) * dtype.size();
        ensure(
            bytes.len() == need,
            "from_bytes",
            "bytes",
            format!("{need} bytes for {dtype} {}", shape_str(shape)),
            format!("{} bytes", bytes.len()),
        )?;
        Ok(Tensor {
            dtype,
            shape: shape.to_vec(),
            storage: Storage::Cpu(bytes),
        })
    }

    /// A zero-filled tensor on the CPU.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
        Tensor {
            dtype,
            shape: shape.to_vec(),
            storage: Storage::Cpu(Bytes::zeroed(numel_of(shape) * dtype.size())),
        }
    }

    /// A CPU tensor holding a copy of `data`.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize]) -> Result<Tensor> {
        ensure(
            data.len() == numel_of(shape),
            "from_slice",
            "data",
            format!(
                "{} elements for shape {}",
                numel_of(shape),
                shape_str(shape)
            ),
            format!("{} elements", data.len()),
        )?;
        Ok(Tensor {
            dtype: T::DTYPE,
            shape: shape.to_vec(),
            storage: Storage::Cpu(Bytes::copy_from(bytemuck::cast_slice(data))),
        })
    }

    /// A CPU tensor of float dtype `dtype` from f32 values (rounded).
    pub fn from_f32(data: &[f32], shape: &[usize], dtype: DType) -> Result<Tensor> {
        match dtype {
            DType::F32 => Tensor::from_slice(data, shape),
            DType::F16 => Tensor::from_slice(&convert::<f16>(data), shape),
            DType::Bf16 => Tensor::from_slice(&convert::<bf16>(data), shape),
            other => Err(invalid("from_f32", "dtype", "f32, f16 or bf16", other)),
        }
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        numel_of(&self.shape)
    }

    /// Size of the data in bytes.
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }

    /// Device of the storage.
    pub fn device(&self) -> Device {
        match &self.storage {
            Storage::Cpu(_) => Device::Cpu,
            Storage::Cuda(c) => Device::Cuda(c.device().ordinal()),
        }
    }

    /// The raw host bytes (an error for a device tensor: copy it with [`Tensor::to_device`]).
    pub fn bytes(&self) -> Result<&[u8]> {
        match &self.storage {
            Storage::Cpu(b) => Ok(b.as_slice()),
            Storage::Cuda(_) => Err(on_device("bytes", self.device())),
        }
    }

    /// The raw host bytes, mutable (a shared view is copied first).
    pub fn bytes_mut(&mut self) -> Result<&mut [u8]> {
        let dev = self.device();
        match &mut self.storage {
            Storage::Cpu(b) => Ok(b.make_mut()),
            Storage::Cuda(_) => Err(on_device("bytes_mut", dev)),
        }
    }

    /// The device bytes of a CUDA tensor.
    pub fn cuda_bytes(&self) -> Result<&crate::cuda::CudaBytes> {
        match &self.storage {
            Storage::Cuda(c) => Ok(c),
            Storage::Cpu(_) => Err(invalid(
                "cuda_bytes",
                "tensor",
                "a CUDA tensor",
                "a CPU tensor",
            )),
        }
    }

    /// A zero-filled tensor on `device`.
    pub fn zeros_on(dtype: DType, shape: &[usize], device: Device) -> Result<Tensor> {
        Tensor::alloc_on(dtype, shape, device, true)
    }

    /// A tensor on `device` whose contents are unspecified until written
    /// (zeros on the CPU; no memset on a GPU): scratch that kernels fill.
    pub(crate) fn uninit_on(dtype: DType, shape: &[usize], device: Device) -> Result<Tensor> {
        Tensor::alloc_on(dtype, shape, device, false)
    }

    fn alloc_on(dtype: DType, shape: &[usize], device: Device, zero: bool) -> Result<Tensor> {
        let Device::Cuda(n) = device else {
            return Ok(Tensor::zeros(dtype, shape));
        };
        let dev = crate::cuda::device(n)?;
        let len = numel_of(shape) * dtype.size();
        let b = if zero {
            crate::cuda::CudaBytes::zeroed(&dev, len)?
        } else {
            crate::cuda::CudaBytes::uninit(&dev, len)?
        };
        Ok(Tensor {
            dtype,
            shape: shape.to_vec(),
            storage: Storage::Cuda(b),
        })
    }

    /// A copy on `device` (the same tensor if it is already there).
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        let storage = match (&self.storage, device) {
            (Storage::Cpu(b), Device::Cuda(n)) => Storage::Cuda(crate::cuda::CudaBytes::from_host(
                &crate::cuda::device(n)?,
                b.as_slice(),
            )?),
            (Storage::Cuda(c), Device::Cpu) => Storage::Cpu(Bytes::copy_from(&c.to_host()?)),
            (Storage::Cuda(c), Device::Cuda(n)) => Storage::Cuda(
                crate::cuda::CudaBytes::from_host(&crate::cuda::device(n)?, &c.to_host()?)?,
            ),
            (Storage::Cpu(_), Device::Cpu) => self.storage.clone(),
        };
        Ok(Tensor {
            dtype: self.dtype,
            shape: self.shape.clone(),
            storage,
        })
    }

    /// The storage.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// The same data with a new shape of equal element count.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        ensure(
            numel_of(shape) == self.numel(),
            "reshape",
            "shape",
            format!("{} elements", self.numel()),
            format!("{} ({} elements)", shape_str(shape), numel_of(shape)),
        )?;
        Ok(Tensor {
            shape: shape.to_vec(),
            ..self.clone()
        })
    }

    /// Wraps device bytes as a tensor; the length must match dtype × shape.
    pub fn from_cuda_bytes(
        dtype: DType,
        shape: &[usize],
        bytes: crate::cuda::CudaBytes,
    ) -> Result<Tensor> {
        let need = numel_of(shape) * dtype.size();
        ensure(
            bytes.len() == need,
            "from_cuda_bytes",
            "bytes",
            format!("{need} bytes"),
            bytes.len(),
        )?;
        Ok(Tensor {
            dtype,
            shape: shape.to_vec(),
            storage: Storage::Cuda(bytes),
        })
    }

    /// Copies `src` (same dtype and shape, any device) into this tensor's
    /// storage in place — on a CUDA tensor without reallocating, so the
    /// address stays valid for a captured CUDA graph.
    pub fn copy_from(&mut self, src: &Tensor) -> Result<()> {
        const OP: &str = "copy_from";
        ensure(
            src.dtype == self.dtype,
            OP,
            "src",
            format!("dtype {}", self.dtype),
            src.dtype,
        )?;
        ensure(
            src.shape == self.shape,
            OP,
            "src",
            format!("shape {:?}", self.shape),
            format!("{:?}", src.shape),
        )?;
        match (&mut self.storage, &src.storage) {
            (Storage::Cuda(d), Storage::Cuda(s)) => d.copy_from_device(s),
            (Storage::Cuda(d), Storage::Cpu(s)) => d.copy_from_host(s.as_slice()),
            (Storage::Cpu(d), Storage::Cpu(s)) => {
                d.make_mut().copy_from_slice(s.as_slice());
                Ok(())
            }
            (Storage::Cpu(d), Storage::Cuda(s)) => {
                d.make_mut().copy_from_slice(&s.to_host()?);
                Ok(())
            }
        }
    }

    /// Typed view of the data; errors on a dtype mismatch or misaligned view.
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        ensure(
            self.dtype == T::DTYPE,
            "as_slice",
            "T",
            self.dtype,
            T::DTYPE,
        )?;
        let b = self.bytes()?;
        bytemuck::try_cast_slice(b).map_err(|e| {
            invalid(
                "as_slice",
                "storage",
                format!("{}-byte aligned data", std::mem::align_of::<T>()),
                e,
            )
        })
    }

    /// Mutable typed view (a shared view is copied first).
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        ensure(
            self.dtype == T::DTYPE,
            "as_mut_slice",
            "T",
            self.dtype,
            T::DTYPE,
        )?;
        let b = self.bytes_mut()?;
        bytemuck::try_cast_slice_mut(b).map_err(|e| {
            invalid(
                "as_mut_slice",
                "storage",
                format!("{}-byte aligned data", std::mem::align_of::<T>()),
                e,
            )
        })
    }

    /// The values widened to f32 (float dtypes only).
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        match self.dtype {
            DType::F32 => Ok(self.as_slice::<f32>()?.to_vec()),
            DType::F16 => Ok(widen(self.as_slice::<f16>()?)),
            DType::Bf16 => Ok(widen(self.as_slice::<bf16>()?)),
            other => Err(invalid("to_f32_vec", "dtype", "f32, f16 or bf16", other)),
        }
    }

    /// A copy with float dtype `dtype`.
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype {
            return Ok(self.clone());
        }
        Tensor::from_f32(&self.to_f32_vec()?, &self.shape, dtype)
    }
}

fn on_device(op: &'static str, d: Device) -> crate::Error {
    invalid(
        op,
        "tensor",
        "a CPU tensor (copy it with to_device(Device::Cpu))",
        format!("a tensor on {d}"),
    )
}

/// Rounds f32 values to a float type.
pub fn convert<T: Float>(v: &[f32]) -> Vec<T> {
    v.iter().map(|&x| T::from_f32(x)).collect()
}

/// Widens float values to f32.
pub fn widen<T: Float>(v: &[T]) -> Vec<f32> {
    v.iter().map(|&x| x.to_f32()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_owned_bytes_are_advised_and_clone_equal() {
        // Below, at and above the advised size, and a buffer with no whole
        // 2 MiB page in it: contents as written, clones equal and owned.
        for len in [
            0,
            1,
            4097,
            HUGE_PAGES_MIN - 1,
            HUGE_PAGES_MIN,
            HUGE_PAGES_MIN + 12345,
        ] {
            let mut b = Bytes::zeroed(len);
            assert_eq!(b.len(), len);
            assert!(b.as_slice().iter().all(|&v| v == 0));
            for (i, v) in b.make_mut().iter_mut().enumerate() {
                *v = (i % 251) as u8;
            }
            let c = b.clone();
            assert!(matches!(c, Bytes::Owned { .. }));
            assert_eq!(c.as_slice(), b.as_slice(), "len {len}");
        }
        advise_huge_pages(&[]);
        advise_huge_pages(&[1, 2, 3]);
    }

    #[test]
    fn roundtrip_and_reshape() {
        let t = Tensor::from_f32(&[1.0, 2.0, 3.0, 4.0], &[2, 2], DType::Bf16).unwrap();
        assert_eq!(t.to_f32_vec().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        assert!(t.reshape(&[3]).is_err());
        assert_eq!(t.reshape(&[4]).unwrap().shape(), &[4]);
        assert!(t.as_slice::<f32>().is_err());
    }

    #[test]
    fn shared_view_is_zero_copy_and_bounds_checked() {
        let mem: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(vec![0u8; 64]);
        assert!(Bytes::shared(mem.clone(), 8..72).is_err());
        let b = Bytes::shared(mem.clone(), 8..24).unwrap();
        let t = Tensor::from_bytes(DType::F32, &[4], b).unwrap();
        assert_eq!(t.as_slice::<f32>().unwrap(), &[0.0; 4]);
        assert!(Tensor::from_bytes(DType::F32, &[5], Bytes::zeroed(16)).is_err());
    }
}
