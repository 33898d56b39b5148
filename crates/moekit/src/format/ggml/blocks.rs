//! `#[repr(C)]` GGUF blocks, laid out exactly as llama.cpp's `ggml-common.h`,
//! and their dequantization.
//!
//! Every block is `Pod` (no padding: the only wider field is the 2-byte
//! `f16`, and every block holding one has an even size), so a byte row can be
//! viewed as `&[Block]` when it is aligned (2 bytes; 1 for MXFP4, NVFP4 and IQ1_M)
//! and is read block by block otherwise. The table-based blocks (IQ4_NL,
//! IQ4_XS, MXFP4) are in [`super::nonlinear`], the grid i-quants in
//! [`super::iquant`], the ternary ones in [`super::ternary`].
//!
//! Dequantization follows `dequantize_row_*` of ggml-quants.c (and gguf-py's
//! `gguf.quants`) operation for operation, so results are bit-identical in
//! f32: e.g. Q4_K computes `(d·sc)·q − (dmin·m)` with the products rounded to
//! f32 in that order.

use super::GgmlType;
use bytemuck::{Pod, Zeroable};
use half::f16;
use rand::rngs::StdRng;
use rand::Rng;

/// Weights per K-quant super-block (`QK_K`).
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales and mins in Q4_K / Q5_K (`K_SCALE_SIZE`).
pub const K_SCALE_SIZE: usize = 12;

/// `block_q4_0`: 32 weights `d·(q − 8)`, q 4-bit (low nibbles are weights
/// 0..16, high nibbles 16..32).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_0 {
    /// Scale.
    pub d: f16,
    /// Nibbles.
    pub qs: [u8; 16],
}

/// `block_q4_1`: 32 weights `d·q + m`, q 4-bit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_1 {
    /// Scale.
    pub d: f16,
    /// Minimum (offset).
    pub m: f16,
    /// Nibbles.
    pub qs: [u8; 16],
}

/// `block_q5_0`: 32 weights `d·(q − 16)`, q 5-bit (bit 4 of weight j is bit j
/// of the little-endian `qh`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_0 {
    /// Scale.
    pub d: f16,
    /// High bits, little-endian u32.
    pub qh: [u8; 4],
    /// Low nibbles.
    pub qs: [u8; 16],
}

/// `block_q5_1`: 32 weights `d·q + m`, q 5-bit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_1 {
    /// Scale.
    pub d: f16,
    /// Minimum (offset).
    pub m: f16,
    /// High bits, little-endian u32.
    pub qh: [u8; 4],
    /// Low nibbles.
    pub qs: [u8; 16],
}

/// `block_q8_0`: 32 weights `d·q`, q signed 8-bit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// Codes.
    pub qs: [i8; 32],
}

/// `block_q2_K`: 16 groups of 16 weights `d·sc·q − dmin·m`, q 2-bit, 4-bit
/// `sc` (low nibble) and `m` (high nibble) per group.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ2_K {
    /// Per-group scale (low nibble) and min (high nibble).
    pub scales: [u8; QK_K / 16],
    /// 2-bit codes: byte `l` of half `h` holds weights `h·128 + 32·s + l`, s = 0..4.
    pub qs: [u8; QK_K / 4],
    /// Super-block scale of the scales.
    pub d: f16,
    /// Super-block scale of the mins.
    pub dmin: f16,
}

/// `block_q3_K`: 16 groups of 16 weights `d·(sc − 32)·q`, q 3-bit signed
/// (`q = low2 − 4` unless the `hmask` bit is set), 6-bit scales.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ3_K {
    /// High bit of each code (bit `4h + s` of byte `l`).
    pub hmask: [u8; QK_K / 8],
    /// Low 2 bits of each code, as in Q2_K.
    pub qs: [u8; QK_K / 4],
    /// 16 packed 6-bit scales.
    pub scales: [u8; 12],
    /// Super-block scale.
    pub d: f16,
}

/// `block_q4_K`: 8 groups of 32 weights `d·sc·q − dmin·m`, q 4-bit, 6-bit
/// `sc`/`m` packed in 12 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_K {
    /// Super-block scale of the scales.
    pub d: f16,
    /// Super-block scale of the mins.
    pub dmin: f16,
    /// Packed 6-bit scales and mins.
    pub scales: [u8; K_SCALE_SIZE],
    /// Nibbles: byte `l` of chunk `c` holds weights `64c + l` (low) and `64c + 32 + l` (high).
    pub qs: [u8; QK_K / 2],
}

