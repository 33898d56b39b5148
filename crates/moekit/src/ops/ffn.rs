//! The routed experts' FFN beyond plain SwiGLU: the gated activation
//! ([`GluAct`]), the optional biases of the router and of each expert's
//! three projections ([`ExpertBiases`]), as gpt-oss has them, and the
//! optional per-expert scales of each projection's output
//! ([`ExpertScales`]: NVFP4 GGUFs' `ffn_{gate,up,down}_exps.scale`, MLX
//! nvfp4's per-expert `global_scale`). One [`ExpertFfn`] per block;
//! [`ExpertFfn::default`] is the plain SwiGLU without biases or scales that
//! most families use.
//!
//! What a block with an `ExpertFfn` computes for token `t` (slot `j`,
//! expert `e = ids[t, j]`, routing weight `w = weights[t, j]`; a missing
//! scale is 1):
//!
//! ```text
//! logits = x·Rᵀ + router_bias
//! g = s_g[e]·(x·Gₑᵀ) + gate_bias[e]     u = s_u[e]·(x·Uₑᵀ) + up_bias[e]
//! y_t = Σ_j w · (s_d[e]·(Dₑ·act(g, u)) + down_bias[e])     (slot order j)
//! ```
//!
//! Each scale multiplies its matmul's output before that projection's bias,
//! as llama.cpp's `build_lora_mm_id` (`ggml_mul` by the selected experts'
//! scales right after `ggml_mul_mat_id`, the bias added by `build_moe_ffn`
//! after it) and mlx-lm's `QuantizedSwitchLinear` (`gather_qmm(...,
//! global_scale)`, then `+ bias`) do. Where each is applied:
//! * `s_g` and `s_u` in the gate/up epilogue, before the biases and the
//!   activation (the gate's scale sits inside the nonlinearity, and the up's
//!   inside gpt-oss's clamp, so neither can move out of it): every path's
//!   GLU (CPU reference and fast, CUDA `GluParams` in `kernels/common.cuh`);
//! * `s_d`, linear in the down projection's output, folded into the combine
//!   weight of each slot: `Σ_j (w·s_d[e])·(Dₑ·h) + Σ_j w·down_bias[e]`
//!   ([`combine_weights_on`]; the fused decode path multiplies in its
//!   combine). The routing weights a forward pass returns
//!   ([`Routing::weights`]) stay the router's.
//!
//! Gemma-4's `ffn_down_exps.scale` is not an `ExpertScales::down`: its
//! router rule carries it ([`crate::ops::route::RouterKind::Gemma4`]), so
//! there it is part of the routing weights, as the GGUF and mlx-lm loaders
//! have always read it (the same product either way: Gemma-4 has no down
//! bias).

use crate::device::Backend;
use crate::error::{ensure, Result};
use crate::ops::act::silu;
pub use crate::ops::input::{ExpertInput, InputNorm};
use crate::ops::route::Routing;
use crate::tensor::Tensor;
use crate::{DType, Device};

/// The gated activation `act(gate, up)` of the experts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GluAct {
    /// `silu(g) · u`.
    SwiGlu,
    /// gpt-oss's clamped SwiGLU (mlx-lm `swiglu_oai`, llama.cpp
    /// `ggml_swiglu_oai`): `g' = min(g, limit)`, `u' = clamp(u, −limit,
    /// limit)`, `(u' + 1) · g' · σ(α · g')`. gpt-oss: α = 1.702, limit = 7.
    SwiGluOai {
        /// α of the sigmoid.
        alpha: f32,
        /// the clamp.
        limit: f32,
    },
    /// Gemma-4's GeGLU: `gelu_tanh(g) · u` with `gelu_tanh(g) = ½ g (1 +
    /// tanh(√(2/π) (g + 0.044715 g³)))` (mlx `nn.gelu_approx`, llama.cpp
    /// `ggml_geglu`).
    GeluTanh,
}

impl GluAct {
    /// gpt-oss's constants.
    pub const GPT_OSS: GluAct = GluAct::SwiGluOai {
        alpha: 1.702,
        limit: 7.0,
    };

    /// `act(g, u)` in f32 (the fast CPU path; the CUDA kernels'
    /// `moekit::glu` is the same formula).
    #[inline]
    pub fn apply(self, g: f32, u: f32) -> f32 {
        match self {
            GluAct::SwiGlu => silu(g) * u,
            GluAct::SwiGluOai { alpha, limit } => {
                let g = g.min(limit);
                let u = u.max(-limit).min(limit);
                (u + 1.0) * (g / (1.0 + (-alpha * g).exp()))
            }
            GluAct::GeluTanh => {
                const C: f32 = 0.797_884_6; // √(2/π)
                0.5 * g * (1.0 + (C * (g + 0.044715 * g * g * g)).tanh()) * u
            }
        }
    }

