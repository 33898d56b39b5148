//! `kernels/act.cu`: elementwise SwiGLU `silu(gate) · up` (the fused
//! gate+up+SwiGLU projection is [`super::gather_mm::gather_swiglu`]).

use super::{check_out, ctype, launch, Geometry, FLOAT_DTYPES};
use crate::cuda::jit::Source;
use crate::error::{ensure, Result};
use crate::tensor::Tensor;

static SRC: Source = Source {
    name: "act.cu",
    text: include_str!("../../../kernels/act.cu"),
};

/// Threads per block.
const THREADS: usize = 256;
/// Grid cap: the kernel is grid-stride, so larger tensors just loop.
const MAX_BLOCKS: usize = 1 << 20;

#[repr(C)]
#[derive(Clone, Copy)]
struct SwigluParams {
    gate: u64,
    up: u64,
    out: u64,
    n: u64,
}
const _: () = assert!(std::mem::size_of::<SwigluParams>() == 32);
// SAFETY: plain-old-data mirrored by the kernel's SwigluParams.
unsafe impl cudarc::driver::DeviceRepr for SwigluParams {}

/// Instances for the compile check: one per activation dtype.
pub fn instances() -> Vec<(&'static Source, String)> {
    FLOAT_DTYPES
        .iter()
        .filter_map(|&d| ctype("swiglu", d).ok())
        .map(|t| (&SRC, format!("moekit::swiglu<{t}>")))
        .collect()
}

/// `silu(gate) · up` elementwise on the device of `gate`.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    let out = Tensor::zeros_on(gate.dtype(), gate.shape(), gate.device())?;
    swiglu_into(gate, up, &out)?;
    Ok(out)
}

/// [`swiglu`] into a preallocated `out` of `gate`'s shape and dtype.
pub fn swiglu_into(gate: &Tensor, up: &Tensor, out: &Tensor) -> Result<()> {
    const OP: &str = "swiglu";
    let gb = gate.cuda_bytes()?;
    let dev = gb.device().clone();
    let t = ctype(OP, gate.dtype())?;
    ensure(
        up.shape() == gate.shape(),
        OP,
        "up",
        format!("shape {:?}", gate.shape()),
        format!("{:?}", up.shape()),
    )?;
    ensure(
        up.dtype() == gate.dtype(),
        OP,
        "up",
        format!("dtype {}", gate.dtype()),
        up.dtype(),
    )?;
    ensure(
        up.device() == gate.device(),
        OP,
        "up",
        format!("on {}", gate.device()),
        up.device(),
    )?;
    check_out(OP, out, gate.dtype(), gate.shape())?;
    ensure(
        out.device() == gate.device(),
        OP,
        "out",
        format!("on {}", gate.device()),
        out.device(),
    )?;
    let n = gate.numel();
    let blocks = n.div_ceil(THREADS).min(MAX_BLOCKS);
    let p = SwigluParams {
        gate: gb.ptr(),
        up: up.cuda_bytes()?.ptr(),
        out: out.cuda_bytes()?.ptr(),
        n: n as u64,
    };
    let geo = Geometry {
        grid: (blocks as u32, 1, 1),
        block: (THREADS as u32, 1, 1),
        shared: 0,
    };
    // SAFETY: gate, up and out are device tensors of n elements of T on one
    // device (checked); the kernel touches indices < n only.
    unsafe { launch(&dev, &SRC, &format!("moekit::swiglu<{t}>"), geo, p, OP) }
}
