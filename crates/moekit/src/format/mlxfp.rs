//! MLX's microscaled floating-point modes (`mx.quantize(w, mode=...)`,
//! MLX 0.32): `mxfp4`, `nvfp4` and `mxfp8`.
//!
//! | mode | codes | group | scale | bias |
//! |---|---|---|---|---|
//! | `mxfp4` | 4-bit e2m1 | 32 | e8m0 (`u8`) | – |
//! | `nvfp4` | 4-bit e2m1 | 16 | e4m3 (`u8`) | – |
//! | `mxfp8` | 8-bit e4m3 | 32 | e8m0 (`u8`) | – |
//!
//! MLX accepts exactly these (group size, bits) per mode (`fp_quantize` in
//! `mlx/ops.cpp`: "mxfp4 quantization requires group size 32", ...).
//!
//! **Layout** (one definition, shared with `kernels/dequant_mlx.cuh`): a row
//! of K weights is `K·bits/32` `u32` words, code `k` at bits
//! `k·bits .. (k+1)·bits` of the row's little-endian stream (LSB first, as
//! MLX's affine packing: 8 e2m1 codes or 4 e4m3 bytes a word), and
//! `K/group_size` scale bytes. Stored tensors: `weight` `u32 [E, N,
//! K·bits/32]`, `scales` `u8 [E, N, K/group_size]`, no `biases`.
//!
//! **Values**, as MLX's CPU `mx.dequantize` (`fp_dequantize`) computes them:
//! * e2m1 code `c`: `FP4_LUT[c]` = ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}
//!   (bit 3 is the sign);
//! * e4m3 byte `b` (`mx.from_fp8`, OCP e4m3fn): the bits `(b & 127) << 7`
//!   read as an f16, times 256, negated if `b & 128`; 0x7F and 0xFF are NaN;
//! * e8m0 scale `e`: `2^(e − 127)` computed in f32, so `e = 0` is the
//!   subnormal 2^−127 and `e = 255` is +∞ (OCP says NaN);
//! * e4m3 scale (nvfp4): the e4m3 value of the byte (times `global_scale /
//!   (448·6)` when MLX is given a global scale; the format leaves it out:
//!   the safetensors loader reads mlx-lm's per-expert `global_scale` as the
//!   experts' output scale, `crate::ops::ffn::ExpertScales`, the same
//!   product since the factor is one per expert matrix).
//!
//! A weight is `value(code) · scale`: one f32 product, exact except where it
//! overflows, so bit-identical to `mx.dequantize(..., dtype=mx.float32)`.
//!
//! **Quantization** ([`quantize`]) is MLX 0.32.4's CPU `mx.quantize(w,
//! mode=...)` of f32 weights, byte for byte: per group `a = max|w|` (NaN
//! if any weight is NaN) and `s = a / m` in f32, `m` = 6 (e2m1) or 448
//! (e4m3);
//! * e8m0 scale (mxfp4, mxfp8): exponent `e = ⌈log2 s⌉` (MLX rounds
//!   `log2 s` to nearest and adds one where `2^e < s`, which is exactly the
//!   ceiling; MLX's source at 0.32.2 still rounded to nearest, so older
//!   MLX writes other bytes), byte `e + 127` wrapped to 8 bits (so groups
//!   with `s` at most 2^−128, i.e. `a` below about 2^−125, or 2^−119 for
//!   mxfp8, get bytes 234..255, as MLX's float→uint8 cast on x86-64 gives),
//!   divisor `2^e`; `s = 0` gives byte 127 and divisor 1; `s` NaN or
//!   ∞ gives byte 128 and divisor 0 (MLX's int32 conversion of NaN/∞ is
//!   `INT_MIN` on x86-64, and its round-up step adds one), so every e2m1
//!   code of that group is 0 and every e4m3 code ±448 (0x7E/0xFE: `x/0` is
//!   ±∞, and `0/0` the CPU's default NaN, negative on x86-64);
//! * e4m3 scale (nvfp4): byte `to_e4m3(s)`, divisor its e4m3 value;
//! * codes of `v = w / divisor`: e2m1 is MLX's `argmin |v − FP4_LUT[i]|`,
//!   the first minimum, so ties go to the smaller magnitude (0.75 → 0.5,
//!   5 → 4), −0.25 → +0 and NaN → code 0; e4m3 is [`f32_to_e4m3`].

