// decode_common.cuh — what the decode kernels share (decode.cu's router
// matvec and expert kernels, decode_tail.cu's routing step): the parameter
// block (decode.rs `DecodeParams`, one struct for every launch of a call),
// the timeline stamps of MOEKIT_TRACE builds, and the kernel-boundary
// primitives (PDL, last-arrival tickets).
#pragma once
#include "moekit/common.cuh"

namespace moekit {

// A [E, rows, K] weight tensor of the kernel's format (data null = absent).
struct DecodeW {
  const u8* data;
  const u8* scales;
  const u8* biases;
  u32 rows, row_offset, k, group_shift;
};
static_assert(sizeof(DecodeW) == 40, "DecodeW layout");

// The routing rule of a call: decode_route_tail has an instance per rule;
// the gate/up blocks' own routing (fold_route) switches on it at run time.
enum DecodeRule : u32 {
  RULE_SOFTMAX_TOPK = 0,
  RULE_TOPK_SOFTMAX = 1,
  RULE_GEMMA4 = 2,
  RULE_GROUPED_SOFTMAX = 3,
  RULE_GROUPED_SIGMOID = 4,
  RULE_KIND = 0xffu,                // the rule: the low byte of DecodeParams::rule
  RULE_DROPPED_NEG_INF = 0x100u,    // flag: Grouped's dropped groups get key -inf (else 0)
};

struct DecodeParams {
  const void* x;         // [T, H] of T
  void* out;             // [T, H] of T
  float* logits;         // [T, E + 1] scratch; column E is the shared-gate logit
  u32* ids;              // [T, k]
  float* weights;        // [T, k]
  float* shared_factor;  // [T] shared-expert factor (sigmoid or 1)
  u32* active;           // [E] active experts, ascending
  u32* n_active;         // [1]
  u32* offsets;          // [E + 1] of the expert-sorted slots
  u32* slots;            // [T·k] slots t·k + j in expert order
  void* act;             // [T·k + T, act_stride] routed slots, then shared rows
                         // (f32 on CUDA cores, T on tensor cores)
  const float* rvec;     // [E] Gemma-4 scale or grouped bias, or null
  u32* err;
  float* y;              // [T·k + T, H] down outputs per slot (tensor-core path)
  u32* tile_tickets;     // [⌈H / 16⌉], zero between launches (tensor-core down)
  DecodeW router, sgate;  // format FR: [1, E, H], [1, 1, H]
  DecodeW gate_w, up_w, down_w; // format F: [E, I, H] ×2, [E, H, I]
  DecodeW sg, su, sd;     // format F: shared expert [1, Is, H] ×2, [1, H, Is]
  u32 n_tokens, hidden, n_experts, top_k;
  u32 n_group, topk_group, norm_topk_prob, rule;
  float rsf;
  u32 act_stride, max_active;
  u32 route_warps;  // warps that route in decode_route_tail (a token each)
  u32 gu_rows;      // rows of gate/up per decode_gate_up block
  u32 down_rows;    // output rows per decode_down block
  u32 down_room;    // bytes of one decode_down ring buffer
  u32 gu_split;     // warps splitting K in a decode_gate_up_mma block (1, 2, 4 or 8)
  u32 down_split;   // the same for decode_down_mma
  u32 route_block;  // T up to which the routing step routes each token with all its threads
  u32 fold_route;   // 1: no decode_route_tail; every decode_gate_up_mma block routes (FOLD_MAX_T)
  u32 trace_twice;   // MOEKIT_TRACE builds: 1 routes every token twice (the second pass on warm code)
  u64* trace;       // MOEKIT_TRACE builds: TRACE_WORDS globaltimer stamps (else unused, may be null)
  GluParams glu;              // the routed experts' activation, gate/up biases [E, I] and scales [E]
  const float* router_bias;   // [E] added to the logits, or null
  const float* down_bias;     // [E, H] added to each slot's down output, or null
  const void* router_x;       // [T, H] of T the router reads (Gemma-4's router norm), or null: x
  u32 weight_in;              // 1: the routing weight scales the experts' input (Llama-4, k = 1)
  u32 pad_wi;
  const float* down_scale;    // [E] each slot's down output × down_scale[e] (in its combine weight), or null
  u32* routed;                // fold_route on tensor cores: [2] zero between launches (published, down blocks past it), else null
};
static_assert(sizeof(DecodeParams) == 624, "DecodeParams layout");

// ---------------------------------------------------------------------------
// Timeline stamps (a diagnostic build: NVRTC option -DMOEKIT_TRACE, set by
// the host when the MOEKIT_TRACE environment variable is). Thread 0 of a
// block writes %globaltimer (ns) into its slot of p.trace: the layout is
// decode.rs `trace_summary`'s. Other builds compile no stamps.
enum TraceSlot : u32 {
  TR_ROUTE_START = 0,      // + route block
  TR_ROUTE_LOADED = 256,   // + route block: its dots done (router rows and x loaded)
  TR_ROUTE_DOTS = 512,     // + route block: its router rows written
  TR_TAIL_START = 1024,    // the routing step: decode_route_tail's block started
  TR_TAIL_ROUTED = 1025,   // ... every token routed
  TR_TAIL_END = 1026,      // ... sort written
  TR_TAIL_FIRST = 1027,    // ... (trace_twice = 1: tokens routed twice) the first pass done
  TR_TAIL_WAITED = 1028,   // ... decode_route_tail past its wait for the logits
  TR_GU = 2048,            // gate/up: + block (start), + 1024 + block (expert known),
                           //   + 2048 + block (end), + 3072 + block (products, before the reduction)
  TR_DOWN = 6144,          // down: + block (start), + 1024 (expert known), + 2048 (products stored),
                           //   + 3072 (end), + 4096 (products, before the reduction)
  TRACE_WORDS = 11264,
};
__device__ __forceinline__ void trace_at(const DecodeParams& p, u32 slot) {
#ifdef MOEKIT_TRACE
  if (threadIdx.x == 0 && p.trace != nullptr && slot < TRACE_WORDS) {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    p.trace[slot] = t;
  }
#endif
}
__device__ __forceinline__ u32 block_id() { return blockIdx.y * gridDim.x + blockIdx.x; }
// A per-block stamp at base + block (the first 1024 blocks: a phase's room).
__device__ __forceinline__ u32 block_slot(u32 base) { return block_id() < 1024 ? base + block_id() : TRACE_WORDS; }

// Kernel boundaries: pdl_trigger / pdl_wait (common.cuh).

__device__ __forceinline__ u32 ld_acquire_gpu(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void add_release_gpu(u32* p, u32 v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Arrival of one block at a ticket word: true for the last of `count`
// blocks. After the block's barrier, one release-acquire atomic orders
// every thread's earlier writes before the ticket (bar.sync + cumulativity)
// and, for the last block, the other blocks' writes before the reads that
// follow its next barrier — no per-thread fence.
__device__ __forceinline__ bool last_arrival(u32* ticket, u32 count, u32* s_flag) {
  __syncthreads();
  if (threadIdx.x == 0) {
    u32 old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(ticket) : "memory");
    *s_flag = old == count - 1;
  }
  __syncthreads();
  return *s_flag != 0;
}


}  // namespace moekit
