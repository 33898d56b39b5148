//! The [`Avx2`] level: AVX2 + FMA + F16C intrinsics, one per operation.
//!
//! # Safety
//!
//! The intrinsics need the CPU to have AVX2, FMA and F16C. Every value of
//! this module's types is made inside [`Avx2::enter`], and the kernels
//! instantiated for [`Avx2`] are run only by
//! [`dot_rows_at`](super::super::dot_rows_at) with a level that has AVX2
//! (`SimdLevel::has_avx2`), which it accepts only if
//! `SimdLevel::is_supported` detected those features at run time. That is
//! what the `SAFETY` comments below mean by "the level was detected".

use super::{F8Ops, Simd, U8Ops};
use half::f16;
use std::arch::x86_64::*;

/// The AVX2 + FMA + F16C level (x86-64-v3's vector features).
#[derive(Clone, Copy)]
pub(in super::super) struct Avx2;

/// 8 f32 lanes.
#[derive(Clone, Copy)]
pub(in super::super) struct F8(__m256);

/// 8 u32 lanes.
#[derive(Clone, Copy)]
pub(in super::super) struct U8(__m256i);

/// Calls `f` in a function compiled with AVX2, FMA and F16C.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline(never)]
unsafe fn with_avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

impl Simd for Avx2 {
    type F8 = F8;
    type U8 = U8;

    #[inline(always)]
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        // Inlined into `enter`'s body, which has FMA: one `vfmadd`.
        a.mul_add(b, c)
    }

    /// F16C straight from memory: a load writes the whole register, whereas
    /// converting a value already in a general register inserts it into
    /// some other register, which LLVM may pick from a live accumulator (a
    /// false dependency chaining every block to the previous one). (Where
    /// only the first value is used, LLVM may still narrow the load to such
    /// an insert.)
    #[inline(always)]
    fn f16_pair(b: &[u8; 8]) -> (f32, f32) {
        // SAFETY: `b` is 8 readable bytes (`vcvtph2ps xmm, m64` reads 8);
        // the level was detected (module doc).
        unsafe {
            let v = _mm_cvtph_ps(_mm_loadl_epi64(b.as_ptr().cast()));
            (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
        }
    }

    #[inline(always)]
    fn f16x8(h: &[f16; 8]) -> [f32; 8] {
        // SAFETY: `h` is 16 readable bytes, unaligned loads are allowed;
        // the level was detected (module doc).
        F8(unsafe { _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr().cast())) }).to_array()
    }

    #[inline(always)]
    fn enter<R>(f: impl FnOnce() -> R) -> R {
        // SAFETY: the level was detected (module doc).
        unsafe { with_avx2(f) }
    }
}

impl F8Ops for F8 {
    #[inline(always)]
    fn zero() -> F8 {
        // SAFETY: no memory is accessed; the level was detected (module doc).
        F8(unsafe { _mm256_setzero_ps() })
    }

    #[inline(always)]
    fn splat(v: f32) -> F8 {
        // SAFETY: as in `zero`.
        F8(unsafe { _mm256_set1_ps(v) })
    }

    #[inline(always)]
    fn load(x: &[f32; 8]) -> F8 {
        // SAFETY: `x` is 8 readable f32, unaligned loads are allowed; the
        // level was detected (module doc).
        F8(unsafe { _mm256_loadu_ps(x.as_ptr()) })
    }

    #[inline(always)]
    fn to_array(self) -> [f32; 8] {
        let mut a = [0f32; 8];
        // SAFETY: `a` is 8 writable f32, unaligned stores are allowed; the
        // level was detected (module doc).
        unsafe { _mm256_storeu_ps(a.as_mut_ptr(), self.0) };
        a
    }

    #[inline(always)]
    fn mul(self, b: F8) -> F8 {
        // SAFETY: as in `zero`.
        F8(unsafe { _mm256_mul_ps(self.0, b.0) })
    }

    #[inline(always)]
    fn fma(self, b: F8, c: F8) -> F8 {
        // SAFETY: as in `zero`.
        F8(unsafe { _mm256_fmadd_ps(self.0, b.0, c.0) })
    }

    #[inline(always)]
    fn add(self, b: F8) -> F8 {
        // SAFETY: as in `zero`.
        F8(unsafe { _mm256_add_ps(self.0, b.0) })
    }

    #[inline(always)]
    fn sum(self) -> f32 {
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

impl U8Ops for U8 {
    type F8 = F8;

    #[inline(always)]
    fn bytes(b: &[u8; 8]) -> U8 {
        // SAFETY: `b` is 8 readable bytes (`movq` reads exactly 8); the
        // level was detected (module doc).
        U8(unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(b.as_ptr().cast())) })
    }

