//! Fused dequantize-and-dot of one stored weight row with f32 activations.
//!
//! Used when an expert has only a few activation rows (decode), where
//! dequantizing a row to memory first would cost more than the dot itself.
//! Every format with a power-of-two code width, 3/5/6-bit affine, MLX's
//! microscaled modes, FP8 block-scaled rows and every GGUF type but the grid
//! and ternary ones has a fused kernel ([`ggml`], [`affine`], [`mlxfp`],
//! [`fp8`]): codes are widened to
//! f32 in registers, multiplied by `x` and accumulated per block or group;
//! the per-block scale is applied once per 32 products, and per-block offsets
//! (Q4_1's min, the K-quants' mins, affine biases) once per block through the
//! block sums of `x` ([`XSums`], computed once per activation row).
//!
//! The GGUF kernels and the 2/4/8-bit affine ones are written with the 8-lane
//! vectors of [`simd`] (AVX2 + FMA intrinsics at the [`SimdLevel::Avx2`]
//! level, plain arrays at [`SimdLevel::Portable`]): codes are widened from bytes 8 at a time
//! (`vpmovzxbd`), split with shifts and masks, converted and multiplied into
//! per-block sums, which are scaled into two pairs of accumulators (even and
//! odd blocks, so no accumulator waits on the previous block's multiply-add).
//! The 3/5/6-bit affine and dense kernels are plain Rust over fixed-size
//! lane arrays (32 codes, 16 accumulator lanes) that LLVM vectorizes: fixed-
//! size block views remove every bounds check, and [`Simd::fma`] maps to
//! `vfmadd` at the AVX2 level.
//!
//! Every kernel is generic over the [`Simd`] level and its out-of-line
//! bodies run inside [`Simd::enter`] (compiled with the level's target
//! features); [`dot_rows`] picks the level once per call
//! ([`simd_level`], detected once per process), [`dot_rows_at`] takes it
//! as an argument.
//! Formats without a fused kernel (mlx-native u8 codes, the GGUF IQ1–IQ3
//! grid and TQ* ternary types on the f32 path — by default they take the
//! integer kernels of `qdot::grid` — rows whose bytes are not 2-aligned)
//! decode into a scratch row and use
//! [`dot`](super::gather_mm::dot).

mod affine;
mod fp8;
#[cfg(target_arch = "x86_64")]
mod fp8_zmm;
mod ggml;
mod kquant;
mod legacy;
mod mlxfp;
mod simd;

#[cfg(target_arch = "x86_64")]
use simd::Avx2;
use simd::{Portable, Simd};

pub(crate) use kquant::k4_scales_mins;

use super::gather_mm::dot;
use crate::cpu::{simd_level, SimdLevel};
use crate::error::{invalid, Result};
use crate::format::{RawRow, RowDecoder, ScaleRow};
use half::{bf16, f16};
use std::marker::PhantomData;

/// Codes a kernel widens at a time: four 8-wide AVX2 registers.
const L: usize = 32;

/// Lanes of the accumulators: two AVX2 registers, one per 16-weight half of
/// a 32-code pack (so 16-weight groups keep separate scales without extra
/// work), each updated once per pack.
const A: usize = 16;

/// Accumulator lanes.
type Acc = [f32; A];

/// `t += q·x` folded to 16 lanes (an unscaled group accumulator).
#[inline(always)]
fn fold_fma<V: Simd>(t: &mut Acc, q: &[f32; L], x: &[f32; L]) {
    for j in 0..A {
        t[j] = V::fma(q[A + j], x[A + j], V::fma(q[j], x[j], t[j]));
    }
}

/// Sum of the lanes: the two registers, then halves.
///
/// Kept out of line and taking the lanes by value: the kernels then store
/// their accumulator registers once, after the loop. Inlined (or given the
/// accumulator's address), LLVM split the accumulators into scalars or kept
/// them in memory inside the hot loop.
#[inline(never)]
fn lanes_sum(acc: Acc) -> f32 {
    let mut a = acc;
    for j in 0..8 {
        a[j] += a[8 + j];
    }
    for j in 0..4 {
        a[j] += a[4 + j];
    }
    (a[0] + a[2]) + (a[1] + a[3])
}

