// moekit/dequant_iq.cuh — the GGUF formats beyond the K-quants, as decoder
// types like dequant.cuh's (which includes this file at its end; it is not
// included on its own). Block structs byte for byte llama.cpp's
// ggml-common.h and src/format/ggml/{nonlinear,iquant,ternary}.rs:
//   * IQ4_NL, IQ4_XS (4-bit codes into `kvalues_iq4nl`), MXFP4 (e2m1
//     values doubled, e8m0 block scale) and NVFP4 (the same values, an
//     unsigned e4m3 scale per 16). A table lookup is one byte permute
//     (`prmt`) of the table held as four words, in registers: the table
//     entry plus a bias (128 for kvalues_iq4nl, 12 for MXFP4) is a small
//     unsigned code, so `code_f(entry, bias)` is the exact float of the
//     signed table value;
//   * the grid i-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M
//     (grids in iq_grids.cuh, read from global memory as ggml-cuda does);
//   * the ternary TQ1_0, TQ2_0.
// Every weight is one f32 product of its group scale (rounded as gguf-py
// rounds it) and an exact code, as on the CPU.
#pragma once
#include "moekit/iq_grids.cuh"

namespace moekit {

struct block_iq4_nl { f16bits d; u8 qs[16]; };
struct block_iq4_xs { f16bits d; u16 scales_h; u8 scales_l[QK_K / 64]; u8 qs[QK_K / 2]; };
struct block_mxfp4 { u8 e; u8 qs[16]; };
struct block_nvfp4 { u8 d[4]; u8 qs[32]; };

static_assert(sizeof(block_iq4_nl) == 18, "wrong iq4_nl block size/padding");
static_assert(sizeof(block_iq4_xs) == 136, "wrong iq4_xs block size/padding");
static_assert(sizeof(block_mxfp4) == 17, "wrong mxfp4 block size/padding");
static_assert(sizeof(block_nvfp4) == 36, "wrong nvfp4 block size/padding");

#define MOEKIT_SZ(B, f) ((int)sizeof(B::f))
static_assert(MOEKIT_SZ(block_iq4_nl, d) + MOEKIT_SZ(block_iq4_nl, qs) == 18, "iq4_nl padding");
static_assert(MOEKIT_SZ(block_iq4_xs, d) + MOEKIT_SZ(block_iq4_xs, scales_h) + MOEKIT_SZ(block_iq4_xs, scales_l) +
                      MOEKIT_SZ(block_iq4_xs, qs) == 136, "iq4_xs padding");
static_assert(MOEKIT_SZ(block_mxfp4, e) + MOEKIT_SZ(block_mxfp4, qs) == 17, "mxfp4 padding");
constexpr int IQ4_NL_QS = MOEKIT_SZ(block_iq4_nl, d);
constexpr int IQ4_XS_HEADER = MOEKIT_SZ(block_iq4_xs, d) + MOEKIT_SZ(block_iq4_xs, scales_h) + MOEKIT_SZ(block_iq4_xs, scales_l);
constexpr int IQ4_XS_QS = IQ4_XS_HEADER;
constexpr int MXFP4_QS = MOEKIT_SZ(block_mxfp4, e);
constexpr int NVFP4_QS = MOEKIT_SZ(block_nvfp4, d);
static_assert(NVFP4_QS + MOEKIT_SZ(block_nvfp4, qs) == 36 && NVFP4_QS == 4, "nvfp4: 4 scale bytes, then the codes");
static_assert(IQ4_XS_HEADER == 8, "iq4_xs header: d, scales_h, scales_l");
#undef MOEKIT_SZ

// A 16-entry byte table as four little-endian words.
struct Table16 {
  u32 w0, w1, w2, w3;
};

// kvalues_iq4nl + 128: {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113} + 128.
constexpr Table16 IQ4NL_TABLE = {0x3F2D1801u, 0x766A5D4Fu, 0xA6998D81u, 0xF1D9C5B5u};
constexpr u32 IQ4NL_BIAS = 128;
// kvalues_mxfp4 + 12: {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12} + 12.
constexpr Table16 MXFP4_TABLE = {0x0F0E0D0Cu, 0x18141210u, 0x090A0B0Cu, 0x00040608u};
constexpr u32 MXFP4_BIAS = 12;

// Entry q (0..15) of a table.
__device__ __forceinline__ u32 table16(const Table16& t, u32 q) {
  const u32 lo = __byte_perm(t.w0, t.w1, q & 7), hi = __byte_perm(t.w2, t.w3, q & 7);
  return ((q & 8) ? hi : lo) & 0xFFu;
}

// The 32 table codes of 16 code bytes (weight j < 16: low nibble of byte j,
// j + 16: its high nibble), as exact floats of the signed table values.
__device__ __forceinline__ void table_codes(const u32 (&qs)[4], const Table16& t, u32 bias, float (&out)[32]) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const u32 q = byte_of(qs, j);
    out[j] = code_f(table16(t, q & 15), bias);
    out[j + 16] = code_f(table16(t, q >> 4), bias);
  }
}

