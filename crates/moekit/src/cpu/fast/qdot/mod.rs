//! Integer dot products of stored weight rows with activations quantized to
//! 8-bit blocks (the [`ActMode::Q8`](crate::cpu::ActMode) path of the fused
//! dots).
//!
//! Each activation row is quantized once per call ([`QRow::new`]), in
//! blocks matching the weight format's: 32 values for the 32-weight GGUF
//! types and MLX affine (like ggml's q8_0), 256 for the K-quants (q8_K).
//! In a 32-value block each lane of 4 values (largest magnitude `a`) has
//! its own f32 scale `m = a/127` and codes `y_i = round(x_i·127/a)` (ties to
//! even); a 256-value block (largest magnitude `amax`) has the scale
//! `d = amax/(127·2³)` and each lane a shift `s ∈ 0..=3`, the smallest that
//! keeps its codes within ±127, the values being `d·(y_i << s)` (the
//! K-quant kernels combine groups in integers, so their lane factors are
//! powers of two applied as 16-bit multipliers). Either way a lane of small
//! values gets finer steps than its block's largest value would allow (ggml
//! has one scale per block): the activation error of heavy-tailed rows
//! (SwiGLU outputs, the down projection's input) drops from ~8e-5 to ~1e-5
//! (lane scales) or ~3e-5 (shifts). A row also keeps, as its kind needs,
//! the shifted sums of its codes per 16 and per 32 (the K-quants' mins), the
//! lane sums times the weights' code offset (Q8_0's `+128` at the VNNI
//! levels), the blocks' offsets `8·Σ m·Σy` (Q4_0's and affine's `q − 8`),
//! and the exact f32 sums of its values per block (the affine biases). For
//! the nibble formats the codes of each run of 4 blocks are stored
//! interleaved (the first halves — for MLX affine, the even values — of
//! the 4 blocks, then the second halves: [`half_offsets`]), the order in
//! which the kernels split the weights' nibble bytes. Rows are 64-byte
//! aligned.
//!
//! A weight block then costs integer multiply-adds of its codes with the
//! activation codes — exact, in `i32` — and a few f32 operations per 32
//! (256) weights. The integer part of block `b` is kept as 8 lanes
//! `L_b[j] = Σ_{k<4} w[4j+k]·y[4j+k]` (for the K-quants shifted and times
//! the group scales, in integers): lane `j` covers weights `4j..4j+4` of
//! the block (of each 32 for the K-quants), as `vpdpbusd` (and AVX2's
//! `vpmaddubsw` + `vpmaddwd`) sum them. The float part is fixed:
//! `s_b = w_scale_b · d_b` (f32), four accumulators of 8 lanes take the
//! blocks in turn, `A[b % 4][j] = fma(s_b·m_j, f32(L_b[j]), A[b % 4][j])`
//! (32-value blocks, `s_b·m_j` rounded once) or `fma(s_b, f32(L_b[j]), …)`
//! (256), then [`finish`] sums `(A0 + A1) + (A2 + A3)` lane by lane, the
//! lanes in a fixed tree, and subtracts the offset terms: Q4_0's `q − 8` as
//! `O[b % 4] = fma(s_b, 8·Σ m·Σy, O[b % 4])`, `(O0 + O1) + (O2 + O3)` (the
//! integer lanes hold `Σ q·y` alone: no per-lane bias to load); Q4_K's
//! mins likewise, `O[b % 4] = fma(dmin_b·d_b, f32(Σ_g m_g·Σy_g), O[b % 4])`;
//! affine's biases as in [`affine`]. Every level computes exactly this, so
//! the [`Portable`](SimdLevel::Portable), AVX2 and VNNI kernels give
//! bit-identical results, and a result depends only on its weight row and
//! activation row (batch- and thread-invariant).
//!
//! Error bound: tested at NMSE ≤ 1e-4 against the f32 path, on random rows
//! (measured 1e-7..1.5e-5) and on the MoE-block fixtures (at most ~5e-5; the
//! tolerance llama.cpp's `test-backend-ops` allows for `mul_mat_id`).
//!
//! Formats: every GGUF type ([`kind_of`]), MLX affine of 2, 3, 4, 5, 6 and 8 bits, groups of
//! 32/64/128 ([`kind_of_affine`]), and MLX's mxfp4 and nvfp4
//! ([`kind_of_mlxfp`]). Q4_0, Q8_0, Q4_K and affine4 have kernels of their
//! own (above); the others ([`blocks`]: Q4_1, Q5_0, Q5_1 and affine
//! 2/3/5/6/8 as Q8_0's signed-code kernel with a per-format code unpacking;
//! Q2_K, Q3_K, Q5_K, Q6_K as Q4_K's with per-16 scales and offsets) share
//! one kernel per family, and the 4-bit codebook formats ([`codebook`]:
//! IQ4_NL, IQ4_XS, MXFP4, MLX mxfp4 and nvfp4) dot Q8_0's way the signed
//! values their nibbles index in a 16-entry table (a byte shuffle at the
//! x86 levels), against activations stored as Q4_0's; the grid and
//! ternary types ([`grid`]: IQ1–IQ3, TQ1_0, TQ2_0) look their grid bytes
//! up, apply the signs to the activations and dot like the K-quants
//! (256-value activation blocks, `vpmaddubsw` + `vpmaddwd` with `2^s`
//! times the group scales). Q4_1 and affine
//! 2 and 8 bits keep the f32 kernels by default ([`QKind::by_default`]:
//! those measured faster). Levels: `portable` (plain Rust integer
//! arithmetic; `f32::mul_add`), `ymm` (AVX2 `vpmaddubsw`/`vpmaddwd` and
//! AVX-VNNI `vpdpbusd`/`vpdpwssd` on 256-bit vectors), `avx512`
//! (AVX512-VNNI and VBMI on 512-bit vectors: 4 nibble blocks, 2 byte blocks
//! or two 32-value K-quant chunks per instruction; Q3_K, Q4_K and MLX
//! affine 2/3/5/6/8 bits unpack their codes with `vpmultishiftqb`; the
//! other [`blocks`] formats and the [`grid`] formats run their 256-bit
//! kernels in EVEX forms), chosen by [`qdot_rows`]' level argument.

