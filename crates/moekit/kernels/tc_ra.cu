// tc_ra.cu — the grouped expert GEMM of tc_gemm.cu (same parameters, rows,
// tiles and outputs: P = 1 plain, P = 2 gate and up with SwiGLU) on sm_90a
// with the weights decoded straight into registers as wgmma's A operand:
// no shared-memory round trip for the weights at all.
//
// tc_gemm stages each weight row's packed bytes in shared memory, decodes
// them into a shared B tile and multiplies from there: three shared-memory
// passes per weight and one block-wide barrier per 64 columns between them.
// Here lane (g, c) of warp w owns weight rows 16w + g and 16w + g + 8 of the
// block's 128 and, in every span of 128 columns, their 32 columns 32c ..
// 32c + 31 (the decode path's mapping, decode_mma.cuh): it loads them from
// global memory two spans ahead into its format's decoder (the tile decoders
// of tc_decode.cuh, read from global memory as the decode path does), and
// decodes them into the A fragments of the span's 8 k16 steps, 4 pairs a
// unit of 8 columns as the decoder pairs them (SpanOrder, decode_mma.cuh:
// adjacent columns, or as MLX 4-bit and Q4_K codes unpack, which needs no
// PRMT) — so the
// MMA's logical k order is a permutation of the span's columns, and the
// activations (wgmma's B, the tile's BM rows, staged in shared memory with
// cp.async) must be stored in that order: x permuted once by `ra_permute`
// (and the SwiGLU output written permuted, in the down weights' order, for
// the down projection that reads it). Both operands see the same
// permutation, so each output is the plain dot product, summed in an order
// fixed by K and the format alone (deterministic and batch-invariant, like
// every other path).
//
// Pipeline, per span s (4 B stages, or 3 for 256-row tiles, each BM rows ×
// 128 columns in two 128-byte-swizzled 64-column halves): wait for stage s,
// barrier, issue stage s + 2 (s + 1 with 3 stages); then for each half of
// the span: wait until the wgmma group that last read this half's A
// registers is done, decode the half (4 k16 steps) into them, and issue its
// 4 wgmmas as one group — so one half decodes while the other half's MMAs
// run. The weights of span s + 2 are loaded once span s's are decoded.
//
// 256-row tiles (m64n256k16) decode each weight once for twice the tokens of
// a 128-row tile, and give each span twice the MMA time to hide the
// decoding behind (qwen3-30b-a3b T = 4096, H200: the 128-row kernel kept
// the tensor pipe 40-46% busy, its warps waiting on their dependent
// decoding chains, the weight loads and the span barrier). A tile of fewer
// rows runs at a narrower N (RaWidths: 128 or 32 in a 256-row instance, a
// half or a quarter of BM in 64- and 128-row ones), so an expert's last few
// rows cost a few MMA columns (qwen3-30b-a3b T = 512, H200: experts of
// about 32 rows on 64-row tiles, affine4 284 → 269 µs; Mixtral T = 512
// 1347 → 1228 µs).
//
// Needs K a multiple of 128 (whole spans; tc_ra.rs refuses the rest).
#include "moekit/tc_common.cuh"
#include "moekit/wgmma.cuh"
#include "moekit/decode_mma.cuh"

