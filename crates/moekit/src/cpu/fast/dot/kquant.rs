//! Fused dot kernels of the GGUF K-quant super-blocks (Q2_K … Q6_K) and of
//! IQ4_XS (K-quant-like groups of 32 with table-coded weights).
//!
//! A row is viewed as `&[Block]` (the blocks are 2-aligned `Pod` structs; an
//! unaligned row falls back to decode-then-dot). Each super-block unpacks its
//! group scales (and mins) once, widens its codes 32 at a time and adds
//! `scale · q · x` per group to the accumulator ([`Accum::add`]); signed code
//! offsets (Q3_K's −4, Q6_K's −32) are applied to the small integers before
//! widening, and the mins (`dmin·m`) once per group as `min · Σx` from the
//! block sums of `x`. The super-block scales `d`, `dmin` are often subnormal
//! f16, so they are widened without branches.

use super::legacy::{table_codes, IQ4NL_F32};
use super::simd::{whole, F8Ops, Simd, U8Ops};
use super::{arr, f16_to_f32, XSums};
use crate::format::ggml::blocks::{
    q3k_scales, BlockQ2_K, BlockQ3_K, BlockQ4_K, BlockQ5_K, BlockQ6_K, QK_K,
};
use crate::format::ggml::nonlinear::{iq4xs_scale, BlockIQ4_XS};
use bytemuck::Pod;

/// A row's running sums: scaled products by lane, in two pairs of
/// accumulators (alternate 32- or 64-weight slices use alternate pairs, so
/// each accumulator is updated at most once per slice pair), and the offset
/// terms.
pub(super) struct Accum<V: Simd> {
    lanes: [[V::F8; 2]; 2],
    off: f32,
    /// Q4_K / Q5_K: `Σ dmin·m_g·Σx_g` by lane (subtracted at the end).
    mins: V::F8,
}

impl<V: Simd> Accum<V> {
    /// `lanes[pair] += (s0·lo, s1·hi)`.
    #[inline(always)]
    fn add(&mut self, pair: usize, (s0, s1): (f32, f32), (lo, hi): (V::F8, V::F8)) {
        if let Some(a) = self.lanes.get_mut(pair & 1) {
            a[0] = V::F8::splat(s0).fma(lo, a[0]);
            a[1] = V::F8::splat(s1).fma(hi, a[1]);
        }
    }
}

/// `(q[0]·x[0..8] + q[1]·x[8..16], q[2]·x[16..24] + q[3]·x[24..32])`: the
/// products of the two 16-weight halves of a 32-weight slice.
#[inline(always)]
fn halves<F: F8Ops>(q: [F; 4], x: &[f32; 32]) -> (F, F) {
    let xv = |i: usize| {
        x.get(8 * i..8 * i + 8)
            .and_then(arr)
            .map_or(F::zero(), F::load)
    };
    (
        q[1].fma(xv(1), q[0].mul(xv(0))),
        q[3].fma(xv(3), q[2].mul(xv(2))),
    )
}

/// The 32 bytes as four vectors of 8 lanes.
#[inline(always)]
fn bytes32<U: U8Ops>(b: &[u8; 32]) -> [U; 4] {
    std::array::from_fn(|i| {
        b.get(8 * i..8 * i + 8)
            .and_then(arr)
            .map_or(U::splat(0), U::bytes)
    })
}

/// A K-quant super-block with a fused dot kernel.
pub(super) trait SuperBlock: Pod {
    /// Size of the blocks of `x` whose sums the kernel reads (16 or 32).
    const SUM: usize;
    /// Adds the block's `Σ_i (d·q_i)·x_i` to `acc.lanes` and its offset part
    /// (`Σ_groups offset·Σx`) to `acc.off`; `x` has `QK_K` values and `sums`
    /// `QK_K/SUM`. `None` only if a length is wrong.
    fn dot<V: Simd>(&self, x: &[f32], sums: &[f32], acc: &mut Accum<V>) -> Option<()>;
}

/// Dot of a row of `B` super-blocks with `x`; `None` if the row is not
/// 2-aligned or the lengths disagree. Runs out of line, in [`Simd::enter`].
#[inline(always)]
pub(super) fn dot_blocks<B: SuperBlock, V: Simd>(
    bytes: &[u8],
    x: &[f32],
    xs: &XSums,
) -> Option<f32> {
    V::enter(
        #[inline(always)]
        || blocks_dot::<B, V>(bytes, x, xs),
    )
}

