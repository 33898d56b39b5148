//! RMS norm and the fused norm epilogues of an MoE layer (the semantics of
//! mlx-native's `fused-norm-routing` Metal kernels).
//!
//! Layout: activations are `[rows, dim]` (MoE expert outputs `[rows, k, dim]`),
//! all of one float dtype (f32, f16 or bf16); norm weights and scalars may be
//! any float dtype; MoE routing weights are `f32 [rows, k]`. Arithmetic is f32
//! (the reference backend uses f64) and the output has the activations' dtype.
//!
//! With `n(v) = v · rsqrt(mean(v²) + eps)` over one row of `dim` values
//! (products left to right, e.g. `n(v)·w = (v · rsqrt(..)) · w`):
//!
//! | function | output row |
//! |---|---|
//! | [`rms_norm`] | `n(x)·w` |
//! | [`norm_add`] | `residual + n(input)·w` |
//! | [`residual_norm`] | `n(residual + input)·w` (and optionally the sum) |
//! | [`residual_norm_scalar`] | `n(residual + input)·w·scalar` |
//! | [`norm_add_scalar`] | `(residual + n(input)·w)·scalar` |
//! | [`moe_wsum_norm_add`] | `residual + n(Σ_k wₖ·yₖ)·w` |
//! | [`moe_wsum_dnorm_add`] | `n(residual)·w_res + n(Σ_k wₖ·yₖ)·w_moe` |
//!
//! `scalar` is `[1]` (broadcast) or `[dim]` (per element).

use crate::cpu;
use crate::device::Backend;
use crate::dtype::{DType, Float};
use crate::error::{ensure, invalid, Result};
use crate::ops::{check_dtype, check_float, check_shape};
use crate::tensor::Tensor;
use half::{bf16, f16};

/// Operands of [`rms_norm`]: `n(x)·weight`.
#[derive(Debug, Clone, Copy)]
pub struct RmsNormParams<'a> {
    /// `[rows, dim]` activations.
    pub x: &'a Tensor,
    /// `[dim]` norm scale.
    pub weight: &'a Tensor,
    /// Added to `mean(x²)`; finite, ≥ 0.
    pub eps: f32,
}

/// Operands of [`norm_add`]: `residual + n(input)·weight` (mlx-native `fused_norm_add`).
#[derive(Debug, Clone, Copy)]
pub struct NormAddParams<'a> {
    /// `[rows, dim]` residual stream.
    pub residual: &'a Tensor,
    /// `[rows, dim]` sublayer output, normalised.
    pub input: &'a Tensor,
    /// `[dim]` norm scale.
    pub weight: &'a Tensor,
    /// Finite, ≥ 0.
    pub eps: f32,
}

/// Operands of [`residual_norm`]: `n(residual + input)·weight` (mlx-native `fused_residual_norm`).
#[derive(Debug, Clone, Copy)]
pub struct ResidualNormParams<'a> {
    /// `[rows, dim]` residual stream.
    pub residual: &'a Tensor,
    /// `[rows, dim]` sublayer output.
    pub input: &'a Tensor,
    /// `[dim]` norm scale.
    pub weight: &'a Tensor,
    /// Finite, ≥ 0.
    pub eps: f32,
    /// Also return `residual + input` (rounded to the activation dtype).
    pub write_sum: bool,
}

/// Result of [`residual_norm`].
#[derive(Debug, Clone)]
pub struct ResidualNormOutput {
    /// `n(residual + input)·weight`, `[rows, dim]`.
    pub normed: Tensor,
    /// `residual + input`, `[rows, dim]`, when `write_sum` was set.
    pub sum: Option<Tensor>,
}

/// Operands of [`residual_norm_scalar`] and [`norm_add_scalar`].
#[derive(Debug, Clone, Copy)]
pub struct ScalarNormParams<'a> {
    /// `[rows, dim]` residual stream.
    pub residual: &'a Tensor,
    /// `[rows, dim]` sublayer output.
    pub input: &'a Tensor,
    /// `[dim]` norm scale.
    pub weight: &'a Tensor,
    /// `[1]` (broadcast) or `[dim]` (per element) output scale.
    pub scalar: &'a Tensor,
    /// Finite, ≥ 0.
    pub eps: f32,
}