// ggml_e8m0_to_fp32_half: 2^(e − 128), exact (e < 2: f32 subnormals).
__device__ __forceinline__ float e8m0_to_f32_half(u32 e) {
  return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

struct FmtIQ4_NL : Codes<FmtIQ4_NL> {
  typedef block_iq4_nl B;
  static constexpr int CHUNK = 32, UNIT_W = 32, UNIT_BYTES = sizeof(B);
  static constexpr int SUB = 32;
  static constexpr bool HAS_B = false;
  typedef void Scale;
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[CHUNK / SUB],
                                                    float (&kb)[CHUNK / SUB]) {
    const B* b = reinterpret_cast<const B*>(r.data) + c;
    ka[0] = half_bits_to_f32(load_u16(&b->d));
    kb[0] = 0.f;
    u32 qs[4];
    load_words<16, align_at(UNIT_BYTES, IQ4_NL_QS)>(b->qs, qs);
    table_codes(qs, IQ4NL_TABLE, IQ4NL_BIAS, out);
  }
};

// The constants of a super-block format (IQ4_XS, the grid i-quants, the
// ternary types): super-blocks of 256, chunk c = group c % 8 of super-block
// c / 8, one scale per SUB weights.
template <typename BLOCK, int SUB_>
struct SuperFmt {
  typedef BLOCK B;
  static constexpr int CHUNK = 32, UNIT_W = QK_K, UNIT_BYTES = sizeof(B);
  static constexpr int SUB = SUB_;
  static constexpr bool HAS_B = false;
  typedef void Scale;
};

// IQ4_XS: group scale d·(ls − 32) with the 6-bit ls from scales_l (nibble
// g % 2 of byte g / 2, i.e. bits 4g of the word) and scales_h (bits 2g,
// 2g + 1).
struct FmtIQ4_XS : Codes<FmtIQ4_XS>, SuperFmt<block_iq4_xs, 32> {
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[CHUNK / SUB],
                                                    float (&kb)[CHUNK / SUB]) {
    const B* b = reinterpret_cast<const B*>(r.data) + (c >> 3);
    const u32 g = c & 7;
    u32 hdr[2], qs[4];
    load_words<IQ4_XS_HEADER, align_at(UNIT_BYTES, 0)>(reinterpret_cast<const u8*>(b), hdr);
    load_words<16, align_at(UNIT_BYTES, IQ4_XS_QS)>(b->qs + 16 * g, qs);
    const u32 ls = ((hdr[1] >> (4 * g)) & 15) | (((hdr[0] >> (16 + 2 * g)) & 3) << 4);
    ka[0] = __fmul_rn(half_bits_to_f32(hdr[0]), (float)((int)ls - 32));
    kb[0] = 0.f;
    table_codes(qs, IQ4NL_TABLE, IQ4NL_BIAS, out);
  }
};

