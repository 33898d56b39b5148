//! 8-lane vectors for the fused dot kernels: [`F8`] (f32) and [`U8`] (u32).
//!
//! Built with AVX2 + FMA (the project's `x86-64-v3` target), each operation
//! is one intrinsic; otherwise the same operations run lane by lane on
//! arrays, in the same order with the same roundings (`mul_add` where the
//! build has FMA), so both give the same results.
//!
//! The kernels widen codes from bytes: [`U8::bytes`] zero-extends 8 bytes to
//! 8 lanes (`vpmovzxbd` from memory), nibbles and bit planes are split with
//! shifts and masks in the integer lanes, and [`U8::to_f32`] converts them.

pub(super) use imp::{f16_pair, F8, U8};

/// `Σ q·x` of a 32-weight slice, by lane, in one chain.
#[inline(always)]
pub(super) fn whole(q: [F8; 4], x: &[f32; 32]) -> F8 {
    let xv = |i: usize| {
        x.get(8 * i..8 * i + 8)
            .and_then(super::arr)
            .map_or(F8::zero(), F8::load)
    };
    let p = q[0].mul(xv(0));
    let p = q[1].fma(xv(1), p);
    let p = q[2].fma(xv(2), p);
    q[3].fma(xv(3), p)
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
#[allow(unused_unsafe)] // value intrinsics are safe from Rust 1.87, unsafe before
mod imp {
    use std::arch::x86_64::*;

    /// 8 f32 lanes.
    #[derive(Clone, Copy)]
    pub struct F8(__m256);

    /// 8 u32 lanes.
    #[derive(Clone, Copy)]
    pub struct U8(__m256i);

    /// The f16 values at bytes 0..2 and 2..4 of `b`, widened (exact).
    ///
    /// F16C straight from memory: a load writes the whole register, whereas
    /// converting a value already in a general register inserts it into
    /// some other register, which LLVM may pick from a live accumulator (a
    /// false dependency chaining every block to the previous one). (Where
    /// only the first value is used, LLVM may still narrow the load to such
    /// an insert.)
    #[inline(always)]
    pub fn f16_pair(b: &[u8; 8]) -> (f32, f32) {
        // SAFETY: `b` is 8 readable bytes (`vcvtph2ps xmm, m64` reads 8);
        // F16C is enabled by the build.
        unsafe {
            let v = _mm_cvtph_ps(_mm_loadl_epi64(b.as_ptr().cast()));
            (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
        }
    }

    impl F8 {
        /// All lanes zero.
        #[inline(always)]
        pub fn zero() -> F8 {
            // SAFETY: the build enables AVX2; no memory is accessed.
            F8(unsafe { _mm256_setzero_ps() })
        }

        /// All lanes `v`.
        #[inline(always)]
        pub fn splat(v: f32) -> F8 {
            // SAFETY: as in `zero`.
            F8(unsafe { _mm256_set1_ps(v) })
        }

        /// The 8 values.
        #[inline(always)]
        pub fn load(x: &[f32; 8]) -> F8 {
            // SAFETY: `x` is 8 readable f32; unaligned loads are allowed.
            F8(unsafe { _mm256_loadu_ps(x.as_ptr()) })
        }

        /// The lanes, in order.
        #[inline(always)]
        pub fn to_array(self) -> [f32; 8] {
            let mut a = [0f32; 8];
            // SAFETY: `a` is 8 writable f32; unaligned stores are allowed.
            unsafe { _mm256_storeu_ps(a.as_mut_ptr(), self.0) };
            a
        }

        /// `self · b`.
        #[inline(always)]
        pub fn mul(self, b: F8) -> F8 {
            // SAFETY: as in `zero`.
            F8(unsafe { _mm256_mul_ps(self.0, b.0) })
        }

        /// `self · b + c` (one rounding).
        #[inline(always)]
        pub fn fma(self, b: F8, c: F8) -> F8 {
            // SAFETY: the build enables FMA; no memory is accessed.
            F8(unsafe { _mm256_fmadd_ps(self.0, b.0, c.0) })
        }

        /// `self + b`.
        #[inline(always)]
        pub fn add(self, b: F8) -> F8 {
            // SAFETY: as in `zero`.
            F8(unsafe { _mm256_add_ps(self.0, b.0) })
        }

        /// Sum of the lanes: `((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7))`.
        #[inline(always)]
        pub fn sum(self) -> f32 {
            // SAFETY: as in `zero`.
            unsafe {
                let h = _mm_add_ps(
                    _mm256_castps256_ps128(self.0),
                    _mm256_extractf128_ps(self.0, 1),
                );
                let q = _mm_add_ps(h, _mm_movehl_ps(h, h));
                _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)))
            }
        }
    }

    impl U8 {
        /// 8 bytes zero-extended.
        #[inline(always)]
        pub fn bytes(b: &[u8; 8]) -> U8 {
            // SAFETY: `b` is 8 readable bytes (`movq` reads exactly 8).
            U8(unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(b.as_ptr().cast())) })
        }

        /// The 8 bytes of `v` (little-endian) zero-extended.
        #[inline(always)]
        pub fn from_u64(v: u64) -> U8 {
            // SAFETY: no memory is accessed.
            U8(unsafe { _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64)) })
        }

        /// 8 signed bytes sign-extended (as two's complement u32).
        #[inline(always)]
        pub fn signed_bytes(b: &[i8; 8]) -> U8 {
            // SAFETY: as in `bytes`.
            U8(unsafe { _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.as_ptr().cast())) })
        }

        /// All lanes `v`.
        #[inline(always)]
        pub fn splat(v: u32) -> U8 {
            // SAFETY: no memory is accessed.
            U8(unsafe { _mm256_set1_epi32(v as i32) })
        }

        /// `self & m`.
        #[inline(always)]
        pub fn and(self, m: u32) -> U8 {
            // SAFETY: as in `splat`.
            U8(unsafe { _mm256_and_si256(self.0, _mm256_set1_epi32(m as i32)) })
        }

        /// `self | b`.
        #[inline(always)]
        pub fn or(self, b: U8) -> U8 {
            // SAFETY: as in `splat`.
            U8(unsafe { _mm256_or_si256(self.0, b.0) })
        }

        /// `self − c` (wrapping).
        #[inline(always)]
        pub fn sub(self, c: u32) -> U8 {
            // SAFETY: as in `splat`.
            U8(unsafe { _mm256_sub_epi32(self.0, _mm256_set1_epi32(c as i32)) })
        }

        /// `self >> n` (n < 32).
        #[inline(always)]
        pub fn shr(self, n: u32) -> U8 {
            // SAFETY: as in `splat`.
            U8(unsafe { _mm256_srl_epi32(self.0, _mm_cvtsi32_si128(n as i32)) })
        }

        /// `self << n` (n < 32).
        #[inline(always)]
        pub fn shl(self, n: u32) -> U8 {
            // SAFETY: as in `splat`.
            U8(unsafe { _mm256_sll_epi32(self.0, _mm_cvtsi32_si128(n as i32)) })
        }

        /// Lane `j` shifted right by `j` (bit `j` of a splat to bit 0).
        #[inline(always)]
        pub fn shr_by_lane(self) -> U8 {
            // SAFETY: as in `splat`.
            U8(unsafe { _mm256_srlv_epi32(self.0, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)) })
        }

        /// The lanes as i32, converted to f32 (exact below 2²⁴).
        #[inline(always)]
        pub fn to_f32(self) -> F8 {
            // SAFETY: as in `splat`.
            F8(unsafe { _mm256_cvtepi32_ps(self.0) })
        }
    }
}