use crate::error::{ensure, invalid, Result};
use std::fmt;

/// One of MLX's microscaled floating-point modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MlxFpMode {
    /// e2m1 codes, groups of 32, e8m0 scales.
    Mxfp4,
    /// e2m1 codes, groups of 16, e4m3 scales.
    Nvfp4,
    /// e4m3 codes, groups of 32, e8m0 scales.
    Mxfp8,
}

impl MlxFpMode {
    /// Every mode.
    pub const ALL: [MlxFpMode; 3] = [MlxFpMode::Mxfp4, MlxFpMode::Nvfp4, MlxFpMode::Mxfp8];

    /// MLX's `mode` string (`"mxfp4"`, `"nvfp4"`, `"mxfp8"`).
    pub fn mlx_name(self) -> &'static str {
        match self {
            MlxFpMode::Mxfp4 => "mxfp4",
            MlxFpMode::Nvfp4 => "nvfp4",
            MlxFpMode::Mxfp8 => "mxfp8",
        }
    }

    /// The mode of MLX's `mode` string.
    pub fn from_mlx_name(s: &str) -> Option<MlxFpMode> {
        MlxFpMode::ALL.into_iter().find(|m| m.mlx_name() == s)
    }

    /// Bits per code (4 or 8), the only `bits` MLX accepts for the mode.
    pub fn bits(self) -> u32 {
        match self {
            MlxFpMode::Mxfp4 | MlxFpMode::Nvfp4 => 4,
            MlxFpMode::Mxfp8 => 8,
        }
    }

    /// Weights per scale (32, or 16 for nvfp4), the only `group_size` MLX
    /// accepts for the mode.
    pub fn group_size(self) -> usize {
        match self {
            MlxFpMode::Nvfp4 => 16,
            MlxFpMode::Mxfp4 | MlxFpMode::Mxfp8 => 32,
        }
    }

    /// Checks a configured (bits, group size) pair against the mode's.
    pub fn check(self, op: &'static str, bits: u32, group_size: usize) -> Result<()> {
        if bits != self.bits() || group_size != self.group_size() {
            return Err(invalid(
                op,
                "bits, group_size",
                format!(
                    "{}, {} for mode {}",
                    self.bits(),
                    self.group_size(),
                    self.mlx_name()
                ),
                format!("{bits}, {group_size}"),
            ));
        }
        Ok(())
    }

    /// The value of scale byte `s`: e8m0 (`2^(s − 127)`) or, for nvfp4, e4m3.
    #[inline(always)]
    pub fn scale(self, s: u8) -> f32 {
        match self {
            MlxFpMode::Nvfp4 => e4m3_to_f32(s),
            MlxFpMode::Mxfp4 | MlxFpMode::Mxfp8 => e8m0_to_f32(s),
        }
    }
}

impl fmt::Display for MlxFpMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.mlx_name())
    }
}

/// MLX's `FP4_LUT`: the e2m1 value of each 4-bit code.
pub const FP4_LUT: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// MLX's e8m0 scale `2^(e − 127)` in f32: e = 0 gives the subnormal
/// 2^−127, e = 255 gives +∞ (MLX's `power(2, e − 127)` in f32).
#[inline(always)]
pub fn e8m0_to_f32(e: u8) -> f32 {
    f32::from_bits(if e == 0 {
        0x0040_0000
    } else {
        u32::from(e) << 23
    })
}

