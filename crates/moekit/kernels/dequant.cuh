// moekit/dequant.cuh — weight formats on the device: GGUF block structs and
// one decoder type per format, the single CUDA source of truth for the
// layouts of src/format/{mod.rs,affine.rs,ggml/blocks.rs}.
//
// A format is a C++ type F chosen by template argument (never an integer
// code):
//   F::CHUNK        weights one call of F::dequant decodes (divides 32)
//   F::UNIT_W       weights of the storage unit that tiles a row ...
//   F::UNIT_BYTES   ... and its bytes (row bytes = K / UNIT_W * UNIT_BYTES)
//   F::Scale        type of the per-group scales/biases (affine), else void
//   F::SUB          weights per sub-chunk sharing one scale and offset
//   F::HAS_B        whether the offsets can be non-zero
//   F::codes(row, c, q, a, b)  chunk c as codes q and, per sub-chunk s,
//                   scale a[s] and offset b[s]: weight i = q[i]·a[i/SUB] + b[i/SUB]
//   F::dequant(row, c, out)    weights c*CHUNK .. c*CHUNK+CHUNK of the row,
//                   = fadd(fmul(q, a), b) (Codes<F>, one definition for all)
// Kernels that dot many weights with the same x use the codes directly:
// Σ w·x = Σ_s a[s]·Σ q·x + b[s]·Σ x, two fewer operations per weight.
//
// Decoders are bit-identical in f32 to the CPU dequantizers: they round each
// product and sum exactly where the CPU does (`__fmul_rn`/`__fadd_rn`, which
// the compiler never contracts into an FMA).
//
// Alignment: the kernels require every weight tensor to start 16-byte aligned
// (checked on the host). Rows are whole storage units, so every unit (block,
// 32-code pack) starts at a multiple of gcd(UNIT_BYTES, 16), and each field's
// alignment is known at compile time (`align_at`), which picks the widest
// load: 16-byte `uint4` where the layout allows, else 8, 4, 2 or 1 bytes.
//
// The table-based GGUF formats (IQ4_NL, IQ4_XS, MXFP4) are in
// dequant_iq.cuh, MLX's mxfp4 / nvfp4 / mxfp8 in dequant_mlx.cuh, both
// included at the end of this file.
// Loads are plain (not __ldg): decoders also read rows staged in shared memory.
#pragma once
#include "moekit/common.cuh"

