#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each for SECONDS, two at a
# time, then merges what they found into the regression corpus in tests/fuzz/corpus.
# usage: scripts/fuzz.sh [SECONDS] [TARGET...]   (targets: host_list hostfile discovery
#        rendezvous rendezvous_server torch_store frames slurm_hostlist timeline worker_registration;
#        default: all,
#        600 s each). Logs go to build-fuzz/logs.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(host_list hostfile discovery rendezvous rendezvous_server torch_store frames slurm_hostlist timeline
                            worker_registration)

need=()
command -v clang++-14 >/dev/null || need+=(clang-14)
dpkg-query -W -f='${Status}' libclang-rt-14-dev 2>/dev/null | grep -q "ok installed" \
  || need+=(libclang-rt-14-dev)
if ((${#need[@]})); then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

out=build-fuzz
mkdir -p "$out/logs"
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I. -DFMT_HEADER_ONLY=0)
sources=(runtime/job/host_spec.cpp runtime/job/assignment.cpp runtime/horovod/kv_store.cpp
         runtime/horovod/rendezvous_server.cpp runtime/torch/torch_store_protocol.cpp runtime/launch/channel.cpp
         runtime/observe/output_writer.cpp runtime/job/allocation.cpp runtime/observe/timeline.cpp
         runtime/network/allowlist.cpp runtime/observe/text.cpp runtime/horovod/horovod_wire.cpp runtime/network/socket_abort.cpp
         # Horovod's wire signs with the network module's HMAC, linked in here
         runtime/network/net.cpp runtime/launch/process.cpp runtime/cluster/credential_files.cpp
         net/module.cpp net/credentials.cpp net/tls_context.cpp)
for t in "${targets[@]}"; do
  echo "building fuzz-$t"
  clang++-14 "${flags[@]}" "tests/fuzz/fuzz_$t.cpp" "${sources[@]}" -lfmt -lcaf_core -lcaf_io -lcaf_openssl -lssl -lcrypto -lpthread \
    -o "$out/fuzz-$t"
done

run() {
  local t=$1 work="$out/work-$1"
  rm -rf "$work"; mkdir -p "$work"
  cp tests/fuzz/corpus/"$t"/* "$work"/
  "$out/fuzz-$t" "$work" -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 \
    -artifact_prefix="$out/logs/$t-" > "$out/logs/$t.log" 2>&1 || echo "fuzz-$t FOUND A FAILURE (see $out/logs/$t.log)"
  # Keep a minimal set of inputs that covers what the run reached.
  mkdir -p "$work.min"
  "$out/fuzz-$t" -merge=1 "$work.min" tests/fuzz/corpus/"$t" "$work" > /dev/null 2>&1
  cp -n "$work.min"/* tests/fuzz/corpus/"$t"/ 2>/dev/null || true
  rm -rf "$work.min"
  local execs
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$out/logs/$t.log" | awk '{print $2}')
  echo "fuzz-$t: ${execs:-?} executions in ${seconds}s; corpus $(ls tests/fuzz/corpus/$t | wc -l) files"
}

i=0
for t in "${targets[@]}"; do
  run "$t" &
  i=$((i + 1))
  if ((i % 2 == 0)); then wait; fi
done
wait
