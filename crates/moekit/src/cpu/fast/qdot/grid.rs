//! The GGUF grid i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S,
//! IQ1_M) and the ternary types (TQ1_0, TQ2_0) on the integer path, as one
//! family with one kernel per level (the x86 kernels are in `grid_x86`).
//!
//! Every type is a super-block of 256 weights `w = D·sc_h·q`: `D` the f16
//! scale times a power of two (exact), `sc_h` a small odd integer per 16
//! values (IQ2_XS, IQ2_S, IQ1_M; the others one per 32, each 16 of a 32
//! taking it) and `q` a signed integer per weight ([`Grid`]):
//!
//! - IQ2_XXS, IQ2_XS, IQ2_S: `D = d/8`, `sc = 2·ls + 1` (gguf-py's
//!   `(d·(0.5 + ls))·0.25`), `q = ±g`, `g` a byte of `iq2xxs_grid` /
//!   `iq2xs_grid` / `iq2s_grid` (8, 25 or 43), the sign from
//!   `ksigns_iq2xs` (a 7-bit index) or a sign byte;
//! - IQ3_XXS: `D = d/4`, `sc = 2·ls + 1`, `q = ±g`, `g` of `iq3xxs_grid`
//!   (≤ 62); IQ3_S: `D = d`, `sc = 2·ls + 1`, `g` of `iq3s_grid` (≤ 15),
//!   one sign bit a weight;
//! - IQ1_S, IQ1_M: `w = dl·(g ± 1/8)` with `g ∈ {−1, 0, 1}` of `iq1s_grid`,
//!   so `D = d/8`, `sc = 2·ls + 1`, `q = 8·g ± 1` (`|q| ≤ 9`);
//! - TQ2_0, TQ1_0: `D = d`, `sc = 1`, `q ∈ {−1, 0, 1}` (and TQ2_0's code 3,
//!   never written by ggml, `q = 2` as its decoder has it).
//!
//! The activations are the K-quants' 256-value blocks with lane shifts up to
//! 4 ([`QKind`](super::QKind)'s `max_shift`; Q2_K's kind): value `i` is
//! `d_x·(y_i << s_i)`. Chunk `c` of 32 values adds to lane `j` of the block
//! `sc_{2c + j/4}·(Σ_{k<4} q·y << s)` over values `32c + 4j + k`, exactly in
//! `i32` (`|q·y| ≤ 62·127`, `sc ≤ 31`, `s ≤ 4`: a lane stays below 2³⁰),
//! and the block adds `A[b % 4] = fma(D·d_x, f32(L), A[b % 4])` (the
//! product rounded once), as the K-quants do; there are no offset terms.
//! The x86 kernels get the same integers from `vpmaddubsw(|q|, ±y)` (pair
//! sums ≤ 2·62·127) and `vpmaddwd` with the 16-bit multipliers
//! `2^s·sc ≤ 496`, so every level computes exactly this (bit for bit).

use super::blocks::f16_at;
use super::{add_block, each_row, finish, Acc, QRow, Run, RUN};
use crate::cpu::fast::dot::f16_to_f32;
use crate::cpu::SimdLevel;
use crate::format::ggml::iq_grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID,
};
use crate::format::ggml::iquant::{ksigns, BlockIQ1_M};
use crate::format::ggml::ternary::trit;
use crate::format::ggml::GgmlType;

/// A super-block type of this family (see the module doc).
pub(super) trait Grid: 'static {
    /// Bytes per super-block.
    const BS: usize;
    /// The factor `D` of a super-block of `BS` bytes.
    fn d(blk: &[u8]) -> Option<f32>;
    /// The integer scales `sc_h` of its 16 groups of 16 values.
    fn scales(blk: &[u8]) -> Option<[i16; 16]>;
    /// The integer weights `q` of chunk `c < 8` (values `32c..32c + 32`).
    fn chunk(blk: &[u8], c: usize) -> Option<[i8; 32]>;
}

/// Whether weights of type `t` take this family's kernels.
pub(super) fn is_grid(t: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        t,
        IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M | TQ1_0 | TQ2_0
    )
}

/// The little-endian `u16` / `u32` at byte `at` of `b`.
#[inline(always)]
pub(super) fn le16(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from(u16::from_le_bytes(
        b.get(at..at + 2)?.try_into().ok()?,
    )))
}
#[inline(always)]
pub(super) fn le32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// `2·v + 1` of each of 16 small values.
#[inline(always)]
fn odd(v: [u32; 16]) -> [i16; 16] {
    v.map(|v| (2 * (v & 15) + 1) as i16)
}

