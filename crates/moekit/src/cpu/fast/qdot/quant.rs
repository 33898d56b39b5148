//! The activation side: which quantization each weight format takes
//! ([`QKind`]) and the quantized rows ([`QRow`]).

use crate::error::{invalid, Result};
use crate::format::ggml::GgmlType;
use crate::format::{AffineParams, MlxFpMode, RawRow, RowDecoder};

/// How an activation row is quantized for one weight format.
///
/// Two kinds are equal if rows quantized for one serve the other (whether
/// the path is the default, [`QKind::by_default`], is not compared).
#[derive(Debug, Clone, Copy)]
pub struct QKind {
    /// Values per activation scale: 32 or 256.
    pub(super) block: usize,
    /// Offset `c` of the weight codes (Q4_0: 8, Q8_0 at the VNNI levels:
    /// 128); 0 for none. Applied per lane of 4 codes (`−c·Σy` in the
    /// integer lanes: the row's lane biases) if `lane_bias`, else per block
    /// in float (the row's block offsets `c·Σ(y << s)`).
    pub(super) offset: i32,
    /// Whether the offset is a lane bias (else a block offset).
    pub(super) lane_bias: bool,
    /// Codes stored interleaved for the nibble kernels: in each whole run of
    /// 4 blocks of 32, the first 16 codes of blocks 0..4, then their last
    /// 16 ([`half_offsets`]); other blocks in order.
    pub(super) interleave: bool,
    /// The two halves of a block are its even and its odd values (MLX
    /// affine: byte `k` holds codes `2k`, `2k + 1`), else its first and
    /// last 16.
    pub(super) pairs: bool,
    /// Whether the row keeps the exact f32 sum of each block of its values
    /// (the affine biases' term `b·Σx`, the mins of Q4_1 and Q5_1).
    pub(super) xsums: bool,
    /// 256-value blocks: the largest lane shift (a lane's step is
    /// `amax/127` divided by up to `2^max_shift`), as small as the weight
    /// codes need for the kernels' 16-bit products `(u·y + u·y) << s` to fit:
    /// 4 for codes below 8 (Q2_K, Q3_K), 3 below 16 (Q4_K), 2 below 32
    /// (Q5_K) and for Q6_K's centred codes (|q| ≤ 32).
    pub(super) max_shift: u32,
    /// Whether [`ActMode::Auto`](crate::cpu::ActMode::Auto) takes the
    /// integer kernels (measured at least as fast as the f32 ones), else
    /// only [`ActMode::Q8`](crate::cpu::ActMode::Q8).
    pub(super) auto: bool,
}

impl PartialEq for QKind {
    fn eq(&self, o: &QKind) -> bool {
        (self.block, self.offset, self.lane_bias, self.interleave)
            == (o.block, o.offset, o.lane_bias, o.interleave)
            && (self.pairs, self.xsums, self.max_shift) == (o.pairs, o.xsums, o.max_shift)
    }
}

impl Eq for QKind {}

impl QKind {
    /// Whether [`ActMode::Auto`](crate::cpu::ActMode::Auto) takes the
    /// integer kernels: every format but Q4_1 and MLX affine 2 and 8 bits,
    /// whose f32 kernels measured faster on qwen3-30b-a3b (T = 1 and 8,
    /// `bench/results/cpu_2core/qdot/`).
    pub fn by_default(self) -> bool {
        self.auto
    }

    /// Values per activation scale.
    pub fn block(self) -> usize {
        self.block
    }

    /// Whether the codes are stored interleaved ([`half_offsets`]).
    pub fn interleaved(self) -> bool {
        self.interleave
    }

    /// Whether a block's halves are its even and odd values (else its
    /// first and last 16).
    pub fn paired(self) -> bool {
        self.pairs
    }
}

/// The kind of the weights whose blocks decode to signed 8-bit codes in
/// value order (Q8_0, Q5_0; with `xsums`, those with a min or bias: Q4_1,
/// Q5_1, MLX affine of 2, 3, 5, 6 and 8 bits): the VNNI kernels offset the
/// codes by 128 (`vpdpbusd` takes unsigned × signed), a lane bias.
const fn signed_codes(xsums: bool, auto: bool) -> QKind {
    QKind {
        block: 32,
        offset: 128,
        lane_bias: true,
        interleave: false,
        pairs: false,
        xsums,
        max_shift: 0,
        auto,
    }
}

