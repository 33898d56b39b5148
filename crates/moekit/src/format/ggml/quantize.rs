//! Reference quantizers of the legacy 32-weight types, byte-identical to
//! gguf-py's `gguf.quants.quantize` (which mirrors llama.cpp's
//! `quantize_row_*_ref`).
//!
//! Every function takes one block of 32 values (a shorter slice is treated
//! as zero-padded) and is exact for finite input. Two details follow gguf-py
//! rather than llama.cpp, where the two differ only on signed zeros:
//! the symmetric types take the *signed* value at the first index of the
//! largest magnitude (`argmax`), so an all-zero block whose first value is
//! `-0.0` stores `d = +0.0`.

use super::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0};
use half::f16;

const QK: usize = 32;

/// The block as a fixed array (missing values are zero).
fn block(x: &[f32]) -> [f32; QK] {
    let mut b = [0f32; QK];
    for (o, &v) in b.iter_mut().zip(x) {
        *o = v;
    }
    b
}

/// The signed value of the first element of largest magnitude (numpy
/// `take_along_axis(x, argmax(abs(x)))`; a NaN wins, as in numpy).
fn signed_absmax(x: &[f32; QK]) -> f32 {
    let mut best = x[0];
    for &v in &x[1..] {
        if v.abs() > best.abs() || (v.is_nan() && !best.is_nan()) {
            best = v;
        }
    }
    best
}

/// Minimum and maximum, first value kept on ties.
fn min_max(x: &[f32; QK]) -> (f32, f32) {
    let (mut lo, mut hi) = (x[0], x[0]);
    for &v in &x[1..] {
        if v < lo {
            lo = v;
        }
        if v > hi {
            hi = v;
        }
    }
    (lo, hi)
}

/// `1/d`, or 0 when `d == 0`.
fn inverse(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// `trunc(v)` as an integer clamped to `0..=max` (gguf-py: trunc → u8 → clip;
/// the truncated value is ≥ 0 for every finite input of these quantizers).
fn trunc_clamp(v: f32, max: i32) -> u8 {
    (v as i32).clamp(0, max) as u8
}

/// Packs 5-bit codes: low nibbles as Q4 (`j` low, `j + 16` high), bit 4 of
/// code `j` into bit `j` of the little-endian `qh`.
fn pack5(q: &[u8; QK]) -> ([u8; 4], [u8; 16]) {
    let mut qs = [0u8; 16];
    let (lo, hi) = q.split_at(QK / 2);
    for ((o, &a), &b) in qs.iter_mut().zip(lo).zip(hi) {
        *o = (a & 0x0F) | (b << 4);
    }
    let qh = q
        .iter()
        .enumerate()
        .fold(0u32, |acc, (j, &c)| acc | (u32::from(c >> 4) << j));
    (qh.to_le_bytes(), qs)
}

/// Packs 4-bit codes (`j` low nibble, `j + 16` high nibble).
fn pack4(q: &[u8; QK]) -> [u8; 16] {
    let mut qs = [0u8; 16];
    let (lo, hi) = q.split_at(QK / 2);
    for ((o, &a), &b) in qs.iter_mut().zip(lo).zip(hi) {
        *o = a | (b << 4);
    }
    qs
}

/// Q4_0: `d = max / −8`, `q = min(15, trunc(x/d + 8.5))`.
pub(crate) fn q4_0(x: &[f32]) -> BlockQ4_0 {
    let x = block(x);
    let d = signed_absmax(&x) / -8.0;
    let id = inverse(d);
    let q = x.map(|v| trunc_clamp(v * id + 8.5, 15));
    BlockQ4_0 {
        d: f16::from_f32(d),
        qs: pack4(&q),
    }
}

/// Q4_1: `d = (max − min)/15`, `q = min(15, trunc((x − min)/d + 0.5))`.
pub(crate) fn q4_1(x: &[f32]) -> BlockQ4_1 {
    let x = block(x);
    let (lo, hi) = min_max(&x);
    let d = (hi - lo) / 15.0;
    let id = inverse(d);
    let q = x.map(|v| trunc_clamp((v - lo) * id + 0.5, 15));
    BlockQ4_1 {
        d: f16::from_f32(d),
        m: f16::from_f32(lo),
        qs: pack4(&q),
    }
}

/// Q5_0: `d = max / −16`, `q = min(31, trunc(x/d + 16.5))`.
pub(crate) fn q5_0(x: &[f32]) -> BlockQ5_0 {
    let x = block(x);
    let d = signed_absmax(&x) / -16.0;
    let id = inverse(d);
    let q = x.map(|v| trunc_clamp(v * id + 16.5, 31));
    let (qh, qs) = pack5(&q);
    BlockQ5_0 {
        d: f16::from_f32(d),
        qh,
        qs,
    }
}

/// Q5_1: `d = (max − min)/31`, `q = min(31, trunc((x − min)/d + 0.5))`.
pub(crate) fn q5_1(x: &[f32]) -> BlockQ5_1 {
    let x = block(x);
    let (lo, hi) = min_max(&x);
    let d = (hi - lo) / 31.0;
    let id = inverse(d);
    let q = x.map(|v| trunc_clamp((v - lo) * id + 0.5, 31));
    let (qh, qs) = pack5(&q);
    BlockQ5_1 {
        d: f16::from_f32(d),
        m: f16::from_f32(lo),
        qh,
        qs,
    }
}

/// Q8_0: `d = max|x| / 127`, `q = round_half_away(x/d)`.
pub(crate) fn q8_0(x: &[f32]) -> BlockQ8_0 {
    let x = block(x);
    let amax = x
        .iter()
        .fold(0f32, |m, &v| if v.abs() > m { v.abs() } else { m });
    let d = amax / 127.0;
    let id = inverse(d);
    BlockQ8_0 {
        d: f16::from_f32(d),
        qs: x.map(|v| (v * id).round() as i8),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_rounds_half_away_from_zero() {
        // amax 127 → d = 1, id = 1: codes are round(x).
        let mut x = [0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        x[3] = 0.49999997;
        let b = q8_0(&x);
        assert_eq!(b.d.to_f32(), 1.0);
        assert_eq!(&b.qs[..4], &[127, 3, -3, 0]);
    }

    #[test]
    fn q4_0_first_largest_magnitude_sets_the_sign() {
        let mut x = [0f32; 32];
        x[5] = 4.0;
        x[9] = -4.0;
        assert_eq!(q4_0(&x).d.to_f32(), -0.5);
        x[5] = -4.0;
        x[9] = 4.0;
        assert_eq!(q4_0(&x).d.to_f32(), 0.5);
        // All zeros: d = 0/−8 = −0.0 (gguf-py and llama.cpp agree when x[0] = +0).
        assert_eq!(q4_0(&[0.0; 32]).d.to_bits(), 0x8000);
        assert_eq!(q4_0(&[0.0; 32]).qs, [0x88; 16]);
    }

    #[test]
    fn q5_1_packs_high_bits_little_endian() {
        // Codes 0..31 in order: min 0, max 31 → d = 1.
        let x: Vec<f32> = (0..32).map(|i| i as f32).collect();
        let b = q5_1(&x);
        assert_eq!(b.d.to_f32(), 1.0);
        assert_eq!(b.m.to_f32(), 0.0);
        assert_eq!(u32::from_le_bytes(b.qh), 0xFFFF_0000);
        assert_eq!(b.qs[0], 0x00);
        assert_eq!(b.qs[15], 0xFF);
    }
}
