// norm.cu — RMS norm and the fused norm epilogues of an MoE layer
// (src/ops/norm.rs has the table of row functions).
//
// With n(v) = v · rsqrt(mean(v²) + eps) over one row of `dim` values, every
// epilogue is: build the row v from its source (input, residual + input, or
// the routing-weighted sum of k expert outputs), reduce Σv² over the block,
// then write E::finish(n(v)·w) per element. One block per row; the epilogue
// variant is the functor E, the activation type T, the norm-weight type W;
// variant-specific operand types (the scalar S, the residual's norm weight
// W2) are parameters of E. Arithmetic is f32; no atomics (deterministic).
//
// Elements are processed in groups of G = 16 / sizeof(T) (one 16-byte load
// of activations) when dim is a multiple of G and every operand is 16-byte
// aligned, else one at a time. v is staged in dynamic shared memory (`dim`
// floats) when the host sets `staged`, else recomputed from global memory in
// the second pass. Each thread reads back only what it staged itself.
#include "moekit/common.cuh"

namespace moekit {

struct NormParams {
  const void* input;         // [rows, dim] of T, or [rows, k, dim] (MoE)
  const float* moe_weights;  // [rows, k] (MoE variants)
  const void* residual;      // [rows, dim] of T (all but RmsNorm)
  const void* weight;        // [dim] of W: scale of n(v)
  const void* extra;         // [dim] of W2 (MoeWsumDnormAdd) or [1]/[dim] of S (scalar variants)
  void* out;                 // [rows, dim] of T
  void* sum;                 // [rows, dim] of T (ResidualNorm), or null
  u32 rows, dim, top_k;
  u32 extra_len;             // elements of `extra` (1: broadcast scalar)
  float eps;
  u32 staged;                // nonzero: dynamic shared memory holds dim floats
};
static_assert(sizeof(NormParams) == 80, "NormParams layout");

// G values of U, aligned for one vector access (16 bytes at most).
template <typename U, int G>
struct alignas(G * sizeof(U) >= 16 ? 16 : G * sizeof(U)) Pack {
  U v[G];
};

template <int G, typename U>
__device__ __forceinline__ void load(const U* p, float (&o)[G]) {
  const Pack<U, G> q = *reinterpret_cast<const Pack<U, G>*>(p);
#pragma unroll
  for (int j = 0; j < G; ++j) o[j] = to_f32(q.v[j]);
}

template <int G, typename U>
__device__ __forceinline__ void store(U* p, const float (&o)[G]) {
  Pack<U, G> q;
#pragma unroll
  for (int j = 0; j < G; ++j) q.v[j] = from_f32<U>(o[j]);
  *reinterpret_cast<Pack<U, G>*>(p) = q;
}

// Where the normalised row v comes from.
enum class Src { Input, ResidualPlusInput, MoeWsum };

// ---- Epilogue functors -----------------------------------------------------
// kSrc: the row source; kNormResidual: residual is normalised too (its
// rsqrt is `inv_res`); kWritesSum: v may be written to p.sum. finish() turns
// o = n(v)·w of the G elements at column i into the output values; `res`
// points at the residual row.

struct RmsNorm {
  static constexpr Src kSrc = Src::Input;
  static constexpr bool kNormResidual = false, kWritesSum = false;
  template <int G, typename T>
  __device__ static void finish(const NormParams&, const T*, u32, float, float (&)[G]) {}
};

struct NormAdd {
  static constexpr Src kSrc = Src::Input;
  static constexpr bool kNormResidual = false, kWritesSum = false;
  template <int G, typename T>
  __device__ static void finish(const NormParams&, const T* res, u32 i, float, float (&o)[G]) {
    float r[G];
    load<G>(res + i, r);
#pragma unroll
    for (int j = 0; j < G; ++j) o[j] = r[j] + o[j];
  }
};

struct ResidualNorm {
  static constexpr Src kSrc = Src::ResidualPlusInput;
  static constexpr bool kNormResidual = false, kWritesSum = true;
  template <int G, typename T>
  __device__ static void finish(const NormParams&, const T*, u32, float, float (&)[G]) {}
};

// The output scale: scalar[0] broadcast, or scalar[i..i+G).
template <int G, typename S>
__device__ __forceinline__ void load_scale(const NormParams& p, u32 i, float (&s)[G]) {
  const S* sc = static_cast<const S*>(p.extra);
  if (p.extra_len == 1) {
    const float b = to_f32(sc[0]);
#pragma unroll
    for (int j = 0; j < G; ++j) s[j] = b;
  } else {
    load<G>(sc + i, s);
  }
}

template <typename S>
struct ResidualNormScalar {
  static constexpr Src kSrc = Src::ResidualPlusInput;
  static constexpr bool kNormResidual = false, kWritesSum = false;
  template <int G, typename T>
  __device__ static void finish(const NormParams& p, const T*, u32 i, float, float (&o)[G]) {
    float s[G];
    load_scale<G, S>(p, i, s);
#pragma unroll
    for (int j = 0; j < G; ++j) o[j] = o[j] * s[j];
  }
};

template <typename S>
struct NormAddScalar {
  static constexpr Src kSrc = Src::Input;
  static constexpr bool kNormResidual = false, kWritesSum = false;
  template <int G, typename T>
  __device__ static void finish(const NormParams& p, const T* res, u32 i, float, float (&o)[G]) {
    float r[G], s[G];
    load<G>(res + i, r);
    load_scale<G, S>(p, i, s);
#pragma unroll
    for (int j = 0; j < G; ++j) o[j] = (r[j] + o[j]) * s[j];
  }
};

struct MoeWsumNormAdd {
  static constexpr Src kSrc = Src::MoeWsum;
  static constexpr bool kNormResidual = false, kWritesSum = false;
  template <int G, typename T>
  __device__ static void finish(const NormParams& p, const T* res, u32 i, float inv_res, float (&o)[G]) {
    NormAdd::finish<G>(p, res, i, inv_res, o);
  }
};

template <typename W2>
struct MoeWsumDnormAdd {
  static constexpr Src kSrc = Src::MoeWsum;
  static constexpr bool kNormResidual = true, kWritesSum = false;
  template <int G, typename T>
  __device__ static void finish(const NormParams& p, const T* res, u32 i, float inv_res, float (&o)[G]) {
    float r[G], rw[G];
    load<G>(res + i, r);
    load<G>(static_cast<const W2*>(p.extra) + i, rw);
#pragma unroll
    for (int j = 0; j < G; ++j) o[j] = r[j] * inv_res * rw[j] + o[j];
  }
};

// ---- Kernel ----------------------------------------------------------------

// v[0..G) of `row` at column i, from E's source.
template <class E, typename T, int G>
__device__ __forceinline__ void source(const NormParams& p, u32 row, u32 i, float (&v)[G]) {
  const u64 at = (u64)row * p.dim + i;
  if constexpr (E::kSrc == Src::Input) {
    load<G>(static_cast<const T*>(p.input) + at, v);
  } else if constexpr (E::kSrc == Src::ResidualPlusInput) {
    float x[G];
    load<G>(static_cast<const T*>(p.residual) + at, v);
    load<G>(static_cast<const T*>(p.input) + at, x);
#pragma unroll
    for (int j = 0; j < G; ++j) v[j] = v[j] + x[j];
  } else {
    // Σ_k w[row,k] · y[row,k,i], in k order.
    const T* y = static_cast<const T*>(p.input) + (u64)row * p.top_k * p.dim + i;
    const float* w = p.moe_weights + (u64)row * p.top_k;
#pragma unroll
    for (int j = 0; j < G; ++j) v[j] = 0.f;
    for (u32 k = 0; k < p.top_k; ++k) {
      float yk[G];
      load<G>(y + (u64)k * p.dim, yk);
      const float wk = w[k];
#pragma unroll
      for (int j = 0; j < G; ++j) v[j] += wk * yk[j];
    }
  }
}

// 1 / sqrt(ss / dim + eps), correctly rounded steps (no rsqrt approximation).
__device__ __forceinline__ float inv_rms(float ss, const NormParams& p) {
  return 1.f / sqrtf(ss / (float)p.dim + p.eps);
}

// One row, in groups of G (G divides dim, operands aligned for G: the
// caller checks). `sv` is the staging area (dim floats) when p.staged.
template <class E, typename T, typename W, int G>
__device__ __forceinline__ void epilogue_row(const NormParams& p, u32 row, float* sv, float* scratch) {
  const u32 groups = p.dim / G;
  const u64 at = (u64)row * p.dim;
  const T* res = static_cast<const T*>(p.residual) + at;
  T* out = static_cast<T*>(p.out) + at;

  // Pass 1: v, Σv² (and Σres² for the double norm); stage v; write the sum.
  float ss = 0.f, ss_res = 0.f;
  for (u32 g = threadIdx.x; g < groups; g += blockDim.x) {
    const u32 i = g * G;
    float v[G];
    source<E, T, G>(p, row, i, v);
#pragma unroll
    for (int j = 0; j < G; ++j) ss += v[j] * v[j];
    if constexpr (E::kNormResidual) {
      float r[G];
      load<G>(res + i, r);
#pragma unroll
      for (int j = 0; j < G; ++j) ss_res += r[j] * r[j];
    }
    if (p.staged) {
#pragma unroll
      for (int j = 0; j < G; ++j) sv[j * groups + g] = v[j];
    }
    if constexpr (E::kWritesSum) {
      if (p.sum != nullptr) store<G>(static_cast<T*>(p.sum) + at + i, v);
    }
  }
  const float inv = inv_rms(block_sum(ss, scratch), p);
  float inv_res = 0.f;
  if constexpr (E::kNormResidual) inv_res = inv_rms(block_sum(ss_res, scratch), p);

  // Pass 2: out = E::finish((v · inv) · w).
  const W* w = static_cast<const W*>(p.weight);
  for (u32 g = threadIdx.x; g < groups; g += blockDim.x) {
    const u32 i = g * G;
    float v[G], wv[G], o[G];
    if (p.staged) {
#pragma unroll
      for (int j = 0; j < G; ++j) v[j] = sv[j * groups + g];
    } else {
      source<E, T, G>(p, row, i, v);
    }
    load<G>(w + i, wv);
#pragma unroll
    for (int j = 0; j < G; ++j) o[j] = v[j] * inv * wv[j];
    E::template finish<G, T>(p, res, i, inv_res, o);
    store<G>(out + i, o);
  }
}

__device__ __forceinline__ bool aligned16(const void* q) { return ((u64)q & 15u) == 0; }

// Grid (rows), block a multiple of 32 threads (≤ 1024: the host's
// src/cuda/ops/norm.rs MAX_THREADS); dynamic shared memory dim floats when
// p.staged.
template <class E, typename T, typename W>
__global__ void __launch_bounds__(1024) norm_epilogue(const __grid_constant__ NormParams p) {
  pdl_entry();  // a dependent launch (ops/mod.rs Order::Dependent)
  extern __shared__ float sv[];
  __shared__ float scratch[32];
  constexpr int G = 16 / sizeof(T);
  const u32 row = blockIdx.x;
  if (row >= p.rows) return;
  // Uniform over the grid: rows start at multiples of dim elements.
  const bool per_element_extra = p.extra_len != 1;
  const bool vec = p.dim % G == 0 && aligned16(p.input) && aligned16(p.residual) && aligned16(p.weight) &&
                   (!per_element_extra || aligned16(p.extra)) && aligned16(p.out) && aligned16(p.sum);
  if (vec) {
    epilogue_row<E, T, W, G>(p, row, sv, scratch);
  } else {
    epilogue_row<E, T, W, 1>(p, row, sv, scratch);
  }
}

}  // namespace moekit
