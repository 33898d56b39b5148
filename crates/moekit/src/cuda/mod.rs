//! The CUDA backend: one context and one stream per device, kernels written
//! in CUDA C++ (`crates/moekit/kernels/`) and compiled at run time by NVRTC
//! for the device's architecture (cached on disk), device storage for
//! [`Tensor`](crate::Tensor) ([`CudaBytes`]), and one typed launch wrapper
//! per kernel (crate-private; the public entry points are
//! [`MoeBlock::forward`](crate::MoeBlock::forward) and the ops in
//! [`ops`](crate::ops)).
//!
//! What is public here: [`available`] and [`device`] (a [`CudaDevice`]: its
//! stream and context, for interop), [`graph`] (capture a forward in a CUDA
//! graph, replay it), [`launch_count`] and [`bench`](mod@bench) (timing helpers).
//!
//! cudarc loads `libcuda` and `libnvrtc` dynamically: the crate builds and
//! its CPU paths run on machines without CUDA. [`available`] says whether
//! this machine can run the backend, and why not.
//!
//! Every op is enqueued on the device's stream; nothing here synchronizes
//! with the host except explicit copies to the CPU, so a whole MoE block can
//! be captured in a CUDA graph.

pub mod graph;
pub(crate) mod jit;
// Crate-private: their docs (rendered with --document-private-items) may link
// other crate-private items; `testing` re-exports some for the repo's tests.
#[allow(rustdoc::private_intra_doc_links)]
pub(crate) mod ops;
pub(crate) mod storage;

pub use ops::launch_count;
pub use storage::CudaBytes;

/// Device measurements for benchmarks: CUDA-event timing, the read
/// bandwidth roofline and the cuBLAS bf16 GEMM rate.
pub mod bench {
    pub use super::ops::bench::{bf16_gemm_tflops, read_bandwidth, time_ms, GEMM_N};
}

use crate::error::{cuda_err, Error, Result};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// A compute capability, e.g. 9.0 for Hopper.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Arch {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl Arch {
    /// Hopper (H100/H200).
    pub const SM90: Arch = Arch { major: 9, minor: 0 };
    /// Ampere (A100).
    pub const SM80: Arch = Arch { major: 8, minor: 0 };

    /// NVRTC's `--gpu-architecture` value: `sm_90a` for 9.0 (so Hopper-only
    /// instructions are available), else `sm_XY`.
    pub fn nvrtc_target(self) -> String {
        if self == Arch::SM90 {
            "sm_90a".to_string()
        } else {
            format!("sm_{}{}", self.major, self.minor)
        }
    }
}

/// One CUDA device: context, stream, architecture and kernel cache.
pub struct CudaDevice {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: Arch,
    sm_count: u32,
    smem_optin: usize,
    name: String,
    jit: jit::Jit,
    err: CudaSlice<u32>,
    tickets: CudaSlice<u32>,
    /// The decode path's timeline stamps ([`jit::trace_enabled`] builds only).
    trace: Option<CudaSlice<u64>>,
}

/// Words of the decode path's timeline buffer (kernels/decode.cu `TRACE_WORDS`).
pub(crate) const TRACE_WORDS: usize = 11264;

/// Ticket counters the decode path's down kernel keeps per 16-row output
/// tile (so H ≤ 16 · TILE_TICKETS there), then the [`ROUTED_WORDS`] words
/// of its early routing read (`DecodeParams::routed`).
pub(crate) const TILE_TICKETS: usize = 4096;
/// Words after the tile tickets: the routing published, the down blocks past it.
pub(crate) const ROUTED_WORDS: usize = 2;

/// Bits of the device error word (kernels/common.cuh: `ErrorBits`).
const ERROR_BITS: [(u32, &str); 4] = [
    (1, "an expert id was >= n_experts (those rows were skipped)"),
    (
        2,
        "expert offsets were not non-decreasing from 0 to the row count (those rows were skipped)",
    ),
    (4, "a sort slot or position was out of range (skipped)"),
    (
        8,
        "a kernel was launched with a configuration its instance does not fit (nothing computed; a moekit bug)",
    ),
];

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaDevice(cuda:{} {} sm_{}{})",
            self.ordinal, self.name, self.arch.major, self.arch.minor
        )
    }
}

