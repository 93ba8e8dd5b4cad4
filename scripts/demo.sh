#!/usr/bin/env bash
# Installs, builds and runs the local demo job: 4 ranks on this machine, each printing
# its assignment, connecting Gloo through the rendezvous server and checking allreduce
# sums in the global, local and cross contexts.
set -euo pipefail
cd "$(dirname "$0")/.."
# Only what the demo needs is installed and built (scripts/test.sh installs and builds
# everything); each stage says what it does on stderr. The demo's build is unoptimized
# (-O0: about half the compile time of the optimized one, the most of a first run) and
# has a directory of its own, build-demo; scripts/setup.sh builds the optimized caf-hvd
# into build/.
scripts/setup.sh --demo build-demo -Dbuildtype=plain -Doptimization=0 -Ddebug=false >/dev/null
echo "caf-hvd demo: running 4 ranks on this machine" >&2
exec build-demo/apps/caf-hvd run -np 4 -- build-demo/apps/caf-hvd-allreduce
