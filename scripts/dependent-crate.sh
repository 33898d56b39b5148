#!/usr/bin/env bash
# Same CPU speed for a crate that depends on moekit as inside the repo?
#
#   scripts/dependent-crate.sh [ROUNDS] [CHECKOUT...]
#
# For each moekit CHECKOUT (default: this repository) builds, in release:
#  - `moekit-cli` inside the checkout (with the checkout's .cargo/config.toml),
#  - a dependent crate generated under /tmp/moekit-dependent/ from
#    scripts/dependent-crate/main.rs, with `moekit = { path = CHECKOUT/crates/moekit }`
#    (outside the checkout: no .cargo/config.toml, default release profile),
# then runs ROUNDS (default 3) interleaved rounds of `moekit bench --device cpu
# --tokens 1` and the dependent crate, on Qwen3-30B-A3B's shape at T = 1 for
# q4_0, q8_0, q4_k and affine4-g64, and prints each round's medians.
# A checkout without `moekit::cpu::simd_level` (before runtime dispatch) is
# built with `--cfg moekit_before`.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
rounds="${1:-3}"
shift || true
checkouts=("$@")
[ ${#checkouts[@]} -gt 0 ] || checkouts=("$here")
formats="q4_0,q8_0,q4_k,affine4-g64"
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-1}"

declare -a bins clis names
for co in "${checkouts[@]}"; do
    co="$(cd "$co" && pwd)"
    name="$(basename "$co")"
    dir="/tmp/moekit-dependent/$name"
    mkdir -p "$dir/src"
    cp "$here/scripts/dependent-crate/main.rs" "$dir/src/main.rs"
    cat > "$dir/Cargo.toml" <<TOML
[package]
name = "moekit-dependent"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
moekit = { path = "$co/crates/moekit" }
rand = "0.9"

[lints.rust]
unexpected_cfgs = { level = "warn", check-cfg = ['cfg(moekit_before)'] }

[workspace]
TOML
    [ -f "$dir/Cargo.lock" ] || cp "$co/Cargo.lock" "$dir/Cargo.lock"
    flags=""
    [ -f "$co/crates/moekit/src/cpu/level.rs" ] || flags="--cfg moekit_before"
    echo "== building $name: moekit-cli in the checkout, the dependent crate in $dir" >&2
    (cd "$co" && nice -n 10 cargo build --release -q -p moekit-cli)
    (cd "$dir" && RUSTFLAGS="$flags" nice -n 10 cargo build --release -q)
    names+=("$name")
    clis+=("$co/target/release/moekit")
    bins+=("$dir/target/release/moekit-dependent")
done

for r in $(seq 1 "$rounds"); do
    for i in "${!names[@]}"; do
        echo "== round $r ${names[$i]} in-repo: moekit bench --device cpu --tokens 1"
        "${clis[$i]}" bench --device cpu --tokens 1 --format "$formats" --preset qwen3-30b-a3b 2>/dev/null |
            awk 'NR == 1 || $2 == 1 { print }'
        echo "== round $r ${names[$i]} dependent crate"
        "${bins[$i]}" "$formats"
    done
done
