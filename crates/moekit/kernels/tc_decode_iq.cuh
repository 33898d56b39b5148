// moekit/tc_decode_iq.cuh — fast tile decoders (tc_decode.cuh's contract:
// load(slice), then unit(u) for u = 0, 1, 2, 3 in that order) for the GGUF
// formats whose 4-bit codes index a 16-entry table (dequant_iq.cuh):
//
//   IQ4_NL  18-byte blocks of 32: f16 d, 16 code bytes (Q4_0's layout);
//   MXFP4   17-byte blocks of 32: e8m0 e, 16 code bytes (any alignment);
//   IQ4_XS  136-byte super-blocks of 256: f16 d, 6-bit sub-block scales,
//           group g's 16 code bytes at 8 + 16g;
//   NVFP4   36-byte blocks of 64: 4 unsigned e4m3 scales (one per 16
//           weights), then 8 code bytes a group of 16.
//
// In the first three, weight j < 16 of a 32-weight group is the low nibble
// of code byte j and weight j + 16 its high nibble, so unit u (weights 8u ..
// 8u + 7) takes the low (u < 2) or high (u ≥ 2) nibbles of code words
// 2(u & 1), + 1. In NVFP4's groups of 16 the low nibbles of the group's 8
// bytes are its weights 0..7, the high nibbles 8..15, so unit u takes the
// low (u even) or high (u odd) nibbles of code words 2(u >> 1), + 1, with
// the scale of group u >> 1.
//
// Table: the 16 entries plus their bias (a byte each, `Table16`) are looked
// up for all 8 nibbles of a code word at once, as llama.cpp's
// get_int_from_table_16 does: two PRMTs pick each nibble's entry from both
// halves of the table (its low 3 bits), a third keeps the half its bit 3
// names, and two more gather the low- and the high-nibble entries. unit(u)
// for u < 2 looks up both and keeps the high ones for unit(u + 2).
//
// Conversion, as Q8_0's bf16 path (tc_decode_gguf.cuh): PRMT builds the f32
// 2^15 + e (the biased entry e < 256 in bits 8..15), then
//   IQ4_NL, MXFP4, NVFP4: one FFMA with the scale a and c = −(2^15 +
//     bias)·a gives (e − bias)·a = v·a exactly (c is exact: 2^15 + 128 =
//     257·2^7 times an f16 d, 9 + 11 bits; 2^15 + 12 = 8195·4 times a power
//     of two, or an unsigned e4m3 of at most 4 significant bits: 17);
//   IQ4_XS: a = d·(ls − 32) has up to 17 significant bits, so c would not be
//     exact: one FADD leaves v exactly, one FMUL the exact v·a (≤ 24 bits).
// One rounding to T by the pack: the same bits as the generic decoder
// (fmaf(v, a, 0) rounded to T). f16 activations take the same f32 path (an
// e8m0 scale or d·(ls − 32) need not be an f16).
#pragma once
#include "moekit/tc_decode.cuh"

namespace moekit {

__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 s) {
  u32 r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
  return r;
}

// The biased table entries of the 8 nibbles of code word w: lo4 byte i =
// entry of byte i's low nibble, hi4 byte i = of its high nibble.
__device__ __forceinline__ void table8(const Table16& t, u32 w, u32& lo4, u32& hi4) {
  const u32 idx = w & 0x77777777u;                          // entry within a half (no sign-replicate bit)
  const u32 half = ((w & 0x88888888u) >> 1) | 0x32103210u;  // bytes 4..7 of (lo, hi) where bit 3 is set
  const u32 r0 = prmt(prmt(t.w0, t.w1, idx), prmt(t.w2, t.w3, idx), half);
  const u32 r1 = prmt(prmt(t.w0, t.w1, idx >> 16), prmt(t.w2, t.w3, idx >> 16), half >> 16);
  // r0 = entries of (b0.lo, b0.hi, b1.lo, b1.hi), r1 of b2, b3.
  lo4 = prmt(r0, r1, 0x6420u);
  hi4 = prmt(r0, r1, 0x7531u);
}