    #[inline(always)]
    fn from_u64(v: u64) -> U8 {
        // SAFETY: no memory is accessed; the level was detected (module doc).
        U8(unsafe { _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64)) })
    }

    #[inline(always)]
    fn signed_bytes(b: &[i8; 8]) -> U8 {
        // SAFETY: as in `bytes`.
        U8(unsafe { _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.as_ptr().cast())) })
    }

    #[inline(always)]
    fn splat(v: u32) -> U8 {
        // SAFETY: as in `from_u64`.
        U8(unsafe { _mm256_set1_epi32(v as i32) })
    }

    #[inline(always)]
    fn and(self, m: u32) -> U8 {
        // SAFETY: as in `from_u64`.
        U8(unsafe { _mm256_and_si256(self.0, _mm256_set1_epi32(m as i32)) })
    }

    #[inline(always)]
    fn or(self, b: U8) -> U8 {
        // SAFETY: as in `from_u64`.
        U8(unsafe { _mm256_or_si256(self.0, b.0) })
    }

    #[inline(always)]
    fn sub(self, c: u32) -> U8 {
        // SAFETY: as in `from_u64`.
        U8(unsafe { _mm256_sub_epi32(self.0, _mm256_set1_epi32(c as i32)) })
    }

    #[inline(always)]
    fn shr(self, n: u32) -> U8 {
        // SAFETY: as in `from_u64`.
        U8(unsafe { _mm256_srl_epi32(self.0, _mm_cvtsi32_si128(n as i32)) })
    }

    #[inline(always)]
    fn shl(self, n: u32) -> U8 {
        // SAFETY: as in `from_u64`.
        U8(unsafe { _mm256_sll_epi32(self.0, _mm_cvtsi32_si128(n as i32)) })
    }

    #[inline(always)]
    fn shr_by_lane(self) -> U8 {
        // SAFETY: as in `from_u64`.
        U8(unsafe { _mm256_srlv_epi32(self.0, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)) })
    }

    #[inline(always)]
    fn to_f32(self) -> F8 {
        // SAFETY: as in `from_u64`.
        F8(unsafe { _mm256_cvtepi32_ps(self.0) })
    }

    /// Two 8-entry permutes (`vpermps`, index bits 0–2) of the table's
    /// halves, blended on index bit 3 (moved to the sign bit).
    #[inline(always)]
    fn lookup16(self, table: &[f32; 16]) -> F8 {
        // SAFETY: `table` is 16 readable f32 (two unaligned 8-lane loads);
        // the level was detected (module doc).
        F8(unsafe {
            let lo = _mm256_loadu_ps(table.as_ptr());
            let hi = _mm256_loadu_ps(table.as_ptr().add(8));
            let a = _mm256_permutevar8x32_ps(lo, self.0);
            let b = _mm256_permutevar8x32_ps(hi, self.0);
            _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(self.0, 28)))
        })
    }

    /// Normal codes (exponent ≥ 1) as f32 bits built in integers: the 7
    /// magnitude bits moved to bits 20..26 and the exponent rebiased by
    /// 120; subnormal codes (exponent 0) as `f32(m)·2⁻⁹`; the sign or'ed in,
    /// and all ones (a NaN) into the NaN codes (as `e4m3_to_f32`). No
    /// float operation sees a subnormal: the earlier form (the bits as a
    /// tiny f32, times 2¹²⁰) multiplied subnormal f32s for exponent-0
    /// codes, a microcode assist per vector on Intel cores that made FP8
    /// rows ~10× slower than their memory.
    #[inline(always)]
    fn e4m3(self) -> F8 {
        // SAFETY: no memory is accessed; the level was detected (module doc).
        F8(unsafe {
            let set = _mm256_set1_epi32;
            let a = _mm256_and_si256(self.0, set(0x7F));
            let normal = _mm256_add_epi32(_mm256_slli_epi32(a, 20), set(120 << 23));
            let sub = _mm256_mul_ps(
                _mm256_cvtepi32_ps(_mm256_and_si256(self.0, set(7))),
                _mm256_set1_ps(f32::from_bits(0x3B00_0000)),
            );
            let mag = _mm256_blendv_ps(
                _mm256_castsi256_ps(normal),
                sub,
                _mm256_castsi256_ps(_mm256_cmpgt_epi32(set(8), a)),
            );
            let sign = _mm256_slli_epi32(_mm256_and_si256(self.0, set(0x80)), 24);
            let nan = _mm256_cmpeq_epi32(a, set(0x7F));
            _mm256_castsi256_ps(_mm256_or_si256(
                _mm256_or_si256(_mm256_castps_si256(mag), sign),
                nan,
            ))
        })
    }
}
