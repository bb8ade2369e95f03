#!/usr/bin/env bash
# Packs a CUDA build for a GPU host that has the NVIDIA driver and CUDA 13 runtime libraries
# but not this project's build dependencies (Gloo, Eigen, GTest, a compiler): the stripped test
# binaries and tools that the GPU checks use, the non-CUDA shared libraries they link (Gloo and
# its dependencies), and scripts/gpu_bundle_run.sh as run.sh. On the GPU host run
# `bash BUNDLE/run.sh [RESULTS_DIR]`; it finds cudart, cuBLAS and NCCL there (the CUDA toolkit,
# or the nvidia-* Python wheels PyTorch installs).
# Usage: scripts/gpu_bundle.sh [BUILD_DIR] [BUNDLE_DIR]   (defaults build/default, build/gpu-bundle)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/default}
bundle=${2:-build/gpu-bundle}
if [ ! -x "$build/engine/ops_cuda_tests" ]; then
  echo "gpu_bundle: $build is not a CUDA build (no engine/ops_cuda_tests); configure and build it where nvcc is found" >&2
  exit 2
fi
binaries=(engine/ops_cuda_tests engine/engine_tests engine/fsdp_tests tools/fsdp-conform
          tools/pg-bench tools/fsdp-launch)
[ -x "$build/engine/nccl_gpu_tests" ] && binaries+=(engine/nccl_gpu_tests)
rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"
for b in "${binaries[@]}"; do
  [ -x "$build/$b" ] || { echo "gpu_bundle: $build/$b is missing; build it first" >&2; exit 2; }
  strip -o "$bundle/bin/$(basename "$b")" "$build/$b"
done
# Every shared library the binaries need except the C/C++ runtime and the CUDA/NCCL libraries,
# which the GPU host provides in versions that match its driver.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libgcc_s|libstdc\+\+|libcudart|libcublas|libcublasLt|libnccl|libcuda\.so)'
for b in "$bundle"/bin/*; do ldd "$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    [[ "$name" =~ $skip ]] || cp -L "$path" "$bundle/lib/$name"
  done
cp scripts/gpu_bundle_run.sh "$bundle/run.sh"
git rev-parse --short HEAD >"$bundle/commit" 2>/dev/null || echo unknown >"$bundle/commit"
echo "gpu_bundle: $bundle ($(du -sh "$bundle" | cut -f1)); on the GPU host: bash $bundle/run.sh [RESULTS_DIR]"
