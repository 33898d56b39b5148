//! `kernels/permute.cu`: permute rows into expert order and the weighted
//! combine back (unpermute).

use super::{check_out, ctype, launch, Geometry, FLOAT_DTYPES};
use crate::cuda::jit::Source;
use crate::error::Result;
use crate::ops::sort::ExpertSort;
use crate::tensor::Tensor;

static SRC: Source = Source {
    name: "permute.cu",
    text: include_str!("../../../kernels/permute.cu"),
};

#[repr(C)]
#[derive(Clone, Copy)]
struct PermuteParams {
    x: u64,
    sorted: u64,
    out: u64,
    err: u64,
    n_rows: u32,
    top_k: u32,
    hidden: u32,
    n_tokens: u32,
}
const _: () = assert!(std::mem::size_of::<PermuteParams>() == 48);
// SAFETY: plain-old-data mirrored by the kernel's PermuteParams.
unsafe impl cudarc::driver::DeviceRepr for PermuteParams {}

#[repr(C)]
#[derive(Clone, Copy)]
struct UnpermuteParams {
    y: u64,
    inverse: u64,
    weights: u64,
    out: u64,
    err: u64,
    n_tokens: u32,
    top_k: u32,
    hidden: u32,
    n_rows: u32,
}
const _: () = assert!(std::mem::size_of::<UnpermuteParams>() == 56);
// SAFETY: plain-old-data mirrored by the kernel's UnpermuteParams.
unsafe impl cudarc::driver::DeviceRepr for UnpermuteParams {}

/// Instances for the compile check.
pub fn instances() -> Vec<(&'static Source, String)> {
    FLOAT_DTYPES
        .iter()
        .flat_map(|&d| {
            let t = ctype("permute", d).unwrap_or("float");
            [
                format!("moekit::permute_rows<{t}>"),
                format!("moekit::unpermute_rows<{t}>"),
            ]
        })
        .map(|e| (&SRC, e))
        .collect()
}

/// `x [T, H]` (validated, on the device) → `[T·k, H]` in sorted order.
pub fn permute(x: &Tensor, sort: &ExpertSort) -> Result<Tensor> {
    let out = Tensor::zeros_on(
        x.dtype(),
        &[x.shape()[0] * sort.top_k, x.shape()[1]],
        x.device(),
    )?;
    permute_into(x, sort, &out)?;
    Ok(out)
}

/// [`permute`] into a preallocated `out [T·k, H]` of `x`'s dtype on the same device.
pub fn permute_into(x: &Tensor, sort: &ExpertSort, out: &Tensor) -> Result<()> {
    let xb = x.cuda_bytes()?;
    let dev = xb.device().clone();
    let (t, h) = (x.shape()[0], x.shape()[1]);
    let n_rows = t * sort.top_k;
    check_out("permute", out, x.dtype(), &[n_rows, h])?;
    let p = PermuteParams {
        x: xb.ptr(),
        sorted: sort.sorted.cuda_bytes()?.ptr(),
        out: out.cuda_bytes()?.ptr(),
        err: dev.error_word(),
        n_rows: n_rows as u32,
        top_k: sort.top_k as u32,
        hidden: h as u32,
        n_tokens: t as u32,
    };
    let geo = Geometry {
        grid: (n_rows as u32, 1, 1),
        block: (128, 1, 1),
        shared: 0,
    };
    let e = format!("moekit::permute_rows<{}>", ctype("permute", x.dtype())?);
    // SAFETY: x is [t, h], sorted has n_rows entries, out is [n_rows, h]; the
    // kernel reads sorted[block] and bounds-checks the token it names.
    unsafe { launch(&dev, &SRC, &e, geo, p, "permute_rows") }
}

/// `y [T·k, H]` (sorted order), `weights f32 [T, k]` → `[T, H]`.
pub fn unpermute(y: &Tensor, sort: &ExpertSort, weights: &Tensor) -> Result<Tensor> {
    let out = Tensor::zeros_on(y.dtype(), &[sort.n_tokens(), y.shape()[1]], y.device())?;
    unpermute_into(y, sort, weights, &out)?;
    Ok(out)
}

/// [`unpermute`] into a preallocated `out [T, H]` of `y`'s dtype on the same device.
pub fn unpermute_into(y: &Tensor, sort: &ExpertSort, weights: &Tensor, out: &Tensor) -> Result<()> {
    let yb = y.cuda_bytes()?;
    let dev = yb.device().clone();
    let (t, k, h) = (sort.n_tokens(), sort.top_k, y.shape()[1]);
    check_out("unpermute", out, y.dtype(), &[t, h])?;
    let p = UnpermuteParams {
        y: yb.ptr(),
        inverse: sort.inverse.cuda_bytes()?.ptr(),
        weights: weights.cuda_bytes()?.ptr(),
        out: out.cuda_bytes()?.ptr(),
        err: dev.error_word(),
        n_tokens: t as u32,
        top_k: k as u32,
        hidden: h as u32,
        n_rows: (t * k) as u32,
    };
    // 64 threads × 16 bytes a block: several blocks a token even at small T.
    let cols_per_block = 64 * (16 / y.dtype().size());
    let geo = Geometry {
        grid: (t as u32, h.div_ceil(cols_per_block).max(1) as u32, 1),
        block: (64, 1, 1),
        shared: 0,
    };
    let e = format!("moekit::unpermute_rows<{}>", ctype("unpermute", y.dtype())?);
    // SAFETY: y is [t·k, h], inverse and weights [t, k], out [t, h]; positions
    // read from inverse are bounds-checked by the kernel.
    unsafe { launch(&dev, &SRC, &e, geo, p, "unpermute_rows") }
}
