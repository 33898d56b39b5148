// act.cu — elementwise epilogues of the general path, in f32, stored as T:
// SwiGLU out = silu(gate) · up; a bias row added to every row; the
// routing-weighted expert biases added to a combined output; and the
// combine weights with down's per-expert scale folded in.
#include "moekit/common.cuh"

namespace moekit {

struct SwigluParams {
  const void* gate;   // [n] of T
  const void* up;     // [n] of T
  void* out;          // [n] of T
  u64 n;
};
static_assert(sizeof(SwigluParams) == 32, "SwigluParams layout");

// Grid-stride over the n elements (any grid covers them).
template <typename T>
__global__ void swiglu(const __grid_constant__ SwigluParams p) {
  pdl_entry();  // a dependent launch (ops/mod.rs Order::Dependent)
  const T* g = static_cast<const T*>(p.gate);
  const T* u = static_cast<const T*>(p.up);
  T* out = static_cast<T*>(p.out);
  const u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += stride)
    out[i] = from_f32<T>(silu(to_f32(g[i])) * to_f32(u[i]));
}


struct RowBiasParams {
  void* y;             // [rows, n] of T, updated in place
  const float* bias;   // [n]
  u64 rows, n;
};
static_assert(sizeof(RowBiasParams) == 32, "RowBiasParams layout");

// y[r, c] += bias[c] (grid-stride).
template <typename T>
__global__ void row_bias(const __grid_constant__ RowBiasParams p) {
  pdl_entry();  // a dependent launch (ops/mod.rs Order::Dependent)
  T* y = static_cast<T*>(p.y);
  const u64 stride = (u64)gridDim.x * blockDim.x, total = p.rows * p.n;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride)
    y[i] = from_f32<T>(to_f32(y[i]) + p.bias[i % p.n]);
}

struct RoutedBiasParams {
  void* out;            // [T, H] of T, updated in place
  const u32* ids;       // [T, k]
  const float* weights; // [T, k]
  const float* bias;    // [E, H]
  u32* err;
  u32 n_tokens, hidden, top_k, n_experts;
  u32 pad[2];
};
static_assert(sizeof(RoutedBiasParams) == 64, "RoutedBiasParams layout");

// out[t, h] += Σ_j weights[t, j] · bias[ids[t, j], h], slots in order j; an
// id ≥ E is reported and its slot skipped. grid = (⌈H / block⌉, T).
template <typename T>
__global__ void routed_bias(const __grid_constant__ RoutedBiasParams p) {
  pdl_entry();  // a dependent launch (ops/mod.rs Order::Dependent)
  const u32 t = blockIdx.y, h = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= p.n_tokens || h >= p.hidden) return;
  T* out = static_cast<T*>(p.out);
  float s = 0.f;
  for (u32 j = 0; j < p.top_k; ++j) {
    const u32 e = p.ids[(u64)t * p.top_k + j];
    if (e >= p.n_experts) {
      report(p.err, ERR_EXPERT_ID);
      continue;
    }
    s = fmaf(p.weights[(u64)t * p.top_k + j], p.bias[(u64)e * p.hidden + h], s);
  }
  const u64 at = (u64)t * p.hidden + h;
  out[at] = from_f32<T>(to_f32(out[at]) + s);
}

struct WeightRowsParams {
  const void* x;         // [T, H] of T
  void* out;             // [T, H] of T
  const float* weights;  // [T] (top-1 routing weights)
  float* ones;           // [T], set to 1
  u64 rows, n;
};
static_assert(sizeof(WeightRowsParams) == 48, "WeightRowsParams layout");

// out[t, h] = x[t, h] · w[t] with w rounded to T and the product rounded to
// T (mlx-lm's x * scores.astype(x.dtype)); ones[t] = 1 (the weights the
// experts of a weight-before block combine with). Grid-stride.
template <typename T>
__global__ void weight_rows(const __grid_constant__ WeightRowsParams p) {
  pdl_entry();  // a dependent launch (ops/mod.rs Order::Dependent)
  const T* x = static_cast<const T*>(p.x);
  T* out = static_cast<T*>(p.out);
  const u64 stride = (u64)gridDim.x * blockDim.x, total = p.rows * p.n;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
    const u64 t = i / p.n;
    out[i] = from_f32<T>(to_f32(x[i]) * to_f32(from_f32<T>(p.weights[t])));
    if (i % p.n == 0) p.ones[t] = 1.f;
  }
}

struct CombineWeightsParams {
  const u32* ids;        // [T·k]
  const float* weights;  // [T·k]
  const float* scale;    // [E]
  float* out;            // [T·k]
  u32* err;
  u32 n, n_experts;
};
static_assert(sizeof(CombineWeightsParams) == 48, "CombineWeightsParams layout");

// out[s] = weights[s] · scale[ids[s]] (src/ops/ffn.rs combine_weights_on);
// an id ≥ E is reported and its weight set to 0. Grid-stride.
__global__ void combine_weights(const __grid_constant__ CombineWeightsParams p) {
  pdl_entry();  // a dependent launch (ops/mod.rs Order::Dependent)
  const u32 stride = gridDim.x * blockDim.x;
  for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += stride) {
    const u32 e = p.ids[i];
    if (e >= p.n_experts) {
      report(p.err, ERR_EXPERT_ID);
      p.out[i] = 0.f;
      continue;
    }
    p.out[i] = __fmul_rn(p.weights[i], p.scale[e]);
  }
}

}  // namespace moekit
