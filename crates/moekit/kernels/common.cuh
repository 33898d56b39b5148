// moekit/common.cuh — device code shared by every kernel source.
//
// Conventions (mirrored on the Rust side in src/cuda/ops/*.rs):
// * Each kernel takes one `Params` struct by value (`__grid_constant__`); its
//   layout is defined here or in the kernel's source and size-checked with
//   static_assert, and checked again in Rust with a const assert.
// * Activations are f32, __half or __nv_bfloat16 (template parameter T),
//   widened to f32 for arithmetic.
// * Data-dependent argument errors (an expert id out of range, bad offsets)
//   never read or write out of bounds: the kernel skips the item and ORs a
//   bit into the device's error word, which the host checks at its next sync.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace moekit {

typedef unsigned int u32;
typedef unsigned char u8;
typedef unsigned long long u64;

// Bits of the device error word (src/cuda/mod.rs: ErrorBits).
enum ErrorBits : u32 {
  ERR_EXPERT_ID = 1u,   // an expert id >= n_experts
  ERR_OFFSETS = 2u,     // expert offsets not monotone / out of range
  ERR_SLOT = 4u,        // a sort slot or position out of range
  ERR_CONFIG = 8u,      // a launch the kernel instance does not fit (shared memory, P)
};

// ---------------------------------------------------------------------------
// Kernel boundaries. On sm_90 the MoE block's kernels start as programmatic
// dependent launches (ops/mod.rs `Order::Dependent`): each kernel lets the
// next one launch as soon as all of its own blocks have started
// (pdl_trigger), and a kernel waits for the previous one to complete, its
// memory visible (pdl_wait = griddepcontrol.wait), before it touches anything
// an earlier kernel wrote or reads — so launch latency and block scheduling
// overlap the previous kernel's tail. Launched in plain stream order, both
// are no-ops. Every block of a dependent launch must wait (a kernel whose
// blocks all finished without waiting could complete before the kernel it
// follows, and the next one's wait would not cover that one).
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// The first statement of a kernel launched with Order::Dependent that has
// no independent prologue: let the next kernel launch, then wait for the
// previous one.
__device__ __forceinline__ void pdl_entry() {
  pdl_trigger();
  pdl_wait();
}

// Asks L2 for the line holding p (no registers, nothing to wait for).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

__device__ __forceinline__ void report(u32* err, u32 bit) { atomicOr(err, bit); }

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024);
// every thread gets the result. `scratch` holds 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < nw ? scratch[lane] : 0.f;
  return warp_sum(t);
}

// g·σ(g) = g / (1 + e^−g), the division as g · rcp.approx(1 + e^−g)
// (__fdividef: within 2 ulp of the IEEE quotient; a denominator past 2^126,
// g < −87, gives 0, the quotient rounded to 0 in any case but a denormal),
// so that an epilogue spends a MUFU and a multiply a value rather than the
// IEEE division's refinement, its check and its slow-path branch (tc_tma's
// SwiGLU epilogue, bf16 P = 2: about 27 → 13 SASS instructions an output).
__device__ __forceinline__ float silu(float g) { return __fdividef(g, 1.f + __expf(-g)); }

// The experts' gated activation with its optional biases and per-expert
// output scales (src/ops/ffn.rs, GluAct, ExpertBiases and ExpertScales; the
// Rust mirror is cuda::ops::GluParams): g' = g·gate_scale[e] + gate_bias[e],
// u' likewise, act(g', u') — each scale before its bias, as llama.cpp's
// build_lora_mm_id and mlx-lm's QuantizedSwitchLinear apply them.
enum GluKind : u32 { GLU_SWIGLU = 0, GLU_SWIGLU_OAI = 1, GLU_GELU_TANH = 2 };
struct GluParams {
  const float* gate_bias;   // [E, N] f32, or null
  const float* up_bias;     // [E, N] f32, or null
  const float* gate_scale;  // [E] f32, or null (1)
  const float* up_scale;    // [E] f32, or null (1)
  u32 kind;                 // GluKind
  float alpha, limit;       // GLU_SWIGLU_OAI
  u32 pad;
};
static_assert(sizeof(GluParams) == 48, "GluParams layout");

// Whether `a` is plain SwiGLU without biases or scales: epilogues test it
// once and keep their plain loop free of the general one's branches and loads.
__device__ __forceinline__ bool glu_plain(const GluParams& a) {
  return a.kind == GLU_SWIGLU && !a.gate_bias && !a.up_bias && !a.gate_scale && !a.up_scale;
}

// One output column's gate and up biases (0 without) and its expert's gate
// and up scales (1 without).
struct GluCol {
  float gate, up, gate_scale, up_scale;
};
// Column `at` = e · N + column of expert `e`.
__device__ __forceinline__ GluCol glu_col(const GluParams& a, u32 e, u64 at) {
  return GluCol{a.gate_bias ? a.gate_bias[at] : 0.f, a.up_bias ? a.up_bias[at] : 0.f,
                a.gate_scale ? a.gate_scale[e] : 1.f, a.up_scale ? a.up_scale[e] : 1.f};
}

// act(g·col.gate_scale + col.gate, u·col.up_scale + col.up) (the product
// rounded apart from the sum, as the CPU paths round it). GLU_SWIGLU_OAI
// (gpt-oss): min(g, limit), clamp(u, ±limit), (u + 1)·g·σ(α g).
// GLU_GELU_TANH (Gemma-4): ½ g (1 + tanh(√(2/π) (g + 0.044715 g³)))·u.
__device__ __forceinline__ float glu_at(const GluParams& a, const GluCol& col, float g, float u) {
  g = __fadd_rn(__fmul_rn(g, col.gate_scale), col.gate);
  u = __fadd_rn(__fmul_rn(u, col.up_scale), col.up);
  if (a.kind == GLU_SWIGLU_OAI) {
    g = fminf(g, a.limit);
    u = fminf(fmaxf(u, -a.limit), a.limit);
    return (u + 1.f) * __fdividef(g, 1.f + __expf(-a.alpha * g));
  }
  if (a.kind == GLU_GELU_TANH) return 0.5f * g * (1.f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g))) * u;
  return silu(g) * u;
}

// glu_at with column `at` = e · N + column of expert `e`.
__device__ __forceinline__ float glu(const GluParams& a, float g, float u, u32 e, u64 at) {
  return glu_at(a, glu_col(a, e, at), g, u);
}

}  // namespace moekit