namespace moekit {

constexpr u32 RA_SPAN = 128;  // = MMA_SPAN: columns a lane group decodes at once
constexpr int RA_THREADS = 256;
constexpr int RA_STAGES = 4;  // B stages: two in flight, one being read, one draining
constexpr u32 RA_PERM_OUT = 256u;  // TcParams::p flag: P = 2 writes its output permuted
constexpr u32 RA_PREFETCH = 512u;  // TcParams::p flag: the block first asks L2 for all of its weight rows
constexpr u32 RA_OUT_ORDER = 10;  // TcParams::p bits 10, 11: the permuted output's SpanOrder
constexpr u32 RA_FULL_N = 4096u;  // TcParams::p flag: every tile runs at N = BM (A/B of RaWidths)
constexpr u32 RA_LOOK = 13;  // TcParams::p bits 13..15: spans beyond the register loads that L2 is asked for (0: none)

// Position of column p (0..127) of a span in the MMA's k order (SpanOrder,
// decode_mma.cuh): p = 32c + 8u + r, r = column span_first(order, i) + h ·
// span_apart(order) of pair i; pair i of unit u is k 2c + 8(i & 1) + h of
// step 2u + (i >> 1).
__host__ __device__ constexpr u32 ra_logical(u32 p, u32 order) {
  const u32 c = p >> 5, u = (p >> 3) & 3u, r = p & 7u;
  const u32 i = order == SPAN_PAIRS ? r >> 1 : order == SPAN_NIBBLES ? r & 3u : (r & 1u) | ((r >> 2) << 1);
  const u32 h = order == SPAN_PAIRS ? r & 1u : order == SPAN_NIBBLES ? r >> 2 : (r >> 1) & 1u;
  return ((2u * u + (i >> 1)) << 4) | ((i & 1u) << 3) | (c << 1) | h;
}
static_assert(ra_logical(32, SPAN_PAIRS) == 2 && ra_logical(4, SPAN_PAIRS) == 16 && ra_logical(2, SPAN_PAIRS) == 8,
              "the pair order (tc_ra.rs mirrors it)");
static_assert(ra_logical(4, SPAN_NIBBLES) == 1 && ra_logical(1, SPAN_NIBBLES) == 8 && ra_logical(2, SPAN_NIBBLES) == 16,
              "the nibble order (tc_ra.rs mirrors it)");
static_assert(ra_logical(2, SPAN_ALTERNATE) == 1 && ra_logical(1, SPAN_ALTERNATE) == 8 &&
                  ra_logical(4, SPAN_ALTERNATE) == 16,
              "the alternate order (tc_ra.rs mirrors it)");

// y[r] = x[r] with each span's columns in the MMA's k order: y[r][s·128 +
// ra_logical(p)] = x[r][s·128 + p]. One thread an 8-column group (16 bytes
// in, the order's four pairs out as 4-byte words). k is a multiple of 128
// (tc_ra.rs checks).
struct RaPermParams {
  const void* x;  // [rows, k] of T
  void* y;        // [rows, k] of T
  u32 rows, k;
  u32 order;      // SpanOrder
  u32 pad;
};
static_assert(sizeof(RaPermParams) == 32, "RaPermParams layout");

// The 8-column group v at span column q, its pairs in order O, into out.
template <u32 O, typename T>
__device__ __forceinline__ void ra_put8(T* out, u32 q, const uint4& v) {
  const uint4 pr = x_pairs<O>(v);
  const u32 w[4] = {pr.x, pr.y, pr.z, pr.w};
#pragma unroll
  for (u32 j = 0; j < 4; ++j) *reinterpret_cast<u32*>(out + ra_logical(q + span_first(O, j), O)) = w[j];
}

template <typename T>
__global__ void __launch_bounds__(256) ra_permute(const __grid_constant__ RaPermParams p) {
  pdl_entry();  // a dependent launch (ops/mod.rs Order::Dependent)
  const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;  // 8-column group
  const u32 groups = p.k / 8;
  if (i >= (u64)p.rows * groups) return;
  const u64 r = i / groups;
  const u32 col = (u32)(i % groups) * 8u, s0 = col & ~(RA_SPAN - 1u), q = col & (RA_SPAN - 1u);
  const uint4 v = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.x) + r * p.k + col);
  T* out = static_cast<T*>(p.y) + r * p.k + s0;
  if (p.order == SPAN_NIBBLES) ra_put8<SPAN_NIBBLES>(out, q, v);
  else if (p.order == SPAN_ALTERNATE) ra_put8<SPAN_ALTERNATE>(out, q, v);
  else ra_put8<SPAN_PAIRS>(out, q, v);
}

// Shared memory of an instance (tc_ra.rs: smem_bytes mirrors it).
template <int BM>
struct RaGeo {
  static constexpr int HALF = BM * 128;       // a 64-column half of a stage
  static constexpr int STAGE = 2 * HALF;
  // B stages: 4 (two in flight, one being read, one draining), or 3 for
  // 256-row tiles (one in flight: 4 would not fit in shared memory; a span
  // of 256 rows runs twice as long, and its copies hit L2).
  static constexpr int STAGES = BM >= 256 ? 3 : RA_STAGES;
  static constexpr int AHEAD = STAGES - 2;                // spans a stage is issued ahead
  static constexpr int SMEM = STAGES * STAGE + 1024;     // + alignment slack (1024: the swizzle atom)
  static constexpr int UNITS = BM * 16 / RA_THREADS;      // 16-byte copies a thread a stage
  // Two blocks an SM where their stages fit (≤ 128 registers a thread;
  // H100, qwen3 T = 512, 64-row tiles: one block of 154-187 registers
  // left the decoding latency exposed), one for 128-row tiles.
  static constexpr int MIN_BLOCKS = BM <= 64 ? 2 : 1;
  static_assert(BM % 16 == 0 && UNITS >= 1, "whole copies a thread");
};