    /// `act(g, u)` in f64 (the CPU reference).
    pub fn apply_f64(self, g: f64, u: f64) -> f64 {
        match self {
            GluAct::SwiGlu => g / (1.0 + (-g).exp()) * u,
            GluAct::SwiGluOai { alpha, limit } => {
                let (a, l) = (alpha as f64, limit as f64);
                let g = g.min(l);
                let u = u.max(-l).min(l);
                (u + 1.0) * (g / (1.0 + (-a * g).exp()))
            }
            GluAct::GeluTanh => {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * g * (1.0 + (c * (g + 0.044715 * g * g * g)).tanh()) * u
            }
        }
    }

    /// The kernels' code (`GLU_*` in `kernels/common.cuh`) and its α, limit.
    pub(crate) fn kernel_args(self) -> (u32, f32, f32) {
        match self {
            GluAct::SwiGlu => (0, 0.0, 0.0),
            GluAct::SwiGluOai { alpha, limit } => (1, alpha, limit),
            GluAct::GeluTanh => (2, 0.0, 0.0),
        }
    }

    fn check(self) -> Result<()> {
        if let GluAct::SwiGluOai { alpha, limit } = self {
            ensure(
                alpha.is_finite() && limit.is_finite() && limit > 0.0,
                "expert_ffn",
                "act",
                "a finite α and a finite limit > 0",
                format!("α = {alpha}, limit = {limit}"),
            )?;
        }
        Ok(())
    }
}

/// Optional f32 biases; each on the weights' device.
#[derive(Debug, Clone, Default)]
pub struct ExpertBiases {
    /// Router bias `[E]`, added to the logits.
    pub router: Option<Tensor>,
    /// Gate projection bias `[E, I]`.
    pub gate: Option<Tensor>,
    /// Up projection bias `[E, I]`.
    pub up: Option<Tensor>,
    /// Down projection bias `[E, H]`.
    pub down: Option<Tensor>,
}

/// Optional per-expert f32 scales `[E]` of the gate, up and down
/// projections' outputs (see the module doc for where each applies); each
/// on the weights' device.
#[derive(Debug, Clone, Default)]
pub struct ExpertScales {
    /// `s_g`: the gate projection's output × `gate[e]`, before its bias
    /// and the activation.
    pub gate: Option<Tensor>,
    /// `s_u`: the up projection's output × `up[e]`, before its bias.
    pub up: Option<Tensor>,
    /// `s_d`: the down projection's output × `down[e]`, before its bias.
    pub down: Option<Tensor>,
}

impl ExpertScales {
    /// Whether any scale is set.
    pub fn any(&self) -> bool {
        self.gate.is_some() || self.up.is_some() || self.down.is_some()
    }
}

/// The experts' activation, biases and output scales.
#[derive(Debug, Clone)]
pub struct ExpertFfn {
    /// The gated activation.
    pub act: GluAct,
    /// The biases.
    pub bias: ExpertBiases,
    /// The per-expert output scales.
    pub scale: ExpertScales,
    /// What the router and the experts read ([`ExpertInput::default`]: `x`).
    pub input: ExpertInput,
}

impl Default for ExpertFfn {
    fn default() -> ExpertFfn {
        ExpertFfn {
            act: GluAct::SwiGlu,
            bias: ExpertBiases::default(),
            scale: ExpertScales::default(),
            input: ExpertInput::default(),
        }
    }
}

impl ExpertFfn {
    /// Plain SwiGLU without biases or scales (the epilogue with no
    /// per-expert loads).
    pub fn is_plain(&self) -> bool {
        self.act == GluAct::SwiGlu && !self.has_bias() && !self.scale.any()
    }

    /// Whether the gate/up epilogue has anything beyond plain SwiGLU: another
    /// activation, a gate or up bias, or a gate or up scale.
    pub fn glu_is_plain(&self) -> bool {
        let (b, s) = (&self.bias, &self.scale);
        self.act == GluAct::SwiGlu
            && b.gate.is_none()
            && b.up.is_none()
            && s.gate.is_none()
            && s.up.is_none()
    }