/// The 16 scales of the types with one 4-bit scale per 32 values, nibble
/// `ls(c)` of chunk `c`.
#[inline(always)]
fn per32(ls: impl Fn(usize) -> Option<u32>) -> Option<[i16; 16]> {
    let mut v = [0u32; 16];
    for c in 0..8 {
        let s = ls(c)?;
        v[2 * c] = s;
        v[2 * c + 1] = s;
    }
    Some(odd(v))
}

/// The 16 nibble scales of IQ2_XS and IQ2_S at byte `at` (group `h`: nibble
/// `h % 2` of byte `h / 2`).
#[inline(always)]
fn nibble_scales(blk: &[u8], at: usize) -> Option<[i16; 16]> {
    let s: &[u8; 8] = blk.get(at..at + 8)?.try_into().ok()?;
    Some(odd(std::array::from_fn(|h| {
        u32::from(s[h / 2] >> (4 * (h % 2)))
    })))
}

/// Writes the 8 magnitudes of a grid entry (its bytes), negated where bit
/// `k` of `signs` is set, to `q[..8]`.
#[inline(always)]
fn signed8(q: &mut [i8], entry: u64, signs: u8) {
    for (k, (q, g)) in q.iter_mut().zip(entry.to_le_bytes()).enumerate() {
        let g = g as i8;
        *q = if (signs >> k) & 1 != 0 { -g } else { g };
    }
}

/// Writes `8·g ± 1` of an IQ1 grid entry (bytes −1, 0, 1) to `q[..8]`: `−1`
/// where `neg`.
#[inline(always)]
fn iq1_8(q: &mut [i8], entry: u64, neg: bool) {
    let delta = if neg { -1 } else { 1 };
    for (q, g) in q.iter_mut().zip(entry.to_le_bytes()) {
        *q = 8 * (g as i8) + delta;
    }
}

/// The entry of a grid (0 for an index past it: never, indices are masked).
#[inline(always)]
fn entry<T: Copy + Default>(g: &[T], i: u32) -> T {
    g.get(i as usize).copied().unwrap_or_default()
}

/// Two 4-weight `u32` entries as one 8-weight entry (`lo` first).
#[inline(always)]
fn pair(lo: u32, hi: u32) -> u64 {
    u64::from(lo) | (u64::from(hi) << 32)
}

/// IQ2_XXS: `d`, then per 32 weights a `u32` of 4 grid indices and a `u32`
/// of 4 7-bit sign indices and the 4-bit scale (top bits).
#[allow(non_camel_case_types)]
pub(super) struct IQ2_XXS;
/// IQ2_XS: `d`, 32 `u16` (9-bit grid index, 7-bit sign index), 8 bytes of
/// nibble scales per 16.
#[allow(non_camel_case_types)]
pub(super) struct IQ2_XS;
/// IQ2_S: `d`, 32 grid indices (low 8 bits), 32 sign bytes, 8 bytes of the
/// indices' bits 8–9, 8 bytes of nibble scales per 16.
#[allow(non_camel_case_types)]
pub(super) struct IQ2_S;
/// IQ3_XXS: `d`, 64 grid indices (4 weights each), 8 `u32` of 4 7-bit sign
/// indices and the 4-bit scale.
#[allow(non_camel_case_types)]
pub(super) struct IQ3_XXS;
/// IQ3_S: `d`, 64 grid indices (low 8 bits), 8 bytes of their bit 8, 32
/// sign bytes, 4 bytes of nibble scales per 32.
#[allow(non_camel_case_types)]
pub(super) struct IQ3_S;
/// IQ1_S: `d`, 32 grid indices (low 8 bits), 8 `u16` (4 × 3 index bits, a
/// 3-bit scale, the shift's sign).
#[allow(non_camel_case_types)]
pub(super) struct IQ1_S;
/// IQ1_M: 32 grid indices (low 8 bits), 16 bytes of nibbles (3 index bits,
/// the shift's sign), 4 `u16` of 3-bit scales per 16 and a nibble of `d`.
#[allow(non_camel_case_types)]
pub(super) struct IQ1_M;
/// TQ1_0: 48 bytes of 5 trits, 4 bytes of 4 trits, `d`.
#[allow(non_camel_case_types)]
pub(super) struct TQ1_0;
/// TQ2_0: 64 bytes of 2-bit codes `t + 1`, `d`.
#[allow(non_camel_case_types)]
pub(super) struct TQ2_0;