/// MLX's e4m3 (`mx.from_fp8`, OCP e4m3fn): exact for every byte; 0x7F and
/// 0xFF are NaN.
#[inline(always)]
pub fn e4m3_to_f32(b: u8) -> f32 {
    if b & 0x7F == 0x7F {
        return f32::NAN;
    }
    // (b & 127) << 20 under an f32 exponent, times 2^120: the f16 trick of
    // MLX with f32's exponent bias (subnormals included, exact).
    let mag = f32::from_bits(u32::from(b & 0x7F) << 20) * f32::from_bits(0x7B80_0000);
    if b & 0x80 != 0 {
        -mag
    } else {
        mag
    }
}

/// [`e4m3_to_f32`] of every byte (the row decoder's table).
pub(crate) static E4M3: std::sync::LazyLock<[f32; 256]> =
    std::sync::LazyLock::new(|| std::array::from_fn(|b| e4m3_to_f32(b as u8)));

/// Dequantizes one row: `words` (`K·bits/32`) and `scales` (`K/group_size`)
/// into `out` (`K`), bit-identical to `mx.dequantize(..., dtype=float32)`.
pub fn dequantize_row(
    mode: MlxFpMode,
    words: &[u32],
    scales: &[u8],
    out: &mut [f32],
) -> Result<()> {
    const OP: &str = "mlxfp::dequantize_row";
    let (k, g) = (out.len(), mode.group_size());
    if !k.is_multiple_of(g) {
        return Err(invalid(OP, "out", format!("a multiple of {g} values"), k));
    }
    let nw = k * mode.bits() as usize / 32;
    if words.len() != nw {
        return Err(invalid(
            OP,
            "words",
            format!("{nw} words for K = {k}"),
            words.len(),
        ));
    }
    if scales.len() != k / g {
        return Err(invalid(
            OP,
            "scales",
            format!("{} bytes for K = {k}", k / g),
            scales.len(),
        ));
    }
    // A group's codes are whole words: 8 e2m1 or 4 e4m3 codes a word, LSB first.
    let per_group = g * mode.bits() as usize / 32;
    let groups = out.chunks_exact_mut(g).zip(words.chunks_exact(per_group));
    if mode.bits() == 4 {
        for ((o, ws), &s) in groups.zip(scales) {
            let a = mode.scale(s);
            for (o8, &w) in o.chunks_exact_mut(8).zip(ws) {
                for (t, v) in o8.iter_mut().enumerate() {
                    *v = FP4_LUT[((w >> (4 * t)) & 15) as usize] * a;
                }
            }
        }
    } else {
        let table = &*E4M3;
        for ((o, ws), &s) in groups.zip(scales) {
            let a = mode.scale(s);
            for (o4, &w) in o.chunks_exact_mut(4).zip(ws) {
                for (t, v) in o4.iter_mut().enumerate() {
                    *v = table[((w >> (8 * t)) & 255) as usize] * a;
                }
            }
        }
    }
    Ok(())
}

/// MLX's f32 → e4m3 conversion (`mx.to_fp8`, CPU `ToFP8`): round to
/// nearest, ties to even, subnormals included; magnitudes ≥ 448, ∞ and NaN
/// give ±448 (0x7E), so the NaN codes 0x7F/0xFF never come out. The sign bit
/// is kept (−0 → 0x80, and a NaN's sign too).
#[inline]
pub fn f32_to_e4m3(f: f32) -> u8 {
    let bits = f.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let mag = bits & 0x7FFF_FFFF;
    // 543 << 21 is 448.0, 121 << 23 is 2^-6, 141 << 23 is 2^14.
    let code = if mag >= 543 << 21 {
        0x7E
    } else if mag < 121 << 23 {
        // Below 2^-6 (e4m3's smallest normal): adding 2^14 rounds to a
        // multiple of 2^-9 (the subnormal step), ties to even.
        let low = (f32::from_bits(mag) + f32::from_bits(141 << 23)).to_bits();
        low.wrapping_sub(141 << 23) as u8
    } else {
        // Rebias 127 → 7 and round the 20 dropped mantissa bits to nearest
        // even.
        let odd = (mag >> 20) & 1;
        (mag.wrapping_add((7u32.wrapping_sub(127) << 23) + 0x7FFFF + odd) >> 20) as u8
    };
    code | sign
}

