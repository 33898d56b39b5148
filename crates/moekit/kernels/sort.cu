// sort.cu — the expert sort on the device: a stable counting sort of the T·k
// routed slots by expert id (src/ops/sort.rs), deterministic (no atomics on
// data that decide an order).
//
// The slots are split into ranges of sort::kRange, one warp each. Within a
// range a warp walks its slots 32 at a time in increasing order: the lanes of
// one expert find each other with __match_any_sync, rank themselves by lane,
// and the lowest of them advances the expert's counter in shared memory. So
// the order within an expert is the slot order, as on the CPU.
//
// * n ≤ kRange: `sort_single` does everything in one warp (count, scan, scatter).
// * otherwise: `sort_count` (per range histograms into counts[r][e]),
//   `sort_scan` (offsets, and counts[r][e] rewritten as the first sorted
//   position of expert e's slots in range r), `sort_scatter`.
//
// Ids ≥ E: reported (ERR_EXPERT_ID) and sorted as a virtual expert E, after
// every real one: offsets[E] counts only valid slots, their positions are
// offsets[E]..n, and sorted/inverse stay a permutation of 0..n, so no later
// kernel indexes out of bounds through them.
#include "moekit/common.cuh"

namespace moekit {

struct SortParams {
  const u32* ids;   // [n] expert of slot s = t*k + j
  u32* counts;      // [n_ranges, E+1] scratch (multi-range path only)
  u32* offsets;     // [E+1]
  u32* sorted;      // [n]
  u32* inverse;     // [n]
  u32* err;
  u32 n, n_experts, n_ranges, pad;
};
static_assert(sizeof(SortParams) == 64, "SortParams layout");

namespace sort {

constexpr u32 kFull = 0xffffffffu;
constexpr u32 kNone = 0xffffffffu;
// Slots per warp range, and warps per block of sort_count/sort_scatter
// (src/cuda/ops/sort.rs mirrors both).
constexpr u32 kRange = 1024;
constexpr u32 kWarps = 4;

// The sort key of slot s: its expert, E for an invalid id (reported when
// `report_bad`), kNone past the end.
__device__ __forceinline__ u32 slot_key(const SortParams& p, u32 s, bool report_bad) {
  if (s >= p.n) return kNone;
  const u32 e = p.ids[s];
  if (e < p.n_experts) return e;
  if (report_bad) report(p.err, ERR_EXPERT_ID);
  return p.n_experts;
}

// Warp: hist[0..=E] = number of slots of range r per key (E: invalid ids).
__device__ void count_range(const SortParams& p, u32 r, u32* hist, u32 lane) {
  for (u32 c = lane; c <= p.n_experts; c += 32) hist[c] = 0;
  __syncwarp();
  const u32 begin = r * kRange;
  for (u32 i = 0; i < kRange && begin + i < p.n; i += 32) {
    const u32 e = slot_key(p, begin + i + lane, true);
    const u32 peers = __match_any_sync(kFull, e);
    // The lowest lane of each key adds the group's size; distinct keys, distinct words.
    if (e != kNone && lane == (u32)(__ffs(peers) - 1)) hist[e] += __popc(peers);
    __syncwarp();
  }
}

// Warp: writes the slots of range r to their sorted positions; next[e] holds
// the first position for key e in this range and is advanced.
__device__ void scatter_range(const SortParams& p, u32 r, u32* next, u32 lane) {
  const u32 below = (1u << lane) - 1u;
  const u32 begin = r * kRange;
  for (u32 i = 0; i < kRange && begin + i < p.n; i += 32) {
    const u32 s = begin + i + lane;
    const u32 e = slot_key(p, s, false);
    const u32 peers = __match_any_sync(kFull, e);
    const u32 pos = e != kNone ? next[e] + __popc(peers & below) : 0;
    __syncwarp();
    if (e != kNone && lane == (u32)(__ffs(peers) - 1)) next[e] += __popc(peers);
    __syncwarp();
    if (e == kNone) continue;
    if (pos < p.n) {
      p.sorted[pos] = s;
      p.inverse[s] = pos;
    } else {
      report(p.err, ERR_SLOT);  // unreachable unless ids changed between kernels
    }
  }
}

// In-place exclusive prefix sum of v[0..n) (shared memory) by the whole block
// (blockDim.x a multiple of 32, ≤ 1024); scratch: 32 words of shared memory.
__device__ void block_exclusive_scan(u32* v, u32 n, u32* scratch) {
  const u32 tid = threadIdx.x, nt = blockDim.x, lane = tid & 31u, warp = tid >> 5, nw = nt >> 5;
  const u32 per = (n + nt - 1) / nt;
  const u32 lo = min(n, tid * per), hi = min(n, lo + per);
  __syncthreads();
  u32 local = 0;
  for (u32 i = lo; i < hi; ++i) local += v[i];
  u32 incl = local;
#pragma unroll
  for (u32 o = 1; o < 32; o <<= 1) {
    const u32 x = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += x;
  }
  if (lane == 31) scratch[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const u32 mine = lane < nw ? scratch[lane] : 0u;
    u32 wi = mine;
#pragma unroll
    for (u32 o = 1; o < 32; o <<= 1) {
      const u32 x = __shfl_up_sync(kFull, wi, o);
      if (lane >= o) wi += x;
    }
    if (lane < nw) scratch[lane] = wi - mine;
  }
  __syncthreads();
  u32 run = scratch[warp] + incl - local;
  for (u32 i = lo; i < hi; ++i) {
    const u32 x = v[i];
    v[i] = run;
    run += x;
  }
  __syncthreads();
}

}  // namespace sort

// n ≤ sort::kRange: one block of one warp; shared memory (E + 1 + 32) words.
__global__ void __launch_bounds__(32) sort_single(const __grid_constant__ SortParams p) {
  extern __shared__ u32 sort_smem[];
  const u32 lane = threadIdx.x & 31u, cols = p.n_experts + 1;
  u32* hist = sort_smem;
  sort::count_range(p, 0, hist, lane);
  sort::block_exclusive_scan(hist, cols, hist + cols);
  for (u32 c = lane; c < cols; c += 32) p.offsets[c] = hist[c];
  sort::scatter_range(p, 0, hist, lane);
}

// One warp per range, sort::kWarps per block; shared memory kWarps * (E + 1) words.
__global__ void __launch_bounds__(sort::kWarps * 32) sort_count(const __grid_constant__ SortParams p) {
  extern __shared__ u32 sort_smem[];
  const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, cols = p.n_experts + 1;
  const u32 r = blockIdx.x * sort::kWarps + warp;
  if (r >= p.n_ranges) return;
  u32* hist = sort_smem + warp * cols;
  sort::count_range(p, r, hist, lane);
  u32* row = p.counts + (u64)r * cols;
  for (u32 c = lane; c < cols; c += 32) row[c] = hist[c];
}

// One block of 1024 threads; shared memory (E + 1 + 32) words. Each thread
// walks its columns down the ranges in batches of kBatch independent loads.
__global__ void __launch_bounds__(1024) sort_scan(const __grid_constant__ SortParams p) {
  constexpr u32 kBatch = 8;
  extern __shared__ u32 sort_smem[];
  const u32 cols = p.n_experts + 1, nr = p.n_ranges;
  u32* total = sort_smem;
  for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
    u32 t = 0;
    for (u32 r = 0; r < nr; r += kBatch) {
      u32 x[kBatch];
#pragma unroll
      for (u32 j = 0; j < kBatch; ++j) x[j] = r + j < nr ? p.counts[(u64)(r + j) * cols + c] : 0u;
#pragma unroll
      for (u32 j = 0; j < kBatch; ++j) t += x[j];
    }
    total[c] = t;
  }
  sort::block_exclusive_scan(total, cols, total + cols);
  for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
    u32 run = total[c];
    p.offsets[c] = run;
    for (u32 r = 0; r < nr; r += kBatch) {
      u32 x[kBatch];
#pragma unroll
      for (u32 j = 0; j < kBatch; ++j) x[j] = r + j < nr ? p.counts[(u64)(r + j) * cols + c] : 0u;
#pragma unroll
      for (u32 j = 0; j < kBatch; ++j) {
        if (r + j < nr) p.counts[(u64)(r + j) * cols + c] = run;
        run += x[j];
      }
    }
  }
}

// Geometry of sort_count; shared memory kWarps * (E + 1) words.
__global__ void __launch_bounds__(sort::kWarps * 32) sort_scatter(const __grid_constant__ SortParams p) {
  extern __shared__ u32 sort_smem[];
  const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, cols = p.n_experts + 1;
  const u32 r = blockIdx.x * sort::kWarps + warp;
  if (r >= p.n_ranges) return;
  u32* next = sort_smem + warp * cols;
  const u32* row = p.counts + (u64)r * cols;
  for (u32 c = lane; c < cols; c += 32) next[c] = row[c];
  __syncwarp();
  sort::scatter_range(p, r, next, lane);
}

}  // namespace moekit
