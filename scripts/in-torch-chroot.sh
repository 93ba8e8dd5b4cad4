#!/usr/bin/env bash
# Runs a command in a tree built by scripts/setup-torch-chroot.sh, as a rank of a job:
# the same process (no fork), the same environment and network (the job's servers on
# loopback), with the host's /proc, /sys and /dev, and each DIR given with -b at the
# same path inside. The mounts live in a private mount namespace of this process only,
# so they are gone when it exits, however it ends, and nothing is left mounted on the host.
# usage: scripts/in-torch-chroot.sh TREE [-b DIR]... -- COMMAND [ARG]...
# The working directory is kept when it lies in a -b directory, else it is /.
set -euo pipefail
if [ "${1:-}" = --in-namespace ]; then
  shift
  tree=$1
  shift
  binds=()
  while [ "$1" != -- ]; do
    binds+=("$1")
    shift
  done
  shift
  for m in proc sys dev; do
    mount --rbind "/$m" "$tree/$m"
  done
  for b in ${binds[@]+"${binds[@]}"}; do
    mkdir -p "$tree$b"
    mount --rbind "$b" "$tree$b"
  done
  cwd=/
  for b in ${binds[@]+"${binds[@]}"}; do
    case "$PWD/" in "$b"/*) cwd=$PWD ;; esac
  done
  exec chroot "$tree" /bin/sh -c 'cd "$0" && exec "$@"' "$cwd" "$@"
fi

usage="usage: in-torch-chroot.sh TREE [-b DIR]... -- COMMAND [ARG]..."
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
tree=$1
shift
[ -x "$tree/bin/sh" ] || { echo "in-torch-chroot: $tree is not a Debian tree (no bin/sh)" >&2; exit 2; }
binds=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  [ "$1" = -b ] && [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
  d=$(realpath -e "$2") || { echo "in-torch-chroot: no directory $2" >&2; exit 2; }
  binds+=("$d")
  shift 2
done
[ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
shift
exec unshare --mount --propagation private "$(realpath "$0")" --in-namespace "$(realpath "$tree")" \
  ${binds[@]+"${binds[@]}"} -- "$@"
