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

use super::tc_gemm::{self, Kernel, TcRows};
use super::tc_ra;
use super::tc_tma;
use super::GluParams;
use crate::device::Backend;
use crate::error::{invalid, Result};
use crate::format::{QuantWeights, WeightFormat};
use crate::ops::act::GateUp;
use crate::ops::ffn::ExpertFfn;
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
    supports_experts(&p.gate_up, &p.down, x)?;
    if let Some(s) = &p.shared {
        supports_experts(&s.gate_up, &s.down, x).map_err(|e| format!("shared {e}"))?;
    }
    Ok(())
}

/// Whether experts `gate_up` / `down` run on tensor cores for `x`; the
/// reason when not.
pub fn supports_experts(
    gate_up: &GateUp,
    down: &QuantWeights,
    x: &Tensor,
) -> std::result::Result<(), String> {
    let crate::Device::Cuda(n) = x.device() else {
        return Err(format!("x is on {}, not a CUDA device", x.device()));
    };
    if x.rank() != 2 || x.shape()[1] != gate_up.hidden() {
        return Err(format!(
            "x has shape {:?}, not [T, {}]",
            x.shape(),
            gate_up.hidden()
        ));
    }
    let smem = crate::cuda::device(n)
        .map_err(|e| e.to_string())?
        .smem_optin();
    if let GateUp::Separate { gate, up } = gate_up {
        if let Some(why) = tc_gemm::mixed(gate, up) {
            return Err(format!("gate/up: {why}"));
        }
    }
    for (w, _) in gate_up.sources() {
        tc_gemm::supports(x.dtype(), w, smem).map_err(|e| format!("gate/up: {e}"))?;
    }
    tc_gemm::supports(x.dtype(), down, smem).map_err(|e| format!("down: {e}"))
}

/// The kernels of the routed experts' gate/up and down GEMMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ExpertKernels {
    pub(crate) gate_up: Kernel,
    pub(crate) down: Kernel,
}

/// The one place the routed experts' kernels are chosen, for `m` = T·k
/// rows: the TMA kernel ([`tc_tma`], sm_90a) for each GEMM it measured
/// faster at ([`tc_tma::runs`]: dense weights of the activation type where
/// the staged kernel's tile would be at least [`tc_tma::MIN_TILE`] rows,
/// and, for a general activation, experts average [`tc_tma::GLU_ROWS`]
/// rows); else the register-operand kernel ([`tc_ra`],
/// sm_90a) where it takes the weights and the tile is one it measured
/// faster at ([`tc_ra::runs_tile`]), else the staged one. The down GEMM runs on
/// `tc_ra` only after a gate/up GEMM on it (its input is then written in
/// the permuted order it reads). `MOEKIT_TC_RA=0` / `MOEKIT_TC_TMA=0` keep
/// a kernel out everywhere, `all` takes it at every tile (A/B
/// measurements of the table).
pub(crate) fn expert_kernels(
    gate_up: &GateUp,
    down: &QuantWeights,
    x: &Tensor,
    m: usize,
    general_glu: bool,
) -> ExpertKernels {
    let ra = ra_kernels(gate_up, down, x, m);
    let (gu, dn) = tma_takes(gate_up, down, x, m, general_glu);
    // tc_ra's gate/up writes its output permuted only for a down GEMM on
    // tc_ra, which needs it so: neither beside a TMA GEMM.
    let gate_up = match ra.gate_up {
        _ if gu => Kernel::Tma,
        Kernel::RegA { .. } if dn => Kernel::RegA { perm_out: None },
        k => k,
    };
    let down = match ra.down {
        _ if dn => Kernel::Tma,
        Kernel::RegA { .. } if gu => Kernel::Staged,
        k => k,
    };
    ExpertKernels { gate_up, down }
}