/// The kind of the 4-bit codebook formats (IQ4_NL, IQ4_XS, MXFP4, MLX's
/// mxfp4 and nvfp4: [`super::codebook`]): 32-value blocks stored
/// interleaved as Q4_0's (halves: the first and last 16 values, or for
/// MLX's LSB-first codes, `pairs`, the even and odd values), the table
/// values offset by 128 at the VNNI levels (lane biases).
const fn codebook(pairs: bool, auto: bool) -> QKind {
    QKind {
        block: 32,
        offset: 128,
        lane_bias: true,
        interleave: true,
        pairs,
        xsums: false,
        max_shift: 0,
        auto,
    }
}

/// The kind of the K-quants (256-value blocks) with lane shifts up to
/// `max_shift`.
const fn super_block(max_shift: u32) -> QKind {
    QKind {
        block: 256,
        offset: 0,
        lane_bias: false,
        interleave: false,
        pairs: false,
        xsums: false,
        max_shift,
        auto: true,
    }
}

/// The activation quantization of weights of type `t`, if it has integer
/// dot kernels.
pub fn kind_of(t: GgmlType) -> Option<QKind> {
    Some(match t {
        GgmlType::Q4_0 => QKind {
            block: 32,
            offset: 8,
            lane_bias: false,
            interleave: true,
            pairs: false,
            xsums: false,
            max_shift: 0,
            auto: true,
        },
        GgmlType::Q8_0 | GgmlType::Q5_0 => signed_codes(false, true),
        GgmlType::Q4_1 => signed_codes(true, false),
        GgmlType::Q5_1 => signed_codes(true, true),
        GgmlType::Q4_K => super_block(3),
        // Codes below 8: one more shift fits (and the 16-bit sums of 16).
        GgmlType::Q2_K | GgmlType::Q3_K => super_block(MAX_SHIFT),
        GgmlType::Q5_K => super_block(2),
        // Centred codes, |q| ≤ 32.
        GgmlType::Q6_K => super_block(2),
        // 4-bit codes into a table of signed bytes.
        GgmlType::IQ4_NL | GgmlType::IQ4_XS | GgmlType::MXFP4 => codebook(false, true),
        // Grid and ternary types: signed weights |q| ≤ 62 dotted as
        // `vpmaddubsw(|q|, ±y)` then times the 16-bit `2^s·sc` (`grid`): no
        // 16-bit bound on the shift.
        GgmlType::IQ2_XXS
        | GgmlType::IQ2_XS
        | GgmlType::IQ2_S
        | GgmlType::IQ3_XXS
        | GgmlType::IQ3_S
        | GgmlType::IQ1_S
        | GgmlType::IQ1_M
        | GgmlType::TQ1_0
        | GgmlType::TQ2_0 => super_block(MAX_SHIFT),
        // NVFP4's groups of 16 interleave their nibbles unlike the codebook
        // kernels' 32-value blocks: f32 activations for now.
        GgmlType::NVFP4 => return None,
    })
}

/// The activation quantization of MLX packed affine weights with `p`, if
/// they have integer dot kernels (2, 3, 4, 5, 6 or 8 bits, groups of 32, 64
/// or 128).
pub fn kind_of_affine(p: AffineParams) -> Option<QKind> {
    if !matches!(p.group_size, 32 | 64 | 128) {
        return None;
    }
    match p.bits {
        4 => Some(QKind {
            block: 32,
            // Codes centred as Q4_0's (block offsets): the activations'
            // rounding errors then meet q − 8, not q (an MLX bias is about
            // −8·scale).
            offset: 8,
            lane_bias: false,
            interleave: true,
            pairs: true,
            xsums: true,
            max_shift: 0,
            auto: true,
        }),
        // Codes centred (q − 2^(bits−1)) as signed bytes.
        3 | 5 | 6 => Some(signed_codes(true, true)),
        2 | 8 => Some(signed_codes(true, false)),
        _ => None,
    }
}

/// The activation quantization of MLX microscaled weights of `mode`, if
/// they have integer dot kernels (mxfp4 and nvfp4: 4-bit e2m1 codes).
pub fn kind_of_mlxfp(mode: MlxFpMode) -> Option<QKind> {
    match mode {
        MlxFpMode::Mxfp4 | MlxFpMode::Nvfp4 => Some(codebook(true, true)),
        MlxFpMode::Mxfp8 => None,
    }
}

