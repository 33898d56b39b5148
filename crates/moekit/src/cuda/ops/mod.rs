//! Typed launch wrappers, one module per kernel source (`kernels/*.cu`).
//!
//! Every kernel takes one `#[repr(C)]` params struct by value, mirrored in
//! CUDA with a `static_assert` on its size; [`launch`] is the one place a
//! kernel is started. [`all_instances`] lists every template instance the
//! library can request, so CI compiles each one through NVRTC without a GPU.

pub mod act;
pub mod bench;
pub mod decode;
pub mod gather_mm;
pub mod moe;
pub mod norm;
pub mod permute;
pub mod route;
pub mod sort;
pub mod split;
pub mod tc_gemm;
pub mod tc_geo;
pub mod tc_moe;
pub mod tc_parts;
pub mod tc_ra;
pub mod tc_tma;

use super::jit::Source;
use super::CudaDevice;
use crate::dtype::DType;
use crate::error::{cuda_err, invalid, Result};
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

/// The CUDA C++ type of a float activation dtype.
pub fn ctype(op: &'static str, dtype: DType) -> Result<&'static str> {
    match dtype {
        DType::F32 => Ok("float"),
        DType::F16 => Ok("__half"),
        DType::Bf16 => Ok("__nv_bfloat16"),
        d => Err(invalid(op, "dtype", "f32, f16 or bf16", d)),
    }
}

/// Checks that `t` lives on `dev`.
pub fn check_same_device(
    op: &'static str,
    t: &crate::Tensor,
    dev: &std::sync::Arc<crate::cuda::CudaDevice>,
) -> Result<()> {
    crate::error::ensure(
        t.device() == crate::Device::Cuda(dev.ordinal()),
        op,
        "out",
        format!("a tensor on cuda:{}", dev.ordinal()),
        t.device(),
    )
}

/// Checks a preallocated output: on a CUDA device, `dtype`, `shape`.
pub fn check_out(
    op: &'static str,
    out: &crate::Tensor,
    dtype: DType,
    shape: &[usize],
) -> Result<()> {
    out.cuda_bytes()?;
    crate::error::ensure(
        out.dtype() == dtype,
        op,
        "out",
        format!("dtype {dtype}"),
        out.dtype(),
    )?;
    crate::error::ensure(
        out.shape() == shape,
        op,
        "out",
        format!("shape {shape:?}"),
        format!("{:?}", out.shape()),
    )
}

/// `v` as a kernel's u32 argument, or an error naming op and argument.
pub(crate) fn u32_of(op: &'static str, arg: &'static str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| invalid(op, arg, "< 2^32", v))
}

/// Device address of an optional (validated) tensor, or 0 (null) without one.
pub(crate) fn opt_ptr(t: &Option<crate::tensor::Tensor>) -> Result<u64> {
    t.as_ref().map_or(Ok(0), |t| Ok(t.cuda_bytes()?.ptr()))
}

/// The experts' activation, gate/up biases and gate/up per-expert scales as
/// the kernels take them (`kernels/common.cuh` `GluParams`; down's scale is
/// folded into the combine weights, `ops::ffn::combine_weights_on`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct GluParams {
    gate_bias: u64,
    up_bias: u64,
    gate_scale: u64,
    up_scale: u64,
    kind: u32,
    alpha: f32,
    limit: f32,
    pad: u32,
}
const _: () = assert!(std::mem::size_of::<GluParams>() == 48);

impl GluParams {
    /// Whether these need a kernel's GLU instance (anything but plain
    /// SwiGLU without biases or scales).
    pub(crate) fn general(&self) -> bool {
        self.kind != 0
            || self.gate_bias != 0
            || self.up_bias != 0
            || self.gate_scale != 0
            || self.up_scale != 0
    }

    /// `ffn`'s activation and gate/up bias and scale pointers (validated by
    /// the caller: f32 `[E, I]` and `[E]` on the kernel's device).
    pub(crate) fn of(ffn: &crate::ops::ffn::ExpertFfn) -> Result<GluParams> {
        let (kind, alpha, limit) = ffn.act.kernel_args();
        Ok(GluParams {
            gate_bias: opt_ptr(&ffn.bias.gate)?,
            up_bias: opt_ptr(&ffn.bias.up)?,
            gate_scale: opt_ptr(&ffn.scale.gate)?,
            up_scale: opt_ptr(&ffn.scale.up)?,
            kind,
            alpha,
            limit,
            pad: 0,
        })
    }
}