/// Operands of [`moe_wsum_norm_add`]: `residual + n(Σ_k w[r,k]·y[r,k,:])·norm_weight`.
#[derive(Debug, Clone, Copy)]
pub struct MoeWsumNormAddParams<'a> {
    /// `[rows, k, dim]` expert outputs y.
    pub expert_outputs: &'a Tensor,
    /// `f32 [rows, k]` routing weights w.
    pub weights: &'a Tensor,
    /// `[rows, dim]` residual stream.
    pub residual: &'a Tensor,
    /// `[dim]` norm scale.
    pub norm_weight: &'a Tensor,
    /// Finite, ≥ 0.
    pub eps: f32,
}

/// Operands of [`moe_wsum_dnorm_add`]:
/// `n(residual)·res_norm_weight + n(Σ_k w[r,k]·y[r,k,:])·moe_norm_weight`.
#[derive(Debug, Clone, Copy)]
pub struct MoeWsumDnormAddParams<'a> {
    /// `[rows, k, dim]` expert outputs y.
    pub expert_outputs: &'a Tensor,
    /// `f32 [rows, k]` routing weights w.
    pub weights: &'a Tensor,
    /// `[rows, dim]`, normalised (not added as is).
    pub residual: &'a Tensor,
    /// `[dim]` norm scale of the residual.
    pub res_norm_weight: &'a Tensor,
    /// `[dim]` norm scale of the weighted sum.
    pub moe_norm_weight: &'a Tensor,
    /// Finite, ≥ 0.
    pub eps: f32,
}

/// Which row function a backend computes (see the table in the module docs;
/// `v` is the normalised row, `w` = [`EpilogueArgs::weight`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Epilogue {
    /// `v = x`; `n(v)·w`.
    RmsNorm,
    /// `v = input`; `residual + n(v)·w`.
    NormAdd,
    /// `v = residual + input`; `n(v)·w`, optionally also `v`.
    ResidualNorm,
    /// `v = residual + input`; `n(v)·w·scalar`.
    ResidualNormScalar,
    /// `v = input`; `(residual + n(v)·w)·scalar`.
    NormAddScalar,
    /// `v = Σ_k wₖ·yₖ`; `residual + n(v)·w`.
    MoeWsumNormAdd,
    /// `v = Σ_k wₖ·yₖ`; `n(residual)·residual_weight + n(v)·w`.
    MoeWsumDnormAdd,
}

impl Epilogue {
    fn is_moe(self) -> bool {
        matches!(self, Epilogue::MoeWsumNormAdd | Epilogue::MoeWsumDnormAdd)
    }
    fn has_scalar(self) -> bool {
        matches!(self, Epilogue::ResidualNormScalar | Epilogue::NormAddScalar)
    }
}

/// Validated, typed operands of one epilogue, as the backends receive them.
/// Unused operands are empty slices.
#[derive(Debug, Clone, Copy)]
pub struct EpilogueArgs<'a, T> {
    /// The row function.
    pub op: Epilogue,
    /// Number of rows.
    pub rows: usize,
    /// Row length (≥ 1).
    pub dim: usize,
    /// k of the MoE ops (0 otherwise).
    pub top_k: usize,
    /// Norm epsilon.
    pub eps: f32,
    /// `[rows, dim]` x / input, or `[rows, k, dim]` expert outputs.
    pub input: &'a [T],
    /// `[rows, k]` MoE routing weights.
    pub moe_weights: &'a [f32],
    /// `[rows, dim]` residual.
    pub residual: &'a [T],
    /// `[dim]` scale of `n(v)`.
    pub weight: &'a [f32],
    /// `[dim]` scale of `n(residual)` ([`Epilogue::MoeWsumDnormAdd`]).
    pub residual_weight: &'a [f32],
    /// `[1]` or `[dim]` output scale.
    pub scalar: &'a [f32],
}