/// The activation quantization of the rows of `dec` (`None`: f32 only).
pub fn kind_of_rows(dec: &RowDecoder<'_>) -> Option<QKind> {
    let kind = match dec.raw_row(0, 0).ok()? {
        RawRow::Ggml(t, _) => kind_of(t),
        RawRow::Affine { params, .. } => kind_of_affine(params),
        RawRow::MlxFp { mode, .. } => kind_of_mlxfp(mode),
        _ => None,
    };
    kind.filter(|k| dec.cols() > 0 && dec.cols().is_multiple_of(k.block))
}

/// Where the two 16-code halves of 32-value block `b` (of `nb`) are stored:
/// `[32b, 32b + 16]`, or, interleaved, for a block of a whole run `g` of 4
/// blocks, `[128g + 16(b % 4), 128g + 64 + 16(b % 4)]`.
#[inline(always)]
pub fn half_offsets(interleave: bool, nb: usize, b: usize) -> [usize; 2] {
    if interleave && b < nb / 4 * 4 {
        let at = 128 * (b / 4) + 16 * (b % 4);
        [at, at + 64]
    } else {
        [32 * b, 32 * b + 16]
    }
}

/// One activation row quantized to 8-bit blocks (see the module doc).
#[derive(Debug, Clone)]
pub struct QRow {
    pub(super) kind: QKind,
    /// Codes, one per value (in the kind's order).
    pub(super) codes: Aligned<i8>,
    /// Scale per block: 256-value blocks `amax/(127·2^max_shift)`; 32-value blocks
    /// 1 (their lanes have scales). NaN for a block with a non-finite value
    /// (and, for 32-value blocks, its lane scales).
    pub(super) d: Vec<f32>,
    /// 256-value blocks: the shift (0..=3) of each lane of 4 stored codes:
    /// code `i` stands for `d·(codes[i] << shift[i/4])`. Empty for 32-value
    /// blocks.
    pub(super) shift: Aligned<u32>,
    /// 256-value blocks: `2^shift` of each pair of codes (the 16-bit
    /// multiplier of the K-quant kernels). Empty for 32-value blocks.
    pub(super) pow2: Aligned<i16>,
    /// 32-value blocks: the scale `m` of each lane of 4 stored codes (its
    /// largest magnitude / 127): code `i` stands for `m[i/4]·codes[i]`.
    /// Empty for 256-value blocks.
    pub(super) lscale: Aligned<f32>,
    /// `−offset·Σ` of each lane of 4 stored codes, not shifted (empty
    /// unless the kind has a lane bias).
    pub(super) bias: Aligned<i32>,
    /// `offset·Σ_k m_k·Σ(codes of lane k)` of each 32-value block, its 8
    /// lanes in stored order, summed in order (empty unless the kind has a
    /// block offset).
    pub(super) boff: Aligned<f32>,
    /// 256-value blocks: `Σ codes[i] << shift[i/4]` of each 16 codes.
    /// Empty for 32-value blocks.
    pub(super) sums: Aligned<i32>,
    /// The exact sum of each block's values (f32, in value order; for kinds
    /// with `xsums`, else empty).
    pub(super) xsum: Vec<f32>,
    /// The same of each 32 (`|Σ| ≤ 32·127·8`: 16 bits for kinds of
    /// `max_shift ≤ 3`; wrapped, and unused, for the others), for 256-value
    /// blocks (Q4_K's mins: one `vpmaddwd` with the 8 mins); empty for
    /// 32-value blocks.
    pub(super) gsum: Aligned<i16>,
    /// [`sums`](Self::sums) as 16 bits (`|Σ| ≤ 16·127·2⁴`), for 256-value
    /// blocks (the other K-quants' offsets: one `vpmaddwd` with 16 per-16
    /// offsets); empty for 32-value blocks.
    pub(super) hsum: Aligned<i16>,
}

/// 64 bytes on a 64-byte boundary: the unit of [`Aligned`].
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct Line([u8; 64]);

/// A slice of `T` that starts on a 64-byte boundary: the kernels' 512-bit
/// loads of a row's codes, biases and multipliers then each touch one cache
/// line (unaligned, most touched two, and the loads of a Q4_0 run were
/// bound by the cache's line accesses).
#[derive(Clone, Debug)]
pub(super) struct Aligned<T> {
    lines: Vec<Line>,
    len: usize,
    _t: std::marker::PhantomData<T>,
}