// MXFP4: 17-byte blocks, so only byte loads (align_at gives 1).
struct FmtMXFP4 : Codes<FmtMXFP4> {
  typedef block_mxfp4 B;
  static constexpr int CHUNK = 32, UNIT_W = 32, UNIT_BYTES = sizeof(B);
  static constexpr int SUB = 32;
  static constexpr bool HAS_B = false;
  typedef void Scale;
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[CHUNK / SUB],
                                                    float (&kb)[CHUNK / SUB]) {
    const B* b = reinterpret_cast<const B*>(r.data) + c;
    ka[0] = e8m0_to_f32_half(b->e);
    kb[0] = 0.f;
    u32 qs[4];
    load_words<16, align_at(UNIT_BYTES, MXFP4_QS)>(b->qs, qs);
    table_codes(qs, MXFP4_TABLE, MXFP4_BIAS, out);
  }
};

// Half of llama.cpp's unsigned e4m3 scale (ggml_ue4m3_to_fp32, halving
// included; nonlinear.rs `ue4m3_to_f32_half`): bits 3–6 the exponent (bias
// 7), bits 0–2 the mantissa, bit 7 ignored; 0 and 0x7F are zero; exponent 0
// is subnormal (m·2^−9). Exact: (8 + m)·2^(e − 11) as f32 bits, or m·2^−10.
__device__ __forceinline__ float ue4m3_to_f32_half(u32 x) {
  x &= 0xFFu;
  const u32 e = (x >> 3) & 15u, m = x & 7u;
  if (x == 0 || x == 0x7Fu) return 0.f;
  return e == 0 ? __fmul_rn((float)m, 0x1p-10f) : __uint_as_float(((e + 119u) << 23) | (m << 20));
}

// NVFP4: 36-byte blocks of 64 weights (4-byte loads); chunk c is groups
// 2(c % 2) and 2(c % 2) + 1 of block c / 2, each 8 code bytes (low
// nibbles: the group's weights 0..8, high: 8..16) with its own scale.
struct FmtNVFP4 : Codes<FmtNVFP4> {
  typedef block_nvfp4 B;
  static constexpr int CHUNK = 32, UNIT_W = 64, UNIT_BYTES = sizeof(B);
  static constexpr int SUB = 16;
  static constexpr bool HAS_B = false;
  typedef void Scale;
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[CHUNK / SUB],
                                                    float (&kb)[CHUNK / SUB]) {
    const B* b = reinterpret_cast<const B*>(r.data) + (c >> 1);
    const u32 h = c & 1u;
    u32 d[1], qs[4];
    load_words<4, align_at(UNIT_BYTES, 0)>(reinterpret_cast<const u8*>(b), d);
    load_words<16, align_at(UNIT_BYTES, NVFP4_QS)>(b->qs + 16 * h, qs);
    ka[0] = ue4m3_to_f32_half(d[0] >> (16 * h));
    ka[1] = ue4m3_to_f32_half(d[0] >> (16 * h + 8));
    kb[0] = kb[1] = 0.f;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const u32 q = byte_of(qs, j), at = 16 * (j >> 3) + (j & 7);
      out[at] = code_f(table16(MXFP4_TABLE, q & 15), MXFP4_BIAS);
      out[at + 8] = code_f(table16(MXFP4_TABLE, q >> 4), MXFP4_BIAS);
    }
  }
};

// ---------------------------------------------------------------------------
// Grid i-quants and ternary blocks: super-blocks of 256; chunk c is group
// g = c % 8 (weights 32g ..) of super-block c / 8.

struct block_iq2_xxs { f16bits d; u16 qs[QK_K / 8]; };
struct block_iq2_xs { f16bits d; u16 qs[QK_K / 8]; u8 scales[QK_K / 32]; };
struct block_iq2_s { f16bits d; u8 qs[QK_K / 4]; u8 qh[QK_K / 32]; u8 scales[QK_K / 32]; };
struct block_iq3_xxs { f16bits d; u8 qs[3 * QK_K / 8]; };
struct block_iq3_s { f16bits d; u8 qs[QK_K / 4]; u8 qh[QK_K / 32]; u8 signs[QK_K / 8]; u8 scales[QK_K / 64]; };
struct block_iq1_s { f16bits d; u8 qs[QK_K / 8]; u16 qh[QK_K / 32]; };
struct block_iq1_m { u8 qs[QK_K / 8]; u8 qh[QK_K / 16]; u8 scales[QK_K / 32]; };
struct block_tq1_0 { u8 qs[(QK_K - 4 * QK_K / 64) / 5]; u8 qh[QK_K / 64]; f16bits d; };
struct block_tq2_0 { u8 qs[QK_K / 4]; f16bits d; };