/// `fn $name<$generics>`, a portable [`Run`]: `$kernel` over the rows
/// ([`run_rows`]). The one adapter of the `portable`, `blocks` and `grid`
/// kernels (the x86 levels': `level_run!`).
macro_rules! portable_run {
    ($name:ident [$($gen:tt)*], $($kernel:tt)+) => {
        #[allow(clippy::too_many_arguments)] // a Run
        fn $name<$($gen)*>(
            dec: &$crate::format::RowDecoder<'_>,
            e: usize,
            n0: usize,
            n: usize,
            acts: &[&super::QRow; R],
            scratch: &mut [f32],
            out: &mut [f32],
            stride: usize,
        ) -> $crate::error::Result<()> {
            super::run_rows(dec, e, n0, n, acts, scratch, out, stride, $($kernel)+)
        }
    };
}

/// `$vis fn $name<$generics>`, a [`Run`] at an x86 level: `$kernel` over
/// the rows ([`run_rows`]) inside `$level::enter`, both closures inlined
/// into the level's target-feature region. The one adapter of the
/// `avx512`, `avx512_k`, `ymm`, `blocks_x86` and `grid_x86` kernels.
#[cfg(target_arch = "x86_64")]
macro_rules! level_run {
    ($vis:vis $name:ident [$($gen:tt)*], $level:ty, $($kernel:tt)+) => {
        #[allow(clippy::too_many_arguments)] // a Run
        $vis fn $name<$($gen)*>(
            dec: &$crate::format::RowDecoder<'_>,
            e: usize,
            n0: usize,
            n: usize,
            acts: &[&super::QRow; R],
            scratch: &mut [f32],
            out: &mut [f32],
            stride: usize,
        ) -> $crate::error::Result<()> {
            <$level>::enter(
                #[inline(always)]
                move || {
                    super::run_rows(
                        dec,
                        e,
                        n0,
                        n,
                        acts,
                        scratch,
                        out,
                        stride,
                        #[inline(always)]
                        |b, l, a, s, o, st| $($kernel)+(b, l, a, s, o, st),
                    )
                },
            )
        }
    };
}

