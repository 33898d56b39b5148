//! `kernels/bench.cu`: the device's measured read bandwidth, the roofline
//! every benchmark result is compared with.

use super::{launch, Geometry};
use crate::cuda::jit::Source;
use crate::cuda::CudaDevice;
use crate::error::{cuda_err, Result};
use cudarc::driver::DevicePtr;

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
        a.record(dev.stream()).map_err(cuda_err("event record"))?;
        f()?;
        b.record(dev.stream()).map_err(cuda_err("event record"))?;
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
    let (sp, _g1) = src.device_ptr(dev.stream());
    let (kp, _g2) = sink.device_ptr(dev.stream());
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
        unsafe { launch(dev, &SRC, "moekit::read_words", geo, p, "read_words") }
    })?;
    Ok((n_words * 16) as f64 / (ms * 1e-3) / 1e9)
}
