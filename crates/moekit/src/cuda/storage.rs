//! Device memory behind a [`Tensor`](crate::Tensor): a stream-ordered
//! allocation shared by reference count, viewed as a byte range.

use super::CudaDevice;
use crate::error::{cuda_err, Result};
use cudarc::driver::{CudaSlice, DevicePtr};
use std::sync::Arc;

/// Bytes on a CUDA device.
#[derive(Clone)]
pub struct CudaBytes {
    dev: Arc<CudaDevice>,
    buf: Arc<CudaSlice<u8>>,
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
            buf: Arc::new(buf),
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
            buf: Arc::new(buf),
            offset: 0,
            len,
        })
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
            buf: Arc::new(buf),
            offset: 0,
            len: bytes.len(),
        })
    }

    /// Copies the bytes to the host (waits for the stream).
    pub fn to_host(&self) -> Result<Vec<u8>> {
        let all = self
            .dev
            .stream()
            .clone_dtoh(self.buf.as_ref())
            .map_err(cuda_err("copy to host"))?;
        self.dev.check_errors()?;
        Ok(all[self.offset..self.offset + self.len].to_vec())
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
        let (p, _guard) = self.buf.device_ptr(self.dev.stream());
        p + self.offset as u64
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
