// A host stand-in for crates/moekit/kernels/common.cuh, so that the format
// decoders of dequant.cuh / dequant_iq.cuh compile with a plain C++17
// compiler (scripts/check_decoders_on_host.sh): the types, and the device
// intrinsics the decoders use, with the same results on finite inputs
// (__fmul_rn / __fadd_rn / __fsub_rn: one IEEE f32 rounding, as the host's
// f32 arithmetic without contraction; compile with -ffp-contract=off).
#pragma once
#include <cstdint>
#include <cstring>

#define __device__
#define __host__
#define __forceinline__ inline

struct alignas(8) uint2 { unsigned int x, y; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };

struct __half { unsigned short bits; };
struct __nv_bfloat16 { unsigned short bits; };

inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline unsigned int __popc(unsigned int x) { return (unsigned int)__builtin_popcount(x); }
inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
  const uint64_t v = (uint64_t)x | ((uint64_t)y << 32);
  unsigned int r = 0;
  for (int n = 0; n < 4; ++n) r |= (unsigned int)((v >> (8 * ((s >> (4 * n)) & 7))) & 0xFF) << (8 * n);
  return r;
}
inline __half __ushort_as_half(unsigned short b) { return __half{b}; }
inline float __half2float(__half h) {  // exact, every bit pattern
  const uint32_t s = (uint32_t)(h.bits & 0x8000) << 16, e = (h.bits >> 10) & 0x1F, m = h.bits & 0x3FF;
  uint32_t bits;
  if (e == 0) {
    if (m == 0) return __uint_as_float(s);
    const float v = (float)m * (1.0f / 16777216.0f);  // m · 2^-24, exact
    return s ? -v : v;
  } else if (e == 31) {
    bits = s | 0x7F800000u | (m << 13);
  } else {
    bits = s | ((e + 112) << 23) | (m << 13);
  }
  return __uint_as_float(bits);
}

namespace moekit {
typedef unsigned int u32;
typedef unsigned char u8;
typedef unsigned long long u64;
inline float to_f32(float v) { return v; }
inline float to_f32(__half v) { return __half2float(v); }
inline float to_f32(__nv_bfloat16 v) { return __uint_as_float((u32)v.bits << 16); }
}  // namespace moekit