/// MLX's e2m1 code of `v`: the first `i` minimizing `|v − FP4_LUT[i]|` in
/// f32 (`mx.argmin`, which keeps index 0 when its distance is NaN).
#[inline]
fn e2m1_code(v: f32) -> u8 {
    let (mut best, mut code) = ((v - FP4_LUT[0]).abs(), 0u8);
    for (i, &l) in FP4_LUT.iter().enumerate().skip(1) {
        let d = (v - l).abs();
        if d < best {
            (best, code) = (d, i as u8);
        }
    }
    code
}

/// `2^e` in f32 for `e` in −149..=128 (∞ at 128).
fn exp2i(e: i32) -> f32 {
    match e {
        ..=-150 => 0.0,
        -149..=-127 => f32::from_bits(1 << (e + 149)),
        -126..=127 => f32::from_bits(((e + 127) as u32) << 23),
        _ => f32::INFINITY,
    }
}

/// `⌈log2 s⌉` of a finite `s > 0`.
fn ceil_log2(s: f32) -> i32 {
    let b = s.to_bits();
    let (exp, man) = ((b >> 23) as i32, b & 0x7F_FFFF);
    if exp == 0 {
        // Subnormal: s = man · 2^-149, man ≥ 1.
        -149 + (32 - (man - 1).leading_zeros()) as i32
    } else {
        exp - 127 + i32::from(man != 0)
    }
}

/// The scale byte of one group and the divisor of its weights (see the
/// module docs).
fn group_scale(mode: MlxFpMode, group: &[f32]) -> (u8, f32) {
    let mut a = 0f32;
    for &x in group {
        let m = x.abs();
        if m.is_nan() || a.is_nan() {
            a = f32::NAN;
        } else if m > a {
            a = m;
        }
    }
    let s = a / if mode.bits() == 4 { 6.0 } else { 448.0 };
    match mode {
        MlxFpMode::Nvfp4 => {
            let b = f32_to_e4m3(s);
            (b, e4m3_to_f32(b))
        }
        MlxFpMode::Mxfp4 | MlxFpMode::Mxfp8 => {
            if s == 0.0 {
                (127, 1.0)
            } else if !s.is_finite() {
                (128, 0.0)
            } else {
                let e = ceil_log2(s);
                ((e + 127) as u8, exp2i(e))
            }
        }
    }
}

/// Output of [`quantize`]: packed codes `[rows, cols·bits/32]` and scale
/// bytes `[rows, cols/group_size]`, row-major, in the [module](self) layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MlxFpQuantized {
    /// Packed codes (8 e2m1 or 4 e4m3 codes a word, LSB first).
    pub packed: Vec<u32>,
    /// Scale bytes (e8m0, or e4m3 for nvfp4).
    pub scales: Vec<u8>,
}

/// Quantizes a row-major `[rows, cols]` f32 matrix as MLX 0.32.4's CPU
/// `mx.quantize(w, mode=mode.mlx_name())` does, byte for byte (module docs).
/// `cols` must be a positive multiple of 32 (the layout's, and MLX's
/// nvfp4 packing's, unit); every f32 value is accepted, NaN and ±∞ too.
pub fn quantize(mode: MlxFpMode, w: &[f32], rows: usize, cols: usize) -> Result<MlxFpQuantized> {
    const OP: &str = "mlxfp::quantize";
    ensure(
        cols > 0 && cols.is_multiple_of(32),
        OP,
        "cols",
        "a positive multiple of 32",
        cols,
    )?;
    let numel = rows
        .checked_mul(cols)
        .ok_or_else(|| invalid(OP, "rows·cols", "no overflow", format!("{rows}·{cols}")))?;
    ensure(
        w.len() == numel,
        OP,
        "w",
        format_args!("{numel} elements ([{rows}, {cols}])"),
        w.len(),
    )?;
    let (g, bits) = (mode.group_size(), mode.bits() as usize);
    let mut packed = Vec::with_capacity(numel / 32 * bits);
    let mut scales = Vec::with_capacity(numel / g);
    for group in w.chunks_exact(g) {
        let (byte, div) = group_scale(mode, group);
        scales.push(byte);
        let code = |x: f32| {
            let v = x / div;
            if bits == 4 {
                u32::from(e2m1_code(v))
            } else {
                u32::from(f32_to_e4m3(v))
            }
        };
        for chunk in group.chunks_exact(32 / bits) {
            let word = chunk
                .iter()
                .enumerate()
                .fold(0u32, |acc, (t, &x)| acc | code(x) << (bits * t));
            packed.push(word);
        }
    }
    Ok(MlxFpQuantized { packed, scales })
}

