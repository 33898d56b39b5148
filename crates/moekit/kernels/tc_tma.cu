// tc_tma.cu — the grouped expert GEMM of tc_gemm.cu (same parameters, rows,
// tiles and outputs: P = 1 plain, P = 2 gate and up with SwiGLU) for dense
// weights of the activation type T on sm_90a, in a warp-specialized
// schedule: one producer warpgroup fills a ring of shared-memory stages, two
// consumer warpgroups multiply from it with wgmma, and full/empty mbarriers
// pass each stage between them — no block-wide barrier in the K loop, and
// the tensor cores never wait for a step's copies to be issued.
//
// Tile: 256 weight rows × BM rows of x, 64 columns (128 bytes) a step.
//   * Weights: two TMA boxes a stage (128 rows × 64 columns each, 128-byte
//     swizzle) through one tensor map per source, [E·rows, K] of T:
//     P = 1 rows n0 .. n0 + 255 of the source; P = 2 gate rows n0 .. n0 + 127
//     then up rows n0 .. n0 + 127 (128 output columns).
//   * x: the tile's BM rows (gathered through the sort: x is never
//     permuted) with cp.async, 16 bytes a copy, into the same swizzled
//     layout; each producer thread's copies arrive on the stage's full
//     barrier when they land (cp.async.mbarrier.arrive.noinc).
//   * Consumer warpgroup c holds two m64 × BM accumulator tiles: P = 1
//     weight rows 128c .. 128c + 127; P = 2 gate rows 64c .. 64c + 63 and
//     the same columns' up rows, so a thread holds gate and up of the same
//     (column, row) and SwiGLU needs no exchange.
//   * One wgmma group a step (2 × 4 m64nBMk16), one group left in flight:
//     a consumer releases stage j − 1 once step j's group is issued and
//     step j − 1's is done.
// Each output is summed over k in k16 steps from k = 0 in one accumulator:
// deterministic and batch-invariant, as every other path.
//
// Needs K a multiple of 64 and K·sizeof(T) a multiple of 16 (tc_tma.rs
// checks), no general activation (GluParams: the staged kernel runs those).
#include "moekit/tc_common.cuh"
#include "moekit/wgmma.cuh"