impl Grid for IQ2_XXS {
    const BS: usize = 66;
    #[inline(always)]
    fn d(blk: &[u8]) -> Option<f32> {
        Some(f16_at(blk, 0)? * 0.125)
    }
    #[inline(always)]
    fn scales(blk: &[u8]) -> Option<[i16; 16]> {
        per32(|c| Some(le32(blk, 6 + 8 * c)? >> 28))
    }
    #[inline(always)]
    fn chunk(blk: &[u8], c: usize) -> Option<[i8; 32]> {
        let (idx, aux) = (le32(blk, 2 + 8 * c)?, le32(blk, 6 + 8 * c)?);
        let mut q = [0i8; 32];
        for (l, q8) in q.chunks_exact_mut(8).enumerate() {
            let e = entry(&IQ2XXS_GRID, (idx >> (8 * l)) & 0xFF);
            signed8(q8, e, ksigns(aux >> (7 * l)));
        }
        Some(q)
    }
}

impl Grid for IQ2_XS {
    const BS: usize = 74;
    #[inline(always)]
    fn d(blk: &[u8]) -> Option<f32> {
        Some(f16_at(blk, 0)? * 0.125)
    }
    #[inline(always)]
    fn scales(blk: &[u8]) -> Option<[i16; 16]> {
        nibble_scales(blk, 66)
    }
    #[inline(always)]
    fn chunk(blk: &[u8], c: usize) -> Option<[i8; 32]> {
        let mut q = [0i8; 32];
        for (l, q8) in q.chunks_exact_mut(8).enumerate() {
            let v = le16(blk, 2 + 2 * (4 * c + l))?;
            signed8(q8, entry(&IQ2XS_GRID, v & 511), ksigns(v >> 9));
        }
        Some(q)
    }
}

impl Grid for IQ2_S {
    const BS: usize = 82;
    #[inline(always)]
    fn d(blk: &[u8]) -> Option<f32> {
        Some(f16_at(blk, 0)? * 0.125)
    }
    #[inline(always)]
    fn scales(blk: &[u8]) -> Option<[i16; 16]> {
        nibble_scales(blk, 74)
    }
    #[inline(always)]
    fn chunk(blk: &[u8], c: usize) -> Option<[i8; 32]> {
        let qh = u32::from(*blk.get(66 + c)?);
        let mut q = [0i8; 32];
        for (l, q8) in q.chunks_exact_mut(8).enumerate() {
            let i = 4 * c + l;
            let v = u32::from(*blk.get(2 + i)?) | (((qh >> (2 * l)) & 3) << 8);
            signed8(q8, entry(&IQ2S_GRID, v), *blk.get(34 + i)?);
        }
        Some(q)
    }
}

impl Grid for IQ3_XXS {
    const BS: usize = 98;
    #[inline(always)]
    fn d(blk: &[u8]) -> Option<f32> {
        Some(f16_at(blk, 0)? * 0.25)
    }
    #[inline(always)]
    fn scales(blk: &[u8]) -> Option<[i16; 16]> {
        per32(|c| Some(le32(blk, 66 + 4 * c)? >> 28))
    }
    #[inline(always)]
    fn chunk(blk: &[u8], c: usize) -> Option<[i8; 32]> {
        let aux = le32(blk, 66 + 4 * c)?;
        let idx: &[u8; 8] = blk.get(2 + 8 * c..10 + 8 * c)?.try_into().ok()?;
        let mut q = [0i8; 32];
        for (l, q8) in q.chunks_exact_mut(8).enumerate() {
            let g = |k: usize| entry(&IQ3XXS_GRID, u32::from(idx[2 * l + k]));
            signed8(q8, pair(g(0), g(1)), ksigns(aux >> (7 * l)));
        }
        Some(q)
    }
}

