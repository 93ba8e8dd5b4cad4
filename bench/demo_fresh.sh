#!/usr/bin/env bash
# A newcomer's first command, timed on a fresh system: scripts/demo.sh from a clean copy
# of HEAD (git archive: no build directory) inside a fresh Debian 12 minbase tree (the one
# the package tests use, scripts/setup-deb-chroot.sh) on a throw-away overlay. The
# downloaded .debs are kept in a cache of their own between runs, so a second run
# measures "with the packages already downloaded" (the package lists are fetched anew
# each time, as setup.sh does). Prints the demo's own stage lines with the seconds since
# the start, its last lines, and the total.
# usage: bench/demo_fresh.sh            (root: chroot, mounts; needs a Debian mirror)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "demo_fresh: needs root (chroot, mounts)" >&2; exit 1; }
tree=$(scripts/setup-deb-chroot.sh | tail -1)
cache=${CAF_HVD_CACHE:-/var/cache/caf-hvd}/bookworm-demo-debs
scratch=$(mktemp -d /var/tmp/caf-hvd-demo.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/src"
git archive HEAD | tar -x -C "$scratch/src"
echo "demo_fresh: $(git rev-parse --short HEAD) in a fresh bookworm minbase tree; .debs cached in $cache"
scripts/fresh-bookworm-run.sh "$tree" "$scratch/overlay" "$cache" "$scratch/src" /src /bin/bash -c '
  export DEBIAN_FRONTEND=noninteractive PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
  cd /src
  start=$(date +%s%N)
  took() { local d=$(( ($(date +%s%N) - start) / 100000000 )); echo $((d / 10)).$((d % 10)); }
  scripts/demo.sh 2>&1 | while IFS= read -r line; do
    printf "%6s s  %s\n" "$(took)" "$line"
  done
  rc=${PIPESTATUS[0]}
  echo "demo_fresh: scripts/demo.sh exited $rc after $(took) s"
  exit $rc'
