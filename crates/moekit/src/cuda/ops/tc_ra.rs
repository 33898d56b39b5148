//! `kernels/tc_ra.cu`: the grouped expert GEMM of [`super::tc_gemm`] (same
//! parameters, rows, tiles and outputs) on sm_90a with the weights decoded
//! from global memory straight into `wgmma`'s register A operand, so they
//! never pass through shared memory; only the activations are staged.
//!
//! The MMA's k order is a fixed permutation of each 128-column span (lane c
//! of a quad decodes 32 consecutive columns, `kernels/decode_mma.cuh`), one
//! of three by the weight format ([`span_order`]), so the activations must
//! come in that order: [`permute_into`] permutes x once (a copy of
//! `[T, H]`), and the gate/up GEMM writes its SwiGLU output permuted in the
//! down weights' order ([`Kernel::RegA`]'s `perm_out`) for the down GEMM
//! that reads it.
//! Both operands see the same permutation: every output is the plain dot
//! product, summed in an order fixed by K (deterministic, batch-invariant).
//!
//! [`supports`] says whether an operand set fits and why not;
//! `crate::cuda::ops::tc_moe::expert_kernels` is the one place the MoE block
//! picks this kernel or the staged one.

use super::gather_mm::all_format_types;
use super::tc_gemm::{self, Kernel, TcRows};
use super::{check_out, ctype, launch, u32_of, Geometry};
use crate::cuda::jit::Source;
use crate::cuda::Arch;
use crate::dtype::DType;
use crate::error::{ensure, invalid, Result};
use crate::format::{QuantWeights, WeightFormat};
use crate::ops::act::GateUp;
use crate::tensor::Tensor;
use std::collections::BTreeSet;

pub(crate) static SRC: Source = Source {
    name: "tc_ra.cu",
    text: include_str!("../../../kernels/tc_ra.cu"),
};

/// Columns of a span (`RA_SPAN`): K must be a multiple of it.
pub const SPAN: usize = 128;
/// Tile row counts the kernel is instantiated for (`BM`: wgmma's N; a
/// 256-row instance runs its tiles at N = 256, 128 or 32 by their rows, a
/// 64- or 128-row one at BM, BM / 2 or BM / 4: `RaWidths`).
pub const TILE_ROWS: [usize; 5] = [16, 32, 64, 128, 256];
/// Activation stages in shared memory (`RaGeo::STAGES`): 4, or 3 for
/// 256-row tiles.
fn stages(bm: usize) -> usize {
    if bm >= 256 {
        3
    } else {
        4
    }
}
/// `TcParams::p` flag (`RA_PERM_OUT`): P = 2 writes its output permuted.
const PERM_OUT: u32 = 256;
/// `TcParams::p` flag (`RA_PREFETCH`): see [`prefetch_flag`].
const PREFETCH: u32 = 512;
/// `TcParams::p` flag (`RA_PREFETCH`) for a `bm`-row tile: the block first
/// asks L2 for all of its weight rows (one bulk prefetch a range). Set for
/// 128-row tiles only, where it measured faster (H200, qwen3-30b-a3b
/// T = 4096, graph: affine4 1164 → 1108 µs, q4_k 1178 → 1135); with
/// smaller tiles it was slower (affine4 T = 512 291 → 306 µs, Mixtral
/// T = 64 480 → 536). `MOEKIT_TC_PF=0` never sets it (read once; A/B).
pub(crate) fn prefetch_flag(bm: usize) -> u32 {
    static ENV: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let on = *ENV.get_or_init(|| super::env_knob("MOEKIT_TC_PF", 0..=1, 1));
    if on == 1 && bm == 128 {
        PREFETCH
    } else {
        0
    }
}

/// `TcParams::p` flag (`RA_FULL_N`): every tile runs at wgmma N = its
/// instance's rows, not the narrower N its rows fit (`RaWidths`).
const FULL_N: u32 = 4096;

/// [`FULL_N`] where `MOEKIT_TC_RA_NARROW=0` (read once; A/B of the narrow
/// widths), else 0.
pub(crate) fn width_flag() -> u32 {
    static ENV: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    if *ENV.get_or_init(|| super::env_knob("MOEKIT_TC_RA_NARROW", 0..=1, 1)) == 0 {
        FULL_N
    } else {
        0
    }
}

