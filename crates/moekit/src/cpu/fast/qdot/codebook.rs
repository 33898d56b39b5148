//! The 4-bit codebook formats on the integer path: GGUF IQ4_NL, IQ4_XS and
//! MXFP4, MLX `mode="mxfp4"` and `mode="nvfp4"`. Their 4-bit codes index a
//! table of 16 signed bytes ([`Codebook::TABLE`]: llama.cpp's
//! `kvalues_iq4nl`, or `kvalues_mxfp4`, the e2m1 values doubled, with the
//! scale halved), so a block dots as Q8_0's signed codes once the nibbles
//! are looked up (a byte shuffle at the x86 levels, `codebook_x86`).
//!
//! Every format is cut into 32-value blocks (IQ4_XS: its sub-blocks of 32,
//! each with the scale `d·(ls − 32)`, one exact f32 product), each with its
//! weight scale (nvfp4: two, one per group of 16: [`Codebook::GROUPS`]).
//! The activations are 32-value blocks with lane scales, stored interleaved
//! as Q4_0's (the low nibbles of a run of 4 blocks dot against the first
//! halves, the high nibbles against the second; for MLX's codes, packed
//! LSB first, the halves are the even and the odd values: `pairs`), with
//! the lane biases `−128·Σy` (the VNNI kernels dot `kv + 128`, unsigned).
//! Lane `j` of block `b` has the weight scale `w_b` of its group (nvfp4
//! with pairs: lane `j` covers values of group `(j % 4)/2`), the scale
//! product `s = w_g·d_b` (`d_b` the activations' block scale: 1, or NaN for
//! a block with a non-finite value) is rounded once, and the lane adds
//! `A[b % 4][j] = fma(s·m_j, f32(L_b[j]), A[b % 4][j])`, `s·m_j` rounded
//! once: the arithmetic of the module doc of [`super`], with no offset
//! terms. Every level computes exactly this.

use super::portable::block_lanes;
use super::{finish, invalid, Acc, QRow, Rows, Run, RUN};
use crate::cpu::fast::dot::f16_to_f32;
use crate::cpu::SimdLevel;
use crate::error::Result;
use crate::format::ggml::nonlinear::{e8m0_to_f32_half, KVALUES_IQ4NL, KVALUES_MXFP4};
use crate::format::ggml::GgmlType;
use crate::format::mlxfp::{e4m3_to_f32, e8m0_to_f32};
use crate::format::{MlxFpMode, RowDecoder};

/// One weight row as stored: its code bytes and the bytes holding its
/// scales (the same slice for the GGUF blocks, MLX's scale bytes apart).
#[derive(Clone, Copy)]
pub(super) struct CbRow<'a> {
    /// Code bytes (and, for GGUF, the blocks' scales).
    pub qs: &'a [u8],
    /// Scale bytes.
    pub sc: &'a [u8],
}

/// A 4-bit codebook format.
pub(super) trait Codebook: 'static {
    /// The value of each 4-bit code.
    const TABLE: [i8; 16];
    /// Weight scales per 32-value block: 1, or 2 (groups of 16, MLX's
    /// nvfp4: lane `j` in group `(j % 4)/2`, the pairs layout).
    const GROUPS: usize;
    /// Whether the 4 blocks of a run have their 64 code bytes contiguous
    /// (else blocks of [`BS`](Self::BS) bytes, codes from byte
    /// [`HDR`](Self::HDR)).
    const CONTIGUOUS: bool;
    /// Bytes per block (blocked formats).
    const BS: usize = 0;
    /// Offset of the code bytes in a block (blocked formats).
    const HDR: usize = 0;
    /// Whether the scales are the f16 at byte 0 of 18-byte blocks
    /// (IQ4_NL: the x86 levels widen them with F16C).
    const F16_BLOCKS: bool = false;
    /// The stored rows `n0..n0 + n` of expert `e`: code bytes and their
    /// length per row, scale bytes and theirs (`None`: another format).
    fn rows<'a>(
        dec: &RowDecoder<'a>,
        e: usize,
        n0: usize,
        n: usize,
    ) -> Option<(&'a [u8], usize, &'a [u8], usize)>;
    /// The code and scale bytes a row of `nb` blocks has (`None`: no such
    /// row).
    fn row_len(nb: usize) -> Option<(usize, usize)>;
    /// Where the 16 code bytes of block `b` start: low nibbles are the
    /// block's first half, high nibbles its second.
    fn qs_at(b: usize) -> usize;
    /// The weight scales of groups `g0..g0 + 8` (zeros past the row's end).
    fn scales8(row: CbRow<'_>, g0: usize) -> [f32; 8];
}

