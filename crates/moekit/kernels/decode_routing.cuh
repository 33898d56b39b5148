// decode_routing.cuh — the decode path's routing step: every token routed
// (route.cuh's rules, by a warp or the whole block), then the T·k slots
// sorted by expert and the active experts listed. Two callers: the routing
// kernel decode_route_tail (decode_tail.cu, one instance for every format),
// and — fold_route, T ≤ FOLD_MAX_T — each decode_gate_up_mma block, which
// compiles the block team only. This is the costliest code of the decode
// kernels to compile, so no format-templated kernel holds more of it.
#pragma once
#include "moekit/decode_common.cuh"
#include "moekit/route.cuh"

namespace moekit {

// Routes token t with a team — a warp or the block (route.cuh's rules, the
// CPU's arithmetic); the ids also go to `ids_s` (shared memory) for the sort.
// Which code a routing step compiles: one rule (a DecodeRule) or any
// (RULE_ANY: chosen per call from p.rule), and one team or either (TEAM_ANY:
// chosen per call from T and E). decode_route_tail has an instance per
// (rule, team), so the code it runs is that pair's alone: one token's
// routing is a chain of dependent steps, and with every rule and team in
// one kernel (15 000 SASS instructions) it waited mostly on instruction
// fetch (H100 ncu, T = 1: 8 of 9 stall samples `no_instruction`).
constexpr int RULE_ANY = -1;
enum RouteTeam : int { TEAM_ANY = 0, TEAM_BLOCK = 1, TEAM_WARP = 2 };

template <int RULE, class W>
__device__ void route_token(const DecodeParams& p, u32 t, const W& w, u32* ids_s, bool publish) {
  RouteParams rp;
  rp.logits = nullptr;
  rp.ids = p.ids;
  rp.weights = p.weights;
  rp.vec = p.rvec;
  rp.n_tokens = p.n_tokens;
  rp.n_experts = p.n_experts;
  rp.top_k = p.top_k;
  rp.n_group = p.n_group;
  rp.topk_group = p.topk_group;
  rp.norm_topk_prob = p.norm_topk_prob;
  rp.routed_scaling_factor = p.rsf;
  rp.dropped_neg_inf = (p.rule & RULE_DROPPED_NEG_INF) ? 1u : 0u;
  const float* row = p.logits + (u64)t * (p.n_experts + 1);
  for (u32 e = w.tid(); e < w.n; e += w.size()) w.a[e] = row[e];
  w.sync();
  u32 id = route::kNone;
  float wt = 0.f;
  switch (RULE == RULE_ANY ? (p.rule & RULE_KIND) : (u32)RULE) {
    case RULE_SOFTMAX_TOPK: route::SoftmaxTopK::run(rp, w, id, wt); break;
    case RULE_TOPK_SOFTMAX: route::TopKSoftmax::run(rp, w, id, wt); break;
    case RULE_GEMMA4: route::Gemma4::run(rp, w, id, wt); break;
    case RULE_GROUPED_SOFTMAX: route::Grouped<route::SoftmaxScores>::run(rp, w, id, wt); break;
    default: route::Grouped<route::SigmoidScores>::run(rp, w, id, wt); break;
  }
  if (w.tid() < w.k) {
    if (publish) {
      p.ids[(u64)t * w.k + w.tid()] = id;
      p.weights[(u64)t * w.k + w.tid()] = wt;
    }
    ids_s[t * w.k + w.tid()] = id;
  }
  w.sync();
}

// Where the expert sort writes: the global routing arrays, or a block's own
// copies in shared memory.
struct SortOut {
  u32* offsets;   // [E + 1]
  u32* active;    // [E]
  u32* n_active;  // [1]
  u32* slots;     // [T·k]
};

// Routes every token (each by the whole block for T ≤ route_block and E ≤
// kBlockKeys, else a warp each), then sorts the T·k slots by expert
// (stable) and lists the active experts ascending, into `o`: the kernel
// decode_route_tail, or (fold_route) the prologue of a decode_gate_up_mma block.
// `buf`: max(route_warps · 3 · E, E + 1) floats of shared memory, then T·k
// ids. `publish`: also write the routing (ids, weights, shared factors) to
// global memory. Every thread of the block calls it; the caller syncs
// before reading the sort's arrays.
// RULE, TEAM: see RULE_ANY and RouteTeam (the caller guarantees that a
// fixed team or rule is this call's: TEAM_BLOCK only for T ≤ route_block and
// E ≤ kBlockKeys, TEAM_WARP only otherwise). The gate/up blocks' own routing
// (fold_route) compiles TEAM_BLOCK with every rule: every expert-format
// instance of decode_gate_up_mma holds it, so it stays one copy.
// How many of one token's k chosen experts ids[0..k) (distinct) are below
// v: expert v's offset in the sorted slots, or, for a chosen v, its rank in
// the ascending active list.
__device__ __forceinline__ u32 chosen_below(const u32* ids, u32 k, u32 v) {
  u32 c = 0;
  for (u32 j = 0; j < k; ++j) c += ids[j] < v ? 1u : 0u;
  return c;
}

template <int RULE, int TEAM>
__device__ void route_and_sort(const DecodeParams& p, float* buf, route::BlockScratch* s_route, const SortOut& o,
                               bool publish) {
  const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const u32 E = p.n_experts, nt = p.n_tokens, k = p.top_k;
  const u32 n = nt * k;
  u32* ids_s = reinterpret_cast<u32*>(buf + max(p.route_warps * 3 * E, E + 1));
  auto route_all = [&]() {
    const bool block = TEAM == TEAM_BLOCK || (TEAM == TEAM_ANY && nt <= p.route_block && E <= route::kBlockKeys);
    if (TEAM != TEAM_WARP && block) {
      // Few tokens: each routed by the whole block in turn (the first warp's buffers).
      const route::Block w{lane, E, k, buf, buf + E, buf + 2 * E, s_route};
      for (u32 t = 0; t < nt; ++t) route_token<RULE>(p, t, w, ids_s, publish);
    } else if (TEAM != TEAM_BLOCK && warp < p.route_warps) {
      float* a = buf + (u64)warp * 3 * E;
      const route::Warp w{lane, E, k, a, a + E, a + 2 * E};
      for (u32 t = warp; t < nt; t += p.route_warps) route_token<RULE>(p, t, w, ids_s, publish);
    }
  };
#ifdef MOEKIT_TRACE
  // Diagnostic (trace_twice = 1): route twice, the second pass on warm code.
  if (p.trace_twice == 1) {
    route_all();
    __syncthreads();
    if (publish) trace_at(p, TR_TAIL_FIRST);
  }
#endif
  route_all();
  if (publish) trace_at(p, TR_TAIL_ROUTED);
  for (u32 t = threadIdx.x; publish && t < nt; t += blockDim.x) {
    const float g = p.logits[(u64)t * (E + 1) + E];
    p.shared_factor[t] = p.sgate.data ? 1.f / (1.f + expf(-g)) : 1.f;
  }
  __syncthreads();
  if (nt == 1) {
    // One token: its k experts (distinct) are the active list, ascending;
    // an expert's offset is the number of chosen experts below it, and slot
    // j goes to its expert's place — what the counting sort gives, without
    // its passes over E.
    for (u32 e = threadIdx.x; e <= E; e += blockDim.x) o.offsets[e] = chosen_below(ids_s, k, e);
    if (threadIdx.x < k) {
      const u32 id = ids_s[threadIdx.x];
      const u32 r = chosen_below(ids_s, k, id);
      o.active[r] = id;
      o.slots[r] = threadIdx.x;
    }
    if (threadIdx.x == 0) *o.n_active = k;
    return;
  }
  // Counting sort of the T·k slots by expert (stable) and the active list,
  // in shared memory (the routing buffers are free again).
  u32* cnt = reinterpret_cast<u32*>(buf);
  for (u32 e = threadIdx.x; e <= E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (u32 s = threadIdx.x; s < n; s += blockDim.x) atomicAdd(&cnt[ids_s[s]], 1u);
  __syncthreads();
  if (warp == 0) {
    u32 base = 0, act_base = 0;
    for (u32 e0 = 0; e0 < E; e0 += 32) {
      const u32 e = e0 + lane;
      const u32 c = e < E ? cnt[e] : 0;
      u32 inc = c, flag = c > 0 ? 1u : 0u;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const u32 a = __shfl_up_sync(0xffffffffu, inc, d);
        const u32 b = __shfl_up_sync(0xffffffffu, flag, d);
        if (lane >= (u32)d) {
          inc += a;
          flag += b;
        }
      }
      if (e < E) {
        o.offsets[e] = base + inc - c;
        cnt[e] = base + inc - c;  // the expert's cursor
        if (c > 0) o.active[act_base + flag - 1] = e;
      }
      base += __shfl_sync(0xffffffffu, inc, 31);
      act_base += __shfl_sync(0xffffffffu, flag, 31);
    }
    if (lane == 0) {
      o.offsets[E] = base;
      *o.n_active = act_base;
    }
    __syncwarp();
    // Stable placement, 32 slots at a time: a slot's place is its expert's
    // cursor plus the earlier lanes with the same expert; the last of those
    // lanes then advances the cursor.
    for (u32 s0 = 0; s0 < n; s0 += 32) {
      const u32 s = s0 + lane;
      const u32 e = s < n ? ids_s[s] : 0xffffffffu;
      const u32 peers = __match_any_sync(0xffffffffu, e);
      if (s < n) o.slots[cnt[e] + __popc(peers & ((1u << lane) - 1u))] = s;
      __syncwarp();
      if (s < n && (peers >> lane) == 1u) cnt[e] += __popc(peers);
      __syncwarp();
    }
  }
}


}  // namespace moekit
