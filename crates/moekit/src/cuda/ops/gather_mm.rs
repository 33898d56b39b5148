//! `kernels/gather_mm.cu`: grouped quantized matmul over experts and the fused
//! gate+up+SwiGLU projection, for every [`WeightFormat`].
//!
//! One kernel template `gather_mm<F, T, P>`: the weight format `F` (a decoder
//! type of `kernels/dequant.cuh`, named by [`format_type`]), the activation
//! type `T`, and the number of weight sources `P` (1: plain matmul, 2: gate
//! and up combined as `silu(g)·u`). Everything else is a run-time field of the
//! params, so the instance count stays at formats × 3 × 2 (192 per
//! architecture):
//! * how rows find their expert ([`RowExperts`]: per-row ids, sorted offsets,
//!   or a single expert), a block-uniform branch at the start of each block;
//! * the affine group size (32/64/128): a chunk of 32 codes never straddles a
//!   group, so it only enters the index of the chunk's scale (a shift);
//! * where the P sources live (separate gate/up tensors or the two halves of
//!   a fused `[E, 2I, H]` tensor).
//!
//! Geometry depends on shapes only: `grid = (⌈M/8⌉, ⌈N/(4·RPW)⌉)` with RPW
//! output columns per warp (2 for P = 1, 1 for P = 2), 128 threads a block.

use super::{check_out, ctype, launch, u32_of, Geometry, FLOAT_DTYPES};
use crate::cuda::jit::Source;
use crate::dtype::DType;
use crate::error::{ensure, Result};
use crate::format::{GgmlType, QuantWeights, WeightFormat};
use crate::ops::act::GateUp;
use crate::ops::ffn::ExpertFfn;
use crate::ops::gather_mm::RowExperts;
use crate::tensor::Tensor;
use std::collections::BTreeSet;

static SRC: Source = Source {
    name: "gather_mm.cu",
    text: include_str!("../../../kernels/gather_mm.cu"),
};

/// Rows of x per block (kernel: `MT`).
const ROWS_PER_BLOCK: usize = 8;
/// Warps per block (kernel: `WARPS`).
const WARPS: usize = 4;

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct WeightSrc {
    pub(crate) data: u64,
    pub(crate) scales: u64,
    pub(crate) biases: u64,
    pub(crate) rows: u32,
    pub(crate) row_offset: u32,
}
const _: () = assert!(std::mem::size_of::<WeightSrc>() == 32);

#[repr(C)]
#[derive(Clone, Copy)]
struct GatherParams {
    x: u64,
    experts: u64,
    out: u64,
    err: u64,
    src: [WeightSrc; 2],
    m: u32,
    n: u32,
    k: u32,
    n_experts: u32,
    mode: u32,
    group_shift: u32,
    pad: [u32; 2],
    glu: super::GluParams,
}
const _: () = assert!(std::mem::size_of::<GatherParams>() == 176);
// SAFETY: plain-old-data mirrored by the kernel's GatherParams (and WeightSrc).
unsafe impl cudarc::driver::DeviceRepr for GatherParams {}

/// Kernel `RowMode` values.
const ROWS_PER_ROW: u32 = 0;
const ROWS_SORTED: u32 = 1;
const ROWS_SINGLE: u32 = 2;

/// The C++ decoder type (`kernels/dequant.cuh`) of `format` whose affine
/// scales and biases have `scale_dtype` (ignored by the other formats): the
/// one place a [`WeightFormat`] becomes a kernel template argument.
pub fn format_type(format: WeightFormat, scale_dtype: DType) -> Result<String> {
    const OP: &str = "gather_mm";
    Ok(match format {
        WeightFormat::Dense(d) => format!("moekit::FmtDense<{}>", ctype(OP, d)?),
        WeightFormat::Affine(p) => {
            format!("moekit::FmtAffine<{}, {}>", p.bits, ctype(OP, scale_dtype)?)
        }
        WeightFormat::AffineU8 { .. } => "moekit::FmtAffineU8".to_string(),
        WeightFormat::MlxFp(m) => format!("moekit::FmtMlxFp<{}, {}>", m.bits(), m.group_size()),
        WeightFormat::Fp8Block { .. } => "moekit::FmtFp8Block".to_string(),
        WeightFormat::Ggml(t) => {
            let name = match t {
                GgmlType::Q4_0 => "Q4_0",
                GgmlType::Q4_1 => "Q4_1",
                GgmlType::Q5_0 => "Q5_0",
                GgmlType::Q5_1 => "Q5_1",
                GgmlType::Q8_0 => "Q8_0",
                GgmlType::Q2_K => "Q2_K",
                GgmlType::Q3_K => "Q3_K",
                GgmlType::Q4_K => "Q4_K",
                GgmlType::Q5_K => "Q5_K",
                GgmlType::Q6_K => "Q6_K",
                GgmlType::IQ4_NL => "IQ4_NL",
                GgmlType::IQ4_XS => "IQ4_XS",
                GgmlType::MXFP4 => "MXFP4",
                GgmlType::NVFP4 => "NVFP4",
                GgmlType::IQ2_XXS => "IQ2_XXS",
                GgmlType::IQ2_XS => "IQ2_XS",
                GgmlType::IQ2_S => "IQ2_S",
                GgmlType::IQ3_XXS => "IQ3_XXS",
                GgmlType::IQ3_S => "IQ3_S",
                GgmlType::IQ1_S => "IQ1_S",
                GgmlType::IQ1_M => "IQ1_M",
                GgmlType::TQ1_0 => "TQ1_0",
                GgmlType::TQ2_0 => "TQ2_0",
            };
            format!("moekit::Fmt{name}")
        }
    })
}

