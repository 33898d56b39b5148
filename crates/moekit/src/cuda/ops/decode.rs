//! `kernels/decode.cu`: the MoE block for few tokens (decode) in four
//! launches — router matvec, routing + expert sort (`kernels/decode_tail.cu`),
//! gate/up + SwiGLU, down + weighted combine — or three when the gate/up
//! blocks route themselves (T = 1, `fold_route`: each block selects its
//! own expert, one extra block publishes the full routing), with no host
//! synchronization (capturable in a graph).
//!
//! [`supports`] says when it applies (the block picks it in
//! `crate::plan`); [`forward`] runs it. Which expert kernels a call runs
//! (tensor cores or CUDA cores) is chosen in one place, [`experts_for`].

use super::gather_mm::{all_format_types, format_type, group_shift, weight_src};
use super::route::rule_params;
use super::{ctype, launch_ordered, Geometry, Order, FLOAT_DTYPES};
use crate::cuda::jit::Source;
use crate::error::{ensure, Result};
use crate::format::QuantWeights;
use crate::ops::parts::MoeBlockParts;
use crate::ops::route::Routing;
use crate::ops::route::{RouterKind, Scoring};
use crate::tensor::Tensor;
use crate::{DType, WeightFormat};

static SRC: Source = Source {
    name: "decode.cu",
    text: include_str!("../../../kernels/decode.cu"),
};

/// The routing step as its own kernel (`decode_route_tail`): an instance
/// per rule and team, whatever the formats and activation type.
static TAIL_SRC: Source = Source {
    name: "decode_tail.cu",
    text: include_str!("../../../kernels/decode_tail.cu"),
};

/// Largest token count the decode path takes (larger batches use the general path).
pub const MAX_TOKENS: usize = 64;
/// Warps per block of `decode_gate_up` and `decode_down` (`DEC_WARPS`).
const WARPS: usize = 8;
/// Warps per `decode_route` block (`ROUTE_WARPS`), and of the one
/// `decode_route_tail` block (`ROUTE_TAIL_WARPS`: a token each when routing
/// a warp per token).
const ROUTE_WARPS: usize = 8;
/// Router rows per `decode_route` block (`ROUTE_ROWS`: 4 warps a row).
const ROUTE_ROWS: usize = 2;
/// Warps per block of the tensor-core expert kernels (`MMA_WARPS`).
const MMA_WARPS: usize = 8;
/// Weight rows per warp of the tensor-core expert kernels (`MMA_TILE`).
const MMA_TILE: usize = 16;
/// Columns of one span of the tensor-core kernels (`MMA_SPAN`).
const MMA_SPAN: usize = 128;

/// Warps of a tensor-core expert block that split K (`gu_split`,
/// `down_split`): enough that each walks about 4 spans (so a warp's loads
/// are few round trips and the GPU has many warps streaming), at most all 8
/// of them. A function of K alone, so the order of the sums never depends
/// on the batch.
fn mma_split(k: usize) -> usize {
    k.div_ceil(MMA_SPAN)
        .div_ceil(spans_per_warp())
        .next_power_of_two()
        .clamp(1, MMA_WARPS)
}

/// Spans of K a tensor-core expert warp aims to take: 4, or
/// `MOEKIT_DECODE_SPANS` (1..=16, read once; a tuning knob — the split
/// stays a function of K alone within a process).
fn spans_per_warp() -> usize {
    static ENV: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ENV.get_or_init(|| super::env_knob("MOEKIT_DECODE_SPANS", 1..=16, 4))
}

/// Largest T at which the routing step (`decode_route_tail`) routes each token with
/// all of its threads (one after another; E ≤ 256), rather than a warp per
/// token: 1, or `MOEKIT_ROUTE_BLOCK_T` (0..=64, read once; 0 = always a
/// warp per token). Both give the same bits, so this is a pure speed knob.
/// Measured (H100, qwen3-30b-a3b affine4, graph): T = 1 38.4 → 38.0 µs,
/// T = 2 55.0 → 59.4 µs (tokens routed in turn instead of side by side).
fn route_block_tokens() -> usize {
    static ENV: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ENV.get_or_init(|| super::env_knob("MOEKIT_ROUTE_BLOCK_T", 0..=MAX_TOKENS, 1))
}

