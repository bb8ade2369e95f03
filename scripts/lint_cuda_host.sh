#!/usr/bin/env bash
# Static analysis of the CUDA-path host code (the parts that cannot run without a GPU here):
# clang-tidy (bugprone, performance, clang-analyzer) and cppcheck, failing on any finding.
# Usage: scripts/lint_cuda_host.sh [BUILD_DIR]   (BUILD_DIR has compile_commands.json; default
# build/default). Skips with a message when the build has no CUDA sources.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${1:-build/default}"
files=(engine/core/cuda_backend.cc engine/core/caching_allocator.cc engine/core/cuda_stream.cc
       engine/core/storage.cc engine/fsdp/comm_context.cc engine/fsdp/fsdp_collectives.cc
       engine/fsdp/fsdp_param.cc)
for f in engine/ops/cuda/*.cc engine/distributed/nccl/*.cc; do
  case "$f" in *_test.cc) ;; *) files+=("$f") ;; esac
done
if ! grep -q '"file": ".*engine/core/cuda_stream.cc"' "$build_dir/compile_commands.json" 2>/dev/null; then
  echo "lint_cuda_host: $build_dir has no CUDA build (no nvcc?); skipped"
  exit 0
fi
checks='-*,bugprone-*,performance-*,clang-analyzer-*,-bugprone-easily-swappable-parameters'
status=0
for f in "${files[@]}"; do
  if ! clang-tidy -p "$build_dir" --quiet --checks="$checks" --warnings-as-errors='*' "$f" 2>/dev/null; then
    echo "lint_cuda_host: clang-tidy findings in $f" >&2
    status=1
  fi
done
cppcheck --quiet --error-exitcode=1 --enable=warning,performance,portability --std=c++20 \
  --language=c++ -I . -I "$build_dir/generated" --suppress=missingIncludeSystem "${files[@]}" || status=1
[ "$status" = 0 ] && echo "lint_cuda_host: clean (${#files[@]} files: clang-tidy + cppcheck)"
exit "$status"
