#!/bin/sh
# Writes a man page from a command's --help text with help2man; the page is named after
# NAME even when the command is a subcommand (caf-hvd node: caf-hvd-node).
# usage: help2man.sh OUTPUT SECTION NAME VERSION INCLUDE DESCRIPTION -- COMMAND [ARG]...
set -eu
out=$1 section=$2 name=$3 version=$4 include=$5 description=$6
shift 6
[ "$1" = -- ] && shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{
  echo '#!/bin/sh'
  printf 'exec'
  for a in "$@"; do printf " '%s'" "$a"; done
  echo ' "$@"'
} >"$tmp/$name"
chmod +x "$tmp/$name"
help2man --no-info --no-discard-stderr --section "$section" --version-string "$version" \
  --name "$description" --include "$include" --output "$out.tmp" "$tmp/$name"
# help2man names the generator's wrapper path in a comment; keep pages reproducible.
sed -e "s|$tmp/||g" "$out.tmp" >"$out"
rm -f "$out.tmp"
