//! The x86 integer kernels on 256-bit vectors, one body per format, generic
//! over the instruction that multiplies bytes ([`Dot`]): AVX2's
//! `vpmaddubsw` + `vpmaddwd` ([`Avx2`]), or `vpdpbusd`/`vpdpwssd` in their
//! AVX-VNNI ([`AvxVnni`]) or AVX512-VNNI ([`Avx512Vnni`], EVEX-encoded
//! 256-bit) forms.
//!
//! Weight codes are widened to bytes in natural order (Q4_0: the 16 nibble
//! bytes and the same shifted right by 4, masked; Q4_K: low and high
//! nibbles of 32 bytes), so one 256-bit vector holds a 32-weight block or
//! group against 32 activation codes, and each `i32` lane `j` of the
//! multiply-add sums codes `4j..4j+4`: the lanes of the module doc of
//! [`super`], in exact integers. Scaling and accumulation are the same f32
//! operations, in the same order, as the portable kernels (multiply, then
//! add; no FMA), and the lanes are summed by the shared [`finish`].
//!
//! # Safety
//!
//! The intrinsics need the features of their level ([`Dot::enter`]). The
//! kernels of a level run only inside its `enter`, and
//! [`qdot_rows`](super::qdot_rows) runs a level only if
//! `SimdLevel::is_supported` detected its features at run time: that is
//! what the `SAFETY` comments below mean by "the level was detected".
//! Memory is read only through references to fixed-size arrays.

use super::{block_scales, chunk, finish, run_rows, QRow, Rows, Run};
use crate::cpu::fast::dot::k4_scales_mins;
use crate::error::Result;
use crate::format::ggml::GgmlType;
use crate::format::RowDecoder;
use std::arch::x86_64::*;

/// How a level multiplies and adds bytes, and the compiled context its
/// kernels run in.
pub(super) trait Dot: Copy + 'static {
    /// Runs `f` in a function compiled with the level's features (pass
    /// `#[inline(always)]` closures; see `dot::simd::Simd::enter`).
    fn enter<T>(f: impl FnOnce() -> T) -> T;
    /// `acc[j] + Σ_{k<4} u[4j+k]·s[4j+k]` of unsigned `u ≤ 128` and signed
    /// `s ≥ −127` (so AVX2's 16-bit pair sums cannot saturate).
    fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
    /// `acc[j] + p[2j]·q[2j] + p[2j+1]·q[2j+1]` of 16-bit lanes.
    fn dpwssd(acc: __m256i, p: __m256i, q: __m256i) -> __m256i;
    /// `Σ_{k<4} w[4j+k]·y[4j+k]` of signed bytes, `y ≥ −127`; `bias` holds
    /// `−128·Σ_{k<4} y[4j+k]` (for levels that offset `w` to unsigned).
    fn dot_i8(w: __m256i, y: __m256i, bias: &[i32; 8]) -> __m256i;
}

/// AVX2: `vpmaddubsw` + `vpmaddwd`.
#[derive(Clone, Copy)]
pub(super) struct Avx2;

/// AVX-VNNI: VEX `vpdpbusd`, `vpdpwssd`.
#[derive(Clone, Copy)]
pub(super) struct AvxVnni;

/// AVX512-VNNI (+VL): EVEX `vpdpbusd`, `vpdpwssd` on 256 bits.
#[derive(Clone, Copy)]
pub(super) struct Avx512Vnni;

/// Calls `f` compiled with AVX2, FMA and F16C.
///
/// # Safety
/// The CPU must have them.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline(never)]
unsafe fn with_avx2<T>(f: impl FnOnce() -> T) -> T {
    f()
}

/// Calls `f` compiled with AVX2, FMA, F16C and AVX-VNNI.
///
/// # Safety
/// The CPU must have them.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[inline(never)]
unsafe fn with_avx_vnni<T>(f: impl FnOnce() -> T) -> T {
    f()
}

/// Calls `f` compiled with AVX2, FMA, F16C, AVX-512 F/BW/VL and
/// AVX512-VNNI.
///
/// # Safety
/// The CPU must have them.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline(never)]
unsafe fn with_avx512_vnni<T>(f: impl FnOnce() -> T) -> T {
    f()
}

