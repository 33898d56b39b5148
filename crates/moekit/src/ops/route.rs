//! Routing: router logits `[T, E]` → top-k expert ids and weights.
//!
//! Every family's rule follows mlx-lm's gate code (the fixture oracle, see
//! `scripts/fixtures/route.py`); the per-variant docs of [`RouterKind`] give
//! the exact formula.
//!
//! ## Conventions shared by every rule
//!
//! * Logits may be f32, f16 or bf16; all arithmetic is f32.
//! * **Ties go to the lower expert index** (selection is stable). NaN ranks
//!   below every number (two NaNs tie); `-0.0` and `0.0` tie.
//! * **Slot order:** the `k` slots of a token are in descending selection score
//!   (the key each rule selects on), ties in ascending expert index. mlx-lm
//!   returns the slots in `argpartition` order, which is unspecified; the sets
//!   are the same.
//! * Softmax is `exp(x - max) / Σ exp(x - max)` with the sum taken in expert
//!   order; sigmoid is `1 / (1 + exp(-x))`.

use crate::cpu;
use crate::device::Backend;
use crate::dtype::{DType, Float};
use crate::error::{ensure, invalid, Result};
use crate::ops::check_float;
use crate::tensor::Tensor;
use half::{bf16, f16};

/// How scores are made from logits (DeepSeek-style grouped routers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scoring {
    /// softmax over all experts.
    Softmax,
    /// element-wise sigmoid.
    Sigmoid,
}

/// What the grouped router ([`RouterKind::Grouped`]) writes into the
/// selection keys of the experts of the groups it drops. The two reference
/// implementations differ here, and they pick different experts when a kept
/// expert's key `s[e] + bias[e]` is negative (possible only with a negative
/// selection bias, or NaN keys); with every kept key `≥ 0` both rules choose
/// the same experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupMask {
    /// `0.0`, as mlx-lm's `group_expert_select` (`put_along_axis(.., 0.0)`)
    /// and V2 `MoEGate`: the dropped groups' experts stay selectable; one of
    /// them (key `0.0`, lowest index first among them) wins over every kept
    /// expert whose key is negative. The safetensors loader's rule.
    Zero,
    /// `−∞`, as llama.cpp's `build_moe_ffn` (`ggml_fill(.., -INFINITY)`): the
    /// dropped groups' experts are never chosen while a kept expert's key is
    /// a number (`k ≤ topk_group · E / n_group` guarantees enough of them; a
    /// NaN key ranks below `−∞`). The GGUF loader's rule.
    NegInf,
}

impl GroupMask {
    /// The key a dropped group's experts get: `0.0` or `−∞`.
    #[inline(always)]
    pub fn key(self) -> f32 {
        match self {
            GroupMask::Zero => 0.0,
            GroupMask::NegInf => f32::NEG_INFINITY,
        }
    }

    /// `"0"` or `"-inf"`, for descriptions.
    pub fn label(self) -> &'static str {
        match self {
            GroupMask::Zero => "0",
            GroupMask::NegInf => "-inf",
        }
    }
}