/// Tokens up to which the tensor-core gate/up blocks can route themselves
/// (kernels/decode.cu `FOLD_MAX_T`).
const FOLD_MAX_T: usize = 16;
/// Floats of a tensor-core expert block's reduction buffer (`MMA_RED`).
const MMA_RED: usize = MMA_WARPS * 2 * 2 * 4 * 32;

/// A test's choice of `fold_route`: [`force_fold`].
static FOLD_FORCED: super::Forced = super::Forced::new();

/// Forces the gate/up blocks' own routing on or off (`None`: the knob
/// decides), so that tests can compare both paths in one process.
pub fn force_fold(on: Option<bool>) {
    FOLD_FORCED.set(on);
}

/// Whether the gate/up blocks route the tokens themselves (`fold_route`):
/// `MOEKIT_DECODE_FOLD=0|1` (read once), default on, unless a test forces it.
fn fold_knob() -> bool {
    if let Some(on) = FOLD_FORCED.get() {
        return on;
    }
    static ENV: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ENV.get_or_init(|| super::env_knob("MOEKIT_DECODE_FOLD", 0..=1, 1)) == 1
}

/// Whether a tensor-core call of `t` tokens folds the routing into the
/// gate/up blocks: few tokens, each routed by a whole block (T ≤ the
/// route_block knob, E ≤ 256 keys), and the routing and sort buffers
/// (route.rs's 3·E floats a routing warp, the ids, the sort's arrays) fit the
/// block's reduction buffer, which they borrow.
fn folds(t: usize, e: usize, k: usize, route_warps: usize) -> bool {
    let n = t * k;
    let room = (route_warps * 3 * e).max(e + 1) + n + (2 * e + 2) + n;
    fold_knob() && t <= FOLD_MAX_T && team_for(t, e) == TEAM_BLOCK && room <= MMA_RED
}

/// Whether decode_down_mma reads a folded routing before its wait for the
/// gate/up grid (`DecodeParams::routed`): `MOEKIT_DECODE_EARLY=0|1` (read
/// once; default on), for A/B measurements.
fn routed_knob() -> bool {
    static ENV: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ENV.get_or_init(|| super::env_knob("MOEKIT_DECODE_EARLY", 0..=1, 1)) == 1
}

/// Gate/up blocks an SM up to which they route themselves (the grid's
/// size over the SM count): 2 — one wave of `decode_gate_up_mma` — or
/// `MOEKIT_DECODE_FOLD_BLOCKS` (1..=64, read once; a tuning knob).
fn fold_blocks() -> usize {
    static ENV: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ENV.get_or_init(|| super::env_knob("MOEKIT_DECODE_FOLD_BLOCKS", 1..=64, 2))
}

/// Rows per tensor-core expert block for K (16 per row tile, 8 / split tiles).
fn mma_rows(k: usize) -> usize {
    MMA_TILE * (MMA_WARPS / mma_split(k))
}
/// Tiles in flight per `decode_down` block (2 · `DOWN_BATCH`).
const DOWN_RING: usize = 16;
/// Tokens whose x rows a `decode_gate_up` block stages at a time (`GU_TG`).
const GU_TG: usize = 4;

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct DecodeW {
    data: u64,
    scales: u64,
    biases: u64,
    rows: u32,
    row_offset: u32,
    k: u32,
    group_shift: u32,
}
const _: () = assert!(std::mem::size_of::<DecodeW>() == 40);

#[repr(C)]
#[derive(Clone, Copy)]
struct DecodeParams {
    x: u64,
    out: u64,
    logits: u64,
    ids: u64,
    weights: u64,
    gate: u64,
    active: u64,
    n_active: u64,
    offsets: u64,
    slots: u64,
    act: u64,
    rvec: u64,
    err: u64,
    y: u64,
    tile_tickets: u64,
    router: DecodeW,
    sgate: DecodeW,
    gate_w: DecodeW,
    up_w: DecodeW,
    down_w: DecodeW,
    sg: DecodeW,
    su: DecodeW,
    sd: DecodeW,
    n_tokens: u32,
    hidden: u32,
    n_experts: u32,
    top_k: u32,
    n_group: u32,
    topk_group: u32,
    norm_topk_prob: u32,
    rule: u32,
    rsf: f32,
    act_stride: u32,
    max_active: u32,
    route_warps: u32,
    gu_rows: u32,
    down_rows: u32,
    down_room: u32,
    gu_split: u32,
    down_split: u32,
    route_block: u32,
    fold_route: u32,
    trace_twice: u32,
    trace: u64,
    glu: super::GluParams,
    router_bias: u64,
    down_bias: u64,
    router_x: u64,
    weight_in: u32,
    pad_wi: u32,
    down_scale: u64,
    routed: u64,
}
const _: () = assert!(std::mem::size_of::<DecodeParams>() == 624);