/// `Σ_{k<2}` of the 16-bit pair products, the AVX2 way.
#[inline(always)]
fn maddubs_pairs(u: __m256i, s: __m256i) -> __m256i {
    // SAFETY: no memory is accessed; the level was detected (module doc).
    unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)) }
}

impl Dot for Avx2 {
    #[inline(always)]
    fn enter<T>(f: impl FnOnce() -> T) -> T {
        // SAFETY: the level was detected (module doc).
        unsafe { with_avx2(f) }
    }
    #[inline(always)]
    fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: as in `maddubs_pairs`.
        unsafe { _mm256_add_epi32(acc, maddubs_pairs(u, s)) }
    }
    #[inline(always)]
    fn dpwssd(acc: __m256i, p: __m256i, q: __m256i) -> __m256i {
        // SAFETY: as in `maddubs_pairs`.
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(p, q)) }
    }
    #[inline(always)]
    fn dot_i8(w: __m256i, y: __m256i, _: &[i32; 8]) -> __m256i {
        // |w|·sign(y, w) = w·y, with |w| ≤ 128 unsigned and |y| ≤ 127.
        // SAFETY: as in `maddubs_pairs`.
        unsafe { maddubs_pairs(_mm256_abs_epi8(w), _mm256_sign_epi8(y, w)) }
    }
}

impl Dot for AvxVnni {
    #[inline(always)]
    fn enter<T>(f: impl FnOnce() -> T) -> T {
        // SAFETY: the level was detected (module doc).
        unsafe { with_avx_vnni(f) }
    }
    #[inline(always)]
    fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: as in `maddubs_pairs`.
        unsafe { _mm256_dpbusd_avx_epi32(acc, u, s) }
    }
    #[inline(always)]
    fn dpwssd(acc: __m256i, p: __m256i, q: __m256i) -> __m256i {
        // SAFETY: as in `maddubs_pairs`.
        unsafe { _mm256_dpwssd_avx_epi32(acc, p, q) }
    }
    #[inline(always)]
    fn dot_i8(w: __m256i, y: __m256i, bias: &[i32; 8]) -> __m256i {
        // (w + 128)·y − 128·y.
        // SAFETY: `bias` is 32 readable bytes; as in `maddubs_pairs`.
        unsafe {
            let u = _mm256_xor_si256(w, _mm256_set1_epi8(i8::MIN));
            _mm256_dpbusd_avx_epi32(_mm256_loadu_si256(bias.as_ptr().cast()), u, y)
        }
    }
}

impl Dot for Avx512Vnni {
    #[inline(always)]
    fn enter<T>(f: impl FnOnce() -> T) -> T {
        // SAFETY: the level was detected (module doc).
        unsafe { with_avx512_vnni(f) }
    }
    #[inline(always)]
    fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: as in `maddubs_pairs`.
        unsafe { _mm256_dpbusd_epi32(acc, u, s) }
    }
    #[inline(always)]
    fn dpwssd(acc: __m256i, p: __m256i, q: __m256i) -> __m256i {
        // SAFETY: as in `maddubs_pairs`.
        unsafe { _mm256_dpwssd_epi32(acc, p, q) }
    }
    #[inline(always)]
    fn dot_i8(w: __m256i, y: __m256i, bias: &[i32; 8]) -> __m256i {
        // SAFETY: `bias` is 32 readable bytes; as in `maddubs_pairs`.
        unsafe {
            let u = _mm256_xor_si256(w, _mm256_set1_epi8(i8::MIN));
            _mm256_dpbusd_epi32(_mm256_loadu_si256(bias.as_ptr().cast()), u, y)
        }
    }
}

/// The run of `R` activation rows for weights of type `t` at level `D`
/// (the [`Avx512Vnni`] level runs its own kernels, [`super::avx512`]).
pub(super) fn run_for<D: Dot, const R: usize>(t: GgmlType) -> Option<Run<R>> {
    match t {
        GgmlType::Q4_0 => Some(run_q4_0::<D, R>),
        GgmlType::Q8_0 => Some(run_q8_0::<D, R>),
        GgmlType::Q4_K => Some(run_q4_k::<D, R>),
        _ => None,
    }
}

