#!/usr/bin/env bash
# Builds a Debian 13 (trixie) tree with Debian's python3-torch (torch 2.6) once per
# machine, in a cache outside the checkout, for the torch 2.x tests and bench/compare.py
# (bookworm's own python3-torch is 1.13). Ranks run in it with scripts/in-torch-chroot.sh.
# usage: scripts/setup-torch-chroot.sh
# Prints the tree's directory as its last line. Exits 2 when no package mirror could be
# reached (the tests then skip, saying why), 1 on any other failure, with the reason.
set -euo pipefail
torch_version=2.6
cache_root=${CAF_HVD_CACHE:-/var/cache/caf-hvd}
dest="$cache_root/trixie-torch-$torch_version"
if [ -f "$dest/.complete" ]; then
  echo "$dest"
  exit 0
fi
[ "$(id -u)" -eq 0 ] || { echo "setup-torch-chroot: needs root (debootstrap, chroot)" >&2; exit 1; }

mirror=$("$(dirname "$0")/debian-mirror.sh")

mkdir -p "$cache_root"
# One build at a time per machine; a second caller waits for it and takes its result.
exec 9>"$cache_root/trixie-torch.lock"
flock -w 1800 9 || { echo "setup-torch-chroot: another build held $cache_root/trixie-torch.lock for 30 min" >&2; exit 1; }
if [ -f "$dest/.complete" ]; then
  echo "$dest"
  exit 0
fi

if ! command -v debootstrap >/dev/null; then
  echo "setup-torch-chroot: installing debootstrap" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; } \
    || { echo "setup-torch-chroot: debootstrap could not be installed (no package mirror?)" >&2; exit 2; }
fi

# Earlier builds that were interrupted (this one holds the lock) are removed.
for old in "$cache_root/trixie-torch-$torch_version".partial.*; do
  [ -d "$old" ] || continue
  findmnt -rn -o TARGET | grep -q "^$old/" || rm -rf "$old"
done
work=$(mktemp -d "$cache_root/trixie-torch-$torch_version.partial.XXXXXX")
chmod 755 "$work"
log="$cache_root/trixie-torch-$torch_version.build.log"
: >"$log"
# Mounts are made only in private mount namespaces (in-torch-chroot.sh), which vanish
# with their process; a tree that still has mounts in it is never deleted.
cleanup() {
  if findmnt -rn -o TARGET | grep -q "^$work/"; then
    echo "setup-torch-chroot: $work still has mounts; left in place" >&2
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT
in_tree=("$(dirname "$0")/in-torch-chroot.sh" "$work" --)

echo "setup-torch-chroot: building Debian trixie with python3-torch from $mirror into $dest (a few minutes, about 1.6 GB; log: $log)" >&2
if ! debootstrap --variant=minbase trixie "$work" "$mirror" >>"$log" 2>&1; then
  if grep -qE "Failed getting release file|Couldn't download|Temporary failure resolving|Could not resolve|unable to fetch" "$log"; then
    echo "setup-torch-chroot: the Debian mirror $mirror could not be reached; the last lines of $log:" >&2
    tail -5 "$log" >&2
    exit 2
  fi
  echo "setup-torch-chroot: debootstrap failed; the last lines of $log:" >&2
  tail -20 "$log" >&2
  exit 1
fi
if ! "${in_tree[@]}" /usr/bin/env DEBIAN_FRONTEND=noninteractive sh -c \
     'apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-torch && apt-get clean' \
     >>"$log" 2>&1; then
  echo "setup-torch-chroot: installing python3-torch in the trixie tree failed; the last lines of $log:" >&2
  tail -20 "$log" >&2
  grep -qE "Temporary failure resolving|Could not resolve|Failed to fetch|Unable to connect" "$log" && exit 2
  exit 1
fi
version=$("${in_tree[@]}" /usr/bin/python3 -c \
  "import torch, torch.distributed; print(torch.__version__)" 2>>"$log") || {
  echo "setup-torch-chroot: torch does not import in the trixie tree; the last lines of $log:" >&2
  tail -20 "$log" >&2
  exit 1
}
case "$version" in
  "$torch_version".*) ;;
  *) echo "setup-torch-chroot: trixie's python3-torch is $version, not $torch_version" >&2; exit 1 ;;
esac
rm -rf "$dest"
mv "$work" "$dest"
touch "$dest/.complete"
echo "setup-torch-chroot: torch $version in $dest" >&2
echo "$dest"