// SAFETY: plain-old-data mirrored by the kernel's DecodeParams.
unsafe impl cudarc::driver::DeviceRepr for DecodeParams {}

/// `DecodeRule`'s flag bit: the grouped router's dropped groups get key −∞
/// ([`crate::ops::route::GroupMask::NegInf`]), else 0.
const RULE_DROPPED_NEG_INF: u32 = 0x100;

/// The routing rule as the kernel's `DecodeRule` (low byte; the flag is added by the caller).
fn rule_code(kind: &RouterKind) -> u32 {
    match kind {
        RouterKind::SoftmaxTopK { .. } => 0,
        RouterKind::TopKSoftmax => 1,
        RouterKind::Gemma4 { .. } => 2,
        RouterKind::Grouped {
            scoring: Scoring::Softmax,
            ..
        } => 3,
        RouterKind::Grouped {
            scoring: Scoring::Sigmoid,
            ..
        } => 4,
    }
}

/// The C++ format type of `w` (format + scale dtype).
fn ftype(w: &QuantWeights) -> Result<String> {
    format_type(w.format(), w.scales().map_or(DType::F32, |s| s.dtype()))
}

/// Bytes of one row's packed weights and of its scales (0 without).
fn row_sizes(w: &QuantWeights) -> (usize, usize) {
    let rows = (w.n_experts() * w.rows()).max(1);
    (
        w.data().nbytes() / rows,
        w.scales().map_or(0, |s| s.nbytes() / rows),
    )
}

/// Shared memory a staged range of `n` bytes takes (`stage_room`).
fn stage_room(n: usize) -> usize {
    (n + 30) & !15
}

/// Shared memory of a staged tile of `nr` rows (`tile_room`).
fn tile_room(nr: usize, (rb, ab): (usize, usize)) -> usize {
    stage_room(nr * rb) + if ab > 0 { 2 * stage_room(nr * ab) } else { 0 }
}

/// Staging budget of a `decode_gate_up` block (its gate and up tiles).
const GU_BUDGET: usize = 80 * 1024;
/// Staging budget of a `decode_down` block's two batches of tiles.
const DOWN_BUDGET: usize = 64 * 1024;
/// Most dynamic shared memory a decode block may take (fits sm_80 and sm_90).
const SMEM_LIMIT: usize = 160 * 1024;

/// Tile sizes of one call — the one place they are chosen. Rows per tile
/// are the largest power of two (up to 32 for gate/up, 16 for down) whose
/// tiles fit the kernel's staging budget, so a decode block keeps 64–80 KiB
/// of weights in flight whatever the format's bytes per row, and T = 1 runs
/// in about one wave (qwen3-30b-a3b affine4: 24 × 8 gate/up blocks of 32
/// rows, 256 down blocks of 8 rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tiles {
    gu_rows: usize,
    down_rows: usize,
    down_room: usize,
}

fn tiles(gate: (usize, usize), down: (usize, usize)) -> Tiles {
    let fit = |budget: usize, need: &dyn Fn(usize) -> usize| {
        [32, 16, 8, 4, 2, 1]
            .into_iter()
            .find(|&r| need(r) <= budget)
            .unwrap_or(1)
    };
    let gu_rows = fit(GU_BUDGET, &|r| 2 * tile_room(r, gate));
    let down_rows = fit(DOWN_BUDGET, &|r| {
        if r > 16 {
            usize::MAX
        } else {
            DOWN_RING * tile_room(r, down)
        }
    });
    Tiles {
        gu_rows,
        down_rows,
        down_room: tile_room(down_rows, down),
    }
}

