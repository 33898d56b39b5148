// moekit/decode_mma.cuh — tensor-core dot products for the decode path
// (decode.cu): a warp multiplies a 16-row weight tile by up to 8·NT tokens
// with mma.sync m16n8k16, the weights decoded from global memory straight
// into A fragments by the tensor-core GEMM's tile decoders (tc_decode.cuh),
// with no shared-memory round trip.
//
// K is walked in spans of 128 columns. In a span, lane (g, c) = (lane / 4,
// lane % 4) owns the 32 columns 32c .. 32c + 31 of weight rows g and g + 8
// (one decoder slice each) and of token g's activation row. The MMA's
// logical k is mapped onto these physical columns — MMA j of the span (8 per
// span) takes 4 of the lane's columns, 32c + 4j .. 32c + 4j + 3 or, for MLX
// 4-bit and Q4_K weights, pairs of columns 4 or 2 apart (SpanOrder below)
// — for A and B
// alike, so the products are those of the plain dot product, summed in a
// fixed order that depends on K and the format only (deterministic, batch
// invariant).
// Every load of a span is a 16-byte load of 32 consecutive weights (or 8
// activations), and 4 lanes read a row's 128 consecutive columns.
#pragma once
#include "moekit/tc_decode.cuh"
#include "moekit/mma.cuh"

namespace moekit {

constexpr u32 MMA_SPAN = 128;  // columns of one span

// Weights already of the activation type: the slice's 64 bytes are its units.
template <typename T>
struct DecSame {
  uint4 v[4];
  __device__ __forceinline__ void load(const TcSlice& s) {
    const uint4* p = reinterpret_cast<const uint4*>(s.data + 2 * s.col);
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = s.cols != 0 ? __ldg(p + u) : make_uint4(0, 0, 0, 0);
  }
  __device__ __forceinline__ uint4 unit(int u) const { return v[u]; }
};

// The decode path's decoder of F for activations T.
template <typename F, typename T> struct DecOf { typedef typename TcDecOf<F, T>::type type; };
template <typename T> struct DecOf<FmtDense<T>, T> { typedef DecSame<T> type; };

// The orders a decoder pairs a lane's columns in (tc_ra.rs `SpanOrder`). A
// lane's 32 columns of a span come as 4 units of 4 pairs; MMA step 2u +
// (i >> 1) takes pair i of unit u as k 2c + 8(i & 1) (+1 for the pair's
// second weight), for weights and activations alike. Pair i of unit u is
// columns 8u + span_first(O, i) and span_apart(O) further:
//   SPAN_PAIRS: unit(u), adjacent columns (2i, 2i + 1) — every decoder;
//   SPAN_NIBBLES: unit_raw(u), columns 4 apart (i, i + 4) — the order MLX
//     4-bit codes unpack in (4 nibbles a LOP3, 16 bits apart);
//   SPAN_ALTERNATE: unit_raw(u), columns 2 apart ((i & 1) + 4(i >> 1), + 2)
//     — the order Q4_K's codes unpack in (nibbles of bytes 0 and 2).
// In the raw orders the decoder needs no PRMT to pair its codes (SpanOf
// says which decoders have one). The decode path pairs its activations so
// (x_pairs); tc_ra takes x permuted into the order (ra_permute).
enum SpanOrder : u32 { SPAN_PAIRS = 0, SPAN_NIBBLES = 1, SPAN_ALTERNATE = 2 };
__host__ __device__ constexpr u32 span_first(u32 o, u32 i) {
  return o == SPAN_PAIRS ? 2 * i : o == SPAN_NIBBLES ? i : (i & 1u) + 4 * (i >> 1);
}
__host__ __device__ constexpr u32 span_apart(u32 o) { return o == SPAN_PAIRS ? 1 : o == SPAN_NIBBLES ? 4 : 2; }
template <typename D> struct SpanOf { static constexpr SpanOrder value = SPAN_PAIRS; };
template <typename S, typename T> struct SpanOf<TcDecAffine4<S, T>> { static constexpr SpanOrder value = SPAN_NIBBLES; };
template <typename T> struct SpanOf<TcDecQ4K<T>> { static constexpr SpanOrder value = SPAN_ALTERNATE; };

// Unit u of decoder d, paired in its SpanOf order.
template <typename D>
__device__ __forceinline__ uint4 span_unit(const D& d, int u) {
  if constexpr (SpanOf<D>::value == SPAN_PAIRS) return d.unit(u);
  else return d.unit_raw(u);
}

// Pair i of order O from 8 consecutive 16-bit values held as 4 words
// (pairs (0,1) .. (6,7)): one PRMT, or the word itself for SPAN_PAIRS.
template <u32 O, int I>
__device__ __forceinline__ u32 pair_of_words(const u32 (&w)[4]) {
  constexpr u32 a = span_first(O, I), b = a + span_apart(O);
  if constexpr (b == a + 1 && a % 2 == 0) return w[a / 2];
  else return __byte_perm(w[a / 2], w[b / 2], ((a & 1) ? 0x32u : 0x10u) | ((b & 1) ? 0x7600u : 0x5400u));
}

// 8 consecutive activations (pairs (0,1) .. (6,7)) paired in order O.
template <u32 O>
__device__ __forceinline__ uint4 x_pairs(const uint4& v) {
  const u32 w[4] = {v.x, v.y, v.z, v.w};
  return make_uint4(pair_of_words<O, 0>(w), pair_of_words<O, 1>(w), pair_of_words<O, 2>(w), pair_of_words<O, 3>(w));
}

// The slice of row r at column kc (a multiple of 32) read from global
// memory; `valid` false (or kc ≥ K) gives a slice of no columns, which every
// decoder turns into zeros — reading, if at all, only inside the row's first
// unit (kc is clamped to 0).
template <typename F>
__device__ __forceinline__ TcSlice global_slice(const QRow& r, u32 kc, bool valid) {
  const bool ok = valid && kc < r.k;
  if (!ok) kc = 0;
  TcSlice s;
  if constexpr (F::UNIT_W > 32) {
    // K-quant super-blocks: the decoders address within one block.
    s.data = r.data + (kc / F::UNIT_W) * F::UNIT_BYTES;
    s.col = kc % F::UNIT_W;
    s.kr = F::UNIT_W;
  } else {
    s.data = r.data;
    s.col = kc;
    s.kr = r.k;
  }
  s.scales = r.scales;
  s.biases = r.biases;
  s.cols = ok ? 32u : 0u;
  s.group_shift = r.group_shift;
  s.lo = false;
  return s;
}

// Token g's 32 activations at kc as 16 T pairs (zeros for a missing token
// or kc ≥ k); rows are 16-byte aligned (K a multiple of 8).
template <typename T>
__device__ __forceinline__ void load_x32(const T* row, u32 kc, u32 k, uint4 (&v)[4]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) v[q] = make_uint4(0, 0, 0, 0);
  if (row != nullptr && kc < k) {
    const uint4* p = reinterpret_cast<const uint4*>(row + kc);
#pragma unroll
    for (int q = 0; q < 4; ++q) v[q] = __ldg(p + q);
  }
}

