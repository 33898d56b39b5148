//! MLX affine quantization (`mx.quantize(w, group_size, bits, mode="affine")`).
//!
//! A row of `K` weights is cut into groups of `group_size`; each group has a
//! scale `s` and a bias `b` and each weight a `bits`-bit code `q`, with
//! `w ≈ s·q + b`.
//!
//! **Packing** (as MLX 0.32 writes it): the codes of a row form one continuous
//! little-endian bit stream, code `k` occupying bits `k·bits .. (k+1)·bits`,
//! stored in `u32` words LSB first. For 2, 4 and 8 bits a word holds whole
//! codes; for 3, 5 and 6 bits codes straddle words (MLX writes them as
//! 3/5/3-byte packs of 8/8/4 codes, which is the same bit stream). A row takes
//! `K·bits/32` words; every 32 codes take exactly `bits` words.
//!
//! **Quantization** (MLX's CPU `quantize`, computed in f32 on the input
//! widened from its own dtype): per group, `w_min`/`w_max`;
//! `scale = max((w_max − w_min)/(2^bits − 1), 1e-7)`, negated unless
//! `|w_min| > |w_max|`; `edge` is `w_min` or `w_max` accordingly;
//! `q0 = rint(edge/scale)`; if `q0 ≠ 0` then `scale = edge/q0`, `bias = edge`,
//! else `bias = 0`; codes `q = clamp(rint((w − bias)/scale), 0, 2^bits − 1)`
//! with the f32 scale and bias, which are rounded to the output dtype only
//! when stored. `rint` rounds half to even.
//!
//! **Dequantization** here is `s·q + b` in f32 (multiply, then add; no FMA),
//! bit-identical to `mx.dequantize` with f32 scales. With f16/bf16 scales MLX
//! computes in that dtype (two roundings); we return the exact f32 value.
//! [`dequantize_row`] is the CPU matmul's inner loop: one generic source,
//! monomorphized per bit width (`const BITS`) and scale type, a group at a
//! time, no allocation; on x86-64 builds without AVX2 it picks an AVX2
//! version at run time when the CPU has it.
//!
//! NaN or infinite weights are not supported (MLX's result is undefined there).

use crate::dtype::Float;
use crate::error::{ensure, invalid, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Bit widths `mx.quantize` supports.
pub const SUPPORTED_BITS: [u32; 6] = [2, 3, 4, 5, 6, 8];
/// Group sizes supported.
pub const SUPPORTED_GROUP_SIZES: [usize; 3] = [32, 64, 128];

/// Checks bits and group size.
pub fn check_params(op: &'static str, bits: u32, group_size: usize) -> Result<()> {
    ensure(
        SUPPORTED_BITS.contains(&bits),
        op,
        "bits",
        "2, 3, 4, 5, 6 or 8",
        bits,
    )?;
    ensure(
        SUPPORTED_GROUP_SIZES.contains(&group_size),
        op,
        "group_size",
        "32, 64 or 128",
        group_size,
    )
}

/// Output of [`quantize`]: packed words `[rows, cols·bits/32]`, scales and biases `[rows, cols/group_size]`.
#[derive(Debug, Clone, PartialEq)]
pub struct AffineQuantized<S> {
    /// Packed codes.
    pub packed: Vec<u32>,
    /// Per-group scales.
    pub scales: Vec<S>,
    /// Per-group biases.
    pub biases: Vec<S>,
}

/// Validates a `[rows, cols]` matrix shape for `bits`/`group_size` and returns
/// `(rows·cols, words per row, groups per row)`.
fn check_matrix(
    op: &'static str,
    rows: usize,
    cols: usize,
    bits: u32,
    group_size: usize,
) -> Result<(usize, usize, usize)> {
    check_params(op, bits, group_size)?;
    ensure(
        cols > 0 && cols.is_multiple_of(group_size),
        op,
        "cols",
        format_args!("a positive multiple of group_size {group_size}"),
        cols,
    )?;
    let numel = rows
        .checked_mul(cols)
        .ok_or_else(|| invalid(op, "rows·cols", "no overflow", format!("{rows}·{cols}")))?;
    // cols is a multiple of 32, so cols·bits/32 is exact.
    Ok((numel, cols / 32 * bits as usize, cols / group_size))
}

/// The largest code of `bits` bits, as f32.
fn n_bins(bits: u32) -> f32 {
    ((1u32 << bits) - 1) as f32
}

/// Appends codes LSB first to a little-endian `u32` bit stream.
struct BitWriter<'a> {
    out: &'a mut Vec<u32>,
    acc: u64,
    nbits: u32,
}

