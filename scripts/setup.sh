#!/usr/bin/env bash
# Installs what caf-hvd needs from Debian (bookworm) when it is missing, then builds it.
# usage: scripts/setup.sh [--demo] [BUILD_DIR] [extra meson setup options...]
#   --demo: only the packages the build needs and only the programs the local demo runs
#           (caf-hvd, its shim and network module, caf-hvd-allreduce), with a line per
#           stage; without it, every package the suites use and every target.
set -euo pipefail
cd "$(dirname "$0")/.."
demo=0
if [ "${1:-}" = --demo ]; then
  demo=1
  shift
fi
build=${1:-build}
shift || true
say() { if ((demo)); then echo "caf-hvd demo: $*" >&2; fi; }

packages=(g++ meson ninja-build pkg-config cmake python3 libcaf-dev libfmt-dev
          libboost-dev libboost-program-options-dev doctest-dev libgloo-dev libssl-dev nlohmann-json3-dev libyaml-cpp-dev)
targets=()
if ((demo)); then
  targets=(apps/caf-hvd apps/caf-hvd-exec apps/caf-hvd-net.so apps/caf-hvd-allreduce)
else
  packages+=(iproute2 util-linux openssl python3-cloudpickle help2man dpkg-dev lintian python3-pip
             python3-venv python3-setuptools python3-sphinx python3-myst-parser
             python3-sphinx-rtd-theme)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "caf-hvd setup: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -f "$build/build.ninja" ]; then
  say "configuring $build"
  meson setup "$build" "$@" >/dev/null
elif (($#)); then
  meson configure "$build" "$@" >/dev/null
fi
say "building ${targets[*]:-everything} (the first time takes a few minutes)"
if ((demo)); then
  log=$(mktemp)
  if ! ninja -C "$build" "${targets[@]}" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
else
  ninja -C "$build"
fi
