// decode.cu — the MoE block for few tokens (decode, T ≤ 64) in three
// or four launches, with no host round trip (capturable in a CUDA graph):
//
//   1. decode_route     router matvec, four warps per router row (plus the
//                       shared-expert gate row) → logits; then the routing
//                       step (decode_routing.cuh) routes the tokens and
//                       builds the expert-sorted slot list and the list of
//                       active experts: one block of decode_route_tail
//                       (decode_tail.cu: compiled once, not per format), or
//                       at T = 1 (fold_route) every gate/up block itself —
//                       only its own expert where the rule selects on the
//                       logits (select_expert), while one more block of the
//                       grid computes and publishes the whole routing.
//   2. gate/up          block (16-row tile, active expert) → act[slot, n] =
//                       silu(g)·u (or the block's GluParams activation with
//                       gate/up biases: gpt-oss) for every token that chose
//                       the expert (the shared expert is one more grid row
//                       over all tokens).
//   3. down + combine   block (16-row tile of H, active expert) → y[slot, h];
//                       the last block of a row tile (a ticket per tile) sums
//                       each token's k slots in slot order (+ gated shared
//                       expert) into out.
//
// Steps 2 and 3 run on tensor cores for 16-bit activations
// (decode_gate_up_mma, decode_down_mma: moekit/decode_mma.cuh, weights
// decoded straight into MMA fragments, the block's warps splitting K) and
// on CUDA cores for f32 activations or f32 weights (decode_gate_up,
// decode_down: moekit/decode_f32.cuh, f32 arithmetic throughout). The host
// (decode.rs: `Kernels`) picks which, and the tiles of the CUDA-core kernels.
//
// Deterministic and batch-invariant: every (row, token) dot uses the same
// order of products and sums whatever the other tokens are (the MMA split
// of K depends on K only); the combine runs in slot order; no float
// atomics. Intermediates are rounded to the activation type where the
// general path stores them in it, so both paths agree to rounding.
#include "moekit/dequant.cuh"
#include "moekit/pipe.cuh"
#include "moekit/decode_mma.cuh"
#include "moekit/decode_routing.cuh"

