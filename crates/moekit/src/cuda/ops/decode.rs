//! `kernels/decode.cu`: the MoE block for few tokens (decode) in three
//! launches — router + routing + expert sort, gate/up + SwiGLU, down +
//! weighted combine — with no host synchronization (capturable in a graph).
//!
//! [`supports`] says when it applies (the block picks it in
//! `MoeBlock::forward_on`); [`forward`] runs it.

use super::gather_mm::{format_type, group_shift, weight_src};
use super::route::rule_params;
use super::{ctype, launch, Geometry, FLOAT_DTYPES};
use crate::cuda::jit::Source;
use crate::error::{ensure, Result};
use crate::format::{QuantWeights, WeightFormat};
use crate::moe::MoeBlock;
use crate::ops::route::{RouterKind, Scoring};
use crate::tensor::Tensor;
use crate::DType;
use std::collections::BTreeSet;

static SRC: Source = Source {
    name: "decode.cu",
    text: include_str!("../../../kernels/decode.cu"),
};

/// Largest token count the decode path takes (larger batches use the general path).
pub const MAX_TOKENS: usize = 64;
/// Warps per block of every decode kernel (`DEC_WARPS`).
const WARPS: usize = 8;
/// Warps that route in the last block of `decode_route` (`ROUTE_WARPS`).
const ROUTE_WARPS: usize = 4;

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
    ticket: u64,
    active: u64,
    n_active: u64,
    offsets: u64,
    slots: u64,
    act: u64,
    rvec: u64,
    err: u64,
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
    pad: u32,
}
const _: () = assert!(std::mem::size_of::<DecodeParams>() == 480);
// SAFETY: plain-old-data mirrored by the kernel's DecodeParams.
unsafe impl cudarc::driver::DeviceRepr for DecodeParams {}

/// The routing rule as the kernel's `DecodeRule`.
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

/// Dynamic shared memory of `decode_down`: partial sums of every slot per
/// warp, the active experts' metadata and the slot list.
fn down_smem(t: usize, k: usize, max_active: usize) -> usize {
    (WARPS * (t * k + t) + 3 * (max_active + 1) + t * k) * 4
}

/// Shared memory a block may use without opting in.
const SMEM_LIMIT: usize = 48 * 1024;

/// Whether the decode path runs `block` on `x`: a CUDA tensor of 1 to
/// [`MAX_TOKENS`] rows, every routed and shared expert matrix in one format,
/// the shared-expert gate (if any) in the router's format, and T·k small
/// enough for the combine's shared memory.
pub fn supports(block: &MoeBlock, x: &Tensor) -> bool {
    let p = block.parts();
    let t = x.shape().first().copied().unwrap_or(0);
    if !matches!(x.device(), crate::Device::Cuda(_)) || x.rank() != 2 || t == 0 || t > MAX_TOKENS {
        return false;
    }
    let (e, k) = (p.router.n_experts, p.router.top_k);
    if down_smem(t, k, (t * k).min(e)) > SMEM_LIMIT || ROUTE_WARPS * 3 * e * 4 > SMEM_LIMIT {
        return false;
    }
    let Ok(f) = ftype(&p.down) else { return false };
    let mut experts: Vec<&QuantWeights> = p.gate_up.sources().iter().map(|x| x.0).collect();
    if let Some(s) = &p.shared {
        experts.extend(s.gate_up.sources().iter().map(|x| x.0));
        experts.push(&s.down);
        if let Some(g) = &s.gate {
            if ftype(g).ok() != ftype(&p.router_weight).ok() {
                return false;
            }
        }
    }
    experts.iter().all(|w| ftype(w).ok().as_ref() == Some(&f))
}

