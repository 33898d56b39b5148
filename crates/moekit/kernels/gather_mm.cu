// gather_mm.cu — grouped quantized matmul over experts, and the fused
// gate+up+SwiGLU projection, for every weight format (moekit/dequant.cuh).
//
//   P = 1:  y[m, n] = Σ_k x[m, k] · W[e(m), n, k]
//   P = 2:  y[m, n] = act(Σ_k x[m, k] · G[e(m), n, k] + bg[e(m), n], Σ_k x[m, k] · U[e(m), n, k] + bu[e(m), n])
//           (act and the optional biases: GluParams; plain SwiGLU silu(g)·u by default)
//
// Geometry (shapes only): grid.x = ⌈M / MT⌉ groups of MT consecutive rows of
// x, grid.y = ⌈N / (WARPS · RPW)⌉ blocks of output columns; WARPS warps a
// block, each owning RPW output columns n. A block finds the expert of each
// of its rows (per-row id, binary search in the sorted offsets, or expert 0),
// then runs once per distinct expert among them: for each K slab of SLAB
// columns the x rows are staged in shared memory as f32, and each lane decodes
// its chunk of CHUNK weights of every owned row (one chunk a lane, so a warp
// covers 32 · CHUNK consecutive weights) and accumulates it against the x rows
// of that expert. Warp sums in a fixed order: deterministic, no atomics.
#include "moekit/dequant.cuh"

