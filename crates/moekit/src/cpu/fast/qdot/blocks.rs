//! The other GGUF formats on the integer path, as two generic families with
//! one portable kernel each (the x86 kernels are in `blocks_x86`):
//!
//! - [`Block32`]: 32-weight blocks whose codes `u` the kernels dot centred,
//!   `u − c`, as signed bytes, like Q8_0's (Q5_0: `w = d·(u − 16)`; Q4_1,
//!   Q5_1 with a min `m`: `w = d·(u − c) + (m + c·d)`, `c` = 8 and 16). The
//!   lanes, lane scales and accumulators are Q8_0's; a min's term uses the
//!   exact f32 block sums of the activations, `P[b % 16] = fma(m_b + c·d_b,
//!   Σx_b, P[b % 16])` ([`min_term`]), and the dot is `tree(A) + tree(P)`.
//! - [`SuperBlock`]: K-quant super-blocks of 256 weights (Q2_K, Q3_K, Q5_K,
//!   Q6_K) with 16 per-16 integer scales `sc_h` ([`Meta`]): Q2_K, Q5_K
//!   `w = d·sc_h·u − dmin·m_h`, Q3_K, Q6_K `w = d·sc_h·(u − c)` with the
//!   codes' centre `c` = 4 and 32 ([`SuperBlock::CENTRE`]). Chunk `c` of 32
//!   codes (values `32c..32c + 32`) adds to lane `j` of the block
//!   `sc_{2c + j/4}·Σ_{k<4} q·(y << s)` over values `32c + 4j + k` (`q = u`
//!   or `u − c`), exactly as Q4_K's kernel (16-bit pair products times
//!   `2^s`, then `vpmaddwd` with the scales: the activations' largest shift
//!   is what keeps `2·|q|·127·2^s` within 16 bits, [`QKind`]'s `max_shift`;
//!   signed codes as `vpmaddubsw(|q|, sign(y, q))`). The mins,
//!   `Σ_h m_h·Σ(y << s)_h` in integers, go to the offset accumulators with
//!   `dmin·d_x` (the activations' block scale). (Centring in the integers
//!   matters: `Σ sc·u·y` and `c·Σ sc·Σy` are both large, and their
//!   difference in f32 lost ~4 digits on the MoE-block fixtures.)
//!
//! Either way every level computes exactly this (bit for bit).
//!
//! [`QKind`]: super::QKind

use super::portable::{block_lanes, Lanes};
use super::{
    add_block, add_block_scaled, add_offset, each_row, finish, offsets, Acc, QRow, Run, RUN,
};
use crate::cpu::fast::dot::{f16_to_f32, k4_scales_mins};
use crate::format::ggml::GgmlType;

/// A 32-weight GGUF block: `d` (f16) at byte 0, for the types with a min
/// `m` (f16) at byte 2, and 32 unsigned codes `u`.
pub(super) trait Block32: 'static {
    /// Bytes per block.
    const BS: usize;
    /// The codes' centre `c`: the kernels dot `u − c`.
    const CENTRE: u8;
    /// Whether the block has a min (`w = d·u + m`), else `w = d·(u − c)`.
    const HAS_MIN: bool;
    /// The unsigned codes of a block of `BS` bytes, in value order.
    fn codes(blk: &[u8]) -> Option<[u8; 32]>;
}

/// The per-16 scales and mins of a K-quant super-block and its f16
/// factors: `w = d·sc_h·q − f·om_h` for the values of 16-group `h` (`q` the
/// codes, centred for the types with a [`SuperBlock::CENTRE`]).
#[derive(Clone, Copy)]
pub(super) struct Meta {
    /// The integer scale of each 16 values.
    pub sc: [i16; 16],
    /// The integer min of each 16 values (zeros for centred codes).
    pub om: [i16; 16],
    /// The scale factor `d`.
    pub d: f32,
    /// The mins' factor `f` (`dmin`).
    pub f: f32,
}

