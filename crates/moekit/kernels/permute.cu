// permute.cu — gather token rows into expert order, and the weighted combine back.
#include "moekit/common.cuh"

namespace moekit {

struct PermuteParams {
  const void* x;        // [T, H] of T
  const u32* sorted;    // [T*k] slot t*k+j at each sorted position
  void* out;            // [T*k, H]
  u32* err;
  u32 n_rows, top_k, hidden, n_tokens;
};
static_assert(sizeof(PermuteParams) == 48, "PermuteParams layout");

// One block per sorted row; threads stride over the hidden dimension.
template <typename T>
__global__ void permute_rows(const __grid_constant__ PermuteParams p) {
  pdl_entry();  // a dependent launch (ops/mod.rs Order::Dependent)
  const u32 row = blockIdx.x;
  const u32 s = p.sorted[row];
  const u32 t = s / p.top_k;
  if (t >= p.n_tokens) {
    if (threadIdx.x == 0) report(p.err, ERR_SLOT);
    return;
  }
  const T* src = static_cast<const T*>(p.x) + (u64)t * p.hidden;
  T* dst = static_cast<T*>(p.out) + (u64)row * p.hidden;
  for (u32 i = threadIdx.x; i < p.hidden; i += blockDim.x) dst[i] = src[i];
}

struct UnpermuteParams {
  const void* y;          // [T*k, H] of T, sorted order
  const u32* inverse;     // [T*k] sorted position of slot t*k+j
  const float* weights;   // [T, k]
  void* out;              // [T, H] of T
  u32* err;
  u32 n_tokens, top_k, hidden, n_rows;
};
static_assert(sizeof(UnpermuteParams) == 56, "UnpermuteParams layout");

// out[t] = sum_j w[t,j] * y[inverse[t*k+j]], in slot order (deterministic,
// no atomics). Block (t, c): token t, columns c·blockDim·V .. ; each thread
// owns V = 16 / sizeof(T) consecutive columns, loaded 16 bytes at a time
// when the row allows (H a multiple of V). Slots go in chunks of UNPERM_CHUNK:
// the chunk's positions and weights are loaded together, then all of its
// rows, then summed in slot order (a loop over j that loaded and summed one
// slot at a time waited on two dependent loads a slot: qwen3-30b-a3b T = 64,
// H200, 7.0 µs for 2 MB).
constexpr u32 UNPERM_CHUNK = 8;

template <typename T>
__global__ void unpermute_rows(const __grid_constant__ UnpermuteParams p) {
  pdl_entry();  // a dependent launch (ops/mod.rs Order::Dependent)
  constexpr u32 V = 16 / sizeof(T);
  const u32 t = blockIdx.x;
  const u32 c0 = (blockIdx.y * blockDim.x + threadIdx.x) * V;
  if (c0 >= p.hidden) return;
  T* dst = static_cast<T*>(p.out) + (u64)t * p.hidden;
  const T* y = static_cast<const T*>(p.y);
  const bool vec = p.hidden % V == 0 && (reinterpret_cast<u64>(y) & 15u) == 0;
  float acc[V];
#pragma unroll
  for (u32 v = 0; v < V; ++v) acc[v] = 0.f;
  for (u32 j0 = 0; j0 < p.top_k; j0 += UNPERM_CHUNK) {
    u32 pos[UNPERM_CHUNK];
    float w[UNPERM_CHUNK];
#pragma unroll
    for (u32 c = 0; c < UNPERM_CHUNK; ++c) {
      const bool in = j0 + c < p.top_k;
      pos[c] = in ? p.inverse[t * p.top_k + j0 + c] : p.n_rows;
      w[c] = in ? p.weights[t * p.top_k + j0 + c] : 0.f;
    }
    T vals[UNPERM_CHUNK][V];
#pragma unroll
    for (u32 c = 0; c < UNPERM_CHUNK; ++c) {
      const T* src = y + (u64)pos[c] * p.hidden + c0;  // read only where pos[c] < n_rows
      if (pos[c] >= p.n_rows) {
#pragma unroll
        for (u32 v = 0; v < V; ++v) vals[c][v] = from_f32<T>(0.f);
      } else if (vec) {
        *reinterpret_cast<uint4*>(vals[c]) = *reinterpret_cast<const uint4*>(src);
      } else {
#pragma unroll
        for (u32 v = 0; v < V; ++v) vals[c][v] = c0 + v < p.hidden ? src[v] : from_f32<T>(0.f);
      }
    }
#pragma unroll
    for (u32 c = 0; c < UNPERM_CHUNK; ++c) {
      if (j0 + c >= p.top_k) break;
      if (pos[c] >= p.n_rows) {
        if (c0 == 0) report(p.err, ERR_SLOT);
        continue;
      }
#pragma unroll
      for (u32 v = 0; v < V; ++v) acc[v] += w[c] * to_f32(vals[c][v]);
    }
  }
#pragma unroll
  for (u32 v = 0; v < V; ++v)
    if (c0 + v < p.hidden) dst[c0 + v] = from_f32<T>(acc[v]);
}

}  // namespace moekit
