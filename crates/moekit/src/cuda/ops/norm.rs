//! `kernels/norm.cu`: RMS norm and the fused norm epilogues of an MoE layer
//! (the row functions of [`crate::ops::norm`]), one templated kernel
//! `norm_epilogue<E, T, W>`: the epilogue functor `E` (which carries the
//! scalar's or the residual norm weight's type), the activation type `T`, the
//! norm-weight type `W`.

use super::{check_out, ctype, launch, Geometry, FLOAT_DTYPES};
use crate::cuda::jit::Source;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{ensure, invalid, Result};
use crate::ops::norm::Epilogue;
use crate::tensor::Tensor;

static SRC: Source = Source {
    name: "norm.cu",
    text: include_str!("../../../kernels/norm.cu"),
};

/// Rows up to this length are staged in shared memory (f32, within the 48 KiB
/// a launch gets without opting in); longer rows are re-read in the second pass.
pub const STAGED_MAX_DIM: usize = 12_032;

/// Threads per block at most (the kernel's `__launch_bounds__`).
const MAX_THREADS: usize = 1024;

#[repr(C)]
#[derive(Clone, Copy)]
struct NormParams {
    input: u64,
    moe_weights: u64,
    residual: u64,
    weight: u64,
    extra: u64,
    out: u64,
    sum: u64,
    rows: u32,
    dim: u32,
    top_k: u32,
    extra_len: u32,
    eps: f32,
    staged: u32,
}
const _: () = assert!(std::mem::size_of::<NormParams>() == 80);
// SAFETY: plain-old-data mirrored by the kernel's NormParams.
unsafe impl cudarc::driver::DeviceRepr for NormParams {}

/// Every epilogue, for the instance list.
const EPILOGUES: [Epilogue; 7] = [
    Epilogue::RmsNorm,
    Epilogue::NormAdd,
    Epilogue::ResidualNorm,
    Epilogue::ResidualNormScalar,
    Epilogue::NormAddScalar,
    Epilogue::MoeWsumNormAdd,
    Epilogue::MoeWsumDnormAdd,
];

fn is_moe(op: Epilogue) -> bool {
    matches!(op, Epilogue::MoeWsumNormAdd | Epilogue::MoeWsumDnormAdd)
}

fn has_scalar(op: Epilogue) -> bool {
    matches!(op, Epilogue::ResidualNormScalar | Epilogue::NormAddScalar)
}

/// Operands of one epilogue on a CUDA device, named as in
/// [`crate::ops::norm::EpilogueArgs`]: `input` is `[rows, dim]` (`[rows, k, dim]`
/// for the MoE epilogues), `moe_weights` `f32 [rows, k]`, `residual` `[rows, dim]`
/// of `input`'s dtype, `weight` and `residual_weight` `[dim]` and `scalar` `[1]`
/// or `[dim]` of any float dtype. Operands the epilogue does not use must be `None`.
#[derive(Debug, Clone, Copy)]
pub struct EpilogueOperands<'a> {
    /// The row function.
    pub op: Epilogue,
    /// x / input / expert outputs.
    pub input: &'a Tensor,
    /// Routing weights (MoE epilogues).
    pub moe_weights: Option<&'a Tensor>,
    /// Residual stream (all but [`Epilogue::RmsNorm`]).
    pub residual: Option<&'a Tensor>,
    /// Scale of `n(v)`.
    pub weight: &'a Tensor,
    /// Scale of `n(residual)` ([`Epilogue::MoeWsumDnormAdd`]).
    pub residual_weight: Option<&'a Tensor>,
    /// Output scale (the `*Scalar` epilogues).
    pub scalar: Option<&'a Tensor>,
    /// Norm epsilon, finite and ≥ 0.
    pub eps: f32,
}

/// The C++ functor of `op`; `extra` is the dtype of the scalar or of the
/// residual norm weight where `op` has one.
fn functor(op: Epilogue, extra: Option<DType>) -> Result<String> {
    const OP: &str = "norm_epilogue";
    let name = |d: Option<DType>| match d {
        Some(d) => ctype(OP, d),
        None => Err(invalid(
            OP,
            "extra operand",
            "a scalar or residual norm weight",
            "none",
        )),
    };
    Ok(match op {
        Epilogue::RmsNorm => "moekit::RmsNorm".to_string(),
        Epilogue::NormAdd => "moekit::NormAdd".to_string(),
        Epilogue::ResidualNorm => "moekit::ResidualNorm".to_string(),
        Epilogue::ResidualNormScalar => format!("moekit::ResidualNormScalar<{}>", name(extra)?),
        Epilogue::NormAddScalar => format!("moekit::NormAddScalar<{}>", name(extra)?),
        Epilogue::MoeWsumNormAdd => "moekit::MoeWsumNormAdd".to_string(),
        Epilogue::MoeWsumDnormAdd => format!("moekit::MoeWsumDnormAdd<{}>", name(extra)?),
    })
}

