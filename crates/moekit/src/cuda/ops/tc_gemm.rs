//! `kernels/tc_gemm.cu`: the grouped expert GEMM on tensor cores (bf16 or
//! f16 operands, f32 accumulation) for every [`WeightFormat`], plain or fused
//! with SwiGLU: `wgmma` (m64nBMk16, weights on M) for tiles of >= 32 rows on
//! sm_90a, `mma.sync` m16n8k16 otherwise.
//!
//! One kernel template `tc_gemm<F, T, P, BM>`: the format's decoder `F` (the
//! same `kernels/dequant.cuh` types every other path uses, with a fast tile
//! decoder in `kernels/tc_decode.cuh` where packed conversions pay, so a new
//! format plugs in with its decoder), the activation type `T` (f16/bf16), the number
//! of weight sources `P` (1; 2: gate and up with SwiGLU in the epilogue; 3:
//! an f32 weight split into two T halves, summed — see [`split_matmul_into`]) and
//! the tile's row count `BM` ([`TILE_ROWS`], chosen by [`tile_rows`]). A
//! block computes `BM` rows × 128 weight rows; tiles never straddle experts.
//!
//! [`supports`] says whether an operand set fits, and why not; the launch
//! wrappers check again and return that reason as an error.

use super::gather_mm::{
    all_format_types, format_type, group_shift, same_instance, weight_src, WeightSrc,
};
use super::tc_parts::{MAX_PARTS, PARTS};
use super::GluParams;
use super::{check_out, ctype, launch, u32_of, Geometry};
use crate::cuda::jit::Source;
use crate::dtype::DType;
use crate::error::{ensure, invalid, Result};
use crate::format::{QuantWeights, WeightFormat};
use crate::ops::act::GateUp;
use crate::ops::ffn::ExpertFfn;
use crate::tensor::Tensor;
use std::collections::BTreeSet;

pub(crate) static SRC: Source = Source {
    name: "tc_gemm.cu",
    text: include_str!("../../../kernels/tc_gemm.cu"),
};

/// Tile row counts the kernel is instantiated for (`BM`).
pub const TILE_ROWS: [usize; 5] = [16, 32, 64, 128, 256];
/// Weight rows of a tile (`TC_BROWS`): 128 output columns, or 64 with SwiGLU.
const BROWS: usize = 128;
/// K columns a pipeline step (`TC_BK`).
pub(crate) const BK: usize = 64;
/// A-tile stages (`TcStages`): 4 for tiles of < 64 rows, else 3.
fn stages(bm: usize) -> usize {
    if bm >= 64 {
        3
    } else {
        4
    }
}
/// Shared memory of an SM (228 KB; each block also takes 1 KB reserved):
/// `TcGeo::blocks_for`.
const SM_SMEM: usize = 233472;
/// Threads a block (`TC_THREADS`).
const THREADS: u32 = 256;
/// Experts the kernel's tile scan covers (`EPT` × threads).
pub const MAX_EXPERTS: usize = 1024;

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct TcParams {
    x: u64,
    gather: u64,
    offsets: u64,
    out: u64,
    err: u64,
    src: [WeightSrc; 2],
    m: u32,
    n: u32,
    k: u32,
    n_experts: u32,
    x_rows: u32,
    gather_div: u32,
    group_shift: u32,
    p: u32,
    glu: GluParams,
}
const _: () = assert!(std::mem::size_of::<TcParams>() == 184);
// SAFETY: plain-old-data mirrored by the kernel's TcParams (and WeightSrc).
unsafe impl cudarc::driver::DeviceRepr for TcParams {}

/// How the GEMM's rows find their expert and their row of x.
#[derive(Debug, Clone, Copy)]
pub enum TcRows<'a> {
    /// Every row of x uses expert 0 (a plain matmul: router, shared expert).
    Single,
    /// As `Single`, with K split into this many ranges of whole steps
    /// ([`super::tc_parts::k_parts`]): `out` is `f32 [parts · M, N]`, part z's partial
    /// products at rows z·M.., which [`super::tc_parts::sum_parts_into`] adds in part order.
    /// For dense weights of the activation type (copied straight into the
    /// tiles) and P = 1 or 3 (the router).
    Parts(usize),
    /// x is expert-sorted: expert `e` owns rows `offsets[e]..offsets[e+1]`
    /// (`u32 [E + 1]`).
    Sorted(&'a Tensor),
    /// Expert-sorted slots of an [`crate::ops::sort::ExpertSort`]: row `r`
    /// reads `x[sorted[r] / top_k]`, so x is never permuted in memory.
    Gathered {
        /// `u32 [E + 1]`.
        offsets: &'a Tensor,
        /// `u32 [T·k]`: the slot at each sorted position.
        sorted: &'a Tensor,
        /// k (slots per token).
        top_k: usize,
    },
}

