//! Integer dot products of stored weight rows with activations quantized to
//! 8-bit blocks (the [`ActMode::Q8`](crate::cpu::ActMode) path of the fused
//! dots).
//!
//! Each activation row is quantized once per call ([`QRow::new`]), in
//! blocks matching the weight format's: 32 values per scale for the
//! 32-weight GGUF types (like ggml's q8_0), 256 for the K-quants (q8_K).
//! A block with largest magnitude `amax` has the f32 scale
//! `d = amax/(127·2³)`; each lane of 4 values has a shift `s ∈ 0..=3`, the
//! smallest that keeps its codes within ±127, and its values are
//! `d·(y_i << s)` with `y_i = round(x_i·127·2^(3−s)/amax)` (ties to even).
//! The shifts (ggml has none) give a lane of small values up to 8 times
//! finer steps than the block's largest value would allow; they cost one
//! shift of the integer lanes, and bring the activation error of
//! heavy-tailed rows (SwiGLU outputs, the down projection's input) from
//! ~8e-5 to ~2e-5. A row also keeps the shifted sums of its codes per 16
//! (the K-quants' mins) and, for the weight types whose codes are offset
//! (Q4_0's `q − 8`), the lane sums times that offset ([`QKind`]).
//!
//! A weight block then costs integer multiply-adds of its codes with the
//! activation codes — exact, in `i32` — and one f32 scale product per 32
//! (256) weights. The integer part of block `b` is kept as 8 lanes
//! `L_b[j] = (Σ_{k<4} w[4j+k]·y[4j+k]) << s_j` (with the offset, and for
//! the K-quants the group scales, applied in integers): lane `j` covers
//! codes `4j..4j+4` of every 32, as `vpdpbusd` (and AVX2's `vpmaddubsw` +
//! `vpmaddwd`) sum them. The float part is fixed: `s_b = w_scale_b · d_b`
//! (f32), and two accumulators of 8 lanes take the even and odd blocks,
//! `A[b % 2][j] += s_b · f32(L_b[j])` (product rounded, then the sum; no
//! FMA), then [`finish`] adds `A[0] + A[1]` lane by lane, the lanes in a
//! fixed tree, and subtracts the min terms (Q4_K's
//! `(dmin_b·d_b)·Σ_g m_g·Σy_g`, accumulated in block order). Every level
//! computes exactly this, so the [`Portable`](SimdLevel::Portable), AVX2
//! and VNNI kernels give bit-identical results, and a result depends only
//! on its weight row and activation row (batch- and thread-invariant).
//!
//! Error bound: tested at NMSE ≤ 1e-4 against the f32 path, on random rows
//! (measured ~1.5e-5) and on the MoE-block fixtures (the tolerance
//! llama.cpp's `test-backend-ops` allows for `mul_mat_id`).
//!
//! Formats: Q4_0, Q8_0, Q4_K ([`kind_of`]). Levels: `portable` (plain Rust
//! integer arithmetic), `x86` (AVX2 `vpmaddubsw`/`vpmaddwd`; AVX-VNNI and
//! AVX512-VNNI `vpdpbusd`/`vpdpwssd`, on 256-bit vectors), chosen by
//! [`qdot_rows`]' level argument.

mod portable;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::cpu::SimdLevel;
use crate::error::{invalid, Result};
use crate::format::ggml::GgmlType;
use crate::format::{RawRow, RowDecoder};

/// How an activation row is quantized for one weight format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QKind {
    /// Values per activation scale: 32 or 256.
    block: usize,
    /// Offset `c` of the weight codes (Q4_0: 8): each lane of 4 codes
    /// carries `−c·Σy` ([`QRow::bias`]); 0 for none.
    offset: i32,
}

impl QKind {
    /// Values per activation scale.
    pub fn block(self) -> usize {
        self.block
    }
}

/// The activation quantization of weights of type `t`, if it has integer
/// dot kernels.
pub fn kind_of(t: GgmlType) -> Option<QKind> {
    match t {
        GgmlType::Q4_0 => Some(QKind {
            block: 32,
            offset: 8,
        }),
        // The VNNI kernels offset the signed codes by 128 (`vpdpbusd` takes
        // unsigned × signed).
        GgmlType::Q8_0 => Some(QKind {
            block: 32,
            offset: 128,
        }),
        GgmlType::Q4_K => Some(QKind {
            block: 256,
            offset: 0,
        }),
        _ => None,
    }
}

