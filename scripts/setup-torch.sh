#!/usr/bin/env bash
# Installs Debian's PyTorch (python3-torch, for /usr/bin/python3) when it is missing.
# Used by the torch cluster test and bench/compare.py. Exits non-zero if it cannot.
set -euo pipefail
if /usr/bin/python3 -c "import torch.distributed" 2>/dev/null; then
  exit 0
fi
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-torch >/dev/null
/usr/bin/python3 -c "import torch.distributed"