static_assert(sizeof(block_iq2_xxs) == 66, "wrong iq2_xxs block size/padding");
static_assert(sizeof(block_iq2_xs) == 74, "wrong iq2_xs block size/padding");
static_assert(sizeof(block_iq2_s) == 82, "wrong iq2_s block size/padding");
static_assert(sizeof(block_iq3_xxs) == 98, "wrong iq3_xxs block size/padding");
static_assert(sizeof(block_iq3_s) == 110, "wrong iq3_s block size/padding");
static_assert(sizeof(block_iq1_s) == 50, "wrong iq1_s block size/padding");
static_assert(sizeof(block_iq1_m) == 56, "wrong iq1_m block size/padding");
static_assert(sizeof(block_tq1_0) == 54, "wrong tq1_0 block size/padding");
static_assert(sizeof(block_tq2_0) == 66, "wrong tq2_0 block size/padding");

// Field offsets (no padding: each struct's size above is the sum of its
// fields', so these sums are the offsets).
#define MOEKIT_SZ(B, f) ((int)sizeof(B::f))
static_assert(MOEKIT_SZ(block_iq2_xs, d) + MOEKIT_SZ(block_iq2_xs, qs) + MOEKIT_SZ(block_iq2_xs, scales) == 74, "iq2_xs padding");
static_assert(MOEKIT_SZ(block_iq2_s, d) + MOEKIT_SZ(block_iq2_s, qs) + MOEKIT_SZ(block_iq2_s, qh) + MOEKIT_SZ(block_iq2_s, scales) == 82, "iq2_s padding");
static_assert(MOEKIT_SZ(block_iq3_s, d) + MOEKIT_SZ(block_iq3_s, qs) + MOEKIT_SZ(block_iq3_s, qh) + MOEKIT_SZ(block_iq3_s, signs) +
                      MOEKIT_SZ(block_iq3_s, scales) == 110, "iq3_s padding");
static_assert(MOEKIT_SZ(block_iq1_s, d) + MOEKIT_SZ(block_iq1_s, qs) + MOEKIT_SZ(block_iq1_s, qh) == 50, "iq1_s padding");
static_assert(MOEKIT_SZ(block_tq1_0, qs) + MOEKIT_SZ(block_tq1_0, qh) + MOEKIT_SZ(block_tq1_0, d) == 54, "tq1_0 padding");
constexpr int IQ_QS = 2;  // after the f16 d: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S
constexpr int IQ2_S_SIGNS = IQ_QS + MOEKIT_SZ(block_iq2_s, qs) / 2;
constexpr int IQ3_XXS_AUX = IQ_QS + QK_K / 4;
constexpr int IQ3_S_SIGNS = IQ_QS + MOEKIT_SZ(block_iq3_s, qs) + MOEKIT_SZ(block_iq3_s, qh);
constexpr int IQ1_M_QS = 0, IQ1_M_SCALES = MOEKIT_SZ(block_iq1_m, qs) + MOEKIT_SZ(block_iq1_m, qh);
constexpr int TQ1_0_QS = 0, TQ1_0_QH = MOEKIT_SZ(block_tq1_0, qs);
#undef MOEKIT_SZ

// The alignment of byte `off + k·step` (any k) of a unit.
constexpr int align_step(int unit_bytes, int off, int step) { return align_at(unit_bytes, cgcd(off, step)); }

// ksigns_iq2xs[k]: the 7 sign bits of k and their parity as bit 7.
__device__ __forceinline__ u32 ksigns(u32 k) {
  k &= 0x7Fu;
  return k | ((__popc(k) & 1u) << 7);
}

// ±(byte j of a grid entry), negative when bit j of `signs` is set: exact.
__device__ __forceinline__ float signed_byte(u64 e, int j, u32 signs) {
  const float v = code_f((u32)(e >> (8 * j)) & 0xFFu, 0);
  return (signs >> j) & 1u ? -v : v;
}