/// A K-quant super-block of 256 weights.
pub(super) trait SuperBlock: 'static {
    /// Bytes per super-block.
    const BS: usize;
    /// The codes' centre `c` (0: unsigned codes and mins): the kernels dot
    /// `u − c`, signed.
    const CENTRE: u8 = 0;
    /// The scales, mins and factors of a super-block of `BS` bytes.
    fn meta(blk: &[u8]) -> Option<Meta>;
    /// The unsigned codes of chunk `c < 8` (values `32c..32c + 32`).
    fn chunk(blk: &[u8], c: usize) -> Option<[u8; 32]>;
}

/// The f16 at byte `at` of `b`, widened (exact).
#[inline(always)]
pub(super) fn f16_at(b: &[u8], at: usize) -> Option<f32> {
    let h = b.get(at..at + 2)?;
    Some(f16_to_f32(
        half::f16::from_bits(u16::from_le_bytes([h[0], h[1]])),
        true,
    ))
}

/// 32 bytes of `b` from `at`.
#[inline(always)]
pub(super) fn bytes32(b: &[u8], at: usize) -> Option<&[u8; 32]> {
    b.get(at..at + 32)?.try_into().ok()
}

/// The codes of 16 nibble bytes (low nibbles: values 0..16) with bit `i` of
/// `qh` as bit 4 of value `i`.
#[inline(always)]
fn nibbles_hi(qs: &[u8], qh: u32) -> Option<[u8; 32]> {
    let qs: &[u8; 16] = qs.get(..16)?.try_into().ok()?;
    let mut u = [0u8; 32];
    for (i, &q) in qs.iter().enumerate() {
        let h = |k: usize| (((qh >> k) & 1) as u8) << 4;
        u[i] = (q & 15) | h(i);
        u[i + 16] = (q >> 4) | h(i + 16);
    }
    Some(u)
}

/// The `u32` at byte `at` of `b`.
#[inline(always)]
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Q4_1: `d`, `m`, 16 nibble bytes.
#[allow(non_camel_case_types)]
pub(super) struct Q4_1;
/// Q5_0: `d`, 4 bytes of high bits, 16 nibble bytes.
#[allow(non_camel_case_types)]
pub(super) struct Q5_0;
/// Q5_1: `d`, `m`, 4 bytes of high bits, 16 nibble bytes.
#[allow(non_camel_case_types)]
pub(super) struct Q5_1;

impl Block32 for Q4_1 {
    const BS: usize = 20;
    const CENTRE: u8 = 8;
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn codes(blk: &[u8]) -> Option<[u8; 32]> {
        nibbles_hi(blk.get(4..20)?, 0)
    }
}

impl Block32 for Q5_0 {
    const BS: usize = 22;
    const CENTRE: u8 = 16;
    const HAS_MIN: bool = false;
    #[inline(always)]
    fn codes(blk: &[u8]) -> Option<[u8; 32]> {
        nibbles_hi(blk.get(6..22)?, u32_at(blk, 2)?)
    }
}

impl Block32 for Q5_1 {
    const BS: usize = 24;
    const CENTRE: u8 = 16;
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn codes(blk: &[u8]) -> Option<[u8; 32]> {
        nibbles_hi(blk.get(8..24)?, u32_at(blk, 4)?)
    }
}

/// Q2_K: 16 bytes of 4-bit scales (low) and mins (high), 64 bytes of 2-bit
/// codes, `d`, `dmin`.
#[allow(non_camel_case_types)]
pub(super) struct Q2_K;
/// Q3_K: 32 bytes of high bits, 64 bytes of 2-bit codes, 12 bytes of 6-bit
/// scales, `d`; codes `u − 4`.
#[allow(non_camel_case_types)]
pub(super) struct Q3_K;
/// Q5_K: `d`, `dmin`, 12 bytes of 6-bit scales and mins, 32 bytes of high
/// bits, 128 nibble bytes.
#[allow(non_camel_case_types)]
pub(super) struct Q5_K;
/// Q6_K: 128 nibble bytes, 64 bytes of 2-bit high parts, 16 signed scales,
/// `d`; codes `u − 32`.
#[allow(non_camel_case_types)]
pub(super) struct Q6_K;