namespace moekit {

constexpr int DEC_WARPS = 8;    // warps per block of decode_gate_up and decode_down
constexpr u32 ROUTE_WARPS = 8;  // warps per decode_route block (ROUTE_ROW_WARPS a router row)
constexpr int DEC_TG = 4;      // tokens per register group
// Lanes that share one row's dot (a warp works on DEC_GROUPS rows at once).
constexpr u32 DEC_GL = 8, DEC_GROUPS = 32 / DEC_GL;

__device__ __forceinline__ u32 group_mask(u32 grp) { return ((1u << DEC_GL) - 1u) << (grp * DEC_GL); }

// Sum over the DEC_GL lanes of a group (fixed order: deterministic).
__device__ __forceinline__ float group_sum(float v, u32 mask) {
#pragma unroll
  for (u32 o = DEC_GL / 2; o > 0; o >>= 1) v += __shfl_xor_sync(mask, v, o);
  return v;
}

// Loads CHUNK activations from column k0 of a row of `k` values as f32: one
// or more 16-byte loads when the whole chunk is in range and aligned (a warp's
// lanes then read consecutive 16-byte words), else element by element with
// zeros past `k`.
template <int CHUNK, typename T>
__device__ __forceinline__ void load_chunk(const T* row, u32 k0, u32 k, float (&v)[CHUNK]) {
  const T* src = row + k0;
  constexpr int PER = 16 / (int)sizeof(T);  // values per 16-byte word
  constexpr int BYTES = CHUNK * (int)sizeof(T);
  if (k0 + CHUNK <= k && (reinterpret_cast<u64>(src) & 15) == 0 && CHUNK % PER == 0) {
#pragma unroll
    for (int q = 0; q < CHUNK / PER; ++q) {
      const uint4 w = __ldg(reinterpret_cast<const uint4*>(src) + q);
      const T* e = reinterpret_cast<const T*>(&w);
#pragma unroll
      for (int i = 0; i < PER; ++i) v[q * PER + i] = to_f32(e[i]);
    }
  } else if (BYTES == 8 && k0 + CHUNK <= k && (reinterpret_cast<u64>(src) & 7) == 0) {
    // 16-bit activations against an f32 router's 4-value chunks: one 8-byte load.
    const uint2 w = __ldg(reinterpret_cast<const uint2*>(src));
    const T* e = reinterpret_cast<const T*>(&w);
#pragma unroll
    for (int i = 0; i < CHUNK; ++i) v[i] = to_f32(e[i]);
  } else {
#pragma unroll
    for (int i = 0; i < CHUNK; ++i) v[i] = k0 + i < k ? to_f32(src[i]) : 0.f;
  }
}

// Dot of a decoded chunk (CHUNK weights from column k0) with a row of `k`
// values (T or f32); columns past `k` count as zero.
template <int CHUNK, typename T>
__device__ __forceinline__ float chunk_dot(const float (&w)[CHUNK], const T* x, u32 k0, u32 k) {
  float v[CHUNK];
  load_chunk<CHUNK, T>(x, k0, k, v);
  float a = 0.f;
#pragma unroll
  for (int i = 0; i < CHUNK; ++i) a = fmaf(w[i], v[i], a);
  return a;
}

template <typename F>
__device__ __forceinline__ QRow row_of(const DecodeW& w, u64 expert, u32 n) {
  return make_row<F>(w.data, w.scales, w.biases, expert * w.rows + w.row_offset + n, w.k, w.group_shift);
}

constexpr u32 ROUTE_ROW_WARPS = 4;  // warps splitting one router row
constexpr u32 ROUTE_ROWS = ROUTE_WARPS / ROUTE_ROW_WARPS;
constexpr u32 ROUTE_HELD = 8;  // chunks a lane holds in registers at once

// A chunk of CHUNK x values (whole, inside an aligned row) as raw 32-bit
// words: load() with 8- or 16-byte vector loads and no bounds or alignment
// branch; dot() is chunk_dot's order of products and sums (the same bits).
template <int CHUNK, typename T>
struct XRaw {
  static constexpr int BYTES = CHUNK * (int)sizeof(T);
  static_assert(BYTES % 8 == 0, "x chunks of whole 8-byte words");
  static constexpr int WORDS = BYTES / 4;
  u32 w[WORDS];
  __device__ __forceinline__ void load(const T* src) {
    if constexpr (BYTES % 16 == 0) {
#pragma unroll
      for (int q = 0; q < WORDS / 4; ++q) {
        const uint4 u = __ldg(reinterpret_cast<const uint4*>(src) + q);
        w[4 * q] = u.x;
        w[4 * q + 1] = u.y;
        w[4 * q + 2] = u.z;
        w[4 * q + 3] = u.w;
      }
    } else {
#pragma unroll
      for (int q = 0; q < WORDS / 2; ++q) {
        const uint2 u = __ldg(reinterpret_cast<const uint2*>(src) + q);
        w[2 * q] = u.x;
        w[2 * q + 1] = u.y;
      }
    }
  }
  __device__ __forceinline__ float dot(const float (&wt)[CHUNK]) const {
    const T* e = reinterpret_cast<const T*>(w);
    float a = 0.f;
#pragma unroll
    for (int i = 0; i < CHUNK; ++i) a = fmaf(wt[i], to_f32(e[i]), a);
    return a;
  }
};

constexpr u32 ROUTE_STRIDE = 32 * ROUTE_ROW_WARPS;  // lanes of a router row

// acc[i] += the dots of token t0 + i (i < DEC_TG, t0 + i < nt) with the
// router row's chunks first + ROUTE_STRIDE·m, in ascending chunk order.
// ALIGNED (the row and x in whole, aligned chunks, decode_route checks):
// ROUTE_HELD chunks' weights in flight and branch-free x loads, so each
// lane's loads issue together (with per-chunk bounds and alignment branches
// every load waited for the one before it: H100 ncu, T = 8, stalls on the
// x loads). Otherwise one chunk at a time through chunk_dot's checks: the
// same chunks, order and bits, in less code.
template <typename FR, typename T, bool ALIGNED>
__device__ __forceinline__ void route_dots(const QRow& row, const T* x, u32 t0, u32 nt, u32 H, u32 nch, u32 first,
                                           float (&acc)[DEC_TG]) {
  constexpr u32 HELD = ALIGNED ? ROUTE_HELD : 1;
  if (ALIGNED) __builtin_assume(row.k % FR::CHUNK == 0);
  for (u32 c0 = first; c0 < nch; c0 += HELD * ROUTE_STRIDE) {
    float w[HELD][FR::CHUNK];
#pragma unroll
    for (u32 j = 0; j < HELD; ++j) {
      const u32 c = c0 + j * ROUTE_STRIDE;
      if (c < nch) FR::dequant(row, c, w[j]);
    }
#pragma unroll
    for (int i = 0; i < DEC_TG; ++i) {
      if (t0 + i >= nt) break;
      const T* xt = x + (u64)(t0 + i) * H;
      if constexpr (ALIGNED && HELD * XRaw<FR::CHUNK, T>::WORDS <= 16) {
        // Small chunks (a dense router): the token's x words for every held
        // chunk first (predicated loads, no branch between them), then the
        // products.
        XRaw<FR::CHUNK, T> xr[HELD];
#pragma unroll
        for (u32 j = 0; j < HELD; ++j) {
          const u32 c = c0 + j * ROUTE_STRIDE;
          if (c < nch) xr[j].load(xt + (u64)c * FR::CHUNK);
        }
#pragma unroll
        for (u32 j = 0; j < HELD; ++j)
          if (c0 + j * ROUTE_STRIDE < nch) acc[i] += xr[j].dot(w[j]);
      } else {
#pragma unroll
        for (u32 j = 0; j < HELD; ++j) {
          const u32 c = c0 + j * ROUTE_STRIDE;
          if (c < nch) {
            if constexpr (ALIGNED) {
              XRaw<FR::CHUNK, T> xr;
              xr.load(xt + (u64)c * FR::CHUNK);
              acc[i] += xr.dot(w[j]);
            } else {
              acc[i] += chunk_dot<FR::CHUNK, T>(w[j], xt, c * FR::CHUNK, H);
            }
          }
        }
      }
    }
  }
}

// Grid: ⌈(E + 1) / ROUTE_ROWS⌉ blocks of ROUTE_WARPS warps; ROUTE_ROW_WARPS
// warps compute a router row (row E: the shared-expert gate) for every
// token: lane l of part q takes chunks (32q + l) + 128j, loading up to
// ROUTE_HELD of them at once (one memory round trip for H ≤ 4096 f32), then
// dots them with each token; the parts' butterfly sums are added in part
// order (a fixed order). The routing step follows: decode_route_tail
// (decode_tail.cu), or with fold_route the gate/up blocks.
template <typename FR, typename T>
__global__ void __launch_bounds__(ROUTE_WARPS * 32) decode_route(const __grid_constant__ DecodeParams p) {
  __shared__ float part[ROUTE_WARPS][DEC_TG];
  const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const u32 E = p.n_experts, nt = p.n_tokens, H = p.hidden, k = p.top_k;
  const u32 rl = warp / ROUTE_ROW_WARPS, q = warp % ROUTE_ROW_WARPS;
  const u32 r = blockIdx.x * ROUTE_ROWS + rl;
  const bool gate_row = r == E && p.sgate.data != nullptr;
  const bool active = r < E || gate_row;
  const QRow row = row_of<FR>(gate_row ? p.sgate : p.router, 0, active && !gate_row ? r : 0);
  const u32 nch = (H + FR::CHUNK - 1) / FR::CHUNK;
  // The shared-expert gate reads x; the router its own input where it has one.
  const T* x = static_cast<const T*>(p.router_x != nullptr && !gate_row ? p.router_x : p.x);
  // Whole chunks only, every x row 16-byte aligned: the branch-free loop.
  const bool aligned = row.k == H && H % FR::CHUNK == 0 && (H * sizeof(T)) % 16 == 0 &&
                       (reinterpret_cast<u64>(x) & 15) == 0;
  trace_at(p, (blockIdx.x < 256 ? TR_ROUTE_START + blockIdx.x : TRACE_WORDS));
  pdl_trigger();
  for (u32 t0 = 0; t0 < nt; t0 += DEC_TG) {
    float acc[DEC_TG];
#pragma unroll
    for (int i = 0; i < DEC_TG; ++i) acc[i] = 0.f;
    if (active) {
      if (aligned)
        route_dots<FR, T, true>(row, x, t0, nt, H, nch, q * 32 + lane, acc);
      else
        route_dots<FR, T, false>(row, x, t0, nt, H, nch, q * 32 + lane, acc);
    }
    if (t0 == 0) trace_at(p, (blockIdx.x < 256 ? TR_ROUTE_LOADED + blockIdx.x : TRACE_WORDS));
#pragma unroll
    for (int i = 0; i < DEC_TG; ++i) {
      const float s = warp_sum(acc[i]);
      if (lane == 0) part[warp][i] = s;
    }
    __syncthreads();
    if (threadIdx.x < ROUTE_ROWS * DEC_TG) {
      const u32 rr = threadIdx.x / DEC_TG, i = threadIdx.x % DEC_TG, row_r = blockIdx.x * ROUTE_ROWS + rr;
      if (t0 + i < nt && (row_r < E || (row_r == E && p.sgate.data != nullptr))) {
        float s = 0.f;
        for (u32 w = 0; w < ROUTE_ROW_WARPS; ++w) s += part[rr * ROUTE_ROW_WARPS + w][i];
        // The general path's router matmul stores logits in T, and adds
        // the router's bias (if any) to them in T.
        float l = to_f32(from_f32<T>(s));
        if (p.router_bias != nullptr && row_r < E) l = to_f32(from_f32<T>(l + p.router_bias[row_r]));
        p.logits[(u64)(t0 + i) * (E + 1) + row_r] = l;
      }
    }
    __syncthreads();
  }
  trace_at(p, (blockIdx.x < 256 ? TR_ROUTE_DOTS + blockIdx.x : TRACE_WORDS));
}


// A gate/up block's wait for the step before it (stamped in trace builds).
__device__ __forceinline__ void gate_up_wait(const DecodeParams& p) {
  trace_at(p, block_slot(TR_GU));
  pdl_trigger();
  pdl_wait();
  trace_at(p, block_slot(TR_GU + 1024));
}
// The start of a gate/up block: waits for the routing step, then finds the
// expert of grid row blockIdx.y — active expert y, or (y = max_active) the
// shared expert; false when the row has none this call.
__device__ __forceinline__ bool gate_up_begin(const DecodeParams& p, bool& shared, u32& e) {
  gate_up_wait(p);
  shared = blockIdx.y == p.max_active;
  // Both words at once (one round trip): active[y] is in bounds (y <
  // max_active ≤ E) and ignored when y ≥ n_active.
  const u32 n_active = *p.n_active, ey = shared ? 0 : p.active[blockIdx.y];
  e = 0;
  if (shared) return p.sg.data != nullptr;
  if (blockIdx.y >= n_active) return false;
  e = ey;
  return true;
}

// Token t's output from its slots' down outputs y(s) (slots t·k + j, and
// T·k + t for the shared expert): Σ_j w[t, j]·y in slot order rounded to T,
// plus the gated shared expert rounded again, as the general path rounds.
// With down's per-expert scale, slot j's weight is w[t, j]·down_scale[e]
// (rounded to f32, as the general path's combine_weights). With a down bias
// (gpt-oss), Σ_j w[t, j]·bias[ids[t, j], h] is added to the rounded sum and
// rounded again, as the general path's routed_bias.
template <typename T, typename Y>
__device__ __forceinline__ T combine_token(const DecodeParams& p, u32 t, u32 h, const Y& y) {
  const u32 k = p.top_k;
  float acc = 0.f;
  // A weight-before block's experts saw the weight already: they combine with 1.
  auto wt = [&](u32 j) { return p.weight_in ? 1.f : p.weights[(u64)t * k + j]; };
  // The down scale of slot j's expert (the routing step wrote ids < E).
  auto ws = [&](u32 j) {
    if (p.down_scale == nullptr) return wt(j);
    const u32 e = p.ids[(u64)t * k + j];
    return e < p.n_experts ? __fmul_rn(wt(j), p.down_scale[e]) : 0.f;
  };
  for (u32 j = 0; j < k; ++j) acc = __fadd_rn(acc, __fmul_rn(ws(j), y(t * k + j)));
  float o = to_f32(from_f32<T>(acc));
  if (p.down_bias != nullptr) {
    float b = 0.f;
    for (u32 j = 0; j < k; ++j) {
      const u32 e = p.ids[(u64)t * k + j];
      if (e < p.n_experts) b = fmaf(wt(j), p.down_bias[(u64)e * p.hidden + h], b);
    }
    o = to_f32(from_f32<T>(o + b));
  }
  if (p.sd.data) o = to_f32(from_f32<T>(o + p.shared_factor[t] * y(p.n_tokens * k + t)));
  return from_f32<T>(o);
}

}  // namespace moekit

