#!/usr/bin/env bash
# Enforces the dependency arrows of docs/architecture: reference/ includes nothing of ours,
# engine/ never includes conformance/, reference/ or tools/ (and only its tests include
# fakes/), fakes/ never includes conformance/. Inside engine/, every non-test source (any file
# not ending in _test.cc) includes only the layers its folder may use:
#
#   core        -> core
#   ops         -> core                     (engine/ops/cuda included: raw kernels, no autograd)
#   autograd    -> core                     (its gradient sums have their own loops, no kernels)
#   functional  -> core, ops, autograd      (the differentiable API on top of both)
#   nn          -> core, ops, autograd, functional
#   optim       -> core, ops, autograd, functional, nn
#   distributed -> core                     (distributed/store/ -> core and store only;
#                                            distributed/gloo/ and distributed/nccl/ never
#                                            include each other; distributed/launch/, the
#                                            process launcher, -> core and distributed but
#                                            no backend folder)
#   serialization -> core, nn               (safetensors files, atomic writes, checkpoints of
#                                            nn::StateDict: index, rank files, N -> M reads)
#   fsdp        -> core, ops, autograd, functional, nn, optim, distributed, tensor_parallel
#                                           (FSDP2 over tensor-parallel parameters)
#   fsdp1       -> core, ops, autograd, functional, nn, optim, distributed, fsdp,
#                  tensor_parallel           (its DTensor extension: FSDP1 over a TP model)
#   checkpoint  -> core, ops, autograd, functional, nn, optim, distributed, serialization,
#                  fsdp                      (get/set_model_state_dict, checkpoint save/load)
#   ddp         -> core, ops, autograd, functional, nn, optim, distributed
#   tensor_parallel -> core, ops, autograd, functional, nn, optim, distributed
#                                           (DTensor, redistribution, parallel styles)
#   testing     -> anything in engine/      (test-only helpers, library fsdp_testing)
#
# (every layer may include itself). Engine tests (*_test.cc) may include any of engine/ and
# fakes/, never conformance/, reference/ or tools/. Quoted includes in engine/ name a path
# from the repository root (engine/..., fakes/... in tests, or the generated fsdp/config.h).
# Prints one line per violation (file:line, the include, the rule) and exits 1 on any.
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
check fakes '#include *"(conformance|reference|tools)/' "fakes/ must not include conformance/, reference/ or tools/"

# The layers engine/<layer>/ may include (besides itself), for non-test sources.
declare -A allowed=(
  [core]=""
  [ops]="core"
  [autograd]="core"
  [functional]="core ops autograd"
  [nn]="core ops autograd functional"
  [optim]="core ops autograd functional nn"
  [distributed]="core"
  [serialization]="core nn"
  [fsdp]="core ops autograd functional nn optim distributed tensor_parallel"
  [fsdp1]="core ops autograd functional nn optim distributed fsdp tensor_parallel"
  [checkpoint]="core ops autograd functional nn optim distributed serialization fsdp"
  [ddp]="core ops autograd functional nn optim distributed"
  [tensor_parallel]="core ops autograd functional nn optim distributed"
  [testing]="core ops autograd functional nn optim distributed serialization fsdp fsdp1 checkpoint ddp tensor_parallel"
)

violation() {  # violation FILE:LINE INCLUDE RULE
  echo "layering violation: $1 includes \"$2\" ($3)"
  fail=1
}

# file:line:#include "path" for every quoted include under engine/ (tests and sources; a
# test may include only engine/, fakes/ and fsdp/config.h, so never conformance/, reference/
# or tools/).
while IFS= read -r hit; do
  file=${hit%%:*}
  rest=${hit#*:}
  line=${rest%%:*}
  [[ "${rest#*:}" =~ \"([^\"]*)\" ]] || continue
  inc=${BASH_REMATCH[1]}
  where="$file:$line"
  rel=${file#engine/}
  layer=${rel%%/*}
  if [[ "$rel" != */* ]]; then
    violation "$where" "$inc" "engine/ sources live in a layer folder (engine/<layer>/)"
    continue
  fi
  if [[ "$file" == *_test.cc ]]; then
    # Tests: any engine layer (the testing library included) and the fakes.
    case "$inc" in
      engine/* | fakes/* | fsdp/config.h) ;;
      *) violation "$where" "$inc" "engine tests include engine/..., fakes/... or fsdp/config.h" ;;
    esac
    continue
  fi
  case "$inc" in
    fsdp/config.h) continue ;;
    engine/*) ;;
    fakes/*)
      violation "$where" "$inc" "only engine tests (*_test.cc) may include fakes/"
      continue ;;
    *)
      violation "$where" "$inc" "quoted includes in engine/ name a path from the repository root"
      continue ;;
  esac
  if [[ -z "${allowed[$layer]+set}" ]]; then
    violation "$where" "$inc" "engine/$layer/ has no layer rule in scripts/check_layering.sh"
    continue
  fi
  target_rel=${inc#engine/}
  target=${target_rel%%/*}
  if [[ "$target" != "$layer" && " ${allowed[$layer]} " != *" $target "* ]]; then
    violation "$where" "$inc" "engine/$layer/ may include only: $layer${allowed[$layer]:+ ${allowed[$layer]}}"
    continue
  fi
  # Inside engine/distributed: the store is below everything else; backends are siblings.
  if [[ "$layer" == distributed ]]; then
    sub=${rel#distributed/}
    sub=${sub%%/*}
    if [[ "$rel" == distributed/store/* && "$inc" != engine/core/* && "$inc" != engine/distributed/store/* ]]; then
      violation "$where" "$inc" "engine/distributed/store/ may include only core and distributed/store"
    elif [[ "$sub" == gloo && "$inc" == engine/distributed/nccl/* ]] ||
         [[ "$sub" == nccl && "$inc" == engine/distributed/gloo/* ]]; then
      violation "$where" "$inc" "engine/distributed/gloo/ and engine/distributed/nccl/ must not include each other"
    elif [[ "$sub" == launch && ( "$inc" == engine/distributed/gloo/* || "$inc" == engine/distributed/nccl/* ) ]]; then
      violation "$where" "$inc" "engine/distributed/launch/ may include only core and distributed (no backend folder)"
    fi
  fi
done < <(grep -rEn --include='*.h' --include='*.cc' --include='*.cu' --include='*.cuh' \
           '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' engine | sort)

if [ "$fail" -ne 0 ]; then exit 1; fi
echo "layering: ok"