/// [`expert_kernels`]' choice between `tc_ra` and the staged kernel.
fn ra_kernels(gate_up: &GateUp, down: &QuantWeights, x: &Tensor, m: usize) -> ExpertKernels {
    let staged = ExpertKernels {
        gate_up: Kernel::Staged,
        down: Kernel::Staged,
    };
    let Some(arch) = ra_arch(x) else {
        return staged;
    };
    // Where the staged kernel takes 256-row tiles (over 256 rows an
    // expert), its larger tile beat tc_ra's 128-row one (H100 graph ms,
    // mixtral-8x7b T = 4096 affine4 7.38 vs 7.89, q4_k 7.31 vs 7.60); tc_ra's
    // own 256-row tiles beat it in turn (H200, `bench/results/h200/
    // 2026-11-29_t256`: mixtral affine4 7.36 → 5.92 ms, q4_k 7.22 → 6.47,
    // deepseek-v2-lite affine4 1.82 → 1.59), so tc_ra takes those tiles for
    // the formats it runs at 256 rows ([`tc_ra::max_tile`]) and leaves the
    // others to the staged kernel (`MOEKIT_TC_RA=all`: every format).
    let bm = tc_gemm::tile_rows(m, gate_up.n_experts(), 1);
    let bm = if bm > 128 { 256 } else { bm };
    let takes =
        |w: &QuantWeights| tc_ra::supports(x.dtype(), w, arch).is_ok() && tc_ra::runs_tile(w, bm);
    if !tc_gemm::one_instance(gate_up) || !gate_up.sources().iter().all(|(w, _)| takes(w)) {
        return staged;
    }
    let dn = takes(down) && gate_up.intermediate().is_multiple_of(tc_ra::SPAN);
    ExpertKernels {
        gate_up: Kernel::RegA {
            perm_out: dn.then(|| tc_ra::span_order(down.format())),
        },
        down: if dn {
            Kernel::RegA { perm_out: None }
        } else {
            Kernel::Staged
        },
    }
}

/// [`expert_kernels`]' TMA choice: whether `tc_tma` takes the gate/up
/// (`general_glu`: with a general activation or biases) and the down GEMM
/// at this size ([`tc_tma::runs`]).
fn tma_takes(
    gate_up: &GateUp,
    down: &QuantWeights,
    x: &Tensor,
    m: usize,
    general_glu: bool,
) -> (bool, bool) {
    let Some(arch) = arch_if(tc_tma::use_mode() != tc_tma::Use::Never, x) else {
        return (false, false);
    };
    let e = gate_up.n_experts();
    let takes = |w: &QuantWeights, p: usize, cols: usize| {
        let bn = tc_tma::WEIGHT_ROWS / p;
        let bm = tc_gemm::tile_rows(m, e, cols.div_ceil(bn));
        tc_tma::supports(x.dtype(), w, arch).is_ok()
            && tc_tma::runs(x.dtype(), w, p == 2 && general_glu, bm, m / e.max(1))
    };
    let gu = tc_gemm::one_instance(gate_up)
        && gate_up
            .sources()
            .iter()
            .all(|(w, _)| takes(w, 2, gate_up.intermediate()));
    (gu, takes(down, 1, down.rows()))
}

/// Whether the tensor-core path runs experts of `format` on `tc_ra` for
/// `x` at its smallest tiles (the planner's crossover depends on it).
pub(crate) fn ra_format(format: WeightFormat, x: &Tensor) -> bool {
    ra_arch(x).is_some_and(|a| tc_ra::supports_arch(a).is_ok())
        && tc_ra::max_tile(format) >= tc_ra::TILE_ROWS[0]
}

/// The architecture of `x`'s CUDA device while a schedule is enabled
/// (`on`: its `MOEKIT_TC_*` knob not `0`); None elsewhere.
fn arch_if(on: bool, x: &Tensor) -> Option<crate::cuda::Arch> {
    match x.device() {
        crate::Device::Cuda(n) if on => crate::cuda::device(n).map(|d| d.arch()).ok(),
        _ => None,
    }
}

/// [`arch_if`] for `tc_ra` (`MOEKIT_TC_RA`).
fn ra_arch(x: &Tensor) -> Option<crate::cuda::Arch> {
    arch_if(tc_ra::use_mode() != tc_ra::Use::Never, x)
}

/// The router's dense f32 weights split into hi/lo halves of an activation
/// dtype, made once per block and dtype (split on every call they cost a
/// kernel: 3 µs at qwen3-30b-a3b T = 64 and 512, H200 ncu). Filled only
/// outside a CUDA graph capture (memory allocated during a capture belongs
/// to the graph); a call under capture splits for itself, with the same
/// bits.
#[derive(Debug, Clone, Default)]
pub struct RouterHalves {
    bf16: std::sync::OnceLock<QuantWeights>,
    f16: std::sync::OnceLock<QuantWeights>,
}

