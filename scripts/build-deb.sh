#!/usr/bin/env bash
# Builds the Debian package caf-hvd_VERSION_ARCH.deb: `meson install` of a build
# configured for /usr into a staging tree, then dpkg-deb (see docs/cluster.md, "Install on a
# cluster"). Dependencies come from dpkg-shlibdeps (Debian's libraries) plus python3,
# python3-cloudpickle and adduser.
# usage: scripts/build-deb.sh [--build-dir DIR] [--out DIR]
#   Without --build-dir: a release build in build-deb/ (set up here, --prefix=/usr, with
#   Debian's hardening flags). --build-dir: an existing build configured with
#   --prefix=/usr (the tests package build-test's binaries, which saves a second compile).
#   --out: where the .deb goes (default: the current directory). Prints its path last.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build="" out=$PWD
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build=$(realpath -m "$2"); shift 2 ;;
    --out) out=$(realpath -m "$2"); shift 2 ;;
    *) echo "usage: scripts/build-deb.sh [--build-dir DIR] [--out DIR]" >&2; exit 2 ;;
  esac
done
die() { echo "build-deb: $*" >&2; exit 1; }
for tool in dpkg-deb dpkg-shlibdeps help2man; do
  command -v "$tool" >/dev/null \
    || die "$tool is missing (apt-get install dpkg-dev help2man)"
done

if [ -z "$build" ]; then
  build=$src/build-deb
  if [ ! -f "$build/build.ninja" ]; then
    # Debian's hardening flags (fortify, stack protector, relro, bindnow), as its own
    # packages are built.
    export DEB_BUILD_MAINT_OPTIONS=hardening=+all
    CPPFLAGS=$(dpkg-buildflags --get CPPFLAGS) CXXFLAGS=$(dpkg-buildflags --get CXXFLAGS) \
      LDFLAGS=$(dpkg-buildflags --get LDFLAGS) \
      "$src/scripts/setup.sh" "$build" --prefix=/usr --buildtype=release -Dman=enabled
  fi
fi
[ -f "$build/build.ninja" ] || die "$build is not a meson build directory"
options=$(meson introspect --buildoptions "$build")
option() { python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == sys.argv[1]))' "$1" <<<"$options"; }
[ "$(option prefix)" = /usr ] \
  || die "$build is configured with --prefix=$(option prefix); a package needs /usr (meson configure $build -Dprefix=/usr)"
[ "$(option sysconfdir)" = /etc ] || die "$build has sysconfdir $(option sysconfdir), not /etc"
ninja -C "$build" >/dev/null || die "the build in $build failed (run ninja -C $build)"

version=$(meson introspect --projectinfo "$build" | python3 -c 'import json,sys; print(json.load(sys.stdin)["version"])')
arch=$(dpkg --print-architecture)
maintainer=${CAF_HVD_MAINTAINER:-"caf-hvd maintainers <caf-hvd@users.noreply.github.com>"}
mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/caf-hvd-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
stage=$work/caf-hvd
meson install -C "$build" --no-rebuild --strip --quiet --destdir "$stage" >/dev/null \
  || die "meson install from $build failed"
[ -f "$stage/usr/share/man/man1/caf-hvd.1" ] \
  || die "$build installs no man pages (help2man was missing when it was set up: meson configure $build -Dman=enabled)"

# Debian's layout: units in /lib/systemd/system (bookworm), man pages and the changelog
# compressed, no byte code (postinst compiles it, prerm removes it).
if [ -d "$stage/usr/lib/systemd/system" ]; then
  mkdir -p "$stage/lib/systemd"
  mv "$stage/usr/lib/systemd/system" "$stage/lib/systemd/system"
  rmdir "$stage/usr/lib/systemd"
fi
find "$stage" -name __pycache__ -prune -exec rm -rf {} +
find "$stage/usr/share/man" -type f -exec gzip -9n {} +
doc=$stage/usr/share/doc/caf-hvd
install -d "$doc"
install -m 644 "$src/packaging/debian/copyright" "$doc/copyright"
commit=$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)
date=$(git -C "$src" log -1 --format=%cD 2>/dev/null || date -R)
printf 'caf-hvd (%s) unstable; urgency=medium\n\n  * Built from the caf-hvd tree at commit %s.\n\n -- %s  %s\n' \
  "$version" "$commit" "$maintainer" "$date" | gzip -9n >"$doc/changelog.gz"
find "$stage" -type d -exec chmod 755 {} +
find "$stage" -type f -exec chmod go-w {} +

# Dependencies: the shared libraries the binaries link (dpkg-shlibdeps wants a
# debian/control beside it), and what the Python package and the scripts need.
mkdir -p "$work/debian"
printf 'Source: caf-hvd\n\nPackage: caf-hvd\nArchitecture: any\n' >"$work/debian/control"
netmod=$(find "$stage/usr/lib" -path '*/caf-hvd/caf-hvd-net.so' | head -n 1)
[ -n "$netmod" ] || die "the install has no network module (caf-hvd-net.so)"
shlibs=$(cd "$work" && dpkg-shlibdeps -O -e "$stage"/usr/bin/caf-hvd -e "$stage"/usr/bin/caf-hvd-exec \
           -e "$stage"/usr/bin/caf-hvd-allreduce -e "$netmod" 2>"$work/shlibdeps.err") \
  || { cat "$work/shlibdeps.err" >&2; die "dpkg-shlibdeps failed"; }
shlibs=${shlibs#shlibs:Depends=}
depends="$shlibs, python3:any, python3-cloudpickle, adduser"

install -d -m 755 "$stage/DEBIAN"
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s|@MAINTAINER@|$maintainer|" \
    -e "s/@SIZE@/$(du -sk --exclude=DEBIAN "$stage" | cut -f1)/" -e "s/@DEPENDS@/$depends/" \
    "$src/packaging/debian/control.in" >"$stage/DEBIAN/control"
for s in postinst prerm postrm; do
  install -m 755 "$src/packaging/debian/$s" "$stage/DEBIAN/$s"
done
find "$stage/etc" -type f | sed "s|^$stage||" >"$stage/DEBIAN/conffiles"
(cd "$stage" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z \
   | xargs -0 md5sum) >"$stage/DEBIAN/md5sums"
deb=$out/caf-hvd_${version}_${arch}.deb
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
echo "build-deb: $deb ($(du -h "$deb" | cut -f1))" >&2
echo "$deb"