/// Storage unit of a format: (weights, bytes) (`F::UNIT_W`, `F::UNIT_BYTES`).
fn unit(format: WeightFormat) -> (usize, usize) {
    match format {
        WeightFormat::Dense(d) => (1, d.size()),
        WeightFormat::Affine(p) => (32, 4 * p.bits as usize),
        WeightFormat::AffineU8 { .. } => (32, 32),
        WeightFormat::Ggml(t) => (t.block_size(), t.type_size()),
        WeightFormat::MlxFp(m) => (32, 4 * m.bits() as usize),
        WeightFormat::Fp8Block { .. } => (32, 32),
    }
}

/// A weight row's raw stage in shared memory (`TcRaw<F, aw>`: scales and
/// biases in words of `aw` bytes): its pitch in bytes and the pipeline steps
/// a stage feeds. None for dense weights of the activation type, which are
/// copied straight into the tiles.
struct RawRow {
    pitch: usize,
    rsteps: usize,
}

fn raw_row(w: &QuantWeights, dtype: DType, aw: usize) -> Option<RawRow> {
    if w.format() == WeightFormat::Dense(dtype) {
        return None;
    }
    let room = |n: usize| (n + 30) & !15;
    let (uw, ub) = unit(w.format());
    let kr = uw.max(BK);
    // Data: its bytes when units are whole 16-byte words, else the words
    // that cover them; scales and biases: 4-byte words rounded up to 8
    // bytes, or the 16-byte words that cover them.
    let data = if ub % 16 == 0 {
        kr / uw * ub
    } else {
        room(kr / uw * ub)
    };
    // Most groups a stage covers (`TcRaw::AUX_ELEMS`: KR / F::SUB, the
    // smallest group: 32, or nvfp4's 16).
    let groups = kr
        / match w.format() {
            WeightFormat::MlxFp(m) => m.group_size(),
            _ => 32,
        };
    let aux = w.scales().map_or(0, |s| {
        let size = s.dtype().size();
        if aw == 4 {
            ((4 - size % 4) % 4 + groups * size + 7) & !7
        } else {
            room(groups * size)
        }
    });
    // An odd number of 16-byte units (bank-conflict-free row reads).
    Some(RawRow {
        pitch: (data + 2 * aux) | 16,
        rsteps: kr / BK,
    })
}

/// Shared memory of an instance (`TcGeo::SMEM`) for activations of `dtype`.
fn smem_bytes(w: &QuantWeights, dtype: DType, bm: usize) -> usize {
    let a_b = stages(bm) * bm * BK * 2;
    let b_tile = BROWS * BK * 2;
    // Dense weights of the activation type go straight to S B stages.
    // Tiles of >= 32 rows may run on wgmma: room to align them to 1024 bytes.
    let slack = if bm >= 32 { 1024 } else { 0 };
    let blocks = |smem: usize| SM_SMEM / (smem + 1024);
    // Raw stages (`TcTiles::lead_for`): one more (raw copies one step ahead
    // of A) unless that fits fewer blocks on an SM.
    let best = |raw: &RawRow| {
        let with = |lead: usize| {
            let rs = 1 + (stages(bm) - 2 + lead).div_ceil(raw.rsteps);
            a_b + 2 * b_tile + rs * BROWS * raw.pitch + slack
        };
        if blocks(with(1)) >= blocks(with(0)) {
            with(1)
        } else {
            with(0)
        }
    };
    let (Some(r4), Some(r16)) = (raw_row(w, dtype, 4), raw_row(w, dtype, 16)) else {
        return a_b + stages(bm) * b_tile + slack;
    };
    // `TcTiles::AUX_WORD`: 16-byte scale/bias words for tiles of >= 128 rows
    // where they fit as many blocks an SM, else 4-byte words.
    if w.scales().is_some() && bm >= 128 && blocks(best(&r16)) >= blocks(best(&r4)) {
        best(&r16)
    } else {
        best(&r4)
    }
}