/// The rows of `dec` if it holds GGUF blocks of type `t`.
#[inline(always)]
fn ggml_rows<'a>(
    t: GgmlType,
    dec: &RowDecoder<'a>,
    e: usize,
    n0: usize,
    n: usize,
) -> Option<(&'a [u8], usize, &'a [u8], usize)> {
    let (got, bytes) = dec.ggml_rows(e, n0, n)?;
    let len = bytes.len() / n.max(1);
    (got == t).then_some((bytes, len, bytes, len))
}

/// The rows of `dec` if it holds MLX weights of `mode`.
#[inline(always)]
fn mlx_rows<'a>(
    mode: MlxFpMode,
    dec: &RowDecoder<'a>,
    e: usize,
    n0: usize,
    n: usize,
) -> Option<(&'a [u8], usize, &'a [u8], usize)> {
    let (got, words, scales) = dec.mlxfp_rows(e, n0, n)?;
    let qs: &[u8] = bytemuck::cast_slice(words);
    let n = n.max(1);
    (got == mode).then_some((qs, qs.len() / n, scales, scales.len() / n))
}

/// The f16 at byte `at` of `b`, widened (zero if out of range).
#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    b.get(at..at + 2).map_or(0.0, |h| {
        f16_to_f32(half::f16::from_bits(u16::from_le_bytes([h[0], h[1]])), true)
    })
}

/// GGUF IQ4_NL: f16 `d`, 16 nibble bytes.
pub(super) struct Iq4Nl;
/// GGUF IQ4_XS: f16 `d`, 6-bit sub-block scales, 8 × 16 nibble bytes.
pub(super) struct Iq4Xs;
/// GGUF MXFP4: e8m0 byte, 16 nibble bytes.
pub(super) struct Mxfp4;
/// MLX `mode="mxfp4"`: e2m1 codes, e8m0 scale per 32.
pub(super) struct MlxMxfp4;
/// MLX `mode="nvfp4"`: e2m1 codes, e4m3 scale per 16.
pub(super) struct MlxNvfp4;

impl Codebook for Iq4Nl {
    const TABLE: [i8; 16] = KVALUES_IQ4NL;
    const GROUPS: usize = 1;
    const CONTIGUOUS: bool = false;
    const BS: usize = 18;
    const HDR: usize = 2;
    const F16_BLOCKS: bool = true;
    #[inline(always)]
    fn rows<'a>(
        dec: &RowDecoder<'a>,
        e: usize,
        n0: usize,
        n: usize,
    ) -> Option<(&'a [u8], usize, &'a [u8], usize)> {
        ggml_rows(GgmlType::IQ4_NL, dec, e, n0, n)
    }
    #[inline(always)]
    fn row_len(nb: usize) -> Option<(usize, usize)> {
        Some((18 * nb, 18 * nb))
    }
    #[inline(always)]
    fn qs_at(b: usize) -> usize {
        18 * b + 2
    }
    #[inline(always)]
    fn scales8(row: CbRow<'_>, g0: usize) -> [f32; 8] {
        super::widen8_f16::<18, 0>(row.sc, g0)
    }
}