/// The routing rule of a model family.
#[derive(Debug, Clone, PartialEq)]
pub enum RouterKind {
    /// softmax over all experts, top-k; with `norm_topk_prob` the k weights are
    /// renormalised to sum 1 (Qwen3-MoE), else raw probabilities (Qwen3-Next, Qwen2-MoE).
    ///
    /// Selection is on the logits (softmax is monotone, so this is the top-k
    /// of the probabilities; a tie that rounding in `exp` creates between two
    /// different logits is broken by the logits). Weight of expert `e`:
    /// `p[e] = softmax(logits)[e]`, then `p[e] / Σ_chosen p` if `norm_topk_prob`.
    SoftmaxTopK {
        /// renormalise the chosen k.
        norm_topk_prob: bool,
    },
    /// top-k over the raw logits, softmax over the chosen k (Mixtral, gpt-oss).
    TopKSoftmax,
    /// Gemma-4: softmax over all, top-k, renormalise, × `per_expert_scale[e]`.
    ///
    /// Computed as mlx-lm does (top-k on the logits, softmax over the chosen
    /// k, × scale), which equals HF's softmax-all → top-k → renormalise.
    Gemma4 {
        /// one scale per expert.
        per_expert_scale: Vec<f32>,
    },
    /// DeepSeek-V2/V3 (and GLM-4-MoE): scores from `scoring`; selection on
    /// scores + `bias` (V3 `e_score_correction_bias`), limited to `topk_group`
    /// of `n_group` groups; weights from the unbiased scores, optionally
    /// renormalised, × `routed_scaling_factor`.
    ///
    /// Exactly (mlx-lm `group_expert_select` / V2 `MoEGate`):
    /// 1. `s = scores(logits)`; selection key `q[e] = s[e] + bias[e]`.
    /// 2. If `n_group > 1`: experts form `n_group` contiguous groups of
    ///    `E / n_group`. Group score: with [`Scoring::Sigmoid`] the sum of the
    ///    group's two largest `q` (the one `q` for groups of one), with
    ///    [`Scoring::Softmax`] the largest `q` (V2 group-limited greedy). The
    ///    `topk_group` best groups are kept (ties → lower group index); in
    ///    every other group `q` is set to `dropped_groups.key()`: `0.0`
    ///    ([`GroupMask::Zero`], mlx-lm: those experts stay selectable and win
    ///    over kept experts whose `q` is negative) or `−∞`
    ///    ([`GroupMask::NegInf`], llama.cpp: never selected). Nothing is
    ///    masked when `n_group = 1` (plain greedy top-k, V2 `greedy`) or
    ///    `topk_group = n_group`.
    /// 3. Top-k over `q`; weights `w = s[chosen]` (unbiased, unmasked).
    /// 4. If `norm_topk_prob` and `k > 1`: `w /= Σ w` (no epsilon, as mlx-lm;
    ///    skipped when `Σ w` is 0, where mlx-lm would give NaN).
    /// 5. `w *= routed_scaling_factor`.
    Grouped {
        /// softmax (V2) or sigmoid (V3).
        scoring: Scoring,
        /// selection-only bias, one per expert.
        bias: Option<Vec<f32>>,
        /// number of expert groups (1 = no grouping).
        n_group: usize,
        /// groups kept per token.
        topk_group: usize,
        /// the selection key of the dropped groups' experts (step 2).
        dropped_groups: GroupMask,
        /// renormalise the chosen k.
        norm_topk_prob: bool,
        /// final multiplier of the weights.
        routed_scaling_factor: f32,
    },
}

/// A router: rule, number of experts and top-k.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterConfig {
    /// The rule.
    pub kind: RouterKind,
    /// E (≤ 1024).
    pub n_experts: usize,
    /// k (≤ 32, ≤ E).
    pub top_k: usize,
}

/// The largest supported number of experts.
pub const MAX_EXPERTS: usize = 1024;
/// The largest supported top-k.
pub const MAX_TOP_K: usize = 32;

const OP: &str = "route";

impl RouterConfig {
    /// Checks every field: `1 ≤ E ≤ 1024`, `1 ≤ k ≤ min(32, E)`, per-expert
    /// vectors of length E, `n_group` divides E, `1 ≤ topk_group ≤ n_group`,
    /// `k ≤ topk_group · E / n_group`, finite `routed_scaling_factor`.
    pub fn validate(&self) -> Result<()> {
        let (e, k) = (self.n_experts, self.top_k);
        ensure(
            (1..=MAX_EXPERTS).contains(&e),
            OP,
            "cfg.n_experts",
            format!("1..={MAX_EXPERTS}"),
            e,
        )?;
        ensure(
            (1..=MAX_TOP_K.min(e)).contains(&k),
            OP,
            "cfg.top_k",
            format!("1..={}", MAX_TOP_K.min(e)),
            k,
        )?;
        match &self.kind {
            RouterKind::SoftmaxTopK { .. } | RouterKind::TopKSoftmax => Ok(()),
            RouterKind::Gemma4 { per_expert_scale } => ensure(
                per_expert_scale.len() == e,
                OP,
                "cfg.kind.per_expert_scale",
                format!("{e} values (one per expert)"),
                format!("{} values", per_expert_scale.len()),
            ),
            RouterKind::Grouped {
                bias,
                n_group,
                topk_group,
                routed_scaling_factor,
                ..
            } => {
                if let Some(b) = bias {
                    ensure(
                        b.len() == e,
                        OP,
                        "cfg.kind.bias",
                        format!("{e} values (one per expert)"),
                        format!("{} values", b.len()),
                    )?;
                }
                let g = *n_group;
                ensure(
                    g >= 1 && e % g == 0,
                    OP,
                    "cfg.kind.n_group",
                    format!("a divisor of n_experts = {e}"),
                    g,
                )?;
                ensure(
                    (1..=g).contains(topk_group),
                    OP,
                    "cfg.kind.topk_group",
                    format!("1..={g}"),
                    topk_group,
                )?;
                let reachable = topk_group * (e / g);
                ensure(
                    k <= reachable,
                    OP,
                    "cfg.top_k",
                    format!("≤ topk_group · n_experts / n_group = {reachable}"),
                    k,
                )?;
                ensure(
                    routed_scaling_factor.is_finite(),
                    OP,
                    "cfg.kind.routed_scaling_factor",
                    "a finite number",
                    routed_scaling_factor,
                )
            }
        }
    }
}