/// A [`Run`] of `kernel` inside `D::enter`.
macro_rules! run_fn {
    ($name:ident, $kernel:ident) => {
        #[allow(clippy::too_many_arguments)] // a Run
        fn $name<D: Dot, const R: usize>(
            dec: &RowDecoder<'_>,
            e: usize,
            n0: usize,
            n: usize,
            acts: &[&QRow; R],
            scratch: &mut [f32],
            out: &mut [f32],
            stride: usize,
        ) -> Result<()> {
            D::enter(
                #[inline(always)]
                move || {
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
                        |r, a, s, o| $kernel::<D, R>(r, a, s, o),
                    )
                },
            )
        }
    };
}

run_fn!(run_q4_0, q4_0);
run_fn!(run_q8_0, q8_0);
run_fn!(run_q4_k, q4_k);

/// 32 bytes.
#[inline(always)]
pub(super) fn load256<T>(v: &[T; 32]) -> __m256i
where
    T: Copy,
{
    // SAFETY: `v` is 32 readable bytes (`T` is a byte type at every
    // caller), unaligned loads are allowed; the level was detected (module
    // doc).
    unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
}

/// 8 `i32`.
#[inline(always)]
pub(super) fn load_i32x8(v: &[i32; 8]) -> __m256i {
    // SAFETY: `v` is 32 readable bytes, unaligned loads are allowed; the
    // level was detected (module doc).
    unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
}

/// `l << sh`, lane by lane.
#[inline(always)]
pub(super) fn shift(l: __m256i, sh: &[u32; 8]) -> __m256i {
    // SAFETY: `sh` is 32 readable bytes; the level was detected (module
    // doc).
    unsafe { _mm256_sllv_epi32(l, _mm256_loadu_si256(sh.as_ptr().cast())) }
}

/// Lanes as an array.
#[inline(always)]
pub(super) fn to_array(v: __m256) -> [f32; 8] {
    let mut a = [0f32; 8];
    // SAFETY: `a` is 8 writable f32, unaligned stores are allowed; the level
    // was detected (module doc).
    unsafe { _mm256_storeu_ps(a.as_mut_ptr(), v) };
    a
}

/// `acc + s·f32(l)`, the product rounded, then the sum.
#[inline(always)]
fn scale_add(acc: __m256, s: f32, l: __m256i) -> __m256 {
    // SAFETY: no memory is accessed; the level was detected (module doc).
    unsafe { _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(s), _mm256_cvtepi32_ps(l))) }
}

/// The 32 codes of a Q4_0 block's 16 nibble bytes, in weight order.
#[inline(always)]
pub(super) fn q4_0_codes(qs: &[u8; 16]) -> __m256i {
    // SAFETY: `qs` is 16 readable bytes; the level was detected (module doc).
    unsafe {
        let q = _mm_loadu_si128(qs.as_ptr().cast());
        let both = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
        _mm256_and_si256(both, _mm256_set1_epi8(15))
    }
}

/// The f16 at byte `AT` of each `BS`-byte block of `row`, widened into
/// `w` 8 at a time: packed into two words in general registers, moved to a
/// vector and converted by F16C (exact, as the portable `f16_to_f32` but
/// for NaN payloads, which F16C quiets).
#[inline(always)]
pub(super) fn widen_f16c<const BS: usize, const AT: usize>(
    row: &[u8],
    w: &mut [f32],
) -> Option<()> {
    /// 4 f16 from blocks `i..i + 4` of `c` (zeros past its end; for whole
    /// chunks of 8 blocks the indices are constants and the checks fold).
    #[inline(always)]
    fn word<const BS: usize, const AT: usize>(c: &[u8], i: usize) -> u64 {
        let mut v = 0u64;
        for k in 0..4 {
            if let Some(h) = c.get((i + k) * BS + AT..(i + k) * BS + AT + 2) {
                v |= u64::from(u16::from_le_bytes([h[0], h[1]])) << (16 * k);
            }
        }
        v
    }
    /// 8 widened from the words of blocks `0..4` and `4..8`.
    #[inline(always)]
    fn cvt8(lo: u64, hi: u64) -> [f32; 8] {
        let mut v = [0f32; 8];
        // SAFETY: `v` is 8 writable f32; the level was detected (module doc).
        unsafe {
            let x = _mm_set_epi64x(hi as i64, lo as i64);
            _mm256_storeu_ps(v.as_mut_ptr(), _mm256_cvtph_ps(x));
        }
        v
    }
    let nb = row.len() / BS;
    let w = w.get_mut(..nb)?;
    let chunks = row.chunks_exact(8 * BS);
    let tail = chunks.remainder();
    let mut w8 = w.chunks_exact_mut(8);
    for (c, o) in chunks.zip(w8.by_ref()) {
        o.copy_from_slice(&cvt8(word::<BS, AT>(c, 0), word::<BS, AT>(c, 4)));
    }
    let wt = w8.into_remainder();
    if !wt.is_empty() {
        let v = cvt8(word::<BS, AT>(tail, 0), word::<BS, AT>(tail, 4));
        for (o, v) in wt.iter_mut().zip(v) {
            *o = v;
        }
    }
    Some(())
}

