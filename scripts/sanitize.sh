#!/usr/bin/env bash
# Builds the project with AddressSanitizer and UndefinedBehaviorSanitizer and runs the
# whole test suite with those binaries (unit, cluster, multi-host and corpus replays).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build-asan -Db_sanitize=address,undefined -Db_lundef=false \
  -Dbuildtype=debugoptimized >/dev/null
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:suppressions=$PWD/tests/ubsan.supp}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp}
meson test -C build-asan --print-errorlogs "$@"
