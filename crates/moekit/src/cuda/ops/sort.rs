//! `kernels/sort.cu`: the expert sort on the device (no host round trip):
//! ids `u32 [T, k]` → [`ExpertSort`] (`offsets [E+1]`, `sorted [T·k]`,
//! `inverse [T·k]`), stable and deterministic, equal to the CPU result.
//!
//! Up to [`RANGE`] slots: one kernel, one block. Beyond: three kernels
//! (per-range histograms, scan, stable scatter; a block per range) with a
//! scratch buffer of `ceil(T·k / RANGE) × (E+1)` u32.
//!
//! An id ≥ E is reported through the device error word (the next copy to the
//! host fails, naming the expert id) and sorted as a virtual expert E after
//! all real ones: `offsets[E]` counts the valid slots only, the invalid ones
//! occupy positions `offsets[E]..T·k`, and `sorted`/`inverse` remain a
//! permutation, so no later kernel goes out of bounds through them.

use super::{check_out, launch, Geometry};
use crate::cuda::jit::Source;
use crate::dtype::DType;
use crate::error::{ensure, Result};
use crate::ops::sort::ExpertSort;
use crate::tensor::Tensor;

static SRC: Source = Source {
    name: "sort.cu",
    text: include_str!("../../../kernels/sort.cu"),
};

const OP: &str = "expert_sort";
/// Slots per range (one block): `sort::kRange` in the kernel.
pub const RANGE: usize = 1024;
/// Warps per block (each walks `RANGE / WARPS` slots of the range):
/// `sort::kWarps`.
const WARPS: usize = 8;

#[repr(C)]
#[derive(Clone, Copy)]
struct SortParams {
    ids: u64,
    counts: u64,
    offsets: u64,
    sorted: u64,
    inverse: u64,
    err: u64,
    n: u32,
    n_experts: u32,
    n_ranges: u32,
    pad: u32,
}
const _: () = assert!(std::mem::size_of::<SortParams>() == 64);
// SAFETY: plain-old-data mirrored by the kernel's SortParams.
unsafe impl cudarc::driver::DeviceRepr for SortParams {}

const KERNELS: [&str; 4] = [
    "moekit::sort_single",
    "moekit::sort_count",
    "moekit::sort_scan",
    "moekit::sort_scatter",
];

/// Instances for the compile check.
pub fn instances() -> Vec<(&'static Source, String)> {
    KERNELS.iter().map(|k| (&SRC, k.to_string())).collect()
}

/// Checks ids and E; returns (T, k).
fn check_ids(ids: &Tensor, n_experts: usize) -> Result<(usize, usize)> {
    ensure(
        ids.dtype() == DType::U32,
        OP,
        "ids",
        "dtype u32",
        ids.dtype(),
    )?;
    let (t, k) = match ids.shape() {
        &[t, k] => (t, k),
        s => {
            return Err(crate::error::invalid(
                OP,
                "ids",
                "rank 2 [T, k]",
                format!("shape {s:?}"),
            ))
        }
    };
    ensure(k > 0, OP, "ids", "k > 0", k)?;
    ensure(
        (1..=1024).contains(&n_experts),
        OP,
        "n_experts",
        "1..=1024",
        n_experts,
    )?;
    ensure(t * k < 1 << 31, OP, "ids", "fewer than 2^31 slots", t * k)?;
    ids.cuda_bytes()?;
    Ok((t, k))
}

/// Sorts `ids` (`u32 [T, k]` on a CUDA device) into new device tensors.
pub fn expert_sort(ids: &Tensor, n_experts: usize) -> Result<ExpertSort> {
    let (t, k) = check_ids(ids, n_experts)?;
    let dev = ids.device();
    let out = ExpertSort {
        offsets: Tensor::zeros_on(DType::U32, &[n_experts + 1], dev)?,
        sorted: Tensor::zeros_on(DType::U32, &[t * k], dev)?,
        inverse: Tensor::zeros_on(DType::U32, &[t * k], dev)?,
        n_experts,
        top_k: k,
    };
    expert_sort_into(ids, n_experts, &out)?;
    Ok(out)
}

