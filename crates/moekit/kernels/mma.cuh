// moekit/mma.cuh — the warp-level tensor-core MMA (mma.sync m16n8k16, f32
// accumulators, sm_80+) shared by the tensor-core GEMM (tc_gemm.cu) and the
// decode path (decode.cu).
//
// Fragments (PTX ISA, "mma.m16n8k16" for .bf16/.f16), with g = lane / 4 and
// c = lane % 4:
//   A (16 × 16, row): a0 = (row g, k 2c..2c+1), a1 = (row g+8, k 2c..2c+1),
//                     a2 = (row g, k 2c+8..2c+9), a3 = (row g+8, k 2c+8..2c+9)
//   B (16 × 8, col):  b0 = (k 2c..2c+1, col g), b1 = (k 2c+8..2c+9, col g)
//   C (16 × 8, f32):  c0, c1 = (row g, cols 2c, 2c+1), c2, c3 = (row g+8, …)
// Each output element is the dot of its own row and column: the result for
// a column never depends on the other columns (batch invariance).
#pragma once
#include "moekit/common.cuh"

namespace moekit {

template <typename T> struct Mma;
template <> struct Mma<__nv_bfloat16> {
  __device__ static __forceinline__ void run(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <> struct Mma<__half> {
  __device__ static __forceinline__ void run(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

}  // namespace moekit