/// The activation quantization of the rows of `dec` (`None`: f32 only).
pub fn kind_of_rows(dec: &RowDecoder<'_>) -> Option<QKind> {
    match dec.raw_row(0, 0).ok()? {
        RawRow::Ggml(t, _) => kind_of(t).filter(|k| dec.cols() > 0 && dec.cols() % k.block == 0),
        _ => None,
    }
}

/// One activation row quantized to 8-bit blocks (see the module doc).
#[derive(Debug, Clone)]
pub struct QRow {
    kind: QKind,
    /// Codes, one per value.
    codes: Vec<i8>,
    /// Scale per block (`amax/(127·8)`).
    d: Vec<f32>,
    /// Shift (0..=3) of each lane of 4 codes: value `i` is
    /// `d·(codes[i] << shift[i/4])`.
    shift: Vec<u32>,
    /// `2^shift` of each pair of codes (the 16-bit multiplier of the K-quant
    /// kernels; empty for 32-value blocks).
    pow2: Vec<i16>,
    /// `−offset·Σ` of each lane of 4 codes, not shifted (empty for offset 0).
    bias: Vec<i32>,
    /// `Σ codes[i] << shift[i/4]` of each 16 codes.
    sums: Vec<i32>,
}

/// Round to nearest, ties to even, for `|v| < 2²²` (the f32 addition
/// rounds; any SSE2 build vectorizes it, unlike `round_ties_even`).
#[inline(always)]
fn round_even(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5·2²³
    (v + MAGIC) - MAGIC
}

/// Largest lane shift: a lane's step is `amax/127` divided by up to
/// `2^MAX_SHIFT`.
const MAX_SHIFT: u32 = 3;

impl QRow {
    /// Quantizes `x`; an error if its length is not a whole number of the
    /// kind's blocks. Non-finite values make their block's scale NaN (so the
    /// dots of the row are NaN, as f32 arithmetic would make them).
    ///
    /// A block with largest magnitude `amax` gets the scale
    /// `d = amax/(127·2³)`, and each lane of 4 values with largest
    /// magnitude `a` the smallest shift `s ∈ 0..=3` with `a·2^(3−s) ≤ amax`:
    /// its codes are `round(x·127·2^(3−s)/amax)` (ties to even; `|code| ≤
    /// 127`) and stand for `d·(code << s)`. So a lane of small values gets
    /// up to 8 times finer steps than the block's largest value allows.
    pub fn new(x: &[f32], kind: QKind) -> Result<QRow> {
        if kind.block == 0 || x.len() % kind.block != 0 {
            return Err(invalid(
                "QRow::new",
                "x",
                format!("a multiple of {} values", kind.block),
                x.len(),
            ));
        }
        let n = x.len();
        let mut codes = vec![0i8; n];
        let mut shift = vec![0u32; n / 4];
        let mut d = Vec::with_capacity(n / kind.block);
        let blocks = x
            .chunks_exact(kind.block)
            .zip(codes.chunks_exact_mut(kind.block))
            .zip(shift.chunks_exact_mut(kind.block / 4));
        for ((xb, cb), sb) in blocks {
            let amax = xb.iter().fold(0f32, |m, &v| m.max(v.abs()));
            if !xb.iter().all(|v| v.is_finite()) {
                d.push(f32::NAN);
                continue;
            }
            if amax == 0.0 {
                d.push(0.0);
                continue;
            }
            let id = 127.0 / amax;
            for ((xl, cl), sl) in xb.chunks_exact(4).zip(cb.chunks_exact_mut(4)).zip(sb) {
                let a = xl.iter().fold(0f32, |m, &v| m.max(v.abs()));
                // Powers of two scale exactly.
                let mut s = MAX_SHIFT;
                while s > 0 && a * (1 << (MAX_SHIFT + 1 - s)) as f32 <= amax {
                    s -= 1;
                }
                *sl = s;
                let id = id * (1 << (MAX_SHIFT - s)) as f32;
                for (c, &v) in cl.iter_mut().zip(xl) {
                    // |v·id| ≤ 127 (+ rounding): the cast saturates at 127.
                    *c = round_even(v * id) as i32 as i8;
                }
            }
            d.push(amax / (127 << MAX_SHIFT) as f32);
        }
        let sums = codes
            .chunks_exact(16)
            .zip(shift.chunks_exact(4))
            .map(|(c, s)| {
                c.chunks_exact(4)
                    .zip(s)
                    .map(|(c, &s)| c.iter().map(|&v| i32::from(v)).sum::<i32>() << s)
                    .sum()
            })
            .collect();
        let bias = if kind.offset == 0 {
            Vec::new()
        } else {
            codes
                .chunks_exact(4)
                .map(|c| -kind.offset * c.iter().map(|&v| i32::from(v)).sum::<i32>())
                .collect()
        };
        let pow2 = if kind.block == 256 {
            shift.iter().flat_map(|&s| [1i16 << s; 2]).collect()
        } else {
            Vec::new()
        };
        Ok(QRow {
            kind,
            codes,
            d,
            shift,
            pow2,
            bias,
            sums,
        })
    }