/// The per-block scale products of `BS`-byte blocks with the f16 at `AT`
/// ([`block_scales`] with [`widen_f16c`]).
#[inline(always)]
pub(super) fn scales<'s, const R: usize, const BS: usize, const AT: usize>(
    row: &[u8],
    acts: &[&QRow; R],
    scratch: &'s mut [f32],
) -> Option<&'s [f32]> {
    block_scales(
        row,
        BS,
        AT,
        acts,
        scratch,
        #[inline(always)]
        |r, _, _, w| widen_f16c::<BS, AT>(r, w),
    )
}

/// Runs `lanes(b, blk, t)` (the integer lanes of block `b`, bytes `blk`, for
/// activation row `t`) over the 32-weight blocks of `row`, scaling them
/// into the accumulators of even and odd blocks, and finishes the `R` dots.
/// `st` holds the scale products (`R·nb`).
#[inline(always)]
fn blocks32<const R: usize, const BS: usize>(
    row: &[u8],
    st: &[f32],
    out: &mut [f32; R],
    lanes: impl Fn(usize, &[u8; BS], usize) -> __m256i,
) -> Option<()> {
    let nb = row.len() / BS;
    if st.len() < R * nb {
        return None;
    }
    // SAFETY: no memory is accessed; the level was detected (module doc).
    let zero = unsafe { _mm256_setzero_ps() };
    let mut acc = [[zero; R]; 2];
    let pairs = row.chunks_exact(2 * BS);
    let tail = pairs.remainder();
    for (p, two) in pairs.enumerate() {
        let (b0, b1) = two.split_at(BS);
        step(&mut acc[0], st, nb, 2 * p, b0.try_into().ok()?, &lanes);
        step(&mut acc[1], st, nb, 2 * p + 1, b1.try_into().ok()?, &lanes);
    }
    if !tail.is_empty() {
        step(&mut acc[0], st, nb, nb - 1, tail.try_into().ok()?, &lanes);
    }
    for (t, o) in out.iter_mut().enumerate() {
        *o = finish(to_array(acc[0][t]), to_array(acc[1][t]), 0.0);
    }
    Some(())
}

/// Block `b < nb` (bytes `blk`) of [`blocks32`] into `acc`.
#[inline(always)]
fn step<const R: usize, const BS: usize>(
    acc: &mut [__m256; R],
    st: &[f32],
    nb: usize,
    b: usize,
    blk: &[u8; BS],
    lanes: &impl Fn(usize, &[u8; BS], usize) -> __m256i,
) {
    for (t, a) in acc.iter_mut().enumerate() {
        // SAFETY: b < nb and st.len() ≥ R·nb (checked by `blocks32`).
        let s = unsafe { *st.get_unchecked(t * nb + b) };
        *a = scale_add(*a, s, lanes(b, blk, t));
    }
}