/// [`dot_blocks`]' body.
#[inline(always)]
fn blocks_dot<B: SuperBlock, V: Simd>(bytes: &[u8], x: &[f32], xs: &XSums) -> Option<f32> {
    let blocks: &[B] = bytemuck::try_cast_slice(bytes).ok()?;
    let sums = xs.of(B::SUM);
    let k = blocks.len() * QK_K;
    if x.len() != k || sums.len() * B::SUM != k {
        return None;
    }
    let mut acc = Accum::<V> {
        lanes: [[V::F8::zero(); 2]; 2],
        off: 0.0,
        mins: V::F8::zero(),
    };
    let per = QK_K / B::SUM;
    for ((b, xb), sb) in blocks
        .iter()
        .zip(x.chunks_exact(QK_K))
        .zip(sums.chunks_exact(per))
    {
        b.dot(xb, sb, &mut acc)?;
    }
    let [[a, b], [c, d]] = acc.lanes;
    Some(a.add(c).add(b.add(d)).sum() + (acc.off - acc.mins.sum()))
}

/// Codes of chunk `c` of a Q4_K / Q5_K super-block: groups `2c` (low
/// nibbles of the 32 bytes `q32`) and `2c + 1` (high nibbles), plus bit `2c`
/// (`2c + 1`) of `qh[l]` as bit 4 of weight `l` of group `2c` (`2c + 1`)
/// (Q5_K).
#[inline(always)]
fn k4_codes<V: Simd>(q32: &[u8; 32], qh: Option<&[u8; 32]>, c: usize) -> ([V::F8; 4], [V::F8; 4]) {
    let v = bytes32::<V::U8>(q32);
    let mut lo = v.map(|v| v.and(15));
    let mut hi = v.map(|v| v.shr(4));
    if let Some(qh) = qh {
        let c = c as u32;
        for ((lo, hi), h) in lo.iter_mut().zip(&mut hi).zip(bytes32::<V::U8>(qh)) {
            // Bit 2c (2c + 1) to bit 4.
            let h = h.shl(4);
            *lo = lo.or(h.shr(2 * c).and(16));
            *hi = hi.or(h.shr(2 * c + 1).and(16));
        }
    }
    (lo.map(V::U8::to_f32), hi.map(V::U8::to_f32))
}

/// The 8 6-bit scales and 8 mins of Q4_K / Q5_K (as `scale_min_k4`), with
/// word operations (ggml's `kmask` unpacking) rather than 16 byte picks.
#[inline(always)]
pub(crate) fn k4_scales_mins(q: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    const M6: u32 = 0x3f3f_3f3f;
    const M4: u32 = 0x0f0f_0f0f;
    const M2: u32 = 0x0303_0303;
    let w = |i: usize| u32::from_le_bytes([q[i], q[i + 1], q[i + 2], q[i + 3]]);
    let (a, b, c) = (w(0), w(4), w(8));
    // Scales 0..4: a & 63; 4..8: low nibbles of c, top bits of a at bit 4.
    let sc_hi = (c & M4) | (((a >> 6) & M2) << 4);
    // Mins 0..4: b & 63; 4..8: high nibbles of c, top bits of b at bit 4.
    let m_hi = ((c >> 4) & M4) | (((b >> 6) & M2) << 4);
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    sc[..4].copy_from_slice(&(a & M6).to_le_bytes());
    sc[4..].copy_from_slice(&sc_hi.to_le_bytes());
    m[..4].copy_from_slice(&(b & M6).to_le_bytes());
    m[4..].copy_from_slice(&m_hi.to_le_bytes());
    (sc, m)
}

/// Q4_K / Q5_K: 8 groups of 32 weights; group `g` has codes [`k4_codes`],
/// scale `d·sc_g` and min `dmin·m_g` (subtracted as `dmin·m_g·Σx_g`).
#[inline(always)]
fn k4_dot<V: Simd>(
    (d, dmin): (f32, f32),
    scales: &[u8; 12],
    qs: &[u8; QK_K / 2],
    qh: Option<&[u8; 32]>,
    x: &[f32],
    sums: &[f32],
    acc: &mut Accum<V>,
) -> Option<()> {
    let x: &[f32; QK_K] = arr(x)?;
    let sums: &[f32; 8] = arr(sums)?;
    // Scales and mins widened a register at a time (scalar conversions and
    // products took as many vector-pipe slots as a fifth of the codes).
    let (sc, m) = k4_scales_mins(scales);
    let sc = V::U8::from_u64(u64::from_le_bytes(sc)).to_f32();
    let m = V::U8::from_u64(u64::from_le_bytes(m)).to_f32();
    let dl = sc.mul(V::F8::splat(d)).to_array();
    acc.mins = V::F8::splat(dmin).fma(m.mul(V::F8::load(sums)), acc.mins);
    for (c, (q32, x64)) in qs.chunks_exact(32).zip(x.chunks_exact(64)).enumerate() {
        let q32: &[u8; 32] = arr(q32)?;
        let (x0, x1) = x64.split_at(32);
        let (s0, s1) = (*dl.get(2 * c)?, *dl.get(2 * c + 1)?);
        let (lo, hi) = k4_codes::<V>(q32, qh, c);
        acc.add(c, (s0, s1), (whole(lo, arr(x0)?), whole(hi, arr(x1)?)));
    }
    Some(())
}