/// f16 → f32 (exact, every bit pattern) in integer arithmetic.
///
/// `half`'s F16C path inserts the 16 bits into an otherwise undefined vector
/// register, which LLVM may pick from a live accumulator: a false dependency
/// that chains every block's scale conversion to the previous block's
/// multiply-adds. Here: rebias the exponent; subnormals are renormalized by
/// one subtraction of normal floats (no subnormal arithmetic); Inf/NaN get
/// exponent 255 and keep their payload (Giesen's `half_to_float`).
///
/// `branchless` selects with masks instead of branches: for K-quant scales,
/// which are often subnormal f16; per-block scales of the 32-weight formats
/// are practically always normal, where a predicted branch costs less.
#[inline(always)]
pub(crate) fn f16_to_f32(h: f16, branchless: bool) -> f32 {
    let h = u32::from(h.to_bits());
    let em = (h & 0x7fff) << 13;
    let exp = em & 0x0f80_0000;
    let sign = (h & 0x8000) << 16;
    // Normal: exponent + (127 − 15).
    let o = em + 0x3800_0000;
    // Subnormal: 2⁻¹⁴·(1 + m/1024) − 2⁻¹⁴, exact.
    let sub = || (f32::from_bits(o + 0x0080_0000) - f32::from_bits(0x3880_0000)).to_bits();
    // Inf/NaN: exponent 255.
    let inf_nan = o + 0x3800_0000;
    let bits = if branchless {
        let is_sub = u32::from(exp == 0).wrapping_neg();
        let is_inf = u32::from(exp == 0x0f80_0000).wrapping_neg();
        (sub() & is_sub) | (inf_nan & is_inf) | (o & !(is_sub | is_inf))
    } else if exp == 0 {
        sub()
    } else if exp == 0x0f80_0000 {
        inf_nan
    } else {
        o
    };
    f32::from_bits(bits | sign)
}

/// A stored scale or bias dtype, widened without `half`'s F16C call (see
/// [`f16_to_f32`]).
trait Widen: Copy {
    /// The value as f32 (exact).
    fn widen(self) -> f32;

    /// A dense row stored in this dtype.
    fn dense_row(raw: RawRow<'_>) -> Option<&[Self]>;

    /// Affine scales or biases stored in this dtype.
    fn scale_row(row: ScaleRow<'_>) -> Option<&[Self]>;

    /// `dst[i] = src[i]` widened, for equal lengths (else nothing).
    #[inline(always)]
    fn widen_into<V: Simd>(src: &[Self], dst: &mut [f32]) {
        if src.len() == dst.len() {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = s.widen();
            }
        }
    }
}

impl Widen for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    #[inline(always)]
    fn dense_row(raw: RawRow<'_>) -> Option<&[Self]> {
        match raw {
            RawRow::F32(w) => Some(w),
            _ => None,
        }
    }
    #[inline(always)]
    fn scale_row(row: ScaleRow<'_>) -> Option<&[Self]> {
        match row {
            ScaleRow::F32(v) => Some(v),
            _ => None,
        }
    }
}

impl Widen for f16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        f16_to_f32(self, false)
    }
    #[inline(always)]
    fn dense_row(raw: RawRow<'_>) -> Option<&[Self]> {
        match raw {
            RawRow::F16(w) => Some(w),
            _ => None,
        }
    }
    #[inline(always)]
    fn scale_row(row: ScaleRow<'_>) -> Option<&[Self]> {
        match row {
            ScaleRow::F16(v) => Some(v),
            _ => None,
        }
    }

    /// Whole registers at a time ([`Simd::f16x8`]: F16C's `vcvtph2ps` from
    /// memory at the AVX2 level), the tail (< 8) one by one: `half` pads a
    /// tail through a stack buffer, and reading that back stalls
    /// store-to-load forwarding.
    #[inline(always)]
    fn widen_into<V: Simd>(src: &[Self], dst: &mut [f32]) {
        if src.len() == dst.len() {
            let n8 = src.len() & !7;
            let (s8, st) = src.split_at(n8);
            let (d8, dt) = dst.split_at_mut(n8);
            for (d, s) in d8.chunks_exact_mut(8).zip(s8.chunks_exact(8)) {
                if let (Ok(d), Some(s)) = (<&mut [f32; 8]>::try_from(d), arr(s)) {
                    *d = V::f16x8(s);
                }
            }
            for (d, &s) in dt.iter_mut().zip(st) {
                *d = s.widen();
            }
        }
    }
}

