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
//!   (448·6)` when MLX is given a global scale; moekit does not support a
//!   global scale yet and the loader refuses one).
//!
//! A weight is `value(code) · scale`: one f32 product, exact except where it
//! overflows, so bit-identical to `mx.dequantize(..., dtype=mx.float32)`.

use crate::error::{invalid, Result};
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
static E4M3: std::sync::LazyLock<[f32; 256]> =
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
