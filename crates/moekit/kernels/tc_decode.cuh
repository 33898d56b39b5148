// moekit/tc_decode.cuh — the tile decoders of the tensor-core GEMM
// (tc_gemm.cu): a thread's slice of a pipeline step, 32 consecutive weights
// of one weight row read from the raw stage in shared memory, as packed
// pairs of the activation type T, one 16-byte unit (8 weights) at a time.
//
// A decoder D has
//   D::load(slice)   reads what the slice needs from shared memory;
//   D::unit(u)       weights 8u .. 8u + 7 of the slice, packed (T pairs).
// The kernel calls load one step ahead and unit(u) after the u-th batch of
// MMAs, so the decoding work of the next step is spread over this step's
// tensor-core work.
//
// Every format has the generic decoder (`TcDecCodes`): F::codes, the same
// decoders the other paths use, one fmaf and one rounding to T per weight.
// Formats with packed codes where it pays have a fast one (`TcDecOf`
// specializations), which converts codes to T pairs with the magic-number
// trick (the code ORed under the exponent of 2^7 (bf16) or 2^10 (f16), one
// exact subtraction) and applies scale and offset with one packed FMA per
// pair (one rounding, of the exact q·s + b, where the generic decoder rounds
// twice: to f32, then to T). Fast decoders need their scales in T: MLX
// affine scales of the activation type as they are (others rounded once to
// T), K-quant sub-block scales (d·sc, dmin·m, exact in f32) rounded once to T.
#pragma once
#include "moekit/dequant.cuh"

namespace moekit {

template <typename A, typename B> struct is_same { static constexpr bool value = false; };
template <typename A> struct is_same<A, A> { static constexpr bool value = true; };

// A thread's slice: 32 weights of a weight row, staged in shared memory.
struct TcSlice {
  const u8* data;    // the row's staged bytes at the raw stage's first unit
  const u8* scales;  // affine: staged scales at the stage's first group
  const u8* biases;
  u32 col;           // first column of the slice within the raw stage (a multiple of 32)
  u32 cols;          // columns of the slice inside K and on a valid row: 0, or a multiple of 8 ≤ 32
  u32 kr;            // columns a raw stage holds
  u32 group_shift;
  bool lo;           // hi/lo split (P = 3): this row holds the low halves
};

// Packed pairs of T: the pair type, and the magic pair (c, c) with c | q = c
// + q exactly for codes q < 128 (bf16 c = 128) or < 1024 (f16 c = 1024).
template <typename T> struct PkType;
template <> struct PkType<__nv_bfloat16> {
  typedef __nv_bfloat162 V;
  static constexpr u32 MAGIC = 0x43004300u, NEG = 0xC300C300u;  // (128, 128), (−128, −128)
  __device__ static __forceinline__ V pair(float lo, float hi) { return __floats2bfloat162_rn(lo, hi); }
};
template <> struct PkType<__half> {
  typedef __half2 V;
  static constexpr u32 MAGIC = 0x64006400u, NEG = 0xE400E400u;  // (1024, 1024), (−1024, −1024)
  __device__ static __forceinline__ V pair(float lo, float hi) { return __floats2half2_rn(lo, hi); }
};
template <typename T>
struct Pk : PkType<T> {
  typedef typename PkType<T>::V V;
  __device__ static __forceinline__ V as_pair(const u32& bits) { return *reinterpret_cast<const V*>(&bits); }
  __device__ static __forceinline__ u32 bits(const V& v) { return *reinterpret_cast<const u32*>(&v); }
  __device__ static __forceinline__ u32 pack(float lo, float hi) { return bits(PkType<T>::pair(lo, hi)); }
  // v minus its rounding to T (exact in f32).
  __device__ static __forceinline__ float residual(float v) { return v - to_f32(from_f32<T>(v)); }
  // (x & mask) | MAGIC in one LOP3 (the compiler splits the two immediates
  // into two): codes under the magic pair's exponent.
  template <u32 MASK>
  __device__ static __forceinline__ u32 magic(u32 x) {
    u32 r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(x), "n"(MASK), "r"(PkType<T>::MAGIC));
    return r;
  }
  // (v + neg) · s + b, pairwise: codes under a magic pair, the pair's value
  // (and any code offset) removed by `neg`, scaled and offset.
  __device__ static __forceinline__ u32 scale(u32 v, u32 neg, u32 s, u32 b) {
    return bits(__hfma2(__hadd2(as_pair(v), as_pair(neg)), as_pair(s), as_pair(b)));
  }
  // The same with the magic pair's own NEG.
  __device__ static __forceinline__ u32 scale(u32 v, u32 s, u32 b) { return scale(v, PkType<T>::NEG, s, b); }
};