/// The expert kernels of a call (steps 2 and 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Experts {
    /// `decode_gate_up_mma` / `decode_down_mma`: tensor cores, weights
    /// decoded into MMA fragments; gate/up and down may differ in format.
    Mma,
    /// `decode_gate_up` / `decode_down`: CUDA cores, f32 arithmetic.
    Cores,
}

/// The weight formats of a block's expert matrices: (gate/up, down), each
/// `None` when the routed and shared matrices of that side differ.
fn expert_formats(p: &MoeBlockParts) -> (Option<String>, Option<String>) {
    let one = |ws: &[&QuantWeights]| -> Option<String> {
        let f = ftype(ws.first()?).ok()?;
        ws.iter()
            .all(|w| ftype(w).ok().as_ref() == Some(&f))
            .then_some(f)
    };
    let mut gu: Vec<&QuantWeights> = p.gate_up.sources().iter().map(|x| x.0).collect();
    let mut dn = vec![&p.down];
    if let Some(s) = &p.shared {
        gu.extend(s.gate_up.sources().iter().map(|x| x.0));
        dn.push(&s.down);
    }
    (one(&gu), one(&dn))
}

/// Which expert kernels run `p` on `dtype` activations — the one place the
/// choice is made — or why none can. Tensor cores where the activations
/// are 16-bit, no expert matrix holds f32 weights (the MMA would round them
/// to 16 bits), every K and row count is a multiple of 32 (whole slices)
/// and the down tiles fit the device's tile tickets; CUDA cores for the
/// rest, which need every expert matrix in one format.
fn experts_for(p: &MoeBlockParts, dtype: DType) -> std::result::Result<Experts, &'static str> {
    let (gu, dn) = expert_formats(p);
    let (Some(gu), Some(dn)) = (gu, dn) else {
        return Err("routed and shared expert matrices of one side differ in format");
    };
    let f32_weights = |f: &str| f == "moekit::FmtDense<float>";
    let i = p.gate_up.intermediate();
    let si = p.shared.as_ref().map_or(0, |s| s.gate_up.intermediate());
    let mma = matches!(dtype, DType::Bf16 | DType::F16)
        && !f32_weights(&gu)
        && !f32_weights(&dn)
        && [p.hidden(), i, si].iter().all(|d| d % 32 == 0)
        && p.hidden().div_ceil(mma_rows(i.max(si))) <= crate::cuda::TILE_TICKETS;
    if mma {
        Ok(Experts::Mma)
    } else if gu == dn {
        Ok(Experts::Cores)
    } else {
        Err("gate/up and down differ in format, which only the tensor-core kernels take")
    }
}

/// One call's launch plan: expert kernels, tile sizes, routing warps of
/// the routing step, and the dynamic shared memory of the routing step and
/// the two expert kernels.
struct Plan {
    experts: Experts,
    tiles: Tiles,
    route_warps: usize,
    smem: [usize; 3],
}

/// The plan for `block` at `t` tokens of `dtype` (k slots each, E experts),
/// or why the decode kernels cannot hold it.
fn plan(p: &MoeBlockParts, t: usize, dtype: DType) -> std::result::Result<Plan, String> {
    let experts = experts_for(p, dtype)?;
    let (e, k) = (p.router.n_experts, p.router.top_k);
    let [(g, _), _] = p.gate_up.sources();
    let (mut gate, mut down) = (row_sizes(g), row_sizes(&p.down));
    if let Some(sh) = &p.shared {
        let [(sg, _), _] = sh.gate_up.sources();
        let (a, b) = (row_sizes(sg), row_sizes(&sh.down));
        gate = (gate.0.max(a.0), gate.1.max(a.1));
        down = (down.0.max(b.0), down.1.max(b.1));
    }
    let tl = tiles(gate, down);
    // Routing warps of the decode_route_tail block: 3·E floats each.
    let route_warps = (48 * 1024 / (12 * e.max(1))).min(ROUTE_WARPS);
    let route = (route_warps * 3 * e).max(e + 1) * 4 + t * k * 4;
    let smem = match experts {
        // The tensor-core kernels' shared memory is static.
        Experts::Mma => [route, 0, 0],
        Experts::Cores => {
            // Tiles, GU_TG staged x rows (padded to 32) and their sums per 16 or more.
            let hp = p.hidden().div_ceil(32) * 32;
            let gu = 2 * tile_room(tl.gu_rows, gate) + GU_TG * (hp + hp / 16) * 4;
            let slots = t * k + t;
            let max_active = (t * k).min(e);
            let dn = DOWN_RING * tl.down_room
                + slots * tl.down_rows * 4
                + (3 * (max_active + 1) + t * k) * 4;
            [route, gu, dn]
        }
    };
    if route_warps == 0 || smem.iter().any(|&b| b > SMEM_LIMIT) {
        return Err(format!(
            "its tiles need {smem:?} bytes of shared memory (at most {SMEM_LIMIT}) at E = {e}"
        ));
    }
    Ok(Plan {
        experts,
        tiles: tl,
        route_warps,
        smem,
    })
}