/// `block_q5_K`: as Q4_K with a fifth bit per weight in `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_K {
    /// Super-block scale of the scales.
    pub d: f16,
    /// Super-block scale of the mins.
    pub dmin: f16,
    /// Packed 6-bit scales and mins.
    pub scales: [u8; K_SCALE_SIZE],
    /// Bit `g` of byte `l` is bit 4 of weight `32g + l`.
    pub qh: [u8; QK_K / 8],
    /// Low nibbles, as in Q4_K.
    pub qs: [u8; QK_K / 2],
}

/// `block_q6_K`: 16 groups of 16 weights `d·sc·(q − 32)`, q 6-bit, signed
/// 8-bit scales.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ6_K {
    /// Low 4 bits of the codes.
    pub ql: [u8; QK_K / 2],
    /// High 2 bits of the codes.
    pub qh: [u8; QK_K / 4],
    /// Per-group scales.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale.
    pub d: f16,
}

const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == GgmlType::Q4_0.type_size());
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == GgmlType::Q4_1.type_size());
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == GgmlType::Q5_0.type_size());
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == GgmlType::Q5_1.type_size());
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == GgmlType::Q8_0.type_size());
const _: () = assert!(std::mem::size_of::<BlockQ2_K>() == 84);
const _: () = assert!(std::mem::size_of::<BlockQ3_K>() == 110);
const _: () = assert!(std::mem::size_of::<BlockQ4_K>() == 144);
const _: () = assert!(std::mem::size_of::<BlockQ5_K>() == 176);
const _: () = assert!(std::mem::size_of::<BlockQ6_K>() == 210);
const _: () = assert!(GgmlType::Q2_K.type_size() == 84 && GgmlType::Q3_K.type_size() == 110);
const _: () = assert!(GgmlType::Q4_K.type_size() == 144 && GgmlType::Q5_K.type_size() == 176);
const _: () = assert!(GgmlType::Q6_K.type_size() == 210);

/// One GGUF block type: its [`GgmlType`], dequantizer, random-scale setter and
/// (for the legacy types) reference quantizer.
pub(crate) trait Block: Pod {
    /// The block's type.
    const TYPE: GgmlType;
    /// Whether [`Block::quantize`] is implemented.
    const QUANTIZE: bool = false;

    /// Writes the block's weights into `out`, which must have `block_size`
    /// elements (any other length writes nothing; never panics).
    fn dequantize(&self, out: &mut [f32]);

    /// Overwrites the scale fields (f16, or MXFP4's e8m0 byte) with finite
    /// random values chosen so the weights are O(0.01–0.1); code bytes are
    /// left as they are.
    fn randomize_scales(&mut self, rng: &mut StdRng);

    /// Quantizes `block_size` values (gguf-py / `quantize_row_*_ref`). Only
    /// meaningful when [`Block::QUANTIZE`]; the default is a zeroed block.
    fn quantize(_x: &[f32]) -> Self {
        Self::zeroed()
    }
}

/// A random finite f16 scale, log-uniform so that `scale · max_product` lies
/// in [0.01, 0.1]; negative with probability ½ when `signed`.
pub(crate) fn random_scale(rng: &mut StdRng, max_product: f32, signed: bool) -> f16 {
    let (lo, hi) = (0.01 / max_product, 0.1 / max_product);
    let mag = lo * (hi / lo).powf(rng.random::<f32>());
    let sign = if signed && rng.random::<bool>() {
        -1.0
    } else {
        1.0
    };
    f16::from_f32(sign * mag)
}

/// `out` as a fixed-size block (known lengths let the loops vectorize
/// without bounds checks); `None` if the caller passed a wrong length.
#[inline(always)]
fn fixed<const N: usize>(out: &mut [f32]) -> Option<&mut [f32; N]> {
    out.try_into().ok()
}

/// Low nibbles to `lo`, high nibbles to `hi`, each through `f`.
#[inline(always)]
fn nibbles(qs: &[u8], lo: &mut [f32], hi: &mut [f32], f: impl Fn(u8) -> f32) {
    for ((&q, l), h) in qs.iter().zip(lo).zip(hi) {
        *l = f(q & 0x0F);
        *h = f(q >> 4);
    }
}

/// `1 << j` for lane j: a per-lane constant mask, so the Q5 high-bit test
/// vectorizes (no loop counter, no variable shifts).
const LANE_BITS: [u32; 16] = {
    let mut b = [0u32; 16];
    let mut j = 0;
    while j < 16 {
        b[j] = 1 << j;
        j += 1;
    }
    b
};

