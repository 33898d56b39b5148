//! The op front end: every op validates all of its arguments, then dispatches
//! to a [`Backend`](crate::Backend). Each op has a `*_on(backend, ..)` form so
//! tests can force a specific implementation; the plain form picks the
//! backend from the input's device.
//!
//! Data flow of an MoE block:
//! [`route`] → [`sort`] → [`permute`] → [`gather_mm`] (+ [`act`]) →
//! [`gather_mm`] → [`permute::unpermute`] (weighted combine) → [`norm`] epilogues.

pub mod act;
pub mod ffn;
pub mod gather_mm;
pub mod input;
pub mod norm;
pub(crate) mod parts;
pub mod permute;
pub mod route;
pub mod sort;

use crate::dtype::DType;
use crate::error::{ensure, Result};
use crate::tensor::Tensor;

/// Checks that `t` is a float activation tensor of rank `rank`.
pub(crate) fn check_float(
    op: &'static str,
    arg: &'static str,
    t: &Tensor,
    rank: usize,
) -> Result<()> {
    ensure(
        t.dtype().is_float(),
        op,
        arg,
        "dtype f32, f16 or bf16",
        t.dtype(),
    )?;
    ensure(
        t.rank() == rank,
        op,
        arg,
        format!("rank {rank}"),
        format!("shape {:?}", t.shape()),
    )
}

/// Checks that `t` has exactly `shape`.
pub(crate) fn check_shape(
    op: &'static str,
    arg: &'static str,
    t: &Tensor,
    shape: &[usize],
) -> Result<()> {
    ensure(
        t.shape() == shape,
        op,
        arg,
        format!("shape {shape:?}"),
        format!("{:?}", t.shape()),
    )
}

/// Checks that `t` has dtype `dtype`.
pub(crate) fn check_dtype(
    op: &'static str,
    arg: &'static str,
    t: &Tensor,
    dtype: DType,
) -> Result<()> {
    ensure(
        t.dtype() == dtype,
        op,
        arg,
        format!("dtype {dtype}"),
        t.dtype(),
    )
}
