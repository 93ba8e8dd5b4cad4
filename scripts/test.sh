#!/usr/bin/env bash
# Installs, builds (warnings are errors) and runs every test: doctest unit tests and
# cluster tests with real node agents and drivers.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build-test -Dwerror=true -Dbuildtype=debugoptimized
rc=0
meson test -C build-test --print-errorlogs --verbose || rc=$?
python3 - <<'PY'
import json
results = [json.loads(l) for l in open("build-test/meson-logs/testlog.json")]
ok = sum(r["result"] == "OK" for r in results)
print(f"suites: {ok} passed, {len(results) - ok} failed")
PY
exit $rc