// The IQ1 value of byte j of an iq1s_grid entry (int8 −1, 0, 1) plus the
// ±1/8 shift: exact.
__device__ __forceinline__ float iq1_value(u64 e, int j, float delta) {
  return __fadd_rn((float)(int)(signed char)(u8)(e >> (8 * j)), delta);
}

// (d·(0.5 + s))·m: the IQ2 (m = ¼) and IQ3_XXS (m = ½) group scales.
__device__ __forceinline__ float half_step(float d, u32 s, float m) {
  return __fmul_rn(__fmul_rn(d, 0.5f + (float)s), m);
}


struct FmtIQ2_XXS : Codes<FmtIQ2_XXS>, SuperFmt<block_iq2_xxs, 32> {
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[CHUNK / SUB],
                                                    float (&kb)[CHUNK / SUB]) {
    const B* b = reinterpret_cast<const B*>(r.data) + (c >> 3);
    const u32 g = c & 7;
    u32 w[2];  // four grid indices; four 7-bit sign indices and the 4-bit scale
    load_words<8, align_step(UNIT_BYTES, IQ_QS, 8)>(reinterpret_cast<const u8*>(b->qs) + 8 * g, w);
    ka[0] = half_step(half_bits_to_f32(load_u16(&b->d)), w[1] >> 28, 0.25f);
    kb[0] = 0.f;
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const u64 e = iq2xxs_grid[(w[0] >> (8 * l)) & 0xFFu];
      const u32 s = ksigns(w[1] >> (7 * l));
#pragma unroll
      for (int j = 0; j < 8; ++j) out[8 * l + j] = signed_byte(e, j, s);
    }
  }
};

struct FmtIQ2_XS : Codes<FmtIQ2_XS>, SuperFmt<block_iq2_xs, 16> {
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[CHUNK / SUB],
                                                    float (&kb)[CHUNK / SUB]) {
    const B* b = reinterpret_cast<const B*>(r.data) + (c >> 3);
    const u32 g = c & 7;
    u32 w[2];  // four u16: 9-bit grid index, 7-bit sign index
    load_words<8, align_step(UNIT_BYTES, IQ_QS, 8)>(reinterpret_cast<const u8*>(b->qs) + 8 * g, w);
    const float d = half_bits_to_f32(load_u16(&b->d));
    const u32 sc = b->scales[g];
    ka[0] = half_step(d, sc & 15u, 0.25f);
    ka[1] = half_step(d, sc >> 4, 0.25f);
    kb[0] = kb[1] = 0.f;
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const u32 q = (w[l >> 1] >> (16 * (l & 1))) & 0xFFFFu;
      const u64 e = iq2xs_grid[q & 511u];
      const u32 s = ksigns(q >> 9);
#pragma unroll
      for (int j = 0; j < 8; ++j) out[8 * l + j] = signed_byte(e, j, s);
    }
  }
};

struct FmtIQ2_S : Codes<FmtIQ2_S>, SuperFmt<block_iq2_s, 16> {
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[CHUNK / SUB],
                                                    float (&kb)[CHUNK / SUB]) {
    const B* b = reinterpret_cast<const B*>(r.data) + (c >> 3);
    const u32 g = c & 7;
    u32 idx[1], sg[1];
    load_words<4, align_step(UNIT_BYTES, IQ_QS, 4)>(b->qs + 4 * g, idx);
    load_words<4, align_step(UNIT_BYTES, IQ2_S_SIGNS, 4)>(b->qs + QK_K / 8 + 4 * g, sg);
    const float d = half_bits_to_f32(load_u16(&b->d));
    const u32 qh = b->qh[g], sc = b->scales[g];
    ka[0] = half_step(d, sc & 15u, 0.25f);
    ka[1] = half_step(d, sc >> 4, 0.25f);
    kb[0] = kb[1] = 0.f;
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const u64 e = iq2s_grid[byte_of(idx, l) | (((qh >> (2 * l)) & 3u) << 8)];
      const u32 s = byte_of(sg, l);
#pragma unroll
      for (int j = 0; j < 8; ++j) out[8 * l + j] = signed_byte(e, j, s);
    }
  }
};