/// Random codes (every bit pattern) with scales that keep the weights
/// O(0.01–0.1) like trained LLM weights: `words` and `scales` of any rows of
/// the mode are filled in place.
pub fn fill_random(mode: MlxFpMode, words: &mut [u8], scales: &mut [u8], rng: &mut impl rand::Rng) {
    rng.fill_bytes(words);
    if mode == MlxFpMode::Mxfp8 {
        // No NaN codes (e4m3fn 0x7F, 0xFF): 0x7E, 0xFE (±448) instead.
        for b in words.iter_mut().filter(|b| **b & 0x7F == 0x7F) {
            *b ^= 1;
        }
    }
    for s in scales.iter_mut() {
        let r: u8 = rng.random::<u8>();
        *s = match mode {
            // 2^-8 .. 2^-6 times e2m1 values up to 6.
            MlxFpMode::Mxfp4 => 119 + r % 3,
            // e4m3 of exponent field 1..2: 2^-6 .. 2^-5·1.875.
            MlxFpMode::Nvfp4 => 0x08 + r % 16,
            // 2^-14 .. 2^-12 times e4m3 values up to 448.
            MlxFpMode::Mxfp8 => 113 + r % 3,
        };
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_matches_the_f16_definition() {
        for b in (0..=255u8).filter(|b| b & 0x7F != 0x7F) {
            let v = half::f16::from_bits(u16::from(b & 127) << 7).to_f32() * 256.0;
            let want = if b & 128 != 0 { -v } else { v };
            assert_eq!(e4m3_to_f32(b).to_bits(), want.to_bits(), "{b:#x}");
        }
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert!(e4m3_to_f32(0x7F).is_nan() && e4m3_to_f32(0xFF).is_nan());
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
    }

    #[test]
    fn e8m0_is_two_to_the_e_minus_127() {
        for e in 0..=254u8 {
            assert_eq!(
                f64::from(e8m0_to_f32(e)),
                2f64.powi(i32::from(e) - 127),
                "{e}"
            );
        }
        assert_eq!(e8m0_to_f32(255), f32::INFINITY);
    }

    #[test]
    fn e4m3_rounds_to_nearest_even_and_saturates() {
        for b in (0..=255u8).filter(|b| b & 0x7F != 0x7F) {
            assert_eq!(f32_to_e4m3(e4m3_to_f32(b)), b, "{b:#x}");
        }
        // Midpoints go to the even code: 1.0625 (between 0x38 and 0x39) →
        // 0x38, 1.1875 (0x39..0x3A) → 0x3A; the subnormal 1.5·2^-9 → 0x02.
        assert_eq!(f32_to_e4m3(1.0625), 0x38);
        assert_eq!(f32_to_e4m3(1.1875), 0x3A);
        assert_eq!(f32_to_e4m3(-1.5 * 2f32.powi(-9)), 0x82);
        assert_eq!(f32_to_e4m3(0.5 * 2f32.powi(-9)), 0x00);
        assert_eq!(f32_to_e4m3(1.0625f32.next_up()), 0x39);
        for v in [448.0, 470.0, 1e30, f32::INFINITY, f32::NAN] {
            assert_eq!(f32_to_e4m3(v), 0x7E, "{v}");
            assert_eq!(f32_to_e4m3(-v), 0xFE, "{v}");
        }
    }

    #[test]
    fn e2m1_codes_break_ties_toward_the_smaller_magnitude() {
        let cases = [
            (0.25, 0),
            (0.2500001, 1),
            (0.75, 1),
            (1.25, 2),
            (1.75, 3),
            (2.5, 4),
            (3.5, 5),
            (5.0, 6),
            (5.0000005, 7),
            (100.0, 7),
            (-0.25, 0),
            (-0.0, 0),
            (-0.2500001, 9),
            (-5.0, 14),
            (-7.0, 15),
            (f32::NAN, 0),
            (f32::INFINITY, 0),
        ];
        for (v, c) in cases {
            assert_eq!(e2m1_code(v), c, "{v}");
        }
    }

    #[test]
    fn quantize_scales_round_up_and_round_trip() {
        let mode = MlxFpMode::Mxfp4;
        // Max 6 → scale 1 (byte 127); one ulp above → 2 (128), codes halve.
        let mut w = vec![0f32; 64];
        w[0] = 6.0;
        w[1] = 3.0;
        w[32] = 6f32.next_up();
        w[33] = 3.0;
        let q = quantize(mode, &w, 1, 64).unwrap();
        assert_eq!(q.scales, [127, 128]);
        assert_eq!(q.packed[0] & 0xFF, 0x57); // codes 7 (6.0), 5 (3.0)
        assert_eq!(q.packed[4] & 0xFF, 0x35); // codes 5 (3 · 2), 3 (1.5 · 2)

        // Every e2m1 value times a power of two comes back exactly.
        for mode in MlxFpMode::ALL {
            let w: Vec<f32> = (0..256).map(|i| FP4_LUT[i % 16] * 0.125).collect();
            let q = quantize(mode, &w, 2, 128).unwrap();
            let mut out = vec![0f32; 128];
            let (wr, sr) = (q.packed.len() / 2, q.scales.len() / 2);
            for r in 0..2 {
                let (p, s) = (&q.packed[r * wr..][..wr], &q.scales[r * sr..][..sr]);
                dequantize_row(mode, p, s, &mut out).unwrap();
                assert_eq!(out, w[r * 128..][..128], "{mode}");
            }
        }
    }

    #[test]
    fn quantize_names_bad_arguments() {
        let m = MlxFpMode::Nvfp4;
        let e = quantize(m, &[0.0; 16], 1, 16).unwrap_err().to_string();
        assert!(e.contains("`cols`") && e.contains("32"), "{e}");
        let e = quantize(m, &[0.0; 32], 2, 32).unwrap_err().to_string();
        assert!(e.contains("`w`") && e.contains("64"), "{e}");
        let e = quantize(m, &[], usize::MAX, 64).unwrap_err().to_string();
        assert!(e.contains("rows·cols"), "{e}");
        assert!(quantize(m, &[], 0, 32).unwrap().packed.is_empty());
    }

    #[test]
    fn rows_decode_lsb_first_and_check_lengths() {
        let mode = MlxFpMode::Nvfp4;
        // Codes 0..8 then 8..16: one word each; scales 1.0 (e4m3 0x38), 2.0 (0x40).
        let words = [0x7654_3210u32, 0xFEDC_BA98, 0x1111_1111, 0x1111_1111];
        let mut out = [0f32; 32];
        dequantize_row(mode, &words, &[0x38, 0x40], &mut out).unwrap();
        assert_eq!(out[..16], FP4_LUT);
        assert_eq!(out[16..], [1.0; 16]);
        assert!(dequantize_row(mode, &words[..3], &[0x38, 0x40], &mut out).is_err());
        assert!(dequantize_row(mode, &words, &[0x38], &mut out).is_err());
        assert!(dequantize_row(MlxFpMode::Mxfp8, &words, &[0], &mut out[..8]).is_err());
    }
}
