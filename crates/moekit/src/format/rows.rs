//! Row-at-a-time dequantization of a validated [`QuantWeights`]: the typed
//! views the CPU backends read weights through.

use super::{
    affine, fp8, ggml, mlxfp, AffineParams, GgmlType, MlxFpMode, QuantWeights, WeightFormat,
};
use crate::dtype::{DType, Float};
use crate::error::{invalid, Result};
use half::{bf16, f16};

impl QuantWeights {
    /// A row decoder over validated typed views.
    pub(crate) fn decoder(&self) -> Result<RowDecoder<'_>> {
        let scales_biases = || -> Result<ScaleViews<'_>> {
            let (Some(s), Some(b)) = (&self.scales, &self.biases) else {
                return Err(invalid("QuantWeights", "scales", "present", "none"));
            };
            Ok(match s.dtype() {
                DType::F32 => ScaleViews::F32(s.as_slice()?, b.as_slice()?),
                DType::F16 => ScaleViews::F16(s.as_slice()?, b.as_slice()?),
                DType::Bf16 => ScaleViews::Bf16(s.as_slice()?, b.as_slice()?),
                d => return Err(invalid("QuantWeights", "scales", "f32, f16 or bf16", d)),
            })
        };
        let kind = match self.format {
            WeightFormat::Dense(DType::F32) => DecoderKind::F32(self.data.as_slice()?),
            WeightFormat::Dense(DType::F16) => DecoderKind::F16(self.data.as_slice()?),
            WeightFormat::Dense(DType::Bf16) => DecoderKind::Bf16(self.data.as_slice()?),
            WeightFormat::Dense(d) => {
                return Err(invalid("QuantWeights", "format", "float dense", d))
            }
            WeightFormat::Affine(p) => {
                DecoderKind::Affine(p, self.data.as_slice()?, scales_biases()?)
            }
            WeightFormat::AffineU8 { group_size } => {
                let ScaleViews::F32(s, b) = scales_biases()? else {
                    return Err(invalid("QuantWeights", "scales", "f32", "other"));
                };
                DecoderKind::AffineU8(group_size, self.data.as_slice()?, s, b)
            }
            WeightFormat::Ggml(t) => DecoderKind::Ggml(t, self.data.as_slice()?),
            WeightFormat::MlxFp(m) => {
                let Some(s) = &self.scales else {
                    return Err(invalid("QuantWeights", "scales", "present", "none"));
                };
                DecoderKind::MlxFp(m, self.data.as_slice()?, s.as_slice()?)
            }
            WeightFormat::Fp8Block { block_k } => {
                let Some(s) = &self.scales else {
                    return Err(invalid("QuantWeights", "scales", "present", "none"));
                };
                DecoderKind::Fp8(block_k, self.data.as_slice()?, s.as_slice()?)
            }
        };
        let mut dec = RowDecoder {
            kind,
            rows: self.rows,
            cols: self.cols,
            total_rows: 0,
        };
        dec.total_rows = dec.len_rows();
        Ok(dec)
    }
}

#[derive(Clone, Copy)]
enum ScaleViews<'a> {
    F32(&'a [f32], &'a [f32]),
    F16(&'a [f16], &'a [f16]),
    Bf16(&'a [bf16], &'a [bf16]),
}

