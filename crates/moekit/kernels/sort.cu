// sort.cu — the expert sort on the device: a stable counting sort of the T·k
// routed slots by expert id (src/ops/sort.rs), deterministic (no atomics on
// data that decide an order).
//
// The slots are split into ranges of sort::kRange, one block of kWarps warps
// each; warp w of a range takes its kSub slots w·kSub .. and walks them 32 at
// a time in increasing order: the lanes of one expert find each other with
// __match_any_sync, rank themselves by lane, and the lowest of them advances
// the expert's counter in the warp's row of a shared table. The rows are then
// turned into each warp's first position per expert by an exclusive sum over
// the warps of the range, in warp order. So the order within an expert is the
// slot order, as on the CPU. (One warp walking a whole 1024-slot range took
// 13–24 µs a kernel on an H200; a walk of kSub slots, four steps, does not.)
//
// * n ≤ kRange: `sort_single` does everything in one block (count, scan, scatter).
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
// Slots per range (one block), and warps per block (src/cuda/ops/sort.rs
// mirrors both); each warp walks kSub slots, kPerLane a lane.
constexpr u32 kRange = 1024;
constexpr u32 kWarps = 8;
constexpr u32 kThreads = 32 * kWarps;
constexpr u32 kSub = kRange / kWarps;
constexpr u32 kPerLane = kSub / 32;

// Warp: the sort keys of the kSub slots from `begin` — a slot's expert, E for
// an invalid id (reported when `report_bad`), kNone past the end — with
// every load issued before any is used.
__device__ __forceinline__ void load_keys(const SortParams& p, u32 begin, u32 lane, bool report_bad, u32 (&key)[kPerLane]) {
  const u32 s0 = begin + lane;
#pragma unroll
  for (u32 j = 0; j < kPerLane; ++j) key[j] = s0 + 32 * j < p.n ? p.ids[s0 + 32 * j] : 0u;
  bool bad = false;
#pragma unroll
  for (u32 j = 0; j < kPerLane; ++j) {
    if (s0 + 32 * j >= p.n) {
      key[j] = kNone;
    } else if (key[j] >= p.n_experts) {
      key[j] = p.n_experts;
      bad = true;
    }
  }
  if (report_bad && bad) report(p.err, ERR_EXPERT_ID);
}

// Warp: hist[0..=E] = number of its slots per key (E: invalid ids).
__device__ __forceinline__ void count_sub(const SortParams& p, u32 begin, const u32 (&key)[kPerLane], u32* hist, u32 lane) {
  for (u32 c = lane; c <= p.n_experts; c += 32) hist[c] = 0;
  __syncwarp();
#pragma unroll
  for (u32 j = 0; j < kPerLane; ++j) {
    if (begin + 32 * j >= p.n) break;
    const u32 e = key[j];
    const u32 peers = __match_any_sync(kFull, e);
    // The lowest lane of each key adds the group's size; distinct keys, distinct words.
    if (e != kNone && lane == (u32)(__ffs(peers) - 1)) hist[e] += __popc(peers);
    __syncwarp();
  }
}

