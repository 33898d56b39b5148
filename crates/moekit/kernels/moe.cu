// moe.cu — MoE block glue: adds the (optionally sigmoid-gated) shared expert
// to the routed experts' combined output, in place.
#include "moekit/common.cuh"

namespace moekit {

struct SharedCombineParams {
  void* out;              // [T, H] of T: routed output, updated in place
  const void* shared;     // [T, H] of T: shared expert output
  const void* gate;       // [T] of T: gate logits, or null (ungated)
  u32 n_tokens, hidden;
};
static_assert(sizeof(SharedCombineParams) == 32, "SharedCombineParams layout");

// One block per token: out[t] += (gate ? sigmoid(gate[t]) : 1) * shared[t].
template <typename T>
__global__ void shared_combine(const __grid_constant__ SharedCombineParams p) {
  pdl_entry();  // a dependent launch (ops/mod.rs Order::Dependent)
  const u32 t = blockIdx.x;
  const float g = p.gate ? 1.f / (1.f + expf(-to_f32(static_cast<const T*>(p.gate)[t]))) : 1.f;
  T* out = static_cast<T*>(p.out) + (u64)t * p.hidden;
  const T* s = static_cast<const T*>(p.shared) + (u64)t * p.hidden;
  for (u32 i = threadIdx.x; i < p.hidden; i += blockDim.x) out[i] = from_f32<T>(to_f32(out[i]) + g * to_f32(s[i]));
}

}  // namespace moekit