// The generic decoder: F::codes, fmaf, one rounding to T (and for the hi/lo
// split's low rows, the residual of that rounding).
template <typename F, typename T>
struct TcDecCodes {
  u32 v[16];
  __device__ __forceinline__ void load(const TcSlice& s) {
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = 0;
    if (s.cols == 0) return;
    QRow q;
    q.data = s.data;
    q.scales = s.scales;
    q.biases = s.biases;
    q.k = s.kr;
    q.group_shift = s.group_shift;
#pragma unroll
    for (int c = 0; c < 32 / F::CHUNK; ++c) {
      if ((u32)(c * F::CHUNK) >= s.cols) break;
      float w[F::CHUNK], a[F::CHUNK / F::SUB], b[F::CHUNK / F::SUB];
      F::codes(q, s.col / F::CHUNK + c, w, a, b);
#pragma unroll
      for (int i = 0; i < F::CHUNK; i += 2) {
        float lo = fmaf(w[i], a[i / F::SUB], b[i / F::SUB]);
        float hi = fmaf(w[i + 1], a[(i + 1) / F::SUB], b[(i + 1) / F::SUB]);
        if (s.lo) {
          lo = Pk<T>::residual(lo);
          hi = Pk<T>::residual(hi);
        }
        v[(c * F::CHUNK + i) / 2] = Pk<T>::pack(lo, hi);
      }
    }
  }
  __device__ __forceinline__ uint4 unit(int u) const { return make_uint4(v[4 * u], v[4 * u + 1], v[4 * u + 2], v[4 * u + 3]); }
};

// Dense weights of the activation type need no decoder: tc_gemm copies them
// straight into its B tiles (`TcDirect`).
template <typename F, typename T> struct TcDirect { static constexpr bool value = false; };
template <typename T> struct TcDirect<FmtDense<T>, T> { static constexpr bool value = true; };

// 8 codes of 4 bits at nibbles 0..7 of w (MLX affine order) → 4 T pairs
// as they unpack: codes (i, i + 4) (nibbles 4 apart sit 16 bits apart),
// scaled and offset.
template <typename T>
__device__ __forceinline__ uint4 nibbles8_raw(u32 w, u32 s2, u32 b2) {
  return make_uint4(Pk<T>::scale(Pk<T>::template magic<0x000F000Fu>(w), s2, b2),
                    Pk<T>::scale(Pk<T>::template magic<0x000F000Fu>(w >> 4), s2, b2),
                    Pk<T>::scale(Pk<T>::template magic<0x000F000Fu>(w >> 8), s2, b2),
                    Pk<T>::scale(Pk<T>::template magic<0x000F000Fu>(w >> 12), s2, b2));
}
// The same 8 codes as pairs (2i, 2i + 1).
template <typename T>
__device__ __forceinline__ uint4 nibbles8(u32 w, u32 s2, u32 b2) {
  const uint4 a = nibbles8_raw<T>(w, s2, b2);  // pairs (0,4), (1,5), (2,6), (3,7)
  return make_uint4(__byte_perm(a.x, a.y, 0x5410), __byte_perm(a.z, a.w, 0x5410), __byte_perm(a.x, a.y, 0x7632),
                    __byte_perm(a.z, a.w, 0x7632));
}

// Scale or offset bits of type S as a T pair: as they are when S is T, else
// through f32 (one rounding to T).
template <typename S, typename T>
__device__ __forceinline__ u32 pair_of(u32 bits) {
  if constexpr (is_same<S, T>::value) return bits | (bits << 16);
  else {
    const float v = widen_bits<S>(bits);
    return Pk<T>::pack(v, v);
  }
}