mod affine;
#[cfg(target_arch = "x86_64")]
mod affine_x86;
#[cfg(target_arch = "x86_64")]
mod affine_zmm;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_k;
mod blocks;
#[cfg(target_arch = "x86_64")]
mod blocks_x86;
mod codebook;
#[cfg(target_arch = "x86_64")]
mod codebook_x86;
mod grid;
#[cfg(target_arch = "x86_64")]
mod grid_x86;
mod portable;
mod quant;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod ymm;

pub use quant::{half_offsets, kind_of, kind_of_affine, kind_of_mlxfp, kind_of_rows, QKind, QRow};

use crate::cpu::SimdLevel;
use crate::error::{invalid, Result};
use crate::format::ggml::GgmlType;
use crate::format::{MlxFpMode, RawRow, RowDecoder};

/// Blocks per run of the kernels' accumulators (`A[b % RUN]`).
const RUN: usize = 4;

/// The lane accumulators of one dot: `A[b % 4][j]`.
type Acc = [[f32; 8]; RUN];

/// `A[b % 4][j] = fma(s, f32(l[j]), A[b % 4][j])`: block `b`'s lanes into
/// the accumulators (one rounding, at every level).
#[inline(always)]
fn add_block(acc: &mut Acc, b: usize, s: f32, l: [i32; 8]) {
    if let Some(a) = acc.get_mut(b % RUN) {
        for (a, l) in a.iter_mut().zip(l) {
            *a = s.mul_add(l as f32, *a);
        }
    }
}

/// `A[b % 4][j] = fma(s·m[j], f32(l[j]), A[b % 4][j])`: block `b`'s lanes
/// with the lanes' own scales `m` (32-value blocks; `s·m[j]` rounded once).
#[inline(always)]
fn add_block_scaled(acc: &mut Acc, b: usize, s: f32, m: &[f32; 8], l: [i32; 8]) {
    if let Some(a) = acc.get_mut(b % RUN) {
        for ((a, l), &m) in a.iter_mut().zip(l).zip(m) {
            *a = (s * m).mul_add(l as f32, *a);
        }
    }
}

/// `O[b % 4] = fma(s, off, O[b % 4])`: block `b`'s offset term (Q4_0's
/// `8·Σ(y << s)`) into the offset accumulators.
#[inline(always)]
fn add_offset(o: &mut [f32; RUN], b: usize, s: f32, off: f32) {
    if let Some(o) = o.get_mut(b % RUN) {
        *o = s.mul_add(off, *o);
    }
}

/// The offset accumulators summed: `(O0 + O1) + (O2 + O3)`.
#[inline(always)]
fn offsets(o: &[f32; RUN]) -> f32 {
    (o[0] + o[1]) + (o[2] + o[3])
}

/// The dot from the lane accumulators and the min terms:
/// `Σ_j ((A0[j] + A1[j]) + (A2[j] + A3[j])) − off`, the lanes summed as
/// `((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7))`.
#[inline(always)]
fn finish(a: &Acc, off: f32) -> f32 {
    // Plain loops (inlined into the level's context); `array::from_fn` was
    // left out of line, a call per weight row.
    let [a0, a1, a2, a3] = a;
    let mut l = [0f32; 8];
    for (j, l) in l.iter_mut().enumerate() {
        *l = (a0[j] + a1[j]) + (a2[j] + a3[j]);
    }
    (((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))) - off
}