/// 5-bit codes of a Q5 block through `f`: weight j < 16 is the low nibble of
/// `qs[j]`, weight j + 16 its high nibble; bit 4 of weight j is bit j of `qh`.
#[inline(always)]
fn five_bit(qh: [u8; 4], qs: &[u8; 16], out: &mut [f32; 32], f: impl Fn(u8) -> f32) {
    let qh = u32::from_le_bytes(qh);
    let (qh_lo, qh_hi) = (qh, qh >> 16);
    let (lo, hi) = out.split_at_mut(16);
    for (((&q, l), h), &bit) in qs.iter().zip(lo).zip(hi).zip(&LANE_BITS) {
        let h0 = if qh_lo & bit != 0 { 0x10 } else { 0 };
        let h1 = if qh_hi & bit != 0 { 0x10 } else { 0 };
        *l = f((q & 0x0F) | h0);
        *h = f((q >> 4) | h1);
    }
}

impl Block for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    const QUANTIZE: bool = true;
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let Some(out) = fixed::<32>(out) else {
            return;
        };
        let d = self.d.to_f32();
        let (lo, hi) = out.split_at_mut(16);
        nibbles(&self.qs, lo, hi, |q| {
            f32::from((q as i8).wrapping_sub(8)) * d
        });
    }
    fn randomize_scales(&mut self, rng: &mut StdRng) {
        self.d = random_scale(rng, 8.0, true);
    }
    fn quantize(x: &[f32]) -> Self {
        super::quantize::q4_0(x)
    }
}

impl Block for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    const QUANTIZE: bool = true;
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let Some(out) = fixed::<32>(out) else {
            return;
        };
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        let (lo, hi) = out.split_at_mut(16);
        nibbles(&self.qs, lo, hi, |q| d * f32::from(q) + m);
    }
    fn randomize_scales(&mut self, rng: &mut StdRng) {
        self.d = random_scale(rng, 15.0, false);
        self.m = f16::from_f32(-self.d.to_f32() * rng.random_range(0.0..15.0f32));
    }
    fn quantize(x: &[f32]) -> Self {
        super::quantize::q4_1(x)
    }
}

impl Block for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    const QUANTIZE: bool = true;
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let Some(out) = fixed::<32>(out) else {
            return;
        };
        let d = self.d.to_f32();
        five_bit(self.qh, &self.qs, out, |q| {
            f32::from((q as i8).wrapping_sub(16)) * d
        });
    }
    fn randomize_scales(&mut self, rng: &mut StdRng) {
        self.d = random_scale(rng, 16.0, true);
    }
    fn quantize(x: &[f32]) -> Self {
        super::quantize::q5_0(x)
    }
}

impl Block for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    const QUANTIZE: bool = true;
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let Some(out) = fixed::<32>(out) else {
            return;
        };
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        five_bit(self.qh, &self.qs, out, |q| d * f32::from(q) + m);
    }
    fn randomize_scales(&mut self, rng: &mut StdRng) {
        self.d = random_scale(rng, 31.0, false);
        self.m = f16::from_f32(-self.d.to_f32() * rng.random_range(0.0..31.0f32));
    }
    fn quantize(x: &[f32]) -> Self {
        super::quantize::q5_1(x)
    }
}

impl Block for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const QUANTIZE: bool = true;
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let Some(out) = fixed::<32>(out) else {
            return;
        };
        let d = self.d.to_f32();
        for (y, &q) in out.iter_mut().zip(&self.qs) {
            *y = f32::from(q) * d;
        }
    }
    fn randomize_scales(&mut self, rng: &mut StdRng) {
        self.d = random_scale(rng, 128.0, true);
    }
    fn quantize(x: &[f32]) -> Self {
        super::quantize::q8_0(x)
    }
}

/// Calls `f(group, shift, codes)` for the 16 groups of 16 weights of a Q2_K /
/// Q3_K super-block, where weight `16·group + i` has 2-bit code
/// `(codes[i] >> shift) & 3` and `codes` are 16 bytes of `qs`.
/// Group `g` = `8h + 2s + half`: half `h` of the block, shift `2s`.
#[inline(always)]
fn for_2bit_groups(
    qs: &[u8; QK_K / 4],
    out: &mut [f32; QK_K],
    mut f: impl FnMut(usize, u32, &[u8], &mut [f32]),
) {
    for (h, (o128, q32)) in out
        .chunks_exact_mut(128)
        .zip(qs.chunks_exact(32))
        .enumerate()
    {
        for (s, o32) in o128.chunks_exact_mut(32).enumerate() {
            for (half, (o16, q16)) in o32
                .chunks_exact_mut(16)
                .zip(q32.chunks_exact(16))
                .enumerate()
            {
                f(8 * h + 2 * s + half, 2 * s as u32, q16, o16);
            }
        }
    }
}