/// The kernel name expression for weights `w`, activations `dtype`, `p` sources.
fn kernel_name(w: &QuantWeights, dtype: DType, p: usize) -> Result<String> {
    let scale_dtype = w.scales().map_or(DType::F32, |s| s.dtype());
    Ok(format!(
        "moekit::gather_mm<{}, {}, {p}>",
        format_type(w.format(), scale_dtype)?,
        ctype("gather_mm", dtype)?
    ))
}

/// Every decoder type with the format it decodes: each format of
/// [`WeightFormat::all`] (group sizes share a type) × affine scale dtype.
pub(crate) fn all_format_types() -> Vec<(WeightFormat, String)> {
    let mut v: Vec<(WeightFormat, String)> = Vec::new();
    for f in WeightFormat::all() {
        let scale_dtypes: &[DType] = match f {
            WeightFormat::Affine(_) => &FLOAT_DTYPES,
            _ => &[DType::F32],
        };
        for &s in scale_dtypes {
            if let Ok(ft) = format_type(f, s) {
                if !v.iter().any(|(_, t)| *t == ft) {
                    v.push((f, ft));
                }
            }
        }
    }
    v
}

/// Instances for the compile check: every decoder type × activation dtype ×
/// {plain, fused SwiGLU}.
pub fn instances() -> Vec<(&'static Source, String)> {
    let mut names = BTreeSet::new();
    for (_, ft) in all_format_types() {
        for &t in &FLOAT_DTYPES {
            let Ok(tn) = ctype("gather_mm", t) else {
                continue;
            };
            for p in [1, 2] {
                names.insert(format!("moekit::gather_mm<{ft}, {tn}, {p}>"));
            }
        }
    }
    names.into_iter().map(|e| (&SRC, e)).collect()
}

/// One weight source for the kernel: row `row_offset + n` of each expert.
pub(crate) fn weight_src(
    op: &'static str,
    w: &QuantWeights,
    row_offset: usize,
) -> Result<WeightSrc> {
    let ptr16 = |t: &Tensor, arg: &'static str| -> Result<u64> {
        let p = t.cuda_bytes()?.ptr();
        ensure(
            p % 16 == 0,
            op,
            arg,
            "a 16-byte aligned device address",
            format!("{p:#x}"),
        )?;
        Ok(p)
    };
    let aux =
        |t: Option<&Tensor>, arg| t.map(|t| ptr16(t, arg)).transpose().map(|p| p.unwrap_or(0));
    let scales = aux(w.scales(), "scales")?;
    Ok(WeightSrc {
        data: ptr16(w.data(), "weights")?,
        scales,
        // Formats with scales but no biases (MLX fp) pass the scales again:
        // their decoders never read biases, but the staging code (tc_common,
        // decode_f32) copies a biases row wherever there are scales.
        biases: match w.biases() {
            Some(b) => ptr16(b, "biases")?,
            None => scales,
        },
        rows: u32_of(op, "weight rows", w.rows())?,
        row_offset: u32_of(op, "weight rows", row_offset)?,
    })
}