/// The tile row count for `m` rows spread over up to `n_experts` experts,
/// the output split into `col_blocks` column blocks of a tile each.
///
/// Several experts: the smallest of [`TILE_ROWS`] that holds an expert's
/// expected rows (`per = m / min(E, m)`) with a quarter to spare
/// (`per + per / 4`), so few rows per expert waste little of a tile and many
/// rows get large tiles. The spare quarter: routed rows scatter around
/// `per`, and a tile of exactly `per` rows gives about half of the experts a
/// second, nearly empty tile that decodes all of its weights again. H100,
/// qwen3-30b-a3b, tensor-core path, graph µs, the tile of `per` rows vs the
/// next larger one (`MOEKIT_TC_TILE_STEP=1`,
/// `bench/results/h100/tc/2026-11-24c_tile_step.md`): T = 256 (16 rows an
/// expert) affine4 463 → 414, q4_k 510 → 424, q8_0 644 → 527, bf16 528 →
/// 517; T = 512 (32) affine4 542 → 488, q4_k 574 → 487, q8_0 717 → 571,
/// bf16 540 → 539; T = 1024 (64) affine4 668 → 583, q8_0 807 → 674, q4_k
/// 681 → 709, bf16 571 → 584. 256-row tiles (one block an SM) only past 256
/// rows, where two 128-row tiles (two blocks an SM) measured faster for 3
/// of 4 formats (qwen3-30b-a3b T = 4096, 256 rows an expert, ms 128 vs 256:
/// affine4 1.35 vs 1.43, bf16 1.11 vs 1.43, q8_0 1.57 vs 1.56, q4_k 1.67 vs
/// 1.46; T = 2048, 128 rows an expert, stays at 128: 256 is slower for
/// every format).
///
/// One expert (the router, a shared expert): the smallest tile whose grid
/// stays within [`SINGLE_BLOCKS`] blocks, at most 128 rows. Large tiles there
/// left the GPU idle: the qwen3-30b-a3b router (N = 128, two column blocks)
/// ran 4 blocks at T = 512 and 32 at T = 4096 on 256-row tiles, 90 µs either
/// way under ncu (H100), more than the routed experts' down projection at
/// T = 512; small tiles re-read the weights once per tile from L2, which
/// the block bound keeps in check. It depends on shapes only.
pub fn tile_rows(m: usize, n_experts: usize, col_blocks: usize) -> usize {
    if n_experts <= 1 {
        return TILE_ROWS[..TILE_ROWS.len() - 1]
            .iter()
            .copied()
            .find(|&t| m.div_ceil(t).saturating_mul(col_blocks.max(1)) <= SINGLE_BLOCKS)
            .unwrap_or(REQUIRED_TILE);
    }
    let per = m.div_ceil(n_experts.clamp(1, m.max(1)));
    let largest = TILE_ROWS[TILE_ROWS.len() - 1];
    if per > largest {
        return largest;
    }
    let want = per + per / 4;
    TILE_ROWS
        .into_iter()
        .find(|&t| t >= want && t < largest)
        .unwrap_or(TILE_ROWS[TILE_ROWS.len() - 2])
}

/// Most blocks a single-expert GEMM's tile choice aims for: about two
/// waves of an H100's 132 SMs.
pub const SINGLE_BLOCKS: usize = 264;

/// The largest tile every launch may need (256-row tiles are optional: see
/// [`launch_tile_rows`]).
const REQUIRED_TILE: usize = 128;

/// The tile row count a launch uses on a device with `smem_optin` bytes of
/// shared memory a block: [`tile_rows`], stepped down to [`REQUIRED_TILE`]
/// where a 256-row tile of this format does not fit (an A100 allows 163 KB;
/// q6_K's 256-row tiles take 189 KB). [`supports`] checked the smaller ones.
pub fn launch_tile_rows(
    m: usize,
    n_experts: usize,
    col_blocks: usize,
    w: &QuantWeights,
    dtype: DType,
    smem_optin: usize,
) -> usize {
    let mut bm = tile_rows(m, n_experts, col_blocks);
    if n_experts > 1 {
        bm = step_tile(bm, tile_step());
    }
    if bm > REQUIRED_TILE && smem_bytes(w, dtype, bm) > smem_optin {
        REQUIRED_TILE
    } else {
        bm
    }
}

/// Steps [`tile_rows`]' choice for several experts by `MOEKIT_TC_TILE_STEP`
/// places in [`TILE_ROWS`] (−2..=2, read once; 0 by default). A tuning knob
/// for measuring the tile table: every tile gives the same bits per row.
fn tile_step() -> isize {
    static ENV: std::sync::OnceLock<isize> = std::sync::OnceLock::new();
    *ENV.get_or_init(|| super::env_knob("MOEKIT_TC_TILE_STEP", -2..=2, 0))
}