impl RouterHalves {
    /// The halves of `w` for `dtype`, made now if need be; None under a
    /// stream capture (or for a dtype without halves).
    fn get(
        &self,
        w: &QuantWeights,
        dtype: DType,
        dev: &crate::cuda::CudaDevice,
    ) -> Result<Option<&QuantWeights>> {
        let cell = match dtype {
            DType::Bf16 => &self.bf16,
            DType::F16 => &self.f16,
            _ => return Ok(None),
        };
        if let Some(h) = cell.get() {
            return Ok(Some(h));
        }
        let status = dev
            .stream()
            .capture_status()
            .map_err(crate::error::cuda_err("capture_status"))?;
        if status != cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Ok(None);
        }
        let h = tc_gemm::split_halves(w, dtype)?;
        Ok(Some(cell.get_or_init(|| h)))
    }
}

/// How the router matmul runs: on tensor cores where the weights reach the
/// MMA exactly (dense weights of the activation dtype) or nearly so (dense
/// f32 split into hi + lo halves, ≈16 bits), else on CUDA cores, so that
/// rounding never moves a top-k choice more than the general path would.
fn router_logits(w: &QuantWeights, x: &Tensor, halves: &RouterHalves) -> Result<Tensor> {
    let t = x.shape()[0];
    let dev = crate::cuda::device(match x.device() {
        crate::Device::Cuda(n) => n,
        d => return Err(invalid("moe_tc", "x", "a CUDA tensor", d)),
    })?;
    let smem = dev.smem_optin();
    // At every T measured the tensor cores won once single-expert tiles
    // filled the GPU and f32 weights came as split halves (H100, qwen3
    // graph ms, tensor-core path, router on CUDA cores vs tensor cores:
    // affine4 T = 1 0.088 vs 0.074, T = 8 0.215 vs 0.163, T = 32 0.339 vs
    // 0.292, T = 48 0.365 vs 0.315; bf16 T = 32 0.483 vs 0.430).
    //
    // K is split into parts summed in a fixed order (tc_gemm::k_parts, from
    // K alone: batch-invariant), so the router's few tiles spread over more
    // blocks than T/16 × 2 (H200, qwen3-30b-a3b T = 64: one tile walked 32
    // steps on 8 blocks, 13 µs).
    let dense = [DType::F32, x.dtype()].map(WeightFormat::Dense);
    if tc_gemm::supports(x.dtype(), w, smem).is_ok() && dense.contains(&w.format()) {
        let out = Tensor::uninit_on(x.dtype(), &[t, w.rows()], x.device())?;
        let parts = super::tc_parts::k_parts(w.cols());
        let rows = if parts > 1 {
            TcRows::Parts(parts)
        } else {
            TcRows::Single
        };
        let dst = if parts > 1 {
            Tensor::uninit_on(DType::F32, &[parts * t, w.rows()], x.device())?
        } else {
            out.clone()
        };
        let kept = if w.format() == WeightFormat::Dense(DType::F32) && w.n_experts() == 1 {
            halves.get(w, x.dtype(), &dev)?
        } else {
            None
        };
        if let Some(hl) = kept {
            tc_gemm::halves_matmul_into(x, hl, rows, &dst)?;
        } else if w.format() == WeightFormat::Dense(DType::F32) {
            tc_gemm::split_matmul_into(x, w, rows, &dst)?;
        } else {
            tc_gemm::matmul_into(x, w, rows, &dst)?;
        }
        if parts > 1 {
            super::tc_parts::sum_parts_into(&dst, &out)?;
        }
        return Ok(out);
    }
    qmm_on(Backend::Cuda, x, w)
}

