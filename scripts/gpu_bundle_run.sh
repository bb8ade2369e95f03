#!/usr/bin/env bash
# The GPU checks of scripts/gpu_check.sh, run from a bundle made by scripts/gpu_bundle.sh (copied
# into the bundle as run.sh): the GPU-labelled gtest suites, every conformance family over NCCL
# (in parallel groups, one rank per GPU, at most 2) and pg-bench over NCCL. Each group's table
# and --json report go to RESULTS_DIR (default ./gpu-results); the summary to stdout.
# Exit status: 0 when everything passed, 1 otherwise, 2 without a visible GPU.
set -u
bundle=$(cd "$(dirname "$0")" && pwd)
results=$(mkdir -p "${1:-gpu-results}" && cd "${1:-gpu-results}" && pwd)
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_bundle_run: no GPU visible (nvidia-smi -L failed); nothing to run" >&2
  exit 2
fi
# cudart, cuBLAS and NCCL of the host: the CUDA toolkit or the nvidia-* wheels.
libdirs=$(for n in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
            find /usr/local /opt /usr/lib -name "$n" 2>/dev/null | head -1 | xargs -r dirname
          done | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="$bundle/lib:$libdirs${LD_LIBRARY_PATH:-}"
gpus=$(nvidia-smi -L | wc -l)
world=$(( gpus < 2 ? gpus : 2 ))
{
  echo "commit $(cat "$bundle/commit" 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  for b in "$bundle"/bin/*; do ldd "$b" | grep "not found" | sed "s|^|$(basename "$b"): |"; done
} >"$results/env.txt" 2>&1
cat "$results/env.txt"
cd "$bundle/bin" || exit 2
rc="$results/status.txt"; : >"$rc"
step() {  # step NAME TIMEOUT COMMAND...: runs in the background, output in NAME.txt
  local name=$1 limit=$2; shift 2
  ( timeout "$limit" "$@" >"$results/$name.txt" 2>&1; echo "$name $?" >>"$rc" ) &
}
step ops_cuda 300 ./ops_cuda_tests
step engine_gpu 300 ./engine_tests --gtest_filter='*Gpu*:Cuda*'
step fsdp_gpu 300 ./fsdp_tests --gtest_filter='*Gpu*'
[ -x ./nccl_gpu_tests ] && step nccl_gpu 300 ./nccl_gpu_tests
i=0
set -f  # the patterns below are words for fsdp-conform, not file globs
while IFS= read -r patterns; do
  i=$((i + 1))
  # shellcheck disable=SC2086
  step "conform$i" 600 ./fsdp-conform run $patterns --backend nccl --world "$world" \
    --timeout 120 --json "$results/conform$i.json"
done <<'GROUPS'
fully_shard_* parity/fsdp/*
fsdp_state_dict/* checkpoint/*
collectives/all_gather collectives/all_gather_into_tensor
collectives/all_reduce
collectives/barrier collectives/broadcast
collectives/reduce_scatter_tensor --param in_place=True
collectives/reduce_scatter_tensor --param in_place=False
faults/* models/* parity/single/* parity/fsdp1/* parity/tp/*
fsdp_grad_acc/* fsdp_tp_integration/*
GROUPS
set +f
wait
FSDP_BACKEND=nccl timeout 120 ./fsdp-launch --nproc-per-node "$world" -- \
  ./pg-bench --backend nccl -b 1K -e 256M -f 4 >"$results/pg_bench_nccl.txt" 2>&1
echo "pg_bench_nccl $?" >>"$rc"
status=0
while read -r name code; do
  # fsdp-conform exits 3 when every case of a group was skipped (it says why per case).
  case "$name:$code" in *:0 | conform*:3) ;; *) status=1 ;; esac
done <"$rc"
sort "$rc"
for f in "$results"/conform*.txt; do echo "$(basename "$f"): $(tail -n 1 "$f")"; grep FAIL "$f"; done
grep -h -E '^\[ +(PASSED|FAILED|SKIPPED) +\] [0-9]' "$results"/*_gpu.txt "$results"/ops_cuda.txt
exit "$status"
