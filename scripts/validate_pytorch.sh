#!/usr/bin/env bash
# `make validate-pytorch VERSION=V`: judges PyTorch V's FSDP2 with the suite (docs/pytorch.md).
#   1. a virtual environment .venv-torch-V/ (ignored by git) with torch==V, safetensors and
#      numpy from PyPI (reused when it already holds torch V);
#   2. `fsdp-conform run FAMILIES --subject external --driver python/fsdp-conform-pytorch
#      --backend gloo --semantics S --max-driver-ranks M --json build/validate-pytorch/V/run.json`,
#      S being the profile of V's release (torch-2.15 from 2.15 on, torch-2.8 from 2.8 on,
#      torch-2.4 before), M the most
#      Python ranks at once (MAX_DRIVER_RANKS, default 8: each is an interpreter with torch,
#      a few hundred MB), CASE_TIMEOUT (default 120 s) the deadline of each case; the driver
#      serves sessions (one process per rank for the whole run);
#   3. the report (python/validate_pytorch/render_report.py): docs/pytorch-V.md, kept in the
#      repository, what passes, what fails and why, naming known PyTorch defects; and its
#      per-case JSON build/validate-pytorch/V/report.json, a build output.
# Usage: scripts/validate_pytorch.sh VERSION BUILD_DIR [FAMILY_PATTERN...]
set -euo pipefail
version=${1:?usage: validate_pytorch.sh VERSION BUILD_DIR [FAMILY_PATTERN...]}
build_dir=${2:?usage: validate_pytorch.sh VERSION BUILD_DIR [FAMILY_PATTERN...]}
shift 2
families=("$@")
if [ ${#families[@]} -eq 0 ]; then
  families=('fully_shard_comm/*' 'fully_shard_autograd/*' 'fully_shard_init/*'
            'fully_shard_registered_params/*'
            'parity/single/*' 'parity/fsdp/*'
            'parity/fsdp1/*' 'fsdp_grad_acc/*' 'fsdp_tp_integration/*' 'parity/tp/*'
            'fully_shard_state_dict/*' 'fsdp_state_dict/*' 'fsdp_unshard_params/*' 'checkpoint/*'
            'fully_shard_training/*' 'fully_shard_frozen/*' 'fsdp_prefetch/*'
            'fully_shard_mixed_precision/*' 'fsdp_wrap/*' 'collectives/*' 'models/*'
            'dtensor/*')
fi
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.venv-torch-$version"
python="$venv/bin/python"
if ! "$python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$version')" \
    2>/dev/null; then
  python3 -m venv "$venv"
  "$python" -m pip install --quiet "torch==$version" safetensors numpy
fi
torch_version=$("$python" -c "import torch; print(torch.__version__)")
semantics=$("$python" -c "
import torch
major, minor = (int(x) for x in torch.__version__.split('.')[:2])
print('torch-2.15' if (major, minor) >= (2, 15) else
      'torch-2.8' if (major, minor) >= (2, 8) else 'torch-2.4')")
out="$root/build/validate-pytorch/$version"
mkdir -p "$out"
command=(fsdp-conform run "${families[@]}" --subject external
         --driver python/fsdp-conform-pytorch --backend gloo --semantics "$semantics"
         --max-driver-ranks "${MAX_DRIVER_RANKS:-8}" --timeout "${CASE_TIMEOUT:-120}"
         --json "build/validate-pytorch/$version/run.json")
status=0
(cd "$root" && FSDP_CONFORM_PYTHON="$python" "$build_dir/tools/${command[0]}" \
   "${command[@]:1}" | tee "$out/run.txt") || status=$?
# 0: everything passed; 1: some case failed (the report says which and why); else no run.
if [ "$status" -gt 1 ]; then
  echo "validate-pytorch: fsdp-conform run exited $status" >&2
  exit "$status"
fi
printf -v shown '%q ' "${command[@]}"
"$python" "$root/python/validate_pytorch/render_report.py" --run "$out/run.json" \
  --version "$version" --torch-version "$torch_version" --markdown "$root/docs/pytorch-$version.md" \
  --json "$out/report.json" --command "FSDP_CONFORM_PYTHON=.venv-torch-$version/bin/python ${shown% }"
echo "validate-pytorch: docs/pytorch-$version.md, $out/report.json"
