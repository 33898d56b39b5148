//! Activations: SwiGLU `silu(gate) · up`, elementwise and fused with the
//! grouped gate and up projections (one pass over both weight matrices).

use crate::device::Backend;
use crate::error::{ensure, Result};
use crate::format::QuantWeights;
use crate::ops::ffn::ExpertFfn;
use crate::ops::gather_mm::{segments, RowExperts};
use crate::ops::{check_float, check_shape};
use crate::tensor::Tensor;

/// `silu(g) = g · sigmoid(g)`, in f32.
#[inline]
pub fn silu(g: f32) -> f32 {
    g / (1.0 + (-g).exp())
}

/// Elementwise `silu(gate) · up` with the backend of `gate`'s device.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    swiglu_on(Backend::for_device(gate.device())?, gate, up)
}

/// [`swiglu`] with an explicit backend; `gate` and `up` share shape and dtype.
pub fn swiglu_on(backend: Backend, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    const OP: &str = "swiglu";
    check_float(OP, "gate", gate, gate.rank())?;
    check_shape(OP, "up", up, gate.shape())?;
    ensure(
        up.dtype() == gate.dtype(),
        OP,
        "up",
        format!("dtype {}", gate.dtype()),
        up.dtype(),
    )?;
    if backend == Backend::Cuda {
        return crate::cuda::ops::act::swiglu(gate, up);
    }
    let (g, u) = (gate.to_f32_vec()?, up.to_f32_vec()?);
    let out: Vec<f32> = match backend {
        Backend::CpuReference => g
            .iter()
            .zip(&u)
            .map(|(&g, &u)| ((g as f64 / (1.0 + (-g as f64).exp())) * u as f64) as f32)
            .collect(),
        Backend::CpuFast | Backend::Cuda => {
            use rayon::prelude::*;
            g.par_iter().zip(&u).map(|(&g, &u)| silu(g) * u).collect()
        }
    };
    Tensor::from_f32(&out, gate.shape(), gate.dtype())
}

/// Gate and up projection weights of a SwiGLU expert FFN.
// Long-lived weight handles, built once per layer: the size gap between
// variants costs nothing, boxing would add an indirection to every use.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum GateUp {
    /// Two `[E, I, H]` matrices.
    Separate {
        /// gate_proj.
        gate: QuantWeights,
        /// up_proj.
        up: QuantWeights,
    },
    /// One `[E, 2I, H]` matrix: rows `0..I` gate, rows `I..2I` up.
    Fused(QuantWeights),
}

impl GateUp {
    /// Separate gate and up weights; they must agree on E, I and H.
    pub fn separate(gate: QuantWeights, up: QuantWeights) -> Result<GateUp> {
        const OP: &str = "gate_up";
        let dims = |w: &QuantWeights| (w.n_experts(), w.rows(), w.cols());
        ensure(
            dims(&up) == dims(&gate),
            OP,
            "up",
            format!("(E, I, H) = {:?} like gate", dims(&gate)),
            format!("{:?}", dims(&up)),
        )?;
        Ok(GateUp::Separate { gate, up })
    }

    /// Fused `[E, 2I, H]` weights (gate rows first).
    pub fn fused(w: QuantWeights) -> Result<GateUp> {
        ensure(
            w.rows().is_multiple_of(2),
            "fused_gate_up",
            "w",
            "an even number of rows (2·I)",
            w.rows(),
        )?;
        Ok(GateUp::Fused(w))
    }

    /// E.
    pub fn n_experts(&self) -> usize {
        match self {
            GateUp::Separate { gate, .. } => gate.n_experts(),
            GateUp::Fused(w) => w.n_experts(),
        }
    }

    /// I, the intermediate size.
    pub fn intermediate(&self) -> usize {
        match self {
            GateUp::Separate { gate, .. } => gate.rows(),
            GateUp::Fused(w) => w.rows() / 2,
        }
    }

    /// H, the input size.
    pub fn hidden(&self) -> usize {
        match self {
            GateUp::Separate { gate, .. } => gate.cols(),
            GateUp::Fused(w) => w.cols(),
        }
    }

    /// Bytes of one expert's gate and up weights.
    pub fn bytes_per_expert(&self) -> usize {
        match self {
            GateUp::Separate { gate, up } => gate.bytes_per_expert() + up.bytes_per_expert(),
            GateUp::Fused(w) => w.bytes_per_expert(),
        }
    }

    /// The two weight sources (matrix, first row) of gate and up.
    pub(crate) fn sources(&self) -> [(&QuantWeights, usize); 2] {
        match self {
            GateUp::Separate { gate, up } => [(gate, 0), (up, 0)],
            GateUp::Fused(w) => [(w, 0), (w, w.rows() / 2)],
        }
    }
}

/// Fused grouped `silu(x·Wgᵀ) · (x·Wuᵀ)` with the backend of `x`'s device:
/// `x [M, H]` → `[M, I]` in `x`'s dtype.
pub fn gather_swiglu(x: &Tensor, w: &GateUp, experts: RowExperts<'_>) -> Result<Tensor> {
    gather_swiglu_on(Backend::for_device(x.device())?, x, w, experts)
}

