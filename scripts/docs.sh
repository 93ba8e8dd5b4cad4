#!/usr/bin/env bash
# Builds the guide (docs/) into OUT_DIR (default build/docs) with warnings as errors:
# a broken internal link, a missing reference or a page outside the table of contents
# fails it. The command-line reference is written from the --help texts of the caf-hvd
# binary ($CAF_HVD, else build/apps/caf-hvd, else caf-hvd on PATH). Installs Sphinx,
# MyST and the Read the Docs theme from Debian when missing.
# usage: scripts/docs.sh [OUT_DIR]; open OUT_DIR/index.html in a browser.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/docs}

packages=(python3-sphinx python3-myst-parser python3-sphinx-rtd-theme)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "caf-hvd docs: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  { $sudo apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1; } \
    || { $sudo apt-get update -qq \
         && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null; }
fi

bin=${CAF_HVD:-}
if [ -z "$bin" ]; then
  if [ -x build/apps/caf-hvd ]; then bin=build/apps/caf-hvd
  elif command -v caf-hvd >/dev/null; then bin=$(command -v caf-hvd)
  else echo "caf-hvd docs: no caf-hvd binary (build it with scripts/setup.sh, or set CAF_HVD)" >&2; exit 1
  fi
fi

# The sources as the repository lays them out (conf.py reads ../python, the benchmarks
# page includes ../BENCHMARKS.md), plus the command-line reference from the binary.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r docs "$tmp/docs"
cp BENCHMARKS.md "$tmp/"
ln -s "$PWD/python" "$tmp/python"
/usr/bin/python3 scripts/cli_reference.py "$bin" > "$tmp/docs/reference/cli.md"
src=$tmp/docs

mkdir -p "$out"
/usr/bin/python3 -m sphinx -W --keep-going -n -q -b html -d "$src/.doctrees" "$src" "$out"
echo "caf-hvd docs: $out/index.html"