// The wgmma N a tile of `rows` rows runs at in an instance of BM-row tiles:
// the tile's rows rounded up to N3, N2 or N1 = BM, the smallest that holds
// them, so an expert's last tile of a few rows costs a few MMA columns, not
// BM (qwen3-30b-a3b T = 512: experts of about 32 rows on 64-row tiles).
template <int BM> struct RaWidths { static constexpr int N1 = BM, N2 = BM / 2, N3 = BM / 4; };
template <> struct RaWidths<256> { static constexpr int N1 = 256, N2 = 128, N3 = 32; };
// 16- and 32-row tiles run at BM: a narrower N would save little MMA time
// for a third more NVRTC time an instance.
template <> struct RaWidths<32> { static constexpr int N1 = 32, N2 = 32, N3 = 32; };
template <> struct RaWidths<16> { static constexpr int N1 = 16, N2 = 16, N3 = 16; };

template <int N> struct RaN { static constexpr int value = N; };

// Decoders whose units are the very registers their load fills (span()).
template <typename D> struct RaStoredUnits { static constexpr bool value = false; };
template <typename F, typename T> struct RaStoredUnits<TcDecCodes<F, T>> { static constexpr bool value = true; };

// A lane's walk along one weight row, span by span: its slice of span s
// (columns 128s + kc0 .. + 31, kc0 = 32 · (lane % 4)) at fixed strides from
// span 0's, so a span's loads cost a pointer step each rather than
// global_slice's column, group and bounds arithmetic (qwen3 affine4, 16-row
// tiles: 502 → 443 instructions per two spans). Formats of units up to a
// span wide hold whole units a span (the slice starts a unit, or lies at a
// fixed column of one, e.g. NVFP4's 64); 256-wide super-blocks hold a span
// in half a unit (unit s / 2, column 128 (s & 1) + kc0). Affine scales and
// biases start at the slice's group (a slice of 32 never straddles groups of
// 32 .. 128), so the decoder finds its group at column 0. Every slice has
// all 32 columns: K is a multiple of 128, a row past N walks a real row
// (the caller's clamp; its outputs are never stored), and spans past K are
// never asked for. (The decode path keeps global_slice: its K needs only be a
// multiple of 32, and there the cursor measured no fewer instructions.)
template <typename F>
struct RaCursor {
  static_assert(F::UNIT_W <= 32 ? 32 % F::UNIT_W == 0 : F::UNIT_W % 32 == 0 && (F::UNIT_W <= 128 || F::UNIT_W == 256),
                "units that tile a span");
  static constexpr bool WIDE = F::UNIT_W > (int)RA_SPAN;  // half a unit a span
  static constexpr u32 SPAN_BYTES = WIDE ? 0u : RA_SPAN / F::UNIT_W * F::UNIT_BYTES;
  const u8* data;
  const u8* scales;
  const u8* biases;
  u32 col, kr, group_shift, aux_step;
  __device__ __forceinline__ void init(const QRow& r, u32 kc0) {
    group_shift = r.group_shift;
    if constexpr (WIDE) {
      data = r.data;
      col = kc0;
      kr = F::UNIT_W;
    } else {
      data = r.data + kc0 / F::UNIT_W * F::UNIT_BYTES;
      col = F::UNIT_W > 32 ? kc0 % F::UNIT_W : 0u;
      kr = F::UNIT_W > 32 ? (u32)F::UNIT_W : r.k;
    }
    scales = biases = nullptr;
    aux_step = 0;
    if constexpr (!is_void<typename F::Scale>::value) {
      typedef typename F::Scale S;
      scales = r.scales + (kc0 >> r.group_shift) * sizeof(S);
      biases = r.biases + (kc0 >> r.group_shift) * sizeof(S);
      aux_step = (RA_SPAN >> r.group_shift) * (u32)sizeof(S);
    }
  }
  __device__ __forceinline__ TcSlice at(u32 s) const {
    TcSlice t;
    if constexpr (WIDE) {
      t.data = data + (u64)(s >> 1) * F::UNIT_BYTES;
      t.col = col + ((s & 1u) << 7);
    } else {
      t.data = data + (u64)s * SPAN_BYTES;
      t.col = col;
    }
    t.scales = scales + (u64)s * aux_step;
    t.biases = biases + (u64)s * aux_step;
    t.cols = 32;
    t.kr = kr;
    t.group_shift = group_shift;
    t.lo = false;
    return t;
  }
};