impl Widen for bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
    #[inline(always)]
    fn dense_row(raw: RawRow<'_>) -> Option<&[Self]> {
        match raw {
            RawRow::Bf16(w) => Some(w),
            _ => None,
        }
    }
    #[inline(always)]
    fn scale_row(row: ScaleRow<'_>) -> Option<&[Self]> {
        match row {
            ScaleRow::Bf16(v) => Some(v),
            _ => None,
        }
    }
}

/// A fixed-size view of a slice (`None` if the length differs; in the kernels
/// lengths come from `chunks_exact`, so the check compiles away).
#[inline(always)]
fn arr<T, const N: usize>(s: &[T]) -> Option<&[T; N]> {
    s.try_into().ok()
}

/// Sums of one activation row over consecutive blocks of 16, 32, 64 and 128
/// (a shorter tail block is summed as is), and the row permuted for the
/// byte-wise affine kernels ([`XSums::permuted`]).
pub struct XSums {
    /// Sums over blocks of 16, 32, 64, 128.
    by_size: [Vec<f32>; 4],
    /// The row permuted for 2 and 4 codes per byte.
    perm: [Vec<f32>; 2],
}

impl XSums {
    /// Block sums of one activation row.
    pub fn new(x: &[f32]) -> XSums {
        let s16: Vec<f32> = x.chunks(16).map(|c| c.iter().sum()).collect();
        let pairs = |v: &[f32]| -> Vec<f32> { v.chunks(2).map(|c| c.iter().sum()).collect() };
        let s32 = pairs(&s16);
        let s64 = pairs(&s32);
        let s128 = pairs(&s64);
        XSums {
            by_size: [s16, s32, s64, s128],
            perm: [permute(x, 2), permute(x, 4)],
        }
    }

    /// The sums over blocks of `size` (16, 32, 64 or 128; empty otherwise).
    #[inline]
    fn of(&self, size: usize) -> &[f32] {
        let i = match size {
            16 => 0,
            32 => 1,
            64 => 2,
            128 => 3,
            _ => return &[],
        };
        self.by_size.get(i).map_or(&[], |v| v.as_slice())
    }

    /// The row in the order of `c` codes per byte (2 or 4; empty
    /// otherwise): in each run of `8c` values, value `c·m + t` moves to
    /// `8t + m`, the order in which the kernels widen the codes of 8 bytes
    /// (code `t` of the 8 bytes into one vector).
    #[inline]
    fn permuted(&self, c: usize) -> &[f32] {
        let i = match c {
            2 => 0,
            4 => 1,
            _ => return &[],
        };
        self.perm.get(i).map_or(&[], |v| v.as_slice())
    }
}

/// `x` in the order of `c` codes per byte (see [`XSums::permuted`]); a
/// tail shorter than `8c` is kept in order.
fn permute(x: &[f32], c: usize) -> Vec<f32> {
    let mut out = x.to_vec();
    for (o, x) in out.chunks_exact_mut(8 * c).zip(x.chunks_exact(8 * c)) {
        for (m, xm) in x.chunks_exact(c).enumerate() {
            for (t, &v) in xm.iter().enumerate() {
                if let Some(o) = o.get_mut(8 * t + m) {
                    *o = v;
                }
            }
        }
    }
    out
}