impl<T> EpilogueArgs<'_, T> {
    /// Checks slice lengths against `rows`, `dim`, `top_k` and `op`.
    pub(crate) fn check(&self, out: usize, sum: Option<usize>) -> Result<()> {
        const OP: &str = "norm epilogue backend";
        let (rows, dim, op) = (self.rows, self.dim, self.op);
        let n = rows * dim;
        ensure(dim >= 1, OP, "dim", "≥ 1", dim)?;
        let input = if op.is_moe() { n * self.top_k } else { n };
        ensure(
            self.input.len() == input,
            OP,
            "input",
            format!("{input} values"),
            self.input.len(),
        )?;
        if op.is_moe() {
            ensure(
                self.moe_weights.len() == rows * self.top_k,
                OP,
                "moe_weights",
                format!("{} values", rows * self.top_k),
                self.moe_weights.len(),
            )?;
        }
        if op != Epilogue::RmsNorm {
            ensure(
                self.residual.len() == n,
                OP,
                "residual",
                format!("{n} values"),
                self.residual.len(),
            )?;
        }
        ensure(
            self.weight.len() == dim,
            OP,
            "weight",
            format!("{dim} values"),
            self.weight.len(),
        )?;
        if op == Epilogue::MoeWsumDnormAdd {
            ensure(
                self.residual_weight.len() == dim,
                OP,
                "residual_weight",
                format!("{dim} values"),
                self.residual_weight.len(),
            )?;
        }
        if op.has_scalar() {
            let s = self.scalar.len();
            ensure(
                s == 1 || s == dim,
                OP,
                "scalar",
                format!("1 or {dim} values"),
                s,
            )?;
        }
        ensure(out == n, OP, "out", format!("{n} values"), out)?;
        if let Some(s) = sum {
            ensure(
                op == Epilogue::ResidualNorm && s == n,
                OP,
                "sum_out",
                format!("{n} values, ResidualNorm only"),
                s,
            )
        } else {
            Ok(())
        }
    }
}

/// One epilogue call: tensors with the names they have in their params struct.
struct Call<'a> {
    name: &'static str,
    op: Epilogue,
    input: (&'static str, &'a Tensor),
    moe_weights: Option<&'a Tensor>,
    residual: Option<&'a Tensor>,
    weight: (&'static str, &'a Tensor),
    residual_weight: Option<&'a Tensor>,
    scalar: Option<&'a Tensor>,
    eps: f32,
    write_sum: bool,
}

impl<'a> Call<'a> {
    /// A call with no residual, MoE weights, second norm weight or scalar.
    fn new(
        name: &'static str,
        op: Epilogue,
        input: (&'static str, &'a Tensor),
        weight: (&'static str, &'a Tensor),
        eps: f32,
    ) -> Call<'a> {
        Call {
            name,
            op,
            input,
            moe_weights: None,
            residual: None,
            weight,
            residual_weight: None,
            scalar: None,
            eps,
            write_sum: false,
        }
    }
}

/// `n(x)·weight` with the backend of `x`'s device.
pub fn rms_norm(p: &RmsNormParams<'_>) -> Result<Tensor> {
    rms_norm_on(Backend::for_device(p.x.device())?, p)
}

/// [`rms_norm`] with an explicit backend.
pub fn rms_norm_on(backend: Backend, p: &RmsNormParams<'_>) -> Result<Tensor> {
    let call = Call::new(
        "rms_norm",
        Epilogue::RmsNorm,
        ("x", p.x),
        ("weight", p.weight),
        p.eps,
    );
    run(backend, call).map(|(out, _)| out)
}

/// `residual + n(input)·weight` with the backend of `input`'s device.
pub fn norm_add(p: &NormAddParams<'_>) -> Result<Tensor> {
    norm_add_on(Backend::for_device(p.input.device())?, p)
}

/// [`norm_add`] with an explicit backend.
pub fn norm_add_on(backend: Backend, p: &NormAddParams<'_>) -> Result<Tensor> {
    let call = Call {
        residual: Some(p.residual),
        ..Call::new(
            "norm_add",
            Epilogue::NormAdd,
            ("input", p.input),
            ("weight", p.weight),
            p.eps,
        )
    };
    run(backend, call).map(|(out, _)| out)
}

/// `n(residual + input)·weight` (and the sum if asked) with the backend of `input`'s device.
pub fn residual_norm(p: &ResidualNormParams<'_>) -> Result<ResidualNormOutput> {
    residual_norm_on(Backend::for_device(p.input.device())?, p)
}

/// [`residual_norm`] with an explicit backend.
pub fn residual_norm_on(
    backend: Backend,
    p: &ResidualNormParams<'_>,
) -> Result<ResidualNormOutput> {
    let call = Call {
        residual: Some(p.residual),
        write_sum: p.write_sum,
        ..Call::new(
            "residual_norm",
            Epilogue::ResidualNorm,
            ("input", p.input),
            ("weight", p.weight),
            p.eps,
        )
    };
    run(backend, call).map(|(normed, sum)| ResidualNormOutput { normed, sum })
}