#[cfg(not(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
)))]
mod imp {
    /// 8 f32 lanes.
    #[derive(Clone, Copy)]
    pub struct F8([f32; 8]);

    /// 8 u32 lanes.
    #[derive(Clone, Copy)]
    pub struct U8([u32; 8]);

    /// The f16 values at bytes 0..2 and 2..4 of `b`, widened (exact).
    #[inline(always)]
    pub fn f16_pair(b: &[u8; 8]) -> (f32, f32) {
        let h = |i: usize| half::f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]]));
        (
            super::super::f16_to_f32(h(0), false),
            super::super::f16_to_f32(h(2), false),
        )
    }

    #[inline(always)]
    fn fma1(a: f32, b: f32, c: f32) -> f32 {
        super::super::fma(a, b, c)
    }

    impl F8 {
        /// All lanes zero.
        #[inline(always)]
        pub fn zero() -> F8 {
            F8([0.0; 8])
        }

        /// All lanes `v`.
        #[inline(always)]
        pub fn splat(v: f32) -> F8 {
            F8([v; 8])
        }

        /// The 8 values.
        #[inline(always)]
        pub fn load(x: &[f32; 8]) -> F8 {
            F8(*x)
        }

        /// The lanes, in order.
        #[inline(always)]
        pub fn to_array(self) -> [f32; 8] {
            self.0
        }

        /// `self · b`.
        #[inline(always)]
        pub fn mul(self, b: F8) -> F8 {
            F8(std::array::from_fn(|j| self.0[j] * b.0[j]))
        }

        /// `self · b + c` (one rounding where the build has FMA).
        #[inline(always)]
        pub fn fma(self, b: F8, c: F8) -> F8 {
            F8(std::array::from_fn(|j| fma1(self.0[j], b.0[j], c.0[j])))
        }

        /// `self + b`.
        #[inline(always)]
        pub fn add(self, b: F8) -> F8 {
            F8(std::array::from_fn(|j| self.0[j] + b.0[j]))
        }

        /// Sum of the lanes: `((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7))`.
        #[inline(always)]
        pub fn sum(self) -> f32 {
            let a = self.0;
            let h: [f32; 4] = std::array::from_fn(|j| a[j] + a[4 + j]);
            let (q0, q1) = (h[0] + h[2], h[1] + h[3]);
            q0 + q1
        }
    }

    impl U8 {
        /// 8 bytes zero-extended.
        #[inline(always)]
        pub fn bytes(b: &[u8; 8]) -> U8 {
            U8(b.map(u32::from))
        }

        /// The 8 bytes of `v` (little-endian) zero-extended.
        #[inline(always)]
        pub fn from_u64(v: u64) -> U8 {
            U8(v.to_le_bytes().map(u32::from))
        }

        /// 8 signed bytes sign-extended (as two's complement u32).
        #[inline(always)]
        pub fn signed_bytes(b: &[i8; 8]) -> U8 {
            U8(b.map(|v| i32::from(v) as u32))
        }

        /// All lanes `v`.
        #[inline(always)]
        pub fn splat(v: u32) -> U8 {
            U8([v; 8])
        }

        /// `self & m`.
        #[inline(always)]
        pub fn and(self, m: u32) -> U8 {
            U8(self.0.map(|v| v & m))
        }

        /// `self | b`.
        #[inline(always)]
        pub fn or(self, b: U8) -> U8 {
            U8(std::array::from_fn(|j| self.0[j] | b.0[j]))
        }

        /// `self − c` (wrapping).
        #[inline(always)]
        pub fn sub(self, c: u32) -> U8 {
            U8(self.0.map(|v| v.wrapping_sub(c)))
        }

        /// `self >> n` (n < 32).
        #[inline(always)]
        pub fn shr(self, n: u32) -> U8 {
            U8(self.0.map(|v| v >> n))
        }

        /// `self << n` (n < 32).
        #[inline(always)]
        pub fn shl(self, n: u32) -> U8 {
            U8(self.0.map(|v| v << n))
        }

        /// Lane `j` shifted right by `j` (bit `j` of a splat to bit 0).
        #[inline(always)]
        pub fn shr_by_lane(self) -> U8 {
            U8(std::array::from_fn(|j| self.0[j] >> j))
        }

        /// The lanes as i32, converted to f32 (exact below 2²⁴).
        #[inline(always)]
        pub fn to_f32(self) -> F8 {
            F8(self.0.map(|v| v as i32 as f32))
        }
    }
}
