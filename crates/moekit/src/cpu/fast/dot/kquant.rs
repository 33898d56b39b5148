//! Fused dot kernels of the GGUF K-quant super-blocks (Q2_K … Q6_K).
//!
//! A row is viewed as `&[Block]` (the blocks are 2-aligned `Pod` structs; an
//! unaligned row falls back to decode-then-dot). Each super-block unpacks its
//! group scales (and mins) once, widens its codes 32 at a time and adds
//! `scale · q · x` per group to the accumulator ([`scaled_fma`]); signed code
//! offsets (Q3_K's −4, Q6_K's −32) are applied to the small integers before
//! widening, and the mins (`dmin·m`) once per group as `min · Σx` from the
//! block sums of `x`. The super-block scales `d`, `dmin` are often subnormal
//! f16, so they are widened without branches.

use super::{arr, f16_to_f32, fma, lanes_sum, scaled_fma, Acc, XSums, A, L};
use crate::format::ggml::blocks::{
    q3k_scales, BlockQ2_K, BlockQ3_K, BlockQ4_K, BlockQ5_K, BlockQ6_K, QK_K,
};
use bytemuck::Pod;

/// A row's running sums: scaled products by lane, and the offset terms.
pub(super) struct Accum {
    lanes: Acc,
    off: f32,
}

/// A K-quant super-block with a fused dot kernel.
pub(super) trait SuperBlock: Pod {
    /// Size of the blocks of `x` whose sums the kernel reads (16 or 32).
    const SUM: usize;
    /// Adds the block's `Σ_i (d·q_i)·x_i` to `acc.lanes` and its offset part
    /// (`Σ_groups offset·Σx`) to `acc.off`; `x` has `QK_K` values and `sums`
    /// `QK_K/SUM`. `None` only if a length is wrong.
    fn dot(&self, x: &[f32], sums: &[f32], acc: &mut Accum) -> Option<()>;
}

/// Dot of a row of `B` super-blocks with `x`; `None` if the row is not
/// 2-aligned or the lengths disagree.
#[inline(never)]
pub(super) fn dot_blocks<B: SuperBlock>(bytes: &[u8], x: &[f32], xs: &XSums) -> Option<f32> {
    let blocks: &[B] = bytemuck::try_cast_slice(bytes).ok()?;
    let sums = xs.of(B::SUM);
    let k = blocks.len() * QK_K;
    if x.len() != k || sums.len() * B::SUM != k {
        return None;
    }
    let mut acc = Accum {
        lanes: [0f32; A],
        off: 0.0,
    };
    let per = QK_K / B::SUM;
    for ((b, xb), sb) in blocks
        .iter()
        .zip(x.chunks_exact(QK_K))
        .zip(sums.chunks_exact(per))
    {
        b.dot(xb, sb, &mut acc)?;
    }
    Some(lanes_sum(acc.lanes) + acc.off)
}

/// Codes of chunk `c` of a Q4_K / Q5_K super-block: groups `2c` (low
/// nibbles of the 32 bytes `q32`) and `2c + 1` (high nibbles), plus bit `g`
/// of `qh[l]` as bit 4 of weight `32g + l` (Q5_K). In 32-bit lanes with the
/// `·0x1001` split (see the legacy `nibble_codes`): one widening load and
/// one multiply per 8 bytes for both groups.
#[inline(always)]
fn k4_codes(q32: &[u8; 32], qh: Option<&[u8; 32]>, c: usize) -> ([f32; L], [f32; L]) {
    let (mut lo, mut hi) = ([0f32; L], [0f32; L]);
    for l in 0..L {
        let v = u32::from(q32[l]) * 0x1001;
        let (h0, h1) = qh.map_or((0, 0), |qh| {
            let h = u32::from(qh[l]) << 4;
            ((h >> (2 * c)) & 0x10, (h >> (2 * c + 1)) & 0x10)
        });
        lo[l] = ((v & 0x0F) | h0) as f32;
        hi[l] = ((v >> 16) | h1) as f32;
    }
    (lo, hi)
}