#include "moekit/decode_f32.cuh"

namespace moekit {

// ---------------------------------------------------------------------------
// Tensor-core expert kernels (16-bit activations). A block's MMA_WARPS warps
// are MT = MMA_WARPS / KS row tiles of 16 weight rows × KS parts of K
// (KS = p.gu_split or p.down_split, from K alone: decode.rs `mma_split`);
// warp (mt, ks) takes spans ks, ks + KS, … of tile mt (moekit/decode_mma.cuh)
// and, for KS > 1, the parts' partial tiles are summed in part order
// through shared memory. Tokens go in groups of 16 (two n-tiles) or 8 (one),
// each group re-reading the tile (from L2).

constexpr u32 MMA_WARPS = 8;
constexpr u32 MMA_TILE = 16;  // weight rows per warp
constexpr u32 MMA_GROUP = 16; // tokens per group (at most two n-tiles)

// Partial fragments: [MMA_WARPS][MATS][NT][4][32] floats.
template <int MATS, int NT>
__device__ __forceinline__ void put_partials(float* red, const float (&acc)[MATS][NT][4], u32 warp, u32 lane) {
#pragma unroll
  for (int m = 0; m < MATS; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[((((warp * MATS + m) * NT + n) * 4 + i) << 5) + lane] = acc[m][n][i];
}

// Σ over the KS parts of tile mt (warps mt·KS ..), in part order, of
// element (m, n, i) of lane l's fragment.
template <int MATS, int NT>
__device__ __forceinline__ float sum_partials(const float* red, u32 mt, u32 ks_n, u32 m, u32 n, u32 i, u32 l) {
  float s = 0.f;
  for (u32 w = mt * ks_n; w < (mt + 1) * ks_n; ++w) s += red[((((w * MATS + m) * NT + n) * 4 + i) << 5) + l];
  return s;
}

// Fragment element (n, i) of lane l: its row in the tile and its token in the group.
__device__ __forceinline__ u32 frag_row(u32 i, u32 l) { return (l >> 2) + 8u * (i >> 1); }
__device__ __forceinline__ u32 frag_tok(u32 n, u32 i, u32 l) { return 8u * n + 2u * (l & 3u) + (i & 1u); }

constexpr u32 MMA_RED = MMA_WARPS * 2 * 2 * 4 * 32;  // floats of the reduction buffer

// What a decode_gate_up_mma block works on: the expert of grid row
// blockIdx.y (active expert y, or the shared expert) and its slots.
struct GuWork {
  bool shared;
  u32 e;
  u32 n_tok;         // routed slots of the expert (the shared expert: every token)
  const u32* slots;  // their slot numbers t·k + j, in slot order (global or shared memory)
};

// Tokens up to which decode_gate_up_mma blocks can route themselves
// (fold_route): each block keeps its expert's slots (at most one a token).
constexpr u32 FOLD_MAX_T = 16;

// Whether a routing rule selects its experts on the raw logits (the
// selection keys are route_token's w.a as loaded): softmax-top-k,
// top-k-softmax, Gemma-4. The grouped rules select on scores (+ bias).
__device__ __forceinline__ bool selects_on_logits(u32 rule) {
  const u32 kind = rule & RULE_KIND;
  return kind == RULE_SOFTMAX_TOPK || kind == RULE_TOPK_SOFTMAX || kind == RULE_GEMMA4;
}

// One token (T = 1) routed by a rule that selects on its logits: a gate/up
// block needs its expert alone — the blockIdx.y-th smallest of the k chosen
// (the active list is ascending) — and the slot that chose it, not the
// routing weights. route::Block::select is the full routing's selection
// (the same keys and ranks: the same experts); the softmax, its ordered sum
// and the renormalisation are left to the publishing block. s_n as
// gate_up_work's.
__device__ __forceinline__ void select_expert(const DecodeParams& p, float* buf, route::BlockScratch* s_route,
                                              u32* s_tok, u32* s_n) {
  const u32 E = p.n_experts, k = p.top_k;
  for (u32 e = threadIdx.x; e < E; e += blockDim.x) buf[e] = p.logits[e];
  if (threadIdx.x == 0) s_n[0] = 0;
  __syncthreads();
  const route::Block w{threadIdx.x & 31u, E, k, buf, buf + E, buf + 2 * E, s_route};
  u32 id = route::kNone;
  w.select(buf, E, k, id);  // thread j < k: the j-th best expert (ends with a barrier)
  u32* ids = reinterpret_cast<u32*>(buf + E);
  if (threadIdx.x < k) ids[threadIdx.x] = id;
  __syncthreads();
  if (threadIdx.x < k) {
    if (chosen_below(ids, k, id) == blockIdx.y) {
      s_tok[0] = threadIdx.x;  // slot t·k + j of token 0
      s_n[0] = 1;
      s_n[1] = id | (1u << 16);
    }
  }
  __syncthreads();
}

// The start of a decode_gate_up_mma block: waits for the routing step (or,
// with fold_route, for the router logits, then routes every token and sorts
// the slots itself, so that no block waits for a one-block routing tail and
// its global round trips). With fold_route the grid has one more row
// (y = max_active + 1), whose block x = 0 routes and publishes the routing
// (ids, weights, shared factors, the sorted slots) for the down step and the
// caller, and does nothing else. False when the block has no expert work.
__device__ __forceinline__ bool gate_up_work(const DecodeParams& p, float* red, GuWork& w) {
  __shared__ u32 s_tok[FOLD_MAX_T];
  __shared__ u32 s_n[2];
  __shared__ route::BlockScratch s_route;
  if (!p.fold_route) {
    if (!gate_up_begin(p, w.shared, w.e)) return false;
    if (!w.shared) {
      const u32 first = p.offsets[w.e];
      w.n_tok = p.offsets[w.e + 1] - first;
      w.slots = p.slots + first;
    }
    return true;
  }
  gate_up_wait(p);
  const bool publish = blockIdx.y == p.max_active + 1;
  w.shared = blockIdx.y == p.max_active;
  w.e = 0;
  w.n_tok = 0;
  w.slots = s_tok;
  if (publish && blockIdx.x != 0) return false;
  if (w.shared) return p.sg.data != nullptr;
  if (p.n_tokens > p.route_block || p.n_tokens > FOLD_MAX_T || p.n_experts > route::kBlockKeys) {
    // Not a launch the host makes (decode.rs `folds`): nothing computed.
    if (threadIdx.x == 0) report(p.err, ERR_CONFIG);
    return false;
  }
  // Shared memory (in `red`, free until the products): the routing buffers
  // and ids, then the sort's arrays.
  const u32 E = p.n_experts, n = p.n_tokens * p.top_k;
  float* buf = red;
  if (!publish && p.n_tokens == 1 && selects_on_logits(p.rule)) {
    select_expert(p, buf, &s_route, s_tok, s_n);
  } else {
    u32* sorted = reinterpret_cast<u32*>(buf + max(p.route_warps * 3 * E, E + 1) + n);
    const SortOut o{sorted, sorted + E + 1, sorted + 2 * E + 1, sorted + 2 * E + 2};
    route_and_sort<RULE_ANY, TEAM_BLOCK>(p, buf, &s_route, o, publish);
    __syncthreads();  // the sort's arrays
    if (publish) {
      // The routing for the down step and the caller (the sort's arrays as
      // decode_route_tail writes them).
      for (u32 i = threadIdx.x; i <= E; i += blockDim.x) p.offsets[i] = o.offsets[i];
      for (u32 i = threadIdx.x; i < *o.n_active; i += blockDim.x) p.active[i] = o.active[i];
      for (u32 i = threadIdx.x; i < n; i += blockDim.x) p.slots[i] = o.slots[i];
      if (threadIdx.x == 0) *p.n_active = *o.n_active;
      if (p.routed != nullptr) {
        // The routing is out: decode_down_mma's blocks may read it before
        // their wait for this grid (p.routed[0], release after the barrier).
        __syncthreads();
        if (threadIdx.x == 0) add_release_gpu(p.routed, 1);
      }
      trace_at(p, TR_TAIL_END);
      return false;
    }
    if (threadIdx.x == 0) {
      const u32 n_active = *o.n_active;
      const u32 y = blockIdx.y;
      const u32 e = y < n_active ? o.active[y] : 0;
      const u32 first = y < n_active ? o.offsets[e] : 0;
      const u32 cnt = y < n_active ? min(o.offsets[e + 1] - first, FOLD_MAX_T) : 0;
      for (u32 i = 0; i < cnt; ++i) s_tok[i] = o.slots[first + i];
      s_n[0] = y < n_active ? 1u : 0u;
      s_n[1] = e | (cnt << 16);
    }
    __syncthreads();  // s_tok; `red` is free again
  }
  if (s_n[0] == 0) return false;
  w.e = s_n[1] & 0xffffu;
  w.n_tok = s_n[1] >> 16;
  return true;
}

// Where a warp works: its tile's first row, its part of K, and the split.
struct MmaWarp {
  u32 mt, ks, ks_n, row0;
  __device__ __forceinline__ MmaWarp(u32 split) {
    const u32 warp = threadIdx.x >> 5;
    ks_n = split;
    mt = warp / split;
    ks = warp % split;
    row0 = (blockIdx.x * (MMA_WARPS / split) + mt) * MMA_TILE;
  }
};

// acc over the warp's spans for one token group, then `emit(n, i, l, v)`
// for every fragment element of every tile of the block, v[m] the element's
// full sums (the owner lane itself when KS = 1, else after the reduction;
// emit is called by some thread of the block, lane l's element).
template <typename F, typename T, int MATS, int NT, typename Emit>
__device__ __forceinline__ void mma_group(const DecodeParams& p, u32 tr, const MmaWarp& mw, const QRow (&rows)[MATS][2],
                                          const T* const (&xr)[NT], u32 n_spans, float* red, const Emit& emit) {
  const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  float acc[MATS][NT][4];
#pragma unroll
  for (int m = 0; m < MATS; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][n][i] = 0.f;
  mma_spans<F, T, MATS, NT>(rows, xr, mw.ks, mw.ks_n, n_spans, acc);
  trace_at(p, tr);
  if (mw.ks_n == 1) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float v[MATS];
#pragma unroll
        for (int m = 0; m < MATS; ++m) v[m] = acc[m][n][i];
        emit(mw.mt, (u32)n, (u32)i, lane, v);
      }
    return;
  }
  __syncthreads();  // the previous group's partials are read
  put_partials<MATS, NT>(red, acc, warp, lane);
  __syncthreads();
  const u32 mt_n = MMA_WARPS / mw.ks_n;
  for (u32 e = threadIdx.x; e < mt_n * NT * 128u; e += blockDim.x) {
    const u32 l = e & 31u, i = (e >> 5) & 3u, n = (e >> 7) % NT, mt = (e >> 7) / NT;
    float v[MATS];
#pragma unroll
    for (int m = 0; m < MATS; ++m) v[m] = sum_partials<MATS, NT>(red, mt, mw.ks_n, m, n, i, l);
    emit(mt, n, i, l, v);
  }
}