impl Block for BlockQ2_K {
    const TYPE: GgmlType = GgmlType::Q2_K;
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let Some(out) = fixed::<QK_K>(out) else {
            return;
        };
        let (d, dmin) = (self.d.to_f32(), self.dmin.to_f32());
        let scales = &self.scales;
        for_2bit_groups(&self.qs, out, |g, shift, q16, o16| {
            let sc = scales.get(g).copied().unwrap_or(0);
            let dl = d * f32::from(sc & 0x0F);
            let ml = dmin * f32::from(sc >> 4);
            for (y, &q) in o16.iter_mut().zip(q16) {
                *y = dl * f32::from(q.wrapping_shr(shift) & 3) - ml;
            }
        });
    }
    fn randomize_scales(&mut self, rng: &mut StdRng) {
        self.d = random_scale(rng, 45.0, false);
        self.dmin = random_scale(rng, 45.0, false);
    }
}

/// The 16 signed 6-bit scales of a Q3_K block (`sc − 32`).
#[inline(always)]
pub(crate) fn q3k_scales(s: &[u8; 12]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 { s[j] & 0x0F } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (low | (high << 4)) as i8 - 32;
    }
    out
}

impl Block for BlockQ3_K {
    const TYPE: GgmlType = GgmlType::Q3_K;
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let Some(out) = fixed::<QK_K>(out) else {
            return;
        };
        let d = self.d.to_f32();
        let scales = q3k_scales(&self.scales);
        let hmask = &self.hmask;
        for_2bit_groups(&self.qs, out, |g, shift, q16, o16| {
            let dl = d * f32::from(scales.get(g).copied().unwrap_or(0));
            // High-bit plane `4h + s` = `g / 2`; lanes 16·(g % 2) .. +16 of hmask.
            let bit = 1u8 << (g / 2);
            let m16 = hmask.chunks_exact(16).nth(g % 2).unwrap_or(&[]);
            for ((y, &q), &m) in o16.iter_mut().zip(q16).zip(m16) {
                let v = (q.wrapping_shr(shift) & 3) as i8;
                let v = v.wrapping_sub(if m & bit != 0 { 0 } else { 4 });
                *y = dl * f32::from(v);
            }
        });
    }
    fn randomize_scales(&mut self, rng: &mut StdRng) {
        self.d = random_scale(rng, 128.0, true);
    }
}

/// The 8 (scale, min) pairs of Q4_K / Q5_K (`get_scale_min_k4`).
#[inline(always)]
pub(crate) fn scale_min_k4(q: &[u8; K_SCALE_SIZE]) -> [(u8, u8); 8] {
    let mut out = [(0u8, 0u8); 8];
    for (j, o) in out.iter_mut().enumerate() {
        *o = if j < 4 {
            (q[j] & 63, q[j + 4] & 63)
        } else {
            (
                (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
                (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
            )
        };
    }
    out
}

/// Q4_K / Q5_K: calls `f(d_g, m_g, sub, out32)` for the 8 groups of 32 weights,
/// where `sub` is `(chunk, nibble)` (group `2·chunk + nibble`).
#[inline(always)]
fn for_k4_groups(
    d: f16,
    dmin: f16,
    scales: &[u8; K_SCALE_SIZE],
    out: &mut [f32],
    mut f: impl FnMut(f32, f32, usize, u32, &mut [f32]),
) {
    let (d, dmin) = (d.to_f32(), dmin.to_f32());
    let sm = scale_min_k4(scales);
    for (g, (o32, &(sc, m))) in out.chunks_exact_mut(32).zip(&sm).enumerate() {
        f(
            d * f32::from(sc),
            dmin * f32::from(m),
            g / 2,
            (g % 2) as u32,
            o32,
        );
    }
}

impl Block for BlockQ4_K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let Some(out) = fixed::<QK_K>(out) else {
            return;
        };
        let qs = &self.qs;
        for_k4_groups(
            self.d,
            self.dmin,
            &self.scales,
            out,
            |dl, ml, chunk, nib, o32| {
                let q32 = qs.chunks_exact(32).nth(chunk).unwrap_or(&[]);
                let shift = 4 * nib;
                for (y, &q) in o32.iter_mut().zip(q32) {
                    *y = dl * f32::from(q.wrapping_shr(shift) & 0x0F) - ml;
                }
            },
        );
    }
    fn randomize_scales(&mut self, rng: &mut StdRng) {
        self.d = random_scale(rng, 945.0, false);
        self.dmin = random_scale(rng, 945.0, false);
    }
}

