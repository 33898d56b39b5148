//! `kernels/act.cu`: elementwise SwiGLU `silu(gate) · up` (the fused
//! gate+up+SwiGLU projection is [`super::gather_mm::gather_glu`]), a
//! bias row added to every row (the router's bias), and the
//! routing-weighted expert biases added to a combined output (down's bias),
//! and the combine weights with down's per-expert scale folded in.

use super::{check_out, ctype, launch, u32_of, Geometry, FLOAT_DTYPES};
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

#[repr(C)]
#[derive(Clone, Copy)]
struct RowBiasParams {
    y: u64,
    bias: u64,
    rows: u64,
    n: u64,
}
const _: () = assert!(std::mem::size_of::<RowBiasParams>() == 32);
// SAFETY: plain-old-data mirrored by the kernel's RowBiasParams.
unsafe impl cudarc::driver::DeviceRepr for RowBiasParams {}

#[repr(C)]
#[derive(Clone, Copy)]
struct RoutedBiasParams {
    out: u64,
    ids: u64,
    weights: u64,
    bias: u64,
    err: u64,
    n_tokens: u32,
    hidden: u32,
    top_k: u32,
    n_experts: u32,
    pad: [u32; 2],
}
const _: () = assert!(std::mem::size_of::<RoutedBiasParams>() == 64);
// SAFETY: plain-old-data mirrored by the kernel's RoutedBiasParams.
unsafe impl cudarc::driver::DeviceRepr for RoutedBiasParams {}

#[repr(C)]
#[derive(Clone, Copy)]
struct WeightRowsParams {
    x: u64,
    out: u64,
    weights: u64,
    ones: u64,
    rows: u64,
    n: u64,
}
const _: () = assert!(std::mem::size_of::<WeightRowsParams>() == 48);
// SAFETY: plain-old-data mirrored by the kernel's WeightRowsParams.
unsafe impl cudarc::driver::DeviceRepr for WeightRowsParams {}

#[repr(C)]
#[derive(Clone, Copy)]
struct CombineWeightsParams {
    ids: u64,
    weights: u64,
    scale: u64,
    out: u64,
    err: u64,
    n: u32,
    n_experts: u32,
}
const _: () = assert!(std::mem::size_of::<CombineWeightsParams>() == 48);
// SAFETY: plain-old-data mirrored by the kernel's CombineWeightsParams.
unsafe impl cudarc::driver::DeviceRepr for CombineWeightsParams {}

/// Instances for the compile check: each kernel per activation dtype, and
/// the f32-only `combine_weights`.
pub fn instances() -> Vec<(&'static Source, String)> {
    FLOAT_DTYPES
        .iter()
        .filter_map(|&d| ctype("swiglu", d).ok())
        .flat_map(|t| {
            ["swiglu", "row_bias", "routed_bias", "weight_rows"]
                .map(|k| (&SRC, format!("moekit::{k}<{t}>")))
        })
        .chain([(&SRC, "moekit::combine_weights".to_string())])
        .collect()
}

/// `weights[t, j] · scale[ids[t, j]]` into a new f32 `[T, k]` tensor (an id
/// ≥ E is reported, its weight 0): `ids` u32 and `weights` f32 `[T, k]`,
/// `scale` f32 `[E]`, all on one CUDA device
/// ([`crate::ops::ffn::combine_weights_on`]).
pub fn combine_weights(ids: &Tensor, weights: &Tensor, scale: &Tensor) -> Result<Tensor> {
    const OP: &str = "combine_weights";
    let wb = weights.cuda_bytes()?;
    let dev = wb.device().clone();
    let shape = weights.shape().to_vec();
    ensure(
        ids.dtype() == crate::DType::U32
            && ids.shape() == shape
            && ids.device() == weights.device(),
        OP,
        "ids",
        format!("u32 {shape:?} on {}", weights.device()),
        format!("{} {:?} on {}", ids.dtype(), ids.shape(), ids.device()),
    )?;
    check_f32(OP, "weights", weights, &shape, weights.device())?;
    let n_e = scale.shape().first().copied().unwrap_or(0);
    check_f32(OP, "scale", scale, &[n_e], weights.device())?;
    let out = Tensor::uninit_on(crate::DType::F32, &shape, weights.device())?;
    let n = weights.numel();
    if n == 0 {
        return Ok(out);
    }
    let p = CombineWeightsParams {
        ids: ids.cuda_bytes()?.ptr(),
        weights: wb.ptr(),
        scale: scale.cuda_bytes()?.ptr(),
        out: out.cuda_bytes()?.ptr(),
        err: dev.error_word(),
        n: u32_of(OP, "weights", n)?,
        n_experts: u32_of(OP, "scale", n_e)?,
    };
    // SAFETY: ids, weights and out hold n elements, scale n_experts, on one
    // device (checked); the kernel touches indices < n and reads scale only
    // at ids < n_experts.
    unsafe { launch(&dev, &SRC, "moekit::combine_weights", grid_stride(n), p, OP) }?;
    Ok(out)
}