impl Codebook for Mxfp4 {
    const TABLE: [i8; 16] = KVALUES_MXFP4;
    const GROUPS: usize = 1;
    const CONTIGUOUS: bool = false;
    const BS: usize = 17;
    const HDR: usize = 1;
    #[inline(always)]
    fn rows<'a>(
        dec: &RowDecoder<'a>,
        e: usize,
        n0: usize,
        n: usize,
    ) -> Option<(&'a [u8], usize, &'a [u8], usize)> {
        ggml_rows(GgmlType::MXFP4, dec, e, n0, n)
    }
    #[inline(always)]
    fn row_len(nb: usize) -> Option<(usize, usize)> {
        Some((17 * nb, 17 * nb))
    }
    #[inline(always)]
    fn qs_at(b: usize) -> usize {
        17 * b + 1
    }
    /// `2^(e − 128)` (ggml's half e8m0, exact), from a table.
    #[inline(always)]
    fn scales8(row: CbRow<'_>, g0: usize) -> [f32; 8] {
        let t: &[f32; 256] = &E8M0_HALF_GGML;
        match row.sc.get(17 * g0..17 * g0 + 17 * 7 + 1) {
            Some(b) => std::array::from_fn(|i| t[usize::from(b[17 * i])]),
            None => std::array::from_fn(|i| {
                row.sc
                    .get(17 * (g0 + i))
                    .map_or(0.0, |&e| t[usize::from(e)])
            }),
        }
    }
}

impl Codebook for Iq4Xs {
    const TABLE: [i8; 16] = KVALUES_IQ4NL;
    const GROUPS: usize = 1;
    const CONTIGUOUS: bool = true;
    #[inline(always)]
    fn rows<'a>(
        dec: &RowDecoder<'a>,
        e: usize,
        n0: usize,
        n: usize,
    ) -> Option<(&'a [u8], usize, &'a [u8], usize)> {
        ggml_rows(GgmlType::IQ4_XS, dec, e, n0, n)
    }
    #[inline(always)]
    fn row_len(nb: usize) -> Option<(usize, usize)> {
        nb.is_multiple_of(8)
            .then_some((136 * (nb / 8), 136 * (nb / 8)))
    }
    #[inline(always)]
    fn qs_at(b: usize) -> usize {
        136 * (b / 8) + 8 + 16 * (b % 8)
    }
    /// Sub-blocks `g0..g0 + 8` (`g0` a multiple of 8: one super-block):
    /// `d·(ls − 32)`, exact.
    #[inline(always)]
    fn scales8(row: CbRow<'_>, g0: usize) -> [f32; 8] {
        let at = 136 * (g0 / 8);
        let Some(blk) = row.sc.get(at..at + 8) else {
            return [0.0; 8];
        };
        let d = f16_at(blk, 0);
        let high = u16::from_le_bytes([blk[2], blk[3]]);
        std::array::from_fn(|g| {
            let low = (blk[4 + g / 2] >> (4 * (g % 2))) & 15;
            let ls = i32::from(low) | (i32::from((high >> (2 * g)) & 3) << 4);
            d * (ls - 32) as f32
        })
    }
}

impl Codebook for MlxMxfp4 {
    const TABLE: [i8; 16] = KVALUES_MXFP4;
    const GROUPS: usize = 1;
    const CONTIGUOUS: bool = true;
    #[inline(always)]
    fn rows<'a>(
        dec: &RowDecoder<'a>,
        e: usize,
        n0: usize,
        n: usize,
    ) -> Option<(&'a [u8], usize, &'a [u8], usize)> {
        mlx_rows(MlxFpMode::Mxfp4, dec, e, n0, n)
    }
    #[inline(always)]
    fn row_len(nb: usize) -> Option<(usize, usize)> {
        Some((16 * nb, nb))
    }
    #[inline(always)]
    fn qs_at(b: usize) -> usize {
        16 * b
    }
    /// `2^(e − 127)/2` (exact; e = 255: ∞), from a table.
    #[inline(always)]
    fn scales8(row: CbRow<'_>, g0: usize) -> [f32; 8] {
        table8(row.sc, g0, &E8M0_HALF_MLX)
    }
}

impl Codebook for MlxNvfp4 {
    const TABLE: [i8; 16] = KVALUES_MXFP4;
    const GROUPS: usize = 2;
    const CONTIGUOUS: bool = true;
    #[inline(always)]
    fn rows<'a>(
        dec: &RowDecoder<'a>,
        e: usize,
        n0: usize,
        n: usize,
    ) -> Option<(&'a [u8], usize, &'a [u8], usize)> {
        mlx_rows(MlxFpMode::Nvfp4, dec, e, n0, n)
    }
    #[inline(always)]
    fn row_len(nb: usize) -> Option<(usize, usize)> {
        Some((16 * nb, 2 * nb))
    }
    #[inline(always)]
    fn qs_at(b: usize) -> usize {
        16 * b
    }
    /// The e4m3 value halved (exact), from a table.
    #[inline(always)]
    fn scales8(row: CbRow<'_>, g0: usize) -> [f32; 8] {
        table8(row.sc, g0, &E4M3_HALF)
    }
}

