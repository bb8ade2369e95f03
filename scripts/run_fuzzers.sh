#!/usr/bin/env bash
# Runs every libFuzzer target of a `fuzz` build over its seed corpus (fuzz/corpus/<name>/, read
# only: new inputs go to a temporary directory) and prints one line per target with its
# executions. Usage:
#   scripts/run_fuzzers.sh BUILD_DIR SECONDS        each target for SECONDS (CI: `make fuzz`)
#   scripts/run_fuzzers.sh BUILD_DIR runs=N         each target for N executions
# Exits non-zero when a target finds a crash, a leak, undefined behaviour or a timeout (the
# reproducer is kept in the target's temporary directory, whose path is printed).
set -euo pipefail
cd "$(dirname "$0")/.."
build=$1
budget=$2
if [[ "$budget" == runs=* ]]; then
  limit=(-runs="${budget#runs=}")
else
  limit=(-max_total_time="$budget")
fi
root=$(pwd)
build=$(cd "$build" && pwd)
status=0
for name in safetensors_header driver_result driver_request_args scenario_params; do
  exe="$build/fuzz/fuzz_$name"
  [ -x "$exe" ] || { echo "missing $exe (build the fuzz preset first)"; exit 2; }
  work=$(mktemp -d "${TMPDIR:-/tmp}/fuzz_$name.XXXXXX")
  mkdir -p "$work/corpus"
  # libFuzzer writes crash reproducers into its working directory: the temporary one.
  if (cd "$work" && "$exe" "${limit[@]}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        "$work/corpus" "$root/fuzz/corpus/$name" >"$work/log.txt" 2>&1); then
    runs=$(grep -E '^stat::number_of_executed_units' "$work/log.txt" | awk '{print $2}')
    echo "fuzz_$name: ok, ${runs:-?} executions ($budget)"
    rm -rf "$work"
  else
    echo "fuzz_$name: FAILED; log and reproducer in $work"
    tail -30 "$work/log.txt"
    status=1
  fi
done
exit $status