/// The result of routing `T` tokens.
#[derive(Debug, Clone)]
pub struct Routing {
    /// `u32 [T, k]` chosen expert ids.
    pub ids: Tensor,
    /// `f32 [T, k]` their weights.
    pub weights: Tensor,
}

/// Routes `logits` (`[T, E]`, float) with the backend of its device.
pub fn route(logits: &Tensor, cfg: &RouterConfig) -> Result<Routing> {
    route_on(Backend::for_device(logits.device())?, logits, cfg)
}

/// Routes with an explicit backend.
pub fn route_on(backend: Backend, logits: &Tensor, cfg: &RouterConfig) -> Result<Routing> {
    cfg.validate()?;
    check_float(OP, "logits", logits, 2)?;
    let (t, e) = match logits.shape() {
        &[t, e] => (t, e),
        s => {
            return Err(invalid(
                OP,
                "logits",
                "rank 2 [T, E]",
                format!("shape {s:?}"),
            ))
        }
    };
    ensure(
        e == cfg.n_experts,
        OP,
        "logits",
        format!("{} columns (cfg.n_experts)", cfg.n_experts),
        format!("shape {:?}", logits.shape()),
    )?;
    if backend == Backend::Cuda {
        // On the device, before any host access to the logits.
        return crate::cuda::ops::route::route(logits, cfg);
    }
    let k = cfg.top_k;
    let mut ids = Tensor::zeros(DType::U32, &[t, k]);
    let mut weights = Tensor::zeros(DType::F32, &[t, k]);
    {
        let (id, w) = (ids.as_mut_slice::<u32>()?, weights.as_mut_slice::<f32>()?);
        match logits.dtype() {
            DType::F32 => dispatch::<f32>(backend, logits, cfg, id, w)?,
            DType::F16 => dispatch::<f16>(backend, logits, cfg, id, w)?,
            DType::Bf16 => dispatch::<bf16>(backend, logits, cfg, id, w)?,
            other => return Err(invalid(OP, "logits", "dtype f32, f16 or bf16", other)),
        }
    }
    Ok(Routing { ids, weights })
}

fn dispatch<T: Float>(
    backend: Backend,
    logits: &Tensor,
    cfg: &RouterConfig,
    ids: &mut [u32],
    w: &mut [f32],
) -> Result<()> {
    let x = logits.as_slice::<T>()?;
    match backend {
        Backend::CpuReference => cpu::reference::route::route(x, cfg, ids, w),
        Backend::CpuFast | Backend::Cuda => cpu::fast::route::route(x, cfg, ids, w),
    }
}

/// Checks a backend's arguments (config and slice lengths); returns T.
pub(crate) fn check_backend_args(
    logits: usize,
    cfg: &RouterConfig,
    ids: usize,
    weights: usize,
) -> Result<usize> {
    cfg.validate()?;
    let (e, k) = (cfg.n_experts, cfg.top_k);
    ensure(
        logits.is_multiple_of(e),
        OP,
        "logits",
        format!("a multiple of n_experts = {e} values"),
        logits,
    )?;
    let t = logits / e;
    ensure(
        ids == t * k,
        OP,
        "ids",
        format!("{} slots (T·k)", t * k),
        ids,
    )?;
    ensure(
        weights == t * k,
        OP,
        "weights",
        format!("{} slots (T·k)", t * k),
        weights,
    )?;
    Ok(t)
}

/// Whether `(a, ia)` ranks strictly before `(b, ib)`: larger value first,
/// NaN last, ties (incl. `-0.0 == 0.0`, NaN == NaN) to the lower index.
#[inline(always)]
pub(crate) fn ranks_before(a: f32, ia: usize, b: f32, ib: usize) -> bool {
    match (a.is_nan(), b.is_nan()) {
        (false, false) => a > b || (a == b && ia < ib),
        (false, true) => true,
        (true, false) => false,
        (true, true) => ia < ib,
    }
}

/// `1 / (1 + exp(-x))` in f32.
#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}
