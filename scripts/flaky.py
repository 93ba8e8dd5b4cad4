#!/usr/bin/env python3
"""The flake detector: runs one suite of the build (or some of its tests) N times and
prints how many runs passed and each distinct first failure, with how often it came.

    scripts/flaky.py [--runs N] [--build DIR] SUITE [TEST ...]

SUITE is a meson test of the build (`meson test -C DIR --list`: unit, elastic, horovod,
...); TEST names narrow it to some of its tests, as the suite's own runner takes them
(`HorovodTest.test_2_horovods_test_torch_under_driver_2_agents_x2_as_under_horovodrun`;
for the doctest unit suite, a `-tc=` filter). Runs one after the other (the suites use
fixed namespace names and count processes by pattern: two at once would fail each
other), with the build as it is (`--no-rebuild`). A run's first failure is the first
failing test and the first line of its error; runs that fail the same way are counted
together, and each failing run's whole log is kept as
DIR/meson-logs/flaky-SUITE-runN.txt. Exit status: 0 when every run passed, 1 otherwise.
"""
import argparse
import collections
import os
import re
import shlex
import subprocess
import sys
import time

FAIL = re.compile(r"^(?:FAIL|ERROR): (\S+)")
CAUSE = re.compile(r"^(\w+(?:Error|Exception)|AssertionError|Timeout)\b.*")
DOCTEST = re.compile(r"^TEST CASE:\s+(.*)$")
DOCTEST_ERROR = re.compile(r"ERROR: (.*)$")


def first_failure(log):
    """The first failing test in a suite's output and the first line of its error."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        m = FAIL.match(line) or DOCTEST.match(line)
        if not m:
            continue
        test = m.group(1).strip()
        for later in lines[i + 1:i + 200]:
            later = later.strip()
            c = CAUSE.match(later) or DOCTEST_ERROR.search(later)
            if c:
                return f"{test}: {c.group(0)[:300]}"
        return f"{test}: (no error line)"
    for line in reversed(lines):
        if "Timeout" in line or "TIMEOUT" in line:
            return f"the suite timed out: {line.strip()[:300]}"
    return "(no failing test named; see the log)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--build", default="build-test")
    ap.add_argument("suite")
    ap.add_argument("tests", nargs="*")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs: give at least 1")
    if not os.path.isdir(args.build):
        ap.error(f"--build {args.build}: no such build directory (scripts/setup.sh makes one)")
    listed = subprocess.run(["meson", "test", "-C", args.build, "--no-rebuild", "--list"],
                            capture_output=True, text=True)
    if args.suite not in listed.stdout.split():
        ap.error(f"'{args.suite}' is not a test of {args.build}; it has: "
                 f"{' '.join(listed.stdout.split())}")
    cmd = ["meson", "test", "-C", args.build, "--no-rebuild", "--print-errorlogs", args.suite]
    if args.tests:
        cmd += ["--test-args", " ".join(shlex.quote(t) for t in args.tests)]
    what = args.suite + (f" [{' '.join(args.tests)}]" if args.tests else "")
    passed = 0
    failures = collections.Counter()
    took = []
    for n in range(1, args.runs + 1):
        t0 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True)
        took.append(time.monotonic() - t0)
        log = r.stdout + r.stderr
        testlog = os.path.join(args.build, "meson-logs", "testlog.txt")
        if os.path.exists(testlog):
            with open(testlog, errors="replace") as f:
                log += f.read()
        if re.search(r"^Ran 0 tests", log, re.M):
            print(f"{what}: no test of the suite matches {' '.join(args.tests)!r} (a run of "
                  f"nothing would pass)", file=sys.stderr)
            return 2
        if r.returncode == 0:
            passed += 1
            print(f"run {n}/{args.runs}: ok ({took[-1]:.0f} s)", flush=True)
        else:
            first = first_failure(log)
            failures[first] += 1
            # the next run overwrites meson's log: this run's whole log is kept apart
            kept = os.path.join(args.build, "meson-logs", f"flaky-{args.suite}-run{n}.txt")
            with open(kept, "w") as f:
                f.write(log)
            print(f"run {n}/{args.runs}: FAILED ({took[-1]:.0f} s): {first} (its log: {kept})",
                  flush=True)
    print(f"\n{what}: {passed} of {args.runs} runs passed "
          f"(each {min(took):.0f}-{max(took):.0f} s)")
    for first, count in failures.most_common():
        print(f"  {count} x {first}")
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
