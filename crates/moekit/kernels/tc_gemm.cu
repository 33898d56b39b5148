// tc_gemm.cu — grouped expert GEMM on tensor cores (mma.sync m16n8k16,
// sm_80+) over expert-sorted rows, for every weight format of
// moekit/dequant.cuh:
//
//   P = 1:  y[r, n] = Σ_k A[r, k] · W[e(r), n, k]
//   P = 2:  y[r, n] = silu(Σ_k A[r, k] · G[e(r), n, k]) · (Σ_k A[r, k] · U[e(r), n, k])
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
// are deterministic and batch-invariant, and no split-K is used.
//
// Shared tiles of 64 columns of T are rows of 128 bytes: 8 units of 16 bytes,
// unit u of row r stored at u ^ (r & 7) so that ldmatrix's 8 row addresses
// hit 8 different bank groups.
#include "moekit/dequant.cuh"
#include "moekit/pipe.cuh"
#include "moekit/tc_decode.cuh"
#include "moekit/wgmma.cuh"
#include "moekit/mma.cuh"

namespace moekit {

struct TcParams {
  const void* x;       // [x_rows, K] of T
  const u32* gather;   // null: A row r = x[r]; else x[gather[r] / gather_div]
  const u32* offsets;  // [E + 1] expert-sorted offsets; null: all rows use expert 0
  void* out;           // [M, N] of T
  u32* err;
  WeightSrc src[2];    // P = 1: src[0]; P = 2: gate, up
  u32 m, n, k, n_experts;
  u32 x_rows, gather_div, group_shift, p;  // p: P, checked against the instance
};
static_assert(sizeof(TcParams) == 136, "TcParams layout");

constexpr int TC_THREADS = 256;   // 8 warps
constexpr int TC_BROWS = 128;     // weight rows of a tile (P · BN)
constexpr int TC_BK = 64;         // K columns a step
// A stages: 4 for small tiles (memory-bound: deeper prefetch), 3 for BM ≥ 64
// so that two blocks share an SM where the raw stages allow.
template <int BM> struct TcStages { static constexpr int value = BM >= 64 ? 3 : 4; };
constexpr u32 TC_NONE = 0xFFFFFFFFu;

// Tile geometry of an instance (tc_gemm.rs: smem_bytes mirrors it).
template <typename F, typename T, int BM>
struct TcGeo {
  static constexpr int WARPS_M = BM >= 32 ? 2 : 1;
  static constexpr int WARPS_N = 8 / WARPS_M;
  static constexpr int WM = BM / WARPS_M;          // rows per warp
  static constexpr int WNR = TC_BROWS / WARPS_N;   // weight rows per warp
  static constexpr int MI = WM / 16;               // m16 tiles per warp
  static constexpr int NJ = WNR / 8;               // n8 tiles per warp
  static_assert(MI >= 1 && NJ % 2 == 0, "warp tile");
  static constexpr int S = TcStages<BM>::value;
  static constexpr int KR = F::UNIT_W > TC_BK ? F::UNIT_W : TC_BK;  // raw columns a stage
  static constexpr int RSTEPS = KR / TC_BK;                         // steps a raw stage feeds
  static constexpr bool AUX = !is_void<typename F::Scale>::value;
  static constexpr int AUX_ELEMS = KR / 32;                         // most groups a stage covers
  static constexpr int DATA_BYTES = KR / F::UNIT_W * F::UNIT_BYTES; // a row's packed bytes a stage
  // Storage units of whole 16-byte words: every row's stage starts 16-aligned
  // (tensors are) and is whole words, so staging needs no head or tail.
  static constexpr bool ALIGNED = F::UNIT_BYTES % 16 == 0;
  // A row's data in its raw stage: exactly its bytes when ALIGNED, else the
  // 16-byte words that cover them (= stage_room).
  static constexpr int ROOM_DATA = ALIGNED ? DATA_BYTES : (DATA_BYTES + 30) & ~15;
  // Scales and biases go in 4-byte words (cp.async of 4 bytes), landing at
  // their address modulo 4: an element of 2 bytes may start 2 bytes into
  // its first word. Each gets a multiple of 8 bytes, so both together are
  // whole 16-byte units.
  static constexpr int AUX_SIZE = AUX ? (int)sizeof(typename aux_t<F>::type) : 4;
  static constexpr int AUX_BYTES = AUX ? AUX_ELEMS * AUX_SIZE : 0;
  static constexpr int ROOM_AUX = AUX ? ((4 - AUX_SIZE % 4) % 4 + AUX_BYTES + 7) & ~7 : 0;
  static constexpr int PITCH = (ROOM_DATA + 2 * ROOM_AUX) | 16;     // a staged row: odd 16-byte units
  static constexpr int WORDS = (ROOM_DATA - 16) / 16 + 1;           // most 16-byte words a row's data takes
  static_assert((ROOM_DATA + 2 * ROOM_AUX) % 16 == 0, "raw rows of whole 16-byte units");
  static constexpr int A_BYTES = BM * TC_BK * 2;
  static constexpr int B_BYTES = TC_BROWS * TC_BK * 2;
  static constexpr int RAW_BYTES = TC_BROWS * PITCH;
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
  // WAIT).
  static constexpr int rs_for(int lead) { return 1 + (S - 2 + lead + RSTEPS - 1) / RSTEPS; }
  static constexpr int smem_for(int lead) {
    return S * A_BYTES + BS * B_BYTES + (DIRECT ? 0 : rs_for(lead) * RAW_BYTES) + SLACK;
  }
  // Blocks an SM holds by shared memory: 228 KB, 1 KB reserved a block.
  static constexpr int blocks_for(int smem) { return 233472 / (smem + 1024); }
  static constexpr int LEAD = DIRECT || blocks_for(smem_for(1)) >= blocks_for(smem_for(0)) ? 1 : 0;
  static constexpr int RS = rs_for(LEAD);
  static constexpr int WAIT = S - 3 + (DIRECT ? 1 : LEAD);  // copy groups a step leaves in flight
  static constexpr int SMEM = smem_for(LEAD);
  static_assert(F::CHUNK <= 32 && 32 % F::CHUNK == 0, "a slice is whole chunks");
  static_assert(TC_THREADS == 2 * TC_BROWS && TC_BK == 64, "two threads a weight row, 32 columns each");
};

// Byte offset of unit u (16 bytes) of row r in a swizzled 64-column tile.
__device__ __forceinline__ u32 swz(u32 r, u32 u) { return r * 128u + ((u ^ (r & 7u)) << 4); }

__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void ldsm_x4(u32 addr, u32 (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Weight row i (0..127) of a tile: its source q and output column (from
// the tile's first). P = 1: column i. P = 2, 3: 8-row groups alternate the
// two sources (gate/up, hi/lo) of the same 8 columns, so that a column's two
// rows sit in one MMA fragment (rows g and g + 8 of a wgmma warp's 16).
template <int P>
__device__ __forceinline__ void tile_row(u32 i, u32& q, u32& col) {
  if constexpr (P == 1) {
    q = 0;
    col = i;
  } else {
    q = (i >> 3) & 1;
    col = ((i >> 4) << 3) | (i & 7);
  }
}

// The tile a block computes.
struct TcTile {
  u32 e, row0, rows;
};

// Finds this block's tile: blockIdx.y-th of the list of every expert's
// ⌈rows / BM⌉ tiles (expert order). Bad offsets (not monotone, past M) give
// their experts no tiles and are reported; so every row a tile names is < M.
template <int BM>
__device__ __forceinline__ TcTile find_tile(const TcParams& p, u32* scan) {
  const u32 mt = blockIdx.y;
  TcTile t;
  if (p.offsets == nullptr) {
    t.e = 0;
    t.row0 = mt * BM;
    t.rows = t.row0 < p.m ? min((u32)BM, p.m - t.row0) : 0;
    return t;
  }
  const u32* off = p.offsets;
  const u32 E = p.n_experts;
  constexpr u32 EPT = 4;  // experts per thread: E ≤ 1024 (ops::sort)
  const u32 e0 = threadIdx.x * EPT;
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
  // Exclusive block scan of `local`.
  const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  u32 incl = local;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const u32 v = __shfl_up_sync(0xffffffffu, incl, o);
    if ((int)lane >= o) incl += v;
  }
  if (lane == 31) scan[warp] = incl;
  if (threadIdx.x == 0) scan[8] = TC_NONE;
  __syncthreads();
  u32 before = incl - local;
  for (u32 w = 0; w < warp; ++w) before += scan[w];
  if (mt >= before && mt < before + local) {
    u32 at = before;
#pragma unroll
    for (u32 i = 0; i < EPT; ++i) {
      if (mt >= at && mt < at + cnt[i]) {
        const u32 e = e0 + i;
        const u32 row0 = off[e] + (mt - at) * BM;
        scan[8] = e;
        scan[9] = row0;
        scan[10] = min((u32)BM, off[e + 1] - row0);
      }
      at += cnt[i];
    }
  }
  __syncthreads();
  t.e = scan[8];
  t.row0 = scan[9];
  t.rows = t.e == TC_NONE ? 0 : scan[10];
  return t;
}

template <typename F, typename T, int P, int BM>
__global__ void __launch_bounds__(TC_THREADS, BM >= 64 && BM <= 128 ? 2 : 1) tc_gemm(const __grid_constant__ TcParams p) {
  typedef TcGeo<F, T, BM> G;
  extern __shared__ __align__(128) u8 smem[];
  __shared__ u32 scan[12];
  __shared__ const T* arow[BM];  // x row of each A row (null: none)

  {
    u32 dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < (u32)G::SMEM || p.p != (u32)P) {
      if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) report(p.err, ERR_CONFIG);
      return;
    }
  }
  const TcTile tile = find_tile<BM>(p, scan);
  if (tile.rows == 0) return;

  u8* const a_sm = smem + (G::SLACK ? (G::SLACK - (smem_addr(smem) & (G::SLACK - 1))) & (G::SLACK - 1) : 0u);
  u8* const b_sm = a_sm + G::S * G::A_BYTES;
  u8* const raw_sm = b_sm + G::BS * G::B_BYTES;
  const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  static_assert(P == 1 || P == 2 || P == 3, "one source, gate and up, or hi and lo");
  constexpr u32 HALVES = P == 1 ? 1 : 2;  // weight-row groups of a tile
  constexpr u32 BN = TC_BROWS / HALVES;   // output columns of the tile
  const u32 n0 = blockIdx.x * BN;
  const T* x = static_cast<const T*>(p.x);

  for (u32 i = tid; i < BM; i += TC_THREADS) {
    const T* a = nullptr;
    if (i < tile.rows) {
      u32 r = tile.row0 + i;
      if (p.gather != nullptr) {
        r = p.gather[r] / p.gather_div;
        if (r >= p.x_rows) report(p.err, ERR_SLOT);
      }
      if (r < p.x_rows) a = x + (u64)r * p.k;
    }
    arow[i] = a;
  }

  // Weight row i (0..127) of the tile: source i / BN, output column n0 + i % BN.
  // Thread tid stages and decodes row tid / 2, columns 32·(tid & 1) .. + 31
  // of each step (its "slice"), so its row's addresses are computed once.
  // Rows 16w .. 16w + 15 belong to warp w, halves by bit 4 of the lane: a
  // quarter-warp (8 threads) reads 8 consecutive rows' staged bytes at the
  // same offset, distinct banks as the pitch is an odd number of 16-byte units.
  const u32 r_me = (tid & 15) | ((tid >> 5) << 4), h_me = (tid >> 4) & 1;
  const u32 rb = p.k / F::UNIT_W * F::UNIT_BYTES;  // bytes of a weight row
  const u32 ab = G::AUX ? (p.k >> p.group_shift) * (u32)sizeof(typename aux_t<F>::type) : 0;
  const u32 n_steps = (p.k + TC_BK - 1) / TC_BK;
  const u8* my_data;  // the row's packed bytes
  const u8* my_aux;   // its scales (h = 0) or biases (h = 1), affine only
  bool my_valid;
  {
    u32 q, c;
    tile_row<P>(r_me, q, c);
    const u32 n = n0 + c;
    const WeightSrc& s = p.src[q];
    my_valid = n < p.n;
    const u64 row = (u64)tile.e * s.rows + s.row_offset + n;
    my_data = s.data + row * rb;
    my_aux = G::AUX ? (h_me ? s.biases : s.scales) + row * ab : nullptr;
  }
  u8* const my_raw = raw_sm + r_me * G::PITCH;
  __shared__ const u8* wrow[G::DIRECT ? TC_BROWS : 1];  // direct: each weight row (null: past N)
  if (G::DIRECT && h_me == 0) wrow[G::DIRECT ? r_me : 0] = my_valid ? my_data : nullptr;
  __syncthreads();

  // Thread tid copies 16-byte unit a_u = tid & 7 of A rows tid / 8 + 32c.
  constexpr int A_PER = (BM * 8 + TC_THREADS - 1) / TC_THREADS;
  const u32 a_u = tid & 7;
  const u32 a_sw = swz(tid >> 3, a_u);  // + 32c rows = + 4096c bytes, same swizzle
  // Issues the raw stage that step j starts, if it starts one (`issue` of
  // step j takes step j + LEAD's; the prologue step 0's when LEAD = 1).
  auto issue_raw = [&](u32 j) {
    if (j >= n_steps || j % G::RSTEPS != 0 || !my_valid) return;
    const u32 kr0 = j * TC_BK;  // = raw stage start (a multiple of KR)
    const u32 kr1 = min(kr0 + (u32)G::KR, p.k);
    u8* r_dst = my_raw + (j / G::RSTEPS % G::RS) * G::RAW_BYTES;
    const u32 dbytes = (kr1 - kr0) / F::UNIT_W * F::UNIT_BYTES;
    const u8* src = my_data + kr0 / F::UNIT_W * F::UNIT_BYTES;
    if constexpr (G::ALIGNED) {
#pragma unroll
      for (int c = 0; c < (G::DATA_BYTES / 16 + 1) / 2; ++c) {
        const u32 w = h_me + 2 * c;
        if (16u * w < dbytes) cp_async16(r_dst + 16u * w, src + 16u * w, 16u);
      }
    } else {
      const u32 head = (u32)(reinterpret_cast<u64>(src) & 15u), end = head + dbytes;
#pragma unroll
      for (int c = 0; c < (G::WORDS + 1) / 2; ++c) {
        const u32 w = h_me + 2 * c;
        if (16u * w < end) cp_async16(r_dst + 16u * w, src - head + 16u * w, end - 16u * w >= 16u ? 16u : end - 16u * w);
      }
    }
    if constexpr (G::AUX) {
      typedef typename aux_t<F>::type S;
      const u32 g0 = kr0 >> p.group_shift, g1 = ((kr1 - 1) >> p.group_shift) + 1;
      const u8* asrc = my_aux + g0 * sizeof(S);
      const u32 ahead = (u32)(reinterpret_cast<u64>(asrc) & 3u), aend = ahead + (g1 - g0) * (u32)sizeof(S);
      u8* dst = r_dst + G::ROOM_DATA + h_me * G::ROOM_AUX;
#pragma unroll
      for (int w = 0; w < G::ROOM_AUX / 4; ++w)
        if (4u * w < aend) cp_async4(dst + 4u * w, asrc - ahead + 4u * w, aend - 4u * w >= 4u ? 4u : aend - 4u * w);
    }
  };
  // Issues the copies of step j's group: its A tile, and the B stage (dense
  // weights of type T) or the raw stage of step j + LEAD, so that one wait
  // per step lands both what the step multiplies and what it decodes.
  auto issue = [&](u32 j) {
    if (j >= n_steps) return;
    const u32 k0 = j * TC_BK;
    u8* a_dst = a_sm + (j % G::S) * G::A_BYTES + a_sw;
    const bool k_ok = k0 + 8 * a_u < p.k;
#pragma unroll
    for (int c = 0; c < A_PER; ++c) {
      const u32 r = (tid >> 3) + 32 * c;  // row r's unit a_u; r & 7 is the thread's
      if ((BM * 8) % TC_THREADS == 0 || r < (u32)BM) {
        const T* src = arow[r];
        const bool ok = src != nullptr && k_ok;
        cp_async16(a_dst + 4096 * c, ok ? src + k0 + 8 * a_u : x, ok ? 16u : 0u);
      }
    }
    if constexpr (G::DIRECT) {
      // Like A: unit a_u of weight rows tid / 8 + 32c, straight into B stage j % S.
      u8* b_dst = b_sm + (j % G::S) * G::B_BYTES + a_sw;
#pragma unroll
      for (int c = 0; c < TC_BROWS * 8 / TC_THREADS; ++c) {
        const u8* src = wrow[(tid >> 3) + 32 * c];
        const bool ok = src != nullptr && k_ok;
        cp_async16(b_dst + 4096 * c, ok ? src + (u64)(k0 + 8 * a_u) * sizeof(T) : p.x, ok ? 16u : 0u);
      }
    } else {
      issue_raw(j + G::LEAD);
    }
  };

  // This thread's slice of step j in its raw stage. Scales and biases share
  // their misalignment (both tensors start 16-byte aligned, same row layout).
  auto slice = [&](u32 j) {
    TcSlice s;
    const u32 kr0 = j / G::RSTEPS * G::KR;
    const u8* base = my_raw + (j / G::RSTEPS % G::RS) * G::RAW_BYTES;
    s.col = j % G::RSTEPS * TC_BK + 32u * h_me;
    const u32 kc = kr0 + s.col;
    s.cols = my_valid && kc < p.k ? min(32u, p.k - kc) : 0u;
    s.data = base;
    if constexpr (!G::ALIGNED) s.data += (u32)(reinterpret_cast<u64>(my_data + kr0 / F::UNIT_W * F::UNIT_BYTES) & 15u);
    s.scales = s.biases = nullptr;
    if constexpr (G::AUX) {
      typedef typename aux_t<F>::type S;
      const u32 ahead = (u32)(reinterpret_cast<u64>(my_aux + (kr0 >> p.group_shift) * sizeof(S)) & 3u);
      s.scales = base + G::ROOM_DATA + ahead;
      s.biases = base + G::ROOM_DATA + G::ROOM_AUX + ahead;
    }
    s.kr = G::KR;
    s.group_shift = p.group_shift;
    s.lo = P == 3 && ((r_me >> 3) & 1);
    return s;
  };
  typedef typename TcDecOf<F, T>::type Dec;
  // Unit u (8 weights) of this thread's slice into B buffer j & 1.
  auto put = [&](u32 j, int u, uint4 v) {
    *reinterpret_cast<uint4*>(b_sm + (j & 1) * G::B_BYTES + swz(r_me, 4 * h_me + u)) = v;
  };

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
  if constexpr (!G::DIRECT && G::LEAD == 1) issue_raw(0);
#pragma unroll
  for (int j = 0; j < G::S - 1; ++j) {
    issue(j);
    cp_async_commit();
  }
  cp_async_wait<G::S - 2>();
  __syncthreads();
  if constexpr (!G::DIRECT) {
    Dec d;
    d.load(slice(0));
#pragma unroll
    for (int u = 0; u < 4; ++u) put(0, u, d.unit(u));
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
    for (u32 ks = 0; ks < n_steps; ++ks) {
      cp_async_wait<G::WAIT>();
      fence_async_smem();
      __syncthreads();
      issue(ks + G::S - 1);
      cp_async_commit();
      // k16 slice kk starts 32·kk bytes in: + 2kk in the descriptors' address
      // field (shared addresses stay below 2^18, so it never carries out).
      const u64 da = wg_desc(smem_addr(b_sm + (ks % G::BS) * G::B_BYTES) + wg * 64 * 128);
      const u64 db = wg_desc(smem_addr(a_sm + (ks % G::S) * G::A_BYTES));
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
    for (u32 ks = 0; ks < n_steps; ++ks) {
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

  // Epilogue: c0, c1 at (row g, cols 2t, 2t+1), c2, c3 at row g + 8.
  T* out = static_cast<T*>(p.out);
  const u32 g = lane >> 2, t4 = lane & 3;
  if constexpr (WG) {
    // Thread's weight rows R (+ 8: h), tokens 8j + 2t + c: d[4j + 2h + c].
    const u32 R = (warp >> 2) * 64 + (warp & 3) * 16 + g;
#pragma unroll
    for (int j = 0; j < BM / 8; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const u32 r = 8 * j + 2 * t4 + c;
        if (r >= tile.rows) continue;
        T* orow = out + (u64)(tile.row0 + r) * p.n;
        if constexpr (P == 1) {
#pragma unroll
          for (int h = 0; h < 2; ++h)
            if (n0 + R + 8 * h < p.n) orow[n0 + R + 8 * h] = from_f32<T>(wacc[4 * j + 2 * h + c]);
        } else {
          // Rows R and R + 8: the two sources of column 8·(R / 16) + R % 8.
          const u32 n = n0 + ((R >> 4) << 3) + (R & 7);
          const float a = wacc[4 * j + c], b = wacc[4 * j + 2 + c];
          if (n < p.n) orow[n] = from_f32<T>(P == 2 ? silu(a) * b : a + b);
        }
      }
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
            if constexpr (P == 2) y = silu(y) * acc[i][j + per][2 * h + c];
            if constexpr (P == 3) y += acc[i][j + per][2 * h + c];
            orow[n + c] = from_f32<T>(y);
          }
        }
      }
  }
}

}  // namespace moekit
