#!/usr/bin/env bash
# Builds the GPU test target and the CLI in release, strips them, and gathers
# them with a one-command runner into gpu-bundle/ (git-ignored). Copy that
# folder to a CUDA machine (no Rust needed) and run, from the repository root
# (the tests read fixtures/):  bash gpu-bundle/run.sh [test filter]
set -euo pipefail
cd "$(dirname "$0")/.."
out=gpu-bundle
rm -rf "$out"
mkdir -p "$out"
cargo build --release -p moekit-cli
json=$(cargo test --release -p moekit --features gpu-tests --test gpu --no-run --message-format=json)
exe=$(printf '%s\n' "$json" | grep -o '"executable":"[^"]*"' | tail -n 1 | cut -d'"' -f4)
[ -n "$exe" ] || { echo "gpu-bundle: could not find the gpu test executable" >&2; exit 1; }
cp target/release/moekit "$out/moekit"
cp "$exe" "$out/moekit-gpu-tests"
strip "$out/moekit" "$out/moekit-gpu-tests"
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs the GPU tests (and, with SANITIZE=1, under compute-sanitizer memcheck
# and racecheck). Extra arguments go to the test binary (e.g. a test filter).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export MOEKIT_CACHE_DIR=${MOEKIT_CACHE_DIR:-/tmp/moekit-kernels}
# A kernel cache compiled here (WARM=1) spares the device the JIT.
if [ -f "$here/kcache.tar.xz" ] && [ ! -d "$MOEKIT_CACHE_DIR" ]; then
  mkdir -p "$MOEKIT_CACHE_DIR" && tar xJf "$here/kcache.tar.xz" -C "$MOEKIT_CACHE_DIR"
fi
status=0
"$here/moekit-gpu-tests" --test-threads=1 "$@" || status=1
if [ "${SANITIZE:-0}" = 1 ]; then
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer --tool $tool"
    compute-sanitizer --tool "$tool" --error-exitcode 3 "$here/moekit-gpu-tests" --test-threads=1 "$@" || status=1
  done
fi
exit $status
RUN
chmod +x "$out/run.sh"
# The Python binding's wheel (abi3), installed there with
# `pip install --no-deps gpu-bundle/wheels/moekit-*.whl` (bench/peers/binding.py,
# crates/moekit-py/tests/test_cuda.py). Skipped without maturin.
if command -v maturin >/dev/null; then
  maturin build --release --strip -m crates/moekit-py/Cargo.toml -o "$out/wheels"
else
  echo "gpu-bundle: maturin not found (pip install maturin): no Python wheel" >&2
fi
# WARM=1: compile the bf16 kernel instances (sm_90, this NVRTC) into a cache
# that run.sh unpacks; a device whose NVRTC differs just recompiles.
if [ "${WARM:-0}" = 1 ]; then
  cache=$(mktemp -d)
  cargo build --release -p moekit --example warm_cache
  w=target/release/examples/warm_cache
  MOEKIT_CACHE_DIR=$cache $w tc_gemm ', __nv_bfloat16, '
  MOEKIT_CACHE_DIR=$cache $w decode.cu bfloat16
  MOEKIT_CACHE_DIR=$cache $w gather_mm bfloat16
  MOEKIT_CACHE_DIR=$cache $w norm.cu bfloat16
  MOEKIT_CACHE_DIR=$cache $w '!tc_gemm' '!gather_mm' '!decode.cu' '!norm.cu'
  tar cJf "$out/kcache.tar.xz" -C "$cache" .
  rm -rf "$cache"
fi
ls -la "$out"
