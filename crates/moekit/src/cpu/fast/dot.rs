//! Fused dequantize-and-dot of one stored weight row with f32 activations.
//!
//! Used when an expert has only a few activation rows (decode), where
//! dequantizing a row to memory first would cost more than the dot itself.
//! Codes are widened in registers; per-block offsets (Q4_0's −8, Q4_1's min,
//! affine biases) are applied once per block through the block sums of `x`
//! ([`XSums`]), so the inner loops are pure multiply-adds that LLVM vectorizes
//! with fixed-width lane accumulators. Formats without a fused kernel decode
//! into a scratch row and use [`dot`](super::gather_mm::dot).

use super::gather_mm::dot;
use crate::error::Result;
use crate::format::ggml::GgmlType;
use crate::format::{RawRow, RowDecoder};
use half::f16;

/// Sums of `x` over consecutive blocks of 32.
pub struct XSums(Vec<f32>);

impl XSums {
    /// Block sums of one activation row (`x.len()` a multiple of 32 for the
    /// fused kernels; a shorter tail block is summed as is).
    pub fn new(x: &[f32]) -> XSums {
        XSums(x.chunks(32).map(|c| c.iter().sum()).collect())
    }

    /// Sum of `x[32·b0 .. 32·(b0 + n)]`.
    #[inline]
    fn range(&self, b0: usize, n: usize) -> f32 {
        self.0[b0..b0 + n].iter().sum()
    }
}

const L: usize = 16;

#[inline(always)]
fn lanes_sum(acc: &[f32; L]) -> f32 {
    let mut s = 0f32;
    for v in acc {
        s += v;
    }
    s
}

/// `Σ_i w[i]·x[i]` for dense 16-bit weights, converting 16 at a time.
fn dot_half<T: crate::dtype::Float>(w: &[T], x: &[f32]) -> f32 {
    let mut acc = [0f32; L];
    let (cw, cx) = (w.chunks_exact(L), x.chunks_exact(L));
    let tail: f32 = cw
        .remainder()
        .iter()
        .zip(cx.remainder())
        .map(|(a, b)| a.to_f32() * b)
        .sum();
    for (a, b) in cw.zip(cx) {
        for i in 0..L {
            acc[i] += a[i].to_f32() * b[i];
        }
    }
    lanes_sum(&acc) + tail
}

fn d16(b: &[u8]) -> f32 {
    f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// Q4_0 / Q4_1 / Q8_0 rows: `Σ_blocks d·Σ q·x + (offset per block)·Σx`.
fn dot_ggml_simple(t: GgmlType, bytes: &[u8], x: &[f32], xs: &XSums) -> Option<f32> {
    let mut acc = [0f32; L];
    let mut off = 0f32;
    match t {
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let ts = t.type_size();
            let qoff = if t == GgmlType::Q4_1 { 4 } else { 2 };
            for (b, (blk, xb)) in bytes.chunks_exact(ts).zip(x.chunks_exact(32)).enumerate() {
                let d = d16(blk);
                let qs = &blk[qoff..qoff + 16];
                let (xl, xh) = xb.split_at(16);
                for i in 0..16 {
                    acc[i] += d * ((qs[i] & 15) as f32 * xl[i] + (qs[i] >> 4) as f32 * xh[i]);
                }
                off += xs.0[b]
                    * if t == GgmlType::Q4_1 {
                        d16(&blk[2..])
                    } else {
                        -8.0 * d
                    };
            }
        }
        GgmlType::Q8_0 => {
            for (blk, xb) in bytes.chunks_exact(34).zip(x.chunks_exact(32)) {
                let d = d16(blk);
                let qs = &blk[2..34];
                for h in 0..2 {
                    for i in 0..16 {
                        acc[i] += d * (qs[h * 16 + i] as i8 as f32 * xb[h * 16 + i]);
                    }
                }
            }
        }
        _ => return None,
    }
    Some(lanes_sum(&acc) + off)
}

/// Affine rows with 2, 4 or 8 bits (codes never straddle a word):
/// `Σ_groups s·Σ q·x + b·Σx`.
fn dot_affine_pow2<const BITS: usize>(
    words: &[u32],
    gs: usize,
    scale: impl Fn(usize) -> (f32, f32),
    x: &[f32],
    xs: &XSums,
) -> f32 {
    let per_word = 32 / BITS;
    let mask = (1u32 << BITS) - 1;
    let mut acc = [0f32; L];
    let mut off = 0f32;
    let wpg = gs / per_word;
    for (g, (gw, gx)) in words.chunks_exact(wpg).zip(x.chunks_exact(gs)).enumerate() {
        let (s, b) = scale(g);
        let mut ga = [0f32; L];
        // L lanes = L codes: L·BITS/32 consecutive words per step.
        for (ws, xv) in gw.chunks_exact(L / per_word).zip(gx.chunks_exact(L)) {
            for i in 0..L {
                let q = (ws[i / per_word] >> ((i % per_word) * BITS)) & mask;
                ga[i] += q as f32 * xv[i];
            }
        }
        for i in 0..L {
            acc[i] += s * ga[i];
        }
        off += b * xs.range(g * gs / 32, gs / 32);
    }
    lanes_sum(&acc) + off
}

/// `Σ_k W[e, n, k]·x[k]` from the stored row; `scratch` (len K) is used by
/// formats without a fused kernel.
pub fn dot_row(
    dec: &RowDecoder<'_>,
    e: usize,
    n: usize,
    x: &[f32],
    xs: &XSums,
    scratch: &mut [f32],
) -> Result<f32> {
    let fused = match dec.raw_row(e, n)? {
        RawRow::F32(w) => Some(dot(w, x)),
        RawRow::F16(w) => Some(dot_half(w, x)),
        RawRow::Bf16(w) => Some(dot_half(w, x)),
        RawRow::Ggml(t, bytes) => dot_ggml_simple(t, bytes, x, xs),
        RawRow::Affine {
            params: p,
            words,
            scales,
            biases,
        } if p.group_size % 32 == 0 => {
            let sb = |g: usize| (scales.get(g), biases.get(g));
            match p.bits {
                2 => Some(dot_affine_pow2::<2>(words, p.group_size, sb, x, xs)),
                4 => Some(dot_affine_pow2::<4>(words, p.group_size, sb, x, xs)),
                8 => Some(dot_affine_pow2::<8>(words, p.group_size, sb, x, xs)),
                _ => None,
            }
        }
        _ => None,
    };
    match fused {
        Some(v) => Ok(v),
        None => {
            dec.decode(e, n, scratch)?;
            Ok(dot(scratch, x))
        }
    }
}