/// Q3_K's 16 6-bit scales (minus 32) of its 12 bytes, with word operations
/// (ggml's `kmask` unpacking): byte `j` of the low nibbles (`j < 8`: low,
/// else high nibble of byte `j − 8`), bits 4..6 from bits `2(j/4)` of byte
/// `8 + j % 4`.
#[inline(always)]
pub(super) fn q3k_scales(q: &[u8; 12]) -> [i16; 16] {
    const M4: u32 = 0x0f0f_0f0f;
    const M2: u32 = 0x0303_0303;
    let w = |i: usize| u32::from_le_bytes([q[i], q[i + 1], q[i + 2], q[i + 3]]);
    let (a, b, c) = (w(0), w(4), w(8));
    let words = [
        (a & M4) | ((c & M2) << 4),
        (b & M4) | (((c >> 2) & M2) << 4),
        ((a >> 4) & M4) | (((c >> 4) & M2) << 4),
        ((b >> 4) & M4) | (((c >> 6) & M2) << 4),
    ];
    let mut sc = [0i16; 16];
    for (s4, w) in sc.chunks_exact_mut(4).zip(words) {
        for (s, v) in s4.iter_mut().zip(w.to_le_bytes()) {
            *s = i16::from(v) - 32;
        }
    }
    sc
}

/// `f(byte)` of each of 32 bytes.
#[inline(always)]
fn map32(b: &[u8; 32], f: impl Fn(u8, usize) -> u8) -> [u8; 32] {
    let mut u = [0u8; 32];
    for (l, (u, &v)) in u.iter_mut().zip(b).enumerate() {
        *u = f(v, l);
    }
    u
}

impl SuperBlock for Q2_K {
    const BS: usize = 84;
    #[inline(always)]
    fn meta(blk: &[u8]) -> Option<Meta> {
        let s: &[u8; 16] = blk.get(..16)?.try_into().ok()?;
        Some(Meta {
            sc: s.map(|v| i16::from(v & 15)),
            om: s.map(|v| i16::from(v >> 4)),
            d: f16_at(blk, 80)?,
            f: f16_at(blk, 82)?,
        })
    }
    #[inline(always)]
    fn chunk(blk: &[u8], c: usize) -> Option<[u8; 32]> {
        let q = bytes32(blk, 16 + 32 * (c / 4))?;
        Some(map32(q, |v, _| (v >> (2 * (c % 4))) & 3))
    }
}

impl SuperBlock for Q3_K {
    const BS: usize = 110;
    const CENTRE: u8 = 4;
    #[inline(always)]
    fn meta(blk: &[u8]) -> Option<Meta> {
        let sc = q3k_scales(blk.get(96..108)?.try_into().ok()?);
        Some(Meta {
            sc,
            om: [0; 16],
            d: f16_at(blk, 108)?,
            f: f16_at(blk, 108)?,
        })
    }
    #[inline(always)]
    fn chunk(blk: &[u8], c: usize) -> Option<[u8; 32]> {
        let (q, hm) = (bytes32(blk, 32 + 32 * (c / 4))?, bytes32(blk, 0)?);
        Some(map32(q, |v, l| {
            ((v >> (2 * (c % 4))) & 3) | (((hm[l] >> c) & 1) << 2)
        }))
    }
}