impl SuperBlock for BlockQ4_K {
    const SUM: usize = 32;
    #[inline(always)]
    fn dot<V: Simd>(&self, x: &[f32], sums: &[f32], acc: &mut Accum<V>) -> Option<()> {
        let d = (f16_to_f32(self.d, true), f16_to_f32(self.dmin, true));
        k4_dot(d, &self.scales, &self.qs, None, x, sums, acc)
    }
}

impl SuperBlock for BlockQ5_K {
    const SUM: usize = 32;
    #[inline(always)]
    fn dot<V: Simd>(&self, x: &[f32], sums: &[f32], acc: &mut Accum<V>) -> Option<()> {
        let d = (f16_to_f32(self.d, true), f16_to_f32(self.dmin, true));
        k4_dot(d, &self.scales, &self.qs, Some(&self.qh), x, sums, acc)
    }
}

/// Q2_K / Q3_K: 2 halves of 128 weights, each 4 slices of 32 (shift `2s`);
/// weight `128h + 32s + l` has 2-bit code `(qs[32h + l] >> 2s) & 3` and lies
/// in group `8h + 2s + l/16`. `code(h, s, i, c2)` finishes the codes of
/// lanes `8i..8i+8` (in 32-bit lanes); the group scales are `scale[g]`, and
/// `min[g]·Σx_g` is subtracted.
#[inline(always)]
fn k2_dot<V: Simd>(
    qs: &[u8; QK_K / 4],
    scale: &[f32; 16],
    min: Option<&[f32; 16]>,
    code: impl Fn(usize, usize, usize, V::U8) -> V::U8,
    x: &[f32],
    sums: &[f32],
    acc: &mut Accum<V>,
) -> Option<()> {
    let x: &[f32; QK_K] = arr(x)?;
    let sums: &[f32; 16] = arr(sums)?;
    for (h, (q32, x128)) in qs.chunks_exact(32).zip(x.chunks_exact(128)).enumerate() {
        let v = bytes32::<V::U8>(arr(q32)?);
        for (s, x32) in x128.chunks_exact(32).enumerate() {
            let mut q = [V::F8::zero(); 4];
            for (i, (q, v)) in q.iter_mut().zip(v).enumerate() {
                *q = code(h, s, i, v.shr(2 * s as u32).and(3)).to_f32();
            }
            let g = 8 * h + 2 * s;
            let (s0, s1) = (*scale.get(g)?, *scale.get(g + 1)?);
            acc.add(s, (s0, s1), halves(q, arr(x32)?));
            if let Some(min) = min {
                acc.off = V::fma(-*min.get(g)?, *sums.get(g)?, acc.off);
                acc.off = V::fma(-*min.get(g + 1)?, *sums.get(g + 1)?, acc.off);
            }
        }
    }
    Some(())
}

impl SuperBlock for BlockQ2_K {
    const SUM: usize = 16;
    #[inline(always)]
    fn dot<V: Simd>(&self, x: &[f32], sums: &[f32], acc: &mut Accum<V>) -> Option<()> {
        let (d, dmin) = (f16_to_f32(self.d, true), f16_to_f32(self.dmin, true));
        let (mut scale, mut min) = ([0f32; 16], [0f32; 16]);
        for ((s, m), &sc) in scale.iter_mut().zip(&mut min).zip(&self.scales) {
            *s = d * f32::from(sc & 0x0F);
            *m = dmin * f32::from(sc >> 4);
        }
        let code = |_, _, _, c2: V::U8| c2;
        k2_dot(&self.qs, &scale, Some(&min), code, x, sums, acc)
    }
}

