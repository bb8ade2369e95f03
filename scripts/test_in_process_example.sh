#!/usr/bin/env bash
# The in-process example against an installed tree (ctest install.in_process_example;
# docs/in_process.md). Usage: test_in_process_example.sh BUILD_DIR CXX_COMPILER
#   1. `cmake --install BUILD_DIR` into a temporary prefix, then moves the prefix elsewhere
#      (the package must be relocatable);
#   2. configures examples/in_process against the moved prefix (find_package), builds it with
#      the build's compiler (and ccache when present) and runs its ctest.
# The temporary directory is removed on exit.
set -euo pipefail
build_dir=$(cd "$1" && pwd)
cxx=$2
src_dir=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-install-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

cmake --install "$build_dir" --prefix "$tmp/staged" >/dev/null
mv "$tmp/staged" "$tmp/prefix"

launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
cmake -S "$src_dir/examples/in_process" -B "$tmp/build" "${generator[@]}" "${launcher[@]}" \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
      -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/build" -j "${JOBS:-2}"
ctest --test-dir "$tmp/build" --output-on-failure