// Warp: writes its slots to their sorted positions; next[e] holds the first
// position for key e of this warp's slots and is advanced.
__device__ __forceinline__ void scatter_sub(const SortParams& p, u32 begin, const u32 (&key)[kPerLane], u32* next, u32 lane) {
  const u32 below = (1u << lane) - 1u;
#pragma unroll
  for (u32 j = 0; j < kPerLane; ++j) {
    if (begin + 32 * j >= p.n) break;
    const u32 s = begin + 32 * j + lane;
    const u32 e = key[j];
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

// Block (kThreads): loads range r's keys and counts them into table[w][c]
// (kWarps rows of cols = E + 1 words), one row per warp.
__device__ __forceinline__ void count_range(const SortParams& p, u32 r, bool report_bad, u32 (&key)[kPerLane], u32* table) {
  const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const u32 begin = r * kRange + warp * kSub;
  load_keys(p, begin, lane, report_bad, key);
  count_sub(p, begin, key, table + warp * (p.n_experts + 1), lane);
  __syncthreads();
}

// Block: out[c] = the sum of column c of the table over the warps' rows.
__device__ __forceinline__ void column_totals(const u32* table, u32 cols, u32* out) {
  for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
    u32 t = 0;
#pragma unroll
    for (u32 w = 0; w < kWarps; ++w) t += table[w * cols + c];
    out[c] = t;
  }
}

// Block: column c of the table becomes start[c] plus the counts of the rows
// before it: each warp's first position per key. The caller syncs before a
// warp reads its row.
__device__ __forceinline__ void rows_to_starts(u32* table, u32 cols, const u32* start) {
  for (u32 c = threadIdx.x; c < cols; c += blockDim.x) {
    u32 run = start[c];
#pragma unroll
    for (u32 w = 0; w < kWarps; ++w) {
      const u32 x = table[w * cols + c];
      table[w * cols + c] = run;
      run += x;
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

// n ≤ sort::kRange: one block; shared memory (kWarps + 1)·(E + 1) + 32 words.
__global__ void __launch_bounds__(sort::kThreads) sort_single(const __grid_constant__ SortParams p) {
  pdl_entry();  // a dependent launch (ops/mod.rs Order::Dependent)
  extern __shared__ u32 sort_smem[];
  const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, cols = p.n_experts + 1;
  u32* table = sort_smem;
  u32* total = table + sort::kWarps * cols;
  u32 key[sort::kPerLane];
  sort::count_range(p, 0, true, key, table);
  // Totals per key, then their exclusive sum: the offsets.
  sort::column_totals(table, cols, total);
  sort::block_exclusive_scan(total, cols, total + cols);
  for (u32 c = threadIdx.x; c < cols; c += blockDim.x) p.offsets[c] = total[c];
  sort::rows_to_starts(table, cols, total);
  __syncthreads();
  sort::scatter_sub(p, warp * sort::kSub, key, table + warp * cols, lane);
}

// One block per range; shared memory kWarps·(E + 1) words.
__global__ void __launch_bounds__(sort::kThreads) sort_count(const __grid_constant__ SortParams p) {
  pdl_entry();  // a dependent launch (ops/mod.rs Order::Dependent)
  extern __shared__ u32 sort_smem[];
  const u32 r = blockIdx.x, cols = p.n_experts + 1;
  if (r >= p.n_ranges) return;
  u32 key[sort::kPerLane];
  sort::count_range(p, r, true, key, sort_smem);
  sort::column_totals(sort_smem, cols, p.counts + (u64)r * cols);
}

// One block of 1024 threads; shared memory (E + 1 + 32) words. Each thread
// walks its columns down the ranges in batches of kBatch independent loads.
__global__ void __launch_bounds__(1024) sort_scan(const __grid_constant__ SortParams p) {
  pdl_entry();  // a dependent launch (ops/mod.rs Order::Dependent)
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

// As sort_count: the range's counts again, each warp's first positions from
// the range's (sort_scan), then the scatter.
__global__ void __launch_bounds__(sort::kThreads) sort_scatter(const __grid_constant__ SortParams p) {
  pdl_entry();  // a dependent launch (ops/mod.rs Order::Dependent)
  extern __shared__ u32 sort_smem[];
  const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, cols = p.n_experts + 1;
  const u32 r = blockIdx.x;
  if (r >= p.n_ranges) return;
  u32 key[sort::kPerLane];
  sort::count_range(p, r, false, key, sort_smem);
  sort::rows_to_starts(sort_smem, cols, p.counts + (u64)r * cols);
  __syncthreads();
  sort::scatter_sub(p, r * sort::kRange + warp * sort::kSub, key, sort_smem + warp * cols, lane);
}

}  // namespace moekit