/// The kernel instance for activations `t`, norm weight `w`, extra operand `extra`.
fn instance(op: Epilogue, t: DType, w: DType, extra: Option<DType>) -> Result<String> {
    const OP: &str = "norm_epilogue";
    Ok(format!(
        "moekit::norm_epilogue<{}, {}, {}>",
        functor(op, extra)?,
        ctype(OP, t)?,
        ctype(OP, w)?
    ))
}

/// Instances for the compile check: every epilogue × activation dtype ×
/// norm-weight dtype (× scalar / residual norm weight dtype).
pub fn instances() -> Vec<(&'static Source, String)> {
    let mut v = Vec::new();
    for op in EPILOGUES {
        let extras: Vec<Option<DType>> = if has_scalar(op) || op == Epilogue::MoeWsumDnormAdd {
            FLOAT_DTYPES.iter().copied().map(Some).collect()
        } else {
            vec![None]
        };
        for t in FLOAT_DTYPES {
            for w in FLOAT_DTYPES {
                for &e in &extras {
                    if let Ok(name) = instance(op, t, w, e) {
                        v.push((&SRC, name));
                    }
                }
            }
        }
    }
    v
}

/// The CUDA device of `t` (an error for a CPU tensor).
fn cuda_device(op: &'static str, arg: &'static str, t: &Tensor) -> Result<Device> {
    match t.device() {
        d @ Device::Cuda(_) => Ok(d),
        d => Err(invalid(op, arg, "a CUDA tensor", d)),
    }
}

/// Checks `t` (present iff `used`): on `dev`, of `dtype` (any float if
/// `None`), of `shape`.
fn check_operand(
    op: &'static str,
    arg: &'static str,
    t: Option<&Tensor>,
    used: bool,
    dev: Device,
    dtype: Option<DType>,
    shape: &[usize],
) -> Result<()> {
    let Some(t) = t else {
        return ensure(!used, op, arg, "a tensor", "none");
    };
    ensure(
        used,
        op,
        arg,
        "none (this epilogue does not use it)",
        "a tensor",
    )?;
    ensure(
        cuda_device(op, arg, t)? == dev,
        op,
        arg,
        format!("a tensor on {dev}"),
        t.device(),
    )?;
    match dtype {
        Some(d) => ensure(t.dtype() == d, op, arg, format!("dtype {d}"), t.dtype())?,
        None => ensure(
            t.dtype().is_float(),
            op,
            arg,
            "dtype f32, f16 or bf16",
            t.dtype(),
        )?,
    }
    ensure(
        t.shape() == shape,
        op,
        arg,
        format!("shape {shape:?}"),
        format!("{:?}", t.shape()),
    )
}

/// Validates every operand (device, dtype, shape; so the kernel's accesses
/// stay inside the buffers); returns (rows, dim, k).
fn check(o: &EpilogueOperands<'_>) -> Result<(usize, usize, usize)> {
    const OP: &str = "norm_epilogue";
    let x = o.input;
    let dev = cuda_device(OP, "input", x)?;
    ensure(
        x.dtype().is_float(),
        OP,
        "input",
        "dtype f32, f16 or bf16",
        x.dtype(),
    )?;
    let (rows, k, dim) = match (is_moe(o.op), x.shape()) {
        (true, &[r, k, d]) => (r, k, d),
        (false, &[r, d]) => (r, 0, d),
        (moe, s) => {
            let want = if moe { "[rows, k, dim]" } else { "[rows, dim]" };
            return Err(invalid(OP, "input", want, format!("shape {s:?}")));
        }
    };
    ensure(dim >= 1, OP, "input", "dim ≥ 1", dim)?;
    ensure(
        o.eps.is_finite() && o.eps >= 0.0,
        OP,
        "eps",
        "a finite number ≥ 0",
        o.eps,
    )?;
    let fits = |n: usize| u32::try_from(n).is_ok();
    ensure(
        fits(dim) && fits(k) && rows <= i32::MAX as usize,
        OP,
        "input",
        "rows < 2^31, k and dim < 2^32",
        format!("{:?}", x.shape()),
    )?;
    let op = o.op;
    check_operand(
        OP,
        "moe_weights",
        o.moe_weights,
        is_moe(op),
        dev,
        Some(DType::F32),
        &[rows, k],
    )?;
    check_operand(
        OP,
        "residual",
        o.residual,
        op != Epilogue::RmsNorm,
        dev,
        Some(x.dtype()),
        &[rows, dim],
    )?;
    check_operand(OP, "weight", Some(o.weight), true, dev, None, &[dim])?;
    let dnorm = op == Epilogue::MoeWsumDnormAdd;
    check_operand(
        OP,
        "residual_weight",
        o.residual_weight,
        dnorm,
        dev,
        None,
        &[dim],
    )?;
    let scalar_shape = match o.scalar.map(Tensor::numel) {
        Some(1) => [1],
        _ => [dim],
    };
    check_operand(
        OP,
        "scalar",
        o.scalar,
        has_scalar(op),
        dev,
        None,
        &scalar_shape,
    )?;
    Ok((rows, dim, k))
}