/// The activation dtypes every kernel is instantiated for.
pub const FLOAT_DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::Bf16];

/// Grid and block of a launch.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    /// Blocks.
    pub grid: (u32, u32, u32),
    /// Threads per block.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory bytes.
    pub shared: u32,
}

/// How a kernel is started after the previous one on the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Plain stream order: starts when the previous kernel has finished.
    Stream,
    /// Programmatic dependent launch (sm_90+, where [`pdl_enabled`]): may
    /// start once every block of the previous kernel has started or
    /// signalled (`griddepcontrol.launch_dependents`), so its launch and
    /// prologue overlap that kernel's tail. Only for kernels that execute
    /// `griddepcontrol.wait` before they touch anything earlier kernels
    /// wrote. Elsewhere it is plain stream order.
    Dependent,
}

/// A tuning knob from the environment: `name` parsed as `T` when it lies in
/// `range`, else `default` (unset, unparsable or out of range). Callers read
/// it once (a `OnceLock`), so a process keeps one value.
pub(crate) fn env_knob<T>(name: &str, range: std::ops::RangeInclusive<T>, default: T) -> T
where
    T: std::str::FromStr + PartialOrd,
{
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|v| range.contains(v))
        .unwrap_or(default)
}

/// A test's override of an on/off knob, so that a test can run both sides
/// in one process: unset (the knob decides), off or on.
pub(crate) struct Forced(std::sync::atomic::AtomicU8);

impl Forced {
    pub(crate) const fn new() -> Forced {
        Forced(std::sync::atomic::AtomicU8::new(0))
    }

    /// Sets the override (`None`: the knob decides again).
    pub(crate) fn set(&self, on: Option<bool>) {
        let v = match on {
            None => 0,
            Some(false) => 1,
            Some(true) => 2,
        };
        self.0.store(v, std::sync::atomic::Ordering::Relaxed);
    }

    /// The override, if a test set one.
    pub(crate) fn get(&self) -> Option<bool> {
        match self.0.load(std::sync::atomic::Ordering::Relaxed) {
            1 => Some(false),
            2 => Some(true),
            _ => None,
        }
    }
}

/// Whether [`Order::Dependent`] launches use programmatic dependent launch:
/// sm_90+ unless `MOEKIT_PDL=0` (read once; for A/B measurements).
pub fn pdl_enabled(dev: &CudaDevice) -> bool {
    static ENV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let env = *ENV.get_or_init(|| std::env::var("MOEKIT_PDL").map_or(true, |v| v != "0"));
    env && dev.arch().major >= 9
}

/// Launches `name_expr` of `source` with `params` on the device's stream as
/// a programmatic dependent of the kernel before it ([`Order::Dependent`]):
/// every kernel of the crate but the two launched with [`Order::Stream`]
/// (the decode path's router matvec, which starts its products before the
/// previous kernel ends, and the bandwidth probe) begins with
/// `pdl_entry()` (common.cuh: trigger, then wait), so a chain of them
/// overlaps each launch with the previous kernel's tail. An empty grid
/// launches nothing.
///
/// # Safety
/// `params` must match the kernel's params struct, every device pointer in
/// it must be valid for the accesses the kernel makes for this geometry
/// (each wrapper states why), and every block of the kernel must execute
/// `griddepcontrol.wait` (`pdl_entry`/`pdl_wait`) before its first access to
/// memory that earlier kernels on the stream write or read.
pub unsafe fn launch<P: DeviceRepr>(
    dev: &CudaDevice,
    source: &'static Source,
    name_expr: &str,
    geo: Geometry,
    params: P,
    op: &'static str,
) -> Result<()> {
    // SAFETY: forwarded from the caller's contract.
    unsafe { launch_ordered(dev, source, name_expr, geo, params, op, Order::Dependent) }
}

/// Dynamic shared memory above which a launch opts in to more than 48 KiB.
const OPT_IN_SMEM: u32 = 32 * 1024;