/// `n(residual + input)·weight·scalar` with the backend of `input`'s device.
pub fn residual_norm_scalar(p: &ScalarNormParams<'_>) -> Result<Tensor> {
    residual_norm_scalar_on(Backend::for_device(p.input.device())?, p)
}

/// [`residual_norm_scalar`] with an explicit backend.
pub fn residual_norm_scalar_on(backend: Backend, p: &ScalarNormParams<'_>) -> Result<Tensor> {
    run(
        backend,
        scalar_call("residual_norm_scalar", Epilogue::ResidualNormScalar, p),
    )
    .map(|(out, _)| out)
}

/// `(residual + n(input)·weight)·scalar` with the backend of `input`'s device.
pub fn norm_add_scalar(p: &ScalarNormParams<'_>) -> Result<Tensor> {
    norm_add_scalar_on(Backend::for_device(p.input.device())?, p)
}

/// [`norm_add_scalar`] with an explicit backend.
pub fn norm_add_scalar_on(backend: Backend, p: &ScalarNormParams<'_>) -> Result<Tensor> {
    run(
        backend,
        scalar_call("norm_add_scalar", Epilogue::NormAddScalar, p),
    )
    .map(|(out, _)| out)
}

/// `residual + n(Σ_k w·y)·norm_weight` with the backend of `expert_outputs`' device.
pub fn moe_wsum_norm_add(p: &MoeWsumNormAddParams<'_>) -> Result<Tensor> {
    moe_wsum_norm_add_on(Backend::for_device(p.expert_outputs.device())?, p)
}

/// [`moe_wsum_norm_add`] with an explicit backend.
pub fn moe_wsum_norm_add_on(backend: Backend, p: &MoeWsumNormAddParams<'_>) -> Result<Tensor> {
    let call = Call {
        moe_weights: Some(p.weights),
        residual: Some(p.residual),
        ..Call::new(
            "moe_wsum_norm_add",
            Epilogue::MoeWsumNormAdd,
            ("expert_outputs", p.expert_outputs),
            ("norm_weight", p.norm_weight),
            p.eps,
        )
    };
    run(backend, call).map(|(out, _)| out)
}

/// `n(residual)·res_norm_weight + n(Σ_k w·y)·moe_norm_weight` with the backend
/// of `expert_outputs`' device.
pub fn moe_wsum_dnorm_add(p: &MoeWsumDnormAddParams<'_>) -> Result<Tensor> {
    moe_wsum_dnorm_add_on(Backend::for_device(p.expert_outputs.device())?, p)
}

/// [`moe_wsum_dnorm_add`] with an explicit backend.
pub fn moe_wsum_dnorm_add_on(backend: Backend, p: &MoeWsumDnormAddParams<'_>) -> Result<Tensor> {
    let call = Call {
        moe_weights: Some(p.weights),
        residual: Some(p.residual),
        residual_weight: Some(p.res_norm_weight),
        ..Call::new(
            "moe_wsum_dnorm_add",
            Epilogue::MoeWsumDnormAdd,
            ("expert_outputs", p.expert_outputs),
            ("moe_norm_weight", p.moe_norm_weight),
            p.eps,
        )
    };
    run(backend, call).map(|(out, _)| out)
}

fn scalar_call<'a>(name: &'static str, op: Epilogue, p: &ScalarNormParams<'a>) -> Call<'a> {
    Call {
        residual: Some(p.residual),
        scalar: Some(p.scalar),
        ..Call::new(name, op, ("input", p.input), ("weight", p.weight), p.eps)
    }
}

