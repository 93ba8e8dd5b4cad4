#!/usr/bin/env bash
# Prints the Debian archive this machine's apt uses (deb822 .sources or one-line .list
# files), or $CAF_HVD_DEBIAN_MIRROR when set, else deb.debian.org: where the cached
# chroots (setup-torch-chroot.sh, setup-deb-chroot.sh) are built from.
set -euo pipefail
mirror=${CAF_HVD_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
                /etc/apt/sources.list.d/*.list 2>/dev/null \
           | sed -n -e 's/^URIs:[[:space:]]*//p' \
                    -e 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]*\)\?\([^[:space:]]*\).*/\2/p' \
           | tr ' ' '\n' | grep -E '^(https?|file)://.*/debian/?$' | head -1 || true)
fi
echo "${mirror:-http://deb.debian.org/debian}"