/// `TcParams::p` bits 13..15 (`RA_LOOK`): spans beyond its two spans of
/// register loads at which a lane asks L2 for its weight slices
/// (`prefetch.global.L2`), 0 for none: `MOEKIT_TC_LOOK` (0..=7, read once).
pub(crate) fn look_flag() -> u32 {
    static ENV: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *ENV.get_or_init(|| super::env_knob("MOEKIT_TC_LOOK", 0..=7, 0)) << 13
}

/// `TcParams::p` bits (`RA_OUT_ORDER`): with [`PERM_OUT`], the output's
/// [`SpanOrder`] code at bits 10 and 11.
const OUT_ORDER_SHIFT: u32 = 10;

/// The `TcParams::p` flags of an output permuted in `order`.
pub(crate) fn perm_out_flags(order: SpanOrder) -> u32 {
    PERM_OUT | order.code() << OUT_ORDER_SHIFT
}

/// The order of a span's 128 columns in the MMA's k sequence, which x (and
/// a permuted SwiGLU output) must come in for a weight format (`SpanOrder`
/// in `kernels/decode_mma.cuh`; [`span_order`] says which). Lane c of a
/// quad decodes columns 32c .. 32c + 31 as 4 units of 8 columns, each as 4
/// pairs; MMA step 2u + (i >> 1) takes pair i of unit u as k
/// `2c + 8(i & 1)` (+ 1 for the pair's second weight). The orders differ in
/// which columns a decoder pairs: the raw orders are those its codes unpack
/// in, so it pairs them without byte permutations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanOrder {
    /// Adjacent columns (2i, 2i + 1) of a unit: every decoder.
    Pairs,
    /// Columns 4 apart (i, i + 4): MLX 4-bit codes (4 nibbles a word, 16
    /// bits apart).
    Nibbles,
    /// Columns 2 apart ((i & 1) + 4(i >> 1), + 2): Q4_K's codes (the
    /// nibbles of bytes 0 and 2 of a word).
    Alternate,
}

impl SpanOrder {
    /// Every order.
    pub const ALL: [SpanOrder; 3] = [SpanOrder::Pairs, SpanOrder::Nibbles, SpanOrder::Alternate];

    /// The unit column of pair `i`'s first weight and how far its second
    /// is (`span_first`, `span_apart`).
    pub const fn pair(self, i: usize) -> (usize, usize) {
        match self {
            SpanOrder::Pairs => (2 * i, 1),
            SpanOrder::Nibbles => (i, 4),
            SpanOrder::Alternate => ((i & 1) + 4 * (i >> 1), 2),
        }
    }

    /// Position of column `p` (0..128) of a span in the MMA's k order
    /// (`ra_logical`).
    pub const fn logical(self, p: usize) -> usize {
        let (c, u, r) = (p >> 5, (p >> 3) & 3, p & 7);
        let (i, h) = match self {
            SpanOrder::Pairs => (r >> 1, r & 1),
            SpanOrder::Nibbles => (r & 3, r >> 2),
            SpanOrder::Alternate => ((r & 1) | ((r >> 2) << 1), (r >> 1) & 1),
        };
        ((2 * u + (i >> 1)) << 4) | ((i & 1) << 3) | (c << 1) | h
    }

    const fn code(self) -> u32 {
        match self {
            SpanOrder::Pairs => 0,
            SpanOrder::Nibbles => 1,
            SpanOrder::Alternate => 2,
        }
    }
}

/// The span order `tc_ra` reads x in for weights of `format` (`SpanOf`):
/// the order its decoder's codes unpack in where it has a raw unit (MLX
/// 4-bit: [`SpanOrder::Nibbles`], Q4_K: [`SpanOrder::Alternate`]; 4 PRMTs
/// fewer a unit of 8 weights), else [`SpanOrder::Pairs`].
pub fn span_order(format: WeightFormat) -> SpanOrder {
    match format {
        WeightFormat::Affine(a) if a.bits == 4 => SpanOrder::Nibbles,
        WeightFormat::Ggml(crate::format::GgmlType::Q4_K) => SpanOrder::Alternate,
        _ => SpanOrder::Pairs,
    }
}

