//! What the router and the routed experts read when it is not the block's
//! input `x` itself ([`ExpertInput`], part of [`crate::ops::ffn::ExpertFfn`]):
//!
//! - **Gemma-4**: the router reads its own RMS norm of `x` (mlx-lm
//!   `Router`: `rms_norm(x, scale · H^-½)`), the experts read
//!   `pre_feedforward_layernorm_2(x)`; `x` is the residual stream.
//! - **Llama-4** (llama.cpp `weight_before_ffn`): the routing weight scales
//!   the expert's *input*, `y_t = down(act(w · x_t))`, not its output.
//!   Both references route top-1 only, and so does this: with k = 1 the
//!   block runs its experts on `w ⊙ x` (rounded to x's dtype, as mlx-lm's
//!   `x * scores` is) with weights 1.
//!
//! ```text
//! x ─ router_norm? ─ router ─ ids, w ─┐
//! x ─ expert_norm? ───────────────────┴─ (w ⊙ · if weight_before) ─ experts
//! ```

use std::borrow::Cow;

use crate::device::Backend;
use crate::error::{ensure, Result};
use crate::ops::norm::{rms_norm_on, RmsNormParams};
use crate::ops::route::Routing;
use crate::tensor::Tensor;
use crate::{DType, Device};

/// An RMS norm `x · rsqrt(mean(x²) + eps) · weight` of an input.
#[derive(Debug, Clone)]
pub struct InputNorm {
    /// `[H]` f32 scale.
    pub weight: Tensor,
    /// Added to `mean(x²)`; finite, ≥ 0.
    pub eps: f32,
}

/// The router's and the experts' inputs ([`ExpertInput::default`]: both
/// read `x`, weights applied to the outputs).
#[derive(Debug, Clone, Default)]
pub struct ExpertInput {
    /// The router reads `norm(x)` (Gemma-4's router norm).
    pub router_norm: Option<InputNorm>,
    /// The routed experts read `norm(x)` (Gemma-4's
    /// `pre_feedforward_layernorm_2`). The shared expert, if any, reads `x`.
    pub expert_norm: Option<InputNorm>,
    /// The routing weight scales the experts' input (Llama-4); top-1 only.
    pub weight_before: bool,
}

impl InputNorm {
    /// A norm of f32 scale `weight` (`[H]`, on the CPU) and `eps`.
    pub fn new(weight: &[f32], eps: f32) -> Result<InputNorm> {
        Ok(InputNorm {
            weight: Tensor::from_f32(weight, &[weight.len()], DType::F32)?,
            eps,
        })
    }
}

impl ExpertInput {
    /// Whether both read `x` and weights scale outputs.
    pub fn is_plain(&self) -> bool {
        self.router_norm.is_none() && self.expert_norm.is_none() && !self.weight_before
    }

    /// Checks the norms (f32 `[h]` on `device`, eps finite ≥ 0) and that
    /// `weight_before` comes with `top_k = 1`.
    pub fn check(&self, h: usize, top_k: usize, device: Device) -> Result<()> {
        const OP: &str = "expert_input";
        for (name, n) in [
            ("router_norm", &self.router_norm),
            ("expert_norm", &self.expert_norm),
        ] {
            if let Some(n) = n {
                let w = &n.weight;
                ensure(
                    w.dtype() == DType::F32 && w.shape() == [h] && w.device() == device,
                    OP,
                    name,
                    format!("an f32 [{h}] weight on {device}"),
                    format!("{} {:?} on {}", w.dtype(), w.shape(), w.device()),
                )?;
                ensure(
                    n.eps.is_finite() && n.eps >= 0.0,
                    OP,
                    name,
                    "a finite eps ≥ 0",
                    n.eps,
                )?;
            }
        }
        ensure(
            !self.weight_before || top_k == 1,
            OP,
            "weight_before",
            "top_k = 1 (the routing weight scales the expert's input: Llama-4 routes \
             top-1, as mlx-lm and llama.cpp do)",
            format!("top_k = {top_k}"),
        )
    }

    /// A copy with the norms' weights on `device`.
    pub fn to_device(&self, device: Device) -> Result<ExpertInput> {
        let mv = |n: &Option<InputNorm>| -> Result<Option<InputNorm>> {
            n.as_ref()
                .map(|n| {
                    Ok(InputNorm {
                        weight: n.weight.to_device(device)?,
                        eps: n.eps,
                    })
                })
                .transpose()
        };
        Ok(ExpertInput {
            router_norm: mv(&self.router_norm)?,
            expert_norm: mv(&self.expert_norm)?,
            weight_before: self.weight_before,
        })
    }

    /// The router's input and the experts' input (before any
    /// [`weight_before`](Self::weight_before) scaling) for block input `x`.
    pub fn inputs_on<'a>(
        &self,
        backend: Backend,
        x: &'a Tensor,
    ) -> Result<(Cow<'a, Tensor>, Cow<'a, Tensor>)> {
        let norm = |n: &Option<InputNorm>| -> Result<Cow<'a, Tensor>> {
            Ok(match n {
                Some(n) => Cow::Owned(rms_norm_on(
                    backend,
                    &RmsNormParams {
                        x,
                        weight: &n.weight,
                        eps: n.eps,
                    },
                )?),
                None => Cow::Borrowed(x),
            })
        };
        Ok((norm(&self.router_norm)?, norm(&self.expert_norm)?))
    }
}

