//! 8-lane vectors for the fused dot kernels, one implementation per
//! [`SimdLevel`](crate::cpu::SimdLevel): [`Simd::F8`] (f32) and [`Simd::U8`]
//! (u32).
//!
//! The kernels are generic over a [`Simd`] level and monomorphized once per
//! level; [`dot_rows`](super::dot_rows) picks the level once per call from
//! [`simd_level`](crate::cpu::simd_level). [`Avx2`]: each operation is one
//! AVX2 / FMA / F16C intrinsic, and the kernels' bodies run inside
//! [`Simd::enter`], a function compiled with those features, into which the
//! `#[inline(always)]` operations (and the intrinsics) inline. [`Portable`]:
//! the same operations lane by lane on arrays, in the same order.
//!
//! Numerics: both levels sum in the same order; [`Avx2`] multiplies and adds
//! in one rounding (FMA), [`Portable`] does so only where the build itself
//! has FMA (`-C target-feature=+fma`, as with `-C target-cpu=x86-64-v3`),
//! else it rounds the product and the sum separately. So the two levels give
//! bit-identical results in an FMA build, and results that differ in the
//! last bits otherwise (both within the tests' tolerance of an f64 oracle).
//!
//! The kernels widen codes from bytes: [`U8Ops::bytes`] zero-extends 8 bytes
//! to 8 lanes (`vpmovzxbd` from memory), nibbles and bit planes are split with
//! shifts and masks in the integer lanes, and [`U8Ops::to_f32`] converts them.

#[cfg(target_arch = "x86_64")]
mod avx2;
mod portable;

#[cfg(target_arch = "x86_64")]
pub(super) use avx2::Avx2;
pub(super) use portable::Portable;

use half::f16;

/// A level's 8 f32 lanes.
pub(super) trait F8Ops: Copy {
    /// All lanes zero.
    fn zero() -> Self;
    /// All lanes `v`.
    fn splat(v: f32) -> Self;
    /// The 8 values.
    fn load(x: &[f32; 8]) -> Self;
    /// The lanes, in order.
    fn to_array(self) -> [f32; 8];
    /// `self · b`.
    fn mul(self, b: Self) -> Self;
    /// `self · b + c` (one rounding where the level has FMA; see the module doc).
    fn fma(self, b: Self, c: Self) -> Self;
    /// `self + b`.
    fn add(self, b: Self) -> Self;
    /// Sum of the lanes: `((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7))`.
    fn sum(self) -> f32;
}

/// A level's 8 u32 lanes.
pub(super) trait U8Ops: Copy {
    /// The f32 vector of the same level.
    type F8;
    /// 8 bytes zero-extended.
    fn bytes(b: &[u8; 8]) -> Self;
    /// The 8 bytes of `v` (little-endian) zero-extended.
    fn from_u64(v: u64) -> Self;
    /// 8 signed bytes sign-extended (as two's complement u32).
    fn signed_bytes(b: &[i8; 8]) -> Self;
    /// All lanes `v`.
    fn splat(v: u32) -> Self;
    /// `self & m`.
    fn and(self, m: u32) -> Self;
    /// `self | b`.
    fn or(self, b: Self) -> Self;
    /// `self − c` (wrapping).
    fn sub(self, c: u32) -> Self;
    /// `self >> n` (n < 32).
    fn shr(self, n: u32) -> Self;
    /// `self << n` (n < 32).
    fn shl(self, n: u32) -> Self;
    /// Lane `j` shifted right by `j` (bit `j` of a splat to bit 0).
    fn shr_by_lane(self) -> Self;
    /// The lanes as i32, converted to f32 (exact below 2²⁴).
    fn to_f32(self) -> Self::F8;
    /// `table[lane]` for lanes below 16 (the non-linear 4-bit codes of
    /// IQ4_NL, IQ4_XS, MXFP4); higher bits of a lane are ignored.
    fn lookup16(self, table: &[f32; 16]) -> Self::F8;
    /// The e4m3 (OCP e4m3fn, MLX's `from_fp8`) value of the low byte of
    /// each lane, exact: [`e4m3_to_f32`](crate::format::mlxfp::e4m3_to_f32),
    /// 0x7F and 0xFF NaN.
    fn e4m3(self) -> Self::F8;
}

/// A level of the kernels: its vectors, its scalar multiply-add, and the
/// compiled context its kernel bodies run in.
pub(super) trait Simd: Copy + 'static {
    /// 8 f32 lanes.
    type F8: F8Ops;
    /// 8 u32 lanes.
    type U8: U8Ops<F8 = Self::F8>;

    /// `a·b + c`: one rounding where the level has FMA (see the module doc).
    fn fma(a: f32, b: f32, c: f32) -> f32;

    /// The f16 values at bytes 0..2 and 2..4 of `b`, widened (exact).
    fn f16_pair(b: &[u8; 8]) -> (f32, f32);

    /// 8 f16 values widened (exact).
    fn f16x8(h: &[f16; 8]) -> [f32; 8];

    /// Runs `f` in a function compiled for this level (with its target
    /// features), kept out of line: the kernels' out-of-line bodies, so that
    /// the `#[inline(always)]` operations they call inline into code that
    /// may use the level's instructions. Pass `#[inline(always)]` closures,
    /// and write helpers the body calls more than once as `#[inline(always)]`
    /// functions, not closures: a closure LLVM leaves out of line is compiled
    /// without the features, and its intrinsics become calls (40× slower).
    fn enter<R>(f: impl FnOnce() -> R) -> R;
}

/// `Σ q·x` of a 32-weight slice, by lane, in one chain.
#[inline(always)]
pub(super) fn whole<F: F8Ops>(q: [F; 4], x: &[f32; 32]) -> F {
    let xv = |i: usize| {
        x.get(8 * i..8 * i + 8)
            .and_then(super::arr)
            .map_or(F::zero(), F::load)
    };
    let p = q[0].mul(xv(0));
    let p = q[1].fma(xv(1), p);
    let p = q[2].fma(xv(2), p);
    q[3].fma(xv(3), p)
}
