// moekit/decode_f32.cuh — the decode path's CUDA-core expert kernels
// (decode.cu), used for f32 activations and f32 weights, where the
// tensor-core kernels (16-bit MMA operands) would round what the reference
// keeps in f32:
//
//   decode_gate_up   block (row tile, active expert): stages the tile's
//                    gate and up rows in shared memory (cp.async, the
//                    whole tile in flight at once), then each warp decodes
//                    a row once and dots it with every token that chose
//                    the expert: act[slot, n] = silu(g)·u. The shared
//                    expert is one more grid row over all tokens.
//   decode_down      block owns a tile of output rows h for every token:
//                    streams the active experts' down tiles through a ring
//                    of shared-memory buffers, dots each staged row with
//                    the expert's tokens' act rows, then sums each token's
//                    k slots in slot order (+ gated shared expert).
//
// Included by decode.cu after DecodeParams and the shared helpers.
#pragma once

namespace moekit {

// ---------------------------------------------------------------------------
// Staging weight tiles in shared memory. A block copies the packed bytes of
// its rows (and, for affine formats, their scales and biases) with cp.async
// — every load of the tile in flight at once, no registers held — then
// decodes from shared memory (moekit/pipe.cuh: cp.async and `stage`).

// Bytes of one row of K weights of F, and of its scales (and of its biases).
template <typename F>
__device__ __forceinline__ u32 row_bytes(u32 k) { return k / F::UNIT_W * F::UNIT_BYTES; }
template <typename F>
__device__ __forceinline__ u32 aux_bytes(u32 k, u32 group_shift) {
  if constexpr (is_void<typename F::Scale>::value) return 0;
  else return (k >> group_shift) * (u32)sizeof(typename F::Scale);
}
// Shared memory of a staged tile of `nr` rows (decode.rs: tile_room).
template <typename F>
__device__ __forceinline__ u32 tile_room(u32 nr, u32 k, u32 group_shift) {
  const u32 a = aux_bytes<F>(k, group_shift);
  return stage_room(nr * row_bytes<F>(k)) + (a ? 2 * stage_room(nr * a) : 0);
}

// Rows n0 .. n0 + nr of expert e of `w`, staged at `smem` (with `copy`,
// the block issues the copy; without, the tile only points at it);
// `row(i)` is the staged row n0 + i.
template <typename F>
struct Tile {
  const u8 *data, *scales, *biases;
  u32 k, group_shift;
  __device__ __forceinline__ Tile(u8* smem, const DecodeW& w, u64 e, u32 n0, u32 nr, bool copy)
      : scales(nullptr), biases(nullptr), k(w.k), group_shift(w.group_shift) {
    const u64 row = e * w.rows + w.row_offset + n0;
    const u32 rb = row_bytes<F>(k), ab = aux_bytes<F>(k, group_shift);
    data = stage(smem, w.data + row * rb, nr * rb, copy);
    if (ab) {
      u8* s = smem + stage_room(nr * rb);
      scales = stage(s, w.scales + row * ab, nr * ab, copy);
      biases = stage(s + stage_room(nr * ab), w.biases + row * ab, nr * ab, copy);
    }
  }
  __device__ __forceinline__ QRow row(u32 i) const { return make_row<F>(data, scales, biases, i, k, group_shift); }
};

// Activation rows in shared memory are swizzled per chunk: the 4-value piece
// q of chunk c sits at piece q ^ (c % PIECES), so the lanes of a warp (lane
// ↔ chunk) reading piece q at once hit different banks.
template <int CHUNK>
__device__ __forceinline__ u32 swizzled(u32 j) {
  constexpr u32 P = CHUNK / 4;
  const u32 c = j / CHUNK, q = (j % CHUNK) / 4;
  return c * CHUNK + ((q ^ (c % P)) * 4) + j % 4;
}

// An x row staged in shared memory (swizzled, f32).
template <int CHUNK>
struct SmemX {
  const float* row;
  __device__ __forceinline__ float4 piece(u32 c, u32 q) const {
    constexpr u32 P = CHUNK / 4;
    return *reinterpret_cast<const float4*>(row + c * CHUNK + (q ^ (c % P)) * 4);
  }
};

// The act rows (decode_gate_up → decode_down) are lane-major: 32 consecutive
// chunks form a block of 32·CHUNK values where piece q of chunk c sits at
// (q·32 + c % 32)·4, so a warp's lanes, each reading piece q of its own
// chunk, read 512 consecutive bytes. Rows are act_stride (a multiple of
// 32·CHUNK) long.
template <int CHUNK>
__device__ __forceinline__ u32 act_pos(u32 j) {
  constexpr u32 P = CHUNK / 4;
  const u32 c = j / CHUNK, q = (j % CHUNK) / 4;
  return ((c / 32) * P + q) * 128 + (c % 32) * 4 + j % 4;
}

// A lane-major act row of `k` values (positions past k read as zero: they
// are never written).
template <int CHUNK>
struct ActX {
  const float* row;
  u32 k;
  __device__ __forceinline__ float4 piece(u32 c, u32 q) const {
    constexpr u32 P = CHUNK / 4;
    float4 v = *reinterpret_cast<const float4*>(row + ((c / 32) * P + q) * 128 + (c % 32) * 4);
    const u32 j = c * CHUNK + 4 * q;
    if (j + 4 > k) {
      v.x = j < k ? v.x : 0.f;
      v.y = j + 1 < k ? v.y : 0.f;
      v.z = j + 2 < k ? v.z : 0.f;
      v.w = j + 3 < k ? v.w : 0.f;
    }
    return v;
  }
};

// Σ w·x over chunk c of decoded weights.
template <int CHUNK, typename X>
__device__ __forceinline__ float weights_dot(const float (&w)[CHUNK], const X& x, u32 c) {
  float a = 0.f;
#pragma unroll
  for (u32 q = 0; q < CHUNK / 4; ++q) {
    const float4 v = x.piece(c, q);
    a = fmaf(w[4 * q], v.x, a);
    a = fmaf(w[4 * q + 1], v.y, a);
    a = fmaf(w[4 * q + 2], v.z, a);
    a = fmaf(w[4 * q + 3], v.w, a);
  }
  return a;
}

// Σ w·x over chunk c from the format's codes: per sub-chunk s,
// a[s]·Σ q·x + b[s]·Σ x (Σ x from `sums` when SUMS, else summed here).
template <typename F, bool SUMS, typename X>
__device__ __forceinline__ float codes_dot(const float (&q)[F::CHUNK], const float (&ka)[F::CHUNK / F::SUB],
                                           const float (&kb)[F::CHUNK / F::SUB], const X& x, const float* sums, u32 c) {
  constexpr u32 NSUB = F::CHUNK / F::SUB, PS = F::SUB / 4;
  float acc = 0.f;
#pragma unroll
  for (u32 s = 0; s < NSUB; ++s) {
    float d = 0.f, xs = 0.f;
#pragma unroll
    for (u32 i = 0; i < PS; ++i) {
      const u32 j = s * F::SUB + 4 * i;
      const float4 v = x.piece(c, s * PS + i);
      d = fmaf(q[j], v.x, d);
      d = fmaf(q[j + 1], v.y, d);
      d = fmaf(q[j + 2], v.z, d);
      d = fmaf(q[j + 3], v.w, d);
      if (F::HAS_B && !SUMS) xs += (v.x + v.y) + (v.z + v.w);
    }
    acc = fmaf(ka[s], d, acc);
    if (F::HAS_B) acc = fmaf(kb[s], SUMS ? sums[c * NSUB + s] : xs, acc);
  }
  return acc;
}

// Width of a staged activation row: K rounded up to 32 (a multiple of every
// CHUNK), zero-filled past K (decode.rs: the gate/up shared memory).
__device__ __forceinline__ u32 padded(u32 k) { return (k + 31u) & ~31u; }

constexpr u32 GU_TG = 4;  // tokens whose x rows decode_gate_up stages at a time

// Grid: (⌈max(I, Is) / gu_rows⌉, max_active + 1): block (x, y) computes rows
// x·gu_rows .. of gate/up for active expert y (y = max_active: the shared
// expert over every token). Dynamic shared memory: the gate and up tiles,
// then GU_TG x rows as f32 (padded(H) each).
template <typename F, typename T>
__global__ void __launch_bounds__(DEC_WARPS * 32, 2) decode_gate_up(const __grid_constant__ DecodeParams p) {
  extern __shared__ __align__(16) u8 dec_tiles[];
  const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const u32 nt = p.n_tokens, H = p.hidden, k = p.top_k;
  bool shared;
  u32 e;
  if (!gate_up_begin(p, shared, e)) return;
  const DecodeW& G = shared ? p.sg : p.gate_w;
  const DecodeW& U = shared ? p.su : p.up_w;
  const u32 n_rows = shared ? p.sd.k : p.down_w.k;  // I (or Is): down's K
  const u32 n0 = blockIdx.x * p.gu_rows;
  if (n0 >= n_rows) return;
  const u32 nr = min(p.gu_rows, n_rows - n0);
  const u32 room = tile_room<F>(nr, G.k, G.group_shift);
  const Tile<F> tg(dec_tiles, G, e, n0, nr, true);
  const Tile<F> tu(dec_tiles + room, U, e, n0, nr, true);
  cp_async_commit();
  float* xs = reinterpret_cast<float*>(dec_tiles + 2 * tile_room<F>(p.gu_rows, G.k, G.group_shift));
  float* xsum = xs + GU_TG * padded(H);  // GU_TG · padded(H) / SUB sums
  const u32 first = shared ? 0 : p.offsets[e];
  const u32 n_tok = shared ? nt : p.offsets[e + 1] - first;
  const u32 Hp = padded(H), nch = (H + F::CHUNK - 1) / F::CHUNK;
  const T* x = static_cast<const T*>(p.x);
  for (u32 i0 = 0; i0 < n_tok; i0 += GU_TG) {
    const u32 cnt = min(GU_TG, n_tok - i0);
    __syncthreads();  // the previous group's x rows are read
    // The group's x rows as f32 (while the first group's tiles fly).
    for (u32 i = 0; i < cnt; ++i) {
      const u32 t = shared ? i0 + i : p.slots[first + i0 + i] / k;
      // Weight before the FFN: w ⊙ x rounded to T, as the general path's.
      const bool scale = p.weight_in && !shared;
      const float w = scale ? to_f32(from_f32<T>(p.weights[p.slots[first + i0 + i]])) : 1.f;
#pragma unroll 4
      for (u32 j = threadIdx.x; j < Hp; j += blockDim.x) {
        float v = j < H ? to_f32(x[(u64)t * H + j]) : 0.f;
        if (scale) v = to_f32(from_f32<T>(v * w));
        xs[i * Hp + swizzled<F::CHUNK>(j)] = v;
      }
    }
    if constexpr (F::HAS_B) {
      // Σ x per SUB values (in index order), for the formats' offsets.
      __syncthreads();
      for (u32 idx = threadIdx.x; idx < cnt * (Hp / F::SUB); idx += blockDim.x) {
        const u32 i = idx / (Hp / F::SUB), j0 = (idx % (Hp / F::SUB)) * F::SUB;
        float v = 0.f;
        for (u32 j = j0; j < j0 + F::SUB; ++j) v += xs[i * Hp + swizzled<F::CHUNK>(j)];
        xsum[idx] = v;
      }
    }
    cp_async_wait<0>();
    __syncthreads();
    // Lane groups of DEC_GL lanes each own a row (several rows per warp in
    // flight); a clamped duplicate row past nr computes but does not store.
    const u32 grp = lane / DEC_GL, sub = lane % DEC_GL;
    for (u32 r0 = warp * DEC_GROUPS; r0 < nr; r0 += DEC_WARPS * DEC_GROUPS) {
      const u32 r = min(r0 + grp, nr - 1);
      const QRow gr = tg.row(r), ur = tu.row(r);
      float ag[GU_TG], au[GU_TG];
#pragma unroll
      for (u32 i = 0; i < GU_TG; ++i) ag[i] = au[i] = 0.f;
      for (u32 c = sub; c < nch; c += DEC_GL) {
        constexpr u32 NSUB = F::CHUNK / F::SUB;
        float q[F::CHUNK], ka[NSUB], kb[NSUB];
        F::codes(gr, c, q, ka, kb);
#pragma unroll
        for (u32 i = 0; i < GU_TG; ++i)
          if (i < cnt) ag[i] += codes_dot<F, true>(q, ka, kb, SmemX<F::CHUNK>{xs + i * Hp}, xsum + i * (Hp / F::SUB), c);
        F::codes(ur, c, q, ka, kb);
#pragma unroll
        for (u32 i = 0; i < GU_TG; ++i)
          if (i < cnt) au[i] += codes_dot<F, true>(q, ka, kb, SmemX<F::CHUNK>{xs + i * Hp}, xsum + i * (Hp / F::SUB), c);
      }
      const u32 gmask = group_mask(grp);
#pragma unroll
      for (u32 i = 0; i < GU_TG; ++i) {
        const float g = group_sum(ag[i], gmask), u = group_sum(au[i], gmask);
        if (sub == 0 && i < cnt && r0 + grp < nr) {
          const u32 row = shared ? nt * k + i0 + i : p.slots[first + i0 + i];
          // The general path's fused SwiGLU stores its output in T.
          const float a = shared ? silu(g) * u : glu(p.glu, g, u, e, (u64)e * n_rows + n0 + r);
          static_cast<float*>(p.act)[(u64)row * p.act_stride + act_pos<F::CHUNK>(n0 + r)] = to_f32(from_f32<T>(a));
        }
      }
    }
  }
}

constexpr u32 DOWN_BATCH = 8;  // jobs per batch; two batches in flight

// The tile of job j (active expert j, or the shared expert as job n_active)
// in ring buffer j % (2·DOWN_BATCH); with `copy`, issues its copy.
template <typename F>
__device__ __forceinline__ Tile<F> down_tile(const DecodeParams& p, const u32* meta, u32 n_active, u32 j, u32 h0, u32 nr,
                                             u8* ring, bool copy) {
  const bool shared = j == n_active;
  return Tile<F>(ring + (j % (2 * DOWN_BATCH)) * p.down_room, shared ? p.sd : p.down_w, shared ? 0 : meta[3 * j], h0, nr,
                 copy);
}

// Issues batch b's tiles (jobs b·DOWN_BATCH ..) and commits one group (empty
// past the last job, so the groups in flight stay two).
template <typename F>
__device__ __forceinline__ void down_batch(const DecodeParams& p, const u32* meta, u32 n_active, u32 n_jobs, u32 b, u32 h0,
                                           u32 nr, u8* ring) {
  for (u32 j = b * DOWN_BATCH; j < min(n_jobs, (b + 1) * DOWN_BATCH); ++j) down_tile<F>(p, meta, n_active, j, h0, nr, ring, true);
  cp_async_commit();
}

// y[slot, r] for every token of job j and staged row r (rounded to T as the
// general path's down matmul stores y), by one lane group (`sub`: lane in
// the group; `store`: false for a clamped duplicate).
template <typename F, typename T>
__device__ __forceinline__ void down_pair(const DecodeParams& p, const QRow& dr, u32 first, u32 n_tok, bool shared,
                                          const u32* sl, float* ys, u32 r, u32 sub, u32 gmask, bool store) {
  const u32 n_slots = p.n_tokens * p.top_k, R = p.down_rows;
  const u32 K = dr.k, nch = (K + F::CHUNK - 1) / F::CHUNK;
  for (u32 i0 = 0; i0 < n_tok; i0 += DEC_TG) {
    float acc[DEC_TG];
    u32 row[DEC_TG];
#pragma unroll
    for (int i = 0; i < DEC_TG; ++i) {
      acc[i] = 0.f;
      row[i] = i0 + i < n_tok ? (shared ? n_slots + i0 + i : sl[first + i0 + i]) : 0;
    }
    // Decoded once per chunk, then dotted per token: the act rows have no
    // precomputed sums, and summing them here would cost more per token
    // than the factored form saves once per chunk.
    for (u32 c = sub; c < nch; c += DEC_GL) {
      float w[F::CHUNK];
      F::dequant(dr, c, w);
#pragma unroll
      for (int i = 0; i < DEC_TG; ++i) {
        if (i0 + i >= n_tok) break;
        acc[i] += weights_dot<F::CHUNK>(w, ActX<F::CHUNK>{static_cast<const float*>(p.act) + (u64)row[i] * p.act_stride, K}, c);
      }
    }
#pragma unroll
    for (int i = 0; i < DEC_TG; ++i) {
      const float s = group_sum(acc[i], gmask);
      if (store && sub == 0 && i0 + i < n_tok) ys[row[i] * R + r] = to_f32(from_f32<T>(s));
    }
  }
}

// Grid: ⌈H / down_rows⌉: block b owns output rows h0 = b·down_rows .. for
// every token. The jobs' tiles stream through shared memory in batches of
// DOWN_BATCH, two batches in flight; the warps split a batch's (job, row)
// pairs, keep y[slot, row] in shared memory, and finally each token's k
// slots are summed in slot order (+ the gated shared expert).
// Dynamic shared memory: 2·DOWN_BATCH·down_room, then (T·k + T)·down_rows
// floats of y, then (max_active + 1)·3 + T·k words of job metadata and slots.
template <typename F, typename T>
__global__ void __launch_bounds__(DEC_WARPS * 32, 2) decode_down(const __grid_constant__ DecodeParams p) {
  extern __shared__ __align__(16) u8 dec_tiles[];
  const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  pdl_trigger();
  pdl_wait();  // gate/up's act rows (and, through it, the routing)
  const u32 nt = p.n_tokens, H = p.hidden, k = p.top_k, R = p.down_rows;
  const u32 n_slots = nt * k;
  const u32 h0 = blockIdx.x * R;
  if (h0 >= H) return;
  const u32 nr = min(R, H - h0);
  float* ys = reinterpret_cast<float*>(dec_tiles + 2 * DOWN_BATCH * p.down_room);
  u32* meta = reinterpret_cast<u32*>(ys + (n_slots + nt) * R);
  u32* sl = meta + 3 * (p.max_active + 1);
  const u32 n_active = *p.n_active;
  const u32 n_jobs = n_active + (p.sd.data != nullptr ? 1 : 0);
  const u32 n_batches = (n_jobs + DOWN_BATCH - 1) / DOWN_BATCH;
  for (u32 a = threadIdx.x; a < n_active; a += blockDim.x) meta[3 * a] = p.active[a];
  __syncthreads();
  down_batch<F>(p, meta, n_active, n_jobs, 0, h0, nr, dec_tiles);
  down_batch<F>(p, meta, n_active, n_jobs, 1, h0, nr, dec_tiles);
  for (u32 a = threadIdx.x; a < n_active; a += blockDim.x) {
    const u32 first = p.offsets[meta[3 * a]];
    meta[3 * a + 1] = first;
    meta[3 * a + 2] = p.offsets[meta[3 * a] + 1] - first;
  }
  for (u32 s = threadIdx.x; s < n_slots; s += blockDim.x) sl[s] = p.slots[s];
  for (u32 b = 0; b < n_batches; ++b) {
    cp_async_wait<1>();
    __syncthreads();
    const u32 j0 = b * DOWN_BATCH, nb = min(n_jobs - j0, DOWN_BATCH);
    const u32 grp = lane / DEC_GL, sub = lane % DEC_GL, gmask = group_mask(grp);
    for (u32 q0 = warp * DEC_GROUPS; q0 < nb * nr; q0 += DEC_WARPS * DEC_GROUPS) {
      const u32 q = min(q0 + grp, nb * nr - 1);
      const u32 j = j0 + q / nr, r = q % nr;
      const bool shared = j == n_active;
      const Tile<F> tile = down_tile<F>(p, meta, n_active, j, h0, nr, dec_tiles, false);
      down_pair<F, T>(p, tile.row(r), shared ? 0 : meta[3 * j + 1], shared ? nt : meta[3 * j + 2], shared, sl, ys, r, sub,
                      gmask, q0 + grp < nb * nr);
    }
    __syncthreads();  // batch b's buffers are free again
    down_batch<F>(p, meta, n_active, n_jobs, b + 2, h0, nr, dec_tiles);
  }
  __syncthreads();
  T* out = static_cast<T*>(p.out);
  for (u32 i = threadIdx.x; i < nt * nr; i += blockDim.x) {
    const u32 t = i / nr, r = i % nr;
    out[(u64)t * H + h0 + r] = combine_token<T>(p, t, h0 + r, [&](u32 s) { return ys[s * R + r]; });
  }
}

}  // namespace moekit