/// The 8 6-bit scales and 8 mins of Q4_K / Q5_K (as `scale_min_k4`), with
/// word operations (ggml's `kmask` unpacking) rather than 16 byte picks.
#[inline(always)]
fn k4_scales_mins(q: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
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
fn k4_dot(
    (d, dmin): (f32, f32),
    scales: &[u8; 12],
    qs: &[u8; QK_K / 2],
    qh: Option<&[u8; 32]>,
    x: &[f32],
    sums: &[f32],
    acc: &mut Accum,
) -> Option<()> {
    let x: &[f32; QK_K] = arr(x)?;
    let sums: &[f32; 8] = arr(sums)?;
    let (sc, m) = k4_scales_mins(scales);
    let (mut dl, mut ml) = ([0f32; 8], [0f32; 8]);
    for j in 0..8 {
        dl[j] = d * f32::from(sc[j]);
        ml[j] = dmin * f32::from(m[j]) * sums[j];
    }
    acc.off -= ((ml[0] + ml[1]) + (ml[2] + ml[3])) + ((ml[4] + ml[5]) + (ml[6] + ml[7]));
    for (c, (q32, x64)) in qs.chunks_exact(32).zip(x.chunks_exact(64)).enumerate() {
        let q32: &[u8; 32] = arr(q32)?;
        let (x0, x1) = x64.split_at(L);
        let (s0, s1) = (*dl.get(2 * c)?, *dl.get(2 * c + 1)?);
        let (lo, hi) = k4_codes(q32, qh, c);
        scaled_fma(&mut acc.lanes, s0, s0, &lo, arr(x0)?);
        scaled_fma(&mut acc.lanes, s1, s1, &hi, arr(x1)?);
    }
    Some(())
}

impl SuperBlock for BlockQ4_K {
    const SUM: usize = 32;
    #[inline(always)]
    fn dot(&self, x: &[f32], sums: &[f32], acc: &mut Accum) -> Option<()> {
        let d = (f16_to_f32(self.d, true), f16_to_f32(self.dmin, true));
        k4_dot(d, &self.scales, &self.qs, None, x, sums, acc)
    }
}

impl SuperBlock for BlockQ5_K {
    const SUM: usize = 32;
    #[inline(always)]
    fn dot(&self, x: &[f32], sums: &[f32], acc: &mut Accum) -> Option<()> {
        let d = (f16_to_f32(self.d, true), f16_to_f32(self.dmin, true));
        k4_dot(d, &self.scales, &self.qs, Some(&self.qh), x, sums, acc)
    }
}

/// Q2_K / Q3_K: 2 halves of 128 weights, each 4 slices of 32 (shift `2s`);
/// weight `128h + 32s + l` has 2-bit code `(qs[32h + l] >> 2s) & 3` and lies
/// in group `8h + 2s + l/16`. `code(h, s, l, c2)` finishes the code (in
/// 32-bit lanes); the group scales are `scale[g]`, and `min[g]·Σx_g` is
/// subtracted.
#[inline(always)]
fn k2_dot(
    qs: &[u8; QK_K / 4],
    scale: &[f32; 16],
    min: Option<&[f32; 16]>,
    code: impl Fn(usize, usize, usize, u32) -> i32,
    x: &[f32],
    sums: &[f32],
    acc: &mut Accum,
) -> Option<()> {
    let x: &[f32; QK_K] = arr(x)?;
    let sums: &[f32; 16] = arr(sums)?;
    for (h, (q32, x128)) in qs.chunks_exact(32).zip(x.chunks_exact(128)).enumerate() {
        let q32: &[u8; 32] = arr(q32)?;
        for (s, x32) in x128.chunks_exact(L).enumerate() {
            let mut q = [0f32; L];
            for (l, q) in q.iter_mut().enumerate() {
                *q = code(h, s, l, (u32::from(q32[l]) >> (2 * s)) & 3) as f32;
            }
            let g = 8 * h + 2 * s;
            let (s0, s1) = (*scale.get(g)?, *scale.get(g + 1)?);
            scaled_fma(&mut acc.lanes, s0, s1, &q, arr(x32)?);
            if let Some(min) = min {
                acc.off = fma(-*min.get(g)?, *sums.get(g)?, acc.off);
                acc.off = fma(-*min.get(g + 1)?, *sums.get(g + 1)?, acc.off);
            }
        }
    }
    Some(())
}

impl SuperBlock for BlockQ2_K {
    const SUM: usize = 16;
    #[inline(always)]
    fn dot(&self, x: &[f32], sums: &[f32], acc: &mut Accum) -> Option<()> {
        let (d, dmin) = (f16_to_f32(self.d, true), f16_to_f32(self.dmin, true));
        let (mut scale, mut min) = ([0f32; 16], [0f32; 16]);
        for ((s, m), &sc) in scale.iter_mut().zip(&mut min).zip(&self.scales) {
            *s = d * f32::from(sc & 0x0F);
            *m = dmin * f32::from(sc >> 4);
        }
        let code = |_, _, _, c2: u32| c2 as i32;
        k2_dot(&self.qs, &scale, Some(&min), code, x, sums, acc)
    }
}

impl SuperBlock for BlockQ3_K {
    const SUM: usize = 16;
    #[inline(always)]
    fn dot(&self, x: &[f32], sums: &[f32], acc: &mut Accum) -> Option<()> {
        let d = f16_to_f32(self.d, true);
        let mut scale = [0f32; 16];
        for (s, &sc) in scale.iter_mut().zip(&q3k_scales(&self.scales)) {
            *s = d * f32::from(sc);
        }
        // High-bit plane 4h + s; a clear bit means code − 4.
        let hmask = &self.hmask;
        let code = |h: usize, s: usize, l: usize, c2: u32| {
            let high = (u32::from(hmask[l]) >> (4 * h + s)) & 1;
            (c2 | (high << 2)) as i32 - 4
        };
        k2_dot(&self.qs, &scale, None, code, x, sums, acc)
    }
}

impl SuperBlock for BlockQ6_K {
    const SUM: usize = 16;
    #[inline(always)]
    fn dot(&self, x: &[f32], _: &[f32], acc: &mut Accum) -> Option<()> {
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
        let halves = x
            .chunks_exact(128)
            .zip(self.ql.chunks_exact(64))
            .zip(self.qh.chunks_exact(32))
            .zip(scale.chunks_exact(8));
        for (((x128, ql64), qh32), sc8) in halves {
            let (qh32, sc8): (&[u8; 32], &[f32; 8]) = (arr(qh32)?, arr(sc8)?);
            for (p, ql32) in ql64.chunks_exact(32).enumerate() {
                let ql32: &[u8; 32] = arr(ql32)?;
                // Slice p (low nibbles, high bits 2p), then slice p + 2 (high
                // nibbles, high bits 2p + 4): one code array live at a time.
                for (half, shift) in [(0, 2 * p), (1, 2 * p + 4)] {
                    let mut q = [0f32; L];
                    for (l, q) in q.iter_mut().enumerate() {
                        let v = u32::from(ql32[l]) * 0x1001;
                        let lo = if half == 0 { v & 0x0F } else { v >> 16 };
                        let hi = ((u32::from(qh32[l]) << 4) >> shift) & 0x30;
                        *q = ((lo | hi) as i32 - 32) as f32;
                    }
                    let s = p + 2 * half;
                    let xs = arr(x128.get(32 * s..32 * s + 32)?)?;
                    let sc = sc8.get(2 * s..2 * s + 2)?;
                    scaled_fma(&mut acc.lanes, *sc.first()?, *sc.last()?, &q, xs);
                }
            }
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
