#!/usr/bin/env bash
# One command for a GPU host: builds with CUDA, runs every GPU test, the FSDP scenarios over
# NCCL, and pg-bench over NCCL next to the threaded fake, and writes a Markdown report to paste
# into docs/gpu.md ("Honest record"). Nothing here runs without a visible GPU: it says so and
# exits 2.
# Usage: scripts/gpu_check.sh [REPORT]   (default gpu-report.md; build dir build/gpu)
set -uo pipefail
cd "$(dirname "$0")/.."
report="${1:-gpu-report.md}"
build=build/gpu
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no GPU visible (nvidia-smi -L failed); nothing to run" >&2
  exit 2
fi
gpus=$(nvidia-smi -L | wc -l)
world=$(( gpus < 2 ? gpus : 2 ))   # NCCL: one rank per GPU
status=0
run() {  # run TITLE COMMAND...: appends the command, its exit status and its last lines
  local out rc
  out=$("${@:2}" 2>&1); rc=$?
  [ "$rc" = 0 ] || status=1
  { echo "### $1"; echo; echo '```'; echo "\$ ${*:2}"; echo "$out" | tail -n 60; echo "(exit $rc)"; echo '```'; echo; } >>"$report"
}
{
  echo "# GPU run, $(date -u +%F)"; echo
  echo '```'; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nvcc --version | tail -n 2; echo "commit $(git rev-parse --short HEAD 2>/dev/null)"; echo '```'; echo
} >"$report"
run "Configure and build" bash -c "cmake --preset default -B $build >/dev/null && cmake --build $build -j"
run "GPU tests (ctest -L gpu)" ctest --test-dir "$build" -L gpu --output-on-failure
run "All other tests" ctest --test-dir "$build" -LE gpu -j "$(nproc)"
run "FSDP scenarios over NCCL, world $world" \
  "$build/tools/fsdp-conform" run 'fully_shard_*' 'parity/fsdp/*' --backend nccl --world "$world"
if [ "$world" -ge 2 ]; then
  run "pg-bench over NCCL, $world GPUs" env FSDP_BACKEND=nccl "$build/tools/fsdp-launch" \
    --nproc-per-node "$world" -- "$build/tools/pg-bench" --backend nccl -b 1K -e 256M -f 4 -o all
fi
run "pg-bench, threaded fake on the host (reference from the same run)" \
  "$build/tools/pg-bench" --backend threaded --world 2 -b 1K -e 64M -f 8
echo "gpu_check: report in $report (status $status)"
exit "$status"
