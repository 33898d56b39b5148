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
//! wrappers check again and return that reason as an error. The geometry
//! (shared memory of an instance, the tile choice) is in
//! [`super::tc_geo`]; the router's K in parts in [`super::tc_parts`].

use super::gather_mm::{
    all_format_types, format_type, group_shift, same_instance, weight_src, WeightSrc,
};
pub use super::tc_geo::{launch_tile_rows, tile_rows, TILE_ROWS};
use super::tc_geo::{smem_bytes, BROWS, REQUIRED_TILE};
use super::tc_parts::{MAX_PARTS, PARTS};
use super::GluParams;
use super::{check_out, ctype, launch, u32_of, Geometry};
use crate::cuda::jit::Source;
use crate::cuda::Arch;
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

/// Threads a block (`TC_THREADS`).
const THREADS: u32 = 256;

/// `TcParams::p` flag (`TC_BY_ROW`, tc_common.cuh): the grouped GEMMs walk
/// their (row tile, column block) list a row tile's column blocks at a time
/// — the order before b6660b6 (2026-11-30) — instead of an expert's row
/// tiles at a time for each column block (`expert_order`), which reads a
/// column block's weights from DRAM once for all of the expert's rows.
const BY_ROW: u32 = 1 << 17;

/// A test's choice of the tile order: [`force_by_row`].
static BY_ROW_FORCED: super::Forced = super::Forced::new();

/// Forces the grouped GEMMs' tile order (`Some(true)`: a row tile's column
/// blocks side by side; `None`: the knob decides), so that a test can
/// compare both orders in one process.
pub fn force_by_row(by_row: Option<bool>) {
    BY_ROW_FORCED.set(by_row);
}

/// [`BY_ROW`] where `MOEKIT_TC_ORDER=0` (read once; A/B of the tile order)
/// or a test forces it, else 0. Every order gives the same bits: it only
/// changes which tiles run together.
fn order_flag() -> u32 {
    if let Some(by_row) = BY_ROW_FORCED.get() {
        return if by_row { BY_ROW } else { 0 };
    }
    static ENV: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    if *ENV.get_or_init(|| super::env_knob("MOEKIT_TC_ORDER", 0..=1, 1)) == 0 {
        BY_ROW
    } else {
        0
    }
}

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

/// How the MoE block uses one of the sm_90a schedules ([`super::tc_ra`],
/// [`super::tc_tma`]): never, where its table says, or at every tile it
/// can run (an A/B knob for measuring the table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Use {
    Never,
    Table,
    Everywhere,
}

impl Use {
    /// From environment variable `var`: `0` never, `all` everywhere, else
    /// (unset or anything else) the table.
    pub(crate) fn from_env(var: &str) -> Use {
        match std::env::var(var).as_deref() {
            Ok("0") => Use::Never,
            Ok("all") => Use::Everywhere,
            _ => Use::Table,
        }
    }
}

/// Whether a device of `arch` runs the sm_90a schedules of this GEMM
/// ([`super::tc_ra`], [`super::tc_tma`]: wgmma); the reason, naming `kernel`,
/// when not.
pub(crate) fn sm90_arch(kernel: &str, arch: Arch) -> std::result::Result<(), String> {
    if arch.major != 9 {
        return Err(format!(
            "sm_{}{}: {kernel} needs sm_90a (wgmma)",
            arch.major, arch.minor
        ));
    }
    Ok(())
}

