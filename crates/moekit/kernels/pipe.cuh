// moekit/pipe.cuh — asynchronous global→shared copies (cp.async, sm_80+)
// and the staging of byte ranges whose start is not 16-byte aligned.
//
// A range is copied as the 16-byte words that cover it (weight tensors start
// 16-byte aligned, so the word before the range is still inside the tensor;
// bytes past its end are zero-filled, not read), and lands at the same
// address modulo 16, which keeps the decoders' alignment assumptions.
#pragma once
#include "moekit/common.cuh"

namespace moekit {

__device__ __forceinline__ void cp_async16(void* dst, const void* src, u32 bytes) {
  const u32 d = (u32)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(bytes) : "memory");
}
// 4 bytes (src 4-byte aligned); bytes past `bytes` are zero-filled, not read.
__device__ __forceinline__ void cp_async4(void* dst, const void* src, u32 bytes) {
  const u32 d = (u32)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(bytes) : "memory");
}
// x, opaque to the compiler: a per-thread constant computed once stays in its
// register instead of being recomputed (from threadIdx and the parameters)
// inside a pipeline loop.
__device__ __forceinline__ u32 pin(u32 x) {
  asm volatile("" : "+r"(x));
  return x;
}
template <typename P>
__device__ __forceinline__ P* pin(P* x) {
  asm volatile("" : "+l"(x));
  return x;
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// Shared memory a staged range of n bytes takes (decode.rs: stage_room).
__device__ __forceinline__ u32 stage_room(u32 n) { return (n + 30u) & ~15u; }

// Where the copy of bytes [src, src + n) lands when staged at `dst`
// (16-aligned); with `copy`, the whole block also issues the copy.
__device__ __forceinline__ const u8* stage(u8* dst, const u8* src, u32 n, bool copy) {
  const u32 head = (u32)(reinterpret_cast<u64>(src) & 15u);
  if (copy) {
    const u8* lo = src - head;
    const u32 end = head + n, words = (end + 15u) >> 4;
    for (u32 i = threadIdx.x; i < words; i += blockDim.x) {
      const u32 at = 16u * i;
      cp_async16(dst + at, lo + at, end - at >= 16u ? 16u : end - at);
    }
  }
  return dst + head;
}

}  // namespace moekit