/// Runs the epilogue into new tensors: the output `[rows, dim]` and, if
/// `write_sum` ([`Epilogue::ResidualNorm`] only), `residual + input`.
pub fn epilogue(o: &EpilogueOperands<'_>, write_sum: bool) -> Result<(Tensor, Option<Tensor>)> {
    let (rows, dim, _) = check(o)?;
    let (dtype, dev) = (o.input.dtype(), o.input.device());
    let out = Tensor::zeros_on(dtype, &[rows, dim], dev)?;
    let sum = match write_sum {
        true => Some(Tensor::zeros_on(dtype, &[rows, dim], dev)?),
        false => None,
    };
    epilogue_into(o, &out, sum.as_ref())?;
    Ok((out, sum))
}

/// [`epilogue`] into preallocated `out` (and `sum`, [`Epilogue::ResidualNorm`]
/// only): `[rows, dim]` of the input's dtype on the input's device.
pub fn epilogue_into(o: &EpilogueOperands<'_>, out: &Tensor, sum: Option<&Tensor>) -> Result<()> {
    const OP: &str = "norm_epilogue";
    let (rows, dim, k) = check(o)?;
    let dtype = o.input.dtype();
    let xb = o.input.cuda_bytes()?;
    let dev = xb.device().clone();
    let on_dev = Device::Cuda(dev.ordinal());
    for (arg, t) in [("out", Some(out)), ("sum", sum)] {
        if let Some(t) = t {
            check_out(OP, t, dtype, &[rows, dim])?;
            ensure(
                t.device() == on_dev,
                OP,
                arg,
                format!("a tensor on {on_dev}"),
                t.device(),
            )?;
        }
    }
    ensure(
        sum.is_none() || o.op == Epilogue::ResidualNorm,
        OP,
        "sum",
        "none (ResidualNorm only)",
        "a tensor",
    )?;
    let ptr = |t: Option<&Tensor>| t.map_or(Ok(0), |t| t.cuda_bytes().map(|b| b.ptr()));
    let extra = o.residual_weight.or(o.scalar);
    let staged = dim <= STAGED_MAX_DIM;
    let p = NormParams {
        input: xb.ptr(),
        moe_weights: ptr(o.moe_weights)?,
        residual: ptr(o.residual)?,
        weight: ptr(Some(o.weight))?,
        extra: ptr(extra)?,
        out: ptr(Some(out))?,
        sum: ptr(sum)?,
        rows: rows as u32,
        dim: dim as u32,
        top_k: k as u32,
        extra_len: extra.map_or(0, Tensor::numel) as u32,
        eps: o.eps,
        staged: staged as u32,
    };
    // One thread per 16-byte group of activations, in whole warps.
    let threads = dim
        .div_ceil(16 / dtype.size())
        .next_multiple_of(32)
        .clamp(32, MAX_THREADS);
    let shared = if staged { dim * 4 } else { 0 };
    let geo = Geometry {
        grid: (rows as u32, 1, 1),
        block: (threads as u32, 1, 1),
        shared: shared as u32,
    };
    let e = instance(o.op, dtype, o.weight.dtype(), extra.map(Tensor::dtype))?;
    // SAFETY: `check` verified every operand the epilogue reads is a CUDA
    // tensor on this device of the shape the kernel indexes (input [rows, dim]
    // or [rows, k, dim], moe_weights [rows, k], residual [rows, dim], weight
    // and residual_weight [dim], scalar [extra_len] with extra_len 1 or dim),
    // unused pointers are null and never read; out and sum are [rows, dim] of
    // the input's dtype on the device. One block per row < rows; the kernel
    // uses vector accesses only when dim is a multiple of the group size and
    // every pointer is 16-byte aligned; the staging buffer is dim floats.
    unsafe { launch(&dev, &SRC, &e, geo, p, "norm_epilogue") }
}
