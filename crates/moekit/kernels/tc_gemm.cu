// tc_gemm.cu — grouped expert GEMM on tensor cores (mma.sync m16n8k16,
// sm_80+) over expert-sorted rows, for every weight format of
// moekit/dequant.cuh:
//
//   P = 1:  y[r, n] = Σ_k A[r, k] · W[e(r), n, k]
//   P = 2:  y[r, n] = silu(Σ_k A[r, k] · G[e(r), n, k]) · (Σ_k A[r, k] · U[e(r), n, k])
//           (GLU instances: p.glu's activation and gate/up biases instead)
//   P = 3:  y[r, n] = Σ_k A[r, k] · hi(W) + Σ_k A[r, k] · lo(W), W split into
//           hi = T(W) and lo = T(W − hi): about 16 significant bits of an f32
//           weight (the router, whose top-k choice should not move when its
//           f32 weights are rounded to T); instantiated for dense f32
//           (decoded here) and dense T (the halves split.cu made of one
//           expert's f32 weights: hi rows, then lo rows).
//
// A row r is x[r], or x[gather[r] / gather_div] (the expert-sorted slot's
// token: the permutation is read, never materialized). Rows are
// expert-sorted: expert e owns rows offsets[e] .. offsets[e + 1] (or every
// row uses expert 0 when offsets is null).
//
// Work: a block computes a BM × BN tile of y with 8 warps: BN = 128 (P = 1)
// or 64 output columns, i.e. 128 weight rows (for P = 2, 3: gate and up, or
// hi and lo, rows of the same columns in alternating groups of 8:
// `tile_row`). Tiles never straddle experts: blockIdx.y is the tile's index in
// the list of every expert's ⌈rows / BM⌉ tiles, found by a block-wide scan of
// the offsets (no host round trip; the grid is sized for the worst case,
// ⌈M / BM⌉ + min(E, M) tiles, and blocks past the last tile exit).
//
// Pipeline along K in steps of BK = 64, one __syncthreads a step:
//   * A tiles (BM × 64 of T) go to shared memory with cp.async, S stages;
//   * the weights' packed bytes (raw: blocks, codes, scales and biases, the
//     whole storage unit, KR = max(64, UNIT_W) columns at a time) go to
//     shared memory with cp.async, RS stages, one step ahead of A where
//     shared memory allows (a step's copy group holds its A tile and the
//     next step's raw stage: TcGeo::LEAD);
//   * one step ahead, the block decodes the raw bytes of the next step into
//     a 128 × 64 tile of T with the format's tile decoder (tc_decode.cuh:
//     packed conversions where the format has them, else `F::codes`, as
//     every other path does), a 16-byte unit between batches of MMAs; each
//     thread stages and decodes 32 columns of one weight row;
//   * dense weights of type T skip both: they are copied like A, S stages;
//   * each warp runs ldmatrix + mma.sync on its WM × WN sub-tile, f32
//     accumulators; on sm_90a, tiles of ≥ 32 rows instead run
//     wgmma.mma_async m64nBMk16 (moekit/wgmma.cuh) with the weights as M
//     (one warpgroup per 64 weight rows) and the tile's rows as N, issued
//     before the next step's decode and waited for after it, so the decoding
//     overlaps the tensor cores.
// Every output element is a sum over k in the same order (k16 steps from
// k = 0) whatever the tile size, the batch or the row's position: results
// are deterministic and batch-invariant. The one split of K (TC_PARTS, the
// router's dense single-expert GEMM) depends on K alone: each part sums its
// steps in order, tc_sum_parts the parts in order.
//
// The shared pieces (parameters, raw row layout, tile search, the staging
// threads' copies and slices) are in tc_common.cuh.
#include "moekit/tc_common.cuh"
#include "moekit/wgmma.cuh"
#include "moekit/mma.cuh"