/// [`launch`] with an explicit [`Order`].
///
/// # Safety
/// As [`launch`]'s first two conditions; with [`Order::Dependent`] also its
/// third: every block executes `griddepcontrol.wait` (common.cuh
/// `pdl_wait`) before its first access to memory that earlier kernels on
/// the stream write or read.
pub unsafe fn launch_ordered<P: DeviceRepr>(
    dev: &CudaDevice,
    source: &'static Source,
    name_expr: &str,
    geo: Geometry,
    params: P,
    op: &'static str,
    order: Order,
) -> Result<()> {
    if geo.grid.0 == 0 || geo.grid.1 == 0 || geo.grid.2 == 0 {
        return Ok(());
    }
    let f = dev
        .jit()
        .function(dev.context(), dev.arch(), source, name_expr)?;
    if geo.shared > OPT_IN_SMEM {
        // Above 48 KiB of static and dynamic shared memory together a kernel
        // must opt in to its dynamic shared memory (the static part is at
        // most 16 KiB in every kernel here).
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            geo.shared as i32,
        )
        .map_err(cuda_err(op))?;
    }
    LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if order == Order::Dependent && pdl_enabled(dev) {
        // SAFETY: forwarded from the caller's contract.
        return unsafe { launch_pdl(dev, &f, geo, params, op) };
    }
    let cfg = LaunchConfig {
        grid_dim: geo.grid,
        block_dim: geo.block,
        shared_mem_bytes: geo.shared,
    };
    let stream = dev.stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&params);
    // SAFETY: forwarded from the caller's contract.
    unsafe { b.launch(cfg) }.map(|_| ()).map_err(cuda_err(op))
}

/// `cuLaunchKernelEx` with programmatic stream serialization allowed
/// (cudarc's launch builder has no launch attributes).
///
/// # Safety
/// As [`launch_ordered`] with [`Order::Dependent`].
unsafe fn launch_pdl<P: DeviceRepr>(
    dev: &CudaDevice,
    f: &cudarc::driver::CudaFunction,
    geo: Geometry,
    params: P,
    op: &'static str,
) -> Result<()> {
    use cudarc::driver::sys;
    dev.context().bind_to_thread().map_err(cuda_err(op))?;
    // SAFETY: an all-zero attribute is a valid value of this plain C union.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let cfg = sys::CUlaunchConfig {
        gridDimX: geo.grid.0,
        gridDimY: geo.grid.1,
        gridDimZ: geo.grid.2,
        blockDimX: geo.block.0,
        blockDimY: geo.block.1,
        blockDimZ: geo.block.2,
        sharedMemBytes: geo.shared,
        hStream: dev.stream().cu_stream(),
        attrs: &mut attr,
        numAttrs: 1,
    };
    let mut arg = params;
    let mut args = [(&mut arg as *mut P).cast::<std::ffi::c_void>()];
    // SAFETY: `cfg` and `attr` outlive the call; `args` holds one pointer to
    // the params struct, the kernel's only parameter (the caller's contract),
    // which the driver copies before returning.
    unsafe {
        sys::cuLaunchKernelEx(
            &cfg,
            f.cu_function(),
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()
    .map_err(cuda_err(op))
}

static LAUNCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Kernel launches made by this process so far (benchmarks report launches
/// per MoE block as a difference of two readings).
pub fn launch_count() -> u64 {
    LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// The architectures the library requests instances of `source` for:
/// `tc_ra.cu` and `tc_tma.cu` run on sm_90a only ([`tc_ra::supports`],
/// [`tc_tma::supports`]), every other source
/// on sm_80 and sm_90a alike.
pub fn instance_arches(source: &Source) -> &'static [super::Arch] {
    if std::ptr::eq(source, &tc_ra::SRC) || std::ptr::eq(source, &tc_tma::SRC) {
        &[super::Arch::SM90]
    } else {
        &[super::Arch::SM90, super::Arch::SM80]
    }
}

/// Every (source, name expression) the library can request.
pub fn all_instances() -> Vec<(&'static Source, String)> {
    let mut v = Vec::new();
    v.extend(permute::instances());
    v.extend(moe::instances());
    v.extend(bench::instances());
    v.extend(decode::instances());
    v.extend(norm::instances());
    v.extend(route::instances());
    v.extend(sort::instances());
    v.extend(act::instances());
    v.extend(gather_mm::instances());
    v.extend(split::instances());
    v.extend(tc_gemm::instances());
    v.extend(tc_ra::instances());
    v.extend(tc_tma::instances());
    v
}
