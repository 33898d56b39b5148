// moekit/route.cuh — routing rules as device functors (route::SoftmaxTopK,
// ::TopKSoftmax, ::Gemma4, ::Grouped<Scores>), shared by route.cu (one warp
// per token) and decode.cu (the fused decode path's routing step).
// See route.cu for the bit-compatibility notes.
#pragma once
#include "moekit/common.cuh"

namespace moekit {

struct RouteParams {
  const void* logits;        // [T, E] of T
  u32* ids;                  // [T, k]
  float* weights;            // [T, k]
  const float* vec;          // [E]: Gemma4 per_expert_scale or Grouped bias; null when none
  u32 n_tokens, n_experts, top_k, n_group;
  u32 topk_group, norm_topk_prob;
  float routed_scaling_factor;
  u32 dropped_neg_inf;       // Grouped: dropped groups' keys -inf (llama.cpp), else 0 (mlx-lm)
};
static_assert(sizeof(RouteParams) == 64, "RouteParams layout");

namespace route {

constexpr u32 kFull = 0xffffffffu;
constexpr u32 kNone = 0xffffffffu;
// Tokens (warps) per block, and float buffers of E per warp in dynamic shared
// memory: the launch gives kWarps * 32 threads and kWarps * kBuffers * E * 4
// bytes (src/cuda/ops/route.rs mirrors both).
constexpr u32 kWarps = 4;
constexpr u32 kBuffers = 3;
constexpr u32 kMaxExperts = 1024;  // 32 per lane: one bit each in a u32 mask
constexpr u32 kMaxTopK = 32;       // one slot per lane

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float exp_f32(float x) { return (float)exp((double)x); }

__device__ __forceinline__ float sigmoid(float x) {
  return __fdiv_rn(1.f, __fadd_rn(1.f, exp_f32(-x)));
}

// Whether (a, ia) ranks strictly before (b, ib): larger first, NaN last, ties
// (-0.0 == 0.0, NaN == NaN) to the lower index; kNone (no candidate) last.
__device__ __forceinline__ bool ranks_before(float a, u32 ia, float b, u32 ib) {
  if (ib == kNone) return ia != kNone;
  if (ia == kNone) return false;
  const bool na = isnan(a), nb = isnan(b);
  if (!na && !nb) return a > b || (a == b && ia < ib);
  if (na != nb) return nb;
  return ia < ib;
}

// A 64-bit key whose unsigned order is `ranks_before`'s: the value's bits
// made monotone (−0 as +0) above the inverted index (ties to the lower
// index); every NaN ranks below every number, and 0 (no candidate) below all.
__device__ __forceinline__ u64 rank_key(float v, u32 i) {
  u32 o = 1u;  // NaN
  if (!isnan(v)) {
    const u32 b = v == 0.f ? 0u : __float_as_uint(v);
    o = (b & 0x80000000u) ? ~b : (b | 0x80000000u);  // ≥ 0x007FFFFF (−inf)
  }
  return ((u64)o << 32) | (u64)(0xFFFFFFFFu - i);
}

// Keys a lane keeps in a sorted register list for the selection (of its
// share, indices lane + 32 j): the whole share for E ≤ 32 · SEL_REG, else
// its SEL_REG best, re-scanned from `key` only if a lane wins more rounds.
constexpr u32 SEL_REG = 8;

// The best key of this lane's share (indices lane + 32 j, bit j of `taken`
// clear); key 0 when none.
__device__ __forceinline__ u64 lane_best(const float* key, u32 n, u32 lane, u32 taken) {
  u64 best = 0;
  for (u32 j = 0, e = lane; e < n; ++j, e += 32) {
    if ((taken >> j) & 1u) continue;
    const u64 k = rank_key(key[e], e);
    best = k > best ? k : best;
  }
  return best;
}

// Sorts the SEL_REG keys of a lane in descending order (Batcher's odd-even
// merge sort of 8: 19 compare-exchanges, all indices compile-time, so the
// keys stay in registers).
__device__ __forceinline__ void sort_desc(u64 (&k)[SEL_REG]) {
  static_assert(SEL_REG == 8, "sort_desc is the network for 8 keys");
  constexpr u32 kNet[19][2] = {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {0, 2}, {1, 3}, {4, 6},
                               {5, 7}, {1, 2}, {5, 6}, {0, 4}, {1, 5}, {2, 6}, {3, 7},
                               {2, 4}, {3, 5}, {1, 2}, {3, 4}, {5, 6}};
#pragma unroll
  for (u32 c = 0; c < 19; ++c) {
    const u64 a = k[kNet[c][0]], b = k[kNet[c][1]];
    k[kNet[c][0]] = a > b ? a : b;
    k[kNet[c][1]] = a > b ? b : a;
  }
}

// Inserts x into the descending list k, dropping the smallest.
__device__ __forceinline__ void insert_desc(u64 (&k)[SEL_REG], u64 x) {
#pragma unroll
  for (u32 i = 0; i < SEL_REG; ++i) {
    const u64 hi = x > k[i] ? x : k[i];
    x = x > k[i] ? k[i] : x;
    k[i] = hi;
  }
}

// The 64-bit warp max of unique keys, as two 32-bit warp reductions
// (redux.sync, sm_80+): the largest high word, then the largest low word
// among the lanes that hold it.
__device__ __forceinline__ u64 warp_max_key(u64 best) {
  const u32 hi = (u32)(best >> 32), mh = __reduce_max_sync(kFull, hi);
  const u32 ml = __reduce_max_sync(kFull, hi == mh ? (u32)best : 0u);
  return ((u64)mh << 32) | ml;
}

// Selects the `count` best of key[0..n) (n ≤ 1024, count ≤ n) in rank order:
// lane j < count receives the index of the j-th best in `nth` (kNone for the
// others). Returns this lane's mask of selected keys (bit i: key lane + 32 i).
// Every lane of the warp must call it; `key` must be visible to all lanes.
// Each lane first sorts its keys (its SEL_REG best) into registers; a round
// is then one warp max of unique keys (they hold the index) and, on the
// winning lane, a shift of its list — a search only when a lane of a share
// larger than SEL_REG has won SEL_REG rounds.
__device__ u32 select_best(const float* key, u32 n, u32 count, u32 lane, u32& nth) {
  u32 taken = 0;
  nth = kNone;
  u64 k[SEL_REG];
#pragma unroll
  for (u32 j = 0; j < SEL_REG; ++j) {
    const u32 e = lane + 32 * j;
    k[j] = e < n ? rank_key(key[e], e) : 0;
  }
  sort_desc(k);
  const bool spills = n > 32 * SEL_REG;
  if (spills)
    for (u32 e = lane + 32 * SEL_REG; e < n; e += 32) insert_desc(k, rank_key(key[e], e));
  for (u32 j = 0; j < count; ++j) {
    const u64 m = warp_max_key(k[0]);
    const u32 e = 0xFFFFFFFFu - (u32)m;  // 0 (no candidate) decodes to kNone
    if (lane == j) nth = e;
    if (m != 0 && k[0] == m) {
      taken |= 1u << ((e - lane) >> 5);
#pragma unroll
      for (u32 i = 0; i + 1 < SEL_REG; ++i) k[i] = k[i + 1];
      k[SEL_REG - 1] = 0;
      // Every listed key is taken: the next best of the share is unlisted.
      if (spills && k[0] == 0) k[0] = lane_best(key, n, lane, taken);
    }
  }
  return taken;
}

// The largest of buf[0..n) (fmaxf: NaN ignored, as Rust's f32::max), on every lane.
__device__ __forceinline__ float all_max(const float* buf, u32 n, u32 lane) {
  float m = neg_inf();
  for (u32 e = lane; e < n; e += 32) m = fmaxf(m, buf[e]);
  return warp_max(m);
}

// 0 + buf[0] + buf[1] + … in index order (every lane computes it: broadcast
// reads). Blocks of 32 values are loaded before they are added, so only the
// additions are serial.
__device__ __forceinline__ float ordered_sum(const float* buf, u32 n) {
  float s = 0.f;
  u32 e = 0;
  for (; e + 32 <= n; e += 32) {
    float v[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) v[i] = buf[e + i];
#pragma unroll
    for (int i = 0; i < 32; ++i) s = __fadd_rn(s, v[i]);
  }
  for (; e < n; ++e) s = __fadd_rn(s, buf[e]);
  return s;
}

// 0 + v(lane 0) + … + v(lane k-1) in slot order (k ≤ 32, the same on every
// lane), on every lane: the k shuffles are independent, only the additions
// are serial.
__device__ __forceinline__ float slot_sum(float v, u32 k) {
  float x[32];
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    if ((u32)j >= k) break;
    x[j] = __shfl_sync(kFull, v, j);
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    if ((u32)j >= k) break;
    s = __fadd_rn(s, x[j]);
  }
  return s;
}

// w /= Σ w over the k slots, unless the sum is not positive (the zero-sum guard).
__device__ __forceinline__ float renormalise(float w, u32 k) {
  const float s = slot_sum(w, k);
  return s > 0.f ? __fdiv_rn(w, s) : w;
}

// A team routes one token: a warp (route.cu, and decode.cu for several
// tokens at once) or a whole block (decode.cu for one or two tokens). Both
// hold E, k and three shared buffers of E floats (`a` holds the token's
// logits on entry), walk the experts with stride size() from tid(), and
// give the k slots to threads tid() < k — lanes of the first warp either
// way, so the slot-order sums (slot_sum, renormalise) are the same
// shuffles. Every value is the same in both: the selection and the max are
// exact, and every sum runs in one fixed order.
struct Warp {
  u32 lane, n, k;
  float* a;
  float* b;
  float* c;
  __device__ __forceinline__ u32 tid() const { return lane; }
  __device__ __forceinline__ u32 size() const { return 32; }
  __device__ __forceinline__ void sync() const { __syncwarp(); }
  // The largest of buf[0..n), on every lane.
  __device__ __forceinline__ float max_all(const float* buf) const { return all_max(buf, n, lane); }
  // select_best of key[0..nk): lane j < count gets the j-th best; the
  // mask has bit i for key lane + 32 i.
  __device__ __forceinline__ u32 select(const float* key, u32 nk, u32 count, u32& nth) const {
    return select_best(key, nk, count, lane, nth);
  }
};

// Largest E (and group count) a block routes.
constexpr u32 kBlockKeys = 256;

// A block's shared scratch for routing one token.
struct BlockScratch {
  u64 keys[kBlockKeys];
  u32 chosen[kMaxTopK];
  float red[32];
};

// A whole block routing one token: the selection counts each key's rank
// (the keys greater than it) on its own thread, so no round waits on the
// previous one. Every thread of the block must call every method.
struct Block {
  u32 lane, n, k;
  float* a;
  float* b;
  float* c;
  BlockScratch* s;
  __device__ __forceinline__ u32 tid() const { return threadIdx.x; }
  __device__ __forceinline__ u32 size() const { return blockDim.x; }
  __device__ __forceinline__ void sync() const { __syncthreads(); }
  __device__ float max_all(const float* buf) const {
    float m = neg_inf();
    for (u32 e = tid(); e < n; e += size()) m = fmaxf(m, buf[e]);
    m = warp_max(m);
    if (lane == 0) s->red[threadIdx.x >> 5] = m;
    __syncthreads();
    float r = s->red[0];
    for (u32 w = 1; w < (blockDim.x >> 5); ++w) r = fmaxf(r, s->red[w]);
    __syncthreads();  // red is free again
    return r;
  }
  // As Warp::select (nk ≤ kBlockKeys); the mask has bit i for key tid + size·i.
  __device__ u32 select(const float* key, u32 nk, u32 count, u32& nth) const {
    for (u32 e = tid(); e < nk; e += size()) s->keys[e] = rank_key(key[e], e);
    __syncthreads();
    u32 taken = 0;
    for (u32 i = tid(), bit = 0; i < nk; i += size(), ++bit) {
      const u64 ki = s->keys[i];
      u32 r = 0;
#pragma unroll 8
      for (u32 j = 0; j < nk; ++j) r += s->keys[j] > ki ? 1u : 0u;
      if (r < count) {
        s->chosen[r] = i;
        taken |= 1u << bit;
      }
    }
    __syncthreads();
    nth = tid() < count ? s->chosen[tid()] : kNone;
    __syncthreads();  // keys and chosen are free again
    return taken;
  }
};

// Softmax over the chosen k (max and sum in slot order): slot thread j < k
// gets the weight of slot j; `id` is the slot's expert (kNone past k).
template <class W>
__device__ __forceinline__ float chosen_softmax(const W& w, u32 id) {
  const bool mine = w.tid() < w.k;
  const float v = mine ? w.a[id] : neg_inf();
  const float m = warp_max(v);
  const float x = mine ? exp_f32(__fsub_rn(v, m)) : 0.f;
  const float s = slot_sum(x, w.k);
  return mine ? __fdiv_rn(x, s) : 0.f;
}

// Qwen3-MoE / Qwen2-MoE: softmax over all, top-k (on the logits), optional renormalisation.
struct SoftmaxTopK {
  template <class W>
  static __device__ void run(const RouteParams& p, const W& w, u32& id, float& wt) {
    w.select(w.a, w.n, w.k, id);
    const float m = w.max_all(w.a);
    // Unrolled: independent exponentials overlap.
#pragma unroll 4
    for (u32 e = w.tid(); e < w.n; e += w.size()) w.b[e] = exp_f32(__fsub_rn(w.a[e], m));
    w.sync();
    const float sum = ordered_sum(w.b, w.n);
    wt = w.tid() < w.k ? __fdiv_rn(w.b[id], sum) : 0.f;
    if (p.norm_topk_prob) wt = renormalise(wt, w.k);
  }
};

// Mixtral / gpt-oss: top-k on the logits, softmax over the chosen.
struct TopKSoftmax {
  template <class W>
  static __device__ void run(const RouteParams&, const W& w, u32& id, float& wt) {
    w.select(w.a, w.n, w.k, id);
    wt = chosen_softmax(w, id);
  }
};

// Gemma-4: as TopKSoftmax, then × per_expert_scale[e] (p.vec).
struct Gemma4 {
  template <class W>
  static __device__ void run(const RouteParams& p, const W& w, u32& id, float& wt) {
    w.select(w.a, w.n, w.k, id);
    wt = chosen_softmax(w, id);
    if (w.tid() < w.k) wt = __fmul_rn(wt, p.vec[id]);
  }
};

// Scores of the grouped router, computed in place over w.a (the logits).
struct SoftmaxScores {
  static constexpr bool kSigmoid = false;
  template <class W>
  static __device__ void scores(const W& w) {
    const float m = w.max_all(w.a);
    for (u32 e = w.tid(); e < w.n; e += w.size()) w.a[e] = exp_f32(__fsub_rn(w.a[e], m));
    w.sync();
    const float sum = ordered_sum(w.a, w.n);
    w.sync();
    for (u32 e = w.tid(); e < w.n; e += w.size()) w.a[e] = __fdiv_rn(w.a[e], sum);
  }
};

struct SigmoidScores {
  static constexpr bool kSigmoid = true;
  template <class W>
  static __device__ void scores(const W& w) {
    for (u32 e = w.tid(); e < w.n; e += w.size()) w.a[e] = sigmoid(w.a[e]);
  }
};

// DeepSeek-V2/V3, GLM-4-MoE: scores s (w.a), selection keys q = s + bias
// (w.b), group-limited (group scores and kept flags in w.c), weights from s.
template <class Scores>
struct Grouped {
  // Sets q outside the topk_group best of n_group groups to 0.0 (mlx-lm's
  // masking: those experts stay selectable) or, with p.dropped_neg_inf, to
  // -inf (llama.cpp's: never selected while a kept key is a number).
  template <class W>
  static __device__ void mask_groups(const RouteParams& p, const W& w) {
    const u32 g_n = p.n_group, size = w.n / g_n;
    for (u32 g = w.tid(); g < g_n; g += w.size()) {
      float v1 = 0.f, v2 = 0.f;
      u32 i1 = kNone, i2 = kNone;
      for (u32 e = g * size; e < (g + 1) * size; ++e) {
        const float v = w.b[e];
        if (ranks_before(v, e, v1, i1)) {
          v2 = v1;
          i2 = i1;
          v1 = v;
          i1 = e;
        } else if (ranks_before(v, e, v2, i2)) {
          v2 = v;
          i2 = e;
        }
      }
      // sigmoid: sum of the two best (the one, for groups of one); softmax: the best.
      w.c[g] = (Scores::kSigmoid && i2 != kNone) ? __fadd_rn(v1, v2) : v1;
    }
    w.sync();
    u32 unused;
    const u32 kept = w.select(w.c, g_n, p.topk_group, unused);
    w.sync();
    for (u32 g = w.tid(), j = 0; g < g_n; g += w.size(), ++j) w.c[g] = ((kept >> j) & 1u) ? 1.f : 0.f;
    w.sync();
    const float dropped = p.dropped_neg_inf ? neg_inf() : 0.f;
    for (u32 e = w.tid(); e < w.n; e += w.size())
      if (w.c[e / size] == 0.f) w.b[e] = dropped;
    w.sync();
  }

  template <class W>
  static __device__ void run(const RouteParams& p, const W& w, u32& id, float& wt) {
    Scores::scores(w);
    for (u32 e = w.tid(); e < w.n; e += w.size()) w.b[e] = p.vec ? __fadd_rn(w.a[e], p.vec[e]) : w.a[e];
    w.sync();
    if (p.n_group > 1 && p.topk_group < p.n_group) mask_groups(p, w);
    w.select(w.b, w.n, w.k, id);
    wt = w.tid() < w.k ? w.a[id] : 0.f;
    if (p.norm_topk_prob && w.k > 1) wt = renormalise(wt, w.k);
    wt = __fmul_rn(wt, p.routed_scaling_factor);
  }
};

}  // namespace route

}  // namespace moekit
