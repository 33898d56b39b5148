// tc_tma.cu — the grouped expert GEMM of tc_gemm.cu (same parameters, rows,
// tiles and outputs: P = 1 plain, P = 2 gate and up with SwiGLU, GLU = true
// with p.glu's general activation and biases) for weights of format F and
// activations T on sm_90a, in a warp-specialized schedule: one producer
// warpgroup fills a ring of shared-memory stages, two consumer warpgroups
// multiply from it with wgmma, and full/empty mbarriers pass each stage
// between them — no block-wide barrier in the K loop, and the tensor cores
// never wait for a step's copies to be issued.
//
// Tile: 256 weight rows × BM (64, 128) rows of x, 64 columns a step.
//   * Weights, as 64-row quarters of the stage (64 × 64 of T, 128-byte
//     swizzle: wgmma's K-major layout). Quarter q: P = 1 rows n0 + 64q;
//     P = 2 gate (q even) or up (q odd) rows n0 + 64⌊q/2⌋ (128 output
//     columns). Dense weights of T (F = FmtDense<T>): one TMA box a quarter
//     through one tensor map per source, [E·rows, K] of T. Any other format
//     (but dense f32, whose raw rows leave no room): the producer threads
//     copy the tile's packed rows into raw stages (cp.async, the staged
//     kernel's layout and copies, TcStager: one raw stage ahead, so no
//     thread waits on a global load) and decode them with their format's
//     decoder (DecOf) into the ring's stage (st.shared, then
//     fence.proxy.async for wgmma's async proxy). Decoding straight from
//     global memory into registers a step ahead left the producer waiting
//     on its loads and the tensor pipes 39% busy (2026-11-30_s26/run4).
//   * x: the tile's BM rows (gathered through the sort: x is never
//     permuted) with cp.async, 16 bytes a copy, into the same swizzled
//     layout; each producer thread's copies arrive on the stage's full
//     barrier when they land (cp.async.mbarrier.arrive.noinc).
//   * x rows on wgmma's M, weight rows on N: BM = 128 — consumer c takes x
//     rows 64c .. 64c + 63 against all 256 weight rows (m64n256k16); BM = 64
//     — all 64 x rows against quarters 2c, 2c + 1 (m64n128k16). A thread
//     then holds gate and up of the same (row, column) 64 weight rows apart,
//     and two adjacent columns of each: SwiGLU needs no exchange, and the
//     four lanes of a quad transpose their words (two shuffles) so each
//     stores 16 bytes (8 columns) of a row.
//   * One wgmma group a step (4 k16 slices), one group left in flight: a
//     consumer releases stage j − 1 once step j's group is issued and step
//     j − 1's is done.
//   * Persistent: one block an SM walks the list of (row tile, column block)
//     tiles; the ring runs on across tiles, so the producer fills the next
//     tile's first stages while the consumers store this one.
// Each output is summed over k in k16 steps from k = 0 in one accumulator:
// deterministic, batch-invariant, and the same bits as tc_gemm's wgmma
// tiles (GPU test tc_tma::matches_cpu_and_the_staged_kernel).
//
// Needs K a multiple of 64 (tc_tma.rs checks).
#include "moekit/tc_common.cuh"
#include "moekit/wgmma.cuh"
#include "moekit/decode_mma.cuh"

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

constexpr int TMA_PRODUCERS = 128;  // a producer warpgroup
constexpr int TMA_THREADS = TMA_PRODUCERS + 256;  // and two consumer warpgroups
constexpr int TMA_WROWS = 256;    // weight rows of a tile
constexpr int TMA_BOX = 64;       // weight rows a TMA box (a quarter of the tile)
constexpr int TMA_W_BYTES = TMA_WROWS * 128;
constexpr u32 TMA_MAX_E = 1024;  // experts the tile list covers (tc_gemm's MAX_EXPERTS)

// Dense weights of T come by TMA; every other format through its decoder.
template <typename F, typename T> struct TmaByTma { static constexpr bool value = is_same<F, FmtDense<T>>::value; };

// Raw (packed) stages of decoded weights: TMA_RAW_STAGES of the tile's 256
// rows (TcRaw<F>'s row layout, a quarter's 64 rows after another's), each
// feeding RSTEPS steps; none for weights by TMA.
constexpr int TMA_RAW_STAGES = 2;
template <typename F, bool BY_TMA> struct TmaRaw {
  static constexpr int PITCH = TcRaw<F>::PITCH;
  static constexpr int BYTES = TMA_WROWS * PITCH;  // a raw stage
  static constexpr int ROOM = TMA_RAW_STAGES * BYTES;
};
template <typename F> struct TmaRaw<F, true> { static constexpr int PITCH = 0, BYTES = 0, ROOM = 0; };

