//! `kernels/bench.cu`: the device's measured read bandwidth, the roofline
//! every benchmark result is compared with; and, for context, its cuBLAS
//! bf16 GEMM rate.

use super::{launch_ordered, Geometry, Order};
use crate::cuda::jit::Source;
use crate::cuda::CudaDevice;
use crate::error::{cublas_err, cuda_err, invalid, Error, Result};
use cudarc::cublas::{result as blas, sys as blas_sys, CudaBlas};
use cudarc::driver::{DevicePtr, DevicePtrMut};
use rayon::prelude::*;

static SRC: Source = Source {
    name: "bench.cu",
    text: include_str!("../../../kernels/bench.cu"),
};

#[repr(C)]
#[derive(Clone, Copy)]
struct ReadParams {
    src: u64,
    sink: u64,
    n_words: u64,
}
const _: () = assert!(std::mem::size_of::<ReadParams>() == 24);
// SAFETY: plain-old-data mirrored by the kernel's ReadParams.
unsafe impl cudarc::driver::DeviceRepr for ReadParams {}

/// Instances for the compile check.
pub fn instances() -> Vec<(&'static Source, String)> {
    vec![(&SRC, "moekit::read_words".to_string())]
}

/// Times `f` (which enqueues work on the device's stream) with CUDA events:
/// one warm-up, then `reps` runs; returns the median in milliseconds.
pub fn time_ms(dev: &CudaDevice, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let ctx = dev.context();
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        let a = ctx
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(cuda_err("new_event"))?;
        let b = ctx
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(cuda_err("new_event"))?;
        a.record(&dev.stream()).map_err(cuda_err("event record"))?;
        f()?;
        b.record(&dev.stream()).map_err(cuda_err("event record"))?;
        b.synchronize().map_err(cuda_err("event sync"))?;
        times.push(a.elapsed_ms(&b).map_err(cuda_err("elapsed"))? as f64);
    }
    dev.check_errors()?;
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Read bandwidth in GB/s: median of 20 reads of a `bytes`-byte buffer.
pub fn read_bandwidth(dev: &CudaDevice, bytes: usize) -> Result<f64> {
    let n_words = bytes / 16;
    let src = dev
        .stream()
        .alloc_zeros::<u8>(n_words * 16)
        .map_err(cuda_err("alloc"))?;
    let blocks = dev.sm_count() * 8;
    let sink = dev
        .stream()
        .alloc_zeros::<u32>(blocks as usize)
        .map_err(cuda_err("alloc"))?;
    let stream = dev.stream();
    let (sp, _g1) = src.device_ptr(&stream);
    let (kp, _g2) = sink.device_ptr(&stream);
    let p = ReadParams {
        src: sp,
        sink: kp,
        n_words: n_words as u64,
    };
    let geo = Geometry {
        grid: (blocks, 1, 1),
        block: (512, 1, 1),
        shared: 0,
    };
    let ms = time_ms(dev, 20, || {
        // SAFETY: src holds n_words 16-byte words and sink one word per block.
        unsafe {
            launch_ordered(
                dev,
                &SRC,
                "moekit::read_words",
                geo,
                p,
                "read_words",
                Order::Stream,
            )
        }
    })?;
    Ok((n_words * 16) as f64 / (ms * 1e-3) / 1e9)
}

/// Default matrix size of [`bf16_gemm_tflops`].
pub const GEMM_N: usize = 8192;

/// Dense bf16 GEMM rate of cuBLAS in TFLOP/s: C = A·B with n×n matrices,
/// bf16 inputs and output, f32 accumulation (`CUBLAS_COMPUTE_32F`).
///
/// A and B hold pseudo-random values in [-1, 1) (all-zero operands can run
/// faster than real data on power-limited GPUs). Two warm-up GEMMs, then the
/// median of 20 timed by [`time_ms`]; the rate is 2·n³ / seconds / 1e12.
/// Errors if libcublas cannot be loaded, instead of panicking.
pub fn bf16_gemm_tflops(dev: &CudaDevice, n: usize) -> Result<f64> {
    const OP: &str = "bf16_gemm_tflops";
    let (dim, elems) = match (i32::try_from(n), n.checked_mul(n)) {
        (Ok(d), Some(e)) if d > 0 => (d, e),
        _ => return Err(invalid(OP, "n", "a positive matrix size below 2^31", n)),
    };
    // SAFETY: only probes whether the shared library can be loaded (cudarc
    // panics on first use of a library it cannot load).
    if !unsafe { blas_sys::is_culib_present() } {
        return Err(Error::NoCuda(format!(
            "{OP}: libcublas was not found (set LD_LIBRARY_PATH to include the CUDA libraries)"
        )));
    }
    // bf16 bit patterns (u16: the device buffers are only handed to cuBLAS).
    let host: Vec<u16> = (0..elems as u64)
        .into_par_iter()
        .map(|i| {
            // splitmix64 of the index: 24 random bits to a value in [-1, 1).
            let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let x = (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
            half::bf16::from_f32(x).to_bits()
        })
        .collect();
    let stream = dev.stream();
    let a = stream
        .clone_htod(&host)
        .map_err(cuda_err("GEMM operand upload"))?;
    let b = stream
        .clone_htod(&host)
        .map_err(cuda_err("GEMM operand upload"))?;
    drop(host);
    let mut c = stream
        .alloc_zeros::<u16>(elems)
        .map_err(cuda_err("alloc"))?;
    let blas =
        CudaBlas::new(stream.clone()).map_err(cublas_err("cublasCreate (bf16_gemm_tflops)"))?;
    let (ap, _ga) = a.device_ptr(&stream);
    let (bp, _gb) = b.device_ptr(&stream);
    let (cp, _gc) = c.device_ptr_mut(&stream);
    let (alpha, beta) = (1.0f32, 0.0f32);
    let gemm = || -> Result<()> {
        // SAFETY: a, b and c are live n×n bf16 device buffers (column-major,
        // leading dimension n); alpha and beta are f32 host scalars, as
        // CUBLAS_COMPUTE_32F with the handle's default host pointer mode needs.
        unsafe {
            blas::gemm_ex(
                *blas.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                dim,
                dim,
                dim,
                (&alpha as *const f32).cast(),
                ap as *const std::ffi::c_void,
                blas_sys::cudaDataType_t::CUDA_R_16BF,
                dim,
                bp as *const std::ffi::c_void,
                blas_sys::cudaDataType_t::CUDA_R_16BF,
                dim,
                (&beta as *const f32).cast(),
                cp as *mut std::ffi::c_void,
                blas_sys::cudaDataType_t::CUDA_R_16BF,
                dim,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(cublas_err("cublasGemmEx (bf16_gemm_tflops)"))
    };
    // One warm-up here and one inside time_ms.
    gemm()?;
    let ms = time_ms(dev, 20, gemm)?;
    let flop = 2.0 * (n as f64).powi(3);
    Ok(flop / (ms * 1e-3) / 1e12)
}