namespace moekit {

constexpr int TC_THREADS = TC_STAGERS;  // 8 warps: all stage, decode and multiply
// A stages: 4 for small tiles (memory-bound: deeper prefetch), 3 for BM ≥ 64
// so that two blocks share an SM where the raw stages allow.
template <int BM> struct TcStages { static constexpr int value = BM >= 64 ? 3 : 4; };

// What the tiles of an instance take besides the raw stages.
template <typename F, typename T, int BM>
struct TcTiles {
  static constexpr int S = TcStages<BM>::value;
  static constexpr int A_BYTES = BM * TC_BK * 2;
  static constexpr int B_BYTES = TC_BROWS * TC_BK * 2;
  // Direct: weights of type T are copied straight into S B stages (no raw
  // stage, no decode); else two B buffers, filled by decoding raw stages.
  static constexpr bool DIRECT = TcDirect<F, T>::value;
  static constexpr int BS = DIRECT ? S : 2;
  // Tiles of ≥ 32 rows may run on wgmma (sm_90a), whose swizzle needs
  // 1024-byte-aligned tiles: room to align the dynamic shared memory.
  static constexpr int SLACK = BM >= 32 ? 1024 : 0;
  // Raw stages: with LEAD = 1 a step's copy group carries the next step's
  // raw stage (the raw stages of steps ks + 1 .. ks + S are live at once),
  // with LEAD = 0 its own (ks + 1 .. ks + S − 1), one stage fewer but each
  // step then waits for the copies issued one step before. LEAD = 1 unless
  // its extra stage would fit fewer blocks on an SM (the loop's wait depth:
  // TcGeo::WAIT).
  static constexpr int rs_for(int rsteps, int lead) { return 1 + (S - 2 + lead + rsteps - 1) / rsteps; }
  template <typename R>
  static constexpr int smem_for(int lead) {
    return S * A_BYTES + BS * B_BYTES + (DIRECT ? 0 : rs_for(R::RSTEPS, lead) * R::BYTES) + SLACK;
  }
  template <typename R>
  static constexpr int lead_for() {
    return DIRECT || tc_blocks_for(smem_for<R>(1)) >= tc_blocks_for(smem_for<R>(0)) ? 1 : 0;
  }
  template <typename R>
  static constexpr int best_for() { return smem_for<R>(lead_for<R>()); }
  // Scales and biases in 16-byte words for tiles of ≥ 128 rows where they
  // fit as many blocks an SM as 4-byte words (H100, mixtral-8x7b affine4
  // T = 512, 128-row tiles: 1.62 ms with 16-byte words, 1.86 with 4-byte
  // ones), else 4-byte words (a 32-row affine4 tile fits three blocks an SM
  // with them, two without; 128-row affine8 tiles two, not one: qwen3
  // T = 4096 1.45 vs 1.87 ms).
  static constexpr int AUX_WORD =
      TcRaw<F>::AUX && BM >= 128 && tc_blocks_for(best_for<TcRaw<F, 16>>()) >= tc_blocks_for(best_for<TcRaw<F, 4>>()) ? 16 : 4;
};

// Tile geometry of an instance (tc_geo.rs: smem_bytes mirrors it).
template <typename F, typename T, int BM>
struct TcGeo : TcTiles<F, T, BM>, TcRaw<F, TcTiles<F, T, BM>::AUX_WORD> {
  typedef TcTiles<F, T, BM> X;
  typedef TcRaw<F, X::AUX_WORD> R;
  static constexpr int WARPS_M = BM >= 32 ? 2 : 1;
  static constexpr int WARPS_N = 8 / WARPS_M;
  static constexpr int WM = BM / WARPS_M;          // rows per warp
  static constexpr int WNR = TC_BROWS / WARPS_N;   // weight rows per warp
  static constexpr int MI = WM / 16;               // m16 tiles per warp
  static constexpr int NJ = WNR / 8;               // n8 tiles per warp
  static_assert(MI >= 1 && NJ % 2 == 0, "warp tile");
  static constexpr int RAW_BYTES = R::BYTES;
  static constexpr int LEAD = X::template lead_for<R>();
  static constexpr int RS = X::rs_for(R::RSTEPS, LEAD);
  static constexpr int WAIT = X::S - 3 + (X::DIRECT ? 1 : LEAD);  // copy groups a step leaves in flight
  static constexpr int SMEM = X::template smem_for<R>(LEAD);
};

template <typename F, typename T, int P, int BM, bool GLU = false>
__global__ void __launch_bounds__(TC_THREADS, BM >= 64 && BM <= 128 ? 2 : 1) tc_gemm(const __grid_constant__ TcParams p) {
  pdl_entry();  // a dependent launch (ops/mod.rs Order::Dependent)
  typedef TcGeo<F, T, BM> G;
  extern __shared__ __align__(128) u8 smem[];
  __shared__ u32 scan[TC_THREADS / 32 + 4];
  __shared__ const T* arow[BM];  // x row of each A row (null: none)

  {
    u32 dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    // K parts only for weights copied straight into B (no raw stages, whose
    // steps a part boundary could split).
    const bool parts_ok = (p.p & TC_PARTS) == 0 || (G::DIRECT && (P == 1 || P == 3));
    if (dyn < (u32)G::SMEM || (p.p & ~(TC_PARTS | TC_BY_ROW)) != (u32)P || !parts_ok) {
      if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) report(p.err, ERR_CONFIG);
      return;
    }
  }
  const TcTile tile = find_tile<BM, TC_THREADS>(p, scan);
  if (tile.rows == 0) return;

