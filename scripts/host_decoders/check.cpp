// Runs each GGUF format's CUDA decoder (F::dequant of dequant.cuh /
// dequant_iq.cuh; MLX's fp modes of dequant_mlx.cuh: check_mlx), compiled for the host against common_shim.cuh) over the
// committed fixtures/ggml/NAME_blocks.npy and compares every weight with
// gguf-py's NAME_deq.npy (== on floats: the decoders add a +0 offset, so a
// -0 of gguf-py may come back +0). Row data is 16-byte aligned, as the
// kernels require of every weight tensor. See scripts/check_decoders_on_host.sh.
#include "moekit/dequant.cuh"

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

static std::vector<unsigned char> npy_data(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<unsigned char> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (b.size() < 10 || b[6] != 1) return {};
  const size_t header = 10 + (size_t)(b[8] | (b[9] << 8));
  return std::vector<unsigned char>(b.begin() + (long)header, b.end());
}

template <typename F>
static int check(const char* dir, const char* name, int block_w) {
  const auto blocks = npy_data(std::string(dir) + "/" + name + "_blocks.npy");
  const auto deq = npy_data(std::string(dir) + "/" + name + "_deq.npy");
  const size_t n_blocks = blocks.size() / F::UNIT_BYTES;
  if (blocks.empty() || blocks.size() % F::UNIT_BYTES || deq.size() != 4 * n_blocks * block_w) {
    std::printf("%-8s bad fixture sizes\n", name);
    return 1;
  }
  std::vector<uint4> aligned((blocks.size() + 15) / 16);
  std::memcpy(aligned.data(), blocks.data(), blocks.size());
  moekit::QRow r{reinterpret_cast<const moekit::u8*>(aligned.data()), nullptr, nullptr, (moekit::u32)(n_blocks * block_w), 0};
  int bad = 0;
  for (moekit::u32 c = 0; c < r.k / F::CHUNK; ++c) {
    float out[F::CHUNK];
    F::template dequant<F::CHUNK>(r, c, out);
    for (int i = 0; i < F::CHUNK; ++i) {
      float want;
      std::memcpy(&want, deq.data() + 4 * (c * F::CHUNK + i), 4);
      if (!(out[i] == want) && bad++ < 3) std::printf("%-8s weight %u: got %.9g want %.9g\n", name, c * F::CHUNK + i, out[i], want);
    }
  }
  std::printf("%-8s %zu blocks: %s\n", name, n_blocks, bad ? "MISMATCH" : "ok");
  return bad != 0;
}

// MLX's microscaled modes: F::dequant over fixtures/mlxfp/MODE_all_{w,scales}
// (every code, every scale byte) against mx.dequantize's MODE_all_deq (==,
// or NaN on both sides: scale bytes 255 (e8m0 +inf) and e4m3 0x7F give NaN).
template <typename F>
static int check_mlx(const char* dir, const char* mode, int group) {
  const std::string p = std::string(dir) + "/" + mode + "_all_";
  const auto w = npy_data(p + "w.npy"), s = npy_data(p + "scales.npy"), deq = npy_data(p + "deq.npy");
  const size_t n = deq.size() / 4, rows = n / 64;
  if (n == 0 || w.size() != n / F::UNIT_W * F::UNIT_BYTES || s.size() != n / group) {
    std::printf("%-8s bad fixture sizes\n", mode);
    return 1;
  }
  std::vector<uint4> aligned((w.size() + 15) / 16);
  std::memcpy(aligned.data(), w.data(), w.size());
  int bad = 0;
  for (size_t row = 0; row < rows; ++row) {
    const moekit::u8* data = reinterpret_cast<const moekit::u8*>(aligned.data()) + row * (64 / F::UNIT_W * F::UNIT_BYTES);
    moekit::QRow r{data, s.data() + row * (64 / group), nullptr, 64, (moekit::u32)__builtin_ctz(group)};
    for (moekit::u32 c = 0; c < 64 / F::CHUNK; ++c) {
      float out[F::CHUNK];
      F::template dequant<F::CHUNK>(r, c, out);
      for (int i = 0; i < F::CHUNK; ++i) {
        float want;
        std::memcpy(&want, deq.data() + 4 * (row * 64 + c * F::CHUNK + i), 4);
        if (!(out[i] == want || (out[i] != out[i] && want != want)) && bad++ < 3)
          std::printf("%-8s row %zu weight %u: got %.9g want %.9g\n", mode, row, c * F::CHUNK + i, out[i], want);
      }
    }
  }
  std::printf("mlx %-6s %zu rows: %s\n", mode, rows, bad ? "MISMATCH" : "ok");
  return bad != 0;
}