/// The plan for running `block` on `x` when the decode path applies: a CUDA
/// tensor of 1 to [`MAX_TOKENS`] rows, expert matrices the chosen kernels
/// take ([`experts_for`]), the shared-expert gate (if any) in the router's
/// format, and tiles that fit the kernels' shared memory.
fn plan_for(p: &MoeBlockParts, x: &Tensor) -> std::result::Result<Plan, String> {
    let t = x.shape().first().copied().unwrap_or(0);
    if !matches!(x.device(), crate::Device::Cuda(_)) || x.rank() != 2 || t == 0 || t > MAX_TOKENS {
        return Err(format!(
            "needs x on CUDA with 1..={MAX_TOKENS} tokens (got {:?} on {})",
            x.shape(),
            x.device()
        ));
    }
    if !router_format_ok(p.router_weight.format()) {
        return Err(format!(
            "its router weights are {}; the decode path's router takes dense or MLX affine weights",
            p.router_weight.format()
        ));
    }
    if let Some(g) = p.shared.as_ref().and_then(|s| s.gate.as_ref()) {
        if ftype(g).ok() != ftype(&p.router_weight).ok() {
            return Err("the shared-expert gate differs in format from the router".into());
        }
    }
    if p.ffn.input.expert_norm.is_some() && p.shared.is_some() {
        return Err(
            "its experts read a normed input and it has a shared expert; the decode path gives \
             every expert one input"
                .into(),
        );
    }
    plan(p, t, x.dtype())
}

/// Whether the decode path runs `block` on `x`, or why not (see [`plan_for`]).
pub fn supports(p: &MoeBlockParts, x: &Tensor) -> std::result::Result<(), String> {
    plan_for(p, x).map(|_| ())
}

/// Router weight formats `decode_route` is instantiated for: dense and MLX
/// affine (checkpoints keep routers in f32/16-bit, or quantize them as MLX
/// does); a router in a GGML block type takes the general path. This keeps
/// the route kernel — the slowest to compile — to the formats routers use.
fn router_format_ok(f: WeightFormat) -> bool {
    !matches!(f, WeightFormat::Ggml(_))
}

/// `DecodeRule` values (kernels/decode_common.cuh): [`rule_code`]'s range.
const RULES: u32 = 5;
/// `RouteTeam` (kernels/decode_routing.cuh): each token routed by the whole
/// block, or by a warp.
const TEAM_BLOCK: u32 = 1;
const TEAM_WARP: u32 = 2;
/// Largest E the block team routes (route.cuh `kBlockKeys`).
const BLOCK_KEYS: usize = 256;

/// The routing kernel's instance for a rule and team (one each: the
/// routing is a chain of dependent steps, and a kernel holding every rule
/// and team waited mostly on instruction fetch).
fn tail_kernel(rule: u32, team: u32) -> String {
    format!("moekit::decode_route_tail<{rule}, {team}>")
}

/// The routing team for `t` tokens of `e` experts: the whole block per
/// token up to the route_block knob (E ≤ 256), else a warp per token — the
/// kernels' `TEAM_ANY` rule.
fn team_for(t: usize, e: usize) -> u32 {
    if t <= route_block_tokens() && e <= BLOCK_KEYS {
        TEAM_BLOCK
    } else {
        TEAM_WARP
    }
}