  u8* const a_sm = smem + (G::SLACK ? (G::SLACK - (smem_addr(smem) & (G::SLACK - 1))) & (G::SLACK - 1) : 0u);
  u8* const b_sm = a_sm + G::S * G::A_BYTES;
  u8* const raw_sm = b_sm + G::BS * G::B_BYTES;
  const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  static_assert(P == 1 || P == 2 || P == 3, "one source, gate and up, or hi and lo");
  static_assert(!GLU || P == 2, "GLU: the general activation of gate and up");
  constexpr u32 HALVES = P == 1 ? 1 : 2;  // weight-row groups of a tile
  constexpr u32 BN = TC_BROWS / HALVES;   // output columns of the tile
  const u32 n0 = tile.cb * BN;

  tile_rows_of_x<T, BM, TC_THREADS>(p, tile, arow);
  // Thread tid stages and decodes weight row st.r, columns 32·st.h .. + 31
  // of each step (its "slice"), so its row's addresses are computed once.
  TcStager<F, T, P, BM, typename G::R> st;
  st.init(p, tile, n0, tid);
  // The block's steps j0 .. n_steps − 1: all of K, or its part blockIdx.z of
  // gridDim.z (TC_PARTS: ⌈steps / parts⌉ steps a part, from K alone).
  // Only instances that can take parts carry their code (the others keep
  // j0 = 0 a constant: the staged quantized kernels measured 5% slower with
  // it, gpt-oss-20b T = 512).
  constexpr bool CAN_PART = G::DIRECT && (P == 1 || P == 3);
  u32 j0 = 0;
  if (CAN_PART && (p.p & TC_PARTS) != 0) {
    const u32 per = (st.n_steps + gridDim.z - 1) / gridDim.z;
    j0 = min(st.n_steps, blockIdx.z * per);
    st.n_steps = min(st.n_steps, j0 + per);
  }
  const u32 n_steps = st.n_steps;
  u8* const my_raw = raw_sm + st.r * G::PITCH;
  __shared__ const u8* wrow[G::DIRECT ? TC_BROWS : 1];  // direct: each weight row (null: past N)
  if (G::DIRECT && st.h == 0) wrow[G::DIRECT ? st.r : 0] = st.valid ? st.data : nullptr;
  __syncthreads();
  st.bind(arow, wrow);

  // The row's place in the raw stage buffer holding step j.
  auto raw_at = [&](u32 j) { return my_raw + (j / G::RSTEPS % G::RS) * G::RAW_BYTES; };
  // Issues the raw stage that step j starts, if it starts one (`issue` of
  // step j takes step j + LEAD's; the prologue step 0's when LEAD = 1).
  auto issue_raw = [&](u32 j) { st.issue_raw(p, j, raw_at(j)); };
  // Issues the copies of step j's group: its A tile, and the B stage (dense
  // weights of type T) or the raw stage of step j + LEAD, so that one wait
  // per step lands both what the step multiplies and what it decodes.
  auto issue = [&](u32 j) {
    if (j >= n_steps) return;
    st.issue_a(p, j, a_sm + (j % G::S) * G::A_BYTES);
    if constexpr (G::DIRECT) {
      st.issue_b(p, j, b_sm + (j % G::S) * G::B_BYTES);
    } else {
      issue_raw(j + G::LEAD);
    }
  };
  auto slice = [&](u32 j) { return st.slice(p, j, raw_at(j)); };
  typedef typename TcDecOf<F, T>::type Dec;
  // Unit u (8 weights) of this thread's slice into B buffer j & 1.
  auto put = [&](u32 j, int u, uint4 v) { st.put(b_sm + (j & 1) * G::B_BYTES, u, v); };