namespace moekit {

// A CUtensorMap (the driver's opaque 128-byte descriptor), as the kernel
// parameter it must be (64-byte aligned in parameter space).
struct alignas(64) TmaMap {
  u64 w[16];
};

struct TmaParams {
  TmaMap map[2];  // weights of src[0] and (P = 2) src[1]: [E·rows, K] of T
  TcParams tc;
};
static_assert(sizeof(TmaParams) == 448, "TmaParams layout");

constexpr int TMA_THREADS = 384;  // producer warpgroup + two consumer warpgroups
constexpr int TMA_WROWS = 256;    // weight rows of a tile
constexpr int TMA_BOX = 128;      // weight rows a TMA box
constexpr int TMA_W_BYTES = TMA_WROWS * 128;
constexpr u32 TMA_MAX_E = 1024;  // experts the tile list covers (tc_gemm's MAX_EXPERTS)

// Stages of the ring: as many as fit a block's 227 KB beside the alignment
// slack and TMA_STATIC bytes of static shared memory (tc_tma.rs mirrors it).
constexpr int TMA_STATIC = 6144;
template <int BM> struct TmaGeo {
  static constexpr int X_BYTES = BM * 128;
  static constexpr int STAGE = TMA_W_BYTES + X_BYTES;
  static constexpr int ROOM = 232448 - 1024 - TMA_STATIC;
  static constexpr int S = ROOM / STAGE > 6 ? 6 : ROOM / STAGE;
  static constexpr int SMEM = S * STAGE + 1024;
  static_assert(S >= 2, "two stages at least");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ bool mbar_try(u32 bar, u32 parity) {
  u32 ok;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
  while (!mbar_try(bar, parity)) {
  }
}
// The thread's earlier cp.async copies arrive on `bar` when they land
// (counted in the barrier's expected arrivals: .noinc).
__device__ __forceinline__ void cp_async_arrive(u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
// A 2-D TMA box (column c0, row c1) of `map` into shared memory at dst,
// completing `bytes` of `bar`'s transaction count.
__device__ __forceinline__ void tma_2d(u32 dst, const TmaMap& map, int c0, int c1, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          dst),
      "l"(reinterpret_cast<u64>(&map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
#endif

// Every expert's first row tile in the list of all experts' ⌈rows / BM⌉
// tiles (expert order): tstart[e], and tstart[E] = the number of tiles, in
// shared memory, with all NT threads (the caller synchronizes); returns E.
// Bad offsets (not monotone, past M) give their experts no tiles and are
// reported, so every tile's rows lie inside M. Without offsets: one expert.
template <int BM, int NT>
__device__ __forceinline__ u32 tile_starts(const TcParams& p, u32* tstart, u32* scan) {
  constexpr u32 EPT = (TMA_MAX_E + NT - 1) / NT, W = NT / 32;
  if (p.offsets == nullptr) {
    if (threadIdx.x == 0) {
      tstart[0] = 0;
      tstart[1] = (p.m + BM - 1) / BM;
    }
    return 1;
  }
  const u32* off = p.offsets;
  const u32 E = p.n_experts, e0 = threadIdx.x * EPT;
  u32 cnt[EPT], local = 0;
  bool bad = threadIdx.x == 0 && (E == 0 || off[0] != 0 || off[E] != p.m);
#pragma unroll
  for (u32 i = 0; i < EPT; ++i) {
    const u32 e = e0 + i;
    cnt[i] = 0;
    if (e < E) {
      const u32 a = off[e], b = off[e + 1];
      const bool ok = a <= b && b <= p.m;
      bad |= !ok;
      cnt[i] = ok ? (b - a + BM - 1) / BM : 0;
    }
    local += cnt[i];
  }
  if (bad && blockIdx.x == 0) report(p.err, ERR_OFFSETS);
  const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  u32 incl = local;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const u32 v = __shfl_up_sync(0xffffffffu, incl, o);
    if ((int)lane >= o) incl += v;
  }
  if (lane == 31) scan[warp] = incl;
  __syncthreads();
  u32 at = incl - local;
  for (u32 w = 0; w < warp; ++w) at += scan[w];
#pragma unroll
  for (u32 i = 0; i < EPT; ++i) {
    const u32 e = e0 + i;
    if (e < E) tstart[e] = at;
    at += cnt[i];
  }
  if (threadIdx.x == NT - 1) tstart[E] = at;  // the last thread's inclusive sum: every tile
  static_assert(EPT * NT >= TMA_MAX_E && W <= 32, "experts a thread");
  return E;
}

// Row tile mt's expert, first row and row count (binary search for the
// last expert e with tstart[e] ≤ mt: the one owning the tile, as experts
// without tiles share their start with the next expert).
template <int BM>
__device__ __forceinline__ TcTile tile_at(const TcParams& p, const u32* tstart, u32 E, u32 mt) {
  u32 lo = 0, hi = E;  // tstart[lo] ≤ mt < tstart[hi]
  while (hi - lo > 1) {
    const u32 mid = (lo + hi) >> 1;
    if (tstart[mid] <= mt) lo = mid;
    else hi = mid;
  }
  // The owner's offsets passed tile_starts' checks.
  const u32 a = p.offsets != nullptr ? p.offsets[lo] : 0u, b = p.offsets != nullptr ? p.offsets[lo + 1] : p.m;
  TcTile t;
  t.e = lo;
  t.row0 = a + (mt - tstart[lo]) * BM;
  t.rows = min((u32)BM, b - t.row0);
  return t;
}

// Grid: (blocks, 1), persistent: block b takes tiles b, b + gridDim.x, …
// of the list (row tile mt, column block cb) in the order t = mt·cols + cb
// (the column blocks of a row tile run side by side and share its x rows in
// L2). The producer and the consumers walk the same list; the stage ring
// runs on across tiles, so the producer fills the next tile's first stages
// while the consumers store this one.
template <typename T, int P, int BM>
__global__ void __launch_bounds__(TMA_THREADS, 1) tc_tma(const __grid_constant__ TmaParams tp) {
  const TcParams& p = tp.tc;
  typedef TmaGeo<BM> G;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(P == 1 || P == 2, "one source, or gate and up");
  extern __shared__ __align__(128) u8 smem[];
  __shared__ u32 scan[TMA_THREADS / 32];
  __shared__ u32 tstart[TMA_MAX_E + 1];
  __shared__ __align__(8) u64 bars[2 * G::S];  // full[S], then empty[S]
  const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
  if (tid == 0) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<u64>(&tp.map[0])) : "memory");
    if (P == 2) asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<u64>(&tp.map[1])) : "memory");
  }
  pdl_entry();  // a dependent launch (ops/mod.rs Order::Dependent)
  {
    u32 dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < (u32)G::SMEM || p.p != (u32)P || p.k % TC_BK != 0 || p.n_experts > TMA_MAX_E) {
      if (tid == 0 && blockIdx.x == 0) report(p.err, ERR_CONFIG);
      return;
    }
  }
  const u32 E = tile_starts<BM, TMA_THREADS>(p, tstart, scan);
  const u32 base = smem_addr(smem);
  const u32 w_sm = base + ((1024u - (base & 1023u)) & 1023u);  // S weight stages, then S x stages
  const u32 x_sm = w_sm + G::S * TMA_W_BYTES;
  const u32 full0 = smem_addr(bars), empty0 = full0 + 8u * G::S;
  if (tid == 0) {
    for (int s = 0; s < G::S; ++s) {
      mbar_init(full0 + 8u * s, 128u + 1u);  // producer threads' copies + the TMA thread's expect_tx
      mbar_init(empty0 + 8u * s, 8u);        // one arrival a consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();  // barriers, tile starts

  const u32 n_steps = p.k / TC_BK;
  constexpr u32 BN = P == 1 ? TMA_WROWS : TMA_WROWS / 2;  // output columns of a tile
  const u32 cols = (p.n + BN - 1) / BN;
  const u32 n_tiles = tstart[E] * cols;

  if (warp < 4) {
    // Producer warpgroup: thread t copies unit t % 8 of rows t / 8 + 16i.
    constexpr int PER = BM * 8 / 128;
    const u32 u = tid & 7u;
    const T* x = static_cast<const T*>(p.x);
    u32 g = 0;  // steps issued so far (the ring's position)
    for (u32 t = blockIdx.x; t < n_tiles; t += gridDim.x) {
      const TcTile tile = tile_at<BM>(p, tstart, E, t / cols);
      const u32 n0 = (t % cols) * BN;
      const u8* src[PER];
      u32 live = 0;  // bit i: row (tid / 8) + 16i is in the tile
#pragma unroll
      for (int i = 0; i < PER; ++i) {
        const u32 r = (tid >> 3) + 16u * i;
        src[i] = nullptr;
        if (r < tile.rows) {
          u32 xr = tile.row0 + r;
          if (p.gather != nullptr) {
            xr = p.gather[xr] / p.gather_div;
            if (xr >= p.x_rows) report(p.err, ERR_SLOT);
          }
          if (xr < p.x_rows) {
            src[i] = reinterpret_cast<const u8*>(x + (u64)xr * p.k) + 16u * u;
            live |= 1u << i;
          }
        }
      }
      // Weight rows of the tile's two boxes in the tensor maps.
      const int wr0 = (int)(tile.e * p.src[0].rows + p.src[0].row_offset + n0);
      const int wr1 = P == 1 ? wr0 + TMA_BOX : (int)(tile.e * p.src[1].rows + p.src[1].row_offset + n0);
      for (u32 j = 0; j < n_steps; ++j, ++g) {
        const u32 s = g % G::S, round = g / G::S;
        if (round > 0) mbar_wait(empty0 + 8u * s, (round - 1) & 1u);
        const u32 full = full0 + 8u * s;
        if (tid == 0) {
          const u32 wdst = w_sm + s * TMA_W_BYTES;
          mbar_expect_tx(full, TMA_W_BYTES);
          tma_2d(wdst, tp.map[0], (int)(j * TC_BK), wr0, full);
          tma_2d(wdst + TMA_BOX * 128, tp.map[P == 1 ? 0 : 1], (int)(j * TC_BK), wr1, full);
        }
        const u32 xdst = x_sm + s * G::X_BYTES;
        const u32 kb = j * TC_BK * (u32)sizeof(T);
#pragma unroll
        for (int i = 0; i < PER; ++i)
          if (live & (1u << i))
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(xdst + swz((tid >> 3) + 16u * i, u)),
                         "l"(src[i] + kb)
                         : "memory");
        cp_async_arrive(full);
      }
    }
    cp_async_wait<0>();  // no copy outlives its thread
    return;
  }

  // Consumer warpgroups.
  const u32 cw = (warp >> 2) - 1u;  // 0 or 1
  // First weight row (in the stage) of each of the warpgroup's two m64 tiles.
  const u32 rb0 = P == 1 ? 128u * cw : 64u * cw;
  const u32 rb1 = P == 1 ? 128u * cw + 64u : 128u + 64u * cw;
  T* out = static_cast<T*>(p.out);
  const u32 wi = warp & 3u, gq = lane >> 2, t4 = lane & 3u;
  u32 g = 0;  // steps consumed so far
  for (u32 t = blockIdx.x; t < n_tiles; t += gridDim.x) {
    const TcTile tile = tile_at<BM>(p, tstart, E, t / cols);
    const u32 n0 = (t % cols) * BN;
    float acc[2][BM / 2];
#pragma unroll
    for (int s = 0; s < 2; ++s)
#pragma unroll
      for (int i = 0; i < BM / 2; ++i) acc[s][i] = 0.f;
    for (u32 j = 0; j < n_steps; ++j, ++g) {
      const u32 s = g % G::S;
      mbar_wait(full0 + 8u * s, (g / G::S) & 1u);
      fence_async_smem();  // x rows written by cp.async (generic proxy) → wgmma
      const u32 wst = w_sm + s * TMA_W_BYTES;
      const u64 da0 = wg_desc(wst + rb0 * 128u), da1 = wg_desc(wst + rb1 * 128u);
      const u64 db = wg_desc(x_sm + s * G::X_BYTES);
      wg_keep(acc[0]);
      wg_keep(acc[1]);
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < TC_BK / 16; ++kk) {
        Wgmma<T, BM>::run(acc[0], da0 + 2 * kk, db + 2 * kk);
        Wgmma<T, BM>::run(acc[1], da1 + 2 * kk, db + 2 * kk);
      }
      wg_commit();
      wg_keep(acc[0]);
      wg_keep(acc[1]);
      wg_wait<1>();  // the step before's group is done: its stage is free
      wg_keep(acc[0]);
      wg_keep(acc[1]);
      if (j > 0 && lane == 0) mbar_arrive(empty0 + 8u * ((g - 1) % G::S));
    }
    wg_wait0();
    wg_keep(acc[0]);
    wg_keep(acc[1]);
    // The tile's last stage is free before the stores: the producer fills
    // the next tile's stages meanwhile.
    if (n_steps > 0 && lane == 0) mbar_arrive(empty0 + 8u * ((g - 1) % G::S));

    // Epilogue: accumulator 4j' + 2h + c of tile s is weight row rb_s + 16w
    // + lane / 4 + 8h of the stage, tile row 8j' + 2(lane % 4) + c.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const u32 r16 = 16u * wi + gq + 8u * h;
      if constexpr (P == 1) {
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          const u32 n = n0 + (s == 0 ? rb0 : rb1) + r16;
          if (n >= p.n) continue;
#pragma unroll
          for (int jj = 0; jj < BM / 8; ++jj)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const u32 r = 8u * jj + 2u * t4 + c;
              if (r < tile.rows) out[(u64)(tile.row0 + r) * p.n + n] = from_f32<T>(acc[s][4 * jj + 2 * h + c]);
            }
        }
      } else {
        const u32 n = n0 + rb0 + r16;
        if (n >= p.n) continue;
#pragma unroll
        for (int jj = 0; jj < BM / 8; ++jj)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const u32 r = 8u * jj + 2u * t4 + c;
            const int i = 4 * jj + 2 * h + c;
            if (r < tile.rows) out[(u64)(tile.row0 + r) * p.n + n] = from_f32<T>(silu(acc[0][i]) * acc[1][i]);
          }
      }
    }
  }
#else
  // Not sm_90a: nothing to run (tc_tma.rs launches it only there).
  if (threadIdx.x == 0 && blockIdx.x == 0) report(p.err, ERR_CONFIG);
#endif
}

}  // namespace moekit
