//! MLX packed affine rows of 4-bit codes: `w = s_g·q + b_g` per group of
//! 32, 64 or 128, scales and biases in f32, f16 or bf16.
//!
//! The codes are dotted in blocks of 32 as Q4_0's (byte `k` of a block
//! holds codes `2k` and `2k + 1`, so the activation halves are a block's
//! even and odd values: [`QKind::paired`](super::QKind::paired)), centred
//! the same way: `w = s_g·(q − 8) + (b_g + 8·s_g)`. With `s_b = s_g·d_b`,
//! `A[b % 4][j] = fma(s_b, f32(L_b[j]), A[b % 4][j])` and the blocks'
//! offsets `O[b % 4] = fma(s_b, 8·Σ(y << s), O[b % 4])`; the biases' term
//! uses the exact f32 sums of the activations (block sums in value order,
//! a group's blocks summed in order): `c_g = 8·s_g + b_g` (one rounding),
//! `P[g % 4] = fma(c_g, Σx_g, P[g % 4])`. The dot is
//! `tree(A) − (((O0 + O1) + (O2 + O3)) − ((P0 + P1) + (P2 + P3)))`. The
//! activations' rounding errors thus meet `q − 8`: an MLX bias is about
//! `−8·scale`, and against the raw codes (`q`, 0..16) the error of the
//! MoE-block fixtures was ~5e-4, centred ~3e-5. [`drive`] does all but the
//! lanes, the same at every level; each level's `body` gives the lane and
//! offset accumulators.
//!
//! The other widths (2, 3, 5, 6 and 8 bits) take Q8_0's way: a block's 32
//! codes unpacked from the LSB-first bit stream ([`codes`]) and centred,
//! `q − 2^(bits−1)`, as signed bytes, dotted with the activations' codes in
//! value order (lane biases at the VNNI levels, no block offsets); the
//! biases' term as above with `c_g = 2^(bits−1)·s_g + b_g`.

use super::portable::{block_lanes, q4_0_codes};
use super::{add_block_scaled, add_offset, finish, offsets, Acc, QRow, Rows, Run, RUN};
use crate::cpu::SimdLevel;
use crate::error::{invalid, Result};
use crate::format::{RowDecoder, ScaleRow};
use half::{bf16, f16};

/// The dtype of an affine row's scales and biases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ScaleType {
    F32,
    F16,
    Bf16,
}

impl ScaleType {
    /// The dtype of `row`.
    pub(super) fn of(row: ScaleRow<'_>) -> ScaleType {
        match row {
            ScaleRow::F32(_) => ScaleType::F32,
            ScaleRow::F16(_) => ScaleType::F16,
            ScaleRow::Bf16(_) => ScaleType::Bf16,
        }
    }
}

/// A scale or bias dtype, widened exactly.
pub(super) trait Scale: Copy {
    /// The value as f32 (exact).
    fn widen(self) -> f32;
    /// The values of `row` if it holds this dtype.
    fn of(row: ScaleRow<'_>) -> Option<&[Self]>;
    /// `dst[i] = src[i]` widened (exact); nothing if the lengths differ. A
    /// plain loop: inlined into the level's context, it vectorizes (the
    /// f16 widening is integer operations).
    #[inline(always)]
    fn widen_into(src: &[Self], dst: &mut [f32]) {
        if src.len() == dst.len() {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = s.widen();
            }
        }
    }
}

impl Scale for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    fn of(row: ScaleRow<'_>) -> Option<&[f32]> {
        match row {
            ScaleRow::F32(v) => Some(v),
            _ => None,
        }
    }
}

impl Scale for f16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        crate::cpu::fast::dot::f16_to_f32(self, true)
    }
    // `widen_into`: the trait's plain loop of the branchless `widen`,
    // inlined into the level's context and vectorized. (`half`'s slice
    // conversion, a call and a feature check per slice of a row's 16–64
    // scales, took as long as a 3-bit row's dots; it also quieted NaN
    // payloads.)
    fn of(row: ScaleRow<'_>) -> Option<&[f16]> {
        match row {
            ScaleRow::F16(v) => Some(v),
            _ => None,
        }
    }
}