/// A value of every byte.
type Table = std::sync::LazyLock<[f32; 256]>;

/// Half the e4m3 value of every byte (exact; NaN for 0x7F, 0xFF).
static E4M3_HALF: Table = Table::new(|| std::array::from_fn(|b| e4m3_to_f32(b as u8) * 0.5));

/// Half MLX's e8m0 value of every byte (exact; 255: ∞).
static E8M0_HALF_MLX: Table = Table::new(|| std::array::from_fn(|b| e8m0_to_f32(b as u8) * 0.5));

/// ggml's half e8m0 value of every byte (exact; 255: 2^127).
static E8M0_HALF_GGML: Table = Table::new(|| std::array::from_fn(|b| e8m0_to_f32_half(b as u8)));

/// `t[sc[g0 + i]]` for `i < 8` (zeros past the end of `sc`).
#[inline(always)]
fn table8(sc: &[u8], g0: usize, t: &Table) -> [f32; 8] {
    let t: &[f32; 256] = t;
    match sc.get(g0..g0 + 8) {
        Some(b) => std::array::from_fn(|i| t[usize::from(b[i])]),
        None => std::array::from_fn(|i| sc.get(g0 + i).map_or(0.0, |&e| t[usize::from(e)])),
    }
}

/// The run of `R` activation rows for weights of codebook format `B` at
/// `level`.
pub(super) fn run_for<B: Codebook, const R: usize>(level: SimdLevel) -> Option<Run<R>> {
    match level {
        SimdLevel::Portable => Some(run_portable::<B, R>),
        #[cfg(target_arch = "x86_64")]
        level => super::codebook_x86::run_for::<B, R>(level),
        #[allow(unreachable_patterns)] // reachable on other architectures
        _ => None,
    }
}

/// The signed values of a block's 32 codes, in the activations' half
/// order (low nibbles, then high nibbles).
#[inline(always)]
fn values<B: Codebook>(qs: &[u8]) -> Option<[i32; 32]> {
    let qs: &[u8; 16] = qs.get(..16)?.try_into().ok()?;
    let mut w = [0i32; 32];
    for (i, &q) in qs.iter().enumerate() {
        w[i] = i32::from(B::TABLE[usize::from(q & 15)]);
        w[i + 16] = i32::from(B::TABLE[usize::from(q >> 4)]);
    }
    Some(w)
}

/// The scale products of block `b`'s 8 lanes from one activation row's
/// group scale products `st` (`GROUPS` per block).
#[inline(always)]
pub(super) fn lane_scales<B: Codebook>(st: &[f32], b: usize) -> Option<[f32; 8]> {
    if B::GROUPS == 1 {
        Some([*st.get(b)?; 8])
    } else {
        let (s0, s1) = (*st.get(2 * b)?, *st.get(2 * b + 1)?);
        Some([s0, s0, s1, s1, s0, s0, s1, s1])
    }
}

/// Blocks `from..nb` of a row into `acc` with the portable lanes (group
/// scale products `st` of one activation row `a`).
#[inline(always)]
pub(super) fn tail<B: Codebook>(
    acc: &mut Acc,
    row: CbRow<'_>,
    st: &[f32],
    a: &QRow,
    nb: usize,
    from: usize,
) -> Option<()> {
    for b in from..nb {
        let w = values::<B>(row.qs.get(B::qs_at(b)..)?)?;
        let (l, m) = block_lanes(a, nb, b, &w)?;
        let s = lane_scales::<B>(st, b)?;
        if let Some(acc) = acc.get_mut(b % RUN) {
            for (((a, l), m), s) in acc.iter_mut().zip(l).zip(m).zip(s) {
                *a = (s * m).mul_add(l as f32, *a);
            }
        }
    }
    Some(())
}

const OP: &str = "qdot_rows";