/// `bm` moved `step` places along [`TILE_ROWS`], clamped to the table.
fn step_tile(bm: usize, step: isize) -> usize {
    let at = TILE_ROWS.iter().position(|&t| t == bm).unwrap_or(0) as isize;
    TILE_ROWS[(at + step).clamp(0, TILE_ROWS.len() as isize - 1) as usize]
}

/// Whether the tensor-core GEMM takes activations of `dtype` against `w`
/// on a device with `smem_optin` bytes of shared memory a block; the reason
/// when it does not.
pub fn supports(
    dtype: DType,
    w: &QuantWeights,
    smem_optin: usize,
) -> std::result::Result<(), String> {
    if !matches!(dtype, DType::F16 | DType::Bf16) {
        return Err(format!(
            "{dtype} activations: the tensor-core GEMM multiplies bf16 or f16 (f32 keeps the exact CUDA-core path)"
        ));
    }
    let k = w.cols();
    if k == 0 || !k.is_multiple_of(8) {
        return Err(format!(
            "K = {k}: the tensor-core GEMM needs K a positive multiple of 8 (16-byte activation rows)"
        ));
    }
    if w.n_experts() > MAX_EXPERTS {
        return Err(format!("{} experts: at most {MAX_EXPERTS}", w.n_experts()));
    }
    let need = smem_bytes(w, dtype, REQUIRED_TILE);
    if need > smem_optin {
        return Err(format!(
            "{} tiles need {need} bytes of shared memory a block; the device allows {smem_optin}",
            w.format()
        ));
    }
    Ok(())
}

/// The kernel name expression.
/// The instance name; `glu`: the P = 2 instance with the general
/// activation and biases (template argument `GLU = true`).
pub(crate) fn kernel_name(
    template: &'static str,
    w: &QuantWeights,
    dtype: DType,
    p: usize,
    bm: usize,
    glu: bool,
) -> Result<String> {
    let scale_dtype = w.scales().map_or(DType::F32, |s| s.dtype());
    Ok(format!(
        "moekit::{template}<{}, {}, {p}, {bm}{}>",
        format_type(w.format(), scale_dtype)?,
        ctype(template, dtype)?,
        if glu { ", true" } else { "" }
    ))
}

/// Instances for the compile check: every format of [`WeightFormat::all`]
/// (group sizes share an instance) × affine scale dtype × {f16, bf16} ×
/// {plain, SwiGLU, SwiGLU's general-activation (GLU) instance, and the hi/lo
/// split for dense f32 and for dense weights of the activation type} ×
/// [`TILE_ROWS`].
pub fn instances() -> Vec<(&'static Source, String)> {
    let mut names = BTreeSet::new();
    for (f, ft) in all_format_types() {
        // P = 3 (hi/lo split) for dense f32 weights, and for the halves of
        // the activation type they are split into (split_matmul_into).
        let split = |t: &str| match f {
            WeightFormat::Dense(DType::F32) => true,
            WeightFormat::Dense(d) => ctype("tc_gemm", d).is_ok_and(|c| c == t),
            _ => false,
        };
        for t in ["__half", "__nv_bfloat16"] {
            let ps: &[usize] = if split(t) { &[1, 2, 3] } else { &[1, 2] };
            for p in ps {
                for bm in TILE_ROWS {
                    names.insert(format!("moekit::tc_gemm<{ft}, {t}, {p}, {bm}>"));
                    if *p == 2 {
                        names.insert(format!("moekit::tc_gemm<{ft}, {t}, 2, {bm}, true>"));
                    }
                }
            }
        }
    }
    for t in ["__half", "__nv_bfloat16"] {
        names.insert(format!("moekit::tc_sum_parts<{t}>"));
    }
    names.into_iter().map(|e| (&SRC, e)).collect()
}

/// Checks a u32 index tensor on `x`'s device.
fn check_index(
    op: &'static str,
    arg: &'static str,
    t: &Tensor,
    x: &Tensor,
    len: usize,
) -> Result<u64> {
    ensure(t.dtype() == DType::U32, op, arg, "dtype u32", t.dtype())?;
    ensure(
        t.shape() == [len],
        op,
        arg,
        format!("shape [{len}]"),
        format!("{:?}", t.shape()),
    )?;
    ensure(
        t.device() == x.device(),
        op,
        arg,
        format!("on {} like x", x.device()),
        t.device(),
    )?;
    Ok(t.cuda_bytes()?.ptr())
}