// The scale and bias of the slice's group, as raw bits of S.
template <typename S>
__device__ __forceinline__ void group_bits(const TcSlice& s, u32& sb, u32& bb) {
  const u32 g = s.col >> s.group_shift;
  if constexpr (sizeof(S) == 2) {
    sb = load_u16(s.scales + 2 * g);
    bb = load_u16(s.biases + 2 * g);
  } else {
    sb = reinterpret_cast<const u32*>(s.scales)[g];
    bb = reinterpret_cast<const u32*>(s.biases)[g];
  }
}

// MLX affine 4-bit (scales and biases of type S).
template <typename S, typename T>
struct TcDecAffine4 {
  uint4 w;
  u32 sb, bb;  // the group's scale and bias as loaded: paired at first use
  __device__ __forceinline__ void load(const TcSlice& s) {
    w = *reinterpret_cast<const uint4*>(s.data + s.col / 2);  // 16 bytes: 32 codes
    group_bits<S>(s, sb, bb);
    // No columns: scale and offset 0 give exact zeros, without a branch
    // between the MMAs the units are interleaved with.
    if (s.cols == 0) sb = bb = 0u;
  }
  // The scale and bias pairs. Computed where a unit is decoded rather than
  // at load, so that nothing waits for the loads before the units need
  // them (tc_ra loads two spans ahead).
  __device__ __forceinline__ u32 s2() const { return pair_of<S, T>(sb); }
  __device__ __forceinline__ u32 b2() const { return pair_of<S, T>(bb); }
  __device__ __forceinline__ uint4 unit(int u) const {
    return nibbles8<T>(u == 0 ? w.x : u == 1 ? w.y : u == 2 ? w.z : w.w, s2(), b2());
  }
  // Unit u in the order the codes unpack in (pairs of weights 4 apart:
  // (8u + i, 8u + i + 4), i < 4), without nibbles8's four PRMTs: for
  // kernels whose k order takes the pairs so (SPAN_NIBBLES, decode_mma.cuh).
  __device__ __forceinline__ uint4 unit_raw(int u) const {
    return nibbles8_raw<T>(u == 0 ? w.x : u == 1 ? w.y : u == 2 ? w.z : w.w, s2(), b2());
  }
};

// Unit u of a slice held as 32 bytes (q0, q1) of 4 codes a word: words 2u
// and 2u + 1, each through the decoder's `four` (4 codes → 2 T pairs).
template <typename D>
__device__ __forceinline__ uint4 unit_of_words(const D& d, const uint4& q0, const uint4& q1, int u) {
  const uint4 q = u < 2 ? q0 : q1;
  uint4 r;
  d.four((u & 1) ? q.z : q.x, r.x, r.y);
  d.four((u & 1) ? q.w : q.y, r.z, r.w);
  return r;
}

// One byte per code (MLX affine 8-bit, mlx-native u8): each code goes to
// f32 exactly under the exponent of 2^23 (one PRMT, one subtraction), then
// fmaf(q, s, b) and one rounding to T — the generic decoder's arithmetic,
// so the same bits, in fewer instructions (no shifts and masks per code).
template <typename S, typename T>
struct TcDecBytes {
  uint4 q0, q1;
  float sc, bi;
  __device__ __forceinline__ void load(const TcSlice& s) {
    q0 = *reinterpret_cast<const uint4*>(s.data + s.col);  // 32 bytes: 32 codes
    q1 = *reinterpret_cast<const uint4*>(s.data + s.col + 16);
    u32 sb, bb;
    group_bits<S>(s, sb, bb);
    sc = s.cols != 0 ? widen_bits<S>(sb) : 0.f;  // no columns: exact zeros
    bi = s.cols != 0 ? widen_bits<S>(bb) : 0.f;
  }
  // Codes 4i .. 4i + 3 of word w → two T pairs.
  __device__ __forceinline__ void four(u32 w, u32& lo, u32& hi) const {
    float v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      v[i] = fmaf(__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540u | i)) - 8388608.f, sc, bi);
    lo = Pk<T>::pack(v[0], v[1]);
    hi = Pk<T>::pack(v[2], v[3]);
  }
  __device__ __forceinline__ uint4 unit(int u) const { return unit_of_words(*this, q0, q1, u); }
};