impl BitWriter<'_> {
    #[inline]
    fn push(&mut self, code: u32, bits: u32) {
        self.acc |= u64::from(code) << self.nbits;
        self.nbits += bits;
        if self.nbits >= 32 {
            self.out.push(self.acc as u32);
            self.acc >>= 32;
            self.nbits -= 32;
        }
    }
}

/// Scale, bias and the affine map of one group, computed as MLX does in f32.
fn group_params(g: &[f32], n_bins: f32) -> (f32, f32) {
    const EPS: f32 = 1e-7;
    // std::max / std::min semantics: keep the running value unless strictly beaten.
    let (mut w_min, mut w_max) = (f32::INFINITY, f32::NEG_INFINITY);
    for &x in g {
        if w_max < x {
            w_max = x;
        }
        if x < w_min {
            w_min = x;
        }
    }
    let mask = w_min.abs() > w_max.abs();
    let range = (w_max - w_min) / n_bins;
    let mut scale = if range < EPS { EPS } else { range };
    if !mask {
        scale = -scale;
    }
    let edge = if mask { w_min } else { w_max };
    let q0 = (edge / scale).round_ties_even();
    if q0 != 0.0 {
        (edge / q0, edge)
    } else {
        (scale, 0.0)
    }
}

/// Quantizes a row-major `[rows, cols]` matrix exactly as `mx.quantize` does.
///
/// `S` is the dtype of the input as MLX sees it and of the returned scales and
/// biases: `quantize::<S>(w)` equals `mx.quantize(w.astype(S))` bit for bit
/// (each weight is first rounded to `S`; a no-op for f32 or for values already
/// representable in `S`). `cols` must be a multiple of `group_size`.
pub fn quantize<S: Float>(
    w: &[f32],
    rows: usize,
    cols: usize,
    bits: u32,
    group_size: usize,
) -> Result<AffineQuantized<S>> {
    const OP: &str = "affine_quantize";
    let (numel, words_per_row, groups_per_row) = check_matrix(OP, rows, cols, bits, group_size)?;
    ensure(
        w.len() == numel,
        OP,
        "w",
        format_args!("{numel} elements ([{rows}, {cols}])"),
        w.len(),
    )?;
    let n_bins = n_bins(bits);
    let n_groups = rows * groups_per_row;
    let mut packed = Vec::with_capacity(rows * words_per_row);
    let mut scales = Vec::with_capacity(n_groups);
    let mut biases = Vec::with_capacity(n_groups);
    let mut writer = BitWriter {
        out: &mut packed,
        acc: 0,
        nbits: 0,
    };
    let mut g = vec![0f32; group_size];
    for src in w.chunks_exact(group_size) {
        for (d, &x) in g.iter_mut().zip(src) {
            *d = S::from_f32(x).to_f32();
        }
        let (scale, bias) = group_params(&g, n_bins);
        for &x in &g {
            let q = ((x - bias) / scale).round_ties_even();
            // std::min(std::max(q, 0), n_bins); NaN maps to 0 like `as`.
            let q = if q < 0.0 { 0.0 } else { q };
            let q = if n_bins < q { n_bins } else { q };
            writer.push(q as u32, bits);
        }
        scales.push(S::from_f32(scale));
        biases.push(S::from_f32(bias));
    }
    Ok(AffineQuantized {
        packed,
        scales,
        biases,
    })
}