/// A fused kernel for one stored-row format.
trait RowKernel {
    /// `Σ_i w[i]·x[i]` of one stored row given the block sums of `x`;
    /// `None` if the row is not of this kernel's format or the lengths
    /// disagree (then the caller decodes and dots).
    fn dot<V: Simd>(raw: &RawRow<'_>, x: &[f32], xs: &XSums) -> Option<f32>;
}

/// Computes a run of rows with one kernel: the arguments of [`dot_rows`].
type Run = fn(&RowDecoder<'_>, usize, usize, &[f32], &XSums, &mut [f32], &mut [f32]) -> Result<()>;

/// [`dot_rows`] with kernel `K` at level `V`, monomorphized so that each
/// row's [`RawRow`] is read in place (a row passed by value through a
/// function pointer was copied with overlapping stores and loads, stalling
/// every row). The loop runs in [`Simd::enter`], so the kernel's inlined
/// parts are compiled for the level too.
fn run<K: RowKernel, V: Simd>(
    dec: &RowDecoder<'_>,
    e: usize,
    n0: usize,
    x: &[f32],
    xs: &XSums,
    scratch: &mut [f32],
    out: &mut [f32],
) -> Result<()> {
    V::enter(
        #[inline(always)]
        move || {
            for (n, o) in (n0..).zip(out.iter_mut()) {
                let raw = dec.raw_row(e, n)?;
                *o = match K::dot::<V>(&raw, x, xs) {
                    Some(v) => v,
                    None => {
                        dec.decode(e, n, scratch)?;
                        dot(scratch, x)
                    }
                };
            }
            Ok(())
        },
    )
}

/// Formats without a fused kernel: decode each row, then dot.
pub(super) struct Decode;

impl RowKernel for Decode {
    #[inline(always)]
    fn dot<V: Simd>(_: &RawRow<'_>, _: &[f32], _: &XSums) -> Option<f32> {
        None
    }
}

/// The kernel run for rows stored like `raw`, at level `V`.
fn run_for<V: Simd>(raw: &RawRow<'_>) -> Run {
    let fused = match raw {
        RawRow::F32(_) => Some(run::<Dense<f32>, V> as Run),
        RawRow::F16(_) => Some(run::<Dense<f16>, V> as Run),
        RawRow::Bf16(_) => Some(run::<Dense<bf16>, V> as Run),
        RawRow::Ggml(t, _) => Some(ggml::run_for::<V>(*t)),
        RawRow::Affine { params, scales, .. } => match scales {
            ScaleRow::F32(_) => affine::run_for::<f32, V>(*params),
            ScaleRow::F16(_) => affine::run_for::<f16, V>(*params),
            ScaleRow::Bf16(_) => affine::run_for::<bf16, V>(*params),
        },
        RawRow::MlxFp { mode, .. } => Some(mlxfp::run_for::<V>(*mode)),
        RawRow::Fp8Block { block_k, .. } => fp8::run_for::<V>(*block_k),
        RawRow::AffineU8 { .. } => None,
    };
    fused.unwrap_or(run::<Decode, V>)
}

/// The kernel run for rows stored like `raw` at `level` (`None` if this
/// build has no kernels for the level).
fn run_at(level: SimdLevel, raw: &RawRow<'_>) -> Option<Run> {
    match level {
        SimdLevel::Portable => Some(run_for::<Portable>(raw)),
        // The VNNI levels add integer dot products only (`qdot`).
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 | SimdLevel::AvxVnni => Some(run_for::<Avx2>(raw)),
        // e4m3 rows: 512-bit kernels, the same bits (`fp8_zmm`).
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512Vnni => {
            Some(fp8_zmm::run_for(raw).unwrap_or_else(|| run_for::<Avx2>(raw)))
        }
        #[allow(unreachable_patterns)] // reachable on other architectures
        _ => None,
    }
}

/// Dense rows of `T`: widened 32 weights at a time.
struct Dense<T>(PhantomData<T>);

impl<T: Widen> RowKernel for Dense<T> {
    #[inline(always)]
    fn dot<V: Simd>(raw: &RawRow<'_>, x: &[f32], _: &XSums) -> Option<f32> {
        let w = T::dense_row(*raw)?;
        V::enter(
            #[inline(always)]
            || dense::<T, V>(w, x),
        )
    }
}

/// `Σ_i w[i]·x[i]` for a dense row (`None` if the lengths differ); run out
/// of line, in [`Simd::enter`].
#[inline(always)]
fn dense<T: Widen, V: Simd>(w: &[T], x: &[f32]) -> Option<f32> {
    if w.len() != x.len() {
        return None;
    }
    let mut acc = [0f32; A];
    let (cw, cx) = (w.chunks_exact(L), x.chunks_exact(L));
    let tail: f32 = cw
        .remainder()
        .iter()
        .zip(cx.remainder())
        .map(|(a, b)| a.widen() * b)
        .sum();
    for (a, b) in cw.zip(cx) {
        let mut q = [0f32; L];
        T::widen_into::<V>(a, &mut q);
        fold_fma::<V>(&mut acc, &q, arr(b)?);
    }
    Some(lanes_sum(acc) + tail)
}

/// `Σ_k W[e, n, k]·x[k]` from the stored row; `xs` are the block sums of `x`
/// and `scratch` (len K) is used by formats without a fused kernel.
pub fn dot_row(
    dec: &RowDecoder<'_>,
    e: usize,
    n: usize,
    x: &[f32],
    xs: &XSums,
    scratch: &mut [f32],
) -> Result<f32> {
    let mut out = [0f32];
    dot_rows(dec, e, n, x, xs, scratch, &mut out)?;
    Ok(out[0])
}

/// `out[i] = Σ_k W[e, n0 + i, k]·x[k]` for every `i < out.len()`: [`dot_row`]
/// for a run of rows, choosing the kernel once, at this process's
/// [`simd_level`].
pub fn dot_rows(
    dec: &RowDecoder<'_>,
    e: usize,
    n0: usize,
    x: &[f32],
    xs: &XSums,
    scratch: &mut [f32],
    out: &mut [f32],
) -> Result<()> {
    dot_rows_at(simd_level(), dec, e, n0, x, xs, scratch, out)
}

/// [`dot_rows`] with the kernels of `level` (e.g. to compare
/// [`SimdLevel::Portable`] with the detected level); an error if this CPU
/// does not support the level ([`SimdLevel::is_supported`]).
#[allow(clippy::too_many_arguments)] // dot_rows' arguments and the level
pub fn dot_rows_at(
    level: SimdLevel,
    dec: &RowDecoder<'_>,
    e: usize,
    n0: usize,
    x: &[f32],
    xs: &XSums,
    scratch: &mut [f32],
    out: &mut [f32],
) -> Result<()> {
    if out.is_empty() {
        return Ok(());
    }
    let run = if level.is_supported() {
        run_at(level, &dec.raw_row(e, n0)?)
    } else {
        None
    };
    let Some(run) = run else {
        return Err(invalid(
            "dot_rows_at",
            "level",
            "a level this CPU supports",
            level,
        ));
    };
    run(dec, e, n0, x, xs, scratch, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_to_f32_matches_half_for_every_bit_pattern() {
        for branchless in [false, true] {
            for b in 0..=u16::MAX {
                let h = f16::from_bits(b);
                let (got, want) = (f16_to_f32(h, branchless), h.to_f32());
                // F16C quiets signaling NaNs; any NaN for a NaN is fine.
                let same = got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan());
                assert!(same, "{b:#06x} ({branchless}): {got:e} vs {want:e}");
            }
        }
    }

    /// Every e4m3 byte through a level's lanes, bit for bit as
    /// `e4m3_to_f32` (NaN codes: any NaN).
    fn e4m3_lanes_are_exact<V: Simd>() {
        use simd::{F8Ops, U8Ops};
        for b0 in (0..=255u8).step_by(8) {
            let b: [u8; 8] = std::array::from_fn(|i| b0 + i as u8);
            let got = V::enter(|| V::U8::bytes(&b).e4m3().to_array());
            for (&code, got) in b.iter().zip(got) {
                let want = crate::format::mlxfp::e4m3_to_f32(code);
                let same = got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan());
                assert!(same, "{code:#04x}: {got:e} vs {want:e}");
            }
        }
    }

    #[test]
    fn e4m3_lanes_are_exact_at_every_level() {
        e4m3_lanes_are_exact::<Portable>();
        #[cfg(target_arch = "x86_64")]
        if SimdLevel::Avx2.is_supported() {
            e4m3_lanes_are_exact::<Avx2>();
        }
    }

    #[test]
    fn bf16_widen_is_exact() {
        for b in (0..=u16::MAX).step_by(7) {
            let h = bf16::from_bits(b);
            let (got, want) = (h.widen(), h.to_f32());
            assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()));
        }
    }
}