namespace moekit {

typedef unsigned short u16;
typedef signed char i8;
typedef u16 f16bits;  // an IEEE half stored as its bits (Rust: half::f16)

constexpr int QK_K = 256;       // weights per K-quant super-block
constexpr int K_SCALE_SIZE = 12;

// ---------------------------------------------------------------------------
// GGUF blocks, byte for byte llama.cpp's ggml-common.h (and blocks.rs).

struct block_q4_0 { f16bits d; u8 qs[16]; };
struct block_q4_1 { f16bits d, m; u8 qs[16]; };
struct block_q5_0 { f16bits d; u8 qh[4]; u8 qs[16]; };
struct block_q5_1 { f16bits d, m; u8 qh[4]; u8 qs[16]; };
struct block_q8_0 { f16bits d; i8 qs[32]; };
struct block_q2_K { u8 scales[QK_K / 16]; u8 qs[QK_K / 4]; f16bits d, dmin; };
struct block_q3_K { u8 hmask[QK_K / 8]; u8 qs[QK_K / 4]; u8 scales[12]; f16bits d; };
struct block_q4_K { f16bits d, dmin; u8 scales[K_SCALE_SIZE]; u8 qs[QK_K / 2]; };
struct block_q5_K { f16bits d, dmin; u8 scales[K_SCALE_SIZE]; u8 qh[QK_K / 8]; u8 qs[QK_K / 2]; };
struct block_q6_K { u8 ql[QK_K / 2]; u8 qh[QK_K / 4]; i8 scales[QK_K / 16]; f16bits d; };

static_assert(sizeof(block_q4_0) == 18, "wrong q4_0 block size/padding");
static_assert(sizeof(block_q4_1) == 20, "wrong q4_1 block size/padding");
static_assert(sizeof(block_q5_0) == 22, "wrong q5_0 block size/padding");
static_assert(sizeof(block_q5_1) == 24, "wrong q5_1 block size/padding");
static_assert(sizeof(block_q8_0) == 34, "wrong q8_0 block size/padding");
static_assert(sizeof(block_q2_K) == 84, "wrong q2_K block size/padding");
static_assert(sizeof(block_q3_K) == 110, "wrong q3_K block size/padding");
static_assert(sizeof(block_q4_K) == 144, "wrong q4_K block size/padding");
static_assert(sizeof(block_q5_K) == 176, "wrong q5_K block size/padding");
static_assert(sizeof(block_q6_K) == 210, "wrong q6_K block size/padding");

// Byte offsets of the fields the decoders load with wide loads (NVRTC has no
// offsetof). Each is the sum of the sizes of the fields before it, which is
// the offset because the blocks have no padding: the sizes asserted above
// equal the sums of all field sizes (asserted here).
#define MOEKIT_SZ(B, f) ((int)sizeof(B::f))
static_assert(MOEKIT_SZ(block_q4_0, d) + MOEKIT_SZ(block_q4_0, qs) == 18, "q4_0 padding");
static_assert(2 * MOEKIT_SZ(block_q4_1, d) + MOEKIT_SZ(block_q4_1, qs) == 20, "q4_1 padding");
static_assert(MOEKIT_SZ(block_q5_0, d) + MOEKIT_SZ(block_q5_0, qh) + MOEKIT_SZ(block_q5_0, qs) == 22, "q5_0 padding");
static_assert(2 * MOEKIT_SZ(block_q5_1, d) + MOEKIT_SZ(block_q5_1, qh) + MOEKIT_SZ(block_q5_1, qs) == 24, "q5_1 padding");
static_assert(MOEKIT_SZ(block_q8_0, d) + MOEKIT_SZ(block_q8_0, qs) == 34, "q8_0 padding");
static_assert(MOEKIT_SZ(block_q2_K, scales) + MOEKIT_SZ(block_q2_K, qs) + 2 * MOEKIT_SZ(block_q2_K, d) == 84, "q2_K padding");
static_assert(MOEKIT_SZ(block_q3_K, hmask) + MOEKIT_SZ(block_q3_K, qs) + MOEKIT_SZ(block_q3_K, scales) + MOEKIT_SZ(block_q3_K, d) == 110, "q3_K padding");
static_assert(2 * MOEKIT_SZ(block_q4_K, d) + MOEKIT_SZ(block_q4_K, scales) + MOEKIT_SZ(block_q4_K, qs) == 144, "q4_K padding");
static_assert(2 * MOEKIT_SZ(block_q5_K, d) + MOEKIT_SZ(block_q5_K, scales) + MOEKIT_SZ(block_q5_K, qh) + MOEKIT_SZ(block_q5_K, qs) == 176, "q5_K padding");
static_assert(MOEKIT_SZ(block_q6_K, ql) + MOEKIT_SZ(block_q6_K, qh) + MOEKIT_SZ(block_q6_K, scales) + MOEKIT_SZ(block_q6_K, d) == 210, "q6_K padding");

constexpr int Q4_0_QS = MOEKIT_SZ(block_q4_0, d);
constexpr int Q4_1_D = 0, Q4_1_QS = 2 * MOEKIT_SZ(block_q4_1, d);
constexpr int Q5_0_QH = MOEKIT_SZ(block_q5_0, d), Q5_0_QS = Q5_0_QH + MOEKIT_SZ(block_q5_0, qh);
constexpr int Q5_1_D = 0, Q5_1_QH = 2 * MOEKIT_SZ(block_q5_1, d), Q5_1_QS = Q5_1_QH + MOEKIT_SZ(block_q5_1, qh);
constexpr int Q8_0_QS = MOEKIT_SZ(block_q8_0, d);
constexpr int Q2_K_QS = MOEKIT_SZ(block_q2_K, scales), Q2_K_D = Q2_K_QS + MOEKIT_SZ(block_q2_K, qs);
constexpr int Q3_K_HMASK = 0, Q3_K_QS = MOEKIT_SZ(block_q3_K, hmask), Q3_K_SCALES = Q3_K_QS + MOEKIT_SZ(block_q3_K, qs);
constexpr int K4_HEADER = 2 * MOEKIT_SZ(block_q4_K, d) + MOEKIT_SZ(block_q4_K, scales);  // d, dmin, scales
constexpr int Q4_K_QS = K4_HEADER;
constexpr int Q5_K_QH = K4_HEADER, Q5_K_QS = Q5_K_QH + MOEKIT_SZ(block_q5_K, qh);
constexpr int Q6_K_QL = 0, Q6_K_QH = MOEKIT_SZ(block_q6_K, ql);
static_assert(K4_HEADER == 16 && 2 * MOEKIT_SZ(block_q5_K, d) + MOEKIT_SZ(block_q5_K, scales) == K4_HEADER, "Q4_K/Q5_K header");
#undef MOEKIT_SZ

// ---------------------------------------------------------------------------
// Loads.

constexpr int cgcd(int a, int b) { return b == 0 ? a : cgcd(b, a % b); }

// Alignment of byte `off` of a unit of `unit_bytes` that tiles a 16-aligned row.
constexpr int align_at(int unit_bytes, int off) { return cgcd(cgcd(unit_bytes, 16), off == 0 ? 16 : off); }

// Loads N bytes (N % 4 == 0) at `src`, whose address is a multiple of A, into
// little-endian words, with the widest loads A allows.
template <int N, int A>
__device__ __forceinline__ void load_words(const u8* src, u32 (&w)[N / 4]) {
  static_assert(N % 4 == 0, "whole words");
  if constexpr (A % 16 == 0 && N % 16 == 0) {
    const uint4* s = reinterpret_cast<const uint4*>(src);
#pragma unroll
    for (int i = 0; i < N / 16; ++i) {
      const uint4 v = s[i];
      w[4 * i] = v.x; w[4 * i + 1] = v.y; w[4 * i + 2] = v.z; w[4 * i + 3] = v.w;
    }
  } else if constexpr (A % 8 == 0 && N % 8 == 0) {
    const uint2* s = reinterpret_cast<const uint2*>(src);
#pragma unroll
    for (int i = 0; i < N / 8; ++i) {
      const uint2 v = s[i];
      w[2 * i] = v.x; w[2 * i + 1] = v.y;
    }
  } else if constexpr (A % 4 == 0) {
    const unsigned int* s = reinterpret_cast<const unsigned int*>(src);
#pragma unroll
    for (int i = 0; i < N / 4; ++i) w[i] = s[i];
  } else if constexpr (A % 2 == 0) {
    const unsigned short* s = reinterpret_cast<const unsigned short*>(src);
#pragma unroll
    for (int i = 0; i < N / 4; ++i) w[i] = (u32)s[2 * i] | ((u32)s[2 * i + 1] << 16);
  } else {
    // Byte-aligned units (MXFP4's 17-byte blocks).
#pragma unroll
    for (int i = 0; i < N / 4; ++i)
      w[i] = (u32)src[4 * i] | ((u32)src[4 * i + 1] << 8) | ((u32)src[4 * i + 2] << 16) | ((u32)src[4 * i + 3] << 24);
  }
}

// The 2-byte value at `src` (2-aligned).
__device__ __forceinline__ u32 load_u16(const void* src) { return *reinterpret_cast<const unsigned short*>(src); }

// The float of a small code q (< 2^23) minus `sub`, exact, without the slow
// integer-to-float conversion: 2^23 + q is q's bits under the exponent of
// 2^23, and one exact subtraction removes 2^23 + sub.
__device__ __forceinline__ float code_f(u32 q, u32 sub) {
  return __fsub_rn(__uint_as_float(0x4B000000u | q), 8388608.f + (float)sub);
}

// Byte i (compile-time after unrolling) of a word array.
template <int N>
__device__ __forceinline__ u32 byte_of(const u32 (&w)[N], int i) { return (w[i >> 2] >> ((i & 3) * 8)) & 0xFFu; }

__device__ __forceinline__ float half_bits_to_f32(u32 bits) { return __half2float(__ushort_as_half((u16)bits)); }

// ---------------------------------------------------------------------------
// A weight row as the decoders read it.

struct QRow {
  const u8* data;     // the row's packed bytes (16-aligned tensor, see above)
  const u8* scales;   // affine: the row's K/group_size scales (else null)
  const u8* biases;   // affine: the row's biases
  u32 k;              // K
  u32 group_shift;    // affine: log2(group size)
};

template <typename T> struct is_void { static constexpr bool value = false; };
template <> struct is_void<void> { static constexpr bool value = true; };

// F's scale type, or u8 for formats without scale tensors (so that sizeof is
// always valid; only used where F::Scale is not void).
template <typename S> struct aux_of { typedef S type; };
template <> struct aux_of<void> { typedef u8 type; };
template <typename F> struct aux_t { typedef typename aux_of<typename F::Scale>::type type; };

// One weight source: a [E, rows, K] tensor of the kernel's format; the kernel
// uses rows row_offset .. row_offset + N of each expert.
struct WeightSrc {
  const u8* data;
  const u8* scales;   // affine only, else null
  const u8* biases;
  u32 rows;           // rows per expert
  u32 row_offset;
};
static_assert(sizeof(WeightSrc) == 32, "WeightSrc layout");


// Row `row` (= expert · rows + n) of a weight tensor of format F.
template <typename F>
__device__ __forceinline__ QRow make_row(const u8* data, const u8* scales, const u8* biases, u64 row, u32 k, u32 group_shift) {
  QRow r;
  r.data = data + row * ((u64)k / F::UNIT_W * F::UNIT_BYTES);
  r.scales = r.biases = nullptr;
  if constexpr (!is_void<typename F::Scale>::value) {
    const u64 aux = row * (u64)(k >> group_shift) * sizeof(typename F::Scale);
    r.scales = scales + aux;
    r.biases = biases + aux;
  }
  r.k = k;
  r.group_shift = group_shift;
  return r;
}

// Bulk L2 prefetch (sm_90: one instruction a 64 KB piece, no registers
// held; a no-op before sm_90) of the 16-byte words inside [a, b).
__device__ __forceinline__ void l2_prefetch(const u8* a, const u8* b) {
#if __CUDA_ARCH__ >= 900
  u64 lo = (reinterpret_cast<u64>(a) + 15) & ~15ull;
  const u64 hi = reinterpret_cast<u64>(b) & ~15ull;
  while (lo < hi) {
    const u32 n = (u32)min(hi - lo, (u64)(64u << 10));
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(lo), "r"(n) : "memory");
    lo += n;
  }
#endif
}