// 4 biased entries (bytes of x) → two T pairs, v·a with v = entry − bias.
// EXACT_C: c = −(2^15 + bias)·a is exact, so one FFMA a weight
// (magic_bytes4); else one FADD leaves v and one FMUL the exact v·a.
template <typename T, bool EXACT_C>
__device__ __forceinline__ void entries4(u32 x, float a, float c, float m, u32& lo, u32& hi) {
  if constexpr (EXACT_C) {
    magic_bytes4<T>(x, a, c, lo, hi);
  } else {
    float v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = __fmul_rn(__fadd_rn(__uint_as_float(prmt(x, 0x47000000u, 0x7404u | (k << 4))), m), a);
    lo = Pk<T>::pack(v[0], v[1]);
    hi = Pk<T>::pack(v[2], v[3]);
  }
}

// The shared part: code words (as 4 words through `word`), the table, the
// scale; the format supplies the block's loads and its scale.
template <typename T, typename Block, bool EXACT_C>
struct TcDecTable4 {
  Block b;
  mutable u32 hi[4];  // high-nibble entries of code words 0..3, from unit(0), unit(1)
  __device__ __forceinline__ uint4 unit(int u) const {
    const float a = b.scale();
    const float m = -(32768.f + (float)Block::BIAS);
    const float c = EXACT_C ? __fmul_rn(a, m) : 0.f;
    uint4 r;
    const int w = 2 * (u & 1);
    u32 e0, e1;
    if (u < 2) {
      table8(Block::table(), b.word(w), e0, hi[w]);
      table8(Block::table(), b.word(w + 1), e1, hi[w + 1]);
    } else {
      e0 = hi[w];
      e1 = hi[w + 1];
    }
    entries4<T, EXACT_C>(e0, a, c, m, r.x, r.y);
    entries4<T, EXACT_C>(e1, a, c, m, r.z, r.w);
    return r;
  }
};

// IQ4_NL: Q4_0's 18-byte block (GgufBlock32<16>: d bits, code words).
struct Iq4NlBlock {
  static constexpr u32 BIAS = IQ4NL_BIAS;
  GgufBlock32<16> g;
  __device__ static __forceinline__ Table16 table() { return IQ4NL_TABLE; }
  __device__ __forceinline__ float scale() const { return half_bits_to_f32(g.db); }
  __device__ __forceinline__ u32 word(int i) const { return g.word(i); }
};
template <typename T>
struct TcDecIq4Nl : TcDecTable4<T, Iq4NlBlock, true> {
  __device__ __forceinline__ void load(const TcSlice& s) {
    this->b.g.load(s.data + (s.col / 32) * sizeof(block_iq4_nl), s.cols != 0);
  }
};

// MXFP4: 17-byte blocks at any alignment. The 16 code bytes are read as the
// 4 or 5 aligned words that cover them (each holds a code byte, so none
// leaves the block's allocation) and funnel-shifted.
struct Mxfp4Block {
  static constexpr u32 BIAS = MXFP4_BIAS;
  u32 w[5], sh, e;
  bool ok;
  __device__ static __forceinline__ Table16 table() { return MXFP4_TABLE; }
  __device__ __forceinline__ void load(const u8* blk, bool ok) {
    const u8* qs = blk + MXFP4_QS;
    const u32 off = (u32)reinterpret_cast<u64>(qs) & 3u;
    const u32* p = reinterpret_cast<const u32*>(qs - off);
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = p[i];
    w[4] = off != 0 ? p[4] : 0u;
    sh = 8u * off;
    e = blk[0];
    this->ok = ok;
  }
  // No columns: scale 0, exact zeros (e = 0 is a real scale, 2^-128).
  __device__ __forceinline__ float scale() const { return ok ? e8m0_to_f32_half(e) : 0.f; }
  __device__ __forceinline__ u32 word(int i) const { return __funnelshift_r(w[i], w[i + 1], sh); }
};
template <typename T>
struct TcDecMxfp4 : TcDecTable4<T, Mxfp4Block, true> {
  __device__ __forceinline__ void load(const TcSlice& s) {
    this->b.load(s.data + (s.col / 32) * sizeof(block_mxfp4), s.cols != 0);
  }
};