/// The per-block scale products `s[t·nb + b] = w_b · d_t[b]` of one weight
/// row for every activation row `t < R` (block scales `ds[t]`) and block
/// `b < nb = row.len()/size`, with `w_b` the f16 weight scale of block `b`,
/// widened 8 blocks at a time by `widen8(row, first block)` (exact; zeros
/// past the last block); each product is rounded once, the same at every
/// level. Uses and returns `scratch[..R·nb]`; `None` if a length disagrees.
#[inline(always)]
fn block_scales<'s, const R: usize>(
    row: &[u8],
    size: usize,
    ds: &[&[f32]; R],
    scratch: &'s mut [f32],
    widen8: impl Fn(&[u8], usize) -> [f32; 8],
) -> Option<&'s [f32]> {
    let nb = row.len() / size;
    if nb == 0 {
        return None;
    }
    let s = scratch.get_mut(..R * nb)?;
    for c in 0..nb.div_ceil(8) {
        let w = widen8(row, 8 * c);
        let n8 = (nb - 8 * c).min(8);
        for (t, d) in ds.iter().enumerate() {
            let st = s.get_mut(t * nb + 8 * c..t * nb + 8 * c + n8)?;
            let d = d.get(8 * c..8 * c + n8)?;
            for ((o, &w), &d) in st.iter_mut().zip(&w).zip(d) {
                *o = w * d;
            }
        }
    }
    Some(s)
}

/// The f16 at byte `AT` of blocks `b0..b0 + 8` of `BS` bytes of `row`
/// (zeros past its end), widened one at a time
/// ([`f16_to_f32`](crate::cpu::fast::dot::f16_to_f32)).
#[inline(always)]
fn widen8_f16<const BS: usize, const AT: usize>(row: &[u8], b0: usize) -> [f32; 8] {
    std::array::from_fn(|i| {
        let at = (b0 + i) * BS + AT;
        row.get(at..at + 2).map_or(0.0, |h| {
            let h = half::f16::from_bits(u16::from_le_bytes([h[0], h[1]]));
            crate::cpu::fast::dot::f16_to_f32(h, true)
        })
    })
}

/// Runs `row(bytes, out)` on each `row_len`-byte weight row `i` of `bytes`,
/// writing its `R` dots to `out[t·stride + i]`.
#[inline(always)]
fn each_row<const R: usize>(
    bytes: &[u8],
    row_len: usize,
    out: &mut [f32],
    stride: usize,
    mut row: impl FnMut(&[u8], &mut [f32; R]) -> Option<()>,
) -> Option<()> {
    if row_len == 0 {
        return None;
    }
    for (i, r) in bytes.chunks_exact(row_len).enumerate() {
        let mut o = [0f32; R];
        row(r, &mut o)?;
        for (t, v) in o.into_iter().enumerate() {
            *out.get_mut(t * stride + i)? = v;
        }
    }
    Some(())
}

/// Calls `block(st, b, i, bytes)` on each `bs`-byte block `b` of `row`,
/// with `i = b % RUN` a constant of the unrolled runs (so what a kernel
/// keeps per slot `i` of `st` — the accumulators `A[b % 4]`, offsets — can
/// stay in registers: indexed at run time it lives on the stack, a store
/// and a reload per block), then `end(st, n)` after each run of `n` blocks
/// (`n < RUN` only for the last; a trailing partial block is not a block).
/// `None` if a call fails or `bs` is 0.
#[inline(always)]
fn in_runs<S>(
    row: &[u8],
    bs: usize,
    st: &mut S,
    mut block: impl FnMut(&mut S, usize, usize, &[u8]) -> Option<()>,
    mut end: impl FnMut(&mut S, usize) -> Option<()>,
) -> Option<()> {
    if bs == 0 {
        return None;
    }
    let mut runs = row.chunks_exact(RUN * bs);
    let mut b0 = 0;
    for run in runs.by_ref() {
        for i in 0..RUN {
            block(st, b0 + i, i, run.get(i * bs..(i + 1) * bs)?)?;
        }
        end(st, RUN)?;
        b0 += RUN;
    }
    let rest = runs.remainder();
    let n = rest.len() / bs;
    if n > 0 {
        for i in 0..RUN {
            if i < n {
                block(st, b0 + i, i, rest.get(i * bs..(i + 1) * bs)?)?;
            }
        }
        end(st, n)?;
    }
    Some(())
}