    /// Whether any bias is set.
    pub fn has_bias(&self) -> bool {
        let b = &self.bias;
        b.router.is_some() || b.gate.is_some() || b.up.is_some() || b.down.is_some()
    }

    /// Checks α/limit and each bias's and scale's dtype (f32), shape and
    /// device against a block of `e` experts, hidden size `h` and
    /// intermediate size `i` on `device`.
    pub fn check(&self, e: usize, h: usize, i: usize, device: Device) -> Result<()> {
        self.act.check()?;
        let (b, s) = (&self.bias, &self.scale);
        for (name, t, shape) in [
            ("bias.router", &b.router, vec![e]),
            ("bias.gate", &b.gate, vec![e, i]),
            ("bias.up", &b.up, vec![e, i]),
            ("bias.down", &b.down, vec![e, h]),
            ("scale.gate", &s.gate, vec![e]),
            ("scale.up", &s.up, vec![e]),
            ("scale.down", &s.down, vec![e]),
        ] {
            if let Some(t) = t {
                ensure(
                    t.dtype() == DType::F32 && t.shape() == shape.as_slice(),
                    "expert_ffn",
                    name,
                    format!("f32 {shape:?}"),
                    format!("{} {:?}", t.dtype(), t.shape()),
                )?;
                ensure(
                    t.device() == device,
                    "expert_ffn",
                    name,
                    format!("on {device} like the weights"),
                    t.device(),
                )?;
            }
        }
        Ok(())
    }

    /// A copy with every bias and scale on `device`.
    pub fn to_device(&self, device: Device) -> Result<ExpertFfn> {
        let mv = |t: &Option<Tensor>| t.as_ref().map(|t| t.to_device(device)).transpose();
        let (b, s) = (&self.bias, &self.scale);
        Ok(ExpertFfn {
            act: self.act,
            bias: ExpertBiases {
                router: mv(&b.router)?,
                gate: mv(&b.gate)?,
                up: mv(&b.up)?,
                down: mv(&b.down)?,
            },
            scale: ExpertScales {
                gate: mv(&s.gate)?,
                up: mv(&s.up)?,
                down: mv(&s.down)?,
            },
            input: self.input.to_device(device)?,
        })
    }
}

/// The combine weights of `routing` with down's per-expert scale folded in:
/// `weights[t, j] · scale[ids[t, j]]` in f32, `[T, k]` on the routing's
/// device (the routing itself is left as the router made it). `scale` is
/// f32 `[E]` on that device. An id ≥ E is an error on the CPU and is
/// reported on CUDA (its weight is then 0).
pub fn combine_weights_on(backend: Backend, routing: &Routing, scale: &Tensor) -> Result<Tensor> {
    const OP: &str = "combine_weights";
    crate::ops::check_dtype(OP, "scale", scale, DType::F32)?;
    crate::ops::check_dtype(OP, "routing.ids", &routing.ids, DType::U32)?;
    crate::ops::check_dtype(OP, "routing.weights", &routing.weights, DType::F32)?;
    ensure(
        scale.rank() == 1,
        OP,
        "scale",
        "shape [E]",
        format!("{:?}", scale.shape()),
    )?;
    ensure(
        routing.ids.rank() == 2 && routing.weights.shape() == routing.ids.shape(),
        OP,
        "routing",
        "ids and weights of one shape [T, k]",
        format!(
            "{:?} and {:?}",
            routing.ids.shape(),
            routing.weights.shape()
        ),
    )?;
    if backend == Backend::Cuda {
        return crate::cuda::ops::act::combine_weights(&routing.ids, &routing.weights, scale);
    }
    let n_e = scale.shape()[0];
    let s = scale.to_f32_vec()?;
    let ids = routing.ids.to_device(Device::Cpu)?;
    let ids = ids.as_slice::<u32>()?;
    let mut w = routing.weights.to_f32_vec()?;
    for (w, &e) in w.iter_mut().zip(ids) {
        let s = s
            .get(e as usize)
            .ok_or_else(|| crate::error::invalid(OP, "routing.ids", format!("< {n_e}"), e))?;
        *w *= s;
    }
    Tensor::from_f32(&w, routing.weights.shape(), DType::F32)
}

