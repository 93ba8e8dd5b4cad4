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
mkdir -p "$cache/partial"
scratch=$(mktemp -d /var/tmp/caf-hvd-demo.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch"/{upper,work,root,src}
git archive HEAD | tar -x -C "$scratch/src"
echo "demo_fresh: $(git rev-parse --short HEAD) in a fresh bookworm minbase tree; .debs cached in $cache"
# private mount and PID namespaces: the overlay and every process go with them
unshare --mount --propagation private --pid --fork --kill-child sh -c '
  set -eu
  s=$1 tree=$2 cache=$3
  r=$s/root
  mount -t overlay overlay -o "lowerdir=$tree,upperdir=$s/upper,workdir=$s/work" "$r"
  mount -t proc proc "$r/proc"
  mount --rbind /sys "$r/sys"
  mount --rbind /dev "$r/dev"
  mkdir -p "$r/src"
  mount --bind "$s/src" "$r/src"
  mount --bind "$cache" "$r/var/cache/apt/archives"
  rm -f "$r/etc/apt/apt.conf.d/docker-clean"  # keep what apt downloads
  exec chroot "$r" /bin/bash -c "
    export DEBIAN_FRONTEND=noninteractive PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
    cd /src
    start=\$(date +%s%N)
    took() { local d=\$(( (\$(date +%s%N) - start) / 100000000 )); echo \$((d / 10)).\$((d % 10)); }
    scripts/demo.sh 2>&1 | while IFS= read -r line; do
      printf \"%6s s  %s\\n\" \"\$(took)\" \"\$line\"
    done
    rc=\${PIPESTATUS[0]}
    echo \"demo_fresh: scripts/demo.sh exited \$rc after \$(took) s\"
    exit \$rc"
' sh "$scratch" "$tree" "$cache"
