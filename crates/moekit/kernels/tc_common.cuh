// moekit/tc_common.cuh — the building blocks of the tensor-core grouped
// expert GEMM (tc_gemm.cu), kept apart from its schedule so that other
// schedules of the same GEMM (tc_ra.cu, tc_tma.cu) share them: the launch
// parameters, the raw (packed) weight row layout in shared memory, the
// swizzled 64-column tiles, the count and search of tiles in the
// expert-sorted rows, and the copies and decode slices of the 256 threads
// that stage a tile (two threads a weight row, 32 columns each).
//
// Shared tiles of 64 columns of T are rows of 128 bytes: 8 units of 16 bytes,
// unit u of row r stored at u ^ (r & 7) so that ldmatrix's 8 row addresses
// hit 8 different bank groups (and the 128-byte swizzle of wgmma's
// descriptors when the tile starts 1024-byte aligned).
#pragma once
#include "moekit/dequant.cuh"
#include "moekit/pipe.cuh"
#include "moekit/tc_decode.cuh"

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
  GluParams glu;       // P = 2: the activation, gate/up biases and scales
};
static_assert(sizeof(TcParams) == 184, "TcParams layout");

// TcParams::p flag (tc_gemm, dense weights of the activation type, P = 1 or
// 3): K split into gridDim.z ranges of whole steps, block z's partial
// products stored as f32 at out + z·M·N (tc_sum_parts adds them in z order).
constexpr u32 TC_PARTS = 1u << 16;

constexpr int TC_STAGERS = 256;   // threads that stage a tile: two a weight row
constexpr int TC_BROWS = 128;     // weight rows of a tile (P · BN)
constexpr int TC_BK = 64;         // K columns a step
constexpr u32 TC_NONE = 0xFFFFFFFFu;

// A weight row's raw (packed) bytes of one stage in shared memory, scales
// and biases staged in words of AW bytes (tc_geo.rs: smem_bytes mirrors it).
template <typename F, int AW = 4>
struct TcRaw {
  static_assert(AW == 4 || AW == 16, "cp.async of 4 or 16 bytes");
  static constexpr int KR = F::UNIT_W > TC_BK ? F::UNIT_W : TC_BK;  // raw columns a stage
  static constexpr int RSTEPS = KR / TC_BK;                         // steps a raw stage feeds
  static constexpr bool AUX = !is_void<typename F::Scale>::value;
  static constexpr int AUX_ELEMS = KR / F::SUB;                     // most groups a stage covers (SUB: the smallest group)
  static constexpr int DATA_BYTES = KR / F::UNIT_W * F::UNIT_BYTES; // a row's packed bytes a stage
  // Storage units of whole 16-byte words: every row's stage starts 16-aligned
  // (tensors are) and is whole words, so staging needs no head or tail.
  static constexpr bool ALIGNED = F::UNIT_BYTES % 16 == 0;
  // A row's data in its raw stage: exactly its bytes when ALIGNED, else the
  // 16-byte words that cover them (= stage_room).
  static constexpr int ROOM_DATA = ALIGNED ? DATA_BYTES : (DATA_BYTES + 30) & ~15;
  // Scales and biases land at their address modulo AW: with AW = 4
  // (cp.async.ca of 4 bytes) an element of 2 bytes may start 2 bytes into
  // its first word, and each gets a multiple of 8 bytes; with AW = 16
  // (cp.async.cg) each gets the 16-byte words that cover it. Both together
  // are whole 16-byte units.
  static constexpr int AUX_WORD = AW;
  static constexpr int AUX_SIZE = AUX ? (int)sizeof(typename aux_t<F>::type) : 4;
  static constexpr int AUX_BYTES = AUX ? AUX_ELEMS * AUX_SIZE : 0;
  static constexpr int ROOM_AUX = !AUX ? 0 : AW == 4 ? ((4 - AUX_SIZE % 4) % 4 + AUX_BYTES + 7) & ~7 : (AUX_BYTES + 30) & ~15;
  static constexpr int PITCH = (ROOM_DATA + 2 * ROOM_AUX) | 16;     // a staged row: odd 16-byte units
  static constexpr int WORDS = (ROOM_DATA - 16) / 16 + 1;           // most 16-byte words a row's data takes
  static_assert((ROOM_DATA + 2 * ROOM_AUX) % 16 == 0, "raw rows of whole 16-byte units");
  static constexpr int BYTES = TC_BROWS * PITCH;                    // a raw stage
  static_assert(F::CHUNK <= 32 && 32 % F::CHUNK == 0, "a slice is whole chunks");
};
static_assert(TC_STAGERS == 2 * TC_BROWS && TC_BK == 64, "two threads a weight row, 32 columns each");

