//! Grouped ("gather") quantized matmul over experts:
//! `y[m, n] = Σ_k x[m, k] · W[e(m), n, k]` for weights in any [`WeightFormat`](crate::WeightFormat).
//!
//! The expert of each row comes either from expert-sorted rows with offsets
//! (`[E + 1]`, rows `offsets[e]..offsets[e+1]` use expert `e`) or from a
//! per-row expert id (`[M]`). [`qmm`] is the dense single-expert case.

use crate::device::Backend;
use crate::error::{ensure, invalid, Result};
use crate::format::QuantWeights;
use crate::ops::{check_dtype, check_float};
use crate::tensor::Tensor;
use crate::DType;

/// How rows of `x` map to experts.
#[derive(Debug, Clone, Copy)]
pub enum RowExperts<'a> {
    /// `u32 [E + 1]` offsets of expert-sorted rows.
    Sorted(&'a Tensor),
    /// `u32 [M]` expert id of each row.
    PerRow(&'a Tensor),
    /// Every row uses expert 0 (single-expert weights: dense layers, shared
    /// experts, routers). Needs no index tensor, so no host→device copy.
    Single,
}

/// Rows of `x` that one expert multiplies, after validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// The expert.
    pub expert: usize,
    /// Row indices into `x` (and into the output), ascending.
    pub rows: Vec<u32>,
}

/// Validates `experts` against `m` rows and `n_experts`, and groups rows by
/// expert (experts with no rows are left out).
pub fn segments(
    op: &'static str,
    experts: RowExperts<'_>,
    m: usize,
    n_experts: usize,
) -> Result<Vec<Segment>> {
    match experts {
        RowExperts::Single => {
            check_single(op, n_experts)?;
            Ok(vec![Segment {
                expert: 0,
                rows: (0..m as u32).collect(),
            }])
        }
        RowExperts::Sorted(off) => {
            check_dtype(op, "offsets", off, DType::U32)?;
            let o = off.as_slice::<u32>()?;
            ensure(
                o.len() == n_experts + 1,
                op,
                "offsets",
                format!("{} entries (E + 1)", n_experts + 1),
                o.len(),
            )?;
            let ok = o.first() == Some(&0)
                && o.windows(2).all(|w| w[0] <= w[1])
                && o.last().map(|&l| l as usize) == Some(m);
            ensure(
                ok,
                op,
                "offsets",
                format!("non-decreasing from 0 to {m} (rows of x)"),
                format!("{:?}", short(o)),
            )?;
            Ok((0..n_experts)
                .filter(|&e| o[e] < o[e + 1])
                .map(|e| Segment {
                    expert: e,
                    rows: (o[e]..o[e + 1]).collect(),
                })
                .collect())
        }
        RowExperts::PerRow(ids) => {
            check_dtype(op, "ids", ids, DType::U32)?;
            let v = ids.as_slice::<u32>()?;
            ensure(
                v.len() == m,
                op,
                "ids",
                format!("{m} entries (rows of x)"),
                v.len(),
            )?;
            let mut by_expert: Vec<Vec<u32>> = vec![Vec::new(); n_experts];
            for (r, &e) in v.iter().enumerate() {
                let slot = by_expert.get_mut(e as usize).ok_or_else(|| {
                    invalid(
                        op,
                        "ids",
                        format!("expert ids < {n_experts}"),
                        format!("id {e} at row {r}"),
                    )
                })?;
                slot.push(r as u32);
            }
            Ok(by_expert
                .into_iter()
                .enumerate()
                .filter(|(_, r)| !r.is_empty())
                .map(|(expert, rows)| Segment { expert, rows })
                .collect())
        }
    }
}

/// [`RowExperts::Single`] needs weights of exactly one expert.
pub(crate) fn check_single(op: &'static str, n_experts: usize) -> Result<()> {
    ensure(
        n_experts == 1,
        op,
        "experts",
        "weights of a single expert for RowExperts::Single",
        format!("E = {n_experts}"),
    )
}

fn short(v: &[u32]) -> &[u32] {
    &v[..v.len().min(16)]
}

/// Validated inputs of a grouped matmul, activations widened to f32.
pub struct GatherMmArgs<'a> {
    /// `[M, K]` activations.
    pub x: &'a [f32],
    /// M.
    pub m: usize,
    /// The weights.
    pub w: &'a QuantWeights,
    /// Rows grouped by expert.
    pub segments: &'a [Segment],
}

/// Grouped matmul with the backend of `x`'s device. Returns `[M, N]` in `x`'s dtype.
pub fn gather_mm(x: &Tensor, w: &QuantWeights, experts: RowExperts<'_>) -> Result<Tensor> {
    gather_mm_on(Backend::for_device(x.device())?, x, w, experts)
}

/// [`gather_mm`] with an explicit backend.
pub fn gather_mm_on(
    backend: Backend,
    x: &Tensor,
    w: &QuantWeights,
    experts: RowExperts<'_>,
) -> Result<Tensor> {
    const OP: &str = "gather_mm";
    check_float(OP, "x", x, 2)?;
    let (m, k) = (x.shape()[0], x.shape()[1]);
    ensure(
        k == w.cols(),
        OP,
        "x",
        format!("{} columns (K of the weights)", w.cols()),
        k,
    )?;
    if backend == Backend::Cuda {
        // Before any host access: offsets/ids stay on the device.
        return crate::cuda::ops::gather_mm::gather_mm(x, w, experts);
    }
    let segs = segments(OP, experts, m, w.n_experts())?;
    let xv = x.to_f32_vec()?;
    let args = GatherMmArgs {
        x: &xv,
        m,
        w,
        segments: &segs,
    };
    let out = match backend {
        Backend::CpuReference => crate::cpu::reference::gather_mm::gather_mm(&args)?,
        Backend::CpuFast | Backend::Cuda => crate::cpu::fast::gather_mm::gather_mm(&args)?,
    };
    Tensor::from_f32(&out, &[m, w.rows()], x.dtype())
}

/// Dense quantized matmul `x [M, K] · Wᵀ` with a single-expert `W [N, K]`.
pub fn qmm(x: &Tensor, w: &QuantWeights) -> Result<Tensor> {
    qmm_on(Backend::for_device(x.device())?, x, w)
}

/// [`qmm`] with an explicit backend.
pub fn qmm_on(backend: Backend, x: &Tensor, w: &QuantWeights) -> Result<Tensor> {
    ensure(
        w.n_experts() == 1,
        "qmm",
        "w",
        "a single expert (E = 1)",
        format!("E = {}", w.n_experts()),
    )?;
    check_float("qmm", "x", x, 2)?;
    gather_mm_on(backend, x, w, RowExperts::Single)
}
