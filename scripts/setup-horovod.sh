#!/usr/bin/env bash
# Builds real Horovod (CPU, Gloo, PyTorch) from the vendored source tarball for
# /usr/bin/python3 and installs it into a cache outside the checkout, keyed by the
# tarball's checksum, so repeated test runs on one machine do not rebuild.
# usage: scripts/setup-horovod.sh [TARBALL]
# Prints the install directory (for PYTHONPATH) as its last line; exits non-zero with
# the reason when the build fails.
set -euo pipefail
cd "$(dirname "$0")/.."
tarball=${1:-${CAF_HVD_HOROVOD_TARBALL:-../shared/vendor/horovod-0.28.1-src.tar.xz}}
[ -f "$tarball" ] || { echo "setup-horovod: no Horovod source tarball at $tarball" >&2; exit 2; }
tarball=$(realpath "$tarball")
cache_root=${CAF_HVD_CACHE:-/var/cache/caf-hvd}
sum=$(sha256sum "$tarball" | cut -c1-16)
dest="$cache_root/horovod-$sum"
if [ -f "$dest/.complete" ]; then
  echo "$dest/site"
  exit 0
fi

sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
packages=(cmake make g++ python3-dev python3-pip python3-setuptools python3-wheel
          python3-torch libtorch-dev libeigen3-dev python3-cloudpickle python3-psutil
          python3-yaml python3-packaging python3-cffi python3-pytest python3-mock
          python3-parameterized)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup-horovod: installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

$sudo mkdir -p "$cache_root"
work=$(mktemp -d "$cache_root/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
log="$cache_root/horovod-$sum.build.log"
echo "setup-horovod: building Horovod from $(basename "$tarball") (a few minutes; log: $log)" >&2
tar -xJf "$tarball" -C "$work"
src=$(find "$work" -mindepth 1 -maxdepth 1 -type d | head -1)
[ -f "$src/setup.py" ] || { echo "setup-horovod: $tarball holds no setup.py" >&2; exit 2; }
# Eigen is not in the tarball (its submodule lives outside GitHub): Debian's works.
rm -rf "$src/third_party/eigen"
ln -s /usr/include/eigen3 "$src/third_party/eigen"

# Horovod's CMake turns CUDA on wherever a toolkit is installed, even for a CPU build.
cat >"$work/cmake" <<'EOF'
#!/bin/sh
case "$1" in
  --build|-E|--version|--install) exec /usr/bin/cmake "$@" ;;
esac
exec /usr/bin/cmake -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON \
  -DCMAKE_CUDA_COMPILER=CMAKE_CUDA_COMPILER-NOTFOUND "$@"
EOF
chmod +x "$work/cmake"

build_env=(env -u CUDA_HOME -u CUDA_PATH -u CUDACXX
  PATH="/usr/bin:/bin:/usr/sbin:/sbin"
  HOROVOD_CMAKE="$work/cmake" HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_MPI=1
  HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
  HOROVOD_GPU_OPERATIONS= HOROVOD_CPU_OPERATIONS=GLOO MAKEFLAGS=-j"$(nproc)")
if ! (cd "$src" && "${build_env[@]}" /usr/bin/python3 setup.py build) >"$log" 2>&1; then
  echo "setup-horovod: Horovod's build failed; the last lines of $log:" >&2
  tail -30 "$log" >&2
  exit 1
fi
rm -rf "$dest.partial"
mkdir -p "$dest.partial"
if ! (cd "$src" && "${build_env[@]}" /usr/bin/python3 -m pip install --no-deps \
      --no-build-isolation --no-index --target "$dest.partial/site" .) >>"$log" 2>&1; then
  echo "setup-horovod: installing the built Horovod failed; the last lines of $log:" >&2
  tail -30 "$log" >&2
  exit 1
fi
# Horovod's own tests run from a copy of test/ (from the source root the unbuilt
# package would shadow the installed one).
cp -a "$src/test" "$dest.partial/test"
if ! out=$(PYTHONPATH="$dest.partial/site" /usr/bin/python3 -c \
      "import horovod.torch as h; print(h.gloo_built(), h.mpi_built())" 2>&1) \
   || [ "$out" != "True False" ]; then
  echo "setup-horovod: the built Horovod does not import with Gloo: $out" >&2
  exit 1
fi
rm -rf "$dest"
mv "$dest.partial" "$dest"
touch "$dest/.complete"
echo "$dest/site"