namespace moekit {

// How rows of x find their expert.
enum RowMode : u32 {
  ROWS_PER_ROW = 0,   // experts = u32 ids [M]
  ROWS_SORTED = 1,    // experts = u32 offsets [E + 1] of expert-sorted rows
  ROWS_SINGLE = 2,    // every row uses expert 0 (experts unused)
};

struct GatherParams {
  const void* x;        // [M, K] of T
  const u32* experts;   // see RowMode
  void* out;            // [M, N] of T
  u32* err;
  WeightSrc src[2];     // P of them used
  u32 m, n, k, n_experts;
  u32 mode;             // RowMode
  u32 group_shift;      // affine: log2(group size), else 0
  u32 pad[2];
  GluParams glu;        // P = 2: the activation, gate/up biases and scales
};
static_assert(sizeof(GatherParams) == 176, "GatherParams layout");

constexpr int MT = 8;                   // rows of x per block
constexpr int WARPS = 4;                // warps per block
constexpr int SLAB = 1024;              // K columns of x staged at a time
constexpr int SLAB_PAD = SLAB + SLAB / 8;
constexpr u32 NO_EXPERT = 0xFFFFFFFFu;

// Shared-memory index of column k of a staged row: 4 floats of padding after
// every 32 keep the lanes' 16-byte reads free of bank conflicts.
__device__ __forceinline__ int xs_index(int k) { return k + (k >> 5) * 4; }

// The expert of row `row`, or NO_EXPERT (past M, or reported as invalid).
__device__ __forceinline__ u32 row_expert(const GatherParams& p, u32 row) {
  if (row >= p.m) return NO_EXPERT;
  if (p.mode == ROWS_SINGLE) return 0;
  if (p.mode == ROWS_PER_ROW) {
    const u32 e = p.experts[row];
    if (e >= p.n_experts) {
      report(p.err, ERR_EXPERT_ID);
      return NO_EXPERT;
    }
    return e;
  }
  // Sorted: the last e < E with offsets[e] <= row; valid iff row < offsets[e + 1].
  const u32* off = p.experts;
  if (p.n_experts == 0 || off[0] > row) {
    report(p.err, ERR_OFFSETS);
    return NO_EXPERT;
  }
  u32 lo = 0, hi = p.n_experts;
  while (hi - lo > 1) {
    const u32 mid = (lo + hi) >> 1;
    if (off[mid] <= row) lo = mid; else hi = mid;
  }
  if (row >= off[lo + 1]) {
    report(p.err, ERR_OFFSETS);
    return NO_EXPERT;
  }
  return lo;
}

// Whole-array check of sorted offsets (block (0, 0) only): 0 = off[0] <=
// off[1] <= … <= off[E] = M. Blocks also check the entries they use.
__device__ void check_offsets(const GatherParams& p) {
  const u32* off = p.experts;
  bool bad = threadIdx.x == 0 && (off[0] != 0 || off[p.n_experts] != p.m);
  for (u32 i = threadIdx.x; i < p.n_experts; i += blockDim.x) bad |= off[i] > off[i + 1];
  if (bad) report(p.err, ERR_OFFSETS);
}

// Stages columns slab·SLAB … of the MT rows of this block as f32 (zeros past M or K).
template <typename T>
__device__ __forceinline__ void stage_x(const GatherParams& p, u32 row0, u32 slab, float (*xs)[SLAB_PAD]) {
  const T* x = static_cast<const T*>(p.x);
  const u32 k0 = slab * SLAB;
  for (int i = threadIdx.x; i < MT * SLAB; i += blockDim.x) {
    const int j = i / SLAB, kl = i % SLAB;
    const u32 row = row0 + j, k = k0 + kl;
    xs[j][xs_index(kl)] = row < p.m && k < p.k ? to_f32(x[(u64)row * p.k + k]) : 0.f;
  }
}

template <typename F, typename T, int P>
__global__ void __launch_bounds__(WARPS * 32) gather_mm(const __grid_constant__ GatherParams p) {
  pdl_entry();  // a dependent launch (ops/mod.rs Order::Dependent)
  static_assert(P == 1 || P == 2, "one source, or gate and up");
  static_assert(32 % F::CHUNK == 0 && F::CHUNK % 4 == 0, "a chunk is whole float4s inside 32 columns");
  constexpr int RPW = P == 1 ? 2 : 1;                   // output columns per warp
  constexpr int CPL = SLAB / (32 * F::CHUNK);           // chunks per lane per slab
  constexpr int SLAB_CHUNKS = SLAB / F::CHUNK;

  __shared__ __align__(16) float xs[MT][SLAB_PAD];
  __shared__ u32 s_expert[MT];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const u32 row0 = blockIdx.x * MT;
  const u32 n0 = (blockIdx.y * WARPS + warp) * RPW;

  if (threadIdx.x < MT) s_expert[threadIdx.x] = row_expert(p, row0 + threadIdx.x);
  if (p.mode == ROWS_SORTED && blockIdx.x == 0 && blockIdx.y == 0) check_offsets(p);
  __syncthreads();

  u32 pending = 0;
#pragma unroll
  for (int j = 0; j < MT; ++j) pending |= (s_expert[j] != NO_EXPERT ? 1u : 0u) << j;

  const u32 n_slabs = (p.k + SLAB - 1) / SLAB;
  const u32 n_chunks = (p.k + F::CHUNK - 1) / F::CHUNK;
  bool staged = false;
  // Block-uniform loop: one pass per distinct expert among the block's rows.
  while (pending) {
    const u32 e = s_expert[__ffs(pending) - 1];
    u32 members = 0;
#pragma unroll
    for (int j = 0; j < MT; ++j) members |= (s_expert[j] == e ? 1u : 0u) << j;
    pending &= ~members;

    QRow rows[RPW * P];
#pragma unroll
    for (int r = 0; r < RPW; ++r)
#pragma unroll
      for (int q = 0; q < P; ++q) {
        const WeightSrc& s = p.src[q];
        const u64 row = (u64)e * s.rows + s.row_offset + n0 + r;
        rows[r * P + q] = make_row<F>(s.data, s.scales, s.biases, row, p.k, p.group_shift);
      }
    float acc[RPW * P][MT];
#pragma unroll
    for (int i = 0; i < RPW * P; ++i)
#pragma unroll
      for (int j = 0; j < MT; ++j) acc[i][j] = 0.f;

    for (u32 slab = 0; slab < n_slabs; ++slab) {
      if (n_slabs > 1 || !staged) {
        __syncthreads();
        stage_x<T>(p, row0, slab, xs);
        __syncthreads();
        staged = true;
      }
#pragma unroll
      for (int i = 0; i < CPL; ++i) {
        const int cl = lane + 32 * i;                    // chunk within the slab
        const u32 c = slab * SLAB_CHUNKS + cl;
        if (c >= n_chunks) break;
        const int xo = xs_index(cl * F::CHUNK);
#pragma unroll
        for (int r = 0; r < RPW; ++r) {
          if (n0 + r >= p.n) break;
#pragma unroll
          for (int q = 0; q < P; ++q) {
            float w[F::CHUNK];
            F::dequant(rows[r * P + q], c, w);
#pragma unroll
            for (int j = 0; j < MT; ++j) {
              if (!((members >> j) & 1u)) continue;
              const float4* xv = reinterpret_cast<const float4*>(&xs[j][xo]);
              float a = acc[r * P + q][j];
#pragma unroll
              for (int v = 0; v < F::CHUNK / 4; ++v) {
                const float4 xx = xv[v];
                a = fmaf(w[4 * v], xx.x, a);
                a = fmaf(w[4 * v + 1], xx.y, a);
                a = fmaf(w[4 * v + 2], xx.z, a);
                a = fmaf(w[4 * v + 3], xx.w, a);
              }
              acc[r * P + q][j] = a;
            }
          }
        }
      }
    }

    T* out = static_cast<T*>(p.out);
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const u32 n = n0 + r;
      if (n >= p.n) break;
#pragma unroll
      for (int j = 0; j < MT; ++j) {
        if (!((members >> j) & 1u)) continue;
        float v[P];
#pragma unroll
        for (int q = 0; q < P; ++q) v[q] = warp_sum(acc[r * P + q][j]);
        float y = v[0];
        if constexpr (P == 2) y = glu(p.glu, v[0], v[1], e, (u64)e * p.n + n);
        if (lane == 0) out[(u64)(row0 + j) * p.n + n] = from_f32<T>(y);
      }
    }
  }
}

}  // namespace moekit
