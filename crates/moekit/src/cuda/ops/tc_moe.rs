//! The MoE block with its expert GEMMs on tensor cores ([`super::tc_gemm`]),
//! for any token count; `crate::plan` chooses it.
//!
//! ```text
//! x [T,H] ─ router (tensor cores when exact enough, else CUDA cores) ─ route ─ sort
//!   └─ gate/up + SwiGLU: rows gathered through the sort (x is never permuted) ─ act [T·k, I]
//!      └─ down (expert-sorted rows) ─ ys [T·k, H] ─ unpermute: Σ_j w_j·y (slot order) ─ out
//!   └─ shared expert: gate/up + SwiGLU, down (tensor cores), gated combine
//! ```
//! Every reduction has a fixed order: deterministic and batch-invariant.

use super::tc_gemm::{self, TcRows};
use crate::device::Backend;
use crate::error::{invalid, Result};
use crate::format::{QuantWeights, WeightFormat};
use crate::ops::act::GateUp;
use crate::ops::gather_mm::qmm_on;
use crate::ops::parts::MoeBlockParts;
use crate::ops::permute::unpermute_on;
use crate::ops::route::{route_on, Routing};
use crate::ops::sort::expert_sort_on;
use crate::tensor::Tensor;
use crate::DType;

/// Whether every expert GEMM of `p` runs on tensor cores for `x`; the reason
/// when not.
pub fn supports(p: &MoeBlockParts, x: &Tensor) -> std::result::Result<(), String> {
    let crate::Device::Cuda(n) = x.device() else {
        return Err(format!("x is on {}, not a CUDA device", x.device()));
    };
    if x.rank() != 2 || x.shape()[1] != p.hidden() {
        return Err(format!(
            "x has shape {:?}, not [T, {}]",
            x.shape(),
            p.hidden()
        ));
    }
    let smem = crate::cuda::device(n)
        .map_err(|e| e.to_string())?
        .smem_optin();
    let gu = |g: &GateUp, what: &str| -> std::result::Result<(), String> {
        if let GateUp::Separate { gate, up } = g {
            if let Some(why) = tc_gemm::mixed(gate, up) {
                return Err(format!("{what}: {why}"));
            }
        }
        for (w, _) in g.sources() {
            tc_gemm::supports(x.dtype(), w, smem).map_err(|e| format!("{what}: {e}"))?;
        }
        Ok(())
    };
    gu(&p.gate_up, "gate/up")?;
    tc_gemm::supports(x.dtype(), &p.down, smem).map_err(|e| format!("down: {e}"))?;
    if let Some(s) = &p.shared {
        gu(&s.gate_up, "shared gate/up")?;
        tc_gemm::supports(x.dtype(), &s.down, smem).map_err(|e| format!("shared down: {e}"))?;
    }
    Ok(())
}

/// How the router matmul runs: on tensor cores where the weights reach the
/// MMA exactly (dense weights of the activation dtype) or nearly so (dense
/// f32 split into hi + lo halves, ≈16 bits), else on CUDA cores, so that
/// rounding never moves a top-k choice more than the general path would.
fn router_logits(w: &QuantWeights, x: &Tensor) -> Result<Tensor> {
    let t = x.shape()[0];
    let smem = crate::cuda::device(match x.device() {
        crate::Device::Cuda(n) => n,
        d => return Err(invalid("moe_tc", "x", "a CUDA tensor", d)),
    })?
    .smem_optin();
    // At every T measured the tensor cores won once single-expert tiles
    // filled the GPU and f32 weights came as split halves (H100, qwen3
    // graph ms, tensor-core path, router on CUDA cores vs tensor cores:
    // affine4 T = 1 0.088 vs 0.074, T = 8 0.215 vs 0.163, T = 32 0.339 vs
    // 0.292, T = 48 0.365 vs 0.315; bf16 T = 32 0.483 vs 0.430).
    if tc_gemm::supports(x.dtype(), w, smem).is_ok() {
        let out = Tensor::uninit_on(x.dtype(), &[t, w.rows()], x.device())?;
        if w.format() == WeightFormat::Dense(DType::F32) {
            tc_gemm::split_matmul_into(x, w, TcRows::Single, &out)?;
            return Ok(out);
        }
        if w.format() == WeightFormat::Dense(x.dtype()) {
            tc_gemm::matmul_into(x, w, TcRows::Single, &out)?;
            return Ok(out);
        }
    }
    qmm_on(Backend::Cuda, x, w)
}

/// Runs the block on `x [T, H]` (f16/bf16 on CUDA); call where [`supports`] holds.
pub fn forward(p: &MoeBlockParts, x: &Tensor) -> Result<(Routing, Tensor)> {
    const OP: &str = "moe_tc";
    if let Err(why) = supports(p, x) {
        return Err(invalid(
            OP,
            "block",
            "a block and input the tensor-core path takes",
            why,
        ));
    }
    let (t, h) = (x.shape()[0], x.shape()[1]);
    let (e, k, i) = (p.router.n_experts, p.router.top_k, p.gate_up.intermediate());
    let logits = router_logits(&p.router_weight, x)?;
    let routing = route_on(Backend::Cuda, &logits, &p.router)?;
    let sort = expert_sort_on(Backend::Cuda, &routing.ids, e)?;
    let act = Tensor::uninit_on(x.dtype(), &[t * k, i], x.device())?;
    let gathered = TcRows::Gathered {
        offsets: &sort.offsets,
        sorted: &sort.sorted,
        top_k: k,
    };
    tc_gemm::swiglu_into(x, &p.gate_up, gathered, &act)?;
    let ys = Tensor::uninit_on(x.dtype(), &[t * k, h], x.device())?;
    tc_gemm::matmul_into(&act, &p.down, TcRows::Sorted(&sort.offsets), &ys)?;
    let out = unpermute_on(Backend::Cuda, &ys, &sort, &routing.weights)?;
    if let Some(s) = &p.shared {
        let sa = Tensor::uninit_on(x.dtype(), &[t, s.gate_up.intermediate()], x.device())?;
        tc_gemm::swiglu_into(x, &s.gate_up, TcRows::Single, &sa)?;
        let sy = Tensor::uninit_on(x.dtype(), &[t, h], x.device())?;
        tc_gemm::matmul_into(&sa, &s.down, TcRows::Single, &sy)?;
        let gates = s
            .gate
            .as_ref()
            .map(|g| qmm_on(Backend::Cuda, x, g))
            .transpose()?;
        super::moe::shared_combine(&out, &sy, gates.as_ref())?;
    }
    Ok((routing, out))
}