// Stages of the ring: as many as fit a block's 227 KB beside the raw stages,
// the alignment slack and TMA_STATIC bytes of static shared memory
// (tc_tma.rs mirrors it).
constexpr int TMA_STATIC = 10240;
template <typename F, typename T, int BM> struct TmaGeo {
  typedef TmaRaw<F, TmaByTma<F, T>::value> Raw;
  static constexpr int X_BYTES = BM * 128;
  static constexpr int STAGE = TMA_W_BYTES + X_BYTES;
  static constexpr int ROOM = 232448 - 1024 - TMA_STATIC - Raw::ROOM;
  static constexpr int S = ROOM / STAGE > 6 ? 6 : ROOM / STAGE;
  static constexpr int SMEM = S * STAGE + Raw::ROOM + 1024;
  static_assert(S >= 2, "two stages at least");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// a[j] of quad lane t (t = lane % 4) ← a[t] of quad lane j: a 4 × 4
// transpose of 32-bit words in two exchanges (xor 2, then xor 1).
__device__ __forceinline__ void quad_transpose(u32 (&a)[4], u32 t) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const u32 x = __shfl_xor_sync(0xffffffffu, (t & 2u) ? a[j] : a[j + 2], 2);
    if (t & 2u) a[j] = x;
    else a[j + 2] = x;
  }