impl Block for BlockQ5_K {
    const TYPE: GgmlType = GgmlType::Q5_K;
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let Some(out) = fixed::<QK_K>(out) else {
            return;
        };
        let (qs, qh) = (&self.qs, &self.qh);
        for_k4_groups(
            self.d,
            self.dmin,
            &self.scales,
            out,
            |dl, ml, chunk, nib, o32| {
                let q32 = qs.chunks_exact(32).nth(chunk).unwrap_or(&[]);
                let (shift, hshift) = (4 * nib, 2 * chunk as u32 + nib);
                for ((y, &q), &h) in o32.iter_mut().zip(q32).zip(qh) {
                    let v = (q.wrapping_shr(shift) & 0x0F) | ((h.wrapping_shr(hshift) & 1) << 4);
                    *y = dl * f32::from(v) - ml;
                }
            },
        );
    }
    fn randomize_scales(&mut self, rng: &mut StdRng) {
        self.d = random_scale(rng, 1953.0, false);
        self.dmin = random_scale(rng, 1953.0, false);
    }
}

impl Block for BlockQ6_K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let Some(out) = fixed::<QK_K>(out) else {
            return;
        };
        let d = self.d.to_f32();
        // Half h: weights 128h + 32s + l, s = 0..4, l = 0..32. Low 4 bits from
        // ql[64h + 32(s%2) + l] >> 4(s/2), high 2 from qh[32h + l] >> 2s.
        let halves = out
            .chunks_exact_mut(128)
            .zip(self.ql.chunks_exact(64))
            .zip(self.qh.chunks_exact(32));
        for (h, ((o128, ql64), qh32)) in halves.enumerate() {
            for (s, o32) in o128.chunks_exact_mut(32).enumerate() {
                let ql32 = ql64.chunks_exact(32).nth(s % 2).unwrap_or(&[]);
                let (lshift, hshift) = (4 * (s / 2) as u32, 2 * s as u32);
                let groups = o32
                    .chunks_exact_mut(16)
                    .zip(ql32.chunks_exact(16))
                    .zip(qh32.chunks_exact(16));
                for (half, ((o16, l16), h16)) in groups.enumerate() {
                    let sc = self.scales.get(8 * h + 2 * s + half).copied().unwrap_or(0);
                    let dl = d * f32::from(sc);
                    for ((y, &l), &hb) in o16.iter_mut().zip(l16).zip(h16) {
                        let q =
                            (l.wrapping_shr(lshift) & 0x0F) | ((hb.wrapping_shr(hshift) & 3) << 4);
                        *y = dl * f32::from((q as i8).wrapping_sub(32));
                    }
                }
            }
        }
    }
    fn randomize_scales(&mut self, rng: &mut StdRng) {
        self.d = random_scale(rng, 4096.0, true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q3k_scales_match_the_kmask_unpacking() {
        // ggml's dequantize_row_q3_K unpacks via u32 masks; check our
        // per-scale formula against that formulation for random bytes.
        let mut rng = <StdRng as rand::SeedableRng>::seed_from_u64(7);
        for _ in 0..100 {
            let s: [u8; 12] = rng.random();
            let a = [0, 4, 8].map(|i| u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]));
            let (k1, k2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
            let tmp = a[2];
            let aux = [
                (a[0] & k2) | ((tmp & k1) << 4),
                (a[1] & k2) | (((tmp >> 2) & k1) << 4),
                ((a[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4),
                ((a[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4),
            ];
            let want: Vec<i8> = aux
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .map(|b| b as i8 - 32)
                .collect();
            assert_eq!(q3k_scales(&s).to_vec(), want);
        }
    }

    #[test]
    fn scale_min_k4_extremes() {
        // All bits set: every 6-bit scale and min is 63.
        assert!(scale_min_k4(&[0xFF; 12]).iter().all(|&p| p == (63, 63)));
        assert!(scale_min_k4(&[0; 12]).iter().all(|&p| p == (0, 0)));
        // Byte 8 = 0x21: scale 4 low nibble 1, min 4 low nibble 2; byte 0 top bits feed scale 4.
        let mut q = [0u8; 12];
        q[8] = 0x21;
        q[0] = 0xC0;
        q[4] = 0x40;
        let sm = scale_min_k4(&q);
        assert_eq!(sm[4], (0x31, 0x12));
        assert_eq!(sm[0], (0, 0));
    }
}