impl Grid for IQ3_S {
    const BS: usize = 110;
    #[inline(always)]
    fn d(blk: &[u8]) -> Option<f32> {
        f16_at(blk, 0)
    }
    #[inline(always)]
    fn scales(blk: &[u8]) -> Option<[i16; 16]> {
        per32(|c| Some(u32::from(*blk.get(106 + c / 2)? >> (4 * (c % 2)))))
    }
    #[inline(always)]
    fn chunk(blk: &[u8], c: usize) -> Option<[i8; 32]> {
        let qh = u32::from(*blk.get(66 + c)?);
        let idx: &[u8; 8] = blk.get(2 + 8 * c..10 + 8 * c)?.try_into().ok()?;
        let g = |k: usize| {
            let v = u32::from(idx[k]) | (((qh >> k) & 1) << 8);
            entry(&IQ3S_GRID, v)
        };
        let mut q = [0i8; 32];
        for (l, q8) in q.chunks_exact_mut(8).enumerate() {
            signed8(q8, pair(g(2 * l), g(2 * l + 1)), *blk.get(74 + 4 * c + l)?);
        }
        Some(q)
    }
}

impl Grid for IQ1_S {
    const BS: usize = 50;
    #[inline(always)]
    fn d(blk: &[u8]) -> Option<f32> {
        Some(f16_at(blk, 0)? * 0.125)
    }
    #[inline(always)]
    fn scales(blk: &[u8]) -> Option<[i16; 16]> {
        per32(|c| Some((le16(blk, 34 + 2 * c)? >> 12) & 7))
    }
    #[inline(always)]
    fn chunk(blk: &[u8], c: usize) -> Option<[i8; 32]> {
        let qh = le16(blk, 34 + 2 * c)?;
        let mut q = [0i8; 32];
        for (l, q8) in q.chunks_exact_mut(8).enumerate() {
            let v = u32::from(*blk.get(2 + 4 * c + l)?) | (((qh >> (3 * l)) & 7) << 8);
            iq1_8(q8, entry(&IQ1S_GRID, v), qh & 0x8000 != 0);
        }
        Some(q)
    }
}

/// The 3-bit scale of IQ1_M's group `h` of 16.
#[inline(always)]
fn iq1m_scale(blk: &[u8], h: usize) -> Option<u32> {
    Some((le16(blk, 48 + 2 * (h / 4))? >> (3 * (h % 4))) & 7)
}

impl Grid for IQ1_M {
    const BS: usize = 56;
    #[inline(always)]
    fn d(blk: &[u8]) -> Option<f32> {
        let b: &[u8; 56] = blk.get(..56)?.try_into().ok()?;
        let d = bytemuck::try_from_bytes::<BlockIQ1_M>(b).ok()?.d();
        Some(f16_to_f32(d, true) * 0.125)
    }
    #[inline(always)]
    fn scales(blk: &[u8]) -> Option<[i16; 16]> {
        let mut v = [0u32; 16];
        for (h, v) in v.iter_mut().enumerate() {
            *v = iq1m_scale(blk, h)?;
        }
        Some(odd(v))
    }
    #[inline(always)]
    fn chunk(blk: &[u8], c: usize) -> Option<[i8; 32]> {
        let mut q = [0i8; 32];
        for (l, q8) in q.chunks_exact_mut(8).enumerate() {
            let i = 4 * c + l;
            let nib = u32::from(*blk.get(32 + i / 2)? >> (4 * (i % 2)));
            let v = u32::from(*blk.get(i)?) | ((nib & 7) << 8);
            iq1_8(q8, entry(&IQ1S_GRID, v), nib & 8 != 0);
        }
        Some(q)
    }
}

impl Grid for TQ1_0 {
    const BS: usize = 54;
    #[inline(always)]
    fn d(blk: &[u8]) -> Option<f32> {
        f16_at(blk, 52)
    }
    #[inline(always)]
    fn scales(_: &[u8]) -> Option<[i16; 16]> {
        Some([1; 16])
    }
    #[inline(always)]
    fn chunk(blk: &[u8], c: usize) -> Option<[i8; 32]> {
        let mut q = [0i8; 32];
        for (m, q) in q.iter_mut().enumerate() {
            // Value v: trit n of byte `at` (the layout of `BlockTQ1_0`).
            let v = 32 * c + m;
            let (at, n) = match v {
                0..160 => (v % 32, v / 32),
                160..240 => (32 + (v - 160) % 16, (v - 160) / 16),
                _ => (48 + (v - 240) % 4, (v - 240) / 4),
            };
            *q = trit(*blk.get(at)?, n as u32);
        }
        Some(q)
    }
}

