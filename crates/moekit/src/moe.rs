//! The MoE block: route → sort → permute → grouped gate/up + SwiGLU →
//! grouped down → weighted combine, plus an optional shared expert. The
//! routed experts' activation and any router / projection biases (gpt-oss)
//! come from [`MoeBlockParts::ffn`] ([`crate::ops::ffn`]), and so do the
//! router's and the experts' inputs where they are not `x` itself
//! (Gemma-4's norms, Llama-4's weight before the FFN: [`crate::ops::input`]).
//!
//! ```text
//! x [T,H] ─ router qmm ─ logits [T,E] ─ route ─ ids,weights [T,k]
//!   │                                              │
//!   └─ permute (expert order) ─ gather_swiglu ─ gather_mm(down) ─ unpermute(Σ w·y) ─┐
//!   └─ shared expert: swiglu(x) · down  (× sigmoid(x·g) if gated) ──────────────────+─ out [T,H]
//! ```

use crate::device::Backend;
use crate::error::{ensure, Result};
use crate::format::QuantWeights;
use crate::ops::act::{gather_glu_on, gather_swiglu_on, GateUp};
use crate::ops::ffn::{add_down_bias_on, add_router_bias_on, combine_weights_on, ExpertFfn};
use crate::ops::gather_mm::{gather_mm_on, qmm_on, RowExperts};
pub use crate::ops::parts::{MoeBlockParts, SharedExpert};
use crate::ops::permute::{permute_on, unpermute_on};
use crate::ops::route::{route_on, Routing};
use crate::ops::sort::expert_sort_on;
use crate::ops::{check_float, check_shape};
use crate::tensor::Tensor;

/// A validated MoE block.
#[derive(Debug, Clone)]
pub struct MoeBlock {
    p: MoeBlockParts,
    /// The router's f32 weights split for the tensor-core path, made on its
    /// first call per activation dtype.
    router_halves: crate::cuda::ops::tc_moe::RouterHalves,
}

pub use crate::plan::MoePath;

/// Intermediate results of a forward pass (for tests and benchmarks).
#[derive(Debug, Clone)]
pub struct MoeTrace {
    /// The routing.
    pub routing: Routing,
    /// Output `[T, H]`.
    pub out: Tensor,
}

impl MoeBlock {
    /// Checks that all parts agree on E, H and I.
    pub fn new(p: MoeBlockParts) -> Result<MoeBlock> {
        const OP: &str = "moe_block";
        let (e, h, i) = (
            p.router.n_experts,
            p.gate_up.hidden(),
            p.gate_up.intermediate(),
        );
        let dims = |w: &QuantWeights| (w.n_experts(), w.rows(), w.cols());
        ensure(
            dims(&p.router_weight) == (1, e, h),
            OP,
            "router_weight",
            format!("[1, {e}, {h}]"),
            format!("{:?}", dims(&p.router_weight)),
        )?;
        ensure(
            p.gate_up.n_experts() == e,
            OP,
            "gate_up",
            format!("{e} experts"),
            p.gate_up.n_experts(),
        )?;
        ensure(
            dims(&p.down) == (e, h, i),
            OP,
            "down",
            format!("[{e}, {h}, {i}]"),
            format!("{:?}", dims(&p.down)),
        )?;
        ensure(
            (1..=32).contains(&p.router.top_k) && p.router.top_k <= e,
            OP,
            "router.top_k",
            format!("1..={}", e.min(32)),
            p.router.top_k,
        )?;
        p.ffn.check(e, h, i, p.down.device())?;
        p.ffn.input.check(h, p.router.top_k, p.down.device())?;
        if let Some(s) = &p.shared {
            let si = s.gate_up.intermediate();
            ensure(
                s.gate_up.n_experts() == 1 && s.gate_up.hidden() == h,
                OP,
                "shared.gate_up",
                format!("1 expert of [_, {h}]"),
                format!(
                    "{} experts of [_, {}]",
                    s.gate_up.n_experts(),
                    s.gate_up.hidden()
                ),
            )?;
            ensure(
                dims(&s.down) == (1, h, si),
                OP,
                "shared.down",
                format!("[1, {h}, {si}]"),
                format!("{:?}", dims(&s.down)),
            )?;
            if let Some(g) = &s.gate {
                ensure(
                    dims(g) == (1, 1, h),
                    OP,
                    "shared.gate",
                    format!("[1, 1, {h}]"),
                    format!("{:?}", dims(g)),
                )?;
            }
        }
        Ok(MoeBlock {
            p,
            router_halves: Default::default(),
        })
    }

    /// The parts.
    pub fn parts(&self) -> &MoeBlockParts {
        &self.p
    }

    /// Hidden size H.
    pub fn hidden(&self) -> usize {
        self.p.gate_up.hidden()
    }

