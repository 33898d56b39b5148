#!/usr/bin/env bash
# Compiles the CUDA format decoders (crates/moekit/kernels/dequant*.cuh) for
# the host with a plain C++17 compiler against scripts/host_decoders/
# common_shim.cuh and checks them against the gguf-py fixtures of
# fixtures/ggml, MLX's of fixtures/mlxfp and the FP8 block oracle of fixtures/fp8 (scripts/host_decoders/check.cpp). No GPU, CUDA or Python.
# Checks the decoders' bit and table logic, not the device compiler: the
# NVRTC compile test and the GPU tests still decide that.
# Usage (repository root): bash scripts/check_decoders_on_host.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/moekit"
for f in dequant.cuh dequant_iq.cuh dequant_mlx.cuh dequant_fp8.cuh iq_grids.cuh; do
  cp "crates/moekit/kernels/$f" "$tmp/moekit/$f"
done
cp scripts/host_decoders/common_shim.cuh "$tmp/moekit/common.cuh"
${CXX:-g++} -std=c++17 -O1 -ffp-contract=off -Wno-unknown-pragmas -I "$tmp" \
  scripts/host_decoders/check.cpp -o "$tmp/check"
"$tmp/check" fixtures/ggml fixtures/mlxfp fixtures/fp8