/// Shared memory of an instance (`RaGeo::SMEM`): the activation stages (BM
/// rows × 128 columns of 2 bytes) and 1 KB to align them to the swizzle atom.
pub(crate) fn smem_bytes(bm: usize) -> usize {
    stages(bm) * bm * SPAN * 2 + 1024
}

/// The tile row count for weights of `format`: [`tc_gemm::tile_rows`]'
/// choice up to 128 rows; 256 where experts average over 192 rows and
/// [`max_tile`] runs the format at 256 (its last tile of an expert runs at
/// the N its rows need: a few rows past 256 cost 32 MMA columns, not 256).
/// `MOEKIT_TC_RA_TILE` (read once) caps it at the largest of [`TILE_ROWS`]
/// not above it (A/B runs).
pub fn tile_rows(m: usize, n_experts: usize, col_blocks: usize, format: WeightFormat) -> usize {
    static CAP: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cap = *CAP.get_or_init(|| {
        let v = super::env_knob("MOEKIT_TC_RA_TILE", 16..=256, 256);
        TILE_ROWS
            .into_iter()
            .filter(|&r| r <= v)
            .max()
            .unwrap_or(TILE_ROWS[0])
    });
    let t = tc_gemm::tile_rows(m, n_experts, col_blocks).min(128);
    let per = m.div_ceil(n_experts.clamp(1, m.max(1)));
    let t = if n_experts > 1 && t == 128 && per > 192 && max_tile(format) >= 256 {
        256
    } else {
        t
    };
    t.min(cap)
}

/// Whether `tc_ra` runs on a device of `arch` (sm_90a: wgmma); the reason
/// when not.
pub fn supports_arch(arch: Arch) -> std::result::Result<(), String> {
    tc_gemm::sm90_arch(KERNEL, arch)
}

/// The kernel as its refusals name it.
const KERNEL: &str = "the register-operand GEMM";

/// Whether `tc_ra` takes activations of `dtype` against `w` on a device of
/// `arch`; the reason when it does not.
pub fn supports(dtype: DType, w: &QuantWeights, arch: Arch) -> std::result::Result<(), String> {
    tc_gemm::sm90_operands(KERNEL, dtype, w, arch, SPAN)
}

/// The largest tile (rows) at which `tc_ra` runs a format, 0 for none:
/// where it measured faster than the staged kernel, both kernels in one
/// device call (qwen3-30b-a3b, graph replay; tiles of 16 rows at T = 16 and
/// 64, 64 rows at T = 512, 128 at T = 4096). tc_ra / staged time, H200
/// (`bench/results/h200/tc_ra_2026-11-28/`), T = 16 / 64 / 512 / 4096:
///
/// | format | ratios | max tile |
/// |---|---|---|
/// | affine4-g64 | 0.72 0.72 0.76 0.98 | 128 |
/// | affine8-g64 | 0.67 0.66 0.79 0.96 | 128 |
/// | iq4_xs | 0.72 0.72 0.77 0.77 | 128 |
/// | q4_k | 0.76 0.74 0.88 0.80 | 128 |
/// | affine2-g64 | 0.91 0.89 0.94 1.27 | 64 |
/// | affine3-g64 | 0.91 0.90 0.99 1.31 | 64 |
/// | mxfp4 | 0.81 0.81 0.84 1.03 | 64 |
/// | nvfp4 (GGUF; 2026-11-29_s21/run4, T = 16 on the decode path) | – 0.89 0.89 1.21 | 64 |
/// | q4_0 | 0.85 0.85 0.86 1.11 | 64 |
/// | fp8-b128 | 0.92 0.91 1.01 1.30 | 16 |
/// | q8_0 | 0.96 0.96 1.16 1.17 | 16 |
/// | q5_k | 1.00 1.00 1.02 1.10 | 0 |
/// | q6_k | 1.15 1.14 0.98 1.21 | 0 |
/// | q3_k | 1.15 1.15 1.19 1.16 | 0 |
///
/// 256-row tiles (where experts average over 192 rows, [`tile_rows`]) for
/// the formats at 128 above: H200 graph ms, qwen3-30b-a3b T = 4096, 128 →
/// 256-row tiles, same call (`bench/results/h200/2026-11-29_t256/`):
/// affine4 1.078 → 0.930, affine8 1.220 → 1.020, iq4_xs 1.389 → 1.132,
/// q4_k 1.098 → 1.068; and against the staged kernel's 256-row tiles
/// (`tc_moe::expert_kernels`): mixtral-8x7b affine4 7.36 → 5.92, q4_k 7.22
/// → 6.47, deepseek-v2-lite affine4 1.82 → 1.59.
///
/// Group sizes share their format's row (one instance). Dense weights stay
/// staged (copied straight into the tiles: bf16 on H100 T = 512 / 4096
/// 0.52 / 1.05 ms staged, 0.65 / 1.57 on tc_ra); formats not measured yet
/// stay staged. Only these tiles have instances.
pub fn max_tile(format: WeightFormat) -> usize {
    use crate::format::GgmlType as G;
    match format {
        WeightFormat::Affine(p) => match p.bits {
            4 | 8 => 256,
            2 | 3 => 64,
            _ => 0,
        },
        WeightFormat::Ggml(G::IQ4_XS | G::Q4_K) => 256,
        WeightFormat::Ggml(G::MXFP4 | G::NVFP4 | G::Q4_0) => 64,
        WeightFormat::Ggml(G::Q8_0) | WeightFormat::Fp8Block { .. } => 16,
        _ => 0,
    }
}