// L2 prefetch of n ≥ 1 consecutive rows from row `row` of a tensor of
// format F (make_row's layout): their data, and their scales and biases
// where the tensor has them (null pointers are skipped).
template <typename F>
__device__ __forceinline__ void l2_prefetch_rows(const u8* data, const u8* scales, const u8* biases, u64 row, u32 n,
                                                 u32 k, u32 group_shift) {
  const u64 rb = (u64)k / F::UNIT_W * F::UNIT_BYTES;
  l2_prefetch(data + row * rb, data + (row + n) * rb);
  if constexpr (!is_void<typename F::Scale>::value) {
    const u64 ab = (u64)(k >> group_shift) * sizeof(typename F::Scale);
    if (scales != nullptr) l2_prefetch(scales + row * ab, scales + (row + n) * ab);
    if (biases != nullptr) l2_prefetch(biases + row * ab, biases + (row + n) * ab);
  }
}

template <typename W> __device__ __forceinline__ float widen_bits(u32 bits);
template <> __device__ __forceinline__ float widen_bits<float>(u32 bits) { return __uint_as_float(bits); }
template <> __device__ __forceinline__ float widen_bits<__half>(u32 bits) { return half_bits_to_f32(bits); }
template <> __device__ __forceinline__ float widen_bits<__nv_bfloat16>(u32 bits) { return __uint_as_float(bits << 16); }