/// Which kernel runs a tensor-core GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// `tc_gemm`: the weights staged and decoded in shared memory.
    Staged,
    /// `tc_ra` ([`super::tc_ra`], sm_90a): the weights decoded into wgmma's
    /// register A operand; x's columns in the weights' span order
    /// ([`super::tc_ra::span_order`], permuted by
    /// [`super::tc_ra::permute_into`]). `perm_out`: P = 2 writes its output
    /// in that order (the input of a down projection on `tc_ra` whose
    /// weights take it).
    RegA {
        perm_out: Option<super::tc_ra::SpanOrder>,
    },
}

/// Validates, fills the params and launches `tc_gemm<F, T, P, BM>` or
/// `tc_ra<F, T, P, BM>` (`kernel`): one validation for both kernels.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_kernel(
    kernel: Kernel,
    op: &'static str,
    x: &Tensor,
    srcs: [(&QuantWeights, usize); 2],
    p_sources: usize,
    n: usize,
    rows: TcRows<'_>,
    out: &Tensor,
    glu: GluParams,
) -> Result<()> {
    let w = srcs[0].0;
    let xb = x.cuda_bytes()?;
    let dev = xb.device().clone();
    for (s, _) in &srcs[..p_sources.min(2)] {
        ensure(
            s.device() == x.device(),
            op,
            "weights",
            format!("on {} like x", x.device()),
            s.device(),
        )?;
        let ok = match kernel {
            Kernel::Staged => supports(x.dtype(), s, dev.smem_optin()),
            Kernel::RegA { .. } => super::tc_ra::supports(x.dtype(), s, dev.arch()),
        };
        if let Err(why) = ok {
            return Err(invalid(
                op,
                "weights",
                "operands the tensor-core GEMM takes",
                why,
            ));
        }
    }
    ensure(
        x.rank() == 2 && x.shape()[1] == w.cols(),
        op,
        "x",
        format!("[rows, {}] (K of the weights)", w.cols()),
        format!("{:?}", x.shape()),
    )?;
    let x_rows = x.shape()[0];
    let e = w.n_experts();
    let mut parts = 1;
    let (m, gather, div, offsets) = match rows {
        TcRows::Single => {
            crate::ops::gather_mm::check_single(op, e)?;
            (x_rows, 0, 1, 0)
        }
        TcRows::Parts(z) => {
            crate::ops::gather_mm::check_single(op, e)?;
            ensure(
                (1..=MAX_PARTS).contains(&z),
                op,
                "parts",
                format!("1..={MAX_PARTS}"),
                z,
            )?;
            ensure(
                kernel == Kernel::Staged
                    && matches!(p_sources, 1 | 3)
                    && w.format() == WeightFormat::Dense(x.dtype()),
                op,
                "weights",
                "dense weights of the activation type, one source or hi/lo (K parts)",
                format!("{} with P = {p_sources}", w.format()),
            )?;
            parts = z;
            (x_rows, 0, 1, 0)
        }
        TcRows::Sorted(off) => (x_rows, 0, 1, check_index(op, "offsets", off, x, e + 1)?),
        TcRows::Gathered {
            offsets,
            sorted,
            top_k,
        } => {
            ensure(top_k >= 1, op, "top_k", ">= 1", top_k)?;
            let m = x_rows.saturating_mul(top_k);
            (
                m,
                check_index(op, "sorted", sorted, x, m)?,
                top_k,
                check_index(op, "offsets", offsets, x, e + 1)?,
            )
        }
    };
    if matches!(rows, TcRows::Parts(_)) {
        check_out(op, out, DType::F32, &[parts * m, n])?;
    } else {
        check_out(op, out, x.dtype(), &[m, n])?;
    }
    let bn = if p_sources == 1 { BROWS } else { BROWS / 2 };
    let (bm, smem, source, name, flags) = match kernel {
        Kernel::Staged => {
            // K parts count as column blocks in the tile choice (its bound
            // on the grid): T = 4096's router took 32-row tiles on 1024
            // blocks of 8 steps, a third of each block filling its pipeline.
            let bm = launch_tile_rows(m, e, n.div_ceil(bn) * parts, w, x.dtype(), dev.smem_optin());
            let name = kernel_name("tc_gemm", w, x.dtype(), p_sources, bm, glu.general())?;
            (bm, smem_bytes(w, x.dtype(), bm), &SRC, name, 0)
        }
        Kernel::RegA { perm_out } => {
            use super::tc_ra;
            // The kernel holds its activation sources as 16-byte words from x
            // in 32 bits.
            let x_bytes = x.nbytes();
            ensure(
                (x_bytes as u64) < 1u64 << 36,
                op,
                "x",
                "below 64 GiB (tc_ra addresses it in 32-bit 16-byte words)",
                x_bytes,
            )?;
            let bm = tc_ra::tile_rows(m, e, n.div_ceil(bn), w.format());
            for (s, _) in &srcs[..p_sources.min(2)] {
                if !tc_ra::runs_tile(s, bm) {
                    return Err(invalid(
                        op,
                        "weights",
                        format!("a format tc_ra runs at {bm}-row tiles"),
                        format!(
                            "{} (tc_ra runs it up to {}-row tiles: the staged kernel measured faster above)",
                            s.format(),
                            tc_ra::max_tile(s.format())
                        ),
                    ));
                }
            }
            let name = kernel_name("tc_ra", w, x.dtype(), p_sources, bm, glu.general())?;
            let flags = tc_ra::prefetch_flag(bm)
                | tc_ra::width_flag()
                | tc_ra::look_flag()
                | match perm_out {
                    Some(order) if p_sources == 2 => tc_ra::perm_out_flags(order),
                    _ => 0,
                };
            (bm, tc_ra::smem_bytes(bm), &tc_ra::SRC, name, flags)
        }
    };
    let m_tiles = m.div_ceil(bm) + if offsets == 0 { 0 } else { e.min(m) };
    let (gx, gy) = (n.div_ceil(bn), m_tiles);
    ensure(
        gy <= 65535 && gx <= u32::MAX as usize,
        op,
        "x",
        format!("at most {} row tiles", 65535),
        gy,
    )?;
    let params = TcParams {
        x: xb.ptr(),
        gather,
        offsets,
        out: out.cuda_bytes()?.ptr(),
        err: dev.error_word(),
        src: [
            weight_src(op, srcs[0].0, srcs[0].1)?,
            weight_src(op, srcs[1].0, srcs[1].1)?,
        ],
        m: u32_of(op, "rows", m)?,
        n: u32_of(op, "weight rows", n)?,
        k: u32_of(op, "K", w.cols())?,
        n_experts: u32_of(op, "n_experts", e)?,
        x_rows: u32_of(op, "x rows", x_rows)?,
        gather_div: u32_of(op, "top_k", div)?,
        group_shift: group_shift(w.format()),
        p: p_sources as u32 | flags | if parts > 1 { PARTS } else { 0 },
        glu,
    };
    let geo = Geometry {
        grid: (gx as u32, gy as u32, parts as u32),
        block: (THREADS, 1, 1),
        shared: smem as u32,
    };
    // SAFETY: x is a device [x_rows, K] tensor of T (f16/bf16) and out a
    // device [m, n] tensor of T, or with K parts an f32 [parts·m, n] one
    // (block z writes rows z·m .. z·m + m − 1 only) (checked); each source is a validated
    // QuantWeights of format F on this device, 16-byte aligned (weight_src),
    // whose rows row_offset + c for c < n ≤ rows − row_offset the kernel reads
    // for experts e < n_experts only (tiles come from offsets checked in the
    // kernel: rows past m or non-monotone offsets get no tile and are
    // reported); `gather` has m entries and gathered rows ≥ x_rows are
    // skipped and reported; `offsets` has E + 1 entries (checked). The
    // dynamic shared memory is the instance's need (the kernel checks it and
    // reports a mismatch instead of running).
    unsafe { launch(&dev, source, &name, geo, params, op) }
}