#pragma unroll
  for (int j = 0; j < 4; j += 2) {
    const u32 x = __shfl_xor_sync(0xffffffffu, (t & 1u) ? a[j] : a[j + 1], 1);
    if (t & 1u) a[j] = x;
    else a[j + 1] = x;
  }
}

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
// shared memory, with all NT threads, and the offsets themselves in toff
// (the caller synchronizes); returns E.
// Bad offsets (not monotone, past M) give their experts no tiles and are
// reported, so every tile's rows lie inside M. Without offsets: one expert.
template <int BM, int NT>
__device__ __forceinline__ u32 tile_starts(const TcParams& p, u32* tstart, u32* toff, u32* scan) {
  constexpr u32 EPT = (TMA_MAX_E + NT - 1) / NT, W = NT / 32;
  if (p.offsets == nullptr) {
    if (threadIdx.x == 0) {
      toff[0] = 0;
      toff[1] = p.m;
      tstart[0] = 0;
      tstart[1] = (p.m + BM - 1) / BM;
    }
    return 1;
  }
  const u32 E = p.n_experts, e0 = threadIdx.x * EPT;
  u32 cnt[EPT];
  u32 at = expert_tiles<BM, NT, EPT>(p, cnt, scan, [&](u32 e, u32 a, u32 b) {
    toff[e] = a;
    if (e + 1 == E) toff[E] = b;
  });
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

// Tile t of the list (`cols` column blocks a row tile, expert_order): its
// expert, first row, row count and column block. The expert is the owner of
// row tile t / cols: binary search for the last expert e with tstart[e] ≤
// t / cols (experts without tiles share their start with the next expert).
template <int BM>
__device__ __forceinline__ TcTile tile_at(const u32* tstart, const u32* toff, u32 E, u32 t, u32 cols, bool by_row) {
  const u32 mq = t / cols;
  u32 lo = 0, hi = E;  // tstart[lo] ≤ mq < tstart[hi]
  while (hi - lo > 1) {
    const u32 mid = (lo + hi) >> 1;
    if (tstart[mid] <= mq) lo = mid;
    else hi = mid;
  }
  u32 mt, cb;
  expert_order(t, cols, tstart[lo], tstart[lo + 1] - tstart[lo], by_row, mt, cb);
  // The owner's offsets passed tile_starts' checks.
  const u32 a = toff[lo], b = toff[lo + 1];
  TcTile tl;
  tl.e = lo;
  tl.row0 = a + (mt - tstart[lo]) * BM;
  tl.rows = min((u32)BM, b - tl.row0);
  tl.cb = cb;
  return tl;
}

// Grid: (blocks, 1), persistent: block b takes tiles b, b + gridDim.x, …
// of the list of (row tile, column block) pairs in expert_order (an
// expert's row tiles side by side for each column block, so the blocks that
// run together share the column block's weights and the expert's x rows in
// L2; TC_BY_ROW: a row tile's column blocks side by side). The producer
// and the consumers walk the same list; the stage ring runs on across
// tiles, so the producer fills the next tile's first stages while the
// consumers store this one.
template <typename F, typename T, int P, int BM, bool GLU = false>
__global__ void __launch_bounds__(TMA_THREADS, 1) tc_tma(const __grid_constant__ TmaParams tp) {
  const TcParams& p = tp.tc;
  typedef TmaGeo<F, T, BM> G;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(P == 1 || P == 2, "one source, or gate and up");
  static_assert(!GLU || P == 2, "GLU: the general activation of gate and up");
  // Dense weights of T come by TMA; every other format through its decoder.
  constexpr bool BY_TMA = TmaByTma<F, T>::value;
  extern __shared__ __align__(128) u8 smem[];
  __shared__ u32 scan[TMA_THREADS / 32];
  __shared__ u32 tstart[TMA_MAX_E + 1], toff[TMA_MAX_E + 1];
  __shared__ __align__(8) u64 bars[2 * G::S];  // full[S], then empty[S]
  const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
  if (BY_TMA && tid == 0) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<u64>(&tp.map[0])) : "memory");
    if (P == 2) asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<u64>(&tp.map[1])) : "memory");
  }
  pdl_entry();  // a dependent launch (ops/mod.rs Order::Dependent)
  {
    u32 dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < (u32)G::SMEM || (p.p & ~TC_BY_ROW) != (u32)P || p.k % TC_BK != 0 || p.n_experts > TMA_MAX_E) {
      if (tid == 0 && blockIdx.x == 0) report(p.err, ERR_CONFIG);
      return;
    }
  }
  const u32 E = tile_starts<BM, TMA_THREADS>(p, tstart, toff, scan);
  const u32 base = smem_addr(smem);
  const u32 w_sm = base + ((1024u - (base & 1023u)) & 1023u);  // S weight stages, then S x stages
  const u32 x_sm = w_sm + G::S * TMA_W_BYTES;
  const u32 raw_sm = x_sm + G::S * G::X_BYTES;  // decoded weights: the raw stages
  const u32 full0 = smem_addr(bars), empty0 = full0 + 8u * G::S;
  if (tid == 0) {
    for (int s = 0; s < G::S; ++s) {
      // The producer threads' copies, and the TMA thread's expect_tx or
      // each producer thread's arrival after its decoded stores.
      mbar_init(full0 + 8u * s, BY_TMA ? TMA_PRODUCERS + 1u : 2u * TMA_PRODUCERS);
      mbar_init(empty0 + 8u * s, 8u);  // one arrival a consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();  // barriers, tile starts

  const u32 n_steps = p.k / TC_BK;
  constexpr u32 BN = P == 1 ? TMA_WROWS : TMA_WROWS / 2;  // output columns of a tile
  const u32 cols = (p.n + BN - 1) / BN;
  const u32 n_tiles = tstart[E] * cols;
  const bool by_row = (p.p & TC_BY_ROW) != 0;

  if (tid < (u32)TMA_PRODUCERS) {
    // Producer warpgroup: thread t copies unit t % 8 of x rows t / 8 + 16i.
    constexpr int PER = BM * 8 / TMA_PRODUCERS;
    const u32 u = tid & 7u;
    const T* x = static_cast<const T*>(p.x);
    u32 g = 0;  // steps issued so far (the ring's position)
    for (u32 t = blockIdx.x; t < n_tiles; t += gridDim.x) {
      const TcTile tile = tile_at<BM>(tstart, toff, E, t, cols, by_row);
      const u32 n0 = tile.cb * BN;
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
      // x's copies of step j into stage s, arriving on its full barrier.
      auto copy_x = [&](u32 j, u32 s) {
        const u32 xdst = x_sm + s * G::X_BYTES;
        const u32 kb = j * TC_BK * (u32)sizeof(T);
#pragma unroll
        for (int i = 0; i < PER; ++i)
          if (live & (1u << i))
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(xdst + swz((tid >> 3) + 16u * i, u)),
                         "l"(src[i] + kb)
                         : "memory");
        cp_async_arrive(full0 + 8u * s);
      };
      if constexpr (BY_TMA) {
        // The tile's first weight row of each source in its tensor map.
        const int wr0 = (int)(tile.e * p.src[0].rows + p.src[0].row_offset + n0);
        const int wr1 = (int)(tile.e * p.src[P - 1].rows + p.src[P - 1].row_offset + n0);
        for (u32 j = 0; j < n_steps; ++j, ++g) {
          const u32 s = g % G::S, round = g / G::S;
          if (round > 0) mbar_wait(empty0 + 8u * s, (round - 1) & 1u);
          const u32 full = full0 + 8u * s;
          if (tid == 0) {
            const u32 wdst = w_sm + s * TMA_W_BYTES;
            mbar_expect_tx(full, TMA_W_BYTES);
            // Quarter q of the stage: P = 1 rows n0 + 64q; P = 2 gate (q
            // even) or up (q odd) rows n0 + 64⌊q/2⌋.
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const int row = P == 1 ? wr0 + TMA_BOX * q : (q & 1 ? wr1 : wr0) + TMA_BOX * (q >> 1);
              tma_2d(wdst + q * TMA_BOX * 128, tp.map[P == 2 && (q & 1) ? 1 : 0], (int)(j * TC_BK), row, full);
            }
          }
          copy_x(j, s);
        }
      } else {
        // Decoded weights, through raw stages: the producer threads copy
        // the next raw stage's packed bytes (cp.async, no register waits on
        // them) while they decode this one's into the ring — the staged
        // kernel's copies and decoders (TcStager), one per quarter of the
        // tile (thread t: row t / 2's half t % 2 of the 64, as the staged
        // kernel's threads t < 128 take them).
        typedef TcRaw<F> R;
        typedef TcStager<F, T, 1, BM, R> St;
        typedef typename DecOf<F, T>::type D;
        St st[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          TcParams pq = p;
          pq.src[0] = p.src[P == 2 ? (q & 1) : 0];
          st[q].init(pq, tile, n0 + TMA_BOX * (P == 1 ? q : q >> 1), tid);
        }
        // The row's place in raw stage slot `rs` of quarter q.
        auto place = [&](u32 rs, int q) -> u8* {
          return smem + (raw_sm - base) + rs * G::Raw::BYTES + (q * TMA_BOX + st[q].r) * G::Raw::PITCH;
        };
        // Every producer thread is done with the last tile's raw stages.
        asm volatile("bar.sync 1, %0;" ::"n"(TMA_PRODUCERS) : "memory");
#pragma unroll
        for (int q = 0; q < 4; ++q) st[q].issue_raw(p, 0, place(0, q));
        cp_async_commit();
        for (u32 j = 0; j < n_steps; ++j, ++g) {
          const u32 rs = (j / R::RSTEPS) % TMA_RAW_STAGES;
          if (j % R::RSTEPS == 0) {
            // This raw stage has landed (every thread's copies: the
            // barrier), and every thread is done with the one before,
            // whose slot the next raw stage takes.
            cp_async_wait<0>();
            asm volatile("bar.sync 1, %0;" ::"n"(TMA_PRODUCERS) : "memory");
            const u32 jn = j + R::RSTEPS;
#pragma unroll
            for (int q = 0; q < 4; ++q) st[q].issue_raw(p, jn, place((jn / R::RSTEPS) % TMA_RAW_STAGES, q));
            cp_async_commit();
          }
          const u32 s = g % G::S, round = g / G::S;
          if (round > 0) mbar_wait(empty0 + 8u * s, (round - 1) & 1u);
          copy_x(j, s);
          u8* wst = smem + (w_sm - base) + s * TMA_W_BYTES;
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            D d;
            d.load(st[q].slice(p, j, place(rs, q)));
#pragma unroll
            for (int u = 0; u < 4; ++u) st[q].put(wst + q * TMA_BOX * 128, u, d.unit(u));
          }
          fence_async_smem();  // the generic proxy's stores → wgmma
          mbar_arrive(full0 + 8u * s);
        }
      }
    }
    cp_async_wait<0>();  // no copy outlives its thread
    return;
  }

  // Consumer warpgroups: x rows on wgmma's M (64 a warpgroup), weight
  // rows on N. BM = 128: warpgroup c takes x rows 64c .. 64c + 63 against
  // all four quarters (N = 256); BM = 64: all 64 x rows against quarters
  // 2c and 2c + 1 (N = 128). Either way a thread's accumulators for weight
  // row w and w + 64 of its range are the gate and up rows of one column
  // (P = 2), and each holds two adjacent columns (c = 0, 1): one word of
  // output a pair (the epilogue below).
  constexpr int WN = BM == 128 ? 256 : 128;  // weight rows a warpgroup multiplies
  constexpr int NACC = WN / 2;
  const u32 cw = (warp >> 2) - 1u;  // 0 or 1
  const u32 xr0 = BM == 128 ? 64u * cw : 0u;     // the warpgroup's first x row of the tile
  const u32 q0 = BM == 128 ? 0u : 2u * cw;       // its first quarter
  T* out = static_cast<T*>(p.out);
  const u32 wi = warp & 3u, gq = lane >> 2, t4 = lane & 3u;
  // Rows of whole 16-byte words: the epilogue's vector stores.
  const bool vec = p.n % 8 == 0 && (reinterpret_cast<u64>(p.out) & 15) == 0;
  u32 g = 0;  // steps consumed so far
  for (u32 t = blockIdx.x; t < n_tiles; t += gridDim.x) {
    const TcTile tile = tile_at<BM>(tstart, toff, E, t, cols, by_row);
    const u32 n0 = tile.cb * BN;
    float acc[NACC];
#pragma unroll
    for (int i = 0; i < NACC; ++i) acc[i] = 0.f;
    for (u32 j = 0; j < n_steps; ++j, ++g) {
      const u32 s = g % G::S;
      mbar_wait(full0 + 8u * s, (g / G::S) & 1u);
      fence_async_smem();  // x rows written by cp.async (generic proxy) → wgmma
      const u64 da = wg_desc(x_sm + s * G::X_BYTES + xr0 * 128u);
      const u64 db = wg_desc(w_sm + s * TMA_W_BYTES + q0 * TMA_BOX * 128u);
      wg_keep(acc);
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < TC_BK / 16; ++kk) Wgmma<T, WN>::run(acc, da + 2 * kk, db + 2 * kk);
      wg_commit();
      wg_keep(acc);
      wg_wait<1>();  // the step before's group is done: its stage is free
      wg_keep(acc);
      if (j > 0 && lane == 0) mbar_arrive(empty0 + 8u * ((g - 1) % G::S));
    }
    wg_wait0();
    wg_keep(acc);
    // The tile's last stage is free before the stores: the producer fills
    // the next tile's stages meanwhile.
    if (n_steps > 0 && lane == 0) mbar_arrive(empty0 + 8u * ((g - 1) % G::S));

    // Epilogue: accumulator 4jj + 2h + c is x row xr0 + 16w + lane / 4 + 8h
    // of the tile, weight row 8jj + 2(lane % 4) + c of the warpgroup's range
    // (quarter q0 + jj / 8). A row's output pairs (words) i = 0 .. NW − 1 are
    // jj = i (P = 1), or the gate pairs jj = 16⌊i/8⌋ + i % 8 with their up
    // partners 8 on (P = 2); the four lanes of a quad hold 8 adjacent
    // columns of each jj.
    constexpr int NW = P == 1 ? NACC / 4 : NACC / 8;
    // Output column of lane l's pair of word i.
    auto col_of = [&](int i, u32 l) { return n0 + (P == 1 ? 64u : 32u) * q0 + 8u * i + 2u * l; };
    auto word = [&](int i, int h) -> u32 {
      const int jj = P == 1 ? i : 16 * (i / 8) + i % 8;
      const float v0 = acc[4 * jj + 2 * h], v1 = acc[4 * jj + 2 * h + 1];
      if constexpr (P == 1) return Pk<T>::pack(v0, v1);
      const float u0 = acc[(4 * (jj + 8) + 2 * h) % NACC], u1 = acc[(4 * (jj + 8) + 2 * h + 1) % NACC];
      if constexpr (GLU) {
        // Biases of columns past N are not read (clamped: their outputs
        // are not stored).
        const u32 c = col_of(i, t4);
        const u64 at = (u64)tile.e * p.n;
        return Pk<T>::pack(glu(p.glu, v0, u0, tile.e, at + min(c, p.n - 1)),
                           glu(p.glu, v1, u1, tile.e, at + min(c + 1, p.n - 1)));
      } else {
        return Pk<T>::pack(silu(v0) * u0, silu(v1) * u1);
      }
    };
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const u32 r = xr0 + 16u * wi + gq + 8u * h;
      const bool live = r < tile.rows;
      T* orow = out + (u64)(tile.row0 + min(r, tile.rows - 1)) * p.n;
      if (vec) {
        // Four words at a time, transposed in the quad: lane t4 then holds
        // word 4G + t4's 8 columns, one 16-byte store.
#pragma unroll
        for (int G4 = 0; G4 < NW / 4; ++G4) {
          u32 a[4];
#pragma unroll
          for (int l = 0; l < 4; ++l) a[l] = word(4 * G4 + l, h);
          quad_transpose(a, t4);
          const u32 c = col_of(4 * G4 + (int)t4, 0);
          if (live && c < p.n) *reinterpret_cast<uint4*>(orow + c) = make_uint4(a[0], a[1], a[2], a[3]);
        }
      } else if (live) {
#pragma unroll
        for (int i = 0; i < NW; ++i) {
          const u32 n = col_of(i, t4), w = word(i, h);
          const T* e = reinterpret_cast<const T*>(&w);
          if (n < p.n) orow[n] = e[0];
          if (n + 1 < p.n) orow[n + 1] = e[1];
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