// The shared dequantization of every format: its codes, scaled and offset
// per sub-chunk, rounded exactly as the CPU dequantizers round.
template <typename F>
struct Codes {
  template <int CHUNK>
  __device__ static __forceinline__ void dequant(const QRow& r, u32 c, float (&out)[CHUNK]) {
    constexpr int NSUB = CHUNK / F::SUB;
    float q[CHUNK], a[NSUB], b[NSUB];
    F::codes(r, c, q, a, b);
#pragma unroll
    for (int i = 0; i < CHUNK; ++i) out[i] = __fadd_rn(__fmul_rn(q[i], a[i / F::SUB]), b[i / F::SUB]);
  }
};

// ---------------------------------------------------------------------------
// Dense f32 / f16 / bf16: K is any length; rows are 16-byte loadable only
// when K is a multiple of CHUNK, else read element by element.

template <typename W>
struct FmtDense : Codes<FmtDense<W>> {
  static constexpr int CHUNK = 16 / (int)sizeof(W);
  static constexpr int UNIT_W = 1, UNIT_BYTES = sizeof(W);
  static constexpr int SUB = CHUNK;
  static constexpr bool HAS_B = false;
  typedef void Scale;
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[1], float (&kb)[1]) {
    ka[0] = 1.f;
    kb[0] = 0.f;
    const u32 k0 = c * CHUNK;
    if (r.k % CHUNK == 0) {
      u32 w[4];
      load_words<16, 16>(r.data + (u64)k0 * sizeof(W), w);
      constexpr int PER = 4 / (int)sizeof(W);  // values per word
#pragma unroll
      for (int i = 0; i < CHUNK; ++i) out[i] = widen_bits<W>(w[i / PER] >> (32 / PER * (i % PER)));
    } else {
      const W* p = reinterpret_cast<const W*>(r.data);
#pragma unroll
      for (int i = 0; i < CHUNK; ++i) out[i] = k0 + i < r.k ? to_f32(p[k0 + i]) : 0.f;
    }
  }
};