impl CudaDevice {
    fn open(ordinal: usize) -> Result<CudaDevice> {
        let ctx = CudaContext::new(ordinal).map_err(cuda_err("create CUDA context"))?;
        // One stream per device orders every op; cudarc's per-buffer event
        // tracking would only add work (and host-visible events) to that.
        // SAFETY: all buffers of this context are used on `stream` only.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx
            .compute_capability()
            .map_err(cuda_err("compute_capability"))?;
        let sm_count = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(cuda_err("device attribute"))?;
        let smem_optin = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(cuda_err("device attribute"))?;
        let name = ctx.name().map_err(cuda_err("device name"))?;
        let stream = ctx.new_stream().map_err(cuda_err("new_stream"))?;
        let err = stream
            .alloc_zeros::<u32>(1)
            .map_err(cuda_err("alloc error word"))?;
        let tickets = stream
            .alloc_zeros::<u32>(TILE_TICKETS + ROUTED_WORDS)
            .map_err(cuda_err("alloc tile tickets"))?;
        let trace = if jit::trace_enabled() {
            Some(
                stream
                    .alloc_zeros::<u64>(TRACE_WORDS)
                    .map_err(cuda_err("alloc trace buffer"))?,
            )
        } else {
            None
        };
        Ok(CudaDevice {
            err,
            tickets,
            trace,
            ordinal,
            ctx,
            stream,
            arch: Arch {
                major: major as u32,
                minor: minor as u32,
            },
            sm_count: sm_count as u32,
            smem_optin: smem_optin.max(0) as usize,
            name,
            jit: jit::Jit::new(),
        })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
    /// Compute capability.
    pub fn arch(&self) -> Arch {
        self.arch
    }
    /// Number of streaming multiprocessors.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }
    /// Most shared memory one block may opt in to (bytes).
    pub fn smem_optin(&self) -> usize {
        self.smem_optin
    }
    /// Marketing name (`NVIDIA H200`).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The stream ops of this device are enqueued on from this thread: the
    /// device's own stream, or the caller's inside [`with_stream`].
    pub fn stream(&self) -> Arc<CudaStream> {
        STREAM_OVERRIDE
            .with(|o| {
                o.borrow()
                    .iter()
                    .rev()
                    .find(|(n, _)| *n == self.ordinal)
                    .map(|(_, s)| s.clone())
            })
            .unwrap_or_else(|| self.stream.clone())
    }
    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
    /// The kernel cache.
    pub(crate) fn jit(&self) -> &jit::Jit {
        &self.jit
    }
    /// Device address of the error word kernels report argument errors into.
    pub(crate) fn error_word(&self) -> u64 {
        // Event tracking is off: the stream argument orders nothing here.
        let (p, _g) = self.err.device_ptr(&self.stream);
        p
    }

    /// Device address of [`TILE_TICKETS`] + [`ROUTED_WORDS`] zeroed words,
    /// per-tile tickets of the decode path and its routing words (its
    /// kernels leave them zero again).
    pub(crate) fn tile_tickets(&self) -> u64 {
        let (p, _g) = self.tickets.device_ptr(&self.stream);
        p
    }

    /// Device address of the decode path's timeline buffer, or 0 when the
    /// kernels are not built with stamps.
    pub(crate) fn trace_ptr(&self) -> u64 {
        self.trace
            .as_ref()
            .map_or(0, |t| t.device_ptr(&self.stream).0)
    }

    /// The decode path's timeline of its last call (`MOEKIT_TRACE` builds),
    /// summarized per kernel phase; the buffer is cleared. `None` without
    /// stamps.
    pub fn decode_trace(&self) -> Result<Option<String>> {
        let Some(t) = self.trace.as_ref() else {
            return Ok(None);
        };
        let stream = self.stream();
        let v = stream.clone_dtoh(t).map_err(cuda_err("read trace"))?;
        // SAFETY: the buffer is a live allocation of TRACE_WORDS words of
        // this context, written only by kernels on this stream.
        unsafe {
            cudarc::driver::result::memset_d8_async(
                self.trace_ptr(),
                0,
                TRACE_WORDS * 8,
                stream.cu_stream(),
            )
        }
        .map_err(cuda_err("clear trace"))?;
        Ok(Some(ops::decode::trace_summary(&v)))
    }

    /// Waits for the stream, then returns (and clears) any argument error a
    /// kernel reported since the last check. Every copy to the host checks.
    pub fn check_errors(&self) -> Result<()> {
        let stream = self.stream();
        let v = stream
            .clone_dtoh(&self.err)
            .map_err(cuda_err("read error word"))?;
        let bits = v.first().copied().unwrap_or(0);
        if bits == 0 {
            return Ok(());
        }
        // SAFETY: the error word is a live 4-byte allocation of this context,
        // cleared in stream order.
        unsafe {
            cudarc::driver::result::memset_d8_async(self.error_word(), 0, 4, stream.cu_stream())
        }
        .map_err(cuda_err("clear error word"))?;
        let what: Vec<&str> = ERROR_BITS
            .iter()
            .filter(|(b, _)| bits & b != 0)
            .map(|(_, m)| *m)
            .collect();
        Err(Error::DeviceReported {
            device: self.ordinal,
            what: what.join("; "),
        })
    }

    /// Blocks the host until all queued work is done (tests, benchmarks).
    pub fn synchronize(&self) -> Result<()> {
        self.stream().synchronize().map_err(cuda_err("synchronize"))
    }
}

thread_local! {
    /// Streams that [`with_stream`] put in place on this thread, innermost last.
    static STREAM_OVERRIDE: RefCell<Vec<(usize, Arc<CudaStream>)>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with every op this thread enqueues on `dev` going to `stream`, a
/// stream another library owns (PyTorch's current stream, say) instead of
/// the device's own: kernels, copies, stream-ordered allocations and frees
/// of the memory allocated inside `f`, and [`graph::capture`]. So moekit's
/// work is ordered with the caller's without events, and a caller capturing
/// `stream` in a CUDA graph captures moekit's work too.
///
/// Calls may nest; the innermost wins. Other threads are not affected.
///
/// The fused decode path keeps per-device ticket counters (reset by its own
/// kernels), so its calls must not run concurrently on two streams of one
/// device; calls on one stream, or on several streams ordered with each
/// other, are fine.
///
/// # Safety
///
/// `stream` must be a valid stream of `dev`'s context (the primary context
/// of its device, which is the one the CUDA runtime, and so PyTorch, uses),
/// and must stay valid as long as memory allocated inside `f` lives (its
/// stream-ordered frees go to `stream`).
pub unsafe fn with_stream<R>(
    dev: &Arc<CudaDevice>,
    stream: cudarc::driver::sys::CUstream,
    f: impl FnOnce() -> R,
) -> R {
    // SAFETY: the caller guarantees the stream belongs to this context and
    // outlives the work and allocations enqueued on it.
    let s = unsafe { dev.ctx.wrap_borrowed_stream(stream) };
    struct Pop;
    impl Drop for Pop {
        fn drop(&mut self) {
            STREAM_OVERRIDE.with(|o| {
                o.borrow_mut().pop();
            });
        }
    }
    STREAM_OVERRIDE.with(|o| o.borrow_mut().push((dev.ordinal, s)));
    let _pop = Pop;
    f()
}

/// Number of CUDA devices, or why CUDA cannot be used here. Probed once per
/// process (loading the driver library and counting devices takes tens of
/// µs, and every op asks), so devices made visible later are not seen.
pub fn available() -> Result<usize> {
    static PROBE: OnceLock<std::result::Result<usize, String>> = OnceLock::new();
    PROBE.get_or_init(probe).clone().map_err(Error::NoCuda)
}

fn probe() -> std::result::Result<usize, String> {
    // SAFETY: only probes whether the shared library can be loaded.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("the CUDA driver library (libcuda.so) was not found".into());
    }
    let n =
        CudaContext::device_count().map_err(|e| format!("cuInit/cuDeviceGetCount failed: {e}"))?;
    if n <= 0 {
        return Err("no CUDA device is visible".into());
    }
    Ok(n as usize)
}

/// The device with `ordinal`, opened once per process.
pub fn device(ordinal: usize) -> Result<Arc<CudaDevice>> {
    static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<CudaDevice>>>> = OnceLock::new();
    let n = available()?;
    if ordinal >= n {
        return Err(crate::error::invalid(
            "cuda_device",
            "ordinal",
            format!("< {n} (devices present)"),
            ordinal,
        ));
    }
    let map = DEVICES.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = map
        .lock()
        .map_err(|_| Error::NoCuda("device registry poisoned by an earlier panic".into()))?;
    if let Some(d) = map.get(&ordinal) {
        return Ok(d.clone());
    }
    let d = Arc::new(CudaDevice::open(ordinal)?);
    map.insert(ordinal, d.clone());
    Ok(d)
}
