// stream_t1.cu — how fast can a decode step's expert weights be streamed?
// A microbenchmark of issue 10 (T = 1): 8 experts chosen a launch from a
// pool of 128 (so L2 does not flatter), qwen3-30b-a3b's gate/up (8 × 1536
// rows × 1024 B, MLX 4-bit, 12.6 MB) and down (8 × 2048 rows × 384 B,
// 6.3 MB) as decode.cu's blocks walk them, each byte folded into a sum so
// the loads are live. Variants:
//   regs2  - a warp's spans two in flight (decode_mma.cuh's Prefetch),
//   regsN  - every span of the warp issued before the first use,
//   bulk1  - the block's rows by cp.async.bulk into shared memory, one mbarrier,
//   bulk4  - the same, one mbarrier per quarter of K (warp ks reads quarter ks).
// nvcc -O3 -gencode=arch=compute_90a,code=sm_90a stream_t1.cu -o stream_t1
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
typedef uint32_t u32;
typedef uint64_t u64;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

struct Shape { u32 rows_e, row_bytes, rows_blk, split, mats; };  // rows an expert (all matrices), bytes a row, rows a block of each matrix, K split, matrices

__device__ __forceinline__ u32 fold(uint4 v) { return v.x ^ (v.y * 3u) ^ (v.z * 5u) ^ (v.w * 7u); }

// warp w: tile w / split, part w % split; lane (g, c); span = 64 B of a row.
template <int NSPAN_MAX, bool ALL>
__global__ void __launch_bounds__(256, 2) regs(const uint8_t* w, const u32* ids, Shape s, u32* out) {
  const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const u32 tile = warp / s.split, ks = warp % s.split, e = ids[blockIdx.y];
  const u32 r0 = blockIdx.x * s.rows_blk + tile * 16 + g;
  const uint8_t* base = w + (u64)e * s.rows_e * s.row_bytes;
  const u32 n_spans = s.row_bytes / 64;
  u32 acc = 0;
  const u32 mrows = s.rows_e / s.mats;
  auto ld = [&](u32 sp, u32 h) {  // h: matrix h / 2, row half h % 2
    return __ldg(reinterpret_cast<const uint4*>(base + (u64)((h >> 1) * mrows + r0 + 8 * (h & 1)) * s.row_bytes + sp * 64 + c * 16));
  };
  if (ALL) {
    uint4 v[NSPAN_MAX][4];
#pragma unroll
    for (int i = 0; i < NSPAN_MAX; ++i) {
      const u32 sp = ks + i * s.split;
#pragma unroll
      for (int h = 0; h < 4; ++h)
        if (sp < n_spans && h < 2 * (int)s.mats) v[i][h] = ld(sp, h);
    }
#pragma unroll
    for (int i = 0; i < NSPAN_MAX; ++i)
#pragma unroll
      for (int h = 0; h < 4; ++h)
        if (ks + i * s.split < n_spans && h < 2 * (int)s.mats) acc += fold(v[i][h]);
  } else {
    const int nh = 2 * s.mats;
    uint4 a[4], b[4];
#pragma unroll
    for (int h = 0; h < 4; ++h) a[h] = h < nh ? ld(ks, h) : make_uint4(0, 0, 0, 0);
    for (u32 sp = ks; sp < n_spans; sp += s.split) {
#pragma unroll
      for (int h = 0; h < 4; ++h) b[h] = a[h];
      if (sp + s.split < n_spans) {
#pragma unroll
        for (int h = 0; h < 4; ++h) if (h < nh) b[h] = ld(sp + s.split, h);
      }
#pragma unroll
      for (int h = 0; h < 4; ++h) acc += fold(a[h]);
      // a little work, as a decoder's would be
#pragma unroll
      for (int j = 0; j < 16 * 2; ++j) acc = acc * 1664525u + 1013904223u;
#pragma unroll
      for (int h = 0; h < 4; ++h) a[h] = b[h];
    }
  }
  if (acc == 0x12345678u) out[0] = acc;
}

__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// Block's rows_blk rows copied whole (QUARTERS = 1) or by quarters of the row.
template <int QUARTERS>
__global__ void __launch_bounds__(256, 2) bulk(const uint8_t* w, const u32* ids, Shape s, u32* out) {
  extern __shared__ __align__(128) uint8_t sm[];
  __shared__ __align__(8) u64 bar[4];
  const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const u32 e = ids[blockIdx.y];
  const uint8_t* base = w + (u64)e * s.rows_e * s.row_bytes;
  const u32 qb = s.row_bytes / QUARTERS, mrows = s.rows_e / s.mats, nrows = s.rows_blk * s.mats;
  if (threadIdx.x < QUARTERS) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bar[threadIdx.x])) : "memory");
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncthreads();
  if (threadIdx.x < QUARTERS)
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(&bar[threadIdx.x])), "r"(nrows * qb) : "memory");
  __syncthreads();
  // copy i: row i % rows_blk, quarter i / rows_blk (quarter 0 of every row first)
  for (u32 i = threadIdx.x; i < nrows * QUARTERS; i += blockDim.x) {
    const u32 r = i % nrows, q = i / nrows;  // smem row r: matrix r / rows_blk, its row r % rows_blk of the block
    const u64 gr = (u64)(r / s.rows_blk) * mrows + blockIdx.x * s.rows_blk + r % s.rows_blk;
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_u32(sm + r * s.row_bytes + q * qb)), "l"(base + gr * s.row_bytes + q * qb), "r"(qb),
                 "r"(smem_u32(&bar[q])) : "memory");
  }
  const u32 tile = warp / s.split, ks = warp % s.split;
  const u32 r0 = tile * 16 + g;
  const u32 n_spans = s.row_bytes / 64;
  u32 acc = 0;
  u32 waited = ~0u;  // the last quarter waited for (none: ~0, so waited + 1 = 0)
  for (u32 sp = ks; sp < n_spans; sp += s.split) {
    const u32 q = min((sp * 64 + 63) / qb, (u32)QUARTERS - 1);  // the span's last byte's quarter
    for (u32 w = waited + 1; w <= q; ++w) {  // quarters land in any order: wait for each up to q
      u32 ok = 0;
      while (!ok)
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(ok) : "r"(smem_u32(&bar[w])) : "memory");
    }
    waited = max(waited + 1, q + 1) - 1;
    for (u32 m = 0; m < s.mats; ++m) {
      const uint8_t* rb = sm + (m * s.rows_blk + r0) * s.row_bytes + sp * 64 + c * 16;
      acc += fold(*reinterpret_cast<const uint4*>(rb)) + fold(*reinterpret_cast<const uint4*>(rb + 8 * s.row_bytes));
    }