// ---------------------------------------------------------------------------
// MLX affine: 32 codes of BITS bits are BITS consecutive u32 words of the
// row's LSB-first bit stream; w = q·s + b with the group's scale and bias.
// The group size (32, 64 or 128) is a run-time shift: a chunk of 32 never
// straddles groups.

template <int BITS, typename S>
struct FmtAffine : Codes<FmtAffine<BITS, S>> {
  static_assert(BITS == 2 || BITS == 3 || BITS == 4 || BITS == 5 || BITS == 6 || BITS == 8, "affine bits");
  static constexpr int CHUNK = 32;
  static constexpr int UNIT_W = 32, UNIT_BYTES = 4 * BITS;
  static constexpr int SUB = 32;
  static constexpr bool HAS_B = true;
  typedef S Scale;
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[1], float (&kb)[1]) {
    u32 w[BITS];
    load_words<4 * BITS, align_at(UNIT_BYTES, 0)>(r.data + (u64)c * UNIT_BYTES, w);
    const u32 g = (c * 32) >> r.group_shift;
    ka[0] = to_f32(reinterpret_cast<const S*>(r.scales)[g]);
    kb[0] = to_f32(reinterpret_cast<const S*>(r.biases)[g]);
    constexpr u32 MASK = (1u << BITS) - 1;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int bit = j * BITS, i = bit >> 5, sh = bit & 31;
      u32 q = w[i] >> sh;
      if (sh + BITS > 32) q |= w[i + 1] << (32 - sh);
      out[j] = code_f(q & MASK, 0);
    }
  }
};

// mlx-native's unpacked affine: one u8 code per weight, f32 scales/biases.
struct FmtAffineU8 : Codes<FmtAffineU8> {
  static constexpr int CHUNK = 32;
  static constexpr int UNIT_W = 32, UNIT_BYTES = 32;
  static constexpr int SUB = 32;
  static constexpr bool HAS_B = true;
  typedef float Scale;
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[1], float (&kb)[1]) {
    u32 w[8];
    load_words<32, 16>(r.data + (u64)c * 32, w);
    const u32 g = (c * 32) >> r.group_shift;
    ka[0] = reinterpret_cast<const float*>(r.scales)[g];
    kb[0] = reinterpret_cast<const float*>(r.biases)[g];
#pragma unroll
    for (int j = 0; j < 32; ++j) out[j] = code_f(byte_of(w, j), 0);
  }
};

// ---------------------------------------------------------------------------
// GGUF 32-weight blocks: chunk c is block c.

struct FmtQ4_0 : Codes<FmtQ4_0> {
  typedef block_q4_0 B;
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
    load_words<16, align_at(UNIT_BYTES, Q4_0_QS)>(b->qs, qs);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int q = (int)byte_of(qs, j);
      out[j] = code_f(q & 15, 8);
      out[j + 16] = code_f(q >> 4, 8);
    }
  }
};

struct FmtQ4_1 : Codes<FmtQ4_1> {
  typedef block_q4_1 B;
  static constexpr int CHUNK = 32, UNIT_W = 32, UNIT_BYTES = sizeof(B);
  static constexpr int SUB = 32;
  static constexpr bool HAS_B = true;
  typedef void Scale;
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[CHUNK / SUB],
                                                    float (&kb)[CHUNK / SUB]) {
    const B* b = reinterpret_cast<const B*>(r.data) + c;
    u32 dm[1], qs[4];
    load_words<4, align_at(UNIT_BYTES, Q4_1_D)>(reinterpret_cast<const u8*>(&b->d), dm);
    load_words<16, align_at(UNIT_BYTES, Q4_1_QS)>(b->qs, qs);
    ka[0] = half_bits_to_f32(dm[0]);
    kb[0] = half_bits_to_f32(dm[0] >> 16);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const u32 q = byte_of(qs, j);
      out[j] = code_f(q & 15, 0);
      out[j + 16] = code_f(q >> 4, 0);
    }
  }
};