/// The data of the `R` activation rows of a kernel call, with lengths
/// checked once for `nb` blocks (so the kernels index them with [`chunk`]).
#[derive(Clone, Copy)]
// The fields are read by the x86 kernels (elsewhere only the checks run).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct Rows<'a, const R: usize> {
    /// Codes: `nb·block` each.
    y: [&'a [i8]; R],
    /// Lane biases: `nb·block/4` each (empty for kinds without one).
    bias: [&'a [i32]; R],
    /// Block offsets: `nb` each (empty for kinds without one).
    boff: [&'a [f32]; R],
    /// 16-bit sums of 32: `nb·block/32` each (empty for 32-value blocks).
    gsum: [&'a [i16]; R],
    /// 16-bit sums of 16: `nb·block/16` each (empty for 32-value blocks).
    hsum: [&'a [i16]; R],
    /// Pair multipliers: `nb·block/2` each (empty for 32-value blocks).
    pow2: [&'a [i16]; R],
    /// Lane scales: `nb·block/4` each (empty for 256-value blocks).
    lscale: [&'a [f32]; R],
    /// Block scales: `nb` each.
    d: [&'a [f32]; R],
}

impl<'a, const R: usize> Rows<'a, R> {
    /// The rows, if each holds `nb` blocks of its kind (with lane biases
    /// if `with_bias`, block offsets if `with_off`).
    #[inline(always)]
    fn new(acts: &[&'a QRow; R], nb: usize, with_bias: bool) -> Option<Self> {
        for a in acts {
            let n = nb.checked_mul(a.kind.block)?;
            let with_off = a.kind.offset != 0 && !a.kind.lane_bias;
            let bias_ok =
                (!with_bias || a.bias.len() == n / 4) && (!with_off || a.boff.len() == nb);
            let pow2_ok = if a.kind.block == 256 {
                a.pow2.len() == n / 2
                    && a.gsum.len() == n / 32
                    && a.hsum.len() == n / 16
                    && a.sums.len() == n / 16
                    && a.shift.len() == n / 4
            } else {
                a.lscale.len() == n / 4
            };
            let ok = a.codes.len() == n && a.d.len() == nb;
            if !ok || !bias_ok || !pow2_ok {
                return None;
            }
        }
        Some(Rows {
            y: std::array::from_fn(|t| acts[t].codes.as_slice()),
            bias: std::array::from_fn(|t| acts[t].bias.as_slice()),
            boff: std::array::from_fn(|t| acts[t].boff.as_slice()),
            gsum: std::array::from_fn(|t| acts[t].gsum.as_slice()),
            hsum: std::array::from_fn(|t| acts[t].hsum.as_slice()),
            pow2: std::array::from_fn(|t| acts[t].pow2.as_slice()),
            lscale: std::array::from_fn(|t| acts[t].lscale.as_slice()),
            d: std::array::from_fn(|t| acts[t].d.as_slice()),
        })
    }
}

/// `&s[at..at + N]` as an array, without a bounds check: the kernels' hot
/// loops index rows whose lengths [`Rows::new`] and [`block_scales`]
/// checked once.
///
/// # Safety
/// `at + N ≤ s.len()`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn chunk<T, const N: usize>(s: &[T], at: usize) -> &[T; N] {
    debug_assert!(at + N <= s.len());
    // SAFETY: `at..at + N` is in bounds (the caller's contract), and
    // `[T; N]` has the layout and alignment of `T`.
    unsafe { &*s.as_ptr().add(at).cast::<[T; N]>() }
}

/// Computes a run of `n` weight rows of expert `e` from row `n0` against
/// `R` activation rows at one level: `out[t·stride + i]`.
type Run<const R: usize> = fn(
    &RowDecoder<'_>,
    usize,
    usize,
    usize,
    &[&QRow; R],
    &mut [f32],
    &mut [f32],
    usize,
) -> Result<()>;

/// The loop of every level's [`Run`] (inlined into the level's compiled
/// context): each weight row once, dotted with all `R` activation rows by
/// `kernel(row bytes, activation rows, scale scratch of ≥ 2·R·blocks,
/// out)`, which returns `None` if a length disagrees.
#[allow(clippy::too_many_arguments)] // a Run's arguments and its kernel
#[inline(always)]
fn run_rows<const R: usize>(
    dec: &RowDecoder<'_>,
    e: usize,
    n0: usize,
    n: usize,
    acts: &[&QRow; R],
    scratch: &mut [f32],
    out: &mut [f32],
    stride: usize,
    kernel: impl Fn(&[u8], usize, &[&QRow; R], &mut [f32], &mut [f32], usize) -> Option<()>,
) -> Result<()> {
    let Some((_, bytes)) = dec.ggml_rows(e, n0, n) else {
        // Name the bad index (raw_row's error), else the format.
        dec.raw_row(e, n0 + n.saturating_sub(1))?;
        return Err(invalid(OP, "dec", "GGUF blocks", "another format"));
    };
    let row_bytes = bytes.len() / n.max(1);
    if row_bytes == 0 {
        return Err(invalid(OP, "dec", "rows of K > 0", "K = 0"));
    }
    if kernel(bytes, row_bytes, acts, scratch, out, stride).is_none() {
        return Err(invalid(
            OP,
            "acts",
            "rows quantized for the weights' format and length",
            "another kind or length",
        ));
    }
    Ok(())
}

const OP: &str = "qdot_rows";

/// A stored format with integer kernels, as the kernels are picked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QFormat {
    /// GGUF blocks.
    Ggml(GgmlType),
    /// MLX packed affine of these bits, with scales and biases of this
    /// dtype.
    Affine(u32, affine::ScaleType),
    /// MLX microscaled floats.
    MlxFp(MlxFpMode),
}

impl std::fmt::Display for QFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QFormat::Ggml(t) => write!(f, "{t}"),
            QFormat::Affine(b, s) => write!(f, "affine{b} ({s:?} scales)"),
            QFormat::MlxFp(m) => write!(f, "mlx-{m}"),
        }
    }
}

/// The format of row `n` of expert `e` and its activations' kind (`None`:
/// no integer kernels).
fn format_of(dec: &RowDecoder<'_>, e: usize, n: usize) -> Result<Option<(QFormat, QKind)>> {
    Ok(match dec.raw_row(e, n)? {
        RawRow::Ggml(t, _) => kind_of(t).map(|k| (QFormat::Ggml(t), k)),
        RawRow::Affine { params, scales, .. } => {
            let s = affine::ScaleType::of(scales);
            kind_of_affine(params).map(|k| (QFormat::Affine(params.bits, s), k))
        }
        RawRow::MlxFp { mode, .. } => kind_of_mlxfp(mode).map(|k| (QFormat::MlxFp(mode), k)),
        _ => None,
    })
}

/// The run of `R` activation rows for weights of format `f` at `level`
/// (`None`: no kernel, or not for this architecture).
fn run_at<const R: usize>(level: SimdLevel, f: QFormat) -> Option<Run<R>> {
    use codebook::{Iq4Nl, Iq4Xs, MlxMxfp4, MlxNvfp4, Mxfp4};
    let t = match f {
        QFormat::Ggml(GgmlType::IQ4_NL) => return codebook::run_for::<Iq4Nl, R>(level),
        QFormat::Ggml(GgmlType::IQ4_XS) => return codebook::run_for::<Iq4Xs, R>(level),
        QFormat::Ggml(GgmlType::MXFP4) => return codebook::run_for::<Mxfp4, R>(level),
        QFormat::MlxFp(MlxFpMode::Mxfp4) => return codebook::run_for::<MlxMxfp4, R>(level),
        QFormat::MlxFp(MlxFpMode::Nvfp4) => return codebook::run_for::<MlxNvfp4, R>(level),
        QFormat::MlxFp(_) => return None,
        QFormat::Ggml(t) if grid::is_grid(t) => return grid::run_for::<R>(level, t),
        QFormat::Ggml(t) => t,
        QFormat::Affine(bits, s) => return affine::run_for::<R>(level, bits, s),
    };
    match level {
        SimdLevel::Portable => portable::run_for::<R>(t),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => ymm::run_for::<x86::Avx2, R>(t),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::AvxVnni => ymm::run_for::<x86::AvxVnni, R>(t),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512Vnni => avx512::run_for::<R>(t),
        #[allow(unreachable_patterns)] // reachable on other architectures
        _ => None,
    }
}

/// [`run_group`] for one `R`.
type Group = fn(
    SimdLevel,
    QFormat,
    &RowDecoder<'_>,
    usize,
    usize,
    usize,
    &[&QRow],
    &mut [f32],
    &mut [f32],
    usize,
) -> Result<()>;

/// Runs [`run_at`]`::<R>` on a group of exactly `R` activation rows.
#[allow(clippy::too_many_arguments)] // qdot_rows' arguments and the level
fn run_group<const R: usize>(
    level: SimdLevel,
    t: QFormat,
    dec: &RowDecoder<'_>,
    e: usize,
    n0: usize,
    n: usize,
    acts: &[&QRow],
    scratch: &mut [f32],
    out: &mut [f32],
    stride: usize,
) -> Result<()> {
    let acts: &[&QRow; R] = acts
        .try_into()
        .map_err(|_| invalid(OP, "acts", format!("{R} rows"), acts.len()))?;
    let run = run_at::<R>(level, t).ok_or_else(|| {
        invalid(
            OP,
            "level",
            format!("a level with integer kernels for {t}"),
            level,
        )
    })?;
    run(dec, e, n0, n, acts, scratch, out, stride)
}

/// `out[t·n + i] = Σ_k W[e, n0 + i, k]·a_t[k]` for every activation row
/// `a_t` of `acts` and `i < n`, with the integer kernels of `level` (an
/// error if this CPU does not support it, the weights have no integer
/// kernel, or a row was quantized for another kind or length). Each weight
/// row is read once per 4 activation rows. `scratch` is resized as needed.
#[allow(clippy::too_many_arguments)] // a run of rows, its inputs and the level
pub fn qdot_rows(
    level: SimdLevel,
    dec: &RowDecoder<'_>,
    e: usize,
    n0: usize,
    n: usize,
    acts: &[&QRow],
    scratch: &mut Vec<f32>,
    out: &mut [f32],
) -> Result<()> {
    if n == 0 || acts.is_empty() {
        return Ok(());
    }
    if dec.cols() == 0 {
        out.fill(0.0);
        return Ok(());
    }
    if !level.is_supported() {
        return Err(invalid(OP, "level", "a level this CPU supports", level));
    }
    if out.len() != acts.len() * n {
        return Err(invalid(
            OP,
            "out",
            format!("len {}", acts.len() * n),
            out.len(),
        ));
    }
    let Some((t, kind)) = format_of(dec, e, n0)? else {
        return Err(invalid(
            OP,
            "dec",
            "a format with integer kernels",
            "another format",
        ));
    };
    if let Some(a) = acts
        .iter()
        .find(|a| a.kind != kind || a.len() != dec.cols())
    {
        return Err(invalid(
            OP,
            "acts",
            format!("rows of {} quantized for {t}", dec.cols()),
            format!("{:?}, len {}", a.kind, a.len()),
        ));
    }
    let blocks = dec.cols() / kind.block;
    // (The codebook formats: 2·4·2 + 2 per block, and 8.)
    scratch.resize(18 * blocks + 4 * n + 8, 0.0);
    for (ag, og) in acts.chunks(4).zip(out.chunks_mut(4 * n)) {
        let group: Group = match ag.len() {
            1 => run_group::<1>,
            2 => run_group::<2>,
            3 => run_group::<3>,
            _ => run_group::<4>,
        };
        group(level, t, dec, e, n0, n, ag, scratch, og, n)?;
    }
    Ok(())
}
