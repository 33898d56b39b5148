// decode_tail.cu — the decode path's routing step as its own kernel: one
// block routes every token from the router logits decode_route wrote and
// sorts the slots by expert (decode_routing.cuh), for the expert kernels
// that follow. It depends on no weight format or activation type, so its
// instances (one per rule and team) serve every format; held inside
// decode_route, the routing made each of that kernel's 78 format × type
// instances cost ~10 s of NVRTC time. Launched as a programmatic dependent of decode_route on
// sm_90: its block starts while the matvec runs and waits for its logits.
#include "moekit/decode_routing.cuh"

namespace moekit {

// Grid: 1 block of ROUTE_TAIL_WARPS warps. Dynamic shared memory:
// max(route_warps · 3 · E, E + 1) floats (routing buffers, then the sort's
// counters), then T·k ids (decode.rs `plan`). RULE: the call's DecodeRule;
// TEAM: TEAM_BLOCK (each token by the whole block) or TEAM_WARP (a warp a
// token) — an instance each, see decode_routing.cuh.
constexpr u32 ROUTE_TAIL_WARPS = 8;
template <int RULE, int TEAM>
__global__ void __launch_bounds__(ROUTE_TAIL_WARPS * 32) decode_route_tail(const __grid_constant__ DecodeParams p) {
  extern __shared__ float tail_smem[];
  __shared__ route::BlockScratch s_route;
  trace_at(p, TR_TAIL_START);
  pdl_trigger();
  pdl_wait();  // decode_route's logits
  trace_at(p, TR_TAIL_WAITED);
  route_and_sort<RULE, TEAM>(p, tail_smem, &s_route, SortOut{p.offsets, p.active, p.n_active, p.slots}, true);
  trace_at(p, TR_TAIL_END);
}

}  // namespace moekit