template <typename F, typename T, int P, int BM, bool GLU = false>
__global__ void __launch_bounds__(RA_THREADS, RaGeo<BM>::MIN_BLOCKS) tc_ra(const __grid_constant__ TcParams p) {
  pdl_entry();  // a dependent launch (ops/mod.rs Order::Dependent)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  typedef RaGeo<BM> G;
  typedef typename DecOf<F, T>::type Dec;
  extern __shared__ __align__(128) u8 smem[];
  __shared__ u32 scan[RA_THREADS / 32 + 4];
  __shared__ const T* arow[BM];
  {
    u32 dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < (u32)G::SMEM || (p.p & 0xFFu) != (u32)P || (p.p & TC_PARTS) != 0 || p.k % RA_SPAN != 0) {
      if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) report(p.err, ERR_CONFIG);
      return;
    }
  }
  const TcTile tile = find_tile<BM, RA_THREADS>(p, scan);
  if (tile.rows == 0) return;
  tile_rows_of_x<T, BM, RA_THREADS>(p, tile, arow);
  __syncthreads();

  u8* const b_sm = smem + ((1024u - (smem_addr(smem) & 1023u)) & 1023u);
  const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
  static_assert(P == 1 || P == 2, "one source, or gate and up");
  static_assert(!GLU || P == 2, "GLU: the general activation of gate and up");
  constexpr u32 BN = P == 1 ? TC_BROWS : TC_BROWS / 2;
  const u32 n0 = tile.cb * BN;
  const u32 n_spans = p.k / RA_SPAN;
  if ((p.p & RA_PREFETCH) != 0 && tid == 0 && n0 < p.n) {
    // Every span's weight bytes requested at once (the lanes' loads, two
    // spans ahead, then mostly hit L2 or merge with these).
#pragma unroll
    for (int q = 0; q < P; ++q) {
      const WeightSrc& s = p.src[q];
      l2_prefetch_rows<F>(s.data, s.scales, s.biases, (u64)tile.e * s.rows + s.row_offset + n0, min(BN, p.n - n0), p.k,
                          p.group_shift);
    }
  }

  // B copies: unit u of half h of rows r0 + 16i, i < UNITS; each source as
  // 16-byte words from x (32 bits: half the registers of a pointer, which
  // 256-row tiles need; x is below 64 GiB, tc_gemm.rs checks).
  const u32 cu = tid & 7u, ch = (tid >> 3) & 1u, cr = tid >> 4;
  const u8* const xb = static_cast<const u8*>(p.x);
  u32 bsrc[G::UNITS];