/// [`expert_sort`] into preallocated device tensors: `out.offsets u32 [E+1]`,
/// `out.sorted` and `out.inverse u32 [T·k]`, with `out.n_experts == E` and
/// `out.top_k == k`, on the device of `ids`.
pub fn expert_sort_into(ids: &Tensor, n_experts: usize, out: &ExpertSort) -> Result<()> {
    let (t, k) = check_ids(ids, n_experts)?;
    let n = t * k;
    ensure(
        out.n_experts == n_experts,
        OP,
        "out.n_experts",
        n_experts,
        out.n_experts,
    )?;
    ensure(out.top_k == k, OP, "out.top_k", k, out.top_k)?;
    check_out(OP, &out.offsets, DType::U32, &[n_experts + 1])?;
    check_out(OP, &out.sorted, DType::U32, &[n])?;
    check_out(OP, &out.inverse, DType::U32, &[n])?;
    for (arg, x) in [
        ("out.offsets", &out.offsets),
        ("out.sorted", &out.sorted),
        ("out.inverse", &out.inverse),
    ] {
        ensure(
            x.device() == ids.device(),
            OP,
            arg,
            format!("a tensor on {}", ids.device()),
            x.device(),
        )?;
    }
    let ib = ids.cuda_bytes()?;
    let dev = ib.device().clone();
    let cols = n_experts + 1;
    let n_ranges = n.div_ceil(RANGE);
    // Scratch for the multi-range path (kept alive until the launches are queued;
    // freed in stream order after them).
    let counts = match n_ranges {
        0 | 1 => None,
        r => Some(Tensor::zeros_on(DType::U32, &[r, cols], ids.device())?),
    };
    let p = SortParams {
        ids: ib.ptr(),
        counts: counts
            .as_ref()
            .map(|c| c.cuda_bytes().map(|b| b.ptr()))
            .transpose()?
            .unwrap_or(0),
        offsets: out.offsets.cuda_bytes()?.ptr(),
        sorted: out.sorted.cuda_bytes()?.ptr(),
        inverse: out.inverse.cuda_bytes()?.ptr(),
        err: dev.error_word(),
        n: n as u32,
        n_experts: n_experts as u32,
        n_ranges: n_ranges as u32,
        pad: 0,
    };
    let words = |w: usize| (w * 4) as u32;
    if counts.is_none() {
        // One block: also for n == 0, so that offsets are written (all zero).
        let geo = Geometry {
            grid: (1, 1, 1),
            block: (32 * WARPS as u32, 1, 1),
            shared: words((WARPS + 1) * cols + 32),
        };
        // SAFETY: n ≤ RANGE slots: ids, sorted and inverse hold n u32, offsets
        // E+1, on `dev`; shared memory holds a histogram of E+1 words per
        // warp, the E+1 totals and 32 words of scan scratch; positions
        // written are < n (checked in the kernel).
        return unsafe { launch(&dev, &SRC, KERNELS[0], geo, p, "sort_single") };
    }
    let per_range = Geometry {
        grid: (n_ranges as u32, 1, 1),
        block: (32 * WARPS as u32, 1, 1),
        shared: words(WARPS * cols),
    };
    // SAFETY: block r handles range r < n_ranges (slots r·RANGE.. < n of
    // ids) and writes row r of counts [n_ranges, E+1]; shared memory is a
    // histogram of E+1 words per warp.
    unsafe { launch(&dev, &SRC, KERNELS[1], per_range, p, "sort_count") }?;
    let scan = Geometry {
        grid: (1, 1, 1),
        block: (1024, 1, 1),
        shared: words(cols + 32),
    };
    // SAFETY: reads and rewrites counts [n_ranges, E+1], writes offsets [E+1];
    // shared memory holds E+1 totals and 32 words of scratch.
    unsafe { launch(&dev, &SRC, KERNELS[2], scan, p, "sort_scan") }?;
    // SAFETY: as sort_count; writes sorted/inverse [n] at positions < n
    // (checked in the kernel) and slots < n.
    unsafe { launch(&dev, &SRC, KERNELS[3], per_range, p, "sort_scatter") }
}