    /// Runs the block on `x [T, H]` with the backend of `x`'s device.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.forward_on(Backend::for_device(x.device())?, x)?.out)
    }

    /// Runs the block into a preallocated `out [T, H]` of `x`'s dtype on
    /// `x`'s device. The fused CUDA paths write `out` in place (no copy: the
    /// form to capture in a CUDA graph, and to use with memory another
    /// library owns); the others compute a new tensor and copy it in.
    pub fn forward_into(&self, x: &Tensor, out: &mut Tensor) -> Result<()> {
        check_shape("forward", "out", out, x.shape())?;
        ensure(
            out.dtype() == x.dtype(),
            "forward",
            "out",
            format!("dtype {}", x.dtype()),
            out.dtype(),
        )?;
        ensure(
            out.device() == x.device(),
            "forward",
            "out",
            format!("a tensor on {}", x.device()),
            out.device(),
        )?;
        let backend = Backend::for_device(x.device())?;
        self.run(backend, MoePath::Auto, x, Some(out)).map(|_| ())
    }

    /// Runs the block with an explicit backend and returns the routing too.
    pub fn forward_on(&self, backend: Backend, x: &Tensor) -> Result<MoeTrace> {
        self.forward_with(backend, MoePath::Auto, x)
    }

    /// Runs the block with an explicit backend and path. A forced path that
    /// does not take the block and input is an error saying why;
    /// [`plan`](crate::plan::plan) tells which path [`MoePath::Auto`] picks.
    ///
    /// ```
    /// use moekit::{open, Backend, DType, MoePath, Tensor};
    /// # fn main() -> moekit::Result<()> {
    /// # let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/gguf/qwen3moe_f32.gguf");
    /// let block = open(&path)?.moe_block(0, &|_, _| {})?;
    /// let x = Tensor::from_f32(&vec![0.5; 2 * block.hidden()], &[2, block.hidden()], DType::F32)?;
    /// // The CPU oracle, with the routing: expert ids and weights, [T, k].
    /// let trace = block.forward_with(Backend::CpuReference, MoePath::General, &x)?;
    /// assert_eq!(trace.routing.ids.shape()[0], 2);
    /// // The tensor-core path is CUDA only: refused, with the reason.
    /// assert!(block.forward_with(Backend::CpuFast, MoePath::TensorCore, &x).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn forward_with(&self, backend: Backend, path: MoePath, x: &Tensor) -> Result<MoeTrace> {
        self.run(backend, path, x, None)
    }

    /// The forward pass, into `dst` if given (checked by the caller).
    fn run(
        &self,
        backend: Backend,
        path: MoePath,
        x: &Tensor,
        dst: Option<&mut Tensor>,
    ) -> Result<MoeTrace> {
        const OP: &str = "forward";
        check_float(OP, "x", x, 2)?;
        match crate::plan::plan(&self.p, backend, x, path)?.path {
            MoePath::Decode => {
                let (routing, out) = crate::cuda::ops::decode::forward(&self.p, x, dst.as_deref())?;
                return Ok(MoeTrace { routing, out });
            }
            MoePath::TensorCore => {
                let (routing, out) = crate::cuda::ops::tc_moe::forward(
                    &self.p,
                    x,
                    dst.as_deref(),
                    &self.router_halves,
                )?;
                return Ok(MoeTrace { routing, out });
            }
            _ => {}
        }
        // CUDA ops stay on the caller's thread: the stream a caller put in
        // place (`cuda::with_stream`) is thread-local.
        if backend == Backend::Cuda {
            return self.run_general(backend, x, dst);
        }
        crate::cpu::in_pool(|| self.run_general(backend, x, dst))
    }

    /// The general path of [`run`](Self::run): router, routing, the routed
    /// and shared experts by ops of `backend`.
    fn run_general(
        &self,
        backend: Backend,
        x: &Tensor,
        dst: Option<&mut Tensor>,
    ) -> Result<MoeTrace> {
        const OP: &str = "forward";
        let h = self.hidden();
        ensure(
            x.shape()[1] == h,
            OP,
            "x",
            format!("[T, {h}]"),
            format!("{:?}", x.shape()),
        )?;
        let p = &self.p;
        // The router's logits with f32 activations on the CPU: which experts
        // a token takes is a discrete choice that quantized activations
        // could flip near a tie; the router is a small part of the work.
        let input = &p.ffn.input;
        let (xr, xe) = input.inputs_on(backend, x)?;
        let logits = crate::cpu::with_act_mode(crate::cpu::ActMode::F32, || {
            qmm_on(backend, &xr, &p.router_weight)
        })?;
        let logits = match &p.ffn.bias.router {
            Some(b) => add_router_bias_on(backend, &logits, b)?,
            None => logits,
        };
        let routing = route_on(backend, &logits, &p.router)?;
        let (xw, rw) = input.experts_on(backend, &xe, &routing)?;
        let mut out = general_experts(backend, &p.gate_up, &p.down, &p.ffn, &xw, &rw)?;
        if let (Some(s), Backend::Cuda) = (&p.shared, backend) {
            let sa = gather_swiglu_on(backend, x, &s.gate_up, RowExperts::Single)?;
            let sy = qmm_on(backend, &sa, &s.down)?;
            let gates = s.gate.as_ref().map(|g| qmm_on(backend, x, g)).transpose()?;
            crate::cuda::ops::moe::shared_combine(&out, &sy, gates.as_ref())?;
        } else if let Some(s) = &p.shared {
            let sa = gather_swiglu_on(backend, x, &s.gate_up, RowExperts::Single)?;
            let sy = qmm_on(backend, &sa, &s.down)?.to_f32_vec()?;
            let gates = match &s.gate {
                Some(g) => Some(qmm_on(backend, x, g)?.to_f32_vec()?),
                None => None,
            };
            let mut o = out.to_f32_vec()?;
            for (t, row) in o.chunks_exact_mut(h).enumerate() {
                let g = gates.as_ref().map_or(1.0, |g| 1.0 / (1.0 + (-g[t]).exp()));
                for (v, &s) in row.iter_mut().zip(&sy[t * h..(t + 1) * h]) {
                    *v += g * s;
                }
            }
            out = Tensor::from_f32(&o, x.shape(), x.dtype())?;
        }
        if let Some(d) = dst {
            d.copy_from(&out)?;
        }
        Ok(MoeTrace { routing, out })
    }

    /// A copy of the block with every weight on `device`.
    pub fn to_device(&self, device: crate::Device) -> Result<MoeBlock> {
        let p = &self.p;
        let gu = |g: &GateUp| -> Result<GateUp> {
            match g {
                GateUp::Separate { gate, up } => {
                    GateUp::separate(gate.to_device(device)?, up.to_device(device)?)
                }
                GateUp::Fused(w) => GateUp::fused(w.to_device(device)?),
            }
        };
        let shared = match &p.shared {
            Some(s) => Some(SharedExpert {
                gate_up: gu(&s.gate_up)?,
                down: s.down.to_device(device)?,
                gate: s.gate.as_ref().map(|g| g.to_device(device)).transpose()?,
            }),
            None => None,
        };
        MoeBlock::new(MoeBlockParts {
            router: p.router.clone(),
            router_weight: p.router_weight.to_device(device)?,
            gate_up: gu(&p.gate_up)?,
            down: p.down.to_device(device)?,
            shared,
            ffn: p.ffn.to_device(device)?,
        })
    }

    /// Where the weights live.
    pub fn device(&self) -> crate::Device {
        self.p.down.device()
    }

    /// Bytes of weights a forward pass reads for `routing`: the router plus
    /// every distinct selected expert (and the shared expert).
    pub fn weight_bytes_touched(&self, routing: &Routing) -> Result<usize> {
        let p = &self.p;
        let mut used = vec![false; p.router.n_experts];
        let ids = routing.ids.to_device(crate::Device::Cpu)?;
        for &e in ids.as_slice::<u32>()? {
            if let Some(u) = used.get_mut(e as usize) {
                *u = true;
            }
        }
        let per_expert = p.gate_up.bytes_per_expert() + p.down.bytes_per_expert();
        let shared = p.shared.as_ref().map_or(0, |s| {
            s.gate_up.bytes_per_expert()
                + s.down.bytes_per_expert()
                + s.gate.as_ref().map_or(0, |g| g.bytes_per_expert())
        });
        Ok(p.router_weight.bytes_per_expert()
            + used.iter().filter(|&&u| u).count() * per_expert
            + shared)
    }

    /// FLOPs of a forward pass over `t` tokens (2 per multiply-add).
    pub fn flops(&self, t: usize) -> usize {
        let p = &self.p;
        let (e, h, i, k) = (
            p.router.n_experts,
            self.hidden(),
            p.gate_up.intermediate(),
            p.router.top_k,
        );
        let shared = p
            .shared
            .as_ref()
            .map_or(0, |s| 3 * h * s.gate_up.intermediate());
        2 * t * (e * h + k * 3 * h * i + shared)
    }
}