#pragma unroll
  for (int i = 0; i < G::UNITS; ++i) {
    const T* a = arow[cr + 16 * i];
    bsrc[i] = pin(a != nullptr ? (u32)((reinterpret_cast<const u8*>(a + 64 * ch + 8 * cu) - xb) >> 4) : TC_NONE);
  }
  const u32 b_dst = pin(ch * G::HALF + swz(cr, cu));

  // The lane's two weight rows (R = 16w + g, R + 8), walked span by span
  // (a row past N walks the tile's first row: its outputs are not stored).
  RaCursor<F> rows[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    u32 q, col;
    tile_row<P>(warp * 16 + (lane >> 2) + 8 * h, q, col);
    const u32 n = n0 + col;
    const WeightSrc& s = p.src[q];
    rows[h].init(make_row<F>(s.data, s.scales, s.biases, (u64)tile.e * s.rows + s.row_offset + (n < p.n ? n : n0),
                             p.k, p.group_shift),
                 32u * (lane & 3u));
  }
  // Decoders of span s. Past K the loop never decodes them, but they still
  // load (span s − 2 again, of the same parity, so that 256-wide
  // super-blocks keep their half known): unconditional loads are issued
  // early in the span, where a branch around them kept the compiler from
  // hoisting them (Q4_K's scales then waited for their loads at once:
  // T = 64 +5%).
  auto load_w = [&](Dec (&d)[2], u32 s) {
    const u32 sc = s < n_spans ? s : s >= 2 ? s - 2 : 0u;
#pragma unroll
    for (int h = 0; h < 2; ++h) d[h].load(rows[h].at(sc));
  };
  // Lookahead: a lane asks L2 for its weight slices `look` spans beyond the
  // two its registers hold (prefetch.global.L2: no registers, no wait), so
  // more weight bytes are in flight than two spans of decoders carry.
  const u32 look = (p.p >> RA_LOOK) & 7u;
  auto prefetch_w = [&](u32 s) {
    if (s >= n_spans) return;
#pragma unroll
    for (int h = 0; h < 2; ++h) prefetch_l2(rows[h].at(s).data);
  };
  const u32 b_base = pin(smem_addr(b_sm));

  // The pipeline and the store at wgmma N = NN (≤ BM): the tile's rows
  // below NN are copied and multiplied.
  auto run = [&](auto nn) {
    constexpr int NN = decltype(nn)::value;
    // The copies of span s (the tile's first NN rows) as one copy group.
    auto issue_b = [&](u32 s) {
      if (s < n_spans) {
        u8* st = b_sm + (s % G::STAGES) * G::STAGE + b_dst;
        const u64 off = (u64)s * RA_SPAN * sizeof(T);
#pragma unroll
        for (int i = 0; i < G::UNITS; ++i)
          if (NN == BM || cr + 16 * i < (u32)NN)
            cp_async16(st + 16 * 128 * i, bsrc[i] != TC_NONE ? xb + 16ull * bsrc[i] + off : xb,
                       bsrc[i] != TC_NONE ? 16u : 0u);
      }
      cp_async_commit();
    };

    float acc[NN / 2];
#pragma unroll
    for (int i = 0; i < NN / 2; ++i) acc[i] = 0.f;
    u32 fa[2][4][4];  // A fragments of the span's halves: [half][k16 step][reg]

    // Half `hf` of span s from decoders d: wait for the group that last read
    // fa[hf], decode units 2hf, 2hf + 1 into it, issue its 4 wgmmas.
    auto half = [&](const Dec (&d)[2], u32 s, int hf) {
      wg_wait<1>();
      wg_keep(acc);
#pragma unroll
      for (int uu = 0; uu < 2; ++uu) {
        const int u = 2 * hf + uu;
        const uint4 a0 = span_unit(d[0], u), a1 = span_unit(d[1], u);
        // Steps 2u, 2u + 1: pairs (x, y) and (z, w) of the unit, rows g, g + 8.
        u32* f0 = fa[hf][2 * uu];
        u32* f1 = fa[hf][2 * uu + 1];
        f0[0] = a0.x; f0[1] = a1.x; f0[2] = a0.y; f0[3] = a1.y;
        f1[0] = a0.z; f1[1] = a1.z; f1[2] = a0.w; f1[3] = a1.w;
      }
      wg_fence();
      const u64 db = wg_desc(b_base + (s % G::STAGES) * G::STAGE + hf * G::HALF);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) WgmmaRA<T, NN>::run(acc, fa[hf][kk], db + 2 * kk);
      wg_commit();
      wg_keep(acc);
    };
    // Span s: stage s landed and every warp is past span s − 1's barrier
    // (span s − 2's groups are done: each half waited for them), so stage
    // s + AHEAD's buffer ((s − 2) % STAGES) is free.
    auto span = [&](Dec (&d)[2], u32 s) {
      cp_async_wait<G::AHEAD - 1>();
      fence_async_smem();
      __syncthreads();
      issue_b(s + G::AHEAD);
      half(d, s, 0);
      half(d, s, 1);
      // A decoder whose units are the registers it loads (the generic one)
      // hands wgmma those registers themselves: its next load must wait for
      // this span's groups, which read them asynchronously (overwriting
      // them under a group in flight gave NaNs). Decoders that compute
      // their units hand wgmma fresh registers, which ptxas keeps until the
      // wait that retires them.
      if constexpr (RaStoredUnits<Dec>::value) {
        wg_wait<0>();
        wg_keep(acc);
      }
      load_w(d, s + 2);
      if (look != 0) prefetch_w(s + 2 + look);
    };

#pragma unroll
    for (u32 s = 0; s < (u32)G::AHEAD; ++s) issue_b(s);
    Dec d0[2], d1[2];
    load_w(d0, 0);
    load_w(d1, 1);
    for (u32 j = 2; j < 2 + look; ++j) prefetch_w(j);
    for (u32 s = 0; s < n_spans; s += 2) {
      span(d0, s);
      if (s + 1 < n_spans) span(d1, s + 1);
    }
    wg_wait<0>();
    wg_keep(acc);
    cp_async_wait<0>();

    const bool perm = P == 2 && (p.p & RA_PERM_OUT) != 0;
    const u32 order = (p.p >> RA_OUT_ORDER) & 3u;
    wg_store<T, P, NN, GLU>(p, tile, n0, acc, [perm, order](u32 n) {
      return perm ? (n & ~(RA_SPAN - 1u)) | ra_logical(n & (RA_SPAN - 1u), order) : n;
    });
  };
  typedef RaWidths<BM> W;
  if constexpr (W::N1 == W::N3) {
    run(RaN<BM>{});
  } else {
    if (tile.rows > (u32)W::N2 || (p.p & RA_FULL_N) != 0) run(RaN<W::N1>{});
    else if (tile.rows > (u32)W::N3) run(RaN<W::N2>{});
    else run(RaN<W::N3>{});
  }
#else
  if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) report(p.err, ERR_CONFIG);
#endif
}

}  // namespace moekit
