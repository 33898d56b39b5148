//! `kernels/route.cu`: router logits `[T, E]` → top-k ids `u32 [T, k]` and
//! weights `f32 [T, k]` on the device, one warp per token.
//!
//! The [`RouterKind`] variant picks the kernel's rule functor (a template
//! argument); the per-expert vector of the rule (Gemma-4's
//! `per_expert_scale`, the grouped router's `bias`) is uploaded once per
//! (device, values) and kept on the device ([`expert_vector`]), so a call
//! makes no host-to-device copy after the first and can be captured in a CUDA
//! graph.
//!
//! Results equal the CPU paths' (same f32 operations in the same order)
//! except for `exp`: the kernel's is correctly rounded (computed in f64),
//! libm's `expf` is within 0.502 ulp, so about 7e-5 of the exponentials
//! differ by one ulp. Ids are then exactly equal for the rules that select on
//! the logits (SoftmaxTopK, TopKSoftmax, Gemma4), and for the grouped router
//! except where two selection keys are within an ulp of each other.

use super::{check_out, ctype, launch, Geometry, FLOAT_DTYPES};
use crate::cuda::jit::Source;
use crate::cuda::storage::CudaBytes;
use crate::cuda::CudaDevice;
use crate::dtype::DType;
use crate::error::{ensure, Error, Result};
use crate::ops::route::{GroupMask, RouterConfig, RouterKind, Routing, Scoring};
use crate::tensor::Tensor;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

static SRC: Source = Source {
    name: "route.cu",
    text: include_str!("../../../kernels/route.cu"),
};

const OP: &str = "route";
/// Tokens (warps) per block: `route::kWarps` in the kernel.
const WARPS: usize = 4;
/// f32 buffers of E per warp in shared memory: `route::kBuffers` in the kernel.
const BUFFERS: usize = 3;
/// Per-expert vectors kept on the device, at most (each ≤ 4 KiB).
const MAX_CACHED_VECTORS: usize = 1024;

#[repr(C)]
#[derive(Clone, Copy)]
struct RouteParams {
    logits: u64,
    ids: u64,
    weights: u64,
    vec: u64,
    n_tokens: u32,
    n_experts: u32,
    top_k: u32,
    n_group: u32,
    topk_group: u32,
    norm_topk_prob: u32,
    routed_scaling_factor: f32,
    /// Grouped: 1 when the dropped groups' keys are −∞ ([`GroupMask::NegInf`]), 0 for `0.0`.
    dropped_neg_inf: u32,
}
const _: () = assert!(std::mem::size_of::<RouteParams>() == 64);
// SAFETY: plain-old-data mirrored by the kernel's RouteParams.
unsafe impl cudarc::driver::DeviceRepr for RouteParams {}

/// The C++ rule functor of a router kind (`kernels/route.cu`, namespace `moekit::route`).
fn kind_type(kind: &RouterKind) -> &'static str {
    match kind {
        RouterKind::SoftmaxTopK { .. } => "moekit::route::SoftmaxTopK",
        RouterKind::TopKSoftmax => "moekit::route::TopKSoftmax",
        RouterKind::Gemma4 { .. } => "moekit::route::Gemma4",
        RouterKind::Grouped {
            scoring: Scoring::Softmax,
            ..
        } => "moekit::route::Grouped<moekit::route::SoftmaxScores>",
        RouterKind::Grouped {
            scoring: Scoring::Sigmoid,
            ..
        } => "moekit::route::Grouped<moekit::route::SigmoidScores>",
    }
}

/// One representative of each kind, for [`instances`].
fn every_kind() -> [RouterKind; 5] {
    let grouped = |scoring| RouterKind::Grouped {
        scoring,
        bias: None,
        n_group: 1,
        topk_group: 1,
        dropped_groups: GroupMask::Zero,
        norm_topk_prob: false,
        routed_scaling_factor: 1.0,
    };
    [
        RouterKind::SoftmaxTopK {
            norm_topk_prob: false,
        },
        RouterKind::TopKSoftmax,
        RouterKind::Gemma4 {
            per_expert_scale: Vec::new(),
        },
        grouped(Scoring::Softmax),
        grouped(Scoring::Sigmoid),
    ]
}

fn name_expr(kind: &RouterKind, dtype: DType) -> Result<String> {
    Ok(format!(
        "moekit::route_tokens<{}, {}>",
        kind_type(kind),
        ctype(OP, dtype)?
    ))
}

/// Instances for the compile check: every kind × every logits dtype.
pub fn instances() -> Vec<(&'static Source, String)> {
    every_kind()
        .iter()
        .flat_map(|k| {
            FLOAT_DTYPES
                .iter()
                .filter_map(move |&d| name_expr(k, d).ok())
        })
        .map(|e| (&SRC, e))
        .collect()
}

/// The device copy of a per-expert vector, uploaded on first use and kept
/// (by device and exact values) for the life of the process: a model has a
/// few such vectors per layer, fixed. Past [`MAX_CACHED_VECTORS`] entries a
/// vector is uploaded per call instead (freed in stream order after use).
fn expert_vector(dev: &Arc<CudaDevice>, v: &[f32]) -> Result<CudaBytes> {
    type Cache = Mutex<HashMap<(usize, Vec<u32>), CudaBytes>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let key = (
        dev.ordinal(),
        v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>(),
    );
    let mut map = CACHE
        .get_or_init(Cache::default)
        .lock()
        .map_err(|_| Error::NoCuda("router vector cache poisoned by an earlier panic".into()))?;
    if let Some(b) = map.get(&key) {
        return Ok(b.clone());
    }
    let b = CudaBytes::from_host(dev, bytemuck::cast_slice(v))?;
    if map.len() < MAX_CACHED_VECTORS {
        map.insert(key, b.clone());
    }
    Ok(b)
}