impl<T: bytemuck::Pod> Aligned<T> {
    /// A copy of `v`.
    fn from_slice(v: &[T]) -> Self {
        let bytes = std::mem::size_of_val(v);
        let mut lines = vec![Line([0; 64]); bytes.div_ceil(64)];
        let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut lines);
        if let Some(dst) = dst.get_mut(..bytes) {
            dst.copy_from_slice(bytemuck::cast_slice(v));
        }
        Aligned {
            lines,
            len: v.len(),
            _t: std::marker::PhantomData,
        }
    }

    /// The values.
    pub(super) fn as_slice(&self) -> &[T] {
        let all: &[T] = bytemuck::cast_slice(&self.lines);
        all.get(..self.len).unwrap_or(&[])
    }
}

impl<T: bytemuck::Pod> std::ops::Deref for Aligned<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

/// Round to nearest, ties to even, for `|v| < 2²²` (the f32 addition
/// rounds; any SSE2 build vectorizes it, unlike `round_ties_even`).
#[inline(always)]
fn round_even(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5·2²³
    (v + MAGIC) - MAGIC
}

/// The bits of `|v|`.
const ABS: u32 = 0x7fff_ffff;

/// Largest lane shift of any kind: a lane's step is `amax/127` divided by
/// up to `2^MAX_SHIFT` (the 16-bit sums of 16 codes, `16·127·2^4`, fit).
const MAX_SHIFT: u32 = 4;

impl QRow {
    /// Quantizes `x`; an error if its length is not a whole number of the
    /// kind's blocks. Non-finite values make their block's scale NaN (so the
    /// dots of the row are NaN, as f32 arithmetic would make them).
    ///
    /// 32-value blocks: each lane of 4 values with largest magnitude `a` has
    /// its own f32 scale `m = a/127` and codes `round(x·127/a)` (ties to
    /// even, `|code| ≤ 127`). 256-value blocks (the K-quants, whose kernels
    /// combine the groups in integers): a block with largest magnitude
    /// `amax` gets the scale `d = amax/(127·2^M)` (`M`: the kind's largest
    /// shift, 1..=4), and each lane the smallest shift `s ∈ 0..=M` with
    /// `a·2^(M−s) ≤ amax`: its codes are `round(x·127·2^(M−s)/amax)` and
    /// stand for `d·(code << s)`. Either way
    /// a lane of small values gets finer steps than the block's largest
    /// value allows.
    pub fn new(x: &[f32], kind: QKind) -> Result<QRow> {
        if kind.block == 0 || kind.block > 256 || !x.len().is_multiple_of(kind.block) {
            return Err(invalid(
                "QRow::new",
                "x",
                format!("a multiple of {} values", kind.block),
                x.len(),
            ));
        }
        let n = x.len();
        let xsum: Vec<f32> = if kind.xsums {
            x.chunks_exact(kind.block).map(|b| b.iter().sum()).collect()
        } else {
            Vec::new()
        };
        // Pairs: each block's even values, then its odd values.
        let paired: Vec<f32>;
        let x = if kind.pairs {
            paired = x
                .chunks_exact(kind.block)
                .flat_map(|b| b.iter().step_by(2).chain(b.iter().skip(1).step_by(2)))
                .copied()
                .collect();
            &paired[..]
        } else {
            x
        };
        let mut codes = vec![0i8; n];
        let mut d = vec![0f32; n / kind.block];
        let lane_sum = |c: &[i8]| -> i32 { c.iter().map(|&v| i32::from(v)).sum() };
        let (mut shift, mut lscale) = (Vec::new(), Vec::new());
        if kind.block == 32 {
            lscale = vec![0f32; n / 4];
            let blocks = x
                .chunks_exact(32)
                .zip(codes.chunks_exact_mut(32))
                .zip(lscale.chunks_exact_mut(8))
                .zip(&mut d);
            for (((xb, cb), mb), d) in blocks {
                *d = quantize_lanes(xb, cb, mb);
            }
        } else {
            shift = vec![0u32; n / 4];
            let blocks = x
                .chunks_exact(kind.block)
                .zip(codes.chunks_exact_mut(kind.block))
                .zip(shift.chunks_exact_mut(kind.block / 4))
                .zip(&mut d);
            for (((xb, cb), sb), d) in blocks {
                *d = quantize_shifted(xb, cb, sb, kind.max_shift.min(MAX_SHIFT));
            }
        }
        if kind.interleave {
            interleave::<_, 16>(&mut codes);
            interleave::<_, 4>(&mut lscale);
        }
        let sums: Vec<i32> = codes
            .chunks_exact(16)
            .zip(shift.chunks_exact(4))
            .map(|(c, s)| {
                c.chunks_exact(4)
                    .zip(s)
                    .map(|(c, &s)| lane_sum(c) << s)
                    .sum()
            })
            .collect();
        let gsum: Vec<i16> = sums.chunks_exact(2).map(|p| (p[0] + p[1]) as i16).collect();
        let hsum: Vec<i16> = sums.iter().map(|&v| v as i16).collect();
        let boff: Vec<f32> = if kind.offset == 0 || kind.lane_bias {
            Vec::new()
        } else {
            // A block's lanes: stored in its two halves (`half_offsets`).
            let nb = n / kind.block;
            (0..nb)
                .map(|b| {
                    let mut sum = 0f32;
                    for at in half_offsets(kind.interleave, nb, b) {
                        let lanes = codes.get(at..at + 16).unwrap_or(&[]).chunks_exact(4);
                        let scales = lscale.get(at / 4..at / 4 + 4).unwrap_or(&[]);
                        for (c, &m) in lanes.zip(scales) {
                            sum += m * lane_sum(c) as f32;
                        }
                    }
                    kind.offset as f32 * sum
                })
                .collect()
        };
        let bias: Vec<i32> = if kind.offset == 0 || !kind.lane_bias {
            Vec::new()
        } else {
            codes
                .chunks_exact(4)
                .map(|c| -kind.offset * lane_sum(c))
                .collect()
        };
        let pow2: Vec<i16> = shift.iter().flat_map(|&s| [1i16 << s; 2]).collect();
        Ok(QRow {
            kind,
            codes: Aligned::from_slice(&codes),
            d,
            shift: Aligned::from_slice(&shift),
            pow2: Aligned::from_slice(&pow2),
            lscale: Aligned::from_slice(&lscale),
            bias: Aligned::from_slice(&bias),
            boff: Aligned::from_slice(&boff),
            gsum: Aligned::from_slice(&gsum),
            hsum: Aligned::from_slice(&hsum),
            xsum,
            sums: Aligned::from_slice(&sums),
        })
    }