// The 32 5-bit codes of a Q5_0/Q5_1 block: weight j < 16 is the low nibble
// of qs[j], weight j + 16 its high nibble; bit 4 of weight j is bit j of qh.
__device__ __forceinline__ u32 five_bit_code(const u32 (&qs)[4], u32 qh, int j) {
  const u32 nib = j < 16 ? byte_of(qs, j) & 15 : byte_of(qs, j - 16) >> 4;
  return nib | (((qh >> j) & 1u) << 4);
}

struct FmtQ5_0 : Codes<FmtQ5_0> {
  typedef block_q5_0 B;
  static constexpr int CHUNK = 32, UNIT_W = 32, UNIT_BYTES = sizeof(B);
  static constexpr int SUB = 32;
  static constexpr bool HAS_B = false;
  typedef void Scale;
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[CHUNK / SUB],
                                                    float (&kb)[CHUNK / SUB]) {
    const B* b = reinterpret_cast<const B*>(r.data) + c;
    ka[0] = half_bits_to_f32(load_u16(&b->d));
    kb[0] = 0.f;
    u32 qh[1], qs[4];
    load_words<4, align_at(UNIT_BYTES, Q5_0_QH)>(b->qh, qh);
    load_words<16, align_at(UNIT_BYTES, Q5_0_QS)>(b->qs, qs);
#pragma unroll
    for (int j = 0; j < 32; ++j) out[j] = code_f(five_bit_code(qs, qh[0], j), 16);
  }
};

struct FmtQ5_1 : Codes<FmtQ5_1> {
  typedef block_q5_1 B;
  static constexpr int CHUNK = 32, UNIT_W = 32, UNIT_BYTES = sizeof(B);
  static constexpr int SUB = 32;
  static constexpr bool HAS_B = true;
  typedef void Scale;
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[CHUNK / SUB],
                                                    float (&kb)[CHUNK / SUB]) {
    const B* b = reinterpret_cast<const B*>(r.data) + c;
    u32 dm[1], qh[1], qs[4];
    load_words<4, align_at(UNIT_BYTES, Q5_1_D)>(reinterpret_cast<const u8*>(&b->d), dm);
    load_words<4, align_at(UNIT_BYTES, Q5_1_QH)>(b->qh, qh);
    load_words<16, align_at(UNIT_BYTES, Q5_1_QS)>(b->qs, qs);
    ka[0] = half_bits_to_f32(dm[0]);
    kb[0] = half_bits_to_f32(dm[0] >> 16);
#pragma unroll
    for (int j = 0; j < 32; ++j) out[j] = code_f(five_bit_code(qs, qh[0], j), 0);
  }
};

struct FmtQ8_0 : Codes<FmtQ8_0> {
  typedef block_q8_0 B;
  static constexpr int CHUNK = 32, UNIT_W = 32, UNIT_BYTES = sizeof(B);
  static constexpr int SUB = 32;
  static constexpr bool HAS_B = false;
  typedef void Scale;
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[CHUNK / SUB],
                                                    float (&kb)[CHUNK / SUB]) {
    const B* b = reinterpret_cast<const B*>(r.data) + c;
    ka[0] = half_bits_to_f32(load_u16(&b->d));
    kb[0] = 0.f;
    u32 qs[8];
    load_words<32, align_at(UNIT_BYTES, Q8_0_QS)>(reinterpret_cast<const u8*>(b->qs), qs);
#pragma unroll
    for (int j = 0; j < 32; ++j) out[j] = code_f(byte_of(qs, j) ^ 0x80u, 128);  // (b ^ 0x80) − 128 = (i8)b
  }
};

// ---------------------------------------------------------------------------
// K-quants: super-blocks of 256; chunk c is weights 32·(c % 8) .. of
// super-block c / 8, decoded on its own (its scales, codes and high bits).

// Q2_K / Q3_K / Q6_K order weights 128h + 32s + l (half h, shift s, lane l);
// their 16-weight groups are 8h + 2s + l/16. Chunk g of a super-block is (h, s) = (g/4, g%4).