struct FmtIQ3_XXS : Codes<FmtIQ3_XXS>, SuperFmt<block_iq3_xxs, 32> {
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[CHUNK / SUB],
                                                    float (&kb)[CHUNK / SUB]) {
    const B* b = reinterpret_cast<const B*>(r.data) + (c >> 3);
    const u32 g = c & 7;
    u32 idx[2], aux[1];  // eight grid indices; four 7-bit sign indices and the scale
    load_words<8, align_step(UNIT_BYTES, IQ_QS, 8)>(b->qs + 8 * g, idx);
    load_words<4, align_step(UNIT_BYTES, IQ3_XXS_AUX, 4)>(b->qs + QK_K / 4 + 4 * g, aux);
    ka[0] = half_step(half_bits_to_f32(load_u16(&b->d)), aux[0] >> 28, 0.5f);
    kb[0] = 0.f;
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const u64 e = (u64)iq3xxs_grid[byte_of(idx, 2 * l)] | ((u64)iq3xxs_grid[byte_of(idx, 2 * l + 1)] << 32);
      const u32 s = ksigns(aux[0] >> (7 * l));
#pragma unroll
      for (int j = 0; j < 8; ++j) out[8 * l + j] = signed_byte(e, j, s);
    }
  }
};

struct FmtIQ3_S : Codes<FmtIQ3_S>, SuperFmt<block_iq3_s, 32> {
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[CHUNK / SUB],
                                                    float (&kb)[CHUNK / SUB]) {
    const B* b = reinterpret_cast<const B*>(r.data) + (c >> 3);
    const u32 g = c & 7;
    u32 idx[2], sg[1];
    load_words<8, align_step(UNIT_BYTES, IQ_QS, 8)>(b->qs + 8 * g, idx);
    load_words<4, align_step(UNIT_BYTES, IQ3_S_SIGNS, 4)>(b->signs + 4 * g, sg);
    const u32 qh = b->qh[g], sc = (b->scales[g >> 1] >> (4 * (g & 1))) & 15u;
    ka[0] = __fmul_rn(half_bits_to_f32(load_u16(&b->d)), (float)(1 + 2 * sc));
    kb[0] = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const u64 e = iq3s_grid[byte_of(idx, k) | (((qh >> k) & 1u) << 8)];
#pragma unroll
      for (int j = 0; j < 4; ++j) out[4 * k + j] = signed_byte(e, j, sg[0] >> (4 * k));
    }
  }
};

struct FmtIQ1_S : Codes<FmtIQ1_S>, SuperFmt<block_iq1_s, 32> {
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[CHUNK / SUB],
                                                    float (&kb)[CHUNK / SUB]) {
    const B* b = reinterpret_cast<const B*>(r.data) + (c >> 3);
    const u32 g = c & 7;
    u32 idx[1];
    load_words<4, align_step(UNIT_BYTES, IQ_QS, 4)>(b->qs + 4 * g, idx);
    const u32 qh = load_u16(&b->qh[g]);
    ka[0] = __fmul_rn(half_bits_to_f32(load_u16(&b->d)), (float)(2 * ((qh >> 12) & 7u) + 1));
    kb[0] = 0.f;
    const float delta = qh & 0x8000u ? -0.125f : 0.125f;
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const u64 e = iq1s_grid[byte_of(idx, l) | (((qh >> (3 * l)) & 7u) << 8)];
#pragma unroll
      for (int j = 0; j < 8; ++j) out[8 * l + j] = iq1_value(e, j, delta);
    }
  }
};

