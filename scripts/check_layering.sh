#!/usr/bin/env bash
# Enforces the dependency arrows of docs/architecture: reference/ includes nothing of ours,
# engine/ never includes fakes/, conformance/ or reference/, fakes/ never includes conformance/.
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0
check() {  # check DIR PATTERN MESSAGE
  local hits
  hits=$(grep -rEn --include='*.h' --include='*.cc' --include='*.cu' --include='*.cuh' "$2" "$1" 2>/dev/null || true)
  if [ -n "$hits" ]; then
    echo "layering violation: $3"; echo "$hits"; fail=1
  fi
}
check reference '#include *"(engine|fakes|conformance|tools)/' "reference/ must depend on Eigen and std only"
check engine '#include *"(fakes|conformance|reference|tools)/' "engine/ must not include fakes/, conformance/, reference/ or tools/"
check fakes '#include *"(conformance|reference|tools)/' "fakes/ must not include conformance/, reference/ or tools/"
if [ "$fail" -ne 0 ]; then exit 1; fi
echo "layering: ok"