// Blocks an SM holds by shared memory: 228 KB, 1 KB reserved a block.
__host__ __device__ constexpr int tc_blocks_for(int smem) { return 233472 / (smem + 1024); }

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
  u32 cb;  // the tile's column block (output columns cb·BN ..)
};

// TcParams::p flag: tiles in row-tile order (a row tile's column blocks
// side by side), the order before b6660b6 (2026-11-30), for A/B runs
// (tc_gemm.rs `order_flag`). Without it an expert's row tiles run side by side for
// each of its column blocks (expert_order): a column block's weights are
// read from DRAM once for all of the expert's rows, where in row-tile
// order a row tile's sweep over an expert larger than L2 (Mixtral's 235 MB
// of gate/up, bf16) evicted them before the next row tile came.
constexpr u32 TC_BY_ROW = 1u << 17;

// Tile `t` of the list of (row tile, column block) pairs, `cols` column
// blocks a row tile, whose row tiles run from `at` (its expert's first) to
// at + ne − 1: the expert's tiles t = at·cols .. (at + ne)·cols − 1 walk its
// column blocks, each for all of its row tiles — or, with TC_BY_ROW, row
// tile t / cols, column block t % cols. The expert owning row tile t / cols
// is the one owning tile t either way.
__device__ __forceinline__ void expert_order(u32 t, u32 cols, u32 at, u32 ne, bool by_row, u32& mt, u32& cb) {
  if (by_row) {
    mt = t / cols;
    cb = t % cols;
  } else {
    const u32 local = t - at * cols;
    cb = local / ne;
    mt = at + local % ne;
  }
}