pub(crate) use super::tc_gemm::Use;

/// How the MoE block uses `tc_ra`, from `MOEKIT_TC_RA` (read once): `0`
/// never, `all` at every tile it can run (to measure [`max_tile`]'s
/// table), else where [`max_tile`] says.
pub(crate) fn use_mode() -> Use {
    static ENV: std::sync::OnceLock<Use> = std::sync::OnceLock::new();
    *ENV.get_or_init(|| Use::from_env("MOEKIT_TC_RA"))
}

/// Whether `tc_ra` runs `w` at tiles of `bm` rows ([`max_tile`]; every
/// tile with `MOEKIT_TC_RA=all`).
pub fn runs_tile(w: &QuantWeights, bm: usize) -> bool {
    bm <= max_tile(w.format()) || use_mode() == Use::Everywhere
}

/// Instances for the compile check: every decoder type × {f16, bf16} ×
/// {plain, SwiGLU} × the [`TILE_ROWS`] up to its [`max_tile`], and the
/// permutation kernel.
pub fn instances() -> Vec<(&'static Source, String)> {
    let mut names = BTreeSet::new();
    for (f, ft) in all_format_types() {
        for t in ["__half", "__nv_bfloat16"] {
            for p in [1, 2] {
                for bm in TILE_ROWS.into_iter().filter(|&b| b <= max_tile(f)) {
                    names.insert(format!("moekit::tc_ra<{ft}, {t}, {p}, {bm}>"));
                    if p == 2 {
                        names.insert(format!("moekit::tc_ra<{ft}, {t}, 2, {bm}, true>"));
                    }
                }
            }
        }
    }
    for t in ["__half", "__nv_bfloat16"] {
        names.insert(format!("moekit::ra_permute<{t}>"));
    }
    names.into_iter().map(|e| (&SRC, e)).collect()
}

#[repr(C)]
#[derive(Clone, Copy)]
struct RaPermParams {
    x: u64,
    y: u64,
    rows: u32,
    k: u32,
    order: u32,
    pad: u32,
}
const _: () = assert!(std::mem::size_of::<RaPermParams>() == 32);
// SAFETY: plain-old-data mirrored by the kernel's RaPermParams.
unsafe impl cudarc::driver::DeviceRepr for RaPermParams {}