impl SuperBlock for Q5_K {
    const BS: usize = 176;
    #[inline(always)]
    fn meta(blk: &[u8]) -> Option<Meta> {
        let (sc, m) = k4_scales_mins(blk.get(4..16)?.try_into().ok()?);
        Some(Meta {
            sc: std::array::from_fn(|h| i16::from(sc[h / 2])),
            om: std::array::from_fn(|h| i16::from(m[h / 2])),
            d: f16_at(blk, 0)?,
            f: f16_at(blk, 2)?,
        })
    }
    #[inline(always)]
    fn chunk(blk: &[u8], c: usize) -> Option<[u8; 32]> {
        let (q, qh) = (bytes32(blk, 48 + 32 * (c / 2))?, bytes32(blk, 16)?);
        Some(map32(q, |v, l| {
            ((v >> (4 * (c % 2))) & 15) | (((qh[l] >> c) & 1) << 4)
        }))
    }
}

impl SuperBlock for Q6_K {
    const BS: usize = 210;
    const CENTRE: u8 = 32;
    #[inline(always)]
    fn meta(blk: &[u8]) -> Option<Meta> {
        let s: &[u8; 16] = blk.get(192..208)?.try_into().ok()?;
        Some(Meta {
            sc: s.map(|v| i16::from(v as i8)),
            om: [0; 16],
            d: f16_at(blk, 208)?,
            f: f16_at(blk, 208)?,
        })
    }
    #[inline(always)]
    fn chunk(blk: &[u8], c: usize) -> Option<[u8; 32]> {
        let (n, s) = (c / 4, c % 4);
        let ql = bytes32(blk, 64 * n + 32 * (s % 2))?;
        let qh = bytes32(blk, 128 + 32 * n)?;
        Some(map32(ql, |v, l| {
            ((v >> (4 * (s / 2))) & 15) | (((qh[l] >> (2 * s)) & 3) << 4)
        }))
    }
}

/// The portable run of `R` activation rows for weights of type `t` of these
/// families.
pub(super) fn run_for<const R: usize>(t: GgmlType) -> Option<Run<R>> {
    Some(match t {
        GgmlType::Q4_1 => run32::<Q4_1, R>,
        GgmlType::Q5_0 => run32::<Q5_0, R>,
        GgmlType::Q5_1 => run32::<Q5_1, R>,
        GgmlType::Q2_K => run256::<Q2_K, R>,
        GgmlType::Q3_K => run256::<Q3_K, R>,
        GgmlType::Q5_K => run256::<Q5_K, R>,
        GgmlType::Q6_K => run256::<Q6_K, R>,
        _ => return None,
    })
}

// The portable runs of [`Block32`] and [`SuperBlock`] types (`portable_run!`, qdot/mod.rs).
portable_run!(run32 [B: Block32, const R: usize], blocks32::<B, R>);

portable_run!(run256 [B: SuperBlock, const R: usize], super_blocks::<B, R>);

/// The centred codes `u − c` of a [`Block32`] block.
#[inline(always)]
fn centred<B: Block32>(blk: &[u8]) -> Option<[i32; 32]> {
    let u = B::codes(blk)?;
    Some(u.map(|u| i32::from(u) - i32::from(B::CENTRE)))
}

/// The lanes (and their scales) of [`Block32`] block `b` against `a`.
#[inline(always)]
pub(super) fn lanes32<B: Block32>(blk: &[u8], a: &QRow, nb: usize, b: usize) -> Option<Lanes> {
    block_lanes(a, nb, b, &centred::<B>(blk)?)
}

/// Accumulators of the min terms (independent chains: the terms of a row
/// are a short loop of their own, bound by the accumulators' latency).
const MINS: usize = 16;