impl SuperBlock for BlockQ3_K {
    const SUM: usize = 16;
    #[inline(always)]
    fn dot<V: Simd>(&self, x: &[f32], sums: &[f32], acc: &mut Accum<V>) -> Option<()> {
        let d = f16_to_f32(self.d, true);
        let mut scale = [0f32; 16];
        for (s, &sc) in scale.iter_mut().zip(&q3k_scales(&self.scales)) {
            *s = d * f32::from(sc);
        }
        // High-bit plane 4h + s; a clear bit means code − 4.
        let hmask = &self.hmask;
        let hm = bytes32::<V::U8>(hmask);
        let code = |h: usize, s: usize, i: usize, c2: V::U8| {
            let high = hm
                .get(i)
                .map_or(V::U8::splat(0), |m| m.shr((4 * h + s) as u32).and(1));
            c2.or(high.shl(2)).sub(4)
        };
        k2_dot(&self.qs, &scale, None, code, x, sums, acc)
    }
}

impl SuperBlock for BlockQ6_K {
    const SUM: usize = 16;
    #[inline(always)]
    fn dot<V: Simd>(&self, x: &[f32], _: &[f32], acc: &mut Accum<V>) -> Option<()> {
        let x: &[f32; QK_K] = arr(x)?;
        let d = f16_to_f32(self.d, true);
        let mut scale = [0f32; 16];
        for (s, &sc) in scale.iter_mut().zip(&self.scales) {
            *s = d * f32::from(sc);
        }
        // Half h: weights 128h + 32s + l, s = 0..4, l = 0..32, group
        // 8h + 2s + l/16. Low 4 bits from ql[64h + 32(s%2) + l] >> 4(s/2),
        // high 2 from qh[32h + l] >> 2s: the 32 ql bytes of part p = s % 2
        // serve slices p (low nibbles) and p + 2 (high), in one pass.
        let parts = x
            .chunks_exact(128)
            .zip(self.ql.chunks_exact(64))
            .zip(self.qh.chunks_exact(32))
            .zip(scale.chunks_exact(8));
        for (((x128, ql64), qh32), sc8) in parts {
            let (qh32, sc8): (&[u8; 32], &[f32; 8]) = (arr(qh32)?, arr(sc8)?);
            let qh = bytes32::<V::U8>(qh32);
            for (p, ql32) in ql64.chunks_exact(32).enumerate() {
                let ql = bytes32::<V::U8>(arr(ql32)?);
                // Slice p (low nibbles, high bits 2p), then slice p + 2 (high
                // nibbles, high bits 2p + 4).
                for half in 0..2 {
                    let shift = (2 * p + 4 * half) as u32;
                    let mut q = [V::F8::zero(); 4];
                    for ((q, l), h) in q.iter_mut().zip(ql).zip(qh) {
                        let lo = if half == 0 { l.and(15) } else { l.shr(4) };
                        let hi = h.shl(4).shr(shift).and(0x30);
                        *q = lo.or(hi).sub(32).to_f32();
                    }
                    let s = p + 2 * half;
                    let xs = arr(x128.get(32 * s..32 * s + 32)?)?;
                    let sc = sc8.get(2 * s..2 * s + 2)?;
                    acc.add(s, (*sc.first()?, *sc.last()?), halves(q, xs));
                }
            }
        }
        Some(())
    }
}

/// IQ4_XS: 8 groups of 32 weights `d·(ls − 32)·kvalues_iq4nl[q]`, two
/// groups (one `qs` pair of 16-byte runs) a step.
impl SuperBlock for BlockIQ4_XS {
    const SUM: usize = 32;
    #[inline(always)]
    fn dot<V: Simd>(&self, x: &[f32], _: &[f32], acc: &mut Accum<V>) -> Option<()> {
        let x: &[f32; QK_K] = arr(x)?;
        let d = f16_to_f32(self.d, true);
        for (c, (q32, x64)) in self.qs.chunks_exact(32).zip(x.chunks_exact(64)).enumerate() {
            let (q0, q1) = q32.split_at(16);
            let (x0, x1) = x64.split_at(32);
            let s0 = d * iq4xs_scale(self, 2 * c) as f32;
            let s1 = d * iq4xs_scale(self, 2 * c + 1) as f32;
            let lo = whole(table_codes::<V>(arr(q0)?, &IQ4NL_F32), arr(x0)?);
            let hi = whole(table_codes::<V>(arr(q1)?, &IQ4NL_F32), arr(x1)?);
            acc.add(c, (s0, s1), (lo, hi));
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ggml::blocks::scale_min_k4;
    use rand::{Rng, SeedableRng};

    #[test]
    fn k4_scales_mins_match_scale_min_k4() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for _ in 0..1000 {
            let q: [u8; 12] = rng.random();
            let (sc, m) = k4_scales_mins(&q);
            let want = scale_min_k4(&q);
            for j in 0..8 {
                assert_eq!((sc[j], m[j]), want[j], "{q:?} j={j}");
            }
        }
    }
}