/// The routed experts on the general path: sort → permute → gather gate/up
/// and SwiGLU → gather down → weighted unpermute (weights × down's
/// per-expert scale where the block has one).
fn general_experts(
    backend: Backend,
    gate_up: &GateUp,
    down: &QuantWeights,
    ffn: &ExpertFfn,
    x: &Tensor,
    routing: &Routing,
) -> Result<Tensor> {
    let sort = expert_sort_on(backend, &routing.ids, gate_up.n_experts())?;
    let xs = permute_on(backend, x, &sort)?;
    let rows = RowExperts::Sorted(&sort.offsets);
    let act = gather_glu_on(backend, &xs, gate_up, rows, ffn)?;
    let ys = gather_mm_on(backend, &act, down, rows)?;
    // Down's per-expert scale rides on the combine weights (linear in y);
    // its bias is added with the router's weights (the scale precedes it).
    let out = match &ffn.scale.down {
        Some(s) => {
            let w = combine_weights_on(backend, routing, s)?;
            unpermute_on(backend, &ys, &sort, &w)?
        }
        None => unpermute_on(backend, &ys, &sort, &routing.weights)?,
    };
    match &ffn.bias.down {
        Some(b) => add_down_bias_on(backend, &out, routing, b),
        None => Ok(out),
    }
}

