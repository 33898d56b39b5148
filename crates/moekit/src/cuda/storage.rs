//! Device memory behind a [`Tensor`](crate::Tensor): a stream-ordered
//! allocation, or memory another library owns (a DLPack import), shared by
//! reference count and viewed as a byte range.

use super::CudaDevice;
use crate::error::{cuda_err, Result};
use cudarc::driver::{CudaSlice, DevicePtr};
use std::sync::Arc;

/// The memory a [`CudaBytes`] views.
enum Mem {
    /// moekit's own stream-ordered allocation.
    Owned(CudaSlice<u8>),
    /// Memory another library allocated; `_owner` keeps it alive.
    Borrowed {
        ptr: u64,
        _owner: Box<dyn std::any::Any + Send + Sync>,
    },
}

/// Bytes on a CUDA device.
#[derive(Clone)]
pub struct CudaBytes {
    dev: Arc<CudaDevice>,
    buf: Arc<Mem>,
    offset: usize,
    len: usize,
}

impl std::fmt::Debug for CudaBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBytes(cuda:{}, {} B)", self.dev.ordinal(), self.len)
    }
}

impl CudaBytes {
    /// `len` zero bytes on `dev` (stream-ordered allocation and memset).
    pub fn zeroed(dev: &Arc<CudaDevice>, len: usize) -> Result<CudaBytes> {
        let buf = dev
            .stream()
            .alloc_zeros::<u8>(len.max(1))
            .map_err(cuda_err("alloc_zeros"))?;
        Ok(CudaBytes {
            dev: dev.clone(),
            buf: Arc::new(Mem::Owned(buf)),
            offset: 0,
            len,
        })
    }

    /// `len` uninitialized bytes on `dev` (stream-ordered allocation, no memset):
    /// for scratch that kernels write before they read.
    pub fn uninit(dev: &Arc<CudaDevice>, len: usize) -> Result<CudaBytes> {
        // SAFETY: device memory is never read by the host before a kernel or
        // copy writes it; uninitialized device bytes are not Rust values.
        let buf = unsafe { dev.stream().alloc::<u8>(len.max(1)) }.map_err(cuda_err("alloc"))?;
        Ok(CudaBytes {
            dev: dev.clone(),
            buf: Arc::new(Mem::Owned(buf)),
            offset: 0,
            len,
        })
    }

    /// A view of `len` bytes at device address `ptr` that another library
    /// owns (a DLPack import, a PyTorch tensor); `owner` is dropped, and so
    /// releases the memory, when the last view of it is dropped.
    ///
    /// # Safety
    ///
    /// `ptr .. ptr + len` must be memory of `dev`'s context that stays valid
    /// while `owner` lives, and nothing else may write it while moekit's
    /// work on it is queued.
    pub unsafe fn from_borrowed(
        dev: &Arc<CudaDevice>,
        ptr: u64,
        len: usize,
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> CudaBytes {
        CudaBytes {
            dev: dev.clone(),
            buf: Arc::new(Mem::Borrowed { ptr, _owner: owner }),
            offset: 0,
            len,
        }
    }

    /// A view of `len` bytes at `offset` (clamped to these bytes).
    pub fn slice(&self, offset: usize, len: usize) -> CudaBytes {
        let offset = offset.min(self.len);
        CudaBytes {
            dev: self.dev.clone(),
            buf: self.buf.clone(),
            offset: self.offset + offset,
            len: len.min(self.len - offset),
        }
    }

    /// Zeroes `len` bytes at `offset`, in stream order (capturable).
    pub fn zero_range(&self, offset: usize, len: usize) -> Result<()> {
        crate::error::ensure(
            offset + len <= self.len,
            "zero_range",
            "range",
            format!("inside {} bytes", self.len),
            offset + len,
        )?;
        // SAFETY: the range lies inside this live allocation.
        unsafe {
            cudarc::driver::result::memset_d8_async(
                self.ptr() + offset as u64,
                0,
                len,
                self.dev.stream().cu_stream(),
            )
        }
        .map_err(cuda_err("memset"))
    }

    /// A device copy of host bytes (asynchronous on the device's stream).
    pub fn from_host(dev: &Arc<CudaDevice>, bytes: &[u8]) -> Result<CudaBytes> {
        let buf = match bytes.len() {
            0 => dev.stream().alloc_zeros::<u8>(1),
            _ => dev.stream().clone_htod(bytes),
        }
        .map_err(cuda_err("copy to device"))?;
        Ok(CudaBytes {
            dev: dev.clone(),
            buf: Arc::new(Mem::Owned(buf)),
            offset: 0,
            len: bytes.len(),
        })
    }

    /// Copies the bytes to the host (waits for the stream).
    pub fn to_host(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.len];
        if self.len > 0 {
            let stream = self.dev.stream();
            // SAFETY: the source range lies inside this live allocation; the
            // destination is a host buffer of the same length, alive until
            // the synchronize below.
            unsafe {
                cudarc::driver::result::memcpy_dtoh_async(&mut v, self.ptr(), stream.cu_stream())
            }
            .map_err(cuda_err("copy to host"))?;
            stream.synchronize().map_err(cuda_err("copy to host"))?;
        }
        self.dev.check_errors()?;
        Ok(v)
    }

    /// Copies `src` (same length) into these bytes, in stream order (capturable).
    pub fn copy_from_device(&self, src: &CudaBytes) -> Result<()> {
        crate::error::ensure(
            src.len == self.len,
            "copy_from_device",
            "src",
            format!("{} bytes", self.len),
            src.len,
        )?;
        // SAFETY: both ranges are live allocations of this context of `len` bytes.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                self.ptr(),
                src.ptr(),
                self.len,
                self.dev.stream().cu_stream(),
            )
        }
        .map_err(cuda_err("copy device to device"))
    }

    /// Copies host bytes (same length) into these bytes.
    pub fn copy_from_host(&self, src: &[u8]) -> Result<()> {
        crate::error::ensure(
            src.len() == self.len,
            "copy_from_host",
            "src",
            format!("{} bytes", self.len),
            src.len(),
        )?;
        // SAFETY: the destination is a live allocation of `len` bytes; the source
        // slice outlives the call, which stages pageable memory before returning.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(
                self.ptr(),
                src,
                self.dev.stream().cu_stream(),
            )
        }
        .map_err(cuda_err("copy host to device"))
    }

    /// The device address of the first byte, for kernel arguments.
    pub fn ptr(&self) -> u64 {
        let base = match self.buf.as_ref() {
            Mem::Owned(s) => s.device_ptr(&self.dev.stream()).0,
            Mem::Borrowed { ptr, .. } => *ptr,
        };
        base + self.offset as u64
    }

    /// The device.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.dev
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}