// FP8 block-scaled rows (dequant_fp8.cuh) over scripts/fixtures/fp8.py's
// NAME_w.npy (e4m3 bytes [n, k]), NAME_scales_rows.npy (per-row f32 scales
// [n, k/group]) and NAME_deq.npy (numpy + ml_dtypes weight_dequant).
static int check_fp8(const char* dir, const char* name, int n, int k, int group) {
  const std::string p = std::string(dir) + "/" + name + "_";
  const auto w = npy_data(p + "w.npy"), s = npy_data(p + "scales_rows.npy"), deq = npy_data(p + "deq.npy");
  if (w.size() != (size_t)n * k || s.size() != (size_t)4 * n * (k / group) || deq.size() != (size_t)4 * n * k) {
    std::printf("fp8 %-6s bad fixture sizes\n", name);
    return 1;
  }
  std::vector<uint4> aligned((w.size() + 15) / 16);
  std::memcpy(aligned.data(), w.data(), w.size());
  std::vector<float> scales(s.size() / 4);
  std::memcpy(scales.data(), s.data(), s.size());
  using F = moekit::FmtFp8Block;
  int bad = 0;
  for (int row = 0; row < n; ++row) {
    const moekit::u8* data = reinterpret_cast<const moekit::u8*>(aligned.data()) + (size_t)row * k;
    const moekit::u8* sc = reinterpret_cast<const moekit::u8*>(scales.data() + (size_t)row * (k / group));
    moekit::QRow r{data, sc, sc, (moekit::u32)k, (moekit::u32)__builtin_ctz(group)};
    for (moekit::u32 c = 0; c < (moekit::u32)k / F::CHUNK; ++c) {
      float out[F::CHUNK];
      F::template dequant<F::CHUNK>(r, c, out);
      for (int i = 0; i < F::CHUNK; ++i) {
        float want;
        std::memcpy(&want, deq.data() + 4 * ((size_t)row * k + c * F::CHUNK + i), 4);
        if (!(out[i] == want || (out[i] != out[i] && want != want)) && bad++ < 3)
          std::printf("fp8 %-6s row %d weight %u: got %.9g want %.9g\n", name, row, c * F::CHUNK + i, out[i], want);
      }
    }
  }
  std::printf("fp8 %-6s %d rows: %s\n", name, n, bad ? "MISMATCH" : "ok");
  return bad != 0;
}

int main(int argc, char** argv) {
  const char* dir = argc > 1 ? argv[1] : "fixtures/ggml";
  const char* mlx_dir = argc > 2 ? argv[2] : "fixtures/mlxfp";
  const char* fp8_dir = argc > 3 ? argv[3] : "fixtures/fp8";
  using namespace moekit;
  int fails = 0;
  fails += check<FmtQ4_0>(dir, "q4_0", 32);
  fails += check<FmtQ4_K>(dir, "q4_k", 256);
  fails += check<FmtQ6_K>(dir, "q6_k", 256);
  fails += check<FmtIQ4_NL>(dir, "iq4_nl", 32);
  fails += check<FmtIQ4_XS>(dir, "iq4_xs", 256);
  fails += check<FmtMXFP4>(dir, "mxfp4", 32);
  fails += check<FmtNVFP4>(dir, "nvfp4", 64);
  fails += check<FmtIQ2_XXS>(dir, "iq2_xxs", 256);
  fails += check<FmtIQ2_XS>(dir, "iq2_xs", 256);
  fails += check<FmtIQ2_S>(dir, "iq2_s", 256);
  fails += check<FmtIQ3_XXS>(dir, "iq3_xxs", 256);
  fails += check<FmtIQ3_S>(dir, "iq3_s", 256);
  fails += check<FmtIQ1_S>(dir, "iq1_s", 256);
  fails += check<FmtIQ1_M>(dir, "iq1_m", 256);
  fails += check<FmtTQ1_0>(dir, "tq1_0", 256);
  fails += check<FmtTQ2_0>(dir, "tq2_0", 256);
  fails += check_mlx<FmtMlxFp<4, 32>>(mlx_dir, "mxfp4", 32);
  fails += check_mlx<FmtMlxFp<4, 16>>(mlx_dir, "nvfp4", 16);
  fails += check_mlx<FmtMlxFp<8, 32>>(mlx_dir, "mxfp8", 32);
  fails += check_fp8(fp8_dir, "ragged", 136, 160, 32);
  fails += check_fp8(fp8_dir, "full", 130, 256, 128);
  return fails ? 1 : 0;
}
