// moekit/dequant_fp8.cuh — FP8 block-scaled weights (Hugging Face
// `quant_method: "fp8"`, DeepSeek-V3 / Kimi-K2 / MiniMax-M2) as a decoder
// type like dequant.cuh's (which includes this file at its end; it is not
// included on its own). The layout is src/format/fp8.rs's: a row is K
// e4m3fn bytes (one code per weight, in order) plus K/group f32 scales, the
// checkpoint's 128×128 block scales expanded per row at load; no biases.
// The group size (32, 64 or 128: WeightFormat::Fp8Block's block_k) is the
// run-time shift r.group_shift, as for mlx-native's u8 codes: a chunk of 32
// never straddles groups.
//
// Values: e4m3 as mx.from_fp8 / torch.float8_e4m3fn (mlx_e4m3 of
// dequant_mlx.cuh: exact, subnormals included, 0x7F and 0xFF NaN, no
// infinities); a weight is one f32 product of its code's value and its
// group's scale (Codes<F>::dequant: __fmul_rn, then + 0), bit-identical to
// fp8::dequantize_row.
#pragma once

namespace moekit {

struct FmtFp8Block : Codes<FmtFp8Block> {
  static constexpr int CHUNK = 32;
  static constexpr int UNIT_W = 32, UNIT_BYTES = 32;  // 32 codes, one byte each
  static constexpr int SUB = 32;                      // one scale per chunk (groups of ≥ 32)
  static constexpr bool HAS_B = false;
  typedef float Scale;
  static_assert(UNIT_BYTES == UNIT_W * 1, "one e4m3 byte per weight (fp8.rs: data u8 [E, N, K])");
  static_assert(sizeof(Scale) == 4, "f32 scales (fp8.rs: scales f32 [E, N, K/block_k])");
  static_assert(CHUNK % SUB == 0 && 32 % CHUNK == 0, "a chunk holds whole sub-chunks");
  __device__ static __forceinline__ void codes(const QRow& r, u32 c, float (&out)[CHUNK], float (&ka)[CHUNK / SUB],
                                                    float (&kb)[CHUNK / SUB]) {
    u32 w[8];
    load_words<32, align_at(UNIT_BYTES, 0)>(r.data + (u64)c * UNIT_BYTES, w);
    ka[0] = reinterpret_cast<const float*>(r.scales)[(c * 32) >> r.group_shift];
    kb[0] = 0.f;
#pragma unroll
    for (int j = 0; j < 32; ++j) out[j] = mlx_e4m3(byte_of(w, j));
  }
};

}  // namespace moekit
