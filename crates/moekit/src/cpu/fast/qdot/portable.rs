//! The [`Portable`](crate::cpu::SimdLevel::Portable) integer kernels: plain
//! Rust, lane by lane, exactly the arithmetic the module doc of [`super`]
//! defines (the other levels must match them bit for bit, and use the lane
//! functions here for the blocks after a row's last whole run of 4).

use super::{
    add_block, add_block_scaled, add_offset, block_scales, each_row, finish, half_offsets, offsets,
    widen8_f16, Acc, QRow, Run, RUN,
};
use crate::cpu::fast::dot::k4_scales_mins;
use crate::format::ggml::GgmlType;

/// The portable run of `R` activation rows for weights of type `t`.
pub(super) fn run_for<const R: usize>(t: GgmlType) -> Option<Run<R>> {
    match t {
        GgmlType::Q4_0 => Some(run_q4_0::<R>),
        GgmlType::Q8_0 => Some(run_q8_0::<R>),
        GgmlType::Q4_K => Some(run_q4_k::<R>),
        _ => super::blocks::run_for::<R>(t),
    }
}

// This file's kernels as Runs (`portable_run!`, qdot/mod.rs).
portable_run!(run_q4_0 [const R: usize], q4_0::<R>);
portable_run!(run_q8_0 [const R: usize], q8_0::<R>);
portable_run!(run_q4_k [const R: usize], q4_k::<R>);

/// `L[j] = Σ_{k<4} w[4j+k]·y[4j+k]` of 32 weights and the codes of their
/// two halves, `y0` (weights 0..16) and `y1` (16..32).
#[inline(always)]
fn lanes(w: &[i32; 32], y0: &[i8], y1: &[i8]) -> [i32; 8] {
    let mut l = [0i32; 8];
    for (j, l) in l.iter_mut().enumerate() {
        let y = if j < 4 { y0 } else { y1 };
        for k in 0..4 {
            *l += w[4 * j + k] * y.get(4 * (j % 4) + k).map_or(0, |&v| i32::from(v));
        }
    }
    l
}

/// The lanes (and their scales) of 32 weights `w` against 32-value block
/// `b` (of `nb`) of `a`.
#[inline(always)]
pub(super) fn block_lanes(a: &QRow, nb: usize, b: usize, w: &[i32; 32]) -> Option<Lanes> {
    let at = half_offsets(a.kind.interleave, nb, b);
    let (y0, y1) = (
        a.codes.get(at[0]..at[0] + 16)?,
        a.codes.get(at[1]..at[1] + 16)?,
    );
    let mut m = [0f32; 8];
    for (j, m) in m.iter_mut().enumerate() {
        *m = *a.lscale.get(at[j / 4] / 4 + j % 4)?;
    }
    Some((lanes(w, y0, y1), m))
}

/// A 32-value block's integer lanes and the lanes' scales.
pub(super) type Lanes = ([i32; 8], [f32; 8]);

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

/// The lanes of Q4_0 block `b` (18 bytes: f16 `d`, 16 nibble bytes)
/// against `a`: `q·y` (codes 0..16); the `−8` is the block's offset term.
#[inline(always)]
pub(super) fn q4_0_lanes(blk: &[u8], a: &QRow, nb: usize, b: usize) -> Option<Lanes> {
    block_lanes(a, nb, b, &q4_0_codes(blk.get(2..18)?))
}

/// The lanes of Q8_0 block `b` (34 bytes: f16 `d`, 32 signed codes)
/// against `a`: `q·y`.
#[inline(always)]
pub(super) fn q8_0_lanes(blk: &[u8], a: &QRow, nb: usize, b: usize) -> Option<Lanes> {
    let mut w = [0i32; 32];
    for (w, &q) in w.iter_mut().zip(blk.get(2..34)?) {
        *w = i32::from(q as i8);
    }
    block_lanes(a, nb, b, &w)
}