// Stores wgmma accumulators whose M side is the tile's 128 weight rows
// (weight row R = 16·warp + lane / 4, and R + 8) and whose N side is its BM
// rows (d[4j + 2h + c]: weight row R + 8h, tile row 8j + 2(lane % 4) + c)
// into out rows tile.row0 + …, output column n at col_at(n). P = 1: one
// column a weight row; P = 2, 3: rows R and R + 8 are the two sources of
// column 8·(R / 16) + R % 8 (tile_row), combined as SwiGLU (GLU: p.glu's
// activation and biases) or as a sum. The instances without GLU hold none
// of its code: inlined beside SwiGLU it took the 128-row tc_ra instances
// from 182 to 192 registers and qwen3 T = 4096 from 1.09 to 1.14 ms (H200).
// PARTS: the instance may run with TC_PARTS (tc_gemm's dense single-expert
// GEMMs), whose f32 partial products it then stores instead.
template <typename T, int P, int BM, bool GLU, bool PARTS = false, typename ColAt>
__device__ __forceinline__ void wg_store(const TcParams& p, const TcTile& tile, u32 n0, const float (&wacc)[BM / 2],
                                         const ColAt& col_at) {
  T* out = static_cast<T*>(p.out);
  const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3u;
  const u32 R = warp * 16 + g;
  // f(r, j, c) for each tile row r = 8j + 2·(lane % 4) + c of this thread
  // that lies inside the tile.
  auto each_row = [&](auto f) {
#pragma unroll
    for (int j = 0; j < BM / 8; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const u32 r = 8 * j + 2 * t4 + c;
        if (r < tile.rows) f(r, j, c);
      }
  };
  if constexpr (PARTS && (P == 1 || P == 3)) {
    if ((p.p & TC_PARTS) != 0) {
      // K part blockIdx.z's f32 partial products (hi and lo summed: P = 3).
      float* part = static_cast<float*>(p.out) + (u64)blockIdx.z * p.m * p.n;
      const u32 n = P == 1 ? n0 + R : n0 + ((R >> 4) << 3) + (R & 7);
      each_row([&](u32 r, int j, int c) {
        float* orow = part + (u64)(tile.row0 + r) * p.n;
        if constexpr (P == 1) {
#pragma unroll
          for (int h = 0; h < 2; ++h)
            if (n + 8 * h < p.n) orow[n + 8 * h] = wacc[4 * j + 2 * h + c];
        } else {
          if (n < p.n) orow[n] = wacc[4 * j + c] + wacc[4 * j + 2 + c];
        }
      });
      return;
    }
  }
  if constexpr (P == 1) {
    each_row([&](u32 r, int j, int c) {
      T* orow = out + (u64)(tile.row0 + r) * p.n;
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (n0 + R + 8 * h < p.n) orow[col_at(n0 + R + 8 * h)] = from_f32<T>(wacc[4 * j + 2 * h + c]);
    });
  } else {
    // A thread's one output column n (the same for every row it stores).
    const u32 n = n0 + ((R >> 4) << 3) + (R & 7);
    if (n >= p.n) return;
    const u32 at = col_at(n);
    auto store_all = [&](auto combine) {
      each_row([&](u32 r, int j, int c) {
        out[(u64)(tile.row0 + r) * p.n + at] = from_f32<T>(combine(wacc[4 * j + c], wacc[4 * j + 2 + c]));
      });
    };
    if constexpr (P == 3) {
      store_all([](float a, float b) { return a + b; });
    } else if constexpr (!GLU) {
      store_all([](float a, float b) { return silu(a) * b; });
    } else {
      // The column's biases once, then the activation per row.
      const GluCol col = glu_col(p.glu, tile.e, (u64)tile.e * p.n + n);
      store_all([&](float a, float b) { return glu_at(p.glu, col, a, b); });
    }
  }
}

// The tiles of BM rows of this thread's EPT experts threadIdx.x·EPT + i:
// cnt[i] (0 past E, and for experts with bad offsets — not monotone, past M —
// which block 0 reports), and the tiles of all experts before them in expert
// order (an exclusive block scan through `scan`, NT / 32 words; ends with a
// barrier). `each(e, a, b)` sees every expert e < E's offsets a, b.
template <int BM, int NT, int EPT, typename Each>
__device__ __forceinline__ u32 expert_tiles(const TcParams& p, u32 (&cnt)[EPT], u32* scan, const Each& each) {
  const u32* off = p.offsets;
  const u32 E = p.n_experts, e0 = threadIdx.x * EPT;
  u32 local = 0;
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
      each(e, a, b);
    }
    local += cnt[i];
  }
  if (bad && blockIdx.x == 0) report(p.err, ERR_OFFSETS);
  const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  u32 incl = local;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const u32 v = __shfl_up_sync(0xffffffffu, incl, o);
    if ((int)lane >= o) incl += v;
  }
  if (lane == 31) scan[warp] = incl;
  __syncthreads();
  u32 before = incl - local;
  for (u32 w = 0; w < warp; ++w) before += scan[w];
  return before;
}

