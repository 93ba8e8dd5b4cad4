#!/usr/bin/env bash
# Builds a minimal Debian 12 (bookworm, debootstrap --variant=minbase) tree once per
# machine, in a cache outside the checkout, with fresh package lists: the clean machine
# the package tests install caf-hvd's .deb into (each run on a throw-away overlay).
# usage: scripts/setup-deb-chroot.sh
# Prints the tree's directory as its last line. Exits 2 when no package mirror could be
# reached (the tests then skip, saying why), 1 on any other failure, with the reason.
set -euo pipefail
cache_root=${CAF_HVD_CACHE:-/var/cache/caf-hvd}
dest="$cache_root/bookworm-minbase"
if [ -f "$dest/.complete" ]; then
  echo "$dest"
  exit 0
fi
[ "$(id -u)" -eq 0 ] || { echo "setup-deb-chroot: needs root (debootstrap, chroot)" >&2; exit 1; }

mirror=$("$(dirname "$0")/debian-mirror.sh")

mkdir -p "$cache_root"
exec 9>"$cache_root/bookworm-minbase.lock"
flock -w 1800 9 || { echo "setup-deb-chroot: another build held $cache_root/bookworm-minbase.lock for 30 min" >&2; exit 1; }
if [ -f "$dest/.complete" ]; then
  echo "$dest"
  exit 0
fi
if ! command -v debootstrap >/dev/null; then
  echo "setup-deb-chroot: installing debootstrap" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; } \
    || { echo "setup-deb-chroot: debootstrap could not be installed (no package mirror?)" >&2; exit 2; }
fi
for old in "$cache_root"/bookworm-minbase.partial.*; do
  [ -d "$old" ] || continue
  findmnt -rn -o TARGET | grep -q "^$old/" || rm -rf "$old"
done
work=$(mktemp -d "$cache_root/bookworm-minbase.partial.XXXXXX")
chmod 755 "$work"
log="$cache_root/bookworm-minbase.build.log"
: >"$log"
cleanup() {
  if findmnt -rn -o TARGET | grep -q "^$work/"; then
    echo "setup-deb-chroot: $work still has mounts; left in place" >&2
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT

echo "setup-deb-chroot: building Debian bookworm (minbase) from $mirror into $dest (about a minute; log: $log)" >&2
if ! debootstrap --variant=minbase bookworm "$work" "$mirror" >>"$log" 2>&1; then
  if grep -qE "Failed getting release file|Couldn't download|Temporary failure resolving|Could not resolve|unable to fetch" "$log"; then
    echo "setup-deb-chroot: the Debian mirror $mirror could not be reached; the last lines of $log:" >&2
    tail -5 "$log" >&2
    exit 2
  fi
  echo "setup-deb-chroot: debootstrap failed; the last lines of $log:" >&2
  tail -20 "$log" >&2
  exit 1
fi
if ! "$(dirname "$0")/in-torch-chroot.sh" "$work" -- /usr/bin/env DEBIAN_FRONTEND=noninteractive \
     sh -c 'apt-get update -qq && apt-get clean' >>"$log" 2>&1; then
  echo "setup-deb-chroot: apt-get update in the tree failed; the last lines of $log:" >&2
  tail -20 "$log" >&2
  grep -qE "Temporary failure resolving|Could not resolve|Failed to fetch|Unable to connect" "$log" && exit 2
  exit 1
fi
rm -rf "$dest"
mv "$work" "$dest"
touch "$dest/.complete"
echo "setup-deb-chroot: bookworm minbase in $dest" >&2
echo "$dest"
