//! `kernels/moe.cu`: glue kernels of the MoE block.

use super::{check_out, ctype, launch, Geometry, FLOAT_DTYPES};
use crate::cuda::jit::Source;
use crate::error::{ensure, Result};
use crate::tensor::Tensor;

static SRC: Source = Source {
    name: "moe.cu",
    text: include_str!("../../../kernels/moe.cu"),
};

#[repr(C)]
#[derive(Clone, Copy)]
struct SharedCombineParams {
    out: u64,
    shared: u64,
    gate: u64,
    n_tokens: u32,
    hidden: u32,
}
const _: () = assert!(std::mem::size_of::<SharedCombineParams>() == 32);
// SAFETY: plain-old-data mirrored by the kernel's SharedCombineParams.
unsafe impl cudarc::driver::DeviceRepr for SharedCombineParams {}

/// Instances for the compile check.
pub fn instances() -> Vec<(&'static Source, String)> {
    FLOAT_DTYPES
        .iter()
        .map(|&d| {
            (
                &SRC,
                format!(
                    "moekit::shared_combine<{}>",
                    ctype("shared_combine", d).unwrap_or("float")
                ),
            )
        })
        .collect()
}

/// `out [T, H] += (gate ? sigmoid(gate[t]) : 1) · shared [T, H]`, in place.
/// `gate` is `[T, 1]`; all three share `out`'s dtype and device.
pub fn shared_combine(out: &Tensor, shared: &Tensor, gate: Option<&Tensor>) -> Result<()> {
    const OP: &str = "shared_combine";
    let ob = out.cuda_bytes()?;
    let dev = ob.device().clone();
    let (t, h) = (out.shape()[0], out.shape()[1]);
    check_out(OP, shared, out.dtype(), &[t, h])?;
    let gate_ptr = match gate {
        Some(g) => {
            check_out(OP, g, out.dtype(), &[t, 1])?;
            g.cuda_bytes()?.ptr()
        }
        None => 0,
    };
    ensure(out.rank() == 2, OP, "out", "rank 2", out.rank())?;
    let p = SharedCombineParams {
        out: ob.ptr(),
        shared: shared.cuda_bytes()?.ptr(),
        gate: gate_ptr,
        n_tokens: t as u32,
        hidden: h as u32,
    };
    let e = format!("moekit::shared_combine<{}>", ctype(OP, out.dtype())?);
    let geo = Geometry {
        grid: (t as u32, 1, 1),
        block: (256, 1, 1),
        shared: 0,
    };
    // SAFETY: out and shared are [t, h], gate (if any) [t]; one block per token row.
    unsafe { launch(&dev, &SRC, &e, geo, p, "shared_combine") }
}
