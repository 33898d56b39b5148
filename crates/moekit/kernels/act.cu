// act.cu — elementwise SwiGLU: out = silu(gate) · up, in f32, stored as T.
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
  const T* g = static_cast<const T*>(p.gate);
  const T* u = static_cast<const T*>(p.up);
  T* out = static_cast<T*>(p.out);
  const u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += stride)
    out[i] = from_f32<T>(silu(to_f32(g[i])) * to_f32(u[i]));
}

}  // namespace moekit