/// Checks `x` and the row→expert mapping (shapes and devices only: no data is
/// read) and fills the shape fields of the params.
fn base_params(
    op: &'static str,
    x: &Tensor,
    n_experts: usize,
    k: usize,
    n: usize,
    experts: RowExperts<'_>,
    out: &Tensor,
) -> Result<GatherParams> {
    let xb = x.cuda_bytes()?;
    ensure(
        x.dtype().is_float() && x.rank() == 2,
        op,
        "x",
        "a [M, K] f32, f16 or bf16 tensor",
        format!("{} {:?}", x.dtype(), x.shape()),
    )?;
    let m = x.shape()[0];
    ensure(
        x.shape()[1] == k,
        op,
        "x",
        format!("{k} columns (K of the weights)"),
        x.shape()[1],
    )?;
    check_out(op, out, x.dtype(), &[m, n])?;
    let same_device = |t: &Tensor, arg: &'static str| {
        ensure(
            t.device() == x.device(),
            op,
            arg,
            format!("on {} like x", x.device()),
            t.device(),
        )
    };
    same_device(out, "out")?;
    let (mode, ptr) = match experts {
        RowExperts::Single => {
            crate::ops::gather_mm::check_single(op, n_experts)?;
            (ROWS_SINGLE, 0)
        }
        RowExperts::Sorted(t) => {
            ensure(
                t.dtype() == DType::U32,
                op,
                "offsets",
                "dtype u32",
                t.dtype(),
            )?;
            ensure(
                t.shape() == [n_experts + 1],
                op,
                "offsets",
                format!("shape [{}] (E + 1)", n_experts + 1),
                format!("{:?}", t.shape()),
            )?;
            same_device(t, "offsets")?;
            (ROWS_SORTED, t.cuda_bytes()?.ptr())
        }
        RowExperts::PerRow(t) => {
            ensure(t.dtype() == DType::U32, op, "ids", "dtype u32", t.dtype())?;
            ensure(
                t.shape() == [m],
                op,
                "ids",
                format!("shape [{m}] (rows of x)"),
                format!("{:?}", t.shape()),
            )?;
            same_device(t, "ids")?;
            (ROWS_PER_ROW, t.cuda_bytes()?.ptr())
        }
    };
    let dev = xb.device();
    Ok(GatherParams {
        x: xb.ptr(),
        experts: ptr,
        out: out.cuda_bytes()?.ptr(),
        err: dev.error_word(),
        src: [WeightSrc::default(); 2],
        m: u32_of(op, "x rows", m)?,
        n: u32_of(op, "weight rows", n)?,
        k: u32_of(op, "K", k)?,
        n_experts: u32_of(op, "n_experts", n_experts)?,
        mode,
        group_shift: 0,
        pad: [0; 2],
        glu: super::GluParams::default(),
    })
}

/// log2 of the affine, MLX fp or FP8 block group size (0 for the other
/// formats).
pub(crate) fn group_shift(format: WeightFormat) -> u32 {
    match format {
        WeightFormat::Affine(p) => p.group_size.trailing_zeros(),
        WeightFormat::AffineU8 { group_size } => group_size.trailing_zeros(),
        WeightFormat::MlxFp(m) => m.group_size().trailing_zeros(),
        WeightFormat::Fp8Block { block_k } => block_k.trailing_zeros(),
        _ => 0,
    }
}

/// Checks that `w` lives on `x`'s device.
fn check_weights(op: &'static str, x: &Tensor, w: &QuantWeights, arg: &'static str) -> Result<()> {
    ensure(
        w.device() == x.device(),
        op,
        arg,
        format!("weights on {} like x", x.device()),
        w.device(),
    )
}

/// Launches `gather_mm<F, T, P>` for filled params.
fn run(
    op: &'static str,
    x: &Tensor,
    w: &QuantWeights,
    p_sources: usize,
    params: GatherParams,
) -> Result<()> {
    let dev = x.cuda_bytes()?.device().clone();
    let (m, n) = (params.m as usize, params.n as usize);
    let cols_per_block = WARPS * if p_sources == 1 { 2 } else { 1 };
    let gx = m.div_ceil(ROWS_PER_BLOCK);
    let gy = n.div_ceil(cols_per_block);
    ensure(
        gy <= 65535,
        op,
        "weights",
        format!("at most {} output rows", 65535 * cols_per_block),
        n,
    )?;
    let geo = Geometry {
        grid: (gx as u32, gy as u32, 1),
        block: ((WARPS * 32) as u32, 1, 1),
        shared: 0,
    };
    let name = kernel_name(w, x.dtype(), p_sources)?;
    // SAFETY: x is a device [m, k] tensor of T and out a device [m, n] tensor
    // of T (checked in base_params); each source's data/scales/biases are the
    // device tensors of a validated QuantWeights of format F with `rows` rows
    // of k columns per expert, 16-byte aligned (checked), and the kernel reads
    // rows e·rows + row_offset + n for n < params.n ≤ rows − row_offset and
    // e < n_experts only (ids ≥ E and bad offsets are skipped and reported);
    // `experts` has E + 1 (sorted) or m (per-row) u32 entries (checked) or is
    // unused (single). Rows ≥ m and columns ≥ n are never touched.
    unsafe { launch(&dev, &SRC, &name, geo, params, op) }
}