/// `logits + bias` per row (the router's bias): `logits [T, E]` float,
/// `bias` f32 `[E]` on its device. On CUDA the logits are updated in place
/// (and returned); on the CPU a new tensor of their dtype is returned.
pub fn add_router_bias_on(backend: Backend, logits: &Tensor, bias: &Tensor) -> Result<Tensor> {
    const OP: &str = "router_bias";
    crate::ops::check_float(OP, "logits", logits, 2)?;
    let e = logits.shape()[1];
    crate::ops::check_shape(OP, "bias", bias, &[e])?;
    crate::ops::check_dtype(OP, "bias", bias, DType::F32)?;
    if backend == Backend::Cuda {
        crate::cuda::ops::act::row_bias_add(logits, bias)?;
        return Ok(logits.clone());
    }
    let b = bias.to_f32_vec()?;
    let mut v = logits.to_f32_vec()?;
    for row in v.chunks_exact_mut(e.max(1)) {
        for (y, &b) in row.iter_mut().zip(&b) {
            *y += b;
        }
    }
    Tensor::from_f32(&v, logits.shape(), logits.dtype())
}

/// `out[t] + Σ_j weights[t, j] · bias[ids[t, j]]` (down's bias, weighted as
/// the experts' outputs are; slots in order): `out [T, H]` float, `bias`
/// f32 `[E, H]`. An id ≥ E is an error on the CPU and is reported (its slot
/// skipped) on CUDA, where `out` is updated in place (and returned).
pub fn add_down_bias_on(
    backend: Backend,
    out: &Tensor,
    routing: &Routing,
    bias: &Tensor,
) -> Result<Tensor> {
    const OP: &str = "down_bias";
    crate::ops::check_float(OP, "out", out, 2)?;
    let (t, h) = (out.shape()[0], out.shape()[1]);
    ensure(
        bias.rank() == 2 && bias.shape()[1] == h && bias.dtype() == DType::F32,
        OP,
        "bias",
        format!("f32 [E, {h}]"),
        format!("{} {:?}", bias.dtype(), bias.shape()),
    )?;
    if backend == Backend::Cuda {
        crate::cuda::ops::act::routed_bias_add(out, &routing.ids, &routing.weights, bias)?;
        return Ok(out.clone());
    }
    let n_e = bias.shape()[0];
    let ids = routing.ids.to_device(Device::Cpu)?;
    let ids = ids.as_slice::<u32>()?;
    let w = routing.weights.to_f32_vec()?;
    let k = routing.ids.shape().get(1).copied().unwrap_or(0);
    ensure(
        ids.len() == t * k && w.len() == t * k,
        OP,
        "routing",
        format!("ids and weights [{t}, k]"),
        format!(
            "{:?} and {:?}",
            routing.ids.shape(),
            routing.weights.shape()
        ),
    )?;
    if let Some(&e) = ids.iter().find(|&&e| e as usize >= n_e) {
        return Err(crate::error::invalid(
            OP,
            "routing.ids",
            format!("< {n_e}"),
            e,
        ));
    }
    let b = bias.to_f32_vec()?;
    let mut o = out.to_f32_vec()?;
    for tt in 0..t {
        for hh in 0..h {
            let mut s = 0f32;
            for j in 0..k {
                let e = ids[tt * k + j] as usize;
                s = w[tt * k + j].mul_add(b[e * h + hh], s);
            }
            o[tt * h + hh] += s;
        }
    }
    Tensor::from_f32(&o, out.shape(), out.dtype())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oai_clamps_gate_above_and_up_both_ways() {
        let a = GluAct::GPT_OSS;
        // g above the limit is clamped; u below −limit too.
        let want = |g: f64, u: f64| (u + 1.0) * g / (1.0 + (-(1.702f32 as f64) * g).exp());
        assert!((a.apply(9.0, -8.0) as f64 - want(7.0, -7.0)).abs() < 1e-5);
        assert!((a.apply_f64(9.0, -8.0) - want(7.0, -7.0)).abs() < 1e-12);
        // Negative g is not clamped from below.
        assert!((a.apply_f64(-9.0, 0.5) - want(-9.0, 0.5)).abs() < 1e-15);
        assert!((a.apply(-9.0, 0.5) as f64 - want(-9.0, 0.5)).abs() < 1e-6);
        assert_eq!(GluAct::SwiGlu.apply(0.0, 3.0), 0.0);
        assert!((GluAct::SwiGlu.apply_f64(1.0, 2.0) - 2.0 / (1.0 + (-1f64).exp())).abs() < 1e-15);
    }

    #[test]
    fn router_and_down_biases_on_the_cpu() {
        use crate::ops::route::Routing;
        let t = |v: &[f32], shape: &[usize]| Tensor::from_f32(v, shape, DType::F32).unwrap();
        for b in [Backend::CpuReference, Backend::CpuFast] {
            let logits = add_router_bias_on(
                b,
                &t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]),
                &t(&[0.5, -1.0], &[2]),
            )
            .unwrap();
            assert_eq!(logits.to_f32_vec().unwrap(), [1.5, 1.0, 3.5, 3.0]);
            // Token 0: 0.25 · bias[1] + 0.75 · bias[0]; token 1: 1.0 · bias[1].
            let bias = t(&[1.0, 2.0, 10.0, 20.0], &[2, 2]);
            let routing = Routing {
                ids: Tensor::from_slice(&[1u32, 0, 1, 1], &[2, 2]).unwrap(),
                weights: t(&[0.25, 0.75, 0.5, 0.5], &[2, 2]),
            };
            let out =
                add_down_bias_on(b, &t(&[0.0, 1.0, 2.0, 3.0], &[2, 2]), &routing, &bias).unwrap();
            assert_eq!(out.to_f32_vec().unwrap(), [3.25, 7.5, 12.0, 23.0]);
            let bad = Routing {
                ids: Tensor::from_slice(&[1u32, 2, 0, 0], &[2, 2]).unwrap(),
                ..routing
            };
            let err = add_down_bias_on(b, &t(&[0.0; 4], &[2, 2]), &bad, &bias)
                .unwrap_err()
                .to_string();
            assert!(err.contains("routing.ids") && err.contains("< 2"), "{err}");
        }
    }

    #[test]
    fn down_scales_fold_into_the_combine_weights_on_the_cpu() {
        use crate::ops::route::Routing;
        let t = |v: &[f32], shape: &[usize]| Tensor::from_f32(v, shape, DType::F32).unwrap();
        let routing = Routing {
            ids: Tensor::from_slice(&[1u32, 0, 2, 1], &[2, 2]).unwrap(),
            weights: t(&[0.25, 0.75, 0.5, 0.5], &[2, 2]),
        };
        let scale = t(&[2.0, 4.0, 0.5], &[3]);
        for b in [Backend::CpuReference, Backend::CpuFast] {
            let w = combine_weights_on(b, &routing, &scale).unwrap();
            assert_eq!(w.to_f32_vec().unwrap(), [1.0, 1.5, 0.25, 2.0]);
            // The routing itself keeps the router's weights.
            assert_eq!(
                routing.weights.to_f32_vec().unwrap(),
                [0.25, 0.75, 0.5, 0.5]
            );
            let err = combine_weights_on(b, &routing, &t(&[1.0, 1.0], &[2]))
                .unwrap_err()
                .to_string();
            assert!(err.contains("routing.ids") && err.contains("< 2"), "{err}");
        }
    }

    #[test]
    fn scales_are_checked_and_make_the_ffn_not_plain() {
        let mut f = ExpertFfn::default();
        f.scale.down = Some(Tensor::from_f32(&[1.0; 4], &[4], DType::F32).unwrap());
        // Down's scale leaves the gate/up epilogue plain.
        assert!(!f.is_plain() && f.glu_is_plain());
        assert!(f.check(4, 8, 6, Device::Cpu).is_ok());
        f.scale.gate = Some(Tensor::from_f32(&[1.0; 6], &[6], DType::F32).unwrap());
        assert!(!f.glu_is_plain());
        let err = f.check(4, 8, 6, Device::Cpu).unwrap_err().to_string();
        assert!(err.contains("scale.gate") && err.contains("[4]"), "{err}");
    }

    #[test]
    fn bad_constants_and_bias_shapes_are_refused() {
        let bad = ExpertFfn {
            act: GluAct::SwiGluOai {
                alpha: 1.0,
                limit: -1.0,
            },
            bias: ExpertBiases::default(),
            scale: ExpertScales::default(),
            input: ExpertInput::default(),
        };
        let err = bad.check(4, 8, 6, Device::Cpu).unwrap_err().to_string();
        assert!(err.contains("limit"), "{err}");
        let mut f = ExpertFfn::default();
        assert!(f.is_plain());
        f.bias.down = Some(Tensor::from_f32(&[0.0; 12], &[4, 3], DType::F32).unwrap());
        assert!(!f.is_plain());
        let err = f.check(4, 8, 6, Device::Cpu).unwrap_err().to_string();
        assert!(err.contains("bias.down") && err.contains("[4, 8]"), "{err}");
    }
}