// Grid: (⌈max(I, Is) / (16·MT)⌉, max_active + 1); block (x, y): MT tiles of
// gate and up of active expert y (y = max_active: the shared expert, every
// token) → act rows (T) of the expert's slots.
template <typename F, typename T>
__global__ void __launch_bounds__(MMA_WARPS * 32, 2) decode_gate_up_mma(const __grid_constant__ DecodeParams p) {
  __shared__ __align__(16) float red[MMA_RED];
  const u32 lane = threadIdx.x & 31u, nt = p.n_tokens, k = p.top_k, H = p.hidden;
  GuWork wk;
  if (!gate_up_work(p, red, wk)) return;
  const bool shared = wk.shared;
  const u32 e = wk.e;
  // The shared expert is always plain SwiGLU (the ffn is the routed experts').
  const bool plain = shared || glu_plain(p.glu);
  const DecodeW& G = shared ? p.sg : p.gate_w;
  const DecodeW& U = shared ? p.su : p.up_w;
  const u32 n_rows = shared ? p.sd.k : p.down_w.k;  // I (or Is): down's K
  const MmaWarp mw(p.gu_split);
  const u32 tile_rows = MMA_TILE * (MMA_WARPS / mw.ks_n);
  if (blockIdx.x * tile_rows >= n_rows) return;
  // A tile past the rows computes on clamped rows and stores nothing (its
  // warps still take part in the block's reduction).
  const bool live = mw.row0 < n_rows;
  QRow rows[2][2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const u32 r = min(mw.row0 + (lane >> 2) + 8u * h, n_rows - 1);
    rows[0][h] = row_of<F>(G, e, r);
    rows[1][h] = row_of<F>(U, e, r);
  }
  const u32 n_tok = shared ? nt : wk.n_tok;
  const u32* const my_slots = wk.slots;
  const u32 n_spans = live ? (H + MMA_SPAN - 1) / MMA_SPAN : 0;
  const T* x = static_cast<const T*>(p.x);
  T* act = static_cast<T*>(p.act);
  const u32 row_base = blockIdx.x * tile_rows;
  for (u32 i0 = 0; i0 < n_tok; i0 += MMA_GROUP) {
    const u32 cnt = min(MMA_GROUP, n_tok - i0);
    auto tok = [&](u32 i) { return shared ? i0 + i : my_slots[i0 + i] / k; };
    auto slot = [&](u32 i) { return shared ? nt * k + i0 + i : my_slots[i0 + i]; };
    auto emit = [&](u32 mt, u32 n, u32 i, u32 l, const float (&v)[2]) {
      const u32 row = row_base + mt * MMA_TILE + frag_row(i, l), t = frag_tok(n, i, l);
      // The general path's fused SwiGLU stores its output in T.
      if (row < n_rows && t < cnt) {
        float g = v[0], u = v[1];
        // Weight before the FFN: (w·x)·W = w·(x·W), w rounded to T as the
        // general path's weighted input is.
        if (p.weight_in && !shared) {
          const float w = to_f32(from_f32<T>(p.weights[slot(t)]));
          g *= w;
          u *= w;
        }
        act[(u64)slot(t) * p.act_stride + row] =
            from_f32<T>(plain ? silu(g) * u : glu(p.glu, g, u, e, (u64)e * n_rows + row));
      }
    };
    const u32 g = lane >> 2;
    if (cnt <= 8) {
      const T* xr[1] = {g < cnt ? x + (u64)tok(g) * H : nullptr};
      mma_group<F, T, 2, 1>(p, block_slot(TR_GU + 3072), mw, rows, xr, n_spans, red, emit);
    } else {
      const T* xr[2] = {x + (u64)tok(g) * H, g + 8 < cnt ? x + (u64)tok(g + 8) * H : nullptr};
      mma_group<F, T, 2, 2>(p, block_slot(TR_GU + 3072), mw, rows, xr, n_spans, red, emit);
    }
  }
  trace_at(p, block_slot(TR_GU + 2048));
}

