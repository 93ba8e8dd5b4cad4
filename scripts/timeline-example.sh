#!/usr/bin/env bash
# Draws the guide's timeline picture (docs/observing.md) from a real job: three node agents on loopback
# (n2, n1 at the start, n0 joining), an elastic caf-hvd-allreduce job, n1's agent killed
# once n0 trains with it. Writes docs/timeline.{html,png} and the event log beside them.
#
# usage: scripts/timeline-example.sh [BUILD_DIR]   (default build-test; needs chromium)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-test}
bin=$build/apps/caf-hvd
allreduce=$build/apps/caf-hvd-allreduce
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

for n in n2 n1 n0; do
  "$bin" node --insecure --bind 127.0.0.1 --port 0 --name "$n" >"$work/$n.log" 2>&1 &
  pids+=($!)
done
port() {
  for _ in $(seq 50); do
    local p
    p=$(grep -o "listening on 127.0.0.1:[0-9]*" "$work/$1.log" | cut -d: -f2 || true)
    [ -n "$p" ] && { echo "$p"; return; }
    sleep 0.1
  done
  echo "agent $1 did not start: $(cat "$work/$1.log")" >&2
  exit 1
}
p2=$(port n2) p1=$(port n1) p0=$(port n0)
printf '127.0.0.1:%s:1\n127.0.0.1:%s:1\n' "$p2" "$p1" >"$work/hosts"
printf '#!/bin/sh\ncat %s\n' "$work/hosts" >"$work/discover.sh"
chmod +x "$work/discover.sh"

mkdir -p docs
"$bin" driver --insecure --host-discovery-script "$work/discover.sh" --discovery-interval 0.1 \
  --min-np 1 --events docs/timeline-events.jsonl -- "$allreduce" --elastic --steps 400 \
  --step-ms 20 >"$work/out" 2>"$work/err" &
driver=$!
pids+=("$driver")
wait_for() { # PATTERN FILE WHAT
  for _ in $(seq 300); do
    grep -q "$1" "$2" && return
    sleep 0.1
  done
  echo "timed out waiting for $3" >&2
  exit 1
}
wait_for "step 50 " "$work/out" "the job to train"
printf '127.0.0.1:%s:1\n127.0.0.1:%s:1\n127.0.0.1:%s:1\n' "$p2" "$p1" "$p0" >"$work/hosts"
wait_for " size 3 sum 3 " "$work/out" "n0 to train"
sleep 1
kill -9 "${pids[1]}" # n1's agent
wait "$driver" || { echo "the job failed:"; cat "$work/err"; exit 1; }
"$bin" timeline docs/timeline-events.jsonl -o docs/timeline.html \
  --title "caf-hvd job: n0 joins, n1's agent is killed"
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,900 \
  --screenshot="$PWD/docs/timeline.png" "file://$PWD/docs/timeline.html" 2>/dev/null
echo "docs/timeline.png: $(stat -c %s docs/timeline.png) bytes"