/// `out [R, K] = x [R, K]` with each 128-column span in `order`
/// ([`SpanOrder::logical`]); K a multiple of [`SPAN`], f16/bf16 on CUDA.
pub fn permute_into(x: &Tensor, order: SpanOrder, out: &Tensor) -> Result<()> {
    const OP: &str = "ra_permute";
    let xb = x.cuda_bytes()?;
    let dev = xb.device().clone();
    ensure(
        matches!(x.dtype(), DType::F16 | DType::Bf16),
        OP,
        "x",
        "dtype f16 or bf16",
        x.dtype(),
    )?;
    ensure(
        x.rank() == 2 && x.shape()[1].is_multiple_of(SPAN),
        OP,
        "x",
        format!("[rows, K] with K a multiple of {SPAN}"),
        format!("{:?}", x.shape()),
    )?;
    check_out(OP, out, x.dtype(), x.shape())?;
    super::check_same_device(OP, out, &dev)?;
    let (rows, k) = (x.shape()[0], x.shape()[1]);
    let groups = rows * (k / 8);
    let blocks = groups.div_ceil(256);
    ensure(
        blocks <= u32::MAX as usize,
        OP,
        "x",
        "fewer than 2^40 elements",
        rows * k,
    )?;
    let params = RaPermParams {
        x: xb.ptr(),
        y: out.cuda_bytes()?.ptr(),
        rows: u32_of(OP, "rows", rows)?,
        k: u32_of(OP, "K", k)?,
        order: order.code(),
        pad: 0,
    };
    let geo = Geometry {
        grid: (blocks as u32, 1, 1),
        block: (256, 1, 1),
        shared: 0,
    };
    let name = format!("moekit::ra_permute<{}>", ctype(OP, x.dtype())?);
    // SAFETY: x and out are device [rows, K] tensors of T on this device
    // (checked), K a multiple of 128: each thread reads 16 bytes at an
    // 8-column group of x (16-byte aligned rows) and writes four 4-byte
    // pairs inside the same row's span of out.
    unsafe { launch(&dev, &SRC, &name, geo, params, OP) }
}

/// `out [M, N] = x_perm · W[e(row)]ᵀ` on `tc_ra`, x's columns permuted by
/// [`permute_into`] in `span_order(w.format())` (or written so by
/// [`swiglu_into`] with `perm_out`).
pub fn matmul_into(
    x_perm: &Tensor,
    w: &QuantWeights,
    rows: TcRows<'_>,
    out: &Tensor,
) -> Result<()> {
    let k = Kernel::RegA { perm_out: None };
    let glu = super::GluParams::default();
    tc_gemm::run_kernel(
        k,
        "tc_ra",
        x_perm,
        [(w, 0), (w, 0)],
        1,
        w.rows(),
        rows,
        out,
        glu,
    )
}

/// Fused `silu(x·Gᵀ) · (x·Uᵀ)` on `tc_ra` into `out [M, I]`, x's columns
/// permuted in the gate/up format's order; `perm_out`: the output's columns
/// permuted too, in that order (I a multiple of [`SPAN`]), as
/// [`matmul_into`] takes them for a down projection of that order.
pub fn swiglu_into(
    x_perm: &Tensor,
    w: &GateUp,
    rows: TcRows<'_>,
    out: &Tensor,
    perm_out: Option<SpanOrder>,
) -> Result<()> {
    let ffn = crate::ops::ffn::ExpertFfn::default();
    glu_into(x_perm, w, rows, &ffn, out, perm_out)
}

