#!/usr/bin/env bash
# Installs, builds and runs the local demo job: 4 ranks on this machine, each printing
# its assignment, connecting Gloo through the rendezvous server and checking allreduce
# sums in the global, local and cross contexts.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build >/dev/null
exec build/apps/caf-hvd run -np 4 -- build/apps/caf-hvd-allreduce