// IQ4_XS: group g = (col / 32) % 8 of the super-block at s.data (8-byte
// aligned: 136-byte blocks in rows that start 16-byte aligned), scale
// d·(ls − 32) with ls from scales_l (bits 4g of the second header word) and
// scales_h (bits 16 + 2g of the first).
struct Iq4XsBlock {
  static constexpr u32 BIAS = IQ4NL_BIAS;
  u32 hdr0, hdr1, q[4], g;
  bool ok;
  __device__ static __forceinline__ Table16 table() { return IQ4NL_TABLE; }
  __device__ __forceinline__ float scale() const {
    if (!ok) return 0.f;  // no columns: exact zeros
    const u32 ls = ((hdr1 >> (4 * g)) & 15u) | (((hdr0 >> (16 + 2 * g)) & 3u) << 4);
    return __fmul_rn(half_bits_to_f32(hdr0), (float)((int)ls - 32));
  }
  __device__ __forceinline__ u32 word(int i) const { return q[i]; }
};
template <typename T>
struct TcDecIq4Xs : TcDecTable4<T, Iq4XsBlock, false> {
  __device__ __forceinline__ void load(const TcSlice& s) {
    Iq4XsBlock& b = this->b;
    const u8* blk = s.data;  // KR = QK_K: the stage's (or span's) only super-block
    b.g = (s.col / 32) & 7u;
    const uint2 h = *reinterpret_cast<const uint2*>(blk);
    const uint2 q0 = *reinterpret_cast<const uint2*>(blk + IQ4_XS_QS + 16 * b.g);
    const uint2 q1 = *reinterpret_cast<const uint2*>(blk + IQ4_XS_QS + 16 * b.g + 8);
    b.hdr0 = h.x;
    b.hdr1 = h.y;
    b.q[0] = q0.x;
    b.q[1] = q0.y;
    b.q[2] = q1.x;
    b.q[3] = q1.y;
    b.ok = s.cols != 0;
  }
};

// NVFP4: half h = (col / 32) % 2 of the block (4-byte aligned: 36-byte
// blocks), its groups 2h, 2h + 1: scale bytes h·2, h·2 + 1 of the first
// word, code words 1 + 4h .. 4 + 4h. unit(0) and unit(2) look up a group's
// words, keeping the high-nibble entries for unit(1) and unit(3).
template <typename T>
struct TcDecNvfp4 {
  u32 q[4], d;
  bool ok;
  mutable u32 hi[2];
  __device__ __forceinline__ void load(const TcSlice& s) {
    const u8* blk = s.data + (s.col / 64) * sizeof(block_nvfp4);
    const u32* p = reinterpret_cast<const u32*>(blk);
    const u32 h = (s.col / 32) & 1u;
    d = p[0] >> (16 * h);
#pragma unroll
    for (int i = 0; i < 4; ++i) q[i] = p[1 + 4 * h + i];
    ok = s.cols != 0;
  }
  __device__ __forceinline__ uint4 unit(int u) const {
    // No columns: scale 0, exact zeros.
    const float a = ok ? ue4m3_to_f32_half(d >> (8 * (u >> 1))) : 0.f;
    const float m = -(32768.f + (float)MXFP4_BIAS);
    const float c = __fmul_rn(a, m);
    const int w = 2 * (u >> 1);
    u32 e0, e1;
    if ((u & 1) == 0) {
      table8(MXFP4_TABLE, q[w], e0, hi[0]);
      table8(MXFP4_TABLE, q[w + 1], e1, hi[1]);
    } else {
      e0 = hi[0];
      e1 = hi[1];
    }
    uint4 r;
    entries4<T, true>(e0, a, c, m, r.x, r.y);
    entries4<T, true>(e1, a, c, m, r.z, r.w);
    return r;
  }
};

template <typename T> struct TcDecOf<FmtIQ4_NL, T> { typedef TcDecIq4Nl<T> type; };
template <typename T> struct TcDecOf<FmtNVFP4, T> { typedef TcDecNvfp4<T> type; };
template <typename T> struct TcDecOf<FmtMXFP4, T> { typedef TcDecMxfp4<T> type; };
template <typename T> struct TcDecOf<FmtIQ4_XS, T> { typedef TcDecIq4Xs<T> type; };

}  // namespace moekit