/// Every instance the decode path can request.
pub fn instances() -> Vec<(&'static Source, String)> {
    let mut v: Vec<(&'static Source, String)> = (0..RULES)
        .flat_map(|r| [TEAM_BLOCK, TEAM_WARP].map(|team| (&TAIL_SRC, tail_kernel(r, team))))
        .collect();
    for (f, ft) in all_format_types() {
        for &d in &FLOAT_DTYPES {
            let t = ctype("decode", d).unwrap_or("float");
            let route = router_format_ok(f).then_some("decode_route");
            for k in route.into_iter().chain(["decode_gate_up", "decode_down"]) {
                v.push((&SRC, format!("moekit::{k}<{ft}, {t}>")));
            }
            if matches!(d, DType::Bf16 | DType::F16) && ft != "moekit::FmtDense<float>" {
                for k in ["decode_gate_up_mma", "decode_down_mma"] {
                    v.push((&SRC, format!("moekit::{k}<{ft}, {t}>")));
                }
            }
        }
    }
    v
}

fn dw(w: &QuantWeights, row_offset: usize) -> Result<DecodeW> {
    let s = weight_src("decode", w, row_offset)?;
    Ok(DecodeW {
        data: s.data,
        scales: s.scales,
        biases: s.biases,
        rows: s.rows,
        row_offset: s.row_offset,
        k: w.cols() as u32,
        group_shift: group_shift(w.format()),
    })
}

/// Runs `block` on `x` (`[T, H]`, T ≤ [`MAX_TOKENS`]) in three or four launches,
/// into `out` (`[T, H]` of `x`'s dtype on its device) if given, else into a
/// new tensor; call only where [`supports`] holds.
pub fn forward(p: &MoeBlockParts, x: &Tensor, out: Option<&Tensor>) -> Result<(Routing, Tensor)> {
    const OP: &str = "moe_decode";
    let plan = plan_for(p, x).map_err(|why| {
        crate::error::invalid(
            OP,
            "block",
            "a block and input the decode path supports",
            why,
        )
    })?;
    let (t, h) = (x.shape()[0], x.shape()[1]);
    ensure(
        h == p.hidden(),
        OP,
        "x",
        format!("[T, {}]", p.hidden()),
        format!("{:?}", x.shape()),
    )?;
    // The router's and the experts' inputs (Gemma-4's norms); the weight
    // before the FFN (Llama-4) is applied in the gate/up epilogue.
    let (xr, xe) = p.ffn.input.inputs_on(crate::device::Backend::Cuda, x)?;
    let x: &Tensor = &xe;
    let xb = x.cuda_bytes()?;
    let dev = xb.device().clone();
    let (e, k) = (p.router.n_experts, p.router.top_k);
    let i = p.gate_up.intermediate();
    let si = p.shared.as_ref().map_or(0, |s| s.gate_up.intermediate());
    let mma = plan.experts == Experts::Mma;
    // act rows: T on tensor cores (16-byte aligned rows); f32 on CUDA cores,
    // lane-major in blocks of 32 chunks (≤ 32 · 32 values).
    let (stride, act_size) = if mma {
        (i.max(si).div_ceil(128) * 128, x.dtype().size())
    } else {
        (i.max(si).div_ceil(1024) * 1024, 4)
    };
    let max_active = (t * k).min(e);
    let (tl, smem) = (plan.tiles, plan.smem);
    // decode_down writes every element of `out`.
    let out = match out {
        Some(o) => {
            super::check_out(OP, o, x.dtype(), &[t, h])?;
            super::check_same_device(OP, o, &dev)?;
            o.clone()
        }
        None => Tensor::from_cuda_bytes(
            x.dtype(),
            &[t, h],
            crate::cuda::storage::CudaBytes::uninit(&dev, t * h * x.dtype().size())?,
        )?,
    };
    // One scratch allocation, carved into 16-byte aligned pieces, every one
    // written by the kernels before it is read (the ticket is the device's).
    let sizes = [
        (t * (e + 1)) * 4,
        t * k * 4,
        t * k * 4,
        t * 4,
        e * 4,
        4,
        (e + 1) * 4,
        t * k * 4,
        (t * k + t) * stride * act_size,
        if mma { (t * k + t) * h * 4 } else { 0 },
    ];
    let mut offs = Vec::with_capacity(sizes.len());
    let mut total = 0usize;
    for s in sizes {
        offs.push(total);
        total += s.div_ceil(16) * 16;
    }
    let scratch = crate::cuda::storage::CudaBytes::uninit(&dev, total)?;
    let base = scratch.ptr();
    let at = |i: usize| base + offs[i] as u64;
    let (logits, ids_p, weights_p, gate, active, n_active, offsets, slots, act) = (
        at(0),
        at(1),
        at(2),
        at(3),
        at(4),
        at(5),
        at(6),
        at(7),
        at(8),
    );
    let rule = rule_params(&dev, &p.router.kind)?;
    let vec = rule.vec.as_ref();
    let [(gw, go), (uw, uo)] = p.gate_up.sources();
    let none = DecodeW::default();
    let (sg, su, sd, sgate) = match &p.shared {
        Some(s) => {
            let [(a, ao), (b, bo)] = s.gate_up.sources();
            (
                dw(a, ao)?,
                dw(b, bo)?,
                dw(&s.down, 0)?,
                s.gate
                    .as_ref()
                    .map(|g| dw(g, 0))
                    .transpose()?
                    .unwrap_or(none),
            )
        }
        None => (none, none, none, none),
    };
    // Every gate/up block routes: worth it only while they all run in one
    // wave (2 an SM), each paying the routing once (H100: qwen3 T = 1
    // 40.9 → 38.9 µs; Mixtral's 2 688 blocks 124 → 135 µs). A weight-before
    // block's gate/up epilogue reads p.weights, which only the publishing
    // block of a folded routing writes: not folded.
    let fold = mma
        && !p.ffn.input.weight_before
        && folds(t, e, k, plan.route_warps)
        && i.max(si).div_ceil(mma_rows(h)) * (max_active + 1)
            <= fold_blocks() * dev.sm_count() as usize;
    let params = DecodeParams {
        x: xb.ptr(),
        out: out.cuda_bytes()?.ptr(),
        logits,
        ids: ids_p,
        weights: weights_p,
        gate,
        active,
        n_active,
        offsets,
        slots,
        act,
        rvec: vec.map_or(0, |v| v.ptr()),
        err: dev.error_word(),
        y: if mma { at(9) } else { 0 },
        tile_tickets: dev.tile_tickets(),
        router: dw(&p.router_weight, 0)?,
        sgate,
        gate_w: dw(gw, go)?,
        up_w: dw(uw, uo)?,
        down_w: dw(&p.down, 0)?,
        sg,
        su,
        sd,
        n_tokens: t as u32,
        hidden: h as u32,
        n_experts: e as u32,
        top_k: k as u32,
        n_group: rule.n_group as u32,
        topk_group: rule.topk_group as u32,
        norm_topk_prob: rule.norm_topk_prob as u32,
        rule: rule_code(&p.router.kind)
            | if rule.dropped_neg_inf {
                RULE_DROPPED_NEG_INF
            } else {
                0
            },
        rsf: rule.routed_scaling_factor,
        act_stride: stride as u32,
        max_active: max_active as u32,
        route_warps: plan.route_warps as u32,
        gu_rows: tl.gu_rows as u32,
        down_rows: tl.down_rows as u32,
        down_room: tl.down_room as u32,
        gu_split: mma_split(h) as u32,
        down_split: mma_split(i.max(si)) as u32,
        route_block: route_block_tokens() as u32,
        fold_route: fold as u32,
        // Diagnostic of MOEKIT_TRACE builds: route every token twice.
        trace_twice: super::env_knob("MOEKIT_TRACE_TWICE", 0..=1, 0),
        trace: dev.trace_ptr(),
        glu: super::GluParams::of(&p.ffn)?,
        router_bias: super::opt_ptr(&p.ffn.bias.router)?,
        down_bias: super::opt_ptr(&p.ffn.bias.down)?,
        router_x: match &xr {
            std::borrow::Cow::Owned(r) => r.cuda_bytes()?.ptr(),
            std::borrow::Cow::Borrowed(_) => 0,
        },
        weight_in: p.ffn.input.weight_before as u32,
        pad_wi: 0,
        down_scale: super::opt_ptr(&p.ffn.scale.down)?,
        // With the gate/up blocks' own routing, decode_down_mma reads it as
        // soon as it is published, before its wait for gate/up (the two
        // words after the tile tickets; its blocks leave them zero).
        routed: if fold && routed_knob() {
            dev.tile_tickets() + 4 * crate::cuda::TILE_TICKETS as u64
        } else {
            0
        },
    };
    let tn = ctype(OP, x.dtype())?;
    let fr = ftype(&p.router_weight)?;
    let (fg, fd) = (ftype(gw)?, ftype(&p.down)?);
    let g1 = Geometry {
        grid: ((e + 1).div_ceil(ROUTE_ROWS) as u32, 1, 1),
        block: (ROUTE_WARPS as u32 * 32, 1, 1),
        shared: 0,
    };
    let g_tail = Geometry {
        grid: (1, 1, 1),
        block: (ROUTE_WARPS as u32 * 32, 1, 1),
        shared: smem[0] as u32,
    };
    let (g2, g3, kgu, kdn) = if mma {
        let block = (MMA_WARPS as u32 * 32, 1, 1);
        (
            Geometry {
                // With fold_route, one more row: its block x = 0 publishes the routing.
                grid: (
                    i.max(si).div_ceil(mma_rows(h)) as u32,
                    max_active as u32 + 1 + params.fold_route,
                    1,
                ),
                block,
                shared: 0,
            },
            Geometry {
                grid: (
                    h.div_ceil(mma_rows(i.max(si))) as u32,
                    max_active as u32 + 1,
                    1,
                ),
                block,
                shared: 0,
            },
            "decode_gate_up_mma",
            "decode_down_mma",
        )
    } else {
        (
            Geometry {
                grid: (
                    i.max(si).div_ceil(tl.gu_rows) as u32,
                    max_active as u32 + 1,
                    1,
                ),
                block: (WARPS as u32 * 32, 1, 1),
                shared: smem[1] as u32,
            },
            Geometry {
                grid: (h.div_ceil(tl.down_rows) as u32, 1, 1),
                block: (WARPS as u32 * 32, 1, 1),
                shared: smem[2] as u32,
            },
            "decode_gate_up",
            "decode_down",
        )
    };
    // SAFETY (every launch): every pointer above is a live device allocation of
    // the shape the kernel indexes for these (T, H, E, k, I, Is): x/out [T,H],
    // logits [T,E+1], ids/weights [T,k], gate [T], active [E], offsets [E+1],
    // slots [T·k], act [T·k+T, stride], y [T·k+T, H] (tensor cores), tile
    // tickets ⌈H/16⌉ ≤ TILE_TICKETS words (experts_for checks) and the ROUTED_WORDS after
    // them (routed); weights were validated by QuantWeights
    // and weight_src (16-byte aligned). Expert ids are produced by the route
    // step itself (< E); the grids depend on shapes only.
    unsafe {
        // The router matvec starts in stream order: its products begin
        // before any wait (x and the router rows come from the caller).
        launch_ordered(
            &dev,
            &SRC,
            &format!("moekit::decode_route<{fr}, {tn}>"),
            g1,
            params,
            "decode_route",
            Order::Stream,
        )?;
        // Each waits (pdl_wait) before reading what the step before wrote.
        if params.fold_route == 0 {
            launch_ordered(
                &dev,
                &TAIL_SRC,
                &tail_kernel(rule_code(&p.router.kind), team_for(t, e)),
                g_tail,
                params,
                "decode_route_tail",
                Order::Dependent,
            )?;
        }
        launch_ordered(
            &dev,
            &SRC,
            &format!("moekit::{kgu}<{fg}, {tn}>"),
            g2,
            params,
            kgu,
            Order::Dependent,
        )?;
        launch_ordered(
            &dev,
            &SRC,
            &format!("moekit::{kdn}<{fd}, {tn}>"),
            g3,
            params,
            kdn,
            Order::Dependent,
        )?;
    }
    // The routing, as tensors viewing the scratch (kept alive by reference count).
    let view = |i: usize, dt: DType, shape: &[usize]| {
        Tensor::from_cuda_bytes(dt, shape, scratch.slice(offs[i], sizes[i]))
    };
    let routing = crate::ops::route::Routing {
        ids: view(1, DType::U32, &[t, k])?,
        weights: view(2, DType::F32, &[t, k])?,
    };
    Ok((routing, out))
}

#[path = "decode_trace.rs"]
mod trace;
pub(crate) use trace::trace_summary;

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;