// Q4_K: a raw stage is one super-block; the slice is group g = col / 32,
// codes = the low (g even) or high nibbles of qs[32·(g/2) ..].
template <typename T>
struct TcDecQ4K {
  uint4 q0, q1;
  u32 s2, b2, shift;
  __device__ __forceinline__ void load(const TcSlice& s) {
    const u8* blk = s.data;  // KR = QK_K: the stage's only block
    const u32 g = s.col / 32;
    const uint4 hdr = *reinterpret_cast<const uint4*>(blk);
    q0 = *reinterpret_cast<const uint4*>(blk + Q4_K_QS + 32 * (g >> 1));
    q1 = *reinterpret_cast<const uint4*>(blk + Q4_K_QS + 32 * (g >> 1) + 16);
    u32 sc, m;
    scale_min_k4(hdr.y, hdr.z, hdr.w, g, sc, m);
    const float dl = __fmul_rn(half_bits_to_f32(hdr.x), (float)sc);
    const float ml = __fmul_rn(half_bits_to_f32(hdr.x >> 16), (float)m);
    const bool ok = s.cols != 0;  // else exact zeros (see TcDecAffine4)
    s2 = ok ? Pk<T>::pack(dl, dl) : 0u;
    b2 = ok ? Pk<T>::pack(-ml, -ml) : 0u;
    shift = 4 * (g & 1);
  }
  // Codes l .. l + 3 at bits 8i + shift of w → pairs (l, l+1), (l+2, l+3),
  // or as they unpack (RAW): (l, l+2), (l+1, l+3).
  template <bool RAW = false>
  __device__ __forceinline__ void four(u32 w, u32& lo, u32& hi) const {
    const u32 y = w >> shift;
    const u32 a = Pk<T>::scale(Pk<T>::template magic<0x000F000Fu>(y), s2, b2); // (l, l+2)
    const u32 b = Pk<T>::scale(Pk<T>::template magic<0x000F000Fu>(y >> 8), s2, b2);  // (l+1, l+3)
    lo = RAW ? a : __byte_perm(a, b, 0x5410);
    hi = RAW ? b : __byte_perm(a, b, 0x7632);
  }
  __device__ __forceinline__ uint4 unit(int u) const { return unit_of_words(*this, q0, q1, u); }
  // Unit u paired as the codes unpack (SPAN_ALTERNATE: columns 2 apart),
  // without the 4 PRMTs a unit that unit(u) spends.
  __device__ __forceinline__ uint4 unit_raw(int u) const {
    const uint4 q = u < 2 ? q0 : q1;
    uint4 r;
    four<true>((u & 1) ? q.z : q.x, r.x, r.y);
    four<true>((u & 1) ? q.w : q.y, r.z, r.w);
    return r;
  }
};

// The decoder of format F for activations T: the generic one unless a fast
// one is specialized below (GGUF: in tc_decode_gguf.cuh, included at the end).
template <typename F, typename T> struct TcDecOf { typedef TcDecCodes<F, T> type; };
template <typename S, typename T> struct TcDecOf<FmtAffine<4, S>, T> { typedef TcDecAffine4<S, T> type; };
template <typename T> struct TcDecOf<FmtQ4_K, T> { typedef TcDecQ4K<T> type; };
template <typename S, typename T> struct TcDecOf<FmtAffine<8, S>, T> { typedef TcDecBytes<S, T> type; };
template <typename T> struct TcDecOf<FmtAffineU8, T> { typedef TcDecBytes<float, T> type; };

}  // namespace moekit

// The GGUF block decoders (Q8_0, Q4_0) and their TcDecOf specializations.
#include "moekit/tc_decode_gguf.cuh"
// The table decoders (IQ4_NL, IQ4_XS, MXFP4).
#include "moekit/tc_decode_iq.cuh"
