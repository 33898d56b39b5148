// bench.cu — the device's read bandwidth: every thread streams 16-byte words
// (grid-stride) and folds them into one value per block, so nothing is elided.
#include "moekit/common.cuh"

namespace moekit {

struct ReadParams {
  const uint4* src;
  u32* sink;       // one word per block
  u64 n_words;     // 16-byte words in src
};
static_assert(sizeof(ReadParams) == 24, "ReadParams layout");

__global__ void read_words(const __grid_constant__ ReadParams p) {
  u32 acc = 0;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < p.n_words; i += stride) {
    const uint4 v = __ldcs(p.src + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  acc = __reduce_xor_sync(0xffffffffu, acc);
  if ((threadIdx.x & 31) == 0) atomicXor(p.sink + blockIdx.x, acc);
}

}  // namespace moekit