/// [`gather_swiglu`] with an explicit backend.
pub fn gather_swiglu_on(
    backend: Backend,
    x: &Tensor,
    w: &GateUp,
    experts: RowExperts<'_>,
) -> Result<Tensor> {
    gather_glu_on(backend, x, w, experts, &ExpertFfn::default())
}

/// [`gather_swiglu_on`] with the experts' activation and gate/up biases and
/// scales of `ffn`: `act(s_g[e]·(x·Wgᵀ) + gate_bias[e], s_u[e]·(x·Wuᵀ) +
/// up_bias[e])` (its router and down biases and down's scale are not used
/// here). The biases and scales are on `x`'s device.
pub fn gather_glu_on(
    backend: Backend,
    x: &Tensor,
    w: &GateUp,
    experts: RowExperts<'_>,
    ffn: &ExpertFfn,
) -> Result<Tensor> {
    const OP: &str = "gather_swiglu";
    check_float(OP, "x", x, 2)?;
    let (m, h) = (x.shape()[0], x.shape()[1]);
    ensure(
        h == w.hidden(),
        OP,
        "x",
        format!("{} columns (H of the weights)", w.hidden()),
        h,
    )?;
    let i = w.intermediate();
    ffn.check(w.n_experts(), h, i, x.device())?;
    if backend == Backend::Cuda {
        // Before any host access: offsets/ids stay on the device.
        return crate::cuda::ops::gather_mm::gather_glu(x, w, experts, ffn);
    }
    let segs = segments(OP, experts, m, w.n_experts())?;
    let xv = x.to_f32_vec()?;
    let act = ffn.act;
    let host = |t: &Option<Tensor>| t.as_ref().map(|t| t.to_f32_vec()).transpose();
    let (gb, ub) = (host(&ffn.bias.gate)?, host(&ffn.bias.up)?);
    let (gs, us) = (host(&ffn.scale.gate)?, host(&ffn.scale.up)?);
    let bias = |b: &Option<Vec<f32>>, at: usize| b.as_ref().map_or(0.0, |b| b[at]);
    let scale = |s: &Option<Vec<f32>>, e: usize| s.as_ref().map_or(1.0, |s| s[e]);
    let out = match backend {
        Backend::CpuReference => {
            let [(gw, go), (uw, uo)] = w.sources();
            let mut out = vec![0f32; m * i];
            for seg in &segs {
                let (gm, um) = (
                    gw.dequantize_expert(seg.expert)?,
                    uw.dequantize_expert(seg.expert)?,
                );
                for &r in &seg.rows {
                    let xr = &xv[r as usize * h..(r as usize + 1) * h];
                    for n in 0..i {
                        let dot = |wm: &[f32], row: usize| -> f64 {
                            xr.iter()
                                .zip(&wm[row * h..(row + 1) * h])
                                .map(|(&a, &b)| a as f64 * b as f64)
                                .sum()
                        };
                        let at = seg.expert * i + n;
                        let (sg, su) = (scale(&gs, seg.expert), scale(&us, seg.expert));
                        let g = dot(&gm, go + n) * sg as f64 + bias(&gb, at) as f64;
                        let u = dot(&um, uo + n) * su as f64 + bias(&ub, at) as f64;
                        out[r as usize * i + n] = act.apply_f64(g, u) as f32;
                    }
                }
            }
            out
        }
        Backend::CpuFast | Backend::Cuda => {
            use crate::cpu::fast::gather_mm::{project, Source, Strategy};
            let [(gw, go), (uw, uo)] = w.sources();
            fn src(w: &QuantWeights, o: usize) -> Result<Source<'_>> {
                Ok(Source {
                    dec: w.decoder()?,
                    row_offset: o,
                })
            }
            if ffn.glu_is_plain() {
                project(
                    Strategy::Auto,
                    &xv,
                    m,
                    &segs,
                    [src(gw, go)?, src(uw, uo)?],
                    i,
                    |[g, u]| silu(g) * u,
                )?
            } else {
                // Gate and up apart, then the scales and biases by expert and
                // the activation (the epilogue knows no expert).
                let g = project(Strategy::Auto, &xv, m, &segs, [src(gw, go)?], i, |[g]| g)?;
                let mut u = project(Strategy::Auto, &xv, m, &segs, [src(uw, uo)?], i, |[u]| u)?;
                for seg in &segs {
                    let (sg, su) = (scale(&gs, seg.expert), scale(&us, seg.expert));
                    for &r in &seg.rows {
                        let r = r as usize;
                        for n in 0..i {
                            let at = seg.expert * i + n;
                            let o = &mut u[r * i + n];
                            let g = g[r * i + n] * sg + bias(&gb, at);
                            *o = act.apply(g, *o * su + bias(&ub, at));
                        }
                    }
                }
                u
            }
        }
    };
    Tensor::from_f32(&out, &[m, i], x.dtype())
}
