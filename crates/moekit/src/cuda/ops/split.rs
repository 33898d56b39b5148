//! `kernels/split.cu`: dense f32 weights split into `hi = T(w)` and
//! `lo = T(w − hi)` halves of a 16-bit type, for the tensor-core split GEMM
//! ([`super::tc_gemm::split_matmul_into`]), which then copies them into its
//! tiles like any dense weights of the activation type.

use super::{ctype, launch, Geometry};
use crate::cuda::jit::Source;
use crate::dtype::DType;
use crate::error::{ensure, Result};
use crate::tensor::Tensor;

static SRC: Source = Source {
    name: "split.cu",
    text: include_str!("../../../kernels/split.cu"),
};

/// Threads per block.
const THREADS: usize = 256;
/// Grid cap: the kernel is grid-stride, so larger tensors just loop.
const MAX_BLOCKS: usize = 1 << 16;

#[repr(C)]
#[derive(Clone, Copy)]
struct SplitParams {
    w: u64,
    out: u64,
    n: u64,
}
const _: () = assert!(std::mem::size_of::<SplitParams>() == 24);
// SAFETY: plain-old-data mirrored by the kernel's SplitParams.
unsafe impl cudarc::driver::DeviceRepr for SplitParams {}

/// Instances for the compile check: one per 16-bit type.
pub fn instances() -> Vec<(&'static Source, String)> {
    [DType::F16, DType::Bf16]
        .iter()
        .filter_map(|&d| ctype("split_hi_lo", d).ok())
        .map(|t| (&SRC, format!("moekit::split_hi_lo<{t}>")))
        .collect()
}

/// `[2, numel]` of `dtype` (f16 or bf16): `w`'s values rounded to `dtype`
/// (hi), then the rounding residuals rounded to `dtype` (lo), on `w`'s device.
pub fn split_hi_lo(w: &Tensor, dtype: DType) -> Result<Tensor> {
    const OP: &str = "split_hi_lo";
    ensure(w.dtype() == DType::F32, OP, "w", "f32", w.dtype())?;
    ensure(
        matches!(dtype, DType::F16 | DType::Bf16),
        OP,
        "dtype",
        "f16 or bf16",
        dtype,
    )?;
    let wb = w.cuda_bytes()?;
    let dev = wb.device().clone();
    let t = ctype(OP, dtype)?;
    let n = w.numel();
    let out = Tensor::uninit_on(dtype, &[2, n], w.device())?;
    if n == 0 {
        return Ok(out);
    }
    let p = SplitParams {
        w: wb.ptr(),
        out: out.cuda_bytes()?.ptr(),
        n: n as u64,
    };
    let geo = Geometry {
        grid: (n.div_ceil(THREADS).min(MAX_BLOCKS) as u32, 1, 1),
        block: (THREADS as u32, 1, 1),
        shared: 0,
    };
    // SAFETY: w is a device tensor of n f32 and out one of 2n elements of T on
    // the same device (allocated here); the kernel touches indices < n of w
    // and < 2n of out only.
    unsafe { launch(&dev, &SRC, &format!("moekit::split_hi_lo<{t}>"), geo, p, OP) }?;
    Ok(out)
}