/// `y [M, N] = x [M, K] · W[e(m)]ᵀ` on the device of `x` (all operands there).
pub fn gather_mm(x: &Tensor, w: &QuantWeights, experts: RowExperts<'_>) -> Result<Tensor> {
    let m = x.shape().first().copied().unwrap_or(0);
    let out = Tensor::zeros_on(x.dtype(), &[m, w.rows()], x.device())?;
    gather_mm_into(x, w, experts, &out)?;
    Ok(out)
}

/// [`gather_mm`] into a preallocated `out [M, N]` of `x`'s dtype on the same device.
pub fn gather_mm_into(
    x: &Tensor,
    w: &QuantWeights,
    experts: RowExperts<'_>,
    out: &Tensor,
) -> Result<()> {
    const OP: &str = "gather_mm";
    check_weights(OP, x, w, "w")?;
    let mut p = base_params(OP, x, w.n_experts(), w.cols(), w.rows(), experts, out)?;
    p.src[0] = weight_src(OP, w, 0)?;
    p.group_shift = group_shift(w.format());
    run(OP, x, w, 1, p)
}

/// Fused `act(x·Wgᵀ + bg, x·Wuᵀ + bu)` with `ffn`'s activation and gate/up
/// biases (validated by the caller: f32 `[E, I]` on `x`'s device): `x [M,
/// H]` → `[M, I]` on the device of `x`.
pub fn gather_glu(
    x: &Tensor,
    w: &GateUp,
    experts: RowExperts<'_>,
    ffn: &ExpertFfn,
) -> Result<Tensor> {
    let m = x.shape().first().copied().unwrap_or(0);
    let out = Tensor::zeros_on(x.dtype(), &[m, w.intermediate()], x.device())?;
    gather_glu_into(x, w, experts, ffn, &out)?;
    Ok(out)
}

/// Whether two weight tensors share one kernel instance (format and scale dtype).
pub(crate) fn same_instance(a: &QuantWeights, b: &QuantWeights) -> bool {
    a.format() == b.format() && a.scales().map(|s| s.dtype()) == b.scales().map(|s| s.dtype())
}

/// Fused `silu(x·Wgᵀ) · (x·Wuᵀ)` into a preallocated `out [M, I]` of `x`'s dtype.
///
/// One pass over gate and up when they share a format (always for
/// [`GateUp::Fused`]); separate gate and up weights of different formats run
/// as two grouped matmuls and the elementwise [`super::act::swiglu_into`].
pub fn gather_swiglu_into(
    x: &Tensor,
    w: &GateUp,
    experts: RowExperts<'_>,
    out: &Tensor,
) -> Result<()> {
    gather_glu_into(x, w, experts, &ExpertFfn::default(), out)
}

/// [`gather_swiglu_into`] with `ffn`'s activation and gate/up biases and
/// scales. Gate and up of different formats take it only as plain SwiGLU.
pub fn gather_glu_into(
    x: &Tensor,
    w: &GateUp,
    experts: RowExperts<'_>,
    ffn: &ExpertFfn,
    out: &Tensor,
) -> Result<()> {
    const OP: &str = "gather_swiglu";
    let i = w.intermediate();
    let (first, srcs) = match w {
        GateUp::Separate { gate, up } => {
            check_weights(OP, x, gate, "gate")?;
            check_weights(OP, x, up, "up")?;
            if !same_instance(gate, up) {
                ensure(
                    ffn.glu_is_plain(),
                    OP,
                    "ffn",
                    "plain SwiGLU without gate/up biases or scales when gate and up differ in format",
                    format!(
                        "{:?} with biases: {}, scales: {}",
                        ffn.act,
                        ffn.has_bias(),
                        ffn.scale.any()
                    ),
                )?;
                return separate_swiglu(x, gate, up, experts, out);
            }
            (gate, [weight_src(OP, gate, 0)?, weight_src(OP, up, 0)?])
        }
        GateUp::Fused(wf) => {
            check_weights(OP, x, wf, "w")?;
            (wf, [weight_src(OP, wf, 0)?, weight_src(OP, wf, i)?])
        }
    };
    let mut p = base_params(OP, x, w.n_experts(), w.hidden(), i, experts, out)?;
    p.src = srcs;
    p.group_shift = group_shift(first.format());
    p.glu = super::GluParams::of(ffn)?;
    run(OP, x, first, 2, p)
}

/// Gate and up of different formats: two grouped matmuls, then SwiGLU.
fn separate_swiglu(
    x: &Tensor,
    gate: &QuantWeights,
    up: &QuantWeights,
    experts: RowExperts<'_>,
    out: &Tensor,
) -> Result<()> {
    let g = gather_mm(x, gate, experts)?;
    let u = gather_mm(x, up, experts)?;
    super::act::swiglu_into(&g, &u, out)
}