/// A row of 32-weight blocks of `BS` bytes against the `R` rows of `acts`,
/// block `b`'s lanes from `lanes(block bytes, row, nb, b)`.
#[inline(always)]
fn blocks32<const R: usize, const BS: usize>(
    bytes: &[u8],
    row_len: usize,
    acts: &[&QRow; R],
    s: &mut [f32],
    out: &mut [f32],
    stride: usize,
    lanes: impl Fn(&[u8], &QRow, usize, usize) -> Option<Lanes>,
) -> Option<()> {
    let nb = row_len / BS;
    let ds: [&[f32]; R] = std::array::from_fn(|t| acts[t].d.as_slice());
    each_row::<R>(bytes, row_len, out, stride, |row, out| {
        let s = block_scales(row, BS, &ds, s, widen8_f16::<BS, 0>)?;
        for ((a, o), st) in acts.iter().zip(out.iter_mut()).zip(s.chunks_exact(nb)) {
            let mut acc: Acc = [[0f32; 8]; RUN];
            let mut off = [0f32; RUN];
            for (b, (blk, &sb)) in row.chunks_exact(BS).zip(st).enumerate() {
                let (l, m) = lanes(blk, a, nb, b)?;
                add_block_scaled(&mut acc, b, sb, &m, l);
                if let Some(&bo) = a.boff.get(b) {
                    add_offset(&mut off, b, sb, bo);
                }
            }
            *o = finish(&acc, offsets(&off));
        }
        Some(())
    })
}

/// Q4_0 rows.
fn q4_0<const R: usize>(
    bytes: &[u8],
    row_len: usize,
    acts: &[&QRow; R],
    s: &mut [f32],
    out: &mut [f32],
    stride: usize,
) -> Option<()> {
    blocks32::<R, 18>(bytes, row_len, acts, s, out, stride, q4_0_lanes)
}

/// Q8_0 rows.
fn q8_0<const R: usize>(
    bytes: &[u8],
    row_len: usize,
    acts: &[&QRow; R],
    s: &mut [f32],
    out: &mut [f32],
    stride: usize,
) -> Option<()> {
    blocks32::<R, 34>(bytes, row_len, acts, s, out, stride, q8_0_lanes)
}

/// The lanes and the mins of Q4_K super-block `b` (144 bytes: f16 `d`,
/// `dmin`, 12 bytes of 6-bit group scales and mins, 128 nibble bytes)
/// against `a`: `Σ_g sc_g·(q·y << shift)` over the 8 groups of 32, and
/// `Σ_g m_g·Σy_g`.
#[inline(always)]
pub(super) fn q4_k_lanes(blk: &[u8], a: &QRow, b: usize) -> Option<([i32; 8], i32)> {
    let (sc, m) = k4_scales_mins(blk.get(4..16)?.try_into().ok()?);
    let qs = blk.get(16..144)?;
    let mut l = [0i32; 8];
    let mut summ = 0i32;
    for g in 0..8 {
        let shift = 4 * (g % 2);
        let q32 = qs.get(32 * (g / 2)..32 * (g / 2) + 32)?;
        let mut w = [0i32; 32];
        for (w, &q) in w.iter_mut().zip(q32) {
            *w = i32::from((q >> shift) & 15);
        }
        let at = 256 * b + 32 * g;
        let y = a.codes.get(at..at + 32)?;
        let lg = lanes(&w, y.get(..16)?, y.get(16..)?);
        let scg = i32::from(*sc.get(g)?);
        for (j, (l, lg)) in l.iter_mut().zip(lg).enumerate() {
            *l += scg * (lg << *a.shift.get(at / 4 + j)?);
        }
        let sums = a.sums.get(at / 16..at / 16 + 2)?;
        summ += i32::from(*m.get(g)?) * (sums.first()? + sums.last()?);
    }
    Some((l, summ))
}

/// Q4_K rows: the mins, times `dmin·d_x`, subtracted at the end.
fn q4_k<const R: usize>(
    bytes: &[u8],
    row_len: usize,
    acts: &[&QRow; R],
    s: &mut [f32],
    out: &mut [f32],
    stride: usize,
) -> Option<()> {
    const BS: usize = 144;
    let nb = row_len / BS;
    let ds: [&[f32]; R] = std::array::from_fn(|t| acts[t].d.as_slice());
    each_row::<R>(bytes, row_len, out, stride, |row, out| {
        let (sd, sm) = s.split_at_mut(s.len() / 2);
        let sd = block_scales(row, BS, &ds, sd, widen8_f16::<BS, 0>)?;
        let sm = block_scales(row, BS, &ds, sm, widen8_f16::<BS, 2>)?;
        let per_row = sd.chunks_exact(nb).zip(sm.chunks_exact(nb));
        for ((a, o), (sd, sm)) in acts.iter().zip(out.iter_mut()).zip(per_row) {
            let mut acc: Acc = [[0f32; 8]; RUN];
            let mut off = [0f32; RUN];
            for (b, blk) in row.chunks_exact(BS).enumerate() {
                let (l, summ) = q4_k_lanes(blk, a, b)?;
                add_block(&mut acc, b, *sd.get(b)?, l);
                add_offset(&mut off, b, *sm.get(b)?, summ as f32);
            }
            *o = finish(&acc, offsets(&off));
        }
        Some(())
    })
}