    /// The exact sum of each block's values (kinds that keep them).
    pub fn block_sums(&self) -> &[f32] {
        &self.xsum
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

    /// The codes, one per value, in the kind's order ([`half_offsets`]).
    pub fn codes(&self) -> &[i8] {
        &self.codes
    }

    /// The scale of each lane of 4 stored codes (32-value blocks; else
    /// empty).
    pub fn lane_scales(&self) -> &[f32] {
        &self.lscale
    }

    /// The block offsets (`offset·Σ_k m_k·Σ codes of lane k`; kinds with a
    /// block offset, else empty).
    pub fn block_offsets(&self) -> &[f32] {
        &self.boff
    }

    /// The shift of each lane of 4 stored codes (256-value blocks; else
    /// empty).
    pub fn shifts(&self) -> &[u32] {
        &self.shift
    }

    /// The scale of each block.
    pub fn scales(&self) -> &[f32] {
        &self.d
    }

    /// `Σ codes[i] << shift[i/4]` of each 16 codes (256-value blocks; else
    /// empty).
    pub fn sums16(&self) -> &[i32] {
        &self.sums
    }

    /// The row as the kernels see it, in value order: `d_b·(y_i << s_i)`.
    pub fn dequantize(&self) -> Vec<f32> {
        let bs = self.kind.block;
        let nb = self.codes.len() / bs.max(1);
        let mut out = vec![0f32; self.codes.len()];
        for (i, o) in out.iter_mut().enumerate() {
            let w = i % 32;
            let (h, pos) = if self.kind.pairs {
                (w % 2, w / 2)
            } else {
                (w / 16, w % 16)
            };
            let at = if bs == 32 {
                half_offsets(self.kind.interleave, nb, i / 32)[h] + pos
            } else {
                i
            };
            let (Some(&c), Some(&d)) = (self.codes.get(at), self.d.get(i / bs)) else {
                continue;
            };
            *o = match (self.shift.get(at / 4), self.lscale.get(at / 4)) {
                (Some(&s), _) => d * f32::from(i16::from(c) << s),
                (None, Some(&m)) => d * (m * f32::from(c)),
                _ => 0.0,
            };
        }
        out
    }
}

/// Quantizes a 32-value block `x` into `codes`, each lane of 4 values with
/// its own scale `m` (its largest magnitude / 127; codes
/// `round(x·127/a)`, ties to even); the block's scale: 1, or NaN if a value
/// is not finite (then the lane scales are NaN too and the codes 0).
fn quantize_lanes(x: &[f32], codes: &mut [i8], m: &mut [f32]) -> f32 {
    // The largest magnitude as the largest `|v|` bit pattern (the order of
    // non-negative floats; an integer max vectorizes), at least infinity's
    // if a value is infinite or NaN.
    if x.iter().fold(0u32, |m, v| m.max(v.to_bits() & ABS)) >= f32::INFINITY.to_bits() {
        m.fill(f32::NAN);
        return f32::NAN;
    }
    let mut f = [0f32; 32];
    for ((xl, fl), m) in x.chunks_exact(4).zip(f.chunks_exact_mut(4)).zip(m) {
        let a = f32::from_bits(xl.iter().fold(0u32, |m, v| m.max(v.to_bits() & ABS)));
        if a > 0.0 {
            *m = a / 127.0;
            fl.fill(127.0 / a);
        }
    }
    for ((c, &v), &f) in codes.iter_mut().zip(x).zip(&f) {
        // |v·f| ≤ 127 (+ rounding): the cast saturates at 127.
        *c = round_even(v * f) as i32 as i8;
    }
    1.0
}

/// Quantizes a block `x` (≤ 256 values) into `codes` with one scale and a
/// shift `≤ ms` per lane of 4 (see [`QRow::new`]); the block's scale, NaN
/// if a value is not finite.
fn quantize_shifted(x: &[f32], codes: &mut [i8], shifts: &mut [u32], ms: u32) -> f32 {
    let top = x.iter().fold(0u32, |m, v| m.max(v.to_bits() & ABS));
    if top >= f32::INFINITY.to_bits() {
        return f32::NAN;
    }
    let amax = f32::from_bits(top);
    if amax == 0.0 {
        return 0.0;
    }
    let id = 127.0 / amax;
    // Each value's factor (`id·2^(ms−s)` of its lane), then one flat loop
    // that vectorizes.
    let mut f = [0f32; 256];
    for ((xl, fl), sl) in x.chunks_exact(4).zip(f.chunks_exact_mut(4)).zip(shifts) {
        let a = f32::from_bits(xl.iter().fold(0u32, |m, v| m.max(v.to_bits() & ABS)));
        // The smallest shift s with a·2^(ms−s) ≤ amax (powers of two scale
        // exactly; the tests are nested).
        let fits = |k: u32| u32::from(k <= ms && a * (1u32 << k) as f32 <= amax);
        let s = ms - (fits(1) + fits(2) + fits(3) + fits(4));
        *sl = s;
        fl.fill(id * (1u32 << (ms - s)) as f32);
    }
    for ((c, &v), &f) in codes.iter_mut().zip(x).zip(&f) {
        // |v·f| ≤ 127 (+ rounding): the cast saturates at 127.
        *c = round_even(v * f) as i32 as i8;
    }
    amax / (127 << ms) as f32
}

/// Reorders whole runs of 4 blocks of `v` (8 parts of `P` items each: the
/// halves of 4 blocks) to halves 0 of the 4 blocks, then halves 1.
fn interleave<T: Copy + Default, const P: usize>(v: &mut [T]) {
    for run in v.chunks_exact_mut(8 * P) {
        let mut old = [[T::default(); P]; 8];
        for (o, part) in old.iter_mut().zip(run.chunks_exact(P)) {
            o.copy_from_slice(part);
        }
        for (k, halves) in old.chunks_exact(2).enumerate() {
            for (h, half) in halves.iter().enumerate() {
                let at = (4 * h + k) * P;
                if let Some(dst) = run.get_mut(at..at + P) {
                    dst.copy_from_slice(half);
                }
            }
        }
    }
}