/// A grid-stride launch over `total` elements (at most [`MAX_BLOCKS`] blocks).
fn grid_stride(total: usize) -> Geometry {
    Geometry {
        grid: (total.div_ceil(THREADS).min(MAX_BLOCKS) as u32, 1, 1),
        block: (THREADS as u32, 1, 1),
        shared: 0,
    }
}

/// Checks that `t` is an f32 tensor of `shape` on `device`.
fn check_f32(
    op: &'static str,
    arg: &'static str,
    t: &Tensor,
    shape: &[usize],
    device: crate::Device,
) -> Result<()> {
    ensure(
        t.dtype() == crate::DType::F32 && t.shape() == shape && t.device() == device,
        op,
        arg,
        format!("f32 {shape:?} on {device}"),
        format!("{} {:?} on {}", t.dtype(), t.shape(), t.device()),
    )
}

/// `y[r, c] += bias[c]` in place: `y [rows, n]` float on a CUDA device,
/// `bias` f32 `[n]` on the same device.
pub fn row_bias_add(y: &Tensor, bias: &Tensor) -> Result<()> {
    const OP: &str = "row_bias";
    let yb = y.cuda_bytes()?;
    let dev = yb.device().clone();
    let t = ctype(OP, y.dtype())?;
    ensure(y.rank() == 2, OP, "y", "rank 2", format!("{:?}", y.shape()))?;
    let (rows, n) = (y.shape()[0], y.shape()[1]);
    check_f32(OP, "bias", bias, &[n], y.device())?;
    let total = rows * n;
    if total == 0 {
        return Ok(());
    }
    let p = RowBiasParams {
        y: yb.ptr(),
        bias: bias.cuda_bytes()?.ptr(),
        rows: rows as u64,
        n: n as u64,
    };
    let geo = grid_stride(total);
    // SAFETY: y holds rows·n elements of T and bias n f32 on one device
    // (checked); the kernel touches indices < rows·n of y and < n of bias.
    unsafe { launch(&dev, &SRC, &format!("moekit::row_bias<{t}>"), geo, p, OP) }
}