/// The min term of a row with widened scales `ws` and mins `wb` against an
/// activation row's block sums `xs`: `P[b % 16] = fma(c·d_b + m_b, Σx_b,
/// P[b % 16])` (`c` a power of two: `c·d_b + m_b` rounds once), the 16
/// accumulators summed pairwise (`P[k] + P[k + 8]`, then `+ 4`, `+ 2`,
/// `+ 1`).
#[inline(always)]
fn min_term(ws: &[f32], wb: &[f32], xs: &[f32], c: f32) -> f32 {
    let mut p = [0f32; MINS];
    let chunks = ws
        .chunks_exact(MINS)
        .zip(wb.chunks_exact(MINS))
        .zip(xs.chunks_exact(MINS));
    for ((s, m), x) in chunks {
        for k in 0..MINS {
            p[k] = (c * s[k] + m[k]).mul_add(x[k], p[k]);
        }
    }
    let tail = ws.len() / MINS * MINS;
    for (b, ((&s, &m), &x)) in ws.iter().zip(wb).zip(xs).enumerate().skip(tail) {
        if let Some(p) = p.get_mut(b % MINS) {
            *p = (c * s + m).mul_add(x, *p);
        }
    }
    let mut n = MINS / 2;
    while n > 0 {
        for k in 0..n {
            p[k] += p[k + n];
        }
        n /= 2;
    }
    p[0]
}

/// The per-block scale products of a row of [`Block32`] blocks against
/// the `R` activation rows, `st[t·nb + b] = d_b·d_t[b]` (as
/// [`block_scales`](super::block_scales) rounds them), and the min terms
/// `p[t]` ([`min_term`] of the widened `d`, `m` and the rows' block sums;
/// zeros for types without a min). `widen8(row,
/// b0, at)` widens the f16 at byte `at` of blocks `b0..b0 + 8` (zeros past
/// the row's end); uses `scratch[..(R + 2)·nb]`.
#[inline(always)]
pub(super) fn row_scales<'s, B: Block32, const R: usize>(
    row: &[u8],
    acts: &[&QRow; R],
    ds: &[&[f32]; R],
    scratch: &'s mut [f32],
    widen8: impl Fn(&[u8], usize, usize) -> [f32; 8],
) -> Option<(&'s [f32], [f32; R])> {
    let nb = row.len() / B::BS;
    let (st, rest) = scratch.split_at_mut_checked(R * nb)?;
    let (ws, rest) = rest.split_at_mut_checked(nb)?;
    let wb = rest.get_mut(..nb)?;
    for c in 0..nb.div_ceil(8) {
        let n8 = (nb - 8 * c).min(8);
        let d = widen8(row, 8 * c, 0);
        ws.get_mut(8 * c..8 * c + n8)?.copy_from_slice(d.get(..n8)?);
        if B::HAS_MIN {
            let m = widen8(row, 8 * c, 2);
            wb.get_mut(8 * c..8 * c + n8)?.copy_from_slice(m.get(..n8)?);
        }
    }
    for (t, d) in ds.iter().enumerate() {
        let st = st.get_mut(t * nb..(t + 1) * nb)?;
        for ((o, &w), &d) in st.iter_mut().zip(&*ws).zip(d.get(..nb)?) {
            *o = w * d;
        }
    }
    let mut p = [0f32; R];
    if B::HAS_MIN {
        for (p, a) in p.iter_mut().zip(acts) {
            if a.xsum.len() != nb {
                return None;
            }
            *p = min_term(ws, wb, &a.xsum, f32::from(B::CENTRE));
        }
    }
    Some((st, p))
}

/// Rows of [`Block32`] blocks.
fn blocks32<B: Block32, const R: usize>(
    bytes: &[u8],
    row_len: usize,
    acts: &[&QRow; R],
    s: &mut [f32],
    out: &mut [f32],
    stride: usize,
) -> Option<()> {
    let nb = row_len / B::BS;
    let ds: [&[f32]; R] = std::array::from_fn(|t| acts[t].d.as_slice());
    each_row::<R>(bytes, row_len, out, stride, |row, out| {
        let (st, p) =
            row_scales::<B, R>(row, acts, &ds, s, |r, b0, at| widen8_at(r, B::BS, b0, at))?;
        for (((a, o), st), p) in acts
            .iter()
            .zip(out.iter_mut())
            .zip(st.chunks_exact(nb))
            .zip(p)
        {
            let mut acc: Acc = [[0f32; 8]; RUN];
            for (b, (blk, &sb)) in row.chunks_exact(B::BS).zip(st).enumerate() {
                let (l, m) = lanes32::<B>(blk, a, nb, b)?;
                add_block_scaled(&mut acc, b, sb, &m, l);
            }
            *o = finish(&acc, -p);
        }
        Some(())
    })
}