struct FmtQ2_K : Codes<FmtQ2_K> {
  typedef block_q2_K B;
  static constexpr int CHUNK = 32, UNIT_W = QK_K, UNIT_BYTES = sizeof(B);
  static constexpr int SUB = 16;
  static constexpr bool HAS_B = true;
  typedef void Scale;
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[CHUNK / SUB],
                                                    float (&kb)[CHUNK / SUB]) {
    const B* b = reinterpret_cast<const B*>(r.data) + (c >> 3);
    const u32 g = c & 7, h = g >> 2, s = g & 3;
    u32 dd[1], qs[8];
    load_words<4, align_at(UNIT_BYTES, Q2_K_D)>(reinterpret_cast<const u8*>(&b->d), dd);
    load_words<32, align_at(UNIT_BYTES, Q2_K_QS)>(b->qs + 32 * h, qs);
    const u32 sc2 = load_u16(b->scales + 8 * h + 2 * s);  // groups 8h+2s and 8h+2s+1
    const float d = half_bits_to_f32(dd[0]), dmin = half_bits_to_f32(dd[0] >> 16);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const u32 sc = (sc2 >> (8 * half)) & 0xFFu;
      ka[half] = __fmul_rn(d, (float)(sc & 15));
      kb[half] = -__fmul_rn(dmin, (float)(sc >> 4));
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int l = 16 * half + i;
        out[l] = code_f((byte_of(qs, l) >> (2 * s)) & 3, 0);
      }
    }
  }
};

struct FmtQ3_K : Codes<FmtQ3_K> {
  typedef block_q3_K B;
  static constexpr int CHUNK = 32, UNIT_W = QK_K, UNIT_BYTES = sizeof(B);
  static constexpr int SUB = 16;
  static constexpr bool HAS_B = false;
  typedef void Scale;
  // Signed 6-bit scale j of the 12 packed bytes (words sw): low 4 bits from
  // byte j (j < 8, low nibble) or j − 8 (high nibble), high 2 from byte 8 + j%4.
  __device__ static __forceinline__ int scale(const u32 (&sw)[3], u32 j) {
    auto byte = [&](u32 i) -> u32 { return ((i < 4 ? sw[0] : i < 8 ? sw[1] : sw[2]) >> (8 * (i & 3))) & 0xFFu; };
    const u32 low = j < 8 ? byte(j) & 15 : byte(j - 8) >> 4;
    const u32 high = (byte(8 + (j & 3)) >> (2 * (j >> 2))) & 3;
    return (int)(low | (high << 4)) - 32;
  }
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[CHUNK / SUB],
                                                    float (&kb)[CHUNK / SUB]) {
    const B* b = reinterpret_cast<const B*>(r.data) + (c >> 3);
    const u32 g = c & 7, h = g >> 2, s = g & 3;
    u32 hm[8], qs[8], sw[3];
    load_words<32, align_at(UNIT_BYTES, Q3_K_HMASK)>(b->hmask, hm);
    load_words<32, align_at(UNIT_BYTES, Q3_K_QS)>(b->qs + 32 * h, qs);
    load_words<12, align_at(UNIT_BYTES, Q3_K_SCALES)>(b->scales, sw);
    const float d = half_bits_to_f32(load_u16(&b->d));
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      ka[half] = __fmul_rn(d, (float)scale(sw, 8 * h + 2 * s + half));
      kb[half] = 0.f;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int l = 16 * half + i;
        // v = low 2 bits − (high bit clear ? 4 : 0) = (low + 4·high) − 4
        const u32 v = ((byte_of(qs, l) >> (2 * s)) & 3) | (((byte_of(hm, l) >> g) & 1) << 2);
        out[l] = code_f(v, 4);
      }
    }
  }
};

// Q4_K / Q5_K: 8 groups of 32 (group = chunk g); (scale, min) of group g
// from the 12 packed bytes, held as words s0 = bytes 0..4, s1 = 4..8, s2 = 8..12
// (`get_scale_min_k4`).
__device__ __forceinline__ void scale_min_k4(u32 s0, u32 s1, u32 s2, u32 g, u32& sc, u32& m) {
  if (g < 4) {
    sc = (s0 >> (8 * g)) & 63;
    m = (s1 >> (8 * g)) & 63;
  } else {
    const u32 sh = 8 * (g - 4);
    sc = ((s2 >> sh) & 15) | (((s0 >> sh) >> 6 & 3) << 4);
    m = ((s2 >> sh) >> 4 & 15) | (((s1 >> sh) >> 6 & 3) << 4);
  }
}

