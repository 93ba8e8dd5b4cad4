#!/usr/bin/env bash
# Runs a command as root in a fresh Debian 12 tree (scripts/setup-deb-chroot.sh's) on a
# throw-away overlay, in private mount and PID namespaces: the overlay, /proc, /sys, /dev
# and the binds vanish with them, and every process the command starts dies with it.
# usage: scripts/fresh-bookworm-run.sh TREE SCRATCH ARCHIVES SRC DST COMMAND [ARGS...]
#   TREE      the minbase tree (the overlay's lower layer, never written)
#   SCRATCH   an empty directory of the caller's for the overlay's layers
#   ARCHIVES  bound at /var/cache/apt/archives: downloaded .debs outlive the run
#   SRC DST   a directory of this machine, bound at DST inside
# The command's exit status is this script's.
set -euo pipefail
(($# >= 6)) || { echo "usage: $0 TREE SCRATCH ARCHIVES SRC DST COMMAND [ARGS...]" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "fresh-bookworm-run: needs root (chroot, mounts)" >&2; exit 1; }
mkdir -p "$2"/{upper,work,root} "$3/partial"
exec unshare --mount --propagation private --pid --fork --kill-child sh -c '
  set -eu
  tree=$1 s=$2 archives=$3 src=$4 dst=$5
  shift 5
  r=$s/root
  mount -t overlay overlay -o "lowerdir=$tree,upperdir=$s/upper,workdir=$s/work" "$r"
  mount -t proc proc "$r/proc"
  mount --rbind /sys "$r/sys"
  mount --rbind /dev "$r/dev"
  mkdir -p "$r$dst"
  mount --bind "$src" "$r$dst"
  mount --bind "$archives" "$r/var/cache/apt/archives"
  rm -f "$r/etc/apt/apt.conf.d/docker-clean"  # keep what apt downloads
  exec chroot "$r" "$@"
' sh "$@"