// Whether a warp holds the next span's loads while it computes this one
// (the next span's weights and activations in flight during the MMAs):
// where two spans' decoders and activations fit in about 80 registers.
template <typename F, typename T, int MATS, int NT>
struct Prefetch {
  static constexpr bool value = 2 * (MATS * 2 * sizeof(typename DecOf<F, T>::type) + NT * 64) <= 320;
};

// One span's loads: the decoders of rows g and g + 8 of every matrix at the
// lane's 32 columns, and its tokens' activations there (kc ≥ K or a span
// past n_spans: zeros, reading only inside the rows).
template <typename F, typename T, int MATS, int NT>
struct SpanLoads {
  typename DecOf<F, T>::type d[MATS][2];
  uint4 xv[NT][4];
  __device__ __forceinline__ void load(const QRow (&rows)[MATS][2], const T* const (&x)[NT], u32 s, u32 n_spans) {
    const u32 kc = s * MMA_SPAN + 32u * (threadIdx.x & 3u);
    const bool ok = s < n_spans;
#pragma unroll
    for (int m = 0; m < MATS; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) d[m][h].load(global_slice<F>(rows[m][h], kc, ok));
#pragma unroll
    for (int n = 0; n < NT; ++n) load_x32<T>(ok ? x[n] : nullptr, kc, rows[0][0].k, xv[n]);
  }
  // acc[m][n] += the span's products: per unit u (8 columns of each lane's
  // 32), MMAs 2u and 2u + 1 take pairs x, y and z, w of the unit, weights and
  // activations paired in the decoder's SpanOrder.
  __device__ __forceinline__ void mma(float (&acc)[MATS][NT][4]) const {
    typedef typename DecOf<F, T>::type Dec;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      uint4 a[MATS][2], xb[NT];
#pragma unroll
      for (int m = 0; m < MATS; ++m) {
        a[m][0] = span_unit(d[m][0], u);
        a[m][1] = span_unit(d[m][1], u);
      }
#pragma unroll
      for (int n = 0; n < NT; ++n) xb[n] = x_pairs<SpanOf<Dec>::value>(xv[n][u]);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
#pragma unroll
        for (int m = 0; m < MATS; ++m) {
          const u32 fa[4] = {half ? a[m][0].z : a[m][0].x, half ? a[m][1].z : a[m][1].x,
                             half ? a[m][0].w : a[m][0].y, half ? a[m][1].w : a[m][1].y};
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            const uint4& b = xb[n];
            Mma<T>::run(acc[m][n], fa, half ? b.z : b.x, half ? b.w : b.y);
          }
        }
      }
    }
  }
};

// acc[m][n] += rows[m] (a 16-row tile: this lane's rows g and g + 8) ×
// tokens x[n] (this lane's token g of n-tile n) over the spans s0, s0 + step,
// … below n_spans, in that order.
template <typename F, typename T, int MATS, int NT>
__device__ __forceinline__ void mma_spans(const QRow (&rows)[MATS][2], const T* const (&x)[NT], u32 s0, u32 step,
                                          u32 n_spans, float (&acc)[MATS][NT][4]) {
  typedef SpanLoads<F, T, MATS, NT> L;
  if constexpr (Prefetch<F, T, MATS, NT>::value) {
    if (s0 >= n_spans) return;
    L cur, nxt;
    cur.load(rows, x, s0, n_spans);
    for (u32 s = s0; s < n_spans; s += 2 * step) {
      nxt.load(rows, x, s + step, n_spans);  // in flight during cur's MMAs
      cur.mma(acc);
      if (s + step >= n_spans) break;
      cur.load(rows, x, s + 2 * step, n_spans);
      nxt.mma(acc);
    }
  } else {
    for (u32 s = s0; s < n_spans; s += step) {
      L cur;
      cur.load(rows, x, s, n_spans);
      cur.mma(acc);
    }
  }
}

}  // namespace moekit
