// moekit/dequant_iq.cuh — the GGUF formats whose 4-bit codes index a
// non-linear table: IQ4_NL and IQ4_XS (`kvalues_iq4nl`) and MXFP4 (e2m1
// values doubled, e8m0 block scale). Block structs byte for byte llama.cpp's
// ggml-common.h and src/format/ggml/nonlinear.rs; decoder types as in
// dequant.cuh, which includes this file at its end (it is not included on its
// own).
//
// A table lookup is one byte permute (`prmt`) of the table held as four
// words, in registers: the table entry plus a bias (128 for kvalues_iq4nl, 12
// for MXFP4) is a small unsigned code, so `code_f(entry, bias)` is the exact
// float of the signed table value, and a weight is one f32 product of scale
// and value, as on the CPU.
#pragma once

namespace moekit {

struct block_iq4_nl { f16bits d; u8 qs[16]; };
struct block_iq4_xs { f16bits d; u16 scales_h; u8 scales_l[QK_K / 64]; u8 qs[QK_K / 2]; };
struct block_mxfp4 { u8 e; u8 qs[16]; };

static_assert(sizeof(block_iq4_nl) == 18, "wrong iq4_nl block size/padding");
static_assert(sizeof(block_iq4_xs) == 136, "wrong iq4_xs block size/padding");
static_assert(sizeof(block_mxfp4) == 17, "wrong mxfp4 block size/padding");

#define MOEKIT_SZ(B, f) ((int)sizeof(B::f))
static_assert(MOEKIT_SZ(block_iq4_nl, d) + MOEKIT_SZ(block_iq4_nl, qs) == 18, "iq4_nl padding");
static_assert(MOEKIT_SZ(block_iq4_xs, d) + MOEKIT_SZ(block_iq4_xs, scales_h) + MOEKIT_SZ(block_iq4_xs, scales_l) +
                      MOEKIT_SZ(block_iq4_xs, qs) == 136, "iq4_xs padding");
static_assert(MOEKIT_SZ(block_mxfp4, e) + MOEKIT_SZ(block_mxfp4, qs) == 17, "mxfp4 padding");
constexpr int IQ4_NL_QS = MOEKIT_SZ(block_iq4_nl, d);
constexpr int IQ4_XS_HEADER = MOEKIT_SZ(block_iq4_xs, d) + MOEKIT_SZ(block_iq4_xs, scales_h) + MOEKIT_SZ(block_iq4_xs, scales_l);
constexpr int IQ4_XS_QS = IQ4_XS_HEADER;
constexpr int MXFP4_QS = MOEKIT_SZ(block_mxfp4, e);
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

// IQ4_XS: super-blocks of 256; chunk c is group c % 8 of super-block c / 8,
// scale d·(ls − 32) with the 6-bit ls from scales_l (nibble g % 2 of byte
// g / 2, i.e. bits 4g of the word) and scales_h (bits 2g, 2g + 1).
struct FmtIQ4_XS : Codes<FmtIQ4_XS> {
  typedef block_iq4_xs B;
  static constexpr int CHUNK = 32, UNIT_W = QK_K, UNIT_BYTES = sizeof(B);
  static constexpr int SUB = 32;
  static constexpr bool HAS_B = false;
  typedef void Scale;
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

}  // namespace moekit
