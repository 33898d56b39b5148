#!/usr/bin/env bash
# Build ggml's CPU backend (static libs) and the ggml_moe_bench harness.
#
#   bench/peers/ggml_cpu/build.sh [GGML_SRC]
#
# GGML_SRC (argument or env var) is either an extracted ggml source tree
# (has CMakeLists.txt and include/ggml.h) or a bare git mirror of
# ggml-org/ggml (e.g. /work/.mirror/ggml-org+ggml/repo), whose HEAD is then
# extracted to $BUILD_DIR/src. Default: /work/.mirror/ggml-org+ggml/repo.
# For an extracted tree the commit comes from git, a .ggml_commit file in it,
# or GGML_COMMIT.
#
# Env: BUILD_DIR (default bench/peers/ggml_cpu/build, git-ignored),
#      JOBS (default 2), NICE (default 19), CC/CXX, CMAKE (default cmake),
#      GGML_ISA: native (default: GGML_NATIVE=ON, i.e. -march=native, AVX512
#      and VNNI where the CPU has them) or avx2 (GGML_NATIVE=OFF with AVX, AVX2,
#      FMA, F16C, BMI2 only: the instruction set of moekit's `avx2` kernels).
#      Use a separate BUILD_DIR per ISA, e.g. BUILD_DIR=.../build-avx2.
# Output: $BUILD_DIR/ggml_moe_bench, $BUILD_DIR/ggml_commit.txt
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
GGML_SRC="${1:-${GGML_SRC:-/work/.mirror/ggml-org+ggml/repo}}"
BUILD_DIR="${BUILD_DIR:-$HERE/build}"
JOBS="${JOBS:-2}"
NICE="${NICE:-19}"
CMAKE="${CMAKE:-cmake}"
CC="${CC:-gcc}"
CXX="${CXX:-g++}"
GGML_ISA="${GGML_ISA:-native}"
case "$GGML_ISA" in
    native)
        ISA_FLAGS=(-DGGML_NATIVE=ON)
        HARNESS_ARCH=(-march=native)
        ;;
    avx2)
        ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON
            -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF
            -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF)
        HARNESS_ARCH=(-mavx2 -mfma -mf16c)
        ;;
    *)
        echo "error: GGML_ISA must be native or avx2, got $GGML_ISA" >&2
        exit 1
        ;;
esac

mkdir -p "$BUILD_DIR"
BUILD_DIR="$(cd "$BUILD_DIR" && pwd)"

# Resolve the source tree and its commit (GGML_COMMIT overrides it for a tree
# without git metadata).
COMMIT="${GGML_COMMIT:-unknown}"
if [[ -f "$GGML_SRC/CMakeLists.txt" && -f "$GGML_SRC/include/ggml.h" ]]; then
    SRC="$(cd "$GGML_SRC" && pwd)"
    if [[ -n "${GGML_COMMIT:-}" ]]; then
        :
    elif git -C "$SRC" rev-parse HEAD >/dev/null 2>&1; then
        COMMIT="$(git -C "$SRC" rev-parse HEAD)"
    elif [[ -f "$SRC/.ggml_commit" ]]; then
        COMMIT="$(cat "$SRC/.ggml_commit")"
    fi
elif git --git-dir="$GGML_SRC" rev-parse HEAD >/dev/null 2>&1; then
    COMMIT="$(git --git-dir="$GGML_SRC" rev-parse HEAD)"
    SRC="$BUILD_DIR/src"
    if [[ ! -f "$SRC/.ggml_commit" || "$(cat "$SRC/.ggml_commit")" != "$COMMIT" ]]; then
        echo "extracting ggml $COMMIT from $GGML_SRC to $SRC"
        rm -rf "$SRC"
        mkdir -p "$SRC"
        git --git-dir="$GGML_SRC" archive HEAD | tar -x -C "$SRC"
        echo "$COMMIT" >"$SRC/.ggml_commit"
    fi
else
    echo "error: $GGML_SRC is neither a ggml source tree nor a git mirror" >&2
    exit 1
fi
echo "ggml source: $SRC (commit $COMMIT)"

# 1. ggml, CPU backend only, static, no tests/examples. GGML_LLAMAFILE=ON as in
#    llama.cpp's build (it only touches plain mul_mat, i.e. the f32 router here;
#    mul_mat_id never goes through llamafile_sgemm). CPU_REPACK is on by default.
"$CMAKE" -S "$SRC" -B "$BUILD_DIR/ggml" \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" \
    -DBUILD_SHARED_LIBS=OFF \
    "${ISA_FLAGS[@]}" \
    -DGGML_CPU=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF \
    -DGGML_BLAS=OFF -DGGML_OPENMP=ON -DGGML_LLAMAFILE=ON -DGGML_CCACHE=OFF \
    -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF
nice -n "$NICE" "$CMAKE" --build "$BUILD_DIR/ggml" -j "$JOBS"

# 2. The harness, linked against the static libs.
LIBS=()
for l in ggml ggml-cpu ggml-base; do
    f="$(find "$BUILD_DIR/ggml" -name "lib$l.a" | head -n1)"
    [[ -n "$f" ]] || { echo "error: lib$l.a not found" >&2; exit 1; }
    LIBS+=("$f")
done
nice -n "$NICE" "$CXX" -O2 -std=c++17 "${HARNESS_ARCH[@]}" \
    -DGGML_COMMIT="\"$COMMIT\"" \
    -I "$SRC/include" \
    "$HERE/ggml_moe_bench.cpp" \
    -Wl,--start-group "${LIBS[@]}" -Wl,--end-group \
    -fopenmp -lpthread -lm -o "$BUILD_DIR/ggml_moe_bench"
echo "$COMMIT" >"$BUILD_DIR/ggml_commit.txt"
echo "$GGML_ISA" >"$BUILD_DIR/ggml_isa.txt"
echo "built $BUILD_DIR/ggml_moe_bench (ggml $COMMIT, ISA $GGML_ISA)"