/// The kernel-side values of a rule (shared by `route.cu` and `decode.cu`).
pub(crate) struct RuleParams {
    /// Per-expert vector on the device (Gemma-4 scale or grouped bias).
    pub vec: Option<CudaBytes>,
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f32,
    /// Grouped: the dropped groups' keys are −∞ ([`GroupMask::NegInf`]).
    pub dropped_neg_inf: bool,
}

/// The kernel-side values of a rule.
pub(crate) fn rule_params(dev: &Arc<CudaDevice>, kind: &RouterKind) -> Result<RuleParams> {
    let plain = |vec, norm_topk_prob| RuleParams {
        vec,
        n_group: 1,
        topk_group: 1,
        norm_topk_prob,
        routed_scaling_factor: 1.0,
        dropped_neg_inf: false,
    };
    Ok(match kind {
        RouterKind::SoftmaxTopK { norm_topk_prob } => plain(None, *norm_topk_prob),
        RouterKind::TopKSoftmax => plain(None, false),
        RouterKind::Gemma4 { per_expert_scale } => {
            plain(Some(expert_vector(dev, per_expert_scale)?), false)
        }
        RouterKind::Grouped {
            bias,
            n_group,
            topk_group,
            dropped_groups,
            norm_topk_prob,
            routed_scaling_factor,
            ..
        } => RuleParams {
            vec: bias.as_deref().map(|b| expert_vector(dev, b)).transpose()?,
            n_group: *n_group,
            topk_group: *topk_group,
            norm_topk_prob: *norm_topk_prob,
            routed_scaling_factor: *routed_scaling_factor,
            dropped_neg_inf: *dropped_groups == GroupMask::NegInf,
        },
    })
}

/// Routes `logits` (`[T, E]` f32/f16/bf16 on a CUDA device) into new device
/// tensors `ids u32 [T, k]` and `weights f32 [T, k]`.
pub fn route(logits: &Tensor, cfg: &RouterConfig) -> Result<Routing> {
    let t = logits.shape().first().copied().unwrap_or(0);
    let out = Routing {
        ids: Tensor::zeros_on(DType::U32, &[t, cfg.top_k], logits.device())?,
        weights: Tensor::zeros_on(DType::F32, &[t, cfg.top_k], logits.device())?,
    };
    route_into(logits, cfg, &out)?;
    Ok(out)
}

/// [`route`] into preallocated `out.ids u32 [T, k]` and `out.weights f32 [T, k]`
/// on the device of `logits`.
pub fn route_into(logits: &Tensor, cfg: &RouterConfig, out: &Routing) -> Result<()> {
    cfg.validate()?;
    crate::ops::check_float(OP, "logits", logits, 2)?;
    let (t, e, k) = (logits.shape()[0], logits.shape()[1], cfg.top_k);
    ensure(
        e == cfg.n_experts,
        OP,
        "logits",
        format!("{} columns (cfg.n_experts)", cfg.n_experts),
        format!("shape {:?}", logits.shape()),
    )?;
    ensure(
        u32::try_from(t * k).is_ok(),
        OP,
        "logits",
        "fewer than 2^32 / k rows",
        t,
    )?;
    let lb = logits.cuda_bytes()?;
    let dev = lb.device().clone();
    check_out(OP, &out.ids, DType::U32, &[t, k])?;
    check_out(OP, &out.weights, DType::F32, &[t, k])?;
    for (arg, x) in [("out.ids", &out.ids), ("out.weights", &out.weights)] {
        ensure(
            x.device() == logits.device(),
            OP,
            arg,
            format!("a tensor on {}", logits.device()),
            x.device(),
        )?;
    }
    let rule = rule_params(&dev, &cfg.kind)?;
    let vec = rule.vec;
    // validate() bounds E ≤ 1024, k ≤ 32, n_group and topk_group ≤ E: all fit u32.
    let p = RouteParams {
        logits: lb.ptr(),
        ids: out.ids.cuda_bytes()?.ptr(),
        weights: out.weights.cuda_bytes()?.ptr(),
        vec: vec.as_ref().map_or(0, CudaBytes::ptr),
        n_tokens: t as u32,
        n_experts: e as u32,
        top_k: k as u32,
        n_group: rule.n_group as u32,
        topk_group: rule.topk_group as u32,
        norm_topk_prob: rule.norm_topk_prob as u32,
        routed_scaling_factor: rule.routed_scaling_factor,
        dropped_neg_inf: rule.dropped_neg_inf as u32,
    };
    let geo = Geometry {
        grid: (t.div_ceil(WARPS) as u32, 1, 1),
        block: (32 * WARPS as u32, 1, 1),
        shared: (WARPS * BUFFERS * e * 4) as u32,
    };
    let name = name_expr(&cfg.kind, logits.dtype())?;
    // SAFETY: logits is [t, e] of its dtype on `dev`; ids/weights are [t, k]
    // on `dev`; vec (when the rule reads it) holds e f32 on `dev` and lives
    // until the stream is done with it (cached, or freed in stream order);
    // warp w of block b routes token 4b + w < t, reading row e values and
    // writing k values; shared memory is 4 warps × 3 × e floats, as indexed.
    unsafe { launch(&dev, &SRC, &name, geo, p, "route_tokens") }
}
