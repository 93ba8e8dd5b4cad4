#!/usr/bin/env bash
# Installs, builds (warnings are errors) and runs every test: doctest unit tests and
# cluster tests with real node agents and drivers.
set -euo pipefail
cd "$(dirname "$0")/.."
# --prefix=/usr: the package test (tests/cluster/run_package_tests.py) packages this build.
scripts/setup.sh build-test -Dwerror=true -Dbuildtype=debugoptimized -Dprefix=/usr
# Debian's Chromium renders the timeline pages in the event tests (they skip, saying so,
# when it cannot be installed).
if ! command -v chromium >/dev/null; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  { $sudo apt-get install -y -qq chromium >/dev/null 2>&1 \
      || { $sudo apt-get update -qq && $sudo apt-get install -y -qq chromium >/dev/null 2>&1; }; } \
    || echo "caf-hvd tests: chromium could not be installed; the timeline screenshots are skipped"
fi
rc=0
meson test -C build-test --print-errorlogs --verbose || rc=$?
python3 - <<'PY'
import json
results = [json.loads(l) for l in open("build-test/meson-logs/testlog.json")]
ok = sum(r["result"] == "OK" for r in results)
print(f"suites: {ok} passed, {len(results) - ok} failed")
PY
exit $rc