/// The computation of a run of rows but the lanes: checks, then per weight
/// row the group scale products `st[t·ng + i] = w_i·d_t[i / GROUPS]` of
/// every activation row `t` (`ng = GROUPS·nb`), `body(row, st, rows, nb)`
/// (each activation row's lane accumulators) and [`finish`]. Runs in the
/// caller's context (inlined); `scales8` widens 8 weight scales.
#[allow(clippy::too_many_arguments)] // a Run's arguments and the level's parts
#[inline(always)]
pub(super) fn drive<B: Codebook, const R: usize>(
    dec: &RowDecoder<'_>,
    e: usize,
    n0: usize,
    n: usize,
    acts: &[&QRow; R],
    scratch: &mut [f32],
    out: &mut [f32],
    stride: usize,
    scales8: impl Fn(CbRow<'_>, usize) -> [f32; 8],
    body: impl Fn(CbRow<'_>, &[f32], &Rows<'_, R>, usize) -> Option<[Acc; R]>,
) -> Result<()> {
    let Some((qs, qlen, sc, slen)) = B::rows(dec, e, n0, n) else {
        dec.raw_row(e, n0 + n.saturating_sub(1))?;
        return Err(invalid(OP, "dec", "codebook rows", "another format"));
    };
    let bad = || {
        invalid(
            OP,
            "acts",
            "rows quantized for the weights' format and length",
            "another kind or length",
        )
    };
    let nb = dec.cols() / 32;
    let ng = B::GROUPS * nb;
    let rows = Rows::new(acts, nb, true).ok_or_else(bad)?;
    let fits = B::row_len(nb) == Some((qlen, slen)) && nb > 0;
    if !fits || qs.len() != n * qlen || sc.len() != n * slen {
        return Err(invalid(OP, "dec", "rows of whole blocks", "a partial row"));
    }
    let (st, rest) = scratch.split_at_mut_checked(R * ng).ok_or_else(bad)?;
    let (ws, rest) = rest
        .split_at_mut_checked(ng.div_ceil(8) * 8)
        .ok_or_else(bad)?;
    // Each group's activation block scale (`GROUPS` = 2: each twice).
    let dg = rest.get_mut(..R * ng).ok_or_else(bad)?;
    for (dg, d) in dg.chunks_exact_mut(ng).zip(rows.d) {
        for (g, d) in dg.chunks_exact_mut(B::GROUPS).zip(d) {
            g.fill(*d);
        }
    }
    let dg: &[f32] = dg;
    let rows_of = qs.chunks_exact(qlen).zip(sc.chunks_exact(slen));
    for (i, (q, s)) in rows_of.enumerate() {
        let row = CbRow { qs: q, sc: s };
        for (c, w8) in ws.chunks_exact_mut(8).enumerate() {
            w8.copy_from_slice(&scales8(row, 8 * c));
        }
        for (st, d) in st.chunks_exact_mut(ng).zip(dg.chunks_exact(ng)) {
            for ((o, &w), &d) in st.iter_mut().zip(&*ws).zip(d) {
                *o = w * d;
            }
        }
        let accs = body(row, st, &rows, nb).ok_or_else(bad)?;
        for (t, acc) in accs.iter().enumerate() {
            if let Some(o) = out.get_mut(t * stride + i) {
                *o = finish(acc, 0.0);
            }
        }
    }
    Ok(())
}

/// The portable run.
#[allow(clippy::too_many_arguments)] // a Run
fn run_portable<B: Codebook, const R: usize>(
    dec: &RowDecoder<'_>,
    e: usize,
    n0: usize,
    n: usize,
    acts: &[&QRow; R],
    scratch: &mut [f32],
    out: &mut [f32],
    stride: usize,
) -> Result<()> {
    drive::<B, R>(
        dec,
        e,
        n0,
        n,
        acts,
        scratch,
        out,
        stride,
        B::scales8,
        |row, st, _, nb| {
            let mut accs = [[[0f32; 8]; RUN]; R];
            let ng = B::GROUPS * nb;
            for (t, acc) in accs.iter_mut().enumerate() {
                tail::<B>(acc, row, st.get(t * ng..(t + 1) * ng)?, acts[t], nb, 0)?;
            }
            Some(accs)
        },
    )
}