/// The f16 at byte `at` of blocks `b0..b0 + 8` of `bs` bytes, widened one at
/// a time (zeros past the row's end).
#[inline(always)]
fn widen8_at(row: &[u8], bs: usize, b0: usize, at: usize) -> [f32; 8] {
    std::array::from_fn(|i| f16_at(row, (b0 + i) * bs + at).unwrap_or(0.0))
}

/// The integer lanes of chunk `c` (codes `u`, centred by `centre`) of a
/// super-block against the codes `y` and shifts of 256-value block `b` of
/// `a`, times the scales, added to `l`.
#[inline(always)]
fn chunk_lanes(
    l: &mut [i32; 8],
    u: &[u8; 32],
    centre: u8,
    sc: &[i16; 16],
    a: &QRow,
    b: usize,
    c: usize,
) {
    let at = 256 * b + 32 * c;
    let (Some(y), Some(sh)) = (a.codes.get(at..at + 32), a.shift.get(at / 4..at / 4 + 8)) else {
        return;
    };
    for (j, (l, &s)) in l.iter_mut().zip(sh).enumerate() {
        let mut v = 0i32;
        for k in 4 * j..4 * j + 4 {
            v += (i32::from(u[k]) - i32::from(centre)) * i32::from(y[k]);
        }
        *l += i32::from(sc[2 * c + j / 4]) * (v << s);
    }
}

/// `Σ_h om_h·Σ(y << s)_h` of super-block `b` of `a`.
#[inline(always)]
pub(super) fn offset256(om: &[i16; 16], a: &QRow, b: usize) -> Option<i32> {
    let h = a.hsum.get(16 * b..16 * b + 16)?;
    Some(
        om.iter()
            .zip(h)
            .map(|(&o, &h)| i32::from(o) * i32::from(h))
            .sum(),
    )
}

/// The lanes and the offset of super-block `b` of `B` against `a`.
#[inline(always)]
pub(super) fn lanes256<B: SuperBlock>(
    blk: &[u8],
    meta: &Meta,
    a: &QRow,
    b: usize,
) -> Option<([i32; 8], i32)> {
    let mut l = [0i32; 8];
    for c in 0..8 {
        chunk_lanes(&mut l, &B::chunk(blk, c)?, B::CENTRE, &meta.sc, a, b, c);
    }
    Some((l, offset256(&meta.om, a, b)?))
}

/// Rows of [`SuperBlock`]s: `A[b % 4] = fma(d·d_x, f32(L), A[b % 4])`,
/// for the types with mins `O[b % 4] = fma(f·d_x, f32(off), O[b % 4])`.
fn super_blocks<B: SuperBlock, const R: usize>(
    bytes: &[u8],
    row_len: usize,
    acts: &[&QRow; R],
    _: &mut [f32],
    out: &mut [f32],
    stride: usize,
) -> Option<()> {
    each_row::<R>(bytes, row_len, out, stride, |row, out| {
        let mut acc = [[[0f32; 8]; RUN]; R];
        let mut off = [[0f32; RUN]; R];
        for (b, blk) in row.chunks_exact(B::BS).enumerate() {
            let meta = B::meta(blk)?;
            for ((acc, off), a) in acc.iter_mut().zip(&mut off).zip(acts) {
                let dx = *a.d.get(b)?;
                let (l, o) = lanes256::<B>(blk, &meta, a, b)?;
                add_block(acc, b, meta.d * dx, l);
                if B::CENTRE == 0 {
                    add_offset(off, b, meta.f * dx, o as f32);
                }
            }
        }
        for ((o, acc), off) in out.iter_mut().zip(&acc).zip(&off) {
            *o = finish(acc, offsets(off));
        }
        Some(())
    })
}