// The shared header of Q4_K and Q5_K (d, dmin, scales: 16 bytes at 0) →
// the group's `d·sc` and `dmin·m`.
template <typename B>
__device__ __forceinline__ void k4_group(const B* b, u32 g, float& dl, float& ml) {
  u32 hdr[4];
  load_words<16, align_at(sizeof(B), 0)>(reinterpret_cast<const u8*>(b), hdr);
  u32 sc, m;
  scale_min_k4(hdr[1], hdr[2], hdr[3], g, sc, m);
  dl = __fmul_rn(half_bits_to_f32(hdr[0]), (float)sc);
  ml = __fmul_rn(half_bits_to_f32(hdr[0] >> 16), (float)m);
}

struct FmtQ4_K : Codes<FmtQ4_K> {
  typedef block_q4_K B;
  static constexpr int CHUNK = 32, UNIT_W = QK_K, UNIT_BYTES = sizeof(B);
  static constexpr int SUB = 32;
  static constexpr bool HAS_B = true;
  typedef void Scale;
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[CHUNK / SUB],
                                                    float (&kb)[CHUNK / SUB]) {
    const B* b = reinterpret_cast<const B*>(r.data) + (c >> 3);
    const u32 g = c & 7;
    float ml;
    k4_group(b, g, ka[0], ml);
    kb[0] = -ml;
    u32 qs[8];
    load_words<32, align_at(UNIT_BYTES, Q4_K_QS)>(b->qs + 32 * (g >> 1), qs);
    const u32 shift = 4 * (g & 1);
#pragma unroll
    for (int l = 0; l < 32; ++l) out[l] = code_f((byte_of(qs, l) >> shift) & 15, 0);
  }
};

struct FmtQ5_K : Codes<FmtQ5_K> {
  typedef block_q5_K B;
  static constexpr int CHUNK = 32, UNIT_W = QK_K, UNIT_BYTES = sizeof(B);
  static constexpr int SUB = 32;
  static constexpr bool HAS_B = true;
  typedef void Scale;
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[CHUNK / SUB],
                                                    float (&kb)[CHUNK / SUB]) {
    const B* b = reinterpret_cast<const B*>(r.data) + (c >> 3);
    const u32 g = c & 7;
    float ml;
    k4_group(b, g, ka[0], ml);
    kb[0] = -ml;
    u32 qh[8], qs[8];
    load_words<32, align_at(UNIT_BYTES, Q5_K_QH)>(b->qh, qh);
    load_words<32, align_at(UNIT_BYTES, Q5_K_QS)>(b->qs + 32 * (g >> 1), qs);
    const u32 shift = 4 * (g & 1);
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      const u32 v = ((byte_of(qs, l) >> shift) & 15) | (((byte_of(qh, l) >> g) & 1) << 4);
      out[l] = code_f(v, 0);
    }
  }
};

struct FmtQ6_K : Codes<FmtQ6_K> {
  typedef block_q6_K B;
  static constexpr int CHUNK = 32, UNIT_W = QK_K, UNIT_BYTES = sizeof(B);
  static constexpr int SUB = 16;
  static constexpr bool HAS_B = false;
  typedef void Scale;
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[CHUNK / SUB],
                                                    float (&kb)[CHUNK / SUB]) {
    const B* b = reinterpret_cast<const B*>(r.data) + (c >> 3);
    const u32 g = c & 7, h = g >> 2, s = g & 3;
    u32 ql[8], qh[8];
    // Low 4 bits: ql[64h + 32(s%2) + l] >> 4(s/2); high 2: qh[32h + l] >> 2s.
    load_words<32, align_at(UNIT_BYTES, Q6_K_QL)>(b->ql + 64 * h + 32 * (s & 1), ql);
    load_words<32, align_at(UNIT_BYTES, Q6_K_QH)>(b->qh + 32 * h, qh);
    const u32 sc2 = load_u16(b->scales + 8 * h + 2 * s);  // groups 8h+2s and 8h+2s+1
    const float d = half_bits_to_f32(load_u16(&b->d));
    const u32 lshift = 4 * (s >> 1), hshift = 2 * s;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      ka[half] = __fmul_rn(d, (float)(i8)((sc2 >> (8 * half)) & 0xFFu));
      kb[half] = 0.f;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int l = 16 * half + i;
        const u32 q = ((byte_of(ql, l) >> lshift) & 15) | (((byte_of(qh, l) >> hshift) & 3) << 4);
        out[l] = code_f(q, 32);
      }
    }
  }
};

}  // namespace moekit

#include "moekit/dequant_iq.cuh"
#include "moekit/dequant_mlx.cuh"
#include "moekit/dequant_fp8.cuh"