/// [`swiglu_into`] with `ffn`'s activation and gate/up biases (f32 `[E, I]`
/// on x's device, validated by the caller; indexed by the output's logical
/// column whatever order it is written in).
pub fn glu_into(
    x_perm: &Tensor,
    w: &GateUp,
    rows: TcRows<'_>,
    ffn: &crate::ops::ffn::ExpertFfn,
    out: &Tensor,
    perm_out: Option<SpanOrder>,
) -> Result<()> {
    const OP: &str = "tc_ra_swiglu";
    let i = w.intermediate();
    if perm_out.is_some() && !i.is_multiple_of(SPAN) {
        return Err(invalid(
            OP,
            "out",
            format!("I a multiple of {SPAN} for a permuted output"),
            i,
        ));
    }
    tc_gemm::run_swiglu(Kernel::RegA { perm_out }, OP, x_perm, w, rows, ffn, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_of_256_rows_only_past_192_rows_an_expert() {
        let a4 = WeightFormat::Affine(crate::format::AffineParams {
            bits: 4,
            group_size: 64,
        });
        let q40 = WeightFormat::Ggml(crate::format::GgmlType::Q4_0);
        assert_eq!(tile_rows(8, 128, 12, a4), 16);
        assert_eq!(tile_rows(512 * 8, 128, 12, a4), 64);
        assert_eq!(tile_rows(2048 * 8, 128, 12, a4), 128);
        assert_eq!(tile_rows(4096 * 8, 128, 12, a4), 256);
        assert_eq!(tile_rows(4096 * 8, 128, 12, q40), 128);
        // One expert (router, shared expert): tc_gemm's rule.
        for m in [64, 4096, 65536] {
            assert_eq!(tile_rows(m, 1, 1, a4), tc_gemm::tile_rows(m, 1, 1).min(128));
        }
        assert_eq!(smem_bytes(128), 4 * 128 * 256 + 1024);
        assert_eq!(smem_bytes(256), 3 * 256 * 256 + 1024);
        // It fits an H100/H200 block (227 KB).
        assert!(smem_bytes(256) <= 232_448);
    }

    #[test]
    fn span_orders_are_permutations_of_the_decoders_pairs() {
        for order in SpanOrder::ALL {
            let mut seen = [false; SPAN];
            for p in 0..SPAN {
                let l = order.logical(p);
                assert!(l < SPAN && !seen[l], "{order:?}: column {p} -> {l}");
                seen[l] = true;
            }
            // Pair i of every unit is one 4-byte word of the MMA's k order:
            // its first weight at an even k, the second right after.
            for unit in 0..SPAN / 8 {
                for i in 0..4 {
                    let (a, d) = order.pair(i);
                    let first = order.logical(8 * unit + a);
                    assert_eq!(first % 2, 0, "{order:?} unit {unit} pair {i}");
                    assert_eq!(order.logical(8 * unit + a + d), first + 1, "{order:?}");
                }
            }
        }
        // Lane 1's first column is k 2 of step 0; step 1 starts at the
        // unit's third pair: the kernel's static asserts.
        assert_eq!(SpanOrder::Pairs.logical(32), 2);
        assert_eq!(SpanOrder::Pairs.logical(4), 16);
        assert_eq!(SpanOrder::Pairs.logical(2), 8);
        assert_eq!(SpanOrder::Nibbles.logical(4), 1);
        assert_eq!(SpanOrder::Nibbles.logical(1), 8);
        assert_eq!(SpanOrder::Nibbles.logical(2), 16);
        assert_eq!(SpanOrder::Alternate.logical(2), 1);
        assert_eq!(SpanOrder::Alternate.logical(1), 8);
        assert_eq!(SpanOrder::Alternate.logical(4), 16);
        let a4 = WeightFormat::Affine(crate::format::AffineParams {
            bits: 4,
            group_size: 32,
        });
        assert_eq!(span_order(a4), SpanOrder::Nibbles);
        let q = |t| span_order(WeightFormat::Ggml(t));
        assert_eq!(q(crate::format::GgmlType::Q4_K), SpanOrder::Alternate);
        assert_eq!(q(crate::format::GgmlType::Q4_0), SpanOrder::Pairs);
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        let f = crate::format::WeightFormat::Affine(crate::format::AffineParams {
            bits: 4,
            group_size: 64,
        });
        let w = crate::format::random::random_weights(f, 1, 8, 256, DType::F16, 1, &|| {}).unwrap();
        assert!(supports(DType::Bf16, &w, Arch::SM90).is_ok());
        assert!(supports(DType::Bf16, &w, Arch::SM80)
            .unwrap_err()
            .contains("sm_90a"));
        assert!(supports(DType::F32, &w, Arch::SM90)
            .unwrap_err()
            .contains("f32"));
        let w = crate::format::random::random_weights(f, 1, 8, 192, DType::F16, 1, &|| {}).unwrap();
        assert!(supports(DType::Bf16, &w, Arch::SM90)
            .unwrap_err()
            .contains("K = 192"));
    }
}