/// `out [M, N] = x · W[e(row)]ᵀ` on tensor cores (see [`TcRows`] for M).
pub fn matmul_into(x: &Tensor, w: &QuantWeights, rows: TcRows<'_>, out: &Tensor) -> Result<()> {
    run_kernel(
        Kernel::Staged,
        "tc_gemm",
        x,
        [(w, 0), (w, 0)],
        1,
        w.rows(),
        rows,
        out,
        GluParams::default(),
    )
}

/// [`matmul_into`] for dense f32 weights with each weight split into
/// `hi = T(w)` and `lo = T(w − hi)` and both products summed: about 16
/// significant bits of each weight instead of T's 8 or 11, at twice the MMA
/// work (the router, whose top-k choice should not move).
///
/// One expert's weights are split once a call into halves of T
/// ([`super::split::split_hi_lo`]) that the GEMM copies straight into its
/// tiles, as dense weights of T; the halves are the values the kernel's
/// decoder would make of the f32 weights, so the results are the same bits
/// (ncu, H100, qwen3-30b-a3b router at T = 512: 73 µs decoding the f32
/// weights on 64 blocks of one block an SM). Several experts decode the f32
/// weights in the GEMM.
pub fn split_matmul_into(
    x: &Tensor,
    w: &QuantWeights,
    rows: TcRows<'_>,
    out: &Tensor,
) -> Result<()> {
    const OP: &str = "tc_split_gemm";
    ensure(
        w.format() == WeightFormat::Dense(DType::F32),
        OP,
        "w",
        "dense f32 weights",
        w.format(),
    )?;
    let (n, k) = (w.rows(), w.cols());
    if w.n_experts() == 1 && matches!(x.dtype(), DType::F16 | DType::Bf16) {
        let halves = super::split::split_hi_lo(w.data(), x.dtype())?.reshape(&[1, 2 * n, k])?;
        let hl = QuantWeights::new(
            WeightFormat::Dense(x.dtype()),
            1,
            2 * n,
            k,
            halves,
            None,
            None,
        )?;
        let glu = GluParams::default();
        return run_kernel(
            Kernel::Staged,
            OP,
            x,
            [(&hl, 0), (&hl, n)],
            3,
            n,
            rows,
            out,
            glu,
        );
    }
    run_kernel(
        Kernel::Staged,
        OP,
        x,
        [(w, 0), (w, 0)],
        3,
        n,
        rows,
        out,
        GluParams::default(),
    )
}