// Finds this block's tile, with all NT threads of the block: tile
// blockIdx.y · gridDim.x + blockIdx.x of the (row tile, column block) list
// in expert_order, row tiles being every expert's ⌈rows / BM⌉ (expert
// order) and gridDim.x the column blocks. Bad
// offsets (not monotone, past M) give their experts no tiles and are
// reported; so every row a tile names is < M. `scan`: NT / 32 + 4 words.
template <int BM, int NT>
__device__ __forceinline__ TcTile find_tile(const TcParams& p, u32* scan) {
  static_assert(NT % 32 == 0 && NT >= 256, "whole warps, 4 experts a thread cover E <= 1024");
  constexpr u32 W = NT / 32, AT = W;  // scan[AT .. AT + 3]: the found tile
  const u32 mq = blockIdx.y;  // the row tile whose expert owns the block's tile (expert_order)
  TcTile t;
  if (p.offsets == nullptr) {
    t.e = 0;
    t.row0 = mq * BM;
    t.rows = t.row0 < p.m ? min((u32)BM, p.m - t.row0) : 0;
    t.cb = blockIdx.x;
    return t;
  }
  const u32* off = p.offsets;
  constexpr u32 EPT = 4;  // experts per thread: E ≤ 1024 (ops::sort)
  const u32 e0 = threadIdx.x * EPT;
  u32 cnt[EPT];
  if (threadIdx.x == 0) {
    scan[AT] = TC_NONE;  // ordered by expert_tiles' barrier
    scan[AT + 3] = 0;
  }
  const u32 before = expert_tiles<BM, NT, EPT>(p, cnt, scan, [](u32, u32, u32) {});
  u32 local = 0;
#pragma unroll
  for (u32 i = 0; i < EPT; ++i) local += cnt[i];
  if (mq >= before && mq < before + local) {
    u32 at = before;
#pragma unroll
    for (u32 i = 0; i < EPT; ++i) {
      if (mq >= at && mq < at + cnt[i]) {
        const u32 e = e0 + i;
        u32 mt, cb;
        expert_order(blockIdx.y * gridDim.x + blockIdx.x, gridDim.x, at, cnt[i], (p.p & TC_BY_ROW) != 0, mt, cb);
        const u32 row0 = off[e] + (mt - at) * BM;
        scan[AT] = e;
        scan[AT + 1] = row0;
        scan[AT + 2] = min((u32)BM, off[e + 1] - row0);
        scan[AT + 3] = cb;
      }
      at += cnt[i];
    }
  }
  __syncthreads();
  t.e = scan[AT];
  t.row0 = scan[AT + 1];
  t.rows = t.e == TC_NONE ? 0 : scan[AT + 2];
  t.cb = scan[AT + 3];
  return t;
}

