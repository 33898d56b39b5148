// decode.cu — the MoE block for few tokens (decode, T ≤ 64) in three launches:
//
//   1. decode_route     router matvec, one block per router row (plus the
//                       shared-expert gate row); the last block to
//                       finish (a ticket counter) routes every token, then
//                       builds the expert-sorted slot list and the list of
//                       active experts — no host round trip, no extra launch.
//   2. decode_gate_up   block (row block, active expert): each warp owns one
//                       row n of gate and up, decodes it once in registers and
//                       dots it with every token that chose the expert:
//                       act[slot, n] = silu(g)·u. The shared expert is one
//                       more grid row over all tokens.
//   3. decode_down      a warp owns output row h: for each active expert it
//                       decodes W_down[e, h] once and dots it with the expert's
//                       tokens' act rows; then sums each token's k slots in
//                       slot order (+ gated shared expert) and writes out[t, h].
//
// Deterministic and batch-invariant: every (row, token) dot uses the same
// lane→chunk assignment and reduction whatever the other tokens are; the
// combine runs in slot order; no float atomics. Intermediates are rounded to
// the activation type where the general path stores them in it, so both
// paths agree to rounding.
#include "moekit/dequant.cuh"
#include "moekit/route.cuh"

namespace moekit {

// A [E, rows, K] weight tensor of the kernel's format (data null = absent).
struct DecodeW {
  const u8* data;
  const u8* scales;
  const u8* biases;
  u32 rows, row_offset, k, group_shift;
};
static_assert(sizeof(DecodeW) == 40, "DecodeW layout");

// The routing rule, chosen per call (the routing step is a sliver of the
// block's time, so it is not worth a template instance per rule).
enum DecodeRule : u32 {
  RULE_SOFTMAX_TOPK = 0,
  RULE_TOPK_SOFTMAX = 1,
  RULE_GEMMA4 = 2,
  RULE_GROUPED_SOFTMAX = 3,
  RULE_GROUPED_SIGMOID = 4,
};

struct DecodeParams {
  const void* x;         // [T, H] of T
  void* out;             // [T, H] of T
  float* logits;         // [T, E + 1] scratch; column E is the shared-gate logit
  u32* ids;              // [T, k]
  float* weights;        // [T, k]
  float* shared_factor;  // [T] shared-expert factor (sigmoid or 1)
  u32* ticket;           // [1], zero between launches (the last block resets it)
  u32* active;           // [E] active experts, ascending
  u32* n_active;         // [1]
  u32* offsets;          // [E + 1] of the expert-sorted slots
  u32* slots;            // [T·k] slots t·k + j in expert order
  float* act;            // [T·k + T, act_stride] routed slots, then shared rows
  const float* rvec;     // [E] Gemma-4 scale or grouped bias, or null
  u32* err;
  DecodeW router, sgate;  // format FR: [1, E, H], [1, 1, H]
  DecodeW gate_w, up_w, down_w; // format F: [E, I, H] ×2, [E, H, I]
  DecodeW sg, su, sd;     // format F: shared expert [1, Is, H] ×2, [1, H, Is]
  u32 n_tokens, hidden, n_experts, top_k;
  u32 n_group, topk_group, norm_topk_prob, rule;
  float rsf;
  u32 act_stride, max_active, pad;
};
static_assert(sizeof(DecodeParams) == 480, "DecodeParams layout");

constexpr int DEC_WARPS = 8;   // warps per block, every decode kernel
constexpr int DEC_TG = 4;      // tokens per register group
constexpr u32 ROUTE_WARPS = 4; // warps that route in the last block

// Loads CHUNK activations from column k0 of a row of `k` values as f32: one
// or more 16-byte loads when the whole chunk is in range and aligned (a warp's
// lanes then read consecutive 16-byte words), else element by element with
// zeros past `k`.
template <int CHUNK, typename T>
__device__ __forceinline__ void load_chunk(const T* row, u32 k0, u32 k, float (&v)[CHUNK]) {
  const T* src = row + k0;
  constexpr int PER = 16 / (int)sizeof(T);  // values per 16-byte word
  if (k0 + CHUNK <= k && (reinterpret_cast<u64>(src) & 15) == 0 && CHUNK % PER == 0) {
#pragma unroll
    for (int q = 0; q < CHUNK / PER; ++q) {
      const uint4 w = __ldg(reinterpret_cast<const uint4*>(src) + q);
      const T* e = reinterpret_cast<const T*>(&w);
#pragma unroll
      for (int i = 0; i < PER; ++i) v[q * PER + i] = to_f32(e[i]);
    }
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

// Routes token t with one warp (route.cuh's rules, the CPU's arithmetic).
__device__ void route_token(const DecodeParams& p, u32 t, const route::Warp& w) {
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
  rp.pad = 0;
  const float* row = p.logits + (u64)t * (p.n_experts + 1);
  for (u32 e = w.lane; e < w.n; e += 32) w.a[e] = row[e];
  __syncwarp();
  u32 id = route::kNone;
  float wt = 0.f;
  switch (p.rule) {
    case RULE_SOFTMAX_TOPK: route::SoftmaxTopK::run(rp, w, id, wt); break;
    case RULE_TOPK_SOFTMAX: route::TopKSoftmax::run(rp, w, id, wt); break;
    case RULE_GEMMA4: route::Gemma4::run(rp, w, id, wt); break;
    case RULE_GROUPED_SOFTMAX: route::Grouped<route::SoftmaxScores>::run(rp, w, id, wt); break;
    default: route::Grouped<route::SigmoidScores>::run(rp, w, id, wt); break;
  }
  if (w.lane < w.k) {
    p.ids[(u64)t * w.k + w.lane] = id;
    p.weights[(u64)t * w.k + w.lane] = wt;
  }
  __syncwarp();
}

// Grid: E + 1 blocks. Dynamic shared memory: ROUTE_WARPS · 3 · E floats
// (≥ the sort's E + 1 words).
template <typename FR, typename T>
__global__ void __launch_bounds__(DEC_WARPS * 32) decode_route(const __grid_constant__ DecodeParams p) {
  extern __shared__ float dec_smem[];
  __shared__ u32 s_last;
  const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const u32 E = p.n_experts, nt = p.n_tokens, H = p.hidden, k = p.top_k;
  // One block per router row (row E: the shared-expert gate); its warps
  // split K, then sum their partials in warp order (deterministic).
  const u32 r = blockIdx.x;
  const bool gate_row = r == E && p.sgate.data != nullptr;
  __shared__ float part[DEC_WARPS][DEC_TG];
  if (r < E || gate_row) {
    const QRow row = row_of<FR>(gate_row ? p.sgate : p.router, 0, gate_row ? 0 : r);
    const u32 nch = (H + FR::CHUNK - 1) / FR::CHUNK;
    const T* x = static_cast<const T*>(p.x);
    for (u32 t0 = 0; t0 < nt; t0 += DEC_TG) {
      float acc[DEC_TG];
#pragma unroll
      for (int i = 0; i < DEC_TG; ++i) acc[i] = 0.f;
#pragma unroll 2
      for (u32 c = threadIdx.x; c < nch; c += blockDim.x) {
        float w[FR::CHUNK];
        FR::dequant(row, c, w);
#pragma unroll
        for (int i = 0; i < DEC_TG; ++i)
          if (t0 + i < nt) acc[i] += chunk_dot<FR::CHUNK, T>(w, x + (u64)(t0 + i) * H, c * FR::CHUNK, H);
      }
#pragma unroll
      for (int i = 0; i < DEC_TG; ++i) {
        const float s = warp_sum(acc[i]);
        if (lane == 0) part[warp][i] = s;
      }
      __syncthreads();
      if (threadIdx.x < DEC_TG && t0 + threadIdx.x < nt) {
        float s = 0.f;
        for (int w = 0; w < DEC_WARPS; ++w) s += part[w][threadIdx.x];
        // The general path's router matmul stores logits in T.
        p.logits[(u64)(t0 + threadIdx.x) * (E + 1) + r] = to_f32(from_f32<T>(s));
      }
      __syncthreads();
    }
  }
  // Last block to finish routes every token.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicAdd(p.ticket, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  if (warp < ROUTE_WARPS) {
    float* a = dec_smem + (u64)warp * 3 * E;
    const route::Warp w{lane, E, k, a, a + E, a + 2 * E};
    for (u32 t = warp; t < nt; t += ROUTE_WARPS) route_token(p, t, w);
  }
  for (u32 t = threadIdx.x; t < nt; t += blockDim.x) {
    const float g = p.logits[(u64)t * (E + 1) + E];
    p.shared_factor[t] = p.sgate.data ? 1.f / (1.f + expf(-g)) : 1.f;
  }
  __syncthreads();
  // Counting sort of the T·k slots by expert (stable) and the active list.
  u32* cnt = reinterpret_cast<u32*>(dec_smem);
  const u32 n = nt * k;
  for (u32 e = threadIdx.x; e <= E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (u32 s = threadIdx.x; s < n; s += blockDim.x) atomicAdd(&cnt[p.ids[s]], 1u);
  __syncthreads();
  if (warp == 0) {
    u32 base = 0, act_base = 0;
    for (u32 e0 = 0; e0 < E; e0 += 32) {
      const u32 e = e0 + lane;
      const u32 c = e < E ? cnt[e] : 0;
      u32 inc = c, flag = c > 0 ? 1u : 0u;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const u32 a = __shfl_up_sync(0xffffffffu, inc, o);
        const u32 b = __shfl_up_sync(0xffffffffu, flag, o);
        if (lane >= (u32)o) {
          inc += a;
          flag += b;
        }
      }
      if (e < E) {
        p.offsets[e] = base + inc - c;
        if (c > 0) p.active[act_base + flag - 1] = e;
      }
      base += __shfl_sync(0xffffffffu, inc, 31);
      act_base += __shfl_sync(0xffffffffu, flag, 31);
    }
    if (lane == 0) {
      p.offsets[E] = base;
      *p.n_active = act_base;
    }
  }
  __syncthreads();
  for (u32 s = threadIdx.x; s < n; s += blockDim.x) {
    const u32 e = p.ids[s];
    u32 rank = 0;
    for (u32 q = 0; q < s; ++q) rank += p.ids[q] == e ? 1u : 0u;
    p.slots[p.offsets[e] + rank] = s;
  }
  if (threadIdx.x == 0) *p.ticket = 0;  // ready for the next launch (graph replay)
}

// Grid: (⌈max(I, Is) / DEC_WARPS⌉, max_active + shared).
// Register cap for 2 blocks per SM (occupancy is what keeps loads in flight).
template <typename F, typename T>
__global__ void __launch_bounds__(DEC_WARPS * 32, 2) decode_gate_up(const __grid_constant__ DecodeParams p) {
  const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const u32 nt = p.n_tokens, H = p.hidden, k = p.top_k;
  const bool shared = blockIdx.y == p.max_active;
  u32 e = 0, first = 0, n_tok = nt;
  if (!shared) {
    if (blockIdx.y >= *p.n_active) return;
    e = p.active[blockIdx.y];
    first = p.offsets[e];
    n_tok = p.offsets[e + 1] - first;
  } else if (p.sg.data == nullptr) {
    return;
  }
  const DecodeW& G = shared ? p.sg : p.gate_w;
  const DecodeW& U = shared ? p.su : p.up_w;
  const u32 n = blockIdx.x * DEC_WARPS + warp;
  const u32 n_rows = shared ? p.sd.k : p.down_w.k;  // I (or Is): down's K
  if (n >= n_rows) return;
  const QRow gr = row_of<F>(G, e, n), ur = row_of<F>(U, e, n);
  const u32 nch = (H + F::CHUNK - 1) / F::CHUNK;
  const T* x = static_cast<const T*>(p.x);
  for (u32 i0 = 0; i0 < n_tok; i0 += DEC_TG) {
    float ag[DEC_TG], au[DEC_TG];
    u32 tok[DEC_TG];
#pragma unroll
    for (int i = 0; i < DEC_TG; ++i) {
      ag[i] = au[i] = 0.f;
      tok[i] = i0 + i < n_tok ? (shared ? i0 + i : p.slots[first + i0 + i] / k) : 0;
    }
    for (u32 c = lane; c < nch; c += 32) {
      float wg[F::CHUNK], wu[F::CHUNK];
      F::dequant(gr, c, wg);
      F::dequant(ur, c, wu);
#pragma unroll
      for (int i = 0; i < DEC_TG; ++i) {
        if (i0 + i >= n_tok) break;
        const T* xr = x + (u64)tok[i] * H;
        float xv[F::CHUNK];
        load_chunk<F::CHUNK, T>(xr, c * F::CHUNK, H, xv);
        float g = 0.f, u = 0.f;
#pragma unroll
        for (int q = 0; q < F::CHUNK; ++q) {
          g = fmaf(wg[q], xv[q], g);
          u = fmaf(wu[q], xv[q], u);
        }
        ag[i] += g;
        au[i] += u;
      }
    }
#pragma unroll
    for (int i = 0; i < DEC_TG; ++i) {
      const float g = warp_sum(ag[i]), u = warp_sum(au[i]);
      if (lane == 0 && i0 + i < n_tok) {
        const u32 row = shared ? nt * k + i0 + i : p.slots[first + i0 + i];
        // The general path's fused SwiGLU stores its output in T.
        p.act[(u64)row * p.act_stride + n] = to_f32(from_f32<T>(silu(g) * u));
      }
    }
  }
}

// Grid: ⌈H / DEC_WARPS⌉; dynamic shared memory: DEC_WARPS · (T·k + T)
// floats of partial sums, then (max_active + 1) · 3 + T·k words: the active
// experts' (expert, first slot, token count) and the slot list, loaded once
// per block so the expert loop issues weight loads without chasing pointers.
template <typename F, typename T>
__global__ void __launch_bounds__(DEC_WARPS * 32, 3) decode_down(const __grid_constant__ DecodeParams p) {
  extern __shared__ float dec_smem[];
  const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const u32 nt = p.n_tokens, H = p.hidden, k = p.top_k;
  const u32 n_slots = nt * k;
  u32* meta = reinterpret_cast<u32*>(dec_smem + DEC_WARPS * (n_slots + nt));
  u32* sl = meta + 3 * (p.max_active + 1);
  const u32 n_active = *p.n_active;
  for (u32 a = threadIdx.x; a < n_active; a += blockDim.x) {
    const u32 e = p.active[a], first = p.offsets[e];
    meta[3 * a] = e;
    meta[3 * a + 1] = first;
    meta[3 * a + 2] = p.offsets[e + 1] - first;
  }
  for (u32 s = threadIdx.x; s < n_slots; s += blockDim.x) sl[s] = p.slots[s];
  __syncthreads();
  const u32 h = blockIdx.x * DEC_WARPS + warp;
  if (h >= H) return;
  float* part = dec_smem + (u64)warp * (n_slots + nt);
  for (u32 a = 0; a < n_active + 1; ++a) {
    const bool shared = a == n_active;
    if (shared && p.sd.data == nullptr) break;
    const u32 e = shared ? 0 : meta[3 * a];
    const u32 first = shared ? 0 : meta[3 * a + 1];
    const u32 n_tok = shared ? nt : meta[3 * a + 2];
    const DecodeW& D = shared ? p.sd : p.down_w;
    const QRow dr = row_of<F>(D, e, h);
    const u32 K = D.k, nch = (K + F::CHUNK - 1) / F::CHUNK;
    for (u32 i0 = 0; i0 < n_tok; i0 += DEC_TG) {
      float acc[DEC_TG];
      u32 row[DEC_TG];
#pragma unroll
      for (int i = 0; i < DEC_TG; ++i) {
        acc[i] = 0.f;
        row[i] = i0 + i < n_tok ? (shared ? n_slots + i0 + i : sl[first + i0 + i]) : 0;
      }
      for (u32 c = lane; c < nch; c += 32) {
        float w[F::CHUNK];
        F::dequant(dr, c, w);
#pragma unroll
        for (int i = 0; i < DEC_TG; ++i) {
          if (i0 + i >= n_tok) break;
          acc[i] += chunk_dot<F::CHUNK, float>(w, p.act + (u64)row[i] * p.act_stride, c * F::CHUNK, K);
        }
      }
#pragma unroll
      for (int i = 0; i < DEC_TG; ++i) {
        const float s = warp_sum(acc[i]);
        // The general path's down matmul stores y in T.
        if (lane == 0 && i0 + i < n_tok) part[row[i]] = to_f32(from_f32<T>(s));
      }
    }
  }
  __syncwarp();
  T* out = static_cast<T*>(p.out);
  for (u32 t = lane; t < nt; t += 32) {
    float acc = 0.f;
    for (u32 j = 0; j < k; ++j) acc = __fadd_rn(acc, __fmul_rn(p.weights[(u64)t * k + j], part[t * k + j]));
    float o = to_f32(from_f32<T>(acc));
    if (p.sd.data) o = to_f32(from_f32<T>(o + p.shared_factor[t] * part[nt * k + t]));
    out[(u64)t * H + h] = from_f32<T>(o);
  }
}

}  // namespace moekit