impl Grid for TQ2_0 {
    const BS: usize = 66;
    #[inline(always)]
    fn d(blk: &[u8]) -> Option<f32> {
        f16_at(blk, 64)
    }
    #[inline(always)]
    fn scales(_: &[u8]) -> Option<[i16; 16]> {
        Some([1; 16])
    }
    #[inline(always)]
    fn chunk(blk: &[u8], c: usize) -> Option<[i8; 32]> {
        let qs: &[u8; 32] = blk.get(32 * (c / 4)..32 * (c / 4) + 32)?.try_into().ok()?;
        Some(qs.map(|v| ((v >> (2 * (c % 4))) & 3) as i8 - 1))
    }
}

/// The run of `R` activation rows for weights of type `t` of this family at
/// `level` (`None`: not of this family, or no kernel at this level).
pub(super) fn run_for<const R: usize>(level: SimdLevel, t: GgmlType) -> Option<Run<R>> {
    match level {
        SimdLevel::Portable => Some(match t {
            GgmlType::IQ2_XXS => run::<IQ2_XXS, R>,
            GgmlType::IQ2_XS => run::<IQ2_XS, R>,
            GgmlType::IQ2_S => run::<IQ2_S, R>,
            GgmlType::IQ3_XXS => run::<IQ3_XXS, R>,
            GgmlType::IQ3_S => run::<IQ3_S, R>,
            GgmlType::IQ1_S => run::<IQ1_S, R>,
            GgmlType::IQ1_M => run::<IQ1_M, R>,
            GgmlType::TQ1_0 => run::<TQ1_0, R>,
            GgmlType::TQ2_0 => run::<TQ2_0, R>,
            _ => return None,
        }),
        #[cfg(target_arch = "x86_64")]
        level => super::grid_x86::run_for::<R>(level, t),
        #[allow(unreachable_patterns)] // reachable on other architectures
        _ => None,
    }
}

// The portable run of a [`Grid`] type (`portable_run!`, qdot/mod.rs).
portable_run!(run [G: Grid, const R: usize], rows::<G, R>);

/// The integer lanes of chunk `c` (weights `q`, scales `sc`) against the
/// codes and shifts of 256-value block `b` of `a`, added to `l`.
#[inline(always)]
fn chunk_lanes(l: &mut [i32; 8], q: &[i8; 32], sc: &[i16; 16], a: &QRow, b: usize, c: usize) {
    let at = 256 * b + 32 * c;
    let (Some(y), Some(sh)) = (a.codes.get(at..at + 32), a.shift.get(at / 4..at / 4 + 8)) else {
        return;
    };
    for (j, (l, &s)) in l.iter_mut().zip(sh).enumerate() {
        let mut v = 0i32;
        for k in 4 * j..4 * j + 4 {
            v += i32::from(q[k]) * i32::from(y[k]);
        }
        *l += i32::from(sc[2 * c + j / 4]) * (v << s);
    }
}

/// Rows of [`Grid`] super-blocks: `A[b % 4] = fma(D·d_x, f32(L), A[b % 4])`.
fn rows<G: Grid, const R: usize>(
    bytes: &[u8],
    row_len: usize,
    acts: &[&QRow; R],
    _: &mut [f32],
    out: &mut [f32],
    stride: usize,
) -> Option<()> {
    let nb = row_len / G::BS;
    for a in acts {
        if a.codes.len() != 256 * nb || a.shift.len() != 64 * nb || a.d.len() != nb {
            return None;
        }
    }
    each_row::<R>(bytes, row_len, out, stride, |row, out| {
        let mut acc: [Acc; R] = [[[0f32; 8]; RUN]; R];
        for (b, blk) in row.chunks_exact(G::BS).enumerate() {
            let (d, sc) = (G::d(blk)?, G::scales(blk)?);
            let mut l = [[0i32; 8]; R];
            for c in 0..8 {
                let q = G::chunk(blk, c)?;
                for (l, a) in l.iter_mut().zip(acts) {
                    chunk_lanes(l, &q, &sc, a, b, c);
                }
            }
            for ((acc, l), a) in acc.iter_mut().zip(l).zip(acts) {
                add_block(acc, b, d * *a.d.get(b)?, l);
            }
        }
        for (o, acc) in out.iter_mut().zip(&acc) {
            *o = finish(acc, 0.0);
        }
        Some(())
    })
}
