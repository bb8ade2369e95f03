#!/usr/bin/env bash
# Idempotent installation of everything the build needs, from Debian's packages.
# Safe to run repeatedly: packages already present are skipped without touching apt.
# CUDA and NCCL are not apt packages here; they come with the machine image and are optional.
set -euo pipefail

packages=(
  cmake ninja-build g++ make ccache
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  libgloo-dev libeigen3-dev nlohmann-json3-dev
  clang-tidy cppcheck
  clang libclang-rt-14-dev
  python3 python3-venv
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all build dependencies present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
