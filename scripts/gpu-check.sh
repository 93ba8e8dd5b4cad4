#!/usr/bin/env bash
# On a machine with NVIDIA GPUs and a torch with CUDA: one rank per GPU through
# `caf-hvd run --gpus-per-slot 1`, a NCCL all_reduce on every GPU (sums checked), and
# every rank's current device mapped to a distinct physical GPU by UUID. Without GPUs
# it says so and exits 0.
# usage: scripts/gpu-check.sh [BUILD_DIR] [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
py=${2:-/usr/bin/python3}
caf_hvd="$build/apps/caf-hvd"
[ -x "$caf_hvd" ] || scripts/setup.sh "$build" >/dev/null
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU on this machine (nvidia-smi -L finds none); nothing to check"
  exit 0
fi
n=$(nvidia-smi -L | grep -c '^GPU ')
if ! "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "gpu-check: $n GPUs, but $py has no torch with CUDA; install one and rerun" >&2
  exit 1
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$caf_hvd" run -np "$n" --gpus-per-slot 1 --quiet -- "$py" -c '
import os, subprocess, torch, torch.distributed as dist
lr = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(lr)            # shared mode: local rank i uses the i-th device
dist.init_process_group("nccl")
r, n = dist.get_rank(), dist.get_world_size()
t = torch.full((1024,), float(r + 1), device="cuda")
dist.all_reduce(t)
want = n * (n + 1) / 2
ok = bool((t == want).all())
physical = os.environ["CUDA_VISIBLE_DEVICES"].split(",")[lr]   # PCI bus order
uuid = subprocess.run(["nvidia-smi", "-i", physical, "--query-gpu=uuid", "--format=csv,noheader"],
                      capture_output=True, text=True).stdout.strip()
print(f"CHECK rank={r} device={torch.cuda.current_device()} physical={physical} uuid={uuid} "
      f"sum_ok={ok}", flush=True)
dist.destroy_process_group()
' | tee "$out"
ranks=$(grep -c 'CHECK rank=' "$out" || true)
bad=$(grep 'CHECK rank=' "$out" | grep -c 'sum_ok=False' || true)
uuids=$(grep -o 'uuid=[^ ]*' "$out" | sort -u | wc -l)
if [ "$ranks" -ne "$n" ] || [ "$bad" -ne 0 ] || [ "$uuids" -ne "$n" ]; then
  echo "gpu-check: FAILED: $ranks of $n ranks reported, $bad wrong sums, $uuids distinct GPUs" >&2
  exit 1
fi
echo "gpu-check: $n GPUs, one rank each: NCCL all_reduce sums right, $uuids distinct devices"