/// Dequantizes one group of 32·n codes whose packed words are `words`
/// (`out.len()·BITS/32` of them): `out[k] = q[k]·scale + bias`.
///
/// `VSHIFT` picks the loop shape for 2/4/8 bits: with per-lane variable
/// shifts (AVX2) a flat loop over 32 codes vectorizes best; without them
/// (baseline SSE2) a loop over whole words with constant shifts does.
#[inline(always)]
fn dequant_group<const BITS: u32, const VSHIFT: bool>(
    words: &[u32],
    scale: f32,
    bias: f32,
    out: &mut [f32],
) {
    let bits = BITS as usize;
    if 32 % BITS == 0 {
        let mask = (1u32 << BITS) - 1;
        if VSHIFT {
            for (w, o) in words.chunks_exact(bits).zip(out.chunks_exact_mut(32)) {
                for (j, o) in o.iter_mut().enumerate() {
                    let bit = j * bits;
                    *o = ((w[bit / 32] >> (bit % 32)) & mask) as f32 * scale + bias;
                }
            }
        } else {
            for (&w, o) in words.iter().zip(out.chunks_exact_mut(32 / bits)) {
                for (j, o) in o.iter_mut().enumerate() {
                    *o = ((w >> (j * bits)) & mask) as f32 * scale + bias;
                }
            }
        }
    } else {
        // 32 codes per `BITS` words, read as four windows of 8 codes
        // (8·BITS ≤ 48 bits) that never reach past the pack's last word.
        let mask = (1u64 << BITS) - 1;
        for (w, o) in words.chunks_exact(bits).zip(out.chunks_exact_mut(32)) {
            for (p, o) in o.chunks_exact_mut(8).enumerate() {
                let bit = p * 8 * bits;
                let (i, sh) = (bit / 32, bit % 32);
                let mut u = u64::from(w[i]);
                if sh + 8 * bits > 32 {
                    u |= u64::from(w[i + 1]) << 32;
                }
                u >>= sh;
                for (j, o) in o.iter_mut().enumerate() {
                    *o = ((u >> (j * bits)) & mask) as f32 * scale + bias;
                }
            }
        }
    }
}

/// Dequantizes a validated row, one group at a time.
#[inline(always)]
fn dequant_row_impl<const BITS: u32, const VSHIFT: bool, S: Float>(
    group_size: usize,
    packed: &[u32],
    scales: &[S],
    biases: &[S],
    out: &mut [f32],
) {
    let words_per_group = group_size / 32 * BITS as usize;
    let groups = packed
        .chunks_exact(words_per_group)
        .zip(out.chunks_exact_mut(group_size))
        .zip(scales.iter().zip(biases));
    for ((w, o), (s, b)) in groups {
        dequant_group::<BITS, VSHIFT>(w, s.to_f32(), b.to_f32(), o);
    }
}

/// [`dequant_row_impl`] compiled for AVX2 (the
/// [`SimdLevel::Avx2`](crate::cpu::SimdLevel::Avx2) level).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dequant_row_avx2<const BITS: u32, S: Float>(
    group_size: usize,
    packed: &[u32],
    scales: &[S],
    biases: &[S],
    out: &mut [f32],
) {
    dequant_row_impl::<BITS, true, S>(group_size, packed, scales, biases, out)
}

/// Runs the best [`dequant_row_impl`] for this CPU: AVX2 at the AVX2 levels
/// (the process's [`simd_level`](crate::cpu::simd_level), detected once),
/// else the build's own target features. Kept out of line: one function per
/// bit width and scale type is what the vectorizer handles well (inlined all
/// into one, it gave up at opt-level 2).
#[inline(never)]
fn dequant_row_dispatch<const BITS: u32, S: Float>(
    group_size: usize,
    packed: &[u32],
    scales: &[S],
    biases: &[S],
    out: &mut [f32],
) {
    const AVX2_BUILD: bool = cfg!(target_feature = "avx2");
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::simd_level().has_avx2() {
        // SAFETY: `simd_level` picks a level with AVX2 only where AVX2, FMA
        // and F16C were detected at run time.
        unsafe { dequant_row_avx2::<BITS, S>(group_size, packed, scales, biases, out) };
        return;
    }
    dequant_row_impl::<BITS, AVX2_BUILD, S>(group_size, packed, scales, biases, out)
}