/// `out[t, h] += Σ_j weights[t, j] · bias[ids[t, j], h]` in place (slots in
/// order; an id ≥ E is reported and skipped): `out [T, H]` float, `ids`
/// u32 `[T, k]`, `weights` and `bias` (`[E, H]`) f32, all on one device.
pub fn routed_bias_add(out: &Tensor, ids: &Tensor, weights: &Tensor, bias: &Tensor) -> Result<()> {
    const OP: &str = "routed_bias";
    let ob = out.cuda_bytes()?;
    let dev = ob.device().clone();
    let t = ctype(OP, out.dtype())?;
    ensure(
        out.rank() == 2,
        OP,
        "out",
        "rank 2",
        format!("{:?}", out.shape()),
    )?;
    let (nt, h) = (out.shape()[0], out.shape()[1]);
    ensure(
        ids.dtype() == crate::DType::U32
            && ids.rank() == 2
            && ids.shape()[0] == nt
            && ids.device() == out.device(),
        OP,
        "ids",
        format!("u32 [{nt}, k] on {}", out.device()),
        format!("{} {:?} on {}", ids.dtype(), ids.shape(), ids.device()),
    )?;
    let k = ids.shape()[1];
    check_f32(OP, "weights", weights, &[nt, k], out.device())?;
    ensure(
        bias.dtype() == crate::DType::F32
            && bias.rank() == 2
            && bias.shape()[1] == h
            && bias.device() == out.device(),
        OP,
        "bias",
        format!("f32 [E, {h}] on {}", out.device()),
        format!("{} {:?} on {}", bias.dtype(), bias.shape(), bias.device()),
    )?;
    if nt == 0 || h == 0 {
        return Ok(());
    }
    ensure(nt <= 65535, OP, "out", "at most 65535 rows", nt)?;
    let p = RoutedBiasParams {
        out: ob.ptr(),
        ids: ids.cuda_bytes()?.ptr(),
        weights: weights.cuda_bytes()?.ptr(),
        bias: bias.cuda_bytes()?.ptr(),
        err: dev.error_word(),
        n_tokens: u32_of(OP, "out", nt)?,
        hidden: u32_of(OP, "out", h)?,
        top_k: u32_of(OP, "ids", k)?,
        n_experts: u32_of(OP, "bias", bias.shape()[0])?,
        pad: [0; 2],
    };
    let geo = Geometry {
        grid: (h.div_ceil(THREADS) as u32, nt as u32, 1),
        block: (THREADS as u32, 1, 1),
        shared: 0,
    };
    // SAFETY: out [T, H] of T, ids/weights [T, k], bias [E, H] on one device
    // (checked); the kernel bounds t < T, h < H, and skips ids ≥ E.
    unsafe { launch(&dev, &SRC, &format!("moekit::routed_bias<{t}>"), geo, p, OP) }
}

/// `out[t] = x[t] · weights[t]` (the weight rounded to x's dtype, the
/// product too) and `ones[t] = 1`: the experts' input and weights of a
/// weight-before block ([`crate::ops::input::weight_input_on`]). `x`, `out`
/// `[T, H]` float of one dtype, `weights` and `ones` f32 `[T, 1]`, all on
/// one device.
pub fn weight_rows_into(x: &Tensor, weights: &Tensor, out: &Tensor, ones: &Tensor) -> Result<()> {
    const OP: &str = "weight_rows";
    let xb = x.cuda_bytes()?;
    let dev = xb.device().clone();
    let t = ctype(OP, x.dtype())?;
    ensure(x.rank() == 2, OP, "x", "rank 2", format!("{:?}", x.shape()))?;
    let (rows, n) = (x.shape()[0], x.shape()[1]);
    check_f32(OP, "weights", weights, &[rows, 1], x.device())?;
    check_f32(OP, "ones", ones, &[rows, 1], x.device())?;
    check_out(OP, out, x.dtype(), x.shape())?;
    super::check_same_device(OP, out, &dev)?;
    let total = rows * n;
    ensure(n > 0 || rows == 0, OP, "x", "H > 0", n)?;
    if total == 0 {
        return Ok(());
    }
    let p = WeightRowsParams {
        x: xb.ptr(),
        out: out.cuda_bytes()?.ptr(),
        weights: weights.cuda_bytes()?.ptr(),
        ones: ones.cuda_bytes()?.ptr(),
        rows: rows as u64,
        n: n as u64,
    };
    let geo = grid_stride(total);
    // SAFETY: x and out hold rows·n elements of T, weights and ones rows f32,
    // on one device (checked); the kernel touches indices < rows·n and < rows.
    unsafe { launch(&dev, &SRC, &format!("moekit::weight_rows<{t}>"), geo, p, OP) }
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
    let p = SwigluParams {
        gate: gb.ptr(),
        up: up.cuda_bytes()?.ptr(),
        out: out.cuda_bytes()?.ptr(),
        n: n as u64,
    };
    let geo = grid_stride(n);
    // SAFETY: gate, up and out are device tensors of n elements of T on one
    // device (checked); the kernel touches indices < n only.
    unsafe { launch(&dev, &SRC, &format!("moekit::swiglu<{t}>"), geo, p, OP) }
}