impl ExpertInput {
    /// The routed experts' input and routing for their input `xe` (from
    /// [`inputs_on`](Self::inputs_on)): `xe` and `routing` themselves, or
    /// with [`weight_before`](Self::weight_before) [`weight_input_on`]'s.
    pub fn experts_on<'a>(
        &self,
        backend: Backend,
        xe: &'a Tensor,
        routing: &'a Routing,
    ) -> Result<(Cow<'a, Tensor>, Cow<'a, Routing>)> {
        if !self.weight_before {
            return Ok((Cow::Borrowed(xe), Cow::Borrowed(routing)));
        }
        let (xw, rw) = weight_input_on(backend, xe, routing)?;
        Ok((Cow::Owned(xw), Cow::Owned(rw)))
    }
}

/// `w[t] ⊙ x[t]` with `w` rounded to x's dtype and the product rounded
/// again (mlx-lm's `x * scores.astype(x.dtype)`), and a routing of the same
/// ids with weights 1: what the experts of a `weight_before` block run on.
/// `x [T, H]` float, `routing.weights f32 [T, 1]`, on one device.
pub fn weight_input_on(
    backend: Backend,
    x: &Tensor,
    routing: &Routing,
) -> Result<(Tensor, Routing)> {
    const OP: &str = "weight_input";
    crate::ops::check_float(OP, "x", x, 2)?;
    let t = x.shape()[0];
    crate::ops::check_shape(OP, "routing.weights", &routing.weights, &[t, 1])?;
    crate::ops::check_dtype(OP, "routing.weights", &routing.weights, DType::F32)?;
    if backend == Backend::Cuda {
        let xw = Tensor::uninit_on(x.dtype(), x.shape(), x.device())?;
        let ones = Tensor::uninit_on(DType::F32, &[t, 1], x.device())?;
        crate::cuda::ops::act::weight_rows_into(x, &routing.weights, &xw, &ones)?;
        let r = Routing {
            ids: routing.ids.clone(),
            weights: ones,
        };
        return Ok((xw, r));
    }
    let dt = x.dtype();
    let w = Tensor::from_f32(&routing.weights.to_f32_vec()?, &[t], dt)?.to_f32_vec()?;
    let mut v = x.to_f32_vec()?;
    let h = x.shape()[1].max(1);
    for (row, &w) in v.chunks_exact_mut(h).zip(&w) {
        for y in row {
            *y *= w;
        }
    }
    let r = Routing {
        ids: routing.ids.clone(),
        weights: Tensor::from_f32(&vec![1.0; t], &[t, 1], DType::F32)?,
    };
    Ok((Tensor::from_f32(&v, x.shape(), dt)?, r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weight_before_scales_rows_and_unit_weights() {
        let x = Tensor::from_f32(&[1.0, 2.0, 3.0, 4.0], &[2, 2], DType::F32).unwrap();
        let r = Routing {
            ids: Tensor::from_slice(&[3u32, 1], &[2, 1]).unwrap(),
            weights: Tensor::from_f32(&[0.5, 0.25], &[2, 1], DType::F32).unwrap(),
        };
        for b in [Backend::CpuReference, Backend::CpuFast] {
            let (xw, rw) = weight_input_on(b, &x, &r).unwrap();
            assert_eq!(xw.to_f32_vec().unwrap(), [0.5, 1.0, 0.75, 1.0]);
            assert_eq!(rw.weights.to_f32_vec().unwrap(), [1.0, 1.0]);
            assert_eq!(rw.ids.as_slice::<u32>().unwrap(), [3, 1]);
        }
        // bf16: the weight is rounded before the product (1/3 → 0.333984375).
        let xb = Tensor::from_f32(&[3.0, 3.0], &[1, 2], DType::Bf16).unwrap();
        let rb = Routing {
            ids: Tensor::from_slice(&[0u32], &[1, 1]).unwrap(),
            weights: Tensor::from_f32(&[1.0 / 3.0], &[1, 1], DType::F32).unwrap(),
        };
        let (xw, _) = weight_input_on(Backend::CpuFast, &xb, &rb).unwrap();
        assert_eq!(xw.to_f32_vec().unwrap(), [1.0, 1.0]);
        // k = 2 is refused.
        let r2 = Routing {
            ids: Tensor::from_slice(&[0u32, 1], &[1, 2]).unwrap(),
            weights: Tensor::from_f32(&[0.5, 0.5], &[1, 2], DType::F32).unwrap(),
        };
        let err = weight_input_on(Backend::CpuFast, &xb, &r2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("routing.weights"), "{err}");
    }

    #[test]
    fn bad_norms_and_top_k_are_refused() {
        let inp = ExpertInput {
            weight_before: true,
            ..Default::default()
        };
        assert!(!inp.is_plain());
        assert!(inp.check(4, 1, Device::Cpu).is_ok());
        let err = inp.check(4, 2, Device::Cpu).unwrap_err().to_string();
        assert!(
            err.contains("weight_before") && err.contains("top_k = 2"),
            "{err}"
        );
        let bad = ExpertInput {
            router_norm: Some(InputNorm::new(&[1.0; 3], 1e-6).unwrap()),
            ..Default::default()
        };
        let err = bad.check(4, 1, Device::Cpu).unwrap_err().to_string();
        assert!(err.contains("router_norm") && err.contains("[4]"), "{err}");
    }
}
