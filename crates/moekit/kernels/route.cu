// route.cu — router logits [T, E] → top-k expert ids u32 [T, k] and weights
// f32 [T, k], one warp per token (src/ops/route.rs gives the rules).
//
// The rule is a functor type (route::SoftmaxTopK, ::TopKSoftmax, ::Gemma4,
// ::Grouped<Scores>) chosen by template argument; config values (k, groups,
// the renormalise flag, the scaling factor) are plain parameters.
//
// Bit-compatibility with the CPU paths: every f32 operation is the CPU's, in
// the CPU's order — sums run sequentially in expert order (softmax over all
// experts) or slot order (softmax over the chosen, renormalisation), products
// and quotients use the _rn intrinsics so nothing is contracted into an FMA.
// The one difference is exp: here (float)exp((double)x) (correctly rounded
// except within ~2^-29 of a rounding boundary), on the CPU libm's expf (≤ 0.502
// ulp); they differ by one ulp on about 7e-5 of the inputs.
#include "moekit/route.cuh"

namespace moekit {


// One warp per token, route::kWarps tokens per block; dynamic shared memory
// route::kWarps * route::kBuffers * E floats.
template <class Kind, typename T>
__global__ void __launch_bounds__(route::kWarps * 32) route_tokens(const __grid_constant__ RouteParams p) {
  pdl_entry();  // a dependent launch (ops/mod.rs Order::Dependent)
  extern __shared__ float route_smem[];
  const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const u32 t = blockIdx.x * route::kWarps + warp;
  const u32 n = p.n_experts, k = p.top_k;
  // Warp-uniform exits; the host validates the config, this only keeps a bad
  // one from indexing out of bounds.
  if (t >= p.n_tokens || n == 0 || n > route::kMaxExperts || k == 0 || k > route::kMaxTopK || k > n) return;
  if (p.n_group == 0 || n % p.n_group != 0 || p.topk_group == 0 || p.topk_group > p.n_group) return;
  float* a = route_smem + (u64)warp * route::kBuffers * n;
  const route::Warp w{lane, n, k, a, a + n, a + 2 * n};
  const T* row = static_cast<const T*>(p.logits) + (u64)t * n;
  for (u32 e = lane; e < n; e += 32) a[e] = to_f32(row[e]);
  __syncwarp();
  u32 id = route::kNone;
  float wt = 0.f;
  Kind::run(p, w, id, wt);
  if (lane < k) {
    p.ids[(u64)t * k + lane] = id;
    p.weights[(u64)t * k + lane] = wt;
  }
}

}  // namespace moekit