// Blocks an SM that decode_down_mma's registers allow: 4 (64 registers)
// for MLX 4-bit affine, whose decoder fits there (6 spill instructions, none
// in the span loop), so that more warps stream weights (mixtral-8x7b
// affine4 T = 1: down 44 → 37 µs, its 512 blocks in one wave); 3 for the
// rest (bf16 and q8_0 measured slower at 4, Q4_0 and Q4_K spill there).
template <typename F> struct DownBlocks { static constexpr int value = 3; };
template <typename S> struct DownBlocks<FmtAffine<4, S>> { static constexpr int value = 4; };

// Grid: (⌈H / (16·MT)⌉, max_active + 1); block (x, y): MT tiles of active
// expert y's down (y = max_active: the shared expert) × the act rows of its
// slots → y. The last of a row tile's blocks to finish (tile_tickets[x])
// then combines the tile for every token: Σ_j w[t, j] · y[t·k + j] in slot
// order, rounded to T, plus the gated shared expert (rounded again), as the
// general path does.
template <typename F, typename T>
__global__ void __launch_bounds__(MMA_WARPS * 32, DownBlocks<F>::value) decode_down_mma(const __grid_constant__ DecodeParams p) {
  __shared__ __align__(16) float red[MMA_RED];
  __shared__ u32 s_last;
  trace_at(p, block_slot(TR_DOWN));
  pdl_trigger();
  // With the gate/up blocks' own routing (p.routed), a block reads the
  // routing as soon as the publishing block has written it — while gate/up
  // still runs — and asks L2 for its weight rows before it waits for the
  // act rows; the last block past the routing resets both words for the
  // next launch. Else the wait covers the routing too.
  const bool early = p.routed != nullptr;
  if (early) {
    if (threadIdx.x == 0) {
      while (ld_acquire_gpu(p.routed) == 0) __nanosleep(32);
      if (atomicAdd(p.routed + 1, 1u) == gridDim.x * gridDim.y - 1) {
        p.routed[0] = 0;
        p.routed[1] = 0;
      }
    }
    __syncthreads();
  } else {
    pdl_wait();  // gate/up's act rows (and, through it, the routing)
  }
  const u32 lane = threadIdx.x & 31u, nt = p.n_tokens, H = p.hidden, k = p.top_k;
  const u32 n_slots = nt * k;
  const bool has_shared = p.sd.data != nullptr;
  const bool shared = blockIdx.y == p.max_active;
  // Both words at once, as in gate_up_begin.
  const u32 n_active = *p.n_active, ey = shared ? 0 : p.active[blockIdx.y];
  if (shared ? !has_shared : blockIdx.y >= n_active) {
    if (early) pdl_wait();  // every block of a dependent launch waits (common.cuh)
    return;
  }
  const u32 e = ey;
  const DecodeW& D = shared ? p.sd : p.down_w;
  const MmaWarp mw(p.down_split);
  const u32 tile_rows = MMA_TILE * (MMA_WARPS / mw.ks_n), row_base = blockIdx.x * tile_rows;
  const bool live = mw.row0 < H;
  QRow rows[1][2];
#pragma unroll
  for (int h = 0; h < 2; ++h) rows[0][h] = row_of<F>(D, e, min(mw.row0 + (lane >> 2) + 8u * h, H - 1));
  const u32 first = shared ? 0 : p.offsets[e];
  const u32 n_tok = shared ? nt : p.offsets[e + 1] - first;
  const u32 n_spans = live ? (D.k + MMA_SPAN - 1) / MMA_SPAN : 0;
  if (early) {
    if (threadIdx.x < 2) {
      // The block's rows (contiguous in the expert) and their scales.
      const u32 r1 = min(row_base + tile_rows, H);
      const QRow a = row_of<F>(D, e, row_base), b = row_of<F>(D, e, r1);
      if (threadIdx.x == 0) l2_prefetch(a.data, b.data);
      else if (a.scales != nullptr) {
        l2_prefetch(a.scales, b.scales);
        l2_prefetch(a.biases, b.biases);
      }
    }
    pdl_wait();  // gate/up's act rows
  }
  trace_at(p, block_slot(TR_DOWN + 1024));
  const T* act = static_cast<const T*>(p.act);
  for (u32 i0 = 0; i0 < n_tok; i0 += MMA_GROUP) {
    const u32 cnt = min(MMA_GROUP, n_tok - i0);
    auto slot = [&](u32 i) { return shared ? n_slots + i0 + i : p.slots[first + i0 + i]; };
    auto emit = [&](u32 mt, u32 n, u32 i, u32 l, const float (&v)[1]) {
      const u32 row = row_base + mt * MMA_TILE + frag_row(i, l), t = frag_tok(n, i, l);
      // The general path's down matmul stores y in T.
      if (row < H && t < cnt) p.y[(u64)slot(t) * H + row] = to_f32(from_f32<T>(v[0]));
    };
    const u32 g = lane >> 2;
    if (cnt <= 8) {
      const T* xr[1] = {g < cnt ? act + (u64)slot(g) * p.act_stride : nullptr};
      mma_group<F, T, 1, 1>(p, block_slot(TR_DOWN + 4096), mw, rows, xr, n_spans, red, emit);
    } else {
      const T* xr[2] = {act + (u64)slot(g) * p.act_stride, g + 8 < cnt ? act + (u64)slot(g + 8) * p.act_stride : nullptr};
      mma_group<F, T, 1, 2>(p, block_slot(TR_DOWN + 4096), mw, rows, xr, n_spans, red, emit);
    }
  }
  trace_at(p, block_slot(TR_DOWN + 2048));
  // The tile's last block combines (the other blocks' y rows are visible).
  if (!last_arrival(p.tile_tickets + blockIdx.x, n_active + (has_shared ? 1u : 0u), &s_last)) return;
  const u32 nr = min(tile_rows, H - row_base);
  T* out = static_cast<T*>(p.out);
  for (u32 i = threadIdx.x; i < nt * nr; i += blockDim.x) {
    const u32 t = i / nr, h = row_base + i % nr;
    out[(u64)t * H + h] = combine_token<T>(p, t, h, [&](u32 s) { return __ldcg(p.y + (u64)s * H + h); });
  }
  if (threadIdx.x == 0) p.tile_tickets[blockIdx.x] = 0;  // ready for the next launch (graph replay)
  trace_at(p, block_slot(TR_DOWN + 3072));
}

}  // namespace moekit