/// The checks the sm_90a schedules share: the architecture, bf16 or f16
/// activations, K a positive multiple of `k_step`, at most [`MAX_EXPERTS`]
/// experts, a decoder type for the format; the reason, naming `kernel`,
/// when one fails.
pub(crate) fn sm90_operands(
    kernel: &str,
    dtype: DType,
    w: &QuantWeights,
    arch: Arch,
    k_step: usize,
) -> std::result::Result<(), String> {
    sm90_arch(kernel, arch)?;
    if !matches!(dtype, DType::F16 | DType::Bf16) {
        return Err(format!("{dtype} activations: it multiplies bf16 or f16"));
    }
    let k = w.cols();
    if k == 0 || !k.is_multiple_of(k_step) {
        return Err(format!(
            "K = {k}: {kernel} needs K a positive multiple of {k_step}"
        ));
    }
    if w.n_experts() > MAX_EXPERTS {
        return Err(format!("{} experts: at most {MAX_EXPERTS}", w.n_experts()));
    }
    let scale_dtype = w.scales().map_or(DType::F32, |s| s.dtype());
    format_type(w.format(), scale_dtype).map_err(|e| e.to_string())?;
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
    /// `tc_tma` ([`super::tc_tma`], sm_90a): dense weights of the
    /// activation type by TMA, warp-specialized, 256 weight rows a tile.
    Tma,
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
            Kernel::Tma => super::tc_tma::supports(x.dtype(), s, dev.arch()),
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
    let bn = match kernel {
        Kernel::Tma => super::tc_tma::WEIGHT_ROWS,
        _ => BROWS,
    } / if p_sources == 1 { 1 } else { 2 };
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
        Kernel::Tma => {
            let (bm, smem, name) = super::tc_tma::launch_shape(
                op,
                x,
                w,
                p_sources,
                glu.general(),
                m,
                e,
                n.div_ceil(bn),
            )?;
            (bm, smem, &super::tc_tma::SRC, name, 0)
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
        p: p_sources as u32 | flags | order_flag() | if parts > 1 { PARTS } else { 0 },
        glu,
    };
    if kernel == Kernel::Tma {
        // Tensor maps for weights copied by TMA; a decoding instance reads
        // none (zeros).
        let maps = if super::tc_tma::by_tma(x.dtype(), w) {
            let m0 = super::tc_tma::tensor_map(op, srcs[0].0)?;
            let m1 = if p_sources == 2 {
                super::tc_tma::tensor_map(op, srcs[1].0)?
            } else {
                m0
            };
            [m0, m1]
        } else {
            [super::tc_tma::TmaMap::zeroed(); 2]
        };
        let tp = super::tc_tma::TmaParams {
            map: maps,
            tc: params,
        };
        let geo = super::tc_tma::geometry(gx as u32, gy as u32, smem, dev.sm_count());
        // SAFETY: as below for the GEMM's params (the same checks); the
        // tensor maps (dense weights of x's type only: `by_tma`) describe
        // each source's whole data tensor ([E·rows, K] of T), which TMA
        // reads only inside (rows past it are filled with zeros, not read);
        // decoded weights are read as the staged kernel reads them (rows
        // row_offset + c, c < n, of experts below n_experts).
        return unsafe { launch(&dev, source, &name, geo, tp, op) };
    }
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
    if w.n_experts() == 1 && matches!(x.dtype(), DType::F16 | DType::Bf16) {
        return halves_matmul_into(x, &split_halves(w, x.dtype())?, rows, out);
    }
    run_kernel(
        Kernel::Staged,
        OP,
        x,
        [(w, 0), (w, 0)],
        3,
        w.rows(),
        rows,
        out,
        GluParams::default(),
    )
}

/// One expert's dense f32 weights `[1, N, K]` as the halves
/// [`split_matmul_into`] multiplies: `[1, 2N, K]` of `dtype` (f16 or bf16),
/// rows `hi` then rows `lo`. A caller that multiplies the same weights
/// again keeps them ([`halves_matmul_into`]; the MoE block's router).
pub fn split_halves(w: &QuantWeights, dtype: DType) -> Result<QuantWeights> {
    const OP: &str = "tc_split_gemm";
    ensure(
        w.format() == WeightFormat::Dense(DType::F32) && w.n_experts() == 1,
        OP,
        "w",
        "one expert of dense f32 weights",
        format!("{} experts of {}", w.n_experts(), w.format()),
    )?;
    let (n, k) = (w.rows(), w.cols());
    let halves = super::split::split_hi_lo(w.data(), dtype)?.reshape(&[1, 2 * n, k])?;
    QuantWeights::new(WeightFormat::Dense(dtype), 1, 2 * n, k, halves, None, None)
}

/// [`split_matmul_into`] with the halves made by [`split_halves`]: the same
/// bits.
pub fn halves_matmul_into(
    x: &Tensor,
    hl: &QuantWeights,
    rows: TcRows<'_>,
    out: &Tensor,
) -> Result<()> {
    const OP: &str = "tc_split_gemm";
    ensure(
        hl.format() == WeightFormat::Dense(x.dtype())
            && hl.n_experts() == 1
            && hl.rows().is_multiple_of(2),
        OP,
        "halves",
        format!("split halves of {} ([1, 2N, K])", x.dtype()),
        format!(
            "{} experts of {} with {} rows",
            hl.n_experts(),
            hl.format(),
            hl.rows()
        ),
    )?;
    let n = hl.rows() / 2;
    run_kernel(
        Kernel::Staged,
        OP,
        x,
        [(hl, 0), (hl, n)],
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