#[derive(Clone, Copy)]
enum DecoderKind<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Bf16(&'a [bf16]),
    Affine(AffineParams, &'a [u32], ScaleViews<'a>),
    AffineU8(usize, &'a [u8], &'a [f32], &'a [f32]),
    Ggml(GgmlType, &'a [u8]),
    MlxFp(MlxFpMode, &'a [u32], &'a [u8]),
    Fp8(usize, &'a [u8], &'a [f32]),
}

/// Dequantizes single rows of a validated [`QuantWeights`].
#[derive(Clone, Copy)]
pub struct RowDecoder<'a> {
    kind: DecoderKind<'a>,
    rows: usize,
    cols: usize,
    /// Rows of all experts the views hold (computed once: the hot path
    /// bounds-checks against it without a division).
    total_rows: usize,
}

fn row_of<T>(v: &[T], row: usize, len: usize) -> &[T] {
    &v[row * len..(row + 1) * len]
}

fn widen_into<T: Float>(src: &[T], out: &mut [f32]) {
    for (o, &s) in out.iter_mut().zip(src) {
        *o = s.to_f32();
    }
}

/// Per-group scales or biases of one row, in their stored dtype.
#[derive(Clone, Copy, Debug)]
pub enum ScaleRow<'a> {
    /// f32.
    F32(&'a [f32]),
    /// f16.
    F16(&'a [f16]),
    /// bf16.
    Bf16(&'a [bf16]),
}

impl ScaleRow<'_> {
    /// Value `i` widened to f32.
    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        match self {
            ScaleRow::F32(v) => v[i],
            ScaleRow::F16(v) => v[i].to_f32(),
            ScaleRow::Bf16(v) => v[i].to_f32(),
        }
    }
}

/// One row of one expert exactly as stored (no dequantization).
#[derive(Clone, Copy, Debug)]
pub enum RawRow<'a> {
    /// Dense f32.
    F32(&'a [f32]),
    /// Dense f16.
    F16(&'a [f16]),
    /// Dense bf16.
    Bf16(&'a [bf16]),
    /// MLX packed affine.
    Affine {
        /// Bits and group size.
        params: AffineParams,
        /// Packed words, `K·bits/32`.
        words: &'a [u32],
        /// Scales, `K/group_size`.
        scales: ScaleRow<'a>,
        /// Biases, `K/group_size`.
        biases: ScaleRow<'a>,
    },
    /// mlx-native unpacked affine.
    AffineU8 {
        /// Group size.
        group_size: usize,
        /// One code per weight.
        codes: &'a [u8],
        /// Scales.
        scales: &'a [f32],
        /// Biases.
        biases: &'a [f32],
    },
    /// GGUF blocks.
    Ggml(GgmlType, &'a [u8]),
    /// MLX microscaled floats.
    MlxFp {
        /// The mode.
        mode: MlxFpMode,
        /// Packed words, `K·bits/32`.
        words: &'a [u32],
        /// Scale bytes, `K/group_size`.
        scales: &'a [u8],
    },
    /// FP8 block-scaled: e4m3 codes and per-row f32 group scales.
    Fp8Block {
        /// Columns per scale.
        block_k: usize,
        /// One e4m3fn byte per weight, `K`.
        codes: &'a [u8],
        /// Scales, `K/block_k`.
        scales: &'a [f32],
    },
}

impl<'a> RowDecoder<'a> {
    /// The stored bytes of row `n` of expert `e`.
    pub fn raw_row(&self, e: usize, n: usize) -> Result<RawRow<'a>> {
        const OP: &str = "raw_row";
        // Hot path: build error messages only on failure.
        if n >= self.rows {
            return Err(invalid(OP, "n", format!("< {}", self.rows), n));
        }
        let r = e * self.rows + n;
        let k = self.cols;
        let nr = self.total_rows;
        if r >= nr {
            return Err(invalid(OP, "e", format!("< {}", nr / self.rows), e));
        }
        let sv = |v: ScaleViews<'a>, g: usize| match v {
            ScaleViews::F32(s, b) => (
                ScaleRow::F32(row_of(s, r, g)),
                ScaleRow::F32(row_of(b, r, g)),
            ),
            ScaleViews::F16(s, b) => (
                ScaleRow::F16(row_of(s, r, g)),
                ScaleRow::F16(row_of(b, r, g)),
            ),
            ScaleViews::Bf16(s, b) => (
                ScaleRow::Bf16(row_of(s, r, g)),
                ScaleRow::Bf16(row_of(b, r, g)),
            ),
        };
        Ok(match self.kind {
            DecoderKind::F32(d) => RawRow::F32(row_of(d, r, k)),
            DecoderKind::F16(d) => RawRow::F16(row_of(d, r, k)),
            DecoderKind::Bf16(d) => RawRow::Bf16(row_of(d, r, k)),
            DecoderKind::Affine(params, d, v) => {
                let (scales, biases) = sv(v, k / params.group_size);
                RawRow::Affine {
                    params,
                    words: row_of(d, r, k * params.bits as usize / 32),
                    scales,
                    biases,
                }
            }
            DecoderKind::AffineU8(group_size, d, s, b) => {
                let g = k / group_size;
                RawRow::AffineU8 {
                    group_size,
                    codes: row_of(d, r, k),
                    scales: row_of(s, r, g),
                    biases: row_of(b, r, g),
                }
            }
            DecoderKind::Ggml(t, d) => {
                RawRow::Ggml(t, row_of(d, r, k / t.block_size() * t.type_size()))
            }
            DecoderKind::MlxFp(mode, d, s) => RawRow::MlxFp {
                mode,
                words: row_of(d, r, k * mode.bits() as usize / 32),
                scales: row_of(s, r, k / mode.group_size()),
            },
            DecoderKind::Fp8(block_k, d, s) => RawRow::Fp8Block {
                block_k,
                codes: row_of(d, r, k),
                scales: row_of(s, r, k / block_k),
            },
        })
    }

    /// The stored bytes of rows `n0..n0 + n` of expert `e` of GGUF weights
    /// (contiguous: `n` rows of `K/block·type_size` bytes each); `None` for
    /// other formats or rows out of range.
    pub fn ggml_rows(&self, e: usize, n0: usize, n: usize) -> Option<(GgmlType, &'a [u8])> {
        let DecoderKind::Ggml(t, d) = self.kind else {
            return None;
        };
        if n0.checked_add(n)? > self.rows || e.checked_mul(self.rows)? >= self.total_rows {
            return None;
        }
        let row = self.cols / t.block_size() * t.type_size();
        let start = (e * self.rows + n0).checked_mul(row)?;
        Some((t, d.get(start..start.checked_add(n.checked_mul(row)?)?)?))
    }

    /// The stored words, scales and biases of rows `n0..n0 + n` of expert
    /// `e` of MLX packed affine weights (contiguous: `K·bits/32` words and
    /// `K/group_size` scales and biases per row); `None` for other formats
    /// or rows out of range.
    pub fn affine_rows(
        &self,
        e: usize,
        n0: usize,
        n: usize,
    ) -> Option<(AffineParams, &'a [u32], ScaleRow<'a>, ScaleRow<'a>)> {
        let DecoderKind::Affine(p, d, v) = self.kind else {
            return None;
        };
        if n0.checked_add(n)? > self.rows || e.checked_mul(self.rows)? >= self.total_rows {
            return None;
        }
        let r0 = e * self.rows + n0;
        let (words, groups) = (self.cols * p.bits as usize / 32, self.cols / p.group_size);
        let span = |len: usize| Some(r0.checked_mul(len)?..(r0 + n).checked_mul(len)?);
        let (w, g) = (span(words)?, span(groups)?);
        let (scales, biases) = match v {
            ScaleViews::F32(s, b) => (ScaleRow::F32(s.get(g.clone())?), ScaleRow::F32(b.get(g)?)),
            ScaleViews::F16(s, b) => (ScaleRow::F16(s.get(g.clone())?), ScaleRow::F16(b.get(g)?)),
            ScaleViews::Bf16(s, b) => {
                (ScaleRow::Bf16(s.get(g.clone())?), ScaleRow::Bf16(b.get(g)?))
            }
        };
        Some((p, d.get(w)?, scales, biases))
    }

    /// The stored words and scale bytes of rows `n0..n0 + n` of expert `e`
    /// of MLX microscaled weights (contiguous: `K·bits/32` words and
    /// `K/group_size` scale bytes per row); `None` for other formats or rows
    /// out of range.
    pub fn mlxfp_rows(
        &self,
        e: usize,
        n0: usize,
        n: usize,
    ) -> Option<(MlxFpMode, &'a [u32], &'a [u8])> {
        let DecoderKind::MlxFp(mode, d, s) = self.kind else {
            return None;
        };
        if n0.checked_add(n)? > self.rows || e.checked_mul(self.rows)? >= self.total_rows {
            return None;
        }
        let r0 = e * self.rows + n0;
        let words = self.cols * mode.bits() as usize / 32;
        let groups = self.cols / mode.group_size();
        let span = |len: usize| Some(r0.checked_mul(len)?..(r0 + n).checked_mul(len)?);
        Some((mode, d.get(span(words)?)?, s.get(span(groups)?)?))
    }

    /// Writes row `n` of expert `e`, dequantized, into `out` (`len == K`).
    pub fn decode(&self, e: usize, n: usize, out: &mut [f32]) -> Result<()> {
        if out.len() != self.cols {
            return Err(invalid(
                "decode",
                "out",
                format!("len {}", self.cols),
                out.len(),
            ));
        }
        match self.raw_row(e, n)? {
            RawRow::F32(w) => out.copy_from_slice(w),
            RawRow::F16(w) => widen_into(w, out),
            RawRow::Bf16(w) => widen_into(w, out),
            RawRow::Affine {
                params: p,
                words,
                scales,
                biases,
            } => match (scales, biases) {
                (ScaleRow::F32(s), ScaleRow::F32(b)) => {
                    affine::dequantize_row(p.bits, p.group_size, words, s, b, out)?
                }
                (ScaleRow::F16(s), ScaleRow::F16(b)) => {
                    affine::dequantize_row(p.bits, p.group_size, words, s, b, out)?
                }
                (ScaleRow::Bf16(s), ScaleRow::Bf16(b)) => {
                    affine::dequantize_row(p.bits, p.group_size, words, s, b, out)?
                }
                _ => {
                    return Err(invalid(
                        "decode",
                        "biases",
                        "the dtype of scales",
                        "another dtype",
                    ))
                }
            },
            RawRow::AffineU8 {
                group_size,
                codes,
                scales,
                biases,
            } => affine::dequantize_u8_row(group_size, codes, scales, biases, out)?,
            RawRow::Ggml(t, bytes) => ggml::dequantize_row(t, bytes, out)?,
            RawRow::MlxFp {
                mode,
                words,
                scales,
            } => mlxfp::dequantize_row(mode, words, scales, out)?,
            RawRow::Fp8Block {
                block_k,
                codes,
                scales,
            } => fp8::dequantize_row(block_k, codes, scales, out)?,
        }
        Ok(())
    }

    fn len_rows(&self) -> usize {
        let k = self.cols;
        match self.kind {
            DecoderKind::F32(d) => d.len() / k,
            DecoderKind::F16(d) => d.len() / k,
            DecoderKind::Bf16(d) => d.len() / k,
            DecoderKind::Affine(p, d, _) => d.len() / (k * p.bits as usize / 32),
            DecoderKind::AffineU8(_, d, _, _) => d.len() / k,
            DecoderKind::Ggml(t, d) => d.len() / (k / t.block_size() * t.type_size()),
            DecoderKind::MlxFp(m, d, _) => d.len() / (k * m.bits() as usize / 32),
            DecoderKind::Fp8(_, d, _) => d.len() / k,
        }
    }

    /// Input columns K.
    pub fn cols(&self) -> usize {
        self.cols
    }
}
