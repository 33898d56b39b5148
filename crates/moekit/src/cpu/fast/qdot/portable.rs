//! The [`Portable`](crate::cpu::SimdLevel::Portable) integer kernels: plain
//! Rust, lane by lane, exactly the arithmetic the module doc of [`super`]
//! defines (the other levels must match them bit for bit).

use super::{block_scales, finish, run_rows, widen_f16, QRow, Run};
use crate::cpu::fast::dot::k4_scales_mins;
use crate::error::Result;
use crate::format::ggml::GgmlType;
use crate::format::RowDecoder;

/// The portable run of `R` activation rows for weights of type `t`.
pub(super) fn run_for<const R: usize>(t: GgmlType) -> Option<Run<R>> {
    match t {
        GgmlType::Q4_0 => Some(run_q4_0::<R>),
        GgmlType::Q8_0 => Some(run_q8_0::<R>),
        GgmlType::Q4_K => Some(run_q4_k::<R>),
        _ => None,
    }
}

/// The arguments of a [`Run`].
macro_rules! run_fn {
    ($name:ident, $kernel:ident) => {
        #[allow(clippy::too_many_arguments)] // a Run
        fn $name<const R: usize>(
            dec: &RowDecoder<'_>,
            e: usize,
            n0: usize,
            n: usize,
            acts: &[&QRow; R],
            scratch: &mut [f32],
            out: &mut [f32],
            stride: usize,
        ) -> Result<()> {
            run_rows(
                dec,
                e,
                n0,
                n,
                acts,
                scratch,
                out,
                stride,
                #[inline(always)]
                |r, a, s, o| $kernel::<R>(r, a, s, o),
            )
        }
    };
}

run_fn!(run_q4_0, q4_0);
run_fn!(run_q8_0, q8_0);
run_fn!(run_q4_k, q4_k);

/// `L[j] = Σ_{k<4} w[4j+k]·y[4j+k]`: the 8 lanes of 32 codes.
#[inline(always)]
pub(super) fn lanes(w: &[i32; 32], y: &[i8; 32]) -> [i32; 8] {
    let mut l = [0i32; 8];
    for ((l, w), y) in l.iter_mut().zip(w.chunks_exact(4)).zip(y.chunks_exact(4)) {
        for (&w, &y) in w.iter().zip(y) {
            *l += w * i32::from(y);
        }
    }
    l
}

/// `a[j] += s·f32(l[j])`, the product rounded, then the sum.
#[inline(always)]
fn scale_add(a: &mut [f32; 8], s: f32, l: [i32; 8]) {
    for (a, l) in a.iter_mut().zip(l) {
        *a += s * l as f32;
    }
}

/// Q4_0 codes `q` (0..16) of a block's 16 nibble bytes: low nibbles are
/// weights 0..16, high nibbles 16..32.
#[inline(always)]
pub(super) fn q4_0_codes(qs: &[u8]) -> [i32; 32] {
    let mut w = [0i32; 32];
    for (i, &q) in qs.iter().take(16).enumerate() {
        w[i] = i32::from(q & 15);
        w[i + 16] = i32::from(q >> 4);
    }
    w
}

/// Q4_0 (18-byte blocks: f16 `d`, 16 nibble bytes): lanes of `q·y` plus
/// the bias `−8·Σy`, shifted.
fn q4_0<const R: usize>(
    row: &[u8],
    acts: &[&QRow; R],
    s: &mut [f32],
    out: &mut [f32; R],
) -> Option<()> {
    const BS: usize = 18;
    let s = block_scales(row, BS, 0, acts, s, widen_f16)?;
    let nb = row.len() / BS;
    for ((a, o), st) in acts.iter().zip(out.iter_mut()).zip(s.chunks_exact(nb)) {
        let mut acc = [[0f32; 8]; 2];
        for (b, (blk, &sb)) in row.chunks_exact(BS).zip(st).enumerate() {
            let w = q4_0_codes(blk.get(2..BS)?);
            let mut l = lanes(&w, a.codes_at::<32>(b)?);
            for ((l, &c), &sh) in l.iter_mut().zip(a.bias_at(b)?).zip(a.shift_at(b)?) {
                *l = (*l + c) << sh;
            }
            scale_add(&mut acc[b & 1], sb, l);
        }
        *o = finish(acc[0], acc[1], 0.0);
    }
    Some(())
}

