// moekit/dequant_mlx.cuh — MLX's microscaled floating-point modes
// (mx.quantize mode "mxfp4", "nvfp4", "mxfp8") as a decoder type like
// dequant.cuh's (which includes this file at its end; it is not included on
// its own). The layout is src/format/mlxfp.rs's: a row is K·BITS/32 u32
// words, code k at bits k·BITS of the row's LSB-first stream (MLX's affine
// packing), plus K/GS scale bytes (e8m0, or e4m3 for nvfp4), no biases.
//
// Values as MLX's CPU mx.dequantize: e2m1 codes ±{0, ½, 1, 1½, 2, 3, 4, 6};
// e4m3 bytes as mx.from_fp8 (e4m3fn: 0x7F, 0xFF NaN); e8m0
// scales 2^(e − 127) in f32 (e = 0: 2^−127, e = 255: +∞). A weight is one
// f32 product of its code and its group's scale. The e2m1 codes go through
// the GGUF MXFP4 table (dequant_iq.cuh: values doubled, exact small
// integers) with the scale halved, which is the same product exactly.
#pragma once

namespace moekit {

// MLX's e8m0 scale 2^(e − 127): e = 0 the subnormal 2^−127, e = 255 +∞.
__device__ __forceinline__ float mlx_e8m0(u32 e) { return __uint_as_float(e == 0 ? 0x00400000u : e << 23); }

// Half of it: 2^(e − 128), +∞ for e = 255 (e < 2: subnormals, exact).
__device__ __forceinline__ float mlx_e8m0_half(u32 e) { return e == 255 ? __uint_as_float(0x7F800000u) : e8m0_to_f32_half(e); }

// MLX's e4m3 (mx.from_fp8, OCP e4m3fn): the 7 magnitude bits under an f32
// exponent times 2^120 (exact, subnormals included), then the sign; 0x7F and
// 0xFF are NaN.
__device__ __forceinline__ float mlx_e4m3(u32 b) {
  if ((b & 0x7Fu) == 0x7Fu) return __uint_as_float(0x7FC00000u);
  const float mag = __fmul_rn(__uint_as_float((b & 0x7Fu) << 20), __uint_as_float(0x7B800000u));
  return __uint_as_float(__float_as_uint(mag) | ((b & 0x80u) << 24));
}

// BITS = 4, GS = 32: mxfp4; BITS = 4, GS = 16: nvfp4; BITS = 8, GS = 32: mxfp8.
template <int BITS, int GS>
struct FmtMlxFp : Codes<FmtMlxFp<BITS, GS>> {
  static_assert((BITS == 4 && (GS == 32 || GS == 16)) || (BITS == 8 && GS == 32), "MLX fp modes: mxfp4, nvfp4, mxfp8");
  static constexpr int CHUNK = 32;
  static constexpr int UNIT_W = 32, UNIT_BYTES = 4 * BITS;
  static constexpr int SUB = GS;
  static constexpr bool HAS_B = false;
  typedef u8 Scale;
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[CHUNK / SUB],
                                                    float (&kb)[CHUNK / SUB]) {
    u32 w[BITS];
    load_words<4 * BITS, align_at(UNIT_BYTES, 0)>(r.data + (u64)c * UNIT_BYTES, w);
#pragma unroll
    for (int s = 0; s < CHUNK / SUB; ++s) {
      const u32 e = r.scales[c * (CHUNK / SUB) + s];
      ka[s] = BITS == 8 ? mlx_e8m0(e) : GS == 16 ? __fmul_rn(mlx_e4m3(e), 0.5f) : mlx_e8m0_half(e);
      kb[s] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      if constexpr (BITS == 4) out[j] = code_f(table16(MXFP4_TABLE, (w[j / 8] >> (4 * (j % 8))) & 15u), MXFP4_BIAS);
      else out[j] = mlx_e4m3(byte_of(w, j));
    }
  }
};

}  // namespace moekit