/// Validates a call; returns (rows, dim, k).
fn validate(c: &Call<'_>) -> Result<(usize, usize, usize)> {
    let op = c.name;
    ensure(
        c.eps.is_finite() && c.eps >= 0.0,
        op,
        "eps",
        "a finite number ≥ 0",
        c.eps,
    )?;
    let (arg, x) = c.input;
    let (rows, k, dim) = if c.op.is_moe() {
        check_float(op, arg, x, 3)?;
        match x.shape() {
            &[r, k, d] => (r, k, d),
            s => {
                return Err(invalid(
                    op,
                    arg,
                    "rank 3 [rows, k, dim]",
                    format!("shape {s:?}"),
                ))
            }
        }
    } else {
        check_float(op, arg, x, 2)?;
        match x.shape() {
            &[r, d] => (r, 0, d),
            s => {
                return Err(invalid(
                    op,
                    arg,
                    "rank 2 [rows, dim]",
                    format!("shape {s:?}"),
                ))
            }
        }
    };
    ensure(
        dim >= 1,
        op,
        arg,
        "dim ≥ 1",
        format!("shape {:?}", x.shape()),
    )?;
    if let Some(w) = c.moe_weights {
        check_dtype(op, "weights", w, DType::F32)?;
        check_shape(op, "weights", w, &[rows, k])?;
    }
    if let Some(r) = c.residual {
        ensure(
            r.dtype() == x.dtype(),
            op,
            "residual",
            format!("dtype {} (like {arg})", x.dtype()),
            r.dtype(),
        )?;
        check_shape(op, "residual", r, &[rows, dim])?;
    }
    let weights = [
        Some(c.weight),
        c.residual_weight.map(|w| ("res_norm_weight", w)),
    ];
    for (name, w) in weights.into_iter().flatten() {
        check_float(op, name, w, 1)?;
        check_shape(op, name, w, &[dim])?;
    }
    if let Some(s) = c.scalar {
        check_float(op, "scalar", s, 1)?;
        let n = s.numel();
        ensure(
            n == 1 || n == dim,
            op,
            "scalar",
            format!("shape [1] or [{dim}]"),
            format!("{:?}", s.shape()),
        )?;
    }
    Ok((rows, dim, k))
}

fn run(backend: Backend, c: Call<'_>) -> Result<(Tensor, Option<Tensor>)> {
    let (rows, dim, k) = validate(&c)?;
    if backend == Backend::Cuda {
        let operands = crate::cuda::ops::norm::EpilogueOperands {
            op: c.op,
            input: c.input.1,
            moe_weights: c.moe_weights,
            residual: c.residual,
            weight: c.weight.1,
            residual_weight: c.residual_weight,
            scalar: c.scalar,
            eps: c.eps,
        };
        return crate::cuda::ops::norm::epilogue(&operands, c.write_sum);
    }
    let f32s = |t: Option<&Tensor>| t.map_or(Ok(Vec::new()), Tensor::to_f32_vec);
    let (w, rw, sc) = (
        c.weight.1.to_f32_vec()?,
        f32s(c.residual_weight)?,
        f32s(c.scalar)?,
    );
    let dtype = c.input.1.dtype();
    let mut out = Tensor::zeros(dtype, &[rows, dim]);
    let mut sum = c.write_sum.then(|| Tensor::zeros(dtype, &[rows, dim]));
    let shape = Shape {
        rows,
        dim,
        k,
        w: &w,
        rw: &rw,
        sc: &sc,
    };
    match dtype {
        DType::F32 => exec::<f32>(backend, &c, &shape, &mut out, sum.as_mut())?,
        DType::F16 => exec::<f16>(backend, &c, &shape, &mut out, sum.as_mut())?,
        DType::Bf16 => exec::<bf16>(backend, &c, &shape, &mut out, sum.as_mut())?,
        other => return Err(invalid(c.name, c.input.0, "dtype f32, f16 or bf16", other)),
    }
    Ok((out, sum))
}

/// Sizes and the f32 copies of weights and scalar.
struct Shape<'a> {
    rows: usize,
    dim: usize,
    k: usize,
    w: &'a [f32],
    rw: &'a [f32],
    sc: &'a [f32],
}

fn exec<T: Float>(
    backend: Backend,
    c: &Call<'_>,
    s: &Shape<'_>,
    out: &mut Tensor,
    sum: Option<&mut Tensor>,
) -> Result<()> {
    let args = EpilogueArgs {
        op: c.op,
        rows: s.rows,
        dim: s.dim,
        top_k: s.k,
        eps: c.eps,
        input: c.input.1.as_slice::<T>()?,
        moe_weights: c.moe_weights.map_or(Ok(&[][..]), Tensor::as_slice::<f32>)?,
        residual: c.residual.map_or(Ok(&[][..]), Tensor::as_slice::<T>)?,
        weight: s.w,
        residual_weight: s.rw,
        scalar: s.sc,
    };
    let out = out.as_mut_slice::<T>()?;
    let sum = match sum {
        Some(t) => Some(t.as_mut_slice::<T>()?),
        None => None,
    };
    match backend {
        Backend::CpuReference => cpu::reference::norm::epilogue(&args, out, sum),
        Backend::CpuFast | Backend::Cuda => cpu::fast::norm::epilogue(&args, out, sum),
    }
}