// IQ1_M: the f16 d is the top nibbles of the four u16 scale words.
struct FmtIQ1_M : Codes<FmtIQ1_M>, SuperFmt<block_iq1_m, 16> {
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[CHUNK / SUB],
                                                    float (&kb)[CHUNK / SUB]) {
    const B* b = reinterpret_cast<const B*>(r.data) + (c >> 3);
    const u32 g = c & 7;
    u32 idx[1], sw[2];
    load_words<4, align_step(UNIT_BYTES, IQ1_M_QS, 4)>(b->qs + 4 * g, idx);
    load_words<8, align_at(UNIT_BYTES, IQ1_M_SCALES)>(b->scales, sw);
    const u32 qh = load_u16(b->qh + 2 * g);  // nibble l: entry 4g + l
    const u32 dbits = ((sw[0] >> 12) & 0xFu) | ((sw[0] >> 24) & 0xF0u) | ((sw[1] >> 4) & 0xF00u) | ((sw[1] >> 16) & 0xF000u);
    const float d = half_bits_to_f32(dbits);
    const u32 word = (sw[g >> 2] >> (16 * ((g >> 1) & 1))) & 0xFFFFu;  // scale word g / 2
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const u32 s = (word >> (3 * (2 * (g & 1) + h))) & 7u;
      ka[h] = __fmul_rn(d, (float)(2 * s + 1));
      kb[h] = 0.f;
    }
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      const u32 nib = (qh >> (4 * l)) & 15u;
      const u64 e = iq1s_grid[byte_of(idx, l) | ((nib & 7u) << 8)];
      const float delta = nib & 8u ? -0.125f : 0.125f;
#pragma unroll
      for (int j = 0; j < 8; ++j) out[8 * l + j] = iq1_value(e, j, delta);
    }
  }
};

// 3ⁿ for n < 5.
__host__ __device__ constexpr u32 pow3(u32 n) { return n == 0 ? 1u : n == 1 ? 3u : n == 2 ? 9u : n == 3 ? 27u : 81u; }

// Trit n of a TQ1_0 byte plus 1 (p = 3ⁿ): ((b·p mod 256)·3) >> 8.
__device__ __forceinline__ u32 trit1(u32 byte, u32 p) { return (((byte * p) & 0xFFu) * 3u) >> 8; }

// TQ1_0: group g < 5 is trit g of qs[0..32]; groups 5, 6 trits 2(g − 5) and
// 2(g − 5) + 1 of qs[32..48]; group 7 trit 4 of qs[32..48], then the four
// trits of qh[0..4] (weight 240 + 4n + m: trit n of qh[m]).
struct FmtTQ1_0 : Codes<FmtTQ1_0>, SuperFmt<block_tq1_0, 32> {
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[CHUNK / SUB],
                                                    float (&kb)[CHUNK / SUB]) {
    const B* b = reinterpret_cast<const B*>(r.data) + (c >> 3);
    const u32 g = c & 7;
    ka[0] = half_bits_to_f32(load_u16(&b->d));
    kb[0] = 0.f;
    if (g < 5) {
      u32 w[8];
      load_words<32, align_at(UNIT_BYTES, TQ1_0_QS)>(b->qs, w);
      const u32 p = pow3(g);
#pragma unroll
      for (int j = 0; j < 32; ++j) out[j] = code_f(trit1(byte_of(w, j), p), 1);
    } else {
      u32 w[4], h[1];
      load_words<16, align_at(UNIT_BYTES, TQ1_0_QS + 32)>(b->qs + 32, w);
      load_words<4, align_at(UNIT_BYTES, TQ1_0_QH)>(b->qh, h);
      const u32 n = 2 * (g - 5);
      const u32 p0 = pow3(n), p1 = pow3(n + 1);
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        out[j] = code_f(trit1(byte_of(w, j), p0), 1);
        out[16 + j] = g < 7 ? code_f(trit1(byte_of(w, j), p1), 1) : code_f(trit1(byte_of(h, j & 3), pow3(j >> 2)), 1);
      }
    }
  }
};

// TQ2_0: weight 128j + 32s + m is (qs[32j + m] >> 2s) & 3, minus 1.
struct FmtTQ2_0 : Codes<FmtTQ2_0>, SuperFmt<block_tq2_0, 32> {
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[CHUNK / SUB],
                                                    float (&kb)[CHUNK / SUB]) {
    const B* b = reinterpret_cast<const B*>(r.data) + (c >> 3);
    const u32 g = c & 7;
    u32 w[8];
    load_words<32, align_step(UNIT_BYTES, 0, 32)>(b->qs + 32 * (g >> 2), w);
    ka[0] = half_bits_to_f32(load_u16(&b->d));
    kb[0] = 0.f;
    const u32 shift = 2 * (g & 3);
#pragma unroll
    for (int j = 0; j < 32; ++j) out[j] = code_f((byte_of(w, j) >> shift) & 3u, 1);
  }
};

}  // namespace moekit