    /// The kind the row was quantized for.
    pub fn kind(&self) -> QKind {
        self.kind
    }

    /// Values in the row.
    pub fn len(&self) -> usize {
        self.codes.len()
    }

    /// Whether the row is empty.
    pub fn is_empty(&self) -> bool {
        self.codes.is_empty()
    }

    /// The codes, one per value.
    pub fn codes(&self) -> &[i8] {
        &self.codes
    }

    /// The shift of each lane of 4 codes.
    pub fn shifts(&self) -> &[u32] {
        &self.shift
    }

    /// The scale of each block.
    pub fn scales(&self) -> &[f32] {
        &self.d
    }

    /// `Σ codes[i] << shift[i/4]` of each 16 codes.
    pub fn sums16(&self) -> &[i32] {
        &self.sums
    }

    /// The row as the kernels see it: `d_b·(y_i << shift_i)`.
    pub fn dequantize(&self) -> Vec<f32> {
        let lanes = self.codes.chunks_exact(4).zip(&self.shift);
        lanes
            .enumerate()
            .flat_map(|(l, (c, &s))| {
                let d = self.d.get(4 * l / self.kind.block).copied().unwrap_or(0.0);
                c.iter().map(move |&q| d * f32::from(i16::from(q) << s))
            })
            .collect()
    }

    /// Codes of block `b` of `N` values (`None` past the end).
    #[inline(always)]
    fn codes_at<const N: usize>(&self, b: usize) -> Option<&[i8; N]> {
        self.codes.get(N * b..N * b + N)?.try_into().ok()
    }

    /// Lane biases of 32-value block `b`.
    #[inline(always)]
    fn bias_at(&self, b: usize) -> Option<&[i32; 8]> {
        self.bias.get(8 * b..8 * b + 8)?.try_into().ok()
    }

    /// Shifts of lanes `8g..8g + 8` (codes `32g..32g + 32`).
    #[inline(always)]
    fn shift_at(&self, g: usize) -> Option<&[u32; 8]> {
        self.shift.get(8 * g..8 * g + 8)?.try_into().ok()
    }

    /// Sums of the 16 runs of 16 codes of 256-value block `b`.
    #[inline(always)]
    fn sums_at(&self, b: usize) -> Option<&[i32; 16]> {
        self.sums.get(16 * b..16 * b + 16)?.try_into().ok()
    }
}

/// The per-block scale products `s[t·nb + b] = w_b · acts[t].d[b]` for
/// every activation row `t < R` and block `b < nb = row.len()/size`, with
/// `w_b` the f16 at byte `at` of block `b` widened by `widen(row, size, at,
/// w)` (exact, into `w[..nb]`); each product is rounded once, the same at
/// every level. Uses `scratch[..(R + 1)·nb]` and returns the products;
/// `None` if a length disagrees.
#[inline(always)]
fn block_scales<'s, const R: usize>(
    row: &[u8],
    size: usize,
    at: usize,
    acts: &[&QRow; R],
    scratch: &'s mut [f32],
    widen: impl Fn(&[u8], usize, usize, &mut [f32]) -> Option<()>,
) -> Option<&'s [f32]> {
    let nb = row.len() / size;
    if nb == 0 || row.len() != nb * size || scratch.len() < (R + 1) * nb {
        return None;
    }
    let (w, s) = scratch.split_at_mut(nb);
    widen(row, size, at, w)?;
    for (a, st) in acts.iter().zip(s.chunks_exact_mut(nb)) {
        if a.d.len() != nb {
            return None;
        }
        for ((o, &w), &d) in st.iter_mut().zip(&*w).zip(&a.d) {
            *o = w * d;
        }
    }
    s.get(..R * nb)
}

