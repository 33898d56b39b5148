// moekit/tc_decode_gguf.cuh — fast tile decoders (tc_decode.cuh's contract:
// load(slice), then unit(u) for u = 0..3) for GGUF formats:
//
//   Q8_0, Q4_0: blocks of 32 weights, an f16 scale d first, then the codes.
//
// Like the other fast decoders, they convert codes with magic-number tricks
// (the code placed under a fixed exponent by one PRMT, so its float is
// magic + code exactly) and scale with one FMA, here one rounding to T of a
// product that is exact in f32: the same bits as the generic decoder
// (`TcDecCodes`: fmaf(q, d, 0), rounded to T). None of them does the hi/lo
// split's low rows (TcSlice::lo): tc_gemm runs the split (P = 3) for dense
// weights only (f32, decoded by the generic decoder, or halves of T, copied;
// host check in tc_gemm.rs, split_matmul_into), as for the other fast
// decoders.
//
// load() only issues loads: in the decode path (decode_mma.cuh) a warp
// loads the next span while it multiplies this one, and any arithmetic on
// the loaded words in load() would wait for them there; the realignment and
// the conversions are in unit().
#pragma once
#include "moekit/tc_decode.cuh"

namespace moekit {

// ---------------------------------------------------------------------------
// 32-weight blocks with d first (Q8_0: 34 bytes, Q4_0: 18). A slice is one
// block, at s.data + UNIT_BYTES · (col / 32) in both callers (decode: the
// row in global memory; tc_gemm: its raw stage, which keeps the global
// address mod 16), so a block is only 2-byte aligned: its codes start at
// b + 2, 4-aligned when b ≡ 2 (mod 4), else at 2 mod 4. The raw block holds
//   w[i] = the aligned u32 at b + odd + 4i (odd = b & 2), i < N/4, and
//   w[N/4] = the u16 at b + N (the last two codes),
// all inside the block's 2 + N bytes (b ≡ 2: the N code bytes; b ≡ 0: d,
// the first N − 2 codes, then the u16), and d's bits, so code word i
// (codes 4i .. 4i + 3, little-endian) is
//   b ≡ 2: w[i];   b ≡ 0: w[i] >> 16 | w[i + 1] << 16,
// one funnel shift by sh = 0 or 16 either way. N/4 + 2 loads (Q8_0: 10,
// Q4_0: 6), where F::codes' u16 loads take N/2 + 1.
template <int N>
struct GgufBlock32 {
  u32 w[N / 4 + 1];
  u32 db;  // d's f16 bits; 0 for a slice of no columns (exact zeros)
  u32 sh;  // 16 (b ≡ 0 mod 4) or 0
  __device__ __forceinline__ void load(const u8* b, bool ok) {
    const u32 odd = (u32)reinterpret_cast<u64>(b) & 2u;
    const u32* p = reinterpret_cast<const u32*>(b + odd);
#pragma unroll
    for (int i = 0; i < N / 4; ++i) w[i] = p[i];
    w[N / 4] = load_u16(b + N);
    db = 0;
    if (ok) db = load_u16(b);  // no columns: d = 0 (a predicated load, no wait here)
    sh = 16u - 8u * odd;
  }
  __device__ __forceinline__ u32 word(int i) const { return __funnelshift_r(w[i], w[i + 1], sh); }
};

// The 4 bytes u of x → (2^15 + u)·a + c each (PRMT builds the f32 2^15 + u,
// u in bits 8..15 under the exponent of 2^15, whose ulp is 2^-8; one FFMA),
// packed into two T pairs. With c = −(2^15 + bias)·a exact in f32 and
// (u − bias)·a exact, that is (u − bias)·a rounded once to T (by the pack).
// Q8_0 and Q4_0 (bf16) and the table decoders (tc_decode_iq.cuh) share it.
template <typename T>
__device__ __forceinline__ void magic_bytes4(u32 x, float a, float c, u32& lo, u32& hi) {
  float v[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] = __fmaf_rn(__uint_as_float(__byte_perm(x, 0x47000000u, 0x7404 | (k << 4))), a, c);
  lo = Pk<T>::pack(v[0], v[1]);
  hi = Pk<T>::pack(v[2], v[3]);
}

// Q8_0: 32 signed byte codes q. A code word is biased first (^ 0x80808080:
// byte u = q + 128, one LOP3 per 4 codes) so that a code can go under a
// magic exponent as it is:
//   bf16: PRMT builds the f32 0x47 00 u 00 = 2^15 + u (u in bits 8..15,
//     under the exponent of 2^15, whose ulp is 2^-8), and one FFMA gives
//     (2^15 + u)·d − (2^15 + 128)·d = q·d exactly: (2^15 + 128)·d =
//     257·2^7·d is exact in f32 (9 + 11 significant bits), and so is q·d
//     (8 + 11); the pack rounds it once to bf16. q = 0: exact cancellation,
//     +0, as fmaf(0, d, 0).
//   f16: PRMT builds the f16 pair (0x64 u0, 0x64 u1) = (1024 + u0, 1024 + u1)
//     (u < 256 < 1024: exact), one HADD2 of −1152 leaves (q0, q1) exactly
//     (|q| ≤ 128), and one HFMA2 (q, d, +0) rounds the exact q·d once to
//     f16 (IEEE fma; f16 arithmetic keeps subnormals), as __floats2half2_rn
//     of the exact f32 q·d does; +0 for q·d = ±0, as fmaf(q, d, 0).
// Per 4 weights: funnel shift, LOP3, then 4 PRMT + 4 FFMA + 2 F2FP (bf16) or
// 2 PRMT + 2 HADD2 + 2 HFMA2 (f16).
template <typename T>
struct TcDecQ8_0 {
  GgufBlock32<32> b;
  __device__ __forceinline__ void load(const TcSlice& s) {
    b.load(s.data + (s.col / 32) * sizeof(block_q8_0), s.cols != 0);
  }
  __device__ __forceinline__ void four(u32 x, u32& lo, u32& hi) const {
    x ^= 0x80808080u;
    if constexpr (is_same<T, __half>::value) {
      const u32 d2 = b.db * 0x10001u, neg = 0xE480E480u, zero = 0u;  // (d, d), (−1152, −1152), (+0, +0)
      lo = Pk<T>::scale(__byte_perm(x, 0x64646464u, 0x4140), neg, d2, zero);
      hi = Pk<T>::scale(__byte_perm(x, 0x64646464u, 0x4342), neg, d2, zero);
    } else {
      const float d = half_bits_to_f32(b.db), c = __fmul_rn(d, -32896.f);  // −(2^15 + 128)·d, exact
      magic_bytes4<T>(x, d, c, lo, hi);
    }
  }
  __device__ __forceinline__ uint4 unit(int u) const {
    uint4 r;
    four(b.word(2 * u), r.x, r.y);
    four(b.word(2 * u + 1), r.z, r.w);
    return r;
  }
};

// Q4_0: 32 codes n of 4 bits, q = n − 8; weight j < 16 is the low nibble of
// code byte j, weight j + 16 its high nibble: unit u takes the low (u < 2)
// or high nibbles of code bytes 8(u & 1) .. + 7 (code words 2(u & 1), + 1).
//   bf16: the unit's nibbles of a code word are masked into the low nibbles
//     (high: >> 4 first, which the compiler folds into the funnel shift),
//     PRMT builds the f32 0x47 00 n 00 = 2^15 + n, and one FFMA subtracts
//     (2^15 + 8)·d = 4097·8·d, exact in f32 (13 + 11 significant bits),
//     leaving the exact (n − 8)·d (4 + 11 bits), rounded once by the pack.
//     (The high nibbles in place under 2^11 would need a second constant
//     (2^11 + 8)·d: one register more, which made decode_down_mma spill.)
//   f16: the nibbles stay in place: PRMT builds the f16 pair (0x64 n0,
//     0x64 n1) = 1024 + n (low) or (0x54 16n0, 0x54 16n1) = 64 + n (high:
//     the ulp of 64 is 2^-4), one HADD2 of −1032 or −72 leaves n − 8
//     exactly, and one HFMA2 (q, d, +0) rounds q·d once, as for Q8_0.
// Per 4 weights: LOP3, then 4 PRMT + 4 FFMA + 2 F2FP (bf16) or 2 PRMT +
// 2 HADD2 + 2 HFMA2 (f16); plus a funnel shift per code word.
template <typename T>
struct TcDecQ4_0 {
  GgufBlock32<16> b;
  __device__ __forceinline__ void load(const TcSlice& s) {
    b.load(s.data + (s.col / 32) * sizeof(block_q4_0), s.cols != 0);
  }
  template <bool HIGH>
  __device__ __forceinline__ void four(u32 x, u32& lo, u32& hi) const {
    const u32 m = x & (HIGH ? 0xF0F0F0F0u : 0x0F0F0F0Fu);
    if constexpr (is_same<T, __half>::value) {
      const u32 magic = HIGH ? 0x54545454u : 0x64646464u;
      const u32 d2 = b.db * 0x10001u, zero = 0u;
      const u32 neg = HIGH ? 0xD480D480u : 0xE408E408u;  // (−72, −72) or (−1032, −1032)
      lo = Pk<T>::scale(__byte_perm(m, magic, 0x4140), neg, d2, zero);
      hi = Pk<T>::scale(__byte_perm(m, magic, 0x4342), neg, d2, zero);
    } else {
      const u32 n = HIGH ? (x >> 4) & 0x0F0F0F0Fu : m;
      const float d = half_bits_to_f32(b.db);
      const float c = __fmul_rn(d, -32776.f);  // −(2^15 + 8)·d, exact
      magic_bytes4<T>(n, d, c, lo, hi);
    }
  }
  __device__ __forceinline__ uint4 unit(int u) const {
    uint4 r;
    const int w = 2 * (u & 1);
    if (u < 2) {
      four<false>(b.word(w), r.x, r.y);
      four<false>(b.word(w + 1), r.z, r.w);
    } else {
      four<true>(b.word(w), r.x, r.y);
      four<true>(b.word(w + 1), r.z, r.w);
    }
    return r;
  }
};

template <typename T> struct TcDecOf<FmtQ8_0, T> { typedef TcDecQ8_0<T> type; };
template <typename T> struct TcDecOf<FmtQ4_0, T> { typedef TcDecQ4_0<T> type; };

}  // namespace moekit