/// The routed experts alone, for a routing computed elsewhere — vLLM's
/// `fused_experts(x, w13, w2, topk_weights, topk_ids)`: token `t`'s output
/// is `Σ_j weights[t,j] · down_e(silu(gate_e(x_t)) · up_e(x_t))` with
/// `e = ids[t,j]`, summed in slot order `j` (deterministic). No router and
/// no shared expert.
///
/// `x [T, H]` float; `gate_up` `[E, I, H]` (separate or fused), `down`
/// `[E, H, I]`, any formats, on `x`'s device; `routing.ids u32 [T, k]`
/// (every id `< E`) and `routing.weights f32 [T, k]` on that device too.
/// On CUDA with 16-bit activations the tensor-core path runs where it takes
/// the formats, else the general path. Writes `out` (`[T, H]` of `x`'s
/// dtype on its device) in place on the tensor-core path and returns it, or
/// returns a new tensor.
pub fn routed_experts(
    gate_up: &GateUp,
    down: &QuantWeights,
    x: &Tensor,
    routing: &Routing,
    out: Option<&mut Tensor>,
) -> Result<Tensor> {
    const OP: &str = "routed_experts";
    check_float(OP, "x", x, 2)?;
    let (e, h, i) = (
        gate_up.n_experts(),
        gate_up.hidden(),
        gate_up.intermediate(),
    );
    let t = x.shape()[0];
    ensure(
        x.shape()[1] == h,
        OP,
        "x",
        format!("[T, {h}] (gate_up's hidden size)"),
        format!("{:?}", x.shape()),
    )?;
    ensure(
        (down.n_experts(), down.rows(), down.cols()) == (e, h, i),
        OP,
        "down",
        format!("[{e}, {h}, {i}]"),
        format!("[{}, {}, {}]", down.n_experts(), down.rows(), down.cols()),
    )?;
    crate::ops::check_dtype(OP, "routing.ids", &routing.ids, crate::DType::U32)?;
    crate::ops::check_dtype(OP, "routing.weights", &routing.weights, crate::DType::F32)?;
    let k = routing.ids.shape().get(1).copied().unwrap_or(0);
    ensure(
        routing.ids.rank() == 2 && routing.ids.shape()[0] == t && (1..=32).contains(&k),
        OP,
        "routing.ids",
        format!("[{t}, k] with 1 ≤ k ≤ 32"),
        format!("{:?}", routing.ids.shape()),
    )?;
    check_shape(OP, "routing.weights", &routing.weights, &[t, k])?;
    for (name, d) in [
        ("gate_up", gate_up.sources()[0].0.device()),
        ("gate_up", gate_up.sources()[1].0.device()),
        ("down", down.device()),
        ("routing.ids", routing.ids.device()),
        ("routing.weights", routing.weights.device()),
    ] {
        ensure(
            d == x.device(),
            OP,
            name,
            format!("on {} (x's device)", x.device()),
            d,
        )?;
    }
    if let Some(o) = &out {
        check_shape(OP, "out", o, x.shape())?;
        ensure(
            o.dtype() == x.dtype() && o.device() == x.device(),
            OP,
            "out",
            format!("{} on {}", x.dtype(), x.device()),
            format!("{} on {}", o.dtype(), o.device()),
        )?;
    }
    let backend = Backend::for_device(x.device())?;
    if backend == Backend::Cuda
        && crate::cuda::ops::tc_moe::supports_experts(gate_up, down, x).is_ok()
    {
        return crate::cuda::ops::tc_moe::experts_into(gate_up, down, x, routing, out.as_deref());
    }
    let y = general_experts(backend, gate_up, down, &ExpertFfn::default(), x, routing)?;
    match out {
        Some(o) => {
            o.copy_from(&y)?;
            Ok(o.clone())
        }
        None => Ok(y),
    }
}
