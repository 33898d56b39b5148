// decode_fused.cuh — one token's gate/up and down in one launch (sm_90;
// included at the end of decode.cu, whose pieces it reuses).
//
// decode_fused_mma<F, T> runs decode_gate_up_mma's grid for T = 1 with
// fold_route and a rule that selects on the logits (select_expert): grid
// rows are the k chosen experts, the shared expert and the publishing
// block. Each expert block also owns a contiguous run of down's 16-row
// tiles of its expert (tiles ⌊x·n/X⌋ .. ⌊(x + 1)·n/X⌋ of n = ⌈H/16⌉,
// X = gridDim.x), so down needs no launch of its own and its weights stream
// while gate/up's do:
//   1. once the block knows its expert, one warp asks the copy engine for
//      the block's down rows (cp.async.bulk into shared memory, completing
//      on an mbarrier) and L2 for their scales;
//   2. the gate/up tiles exactly as decode_gate_up_mma (gate_up_tiles) →
//      act rows; then the block adds one to its grid row's arrival word
//      (release);
//   3. it waits until all X blocks of its row have arrived (acquire), then
//      multiplies its down tiles — weights from the copied rows, act rows
//      read through L2 — in decode_down_mma's order of products and sums
//      (mma_group, the same split of K: the same bits) → y;
//   4. per tile a ticket: the last of the k (+ shared) rows to arrive
//      combines the tile for the token, as decode_down_mma does, once the
//      publishing block's routing (weights, ids) is visible.
// Blocks wait on other blocks of the launch, so the host launches it only
// when the whole grid fits the GPU at once (decode_fused.rs `fused_smem`).
// The flag words (p.flags, FUSED_FLAGS of them, zero between launches) are
// reset by the last expert block to finish, the tile tickets by their
// combining blocks, so CUDA-graph replays start from zero.
#pragma once
#include "moekit/mbar.cuh"
#include "moekit/tc_common.cuh"