/// Runs the block on `x [T, H]` (f16/bf16 on CUDA) into `out` if given (as
/// [`decode::forward`](super::decode::forward)); call where [`supports`] holds.
/// The router's split halves are kept in `halves` (the MoE block's
/// [`RouterHalves`]): the same bits as splitting them each call.
pub fn forward(
    p: &MoeBlockParts,
    x: &Tensor,
    out: Option<&Tensor>,
    halves: &RouterHalves,
) -> Result<(Routing, Tensor)> {
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
    let input = &p.ffn.input;
    let (xr, xe) = input.inputs_on(Backend::Cuda, x)?;
    let logits = router_logits(&p.router_weight, &xr, halves)?;
    if let Some(b) = &p.ffn.bias.router {
        super::act::row_bias_add(&logits, b)?;
    }
    let routing = route_on(Backend::Cuda, &logits, &p.router)?;
    let (xw, rw) = input.experts_on(Backend::Cuda, &xe, &routing)?;
    let out = run_experts(&p.gate_up, &p.down, &p.ffn, &xw, &rw, out)?;
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

/// The routed experts on tensor cores: `Σ_j w[t,j] · down(swiglu(gate_up(x_t)))`
/// over the experts `routing` chose, into `out` if given; call where
/// [`supports_experts`] holds.
pub fn experts_into(
    gate_up: &GateUp,
    down: &QuantWeights,
    x: &Tensor,
    routing: &Routing,
    out: Option<&Tensor>,
) -> Result<Tensor> {
    run_experts(gate_up, down, &ExpertFfn::default(), x, routing, out)
}

/// [`experts_into`] with `ffn`'s activation, gate/up/down biases and
/// per-expert scales (its router bias is the caller's).
fn run_experts(
    gate_up: &GateUp,
    down: &QuantWeights,
    ffn: &ExpertFfn,
    x: &Tensor,
    routing: &Routing,
    out: Option<&Tensor>,
) -> Result<Tensor> {
    const OP: &str = "moe_tc";
    if let Err(why) = supports_experts(gate_up, down, x) {
        return Err(invalid(
            OP,
            "experts",
            "experts and input the tensor-core path takes",
            why,
        ));
    }
    let (t, h) = (x.shape()[0], x.shape()[1]);
    let (e, i) = (gate_up.n_experts(), gate_up.intermediate());
    let k = routing.ids.shape().get(1).copied().unwrap_or(0);
    let sort = expert_sort_on(Backend::Cuda, &routing.ids, e)?;
    let act = Tensor::uninit_on(x.dtype(), &[t * k, i], x.device())?;
    let gathered = TcRows::Gathered {
        offsets: &sort.offsets,
        sorted: &sort.sorted,
        top_k: k,
    };
    let ys = Tensor::uninit_on(x.dtype(), &[t * k, h], x.device())?;
    let kernels = expert_kernels(gate_up, down, x, t * k, GluParams::of(ffn)?.general());
    let sorted_rows = TcRows::Sorted(&sort.offsets);
    match kernels.gate_up {
        Kernel::RegA { perm_out } => {
            // x's columns in the MMA's k order once; with a down GEMM on
            // tc_ra the SwiGLU output is written in that order for it.
            let xp = Tensor::uninit_on(x.dtype(), &[t, h], x.device())?;
            let [(g, _), _] = gate_up.sources();
            tc_ra::permute_into(x, tc_ra::span_order(g.format()), &xp)?;
            tc_ra::glu_into(&xp, gate_up, gathered, ffn, &act, perm_out)?;
        }
        Kernel::Staged => tc_gemm::glu_into(x, gate_up, gathered, ffn, &act)?,
        Kernel::Tma => tc_tma::glu_into(x, gate_up, gathered, ffn, &act)?,
    }
    match kernels.down {
        Kernel::RegA { .. } => tc_ra::matmul_into(&act, down, sorted_rows, &ys)?,
        Kernel::Staged => tc_gemm::matmul_into(&act, down, sorted_rows, &ys)?,
        Kernel::Tma => tc_tma::matmul_into(&act, down, sorted_rows, &ys)?,
    }
    // Down's per-expert scale rides on the combine weights (ops::ffn).
    let scaled = ffn
        .scale
        .down
        .as_ref()
        .map(|s| crate::ops::ffn::combine_weights_on(Backend::Cuda, routing, s))
        .transpose()?;
    let weights = scaled.as_ref().unwrap_or(&routing.weights);
    let out = match out {
        Some(o) => {
            super::check_same_device(OP, o, x.cuda_bytes()?.device())?;
            super::permute::unpermute_into(&ys, &sort, weights, o)?;
            o.clone()
        }
        None => unpermute_on(Backend::Cuda, &ys, &sort, weights)?,
    };
    if let Some(b) = &ffn.bias.down {
        super::act::routed_bias_add(&out, &routing.ids, &routing.weights, b)?;
    }
    Ok(out)
}
