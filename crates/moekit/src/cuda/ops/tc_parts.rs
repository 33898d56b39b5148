//! The router's GEMM with K in parts (`kernels/tc_gemm.cu` `TC_PARTS` and
//! `tc_sum_parts`): a single-expert GEMM of dense weights split over the
//! grid's z dimension into [`k_parts`] ranges of whole steps (from K alone),
//! each storing its f32 partial products, then summed in part order and
//! rounded once to the activation type ([`sum_parts_into`]). The same sums
//! in the same order whatever the batch: batch-invariant, like every path.

use super::tc_gemm::SRC;
use super::{ctype, launch, Geometry};
use crate::error::{ensure, Result};
use crate::tensor::Tensor;
use crate::DType;

/// `TcParams::p` flag (`TC_PARTS`): K split over the grid's z dimension,
/// f32 partial products out.
pub(crate) const PARTS: u32 = 1 << 16;
/// Most K parts a launch takes ([`super::tc_gemm::TcRows::Parts`]).
pub(crate) const MAX_PARTS: usize = 8;
/// Steps of K a part has at least ([`k_parts`]).
const PART_STEPS: usize = 8;

/// The K parts a single-expert GEMM of K columns (the router) is split
/// into: one per 8 steps of 64 columns, at most 8 — from K alone, so a
/// row's sums (each part's in step order, then the parts in order) are the
/// same whatever the batch. The router's tile walked all of K on a handful
/// of blocks (qwen3-30b-a3b T = 64: 8 blocks × 32 steps, 13 µs on an H200).
pub fn k_parts(k: usize) -> usize {
    (k.div_ceil(super::tc_geo::BK) / PART_STEPS).clamp(1, MAX_PARTS)
}

/// `out [M, N]` (T) = the sum of `parts [z, M, N]` (f32, from a
/// [`super::tc_gemm::TcRows::Parts`] GEMM) over z in order, rounded once to T.
pub fn sum_parts_into(parts: &Tensor, out: &Tensor) -> Result<()> {
    const OP: &str = "tc_sum_parts";
    let pb = parts.cuda_bytes()?;
    let dev = pb.device().clone();
    let n = out.numel();
    ensure(
        parts.dtype() == DType::F32 && n > 0 && parts.numel().is_multiple_of(n),
        OP,
        "parts",
        format!("f32 with a multiple of {n} elements"),
        format!("{} {:?}", parts.dtype(), parts.shape()),
    )?;
    let count = parts.numel() / n;
    ensure(
        (1..=MAX_PARTS).contains(&count),
        OP,
        "parts",
        format!("1..={MAX_PARTS} parts"),
        count,
    )?;
    super::check_same_device(OP, out, &dev)?;
    let t = ctype(OP, out.dtype())?;
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct TcSumParams {
        parts: u64,
        out: u64,
        n: u64,
        count: u32,
        pad: u32,
    }
    const _: () = assert!(std::mem::size_of::<TcSumParams>() == 32);
    // SAFETY: plain-old-data mirrored by the kernel's TcSumParams.
    unsafe impl cudarc::driver::DeviceRepr for TcSumParams {}
    let p = TcSumParams {
        parts: pb.ptr(),
        out: out.cuda_bytes()?.ptr(),
        n: n as u64,
        count: count as u32,
        pad: 0,
    };
    let geo = Geometry {
        grid: (n.div_ceil(256).min(1 << 16) as u32, 1, 1),
        block: (256, 1, 1),
        shared: 0,
    };
    // SAFETY: parts is a device f32 tensor of count·n elements and out one
    // of n elements of T on the same device (checked); the grid-stride
    // kernel reads indices < count·n and writes indices < n only.
    unsafe {
        launch(
            &dev,
            &SRC,
            &format!("moekit::tc_sum_parts<{t}>"),
            geo,
            p,
            OP,
        )
    }
}