namespace moekit {

constexpr u32 FUSED_ROWS = 64;                 // grid rows whose arrivals p.flags holds
constexpr u32 FUSED_PUBLISHED = FUSED_ROWS;    // the publishing block's routing is visible
constexpr u32 FUSED_DONE = FUSED_ROWS + 1;     // expert blocks finished
constexpr u32 FUSED_FLAGS = FUSED_ROWS + 2;    // words of p.flags (decode_fused.rs FUSED_FLAGS)

// Decoders that read their weights through the read-only path (__ldg),
// which shared memory cannot be: the host never fuses such formats.
template <typename D> struct LoadsReadOnly { static constexpr bool value = false; };
template <typename T> struct LoadsReadOnly<DecSame<T>> { static constexpr bool value = true; };

__device__ __forceinline__ u32 ld_acquire_gpu(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void add_release_gpu(u32* p, u32 v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// Thread 0 waits until *p ≥ target (acquire), then the block's barrier.
__device__ __forceinline__ void block_wait_flag(const u32* p, u32 target) {
  if (threadIdx.x == 0)
    while (ld_acquire_gpu(p) < target) __nanosleep(32);
  __syncthreads();
}

// Which of down's 16-row tiles block x of X owns (a contiguous run).
struct FusedTiles {
  u32 t0, t1, r0, r1;  // tiles [t0, t1), rows [r0, r1) (r1 ≤ H)
  __device__ __forceinline__ FusedTiles(u32 H, u32 x, u32 X) {
    const u32 n = (H + MMA_TILE - 1) / MMA_TILE;
    t0 = (u32)((u64)x * n / X);
    t1 = (u32)((u64)(x + 1) * n / X);
    r0 = t0 * MMA_TILE;
    r1 = min(t1 * MMA_TILE, H);
  }
};

// The copy of [src, src + n) a fused block keeps in shared memory starts
// at the 16-byte word holding src's first byte, so every byte keeps its
// offset within 16 (the decoders' loads stay as aligned as in global
// memory): bulk copies of the whole words (up to FUSED_PIECE bytes each),
// then the bytes after the last whole word by plain loads.
constexpr u32 FUSED_PIECE = 8192;
__device__ __forceinline__ const u8* word_below(const u8* p) { return reinterpret_cast<const u8*>(reinterpret_cast<u64>(p) & ~15ull); }
// Bytes of the whole words (the bulk part) of such a copy.
__device__ __forceinline__ u32 copy_words(const u8* src, u64 n) { return (u32)(word_below(src + n) - word_below(src)); }
// Lane `lane` of a warp's share of the copy into sm (bulk copies on bar).
__device__ __forceinline__ void copy_range(u8* sm, const u8* src, u64 n, u32 bar, u32 lane) {
  const u8* a0 = word_below(src);
  const u32 words = copy_words(src, n);
  for (u32 off = lane * FUSED_PIECE; off < words; off += 32 * FUSED_PIECE)
    bulk_copy(smem_addr(sm) + off, a0 + off, min(FUSED_PIECE, words - off), bar);
  for (u32 i = words + lane; a0 + i < src + n; i += 32) sm[i] = a0[i];
}
// Where byte `off` of a range copied by copy_range from src lies in sm.
__device__ __forceinline__ const u8* copied(const u8* sm, const u8* src, u64 off) {
  return sm + (reinterpret_cast<u64>(src) & 15u) + off;
}

// A fused block's shared memory for its run of down rows (FusedTiles):
// the rows' packed bytes, (affine) their scales and biases, then the act
// rows of its token (K of T). Every part is sized for the longest run
// (⌈n / X⌉ tiles), each copy with 16 bytes of slack for its start (the
// host's fused_smem is the same sum for the widest rows).
template <typename F, typename T>
struct FusedSmem {
  u32 rows_max;
  u64 row_bytes, aux_bytes;  // a row's packed bytes, and its scales' (0 without)
  u8 *w, *s, *b, *x;
  __device__ __forceinline__ FusedSmem(u8* base, const DecodeW& D, u32 H, u32 X) {
    rows_max = (H / MMA_TILE + X - 1) / X * MMA_TILE;
    row_bytes = (u64)D.k / F::UNIT_W * F::UNIT_BYTES;
    if constexpr (is_void<typename F::Scale>::value) aux_bytes = 0;
    else aux_bytes = (u64)(D.k >> D.group_shift) * sizeof(typename F::Scale);
    const auto room = [](u64 n) { return (n + 16 + 15) & ~15ull; };
    w = base;
    s = w + room(rows_max * row_bytes);
    b = s + (aux_bytes ? room(rows_max * aux_bytes) : 0);
    x = b + (aux_bytes ? room(rows_max * aux_bytes) : 0);
  }
};

// Warp 0 of a fused block: its down rows, their scales and biases into
// shared memory (FusedSmem), completing on bar.
template <typename F, typename T>
__device__ __forceinline__ void fused_prefetch(const DecodeParams& p, const GuWork& wk, u8* base, u32 bar) {
  const DecodeW& D = wk.shared ? p.sd : p.down_w;
  const FusedTiles ft(p.hidden, blockIdx.x, gridDim.x);
  const FusedSmem<F, T> sm(base, D, p.hidden, gridDim.x);
  const u32 lane = threadIdx.x & 31u, nr = ft.r1 - ft.r0;
  if (nr == 0) {
    if (lane == 0) mbar_arrive(bar);  // nothing to wait for
    return;
  }
  const QRow first = row_of<F>(D, wk.e, ft.r0);
  u32 words = copy_words(first.data, nr * sm.row_bytes);
  if (sm.aux_bytes) words += copy_words(first.scales, nr * sm.aux_bytes) + copy_words(first.biases, nr * sm.aux_bytes);
  if (lane == 0) mbar_expect_tx(bar, words);
  __syncwarp();
  copy_range(sm.w, first.data, nr * sm.row_bytes, bar, lane);
  if (sm.aux_bytes) {
    copy_range(sm.s, first.scales, nr * sm.aux_bytes, bar, lane);
    copy_range(sm.b, first.biases, nr * sm.aux_bytes, bar, lane);
  }
}

// Steps 3 and 4 of a fused block with work wk: its down tiles, then the
// combine of each tile whose last arrival it is.
template <typename F, typename T>
__device__ __forceinline__ void fused_down(const DecodeParams& p, const GuWork& wk, u32 rows_total, float* red, u8* base,
                                           u32 bar, u32* s_last) {
  const u32 H = p.hidden, X = gridDim.x;
  const DecodeW& D = wk.shared ? p.sd : p.down_w;
  const FusedTiles ft(H, blockIdx.x, X);
  if (ft.t1 > ft.t0) {
    const FusedSmem<F, T> sm(base, D, H, X);
    const QRow first = row_of<F>(D, wk.e, ft.r0);
    // 3. Down: every gate/up block of the row has stored its act rows
    //    (acquire), which come into shared memory, and the copies landed.
    trace_at(p, block_slot(TR_DOWN));
    block_wait_flag(p.flags + blockIdx.y, X);
    const u32 nt = p.n_tokens, n_slots = nt * p.top_k;
    // One token (T = 1, the host's condition; shared memory holds one act row).
    const u32 n_tok = min(wk.shared ? nt : wk.n_tok, 1u);
    auto slot = [&](u32 i) { return wk.shared ? n_slots + i : wk.slots[i]; };
    T* xs = reinterpret_cast<T*>(sm.x);
    const T* act = static_cast<const T*>(p.act);
    for (u32 i = threadIdx.x; i < n_tok * (D.k / 8); i += blockDim.x) {
      const u32 t = i / (D.k / 8), c = i % (D.k / 8);
      reinterpret_cast<uint4*>(xs + (u64)t * D.k)[c] = __ldcg(reinterpret_cast<const uint4*>(act + (u64)slot(t) * p.act_stride) + c);
    }
    mbar_wait(bar, 0);
    __syncthreads();  // the act rows in shared memory
    trace_at(p, block_slot(TR_DOWN + 1024));
    const u32 lane = threadIdx.x & 31u, g = lane >> 2;
    const MmaWarp mw(p.down_split);
    const u32 mt_n = MMA_WARPS / mw.ks_n;
    const u32 n_spans = (D.k + MMA_SPAN - 1) / MMA_SPAN;
    for (u32 tb = ft.t0; tb < ft.t1; tb += mt_n) {
      const u32 tile = tb + mw.mt;
      QRow rows[1][2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const u32 r = min(tile * MMA_TILE + g + 8u * h, ft.r1 - 1), i = r - ft.r0;
        rows[0][h] = first;
        rows[0][h].data = copied(sm.w, first.data, i * sm.row_bytes);
        if (sm.aux_bytes) {
          rows[0][h].scales = copied(sm.s, first.scales, i * sm.aux_bytes);
          rows[0][h].biases = copied(sm.b, first.biases, i * sm.aux_bytes);
        }
      }
      const u32 ns = tile < ft.t1 ? n_spans : 0;
      // One token (T = 1): one n-tile, its row g = 0 (SMALL as gate_up_tiles').
      auto emit = [&](u32 mt, u32 n, u32 i, u32 l, const float (&v)[1]) {
        const u32 row = (tb + mt) * MMA_TILE + frag_row(i, l), t = frag_tok(n, i, l);
        if (tb + mt < ft.t1 && row < H && t < n_tok) p.y[(u64)slot(t) * H + row] = to_f32(from_f32<T>(v[0]));
      };
      const T* xr[1] = {g < n_tok ? xs + (u64)g * D.k : nullptr};
      mma_group<F, T, 1, 1, true>(p, block_slot(TR_DOWN + 4096), mw, rows, xr, ns, red, emit);
    }
    trace_at(p, block_slot(TR_DOWN + 2048));
    // 4. Per tile, the last row to arrive combines it: warp 0 takes the
    //    tickets of 32 tiles at once (one round trip, not one a tile), and
    //    the block combines every tile it was last for in one pass — a
    //    block last for all its tiles took 15 µs more, a tile at a time.
    T* out = static_cast<T*>(p.out);
    for (u32 c0 = ft.t0; c0 < ft.t1; c0 += 32) {
      __syncthreads();  // the block's y stores; the previous chunk's mask read
      if (threadIdx.x < 32) {
        const u32 t = c0 + threadIdx.x;
        bool last = false;
        if (t < ft.t1) {
          // After the barrier: releases every thread's y stores; acquires
          // the other rows' for the combine (as last_arrival).
          u32 old;
          asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(p.tile_tickets + t) : "memory");
          last = old == rows_total - 1;
        }
        const u32 m = __ballot_sync(0xffffffffu, last);
        if (threadIdx.x == 0) *s_last = m;
      }
      __syncthreads();
      const u32 mask = *s_last;
      if (mask == 0) continue;
      block_wait_flag(p.flags + FUSED_PUBLISHED, 1);
      for (u32 i = threadIdx.x; i < 32u * MMA_TILE * nt; i += blockDim.x) {
        const u32 j = i / (MMA_TILE * nt), t = (i / MMA_TILE) % nt, h = (c0 + j) * MMA_TILE + i % MMA_TILE;
        if ((mask >> j & 1u) && h < H)
          out[(u64)t * H + h] = combine_token<T>(p, t, h, [&](u32 s) { return __ldcg(p.y + (u64)s * H + h); });
      }
      if (threadIdx.x < 32 && (mask >> threadIdx.x & 1u)) p.tile_tickets[c0 + threadIdx.x] = 0;  // for the next launch
    }
    trace_at(p, block_slot(TR_DOWN + 3072));
  }
}

template <typename F, typename T>
__global__ void __launch_bounds__(MMA_WARPS * 32, 2) decode_fused_mma(const __grid_constant__ DecodeParams p) {
  static_assert(!LoadsReadOnly<typename DecOf<F, T>::type>::value, "down rows come from shared memory");
#if __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) u8 down_sm[];
  __shared__ __align__(16) float red[MMA_RED];
  __shared__ __align__(8) u64 bar;
  __shared__ u32 s_last;
  if (threadIdx.x == 0) {
    mbar_init(smem_addr(&bar), 1);
    mbar_fence_init();
  }
  __syncthreads();
  // The block's work lives in shared memory across the gate/up tiles, so
  // that they keep decode_gate_up_mma's registers (no spills).
  __shared__ GuWork s_wk;
  {
    GuWork wk;
    if (!gate_up_work(p, red, wk)) {
      if (blockIdx.y == p.max_active + 1 && blockIdx.x == 0) {
        __syncthreads();  // every thread's routing stores
        if (threadIdx.x == 0) add_release_gpu(p.flags + FUSED_PUBLISHED, 1);
      }
      return;
    }
    if (threadIdx.x == 0) s_wk = wk;
    // 1. The block's down rows (contiguous in the expert) into shared
    //    memory, a tile's rows a copy; their scales and biases into L2.
    if (threadIdx.x < 32) fused_prefetch<F, T>(p, wk, down_sm, smem_addr(&bar));
  }
  __syncthreads();  // s_wk
  {
    // 2. Gate/up (its work read back from shared memory: no value of the
    //    prefetch lives on into its span loop), then this block's arrival.
    const GuWork wk = s_wk;
    gate_up_tiles<F, T, true>(p, red, wk);
  }
  __syncthreads();  // every act store of the block; s_wk
  if (threadIdx.x == 0) add_release_gpu(p.flags + blockIdx.y, 1);
  const u32 rows_total = p.top_k + (p.sd.data != nullptr ? 1u : 0u);  // grid rows with down work
  fused_down<F, T>(p, s_wk, rows_total, red, down_sm, smem_addr(&bar), &s_last);
  // 5. The last expert block resets the flags for the next launch (every
  //    wait on them is behind it).
  if (last_arrival(p.flags + FUSED_DONE, gridDim.x * rows_total, &s_last)) {
    for (u32 i = threadIdx.x; i < FUSED_ROWS; i += blockDim.x) p.flags[i] = 0;
    if (threadIdx.x == 0) {
      p.flags[FUSED_PUBLISHED] = 0;
      p.flags[FUSED_DONE] = 0;
    }
  }
#else
  if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) report(p.err, ERR_CONFIG);  // sm_90 only (decode_fused.rs)
#endif
}

}  // namespace moekit