/// Dequantizes one packed row: `out[k] = scale[g]·q[k] + bias[g]`.
///
/// `out.len()` is the row length K (a multiple of `group_size`), `packed` has
/// `K·bits/32` words, `scales` and `biases` `K/group_size` entries. The result
/// is computed in f32 (multiply then add), so it is bit-identical to
/// `mx.dequantize` for f32 scales.
pub fn dequantize_row<S: Float>(
    bits: u32,
    group_size: usize,
    packed: &[u32],
    scales: &[S],
    biases: &[S],
    out: &mut [f32],
) -> Result<()> {
    const OP: &str = "affine_dequantize_row";
    let k = out.len();
    check_params(OP, bits, group_size)?;
    ensure(
        k > 0 && k.is_multiple_of(group_size),
        OP,
        "out",
        format_args!("length K, a positive multiple of group_size {group_size}"),
        k,
    )?;
    let (words, groups) = (k / 32 * bits as usize, k / group_size);
    ensure(
        packed.len() == words,
        OP,
        "packed",
        format_args!("{words} words for K={k}"),
        packed.len(),
    )?;
    ensure(
        scales.len() == groups,
        OP,
        "scales",
        format_args!("{groups} for K={k}"),
        scales.len(),
    )?;
    ensure(
        biases.len() == groups,
        OP,
        "biases",
        format_args!("{groups} for K={k}"),
        biases.len(),
    )?;
    match bits {
        2 => dequant_row_dispatch::<2, S>(group_size, packed, scales, biases, out),
        3 => dequant_row_dispatch::<3, S>(group_size, packed, scales, biases, out),
        4 => dequant_row_dispatch::<4, S>(group_size, packed, scales, biases, out),
        5 => dequant_row_dispatch::<5, S>(group_size, packed, scales, biases, out),
        6 => dequant_row_dispatch::<6, S>(group_size, packed, scales, biases, out),
        8 => dequant_row_dispatch::<8, S>(group_size, packed, scales, biases, out),
        _ => return Err(invalid(OP, "bits", "2, 3, 4, 5, 6 or 8", bits)),
    }
    Ok(())
}

/// Dequantizes one row of mlx-native's unpacked layout (one `u8` code per weight).
///
/// `out[k] = codes[k]·scales[k / group_size] + biases[k / group_size]`, in f32.
/// `codes` and `out` have the same length K, a positive multiple of
/// `group_size` (any positive group size); `scales`/`biases` have
/// `K/group_size` entries.
pub fn dequantize_u8_row(
    group_size: usize,
    codes: &[u8],
    scales: &[f32],
    biases: &[f32],
    out: &mut [f32],
) -> Result<()> {
    const OP: &str = "dequantize_u8_row";
    let k = out.len();
    ensure(group_size > 0, OP, "group_size", "> 0", group_size)?;
    ensure(
        k > 0 && k.is_multiple_of(group_size),
        OP,
        "out",
        format_args!("a positive multiple of group_size {group_size}"),
        k,
    )?;
    ensure(
        codes.len() == k,
        OP,
        "codes",
        format_args!("len {k} (= out)"),
        codes.len(),
    )?;
    let groups = k / group_size;
    ensure(
        scales.len() == groups,
        OP,
        "scales",
        format_args!("{groups} for K={k}"),
        scales.len(),
    )?;
    ensure(
        biases.len() == groups,
        OP,
        "biases",
        format_args!("{groups} for K={k}"),
        biases.len(),
    )?;
    let it = codes
        .chunks_exact(group_size)
        .zip(out.chunks_exact_mut(group_size))
        .zip(scales.iter().zip(biases));
    for ((c, o), (&s, &b)) in it {
        for (o, &q) in o.iter_mut().zip(c) {
            *o = f32::from(q) * s + b;
        }
    }
    Ok(())
}

/// Packs `bits`-bit codes (one per byte) into MLX's LSB-first `u32` stream.
///
/// `codes.len()` must be a multiple of 32 and every code below `2^bits`.
pub fn pack_codes(bits: u32, codes: &[u8]) -> Result<Vec<u32>> {
    const OP: &str = "pack_codes";
    ensure(
        SUPPORTED_BITS.contains(&bits),
        OP,
        "bits",
        "2, 3, 4, 5, 6 or 8",
        bits,
    )?;
    ensure(
        codes.len().is_multiple_of(32),
        OP,
        "codes",
        "a multiple of 32 codes",
        codes.len(),
    )?;
    let limit = 1u32 << bits;
    if let Some((k, &c)) = codes
        .iter()
        .enumerate()
        .find(|&(_, &c)| u32::from(c) >= limit)
    {
        return Err(invalid(
            OP,
            "codes",
            format!("codes < {limit}"),
            format!("{c} at index {k}"),
        ));
    }
    let mut out = Vec::with_capacity(codes.len() / 32 * bits as usize);
    let mut writer = BitWriter {
        out: &mut out,
        acc: 0,
        nbits: 0,
    };
    for &c in codes {
        writer.push(u32::from(c), bits);
    }
    Ok(out)
}