#pragma unroll
    for (int j = 0; j < 16 * 2; ++j) acc = acc * 1664525u + 1013904223u;
  }
  if (acc == 0x12345678u) out[0] = acc;
}

__global__ void empty_k(u32* out) { if (out == nullptr) out[0] = 1; }

int main() {
  const u32 E = 128, K8 = 8, REPS = 400;
  // gate+up as one [E, 1536, 1024 B] tensor; down [E, 2048, 384 B]
  const Shape gu{1536, 1024, 32, 4, 2}, dn{2048, 384, 64, 2, 1};
  uint8_t *wgu, *wdn;
  u32 *ids, *out;
  CK(cudaMalloc(&wgu, (size_t)E * gu.rows_e * gu.row_bytes));
  CK(cudaMalloc(&wdn, (size_t)E * dn.rows_e * dn.row_bytes));
  CK(cudaMemset(wgu, 1, (size_t)E * gu.rows_e * gu.row_bytes));
  CK(cudaMemset(wdn, 1, (size_t)E * dn.rows_e * dn.row_bytes));
  std::vector<u32> h(REPS * K8);
  u32 st = 12345;
  for (u32 r = 0; r < REPS; ++r)
    for (u32 j = 0; j < K8; ++j) { st = st * 1103515245u + 12345u; h[r * K8 + j] = (st >> 8) % E; }
  CK(cudaMalloc(&ids, h.size() * 4));
  CK(cudaMalloc(&out, 16));
  CK(cudaMemcpy(ids, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  cudaFuncSetAttribute(bulk<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024);
  cudaFuncSetAttribute(bulk<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaStream_t strm;
  cudaStreamCreate(&strm);
  double bw_bytes_gu = 8.0 * gu.rows_e * gu.row_bytes, bw_bytes_dn = 8.0 * dn.rows_e * dn.row_bytes;
  auto run = [&](const char* name, const Shape& s, double bytes, auto launch) {
    std::vector<float> t;
    for (u32 r = 0; r < REPS; ++r) {
      cudaEventRecord(a, strm);
      launch(ids + r * K8);
      cudaEventRecord(b, strm);
      cudaEventSynchronize(b);
      float ms;
      cudaEventElapsedTime(&ms, a, b);
      if (r >= 20) t.push_back(ms * 1000.f);
    }
    std::sort(t.begin(), t.end());
    printf("%-14s %-5s median %7.2f us  p10 %7.2f  p90 %7.2f  (%.0f GB/s at median)\n", name,
           s.row_bytes == 1024 ? "gu" : "down", t[t.size() / 2], t[t.size() / 10], t[t.size() * 9 / 10], bytes / (t[t.size() / 2] * 1e3));
    return 0;
  };
  run("empty", gu, 0, [&](const u32*) { empty_k<<<1, 32, 0, strm>>>(out); });
  for (int pass = 0; pass < 2; ++pass) {
    for (int which = 0; which < 2; ++which) {
      const Shape& s = which ? dn : gu;
      uint8_t* w = which ? wdn : wgu;
      double bytes = which ? bw_bytes_dn : bw_bytes_gu;
      dim3 grid(s.rows_e / s.mats / s.rows_blk, K8);
      run("regs2", s, bytes, [&](const u32* id) { regs<4, false><<<grid, 256, 0, strm>>>(w, id, s, out); });
      run("regsN", s, bytes, [&](const u32* id) { regs<4, true><<<grid, 256, 0, strm>>>(w, id, s, out); });
      const u32 smb = s.mats * s.rows_blk * s.row_bytes;
      run("bulk1", s, bytes, [&](const u32* id) { bulk<1><<<grid, 256, smb, strm>>>(w, id, s, out); });
      Shape s4 = s;
      s4.split = 4;
      s4.rows_blk = 32;  // 2 tiles × 4 quarters
      dim3 grid4(s.rows_e / s.mats / 32, K8);
      run("bulk4 (32 r)", s4, bytes, [&](const u32* id) { bulk<4><<<grid4, 256, s.mats * 32 * s.row_bytes, strm>>>(w, id, s4, out); });
      Shape s1 = s;
      s1.rows_blk = 32;
      s1.split = 4;
      run("bulk1 (32 r)", s1, bytes, [&](const u32* id) { bulk<1><<<grid4, 256, s.mats * 32 * s.row_bytes, strm>>>(w, id, s1, out); });
      Shape s16 = s;
      s16.rows_blk = 16;
      s16.split = 8;
      dim3 grid16(s.rows_e / s.mats / 16, K8);
      run("bulk1 (16 r)", s16, bytes, [&](const u32* id) { bulk<1><<<grid16, 256, s.mats * 16 * s.row_bytes, strm>>>(w, id, s16, out); });
    }
  }
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  return 0;
}