/// The f16 at byte `at` of each `size`-byte block of `row`, widened into
/// `w` one at a time ([`f16_to_f32`](crate::cpu::fast::dot::f16_to_f32)).
#[inline(always)]
fn widen_f16(row: &[u8], size: usize, at: usize, w: &mut [f32]) -> Option<()> {
    for (o, blk) in w.iter_mut().zip(row.chunks_exact(size)) {
        let h = u16::from_le_bytes([*blk.get(at)?, *blk.get(at + 1)?]);
        *o = crate::cpu::fast::dot::f16_to_f32(half::f16::from_bits(h), true);
    }
    Some(())
}

/// The data of the `R` activation rows of a kernel call, with lengths
/// checked once for `nb` blocks (so the kernels index them with [`chunk`]).
#[derive(Clone, Copy)]
struct Rows<'a, const R: usize> {
    /// Codes: `nb·block` each.
    y: [&'a [i8]; R],
    /// Lane biases: `nb·block/4` each (empty for kinds without an offset).
    bias: [&'a [i32]; R],
    /// Sums of 16: `nb·block/16` each.
    sums: [&'a [i32]; R],
    /// Lane shifts: `nb·block/4` each.
    shift: [&'a [u32]; R],
    /// Pair multipliers: `nb·block/2` each (empty for 32-value blocks).
    pow2: [&'a [i16]; R],
}

impl<'a, const R: usize> Rows<'a, R> {
    /// The rows, if each holds `nb` blocks of its kind (with lane biases
    /// if `with_bias`).
    #[inline(always)]
    fn new(acts: &[&'a QRow; R], nb: usize, with_bias: bool) -> Option<Self> {
        for a in acts {
            let n = nb.checked_mul(a.kind.block)?;
            let bias_ok = !with_bias || a.bias.len() == n / 4;
            let pow2_ok = a.kind.block != 256 || a.pow2.len() == n / 2;
            let ok = a.codes.len() == n && a.sums.len() == n / 16 && a.shift.len() == n / 4;
            if !ok || !bias_ok || !pow2_ok {
                return None;
            }
        }
        Some(Rows {
            y: std::array::from_fn(|t| acts[t].codes.as_slice()),
            bias: std::array::from_fn(|t| acts[t].bias.as_slice()),
            sums: std::array::from_fn(|t| acts[t].sums.as_slice()),
            shift: std::array::from_fn(|t| acts[t].shift.as_slice()),
            pow2: std::array::from_fn(|t| acts[t].pow2.as_slice()),
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

/// The dot from the two lane accumulators (even and odd blocks) and the
/// min terms: `Σ_j (a0[j] + a1[j]) − off`, the lanes summed as
/// `((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7))`.
#[inline(always)]
fn finish(a0: [f32; 8], a1: [f32; 8], off: f32) -> f32 {
    let mut l = [0f32; 8];
    for ((l, a), b) in l.iter_mut().zip(a0).zip(a1) {
        *l = a + b;
    }
    (((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))) - off
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
    kernel: impl Fn(&[u8], &[&QRow; R], &mut [f32], &mut [f32; R]) -> Option<()>,
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
    for (i, row) in bytes.chunks_exact(row_bytes).enumerate() {
        let mut o = [0f32; R];
        if kernel(row, acts, scratch, &mut o).is_none() {
            return Err(invalid(
                OP,
                "acts",
                "rows quantized for the weights' format and length",
                "another kind or length",
            ));
        }
        for (t, v) in o.into_iter().enumerate() {
            if let Some(d) = out.get_mut(t * stride + i) {
                *d = v;
            }
        }
    }
    Ok(())
}

const OP: &str = "qdot_rows";

/// The run of `R` activation rows for weights of type `t` at `level`
/// (`None`: no kernel, or not for this architecture).
fn run_at<const R: usize>(level: SimdLevel, t: GgmlType) -> Option<Run<R>> {
    match level {
        SimdLevel::Portable => portable::run_for::<R>(t),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => x86::run_for::<x86::Avx2, R>(t),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::AvxVnni => x86::run_for::<x86::AvxVnni, R>(t),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512Vnni => x86::run_for::<x86::Avx512Vnni, R>(t),
        #[allow(unreachable_patterns)] // reachable on other architectures
        _ => None,
    }
}

/// [`run_group`] for one `R`.
type Group = fn(
    SimdLevel,
    GgmlType,
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
    t: GgmlType,
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
    let t = match dec.raw_row(e, n0)? {
        RawRow::Ggml(t, _) => t,
        _ => return Err(invalid(OP, "dec", "GGUF blocks", "another format")),
    };
    let kind = kind_of(t).ok_or_else(|| invalid(OP, "dec", "a type with integer kernels", t))?;
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
    scratch.resize(2 * (4 + 1) * blocks, 0.0);
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