/// Unpacks MLX's `u32` code stream into one code per byte.
///
/// `packed.len()` must be a multiple of `bits` (32 codes per `bits` words).
pub fn unpack_codes(bits: u32, packed: &[u32]) -> Result<Vec<u8>> {
    const OP: &str = "unpack_codes";
    ensure(
        SUPPORTED_BITS.contains(&bits),
        OP,
        "bits",
        "2, 3, 4, 5, 6 or 8",
        bits,
    )?;
    let b = bits as usize;
    ensure(
        packed.len().is_multiple_of(b),
        OP,
        "packed",
        format_args!("a multiple of {bits} words"),
        packed.len(),
    )?;
    let mask = (1u64 << bits) - 1;
    let mut out = Vec::with_capacity(packed.len() / b * 32);
    let (mut acc, mut nbits) = (0u64, 0u32);
    for &w in packed {
        acc |= u64::from(w) << nbits;
        nbits += 32;
        while nbits >= bits {
            out.push((acc & mask) as u8);
            acc >>= bits;
            nbits -= bits;
        }
    }
    Ok(out)
}

/// Random packed codes with sane scales and biases, for synthetic benchmarks.
///
/// Codes are uniform; per group an amplitude `a ∈ [0.01, 0.1)` is drawn and
/// `scale = 2a/(2^bits − 1)`, `bias = −a·(1 + δ)`, `δ ∈ [−0.1, 0.1)`, so weights
/// lie in about `[−1.1a, 1.1a]`. Deterministic in `seed`.
pub fn random_quantized<S: Float>(
    rows: usize,
    cols: usize,
    bits: u32,
    group_size: usize,
    seed: u64,
) -> Result<AffineQuantized<S>> {
    const OP: &str = "random_quantized";
    let (_, words_per_row, groups_per_row) = check_matrix(OP, rows, cols, bits, group_size)?;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut packed = vec![0u32; rows * words_per_row];
    rng.fill(packed.as_mut_slice());
    let n_groups = rows * groups_per_row;
    let n_bins = n_bins(bits);
    let mut scales = Vec::with_capacity(n_groups);
    let mut biases = Vec::with_capacity(n_groups);
    for _ in 0..n_groups {
        let a: f32 = rng.random_range(0.01..0.1);
        let d: f32 = rng.random_range(-0.1..0.1);
        scales.push(S::from_f32(2.0 * a / n_bins));
        biases.push(S::from_f32(-a * (1.0 + d)));
    }
    Ok(AffineQuantized {
        packed,
        scales,
        biases,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both loop shapes of every bit width (the public entry point runs only
    /// the one this CPU selects) agree exactly with `unpack_codes` + the formula.
    fn check_shapes<const BITS: u32>() -> Result<()> {
        let (cols, gs) = (256, 64);
        let q = random_quantized::<f32>(1, cols, BITS, gs, u64::from(BITS))?;
        let codes = unpack_codes(BITS, &q.packed)?;
        let want: Vec<u32> = codes
            .iter()
            .enumerate()
            .map(|(k, &c)| (f32::from(c) * q.scales[k / gs] + q.biases[k / gs]).to_bits())
            .collect();
        let mut out = vec![0f32; cols];
        dequant_row_impl::<BITS, false, f32>(gs, &q.packed, &q.scales, &q.biases, &mut out);
        assert_eq!(
            out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            want,
            "bits {BITS}"
        );
        out.fill(0.0);
        dequant_row_impl::<BITS, true, f32>(gs, &q.packed, &q.scales, &q.biases, &mut out);
        assert_eq!(
            out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            want,
            "bits {BITS}"
        );
        Ok(())
    }

    #[test]
    fn loop_shapes_agree() -> Result<()> {
        check_shapes::<2>()?;
        check_shapes::<3>()?;
        check_shapes::<4>()?;
        check_shapes::<5>()?;
        check_shapes::<6>()?;
        check_shapes::<8>()
    }
}