/// Fused `silu(x·Gᵀ) · (x·Uᵀ)` on tensor cores into `out [M, I]`; gate and
/// up must share a format and scale dtype (always true of fused weights).
pub fn swiglu_into(x: &Tensor, w: &GateUp, rows: TcRows<'_>, out: &Tensor) -> Result<()> {
    glu_into(x, w, rows, &ExpertFfn::default(), out)
}

/// [`swiglu_into`] with `ffn`'s activation and gate/up biases (f32 `[E, I]`
/// on x's device, validated by the caller).
pub fn glu_into(
    x: &Tensor,
    w: &GateUp,
    rows: TcRows<'_>,
    ffn: &ExpertFfn,
    out: &Tensor,
) -> Result<()> {
    run_swiglu(Kernel::Staged, "tc_swiglu", x, w, rows, ffn, out)
}

/// The SwiGLU GEMM on `kernel`: gate and up as the two weight sources of
/// one instance (separate weights of one format, or the halves of fused
/// ones).
pub(crate) fn run_swiglu(
    kernel: Kernel,
    op: &'static str,
    x: &Tensor,
    w: &GateUp,
    rows: TcRows<'_>,
    ffn: &ExpertFfn,
    out: &Tensor,
) -> Result<()> {
    let i = w.intermediate();
    let srcs = match w {
        GateUp::Separate { gate, up } => {
            if let Some(why) = mixed(gate, up) {
                return Err(invalid(op, "gate_up", "gate and up of one format", why));
            }
            [(gate, 0), (up, 0)]
        }
        GateUp::Fused(wf) => [(wf, 0), (wf, i)],
    };
    run_kernel(kernel, op, x, srcs, 2, i, rows, out, GluParams::of(ffn)?)
}

/// Whether gate and up share one instance (always true of fused weights).
pub(crate) fn one_instance(w: &GateUp) -> bool {
    match w {
        GateUp::Separate { gate, up } => mixed(gate, up).is_none(),
        GateUp::Fused(_) => true,
    }
}