/// Q4_0: `vpdpbusd(−8·Σy, q, y)` per block and row.
#[inline(always)]
fn q4_0<D: Dot, const R: usize>(
    row: &[u8],
    acts: &[&QRow; R],
    s: &mut [f32],
    out: &mut [f32; R],
) -> Option<()> {
    const BS: usize = 18;
    let nb = row.len() / BS;
    let rows = Rows::new(acts, nb, true)?;
    let st = scales::<R, BS, 0>(row, acts, s)?;
    blocks32::<R, BS>(
        row,
        st,
        out,
        #[inline(always)]
        |b, blk, t| {
            let q = q4_0_codes(arr16(blk));
            // SAFETY: b < nb, and `rows` holds nb blocks (Rows::new).
            let (y, bias, sh) = unsafe {
                (
                    chunk(rows.y[t], 32 * b),
                    chunk(rows.bias[t], 8 * b),
                    chunk(rows.shift[t], 8 * b),
                )
            };
            shift(D::dpbusd(load_i32x8(bias), q, load256(y)), sh)
        },
    )
}

/// Bytes `2..18` of a block.
#[inline(always)]
fn arr16<const BS: usize>(blk: &[u8; BS]) -> &[u8; 16] {
    const { assert!(BS >= 18) };
    // SAFETY: 2 + 16 ≤ BS (the assertion).
    unsafe { chunk(blk, 2) }
}

/// Bytes `2..34` of a block.
#[inline(always)]
fn arr32<const BS: usize>(blk: &[u8; BS]) -> &[u8; 32] {
    const { assert!(BS >= 34) };
    // SAFETY: 2 + 32 ≤ BS (the assertion).
    unsafe { chunk(blk, 2) }
}

/// Q8_0: [`Dot::dot_i8`] per block and row.
#[inline(always)]
fn q8_0<D: Dot, const R: usize>(
    row: &[u8],
    acts: &[&QRow; R],
    s: &mut [f32],
    out: &mut [f32; R],
) -> Option<()> {
    const BS: usize = 34;
    let nb = row.len() / BS;
    let rows = Rows::new(acts, nb, true)?;
    let st = scales::<R, BS, 0>(row, acts, s)?;
    blocks32::<R, BS>(
        row,
        st,
        out,
        #[inline(always)]
        |b, blk, t| {
            let w = load256(arr32(blk));
            // SAFETY: b < nb, and `rows` holds nb blocks (Rows::new).
            let (y, bias, sh) = unsafe {
                (
                    chunk(rows.y[t], 32 * b),
                    chunk(rows.bias[t], 8 * b),
                    chunk(rows.shift[t], 8 * b),
                )
            };
            shift(D::dot_i8(w, load256(y), bias), sh)
        },
    )
}

/// `vpshufb` patterns that broadcast 16-bit lane `g` of each 128-bit half.
pub(super) const SCALE_SHUF: [[u8; 32]; 8] = {
    let mut m = [[0u8; 32]; 8];
    let mut g = 0;
    while g < 8 {
        let mut i = 0;
        while i < 16 {
            m[g][2 * i] = (2 * g) as u8;
            m[g][2 * i + 1] = (2 * g + 1) as u8;
            i += 1;
        }
        g += 1;
    }
    m
};

/// 16-bit lane `g` of each half of `sc16`, in every lane.
#[inline(always)]
fn group_scale(sc16: __m256i, g: usize) -> __m256i {
    // SAFETY: no memory is accessed but the pattern; the level was detected
    // (module doc).
    unsafe { _mm256_shuffle_epi8(sc16, load256(&SCALE_SHUF[g & 7])) }
}

/// The 8 group scales of a Q4_K / Q5_K super-block as 16-bit lanes, in
/// both 128-bit halves, and the 8 mins.
#[inline(always)]
pub(super) fn k4_scales16(blk: &[u8; 144]) -> (__m256i, [u8; 8]) {
    // SAFETY: bytes 4..16 of a 144-byte block.
    let (sc, m) = k4_scales_mins(unsafe { chunk(blk, 4) });
    // SAFETY: no memory is accessed; the level was detected (module doc).
    let sc16 = unsafe {
        _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(
            u64::from_le_bytes(sc) as i64
        )))
    };
    (sc16, m)
}