/// Every instance the decode path can request.
pub fn instances() -> Vec<(&'static Source, String)> {
    let mut fmts = BTreeSet::new();
    for f in WeightFormat::all() {
        let scales: &[DType] = if matches!(f, WeightFormat::Affine(_)) {
            &FLOAT_DTYPES
        } else {
            &[DType::F32]
        };
        for &s in scales {
            if let Ok(ft) = format_type(f, s) {
                fmts.insert(ft);
            }
        }
    }
    let mut v = Vec::new();
    for ft in &fmts {
        for &d in &FLOAT_DTYPES {
            let t = ctype("decode", d).unwrap_or("float");
            for k in ["decode_route", "decode_gate_up", "decode_down"] {
                v.push((&SRC, format!("moekit::{k}<{ft}, {t}>")));
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

/// Runs `block` on `x` (`[T, H]`, T ≤ [`MAX_TOKENS`]) in three launches;
/// call only where [`supports`] holds.
pub fn forward(block: &MoeBlock, x: &Tensor) -> Result<crate::moe::MoeTrace> {
    const OP: &str = "moe_decode";
    ensure(
        supports(block, x),
        OP,
        "block",
        "a block and input the decode path supports",
        "another",
    )?;
    let p = block.parts();
    let xb = x.cuda_bytes()?;
    let dev = xb.device().clone();
    let d = x.device();
    let (t, h) = (x.shape()[0], x.shape()[1]);
    let (e, k) = (p.router.n_experts, p.router.top_k);
    ensure(
        h == block.hidden(),
        OP,
        "x",
        format!("[T, {}]", block.hidden()),
        format!("{:?}", x.shape()),
    )?;
    let i = p.gate_up.intermediate();
    let si = p.shared.as_ref().map_or(0, |s| s.gate_up.intermediate());
    let stride = i.max(si);
    let max_active = (t * k).min(e);
    let out = Tensor::zeros_on(x.dtype(), &[t, h], d)?;
    // One scratch allocation, carved into 16-byte aligned pieces; only the
    // ticket must start at zero (the kernels write everything else first).
    let sizes = [
        (t * (e + 1)) * 4,
        t * k * 4,
        t * k * 4,
        t * 4,
        4,
        e * 4,
        4,
        (e + 1) * 4,
        t * k * 4,
        (t * k + t) * stride * 4,
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
    let (logits, ids_p, weights_p, gate, ticket, active, n_active, offsets, slots, act) = (
        at(0),
        at(1),
        at(2),
        at(3),
        at(4),
        at(5),
        at(6),
        at(7),
        at(8),
        at(9),
    );
    scratch.zero_range(offs[4], 4)?;
    let (vec, n_group, topk_group, norm, rsf) = rule_params(&dev, &p.router.kind)?;
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
    let params = DecodeParams {
        x: xb.ptr(),
        out: out.cuda_bytes()?.ptr(),
        logits,
        ids: ids_p,
        weights: weights_p,
        gate,
        ticket,
        active,
        n_active,
        offsets,
        slots,
        act,
        rvec: vec.as_ref().map_or(0, |v| v.ptr()),
        err: dev.error_word(),
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
        n_group: n_group as u32,
        topk_group: topk_group as u32,
        norm_topk_prob: norm as u32,
        rule: rule_code(&p.router.kind),
        rsf,
        act_stride: stride as u32,
        max_active: max_active as u32,
        pad: 0,
    };
    let tn = ctype(OP, x.dtype())?;
    let fr = ftype(&p.router_weight)?;
    let f = ftype(&p.down)?;
    let blocks = |n: usize| n.div_ceil(WARPS) as u32;
    let route_smem = (ROUTE_WARPS * 3 * e * 4).max((e + 1) * 4) as u32;
    let g1 = Geometry {
        grid: (e as u32 + 1, 1, 1),
        block: (WARPS as u32 * 32, 1, 1),
        shared: route_smem,
    };
    let g2 = Geometry {
        grid: (blocks(stride), max_active as u32 + 1, 1),
        block: (WARPS as u32 * 32, 1, 1),
        shared: 0,
    };
    let g3 = Geometry {
        grid: (blocks(h), 1, 1),
        block: (WARPS as u32 * 32, 1, 1),
        shared: down_smem(t, k, max_active) as u32,
    };
    // SAFETY (all three): every pointer above is a live device allocation of
    // the shape the kernel indexes for these (T, H, E, k, I, Is): x/out [T,H],
    // logits [T,E+1], ids/weights [T,k], gate [T], active [E], offsets [E+1],
    // slots [T·k], act [T·k+T, stride]; weights were validated by QuantWeights
    // and weight_src (16-byte aligned). Expert ids are produced by the route
    // step itself (< E); the grids depend on shapes only.
    unsafe {
        launch(
            &dev,
            &SRC,
            &format!("moekit::decode_route<{fr}, {tn}>"),
            g1,
            params,
            "decode_route",
        )?;
        launch(
            &dev,
            &SRC,
            &format!("moekit::decode_gate_up<{f}, {tn}>"),
            g2,
            params,
            "decode_gate_up",
        )?;
        launch(
            &dev,
            &SRC,
            &format!("moekit::decode_down<{f}, {tn}>"),
            g3,
            params,
            "decode_down",
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
    Ok(crate::moe::MoeTrace { routing, out })
}