/// Why separate gate and up weights cannot share one instance, if they cannot.
pub fn mixed(gate: &QuantWeights, up: &QuantWeights) -> Option<String> {
    (!same_instance(gate, up)).then(|| {
        format!(
            "gate {} and up {} differ in format or scale dtype",
            gate.format(),
            up.format()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tile_rows_follow_rows_per_expert() {
        // qwen3-30b-a3b (E = 128, k = 8): T = 1 → 8 rows over 8 experts.
        assert_eq!(tile_rows(8, 128, 12), 16);
        assert_eq!(tile_rows(64 * 8, 128, 12), 16);
        assert_eq!(tile_rows(128 * 8, 128, 12), 16);
        // 16, 32 and 64 rows an expert: the next tile up (a quarter spare).
        assert_eq!(tile_rows(256 * 8, 128, 12), 32);
        assert_eq!(tile_rows(512 * 8, 128, 12), 64);
        assert_eq!(tile_rows(1024 * 8, 128, 12), 128);
        assert_eq!(tile_rows(2048 * 8, 128, 12), 128);
        // qwen3-next (E = 512, k = 10): 10 and 80 rows an expert.
        assert_eq!(tile_rows(512 * 10, 512, 4), 16);
        assert_eq!(tile_rows(4096 * 10, 512, 4), 128);
        assert_eq!(tile_rows(4096 * 8, 128, 12), 128);
        assert_eq!(tile_rows(4097 * 8, 128, 1), 256);
        assert_eq!(tile_rows(0, 128, 12), 16);
        // A single expert (router, shared expert): the smallest tile whose
        // grid stays within SINGLE_BLOCKS, at most 128 rows.
        // qwen3-30b-a3b router (two column blocks): T = 512 and 4096.
        assert_eq!(tile_rows(512, 1, 2), 16);
        assert_eq!(tile_rows(4096, 1, 2), 32);
        assert_eq!(tile_rows(1, 1, 2), 16);
        assert_eq!(tile_rows(300, 1, 44), 64);
        assert_eq!(tile_rows(100_000, 1, 2), 128);
        assert_eq!(tile_rows(100_000, 1, 0), 128);
    }

    #[test]
    fn tile_steps_stay_in_the_table() {
        assert_eq!(step_tile(32, 1), 64);
        assert_eq!(step_tile(32, -1), 16);
        assert_eq!(step_tile(16, -2), 16);
        assert_eq!(step_tile(128, 2), 256);
        assert_eq!(step_tile(64, 0), 64);
    }

    #[test]
    fn tiles_step_down_where_256_rows_do_not_fit() {
        let a100 = 163 * 1024;
        let q6 = WeightFormat::Ggml(crate::format::GgmlType::Q6_K);
        let w =
            crate::format::random::random_weights(q6, 1, 8, 256, DType::F16, 1, &|| {}).unwrap();
        let m = 4097 * 8;
        assert_eq!(tile_rows(m, 128, 1), 256);
        assert!(smem_bytes(&w, DType::Bf16, 256) > a100);
        assert_eq!(launch_tile_rows(m, 128, 1, &w, DType::Bf16, a100), 128);
        assert_eq!(
            launch_tile_rows(m, 128, 1, &w, DType::Bf16, 227 * 1024),
            256
        );
        assert!(supports(DType::Bf16, &w, a100).is_ok());
    }

    #[test]
    fn raw_copies_lead_only_where_occupancy_holds() {
        // affine4-g64 with f16 scales: below 128 rows, raw rows of 48 bytes
        // (32 of codes, 8 of scales, 8 of biases), 6 KB a stage.
        let f = WeightFormat::Affine(crate::format::AffineParams {
            bits: 4,
            group_size: 64,
        });
        let w = crate::format::random::random_weights(f, 1, 8, 256, DType::F16, 1, &|| {}).unwrap();
        // 32 rows: 4 raw stages (one step ahead), three blocks an SM.
        assert_eq!(
            smem_bytes(&w, DType::Bf16, 32),
            16384 + 32768 + 4 * 6144 + 1024
        );
        // 128 rows: scales and biases in 16-byte words (112-byte rows, 14 KB a
        // stage), where 3 raw stages would leave one block an SM; 2 keep two.
        assert_eq!(
            smem_bytes(&w, DType::Bf16, 128),
            49152 + 32768 + 2 * 14336 + 1024
        );
        // affine8-g64 at 128 rows: 16-byte words (144-byte rows) would leave
        // one block an SM, 4-byte ones (80-byte rows) keep two.
        let f8 = WeightFormat::Affine(crate::format::AffineParams {
            bits: 8,
            group_size: 64,
        });
        let w8 =
            crate::format::random::random_weights(f8, 1, 8, 256, DType::F16, 1, &|| {}).unwrap();
        assert_eq!(
            smem_bytes(&w8, DType::Bf16, 128),
            49152 + 32768 + 3 * 128 * 80 + 1024
        );
        // Dense f32 rows of 256 bytes (272 with the odd unit): 128 rows hold
        // one block an SM either way, so 3 raw stages, not 2.
        let f = WeightFormat::Dense(DType::F32);
        let w = crate::format::random::random_weights(f, 1, 8, 256, DType::F16, 1, &|| {}).unwrap();
        assert_eq!(
            smem_bytes(&w, DType::Bf16, 128),
            49152 + 32768 + 3 * 128 * 272 + 1024
        );
    }

    #[test]
    fn shared_memory_of_the_largest_instances_fits_sm90() {
        // Largest raw stages: q6_K (210-byte blocks) and dense f32 rows.
        let fmts = [
            WeightFormat::Ggml(crate::format::GgmlType::Q6_K),
            WeightFormat::Dense(DType::F32),
        ];
        for f in fmts {
            let w =
                crate::format::random::random_weights(f, 1, 8, 256, DType::F16, 1, &|| {}).unwrap();
            let s = smem_bytes(&w, DType::Bf16, TILE_ROWS[TILE_ROWS.len() - 1]);
            assert!(s <= 227 * 1024, "{f}: {s}");
        }
    }
}