  // Warp sub-tile: rows wm0 .., weight rows of n8 tile j at brow[j].
  const u32 wm0 = (warp / G::WARPS_N) * G::WM;
  const u32 wn = warp % G::WARPS_N;
  u32 brow[G::NJ];
#pragma unroll
  for (int j = 0; j < G::NJ; ++j) {
    // P = 1: the warp's WNR consecutive rows. P = 2: its WNR/2 output
    // columns, gate rows (j < NJ/2) then the same columns' up rows.
    constexpr u32 per = G::NJ / HALVES;
    const u32 q = j / per, jj = j % per;
    const u32 col = wn * (G::WNR / HALVES) + 8 * jj;
    brow[j] = P == 1 ? col : ((col >> 3) << 4) | (q << 3);
  }
  // wgmma (sm_90a, tiles of ≥ 32 rows) or mma.sync accumulators.
  constexpr bool WG = TC_WGMMA && BM >= 32;
  constexpr int WR = WG ? BM / 2 : 1;
  float wacc[WR];
#pragma unroll
  for (int i = 0; i < WR; ++i) wacc[i] = 0.f;
  float acc[WG ? 1 : G::MI][G::NJ][4];
#pragma unroll
  for (int i = 0; i < (WG ? 1 : G::MI); ++i)
#pragma unroll
    for (int j = 0; j < G::NJ; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.f;

  // Prologue: groups 0 .. S-2 (with LEAD = 1 group 0 also takes step 0's raw
  // stage), then the first decode.
  if constexpr (!G::DIRECT && G::LEAD == 1) issue_raw(j0);
#pragma unroll
  for (int j = 0; j < G::S - 1; ++j) {
    issue(j0 + j);
    cp_async_commit();
  }
  cp_async_wait<G::S - 2>();
  __syncthreads();
  if constexpr (!G::DIRECT) {
    Dec d;
    d.load(slice(j0));
#pragma unroll
    for (int u = 0; u < 4; ++u) put(j0, u, d.unit(u));
  }

  // Step ks: group ks (A tile ks, and B stage ks or raw stage ks + 1) has
  // landed (wait; groups ks + 1 .. ks + S − 2 stay in flight; with LEAD = 0
  // raw stage ks + 1 comes with group ks + 1, which is waited for too),
  // every thread is past step ks − 1 (sync), so A stage (ks − 1) % S, raw
  // stages older than the next decode's and B buffer (ks + 1) & 1 are free:
  // issue group ks + S − 1, multiply step ks and, between its four k16
  // batches of MMAs, decode step ks + 1 a unit at a time (the last step
  // decodes nothing: its slices have no columns). A raw stage serves RSTEPS
  // steps; RS = rs_for(LEAD) stages keep the one being refilled clear of the
  // ones still to be decoded.
  if constexpr (WG) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    // Weights on wgmma's M side, tokens on N: warpgroup wg multiplies
    // weight rows 64wg .. 64wg + 63 by the tile's BM rows, asynchronously:
    // the block decodes the next step meanwhile.
    const u32 wg = warp >> 2;
    // Stage bases (shared addresses) of the descriptors, computed once.
    const u32 b_base = pin(smem_addr(b_sm) + wg * 64 * 128), a_base = pin(smem_addr(a_sm));
#pragma unroll 4
    for (u32 ks = j0; ks < n_steps; ++ks) {
      cp_async_wait<G::WAIT>();
      fence_async_smem();
      __syncthreads();
      issue(ks + G::S - 1);
      cp_async_commit();
      // k16 slice kk starts 32·kk bytes in: + 2kk in the descriptors' address
      // field (shared addresses stay below 2^18, so it never carries out).
      const u64 da = wg_desc(b_base + (ks % G::BS) * G::B_BYTES);
      const u64 db = wg_desc(a_base + (ks % G::S) * G::A_BYTES);
      wg_keep(wacc);
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < TC_BK / 16; ++kk) Wgmma<T, BM>::run(wacc, da + 2 * kk, db + 2 * kk);
      wg_commit();
      wg_keep(wacc);
      if constexpr (!G::DIRECT) {
        Dec d;
        d.load(slice(ks + 1));
#pragma unroll
        for (int u = 0; u < 4; ++u) put(ks + 1, u, d.unit(u));
      }
      wg_wait0();
      wg_keep(wacc);
    }
#endif
  } else {
#pragma unroll 4
    for (u32 ks = j0; ks < n_steps; ++ks) {
      cp_async_wait<G::WAIT>();
      __syncthreads();
      issue(ks + G::S - 1);
      cp_async_commit();
      Dec d;
      if constexpr (!G::DIRECT) d.load(slice(ks + 1));
      const u8* a_t = a_sm + (ks % G::S) * G::A_BYTES;
      const u8* b_t = b_sm + (ks % G::BS) * G::B_BYTES;
#pragma unroll
      for (int kk = 0; kk < TC_BK / 16; ++kk) {
        u32 af[G::MI][4];
#pragma unroll
        for (int i = 0; i < G::MI; ++i)
          ldsm_x4(smem_addr(a_t + swz(wm0 + 16 * i + (lane & 15), 2 * kk + (lane >> 4))), af[i]);
        u32 bf[G::NJ / 2][4];
#pragma unroll
        for (int j = 0; j < G::NJ; j += 2) {
          const u32 r = (lane & 16 ? brow[j + 1] : brow[j]) + (lane & 7);
          ldsm_x4(smem_addr(b_t + swz(r, 2 * kk + ((lane >> 3) & 1))), bf[j / 2]);
        }
#pragma unroll
        for (int j = 0; j < G::NJ; j += 2)
#pragma unroll
          for (int i = 0; i < G::MI; ++i) {
            Mma<T>::run(acc[i][j], af[i], bf[j / 2][0], bf[j / 2][1]);
            Mma<T>::run(acc[i][j + 1], af[i], bf[j / 2][2], bf[j / 2][3]);
          }
        if constexpr (!G::DIRECT) put(ks + 1, kk, d.unit(kk));
      }
    }
  }
  cp_async_wait<0>();

  // Epilogue: c0, c1 at (row g, cols 2t, 2t+1), c2, c3 at row g + 8; with
  // TC_PARTS f32 partial products at out + blockIdx.z·M·N instead.
  T* out = static_cast<T*>(p.out);
  float* const part =
      CAN_PART && (p.p & TC_PARTS) != 0 ? static_cast<float*>(p.out) + (u64)blockIdx.z * p.m * p.n : nullptr;
  const u32 g = lane >> 2, t4 = lane & 3;
  if constexpr (WG) {
    wg_store<T, P, BM, GLU, CAN_PART>(p, tile, n0, wacc, [](u32 n) { return n; });
  } else {
    constexpr u32 per = G::NJ / HALVES;
#pragma unroll
    for (int i = 0; i < G::MI; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const u32 r = wm0 + 16 * i + g + 8 * h;
        if (r >= tile.rows) continue;
        T* orow = out + (u64)(tile.row0 + r) * p.n;
#pragma unroll
        for (int j = 0; j < G::NJ; ++j) {
          if ((u32)j >= per) break;
          u32 q, col;
          tile_row<P>(brow[j], q, col);
          const u32 n = n0 + col + 2 * t4;
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            if (n + c >= p.n) continue;
            float y = acc[i][j][2 * h + c];
            if constexpr (P == 2 && !GLU) y = silu(y) * acc[i][j + per][2 * h + c];
            if constexpr (GLU) y = glu(p.glu, y, acc[i][j + per][2 * h + c], tile.e, (u64)tile.e * p.n + n + c);
            if constexpr (P == 3) y += acc[i][j + per][2 * h + c];
            if (part != nullptr) part[(u64)(tile.row0 + r) * p.n + n + c] = y;
            else orow[n + c] = from_f32<T>(y);
          }
        }
      }
  }
}

// out[i] = T(Σ_z parts[z·n + i]) for i < n, z = 0 .. count − 1 in order:
// the K parts of a TC_PARTS GEMM summed (tc_parts.rs `sum_parts_into`).
struct TcSumParams {
  const float* parts;  // [count, n]
  void* out;           // [n] of T
  u64 n;
  u32 count, pad;
};
static_assert(sizeof(TcSumParams) == 32, "TcSumParams layout");

template <typename T>
__global__ void tc_sum_parts(const __grid_constant__ TcSumParams p) {
  pdl_entry();  // a dependent launch (ops/mod.rs Order::Dependent)
  const u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += stride) {
    float s = 0.f;
    for (u32 z = 0; z < p.count; ++z) s += p.parts[(u64)z * p.n + i];
    static_cast<T*>(p.out)[i] = from_f32<T>(s);
  }
}

}  // namespace moekit