impl Scale for bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
    fn of(row: ScaleRow<'_>) -> Option<&[bf16]> {
        match row {
            ScaleRow::Bf16(v) => Some(v),
            _ => None,
        }
    }
}

/// The run of `R` activation rows for affine rows of `bits` bits with
/// scales of dtype `s` at `level`.
pub(super) fn run_for<const R: usize>(level: SimdLevel, bits: u32, s: ScaleType) -> Option<Run<R>> {
    macro_rules! by_bits {
        ($s:ty) => {
            match bits {
                4 => Some(run_portable::<$s, R>),
                2 => Some(run_codes::<$s, 2, R>),
                3 => Some(run_codes::<$s, 3, R>),
                5 => Some(run_codes::<$s, 5, R>),
                6 => Some(run_codes::<$s, 6, R>),
                8 => Some(run_codes::<$s, 8, R>),
                _ => None,
            }
        };
    }
    match (level, s) {
        (SimdLevel::Portable, ScaleType::F32) => by_bits!(f32),
        (SimdLevel::Portable, ScaleType::F16) => by_bits!(f16),
        (SimdLevel::Portable, ScaleType::Bf16) => by_bits!(bf16),
        #[cfg(target_arch = "x86_64")]
        (level, s) => super::affine_x86::run_for::<R>(level, bits, s),
        #[allow(unreachable_patterns)] // reachable on other architectures
        _ => None,
    }
}

/// The codes' centre: 8 for 4 bits (Q4_0's way), else `2^(bits−1)`.
pub(super) const fn centre(bits: u32) -> u32 {
    if bits == 4 {
        8
    } else {
        1 << (bits - 1)
    }
}

/// The 32 codes of block `b` of a row of `BITS`-bit codes (LSB-first bit
/// stream, `4·BITS` bytes a block), centred: `q − 2^(BITS−1)`.
#[inline(always)]
pub(super) fn codes<const BITS: u32>(row: &[u8], b: usize) -> Option<[i8; 32]> {
    let bs = 4 * BITS as usize;
    let blk = row.get(bs * b..bs * b + bs)?;
    let mask = (1u32 << BITS) - 1;
    let mut w = [0i8; 32];
    for (i, w) in w.iter_mut().enumerate() {
        let bit = BITS as usize * i;
        let lo = u32::from(*blk.get(bit / 8)?);
        let hi = u32::from(blk.get(bit / 8 + 1).copied().unwrap_or(0));
        let q = ((lo | (hi << 8)) >> (bit % 8)) & mask;
        *w = (q as i32 - (1i32 << (BITS - 1))) as i8;
    }
    Some(w)
}

const OP: &str = "qdot_rows";