/// `Σ_g m_g·Σy_g` of a super-block's mins and the 16 sums of 16 codes.
#[inline(always)]
pub(super) fn k4_mins(m: &[u8; 8], sums: &[i32; 16]) -> i32 {
    let mut summ = 0i32;
    for (g, &m) in m.iter().enumerate() {
        summ += i32::from(m) * (sums[2 * g] + sums[2 * g + 1]);
    }
    summ
}

/// Q4_K: per group of 32, `vpmaddubsw(q, y)` then [`Dot::dpwssd`] with the
/// group scale into the super-block's lanes; the mins from the sums of y.
#[inline(always)]
fn q4_k<D: Dot, const R: usize>(
    row: &[u8],
    acts: &[&QRow; R],
    s: &mut [f32],
    out: &mut [f32; R],
) -> Option<()> {
    const BS: usize = 144;
    let nb = row.len() / BS;
    let rows = Rows::new(acts, nb, false)?;
    let (sd, sm) = s.split_at_mut(s.len() / 2);
    let sd = scales::<R, BS, 0>(row, acts, sd)?;
    let sm = scales::<R, BS, 2>(row, acts, sm)?;
    // SAFETY: no memory is accessed; the level was detected (module doc).
    let (zero, zero_i, m4) = unsafe {
        (
            _mm256_setzero_ps(),
            _mm256_setzero_si256(),
            _mm256_set1_epi8(15),
        )
    };
    let mut acc = [[zero; R]; 2];
    let mut off = [0f32; R];
    for (b, blk) in row.chunks_exact(BS).enumerate() {
        let blk: &[u8; BS] = blk.try_into().ok()?;
        let (sc16, m) = k4_scales16(blk);
        let mut li = [zero_i; R];
        for c in 0..4 {
            // SAFETY: 16 + 32·4 = 144 bytes.
            let q = load256(unsafe { chunk::<u8, 32>(blk, 16 + 32 * c) });
            // SAFETY: no memory is accessed; the level was detected.
            let (lo, hi) = unsafe {
                (
                    _mm256_and_si256(q, m4),
                    _mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                )
            };
            let (s_lo, s_hi) = (group_scale(sc16, 2 * c), group_scale(sc16, 2 * c + 1));
            for ((l, y), p2) in li.iter_mut().zip(rows.y).zip(rows.pow2) {
                let at = 256 * b + 64 * c;
                // SAFETY: b < nb, and `rows` holds nb blocks (Rows::new).
                let (y_lo, y_hi, p2_lo, p2_hi) = unsafe {
                    (
                        chunk(y, at),
                        chunk(y, at + 32),
                        chunk::<i16, 16>(p2, at / 2),
                        chunk::<i16, 16>(p2, at / 2 + 16),
                    )
                };
                // The pair sums (≤ 2·15·127) times 2^shift (≤ 8) fit 16 bits.
                // SAFETY: the multipliers are 32 readable bytes each; the
                // level was detected.
                let (p_lo, p_hi) = unsafe {
                    (
                        _mm256_mullo_epi16(
                            _mm256_maddubs_epi16(lo, load256(y_lo)),
                            _mm256_loadu_si256(p2_lo.as_ptr().cast()),
                        ),
                        _mm256_mullo_epi16(
                            _mm256_maddubs_epi16(hi, load256(y_hi)),
                            _mm256_loadu_si256(p2_hi.as_ptr().cast()),
                        ),
                    )
                };
                *l = D::dpwssd(D::dpwssd(*l, p_lo, s_lo), p_hi, s_hi);
            }
        }
        let acc = &mut acc[b & 1];
        for t in 0..R {
            // SAFETY: b < nb; `sd`, `sm` hold R·nb and `rows` nb blocks.
            let (s_d, s_m, sums) = unsafe {
                (
                    *sd.get_unchecked(t * nb + b),
                    *sm.get_unchecked(t * nb + b),
                    chunk(rows.sums[t], 16 * b),
                )
            };
            acc[t] = scale_add(acc[t], s_d, li[t]);
            off[t] += s_m * k4_mins(&m, sums) as f32;
        }
    }
    for (t, o) in out.iter_mut().enumerate() {
        *o = finish(to_array(acc[0][t]), to_array(acc[1][t]), off[t]);
    }
    Some(())
}
