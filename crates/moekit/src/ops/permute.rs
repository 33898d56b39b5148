//! Permute (gather token rows into expert order) and unpermute (the weighted
//! combine `out[t] = Σ_j w[t, j] · y[inverse[t·k + j]]`, summed in slot order).

use crate::device::Backend;
use crate::error::{ensure, Result};
use crate::ops::sort::ExpertSort;
use crate::ops::{check_dtype, check_float, check_shape};
use crate::tensor::Tensor;
use crate::DType;

/// Gathers `x [T, H]` into expert-sorted rows `[T·k, H]` with the backend of `x`.
pub fn permute(x: &Tensor, sort: &ExpertSort) -> Result<Tensor> {
    permute_on(Backend::for_device(x.device())?, x, sort)
}

/// [`permute`] with an explicit backend. Row `p` of the result is token
/// `sorted[p] / k` of `x`.
pub fn permute_on(backend: Backend, x: &Tensor, sort: &ExpertSort) -> Result<Tensor> {
    const OP: &str = "permute";
    check_float(OP, "x", x, 2)?;
    let (t, h) = (x.shape()[0], x.shape()[1]);
    ensure(
        t == sort.n_tokens(),
        OP,
        "x",
        format!("{} rows (tokens in sort)", sort.n_tokens()),
        t,
    )?;
    if backend == Backend::Cuda {
        return crate::cuda::ops::permute::permute(x, sort);
    }
    let sorted = sort.sorted.as_slice::<u32>()?;
    let mut out = Tensor::zeros(x.dtype(), &[sorted.len(), h]);
    let row_bytes = h * x.dtype().size();
    let args = PermuteArgs {
        x: x.bytes()?,
        sorted,
        top_k: sort.top_k,
        row_bytes,
    };
    let dst = out.bytes_mut()?;
    match backend {
        Backend::CpuReference => crate::cpu::reference::permute::permute(&args, dst),
        Backend::CpuFast | Backend::Cuda => crate::cpu::fast::permute::permute(&args, dst),
    }
    Ok(out)
}

/// Validated arguments of a permute (raw row bytes, so any dtype).
pub struct PermuteArgs<'a> {
    /// `x` bytes, `T` rows of `row_bytes`.
    pub x: &'a [u8],
    /// Sorted slots.
    pub sorted: &'a [u32],
    /// k.
    pub top_k: usize,
    /// Bytes per row.
    pub row_bytes: usize,
}

/// Validated arguments of an unpermute.
pub struct UnpermuteArgs<'a> {
    /// Expert outputs `[T·k, H]` in sorted order, as f32.
    pub y: &'a [f32],
    /// Sorted position of each slot.
    pub inverse: &'a [u32],
    /// Routing weights `[T, k]`.
    pub weights: &'a [f32],
    /// k.
    pub top_k: usize,
    /// H.
    pub hidden: usize,
}

/// Weighted combine back to token order with the backend of `y`.
pub fn unpermute(y: &Tensor, sort: &ExpertSort, weights: &Tensor) -> Result<Tensor> {
    unpermute_on(Backend::for_device(y.device())?, y, sort, weights)
}

/// [`unpermute`] with an explicit backend: `y [T·k, H]` (sorted order),
/// `weights f32 [T, k]` → `[T, H]` in `y`'s dtype, accumulated in f32 in slot order.
pub fn unpermute_on(
    backend: Backend,
    y: &Tensor,
    sort: &ExpertSort,
    weights: &Tensor,
) -> Result<Tensor> {
    const OP: &str = "unpermute";
    check_float(OP, "y", y, 2)?;
    let (t, k) = (sort.n_tokens(), sort.top_k);
    ensure(
        y.shape()[0] == t * k,
        OP,
        "y",
        format!("{} rows (T·k)", t * k),
        y.shape()[0],
    )?;
    check_dtype(OP, "weights", weights, DType::F32)?;
    check_shape(OP, "weights", weights, &[t, k])?;
    let hidden = y.shape()[1];
    if backend == Backend::Cuda {
        return crate::cuda::ops::permute::unpermute(y, sort, weights);
    }
    // f32 rows are read in place and the sums written into the result (at
    // T = 512 the copies of the 32 MB input and the output, fresh memory
    // each call, took longer than the sums).
    let widened;
    let yv = if y.dtype() == DType::F32 {
        y.as_slice::<f32>()?
    } else {
        widened = y.to_f32_vec()?;
        &widened
    };
    let args = UnpermuteArgs {
        y: yv,
        inverse: sort.inverse.as_slice()?,
        weights: weights.as_slice()?,
        top_k: k,
        hidden,
    };
    let mut out = Tensor::zeros(DType::F32, &[t, hidden]);
    let dst = out.as_mut_slice::<f32>()?;
    match backend {
        Backend::CpuReference => crate::cpu::reference::permute::unpermute(&args, dst),
        Backend::CpuFast | Backend::Cuda => crate::cpu::fast::permute::unpermute(&args, dst),
    }
    if y.dtype() == DType::F32 {
        Ok(out)
    } else {
        out.to_dtype(y.dtype())
    }
}