/// The computation of a run of affine rows but the lanes: checks, the
/// activations' group sums, the biases' terms of every row, then per
/// weight row the block scale products `st[b] = s_g` (the same for every
/// activation row: the activations' block scales are 1, a block with a
/// non-finite value has NaN lane scales), `body(row bytes, st, rows, acts,
/// nb)` (the lane and offset accumulators of each activation row) and
/// [`finish`]. Runs in the caller's context (inlined).
#[allow(clippy::too_many_arguments)] // a Run's arguments and the body
#[inline(always)]
pub(super) fn drive<S: Scale, const BITS: u32, const R: usize>(
    dec: &RowDecoder<'_>,
    e: usize,
    n0: usize,
    n: usize,
    acts: &[&QRow; R],
    scratch: &mut [f32],
    out: &mut [f32],
    stride: usize,
    body: impl Fn(&[u8], &[f32], &Rows<'_, R>, &[&QRow; R], usize) -> Option<[(Acc, [f32; RUN]); R]>,
) -> Result<()> {
    let Some((p, words, scales, biases)) = dec.affine_rows(e, n0, n) else {
        dec.raw_row(e, n0 + n.saturating_sub(1))?;
        return Err(invalid(
            OP,
            "dec",
            "MLX packed affine rows",
            "another format",
        ));
    };
    let bad = || {
        invalid(
            OP,
            "acts",
            "rows quantized for the weights' format and length",
            "another kind or length",
        )
    };
    let (Some(scales), Some(biases)) = (S::of(scales), S::of(biases)) else {
        return Err(invalid(
            OP,
            "dec",
            "scales and biases of one dtype",
            "another dtype",
        ));
    };
    let k = dec.cols();
    let (nb, ng, rw) = (k / 32, k / p.group_size.max(1), k * BITS as usize / 32);
    let bpg = p.group_size / 32;
    let rows = Rows::new(acts, nb, BITS != 4).ok_or_else(bad)?;
    if p.bits != BITS || bpg == 0 || rw == 0 || ng == 0 || acts.iter().any(|a| a.xsum.len() != nb) {
        return Err(bad());
    }
    let (st, rest) = scratch.split_at_mut_checked(nb).ok_or_else(bad)?;
    let (gx, rest) = rest.split_at_mut_checked(R * ng).ok_or_else(bad)?;
    let (ws, rest) = rest.split_at_mut_checked(ng).ok_or_else(bad)?;
    let (wb, rest) = rest.split_at_mut_checked(ng).ok_or_else(bad)?;
    let psum = rest.get_mut(..R * n).ok_or_else(bad)?;
    // Σx of each group: its blocks' sums, in order.
    for (a, gx) in acts.iter().zip(gx.chunks_exact_mut(ng)) {
        for (g, xs) in gx.iter_mut().zip(a.xsum.chunks_exact(bpg)) {
            *g = xs.iter().sum();
        }
    }
    let gx: &[f32] = gx;
    // The biases' terms of every row first, in a loop of their own (inside
    // the lane loop their accumulators did not stay in registers).
    let sb = scales.chunks_exact(ng).zip(biases.chunks_exact(ng));
    for (i, (srow, brow)) in sb.enumerate() {
        S::widen_into(srow, ws);
        S::widen_into(brow, wb);
        for (t, gx) in gx.chunks_exact(ng).enumerate() {
            if let Some(p) = psum.get_mut(t * n + i) {
                *p = bias_term(ws, wb, gx, centre(BITS) as f32);
            }
        }
    }
    let psum: &[f32] = psum;
    let rows_of = words.chunks_exact(rw).zip(scales.chunks_exact(ng));
    for (i, (wrow, srow)) in rows_of.enumerate() {
        // A block's scale product is its group's scale (the activations'
        // block scale is 1: their lanes have scales), the same for every
        // activation row.
        S::widen_into(srow, ws);
        expand(st, ws, bpg);
        let accs = body(bytemuck::cast_slice(wrow), st, &rows, acts, nb).ok_or_else(bad)?;
        for (t, (acc, off)) in accs.iter().enumerate() {
            let p = psum.get(t * n + i).copied().unwrap_or(0.0);
            if let Some(o) = out.get_mut(t * stride + i) {
                *o = finish(acc, offsets(off) - p);
            }
        }
    }
    Ok(())
}

/// `st[b] = ws[b / bpg]`, with fixed-size copies for the group sizes 32,
/// 64 and 128 (1, 2 and 4 blocks per group).
#[inline(always)]
fn expand(st: &mut [f32], ws: &[f32], bpg: usize) {
    /// Each `w` of `ws` `N` times.
    #[inline(always)]
    fn by<const N: usize>(st: &mut [f32], ws: &[f32]) {
        for (st, &w) in st.chunks_exact_mut(N).zip(ws) {
            if let Ok(st) = <&mut [f32; N]>::try_from(st) {
                *st = [w; N];
            }
        }
    }
    match bpg {
        1 => by::<1>(st, ws),
        2 => by::<2>(st, ws),
        4 => by::<4>(st, ws),
        _ => {
            for (st, &w) in st.chunks_exact_mut(bpg.max(1)).zip(ws) {
                st.fill(w);
            }
        }
    }
}

/// The biases' term of a row with widened scales `ws` and biases `wb`
/// against an activation row's group sums `gx`: `P[g % 4] = fma(c·s_g +
/// b_g, Σx_g, P[g % 4])` (`c` a power of two: `c·s_g + b_g` rounds once),
/// summed `(P0 + P1) + (P2 + P3)`.
#[inline(always)]
pub(super) fn bias_term(ws: &[f32], wb: &[f32], gx: &[f32], c: f32) -> f32 {
    let mut p = [0f32; RUN];
    let quads = ws
        .chunks_exact(RUN)
        .zip(wb.chunks_exact(RUN))
        .zip(gx.chunks_exact(RUN));
    for ((s4, b4), x4) in quads {
        for k in 0..RUN {
            p[k] = (c * s4[k] + b4[k]).mul_add(x4[k], p[k]);
        }
    }
    let tail = ws.len() / RUN * RUN;
    for (g, ((&s, &b), &x)) in ws.iter().zip(wb).zip(gx).enumerate().skip(tail) {
        if let Some(p) = p.get_mut(g % RUN) {
            *p = (c * s + b).mul_add(x, *p);
        }
    }
    offsets(&p)
}

/// Blocks `from..nb` of a row of 16-byte 4-bit blocks into `acc` and
/// their offsets into `off` with the portable lanes (scales `st`, of one
/// activation row `a`).
#[inline(always)]
pub(super) fn tail_blocks(
    (acc, off): &mut (Acc, [f32; RUN]),
    row: &[u8],
    st: &[f32],
    a: &QRow,
    nb: usize,
    from: usize,
) -> Option<()> {
    for b in from..nb {
        let (l, m) = block_lanes(a, nb, b, &q4_0_codes(row.get(16 * b..16 * b + 16)?))?;
        let s = *st.get(b)?;
        add_block_scaled(acc, b, s, &m, l);
        add_offset(off, b, s, *a.boff.get(b)?);
    }
    Some(())
}

/// The portable run.
#[allow(clippy::too_many_arguments)] // a Run
fn run_portable<S: Scale, const R: usize>(
    dec: &RowDecoder<'_>,
    e: usize,
    n0: usize,
    n: usize,
    acts: &[&QRow; R],
    scratch: &mut [f32],
    out: &mut [f32],
    stride: usize,
) -> Result<()> {
    drive::<S, 4, R>(
        dec,
        e,
        n0,
        n,
        acts,
        scratch,
        out,
        stride,
        |row, st, _, acts, nb| {
            let mut accs = [([[0f32; 8]; RUN], [0f32; RUN]); R];
            for (acc, a) in accs.iter_mut().zip(acts) {
                tail_blocks(acc, row, st.get(..nb)?, a, nb, 0)?;
            }
            Some(accs)
        },
    )
}

/// Blocks `from..nb` of a row of `BITS`-bit codes (not 4) into `acc` with
/// the portable lanes (scales `st`, of one activation row `a`).
#[inline(always)]
pub(super) fn tail_codes<const BITS: u32>(
    acc: &mut Acc,
    row: &[u8],
    st: &[f32],
    a: &QRow,
    nb: usize,
    from: usize,
) -> Option<()> {
    for b in from..nb {
        let w = codes::<BITS>(row, b)?.map(i32::from);
        let (l, m) = block_lanes(a, nb, b, &w)?;
        add_block_scaled(acc, b, *st.get(b)?, &m, l);
    }
    Some(())
}

/// The portable run of `BITS`-bit codes (not 4).
#[allow(clippy::too_many_arguments)] // a Run
fn run_codes<S: Scale, const BITS: u32, const R: usize>(
    dec: &RowDecoder<'_>,
    e: usize,
    n0: usize,
    n: usize,
    acts: &[&QRow; R],
    scratch: &mut [f32],
    out: &mut [f32],
    stride: usize,
) -> Result<()> {
    drive::<S, BITS, R>(
        dec,
        e,
        n0,
        n,
        acts,
        scratch,
        out,
        stride,
        |row, st, _, acts, nb| {
            let mut accs = [([[0f32; 8]; RUN], [0f32; RUN]); R];
            for ((acc, _), a) in accs.iter_mut().zip(acts) {
                tail_codes::<BITS>(acc, row, st.get(..nb)?, a, nb, 0)?;
            }
            Some(accs)
        },
    )
}
