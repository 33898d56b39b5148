//! The [`Portable`] level: the operations lane by lane on arrays, for any
//! CPU; LLVM vectorizes them as far as the build's target features allow.

use super::{F8Ops, Simd, U8Ops};
use half::f16;

/// Plain Rust, for any CPU.
#[derive(Clone, Copy)]
pub(in super::super) struct Portable;

/// 8 f32 lanes.
#[derive(Clone, Copy)]
pub(in super::super) struct F8([f32; 8]);

/// 8 u32 lanes.
#[derive(Clone, Copy)]
pub(in super::super) struct U8([u32; 8]);

impl Simd for Portable {
    type F8 = F8;
    type U8 = U8;

    /// Fused (one rounding) only where the build has FMA: elsewhere
    /// `mul_add` would be a libm call, far slower than the two roundings.
    #[inline(always)]
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        if cfg!(target_feature = "fma") {
            a.mul_add(b, c)
        } else {
            a * b + c
        }
    }

    #[inline(always)]
    fn f16_pair(b: &[u8; 8]) -> (f32, f32) {
        let h = |i: usize| f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]]));
        (
            super::super::f16_to_f32(h(0), false),
            super::super::f16_to_f32(h(2), false),
        )
    }

    #[inline(always)]
    fn f16x8(h: &[f16; 8]) -> [f32; 8] {
        h.map(|v| super::super::f16_to_f32(v, false))
    }

    #[inline(always)]
    fn enter<R>(f: impl FnOnce() -> R) -> R {
        out_of_line(f)
    }
}

/// Calls `f` out of line (as [`Simd::enter`] of the other levels does).
#[inline(never)]
fn out_of_line<R>(f: impl FnOnce() -> R) -> R {
    f()
}

impl F8Ops for F8 {
    #[inline(always)]
    fn zero() -> F8 {
        F8([0.0; 8])
    }

    #[inline(always)]
    fn splat(v: f32) -> F8 {
        F8([v; 8])
    }

    #[inline(always)]
    fn load(x: &[f32; 8]) -> F8 {
        F8(*x)
    }

    #[inline(always)]
    fn to_array(self) -> [f32; 8] {
        self.0
    }

    #[inline(always)]
    fn mul(self, b: F8) -> F8 {
        F8(std::array::from_fn(|j| self.0[j] * b.0[j]))
    }

    #[inline(always)]
    fn fma(self, b: F8, c: F8) -> F8 {
        F8(std::array::from_fn(|j| {
            Portable::fma(self.0[j], b.0[j], c.0[j])
        }))
    }

    #[inline(always)]
    fn add(self, b: F8) -> F8 {
        F8(std::array::from_fn(|j| self.0[j] + b.0[j]))
    }

    #[inline(always)]
    fn sum(self) -> f32 {
        let a = self.0;
        let h: [f32; 4] = std::array::from_fn(|j| a[j] + a[4 + j]);
        let (q0, q1) = (h[0] + h[2], h[1] + h[3]);
        q0 + q1
    }
}

impl U8Ops for U8 {
    type F8 = F8;

    #[inline(always)]
    fn bytes(b: &[u8; 8]) -> U8 {
        U8(b.map(u32::from))
    }

    #[inline(always)]
    fn from_u64(v: u64) -> U8 {
        U8(v.to_le_bytes().map(u32::from))
    }

    #[inline(always)]
    fn signed_bytes(b: &[i8; 8]) -> U8 {
        U8(b.map(|v| i32::from(v) as u32))
    }

    #[inline(always)]
    fn splat(v: u32) -> U8 {
        U8([v; 8])
    }

    #[inline(always)]
    fn and(self, m: u32) -> U8 {
        U8(self.0.map(|v| v & m))
    }

    #[inline(always)]
    fn or(self, b: U8) -> U8 {
        U8(std::array::from_fn(|j| self.0[j] | b.0[j]))
    }

    #[inline(always)]
    fn sub(self, c: u32) -> U8 {
        U8(self.0.map(|v| v.wrapping_sub(c)))
    }

    #[inline(always)]
    fn shr(self, n: u32) -> U8 {
        U8(self.0.map(|v| v >> n))
    }

    #[inline(always)]
    fn shl(self, n: u32) -> U8 {
        U8(self.0.map(|v| v << n))
    }

    #[inline(always)]
    fn shr_by_lane(self) -> U8 {
        U8(std::array::from_fn(|j| self.0[j] >> j))
    }

    #[inline(always)]
    fn to_f32(self) -> F8 {
        F8(self.0.map(|v| v as i32 as f32))
    }

    #[inline(always)]
    fn lookup16(self, table: &[f32; 16]) -> F8 {
        F8(self.0.map(|v| table[(v & 15) as usize]))
    }

    #[inline(always)]
    fn e4m3(self) -> F8 {
        F8(self.0.map(|v| crate::format::mlxfp::e4m3_to_f32(v as u8)))
    }
}
