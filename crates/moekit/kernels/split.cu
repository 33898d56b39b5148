// split.cu — f32 weights split into two halves of type T, hi = T(v) and
// lo = T(v − hi) with v = fmaf(w, 1, 0): exactly the values the tensor-core
// GEMM's generic decoder gives dense f32 weights for its hi/lo split (P = 3),
// so the split GEMM can copy them straight into its tiles instead of
// decoding them every call.
#include "moekit/common.cuh"

namespace moekit {

struct SplitParams {
  const float* w;  // [n]
  void* out;       // [2, n] of T: hi, then lo
  u64 n;
};
static_assert(sizeof(SplitParams) == 24, "SplitParams layout");

// Grid-stride over the n elements (any grid covers them).
template <typename T>
__global__ void split_hi_lo(const __grid_constant__ SplitParams p) {
  pdl_entry();  // a dependent launch (ops/mod.rs Order::Dependent)
  T* hi = static_cast<T*>(p.out);
  T* lo = hi + p.n;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += stride) {
    const float v = fmaf(p.w[i], 1.f, 0.f);  // as the decoder: −0 becomes +0
    const T h = from_f32<T>(v);
    hi[i] = h;
    lo[i] = from_f32<T>(v - to_f32(h));
  }
}

}  // namespace moekit