// x row of each of the tile's BM rows (null: none), into `arow`, with all
// NT threads (the caller synchronizes before reading it).
template <typename T, int BM, int NT>
__device__ __forceinline__ void tile_rows_of_x(const TcParams& p, const TcTile& tile, const T** arow) {
  const T* x = static_cast<const T*>(p.x);
  for (u32 i = threadIdx.x; i < BM; i += NT) {
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
}

// One of the 256 staging threads (tid < 256): weight row `r` of the tile
// (tid / 2 in the warp-pair order below) and its half `h` of each step's 64
// columns; unit `a_u` of the A rows tid / 8 + 32c.
//
// Rows 16w .. 16w + 15 belong to warp w, halves by bit 4 of the lane: a
// quarter-warp (8 threads) reads 8 consecutive rows' staged bytes at the
// same offset, distinct banks as the pitch is an odd number of 16-byte units.
template <typename F, typename T, int P, int BM, typename R = TcRaw<F>>
struct TcStager {
  static constexpr int A_PER = (BM * 8 + TC_STAGERS - 1) / TC_STAGERS;  // A units a thread copies a step
  static constexpr int B_PER = TC_BROWS * 8 / TC_STAGERS;              // dense B units a thread copies a step
  u32 r, h, a_u, a_sw, n_steps;
  const u8* data;  // the row's packed bytes
  const u8* aux;   // its scales (h = 0) or biases (h = 1), affine only
  u32 valid;       // the row is inside N (0 or 1, pinned)
  // Sources of the thread's A (and, dense weights of type T, B) copies,
  // held in registers from `bind` on: unit a_u of rows tid / 8 + 32c
  // (null: no row). Read once a tile, not from shared memory every step.
  const u8* asrc[A_PER];
  const u8* bsrc[TcDirect<F, T>::value ? B_PER : 1];
  u32 put_at[4];  // unit u of the thread's slice in a B tile

  __device__ __forceinline__ void init(const TcParams& p, const TcTile& tile, u32 n0, u32 tid) {
    r = (tid & 15) | ((tid >> 5) << 4);
    h = (tid >> 4) & 1;
    a_u = tid & 7;
    a_sw = swz(tid >> 3, a_u);  // + 32c rows = + 4096c bytes, same swizzle
    n_steps = (p.k + TC_BK - 1) / TC_BK;
    const u32 rb = p.k / F::UNIT_W * F::UNIT_BYTES;  // bytes of a weight row
    const u32 ab = R::AUX ? (p.k >> p.group_shift) * (u32)sizeof(typename aux_t<F>::type) : 0;
    u32 q, c;
    tile_row<P>(r, q, c);
    const u32 n = n0 + c;
    const WeightSrc& s = p.src[q];
    valid = pin(n < p.n ? 1u : 0u);
    const u64 row = (u64)tile.e * s.rows + s.row_offset + n;
    data = pin(s.data + row * rb);
    aux = R::AUX ? pin((h ? s.biases : s.scales) + row * ab) : nullptr;
    r = pin(r);
    h = pin(h);
    a_u = pin(a_u);
    a_sw = pin(a_sw);
#pragma unroll
    for (int u = 0; u < 4; ++u) put_at[u] = pin(swz(r, 4 * h + u));
  }

  // Takes the A rows' (and dense weight rows') sources into registers:
  // `arow` (each A row's x row, null: none) and `wrow` (direct: each weight
  // row, null past N) are complete (the caller synchronized).
  __device__ __forceinline__ void bind(const T* const* arow, const u8* const* wrow) {
#pragma unroll
    for (int c = 0; c < A_PER; ++c) {
      const u32 rr = (threadIdx.x >> 3) + 32 * c;
      const T* a = (BM * 8) % TC_STAGERS == 0 || rr < (u32)BM ? arow[rr] : nullptr;
      asrc[c] = pin(a != nullptr ? reinterpret_cast<const u8*>(a + 8 * a_u) : nullptr);
    }
    if constexpr (TcDirect<F, T>::value) {
#pragma unroll
      for (int c = 0; c < B_PER; ++c) {
        const u8* w = wrow[(threadIdx.x >> 3) + 32 * c];
        bsrc[c] = pin(w != nullptr ? w + 8 * a_u * sizeof(T) : nullptr);
      }
    }
  }

  // A tile of step j (BM × 64 of T) into `a_stage`: the thread's units.
  __device__ __forceinline__ void issue_a(const TcParams& p, u32 j, u8* a_stage) const {
    const u32 k0 = j * TC_BK;
    const bool k_ok = k0 + 8 * a_u < p.k;
    const u64 off = (u64)k0 * sizeof(T);
    u8* a_dst = a_stage + a_sw;
#pragma unroll
    for (int c = 0; c < A_PER; ++c) {
      // row tid / 8 + 32c's unit a_u; its rows & 7 is the thread's
      if ((BM * 8) % TC_STAGERS == 0 || (threadIdx.x >> 3) + 32 * c < (u32)BM) {
        const bool ok = asrc[c] != nullptr && k_ok;
        cp_async16(a_dst + 4096 * c, ok ? asrc[c] + off : p.x, ok ? 16u : 0u);
      }
    }
  }

  // Dense weights of type T, step j, straight into `b_stage` like A: unit a_u
  // of weight rows tid / 8 + 32c.
  __device__ __forceinline__ void issue_b(const TcParams& p, u32 j, u8* b_stage) const {
    const u32 k0 = j * TC_BK;
    const bool k_ok = k0 + 8 * a_u < p.k;
    const u64 off = (u64)k0 * sizeof(T);
    u8* b_dst = b_stage + a_sw;
#pragma unroll
    for (int c = 0; c < B_PER; ++c) {
      const bool ok = bsrc[c] != nullptr && k_ok;
      cp_async16(b_dst + 4096 * c, ok ? bsrc[c] + off : p.x, ok ? 16u : 0u);
    }
  }

  // dbytes of the row's packed bytes at src (16-aligned when ALIGNED) into
  // the row's raw stage place dst, the words of this thread's half.
  __device__ __forceinline__ void copy_data(const u8* src, u8* dst, u32 dbytes) const {
    if constexpr (R::ALIGNED) {
#pragma unroll
      for (int c = 0; c < (R::DATA_BYTES / 16 + 1) / 2; ++c) {
        const u32 w = h + 2 * c;
        if (16u * w < dbytes) cp_async16(dst + 16u * w, src + 16u * w, 16u);
      }
    } else {
      const u32 head = (u32)(reinterpret_cast<u64>(src) & 15u), end = head + dbytes;
#pragma unroll
      for (int c = 0; c < (R::WORDS + 1) / 2; ++c) {
        const u32 w = h + 2 * c;
        if (16u * w < end) cp_async16(dst + 16u * w, src - head + 16u * w, end - 16u * w >= 16u ? 16u : end - 16u * w);
      }
    }
  }

  // The raw stage that step j starts, if it starts one, into the row's place
  // `dst` of its raw stage buffer.
  __device__ __forceinline__ void issue_raw(const TcParams& p, u32 j, u8* dst) const {
    if (j >= n_steps || j % R::RSTEPS != 0 || !valid) return;
    const u32 kr0 = j * TC_BK;  // = raw stage start (a multiple of KR)
    const u32 kr1 = min(kr0 + (u32)R::KR, p.k);
    const u8* src = data + kr0 / F::UNIT_W * F::UNIT_BYTES;
    // A whole stage (every stage but a ragged last one) copies a constant
    // number of bytes: the word predicates fold.
    if (kr1 - kr0 == (u32)R::KR) copy_data(src, dst, (u32)R::DATA_BYTES);
    else copy_data(src, dst, (kr1 - kr0) / F::UNIT_W * F::UNIT_BYTES);
    if constexpr (R::AUX) {
      typedef typename aux_t<F>::type S;
      const u32 g0 = kr0 >> p.group_shift, g1 = ((kr1 - 1) >> p.group_shift) + 1;
      const u8* xs = aux + g0 * sizeof(S);
      constexpr u32 AW = R::AUX_WORD;
      const u32 ahead = (u32)(reinterpret_cast<u64>(xs) & (AW - 1)), aend = ahead + (g1 - g0) * (u32)sizeof(S);
      u8* adst = dst + R::ROOM_DATA + h * R::ROOM_AUX;
#pragma unroll
      for (int w = 0; w < R::ROOM_AUX / (int)AW; ++w) {
        if (AW * w >= aend) continue;
        const u32 n = aend - AW * w >= AW ? AW : aend - AW * w;
        if constexpr (AW == 4) cp_async4(adst + AW * w, xs - ahead + AW * w, n);
        else cp_async16(adst + AW * w, xs - ahead + AW * w, n);
      }
    }
  }

  // This thread's slice of step j in its row's place `base` of the raw stage
  // holding step j. Scales and biases share their misalignment (both tensors
  // start 16-byte aligned, same row layout).
  __device__ __forceinline__ TcSlice slice(const TcParams& p, u32 j, const u8* base) const {
    TcSlice s;
    const u32 kr0 = j / R::RSTEPS * R::KR;
    s.col = j % R::RSTEPS * TC_BK + 32u * h;
    const u32 kc = kr0 + s.col;
    s.cols = valid && kc < p.k ? min(32u, p.k - kc) : 0u;
    s.data = base;
    if constexpr (!R::ALIGNED) s.data += (u32)(reinterpret_cast<u64>(data + kr0 / F::UNIT_W * F::UNIT_BYTES) & 15u);
    s.scales = s.biases = nullptr;
    if constexpr (R::AUX) {
      typedef typename aux_t<F>::type S;
      const u32 ahead = (u32)(reinterpret_cast<u64>(aux + (kr0 >> p.group_shift) * sizeof(S)) & (R::AUX_WORD - 1));
      s.scales = base + R::ROOM_DATA + ahead;
      s.biases = base + R::ROOM_DATA + R::ROOM_AUX + ahead;
    }
    s.kr = R::KR;
    s.group_shift = p.group_shift;
    s.lo = P == 3 && ((r >> 3) & 1);
    return s;
  }

  // Unit u (8 weights) of this thread's slice into the B tile `b_stage`.
  __device__ __forceinline__ void put(u8* b_stage, int u, uint4 v) const {
    *reinterpret_cast<uint4*>(b_stage + put_at[u]) = v;
  }
};

}  // namespace moekit
