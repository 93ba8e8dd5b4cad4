#!/usr/bin/env bash
# Installs what caf-hvd needs from Debian (bookworm) when it is missing, then builds it.
# usage: scripts/setup.sh [BUILD_DIR] [extra meson setup options...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true

packages=(g++ meson ninja-build pkg-config cmake python3 libcaf-dev libfmt-dev
          libboost-dev libboost-program-options-dev doctest-dev libgloo-dev libssl-dev nlohmann-json3-dev libyaml-cpp-dev
          iproute2 util-linux python3-cloudpickle help2man dpkg-dev lintian python3-pip
          python3-venv python3-setuptools python3-sphinx python3-myst-parser python3-sphinx-rtd-theme)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "caf-hvd setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "$@" >/dev/null
elif (($#)); then
  meson configure "$build" "$@" >/dev/null
fi
ninja -C "$build"