/// Q8_0 (34-byte blocks: f16 `d`, 32 signed codes): lanes of `q·y`,
/// shifted.
fn q8_0<const R: usize>(
    row: &[u8],
    acts: &[&QRow; R],
    s: &mut [f32],
    out: &mut [f32; R],
) -> Option<()> {
    const BS: usize = 34;
    let s = block_scales(row, BS, 0, acts, s, widen_f16)?;
    let nb = row.len() / BS;
    for ((a, o), st) in acts.iter().zip(out.iter_mut()).zip(s.chunks_exact(nb)) {
        let mut acc = [[0f32; 8]; 2];
        for (b, (blk, &sb)) in row.chunks_exact(BS).zip(st).enumerate() {
            let mut w = [0i32; 32];
            for (w, &q) in w.iter_mut().zip(blk.get(2..BS)?) {
                *w = i32::from(q as i8);
            }
            let mut l = lanes(&w, a.codes_at::<32>(b)?);
            for (l, &sh) in l.iter_mut().zip(a.shift_at(b)?) {
                *l <<= sh;
            }
            scale_add(&mut acc[b & 1], sb, l);
        }
        *o = finish(acc[0], acc[1], 0.0);
    }
    Some(())
}

/// Q4_K (144-byte super-blocks: f16 `d`, `dmin`, 12 bytes of 6-bit group
/// scales and mins, 128 nibble bytes): lanes of `Σ_g sc_g·(q·y << shift)`
/// over the 8 groups of 32; the mins `Σ_g m_g·Σy_g`, times `dmin·d_x`, are subtracted.
fn q4_k<const R: usize>(
    row: &[u8],
    acts: &[&QRow; R],
    s: &mut [f32],
    out: &mut [f32; R],
) -> Option<()> {
    const BS: usize = 144;
    let nb = row.len() / BS;
    let (sd, sm) = s.split_at_mut(s.len() / 2);
    let sd = block_scales(row, BS, 0, acts, sd, widen_f16)?;
    let sm = block_scales(row, BS, 2, acts, sm, widen_f16)?;
    let per_row = sd.chunks_exact(nb).zip(sm.chunks_exact(nb));
    for ((a, o), (sd, sm)) in acts.iter().zip(out.iter_mut()).zip(per_row) {
        let mut acc = [[0f32; 8]; 2];
        let mut off = 0f32;
        for (b, blk) in row.chunks_exact(BS).enumerate() {
            let (sc, m) = k4_scales_mins(blk.get(4..16)?.try_into().ok()?);
            let qs = blk.get(16..BS)?;
            let y = a.codes_at::<256>(b)?;
            let sums = a.sums_at(b)?;
            let mut l = [0i32; 8];
            let mut summ = 0i32;
            for g in 0..8 {
                let shift = 4 * (g % 2);
                let q32 = qs.get(32 * (g / 2)..32 * (g / 2) + 32)?;
                let mut w = [0i32; 32];
                for (w, &q) in w.iter_mut().zip(q32) {
                    *w = i32::from((q >> shift) & 15);
                }
                let lg = lanes(&w, y.get(32 * g..32 * g + 32)?.try_into().ok()?);
                let scg = i32::from(*sc.get(g)?);
                for ((l, lg), &sh) in l.iter_mut().zip(lg).zip(a.shift_at(8 * b + g)?) {
                    *l += scg * (lg << sh);
                }
                summ += i32::from(*m.get(g)?) * (sums.get(2 * g)? + sums.get(2 * g + 1)?);
            }
            scale_add(&mut acc[b & 1], *sd.get(b)?, l);
            off += sm.get(b)? * summ as f32;
        }
        *o = finish(acc[0], acc[1], off);
    }
    Some(())
}
